#!/usr/bin/env bash
# `longtune train` and `longtune generate` argument handling, without a model: missing required
# options and bad values are usage errors (exit 2) naming the option; a config file is read and
# flags override it; a missing or malformed config is a failure (exit 1) naming the file.
set -u
bin="$1"
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
expect 2 "'model' is required" -- train --data d
expect 2 "'data' is required" -- train --model m
expect 2 "iters" -- train --model m --data d --iters 12x
expect 2 "needs a value" -- train --model m --data d --iters
expect 2 "lm_head" -- train --model m --data d --lora-targets q,lm_head
expect 2 "every:K" -- train --model m --data d --recompute sometimes
expect 2 "recompute policy" -- train --model m --data d --offload-checkpoints
expect 2 "chunk-rows" -- train --model m --data d --chunk-rows 0
expect 2 "constant|cosine" -- train --model m --data d --lr-schedule=linear
expect 2 "unexpected argument" -- train --model m --data d stray
expect 2 "cpu|cuda" -- train --model m --data d --device tpu
# Without a GPU (CI), --device cuda is refused up front with the reason, before any file is read.
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect 1 "device cuda requested" -- train --model "$tmp/no-model.gguf" --data d --device cuda
fi
expect 1 "cannot open" -- train --config "$tmp/none.json"
printf '{"iters": 5,\n "seed": ,}\n' > "$tmp/bad.json"
expect 1 "bad.json:2" -- train --config "$tmp/bad.json"
printf '{"model": "m", "data": "d", "iterz": 5}\n' > "$tmp/unknown.json"
expect 1 "iterz" -- train --config "$tmp/unknown.json"
printf '{"model": "m", "data": "d", "iters": 0.5}\n' > "$tmp/frac.json"
expect 1 "iters" -- train --config "$tmp/frac.json"
printf '{"model": "m", "data": "d", "chunk_rows": -4096}\n' > "$tmp/chunk.json"
expect 1 "chunk_rows" -- train --config "$tmp/chunk.json"
# The config supplies model and data, flags add to it; the run then fails on the missing model file
# (exit 1), which shows that parsing went through.
printf '{"model": "%s/no-model.gguf", "data": "%s", "iters": 50}\n' "$tmp" "$tmp" > "$tmp/run.json"
expect 1 "no-model.gguf" -- train --config "$tmp/run.json" --iters 3 --mask-prompt
expect 2 "required" -- generate --prompt hi
expect 2 "required" -- generate --model m
expect 2 "max-tokens" -- generate --model m --prompt hi --max-tokens 0
expect 1 "no-model.gguf" -- generate --model "$tmp/no-model.gguf" --prompt hi
exit $fail
