"""Summary of a prefill-vs-hf.sh call: per prompt, our prefill_s over the runs (median, all) and
HF SDPA's at the same token count, with ours / HF. Usage: prefill_summary.py OUTDIR"""
import glob, json, os, statistics, sys

out = sys.argv[1]
ours = {}
for f in glob.glob(os.path.join(out, "gen-*.json")):
    g = json.load(open(f))
    ours.setdefault(g["prompt_tokens"], []).append(g["prefill_s"])
hf = {}
for line in open(os.path.join(out, "hf.jsonl")):
    if line.strip():
        h = json.loads(line)
        hf[h["n_ctx"]] = h
rows = []
for n in sorted(ours):
    row = {"prompt_tokens": n, "ours_prefill_s_median": round(statistics.median(ours[n]), 3),
           "ours_prefill_s_all": sorted(round(x, 3) for x in ours[n])}
    if n in hf:
        row["hf_sdpa_prefill_s_median"] = hf[n]["prefill_s_median"]
        row["hf_sdpa_prefill_s_all"] = hf[n]["prefill_s_all"]
        row["ours_over_hf"] = round(row["ours_prefill_s_median"] / hf[n]["prefill_s_median"], 4)
    rows.append(row)
print(json.dumps({"bench": "prefill, ours vs HF SDPA, one call", "runs": rows}, indent=1))
