#!/usr/bin/env bash
# `longtune plan` against the real SmolLM2-135M config.json and a tiny Qwen3 one: the JSON object's
# fields agree with each other and with the budget, --max-seq / --max-batch find the exact edge
# (the answer fits, one more does not), the naive arms cost more, rerunning attention, bf16 saving
# and smaller chunks keep less, train's flags (and its options file) mean what they mean in train
# with the old names as aliases, and bad flags exit 2.
set -u
bin="$1"
src="${LONGTUNE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
smol="$src/tests/fixtures/plan/smollm2-135m-config.json"
qwen="$src/tests/fixtures/plan/qwen3-tiny-config.json"
command -v python3 >/dev/null || { echo "skipped: python3 not found (used to read JSON)"; exit 77; }
fail=0
say() { echo "FAIL: $*"; fail=1; }

# field FILE KEY: prints a top-level field of the JSON object in FILE ("None" when null).
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))' "$1" "$2"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. The object is consistent: peak = sum of classes; fits = peak <= budget; naive arms >= peak.
for args in "--seq-len 2048 --batch 2" "--seq-len 8192 --recompute all" "--seq-len 1000 --recompute every:3 --attention naive --loss naive"; do
  for cfg in "$smol" "$qwen"; do
    # shellcheck disable=SC2086
    if ! "$bin" plan --config "$cfg" $args --budget 64G --json >"$tmp/p.json" 2>"$tmp/err"; then
      say "plan --config $cfg $args: rc=$? $(cat "$tmp/err")"; continue
    fi
    python3 - "$tmp/p.json" <<'EOF' || fail=1
import json, sys
p = json.load(open(sys.argv[1]))
cls = p["classes"]
want = {"frozen_weights", "lora_params", "lora_grads", "activations", "transients", "workspace", "optimizer_state", "held"}
assert set(cls) == want, cls
assert p["peak_bytes"] == sum(cls.values()), p
assert p["budget_bytes"] == 64 * 2**30, p
assert p["fits"] == (p["peak_bytes"] <= p["budget_bytes"]), p
assert p["budget_source"] == "given"
assert cls["held"] > 0 and not p["data_counted"], p  # the trainer's buffers; no --data
assert all(v > 0 for k, v in cls.items() if k != "activations"), cls
for k, v in p["naive_arms"].items():  # rows of >= 1000 tokens: the naive paths never cost less
    assert v is not None and v >= p["peak_bytes"], (k, v, p["peak_bytes"])
EOF
  done
done

# SmolLM2 at 8192 tokens: the naive loss holds the (T, V) fp32 logits (1.5 GiB) where the fused
# loss held only its tiles (at most the whole workspace class).
"$bin" plan --config "$smol" --seq-len 8192 --budget 64G --json >"$tmp/s.json" || say "smollm2 8192"
python3 - "$tmp/s.json" <<'EOF' || fail=1
import json, sys
p = json.load(open(sys.argv[1]))
assert p["naive_arms"]["naive_loss"] >= p["peak_bytes"] + 8192 * 49152 * 4 - p["classes"]["workspace"], p
assert p["naive_arms"]["naive_attention"] > p["peak_bytes"], p
EOF

# 2. Fits / does not fit flips with the budget.
"$bin" plan --config "$qwen" --budget 1M --json >"$tmp/small.json" || say "budget 1M rc"
[ "$(field "$tmp/small.json" fits)" = "False" ] || say "1 MiB budget should not fit"

