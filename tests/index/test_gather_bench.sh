#!/bin/sh
# gather-bench end to end on 1 GiB: a JSON record with every pattern at every thread count and
# a positive time per row; a bad command line exits 2. $1: gather-bench.
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$1" --gib 1 --threads 1,2 --searches 3 --json "$dir/out.json" >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
python3 - "$dir/out.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["results"]
assert [(x["threads"], x["pattern"]) for x in r] == [
    (t, p) for t in (1, 2) for p in ("stream", "batch8", "batch8dep")], r
assert all(x["ns_per_row"] > 0 and x["us_per_search"] > 0 for x in r), r
assert d["rows_per_search"] == 5400 and d["row_bytes"] == 256, d
PY
status=0
"$1" --threads 0 >/dev/null 2>&1 || status=$?
[ "$status" = 2 ] || { echo "FAIL: --threads 0 exited $status, not 2"; exit 1; }
status=0
"$1" --threads 1,2,3,4,5,6,7,8,9 >/dev/null 2>&1 || status=$?
[ "$status" = 2 ] || { echo "FAIL: nine thread counts exited $status, not 2"; exit 1; }
