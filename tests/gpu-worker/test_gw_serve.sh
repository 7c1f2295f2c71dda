#!/usr/bin/env bash
# gpu-worker serve end to end on the CPU backend with SmolLM2 and two real kv-stores on
# loopback: four servers (full attention without context reuse, the same within a device
# memory budget of two contexts, full attention with reuse, flat over the stores), driven by Python's openai client, curl and a raw socket
# (test_gw_serve.py), and scraped by a real Prometheus when its binary is installed.
#   test_gw_serve.sh GPU_WORKER KV_STORE MODEL
set -euo pipefail
GW=$1
KVS=$2
MODEL=$3
HERE=$(dirname "$0")
. "$HERE/../../deploy/loopback-stores.sh"
start_store a "$KVS" --memory-budget 512M --threads 1
start_store b "$KVS" --memory-budget 512M --threads 1
STORES="$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")"

start_serve() { # NAME ARGS...: a server on a free port; its address in $RUN/NAME.addr
  local name=$1
  shift
  "$GW" serve --backend cpu --threads 1 --model "$MODEL" --model-name smollm2 --listen 127.0.0.1:0 \
    --ready-file "$RUN/$name.addr" --ctx 1024 "$@" >"$RUN/$name.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$RUN/$name.pid"
  for _ in $(seq 300); do
    [ -s "$RUN/$name.addr" ] && return 0
    kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: serve $name did not start; its log:" >&2
  cat "$RUN/$name.log" >&2
  return 1
}
start_serve batch --max-cached 0 --max-seqs 8 --max-body 64K
# --kv-budget: one that holds no context is refused at startup, naming a context's size; a
# server whose budget holds two contexts runs four requests two at a time (test_gw_serve.py)
rc=0
"$GW" serve --backend cpu --threads 1 --model "$MODEL" --listen 127.0.0.1:0 --ctx 1024 --kv-budget 1M \
  >"$RUN/nobudget.log" 2>&1 || rc=$?
CTX_BYTES=$(sed -n 's/.*holds no context: one of 1024 tokens takes \([0-9]*\).*/\1/p' "$RUN/nobudget.log")
[ "$rc" -ne 0 ] && [ -n "$CTX_BYTES" ] ||
  { echo "FAIL: serve --kv-budget 1M: exit $rc, $(cat "$RUN/nobudget.log")" >&2; exit 1; }
start_serve budget --max-cached 0 --max-seqs 8 --kv-budget $((CTX_BYTES * 5 / 2))
start_serve reuse --max-seqs 4
start_serve flat --mode flat --stores "$STORES" --sink 4 --window 8 --attn-top-k 4096 --max-cached 0 --max-seqs 4 --batch 16

PROM=$(command -v prometheus || true)
if ! python3 "$HERE/test_gw_serve.py" "$RUN" "$PROM"; then
  for n in batch budget reuse flat; do echo "--- serve $n log:" >&2; tail -20 "$RUN/$n.log" >&2; done
  exit 1
fi

# SIGTERM: a server drains and exits 0
pid=$(cat "$RUN/reuse.pid")
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: serve exited $rc after SIGTERM" >&2; cat "$RUN/reuse.log" >&2; exit 1; }
grep -q "draining" "$RUN/reuse.log" || { echo "FAIL: no drain in the log" >&2; exit 1; }

# A store that goes away: /health says which, and a request fails naming it, the server stays up
kill -TERM "${PIDS[1]}"
wait "${PIDS[1]}" 2>/dev/null || true
FLAT=$(cat "$RUN/flat.addr")
code=$(curl -s -o "$RUN/health.json" -w '%{http_code}' "http://$FLAT/health")
[ "$code" = 503 ] && grep -q "$(cat "$RUN/b.addr")" "$RUN/health.json" ||
  { echo "FAIL: /health with a store down: $code $(cat "$RUN/health.json")" >&2; exit 1; }
code=$(curl -s -o "$RUN/fail.json" -w '%{http_code}' "http://$FLAT/v1/completions" \
  -d '{"model": "smollm2", "prompt": "The capital of France is Paris. The capital of Italy is", "max_tokens": 4, "temperature": 0}')
[ "$code" = 503 ] && grep -q "$(cat "$RUN/b.addr")" "$RUN/fail.json" ||
  { echo "FAIL: a request with a store down: $code $(cat "$RUN/fail.json")" >&2; exit 1; }
curl -sf "http://$FLAT/v1/models" >/dev/null || { echo "FAIL: the server is down after a store failure" >&2; exit 1; }
echo "ok: serve (openai client, streaming, batching, reuse, errors, disconnect, metrics, drain, store failure)"
