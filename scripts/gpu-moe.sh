#!/usr/bin/env bash
# The mixture-of-experts GPU benchmark on one CUDA device: builds the CLI with the CUDA backend, then
# `longtune bench moe --backend cuda` on the Qwen3-30B-A3B shape with 4 layers (random bf16 weights,
# a ~6 GB checkpoint written once and reused): LoRA steps at T = 8k, 16k, 32k, 64k with the expert
# dispatch chunked (--moe-chunk-tokens default) and unchunked, the planner's prediction beside each
# peak, the longest trainable T of both arms (up to 256k, a real step at the longest) and
# transformers + PEFT on the same shape in the same invocation (its own longest T, stopping at its
# first OOM). The result goes to $OUT/moe-cuda.json (default bench/results), the log to
# $OUT/gpu-moe.log. It installs nothing: the peer imports torch, transformers and peft from
# $LONGTUNE_PEER_PATH (default /tmp/lt-peer) or python3's own packages.
#
# usage: scripts/gpu-moe.sh [step ...]   steps: build bench (default: both, in that order; under a
#        10-minute limit per command run `scripts/gpu-moe.sh build`, then `scripts/gpu-moe.sh bench`)
#        BUILD (default build-gpu) names the build folder; BIN=path/to/longtune skips the build's
#        binary for another; extra bench flags go in MOE_FLAGS (e.g. "--max 131072 --no-confirm").
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
BIN=${BIN:-$BUILD/longtune}
OUT=${OUT:-bench/results}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
export LONGTUNE_SOURCE_DIR=$PWD
export LONGTUNE_BENCH_WEIGHTS=${LONGTUNE_BENCH_WEIGHTS:-/tmp/longtune-bench-weights}
export PYTHONUNBUFFERED=1
steps=${*:-build bench}
log="$OUT/gpu-moe.log"
t0=$(date +%s)
run() { # limit label command...
  local limit=$1 label=$2; shift 2
  echo "=== $label ($(date -u +%T), limit ${limit}s, $(( $(date +%s) - t0 ))s so far): $*"
  timeout -k 10 "$limit" "$@"
  local rc=$?
  echo "=== $label: exit $rc"
  return $rc
}
{
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for s in $steps; do
  case $s in
  build)
    run 420 "configure" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLT_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real ${CMAKE_FLAGS:-} >/dev/null &&
      run 420 "build" cmake --build "$BUILD" -j "$JOBS" --target longtune_cli || exit 1 ;;
  bench)
    # a build linked against NCCL finds the library PyTorch ships when the toolkit has none
    if ldd "$BIN" 2>/dev/null | grep -q "libnccl.* not found"; then
      d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
      [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    fi
    # ~5 min expected: peer ~90 s, checkpoint ~15 s, 2 x 4 lengths x 4 steps, the ceilings' steps at 256k
    run 560 "moe qwen3-30b-a3b-l4" "$BIN" bench moe --backend cuda --shape qwen3-30b-a3b-l4 \
      --seq 8192,16384,32768,65536 --max 262144 --repeats 3 --warmup 1 --out "$OUT" ${MOE_FLAGS:-} ;;
  *) echo "unknown step $s" ;;
  esac
done
echo "=== done in $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$log"
