#!/usr/bin/env python3
"""Aggregate decode throughput of a running `gpu-worker serve` against concurrent streams.

For each concurrency C (--concurrency 1,4,16,32), C streaming /v1/completions requests start at
once, each with a distinct prompt of about --prompt-tokens tokens (prefix reuse off: the prompts
differ from their first word) and --max-tokens greedy tokens (stop ignored by asking for
digits). Per level: aggregate decode tok/s = tokens streamed after each stream's first token /
(last token time - first first-token time), TTFT and inter-token p50 / p99. JSON on stdout and
in --json.
  serve_bench.py --url http://127.0.0.1:8000 --model m [--concurrency 1,4,16,32]
                 [--prompt-tokens 32768] [--max-tokens 128] [--json out.json]"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def stream(url, model, prompt, max_tokens, out):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out.update(error=f"{r.status} {r.read()[:200]!r}")
        return
    times, usage = [], None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        if ev["choices"] and ev["choices"][0]["text"]:
            times.append(time.perf_counter())
    out.update(t0=t0, times=times, usage=usage)


def level(args, n):
    words = max(1, args.prompt_tokens // 2)
    prompts = [f"Sequence {i}: " + " ".join(str((i * 7919 + j) % 1000) for j in range(words)) + " Continue:"
               for i in range(n)]
    outs = [{} for _ in range(n)]
    th = [threading.Thread(target=stream, args=(args.url, args.model, p, args.max_tokens, o)) for p, o in zip(prompts, outs)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    errors = [o["error"] for o in outs if "error" in o]
    ok = [o for o in outs if o.get("times")]
    ttft = [o["times"][0] - o["t0"] for o in ok]
    gaps = [b - a for o in ok for a, b in zip(o["times"], o["times"][1:])]
    decoded = sum(len(o["times"]) - 1 for o in ok)
    span = max(o["times"][-1] for o in ok) - min(o["times"][0] for o in ok) if ok else 0
    return {"concurrency": n, "completed": len(ok), "errors": errors[:3],
            "prompt_tokens": [o["usage"]["prompt_tokens"] for o in ok if o.get("usage")][:1],
            "generated_tokens": decoded + len(ok), "decode_tok_s": decoded / span if span > 0 else None,
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99),
            "inter_token_p50_s": pct(gaps, 0.5), "inter_token_p99_s": pct(gaps, 0.99),
            "inter_token_mean_s": statistics.mean(gaps) if gaps else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--prompt-tokens", type=int, default=32768)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--label", default="", help="recorded as is (e.g. the host, mode and build)")
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {"label": args.label, "url": args.url, "model": args.model, "prompt_tokens_asked": args.prompt_tokens,
           "max_tokens": args.max_tokens, "levels": [level(args, int(c)) for c in args.concurrency.split(",")]}
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        open(args.json, "w").write(text + "\n")


if __name__ == "__main__":
    main()
