#!/usr/bin/env bash
# Device round on one H200 (cap 60 s): the NCCL transport in a world of one rank (test_cuda_comm:
# collectives, the grouped exchange and transpose, Ulysses attention against the bare kernel),
# data-parallel training through NCCL against no communicator (the gradient buckets now run on a
# non-blocking stream beside the backward), the model's Ulysses path forced over one GPU
# (bf16 attention tensors, NCCL exchanges to itself) against no context parallel, and the CUDA
# scaling bench's one-GPU arms on a small
# shape (data parallel tokens/s, longest context by planner + allocation, one long step).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
. ./nccl_env.sh
{
echo "=== info $(date -u +%T) commit $(cat COMMIT)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ldd ./longtune | grep -E "nccl|not found"
echo "=== test_cuda_comm $(date -u +%T)"
NCCL_DEBUG=WARN timeout 10 ./test_cuda_comm; echo "rc=$?"
if [ -z "${SKIP_DP_CHECK:-}" ]; then
echo "=== train --device cuda, --distributed off vs nccl $(date -u +%T)"
timeout 15 bash dev/mgpu/nccl_train_check.sh ./longtune "$OUT/train" cuda; echo "check rc=$?"
fi
echo "=== Ulysses forced over a world of one vs no context parallel $(date -u +%T)"
timeout 15 bash dev/mgpu/cp1_check.sh ./longtune "$OUT/cp"; echo "cp check rc=$?"
echo "=== bench scaling --backend cuda, one GPU, smollm2-135m $(date -u +%T)"
LONGTUNE_BENCH_WEIGHTS=/tmp/lt-w timeout ${BENCH_S:-18} ./longtune bench scaling --backend cuda --gpus 1 --shape smollm2-135m \
  --seq 4096 --step 16384 --max 262144 --repeats 2 --warmup 1 --cp-seq 32768 --out "$OUT"; echo "bench rc=$?"
echo "=== end $(date -u +%T)"
} 2>&1 | tee "$OUT/run.log"
find "$OUT" -type f -size +1M -delete
