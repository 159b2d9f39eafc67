#!/usr/bin/env bash
# Device check of the warp-specialised attention backward as committed after round 2 (issue order
# of the measured-faster variant as the only one; the kernel also taken where the plan would split
# heads if that still gives >= 128 CTAs): the GPU tests (13 cases), then the attention bench with
# the default plan at T = 2k/4k/8k/32k and the previous kernel (LONGTUNE_ATTN_BWD=wg) at 4k.
# Expects bin.tar.xz (test_cuda_attention, longtune) next to it; logs under $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/attnb && tar xJf bin.tar.xz -C /tmp/attnb
B=/tmp/attnb/bin
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ldd $B/longtune | grep -q "libnccl.*not found"; then
  d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
fi
export LONGTUNE_COMMIT=$(cat COMMIT) LONGTUNE_SOURCE_DIR=$PWD
t() { echo "=== $* $(date -u +%T)"; }
{
t info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT
t test_cuda_attention
timeout 16 $B/test_cuda_attention > "$OUT/test_attn.log" 2>&1; echo "rc=$?"
grep -E "seed|FAILED|PASSED|ERROR|err " "$OUT/test_attn.log" | grep -vE " (out|lse) " | tail -45
t "cli default"
mkdir -p "$OUT/cli_default" "$OUT/cli_wg"
timeout 8 $B/longtune bench attention --backend cuda --no-peers --T 2048,4096,8192,32768 --packed-T 0 \
  --repeats 10 --out "$OUT/cli_default" 2>&1 | grep -v "^wrote"
t "cli wg"
LONGTUNE_ATTN_BWD=wg timeout 3 $B/longtune bench attention --backend cuda --no-peers --T 4096 --packed-T 0 \
  --repeats 10 --out "$OUT/cli_wg" 2>&1 | grep -v "^wrote"
t end
} 2>&1 | tee "$OUT/run.log"
