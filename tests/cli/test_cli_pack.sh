#!/usr/bin/env bash
# `longtune pack` end to end on the default model (skipped without it): text and JSON statistics on
# a small mlx-lm folder, a malformed line reported as file:line (exit 1) or skipped on request, an
# unknown --chat-template name as a usage error (exit 2).
set -u
bin="$1"
model="${LONGTUNE_CACHE:-$HOME/.cache/longtune}/smollm2-135m-instruct-q4_1.gguf"
if [ ! -r "$model" ]; then echo "skipped: default model $model not found (run scripts/setup.sh)"; exit 77; fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
for i in $(seq 1 30); do
  printf '{"messages": [{"role": "user", "content": "Question %d?"}, {"role": "assistant", "content": "Answer %d."}]}\n' "$i" "$i"
done > "$dir/train.jsonl"
printf '{"text": "plain text record"}\n{"prompt": "P", "completion": "C"}\n' >> "$dir/train.jsonl"

out=$("$bin" pack --model "$model" --data "$dir" --max-seq-length 128 --algorithm bfd --mask-prompt 2>&1); rc=$?
if [ $rc != 0 ] || ! grep -q "32 records (1 text, 1 completion, 30 chat)" <<<"$out" || ! grep -q "utilisation" <<<"$out" \
   || ! grep -q "chat template smollm2" <<<"$out"; then
  echo "FAIL: pack text output (rc=$rc): $out"; fail=1
fi
out=$("$bin" pack --model "$model" --data "$dir" --max-seq-length 128 --batch-size 2 --json 2>&1); rc=$?
if [ $rc != 0 ] || ! python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["dataset"]["records"]==32 and 0<d["pack"]["utilisation"]<=1' <<<"$out"; then
  echo "FAIL: pack --json (rc=$rc): $out"; fail=1
fi
echo '{"text": 3}' >> "$dir/train.jsonl"
out=$("$bin" pack --model "$model" --data "$dir" --max-seq-length 128 2>&1); rc=$?
if [ $rc != 1 ] || ! grep -q "train.jsonl:33:" <<<"$out"; then echo "FAIL: malformed line (rc=$rc): $out"; fail=1; fi
out=$("$bin" pack --model "$model" --data "$dir" --max-seq-length 128 --skip-bad-lines 2>&1); rc=$?
if [ $rc != 0 ] || ! grep -q "1 skipped lines" <<<"$out"; then echo "FAIL: --skip-bad-lines (rc=$rc): $out"; fail=1; fi
out=$("$bin" pack --model "$model" --data "$dir" --max-seq-length 128 --chat-template vicuna 2>&1); rc=$?
if [ $rc != 2 ] || ! grep -q "usage: longtune pack" <<<"$out"; then echo "FAIL: bad --chat-template (rc=$rc): $out"; fail=1; fi
exit $fail
