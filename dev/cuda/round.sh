#!/usr/bin/env bash
# Fills the lead's device-round folder (/work/main/.dev-attn2 by default) from this worktree: the
# test, kernel timer and wgmma probe built here, the SDPA peer script, and run.sh (dev/cuda/round_run.sh)
# with the steps of this round. Usage: dev/cuda/round.sh [seconds]; then `touch $DEST/READY`.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-/work/main/.dev-attn2}
nice -n 5 make build JOBS=2 CMAKE_FLAGS=-DLT_WERROR=ON >/dev/null
gcc -O2 -std=c11 -Iinclude dev/cuda/bench_kernels.c build/liblongtune.a -L/usr/local/cuda/lib64 \
  -lcudart -lcublasLt -lcublas -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lpcre2-8 \
  -lcjson -fopenmp -lm -lstdc++ -o build/bench_kernels
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -Iinclude -Isrc -DLT_HAVE_CUDA=1 \
  dev/cuda/wgmma_probe.cu -o build/wgmma_probe 2>&1 | grep -v C7519 || true
rm -rf "$DEST" && mkdir -p "$DEST/bin"
cp build/test_cuda_attention build/bench_kernels build/wgmma_probe build/longtune "$DEST/bin/"
strip "$DEST"/bin/* 2>/dev/null || true
mkdir -p "$DEST/bench/peers"
cp bench/peers/attention_sdpa.py "$DEST/bench/peers/"
cp bench/peers/attention_sdpa.py "$DEST/"
cp dev/cuda/round_run.sh "$DEST/run.sh"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
echo "${1:-150}" > "$DEST/seconds"
du -sh "$DEST"
