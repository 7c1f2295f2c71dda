"""Prefill peer: HF transformers LlamaForCausalLM, Llama-3-8B geometry, random bf16 weights, SDPA,
batch 1; prints prefill tokens/s at the given context (median of 3 after a warm-up)."""
import json, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
n = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=1 << 20, rope_theta=500000.0)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
with torch.device("cuda"):
    torch.set_default_dtype(torch.bfloat16)
    model = LlamaForCausalLM(cfg)
model.eval()
ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
times = []
with torch.inference_mode():
    for i in range(4):
        torch.cuda.synchronize(); t = time.time()
        model(input_ids=ids, use_cache=True, logits_to_keep=1)
        torch.cuda.synchronize(); times.append(time.time() - t)
t = sorted(times[1:])[1]
print(json.dumps({"n_ctx": n, "prefill_s_median": round(t, 3), "prefill_tok_s": round(n / t, 1)}), flush=True)
