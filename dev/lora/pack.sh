#!/usr/bin/env bash
# Fills the git-ignored round folder DEST (default /work/main/.dev-lora4) for dev/lora/run.sh:
# the stripped, xz'd binaries of build-dev (configure it with -DLT_MPI=OFF -DLT_NATIVE=OFF so they
# run on the device's CPU), the commit, the run script and its seconds. Does not touch READY.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-/work/main/.dev-lora4}
SECONDS_CAP=${SECONDS_CAP:-90}
mkdir -p "$DEST"
tmp=$(mktemp -d)
for b in longtune test_cuda_lora test_cuda_ops test_cuda_train; do cp build-dev/$b "$tmp/"; strip "$tmp/$b"; done
tar cJf "$DEST/bins.tar.xz" -C "$tmp" .
rm -rf "$tmp"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
cp dev/lora/run.sh "$DEST/run.sh"
echo "$SECONDS_CAP" > "$DEST/seconds"
du -sh "$DEST"
