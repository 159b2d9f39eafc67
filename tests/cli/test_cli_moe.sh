#!/usr/bin/env bash
# `longtune plan` on the tiny Mixtral and Qwen3-MoE fixtures: --moe-chunk-tokens N (flag and
# options-file key) shrinks the planned workspace, a bad value exits 2, the default targets are the
# attention's, LoRA on an MoE layer's experts is refused naming the layer. `longtune train` on the
# Qwen3-MoE fixture (its vocabulary widened to the bpe-nfc tokenizer's 1200 ids) reports the
# router's load-balancing loss as aux_loss beside train_loss in metrics.jsonl and on the loss line;
# a dense model's records have none. The expert targets (experts.gate_up_proj, experts.down_proj)
# plan, refuse dropout, train with a falling loss and save.
set -u
bin="$1"
src="${LONGTUNE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
command -v python3 >/dev/null || { echo "skipped: python3 not found (used to read JSON)"; exit 77; }
fail=0
say() { echo "FAIL: $*"; fail=1; }
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["classes"][sys.argv[2]])' "$1" "$2"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for m in mixtral qwen3moe qwen3moe.gguf; do
  path="$src/tests/fixtures/moe/${m%.gguf}"
  [ "$m" = qwen3moe.gguf ] && path="$path/model.gguf"
  base=(plan --model "$path" --batch-size 2 --max-seq-length 64 --lora-targets q,k,v,o --budget 1G --json)
  "$bin" "${base[@]}" >"$tmp/full.json" 2>"$tmp/err" || say "$m: plan: $(cat "$tmp/err")"
  "$bin" "${base[@]}" --moe-chunk-tokens 4 >"$tmp/small.json" 2>"$tmp/err" || say "$m: plan --moe-chunk-tokens 4: $(cat "$tmp/err")"
  full=$(field "$tmp/full.json" workspace) small=$(field "$tmp/small.json" workspace)
  [ "$small" -lt "$full" ] || say "$m: workspace $small with 4-token chunks, $full unchunked"
  printf '{"moe_chunk_tokens": 4}\n' >"$tmp/opts.json"
  "$bin" "${base[@]}" --config "$tmp/opts.json" >"$tmp/file.json" 2>"$tmp/err" || say "$m: --config: $(cat "$tmp/err")"
  [ "$(field "$tmp/file.json" workspace)" = "$small" ] || say "$m: the options file's moe_chunk_tokens differs from the flag"
  "$bin" "${base[@]}" --moe-chunk-tokens 0 >/dev/null 2>"$tmp/err"
  rc=$?
  [ $rc -eq 2 ] && grep -q "moe.chunk.tokens" "$tmp/err" || say "$m: --moe-chunk-tokens 0: rc=$rc $(cat "$tmp/err")"
done

# without --lora-targets an MoE model takes LoRA on its attention: the same plan as q,k,v,o
"$bin" plan --model "$src/tests/fixtures/moe/mixtral" --batch-size 2 --max-seq-length 64 --budget 1G --json \
  >"$tmp/dflt.json" 2>"$tmp/err" || say "default targets: $(cat "$tmp/err")"
"$bin" plan --model "$src/tests/fixtures/moe/mixtral" --batch-size 2 --max-seq-length 64 --budget 1G --json \
  --lora-targets q,k,v,o >"$tmp/attn.json" 2>"$tmp/err" || say "q,k,v,o: $(cat "$tmp/err")"
[ "$(field "$tmp/dflt.json" lora_params)" = "$(field "$tmp/attn.json" lora_params)" ] ||
  say "default targets on an MoE model are not q,k,v,o"
"$bin" plan --model "$src/tests/fixtures/moe/mixtral" --lora-targets q,up --budget 1G >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -ne 0 ] && grep -q "layer 0 is a mixture-of-experts layer" "$tmp/err" || say "LoRA on experts: rc=$rc $(cat "$tmp/err")"
# training: the aux loss beside the cross entropy
python3 "$src/tests/cli/widen_moe_vocab.py" "$src/tests/fixtures/moe/qwen3moe" "$tmp/moe" || say "widening the fixture's vocabulary"
mkdir -p "$tmp/data"
for i in $(seq 1 8); do echo "{\"text\": \"record $i: the quick brown fox jumps\"}"; done >"$tmp/data/train.jsonl"
cp "$tmp/data/train.jsonl" "$tmp/data/valid.jsonl"
tr=(--data "$tmp/data" --batch-size 2 --max-seq-length 32 --threads 1 --iters 2 --steps-per-report 1
  --steps-per-eval 2)
