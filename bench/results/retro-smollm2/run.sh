#!/usr/bin/env bash
# Free generation on SmolLM2 from a ~330-token prompt with a question at its end: full attention,
# flat top-16 with --retro 0 / 2 / 8 (sink 4, window 32, two loopback stores), 48 tokens each.
#   bench/results/retro-smollm2/run.sh BUILD_BIN OUT_DIR
set -euo pipefail
BIN=$1
OUT=$2
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
. deploy/loopback-stores.sh
start_store a "$BIN/kv-store" --memory-budget 256M --threads 1
start_store b "$BIN/kv-store" --memory-budget 256M --threads 1
STORES="$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")"
PROMPT=""
for c in "France Paris" "Italy Rome" "Spain Madrid" "Germany Berlin" "Poland Warsaw" "Austria Vienna" \
  "Greece Athens" "Norway Oslo" "Sweden Stockholm" "Finland Helsinki" "Ireland Dublin" "Hungary Budapest"; do
  set -- $c
  PROMPT+="The capital of $1 is $2. It is a large city with many museums, parks and old buildings. "
done
PROMPT+="The secret code is 7412. Question: list the capitals of France, Norway and Hungary, then say the secret code. Answer:"
gen() {
  local name=$1 mode=$2
  shift 2
  "$BIN/gpu-worker" generate --backend cpu --threads 2 --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 48 \
    --no-stop --mode "$mode" --json "$OUT/$name.json" "$@" >"$OUT/$name.log" 2>&1
}
gen full full
for w in 0 2 8; do gen "flat-retro$w" flat --stores "$STORES" --sink 4 --window 32 --attn-top-k 16 --retro $w; done
