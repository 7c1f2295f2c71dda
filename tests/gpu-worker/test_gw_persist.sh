#!/usr/bin/env bash
# Persistence with real processes: a kv-store with --data-dir is killed with SIGKILL while the
# worker decodes and restarted on the same address from the same directory; the worker
# reattaches its session (--store-reconnect-ms) and the generation's tokens equal an undisturbed
# run's.
#   test_gw_persist.sh GPU_WORKER KV_STORE MODEL
set -euo pipefail
GW=$1
KVS=$2
MODEL=$3
. "$(dirname "$0")/../../deploy/loopback-stores.sh"
start_store a "$KVS" --memory-budget 256M --threads 1
start_store b "$KVS" --memory-budget 256M --threads 1 --data-dir "$RUN/b.data"
A=$(cat "$RUN/a.addr")
B=$(cat "$RUN/b.addr")
PROMPT="The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid."
PROMPT+=" The capital of Germany is Berlin. The capital of Portugal is"
N=48
gen() { # NAME [ARGS...]: writes $RUN/NAME.json
  local name=$1
  shift
  "$GW" generate --backend cpu --threads 2 --model "$MODEL" --prompt "$PROMPT" --max-new-tokens $N --no-stop \
    --mode flat --attn-top-k 4096 --sink 4 --window 8 --stores "$A,$B" --json "$RUN/$name.json" "$@" \
    >"$RUN/$name.out" 2>"$RUN/$name.log"
}
gen calm

: >"$RUN/restarted.out"
gen restarted --store-reconnect-ms 20000 &
W=$!
for _ in $(seq 300); do
  [ "$(wc -c <"$RUN/restarted.out")" -gt 8 ] && break
  sleep 0.02
done
kill -KILL "${PIDS[1]}"
wait "${PIDS[1]}" 2>/dev/null || true
sleep 0.3
"$KVS" --listen "$B" --memory-budget 256M --threads 1 --data-dir "$RUN/b.data" >"$RUN/b2.log" 2>&1 &
PIDS+=($!)
if ! wait $W; then
  echo "FAIL: the generation did not resume on the restarted store:" >&2
  cat "$RUN/restarted.log" "$RUN/b2.log" >&2
  exit 1
fi
cat "$RUN/restarted.log" "$RUN/b2.log"
grep -q "sessions restored" "$RUN/b2.log" || { echo "FAIL: the store restored nothing:" >&2; cat "$RUN/b2.log" >&2; exit 1; }
python3 - "$RUN" "$B" <<'PY'
import json, sys
run, b = sys.argv[1], sys.argv[2]
calm = json.load(open(f"{run}/calm.json"))
again = json.load(open(f"{run}/restarted.json"))
assert len(calm["tokens"]) == 48, calm["tokens"]
assert again["tokens"] == calm["tokens"], (again["tokens"], calm["tokens"])
health = {h["store"]: h for h in again["store_health"]}
assert health[b]["reconnects"] == 1 and not health[b]["down"], health
PY
echo "ok: a store killed mid-decode and restarted from --data-dir, the session resumed, same tokens"
