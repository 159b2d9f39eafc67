#!/usr/bin/env bash
# Two H200s (cap 180 s), one process per GPU over NCCL (RANK/WORLD_SIZE/LOCAL_RANK as torchrun sets
# them, the unique id through LONGTUNE_RENDEZVOUS), NVLink multicast off:
#  1. bench scaling --backend cuda on the Qwen3-8B shape: data-parallel tokens/s at 8k on 1 and 2
#     GPUs (bar: efficiency >= 0.90), the longest context on 1 GPU and on 2 with Ulysses context
#     parallel (planner + allocation; bar: >= 0.8 x 2 x the one-GPU ceiling), one timed step at 32k
#     on 2 GPUs (Ulysses) and on one; JSON in $OUT (scaling-cuda-qwen3-8b-2gpu.json, "summary").
#  2. training checks on a tiny bf16 model: 2-GPU data parallel and 2-GPU Ulysses context parallel
#     against one GPU (tests/cli/compare_runs.py --tol bf16).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LONGTUNE_COMMIT=${LONGTUNE_COMMIT:-$(cat COMMIT 2>/dev/null)}
export NCCL_NVLS_ENABLE=0
. ./nccl_env.sh
{
echo "=== info $(date -u +%T) commit $(cat COMMIT)"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
echo "=== bench scaling --backend cuda --gpus 2, qwen3-8b $(date -u +%T)"
export LONGTUNE_BENCH_WEIGHTS=${LONGTUNE_BENCH_WEIGHTS:-/tmp/longtune-bench-weights}
timeout 128 ./longtune bench scaling --backend cuda --gpus 2 --shape qwen3-8b --seq 8192 --batch 2 --repeats 3 \
  --warmup 1 --step 8192 --cp-seq 32768 --out "$OUT"; echo "bench rc=$?"
echo "=== train checks, tiny bf16 model $(date -u +%T)"
timeout 40 bash dev/mgpu/x2_train_check.sh ./longtune "$OUT/train"; echo "train checks rc=$?"
echo "=== end $(date -u +%T)"
} 2>&1 | tee "$OUT/run.log"
find "$OUT" -type f -size +1M -delete
