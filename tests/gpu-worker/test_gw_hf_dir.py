#!/usr/bin/env python3
"""--model DIR with a Hugging Face directory as shipped, built from the SmolLM2 GGUF by
make_hf_dir.py (2 safetensors shards + index, tokenizer.json, tokenizer_config.json): the same
token ids, greedy tokens and logits as the GGUF. A directory whose vocabulary is padded past the
tokenizer's, with padding rows that would win every pick: generate and serve (two requests in
one batch) pick among the tokenizer's ids and answer as the GGUF does.

Tolerance: the CPU backend dequantizes the GGUF's Q4_1/Q8_0 weights to f32 at load and the
directory holds exactly those f32 values, so only the RoPE layout differs (the GGUF's permuted
q/k rows with adjacent-pair RoPE vs rotate_half): summation order, logits within 1e-3.

    test_gw_hf_dir.py GPU_WORKER MODEL.gguf WORKDIR"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

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


def serve_chats(gw, model, prompts, work):
    """One serve on the CPU backend, the prompts' chat completions sent at once (greedy, 40
    tokens): their texts."""
    ready = os.path.join(work, "serve.addr")
    log = open(os.path.join(work, "serve.log"), "w")
    p = subprocess.Popen([gw, "serve", "--backend", "cpu", "--threads", "2", "--model", model, "--model-name", "m",
                          "--listen", "127.0.0.1:0", "--ready-file", ready, "--ctx", "1024"], stdout=log, stderr=log)
    try:
        for _ in range(600):
            if os.path.exists(ready) and os.path.getsize(ready) > 0:
                break
            if p.poll() is not None:
                sys.exit(f"FAIL: serve exited {p.returncode}: {open(log.name).read()}")
            time.sleep(0.1)
        else:
            sys.exit(f"FAIL: serve not ready after 60 s: {open(log.name).read()}")
        url = f"http://{open(ready).read().strip()}/v1/chat/completions"
        texts = [None] * len(prompts)

        def ask(i):
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompts[i]}], "max_tokens": 40,
                               "temperature": 0}).encode()
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=240) as r:
                texts[i] = json.load(r)["choices"][0]["message"]["content"]
        th = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in th:
            t.start()
        for t in th:
            t.join()
        return texts
    finally:
        p.terminate()
        p.wait(timeout=60)
        log.close()


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

    # the vocabulary padded by 64 rows that outscore every real one: picks stay among the
    # tokenizer's ids, in generate and in a serve step of two sequences
    pad = os.path.join(work, "hf_pad")
    subprocess.run([sys.executable, os.path.join(HERE, "make_hf_dir.py"), gguf, pad, "--shards", "2", "--pad-vocab",
                    "64"], check=True)
    lp, n = logits(gw, pad, prompt, work, "pad"), lg.shape[1]
    check(lp.shape == (lg.shape[0], n + 64) and bool((lp[:, n:].max(1) > lp[:, :n].max(1)).all()),
          f"the padding's logits {lp.shape} outscore the tokenizer's ids")
    gp = generate(gw, pad, prompt, work, "pad")
    check(gp["tokens"] == gg["tokens"], "padded vocabulary: greedy tokens equal the GGUF's")
    other = "Name three rivers of Europe."
    go = generate(gw, gguf, other, work, "other")
    texts = serve_chats(gw, pad, [prompt, other], work)
    check(texts == [gg["text"], go["text"]], f"padded vocabulary: serve answers as generate does: {texts!r}")

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
