#!/usr/bin/env bash
# Our prefill against the HF SDPA peer, in one call: for each prompt, `gpu-worker generate --mode
# full --max-new-tokens 1` REPS times (prefill_s: prompt in, first token out, model load
# excluded), then bench/model/hf_prefill.py at the same token counts (median of REPS after a
# warm-up), then one JSON of medians and ratios (prefill_summary.py).
#   bench/model/prefill-vs-hf.sh OUTDIR BIN_DIR PROSE "BYTES ..." REPS -- GENERATE_ARGS...
# Prompt i is the first BYTES_i bytes of the text file PROSE. GENERATE_ARGS name the model,
# tokenizer, backend and batch (e.g. --backend cuda --model random:llama3-8b --tokenizer tok.gguf
# --kv-dtype bf16 --batch 8192); the HF peer builds Llama-3-8B's geometry with random weights.
# Writes OUTDIR/gen-BYTES-R.json, OUTDIR/hf.jsonl and OUTDIR/summary.json.
#   env HF_PREFILL: the peer script (default bench/model/hf_prefill.py; its arguments and output)
set -euo pipefail
[ $# -ge 6 ] && [ "$6" = "--" ] || { echo "usage: $0 OUTDIR BIN_DIR PROSE \"BYTES ...\" REPS -- GENERATE_ARGS..." >&2; exit 2; }
out=$1 bin=$2 prose=$3 sizes=$4 reps=$5
shift 6
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$prose" ] || { echo "$0: no prose file $prose" >&2; exit 2; }
[[ $reps =~ ^[1-9][0-9]*$ ]] || { echo "$0: REPS must be a positive integer, not '$reps'" >&2; exit 2; }
mkdir -p "$out"
counts=()
for bytes in $sizes; do
  [[ $bytes =~ ^[1-9][0-9]*$ ]] || { echo "$0: BYTES must be positive integers, not '$bytes'" >&2; exit 2; }
  head -c "$bytes" "$prose" >"$out/prompt-$bytes.txt"
  for r in $(seq 1 "$reps"); do
    echo "== ours, $bytes bytes, run $r" >&2
    "$bin/gpu-worker" generate "$@" --mode full --max-new-tokens 1 --no-stop --prompt-file "$out/prompt-$bytes.txt" \
      --json "$out/gen-$bytes-$r.json" >/dev/null
  done
  counts+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt_tokens"])' "$out/gen-$bytes-1.json")")
  rm -f "$out/prompt-$bytes.txt"
done
echo "== HF SDPA at ${counts[*]} tokens" >&2
python3 "${HF_PREFILL:-$here/hf_prefill.py}" "${counts[@]}" --reps "$reps" >"$out/hf.jsonl"
python3 "$here/prefill_summary.py" "$out" >"$out/summary.json"
cat "$out/summary.json"
