#!/usr/bin/env bash
# Data parallel through NCCL on one GPU: `longtune train --device cuda` on a tiny bf16 model, once
# without a communicator (--distributed off) and once in an NCCL world of one (--distributed nccl:
# gradient buckets on the NCCL stream, loss sums staged through it); the metrics and adapters must
# agree (tests/cli/compare_runs.py). usage: nccl_train_check.sh LONGTUNE_BIN OUT_DIR [DEVICE]
# (DEVICE cpu runs the same script without NCCL, as a check of the script itself).
set -u
bin=$1; out=$2; dev=${3:-cuda}
here=$(cd "$(dirname "$0")/../.." && pwd)  # the repository (or a device pack laid out like it)
export NCCL_NVLS_ENABLE=0
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
mkdir -p "$out" "$t/data"
python3 "$here/tests/cli/tiny_model.py" "$t/model" --hidden 128 --layers 2 --bf16 || exit 1
for i in $(seq 1 48); do echo "{\"text\": \"record $i: the quick brown fox jumps over the lazy dog $i times\"}"; done > "$t/data/train.jsonl"
head -6 "$t/data/train.jsonl" > "$t/data/valid.jsonl"
args=(--device "$dev" --model "$t/model" --data "$t/data" --batch-size 4 --grad-accum 2 --max-seq-length 64 --iters 6
      --learning-rate 2e-3 --steps-per-report 1 --steps-per-eval 3 --val-batches -1 --save-every 3 --seed 7)
second=$([ "$dev" = cuda ] && echo nccl || echo auto)
for d in off $second; do
  timeout 20 "$bin" train "${args[@]}" --distributed $d --adapter-path "$out/train_$d" > "$out/train_$d.log" 2>&1
  echo "--distributed $d: rc=$?"; tail -2 "$out/train_$d.log"
done
grep -h "gradient buckets started" "$out/train_$second.log"
python3 "$here/tests/cli/compare_runs.py" "$out/train_off" "$out/train_$second"
