#!/usr/bin/env bash
# The lead's final device run from merged main, in up to three consecutive calls on one warm machine:
#   TESTS=1      the GPU tests (test_cuda_*), logs under $OUT/final
#   STEPS="..."  steps of scripts/gpu-bench.sh (flagship benches, transformers + PEFT peer in the same run)
#   OFFLOAD="..." steps of scripts/gpu-offload.sh (checkpoint offload: test train context step)
#   SMOL=a|b|c   stash this call's third of the real SmolLM2 GGUF (98 MB: over one call's 64 MiB transfer
#                limit) from .dev-smol-<x>/part into /tmp/smolparts; with REAL=1 the parts are joined,
#                checked against .dev-smol-c/sha256 and scripts/gpu-real.sh runs the real-model fine-tune.
# Expects binaries in .dev-final/bin (built here with nvcc), COMMIT, and .dev-libs/libs.tar.xz.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/final"
F=.dev-final
[ -f $F/bins.tar.xz ] && [ ! -x $F/bin/longtune ] && tar xJf $F/bins.tar.xz -C $F
mkdir -p /tmp/ltlibs && tar xJf .dev-libs/libs.tar.xz -C /tmp/ltlibs
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ldd $F/bin/longtune | grep -q "libnccl.*not found"; then
  d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
fi
export NCCL_NVLS_ENABLE=0 LONGTUNE_SOURCE_DIR=$PWD LONGTUNE_COMMIT=$(cat $F/COMMIT)
export LONGTUNE_BENCH_WEIGHTS=/tmp/longtune-bench-weights
t0=$(date +%s)
{
echo "=== commit $LONGTUNE_COMMIT $(date -u +%T)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ -n "${SMOL:-}" ]; then mkdir -p /tmp/smolparts && cp .dev-smol-$SMOL/part /tmp/smolparts/$SMOL && ls -la /tmp/smolparts; fi
if [ "${TESTS:-0}" = 1 ]; then
  for t in test_cuda_ops test_cuda_attention test_cuda_lce test_cuda_lora test_cuda_train test_cuda_graph test_cuda_offload test_cuda_comm test_cuda_guard; do
    [ -x $F/bin/$t ] || continue
    echo "=== $t $(date -u +%T)"
    timeout $(case $t in test_cuda_attention) echo 40;; test_cuda_comm|test_cuda_guard|test_cuda_graph) echo 15;; *) echo 30;; esac) $F/bin/$t > "$OUT/final/$t.log" 2>&1; echo "rc=$?"
    grep -E "test seed|FAILED|PASSED|ERROR|error" "$OUT/final/$t.log" | head -12
  done
fi
if [ -n "${STEPS:-}" ]; then
  echo "=== benches $(( $(date +%s) - t0 ))s so far"
  BIN=$F/bin/longtune OUT=$OUT/bench timeout ${BENCH_LIMIT:-450} bash scripts/gpu-bench.sh $STEPS
fi
if [ -n "${OFFLOAD:-}" ]; then
  echo "=== offload steps: $OFFLOAD $(( $(date +%s) - t0 ))s so far"
  BIN=$F/bin/longtune TEST=$F/bin/test_cuda_offload OUT=$OUT/offload timeout ${OFFLOAD_LIMIT:-300} bash scripts/gpu-offload.sh $OFFLOAD
fi
if [ "${REAL:-0}" = 1 ]; then
  cat /tmp/smolparts/a /tmp/smolparts/b /tmp/smolparts/c > /tmp/smol.gguf 2>/dev/null
  if [ "$(sha256sum /tmp/smol.gguf | cut -d' ' -f1)" = "$(cat .dev-smol-c/sha256)" ]; then
    echo "=== real SmolLM2 on CUDA $(date -u +%T)"
    MODEL=/tmp/smol.gguf DATA=.dev-smol-c/python-faq BIN=$F/bin/longtune OUT=$OUT/real timeout ${REAL_LIMIT:-300} bash scripts/gpu-real.sh
    echo "gpu-real rc=$?"
  else
    echo "real model: parts missing or checksum differs (machine changed between calls?)"; ls -la /tmp/smolparts
  fi
fi
echo "=== end $(( $(date +%s) - t0 ))s"
} 2>&1 | tee "$OUT/final/run.log"
find "$OUT" -type f -size +1M -printf "%p %s\n" > /tmp/big.txt; find "$OUT" -type f -size +1M -delete; mv /tmp/big.txt "$OUT/dropped_big_files.txt"
tar czf /tmp/round.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/round.tgz "$OUT/round.tgz"
