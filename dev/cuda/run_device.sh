#!/usr/bin/env bash
# One batched device session (see dev/cuda/NOTES.md): GPU tests, compute-sanitizer, the kernel
# timer and the PyTorch peers, all logs under $OUT. Expects binaries built on the dev machine in
# bin/ and the shared libraries the device image lacks in libs.tar.xz (both made by
# dev/cuda/pack.sh); falls back to scripts/gpu-test.sh when the image has the build dependencies.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/ltlibs
tar xJf libs.tar.xz -C /tmp/ltlibs 2>/dev/null
export LONGTUNE_COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
STEPS=${STEPS:-info tests bench peers sanitize}
{
for s in $STEPS; do
  echo "=== $s $(date -u +%T)"
  case $s in
  info)
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
    nvcc --version | tail -1; ldd bin/test_cuda_attention | grep -i "not found"
    for p in cmocka libcjson libpcre2-8 openblas; do pkg-config --exists $p 2>/dev/null && echo "pc $p yes" || echo "pc $p no"; done ;;
  tests)
    timeout 90 bin/test_cuda_attention; echo "rc=$?"
    timeout 60 bin/test_cuda_lce; echo "rc=$?" ;;
  bench)
    timeout 100 bin/bench_kernels attention 10 | tee "$OUT/bench_cuda.jsonl" ;;
  peers)
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers/attention_sdpa.py 10 | tee "$OUT/peers_attention.jsonl"
    PYTHONUNBUFFERED=1 timeout 150 python3 bench/peers/lce_torch.py 5 | tee "$OUT/peers_lce.jsonl" ;;
  sanitize)
    timeout 100 compute-sanitizer --tool memcheck --print-limit 20 bin/test_cuda_attention 2>&1 | tail -4
    timeout 120 compute-sanitizer --tool racecheck --print-limit 20 bin/test_cuda_attention 2>&1 | tail -4 ;;
  sanitize_lce)
    timeout 200 compute-sanitizer --tool memcheck --print-limit 20 bin/test_cuda_lce 2>&1 | tail -4 ;;
  variants)
    echo "bwd v2 (8 warps x 16 keys)"; LONGTUNE_ATTN_BWD=8 timeout 60 bin/bench_kernels attn8k 10
    LONGTUNE_ATTN_BWD=8 timeout 100 bin/test_cuda_attention 2>&1 | tail -3 ;;
  cli)
    timeout 120 bin/longtune bench attention --backend cuda --repeats 10 --out "$OUT" ;;
  clilce)
    timeout 150 bin/longtune bench lce --backend cuda --repeats 5 --out "$OUT" ;;
  gputest)
    JOBS=16 timeout 120 scripts/gpu-test.sh 2>&1 | tail -5 ;;
  lcepeers)
    PYTHONUNBUFFERED=1 timeout 150 python3 bench/peers/lce_torch.py 5 | tee "$OUT/peers_lce.jsonl" ;;
  attn_only)
    timeout 100 bin/bench_kernels attention 10 | tee "$OUT/bench_cuda.jsonl" ;;
  esac
done
} 2>&1 | tee "$OUT/device.log"
