#!/usr/bin/env python3
"""Aggregate decode throughput of a running `gpu-worker serve` against concurrent streams.

Per concurrency C (--concurrency 1,4,16,32), two phases of C streaming /v1/completions requests
started at once, each sequence with its own prompt of about --prompt-tokens tokens (distinct
from their first word, and between levels):
  prefill: each prompt with max_tokens 1: the time to first token of C prompts arriving together;
  decode:  each prompt again plus a short suffix, --max-tokens greedy tokens: the server reuses the
           context it just built (usage.cached_tokens), so all C sequences decode together.
  stall (with --long-prompt-tokens N): C streams of new prompts (each prompt plus another suffix,
           prefilled afresh), and once they all decode, one more prompt of N tokens (max_tokens 1)
           arrives: its TTFT, and the streams' longest gap between two tokens that spans its
           prefill, against their median gap (the server needs room for C + 1 sequences).
Reported per level: the decode phase's aggregate tok/s over the span where all C streams were
decoding (from the last stream's first token to the first stream's last token) and over the
whole phase, inter-token p50 / p99, both phases' TTFT p50 / p99, and (offloaded modes) a
sequence's mean decode step by part over the decode phase, from the server's /metrics
(ra_serve_decode_step_seconds_total / ra_serve_store_wait_seconds_count), and the engine's mean
step by part (ra_serve_engine_step_seconds_total / ra_serve_engine_steps_total) over the whole
phase and over the steps where all C streams were decoding (the counters read once every stream
has its second token and again when the first stream is two tokens from its end). JSON on stdout
and --json.
  serve_bench.py --url http://127.0.0.1:8000 --model m [--concurrency 1,4,16,32]
                 [--prompt-tokens 32768] [--max-tokens 128] [--long-prompt-tokens N] [--label TEXT]
                 [--json out.json]"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

WORDS = ("time year people way day man thing woman life child world school state family student "
         "group country problem hand part place case week company system program question work "
         "government number night point home water room mother area money story fact month lot "
         "right study book eye job word business issue side kind head house service friend father "
         "power hour game line end member law car city community name president team minute idea").split()


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def prompt(tag, n_words):
    x = sum(map(ord, tag)) * 2654435761 % 2**32
    out = [tag + ":"]
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(WORDS[x % len(WORDS)])
    return " ".join(out)


def stream(url, model, text, max_tokens, out):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    body = json.dumps({"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out.update(error=f"{r.status} {r.read()[:200]!r}")
        return
    times, usage = out.setdefault("times", []), None  # filled as tokens come (the stall phase watches it)
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:  # the server ended the stream with an error event
            out.update(error=f"stream: {json.dumps(ev['error'])[:200]}")
            return
        if ev.get("usage"):
            usage = ev["usage"]
        if ev["choices"] and ev["choices"][0]["text"]:
            times.append(time.perf_counter())
    out.update(t0=t0, usage=usage)


def step_parts(url):
    """The server's step counters: (offloaded decode {part: s}, its steps, engine {part: s}, engine steps)."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    parts, steps, eparts, esteps = {}, 0.0, {}, 0.0
    for line in text.splitlines():
        if line.startswith('ra_serve_decode_step_seconds_total{part="'):
            parts[line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith('ra_serve_engine_step_seconds_total{part="'):
            eparts[line.split('"')[1]] = float(line.split()[-1])
        elif line.startswith("ra_serve_store_wait_seconds_count "):
            steps = float(line.split()[-1])
        elif line.startswith("ra_serve_engine_steps_total "):
            esteps = float(line.split()[-1])
    return parts, steps, eparts, esteps


def step_ms(before, after, at=0):
    """The mean step by part (ms) between two step_parts() readings: a sequence's offloaded decode
    step (at 0) or the engine's step (at 2)."""
    steps = after[at + 1] - before[at + 1]
    if steps <= 0:
        return None
    return {p: round((after[at][p] - before[at].get(p, 0.0)) / steps * 1e3, 3) for p in after[at]}


def together(args, texts, max_tokens, watch=None):
    """The streams of texts at once; watch(outs), if given, runs beside them."""
    outs = [{} for _ in texts]
    th = [threading.Thread(target=stream, args=(args.url, args.model, t, max_tokens, o)) for t, o in zip(texts, outs)]
    for t in th:
        t.start()
    if watch:
        watch(outs)
    for t in th:
        t.join()
    return outs


def all_running(url, max_tokens, window):
    """A watch for together(): the step counters once every stream has its second token, and
    again when the first one is two tokens from its end (or ended), into window["a"], ["b"]."""
    def done(o):
        return "t0" in o or "error" in o

    def watch(outs):
        while not all(len(o.get("times", ())) >= 2 or done(o) for o in outs):
            time.sleep(0.002)
        if any(done(o) for o in outs):
            return
        window["a"] = step_parts(url)
        while not any(len(o.get("times", ())) >= max_tokens - 2 or done(o) for o in outs):
            time.sleep(0.002)
        window["b"] = step_parts(url)
    return watch


def ttft(outs):
    return [o["times"][0] - o["t0"] for o in outs if o.get("times") and "t0" in o]


def stall(args, prompts, long_words):
    """The streams of prompts decoding, then a long prompt arriving: its TTFT and the streams' gaps."""
    outs = [{} for _ in prompts]
    th = [threading.Thread(target=stream, args=(args.url, args.model, p + " Then:", args.max_tokens, o))
          for p, o in zip(prompts, outs)]
    for t in th:
        t.start()
    while any(len(o.get("times", [])) < 3 and "error" not in o and "usage" not in o for o in outs):
        time.sleep(0.005)
    long = {}
    t_long = time.perf_counter()
    stream(args.url, args.model, prompt(f"LONG{len(prompts)}", long_words), 1, long)
    for t in th:
        t.join()
    first = long["times"][0] if long.get("times") else None
    spans = [b - a for o in outs for a, b in zip(o.get("times", []), o.get("times", [])[1:])
             if first is not None and b > t_long and a < first]
    gaps = [b - a for o in outs for a, b in zip(o.get("times", []), o.get("times", [])[1:])]
    return {"long_prompt_tokens": (long.get("usage") or {}).get("prompt_tokens"),
            "long_ttft_s": first - t_long if first is not None else None,
            "max_gap_during_s": max(spans) if spans else None, "gap_p50_s": pct(gaps, 0.5),
            "errors": [o["error"] for o in outs + [long] if "error" in o][:3]}


def level(args, n, words, long_words):
    prompts = [prompt(f"L{n}S{i}", words) for i in range(n)]
    warm = together(args, prompts, 1)
    before, window = step_parts(args.url), {}
    outs = together(args, [p + " Go on:" for p in prompts], args.max_tokens,
                    all_running(args.url, args.max_tokens, window))
    after = step_parts(args.url)
    errors = [o["error"] for o in warm + outs if "error" in o]
    ok = [o for o in outs if o.get("times") and "error" not in o]
    gaps = [b - a for o in ok for a, b in zip(o["times"], o["times"][1:])]
    decoded = sum(len(o["times"]) - 1 for o in ok)
    span = max(o["times"][-1] for o in ok) - min(o["times"][0] for o in ok) if ok else 0
    # all C decoding: from the last first token to the first last token
    a = max(o["times"][0] for o in ok) if ok else 0
    b = min(o["times"][-1] for o in ok) if ok else 0
    inside = sum(1 for o in ok for t in o["times"] if a < t <= b)
    usage = [o["usage"] for o in ok if o.get("usage")]
    ttft_w, ttft_d = ttft(warm), ttft(ok)
    return {"concurrency": n, "completed": len(ok), "errors": errors[:3],
            "prompt_tokens": usage[0]["prompt_tokens"] if usage else None,
            "cached_tokens": (usage[0].get("prompt_tokens_details") or {}).get("cached_tokens") if usage else None,
            "generated_tokens": decoded + len(ok),
            "decode_tok_s_all_running": inside / (b - a) if b > a and len(ok) == n else None,
            "decode_tok_s": decoded / span if span > 0 else None,
            "inter_token_p50_s": pct(gaps, 0.5), "inter_token_p99_s": pct(gaps, 0.99),
            "inter_token_mean_s": statistics.mean(gaps) if gaps else None,
            "prefill_ttft_p50_s": pct(ttft_w, 0.5), "prefill_ttft_p99_s": pct(ttft_w, 0.99),
            "reuse_ttft_p50_s": pct(ttft_d, 0.5), "reuse_ttft_p99_s": pct(ttft_d, 0.99),
            "decode_steps": after[1] - before[1], "decode_step_ms": step_ms(before, after),
            "engine_steps": after[3] - before[3], "engine_step_ms": step_ms(before, after, 2),
            "engine_steps_all_running": window["b"][3] - window["a"][3] if "b" in window else None,
            "engine_step_ms_all_running": step_ms(window["a"], window["b"], 2) if "b" in window else None,
            "stall": stall(args, prompts, long_words) if long_words else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--prompt-tokens", type=int, default=32768)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--long-prompt-tokens", type=int, default=0, help="the stall phase's prompt (0: no stall phase)")
    ap.add_argument("--label", default="", help="recorded as is (e.g. the host, mode and build)")
    ap.add_argument("--json")
    args = ap.parse_args()
    # the tokenizer's tokens per word, from one short request (also the server's warm-up)
    probe = together(args, [prompt("calibrate", 1000)], 1)[0]
    if "error" in probe or not probe.get("usage"):
        raise SystemExit(f"serve_bench: the calibration request failed: {probe.get('error', 'no usage')}")
    per_word = probe["usage"]["prompt_tokens"] / 1001
    words = max(1, int(args.prompt_tokens / per_word))
    res = {"label": args.label, "url": args.url, "model": args.model, "prompt_tokens_asked": args.prompt_tokens,
           "max_tokens": args.max_tokens, "tokens_per_word": round(per_word, 3),
           "long_prompt_tokens_asked": args.long_prompt_tokens,
           "levels": [level(args, int(c), words, int(args.long_prompt_tokens / per_word))
                      for c in args.concurrency.split(",")]}
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        open(args.json, "w").write(text + "\n")


if __name__ == "__main__":
    main()
