#!/usr/bin/env bash
# Data-parallel `longtune train` under mpirun: 2 and 3 ranks (3 splits a batch of 4 rows unevenly)
# train the same global batches as one process and must give the same loss trajectory (train and
# validation losses per step) and the same adapter within fp32 tolerance, with LoRA dropout on
# (ranks draw the masks of their rows' places in the whole batch). Only rank 0 writes. Skips (77)
# only when mpirun is missing; scripts/setup.sh installs it, so CI runs this.
set -u
bin="$1"
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: mpirun not found (scripts/setup.sh installs openmpi-bin)"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
python3 "$here/tiny_model.py" "$dir/model" || { echo "FAIL: tiny model"; exit 1; }
mkdir -p "$dir/data"
for i in $(seq 1 48); do
  w=$(printf 'lazy%.0s ' $(seq 1 $((i % 7 + 1))))
  echo "{\"text\": \"record $i: the quick brown fox jumps over the $w dog\"}"
done > "$dir/data/train.jsonl"
head -6 "$dir/data/train.jsonl" > "$dir/data/valid.jsonl"
common=(--model "$dir/model" --data "$dir/data" --batch-size 4 --grad-accum 2 --max-seq-length 40 --iters 6
        --learning-rate 2e-3 --lora-dropout 0.1 --grad-clip 1.0 --threads 1 --steps-per-report 1
        --steps-per-eval 3 --val-batches -1 --save-every 3 --seed 7)
# Open MPI in containers: no CMA single-copy (ptrace is often denied), shared memory + self only.
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
# Under ASan, libmpi's own allocations outlive MPI_Finalize: suppressed by name, ours still count.
export LSAN_OPTIONS="suppressions=$here/../lsan_mpi.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

"$bin" train "${common[@]}" --adapter-path "$dir/one" > "$dir/one.out" 2>&1 \
  || { echo "FAIL: single-process run: $(tail -5 "$dir/one.out")"; exit 1; }
for np in 2 3; do
  if ! "${mpi[@]}" -np $np "$bin" train "${common[@]}" --adapter-path "$dir/dp$np" > "$dir/dp$np.out" 2>&1; then
    echo "FAIL: mpirun -np $np: $(tail -8 "$dir/dp$np.out")"; fail=1; continue
  fi
  grep -q "data parallel: rank 0 of $np" "$dir/dp$np.out" || { echo "FAIL: np $np: no data-parallel line"; fail=1; }
  # One voice: rank 1's info lines and summary are not printed.
  if grep -q "data parallel: rank 1" "$dir/dp$np.out"; then echo "FAIL: np $np: rank 1 logged info lines"; fail=1; fi
  n=$(grep -c "^trained 6 steps" "$dir/dp$np.out")
  [ "$n" = 1 ] || { echo "FAIL: np $np: $n summaries (want 1 from rank 0)"; fail=1; }
  python3 - "$dir/one" "$dir/dp$np" <<'PY' || fail=1
import json, struct, sys
TOL_REL = 2e-5   # fp32: reductions in another order, through 6 AdamW steps
TOL_ABS = 1e-6
def metrics(d):
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    steps = [r["step"] for r in recs]
    assert len(steps) == len(set(steps)), "%s: duplicated metrics steps %s (more than one writer?)" % (d, steps)
    return {r["step"]: r for r in recs}
def tensors(d):
    b = open(d + "/adapter_model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
a, b = metrics(sys.argv[1]), metrics(sys.argv[2])
bad = []
assert sorted(a) == sorted(b), "steps differ: %s vs %s" % (sorted(a), sorted(b))
for s in sorted(a):
    for key in ("train_loss", "val_loss", "tokens"):
        x, y = a[s].get(key), b[s].get(key)
        if (x is None) != (y is None): bad.append((s, key, x, y)); continue
        if x is not None and abs(x - y) > TOL_ABS + TOL_REL * abs(x): bad.append((s, key, x, y))
ta, tb = tensors(sys.argv[1]), tensors(sys.argv[2])
assert sorted(ta) == sorted(tb), "adapter tensor names differ"
worst = 0.0
for k in ta:
    for x, y in zip(ta[k], tb[k]):
        worst = max(worst, abs(x - y) / (TOL_ABS + TOL_REL * abs(x)))
if worst > 1: bad.append(("adapter", "max error / tolerance", worst, None))
if bad:
    print("FAIL: %s vs %s:" % (sys.argv[1], sys.argv[2]), bad)
    sys.exit(1)
print("%s: %d steps match the single process (adapter max error %.3g of tolerance)" % (sys.argv[2], len(a), worst))
PY
done
exit $fail
