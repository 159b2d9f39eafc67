#!/usr/bin/env bash
# Device round for the warp-specialised attention backward (attention_bwd_ws.cu): GPU tests with
# the new kernel (default where eligible), its variants (three stages, dQ by atomics) on the ws_*
# cases, the previous kernel (LONGTUNE_ATTN_BWD=wg), and the attention bench at T = 8k/32k (D=128
# GQA, and the D=64 arm) for each, no peers; memcheck of the ws cases last. Expects bin.tar.xz
# (test_cuda_attention, longtune) next to it; logs under $OUT.
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
tst() { # name, seconds, env...
  local n=$1 s=$2; shift 2
  t "test_cuda_attention $n"
  env "$@" timeout $s $B/test_cuda_attention > "$OUT/test_attn_$n.log" 2>&1; echo "rc=$?"
  grep -E "seed|FAILED|PASSED|ERROR|err " "$OUT/test_attn_$n.log" | grep -vE " (out|lse) " | tail -40
}
cli() { # name, seconds, env...
  local n=$1 s=$2; shift 2
  t "cli $n"
  mkdir -p "$OUT/cli_$n"
  env "$@" timeout $s $B/longtune bench attention --backend cuda --no-peers --T 8192,32768 --packed-T 0 \
    --repeats ${REPEATS:-5} --out "$OUT/cli_$n" 2>&1 | grep -v "^wrote"
}
{
t info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT
tst ws 12 LONGTUNE_X=0
cli ws 8 LONGTUNE_X=0
cli wg 8 LONGTUNE_ATTN_BWD=wg
cli ws3 6 LONGTUNE_ATTN_WS_STAGES=3
cli wsa 6 LONGTUNE_ATTN_WS_DQ=atomic
tst ws3 6 LT_TEST_FILTER='ws_*' LONGTUNE_ATTN_WS_STAGES=3
tst wsa 6 LT_TEST_FILTER='ws_*' LONGTUNE_ATTN_WS_DQ=atomic
tst wg 8 LONGTUNE_ATTN_BWD=wg
t memcheck
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
LT_TEST_FILTER='ws_causal*' timeout 8 $CS --tool memcheck --print-limit 10 $B/test_cuda_attention 2>&1 | tail -15
t end
} 2>&1 | tee "$OUT/run.log"
