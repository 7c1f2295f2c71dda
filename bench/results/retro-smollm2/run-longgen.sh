#!/usr/bin/env bash
# The accuracy suite's long-generation measurements on SmolLM2 (CPU): longgen_needles (k coded
# items asked in sequence in one generation, each answer scored) and teacher-forced fidelity over
# full attention's own 1,024-token greedy continuation; full / flat top-16 / flat top-16 with
# --retro 2 (sink 4, window 32, two loopback stores), each from one prefill.
#   bench/results/retro-smollm2/run-longgen.sh BUILD_BIN OUT_DIR [EXTRA MODES, e.g. ,roar,roar+retro2]
# PARTS=longgen or PARTS=fidelity runs one part only.
set -euo pipefail
BIN=$1
OUT=$2
EXTRA=${3:-}
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
. deploy/loopback-stores.sh
start_store a "$BIN/kv-store" --memory-budget 512M --threads 1
start_store b "$BIN/kv-store" --memory-budget 512M --threads 1
STORES="$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")"
COMMON=(--model "$MODEL" --backend cpu --threads 2 --stores "$STORES" --modes "full,flat,flat+retro2$EXTRA"
  --sink 4 --window 32 --top-k 16)
PARTS=${PARTS:-longgen,fidelity}
# the two parts as two processes, so that each can be rerun alone
PIDS_RUN=()
if [[ $PARTS == *longgen* ]]; then
  "$BIN/accuracy-bench" "${COMMON[@]}" --out "$OUT/longgen" --tasks longgen_needles --lengths 1024 --samples 2 \
    --fidelity-prompt 0 >"$OUT/longgen.log" 2>&1 &
  PIDS_RUN+=($!)
fi
if [[ $PARTS == *fidelity* ]]; then
  "$BIN/accuracy-bench" "${COMMON[@]}" --out "$OUT/fidelity" --tasks none --fidelity-prompt 512 \
    --fidelity-tokens 1024 --fidelity-text generated >"$OUT/fidelity.log" 2>&1 &
  PIDS_RUN+=($!)
fi
for p in "${PIDS_RUN[@]}"; do wait "$p"; done
