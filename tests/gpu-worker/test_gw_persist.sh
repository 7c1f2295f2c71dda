#!/usr/bin/env bash
# Persistence with real processes (CPU backend, SmolLM2, two loopback kv-stores, b with
# --data-dir):
#  1. store b is killed with SIGKILL while the worker decodes and restarted on the same address
#     from the same directory; the worker reattaches its session (--store-reconnect-ms) and the
#     generation's tokens equal an undisturbed run's;
#  2. a generation of 16 tokens saved with --save-context, store b killed and restarted, then
#     --context continues it: no prefill, and its 16 tokens are tokens 16-31 of one 32-token run.
#   test_gw_persist.sh GPU_WORKER KV_STORE MODEL
. "$(dirname "$0")/gw_stores.sh"
start_store a "$KVS" --memory-budget 256M --threads 1
start_store b "$KVS" --memory-budget 256M --threads 1 --data-dir "$RUN/b.data"
A=$(cat "$RUN/a.addr")
B=$(cat "$RUN/b.addr")
run() { # NAME N [ARGS...]: N new tokens, writes $RUN/NAME.json
  local name=$1 n=$2
  shift 2
  "$GW" generate --backend cpu --threads 2 --model "$MODEL" --max-new-tokens "$n" --no-stop --mode flat \
    --attn-top-k 4096 --sink 4 --window 8 --stores "$A,$B" --json "$RUN/$name.json" "$@" \
    >"$RUN/$name.out" 2>"$RUN/$name.log"
}
restart_b() { # kill -9 store b, start it again on its address from its data dir
  kill -KILL "${PIDS[1]}"
  wait "${PIDS[1]}" 2>/dev/null || true
  "$KVS" --listen "$B" --memory-budget 256M --threads 1 --data-dir "$RUN/b.data" >>"$RUN/b2.log" 2>&1 &
  PIDS[1]=$!
}
fail() {
  echo "FAIL: $1" >&2
  shift
  cat "$@" >&2
  exit 1
}

run calm 48 --prompt "$PROMPT"
run restarted 48 --prompt "$PROMPT" --store-reconnect-ms 20000 &
W=$!
wait_for_output "$RUN/restarted.out"
restart_b
wait $W || fail "the generation did not resume on the restarted store" "$RUN/restarted.log" "$RUN/b2.log"
grep -q "sessions restored" "$RUN/b2.log" || fail "the store restored nothing" "$RUN/b2.log"

run long 32 --prompt "$PROMPT"
run first 16 --prompt "$PROMPT" --save-context "$RUN/ctx" || fail "--save-context" "$RUN/first.log"
# the saved sessions survive a kill -9 of a store that keeps them on disk
for _ in $(seq 100); do grep -q "^listening\|listening on" "$RUN/b2.log" && break; sleep 0.05; done
restart_b
sleep 0.5
run second 16 --context "$RUN/ctx" --store-reconnect-ms 20000 || fail "--context" "$RUN/second.log" "$RUN/b2.log"

python3 - "$RUN" "$B" <<'PY'
import json, sys
run, b = sys.argv[1], sys.argv[2]
j = lambda n: json.load(open(f"{run}/{n}.json"))
calm, again = j("calm"), j("restarted")
assert len(calm["tokens"]) == 48, calm["tokens"]
assert again["tokens"] == calm["tokens"], (again["tokens"], calm["tokens"])
health = {h["store"]: h for h in again["store_health"]}
assert health[b]["reconnects"] == 1 and not health[b]["down"], health

long, first, second = j("long"), j("first"), j("second")
assert first["tokens"] == long["tokens"][:16], (first["tokens"], long["tokens"])
assert second["tokens"] == long["tokens"][16:], (second["tokens"], long["tokens"])
assert second["prefill_tokens"] == 0 and second["prefill"]["n_offloaded"] == 0, second
assert second["context_position"] == first["prefill_tokens"] + 15, (second["context_position"], first["prefill_tokens"])
assert len(second["steps"]) == 16, len(second["steps"])
PY
echo "ok: a store restarted from --data-dir mid-decode resumes the session; a saved context continues without prefill"
