#!/usr/bin/env bash
# Device round (one H200): the NCCL transport of lt_comm in a world of one rank (test_cuda_comm),
# then data-parallel training of a CUDA model through NCCL (--distributed nccl: gradient buckets,
# staged loss sums) against the same run without a communicator: the trajectories must agree.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
{
echo "=== info $(date -u +%T) commit $(cat COMMIT)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if ldd ./test_cuda_comm | grep -q "libnccl.* not found"; then
  # No libnccl beside the toolkit: use the one PyTorch ships.
  d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
  echo "libnccl from $d"
fi
ldd ./longtune | grep -E "nccl|not found"
echo "=== test_cuda_comm $(date -u +%T)"
NCCL_DEBUG=WARN timeout 6 ./test_cuda_comm; echo "rc=$?"
echo "=== train --device cuda, --distributed off vs nccl $(date -u +%T)"
t=/tmp/mgpu-train; rm -rf $t; mkdir -p $t/data
python3 tests/cli/tiny_model.py $t/model --hidden 128 --layers 2
for i in $(seq 1 48); do echo "{\"text\": \"record $i: the quick brown fox jumps over the lazy dog $i times\"}"; done > $t/data/train.jsonl
head -6 $t/data/train.jsonl > $t/data/valid.jsonl
args=(--device cuda --model $t/model --data $t/data --batch-size 4 --grad-accum 2 --max-seq-length 64 --iters 6
      --learning-rate 2e-3 --steps-per-report 1 --steps-per-eval 3 --val-batches -1 --save-every 3 --seed 7)
for d in off nccl; do
  timeout 5 ./longtune train "${args[@]}" --distributed $d --adapter-path "$OUT/train_$d" > "$OUT/train_$d.log" 2>&1
  echo "$d rc=$?"; tail -3 "$OUT/train_$d.log"
done
python3 tests/cli/compare_runs.py "$OUT/train_off" "$OUT/train_nccl"; echo "compare rc=$?"
echo "=== end $(date -u +%T)"
} 2>&1 | tee "$OUT/run.log"
