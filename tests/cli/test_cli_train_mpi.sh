#!/usr/bin/env bash
# Data-parallel `longtune train` under mpirun: 2 and 3 ranks (3 splits a batch of 4 rows unevenly)
# train the same global batches as one process and must give the same loss trajectory (train and
# validation losses per step) and the same adapter within fp32 tolerance, with LoRA dropout on
# (ranks draw the masks of their rows' places in the whole batch). Only rank 0 writes. Then context
# parallel (--context-parallel) over 2 and 3 ranks against one process on the same unpacked rows:
# ring attention on a model whose one key/value head cannot be split, Ulysses (all-to-all over
# heads) on one with six. Skips (77) only when mpirun is missing; scripts/setup.sh installs it, so CI runs this.
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
export LSAN_OPTIONS="suppressions=$here/../lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export OMPI_MCA_mca_base_component_disable_dlclose=1
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

"$bin" train "${common[@]}" --adapter-path "$dir/one" > "$dir/one.out" 2>&1 \
  || { echo "FAIL: single-process run: $(tail -5 "$dir/one.out")"; exit 1; }
for np in 2 3; do
  # World 2 with buckets of 100 elements: most start while earlier layers are still in backward.
  bucket=$([ $np = 2 ] && echo 100 || echo 0)
  if ! LONGTUNE_DP_BUCKET=$bucket "${mpi[@]}" -np $np "$bin" train "${common[@]}" --adapter-path "$dir/dp$np" \
       > "$dir/dp$np.out" 2>&1; then
    echo "FAIL: mpirun -np $np: $(tail -8 "$dir/dp$np.out")"; fail=1; continue
  fi
  grep -q "data parallel: rank 0 of $np" "$dir/dp$np.out" || { echo "FAIL: np $np: no data-parallel line"; fail=1; }
  # One voice: rank 1's info lines and summary are not printed.
  if grep -q "data parallel: rank 1" "$dir/dp$np.out"; then echo "FAIL: np $np: rank 1 logged info lines"; fail=1; fi
  if [ $np = 2 ]; then
    n=$(grep -o "started during the backward: [0-9]*" "$dir/dp$np.out" | grep -o "[0-9]*$")
    [ "${n:-0}" -gt 6 ] || { echo "FAIL: np 2: ${n:-no} gradient buckets started during the backward"; fail=1; }
  fi
  n=$(grep -c "^trained 6 steps" "$dir/dp$np.out")
  [ "$n" = 1 ] || { echo "FAIL: np $np: $n summaries (want 1 from rank 0)"; fail=1; }
  python3 "$here/compare_runs.py" "$dir/one" "$dir/dp$np" || fail=1
done

# Many small buckets (not aligned to layers) started during the backward, and a rank without rows
# (2 rows over 3 ranks: rank 0 trains none and marks no gradients) issuing the same collectives.
"$bin" train "${common[@]}" --batch-size 2 --adapter-path "$dir/one_b2" > "$dir/one_b2.out" 2>&1 \
  || { echo "FAIL: single-process run, batch 2: $(tail -5 "$dir/one_b2.out")"; exit 1; }
if LONGTUNE_DP_BUCKET=100 "${mpi[@]}" -np 3 "$bin" train "${common[@]}" --batch-size 2 --adapter-path "$dir/dp3b2" \
     > "$dir/dp3b2.out" 2>&1; then
  grep -q "rank 0 of 3 trains rows \[0, 0)" "$dir/dp3b2.out" || { echo "FAIL: rank 0 should have no rows"; fail=1; }
  python3 "$here/compare_runs.py" "$dir/one_b2" "$dir/dp3b2" || fail=1
else
  echo "FAIL: mpirun -np 3, batch 2, small buckets: $(tail -8 "$dir/dp3b2.out")"; fail=1
fi

