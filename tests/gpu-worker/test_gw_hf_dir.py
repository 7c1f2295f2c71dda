#!/usr/bin/env python3
"""--model DIR with a Hugging Face directory as shipped, built from the SmolLM2 GGUF by
make_hf_dir.py (2 safetensors shards + index, tokenizer.json, tokenizer_config.json): the same
token ids, greedy tokens and logits as the GGUF.

Tolerance: the CPU backend dequantizes the GGUF's Q4_1/Q8_0 weights to f32 at load and the
directory holds exactly those f32 values, so only the RoPE layout differs (the GGUF's permuted
q/k rows with adjacent-pair RoPE vs rotate_half): summation order, logits within 1e-3.

    test_gw_hf_dir.py GPU_WORKER MODEL.gguf WORKDIR"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
LOGIT_TOL = 1e-3
fails = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        fails.append(what)


def run(gw, *args, expect_ok=True):
    p = subprocess.run([gw, *args], capture_output=True, text=True, timeout=300)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAIL: gpu-worker {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def tokenize(gw, model, prompt, chat):
    out = run(gw, "tokenize", "--model", model, "--prompt", prompt, *(["--chat"] if chat else [])).stdout
    return json.loads(out.strip().splitlines()[-1])


def generate(gw, model, prompt, work, tag):
    js = os.path.join(work, f"gen_{tag}.json")
    run(gw, "generate", "--model", model, "--prompt", prompt, "--chat", "--max-new-tokens", "40",
        "--temperature", "0", "--threads", "2", "--json", js)
    with open(js) as f:
        return json.load(f)


def logits(gw, model, prompt, work, tag):
    out = os.path.join(work, f"logits_{tag}.npy")
    run(gw, "logits", "--model", model, "--prompt", prompt, "--chat", "--threads", "2", "--out", out)
    return np.load(out)


def main():
    gw, gguf, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    hf = os.path.join(work, "hf")
    subprocess.run([sys.executable, os.path.join(HERE, "make_hf_dir.py"), gguf, hf, "--shards", "2"], check=True)
    shards = sorted(f for f in os.listdir(hf) if f.endswith(".safetensors"))
    check(len(shards) == 2 and os.path.exists(os.path.join(hf, "model.safetensors.index.json")),
          f"directory has 2 shards + index: {shards}")

    ref = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    prompts = ["The 3 largest cities of France are", "Write a haiku about 2048 cats.\n  Indented <|im_end|> text!"]
    for p in prompts:
        ids_g, ids_h = tokenize(gw, gguf, p, False), tokenize(gw, hf, p, False)
        check(ids_h == ids_g, f"plain token ids equal the GGUF's ({len(ids_g)}): {p!r}")
        check(ids_h == ref.encode(p).ids, f"plain token ids equal the tokenizers package's: {p!r}")
        check(tokenize(gw, hf, p, True) == tokenize(gw, gguf, p, True), f"chat-template token ids equal: {p!r}")

    prompt = "List five fruits and one fact about each."
    gg, gh = generate(gw, gguf, prompt, work, "gguf"), generate(gw, hf, prompt, work, "hf")
    check(len(gg["tokens"]) >= 20, f"the GGUF generates a long enough answer ({len(gg['tokens'])} tokens)")
    check(gh["tokens"] == gg["tokens"], "greedy tokens equal the GGUF's")
    check(gh["text"] == gg["text"], f"greedy text equals the GGUF's: {gh['text'][:60]!r}")

    lg, lh = logits(gw, gguf, prompt, work, "gguf"), logits(gw, hf, prompt, work, "hf")
    diff = float(np.abs(lg - lh).max()) if lg.shape == lh.shape else float("inf")
    check(lg.shape == lh.shape and diff < LOGIT_TOL, f"logits {lh.shape} within {LOGIT_TOL} of the GGUF's (max {diff:.2e})")

    # a directory whose tokenizer is of a kind the runtime does not implement is refused, naming it
    bad = os.path.join(work, "bad_pre")
    os.makedirs(bad)
    for f in os.listdir(hf):
        os.symlink(os.path.join(hf, f), os.path.join(bad, f))
    os.unlink(os.path.join(bad, "tokenizer.json"))
    with open(os.path.join(hf, "tokenizer.json")) as f:
        tj = json.load(f)
    tj["pre_tokenizer"] = {"type": "Whitespace"}
    with open(os.path.join(bad, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    p = run(gw, "tokenize", "--model", bad, "--prompt", "hi", expect_ok=False)
    check(p.returncode != 0 and "pre_tokenizer" in p.stderr, f"unknown pre-tokenizer refused: {p.stderr.strip()}")
    os.unlink(os.path.join(bad, shards[1]))
    p = run(gw, "info", "--model", bad, expect_ok=False)
    check(p.returncode != 0 and shards[1] in p.stderr, f"a missing shard is named: {p.stderr.strip()}")

    if fails:
        sys.exit(f"{len(fails)} check(s) failed")
    shutil.rmtree(work, ignore_errors=True)
    print("all checks passed")


if __name__ == "__main__":
    main()
