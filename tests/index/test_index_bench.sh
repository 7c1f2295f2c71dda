#!/bin/sh
# index-bench end to end on a small synthetic dump: roar-kv built from the bench's lists, and
# --group-overlap's counts within their bounds (the union of G walks' scored keys is at most
# their sum and at least the sum / G). $1: qk-synth, $2: index-bench.
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$1" --out "$dir/qk" --tokens 4096 --q-heads 4 --kv-heads 1 --head-dim 32 --seed 3 --decode 16 >/dev/null
"$2" --qk "$dir/qk" --json "$dir/out.json" --kinds roar-kv --lists --key-queries 4 --threads 2 \
  --eval 50 --group-overlap 100 >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
sum=$(sed -n 's/.*"group_scored_sum": \([0-9.]*\).*/\1/p' "$dir/out.json" | head -n 1)
uni=$(sed -n 's/.*"group_scored_union": \([0-9.]*\).*/\1/p' "$dir/out.json" | head -n 1)
[ -n "$sum" ] && [ -n "$uni" ] || { echo "FAIL: no group overlap in the JSON"; exit 1; }
awk -v s="$sum" -v u="$uni" 'BEGIN { exit !(s > 0 && u <= s && u >= s / 4) }' ||
  { echo "FAIL: union $uni outside [sum / 4, sum] for sum $sum"; exit 1; }
grep -q "group walks at ef 100" "$dir/log" || { echo "FAIL: no group line in the output"; exit 1; }
echo "group overlap: $uni distinct of $sum scored"
