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
test_cfg default default
t "test fallbacks: fwd wg (2 buffers) everywhere, dQ atomic everywhere"
LONGTUNE_ATTN_FWD=wg LONGTUNE_ATTN_DQ=atomic timeout 15 bin/test_cuda_attention 2>&1 | grep -v "^test seed\|cpu backend"
t "cli default kernels, with peers"
LONGTUNE_SOURCE_DIR=$PWD timeout 40 bin/longtune bench attention --backend cuda --repeats 10 --out "$OUT" 2>&1 | tail -12
t "cli fwd wg + dQ atomic (packed comparison, no peers)"
mkdir -p "$OUT/fallback"; LONGTUNE_ATTN_FWD=wg LONGTUNE_ATTN_DQ=atomic timeout 15 bin/longtune bench attention --backend cuda \
  --no-peers --T 8192 --repeats 10 --out "$OUT/fallback" 2>&1 | tail -3
t memcheck
timeout 15 compute-sanitizer --tool memcheck --print-limit 10 bin/test_cuda_attention 2>&1 | tail -3
t racecheck
timeout 15 compute-sanitizer --tool racecheck --print-limit 10 bin/test_cuda_attention 2>&1 | tail -3
bench_cfg d128 default default
t end
} 2>&1 | tee "$OUT/device.log"
