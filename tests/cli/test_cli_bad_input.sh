#!/usr/bin/env bash
# The CLI rows of docs/bad-input.md: bad flags (exit 2 with the option named), and inputs that
# only the whole pipeline sees (exit 1 with the status and the file/line/token named): an empty
# dataset, token ids past the model's vocabulary, an unknown architecture, a malformed line, a
# missing data folder or checkpoint. Tiny random model from tests/cli/tiny_model.py (python3).
set -u
bin="$1"
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
python3 "$here/tiny_model.py" "$dir/model" || { echo "FAIL: tiny model"; exit 1; }
mkdir -p "$dir/data" "$dir/empty" "$dir/badline" "$dir/v96" "$dir/gpt2"
for i in $(seq 1 8); do echo "{\"text\": \"record $i: the quick brown fox\"}"; done > "$dir/data/train.jsonl"
printf '\n\n' > "$dir/empty/train.jsonl"
printf '{"text": "fine"}\n{"text": "unterminated\n' > "$dir/badline/train.jsonl"
# The fixture model has 96 ids; the tokenizer beside it makes ids up to 1200.
cp "$src/tests/fixtures/model/llama_tied/config.json" "$src/tests/fixtures/model/llama_tied/model.safetensors" "$dir/v96/"
cp "$dir/model/tokenizer.json" "$dir/model/tokenizer_config.json" "$dir/v96/"
cp "$dir/model/"* "$dir/gpt2/"
sed -i 's/"model_type": "llama"/"model_type": "gpt2"/' "$dir/gpt2/config.json"

# expect EXIT FRAGMENT ARGS...: runs `longtune train ARGS`, checks the exit status and that the
# output (stdout and stderr) contains FRAGMENT verbatim.
expect() {
  local want=$1 frag=$2; shift 2
  local out rc
  out=$("$bin" train "$@" 2>&1); rc=$?
  if [ $rc != "$want" ] || ! grep -qF -- "$frag" <<<"$out"; then
    echo "FAIL: train $* -> exit $rc (want $want), output lacks '$frag':"; echo "$out" | tail -3; fail=1
  fi
}
run=(--model "$dir/model" --data "$dir/data" --iters 2 --batch-size 2 --max-seq-length 32 --threads 1)
ad=(--adapter-path "$dir/ad")

# Bad flags: usage errors, exit 2, the option and the accepted range named.
expect 2 "unknown option '--bogus'" "${run[@]}" --bogus
expect 2 "option 'iters': 'abc' is not an integer in [1, 1000000000000]" "${run[@]}" --iters abc
expect 2 "option 'iters': '99999999999999999999' is not an integer in [1, 1000000000000]" "${run[@]}" --iters 99999999999999999999
expect 2 "option 'learning-rate': '-1' is not a number in [0, 10]" "${run[@]}" --learning-rate -1
expect 2 "option 'lora-rank': '0' is not an integer in [1, 4096]" "${run[@]}" --lora-rank 0
expect 2 "option 'max-seq-length': '1' is not an integer in [2, 16777216]" "${run[@]}" --max-seq-length 1
expect 2 "option 'model' is required" --data "$dir/data"
expect 2 "option '--iters' needs a value" "${run[@]}" --iters
# Inputs the pipeline rejects: exit 1, "longtune train: <status>: <what>".
expect 1 "longtune train: invalid argument: the training set yields no batches" --model "$dir/model" --data "$dir/empty" --iters 2 "${ad[@]}"
expect 1 "longtune train: invalid argument: model: token " --model "$dir/v96" --data "$dir/data" --iters 2 "${ad[@]}"
expect 1 "is outside [0, 96)" --model "$dir/v96" --data "$dir/data" --iters 2 "${ad[@]}"
expect 1 "longtune train: unsupported: $dir/gpt2/config.json: model_type \"gpt2\" is not supported (llama, qwen2, qwen3, mistral, phi3, gemma2, gemma3_text, gemma3, qwen3_moe, qwen2_moe, mixtral)" \
  --model "$dir/gpt2" --data "$dir/data" --iters 2 "${ad[@]}"
