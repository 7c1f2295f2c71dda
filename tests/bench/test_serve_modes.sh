#!/bin/sh
# bench/serve/serve-modes.sh end to end on a random 2-layer SmolLM2-shaped model: full at 1 and
# 2 streams, flat at 2 with two real stores; every level completes, and the offloaded level
# reports a sequence's decode step by part from the server's /metrics (none for full), full the
# engine's step while all its streams decode; the stall
# phase (a 300-token prompt arriving while the streams decode, prefilled in pieces of 64 tokens'
# worth) reports its TTFT and the streams' gap across it. $1: the bin dir, $2: the tokenizer GGUF.
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
STORE_ARGS="--threads 1 --memory-budget 256M" "$here/../../bench/serve/serve-modes.sh" "$out" "$1" \
  "full@1,2 flat:--attn-top-k,8,--sink,16,--window,32@2" -- \
  --backend cpu --threads 1 --model random:smollm2-135m:2 --tokenizer "$2" --ctx 1024 --max-seqs 3 --max-cached 3 \
  --batch 64 --- --prompt-tokens 200 --max-tokens 24 --long-prompt-tokens 300 >/dev/null 2>&1 || { cat "$out"/*.log >&2; exit 1; }
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
full = json.load(open(f"{d}/serve-full_c1_2.json"))
flat = json.load(open(f"{d}/serve-flat_attntopk_8_sink_16_window_32_c2.json"))
for r in (full, flat):
    for lv in r["levels"]:
        assert lv["completed"] == lv["concurrency"] and not lv["errors"], lv
        assert lv["cached_tokens"] and lv["cached_tokens"] > 0, lv
        assert lv["decode_tok_s"] > 0, lv
assert [lv["concurrency"] for lv in full["levels"]] == [1, 2]
assert all(lv["decode_step_ms"] is None for lv in full["levels"]), full
# the engine's steps while every stream decodes: 24 tokens leave ~19 steps between the second
# token and the first stream's 22nd
for lv in full["levels"]:
    e = lv["engine_step_ms_all_running"]
    assert lv["engine_steps_all_running"] >= 10 and e["step"] > 0 and e["forward"] > 0, lv
lv = flat["levels"][0]
p = lv["decode_step_ms"]
assert lv["decode_steps"] >= 2 * 23, lv
assert p["total"] > 0 and 0 < p["wait"] <= p["total"] and p["store"] > 0, p
for r in (full, flat):
    for lv in r["levels"]:
        st = lv["stall"]
        assert not st["errors"] and st["long_prompt_tokens"] >= 250, st
        assert st["long_ttft_s"] > 0 and st["max_gap_during_s"] > 0 and st["gap_p50_s"] > 0, st
PY
