#!/usr/bin/env bash
# Packs the NCCL device checks into DEST (default /work/main/.dev-mgpu) for a lead-run device
# round: test_cuda_comm and longtune built here without MPI (the device image has no libmpi) and
# for a portable CPU target, the tiny-model writer with its tokenizer fixture, the run comparator,
# and run.sh. Shared libraries come from the round driver's .dev-libs pack; libnccl is the
# device's own (CUDA toolkit, else the PyTorch wheel's).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-/work/main/.dev-mgpu}
B=build-dev-mgpu
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DLT_MPI=OFF -DLT_NATIVE=OFF -DLT_WERROR=ON >/dev/null
nice -n 5 cmake --build $B -j2 --target test_cuda_comm longtune_cli >/dev/null
rm -rf "$DEST" && mkdir -p "$DEST/tests/cli" "$DEST/tests/fixtures/tokenizer/bpe-nfc"
cp $B/test_cuda_comm $B/longtune dev/mgpu/run.sh "$DEST/"
cp tests/cli/tiny_model.py tests/cli/compare_runs.py "$DEST/tests/cli/"
mkdir -p "$DEST/dev/mgpu" && cp dev/mgpu/nccl_train_check.sh "$DEST/dev/mgpu/"
cp tests/fixtures/tokenizer/bpe-nfc/tokenizer.json tests/fixtures/tokenizer/bpe-nfc/tokenizer_config.json \
   "$DEST/tests/fixtures/tokenizer/bpe-nfc/"
c=$(git rev-parse --short HEAD); git diff --quiet HEAD || c="$c-dirty"; echo "$c" > "$DEST/COMMIT"
echo 15 > "$DEST/seconds"
du -sh "$DEST"
