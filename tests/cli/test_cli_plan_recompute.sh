#!/usr/bin/env bash
# `longtune plan --recompute sliding[:K] | global[:K]` on the Gemma fixtures' configs: the policy is
# named in the text and the JSON form, the text says which LoRA layers are recomputed, the by-kind
# plan keeps fewer activations than recompute none, a kind the model lacks fails naming it (exit 1)
# and a malformed policy is a usage error (exit 2).
set -u
bin="$1"
src="${LONGTUNE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
g2="$src/tests/fixtures/gemma/gemma2/config.json"
g3="$src/tests/fixtures/gemma/gemma3/config.json"
llama="$src/tests/fixtures/model/llama3_untied/config.json"
mistral="$src/tests/fixtures/family/mistral_v01/config.json"
command -v python3 >/dev/null || { echo "skipped: python3 not found (used to read JSON)"; exit 77; }
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
act() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["classes"]["activations"])' "$1"; }

# 1. Names and the layers recomputed (gemma2: S G S; gemma3: S S G).
for c in "$g2 sliding 2" "$g2 global 1" "$g3 sliding 2" "$g3 global:2 1" "$g3 sliding:2 2"; do
  set -- $c
  "$bin" plan --config "$1" --seq-len 512 --batch 1 --recompute "$2" --budget 64G >"$tmp/t" 2>"$tmp/e" ||
    say "plan $1 --recompute $2: $(cat "$tmp/e")"
  grep -q "recompute $2," "$tmp/t" || say "policy $2 not named: $(head -3 "$tmp/t")"
  grep -q "recomputed in the backward: $3 of 3 LoRA layers" "$tmp/t" || say "$2 on $1: $(grep recomputed "$tmp/t")"
  "$bin" plan --config "$1" --seq-len 512 --batch 1 --recompute "$2" --budget 64G --json >"$tmp/p.json" 2>"$tmp/e" ||
    say "plan --json $1 --recompute $2: $(cat "$tmp/e")"
  [ "$(field "$tmp/p.json" recompute)" = "$2" ] || say "JSON names $(field "$tmp/p.json" recompute), not $2"
done

# 2. The by-kind plans keep fewer activations than recompute none, more than recompute all.
for p in none sliding global all; do
  "$bin" plan --config "$g3" --seq-len 4096 --batch 1 --recompute $p --budget 64G --json >"$tmp/$p.json" 2>"$tmp/e" ||
    say "plan --recompute $p: $(cat "$tmp/e")"
done
n=$(act "$tmp/none.json") s=$(act "$tmp/sliding.json") g=$(act "$tmp/global.json") a=$(act "$tmp/all.json")
[ "$a" -lt "$s" ] && [ "$s" -lt "$g" ] && [ "$g" -lt "$n" ] || say "activations all $a < sliding $s < global $g < none $n"

# 3. Sliding on a model whose every layer slides is recompute all, byte for byte.
"$bin" plan --config "$mistral" --seq-len 512 --batch 1 --recompute sliding --json >"$tmp/ms.json" 2>"$tmp/e" ||
  say "mistral sliding: $(cat "$tmp/e")"
"$bin" plan --config "$mistral" --seq-len 512 --batch 1 --recompute all --json >"$tmp/ma.json" 2>"$tmp/e" ||
  say "mistral all: $(cat "$tmp/e")"
[ "$(field "$tmp/ms.json" peak_bytes)" = "$(field "$tmp/ma.json" peak_bytes)" ] || say "mistral sliding != all"

# 4. A kind the model lacks fails naming it; a malformed policy is a usage error.
"$bin" plan --config "$llama" --recompute sliding >/dev/null 2>"$tmp/e"
rc=$?
[ $rc -eq 1 ] || say "sliding on llama: rc=$rc"
grep -q "the model has no sliding-window layers" "$tmp/e" || say "sliding on llama: $(cat "$tmp/e")"
"$bin" plan --config "$mistral" --recompute global >/dev/null 2>"$tmp/e"
rc=$?
[ $rc -eq 1 ] || say "global on mistral: rc=$rc"
grep -q "no full-attention (global) layers" "$tmp/e" || say "global on mistral: $(cat "$tmp/e")"
for bad in sliding:0 slidingx global: local; do
  "$bin" plan --config "$g3" --recompute "$bad" >/dev/null 2>"$tmp/e"
  rc=$?
  [ $rc -eq 2 ] || say "--recompute $bad: rc=$rc"
  grep -q "$bad" "$tmp/e" || say "--recompute $bad not named: $(cat "$tmp/e")"
done
exit $fail
