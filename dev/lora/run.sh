#!/usr/bin/env bash
# lora4 device round: the CUDA tests of the fused LoRA projection ops (test_cuda_lora), the op
# table (test_cuda_ops) and the trainer against the CPU (test_cuda_train), then the Qwen3-8B-shape
# 8k step with the op profile and, time allowing, one 32k step. Binaries come from
# dev/lora/pack.sh (bins.tar.xz); the round driver has put the shared libraries in /tmp/ltlibs.
set -u
OUT=${OUT:-/tmp/out}; BIN=/tmp/lora4-bin; mkdir -p "$OUT" $BIN /tmp/ltlibs
tar xJf bins.tar.xz -C $BIN
[ -f /tmp/ltlibs/libcmocka.so.0 ] || tar xJf ../.dev-libs/libs.tar.xz -C /tmp/ltlibs 2>/dev/null
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export LONGTUNE_COMMIT="$(cat COMMIT)" LONGTUNE_BENCH_WEIGHTS=/tmp/longtune-bench-weights LONGTUNE_TEST_SEED=0
t0=$(date +%s); el() { echo "--- $(( $(date +%s) - t0 ))s"; }
for t in test_cuda_lora test_cuda_ops test_cuda_train; do
  echo "=== $t"; timeout 25 $BIN/$t > "$OUT/$t.log" 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED|LINE|error|G=" "$OUT/$t.log" | head -12; el
done
echo "=== profile 8k"
timeout 25 $BIN/longtune bench train --backend cuda --shape qwen3-8b --seq 8192 --no-peer \
  --repeats 1 --warmup 1 --profile --out "$OUT" > "$OUT/profile8k.log" 2>&1; echo "rc=$?"
grep -E "^T=|step|matmul|gemm|cvt" "$OUT/profile8k.log" | head -30; el
left=$(( ${CAP:-90} - ($(date +%s) - t0) ))
if [ $left -gt 22 ]; then
  echo "=== 32k step"
  timeout $((left - 2)) $BIN/longtune bench train --backend cuda --shape qwen3-8b --seq 32768 --no-peer \
    --repeats 1 --warmup 0 --out "$OUT" > "$OUT/train32k.log" 2>&1; echo "rc=$?"; grep -E "^T=" "$OUT/train32k.log"; el
fi
