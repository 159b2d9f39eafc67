#!/usr/bin/env bash
# Packs the several-GPU device checks into DEST (default /work/main/.dev-mgpu2) for a lead-run
# device round: test_cuda_comm and longtune built here without MPI (the device image has no
# libmpi) for a portable CPU target, the tiny-model writer with its tokenizer fixture, the run
# comparator, the check scripts, and run.sh: MODE=r1 (default) the one-GPU round (dev/mgpu/run.sh,
# 60 s), MODE=x2 the two-GPU run (dev/mgpu/x2_run.sh, 180 s). Shared libraries come from the round
# driver's .dev-libs pack; libnccl is the device's own (CUDA toolkit, else the PyTorch wheel's).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-/work/main/.dev-mgpu2}
MODE=${MODE:-r1}
B=build-dev-mgpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DLT_MPI=OFF -DLT_NATIVE=OFF -DLT_WERROR=ON >/dev/null
nice -n 5 cmake --build $B -j2 --target test_cuda_comm longtune_cli >/dev/null
rm -rf "$DEST" && mkdir -p "$DEST/tests/cli" "$DEST/tests/fixtures/tokenizer/bpe-nfc" "$DEST/dev/mgpu"
cp $B/test_cuda_comm $B/longtune dev/mgpu/nccl_env.sh "$DEST/"
strip "$DEST/longtune" "$DEST/test_cuda_comm"  # the folder must stay under 10 MiB
if [ "$MODE" = x2 ]; then cp dev/mgpu/x2_run.sh "$DEST/run.sh"; echo 180 > "$DEST/seconds"
else cp dev/mgpu/run.sh "$DEST/run.sh"; echo 60 > "$DEST/seconds"; fi
cp tests/cli/tiny_model.py tests/cli/compare_runs.py "$DEST/tests/cli/"
cp dev/mgpu/nccl_train_check.sh dev/mgpu/x2_train_check.sh dev/mgpu/cp1_check.sh "$DEST/dev/mgpu/"
cp tests/fixtures/tokenizer/bpe-nfc/tokenizer.json tests/fixtures/tokenizer/bpe-nfc/tokenizer_config.json \
   "$DEST/tests/fixtures/tokenizer/bpe-nfc/"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
du -sh "$DEST"
