#!/usr/bin/env bash
# `longtune generate`, `chat` and `eval` on a tiny random model (tests/cli/tiny_model.py): greedy
# and seeded sampling are reproducible, a --stop string ends the text before it (never printed),
# --prompts batches a file through one cache with the same answers as one prompt at a time, chat
# answers each turn and /reset, eval prints mean loss / ppl / tokens (--json) equal to train
# --test's test loss for the same adapter, and bad input is a typed error: sampling values out of
# range, a prompt longer than the model's context, an adapter holding a NaN (named tensor), a bad
# prompts file; bench generate writes its result without a peer.
set -u
bin="$1"
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
python3 "$here/tiny_model.py" "$dir/model" || { echo "FAIL: tiny model"; exit 1; }
M="$dir/model"
g=(generate --model "$M" --threads 1 --no-chat-template)

expect() { # expect RC PATTERN -- ARGS...: runs $bin ARGS, checks the exit status and output
  local want=$1 pat=$2; shift 3
  local out rc
  out=$("$bin" "$@" 2>&1 </dev/null); rc=$?
  if [ $rc != "$want" ] || ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL: $* -> rc $rc (want $want), output: $(tail -3 <<<"$out") (want /$pat/)"; fail=1
  fi
}

# greedy is reproducible; a seeded sample is reproducible and differs from another seed's
a=$("$bin" "${g[@]}" --prompt "the quick brown" --max-tokens 24 2>/dev/null)
b=$("$bin" "${g[@]}" --prompt "the quick brown" --max-tokens 24 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: greedy not reproducible: '$a' vs '$b'"; fail=1; }
s1=$("$bin" "${g[@]}" --prompt "the quick brown" --max-tokens 24 --temp 1.5 --top-k 50 --top-p 0.95 --seed 7 2>/dev/null)
s2=$("$bin" "${g[@]}" --prompt "the quick brown" --max-tokens 24 --temp 1.5 --top-k 50 --top-p 0.95 --seed 7 2>/dev/null)
s3=$("$bin" "${g[@]}" --prompt "the quick brown" --max-tokens 24 --temp 1.5 --top-k 50 --top-p 0.95 --seed 8 2>/dev/null)
[ "$s1" = "$s2" ] || { echo "FAIL: seeded sampling not reproducible"; fail=1; }
[ "$s1" != "$s3" ] || { echo "FAIL: seeds 7 and 8 sampled the same text"; fail=1; }

# --stop: the greedy text cut before the first occurrence of a piece of it
if [ ${#a} -ge 8 ]; then
  stop=${a:4:3}
  want=${a%%"$stop"*}
  got=$("$bin" "${g[@]}" --prompt "the quick brown" --max-tokens 24 --stop "$stop" 2>/dev/null)
  [ "$got" = "$want" ] || { echo "FAIL: --stop '$stop': got '$got', want '$want'"; fail=1; }
fi

# --prompts: one JSON line per prompt, each completion the one-prompt answer
printf '"the quick brown"\n{"prompt": "over the lazy"}\n' >"$dir/prompts.jsonl"
c=$("$bin" "${g[@]}" --prompts "$dir/prompts.jsonl" --max-tokens 24 2>/dev/null)
d=$("$bin" "${g[@]}" --prompt "over the lazy" --max-tokens 24 2>/dev/null)
python3 - "$c" "$a" "$d" <<'PY' || fail=1
import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines()]
by = {r["index"]: r for r in rows}
ok = len(rows) == 2 and by[0]["completion"] == sys.argv[2] and by[1]["completion"] == sys.argv[3]
if not ok: print("FAIL: --prompts rows %r vs %r / %r" % (rows, sys.argv[2], sys.argv[3]))
sys.exit(0 if ok else 1)
PY

# bad input
expect 1 "top_p" -- "${g[@]}" --prompt hi --top-p 1.5
expect 1 "temperature" -- "${g[@]}" --prompt hi --temp -1
expect 1 "min_p" -- "${g[@]}" --prompt hi --min-p 1
expect 1 "top_k" -- "${g[@]}" --prompt hi --top-k -3
expect 1 "repeat_penalty" -- "${g[@]}" --prompt hi --repeat-penalty -2
expect 2 "max-tokens" -- "${g[@]}" --prompt hi --max-tokens 0
expect 2 "one" -- "${g[@]}" --prompt hi --prompts "$dir/prompts.jsonl"
echo '{"text": 3}' >"$dir/bad.jsonl"
expect 1 "bad.jsonl:1" -- "${g[@]}" --prompts "$dir/bad.jsonl"
long=$(python3 -c "print(' '.join(['fox'] * 5000))")
expect 1 "max_positions" -- "${g[@]}" --prompt "$long" --max-tokens 4

# chat: two turns, a reset, a third; a reply per turn on stdout (one line each: --stop at a newline),
# the cache reused for the second turn's unchanged prefix
out=$(printf 'the quick brown\nover the lazy\n/reset\nthe quick brown\n/quit\nignored\n' |
  "$bin" chat --model "$M" --threads 1 --chat-template chatml --max-tokens 12 --stop $'\n' --stats 2>"$dir/chat.err"); rc=$?
n=$(grep -c '' <<<"$out")
if [ $rc != 0 ] || [ "$n" != 3 ] || ! grep -q "reset" "$dir/chat.err"; then
  echo "FAIL: chat rc $rc, $n lines: $out / $(cat "$dir/chat.err")"; fail=1
fi
first=$(sed -n 1p <<<"$out"); third=$(sed -n 3p <<<"$out")
[ "$first" = "$third" ] || { echo "FAIL: chat after /reset: '$third' vs '$first'"; fail=1; }
# the second turn reuses the cached first turn (its whole prompt at least); after /reset nothing
python3 - "$dir/chat.err" <<'PY' || fail=1
import re, sys
rows = [tuple(map(int, m)) for m in re.findall(r"chat: (\d+) prompt tokens, (\d+) reused", open(sys.argv[1]).read())]
ok = len(rows) == 3 and rows[0][1] == 0 and rows[1][1] >= rows[0][0] and rows[1][1] < rows[1][0] and rows[2][1] == 0
if not ok: print("FAIL: chat cache reuse %r" % rows)
sys.exit(0 if ok else 1)
PY
expect 1 "top_p" -- chat --model "$M" --top-p 2

# eval --json against train --test on the same data and adapter
mkdir -p "$dir/data"
for i in $(seq 1 24); do echo "{\"text\": \"record $i: the quick brown fox jumps over the lazy dog\"}"; done >"$dir/data/train.jsonl"
head -4 "$dir/data/train.jsonl" >"$dir/data/valid.jsonl"
for i in $(seq 1 6); do echo "{\"text\": \"test $i: a lazy dog sleeps under the brown fox\"}"; done >"$dir/data/test.jsonl"
tr=(--data "$dir/data" --batch-size 2 --max-seq-length 32)
"$bin" train --model "$M" "${tr[@]}" --iters 3 --threads 1 --adapter-path "$dir/ad" --test >"$dir/train.out" 2>&1 ||
  { echo "FAIL: train --test: $(tail -3 "$dir/train.out")"; fail=1; }
tl=$(grep -o 'Test loss [0-9.]*' "$dir/train.out" | grep -o '[0-9.]*$')
ev=$("$bin" eval --model "$M" --adapter "$dir/ad" "${tr[@]}" --threads 1 --json 2>"$dir/eval.err")
python3 - "$ev" "${tl:-nan}" <<'PY' || { echo "FAIL: eval: $ev / $(cat "$dir/eval.err")"; fail=1; }
import json, math, sys
e = json.loads(sys.argv[1]); tl = float(sys.argv[2])
ok = e["n_tokens"] > 0 and abs(e["ppl"] - math.exp(e["mean_loss"])) < 1e-4 * e["ppl"] and abs(e["mean_loss"] - tl) < 1e-3
if not ok: print("eval %r vs train --test loss %r" % (e, tl))
sys.exit(0 if ok else 1)
PY
expect 0 "perplexity" -- eval --model "$M" "${tr[@]}" --split valid --threads 1

# --bf16-products on a bf16 model (the CPU through oneDNN): the same training run's final
# validation loss moves by bf16 rounding of the products' inputs only (and does move: the path
# ran); a build without oneDNN refuses it by name
python3 "$here/tiny_model.py" "$dir/m16" --bf16 >/dev/null || { echo "FAIL: tiny bf16 model"; exit 1; }
for f in "" --bf16-products; do
  "$bin" train --model "$dir/m16" "${tr[@]}" --iters 3 --threads 1 --adapter-path "$dir/ad16$f" --test $f \
    >"$dir/train16$f.out" 2>&1
  echo "rc=$?" >>"$dir/train16$f.out"
done
if "$bin" info | grep -q "cpu_bf16_products=1"; then
  python3 - "$dir/train16.out" "$dir/train16--bf16-products.out" <<'PY' || { echo "FAIL: train --bf16-products: $(tail -3 "$dir/train16--bf16-products.out")"; fail=1; }
import re, sys
loss = []
for f in sys.argv[1:]:
    t = open(f).read()
    m = re.findall(r"val loss [0-9.]+ -> ([0-9.]+)", t)
    if "rc=0" not in t or not m: sys.exit(1)
    loss.append(float(m[-1]))
print("final validation loss %.4f (f32 products) %.4f (bf16 products)" % tuple(loss))
sys.exit(0 if loss[0] != loss[1] and abs(loss[1] - loss[0]) < 8 * 2**-8 * loss[0] else 1)
PY
else
  grep -q "bf16_products" "$dir/train16--bf16-products.out" || { echo "FAIL: no bf16 products on this CPU, not refused by name"; fail=1; }
fi
# eval --bf16-products: the same split's mean loss moved by bf16 rounding only (and moved)
e16=()
for f in "" --bf16-products; do
  e16+=("$("$bin" eval --model "$dir/m16" "${tr[@]}" --split valid --threads 1 --json $f 2>&1)")
done
if "$bin" info | grep -q "cpu_bf16_products=1"; then
  python3 - "${e16[@]}" <<'PY' || { echo "FAIL: eval --bf16-products: ${e16[*]}"; fail=1; }
import json, sys
a, b = (json.loads(x)["mean_loss"] for x in sys.argv[1:])
sys.exit(0 if a != b and abs(a - b) < 8 * 2**-8 * a else 1)
PY
else
  grep -q "bf16_products" <<<"${e16[1]}" || { echo "FAIL: eval --bf16-products without them on this CPU not refused by name"; fail=1; }
fi
# generate --bf16-products: the prompt's prefill on bf16 products (20 tokens: past the decode path)
g16=$("$bin" generate --model "$dir/m16" --threads 1 --no-chat-template --max-tokens 4 --bf16-products \
  --prompt "record 1: the quick brown fox jumps over the lazy dog record 2: the quick" 2>&1)
if "$bin" info | grep -q "cpu_bf16_products=1"; then
  [ -n "$g16" ] && ! grep -qi "error" <<<"$g16" || { echo "FAIL: generate --bf16-products: $g16"; fail=1; }
else
  grep -q "bf16_products" <<<"$g16" || { echo "FAIL: generate --bf16-products without them on this CPU not refused by name"; fail=1; }
fi
# the plan is exact for a model this small too: its step holds less than reading the data does,
# so the run's host high-water is that of the loading, and `plan --data` predicts it to the byte
"$bin" plan --model "$dir/m16" "${tr[@]}" --threads 1 --json >"$dir/plan16.json" 2>"$dir/plan16.err" ||
  { echo "FAIL: plan --data: $(cat "$dir/plan16.err")"; fail=1; }
python3 - "$dir/ad16/metrics.jsonl" "$dir/plan16.json" <<'PY' || fail=1
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
plan = json.load(open(sys.argv[2]))
ok = last["peak_bytes"] == last["plan_bytes"] == plan["peak_bytes"] == plan["held_parts"]["load_peak"]
ok = ok and plan["peak_bytes"] > sum(plan["classes"].values())
if not ok: print("FAIL: tiny run peak %d, its plan %d, plan --data %d (load_peak %d, classes %d)" % (
    last["peak_bytes"], last["plan_bytes"], plan["peak_bytes"], plan["held_parts"]["load_peak"], sum(plan["classes"].values())))
sys.exit(0 if ok else 1)
PY
expect 1 "test.jsonl\|not found\|No such" -- eval --model "$M" --data "$dir" --threads 1
expect 2 "split" -- eval --model "$M" --data "$dir/data" --split dev
# eval --text: a raw file in llama-perplexity's windows (the second half of each scored)
for i in $(seq 1 20); do echo "the quick brown fox jumps over the lazy dog $i"; done >"$dir/text.txt"
ev=$("$bin" eval --model "$M" --text "$dir/text.txt" --ctx 16 --threads 1 --json 2>"$dir/evt.err")
python3 - "$ev" <<'PY' || { echo "FAIL: eval --text: $ev / $(cat "$dir/evt.err")"; fail=1; }
import json, math, sys
e = json.loads(sys.argv[1])
w = e["text_tokens"] // 16
ok = e["windows"] == w and e["n_tokens"] == w * 7 and abs(e["ppl"] - math.exp(e["mean_loss"])) < 1e-4 * e["ppl"]
sys.exit(0 if ok else 1)
PY
expect 2 "--ctx goes with --text" -- eval --model "$M" --ctx 16
expect 2 "--text takes --ctx" -- eval --model "$M" --text "$dir/text.txt"
expect 2 "--text takes --ctx" -- eval --model "$M" --text "$dir/text.txt" --ctx 16 --data "$dir/data"
expect 1 "need at least" -- eval --model "$M" --text "$dir/text.txt" --ctx 4096 --threads 1
expect 1 "cannot open" -- eval --model "$M" --text "$dir/none.txt" --ctx 16 --threads 1

# an adapter holding a NaN is refused, naming the tensor
cp -r "$dir/ad" "$dir/ad_nan"
python3 - "$dir/ad_nan/adapter_model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
name = sorted(k for k in h if k != "__metadata__")[0]
off = 8 + n + h[name]["data_offsets"][0]
b[off:off + 4] = struct.pack("<f", float("nan"))
open(p, "wb").write(bytes(b))
print(name, file=sys.stderr)
PY
expect 1 "is nan (not finite)" -- "${g[@]}" --adapter "$dir/ad_nan" --prompt hi
expect 1 "lora_" -- eval --model "$M" --adapter "$dir/ad_nan" "${tr[@]}" --threads 1

# bench generate on the tiny model without a peer: longtune's two arms in the result file
"$bin" bench generate --model "$M" --threads 1 --pp 8 --tg 4 --repeats 1 --warmup 0 --llama-bench "$dir/none" \
  --out "$dir/bench" >"$dir/bench.out" 2>&1 || { echo "FAIL: bench generate: $(tail -3 "$dir/bench.out")"; fail=1; }
python3 - "$dir/bench/generate-cpu.json" <<'PY' || { echo "FAIL: bench generate result"; fail=1; }
import json, sys
r = json.load(open(sys.argv[1]))
names = [a["name"] for a in r["arms"]]
sys.exit(0 if names == ["longtune-pp", "longtune-tg"] and all(a["tokens_per_s"] > 0 for a in r["arms"]) else 1)
PY
exit $fail
