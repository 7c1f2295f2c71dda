# Sourced by scripts that run kv-stores on loopback (deploy/demo.sh, tests): sets RUN (a
# temporary directory) and PIDS, and traps EXIT to stop everything in PIDS and remove RUN.
#   start_store NAME KV_STORE [ARGS...]
# starts a kv-store on a free loopback port and waits until it serves; its address is then in
# $RUN/NAME.addr, its output in $RUN/NAME.log. (Not called as $(...): the subshell would wait
# for the store's stdout.)
RUN=$(mktemp -d)
PIDS=()
stores_cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$RUN"
}
trap stores_cleanup EXIT

start_store() {
  local name=$1 bin=$2
  shift 2
  "$bin" --listen 127.0.0.1:0 --ready-file "$RUN/$name.addr" "$@" >"$RUN/$name.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do
    [ -s "$RUN/$name.addr" ] && return 0
    sleep 0.1
  done
  echo "kv-store $name did not start; its log:" >&2
  cat "$RUN/$name.log" >&2
  return 1
}