# 3. The searched maximum is the exact edge.
for what in seq batch; do
  if [ $what = seq ]; then key=max_seq_len; flag=--seq-len; fixed="--batch 1"; else key=max_batch; flag=--batch; fixed="--seq-len 512"; fi
  "$bin" plan --config "$smol" --seq-len 512 $fixed --budget 1500M --max-$what --json >"$tmp/m.json" || { say "--max-$what rc"; continue; }
  best=$(field "$tmp/m.json" $key)
  case "$best" in ''|None|*[!0-9]*) say "--max-$what gave '$best'"; continue;; esac
  "$bin" plan --config "$smol" $fixed $flag "$best" --budget 1500M --json >"$tmp/a.json"
  "$bin" plan --config "$smol" $fixed $flag $((best + 1)) --budget 1500M --json >"$tmp/b.json"
  [ "$(field "$tmp/a.json" fits)" = "True" ] || say "--max-$what $best does not fit"
  [ "$(field "$tmp/b.json" fits)" = "False" ] || say "--max-$what $((best + 1)) fits too"
done
"$bin" plan --config "$smol" --budget 1K --max-seq --json >"$tmp/none.json" || say "--max-seq tiny budget rc"
[ "$(field "$tmp/none.json" max_seq_len)" = "None" ] || say "nothing should fit 1 KiB"

# 4. The table form names every class, the peak and the verdict; auto budget measures the host.
out=$("$bin" plan --config "$smol" --seq-len 4096 2>&1) || say "text mode rc: $out"
for w in frozen_weights lora_params optimizer_state workspace peak "budget:" "auto:" "fits:" naive_loss; do
  grep -q -- "$w" <<<"$out" || say "text output lacks '$w': $out"
done

