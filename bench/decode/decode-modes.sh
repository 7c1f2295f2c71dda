#!/usr/bin/env bash
# One decode benchmark call: the same prompt through gpu-worker in several modes, each with two
# fresh kv-stores on loopback, then one summary of medians and ratios (summary.py).
#   bench/decode/decode-modes.sh OUTDIR BIN_DIR "MODES" -- GENERATE_ARGS...
#     MODES: e.g. "full roar wave"; "MODE:ARG,ARG,..." adds arguments for that mode alone
#            ("roar:--ef,400,--index-per-kv-head")
#   env STORE_ARGS (default "--threads 7 --index-threads 1 --memory-budget 50G")
# Writes OUTDIR/gen-NAME.json, OUTDIR/stores-NAME.log (NAME: the spec with ':' and ',' as '_'
# and '-' dropped: "wave_retrieve_0.036") and OUTDIR/summary.json.
set -euo pipefail
[ $# -ge 4 ] && [ "$4" = "--" ] || { echo "usage: $0 OUTDIR BIN_DIR \"MODES\" -- GENERATE_ARGS..." >&2; exit 2; }
out=$1 bin=$2 modes=$3
shift 4
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
read -r -a store_args <<<"${STORE_ARGS:---threads 7 --index-threads 1 --memory-budget 50G}"
for spec in $modes; do
  mode=${spec%%:*}
  extra=()
  [ "$spec" != "$mode" ] && IFS=, read -r -a extra <<<"${spec#*:}"
  name=$(printf '%s' "$spec" | tr ':,' '__' | tr -d -- '-')
  echo "== $name ${extra[*]}" >&2
  if [ "$mode" = full ]; then
    "$bin/gpu-worker" generate "$@" --json "$out/gen-$name.json" "${extra[@]}" >/dev/null
    continue
  fi
  (
    # shellcheck source=../../deploy/loopback-stores.sh
    . "$here/../../deploy/loopback-stores.sh"
    start_store a "$bin/kv-store" "${store_args[@]}"
    start_store b "$bin/kv-store" "${store_args[@]}"
    "$bin/gpu-worker" generate "$@" --mode "$mode" --stores "$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")" \
      --json "$out/gen-$name.json" "${extra[@]}" >/dev/null
    cat "$RUN/a.log" "$RUN/b.log" >"$out/stores-$name.log"
  )
done
python3 "$here/summary.py" "$out"/gen-*.json >"$out/summary.json"
cat "$out/summary.json"
