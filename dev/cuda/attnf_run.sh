#!/usr/bin/env bash
# Session 4 device round (attnf): the warp-specialised TMA forward (LONGTUNE_ATTN_FWD=ws|ws3) next
# to the one-warpgroup kernels. GPU attention test (its forward cases run every variant and print
# each one's error), then the attention bench per forward variant (no peers: fwd and fwd+bwd ms,
# JSON per variant). Filled by dev/cuda/attnf_pack.sh; logs under $OUT. Fits a 60 s cap.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/attnf && tar xJf bin.tar.xz -C /tmp/attnf
B=/tmp/attnf/bin
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export LONGTUNE_COMMIT=$(cat COMMIT) LONGTUNE_SOURCE_DIR=$PWD
t() { echo "=== $* $(date -u +%T)"; }
cli() { # name, T list, timeout, env...
  local n=$1 T=$2 to=$3; shift 3
  t "bench attention $n T=$T"
  mkdir -p "$OUT/cli_$n"
  env "$@" timeout "$to" $B/longtune bench attention --backend cuda --no-peers --T "$T" --repeats 10 \
    --out "$OUT/cli_$n" 2>&1 | grep -v "^wrote"
}
{
t info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT
cli ws_smoke 8192 6 LONGTUNE_ATTN_FWD=ws
t test_cuda_attention
timeout ${TEST_S:-22} $B/test_cuda_attention > "$OUT/test_cuda_attention.log" 2>&1; echo "rc=$?"
grep -E "seed|fwd |FAILED|PASSED|ERROR|forward" "$OUT/test_cuda_attention.log" | head -60
cli default 2048,8192,32768 8 LONGTUNE_X=0
cli ws 2048,8192,32768 8 LONGTUNE_ATTN_FWD=ws
cli ws3 8192,32768 8 LONGTUNE_ATTN_FWD=ws3
t end
} 2>&1 | tee "$OUT/device.log"
