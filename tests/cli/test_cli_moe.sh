#!/usr/bin/env bash
# `longtune plan` on the tiny Mixtral and Qwen3-MoE fixtures: --moe-chunk-tokens N (flag and
# options-file key) shrinks the planned workspace, a bad value exits 2, the default targets are the
# attention's, LoRA on an MoE layer's experts is refused naming the layer.
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
exit $fail
