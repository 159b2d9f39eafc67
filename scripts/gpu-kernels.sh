#!/usr/bin/env bash
# Where one CUDA training step's device time goes, kernel by kernel: Nsight Compute times every
# launch of one eager step (`bench train --cuda-graph off --repeats 1 --warmup 0`; weight loading
# included, a few ms) and scripts/ncu_kernels.py sums the launches per kernel. ncu serialises the
# launches and flushes the caches before each, so the sum runs a few percent over a real step:
# compare two builds with this, and quote `bench train` for the step itself. ~2 minutes for the
# Qwen3-8B shape at 8k on an H200. The CSV and the table go to $OUT (default /tmp/gpu-kernels).
#
# usage: scripts/gpu-kernels.sh [bench train flags]   (default: --shape qwen3-8b --seq 8192 --recompute none)
#        BIN=path/to/longtune (default build/longtune), NCU=path/to/ncu (default: ncu on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/longtune}
OUT=${OUT:-/tmp/gpu-kernels}
NCU=${NCU:-$(command -v ncu || true)}
[ -n "$NCU" ] || { echo "gpu-kernels: ncu (Nsight Compute) not found; set NCU" >&2; exit 2; }
mkdir -p "$OUT"
export LONGTUNE_SOURCE_DIR=$PWD
export LONGTUNE_BENCH_WEIGHTS=${LONGTUNE_BENCH_WEIGHTS:-/tmp/longtune-bench-weights}
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--shape qwen3-8b --seq 8192 --recompute none)
"$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
  "$BIN" bench train --backend cuda "${args[@]}" --no-peer --repeats 1 --warmup 0 --cuda-graph off \
  --out "$OUT/bench" >"$OUT/ncu.csv" 2>"$OUT/ncu.log"
python3 scripts/ncu_kernels.py "$OUT/ncu.csv" --json "$OUT/kernels.json" | tee "$OUT/kernels.txt"
