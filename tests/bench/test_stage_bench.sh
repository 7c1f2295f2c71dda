#!/usr/bin/env bash
# stage-bench on a small store: its JSON holds the asked shape and a positive rate from every
# stream count; bad flags are usage errors (exit 2) with a message.
set -euo pipefail
bin="$1/stage-bench"
for s in 1 3; do
  out=$("$bin" --tokens 2048 --layers 3 --kv-heads 4 --dim 64 --chunk 300 --streams "$s")
  python3 - "$out" "$s" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
assert d["streams"] == int(sys.argv[2]) and d["kv_heads"] == 4 and d["tokens"] == 2048, d
assert 0 < d["min_gb_per_s"] <= d["median_gb_per_s"] <= d["max_gb_per_s"], d
PY
done
for bad in "--streams 0" "--tokens 10" "--nope 1" "--chunk"; do
  set +e
  # shellcheck disable=SC2086
  "$bin" $bad >/dev/null 2>/tmp/stb-err.$$
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || { echo "accepted: $bad ($rc)"; exit 1; }
  grep -q "stage-bench:" /tmp/stb-err.$$ || { echo "no message for: $bad"; exit 1; }
done
rm -f /tmp/stb-err.$$
echo ok
