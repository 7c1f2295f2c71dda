#!/usr/bin/env bash
# The worker over TLS with a bearer token to two real kv-stores (CA and certificates made by
# openssl here): flat with top-k covering every offloaded key generates full attention's greedy
# tokens; without the token the stores refuse it (UNAUTHENTICATED), and without --store-tls-ca
# (plaintext) it cannot connect.
#   test_tls_worker.sh GPU_WORKER KV_STORE MODEL
set -euo pipefail
GW=$1
KVS=$2
MODEL=$3
command -v openssl >/dev/null || { echo "skipped: no openssl"; exit 77; }
. "$(dirname "$0")/../../deploy/loopback-stores.sh"
(
  cd "$RUN"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ra-test-ca -keyout ca.key -out ca.pem
  openssl req -newkey rsa:2048 -nodes -subj /CN=ra-test-store -keyout store.key -out store.csr
  echo "subjectAltName=IP:127.0.0.1,DNS:localhost" >store.ext
  openssl x509 -req -in store.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile store.ext -out store.pem
  echo "worker-token-5f1c9a" >token
  echo "another-token" >wrong
) >/dev/null 2>&1
SEC=(--tls-cert "$RUN/store.pem" --tls-key "$RUN/store.key" --auth-token-file "$RUN/token")
start_store a "$KVS" --memory-budget 256M --threads 1 "${SEC[@]}"
start_store b "$KVS" --memory-budget 256M --threads 1 "${SEC[@]}"
STORES="$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")"
PROMPT="The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid."
gen() { # NAME ARGS...: $RUN/NAME.json, $RUN/NAME.log; returns the worker's status
  local name=$1
  shift
  "$GW" generate --backend cpu --threads 2 --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 4 --no-stop \
    --json "$RUN/$name.json" "$@" >"$RUN/$name.log" 2>&1
}
gen full --mode full
OFF=(--mode flat --stores "$STORES" --sink 4 --window 8 --attn-top-k 4096)
if ! gen tls "${OFF[@]}" --store-tls-ca "$RUN/ca.pem" --auth-token-file "$RUN/token"; then
  echo "FAIL: the worker over TLS with the token:" >&2
  cat "$RUN/tls.log" >&2
  exit 1
fi
python3 - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
full, tls = (json.load(open(f"{run}/{n}.json")) for n in ("full", "tls"))
assert tls["prefill"]["n_offloaded"] > 0, tls["prefill"]
assert tls["tokens"] == full["tokens"], (tls["tokens"], full["tokens"])
PY
if gen wrong "${OFF[@]}" --store-tls-ca "$RUN/ca.pem" --auth-token-file "$RUN/wrong"; then
  echo "FAIL: a wrong token was accepted" >&2
  exit 1
fi
grep -q UNAUTHENTICATED "$RUN/wrong.log" || { echo "FAIL: no UNAUTHENTICATED:" >&2; cat "$RUN/wrong.log" >&2; exit 1; }
if gen plain "${OFF[@]}" --auth-token-file "$RUN/token" --store-timeout-ms 3000; then
  echo "FAIL: a plaintext worker was served by TLS stores" >&2
  exit 1
fi
grep -q UNAVAILABLE "$RUN/plain.log" || { echo "FAIL: plaintext not refused as UNAVAILABLE:" >&2; cat "$RUN/plain.log" >&2; exit 1; }
echo "ok: the worker over TLS with its token equals full attention; a wrong token and plaintext are refused"
