#!/usr/bin/env bash
# Checkpoint offload on one CUDA device (lt_model_run_options.offload_ckpt): the correctness test,
# the Qwen3-8B 32k step without and with offload, the context ceiling with the checkpoints in
# pinned host memory (device and host budgets; allocation only), and a real step above the
# device-only ceiling (278,528 tokens). Expected on an H200 with 128 GiB of host memory: test ~3 s,
# train ~60 s, context ~70 s (pinning runs at ~2 GiB/s: ~50 s for ~100 GiB), step ~420-520 s.
# Results and logs go to $OUT (default bench/results). It builds nothing and installs nothing.
#
# usage: scripts/gpu-offload.sh [step ...]   steps: test train context step (default: test train context)
#        BIN=path/to/longtune (default build/longtune), TEST=path/to/test_cuda_offload
#        (default build/test_cuda_offload).
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-build/longtune}
TEST=${TEST:-build/test_cuda_offload}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
export LONGTUNE_SOURCE_DIR=$PWD
export LONGTUNE_BENCH_WEIGHTS=${LONGTUNE_BENCH_WEIGHTS:-/tmp/longtune-bench-weights}
export PYTHONUNBUFFERED=1
steps=${*:-test train context}
log="$OUT/gpu-offload.log"
t0=$(date +%s)
run() { # limit label command...
  local limit=$1 label=$2; shift 2
  echo "=== $label ($(date -u +%T), limit ${limit}s, $(( $(date +%s) - t0 ))s so far): $*"
  timeout -k 10 "$limit" "$@"
  echo "=== $label: exit $?"
}
{
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
free -g | head -2
for s in $steps; do
  case $s in
  test)
    run 60 "test_cuda_offload" "$TEST" ;;
  train) # 8B, T=32768: the same step with the checkpoints on the device, then offloaded
    run 120 "train qwen3-8b 32k, offload off/on" "$BIN" bench train --backend cuda --shape qwen3-8b --seq 32768 \
      --offload-both --repeats 2 --warmup 1 --no-peer --out "$OUT" ;;
  context) # the longest T with offload, by the planner (device and host budgets) and allocation
    run 150 "context qwen3-8b, offload" "$BIN" bench context --backend cuda --shape qwen3-8b --offload-checkpoints \
      --no-peer --confirm-seconds 0 --out "$OUT" ;;
  step) # one real step above the device-only ceiling (278,528): T = 294,912 (36 x 8192), attention
    # rerun in the recompute (least memory), ~53 GiB on the device and 76.5 GiB pinned on the host;
    # ~400 s expected (the 196,608 step took 175 s; attention grows as T^2)
    run 590 "train qwen3-8b 294912, offload" "$BIN" bench train --backend cuda --shape qwen3-8b --seq 294912 \
      --offload-checkpoints --recompute-attention 1 --repeats 1 --warmup 0 --no-peer --out "$OUT" ;;
  *) echo "unknown step $s" ;;
  esac
done
echo "=== done in $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$log"
