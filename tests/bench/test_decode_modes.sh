#!/bin/sh
# bench/decode/decode-modes.sh end to end on a random 2-layer SmolLM2-shaped model: full and
# flat in one call, two real stores for flat; the summary holds both runs' medians and the
# ratio to full, and a bad invocation is refused. $1: the bin dir, $2: the tokenizer GGUF.
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
prompt=$(python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 40))')
STORE_ARGS="--threads 1 --memory-budget 256M" "$here/../../bench/decode/decode-modes.sh" "$out" "$1" "full flat:--attn-top-k,8" -- \
  --model random:smollm2-135m:2 --tokenizer "$2" --prompt "$prompt" --sink 16 --window 32 \
  --max-new-tokens 8 --no-stop >/dev/null 2>&1
python3 - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert set(s) == {"full", "flat_attntopk_8"}, s.keys()
assert s["flat_attntopk_8"]["mode"] == "flat"
for m, r in s.items():
    assert r["decode_steps"] == 5, (m, r)
    assert r["decode_ms_median"] > 0 and r["prefill_s"] > 0, (m, r)
assert s["full"]["decode_vs_full"] == 1.0
assert s["flat_attntopk_8"]["decode_vs_full"] > 0 and s["flat_attntopk_8"]["step_median_us"]["n_scanned"] > 0
PY
if "$here/../../bench/decode/decode-modes.sh" "$out" "$1" full 2>/dev/null; then
  echo "FAIL: a call without -- and generate arguments was accepted" >&2
  exit 1
fi
