#!/usr/bin/env bash
# One device round of the attention kernels (dev/cuda/NOTES.md): the wgmma probe, the GPU test for
# every kernel variant timed, the kernel timer per variant, the SDPA peers at T = 2k/8k/32k, and
# compute-sanitizer. Runs from the folder dev/cuda/round.sh filled; logs and JSON lines under $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export LONGTUNE_COMMIT=$(cat COMMIT 2>/dev/null || echo unknown)
t() { echo "=== $* $(date -u +%T)"; }
test_cfg() { # fwd bwd split
  t "test fwd=$1 bwd=$2 split=${3:-auto}"
  env LONGTUNE_ATTN_FWD=$1 LONGTUNE_ATTN_BWD=$2 ${3:+LONGTUNE_ATTN_SPLIT=$3} timeout 20 bin/test_cuda_attention 2>&1 \
    | grep -v "^test seed\|cpu backend"
  echo "rc=${PIPESTATUS[0]}"
}
bench_cfg() { # what fwd bwd split
  t "bench $1 fwd=$2 bwd=$3 split=${4:-auto}"
  env LONGTUNE_ATTN_FWD=$2 LONGTUNE_ATTN_BWD=$3 ${4:+LONGTUNE_ATTN_SPLIT=$4} timeout 20 bin/bench_kernels $1 10 \
    | sed "s/^{/{\"split\":\"${4:-auto}\",/" | tee -a "$OUT/bench.jsonl"
}
{
t info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t probe; timeout 10 bin/wgmma_probe; echo "rc=$?"
test_cfg wg wg
test_cfg wg2 mma
test_cfg mma wg 1
test_cfg mma wgb
test_cfg mma mma
bench_cfg d128 mma mma
bench_cfg d128 wg wg
bench_cfg d128 wg2 wg
bench_cfg d128 wg2 wgb
bench_cfg d128 wg wg 1
bench_cfg d128 wg wg 2
for ab in 1 2 4 6; do t "ablate $ab (wrong results; timing only)"
  env LONGTUNE_ATTN_FWD=wg LONGTUNE_ATTN_BWD=wg LONGTUNE_ATTN_ABLATE=$ab timeout 10 bin/bench_kernels attn8k 10 \
    | sed "s/^{/{\"ablate\":$ab,/" | tee -a "$OUT/bench.jsonl"; done
bench_cfg d64 mma mma
bench_cfg d64 wg wg
bench_cfg d64 wg2 wg
t peers
PYTHONUNBUFFERED=1 timeout 45 python3 -c "
import sys; sys.argv = ['x', '10']
import attention_sdpa as m
m.SHAPES = [(2048, 32, 8, 128), (8192, 32, 8, 128), (32768, 32, 8, 128)]
m.main()" | tee "$OUT/peers.jsonl"
t "cli fwd=wg bwd=wg (T=8192, D=64 row, packed row)"
env LONGTUNE_ATTN_FWD=wg LONGTUNE_ATTN_BWD=wg timeout 20 bin/longtune bench attention --backend cuda --no-peers \
  --T 8192 --repeats 10 --out "$OUT" 2>&1 | tail -4
t memcheck
LONGTUNE_ATTN_FWD=wg LONGTUNE_ATTN_BWD=wg timeout 30 compute-sanitizer --tool memcheck --print-limit 10 bin/test_cuda_attention 2>&1 | tail -4
test_cfg mma wg 2
t racecheck
LONGTUNE_ATTN_FWD=wg LONGTUNE_ATTN_BWD=wg timeout 30 compute-sanitizer --tool racecheck --print-limit 10 bin/test_cuda_attention 2>&1 | tail -4
t end
} 2>&1 | tee "$OUT/device.log"
