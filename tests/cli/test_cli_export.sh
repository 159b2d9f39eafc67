#!/usr/bin/env bash
# `longtune export`: usage errors (exit 2) name the option; a fixture model with the PEFT fixture
# adapter exports to each format (exit 0) with a JSON report; an existing output without
# --overwrite, an adapter of another shape and a missing model are failures (exit 1) that say so.
set -u
bin="$1"
src="$(cd "$(dirname "$0")/../.." && pwd)"
model="$src/tests/fixtures/model/llama_tied"
adapter="$src/tests/fixtures/peft/peft_written"
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect() { # expect STATUS PATTERN -- args...
  local want=$1 pat=$2; shift 3
  out=$("$bin" "$@" 2>&1); rc=$?
  if [ "$rc" != "$want" ] || ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL: longtune $* -> rc=$rc (want $want, /$pat/), output: $out"; fail=1
  fi
}
expect 0 "gguf-lora" -- export --help
expect 2 "'model' is required" -- export --out x --format hf
expect 2 "'out' is required" -- export --model m --format hf
expect 2 "'format' is required" -- export --model m --out x
expect 2 "hf|gguf|gguf-lora" -- export --model m --out x --format onnx
expect 2 "outtype" -- export --model m --out x --format gguf --outtype q9_9
expect 2 "needs --adapter" -- export --model m --out x --format gguf-lora
expect 2 "max-shard-size" -- export --model m --out x --format hf --max-shard-size 12x
expect 2 "unknown option" -- export --model m --out x --format hf --merge
expect 1 "no such file" -- export --model "$tmp/none" --out "$tmp/o" --format hf
expect 1 "f32, f16 or bf16" -- export --model "$model" --out "$tmp/o" --format hf --outtype q8_0
expect 0 "wrote" -- export --model "$model" --adapter "$adapter" --out "$tmp/hf" --format hf --outtype f32
for f in config.json model.safetensors generation_config.json; do
  [ -s "$tmp/hf/$f" ] || { echo "FAIL: $tmp/hf/$f missing"; fail=1; }
done
expect 1 "overwrite" -- export --model "$model" --adapter "$adapter" --out "$tmp/hf" --format hf
expect 0 "wrote" -- export --model "$model" --adapter "$adapter" --out "$tmp/hf" --format hf --overwrite \
  --max-shard-size 40000
[ -s "$tmp/hf/model.safetensors.index.json" ] && [ ! -e "$tmp/hf/model.safetensors" ] ||
  { echo "FAIL: sharded re-export left model.safetensors or lacks the index"; fail=1; }
expect 0 '"requantization_error"' -- export --model "$model" --adapter "$adapter" --out "$tmp/m.gguf" \
  --format gguf --outtype q8_0 --json
expect 0 '"attn_q": {"dtype": "q8_0"' -- export --model "$model" --adapter "$adapter" --out "$tmp/m.gguf" \
  --format gguf --outtype q8_0 --json --overwrite
expect 0 "wrote" -- export --model "$model" --adapter "$adapter" --out "$tmp/l.gguf" --format gguf-lora
# A quantized base: merged matrices are requantized into their own type, or written as f16 with
# --dequantize; an HF folder from it is f16 by default.
expect 0 "wrote" -- export --model "$model" --out "$tmp/q8base.gguf" --format gguf --outtype q8_0
expect 0 '"attn_q": {"dtype": "q8_0"' -- export --model "$tmp/q8base.gguf" --adapter "$adapter" \
  --out "$tmp/req.gguf" --format gguf --json
expect 0 '"attn_q": {"dtype": "f16"' -- export --model "$tmp/q8base.gguf" --adapter "$adapter" \
  --out "$tmp/dq.gguf" --format gguf --dequantize --json
expect 2 "" -- export --model "$tmp/q8base.gguf" --out "$tmp/x.gguf" --format gguf --outtype q9
expect 1 "dequantize writes" -- export --model "$tmp/q8base.gguf" --adapter "$adapter" --out "$tmp/dq2.gguf" \
  --format gguf --dequantize --outtype q4_0
expect 0 '"attn_q": {"dtype": "f16"' -- export --model "$tmp/q8base.gguf" --adapter "$adapter" \
  --out "$tmp/fromq8" --format hf --json
grep -q '"torch_dtype":.*"float16"' "$tmp/fromq8/config.json" || { echo "FAIL: fromq8 config not float16"; fail=1; }
expect 0 '"merged": 0' -- export --model "$model" --adapter "$adapter" --out "$tmp/lora2.gguf" --format gguf-lora --json
# An adapter trained on a model of other shapes is refused, naming the tensor and both shapes.
expect 1 "does not match this base" -- export --model "$src/tests/fixtures/model/qwen3_tied" \
  --adapter "$adapter" --out "$tmp/q.gguf" --format gguf
[ ! -e "$tmp/q.gguf" ] || { echo "FAIL: a refused export left $tmp/q.gguf"; fail=1; }
# --rope-scaling: the scaling a run trained with goes into config.json and the GGUF keys
expect 0 "wrote" -- export --model "$model" --out "$tmp/yarn" --format hf --rope-scaling yarn --rope-factor 4 \
  --yarn-beta-fast 16
python3 - "$tmp/yarn/config.json" <<'PY' || { echo "FAIL: yarn config.json"; fail=1; }
import json, sys
c = json.load(open(sys.argv[1]))
r = c["rope_scaling"]
ok = r["rope_type"] == "yarn" and r["factor"] == 4 and r["beta_fast"] == 16 and \
    c["max_position_embeddings"] == 4 * r["original_max_position_embeddings"]
sys.exit(0 if ok else 1)
PY
expect 0 "wrote" -- export --model "$model" --out "$tmp/yarn.gguf" --format gguf --rope-scaling yarn --rope-factor 4
expect 1 "no dynamic RoPE scaling" -- export --model "$model" --out "$tmp/dyn.gguf" --format gguf \
  --rope-scaling dynamic --rope-factor 2
expect 2 "need --rope-scaling" -- export --model "$model" --out "$tmp/r" --format hf --rope-factor 2
expect 2 "needs --rope-factor" -- export --model "$model" --out "$tmp/r" --format hf --rope-scaling linear
expect 2 "not 'ntk'" -- export --model "$model" --out "$tmp/r" --format hf --rope-scaling ntk --rope-factor 2
expect 2 "is not a number" -- export --model "$model" --out "$tmp/r" --format hf --rope-scaling linear --rope-factor 0
ls "$tmp" | grep -q '\.tmp\.' && { echo "FAIL: temporaries left in $tmp"; fail=1; }
exit $fail
