#!/bin/sh
# bench/model/prefill-vs-hf.sh end to end on the CPU with a random 2-layer SmolLM2-shaped model
# and a stand-in for the HF peer (hf_prefill.py's arguments and output, a fixed 1 s per prompt):
# two prompts, two runs each; the summary holds both prompts' medians, all runs and the ratio to
# the peer; bad invocations are refused.
# $1: the bin dir, $2: the tokenizer GGUF.
set -e
here=$(cd "$(dirname "$0")" && pwd)
script="$here/../../bench/model/prefill-vs-hf.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 -c 'print(" ".join(["the quick brown fox jumps over the lazy dog"] * 60))' >"$out/prose.txt"
cat >"$out/peer.py" <<'PY'
import json, sys
args = sys.argv[1:]
reps = int(args[args.index("--reps") + 1])
for n in args[:args.index("--reps")]:
    print(json.dumps({"n_ctx": int(n), "reps": reps, "prefill_s_median": 1.0, "prefill_tok_s": float(n),
                      "prefill_s_all": [1.0] * reps}))
PY
HF_PREFILL="$out/peer.py" "$script" "$out/run" "$1" "$out/prose.txt" "400 1200" 2 -- \
  --model random:smollm2-135m:2 --tokenizer "$2" --batch 128 >/dev/null 2>&1
python3 - "$out/run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
runs = s["runs"]
assert len(runs) == 2, runs
assert runs[0]["prompt_tokens"] < runs[1]["prompt_tokens"], runs
for r in runs:
    assert len(r["ours_prefill_s_all"]) == 2 and r["ours_prefill_s_median"] > 0, r
    assert r["hf_sdpa_prefill_s_median"] == 1.0, r
    assert abs(r["ours_over_hf"] - r["ours_prefill_s_median"]) < 1e-3, r
PY
for bad in "0" "x"; do
  if HF_PREFILL="$out/peer.py" "$script" "$out/bad" "$1" "$out/prose.txt" "400" "$bad" -- --model random:smollm2-135m:2 \
    --tokenizer "$2" 2>/dev/null; then
    echo "FAIL: REPS '$bad' was accepted" >&2
    exit 1
  fi
done
if "$script" "$out/bad" "$1" "$out/no-such-prose.txt" "400" 2 -- --tokenizer "$2" 2>/dev/null; then
  echo "FAIL: a missing prose file was accepted" >&2
  exit 1
fi
if "$script" "$out/bad" "$1" "$out/prose.txt" "400" 2 2>/dev/null; then
  echo "FAIL: a call without -- and generate arguments was accepted" >&2
  exit 1
fi
echo "prefill-vs-hf.sh: 2 prompts x 2 runs summarized against the peer; 4 bad calls refused"
