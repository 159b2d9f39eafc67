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
t "test dQ atomic everywhere"; LONGTUNE_ATTN_DQ=atomic timeout 20 bin/test_cuda_attention 2>&1 | grep -v "^test seed\|cpu backend"
t "test dQ kernel everywhere"; LONGTUNE_ATTN_DQ=sep timeout 20 bin/test_cuda_attention 2>&1 | grep -v "^test seed\|cpu backend"
test_cfg mma mma
bench_cfg d128 default default
bench_cfg d128 default default 2
bench_cfg d64 default default
t "bench d128 dQ atomic"; LONGTUNE_ATTN_DQ=atomic timeout 20 bin/bench_kernels d128 10 | sed 's/^{/{"dq":"atomic",/' | tee -a "$OUT/bench.jsonl"
t "cli packed row, dQ atomic (no peers)"
mkdir -p "$OUT/dqatomic"; LONGTUNE_ATTN_DQ=atomic timeout 20 bin/longtune bench attention --backend cuda --no-peers --T 8192 --repeats 10 --out "$OUT/dqatomic" 2>&1 | tail -4
t "cli default kernels, with peers"
LONGTUNE_SOURCE_DIR=$PWD timeout 60 bin/longtune bench attention --backend cuda --repeats 10 --out "$OUT" 2>&1 | tail -12
t "ncu bwd"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy"
timeout 40 $NCU --clock-control none -k regex:attn_bwd_wg_kernel -c 1 $SEC bin/bench_kernels attn8k 1 2>&1 | grep -v "^==PROF==\|^{" | tail -110
t "ncu fwd"
timeout 30 $NCU --clock-control none -k regex:attn_fwd_wg_kernel -c 1 $SEC bin/bench_kernels attn8k 1 2>&1 | grep -v "^==PROF==\|^{" | tail -110
t memcheck
timeout 30 compute-sanitizer --tool memcheck --print-limit 10 bin/test_cuda_attention 2>&1 | tail -3
t racecheck
timeout 30 compute-sanitizer --tool racecheck --print-limit 10 bin/test_cuda_attention 2>&1 | tail -3
t end
} 2>&1 | tee "$OUT/device.log"
