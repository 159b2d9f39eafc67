#!/usr/bin/env bash
# `longtune train --context-parallel` on the Qwen3-MoE fixture (its vocabulary widened to the
# bpe-nfc tokenizer's 1200 ids) over 2 and 4 ranks against one process on the same unpacked rows:
# the router's load-balancing loss is the whole row's, so train and validation losses, aux_loss in
# metrics.jsonl and the adapter agree within fp32 tolerance. The rows' lengths vary, so the ranks'
# rows carry a padding tail (up to a multiple of 2 x ranks) that the router's statistics leave out,
# as one process's unpadded rows have none. Skips (77) only when mpirun or python3 is missing.
set -u
bin="$1"
src="${LONGTUNE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
here="$src/tests/cli"
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: mpirun not found (scripts/setup.sh installs openmpi-bin)"; exit 77; }
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$src/tests/cli/widen_moe_vocab.py" "$src/tests/fixtures/moe/qwen3moe" "$tmp/moe" || { echo "FAIL: widening the fixture's vocabulary"; exit 1; }
mkdir -p "$tmp/data"
for i in $(seq 1 12); do
  w=$(printf 'lazy%.0s ' $(seq 1 $((i % 5 + 1))))
  echo "{\"text\": \"record $i: the quick brown fox jumps over the $w dog\"}"
done >"$tmp/data/train.jsonl"
head -4 "$tmp/data/train.jsonl" >"$tmp/data/valid.jsonl"
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
export LSAN_OPTIONS="suppressions=$here/../lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export OMPI_MCA_mca_base_component_disable_dlclose=1
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
cp=(--model "$tmp/moe" --data "$tmp/data" --batch-size 1 --no-pack --grad-accum 2 --max-seq-length 48 --iters 3
  --learning-rate 2e-3 --threads 1 --steps-per-report 1 --steps-per-eval 3 --val-batches -1 --save-every 3 --seed 3)
"$bin" train "${cp[@]}" --adapter-path "$tmp/cp1" >"$tmp/cp1.out" 2>&1 ||
  { echo "FAIL: single-process run: $(tail -5 "$tmp/cp1.out")"; exit 1; }
for np in 2 4; do
  if ! "${mpi[@]}" -np $np "$bin" train "${cp[@]}" --context-parallel --adapter-path "$tmp/cp$np" >"$tmp/cp$np.out" 2>&1; then
    say "mpirun -np $np --context-parallel: $(tail -8 "$tmp/cp$np.out")"; continue
  fi
  grep -q "context parallel: rank 0 of $np" "$tmp/cp$np.out" || say "cp $np: no context-parallel line"
  python3 "$here/compare_runs.py" "$tmp/cp1" "$tmp/cp$np" || fail=1
  python3 - "$tmp/cp1/metrics.jsonl" "$tmp/cp$np/metrics.jsonl" <<'PY' || say "cp $np: aux_loss differs"
import json, sys
a, b = ({r["step"]: r for r in map(json.loads, open(p))} for p in sys.argv[1:])
n = 0
for s in a:
    x, y = a[s].get("aux_loss"), b[s].get("aux_loss")
    if x is None and y is None: continue
    assert x is not None and y is not None and abs(x - y) <= 1e-6 + 2e-5 * abs(x), (s, x, y)
    n += 1
assert n >= 3, "only %d steps report aux_loss" % n
PY
done
exit $fail