expect 1 "longtune train: malformed input: $dir/badline/train.jsonl:2:" --model "$dir/model" --data "$dir/badline" --iters 2 "${ad[@]}"
expect 1 "longtune train: not found: $dir/nodir/train.jsonl: cannot open" --model "$dir/model" --data "$dir/nodir" --iters 2 "${ad[@]}"
expect 1 "longtune train: not found: $dir/nomodel" --model "$dir/nomodel" --data "$dir/data" --iters 2 "${ad[@]}"
expect 1 "longtune train: I/O error: $dir/nockpt: cannot open checkpoint" "${run[@]}" "${ad[@]}" --resume-adapter-file "$dir/nockpt"
# Divergence: a run whose loss or gradient norm leaves float's range stops with exit 4, names the
# step and the quantity, keeps the last good (finite) adapter and checkpoint and leaves
# diverged.json; the kept adapter loads in generate.
div=(--model "$dir/model" --data "$dir/data" --batch-size 2 --max-seq-length 32 --threads 1 --iters 60
  --learning-rate 10 --lora-alpha 1000000 --lora-rank 64 --beta2 0.5 --eps 1e-30 --save-every 1
  --steps-per-report 1 --adapter-path "$dir/div")
# Which quantity leaves float's range first (the loss, or the gradients' sum of squares) depends
# on the compiler's and the CPU's rounding; either stops the run, and the record names it.
out=$("$bin" train "${div[@]}" 2>&1); rc=$?
if [ $rc != 4 ] || ! grep -qE "^longtune train: training diverged: training diverged at step [0-9]+: (train_loss is nan|grad_norm is (inf|nan)) \(learning rate 10\); the checkpoint and adapter of step [0-9]+ in $dir/div are kept; see $dir/div/diverged.json" <<<"$out"; then
  echo "FAIL: divergence -> exit $rc:"; echo "$out" | tail -2; fail=1
fi
q=$(grep -oE "(train_loss|grad_norm) is (nan|inf)" <<<"$out" | head -1 | cut -d' ' -f1)
grep -q "\"quantity\":.*\"${q:-none}\"" "$dir/div/diverged.json" || { echo "FAIL: no divergence record naming $q"; fail=1; }
"$bin" generate --model "$dir/model" --adapter "$dir/div" --prompt hi --max-tokens 2 >/dev/null 2>&1 ||
  { echo "FAIL: the kept adapter does not load"; fail=1; }
