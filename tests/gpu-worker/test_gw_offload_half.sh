#!/usr/bin/env bash
# A half-precision KV cache (--kv-dtype f16 / bf16) with the offload on the CPU backend, against
# two real kv-stores on loopback: roar (its kNN runs on the cache's half rows), flat with top-k
# covering every offloaded key and wave with every cluster retrieved (clustered from the half
# rows, growth blocks of 2 tokens), the stores keeping the cache's dtype, generate the same
# greedy tokens as full attention on the device.
#   test_gw_offload_half.sh GPU_WORKER KV_STORE MODEL
. "$(dirname "$0")/gw_stores.sh"
start_store a "$KVS" --memory-budget 256M --threads 1
start_store b "$KVS" --memory-budget 256M --threads 1
STORES="$(cat "$RUN/a.addr"),$(cat "$RUN/b.addr")"
gen() { # DTYPE MODE [ARGS...]: writes $RUN/DTYPE.MODE.json
  local dt=$1 mode=$2
  shift 2
  if ! "$GW" generate --backend cpu --threads 2 --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 4 \
    --no-stop --kv-dtype "$dt" --mode "$mode" --json "$RUN/$dt.$mode.json" "$@" >"$RUN/$dt.$mode.log" 2>&1; then
    echo "FAIL: --kv-dtype $dt --mode $mode:" >&2
    cat "$RUN/$dt.$mode.log" >&2
    return 1
  fi
}
for dt in bf16 f16; do
  gen "$dt" full
  for mode in roar flat; do
    gen "$dt" "$mode" --stores "$STORES" --store-dtype "$dt" --sink 4 --window 8 --attn-top-k 4096
  done
  gen "$dt" wave --stores "$STORES" --store-dtype "$dt" --sink 4 --window 8 --retrieve 1 --estimate 0 \
    --wave-cluster 2 --wave-block 2
  python3 - "$RUN" "$dt" <<'PY'
import json, sys
run, dt = sys.argv[1], sys.argv[2]
full = json.load(open(f"{run}/{dt}.full.json"))
assert len(full["tokens"]) == 4, full["tokens"]
for mode in ("roar", "flat", "wave"):
    d = json.load(open(f"{run}/{dt}.{mode}.json"))
    assert d["mode"] == mode and d["prefill"]["n_offloaded"] == 21, d["prefill"]
    assert d["tokens"] == full["tokens"], (dt, mode, d["tokens"], full["tokens"])
# wave: every offloaded row scanned once per q head and layer (9 heads, 30 layers), each step's
# selection timed
wave = json.load(open(f"{run}/{dt}.wave.json"))
want = {"retrieve": 1, "estimate": 0, "segment": 8192, "cluster": 2, "iters": 5, "block": 2, "buffer": 0,
        "buffer_hits": 0, "buffer_misses": 0, "buffer_rows": 0}
assert {k: wave["wave"][k] for k in want} == want, wave
for s in wave["steps"]:
    assert s["n_scanned"] == s["n_offloaded"] * 9 * 30 and s["select_us"] > 0, s
    assert s["buffer_hits"] == 0 and s["buffer_rows"] == 0, s
PY
done
echo "ok: f16 and bf16 caches, roar, flat and wave match full attention"
