#!/usr/bin/env bash
# Tensor parallelism in real processes on the CPU backend: SmolLM2 (3 kv heads) generates full
# attention's greedy tokens with --tp 3 in full mode, and in flat mode (every offloaded key
# retrieved, so exact) with --tp 3 over three kv-stores dealt by --stores and with --tp 2 (kv
# heads 0 | 1-2) over a shard map whose rank 0 heads live at one store only, while the other
# rank's head 2 is split by token range across two; a --tp that does not divide the heads into
# whole ones is refused with a message.
#   test_gw_tp_stores.sh GPU_WORKER KV_STORE MODEL
set -euo pipefail
GW=$1
KVS=$2
MODEL=$3
. "$(dirname "$0")/../../deploy/loopback-stores.sh"
for s in a b c; do start_store $s "$KVS" --memory-budget 256M --threads 1; done
A=$(cat "$RUN/a.addr") B=$(cat "$RUN/b.addr") C=$(cat "$RUN/c.addr")
cat >"$RUN/map.txt" <<MAP
$A  *  0    *
$B  *  1-2  0-19
$C  *  1-2  20-
MAP

PROMPT="The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid."
PROMPT+=" The capital of Germany is Berlin. The capital of Portugal is"
gen() { # NAME [ARGS...]: writes $RUN/NAME.json
  local name=$1
  shift
  if ! "$GW" generate --backend cpu --threads 2 --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 8 \
    --no-stop --json "$RUN/$name.json" "$@" >"$RUN/$name.log" 2>&1; then
    echo "FAIL: $name:" >&2
    cat "$RUN/$name.log" >&2
    return 1
  fi
}
OFF=(--mode flat --sink 4 --window 8 --attn-top-k 4096)
gen full
gen full3 --tp 3
gen flat3 --tp 3 "${OFF[@]}" --stores "$A,$B,$C"
gen flat2 --tp 2 "${OFF[@]}" --shard-map "$RUN/map.txt"
if "$GW" generate --backend cpu --model "$MODEL" --prompt x --tp 4 >"$RUN/bad.log" 2>&1; then
  echo "FAIL: --tp 4 with 3 kv heads was accepted" >&2
  exit 1
fi
grep -q "4 ranks for 3 kv heads" "$RUN/bad.log" || { cat "$RUN/bad.log" >&2; exit 1; }
python3 - "$RUN" <<'PY'
import json, sys
run = sys.argv[1]
full = json.load(open(f"{run}/full.json"))
assert full["tp"] == 1 and len(full["tokens"]) == 8
for name, tp, stores in (("full3", 3, None), ("flat3", 3, 1), ("flat2", 2, 1)):
    d = json.load(open(f"{run}/{name}.json"))
    assert d["tp"] == tp, (name, d["tp"])
    assert d["tokens"] == full["tokens"], (name, d["tokens"], full["tokens"])
    assert d["text"] == full["text"], (name, d["text"], full["text"])
    if stores is not None:
        # rank 0's view: the stores of its kv heads only (one of the three), which scored keys
        assert d["stores"] == stores, (name, d["stores"])
        assert d["prefill"]["n_offloaded"] > 0 and all(s["n_scanned"] > 0 for s in d["steps"]), (name, d["steps"])
PY
echo "ok: --tp 3 and --tp 2 with kv-stores generate full attention's tokens"
