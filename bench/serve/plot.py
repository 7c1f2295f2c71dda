#!/usr/bin/env python3
"""Aggregate decode tok/s against concurrent sequences, from serve_bench.py JSON files and
hf_batch JSON lines: one line per file.
  plot.py OUT.png [--title T] RUN.json[=LABEL] ... [--hf HF.jsonl[=LABEL]]"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def split(arg, default):
    path, _, label = arg.partition("=")
    return path, label or default


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    out, args, title = argv[1], argv[2:], "aggregate decode throughput"
    if "--title" in args:
        i = args.index("--title")
        title = args[i + 1]
        del args[i:i + 2]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    hf = False
    for a in args:
        if a == "--hf":
            hf = True
            continue
        if hf:
            path, label = split(a, "HF transformers")
            rows = [json.loads(line) for line in open(path) if line.strip()]
            xs, ys = [r["batch"] for r in rows], [r["agg_tok_s"] for r in rows]
            ax.plot(xs, ys, "s--", label=label)
            hf = False
            continue
        path, label = split(a, None)
        j = json.load(open(path))
        lv = [l for l in j["levels"] if l.get("decode_tok_s_all_running")]
        ax.plot([l["concurrency"] for l in lv], [l["decode_tok_s_all_running"] for l in lv], "o-",
                label=label or j.get("label", path))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent sequences")
    ax.set_ylabel("decode tokens/s (all sequences)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv)
