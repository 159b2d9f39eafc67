#!/usr/bin/env bash
# Builds longtune with the CUDA backend and runs the GPU-labelled tests (ctest -L gpu) on a machine
# with an NVIDIA GPU. BUILD (default build-gpu) names the build folder; extra arguments go to ctest.
# Without a device the tests report "skipped" (exit 77), which ctest counts as not failed.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLT_CUDA=ON ${CMAKE_FLAGS:-} >/dev/null
cmake --build "$BUILD" -j "$JOBS"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
cd "$BUILD" && ctest -L gpu --output-on-failure "$@"
