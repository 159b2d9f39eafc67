#!/usr/bin/env bash
# One GPU: the model's Ulysses context-parallel path (bf16 attention tensors, NCCL exchanges to
# itself) forced over a world of one (LONGTUNE_CP=ulysses --distributed nccl --context-parallel)
# against the same unpacked rows without it; compare_runs.py --tol bf16 (in a world of one the
# exchanges only copy, so the runs should in fact agree to the bit). usage: cp1_check.sh BIN OUT_DIR
set -u
bin=$(realpath "$1"); out=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
export NCCL_NVLS_ENABLE=0
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
mkdir -p "$out" "$t/data"
python3 "$here/tests/cli/tiny_model.py" "$t/model" --hidden 256 --heads 4 --kv-heads 2 --layers 2 --bf16 || exit 1
for i in $(seq 1 24); do echo "{\"text\": \"record $i: the quick brown fox jumps over the lazy dog $i times, and again $i\"}"; done > "$t/data/train.jsonl"
head -4 "$t/data/train.jsonl" > "$t/data/valid.jsonl"
args=(--device cuda --model "$t/model" --data "$t/data" --batch-size 1 --no-pack --grad-accum 2 --max-seq-length 64
      --learning-rate 2e-3 --steps-per-report 1 --steps-per-eval 2 --val-batches -1 --save-every 4 --seed 7 --iters 4)
timeout 20 "$bin" train "${args[@]}" --distributed off --adapter-path "$out/cp_off" > "$out/cp_off.log" 2>&1; echo "off rc=$?"
LONGTUNE_CP=ulysses timeout 20 "$bin" train "${args[@]}" --distributed nccl --context-parallel --adapter-path "$out/cp_uly" \
  > "$out/cp_uly.log" 2>&1; echo "ulysses rc=$?"
grep -h "context parallel" "$out/cp_uly.log"; tail -2 "$out/cp_uly.log"
python3 "$here/tests/cli/compare_runs.py" --tol bf16 "$out/cp_off" "$out/cp_uly"; echo "compare bf16 rc=$?"
python3 "$here/tests/cli/compare_runs.py" "$out/cp_off" "$out/cp_uly"; echo "compare fp32 rc=$?"
