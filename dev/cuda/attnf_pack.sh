#!/usr/bin/env bash
# Fills the lead-run device folder (/work/main/.dev-attnf by default) from this worktree's build-dev/
# (Release, LT_NATIVE=OFF so the binaries run on the device's CPU): the GPU attention test and
# longtune, the forward shape timer dev/cuda/attnf_shapes.c, stripped and xz-packed, the SDPA peer
# script, and a run script (default dev/cuda/attnf_run.sh) as run.sh.
# Usage: dev/cuda/attnf_pack.sh [run-script] [seconds]; then touch $DEST/READY.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:-dev/cuda/attnf_run.sh}
DEST=${DEST:-/work/main/.dev-attnf}
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DLT_MPI=OFF -DLT_NATIVE=OFF -DLT_WERROR=ON >/dev/null
nice -n 5 cmake --build build-dev -j2 --target longtune_cli test_cuda_attention >/dev/null
gcc -O2 -std=c11 -Wall -Wextra -Werror -Iinclude -I/usr/local/cuda/include dev/cuda/attnf_shapes.c \
  build-dev/liblongtune.a -L/usr/local/cuda/lib64 -lcudart -lcublasLt -lcublas \
  -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lpcre2-8 -lcjson -fopenmp -lm -lstdc++ \
  -o build-dev/attnf_shapes
rm -rf "$DEST" && mkdir -p "$DEST/bin" "$DEST/bench/peers"
cp build-dev/test_cuda_attention build-dev/longtune build-dev/attnf_shapes "$DEST/bin/"
cp bench/peers/attention_sdpa.py "$DEST/bench/peers/"
strip "$DEST"/bin/*
tar cJf "$DEST/bin.tar.xz" -C "$DEST" bin && rm -rf "$DEST/bin"
cp "$RUN" "$DEST/run.sh"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
echo "${2:-60}" > "$DEST/seconds"
du -sh "$DEST"
