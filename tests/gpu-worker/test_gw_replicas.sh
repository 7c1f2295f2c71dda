#!/usr/bin/env bash
# Replicas and failover with real processes: two kv-stores holding every shard twice
# (--replicas 2); store b is killed with SIGKILL while the worker decodes, and the generation
# completes with the tokens of an undisturbed run, b reported down in the --json record. Then
# with a spare store c: b killed mid-decode is replaced by c (its shards copied from a), and a
# killed later leaves c alone holding everything: the tokens are still the undisturbed run's.
#   test_gw_replicas.sh GPU_WORKER KV_STORE MODEL
. "$(dirname "$0")/gw_stores.sh"
start_store a "$KVS" --memory-budget 256M --threads 1
start_store b "$KVS" --memory-budget 256M --threads 1
start_store c "$KVS" --memory-budget 256M --threads 1
A=$(cat "$RUN/a.addr")
B=$(cat "$RUN/b.addr")
C=$(cat "$RUN/c.addr")
N=64
gen() { # NAME [ARGS...]: runs in the foreground, writes $RUN/NAME.json
  local name=$1
  shift
  "$GW" generate --backend cpu --threads 2 --model "$MODEL" --prompt "$PROMPT" --max-new-tokens $N --no-stop \
    --mode flat --attn-top-k 4096 --sink 4 --window 8 --json "$RUN/$name.json" "$@" >"$RUN/$name.out" 2>"$RUN/$name.log"
}
gen calm --stores "$A,$B" --replicas 2

gen killed --stores "$A,$B" --replicas 2 &
W=$!
wait_for_output "$RUN/killed.out"
kill -KILL "${PIDS[1]}"
if ! wait $W; then
  echo "FAIL: the generation did not survive the loss of a replica:" >&2
  cat "$RUN/killed.log" >&2
  exit 1
fi
python3 - "$RUN" "$B" <<'PY'
import json, sys
run, b = sys.argv[1], sys.argv[2]
calm = json.load(open(f"{run}/calm.json"))
killed = json.load(open(f"{run}/killed.json"))
assert len(calm["tokens"]) == 64, calm["tokens"]
assert killed["tokens"] == calm["tokens"], (killed["tokens"], calm["tokens"])
health = {h["store"]: h for h in killed["store_health"]}
assert health[b]["down"] and health[b]["error"], health
assert not any(h["down"] for s, h in health.items() if s != b), health
assert not any(h["down"] for h in calm["store_health"]), calm["store_health"]
PY
grep -q "marked down" "$RUN/killed.log" || { echo "FAIL: no log line for the store marked down" >&2; exit 1; }

# b is gone: a fresh b', and the spare c
start_store b2 "$KVS" --memory-budget 256M --threads 1
B=$(cat "$RUN/b2.addr")
gen spare --stores "$A,$B" --replicas 2 --spare-stores "$C" &
W=$!
wait_for_output "$RUN/spare.out"
kill -KILL "${PIDS[3]}" # b'
wait_for_output "$RUN/spare.out" 60
kill -KILL "${PIDS[0]}" # a: c holds every shard now
if ! wait $W; then
  echo "FAIL: the generation did not survive on the spare:" >&2
  cat "$RUN/spare.log" >&2
  exit 1
fi
python3 - "$RUN" "$A" "$B" "$C" <<'PY'
import json, sys
run, a, b, c = sys.argv[1:]
calm = json.load(open(f"{run}/calm.json"))
spare = json.load(open(f"{run}/spare.json"))
assert spare["tokens"] == calm["tokens"], (spare["tokens"], calm["tokens"])
health = {h["store"]: h for h in spare["store_health"]}
assert health[c]["replaced"] == b and not health[c]["down"] and health[c]["rows"] > 0, health
assert health[a]["down"], health
PY
grep -q "replaced by spare" "$RUN/spare.log" || { echo "FAIL: no log line for the spare" >&2; exit 1; }
echo "ok: kill -9 of one of two replicas mid-decode, same tokens as undisturbed; a spare restores R"
