#!/usr/bin/env bash
# wave-scan-bench on a tiny store: the JSON it prints holds the rows the selection implies
# (select x cluster x kv heads + lag x kv heads); wave-select-bench on the CPU backend times
# every cluster count asked; --kernels names the vector kernels it ran; bad flags are usage errors
# (exit 2) for both.
set -euo pipefail
bin="$1/wave-scan-bench"
out=$("$bin" --tokens 4096 --layers 2 --kv-heads 2 --group 3 --dim 64 --cluster 16 --select 10 --lag 100 \
  --threads 2 --steps 4 --dtype f16)
python3 - "$out" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
nc = (4096 - 100) // 16  # clusters of 16 over all but the lag; the remainder joins the lag
assert d["clusters_per_head"] == nc, d
want = 2 * (10 * 16 + 4096 - nc * 16)
assert d["rows_per_attend"] == want, (d["rows_per_attend"], want)
assert d["median_us"] > 0 and d["kv_gb_per_s"] > 0, d
PY
# --gap-us idles between attends: 4 attends after 20 ms gaps take at least 80 ms, and the JSON says so
t0=$(date +%s%N)
out=$("$bin" --tokens 4096 --layers 1 --kv-heads 1 --select 4 --lag 10 --threads 1 --steps 4 --gap-us 20000)
t1=$(date +%s%N)
[ $(( (t1 - t0) / 1000000 )) -ge 80 ] || { echo "--gap-us 20000 x 4 took $(( (t1 - t0) / 1000000 )) ms"; exit 1; }
python3 -c 'import json, sys; d = json.loads(sys.argv[1]); assert d["gap_us"] == 20000, d' "$out"
# --kernels picks the set it reports; every CPU has the portable one
out=$("$bin" --tokens 4096 --layers 1 --kv-heads 1 --select 4 --lag 10 --threads 1 --steps 2 --kernels portable)
python3 -c 'import json, sys; d = json.loads(sys.argv[1]); assert d["kernels"] == "portable", d' "$out"
for bad in "--select 999999" "--dim 72" "--dtype i4" "--threads 0" "--nope 1" "--lag" "--kernels avx9" "--gap-us -1"; do
  set +e
  # shellcheck disable=SC2086
  "$bin" --tokens 4096 $bad >/dev/null 2>/tmp/wsb-err.$$
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || { echo "accepted: $bad"; exit 1; }
  grep -q "wave-scan-bench:" /tmp/wsb-err.$$ || { echo "no message for: $bad"; exit 1; }
done
sel=$("$1/wave-select-bench" --backend cpu --kv-heads 2 --group 2 --dim 64 --clusters 300,40 --retrieve 5 \
  --estimate 20 --reps 3)
python3 - "$sel" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
assert [r["clusters"] for r in d["runs"]] == [300, 40], d
assert all(r["select_estimate_med_us"] > 0 and r["select_only_med_us"] > 0 for r in d["runs"]), d
PY
for bad in "--clusters 0" "--clusters 5,x" "--retrieve 0 --estimate 0" "--reps"; do
  set +e
  # shellcheck disable=SC2086
  "$1/wave-select-bench" --backend cpu $bad >/dev/null 2>/tmp/wsb-err.$$
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || { echo "wave-select-bench accepted: $bad ($rc)"; exit 1; }
done
rm -f /tmp/wsb-err.$$
echo ok
