#!/usr/bin/env bash
# Packs the NCCL device check into DEST (default /work/main/.dev-mgpu) for a lead-run device
# round: test_cuda_comm built here without MPI (the device image has no libmpi) and for a portable
# CPU target, plus run.sh. The shared libraries come from the round driver's .dev-libs pack;
# libnccl is the device's own (CUDA toolkit, else the PyTorch wheel's).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-/work/main/.dev-mgpu}
B=build-dev-mgpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DLT_MPI=OFF -DLT_NATIVE=OFF -DLT_WERROR=ON >/dev/null
nice -n 5 cmake --build $B -j2 --target test_cuda_comm >/dev/null
rm -rf "$DEST" && mkdir -p "$DEST"
cp $B/test_cuda_comm dev/mgpu/run.sh "$DEST/"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
echo 25 > "$DEST/seconds"
du -sh "$DEST"
