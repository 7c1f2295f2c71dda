#!/usr/bin/env bash
# The fuzz targets' long run, outside CI: builds them (clang, -DRA_FUZZ=ON, in build-fuzz/ unless
# $BUILD_DIR says otherwise), then runs fuzz_service and fuzz_gguf one after the other, each for
# half of the time bound, at nice 19, from their seed corpora (kept in the build tree, so a
# later run continues from what this one found). Writes a JSON record of the executions each
# reached, the total against the goal and any crash, to OUT (default
# bench/results/fuzz-long/result.json); a crashing input is kept beside it (crash-TARGET-*) with
# the fuzzer's report. Exits 1 on a crash, 0 otherwise (a goal not reached is reported in the
# record, not an error: the time bound wins).
#   tests/fuzz/long-run.sh [--minutes M (20)] [--goal N (10000000)] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
MINUTES=20 GOAL=10000000 OUT=bench/results/fuzz-long/result.json
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES=$2; shift 2 ;;
    --goal) GOAL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: $0 [--minutes M] [--goal N] [--out FILE]" >&2; exit 2 ;;
  esac
done
BUILD_DIR=${BUILD_DIR:-build-fuzz}
# the sources the targets are built from (the targets compile the tree as it is now)
COMMIT=$(git describe --always --dirty 2>/dev/null || echo unknown)
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
nice -n 19 cmake -S . -B "$BUILD_DIR" -DCMAKE_C_COMPILER=clang -DRA_FUZZ=ON -DRA_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${LAUNCHER[@]}" >/dev/null
nice -n 19 cmake --build "$BUILD_DIR" -j 2 --target fuzz_service fuzz_service_corpus fuzz_gguf make_fuzz_seeds >/dev/null
SERVICE_CORPUS=$BUILD_DIR/tests/fuzz/corpus/service
GGUF_CORPUS=$BUILD_DIR/tests/gpu-worker/fuzz_gguf_corpus
mkdir -p "$GGUF_CORPUS" "$(dirname "$OUT")"
[ -n "$(ls -A "$GGUF_CORPUS")" ] || "$BUILD_DIR/bin/make_fuzz_seeds" "$GGUF_CORPUS"
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
SECONDS_EACH=$((MINUTES * 60 / 2))
status=0
run() { # name binary corpus extra...
  local name=$1 bin=$2 corpus=$3; shift 3
  local t0=$(date +%s) rc=0
  nice -n 19 "$bin" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$LOGS/$name-" "$@" "$corpus" >"$LOGS/$name.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    for a in "$LOGS/$name"-*; do [ -e "$a" ] && cp "$a" "$(dirname "$OUT")/crash-$(basename "$a")"; done
    grep -v ' I ra: ' "$LOGS/$name.log" | tail -60 >"$(dirname "$OUT")/crash-$name.log"
  fi
  local execs
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$LOGS/$name.log" | grep -o '[0-9]*$' | tail -1)
  local crash
  crash=$(ls "$LOGS" | grep -c "^$name-" || true)
  [ "$rc" -eq 0 ] || status=1
  printf '{"target": "%s", "executions": %s, "seconds": %d, "exit": %d, "crash_artifacts": %d, "corpus_files": %d}' \
    "$name" "${execs:-0}" $(( $(date +%s) - t0 )) "$rc" "$crash" "$(ls "$corpus" | wc -l)" >"$LOGS/$name.json"
  [ "$rc" -eq 0 ] || tail -40 "$LOGS/$name.log" >&2
}
run fuzz_service "$BUILD_DIR/bin/fuzz_service" "$SERVICE_CORPUS"
run fuzz_gguf "$BUILD_DIR/bin/fuzz_gguf" "$GGUF_CORPUS" -max_len=4096
total=$(cat "$LOGS"/*.json | grep -o '"executions": [0-9]*' | grep -o '[0-9]*$' | paste -sd+ | bc)
mkdir -p "$(dirname "$OUT")"
{
  printf '{"goal_executions": %d, "total_executions": %d, "goal_reached": %s, "minutes_bound": %d,\n' \
    "$GOAL" "$total" "$([ "$total" -ge "$GOAL" ] && echo true || echo false)" "$MINUTES"
  printf ' "host": "%s", "cores": %d, "nice": 19, "built_from": "%s",\n' "$(uname -srm)" "$(nproc)" "$COMMIT"
  printf ' "targets": [%s, %s]}\n' "$(cat "$LOGS/fuzz_service.json")" "$(cat "$LOGS/fuzz_gguf.json")"
} >"$OUT"
cat "$OUT"
exit $status
