"""Prefill peer: HF transformers LlamaForCausalLM, Llama-3-8B geometry, random bf16 weights, SDPA,
batch 1. Usage: hf_prefill.py [N ...] [--reps R]: for each context N (default 32768), prefill
seconds as the median of R runs (default 3) after a warm-up run; one JSON line per context. The
model is built once for all contexts."""
import json, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
args = sys.argv[1:]
reps = 3
if "--reps" in args:
    i = args.index("--reps")
    reps = int(args[i + 1])
    del args[i:i + 2]
ctxs = [int(a) for a in args] or [32768]
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=1 << 20, rope_theta=500000.0)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
with torch.device("cuda"):
    torch.set_default_dtype(torch.bfloat16)
    model = LlamaForCausalLM(cfg)
model.eval()
for n in ctxs:
    ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
    times = []
    with torch.inference_mode():
        for i in range(reps + 1):
            torch.cuda.synchronize(); t = time.time()
            model(input_ids=ids, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize(); times.append(time.time() - t)
    t = sorted(times[1:])[len(times[1:]) // 2]
    print(json.dumps({"n_ctx": n, "reps": reps, "prefill_s_median": round(t, 3), "prefill_tok_s": round(n / t, 1),
                      "prefill_s_all": [round(x, 3) for x in times[1:]]}), flush=True)
    del ids
    torch.cuda.empty_cache()
