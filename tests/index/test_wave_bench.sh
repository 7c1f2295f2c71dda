#!/bin/sh
# wave-bench end to end on a tiny synthetic dump: the JSON's recalls, masses and errors within
# their ranges; retrieving every cluster reads every offloaded key, with recall 1, mass 1 and o
# exact; a dump without values is refused with a message. $1: qk-synth, $2: wave-bench.
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$1" --out "$dir/qk" --tokens 1536 --q-heads 4 --kv-heads 2 --head-dim 32 --seed 5 --decode 8 >/dev/null
"$2" --qk "$dir/qk" --json "$dir/out.json" --cluster-size 8,16 --seg-len 256,4096 --iters 3 \
  --retrieval 3.6,100 --estimation 0,23.2 --threads 2 >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
j="$dir/out.json"
fail=0
vals() { grep -o "\"$1\": [^][{}, ][^][{}, ]*" "$j" | sed "s/.*: //"; }
for key in recall100 mass mass_worst_head est_weight est_mass keys_read_frac; do
  n=$(vals $key | wc -l)
  [ "$n" -gt 0 ] || { echo "FAIL: no \"$key\" in the JSON"; fail=1; }
  vals $key | awk -v k=$key '!($1 >= 0 && $1 <= 1.00005) { print "FAIL: " k " = " $1 " outside [0, 1]"; bad = 1 }
    END { exit bad }' || fail=1
done
vals o_rel_err | awk '!($1 >= 0 && $1 < 10) { print "FAIL: o_rel_err = " $1; bad = 1 } END { exit bad }' || fail=1
# 2 x 2 x 1 configs, each with "all" and one layer: every retrieval-100 point reads all keys exactly.
n_off=$(vals offloaded_keys)
full=$(grep -o '{"retrieval_pct": 100,[^]]*' "$j")
[ "$(echo "$full" | wc -l)" -eq 8 ] || { echo "FAIL: expected 8 points at retrieval 100 %"; fail=1; }
echo "$full" | awk -v n="$n_off" '{
    if ($0 !~ "\"keys_read\": " n ".0," || $0 !~ /"recall100": 1.0000, "mass": 1.0000/) { print "FAIL: full retrieval: " $0; bad = 1 }
    if (match($0, /"e": 0, "o_rel_err": [0-9.]*/) && substr($0, RSTART + 21, RLENGTH - 21) + 0 > 1e-3) { print "FAIL: o not exact: " $0; bad = 1 }
  } END { exit bad }' || fail=1
# below full retrieval, fewer keys, and the mass never above flat's at the same keys
grep -o '{"retrieval_pct": 3.6,[^]]*' "$j" | sed 's/.*"keys_read_frac": \([0-9.]*\).*"mass": \([0-9.]*\), "mass_worst.*"flat": {"recall100": [0-9.]*, "mass": \([0-9.]*\), "o_rel_err".*/\1 \2 \3/' |
  awk '!($1 < 1 && $2 <= $3 + 1e-4) { print "FAIL: retrieval 3.6 %: keys frac " $1 ", mass " $2 ", flat " $3; bad = 1 } END { exit bad }' || fail=1
grep -q "err@e23.2" "$dir/log" || { echo "FAIL: no table on stdout"; fail=1; }
rm "$dir/qk/v_L0_H1.npy"
if "$2" --qk "$dir/qk" --json "$dir/out2.json" --kinds none >"$dir/log2" 2>&1; then
  echo "FAIL: a dump without values was accepted"; fail=1
fi
grep -q "v_L0_H1.npy" "$dir/log2" || { echo "FAIL: no message naming the missing values"; cat "$dir/log2"; fail=1; }
for bad in "--sink abc" "--window -1" "--threads 1x"; do
  # shellcheck disable=SC2086
  if "$2" --qk "$dir/qk" --json "$dir/out3.json" $bad >/dev/null 2>&1; then
    echo "FAIL: wave-bench accepted $bad"; fail=1
  fi
done
[ $fail -eq 0 ] && echo "wave-bench: ranges and full retrieval hold"
exit $fail
