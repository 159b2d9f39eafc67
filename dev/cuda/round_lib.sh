# Sourced by the round scripts dev/cuda/r*_run.sh (dev/cuda/round.sh copies it next to run.sh):
# unpacks the binaries, sets the library path and provenance, and defines the step helpers
# t (banner), tst (GPU attention test under env overrides) and cli (attention bench, no peers).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/attn3 && tar xJf bin.tar.xz -C /tmp/attn3
B=/tmp/attn3/bin
export LD_LIBRARY_PATH=/tmp/ltlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ldd $B/longtune | grep -q "libnccl.*not found"; then
  d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH
fi
export LONGTUNE_COMMIT=$(cat COMMIT) LONGTUNE_SOURCE_DIR=$PWD
t() { echo "=== $* $(date -u +%T)"; }
tst() { # name, env...
  local n=$1; shift
  t "test_cuda_attention $n"
  env "$@" timeout 12 $B/test_cuda_attention > "$OUT/test_attn_$n.log" 2>&1; echo "rc=$?"
  grep -E "seed|FAILED|PASSED|ERROR" "$OUT/test_attn_$n.log" | head -6
}
cli() { # name, T list, env...
  local n=$1 T=$2; shift 2
  t "cli $n T=$T"
  mkdir -p "$OUT/cli_$n"
  env "$@" timeout 12 $B/longtune bench attention --backend cuda --no-peers --T $T --repeats 20 \
    --out "$OUT/cli_$n" 2>&1 | grep -v "^wrote"
}
