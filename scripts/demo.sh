#!/usr/bin/env bash
# The README's first command (`make demo` runs it after setup and build): QLoRA fine-tune of
# SmolLM2-135M-Instruct (Q4_1 GGUF; the base stays quantized) on the Python FAQ with packing, then
# the answer to a held-out question before and after. Sized for <= 10 minutes on 2 cores: LoRA on
# the last 4 layers, rows of 256 tokens, 60 steps. Fails if the validation loss does not fall.
# Knobs: LONGTUNE_CACHE, LONGTUNE_DEMO_OUT (adapter folder), LONGTUNE_DEMO_ITERS.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LONGTUNE_CACHE:-$HOME/.cache/longtune}"
MODEL="$CACHE/smollm2-135m-instruct-q4_1.gguf"
DATA="$CACHE/data/python-faq"
OUT="${LONGTUNE_DEMO_OUT:-adapters/smollm2-python-faq}"
ITERS="${LONGTUNE_DEMO_ITERS:-60}"
BIN=build/longtune
# OpenMP threads sleep instead of spinning between parallel regions: on a shared machine spinning
# burnt ~1.7x the CPU time for the same steps (measured: 29 s vs 17 s user for two steps).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
for f in "$MODEL" "$DATA/train.jsonl" "$DATA/valid.jsonl" "$DATA/test.jsonl"; do
  [ -f "$f" ] || { echo "demo: $f is missing; run 'make setup' (scripts/setup.sh) first" >&2; exit 1; }
done
start=$(date +%s)

# The held-out question: the first user turn (or prompt) of the test split, never trained on.
question=$(python3 - "$DATA/test.jsonl" <<'PY'
import json, sys
rec = json.loads(open(sys.argv[1], encoding="utf-8").readline())
if "messages" in rec:
    print(next(m["content"] for m in rec["messages"] if m["role"] == "user"))
else:
    print(rec.get("prompt") or rec["text"][:200])
PY
)
echo "== held-out question: $question"
echo "== before fine-tuning:"
"$BIN" generate --model "$MODEL" --prompt "$question" --max-tokens 48

echo "== fine-tuning (QLoRA, packed rows of 256 tokens, $ITERS steps)"
rm -f "$OUT/metrics.jsonl"
LONGTUNE_PROGRESS="${LONGTUNE_PROGRESS:-plain}" "$BIN" train --model "$MODEL" --data "$DATA" --adapter-path "$OUT" \
  --iters "$ITERS" --batch-size 1 --max-seq-length 256 --num-layers 4 --lora-rank 8 --lora-alpha 16 \
  --learning-rate 1e-3 --lr-schedule cosine --warmup 4 --mask-prompt \
  --steps-per-eval 20 --val-batches 4 --steps-per-report 5 --save-every 20 --seed 0 --overwrite

echo "== after fine-tuning (adapter $OUT):"
"$BIN" generate --model "$MODEL" --adapter "$OUT" --prompt "$question" --max-tokens 48

python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
vals = [(r["step"], r["val_loss"]) for r in map(json.loads, open(sys.argv[1])) if "val_loss" in r]
print("== validation loss: " + ", ".join(f"step {s}: {v:.4f}" for s, v in vals))
if len(vals) < 2 or not vals[-1][1] < vals[0][1]:
    sys.exit("demo: validation loss did not fall")
PY
echo "== done in $(( $(date +%s) - start )) s; adapter (PEFT format) in $OUT"