# Context parallel: one long row per step split over the ranks (ring attention) against one
# process on the same rows (no dropout: masks follow each rank's local token index).
cp=(--model "$dir/model" --data "$dir/data" --batch-size 1 --no-pack --grad-accum 2 --max-seq-length 48 --iters 4
    --learning-rate 2e-3 --threads 1 --steps-per-report 1 --steps-per-eval 2 --val-batches -1 --save-every 4 --seed 3)
"$bin" train "${cp[@]}" --adapter-path "$dir/cp1" > "$dir/cp1.out" 2>&1 \
  || { echo "FAIL: single-process run (no packing): $(tail -5 "$dir/cp1.out")"; exit 1; }
for np in 2 3; do
  if ! "${mpi[@]}" -np $np "$bin" train "${cp[@]}" --context-parallel --adapter-path "$dir/cp$np" > "$dir/cp$np.out" 2>&1; then
    echo "FAIL: mpirun -np $np --context-parallel: $(tail -8 "$dir/cp$np.out")"; fail=1; continue
  fi
  grep -q "context parallel: rank 0 of $np holds $((48 / np)) of every row's 48 tokens" "$dir/cp$np.out" \
    || { echo "FAIL: cp $np: no context-parallel line: $(head -5 "$dir/cp$np.out")"; fail=1; }
  python3 "$here/compare_runs.py" "$dir/cp1" "$dir/cp$np" || fail=1
done
# Ulysses: six key/value heads split over 2 and 3 ranks (each rank attends over the whole row for
# its heads); the ranks' info line names it.
python3 "$here/tiny_model.py" "$dir/model6" --hidden 48 --heads 6 --kv-heads 6 >/dev/null || { echo "FAIL: tiny model 6"; exit 1; }
uly=("${cp[@]}")
uly[1]="$dir/model6"
"$bin" train "${uly[@]}" --adapter-path "$dir/uly1" > "$dir/uly1.out" 2>&1 \
  || { echo "FAIL: single-process run (6 heads): $(tail -5 "$dir/uly1.out")"; exit 1; }
for np in 2 3; do
  if ! "${mpi[@]}" -np $np "$bin" train "${uly[@]}" --context-parallel --adapter-path "$dir/uly$np" > "$dir/uly$np.out" 2>&1; then
    echo "FAIL: mpirun -np $np --context-parallel (Ulysses): $(tail -8 "$dir/uly$np.out")"; fail=1; continue
  fi
  grep -q "context parallel: rank 0 of $np .*Ulysses" "$dir/uly$np.out" \
    || { echo "FAIL: uly $np: not Ulysses: $(grep 'context parallel' "$dir/uly$np.out")"; fail=1; }
  python3 "$here/compare_runs.py" "$dir/uly1" "$dir/uly$np" || fail=1
done
grep -q "context parallel: rank 0 of 2 .*ring attention" "$dir/cp2.out" || { echo "FAIL: cp 2: not ring"; fail=1; }
# --distributed: a bad value is a usage error; nccl needs a CUDA device (a CPU model's gradients
# are never reduced over it).
out=$("$bin" train "${cp[@]}" --distributed all --adapter-path "$dir/bad" 2>&1); rc=$?
[ $rc = 2 ] && grep -q "auto|off|nccl" <<<"$out" || { echo "FAIL: --distributed all -> rc=$rc: $out"; fail=1; }
out=$("$bin" train "${cp[@]}" --distributed nccl --adapter-path "$dir/bad" 2>&1); rc=$?
[ $rc = 1 ] && grep -qiE "nccl|cuda" <<<"$out" || { echo "FAIL: --distributed nccl on a CPU model -> rc=$rc: $out"; fail=1; }
# Bad combinations are refused by every rank with the reason.
out=$("${mpi[@]}" -np 2 "$bin" train "${cp[@]}" --context-parallel --max-seq-length 50 --adapter-path "$dir/bad" 2>&1) \
  && { echo "FAIL: --max-seq-length 50 over 2 ranks accepted"; fail=1; }
grep -q "multiple of 4" <<<"$out" || { echo "FAIL: no reason for the refused context-parallel run: $out"; fail=1; }
exit $fail
