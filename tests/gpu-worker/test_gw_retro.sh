#!/usr/bin/env bash
# Retrospective correction on the CPU backend against two real kv-stores on loopback: with every
# offloaded key retrieved, --retro 2 and --retro 0 generate full attention's tokens and no past
# query gets a supplementary row (nothing is unseen); with 4 keys per head (flat and roar)
# --retro 2 still answers the question as full attention does, and every step's JSON shows the
# supplementary work (past steps corrected, rows, time). Wave the same way: with every cluster in
# the retrieval zone --retro 2 equals --retro 0 equals full attention and supplements nothing;
# with a quarter of the clusters retrieved and a quarter estimated it answers as full and
# supplements past steps with the clusters retrieved after them.
#   test_gw_retro.sh GPU_WORKER KV_STORE MODEL
set -euo pipefail
GW=$1
KVS=$2
MODEL=$3
. "$(dirname "$0")/../../deploy/loopback-stores.sh"
start_store a "$KVS" --memory-budget 256M --threads 1
start_store b "$KVS" --memory-budget 256M --threads 1
STORES="$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")"

PROMPT="The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid."
PROMPT+=" The capital of Germany is Berlin. The capital of Portugal is"
gen() { # NAME MODE [ARGS...]: writes $RUN/NAME.json
  local name=$1 mode=$2
  shift 2
  if ! "$GW" generate --backend cpu --threads 2 --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 8 \
    --no-stop --mode "$mode" --json "$RUN/$name.json" "$@" >"$RUN/$name.log" 2>&1; then
    echo "FAIL: $name:" >&2
    cat "$RUN/$name.log" >&2
    return 1
  fi
}
OFF=(--stores "$STORES" --sink 4 --window 8)
gen full full
gen all0 flat "${OFF[@]}" --attn-top-k 4096 --retro 0
gen all2 flat "${OFF[@]}" --attn-top-k 4096 --retro 2
gen flat2 flat "${OFF[@]}" --attn-top-k 4 --retro 2
gen roar2 roar "${OFF[@]}" --attn-top-k 4 --retro 2
WAVE=("${OFF[@]}" --wave-cluster 2 --wave-block 2)
gen wall0 wave "${WAVE[@]}" --retrieve 1 --estimate 0 --retro 0
gen wall2 wave "${WAVE[@]}" --retrieve 1 --estimate 0 --retro 2
gen wave2 wave "${WAVE[@]}" --retrieve 0.25 --retrieve-min 0 --estimate 0.25 --retro 2
# the device buffer's clusters would not be supplemented
if "$GW" generate --backend cpu --model "$MODEL" --prompt x --mode wave "${OFF[@]}" --wave-buffer 4 --retro 2 \
  >"$RUN/bad.log" 2>&1; then
  echo "FAIL: --retro with --wave-buffer was accepted" >&2
  exit 1
fi
grep -q -- "--retro takes no --wave-buffer" "$RUN/bad.log"
# a retro window must leave the corrected tokens on the device
if "$GW" generate --backend cpu --model "$MODEL" --prompt x --mode flat "${OFF[@]}" --retro 8 >"$RUN/bad.log" 2>&1; then
  echo "FAIL: --retro 8 with --window 8 was accepted" >&2
  exit 1
fi
grep -q -- "--retro 8 must be below --window 8" "$RUN/bad.log"
python3 - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
full = json.load(open(f"{run}/full.json"))
for name in ("all0", "all2", "wall0", "wall2"):
    d = json.load(open(f"{run}/{name}.json"))
    assert d["tokens"] == full["tokens"], (name, d["tokens"], full["tokens"])
    for s in d["steps"]:
        assert s["retro_rows"] == 0, (name, s)
all2 = json.load(open(f"{run}/all2.json"))
assert all2["retro"] == 2 and [s["retro_past"] for s in all2["steps"]] == [0, 1] + [2] * 5, all2["steps"]
for name in ("flat2", "roar2", "wave2"):
    d = json.load(open(f"{run}/{name}.json"))
    assert d["retro"] == 2
    # the answer: full attention's first tokens
    assert d["tokens"][:2] == full["tokens"][:2], (name, d["tokens"], full["tokens"])
    steps = d["steps"]
    assert [s["retro_past"] for s in steps] == [0, 1] + [2] * 5, steps
    assert all(s["retro_us"] > 0 for s in steps[1:]), steps
    assert sum(s["retro_rows"] for s in steps) > 0 and all(s["retro_rows"] == 0 for s in steps[:1]), steps
PY
echo "ok: retro with every key (wave: every cluster) equals full; with fewer it answers as full and reports its supplementary work"
