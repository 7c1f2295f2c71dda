#!/usr/bin/env python3
"""Builds a Hugging Face model directory, as the Hub ships one, from a llama-family GGUF:
config.json, model-0000N-of-0000S.safetensors + model.safetensors.index.json (F32: the GGUF's
dequantized values), tokenizer.json (made with the `tokenizers` package) and
tokenizer_config.json (with the chat template).

    make_hf_dir.py MODEL.gguf OUT_DIR [--shards N] [--pad-vocab N]

--pad-vocab N pads the vocabulary past the tokenizer's by N rows, as many checkpoints ship it
(vocab_size a multiple of 64 or 128): their output rows are large random values (seeded), so
that a pick over every logit would choose an id the tokenizer cannot decode.

The GGUF converter permutes q/k rows for adjacent-pair RoPE; they are permuted back here, so the
directory holds what transformers' checkpoint holds (rotate_half RoPE)."""
import argparse
import json
import os
import struct
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

GGUF_TO_HF = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def unpermute(w, n_head):
    """Inverse of llama.cpp's convert permute: rows (head, pair, half) -> (head, half, pair)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    _, layer, base, suffix = name.split(".")
    return f"model.layers.{layer}.{GGUF_TO_HF[base]}.{suffix}"


def write_safetensors(path, tensors):
    """The format: u64 header length, JSON header {name: {dtype, shape, data_offsets}}, data."""
    header, off = {}, 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def build_tokenizer(r):
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre = field(r, "tokenizer.ggml.pre")
    if pre != "smollm":
        sys.exit(f"make_hf_dir: pre-tokenizer {pre} not handled")
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == 3])
    return tok, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--pad-vocab", type=int, default=0)
    a = ap.parse_args()
    r = GGUFReader(a.gguf)
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"make_hf_dir: architecture {arch} not handled")
    n_head = int(field(r, "llama.attention.head_count"))
    n_kv = int(field(r, "llama.attention.head_count_kv", n_head))
    os.makedirs(a.out, exist_ok=True)

    tensors = []
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            w = unpermute(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute(w, n_kv)
        tensors.append((hf_name(t.name), w))
    tied = not any(n == "lm_head.weight" for n, _ in tensors)
    if a.pad_vocab:
        rng = np.random.default_rng(7)
        for i, (n, w) in enumerate(tensors):
            if n == "lm_head.weight" or (tied and n == "model.embed_tokens.weight"):
                pad = rng.normal(0.0, 1.0, (a.pad_vocab, w.shape[1])).astype(np.float32)
            elif n == "model.embed_tokens.weight":
                pad = np.zeros((a.pad_vocab, w.shape[1]), np.float32)
            else:
                continue
            tensors[i] = (n, np.concatenate([w, pad]))

    per = (len(tensors) + a.shards - 1) // a.shards
    weight_map, total = {}, 0
    for s in range(a.shards):
        fname = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
        part = tensors[s * per:(s + 1) * per]
        write_safetensors(os.path.join(a.out, fname), part)
        for n, w in part:
            weight_map[n] = fname
            total += w.nbytes
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    vocab_size = (int(field(r, "llama.vocab_size", 0)) or len(field(r, "tokenizer.ggml.tokens"))) + a.pad_vocab
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": int(field(r, "llama.embedding_length")),
        "intermediate_size": int(field(r, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(r, "llama.block_count")),
        "num_attention_heads": n_head, "num_key_value_heads": n_kv,
        "max_position_embeddings": int(field(r, "llama.context_length")),
        "rms_norm_eps": float(field(r, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(r, "llama.rope.freq_base", 10000.0)),
        "vocab_size": vocab_size, "tie_word_embeddings": tied,
        "bos_token_id": int(field(r, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(r, "tokenizer.ggml.eos_token_id")), "torch_dtype": "float32",
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    tok, tokens = build_tokenizer(r)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    tc = {
        "add_bos_token": bool(field(r, "tokenizer.ggml.add_bos_token", False)),
        "bos_token": tokens[config["bos_token_id"]], "eos_token": tokens[config["eos_token_id"]],
        "unk_token": tokens[int(field(r, "tokenizer.ggml.unknown_token_id", 0))],
        "chat_template": field(r, "tokenizer.chat_template"), "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": config["max_position_embeddings"],
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)


if __name__ == "__main__":
    main()
