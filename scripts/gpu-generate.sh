#!/usr/bin/env bash
# Generation speed on one CUDA device against transformers' `generate` on the same weights: the GGUF
# is exported by longtune to an HF folder (bf16), then longtune (`generate --device cuda`, KV cache,
# flash prefill, split-key decode attention) and transformers (bench/peers/generate_hf.py, KV cache,
# SDPA, bf16) each decode the same chat prompt greedily, medians of REPEATS; longtune's new-token
# count (it stops at EOS) is the peer's fixed count. Writes generate-cuda.json (both arms and the
# ratio) under $OUT. Builds and installs nothing.
#
# usage: MODEL=path.gguf [BIN=build/longtune] [OUT=dir] [REPEATS=3] scripts/gpu-generate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:?MODEL=path.gguf}
BIN=${BIN:-build/longtune}
OUT=${OUT:-bench/results}
REPEATS=${REPEATS:-3}
PROMPT=${PROMPT:-"Write a detailed explanation of how Python manages memory, with examples."}
mkdir -p "$OUT"
hf="$OUT/generate-hf-export"
rm -rf "$hf"
"$BIN" export --model "$MODEL" --format hf --outtype bf16 --out "$hf" > "$OUT/generate-export.log" 2>&1
runs=()
for r in $(seq 1 "$REPEATS"); do
  "$BIN" generate --device cuda --model "$hf" --prompt "$PROMPT" --max-tokens 256 > "$OUT/generate-longtune.txt" 2> "$OUT/generate-longtune.log"
  runs+=("$(grep -o 'longtune generate: .*' "$OUT/generate-longtune.log" | tail -1)")
done
printf '%s\n' "${runs[@]}" > "$OUT/generate-longtune-lines.txt"
n=$(python3 -c 'import re,sys; print(re.search(r", (\d+) new tokens", open(sys.argv[1]).read().splitlines()[-1]).group(1))' "$OUT/generate-longtune-lines.txt")
python3 bench/peers/generate_hf.py "$hf" --prompt "$PROMPT" --new-tokens "$n" --repeats "$REPEATS" > "$OUT/generate-peer.json"
python3 - "$OUT" "$MODEL" "$PROMPT" <<'PY'
import json, os, re, statistics, subprocess, sys
out, model, prompt = sys.argv[1:4]
lines = open(os.path.join(out, "generate-longtune-lines.txt")).read().splitlines()
pat = re.compile(r"(\d+) prompt tokens in [\d.]+ s \(([\d.]+) tok/s\), (\d+) new tokens in [\d.]+ s \(([\d.]+) tok/s\)")
runs = [pat.search(l) for l in lines]
runs = [m for m in runs if m]
ours = {"prompt_tokens": int(runs[0].group(1)), "new_tokens": int(runs[0].group(3)),
        "prefill_tokens_per_s": statistics.median(float(m.group(2)) for m in runs),
        "decode_tokens_per_s": statistics.median(float(m.group(4)) for m in runs),
        "runs": lines}
peer = json.load(open(os.path.join(out, "generate-peer.json")))
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
commit = os.environ.get("LONGTUNE_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
r = {"bench": "generate-cuda", "commit": commit, "machine": gpu, "model": model + " exported to HF bf16 by longtune",
     "prompt": prompt, "longtune": ours, "peer": peer,
     "decode_ratio": ours["decode_tokens_per_s"] / peer["decode_tokens_per_s"],
     "prefill_ratio": ours["prefill_tokens_per_s"] / peer["prefill_tokens_per_s"]}
json.dump(r, open(os.path.join(out, "generate-cuda.json"), "w"), indent=1)
print(json.dumps({k: r[k] for k in ("decode_ratio", "prefill_ratio")}), ours["decode_tokens_per_s"], peer["decode_tokens_per_s"])
PY