"$bin" train --model "$tmp/moe" "${tr[@]}" --adapter-path "$tmp/ad" >"$tmp/train.out" 2>&1 ||
  say "train on the MoE model: $(tail -3 "$tmp/train.out")"
python3 - "$tmp/ad/metrics.jsonl" <<'PY' || say "metrics.jsonl: $(cat "$tmp/ad/metrics.jsonl")"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if r["step"] > 0]
assert len(steps) == 2, recs
for r in steps:  # E * sum f*P: k = 2 when balanced, E * k = 16 at most
    assert 1.0 < r["aux_loss"] < 16.0 and r["train_loss"] > 0, r
PY
grep -qE "step 2: train loss [0-9.]+ \(aux loss [0-9.]+\), val loss" "$tmp/train.out" ||
  say "the loss line lacks the aux loss: $(grep 'step 2' "$tmp/train.out")"
# LoRA on the experts: planned bigger than attention alone, trains (the loss falls) and saves
"$bin" plan --model "$src/tests/fixtures/moe/mixtral" --batch-size 2 --max-seq-length 64 --budget 1G --json \
  --lora-targets q,k,v,o,experts.gate_up_proj,experts.down_proj >"$tmp/xl.json" 2>"$tmp/err" ||
  say "plan with expert targets: $(cat "$tmp/err")"
[ "$(field "$tmp/xl.json" lora_params)" -gt "$(field "$tmp/attn.json" lora_params)" ] ||
  say "expert targets add no LoRA parameters"
"$bin" plan --model "$src/tests/fixtures/moe/mixtral" --lora-targets q,experts.down_proj --lora-dropout 0.1 \
  --budget 1G >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -ne 0 ] && grep -q "experts.down_proj: LoRA dropout" "$tmp/err" || say "expert LoRA dropout: rc=$rc $(cat "$tmp/err")"
"$bin" plan --model "$src/tests/fixtures/moe/mixtral" --lora-targets q,experts.up --budget 1G >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && grep -q "experts.up" "$tmp/err" || say "unknown expert target: rc=$rc $(cat "$tmp/err")"
"$bin" train --model "$tmp/moe" "${tr[@]}" --iters 12 --steps-per-eval 12 --learning-rate 3e-3 \
  --lora-targets q_proj,experts.gate_up_proj,experts.down_proj --adapter-path "$tmp/ad_x" >"$tmp/x.out" 2>&1 ||
  say "train with expert targets: $(tr '\r' '\n' <"$tmp/x.out" | grep -v '^train ' | tail -3)"
python3 - "$tmp/ad_x/metrics.jsonl" <<'PY' || say "expert LoRA loss does not fall: $(cat "$tmp/ad_x/metrics.jsonl")"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in steps if r["step"] > 0 and "train_loss" in r]
assert len(steps) == 12, steps
assert steps[-1]["train_loss"] < 0.95 * steps[0]["train_loss"], (steps[0], steps[-1])
PY
[ -s "$tmp/ad_x/adapters.safetensors" ] || [ -s "$tmp/ad_x/adapter_model.safetensors" ] ||
  say "no adapter saved: $(ls "$tmp/ad_x")"
python3 "$src/tests/cli/tiny_model.py" "$tmp/dense" >/dev/null || say "tiny dense model"
"$bin" train --model "$tmp/dense" "${tr[@]}" --adapter-path "$tmp/ad_dense" >"$tmp/dense.out" 2>&1 ||
  say "train on the dense model: $(tail -3 "$tmp/dense.out")"
grep -q aux_loss "$tmp/ad_dense/metrics.jsonl" && say "a dense model's metrics report an aux loss"
exit $fail
