#!/usr/bin/env bash
# Device round 2 for the warp-specialised attention backward (attention_bwd_ws.cu): the GPU tests
# with the default plan, the ws_* cases with the previous issue order (LONGTUNE_ATTN_WS_ORDER=late),
# the attention bench with the SDPA peers (FA2, cuDNN) at the default shapes, the late order at
# 8k/32k (R1 measured the previous kernel, LONGTUNE_ATTN_BWD=wg, in the same run), short rows (2k/4k) with one CTA per kv
# head (LONGTUNE_ATTN_SPLIT=1: the ws kernel) against the default split plan, then racecheck of
# one ws case. Expects bin.tar.xz (test_cuda_attention, longtune) next to it; logs under $OUT.
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
cli() { # name, seconds, T list, env...
  local n=$1 s=$2 T=$3; shift 3
  t "cli $n T=$T"
  mkdir -p "$OUT/cli_$n"
  env "$@" timeout $s $B/longtune bench attention --backend cuda --no-peers --T $T --packed-T 0 \
    --repeats 10 --out "$OUT/cli_$n" 2>&1 | grep -v "^wrote"
}
{
t info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT
tst ws 12 LONGTUNE_X=0
t "bench with peers (bench/results/attention-cuda-bf16.json)"
mkdir -p "$OUT/attention"
timeout 26 $B/longtune bench attention --backend cuda --repeats 10 --out "$OUT/attention" 2>&1 | grep -v "^wrote"
cli late 5 8192,32768 LONGTUNE_ATTN_WS_ORDER=late
cli short_split 3 2048,4096 LONGTUNE_X=0
cli short_ws 3 2048,4096 LONGTUNE_ATTN_SPLIT=1
tst late 5 LT_TEST_FILTER='ws_*' LONGTUNE_ATTN_WS_ORDER=late
t racecheck
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
LT_TEST_FILTER='ws_causal*' timeout 6 $CS --tool racecheck --print-limit 10 $B/test_cuda_attention 2>&1 | tail -6
t end
} 2>&1 | tee "$OUT/run.log"
