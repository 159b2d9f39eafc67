#!/usr/bin/env bash
# Held-out loss of the demo's fine-tune (scripts/demo.sh: SmolLM2-135M-Instruct Q4_1, python-faq,
# 60 steps of 256-token rows, LoRA on the last 4 layers), scored on the whole validation split,
# with the base as the file holds it, with --base-dtype fp8, and with fp8 but the MLP's down
# projection (then also gate and up) left as the file holds them (--fp8-skip). On the CPU, whose
# FP8 product is the reference for the CUDA one (the same roundings). Writes
# bench/results/fp8-heldout-cpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/longtune}
CACHE=${LONGTUNE_CACHE:-$HOME/.cache/longtune}
M=$CACHE/smollm2-135m-instruct-q4_1.gguf
D=$CACHE/data/python-faq
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ARMS=("file" "fp8" "fp8:down" "fp8:gate,up,down")
for arm in "${ARMS[@]}"; do
  flags=(--base-dtype "${arm%%:*}")
  [[ $arm == *:* ]] && flags+=(--fp8-skip "${arm#*:}")
  start=$(date +%s.%N)
  "$BIN" train --model "$M" --data "$D" --adapter-path "$tmp/a" --iters 60 --batch-size 1 \
    --max-seq-length 256 --num-layers 4 --lora-rank 8 --lora-alpha 16 --learning-rate 1e-3 --lr-schedule cosine \
    --warmup 4 --mask-prompt --steps-per-eval 20 --val-batches -1 --steps-per-report 5 --seed 0 --overwrite \
    "${flags[@]}" > "$tmp/$arm.log" 2>&1
  echo "$start $(date +%s.%N)" > "$tmp/$arm.secs"
done
python3 - "$tmp" "$(git rev-parse --short HEAD)" "${ARMS[@]}" <<'PY'
import json, os, re, sys, platform, datetime
tmp, commit, names = sys.argv[1], sys.argv[2], sys.argv[3:]
def wall_s(arm):  # the .secs file holds the run's start and end times
    start, end = map(float, open(os.path.join(tmp, arm + ".secs")).read().split())
    return round(end - start, 1)
arms = []
for arm in names:
    text = open(os.path.join(tmp, arm + ".log")).read()
    m = re.search(r"val loss ([0-9.]+) -> ([0-9.]+)", text)
    evals = [float(v) for v in re.findall(r"step \d+: train loss [0-9.]+, val loss ([0-9.]+)", text)]
    dtype, _, skip = arm.partition(":")
    arms.append({"name": "base-" + arm.replace(":", "-skip-").replace(",", "-"),
                 "flags": "--base-dtype " + dtype + (" --fp8-skip " + skip if skip else ""),
                 "val_loss_before": float(m.group(1)), "val_loss_after": float(m.group(2)),
                 "val_loss_steps_20_40_60": evals,
                 "wall_s": wall_s(arm)})
f = arms[0]
for a in arms[1:]:
    a["over_file"] = {"before": round(a["val_loss_before"] / f["val_loss_before"], 5),
                      "after": round(a["val_loss_after"] / f["val_loss_after"], 5)}
out = {"bench": "fp8-heldout", "commit": commit, "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
       "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
       "config": {"model": "SmolLM2-135M-Instruct Q4_1 GGUF", "data": "python-faq (the whole validation split)",
                  "command": "scripts/demo.sh's train command with --val-batches -1 and each arm's flags",
                  "backend": "cpu", "bar": "fp8 held-out loss within 0.5% of the file's base"},
       "arms": arms}
os.makedirs("bench/results", exist_ok=True)
json.dump(out, open("bench/results/fp8-heldout-cpu.json", "w"), indent=1)
for a in arms[1:]: print(a["name"], json.dumps(a["over_file"]))
PY