# 5. What the backward keeps: rerunning attention keeps less than keeping its outputs; bf16 saving
#    less than f32; smaller chunks of the position-wise work never more.
peak() { "$bin" plan --config "$smol" --seq-len 4096 --recompute all --budget 64G --json "$@" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_bytes"])'; }
kept=$(peak --saved f32) rerun=$(peak --saved f32 --recompute-attention) half=$(peak --saved bf16 --recompute-attention)
small=$(peak --saved bf16 --recompute-attention --chunk-rows 512)
[ "$rerun" -lt "$kept" ] || say "--recompute-attention: $rerun not below $kept"
part=$(peak --saved f32 --recompute-attention-layers 15) all30=$(peak --saved f32 --recompute-attention-layers 30)
[ "$rerun" -lt "$part" ] && [ "$part" -lt "$kept" ] || say "--recompute-attention-layers 15: $part not between $rerun and $kept"
[ "$all30" = "$rerun" ] || say "--recompute-attention-layers 30 (every layer of 30): $all30, not $rerun"
# the table says what the step does: more layers than are recomputed rerun it in all of them
kept_line() { "$bin" plan --config "$smol" --seq-len 4096 --recompute all --budget 64G "$@" | grep "^kept for the backward"; }
[ "$(kept_line --recompute-attention-layers 45)" = "$(kept_line --recompute-attention)" ] ||
  say "--recompute-attention-layers 45 of 30: $(kept_line --recompute-attention-layers 45)"
grep -q "rerun in 15 of the recomputed layers" <<<"$(kept_line --recompute-attention-layers 15)" ||
  say "--recompute-attention-layers 15: $(kept_line --recompute-attention-layers 15)"
[ "$half" -lt "$rerun" ] || say "--saved bf16: $half not below $rerun"
[ "$small" -lt "$half" ] || say "--chunk-rows 512: $small not below $half"

# 6. Checkpoint offload: on the CPU the host block is inside the peak (nothing is saved there); a
#    CUDA plan (when this build has the backend; no device needed) moves n_ckpt - 2 of SmolLM2's 30
#    checkpoints off the device and checks them against the host budget on their own.
"$bin" plan --config "$qwen" --seq-len 4096 --recompute all --offload-checkpoints --budget 64G --json >"$tmp/o.json" ||
  say "--offload-checkpoints rc"
python3 - "$tmp/o.json" <<'EOF' || fail=1
import json, sys
p = json.load(open(sys.argv[1]))
assert p["offload_checkpoints"] is True and p["host_offload_bytes"] > 0, p
assert p["peak_bytes"] == sum(p["classes"].values()) and p["classes"]["activations"] >= p["host_offload_bytes"], p
EOF
"$bin" plan --config "$qwen" --offload-checkpoints --budget 64G >/dev/null 2>"$tmp/e"
[ $? = 2 ] && grep -q recompute "$tmp/e" || say "offload without recompute: $(cat "$tmp/e")"
if "$bin" plan --config "$smol" --backend cuda --budget 64G --json >/dev/null 2>&1; then
  cu() { "$bin" plan --config "$smol" --backend cuda --batch 1 --seq-len 8192 --recompute all --budget 64G --json "$@"; }
  cu >"$tmp/c0.json" && cu --offload-checkpoints --host-budget 64G >"$tmp/c1.json" || say "cuda offload plan rc"
  python3 - "$tmp/c0.json" "$tmp/c1.json" <<'EOF' || fail=1
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
ck = 8192 * 576 * 2  # one bf16 checkpoint of SmolLM2 (C = 576), a multiple of 256
assert b["host_offload_bytes"] == 28 * ck, b  # 30 layers: 28 leave the device
assert a["peak_bytes"] - b["peak_bytes"] == 28 * ck, (a["peak_bytes"], b["peak_bytes"])
assert b["fits"] and b["fits_host"] and b["host_budget_bytes"] == 64 * 2**30, b
EOF
  out=$("$bin" plan --config "$smol" --backend cuda --batch 1 --seq-len 8192 --recompute all --offload-checkpoints --budget 64G --host-budget 1M 2>&1)
  grep -q "will not fit in host memory" <<<"$out" || say "host verdict missing: $out"
  grep -q "^fits: on the device" <<<"$out" || say "device verdict with a host miss: $out"
  "$bin" plan --config "$smol" --backend cuda --batch 1 --recompute all --offload-checkpoints --budget 64G --host-budget 1G --max-seq --json >"$tmp/m.json" ||
    say "cuda --max-seq with a host budget rc"
  best=$(field "$tmp/m.json" max_seq_len)
  [ "$best" -lt $((2**30 / (28 * 576 * 2) + 1)) ] 2>/dev/null || say "host budget did not bound --max-seq: $best"
fi

# 7. Train's flags mean what they mean in train: the old names are aliases, train's defaults
#    apply (batch 4), flags that change no memory are accepted, train's options file is read.
pk() { "$bin" plan --config "$smol" --budget 64G --json "$@" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_bytes"])'; }
a=$(pk --seq-len 512 --batch 2 --lora-layers 3 --backend cpu)
b=$(pk --max-seq-length 512 --batch-size 2 --num-layers 3 --device cpu)
c=$(pk --max-seq-length=512 --batch-size=2 --num-layers=3 --learning-rate 1e-4 --iters 5 --adapter-path "$tmp/x" \
       --seed 3 --lr-schedule cosine --steps-per-report 1 --train)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$b" = "$c" ] || say "aliases / train flags disagree: $a $b $c"
[ "$(pk --seq-len 512)" = "$(pk --seq-len 512 --batch-size 4)" ] || say "the default batch is not train's (4)"
[ "$(pk --seq-len 512 --grad-checkpoint)" = "$(pk --seq-len 512 --recompute all)" ] || say "--grad-checkpoint is not --recompute all"
[ "$(pk --seq-len 512 --grad-accum 8)" -gt "$(pk --seq-len 512)" ] || say "--grad-accum does not count its loss sums"
echo '{"max_seq_length": 512, "batch_size": 2, "num_layers": 3}' >"$tmp/opts.json"
[ "$(pk --config "$tmp/opts.json")" = "$a" ] || say "train's --config options file is not read"
# 8. --recompute auto: with a budget at a policy's own peak, plan shows that policy (or one of
#    less recompute work that also fits); none when everything fits; no fit is "fits": false.
pa() { "$bin" plan --config "$smol" --seq-len 2048 --json "$@" | python3 -c 'import json,sys; p=json.load(sys.stdin); print(p["peak_bytes"], p["recompute"], p["fits"])' 2>/dev/null; }
none=$(pk --seq-len 2048); all=$(pk --seq-len 2048 --recompute all)
[ "$(pa --recompute auto --budget 64G | cut -d' ' -f1)" = "$none" ] || say "auto with room is not recompute none"
read -r ap ar af <<<"$(pa --recompute auto --budget "$all")"
[ "$ap" = "$all" ] && [ "$af" = "True" ] || say "auto at recompute all's own peak: $ap $ar $af (want $all)"
read -r ap ar af <<<"$(pa --recompute auto --budget 1M)"
[ "$af" = "False" ] || say "auto with no room says it fits: $ap $ar $af"
"$bin" plan --config "$smol" --seq-len 2048 --recompute auto --budget 1M 2>&1 | grep -q "no policy fits" || say "auto without a fit names no reason"
# --max-seq under auto: the longest length one of auto's policies fits, at least every fixed
# policy's own answer, with the policy it takes there (which fits at that length and not one past)
ms() { "$bin" plan --config "$smol" --budget "$all" --json --max-seq "$@" | python3 -c 'import json,sys; p=json.load(sys.stdin); print(p["max_seq_len"], p.get("recompute_at_max", "-"))'; }
read -r m_auto m_pol <<<"$(ms --recompute auto)"
read -r m_none _ <<<"$(ms --recompute none)"
read -r m_all _ <<<"$(ms --recompute all)"
read -r m_e2 _ <<<"$(ms --recompute every:2)"
for m in "$m_none" "$m_all" "$m_e2"; do
  [ "$m_auto" -ge "$m" ] 2>/dev/null || say "auto's longest $m_auto below a fixed policy's $m"
done
[ "$m_auto" -gt "$m_none" ] 2>/dev/null || say "auto's longest $m_auto is recompute none's $m_none"
# (the policy named as "every:2 + recompute_attention, chunks of 1024 rows" or "all + attention rerun in
# 12 layers": each part optional)
pol=${m_pol%% + *}; pol=${pol%%, chunks*}
[ -n "$pol" ] && [ "$pol" != "-" ] || say "auto's --max-seq names no policy"
ra=(); case "$m_pol" in *"+ recompute_attention"*) ra=(--recompute-attention) ;; esac
case "$m_pol" in *"+ attention rerun in "*) n=${m_pol##*rerun in }; ra=(--recompute-attention-layers "${n%% layer*}") ;; esac
case "$m_pol" in *", chunks of "*) n=${m_pol##*chunks of }; ra+=(--chunk-rows "${n%% rows*}") ;; esac
fit_at() { "$bin" plan --config "$smol" --budget "$all" --json --seq-len "$1" --recompute "$pol" "${ra[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["fits"])'; }
[ "$(fit_at "$m_auto")" = "True" ] || say "auto's policy $m_pol does not fit at its longest $m_auto"
"$bin" plan --config "$smol" --budget "$all" --max-seq --recompute auto | grep -q "recompute auto takes" || say "the table form names no policy at the longest length"
expect() { local want=$1; shift; "$bin" plan "$@" >/dev/null 2>"$tmp/e"; rc=$?; [ $rc = "$want" ] || say "plan $* -> $rc (want $want): $(cat "$tmp/e")"; }
expect 2 --config "$smol" --data "$tmp"
expect 2 --config "$smol" --max-seq-length 1
expect 2 --config "$smol" --no-such-flag

# 8. Usage errors exit 2; a missing file is a failure (1) naming it.
expect 2
expect 2 --config "$smol" --model x
expect 2 --config "$smol" --max-seq --max-batch
expect 2 --config "$smol" --budget lots
expect 2 --config "$smol" --recompute sometimes
expect 2 --config "$smol" --batch 0
expect 2 --config "$smol" --attention fast
expect 2 --config "$smol" --saved f16
expect 2 --config "$smol" --chunk-rows 0
expect 2 --config "$smol" --host-budget lots
expect 1 --config "$tmp/no-such-config.json"
grep -q "no-such-config" "$tmp/e" || say "missing config not named: $(cat "$tmp/e")"
exit $fail
