# Sourced by the worker's integration tests with real kv-stores, called as TEST GPU_WORKER
# KV_STORE MODEL: sets GW, KVS, MODEL, the loopback helpers (deploy/loopback-stores.sh: RUN,
# PIDS, start_store) and PROMPT, 33 SmolLM2 tokens (with sink 4 + window 8 on the device, 21 go
# to the stores: enough for roar's index build).
#   wait_for_output FILE [BYTES]: returns once FILE (a worker's stdout, which streams each token
#   as it is decoded) holds more than BYTES (default 8) of text: the worker is then mid-decode.
set -euo pipefail
GW=$1
KVS=$2
MODEL=$3
. "$(dirname "${BASH_SOURCE[0]}")/../../deploy/loopback-stores.sh"
PROMPT="The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid."
PROMPT+=" The capital of Germany is Berlin. The capital of Portugal is"

wait_for_output() {
  for _ in $(seq 500); do
    [ -f "$1" ] && [ "$(wc -c <"$1")" -gt "${2:-8}" ] && return 0
    sleep 0.02
  done
  echo "no output in $1" >&2
  return 1
}
