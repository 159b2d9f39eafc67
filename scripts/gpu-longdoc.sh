#!/usr/bin/env bash
# Long documents past the trained context, on one CUDA device: SmolLM2-135M-Instruct (8,192 tokens of
# trained context; Q4_1 GGUF, QLoRA) extended 4x with YaRN and fine-tuned on whole pages of the Python
# documentation (scripts/prepare_longdocs.py) under a sequence-length curriculum of 8k -> 16k -> 32k
# tokens per row, recompute chosen by the planner (--recompute auto). The held-out validation loss is
# measured at 32k-token rows before the first step and through the run. Writes the log, metrics and
# longdoc-cuda.json (validation losses, tokens/s and peak per stage, plan) under $OUT. Builds and
# installs nothing.
#
# usage: MODEL=path.gguf DATA=dir [BIN=build/longtune] [OUT=dir] [ITERS=60] scripts/gpu-longdoc.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${LONGTUNE_CACHE:-$HOME/.cache/longtune}"
MODEL=${MODEL:-$CACHE/smollm2-135m-instruct-q4_1.gguf}
DATA=${DATA:-$CACHE/data/python-longdocs}
BIN=${BIN:-build/longtune}
OUT=${OUT:-bench/results}
ITERS=${ITERS:-60}
CURRICULUM=${CURRICULUM:-0:8192,0.3:16384,0.6:32768}
mkdir -p "$OUT"
export LONGTUNE_PROGRESS=plain LONGTUNE_SOURCE_DIR=$PWD
args=(train --device cuda --model "$MODEL" --data "$DATA" --adapter-path "$OUT/longdoc" --overwrite
      --rope-scaling yarn --rope-factor 4 --original-max-position 8192 --seq-len-curriculum "$CURRICULUM"
      --recompute auto --batch-size 1 --iters "$ITERS" --learning-rate 2e-4 --lr-schedule cosine --warmup 4
      --lora-rank 16 --lora-alpha 32 --steps-per-eval $((ITERS / 4)) --steps-per-report 5 --val-batches -1
      --save-every "$ITERS" --seed 0)
t0=$(date +%s.%N)
"$BIN" "${args[@]}" > "$OUT/longdoc-cuda.log" 2>&1
t1=$(date +%s.%N)
tail -3 "$OUT/longdoc-cuda.log"
python3 - "$OUT" "$(awk "BEGIN{print $t1-$t0}")" "$MODEL" "$CURRICULUM" "$BIN" "${args[*]}" <<'PY'
import json, os, subprocess, sys
out, secs, model, curriculum, binary, cmd = sys.argv[1:7]
met = [json.loads(l) for l in open(os.path.join(out, "longdoc", "metrics.jsonl"))]
val = [[m["step"], m["val_loss"]] for m in met if "val_loss" in m]
stages = {}
for m in met:
    if "train_loss" not in m:
        continue
    s = stages.setdefault(m["seq_len"], {"seq_len": m["seq_len"], "tokens_per_s": [], "train_loss": []})
    s["tokens_per_s"].append(m["tokens_per_s"])
    s["train_loss"].append(m["train_loss"])
for s in stages.values():
    t = sorted(s["tokens_per_s"])
    s["median_tokens_per_s"] = t[len(t) // 2]
log = open(os.path.join(out, "longdoc-cuda.log")).read()
auto = [l for l in log.splitlines() if "recompute auto" in l]
commit = os.environ.get("LONGTUNE_COMMIT") or subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.strip()
peak = max((m.get("peak_bytes", 0) for m in met), default=0)
plan = max((m.get("plan_bytes", 0) for m in met), default=0)
r = {"bench": "longdoc-cuda", "commit": commit, "machine": gpu, "command": cmd,
     "model": "SmolLM2-135M-Instruct Q4_1 GGUF (8,192 trained context), YaRN x4 to 32,768",
     "data": "python3.11-doc reST pages as whole documents (scripts/prepare_longdocs.py)",
     "curriculum": curriculum, "recompute_auto": auto[0] if auto else None, "seconds": float(secs),
     "val_loss": val, "stages": sorted(stages.values(), key=lambda s: s["seq_len"]),
     "peak_bytes": peak, "plan_bytes": plan,
     "val_loss_fell": len(val) >= 2 and val[-1][1] < val[0][1]}
json.dump(r, open(os.path.join(out, "longdoc-cuda.json"), "w"), indent=1)
print(json.dumps({k: r[k] for k in ("val_loss", "peak_bytes", "plan_bytes", "val_loss_fell")}))
sys.exit(0 if r["val_loss_fell"] else 1)
PY
