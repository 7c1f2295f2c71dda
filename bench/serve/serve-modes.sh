#!/usr/bin/env bash
# One serve benchmark call: `gpu-worker serve` in several modes (offloaded ones with two fresh
# kv-stores on loopback), each driven by serve_bench.py.
#   bench/serve/serve-modes.sh OUTDIR BIN_DIR "MODES" -- SERVE_ARGS... [--- BENCH_ARGS...]
#     MODES: e.g. "full wave"; "MODE:ARG,ARG,..." adds serve arguments for that mode alone
#            ("full:--max-seqs,16", "wave:--max-seqs,32"); a @1,4,16 suffix sets the
#            concurrency levels of that server ("full@1,4,16"; NAME gains "_c1_4_16")
#   env STORE_ARGS (default "--threads 7 --index-threads 1 --memory-budget 50G")
# Writes OUTDIR/serve-NAME.json (NAME as in decode-modes.sh) and OUTDIR/serve-NAME.log.
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = "--" ] || { echo "usage: $0 OUTDIR BIN_DIR \"MODES\" -- SERVE_ARGS... [--- BENCH_ARGS...]" >&2; exit 2; }
out=$1 bin=$2 modes=$3
shift 4
serve_args=() bench_args=()
while [ $# -gt 0 ] && [ "$1" != "---" ]; do serve_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
bench_args=("$@")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
read -r -a store_args <<<"${STORE_ARGS:---threads 7 --index-threads 1 --memory-budget 50G}"
for spec in $modes; do
  levels=() tag=""
  case $spec in *@*) levels=(--concurrency "${spec##*@}") tag=_c${spec##*@}; spec=${spec%@*} ;; esac
  mode=${spec%%:*}
  extra=()
  [ "$spec" != "$mode" ] && IFS=, read -r -a extra <<<"${spec#*:}"
  name=$(printf '%s' "$spec$tag" | tr ':,' '__' | tr -d -- '-')
  echo "== $name ${extra[*]} ${levels[*]}" >&2
  (
    # shellcheck source=../../deploy/loopback-stores.sh
    . "$here/../../deploy/loopback-stores.sh"
    stores=()
    if [ "$mode" != full ] && [ "$mode" != streaming ]; then
      start_store a "$bin/kv-store" "${store_args[@]}"
      start_store b "$bin/kv-store" "${store_args[@]}"
      stores=(--stores "$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")")
    fi
    "$bin/gpu-worker" serve "${serve_args[@]}" --mode "$mode" "${stores[@]}" --listen 127.0.0.1:0 \
      --ready-file "$RUN/serve.addr" --model-name m "${extra[@]}" >"$out/serve-$name.log" 2>&1 &
    PIDS+=($!)
    until [ -s "$RUN/serve.addr" ]; do
      kill -0 "${PIDS[-1]}" 2>/dev/null || { cat "$out/serve-$name.log" >&2; exit 1; }
      sleep 0.5
    done
    python3 "$here/serve_bench.py" --url "http://$(cat "$RUN/serve.addr")" --model m "${levels[@]}" \
      --label "$name" --json "$out/serve-$name.json" "${bench_args[@]}" >/dev/null
    if [ ${#stores[@]} -gt 0 ]; then cat "$RUN/a.log" "$RUN/b.log" >>"$out/serve-$name.log"; fi
  )
done
