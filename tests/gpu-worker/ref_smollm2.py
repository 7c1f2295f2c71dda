#!/usr/bin/env python3
"""Independent reference for the gpu-worker CPU runtime on SmolLM2-135M-Instruct (Q4_1 GGUF).

Written separately from the C code, from the model definitions:
  * weights are dequantized by the `gguf` package's own quants module;
  * the forward pass is plain NumPy (float64) in the Hugging Face layout: the GGUF converter
    permuted q/k rows for adjacent-pair RoPE, so this script un-permutes them and applies
    rotate-half RoPE, which checks that the C runtime's pairing matches the file;
  * tokenization uses Hugging Face `tokenizers` (Rust) built from the GGUF vocabulary and merges
    with SmolLM2's pre-tokenizer (split digits, byte-level).
It runs `gpu-worker tokenize` and `gpu-worker logits` and compares:
  token ids for a set of strings (exact), and for a fixed prompt the logits of every position
  (max abs error bound, identical argmax at every position).
Usage: ref_smollm2.py GPU_WORKER_BIN MODEL.gguf WORKDIR
"""
import json
import os
import subprocess
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPT = ("The history of the Roman Empire spans many centuries. It began when Augustus became "
          "the first emperor in 27 BC, and the city of Rome grew into")
TOKENIZER_CASES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It's 2024; we'll see 3.14159 and 1,000,000 items!",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "naïve café, Übermäßig, ça va? Ελληνικά, русский язык",
    "日本語のテキストと中文字符",
    "emoji 🙂🚀 and symbols ©®™ → ∑",
    "code: def f(x):\n    return x**2  # square",
    "<|im_start|>user\nHi there<|im_end|>\n",
]
MAX_ABS_LOGIT_ERR = 2e-2


def field_str(r, key):
    f = r.fields[key]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def field_strs(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_num(r, key):
    f = r.fields[key]
    return f.parts[f.data[0]][0].item()


def run(args):
    out = subprocess.run(args, check=False, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}")
    return out.stdout


def hf_tokenizer(r):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import AddedToken
    tokens = field_strs(r, "tokenizer.ggml.tokens")
    types = list(r.fields["tokenizer.ggml.token_type"].data)
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in types]
    merges = [tuple(m.split(" ", 1)) for m in field_strs(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok.add_special_tokens(specials)
    return tok


def check_tokenizer(r, bin_path, model, work):
    tok = hf_tokenizer(r)
    failures = 0
    for i, text in enumerate(TOKENIZER_CASES):
        want = tok.encode(text, add_special_tokens=False).ids
        pf = os.path.join(work, f"tok_{i}.txt")
        with open(pf, "w", encoding="utf-8") as f:
            f.write(text)
        got = json.loads(run([bin_path, "tokenize", "--model", model, "--prompt-file", pf]))
        # the CLI drops one final newline of a prompt file (editor artifact): compare on the same text
        if text.endswith("\n"):
            want = tok.encode(text[:-1], add_special_tokens=False).ids
        if got != want:
            failures += 1
            print(f"tokenizer mismatch on {text!r}:\n  C:  {got}\n  HF: {want}")
    return failures


def weights(r):
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type)
        w[t.name] = np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])
    return w


def unpermute(w, n_head):
    # inverse of the converter's  w.reshape(n_head, 2, d/2, cols).swapaxes(1, 2)
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def forward(r, w, ids):
    L = field_num(r, "llama.block_count")
    nh = field_num(r, "llama.attention.head_count")
    nkv = field_num(r, "llama.attention.head_count_kv")
    dim = field_num(r, "llama.embedding_length")
    theta = field_num(r, "llama.rope.freq_base")
    eps = field_num(r, "llama.attention.layer_norm_rms_epsilon")
    hd = dim // nh
    n = len(ids)
    x = w["token_embd.weight"][ids]  # [n, dim]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # [hd/2]
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]  # [n, hd/2]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]  # [n, 1, hd]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]

    def rope(t):  # t: [n, heads, hd], rotate-half convention
        h = hd // 2
        rot = np.concatenate([-t[..., h:], t[..., :h]], axis=-1)
        return t * cos + rot * sin

    mask = np.triu(np.full((n, n), -np.inf), k=1)
    for l in range(L):
        p = f"blk.{l}."
        h = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q = (h @ unpermute(w[p + "attn_q.weight"], nh).T).reshape(n, nh, hd)
        k = (h @ unpermute(w[p + "attn_k.weight"], nkv).T).reshape(n, nkv, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, nkv, hd)
        q, k = rope(q), rope(k)
        k = np.repeat(k, nh // nkv, axis=1)
        v = np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, v).reshape(n, nh * hd)
        x = x + o @ w[p + "attn_output.weight"].T
        h = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    x = rmsnorm(x, w["output_norm.weight"], eps)
    out = w.get("output.weight", w["token_embd.weight"])
    return x @ out.T


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    bin_path, model, work = sys.argv[1:]
    if not os.path.exists(model):
        sys.exit(f"FAIL: model file {model} is missing: run deploy/fetch-model.sh")
    os.makedirs(work, exist_ok=True)
    r = GGUFReader(model)
    failed = 0
    tok_fail = check_tokenizer(r, bin_path, model, work)
    print(f"tokenizer: {len(TOKENIZER_CASES) - tok_fail}/{len(TOKENIZER_CASES)} strings match HF tokenizers")
    failed += tok_fail > 0

    pf = os.path.join(work, "prompt.txt")
    with open(pf, "w") as f:
        f.write(PROMPT)
    ids = json.loads(run([bin_path, "tokenize", "--model", model, "--prompt-file", pf]))
    npy = os.path.join(work, "logits.npy")
    run([bin_path, "logits", "--model", model, "--prompt-file", pf, "--out", npy])
    got = np.load(npy).astype(np.float64)
    want = forward(r, weights(r), ids)
    if got.shape != want.shape:
        sys.exit(f"FAIL: logits shape {got.shape}, reference {want.shape}")
    err = np.abs(got - want).max()
    same = (got.argmax(-1) == want.argmax(-1))
    print(f"logits: {len(ids)} positions x {want.shape[1]} vocab; max abs error {err:.3e} "
          f"(bound {MAX_ABS_LOGIT_ERR}); logit range [{want.min():.1f}, {want.max():.1f}]; "
          f"argmax equal at {int(same.sum())}/{len(ids)} positions")
    if err > MAX_ABS_LOGIT_ERR or not same.all():
        failed += 1
    print(f"{2 - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
