#!/usr/bin/env bash
# The demo: sets up, builds, starts two kv-stores on loopback, and
#   1. drives them with kvstore-demo: random KV sharded over both stores, attention per layer
#      merged with a local sink + window partial and checked against direct attention;
#   2. runs SmolLM2-135M on the CPU backend (gpu-worker generate) on a short prompt: full
#      attention, then roar and wave with most of the context in the stores.
# Everything it starts is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
BUILD_DIR=build deploy/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo
BIN=build/bin
. deploy/loopback-stores.sh
start_store a "$BIN/kv-store" --memory-budget 4G
start_store b "$BIN/kv-store" --memory-budget 4G
A=$(cat "$RUN/a.addr")
B=$(cat "$RUN/b.addr")
echo "== kv-stores listening on $A and $B"
echo "== kvstore-demo: 16K tokens, 4 layers, 8/2 q/kv heads, sharded over both stores"
"$BIN/kvstore-demo" --stores "$A,$B" --tokens 16384 --layers 4 --q-heads 8 --kv-heads 2 --head-dim 64

# A needle in ~1K tokens of natural text (Debian's GPL-3 text), asked of SmolLM2-135M-Instruct.
{ head -c 2400 /usr/share/common-licenses/GPL-3; printf '\nThe secret passkey is 48213. Remember it.\n';
  head -c 4800 /usr/share/common-licenses/GPL-3 | tail -c 2400;
  printf '\nWhat is the secret passkey? Answer with the number only.'; } >"$RUN/needle.txt"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== SmolLM2-135M, full attention (every token's KV on the worker)"
"$BIN/gpu-worker" generate --model "$MODEL" --prompt-file "$RUN/needle.txt" --chat --max-new-tokens 16
echo "== SmolLM2-135M, roar: sink 64 + window 128 on the worker, the rest in both stores behind"
echo "   attention-aware graph indexes (the index build at prefill takes ~15 s on 2 cores)"
"$BIN/gpu-worker" generate --model "$MODEL" --prompt-file "$RUN/needle.txt" --chat --max-new-tokens 16 \
  --mode roar --stores "$A,$B" --sink 64 --window 128 --json "$RUN/roar.json"
python3 - "$RUN/roar.json" <<'PY'
import json, statistics, sys
d = json.load(open(sys.argv[1]))
s = d["steps"]
print("roar: %d tokens offloaded per layer and kv head; per decode step (median) %.1f ms, of which "
      "%.1f ms waiting for the stores and %.1f ms appending the evicted token" % (
      s[-1]["n_offloaded"], statistics.median(x["total_us"] for x in s) / 1e3,
      statistics.median(x["wait_us"] for x in s) / 1e3, statistics.median(x["append_us"] for x in s) / 1e3))
PY
echo "== SmolLM2-135M, wave: the same split; the worker clusters the offloaded keys, picks clusters"
echo "   per step from their centroids, the stores attend exactly over the picked ones"
"$BIN/gpu-worker" generate --model "$MODEL" --prompt-file "$RUN/needle.txt" --chat --max-new-tokens 16 \
  --mode wave --stores "$A,$B" --sink 64 --window 128
