#!/usr/bin/env bash
# Stores on other hosts: each kv-store runs in its own network namespace (a simulated host,
# linked to this one by a veth pair on a private /30), listening on that host's address only;
# kvstore-demo reaches both over the links and checks the merged attention against direct
# attention. Needs root (ip netns); CI runs as root.
#   test_netns_stores.sh BIN_DIR
set -euo pipefail
BIN=$1
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "SKIP: needs root and iproute2 to create network namespaces"
  exit 77
fi
TAG=ra$$
RUN=$(mktemp -d)
HOSTS=()
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  for h in "${HOSTS[@]}"; do ip netns del "$h" 2>/dev/null || true; ip link del "$h-r" 2>/dev/null || true; done
  rm -rf "$RUN"
}
trap cleanup EXIT

# make_host NAME INDEX: namespace NAME with address 10.213.INDEX.2, reached from here via 10.213.INDEX.1
make_host() {
  local name=$1 i=$2
  ip netns add "$name"
  HOSTS+=("$name")
  ip link add "$name-r" type veth peer name "$name-h"
  ip link set "$name-h" netns "$name"
  ip addr add "10.213.$i.1/30" dev "$name-r"
  ip link set "$name-r" up
  ip netns exec "$name" ip addr add "10.213.$i.2/30" dev "$name-h"
  ip netns exec "$name" ip link set "$name-h" up
  ip netns exec "$name" ip link set lo up
}

start_store() {
  local name=$1 addr=$2
  ip netns exec "$name" "$BIN/kv-store" --listen "$addr" --ready-file "$RUN/$name.addr" \
    --memory-budget 1G 2>"$RUN/$name.log" &
  PIDS+=($!)
  for _ in $(seq 100); do [ -s "$RUN/$name.addr" ] && return 0; sleep 0.1; done
  echo "kv-store in $name did not start:"; cat "$RUN/$name.log"
  return 1
}

i=$(( ($$ % 200) + 20 ))
make_host "${TAG}a" "$i"
make_host "${TAG}b" "$((i + 1))"
start_store "${TAG}a" "10.213.$i.2:7000"
start_store "${TAG}b" "10.213.$((i + 1)).2:7000"

# A store bound to its host's address is not reachable on this host's loopback.
if "$BIN/kvstore-demo" --stores 127.0.0.1:7000 --tokens 1024 >"$RUN/neg.log" 2>&1; then
  echo "FAIL: a store answered on loopback outside its namespace"; exit 1
fi
grep -q "127.0.0.1:7000" "$RUN/neg.log" || { echo "FAIL: unreachable store not named:"; cat "$RUN/neg.log"; exit 1; }

"$BIN/kvstore-demo" --stores "10.213.$i.2:7000,10.213.$((i + 1)).2:7000" --tokens 4096 \
  --layers 2 --q-heads 4 --kv-heads 2 --head-dim 64 --dtype bf16 | tee "$RUN/demo.log"
grep -q "exact" "$RUN/demo.log"
echo "PASS: stores in two network namespaces"
