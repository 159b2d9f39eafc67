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

python3 - "$src/tests/fixtures/moe/qwen3moe" "$tmp/moe" <<'PY' || say "widening the fixture's vocabulary"
import json, os, shutil, struct, sys
src, out = sys.argv[1], sys.argv[2]
V = 1200
os.makedirs(out)
c = json.load(open(os.path.join(src, "config.json")))
v0 = c["vocab_size"]
c["vocab_size"] = V
json.dump(c, open(os.path.join(out, "config.json"), "w"))
b = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])
hdr.pop("__metadata__", None)
off, h, blobs = 0, {}, []
for k, e in hdr.items():
    a, z = e["data_offsets"]
    data = b[8 + n + a:8 + n + z]
    if k in ("model.embed_tokens.weight", "lm_head.weight"):  # rows repeated up to V
        row = len(data) // v0
        data = b"".join(data[(i % v0) * row:(i % v0 + 1) * row] for i in range(V))
        e["shape"] = [V, e["shape"][1]]
    h[k] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [off, off + len(data)]}
    off += len(data)
    blobs.append(data)
hj = json.dumps(h).encode()
hj += b" " * (-len(hj) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
tok = os.path.join(src, "..", "..", "tokenizer", "bpe-nfc")
for fn in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tok, fn), os.path.join(out, fn))
PY
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
