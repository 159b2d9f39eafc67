#!/usr/bin/env bash
# Held-out loss of the demo's fine-tune (scripts/demo.sh: SmolLM2-135M-Instruct Q4_1, python-faq,
# 60 steps of 256-token rows, LoRA on the last 4 layers) with the base as the file holds it and with
# --base-dtype fp8, on the CPU (whose FP8 product is the reference for the CUDA one: the same
# roundings). Writes bench/results/fp8-heldout-cpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/longtune}
CACHE=${LONGTUNE_CACHE:-$HOME/.cache/longtune}
M=$CACHE/smollm2-135m-instruct-q4_1.gguf
D=$CACHE/data/python-faq
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for arm in file fp8; do
  "$BIN" train --model "$M" --data "$D" --adapter-path "$tmp/$arm" --iters 60 --batch-size 1 \
    --max-seq-length 256 --num-layers 4 --lora-rank 8 --lora-alpha 16 --learning-rate 1e-3 --lr-schedule cosine \
    --warmup 4 --mask-prompt --steps-per-eval 20 --val-batches 4 --steps-per-report 5 --seed 0 --overwrite \
    --base-dtype "$arm" > "$tmp/$arm.log" 2>&1
done
python3 - "$tmp" "$(git rev-parse --short HEAD)" <<'PY'
import json, os, re, sys, platform, datetime
tmp, commit = sys.argv[1], sys.argv[2]
arms = []
for arm in ("file", "fp8"):
    text = open(os.path.join(tmp, arm + ".log")).read()
    m = re.search(r"val loss ([0-9.]+) -> ([0-9.]+)", text)
    evals = [float(v) for v in re.findall(r"step \d+: train loss [0-9.]+, val loss ([0-9.]+)", text)]
    arms.append({"name": "base-" + arm, "val_loss_before": float(m.group(1)), "val_loss_after": float(m.group(2)),
                 "val_loss_steps_20_40_60": evals})
f, e = arms
out = {"bench": "fp8-heldout", "commit": commit, "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
       "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
       "config": {"model": "SmolLM2-135M-Instruct Q4_1 GGUF", "data": "python-faq (valid: 4 batches)",
                  "command": "scripts/demo.sh's train command, --base-dtype file|fp8", "backend": "cpu"},
       "arms": arms,
       "fp8_over_file": {"before": e["val_loss_before"] / f["val_loss_before"],
                         "after": e["val_loss_after"] / f["val_loss_after"]}}
os.makedirs("bench/results", exist_ok=True)
json.dump(out, open("bench/results/fp8-heldout-cpu.json", "w"), indent=1)
print(json.dumps(out["fp8_over_file"]))
PY
