#!/usr/bin/env bash
# `longtune bench scaling` on a tiny random model: world 1 in process and world 2 under mpirun both
# measured (tokens/s > 0, speedup against world 1), and `mpirun -np 2 longtune bench scaling`
# (started by the user) writes its own one-arm result. The several-GPU bench's rank logic (data
# parallel on 1 and 2 ranks, the longest context on 1 and 2 with context parallel, a context-parallel
# step) runs on the host under mpirun (--child --device cpu) and reports every arm. Flag errors
# exit 2; --backend cuda without a GPU says so. Skips (77) only when mpirun is missing; scripts/setup.sh installs it.
set -u
bin="$1"
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: mpirun not found (scripts/setup.sh installs openmpi-bin)"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader
export LSAN_OPTIONS="suppressions=$here/../lsan_mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export OMPI_MCA_mca_base_component_disable_dlclose=1
tiny=(--hidden 64 --layers 2 --vocab 512 --seq 64 --batch 4 --repeats 2 --warmup 1 --threads 2)
"$bin" bench scaling "${tiny[@]}" --worlds 1,2 --out "$dir" > "$dir/out" 2>&1 || { echo "FAIL: bench scaling: $(tail -5 "$dir/out")"; fail=1; }
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$bin" bench scaling "${tiny[@]}" --out "$dir" > "$dir/out2" 2>&1 \
  || { echo "FAIL: mpirun bench scaling: $(tail -5 "$dir/out2")"; fail=1; }
python3 - "$dir" <<'PY' || fail=1
import json, sys
d = sys.argv[1]
r = json.load(open(d + "/scaling-cpu.json"))
worlds = [a["world"] for a in r["arms"]]
assert worlds == [1, 2], worlds
for a in r["arms"]:
    assert a["tokens_per_s"] > 0 and a["median_ms"] > 0 and a["peak_bytes"] > 0, a
    assert "speedup_vs_world1" in a, a
assert "backend cuda" in r["gpu_points"], r["gpu_points"]
assert r["arms"][1]["threads_per_rank"] == 1, r["arms"][1]
m = json.load(open(d + "/scaling-cpu-world2.json"))
assert [a["world"] for a in m["arms"]] == [2] and m["arms"][0]["tokens_per_s"] > 0, m["arms"]
print("bench scaling: world 1 %.0f tok/s, world 2 %.0f tok/s (tiny model)" % tuple(a["tokens_per_s"] for a in r["arms"]))
PY
out=$("$bin" bench scaling --worlds 0 2>&1); rc=$?
[ $rc = 2 ] && grep -q "bad value '0' for --worlds" <<<"$out" || { echo "FAIL: --worlds 0 -> rc=$rc: $out"; fail=1; }
LONGTUNE_BENCH_WEIGHTS="$dir/w" OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
  "$bin" bench scaling --backend cuda --child --device cpu --shape tiny --seq 64 --step 64 --max 4096 --cp-seq 128 \
  --repeats 1 --warmup 0 > "$dir/gpu-logic" 2> "$dir/gpu-logic.err" \
  || { echo "FAIL: several-GPU logic on the host: $(tail -5 "$dir/gpu-logic.err")"; fail=1; }
# (stdout alone: mpirun may cut a long line of one rank's stdout with the other's stderr)
python3 - "$dir/gpu-logic" <<'PY' || fail=1
import json, sys
tag = "LT_SCALING_CUDA "
lines = [l[len(tag):] for l in open(sys.argv[1]) if l.startswith(tag)]
assert len(lines) == 1, "want one result line from rank 0, got %d" % len(lines)
arms = json.loads(lines[0])["arms"]
names = [a["name"] for a in arms]
assert names[:4] == ["data parallel, 1 GPU", "data parallel, 2 GPUs", "longest context, 1 GPU",
                     "longest context, 2 GPUs (Ulysses)"], names
assert all(a["tokens_per_s"] > 0 for a in arms[:2]), arms[:2]
assert arms[2]["ceiling_T"] >= 64 and arms[3]["ceiling_T"] >= arms[2]["ceiling_T"], arms[2:4]
assert any(a["name"].startswith("context 128, 2 GPUs") and a.get("tokens_per_s", 0) > 0 for a in arms), names
print("several-GPU logic on the host: %s" % ", ".join(names))
PY
out=$("$bin" bench scaling --backend cuda --gpus 9 2>&1); rc=$?
[ $rc = 2 ] && grep -q "bad value '9' for --gpus" <<<"$out" || { echo "FAIL: --gpus 9 -> rc=$rc: $out"; fail=1; }
exit $fail
