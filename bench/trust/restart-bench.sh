#!/usr/bin/env bash
# Restart of stores that keep their sessions on disk, measured mid-generation: two kv-stores on
# loopback with --data-dir; a generation runs; once it decodes, both stores are killed with
# SIGKILL and started again on their addresses from their directories; the worker reattaches
# (--store-reconnect-ms) and finishes. Reports each store's restart (spawn -> serving, which
# includes the journal replay), the bytes on disk, the stall seen by the decode and the tokens
# against an undisturbed run of the same command (same stores' flags, no kill).
#   bench/trust/restart-bench.sh OUTDIR BIN_DIR -- GENERATE_ARGS...
#   env STORE_ARGS (default "--threads 7 --index-threads 1 --memory-budget 50G"),
#       DATA (default: a directory under OUTDIR's filesystem is not assumed; mktemp -d)
# Writes OUTDIR/gen-calm.json, OUTDIR/gen-restarted.json, OUTDIR/stores.log, OUTDIR/restart.json.
set -euo pipefail
[ $# -ge 3 ] && [ "$3" = "--" ] || { echo "usage: $0 OUTDIR BIN_DIR -- GENERATE_ARGS..." >&2; exit 2; }
out=$1 bin=$2
shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
read -r -a store_args <<<"${STORE_ARGS:---threads 7 --index-threads 1 --memory-budget 50G}"
# shellcheck source=../../deploy/loopback-stores.sh
. "$here/../../deploy/loopback-stores.sh"
data=${DATA:-$RUN/data}
store_flags() { echo "${store_args[@]}" --data-dir "$data/$1" --session-idle-timeout 0; }

run_pair() { # NAME [GENERATE_ARGS...]: a generation against two fresh stores with data dirs
  local name=$1
  shift
  rm -rf "$data" "$RUN/a.addr" "$RUN/b.addr"
  mkdir -p "$data"
  PIDS=()
  # shellcheck disable=SC2046
  start_store a "$bin/kv-store" $(store_flags a)
  # shellcheck disable=SC2046
  start_store b "$bin/kv-store" $(store_flags b)
  "$bin/gpu-worker" generate "$@" --stores "$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")" \
    --json "$out/gen-$name.json" >"$RUN/$name.out" 2>"$RUN/$name.log" &
  GEN=$!
}

stop_pair() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

now_ms() { date +%s%3N; }

echo "== calm" >&2
run_pair calm "$@"
wait "$GEN" || { cat "$RUN/calm.log" >&2; exit 1; }
stop_pair

echo "== restarted" >&2
run_pair restarted "$@" --store-reconnect-ms 600000
# the decode has begun once the first generated text is out
until [ -s "$RUN/restarted.out" ]; do
  kill -0 "$GEN" 2>/dev/null || { cat "$RUN/restarted.log" >&2; exit 1; }
  sleep 0.2
done
sleep 1
bytes_a=$(du -sb "$data/a" | cut -f1)
bytes_b=$(du -sb "$data/b" | cut -f1)
kill -KILL "${PIDS[0]}" "${PIDS[1]}"
wait "${PIDS[0]}" "${PIDS[1]}" 2>/dev/null || true
t_kill=$(now_ms)
addr_a=$(cat "$RUN/a.addr") addr_b=$(cat "$RUN/b.addr")
rm -f "$RUN/a2.addr" "$RUN/b2.addr"
# shellcheck disable=SC2046
"$bin/kv-store" --listen "$addr_a" --ready-file "$RUN/a2.addr" $(store_flags a) >"$RUN/a2.log" 2>&1 &
PIDS=($!)
# shellcheck disable=SC2046
"$bin/kv-store" --listen "$addr_b" --ready-file "$RUN/b2.addr" $(store_flags b) >"$RUN/b2.log" 2>&1 &
PIDS+=($!)
ready_a="" ready_b=""
while [ -z "$ready_a" ] || [ -z "$ready_b" ]; do
  [ -z "$ready_a" ] && [ -s "$RUN/a2.addr" ] && ready_a=$(($(now_ms) - t_kill))
  [ -z "$ready_b" ] && [ -s "$RUN/b2.addr" ] && ready_b=$(($(now_ms) - t_kill))
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || { cat "$RUN/a2.log" "$RUN/b2.log" >&2; exit 1; }; done
  sleep 0.05
done
wait "$GEN" || { cat "$RUN/restarted.log" "$RUN/a2.log" "$RUN/b2.log" >&2; exit 1; }
stop_pair
cat "$RUN/a.log" "$RUN/a2.log" "$RUN/b.log" "$RUN/b2.log" >"$out/stores.log"

python3 - "$out" "$ready_a" "$ready_b" "$bytes_a" "$bytes_b" "$RUN/a2.log" "$RUN/b2.log" <<'PY' | tee "$out/restart.json"
import json, re, statistics, sys
out, ra, rb, ba, bb, la, lb = sys.argv[1:8]
calm = json.load(open(f"{out}/gen-calm.json"))
again = json.load(open(f"{out}/gen-restarted.json"))
def replay(log):
    m = re.search(r"(\d+) sessions restored from (\d+) records in ([0-9.]+) ms \((\d+) rows\)", open(log).read())
    return dict(zip(("sessions", "records", "replay_ms", "rows"), (int(m[1]), int(m[2]), float(m[3]), int(m[4])))) if m else None
def steps(j):
    return [s["total_us"] / 1e3 for s in j.get("steps", [])]
st = steps(again)
print(json.dumps({
    "context_tokens": calm.get("prompt_tokens"),
    "tokens_equal_undisturbed": calm["tokens"] == again["tokens"],
    "new_tokens": len(again["tokens"]),
    "stores": [
        {"store": "a", "restart_ms": int(ra), "data_bytes": int(ba), "replay": replay(la)},
        {"store": "b", "restart_ms": int(rb), "data_bytes": int(bb), "replay": replay(lb)},
    ],
    "decode_ms_p50_calm": statistics.median(steps(calm)) if steps(calm) else None,
    "decode_ms_p50_restarted": statistics.median(st) if st else None,
    "slowest_step_ms_restarted": max(st) if st else None,
    "prefill_s_calm": calm.get("prefill_s"),
}, indent=1))
PY
