#!/usr/bin/env bash
# The way out of LoRA on the experts, through the CLI, on the Qwen3-MoE fixture (its vocabulary
# widened to the bpe-nfc tokenizer's 1200 ids): `longtune train --lora-targets
# q_proj,experts.gate_up_proj,experts.down_proj` saves a PEFT folder whose adapter_config.json lists
# target_parameters and whose expert tensors have PEFT's shapes, and a checkpoint it resumes from;
# `longtune eval` and `generate` run with the adapter; `longtune export` merges it (and the
# checkpoint) into an HF folder, a GGUF and a GGUF LoRA, and eval of the merged HF folder equals
# eval of base + adapter.
set -u
bin="$1"
src="${LONGTUNE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
command -v python3 >/dev/null || { echo "skipped: python3 not found (used to read JSON)"; exit 77; }
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 "$src/tests/cli/widen_moe_vocab.py" "$src/tests/fixtures/moe/qwen3moe" "$tmp/moe" || say "widening the fixture's vocabulary"
mkdir -p "$tmp/data"
for i in $(seq 1 8); do echo "{\"text\": \"record $i: the quick brown fox jumps\"}"; done >"$tmp/data/train.jsonl"
cp "$tmp/data/train.jsonl" "$tmp/data/valid.jsonl"
cp "$tmp/data/train.jsonl" "$tmp/data/test.jsonl"
dev=(--device cpu)
tr=("${dev[@]}" --data "$tmp/data" --batch-size 2 --max-seq-length 32 --threads 1 --steps-per-report 1 --steps-per-eval 100
  --learning-rate 3e-3 --lora-targets q_proj,experts.gate_up_proj,experts.down_proj --save-every 2)
"$bin" train --model "$tmp/moe" "${tr[@]}" --iters 4 --adapter-path "$tmp/ad" >"$tmp/t1.out" 2>&1 ||
  say "train with expert targets: $(tr '\r' '\n' <"$tmp/t1.out" | tail -3)"
cp "$tmp/ad/adapter_model.safetensors" "$tmp/first.safetensors"
# The finished run's checkpoint resumes (its expert tensors checked against the model's) and saves
# the same adapter again.
"$bin" train --model "$tmp/moe" "${tr[@]}" --iters 4 --adapter-path "$tmp/ad" --resume-adapter-file "$tmp/ad" \
  >"$tmp/t2.out" 2>&1 || say "resume with expert targets: $(tr '\r' '\n' <"$tmp/t2.out" | tail -3)"
grep -q "resumed from $tmp/ad/checkpoint.ltck at step 4" "$tmp/t2.out" || say "no resume: $(tail -3 "$tmp/t2.out")"
cmp -s "$tmp/first.safetensors" "$tmp/ad/adapter_model.safetensors" || say "the resumed run saved another adapter"
python3 - "$tmp/ad" <<'PY' || say "the adapter folder is not PEFT's expert layout"
import json, struct, sys, os
d = sys.argv[1]
c = json.load(open(os.path.join(d, "adapter_config.json")))
assert c["target_parameters"] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], c
assert c["target_modules"] == ["q_proj"] and c["lora_dropout"] == 0, c
b = open(os.path.join(d, "adapter_model.safetensors"), "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
r, E, C, F = c["r"], 8, 32, 16
want = {"base_layer.lora_A": [r * E, C], "base_layer.lora_B": [2 * F, r * E], "lora_A": [r * E, F], "lora_B": [C, r * E]}
for l in (0, 1):
    for k, s in want.items():
        key = f"base_model.model.model.layers.{l}.mlp.experts.{k}.weight"
        assert h[key]["shape"] == s, (key, h[key]["shape"], s)
PY
ev=("${dev[@]}" --data "$tmp/data" --max-seq-length 32 --batch-size 2 --threads 1 --json)
"$bin" eval --model "$tmp/moe" --adapter "$tmp/ad" "${ev[@]}" >"$tmp/eval_ad.json" 2>"$tmp/err" ||
  say "eval with the expert adapter: $(cat "$tmp/err")"
"$bin" generate --model "$tmp/moe" --adapter "$tmp/ad" --prompt "the quick" --max-tokens 4 --threads 1 \
  >"$tmp/gen.out" 2>"$tmp/err" || say "generate with the expert adapter: $(cat "$tmp/err")"
"$bin" export --model "$tmp/moe" --adapter "$tmp/ad" --out "$tmp/merged" --format hf --outtype f32 >/dev/null \
  2>"$tmp/err" || say "export hf: $(cat "$tmp/err")"
"$bin" eval --model "$tmp/merged" "${ev[@]}" >"$tmp/eval_m.json" 2>"$tmp/err" || say "eval merged: $(cat "$tmp/err")"
tol=1e-4
python3 - "$tmp/eval_ad.json" "$tmp/eval_m.json" "$tol" <<'PY' || say "merged eval differs: $(cat "$tmp/eval_ad.json" "$tmp/eval_m.json")"
import json, sys
a, m = (json.load(open(p)) for p in sys.argv[1:3])
assert a["n_tokens"] == m["n_tokens"] and abs(a["mean_loss"] - m["mean_loss"]) < float(sys.argv[3]), (a, m)
PY
for f in gguf gguf-lora; do
  "$bin" export --model "$tmp/moe" --adapter "$tmp/ad" --out "$tmp/out.$f.gguf" --format $f >/dev/null 2>"$tmp/err" ||
    say "export $f: $(cat "$tmp/err")"
done
"$bin" export --model "$tmp/moe" --adapter "$tmp/ad/checkpoint.ltck" --out "$tmp/merged_ck" --format hf --outtype f32 \
  >/dev/null 2>"$tmp/err" || say "export hf from the checkpoint: $(cat "$tmp/err")"
cmp -s "$tmp/merged/model.safetensors" "$tmp/merged_ck/model.safetensors" ||
  say "the checkpoint merges to other weights than the adapter folder"
exit $fail
