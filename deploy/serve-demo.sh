#!/usr/bin/env bash
# Two kv-stores on loopback, gpu-worker serve (SmolLM2-135M on the CPU backend, flat: sink +
# window on the worker, the rest in the stores) and one chat request with curl; prints the answer.
# Everything it starts is stopped on exit.  deploy/serve-demo.sh [--no-setup]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--no-setup" ]; then
  deploy/setup.sh
  BUILD_DIR=build deploy/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
BIN=build/bin
. deploy/loopback-stores.sh
start_store a "$BIN/kv-store" --memory-budget 2G
start_store b "$BIN/kv-store" --memory-budget 2G
"$BIN/gpu-worker" serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --model-name smollm2 --listen 127.0.0.1:0 \
  --ready-file "$RUN/serve.addr" --mode flat --stores "$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")" --sink 16 \
  --window 32 >"$RUN/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do [ -s "$RUN/serve.addr" ] && break; sleep 0.1; done
[ -s "$RUN/serve.addr" ] || { cat "$RUN/serve.log" >&2; exit 1; }
URL="http://$(cat "$RUN/serve.addr")"
echo "== gpu-worker serve on $URL, kv-stores $(cat "$RUN/a.addr") and $(cat "$RUN/b.addr")"
curl -s "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d '{"model": "smollm2", "temperature": 0,
  "max_tokens": 48, "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]}' |
  python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["choices"][0]["message"]["content"]); print(r["usage"])'
