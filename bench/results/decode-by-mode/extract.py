#!/usr/bin/env python3
"""Writes decode-by-mode.dat from the run files named below (run from this directory)."""
import json
import statistics


def step_median_ms(path, skip=2):
    """Median of steps[].total_us over the steps after the first `skip`, in ms."""
    steps = json.load(open(path))["steps"]
    return statistics.median(s["total_us"] for s in steps[skip:]) / 1000.0


H = "../h200/"
cuda = {d["context"]: d["ms_per_token_median"] for d in json.load(open(H + "cuda-bench.json"))["decode"]}
rows = [
    # series, context tokens, ms/token, source
    ("full", 8192, cuda[8192], "h200/cuda-bench.json"),
    ("full", 32768, cuda[32768], "h200/cuda-bench.json"),
    ("full", 130144, step_median_ms(H + "decode-128k/gen128k-full-f5a6f4a.json"), "h200/decode-128k/gen128k-full-f5a6f4a.json"),
    ("flat", 130144, step_median_ms(H + "decode-128k/gen128k-flat-f5a6f4a.json"), "h200/decode-128k/gen128k-flat-f5a6f4a.json"),
    ("ivf", 130144, step_median_ms(H + "decode-128k/gen128k-ivf-f5a6f4a.json"), "h200/decode-128k/gen128k-ivf-f5a6f4a.json"),
    ("roar", 130144, step_median_ms(H + "decode-128k/gen128k-roar-f5a6f4a.json"), "h200/decode-128k/gen128k-roar-f5a6f4a.json"),
    ("roar-yi6b-8L", 130144, step_median_ms(H + "decode-1m/yi6b-8L-128k-roar-f5a6f4a.json"), "h200/decode-1m/yi6b-8L-128k-roar-f5a6f4a.json"),
    ("roar-yi6b-8L", 1041152, step_median_ms(H + "decode-1m/yi6b-8L-1m-roar-f5a6f4a.json"), "h200/decode-1m/yi6b-8L-1m-roar-f5a6f4a.json"),
]
with open("decode-by-mode.dat", "w") as f:
    f.write("# decode ms/token (median step) by mode and context; written by extract.py\n")
    last = None
    for series, ctx, ms, src in rows:
        if last is not None and series != last:
            f.write("\n\n")
        f.write(f"# {series}\n" if series != last else "")
        f.write(f"{ctx} {ms:.2f}  # {src}\n")
        last = series
