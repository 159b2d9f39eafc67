#!/usr/bin/env bash
# Two builds of longtune on one CUDA device, alternated (A B A B ...) so that both see the same
# clocks and neighbours: for a kernel change, the build with it (A) against the build before (B).
# Each step runs PAIRS times in both builds, A then B; at the end a table gives, per measurement, each
# run's figure for A and for B and the ratio of their medians (A / B: below 1, A is faster).
#
# Steps (default: lora8b lora135m):
#   lora8b, lora135m   `bench lora --shape qwen3-8b|smollm2-135m --repeats 20`: what the LoRA products
#                      add to one layer's base GEMMs, forward and backward (layer-fwd, layer-bwd lora_ms)
#   train135m          `bench train --shape smollm2-135m --seq 8192,32768 --no-peer --repeats 5`
#   train8b            `bench train --shape qwen3-8b --seq 8192 --no-peer --repeats 3` (the 16 GB
#                      random checkpoint is written once to $LONGTUNE_BENCH_WEIGHTS and reused)
#   ncu-lora8b, ncu-lora135m  Nsight Compute on `bench lora --shape qwen3-8b|smollm2-135m --repeats 3`
#                      in each build (once, not per pair): the LoRA kernels' device time per kernel
#                      (scripts/ncu_kernels.py)
#
# usage: A=new/longtune B=old/longtune scripts/gpu-ab.sh [step ...]
#        PAIRS (default 2), OUT (default /tmp/gpu-ab): logs, JSON and the table (ab.txt) go there.
set -u
cd "$(dirname "$0")/.." || exit 1
: "${A:?A=path to the build with the change}" "${B:?B=path to the build before it}"
PAIRS=${PAIRS:-2}
OUT=${OUT:-/tmp/gpu-ab}
mkdir -p "$OUT"
export LONGTUNE_SOURCE_DIR=$PWD
export LONGTUNE_BENCH_WEIGHTS=${LONGTUNE_BENCH_WEIGHTS:-/tmp/longtune-bench-weights}
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(lora8b lora135m)
for s in "${steps[@]}"; do
  case $s in
  lora8b | lora135m | train135m | train8b | ncu-lora8b | ncu-lora135m) ;;
  *) echo "gpu-ab: unknown step '$s'" >&2; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
run() { # arm pair step limit command...
  local arm=$1 pair=$2 step=$3 limit=$4; shift 4
  local d="$OUT/$step/$arm-$pair"
  mkdir -p "$d"
  timeout -k 10 "$limit" "$@" --out "$d" >"$d/log" 2>&1
  echo "$step $arm pair $pair: exit $?"
}
for s in "${steps[@]}"; do
  if [ "${s#ncu-}" != "$s" ]; then
    shape=qwen3-8b
    [ "$s" = ncu-lora135m ] && shape=smollm2-135m
    for arm in A B; do
      mkdir -p "$OUT/$s"
      ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
        -k 'regex:small_n|tall|split|rank_upd' "${!arm}" bench lora --backend cuda --shape "$shape" --repeats 3 \
        --out "$OUT/$s/$arm" >"$OUT/$s/$arm.csv" 2>"$OUT/$s/$arm.log"
      echo "$s $arm: exit $?"
      python3 scripts/ncu_kernels.py "$OUT/$s/$arm.csv" --json "$OUT/$s/$arm.json" >"$OUT/$s/$arm.txt"
      rm -f "$OUT/$s/$arm.csv"
    done
    continue
  fi
  for r in $(seq 1 "$PAIRS"); do
    for arm in A B; do
      bin=${!arm}
      case $s in
      lora8b) run "$arm" "$r" "$s" 60 "$bin" bench lora --backend cuda --shape qwen3-8b --repeats 20 ;;
      lora135m) run "$arm" "$r" "$s" 60 "$bin" bench lora --backend cuda --shape smollm2-135m --repeats 20 ;;
      train135m)
        run "$arm" "$r" "$s" 120 "$bin" bench train --backend cuda --shape smollm2-135m --seq 8192,32768 --no-peer \
          --repeats 5 --warmup 2 ;;
      train8b)
        run "$arm" "$r" "$s" 150 "$bin" bench train --backend cuda --shape qwen3-8b --seq 8192 --no-peer --repeats 3 \
          --warmup 1 ;;
      esac
    done
  done
done
python3 - "$OUT" "${steps[@]}" <<'PY' | tee "$OUT/ab.txt"
import glob, json, os, statistics, sys
out, steps = sys.argv[1], sys.argv[2:]
print("device:", open(os.path.join(out, "gpu.txt")).read().strip())
def figures(d):
    """{measurement: ms} from the bench JSON a run wrote into d."""
    got = {}
    for f in glob.glob(os.path.join(d, "*.json")):
        j = json.load(open(f))
        for a in j.get("arms", []):
            if j.get("bench") == "lora" and a["name"].startswith("layer-"):
                got[a["name"] + " lora_ms"] = a["lora_ms"]
            elif a["name"].startswith("longtune-") and "median_ms" in a:
                got[f"T={a['T']} step ms"] = a["median_ms"]
    return got
for s in steps:
    if s.startswith("ncu-"):
        for arm in "AB":
            t = os.path.join(out, s, arm + ".txt")
            if os.path.exists(t):
                print(f"{s} {arm} (the first rows of {s}/{arm}.txt):")
                print("".join(open(t).readlines()[:8]), end="")
        continue
    runs = {arm: [figures(d) for d in sorted(glob.glob(os.path.join(out, s, arm + "-*")))] for arm in "AB"}
    names = sorted({n for arm in "AB" for fig in runs[arm] for n in fig})
    for n in names:
        va = [f[n] for f in runs["A"] if n in f]
        vb = [f[n] for f in runs["B"] if n in f]
        if not va or not vb:
            continue
        ratio = statistics.median(va) / statistics.median(vb)
        fa = " ".join(f"{v:.3f}" for v in va)
        fb = " ".join(f"{v:.3f}" for v in vb)
        print(f"{s:10s} {n:22s} A {fa:24s} B {fb:24s} A/B {ratio:.3f}")
PY
