#!/usr/bin/env bash
# Fills the git-ignored round folder (default /work/main/.dev-attnb) from this worktree's build-dev
# (cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DLT_MPI=OFF -DLT_NATIVE=OFF): stripped
# test_cuda_attention and longtune in bin.tar.xz, run.sh, COMMIT and seconds; READY is left to
# the caller. The round driver provides the shared libraries (.dev-libs).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-/work/main/.dev-attnb}
rm -rf "$DEST" && mkdir -p "$DEST/bin"
cp build-dev/test_cuda_attention build-dev/longtune "$DEST/bin/"
strip "$DEST/bin/"*
tar cJf "$DEST/bin.tar.xz" -C "$DEST" bin && rm -rf "$DEST/bin"
cp dev/attnb/run.sh "$DEST/run.sh"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
echo "${SECONDS_NEEDED:-60}" > "$DEST/seconds"
du -sh "$DEST"
