#!/bin/sh
# gpu-worker generate --json in full mode: a parseable record whose per-step latencies match
# its decode steps and add up to no more than the decode time. $1: gpu-worker, $2: the GGUF
# whose tokenizer the random 2-layer SmolLM2-shaped model uses.
set -e
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$1" generate --model random:smollm2-135m:2 --tokenizer "$2" --prompt "hello world" \
  --max-new-tokens 6 --no-stop --json "$out" >/dev/null 2>&1
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
steps = d["steps"]
assert d["mode"] == "full", d["mode"]
assert d["generated_tokens"] == 6 and d["decode_steps"] == 5, d
assert len(steps) == d["decode_steps"], (len(steps), d["decode_steps"])
assert all(s["total_us"] > 0 for s in steps), steps
assert sum(s["total_us"] for s in steps) <= d["decode_s"] * 1e6, (steps, d["decode_s"])
PY