# A NaN loss at the first step (a final norm weight of 3.4e38, float's largest: the normed hidden
# states overflow, the logits hold inf - inf): exit 4 naming train_loss, the metrics line holds the
# loss as null beside what it was, the record names it, nothing was saved.
# The tiny model copied to $dir/NAME with every final norm weight set to VALUE.
norm_model() {
  cp -r "$dir/model" "$dir/$1"
  python3 - "$dir/$1/model.safetensors" "$2" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
e = json.loads(b[8:8 + n])["model.norm.weight"]
assert e["dtype"] == "F32"
a, z = e["data_offsets"]
b[8 + n + a:8 + n + z] = struct.pack("<%df" % ((z - a) // 4), *[float(sys.argv[2])] * ((z - a) // 4))
open(sys.argv[1], "wb").write(b)
PY
}
norm_model nl 3.4e38
out=$("$bin" train --model "$dir/nl" --data "$dir/data" --batch-size 2 --max-seq-length 32 --threads 1 --iters 3 \
  --steps-per-report 1 --adapter-path "$dir/nldiv" 2>&1); rc=$?
if [ $rc != 4 ] || ! grep -qF "longtune train: training diverged: training diverged at step 1: train_loss is nan (learning rate 1e-05); no adapter was saved; see $dir/nldiv/diverged.json" <<<"$out"; then
  echo "FAIL: NaN-loss divergence -> exit $rc:"; echo "$out" | tail -2; fail=1
fi
grep -q '"train_loss":null,"train_loss_non_finite":"nan"' "$dir/nldiv/metrics.jsonl" || { echo "FAIL: metrics lacks the null loss"; fail=1; }
grep -q '"quantity":.*"train_loss"' "$dir/nldiv/diverged.json" || { echo "FAIL: no train_loss divergence record"; fail=1; }
# Divergence in the gradient norm alone: a final norm weight of 1e14 and a LoRA scale of 1e6 make
# every LoRA gradient finite but their sum of squares past float's range, while the loss (about
# 1.5e15) stays finite. The first step stops with exit 4 naming grad_norm; the metrics line keeps
# the finite loss; nothing was saved.
norm_model gn 1e14
out=$("$bin" train --model "$dir/gn" --data "$dir/data" --batch-size 2 --max-seq-length 32 --threads 1 --iters 3 \
  --lora-rank 1 --lora-alpha 1000000 --steps-per-report 1 --adapter-path "$dir/gndiv" 2>&1); rc=$?
if [ $rc != 4 ] || ! grep -qF "longtune train: training diverged: training diverged at step 1: grad_norm is inf (learning rate 1e-05); no adapter was saved; see $dir/gndiv/diverged.json" <<<"$out"; then
  echo "FAIL: gradient-norm divergence -> exit $rc:"; echo "$out" | tail -2; fail=1
fi
grep -q '"quantity":.*"grad_norm"' "$dir/gndiv/diverged.json" || { echo "FAIL: no grad_norm divergence record"; fail=1; }
grep -qE '^\{"step":1,"train_loss":[0-9.]+e\+15,' "$dir/gndiv/metrics.jsonl" ||
  { echo "FAIL: the diverged step's finite loss is not in metrics.jsonl"; fail=1; }
[ ! -e "$dir/gndiv/adapter_model.safetensors" ] || { echo "FAIL: a diverged first step saved an adapter"; fail=1; }
# An adapter holding a NaN is refused naming the tensor.
cp -r "$dir/div" "$dir/nanad"
python3 - "$dir/nanad/adapter_model.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
k = sorted(x for x in h if x != "__metadata__")[0]
o = 8 + n + h[k]["data_offsets"][0]
b[o:o + 4] = struct.pack("<f", float("nan"))
open(sys.argv[1], "wb").write(b)
PY
out=$("$bin" generate --model "$dir/model" --adapter "$dir/nanad" --prompt hi --max-tokens 2 2>&1); rc=$?
if [ $rc != 1 ] || ! grep -qF "adapter_model.safetensors: tensor " <<<"$out" || ! grep -qF ": element 0 is nan (not finite)" <<<"$out"; then
  echo "FAIL: a NaN adapter -> exit $rc: $out" | tail -2; fail=1
fi

# One run per adapter folder: a second run while the first holds the lock is refused naming the
# first's pid; a fresh run into a folder holding an adapter needs --overwrite (or a resume).
"$bin" train "${run[@]}" --iters 100000 --save-every 100000 --adapter-path "$dir/locked" >"$dir/locked.out" 2>&1 &
first=$!
for _ in $(seq 1 600); do [ -s "$dir/locked/.longtune.lock" ] && break; sleep 0.1; done
expect 1 "longtune train: invalid argument: $dir/locked is in use by another training run (pid $first, lock $dir/locked/.longtune.lock)" \
  "${run[@]}" --adapter-path "$dir/locked"
kill -TERM $first; wait $first
expect 1 "longtune train: invalid argument: $dir/locked already holds an adapter (adapter_model.safetensors): --overwrite replaces it, --resume-adapter-file $dir/locked continues its run" \
  "${run[@]}" --adapter-path "$dir/locked"
expect 0 "adapter: $dir/locked/adapter_model.safetensors" "${run[@]}" --adapter-path "$dir/locked" --overwrite
expect 0 "adapter: $dir/locked/adapter_model.safetensors" "${run[@]}" --adapter-path "$dir/locked" --resume-adapter-file "$dir/locked"

# Output paths are checked in full before anything loads: the longest --adapter-path allowed (970
# bytes: its longest output, aborted_memory_ceiling.json.tmp.PID, must fit 1023) trains and saves;
# one byte more is a usage error; a component over NAME_MAX too.
long_path() { # LEN: a path under $dir of exactly LEN bytes, components of at most 200
  local p="$dir/lp" n
  while [ ${#p} -lt "$1" ]; do n=$(( $1 - ${#p} - 1 )); [ $n -gt 200 ] && n=200; [ $n -lt 1 ] && n=1
    p="$p/$(head -c $n /dev/zero | tr '\0' x)"; done
  echo "$p"
}
lp=$(long_path 970)
expect 0 "adapter: $lp/adapter_model.safetensors" "${run[@]}" --adapter-path "$lp"
[ -s "$lp/checkpoint.ltck" ] || { echo "FAIL: no checkpoint under the 970-byte path"; fail=1; }
lp=$(long_path 971)
expect 2 "option 'adapter_path': 971 bytes leaves no room for its outputs (aborted_memory_ceiling.json and its temporary aborted_memory_ceiling.json.tmp.PID): a folder path of at most 970 bytes" "${run[@]}" --adapter-path "$lp"
expect 2 "option 'adapter_path': component 256 bytes long at byte " "${run[@]}" --adapter-path "$dir/$(head -c 256 /dev/zero | tr '\0' y)"

# Data that never ends or is not a file: refused at open, never read forever.
mkdir -p "$dir/zero" "$dir/folder/train.jsonl"
ln -s /dev/zero "$dir/zero/train.jsonl"
expect 1 "longtune train: invalid argument: $dir/zero/train.jsonl: is not a regular file (a device, FIFO or socket), not a JSONL file" \
  --model "$dir/model" --data "$dir/zero" --iters 2 --adapter-path "$dir/ad_zero"
expect 1 "longtune train: invalid argument: $dir/folder/train.jsonl: is a folder, not a JSONL file" \
  --model "$dir/model" --data "$dir/folder" --iters 2 --adapter-path "$dir/ad_folder"
# A signal while the data loads (nothing to save yet) ends the run at once, with the signal's
# status, instead of waiting for the first step.
mkdir -p "$dir/big"
python3 -c "
import sys
w = sys.stdout.write
for i in range(400000): w('{\"text\": \"record %d: the quick brown fox jumps over the lazy dog\"}\\n' % i)" > "$dir/big/train.jsonl"
"$bin" train --model "$dir/model" --data "$dir/big" --iters 2 --threads 1 --adapter-path "$dir/ad_big" >"$dir/big.out" 2>&1 &
pid=$!
sleep 1
kill -INT $pid
t0=$SECONDS
wait $pid; rc=$?
if [ $rc != 130 ] || [ $((SECONDS - t0)) -gt 10 ] || [ -e "$dir/ad_big/checkpoint.ltck" ] || grep -q "train 1/" "$dir/big.out"; then
  echo "FAIL: SIGINT while loading: exit $rc after $((SECONDS - t0)) s: $(tail -2 "$dir/big.out")"; fail=1
fi

# Non-finite weights are refused at load, naming the tensor and element: every row of the
# embedding (here its last), the norms.
poison() { # DIR TENSOR INDEX VALUE: a copy of the tiny model with one f32 element replaced
  cp -r "$dir/model" "$1"
  python3 - "$1/model.safetensors" "$2" "$3" "$4" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
o = 8 + n + h[sys.argv[2]]["data_offsets"][0] + 4 * int(sys.argv[3])
b[o:o + 4] = struct.pack("<f", float(sys.argv[4]))
open(sys.argv[1], "wb").write(b)
PY
}
poison "$dir/nan_norm" model.norm.weight 3 nan
expect 1 "longtune train: malformed input: $dir/nan_norm: tensor 'model.norm.weight': element [0, 3] is not finite (f32 data)" \
  --model "$dir/nan_norm" --data "$dir/data" --iters 2 --adapter-path "$dir/ad_nan"
poison "$dir/inf_embed" model.embed_tokens.weight $((1200 * 16 - 1)) inf
expect 1 "tensor 'model.embed_tokens.weight': element [1199, 15] is not finite (f32 data)" \
  --model "$dir/inf_embed" --data "$dir/data" --iters 2 --adapter-path "$dir/ad_inf"

# A given option is honoured or refused, never replaced by its default; numbers are plain decimal.
expect 2 "option 'eps': 0 is not in (0, 1]" "${run[@]}" --eps 0
expect 2 "option 'lora_alpha': 0 is not in (0, 1e+06] (it would scale LoRA to 0)" "${run[@]}" --lora-alpha 0
expect 2 "option 'num_layers': 0 is not in [1, 65536] or -1 (all)" "${run[@]}" --num-layers 0
expect 2 "option 'val_batches': 0 is not in [1, 1e12] or -1 (all)" "${run[@]}" --val-batches 0
expect 2 "option 'lora_targets' is empty" "${run[@]}" --lora-targets ""
expect 2 "option 'iters': '0x2' is not an integer in [1, 1000000000000]" "${run[@]}" --iters 0x2
expect 2 "option 'iters': ' 2' is not an integer in [1, 1000000000000]" "${run[@]}" --iters " 2"
expect 2 "option 'iters': '2 ' is not an integer in [1, 1000000000000]" "${run[@]}" --iters "2 "
expect 2 "option 'seed': ' -1' is not a non-negative integer" "${run[@]}" --seed " -1"
expect 2 "option 'learning-rate': '0x1p-3' is not a number in [0, 10]" "${run[@]}" --learning-rate 0x1p-3
expect 0 "trained 2 steps" "${run[@]}" --learning-rate 0 --beta1 0 --adapter-path "$dir/lr0"
grep -q '"learning_rate":0,' "$dir/lr0/metrics.jsonl" || { echo "FAIL: --learning-rate 0 not honoured"; fail=1; }
expect 0 "trained 2 steps" "${run[@]}" --learning-rate 1e-320 --adapter-path "$dir/lrsub"

# generate: a prompt that fills the model's context is refused; a reply stops where the next token
# would need a position past the context (1 prompt token + 8 new ones use positions 0..7).
cp -r "$dir/model" "$dir/ctx8"
sed -i 's/"max_position_embeddings": 4096/"max_position_embeddings": 8/' "$dir/ctx8/config.json"
out=$("$bin" generate --model "$dir/ctx8" --prompt "the quick brown fox jumps over the lazy dog" 2>&1); rc=$?
if [ $rc != 1 ] || ! grep -qF "generate: prompt 0 has 35 tokens; the model's context (max_positions) is 8" <<<"$out"; then
  echo "FAIL: generate past the context -> exit $rc: $out" | tail -2; fail=1
fi
out=$("$bin" generate --model "$dir/ctx8" --prompt ab --no-chat-template --max-tokens 40 2>&1); rc=$?
if [ $rc != 0 ] || ! grep -qF "1 prompt tokens in" <<<"$out" || ! grep -qF ", 8 new tokens in" <<<"$out"; then
  echo "FAIL: generate up to the context -> exit $rc: $out" | tail -2; fail=1
fi

# Messages that name what is wrong.
expect 1 "longtune train: invalid argument: $dir: is a folder, not a JSON config file" "${run[@]}" --config "$dir"
expect 1 "longtune train: invalid argument: /dev/null: is not a model folder or file (a device, FIFO or socket)" \
  --model /dev/null --data "$dir/data" --iters 2 --adapter-path "$dir/ad_devnull"
ln -s "$dir/nowhere/x" "$dir/dangling"
expect 1 "longtune train: I/O error: $dir/dangling: is a symbolic link to nothing (a dangling link), not a folder" \
  "${run[@]}" --adapter-path "$dir/dangling"
expect 2 "option 'quantize': 'q3_k' is not int4_g64|q4_0|q4_1|q8_0|q4_k|q5_k|q6_k" "${run[@]}" --quantize q3_k
expect 2 "option 'base_dtype': 'fp16' is not file|fp8" "${run[@]}" --base-dtype fp16
expect 2 "option 'base_dtype' fp8 holds the base in fp8 itself: drop 'quantize' q4_0" "${run[@]}" --base-dtype fp8 \
  --quantize q4_0
expect 2 "option 'fp8_skip' down needs 'base_dtype' fp8" "${run[@]}" --fp8-skip down
expect 2 "option 'fp8_skip': 'lm_head' is not one of q,k,v,o,gate,up,down" "${run[@]}" --base-dtype fp8 \
  --fp8-skip down,lm_head
expect 2 "option 'fp8_skip' q,k,v,o,gate,up,down skips every projection: drop 'base_dtype' fp8" "${run[@]}" \
  --base-dtype fp8 --fp8-skip q,k,v,o,gate,up,down
out=$(echo "5 99999" | "$bin" tokenize --model "$dir/model" --decode 2>&1)
if [ "$(grep -o 'longtune tokenize' <<<"$out" | wc -l)" != 1 ] ||
   ! grep -qF "longtune tokenize: invalid argument: record 1: token id 99999 at position 1 is not in the vocabulary" <<<"$out"; then
  echo "FAIL: tokenize --decode message: $out"; fail=1
fi
cp -r "$dir/model" "$dir/shape3"
python3 - "$dir/shape3/model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["model.embed_tokens.weight"]["shape"] += [1]
j = json.dumps(h, separators=(",", ":")).encode()
j += b" " * (n - len(j))
assert len(j) == n
open(sys.argv[1], "wb").write(b[:8] + j + b[8 + n:])
PY
expect 1 "tensor 'model.embed_tokens.weight' has shape (1200, 16, 1), expected (1200, 16)" \
  --model "$dir/shape3" --data "$dir/data" --iters 2 --adapter-path "$dir/ad_shape3"

# After a resume: the summary counts this call's tokens; the next save removes an earlier
# aborted_memory_ceiling.json; NAME.tmp.PID files of dead processes are removed at the start.
expect 0 "trained 2 steps (" "${run[@]}" --adapter-path "$dir/res"
expect 0 "trained 0 steps (0 tokens)" "${run[@]}" --adapter-path "$dir/res" --resume-adapter-file "$dir/res"
echo '{"status": "aborted_memory_ceiling"}' > "$dir/res/aborted_memory_ceiling.json"
echo stale > "$dir/res/adapter_model.safetensors.tmp.2147483647"
"$bin" train "${run[@]}" --iters 100000 --steps-per-report 1 --adapter-path "$dir/res2" >"$dir/res2.out" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q '"step":1,' "$dir/res2/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -INT $pid; wait $pid
cp "$dir/res/aborted_memory_ceiling.json" "$dir/res/adapter_model.safetensors.tmp.2147483647" "$dir/res2/"
"$bin" train "${run[@]}" --iters 100000 --steps-per-report 1 --adapter-path "$dir/res2" --resume-adapter-file "$dir/res2" >"$dir/res2.out" 2>&1 &
pid=$!
k=$(grep -o '"step":[0-9]*,"train_loss"' "$dir/res2/metrics.jsonl" | tail -1 | grep -o '[0-9][0-9]*')
for _ in $(seq 1 600); do
  [ "$(grep -o '"step":[0-9]*,"train_loss"' "$dir/res2/metrics.jsonl" | tail -1 | grep -o '[0-9][0-9]*')" -gt "$k" ] && break
  sleep 0.1
done
kill -INT $pid; wait $pid; rc=$?
if [ $rc != 130 ] || [ -e "$dir/res2/aborted_memory_ceiling.json" ] || [ -e "$dir/res2/adapter_model.safetensors.tmp.2147483647" ]; then
  echo "FAIL: resume cleanup: exit $rc; $(ls "$dir/res2"); $(tail -2 "$dir/res2.out")"; fail=1
fi

exit $fail
