#!/usr/bin/env bash
# Wave and retrospective correction on the accuracy suite, four accuracy-bench processes at once
# against two loopback kv-stores:
#   suite/    wave against full and flat on the needle tasks (counted where full >= 50 %)
#   fid/      teacher-forced text fidelity of flat, roar and wave next to full
#   longgen/  longgen_needles with full / wave / wave+retro2 / flat / flat+retro2
#   fid1024/  fidelity over full's own 1,024-token continuation, the same modes
#   bench/accuracy/run-wave-retro.sh BIN_DIR MODEL CORPUS_DIR OUT_DIR [BACKEND]
#   env: SUITE_LENGTHS (2048,4096,8192), LONGGEN_LENGTHS (1024,2048,4096), FID_TOKENS (256),
#        LONG_TOKENS (1024), STORE_THREADS (7), LIMIT_S (each process's time limit, 0: none)
# The long-generation parts use sink 4, window 32, top-k 16 so that most of the context is
# offloaded. Writes OUT_DIR/{suite,fid,longgen,fid1024}/ and their logs.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 BIN_DIR MODEL CORPUS_DIR OUT_DIR [cpu|cuda]" >&2; exit 2; }
bin=$1 model=$2 corpus=$3 out=$4 backend=${5:-cpu}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
# shellcheck source=../../deploy/loopback-stores.sh
. "$here/../../deploy/loopback-stores.sh"
start_store a "$bin/kv-store" --memory-budget 8G --threads "${STORE_THREADS:-7}"
start_store b "$bin/kv-store" --memory-budget 8G --threads "${STORE_THREADS:-7}"
common=(--backend "$backend" --model "$model" --corpus "$corpus" --stores "$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")")
long=(--sink 4 --window 32 --top-k 16 --modes full,wave,wave+retro2,flat,flat+retro2)
limit=()
[ "${LIMIT_S:-0}" -gt 0 ] && limit=(timeout "$LIMIT_S")
runs=()
part() { # NAME ARGS...: one accuracy-bench process in the background
  local name=$1
  shift
  "${limit[@]}" "$bin/accuracy-bench" "${common[@]}" --out "$out/$name" "$@" >"$out/$name.log" 2>&1 &
  runs+=($!)
}
part suite --tasks niah_single_number,passkey,niah_multikey --lengths "${SUITE_LENGTHS:-2048,4096,8192}" \
  --depths 0.25,0.75 --fidelity-prompt 0 --modes full,flat,wave
part fid --tasks none --fidelity-prompt 4096 --fidelity-tokens "${FID_TOKENS:-256}" --build-queries 512 \
  --modes full,flat,roar,wave
part longgen --tasks longgen_needles --lengths "${LONGGEN_LENGTHS:-1024,2048,4096}" --samples 2 \
  --fidelity-prompt 0 "${long[@]}"
part fid1024 --tasks none --fidelity-prompt 512 --fidelity-tokens "${LONG_TOKENS:-1024}" --fidelity-text generated \
  "${long[@]}"
# the stores run in the background too: wait for the four runs only
rc=0
for p in "${runs[@]}"; do wait "$p" || rc=1; done
cat "$RUN/a.log" "$RUN/b.log" >"$out/stores.log"
exit $rc
