#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test under ctest, then the
# ASan/UBSan build of the suite and the bounded fuzz runs.
#   deploy/test.sh             everything
#   deploy/test.sh --quick     the normal build's ctest only
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/setup.sh
BUILD_DIR=build deploy/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo
(cd build && ctest --output-on-failure -j "$(nproc)")
[ "${1:-}" = "--quick" ] && exit 0

echo "== sanitizer build (ASan + UBSan)"
BUILD_DIR=build-asan deploy/build.sh -DCMAKE_BUILD_TYPE=Debug -DRA_SANITIZE=ON -DRA_CUDA=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j "$(nproc)" -LE slow)

echo "== fuzzing (bounded)"
BUILD_DIR=build-fuzz deploy/build.sh -DCMAKE_C_COMPILER=clang -DRA_FUZZ=ON -DRA_CUDA=OFF
(cd build-fuzz && ctest --output-on-failure -L fuzz)
