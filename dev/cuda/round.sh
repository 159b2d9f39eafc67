#!/usr/bin/env bash
# Fills a lead-run device-round folder (/work/main/.dev-attn3 by default) from this worktree: the
# GPU tests and the longtune binary built here (stripped, xz-packed: the folder stays < 10 MiB),
# the SDPA and loss peer scripts, a run script from dev/cuda/ as run.sh and the helpers it sources
# (dev/cuda/round_lib.sh). Usage:
#   dev/cuda/round.sh dev/cuda/r1_run.sh 75     then   touch $DEST/READY
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:?run script}
DEST=${DEST:-/work/main/.dev-attn3}
nice -n 5 make build JOBS=2 CMAKE_FLAGS=-DLT_WERROR=ON >/dev/null
rm -rf "$DEST" && mkdir -p "$DEST/bin" "$DEST/bench/peers"
cp build/test_cuda_attention build/test_cuda_lce build/longtune "$DEST/bin/"
strip "$DEST"/bin/*
tar cJf "$DEST/bin.tar.xz" -C "$DEST" bin && rm -rf "$DEST/bin"
cp bench/peers/attention_sdpa.py bench/peers/lce_torch.py "$DEST/bench/peers/"
cp "$RUN" "$DEST/run.sh"
cp dev/cuda/round_lib.sh "$DEST/"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
echo "${2:-75}" > "$DEST/seconds"
du -sh "$DEST"
