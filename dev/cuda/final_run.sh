#!/usr/bin/env bash
# The final device run of session 2 (from merged main): GPU tests, a CUDA training run at the SmolLM2
# shape, then the flagship benches (scripts/gpu-bench.sh) with the transformers + PEFT peer in the same run.
# Expects a pack laid out as .dev-final/ (bin/, COMMIT, data/, random_gguf.py, smol_head.bin.xz) + .dev-libs/.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/final"
F=.dev-final
mkdir -p /tmp/ltlibs && tar xJf .dev-libs/libs.tar.xz -C /tmp/ltlibs
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ldd $F/bin/longtune | grep -q "libnccl.*not found"; then
  d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
fi
export NCCL_NVLS_ENABLE=0 LONGTUNE_SOURCE_DIR=$PWD LONGTUNE_COMMIT=$(cat $F/COMMIT)
export LONGTUNE_TEST_SEED=${LONGTUNE_TEST_SEED:-}
t0=$(date +%s)
{
echo "=== commit $LONGTUNE_COMMIT $(date -u +%T)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
(xz -dc $F/smol_head.bin.xz > /tmp/smol_head.bin && python3 $F/random_gguf.py fill /tmp/smol_head.bin /tmp/smol_random.gguf 1) > "$OUT/final/gguf.log" 2>&1 &
for t in test_cuda_ops test_cuda_attention test_cuda_lce test_cuda_train test_cuda_comm test_cuda_guard; do
  [ -x $F/bin/$t ] || continue
  echo "=== $t $(date -u +%T)"
  timeout $(case $t in test_cuda_attention) echo 40;; test_cuda_comm|test_cuda_guard) echo 15;; *) echo 30;; esac) $F/bin/$t > "$OUT/final/$t.log" 2>&1; echo "rc=$?"
  grep -E "test seed|FAILED|PASSED|ERROR|error" "$OUT/final/$t.log" | head -12
done
wait
echo "=== train cuda smollm2-shape $(date -u +%T)"
timeout 20 $F/bin/longtune train --device cuda --model /tmp/smol_random.gguf --data $F/data --adapter-path /tmp/adapter \
  --iters 24 --batch-size 4 --max-seq-length 512 --learning-rate 2e-4 --steps-per-eval 12 --val-batches 3 \
  --steps-per-report 4 --save-every 100 > "$OUT/final/train_cuda.log" 2>&1; echo "rc=$?"
grep -v "^train [0-9]" "$OUT/final/train_cuda.log" | tail -12
cp /tmp/adapter/metrics.jsonl "$OUT/final/metrics_cuda.jsonl" 2>/dev/null
echo "=== benches $(( $(date +%s) - t0 ))s so far"
BIN=$F/bin/longtune OUT=$OUT/bench timeout 330 bash scripts/gpu-bench.sh ${STEPS:-train8b train135m context8b packed135m chart}
echo "=== end $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$OUT/final/run.log"
find "$OUT" -type f -size +1M -printf "%p %s\n" > /tmp/big.txt; find "$OUT" -type f -size +1M -delete; mv /tmp/big.txt "$OUT/dropped_big_files.txt"
tar czf /tmp/round.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/round.tgz "$OUT/round.tgz"
