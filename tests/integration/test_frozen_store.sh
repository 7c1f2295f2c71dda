#!/usr/bin/env bash
# A store that freezes (SIGSTOP) under a generation on two real kv-stores: mid-decode (flat) and
# mid-prefill (roar, while index builds run), the worker must stop with an error naming the
# frozen store within --store-timeout-ms plus a margin, never hang. Without a deadline on every
# call and keepalive pings, the decode took 32 s to notice at 2000 ms and the roar prefill hung
# in BuildIndex for minutes.
#   test_frozen_store.sh GPU_WORKER KV_STORE MODEL
set -euo pipefail
GW=$1
KVS=$2
MODEL=$3
TIMEOUT_MS=2000
# the limit asserted: the deadline, one keepalive period more (a ping is due at most T / 2 after
# the freeze and its ack T / 2 after that), and two seconds for the worker to finish the layer
# it is computing, report and exit on a shared 2-core machine (measured: 2.2 s mid-decode,
# 3.1 s mid-prefill). Only that last part scales under sanitizers (RA_TEST_SLOWDOWN, set by
# ctest: a layer of the 592-token prefill then takes seconds).
LIMIT_MS=$((TIMEOUT_MS + TIMEOUT_MS / 2 + 2000 * ${RA_TEST_SLOWDOWN:-1}))
. "$(dirname "$0")/../../deploy/loopback-stores.sh"
PROMPT=""
for i in $(seq 40); do PROMPT+="Line $i: the quick brown fox jumps over the lazy dog. "; done

now_ms() { date +%s%3N; }

# run NAME MODE TRIGGER: starts the worker, waits for TRIGGER (decode: generated text on stdout;
# prefill: store b has built an index and no text came yet), freezes store b and times the exit
run() {
  local name=$1 mode=$2 trigger=$3
  start_store "$name-a" "$KVS" --memory-budget 256M --threads 1
  start_store "$name-b" "$KVS" --memory-budget 256M --threads 1
  local b_pid=${PIDS[-1]} b_addr
  b_addr=$(cat "$RUN/$name-b.addr")
  "$GW" generate --backend cpu --threads 2 --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 400 --no-stop \
    --mode "$mode" --stores "$(cat "$RUN/$name-a.addr"),$b_addr" --sink 4 --window 16 --attn-top-k 64 \
    --store-timeout-ms "$TIMEOUT_MS" >"$RUN/$name.out" 2>"$RUN/$name.err" &
  local gw=$! waited=0
  while :; do
    if [ "$trigger" = decode ] && [ -s "$RUN/$name.out" ]; then break; fi
    if [ "$trigger" = prefill ] && grep -q "index of layer" "$RUN/$name-b.log"; then break; fi
    kill -0 "$gw" 2>/dev/null || { echo "FAIL: $name: the worker ended before the freeze" >&2; cat "$RUN/$name.err" >&2; return 1; }
    sleep 0.05
    waited=$((waited + 1))
    [ "$waited" -lt 6000 ] || { echo "FAIL: $name: no $trigger within 300 s" >&2; return 1; }
  done
  if [ "$trigger" = prefill ] && [ -s "$RUN/$name.out" ]; then
    echo "FAIL: $name: the decode had begun: the freeze is not mid-prefill" >&2
    return 1
  fi
  kill -STOP "$b_pid"
  local t0 t1 rc=0
  t0=$(now_ms)
  wait "$gw" || rc=$?
  t1=$(now_ms)
  kill -CONT "$b_pid"
  local took=$((t1 - t0))
  echo "$name: the worker exited $rc ${took} ms after the freeze (limit $LIMIT_MS ms)"
  tail -2 "$RUN/$name.err"
  if [ "$rc" -eq 0 ]; then echo "FAIL: $name: the generation succeeded with a frozen store" >&2; return 1; fi
  if ! grep -q "$b_addr" "$RUN/$name.err"; then
    echo "FAIL: $name: the error does not name the frozen store $b_addr:" >&2
    cat "$RUN/$name.err" >&2
    return 1
  fi
  if [ "$took" -gt "$LIMIT_MS" ]; then echo "FAIL: $name: ${took} ms > $LIMIT_MS ms" >&2; return 1; fi
}
run decode flat decode
run prefill roar prefill
echo "ok: a frozen store stops the decode and the roar prefill within the deadline"
