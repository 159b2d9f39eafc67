#!/usr/bin/env bash
# Two GPUs, tiny bf16 model: data parallel (2 processes, 2 rows each of a global batch of 4) and
# Ulysses context parallel (2 processes, one unpacked row of 64 split in two) against the same runs
# on one GPU; compare_runs.py --tol bf16 (CUDA rounds matmul and attention operands to bf16, so
# another split of the batch changes roundings). usage: x2_train_check.sh LONGTUNE_BIN OUT_DIR
set -u
bin=$(realpath "$1"); out=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
export NCCL_NVLS_ENABLE=0
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
mkdir -p "$out" "$t/data"
python3 "$here/tests/cli/tiny_model.py" "$t/model" --hidden 256 --heads 4 --kv-heads 2 --layers 2 --bf16 || exit 1
for i in $(seq 1 48); do echo "{\"text\": \"record $i: the quick brown fox jumps over the lazy dog $i times, and again $i\"}"; done > "$t/data/train.jsonl"
head -6 "$t/data/train.jsonl" > "$t/data/valid.jsonl"
common=(--device cuda --model "$t/model" --data "$t/data" --learning-rate 2e-3 --steps-per-report 1 --steps-per-eval 3
        --val-batches -1 --save-every 6 --seed 7 --iters 6)
dp=(--batch-size 4 --grad-accum 2 --max-seq-length 64)
cp=(--batch-size 1 --no-pack --grad-accum 2 --max-seq-length 64)
two() {  # name, args...: one process per GPU
  local name=$1; shift
  rm -f "$t/nccl.id"
  for r in 0 1; do
    LONGTUNE_RENDEZVOUS="$t/nccl.id" RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r timeout 25 "$bin" train "$@" --distributed nccl \
      --adapter-path "$out/$name" > "$out/${name}_rank$r.log" 2>&1 &
  done
  wait
  tail -2 "$out/${name}_rank0.log"
}
timeout 20 "$bin" train "${common[@]}" "${dp[@]}" --distributed off --adapter-path "$out/dp1" > "$out/dp1.log" 2>&1; echo "dp 1 GPU rc=$?"
two dp2 "${common[@]}" "${dp[@]}"
grep -h "data parallel\|gradient buckets" "$out/dp2_rank0.log"
python3 "$here/tests/cli/compare_runs.py" --tol bf16 "$out/dp1" "$out/dp2"; echo "compare dp rc=$?"
timeout 20 "$bin" train "${common[@]}" "${cp[@]}" --distributed off --adapter-path "$out/cp1" > "$out/cp1.log" 2>&1; echo "cp 1 GPU rc=$?"
two cp2 "${common[@]}" "${cp[@]}" --context-parallel
grep -h "context parallel" "$out/cp2_rank0.log"
python3 "$here/tests/cli/compare_runs.py" --tol bf16 "$out/cp1" "$out/cp2"; echo "compare cp rc=$?"
