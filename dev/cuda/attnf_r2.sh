#!/usr/bin/env bash
# Session 4 device round 2 (attnf): the committed defaults (warp-specialised TMA forward, 3 stages,
# for long rows). GPU attention test (forward cases over every variant), the attention
# bench with the SDPA peers (bench/results/attention-cuda-bf16.json), the forward-only shape table
# that picks the kernel per shape (dev/cuda/attnf_shapes.c), ping-pong off for comparison, and
# memcheck over the GPU test. Filled by dev/cuda/attnf_pack.sh; logs under $OUT. Fits a 60 s cap.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/attnf && tar xJf bin.tar.xz -C /tmp/attnf
B=/tmp/attnf/bin
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export LONGTUNE_COMMIT=$(cat COMMIT) LONGTUNE_SOURCE_DIR=$PWD
t() { echo "=== $* $(date -u +%T)"; }
{
t info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT
t test_cuda_attention
timeout 15 $B/test_cuda_attention > "$OUT/test_cuda_attention.log" 2>&1; echo "rc=$?"
grep -E "seed|fwd |FAILED|PASSED|ERROR|forward|worst" "$OUT/test_cuda_attention.log" | head -40
t "bench attention with peers (--repeats 20)"
mkdir -p "$OUT/attention"
timeout 30 $B/longtune bench attention --backend cuda --repeats 20 --out "$OUT/attention" 2>&1 | grep -v "^wrote"
t "forward per shape and variant"
timeout 10 $B/attnf_shapes 10 | tee "$OUT/shapes.jsonl"
t "ping-pong off"
LONGTUNE_ATTN_WS_PP=0 timeout 5 $B/longtune bench attention --backend cuda --no-peers --T 8192 --repeats 10 \
  --packed-T 0 --out "$OUT" 2>&1 | grep -v "^wrote"
t memcheck
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 12 $CS --tool memcheck --print-limit 10 $B/test_cuda_attention > "$OUT/memcheck.log" 2>&1
echo "rc=$?"; tail -3 "$OUT/memcheck.log"
t end
} 2>&1 | tee "$OUT/device.log"
