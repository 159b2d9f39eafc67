#!/usr/bin/env bash
# CPU training step time of two GGUF files of one model (e.g. Q4_K_M against Q4_1), A/B
# interleaved so that both arms see the same machine load: ROUNDS times each `longtune train` run of
# ITERS steps (batch 1, packed rows of T tokens), the first two steps of a run dropped as warm-up.
# Prints each arm's median step time (metrics.jsonl's elapsed_s between steps) and the ratio B / A.
#
# usage: scripts/quant_step_ab.sh A.gguf B.gguf [ROUNDS=3] [ITERS=8] [T=512]
#        (LONGTUNE=build/longtune, DATA=~/.cache/longtune/data/python-faq, THREADS=all)
set -euo pipefail
A=$1 B=$2 ROUNDS=${3:-3} ITERS=${4:-8} T=${5:-512}
LT=${LONGTUNE:-build/longtune}
DATA=${DATA:-$HOME/.cache/longtune/data/python-faq}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
threads=()
[[ -n ${THREADS:-} ]] && threads=(--threads "$THREADS")
for r in $(seq 1 "$ROUNDS"); do
  for arm in A B; do
    model=${!arm}
    out=$work/$arm-$r
    "$LT" train --model "$model" --data "$DATA" --adapter-path "$out" --iters "$ITERS" --batch-size 1 \
      --max-seq-length "$T" --learning-rate 1e-4 --steps-per-report 1 --steps-per-eval 1000000 \
      --val-batches 1 --save-every 1000000 "${threads[@]}" >"$out.log" 2>&1 ||
      { cat "$out.log"; exit 1; }
  done
done
python3 - "$work" "$A" "$B" "$T" <<'PY'
import glob, json, os, statistics, sys
work, a, b, T = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
med = {}
for arm, path in (("A", a), ("B", b)):
    ms = []
    for f in sorted(glob.glob(os.path.join(work, arm + "-*", "metrics.jsonl"))):
        recs = [json.loads(l) for l in open(f)]
        recs = [r for r in recs if r["step"] >= 2 and "elapsed_s" in r]  # step 1 (and 0) warm up
        ms += [1e3 * (q["elapsed_s"] - p["elapsed_s"]) / (q["step"] - p["step"]) for p, q in zip(recs, recs[1:])]
    med[arm] = statistics.median(ms)
    print(f"{arm}: {os.path.basename(path):40s} median step {med[arm]:8.1f} ms over {len(ms)} steps")
print(f"ratio B/A {med['B'] / med['A']:.3f}")
PY
