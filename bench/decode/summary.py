#!/usr/bin/env python3
"""Medians of gpu-worker --json runs made in one call, and their ratios to the full run.

Runs are named by their file, gen-NAME.json.

usage: summary.py gen-MODE.json... > summary.json
Steps 0-1 are left out of the medians (warm-up: the first decode steps allocate and fill
caches); the median of every per-step field the run recorded is reported."""
import json
import statistics
import sys


def median_fields(steps):
    fields = sorted({k for s in steps for k in s})
    return {k: statistics.median(s[k] for s in steps if k in s) for k in fields}


def main(paths):
    runs = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        steps = r.get("steps", [])[2:]
        if not steps:
            sys.exit(f"{p}: fewer than 3 decode steps")
        med = median_fields(steps)
        name = p.rsplit("/", 1)[-1].removeprefix("gen-").removesuffix(".json")
        runs[name] = {
            "mode": r["mode"],
            "file": p.rsplit("/", 1)[-1],
            "prompt_tokens": r["prompt_tokens"],
            "prefill_s": r["prefill_s"],
            "decode_steps": len(steps),
            "decode_ms_median": med["total_us"] / 1e3,
            "decode_ms_p90": sorted(s["total_us"] for s in steps)[int(0.9 * (len(steps) - 1))] / 1e3,
            "step_median_us": med,
        }
    full = runs.get("full")  # the run named plain "full" is the reference
    for r in runs.values():
        if full:
            r["prefill_vs_full"] = r["prefill_s"] / full["prefill_s"]
            r["decode_vs_full"] = r["decode_ms_median"] / full["decode_ms_median"]
    for m, r in runs.items():
        for other in runs:
            if other not in (m, "full"):
                r[f"speedup_vs_{other}"] = runs[other]["decode_ms_median"] / r["decode_ms_median"]
    json.dump(runs, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
