#!/bin/sh
# accuracy-bench --report-from: the reports of a samples.jsonl without running anything, and a
# clear refusal of a file that does not fit the given modes. $1: accuracy-bench, $2: the model.
bin=$1
model=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
cat > "$dir/samples.jsonl" <<'JSONL'
{"task": "passkey", "length": 1024, "n_tokens": 1010, "depth": 0.2500, "sample": 0, "seed": 1, "needle_token": 200, "prefill_s": 0.1, "expected": ["41814"], "modes": {"full": {"score": 1.0000, "seed_s": 0.0, "decode_s": 0.01, "tokens": 7, "output": " 41814."}, "streaming": {"score": 0.0000, "seed_s": 0.0, "decode_s": 0.01, "tokens": 7, "output": " a key"}}}
{"task": "passkey", "length": 1024, "n_tokens": 1010, "depth": 0.7500, "sample": 0, "seed": 2, "needle_token": 700, "prefill_s": 0.1, "expected": ["37149"], "modes": {"full": {"score": 1.0000, "seed_s": 0.0, "decode_s": 0.01, "tokens": 7, "output": " 37149."}, "streaming": {"score": 1.0000, "seed_s": 0.0, "decode_s": 0.01, "tokens": 7, "output": " 37149."}}}
JSONL
"$bin" --model "$model" --out "$dir/r" --report-from "$dir/samples.jsonl" --tasks passkey --lengths 1024 \
  --depths 0.25,0.75 --modes full,streaming > "$dir/log" 2>&1 || { echo "FAIL: report run"; cat "$dir/log"; fail=1; }
grep -q "| passkey | yes | 100 | 50 |" "$dir/r/summary.md" || { echo "FAIL: summary row"; cat "$dir/r/summary.md"; fail=1; }
[ -s "$dir/r/heatmap_streaming.png" ] || { echo "FAIL: no heat map"; fail=1; }
msg=$("$bin" --model "$model" --out "$dir/r2" --report-from "$dir/samples.jsonl" --tasks passkey --lengths 1024 \
  --depths 0.25,0.75 --modes full,roar --stores 127.0.0.1:1 2>&1)
rc=$?
case "$msg" in
  *"no result of mode roar"*) [ $rc -ne 0 ] || { echo "FAIL: exit 0 for a missing mode"; fail=1; } ;;
  *) echo "FAIL: '$msg'"; fail=1 ;;
esac
# --fidelity-from: a run's fidelity.json joins the rebuilt summary; one of another model is refused.
att=$(seq -s, 30 | sed 's/[0-9]*/0.01/g')
echo "[{\"mode\": \"streaming\", \"prompt\": 4096, \"forced\": 128, \"top1\": 0.8750, \"kl_mean\": 1.5e-01, \"att_rel\": [$att]}]" > "$dir/fid.json"
"$bin" --model "$model" --out "$dir/r4" --report-from "$dir/samples.jsonl" --fidelity-from "$dir/fid.json" \
  --tasks passkey --lengths 1024 --depths 0.25,0.75 --modes full,streaming > "$dir/log4" 2>&1 ||
  { echo "FAIL: report with fidelity"; cat "$dir/log4"; fail=1; }
grep -q "87.5" "$dir/r4/summary.md" || { echo "FAIL: fidelity not in summary"; cat "$dir/r4/summary.md"; fail=1; }
echo '[{"mode": "streaming", "prompt": 4096, "forced": 128, "top1": 0.8750, "kl_mean": 0.15, "att_rel": [0.1]}]' > "$dir/fid2.json"
msg=$("$bin" --model "$model" --out "$dir/r5" --report-from "$dir/samples.jsonl" --fidelity-from "$dir/fid2.json" \
  --tasks passkey --lengths 1024 --depths 0.25,0.75 --modes full,streaming 2>&1)
case "$msg" in
  *"1 layers of attention error, the model has 30"*) ;;
  *) echo "FAIL: '$msg'"; fail=1 ;;
esac
echo '[{"mode": "flat", "prompt": 4096, "forced": 128, "top1": 0.9, "kl_mean": 0.1, "att_rel": []}]' > "$dir/fid3.json"
msg=$("$bin" --model "$model" --out "$dir/r6" --report-from "$dir/samples.jsonl" --fidelity-from "$dir/fid3.json" \
  --tasks passkey --lengths 1024 --depths 0.25,0.75 --modes full,streaming 2>&1)
case "$msg" in
  *"no complete entry for mode streaming"*) ;;
  *) echo "FAIL: '$msg'"; fail=1 ;;
esac
msg=$("$bin" --model "$model" --out "$dir/r3" --report-from "$dir/samples.jsonl" --tasks passkey --lengths 1024 \
  --depths 0.5 --modes full,streaming 2>&1)
case "$msg" in
  *"not one of --depths"*) ;;
  *) echo "FAIL: '$msg'"; fail=1 ;;
esac
# a sequential task in a mode with and without retro: the per-answer table, one column per entry
cat > "$dir/seq.jsonl" <<'JSONL'
{"task": "longgen_needles", "length": 1024, "n_tokens": 1010, "depth": -1.0000, "sample": 0, "seed": 1, "needle_token": -1, "prefill_s": 0.1, "expected": ["1111111", "2222222", "3333333", "4444444"], "sequential": true, "modes": {"full": {"score": 1.0, "items": [1, 1, 1, 1], "output": "x"}, "flat": {"score": 0.5, "items": [1, 0, 1, 0], "output": "x"}, "flat+retro2": {"score": 0.75, "retro": 2, "retro_rows": 900, "items": [1, 1, 1, 0], "output": "x"}}}
{"task": "longgen_needles", "length": 1024, "n_tokens": 1012, "depth": -1.0000, "sample": 1, "seed": 2, "needle_token": -1, "prefill_s": 0.1, "expected": ["5555555", "6666666", "7777777", "8888888"], "sequential": true, "modes": {"full": {"score": 0.75, "items": [1, 1, 1, 0], "output": "x"}, "flat": {"score": 0.25, "items": [1, 0, 0, 0], "output": "x"}, "flat+retro2": {"score": 0.75, "retro": 2, "retro_rows": 800, "items": [1, 1, 0, 1], "output": "x"}}}
JSONL
"$bin" --model "$model" --out "$dir/r7" --report-from "$dir/seq.jsonl" --tasks longgen_needles --lengths 1024 \
  --modes full,flat,flat+retro2 > "$dir/log7" 2>&1 || { echo "FAIL: sequential report"; cat "$dir/log7"; fail=1; }
grep -q "| answer | full | flat | flat+retro2 |" "$dir/r7/summary.md" &&
  grep -q "| 2 | 100 | 0 | 100 |" "$dir/r7/summary.md" && grep -q "| 4 | 50 | 0 | 50 |" "$dir/r7/summary.md" &&
  grep -q "| longgen_needles | yes | 88 | 38 | 75 |" "$dir/r7/summary.md" ||
  { echo "FAIL: per-answer table"; cat "$dir/r7/summary.md"; fail=1; }
msg=$("$bin" --model "$model" --out "$dir/r8" --report-from "$dir/seq.jsonl" --tasks longgen_needles --lengths 1024 \
  --modes full,flat+retro8 2>&1)
case "$msg" in
  *"no result of mode flat+retro8"*) ;;
  *) echo "FAIL: '$msg'"; fail=1 ;;
esac
exit $fail
