#!/usr/bin/env bash
# Fills the lead-run device folder (/work/main/.dev-attnf by default) from this worktree's build-dev/
# (Release, LT_NATIVE=OFF so the binaries run on the device's CPU): the GPU attention test and
# longtune, stripped and xz-packed, plus a run script (default dev/cuda/attnf_run.sh) as run.sh.
# Usage: dev/cuda/attnf_pack.sh [run-script] [seconds]; then touch $DEST/READY.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:-dev/cuda/attnf_run.sh}
DEST=${DEST:-/work/main/.dev-attnf}
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DLT_MPI=OFF -DLT_NATIVE=OFF -DLT_WERROR=ON >/dev/null
nice -n 5 cmake --build build-dev -j2 --target longtune_cli test_cuda_attention >/dev/null
rm -rf "$DEST" && mkdir -p "$DEST/bin"
cp build-dev/test_cuda_attention build-dev/longtune "$DEST/bin/"
strip "$DEST"/bin/*
tar cJf "$DEST/bin.tar.xz" -C "$DEST" bin && rm -rf "$DEST/bin"
cp "$RUN" "$DEST/run.sh"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
echo "${2:-60}" > "$DEST/seconds"
du -sh "$DEST"
