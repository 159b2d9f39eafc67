#!/usr/bin/env bash
# `longtune bench packed` flag contract, the token cache's validation (truncated, bad magic, ids
# outside the vocabulary are clean errors), and one tiny CPU run on a random tiny model over a
# synthetic cache: all three arms ran, counted real tokens only, and packing filled its rows.
set -u
bin="$1"
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench packed --help >"$tmp/out" 2>&1 || say "--help: rc=$?"
grep -q "^usage: longtune bench packed" "$tmp/out" || say "--help does not print the usage line"
for args in "--bogus" "--seq" "--seq 4" "--seconds 0" "--max-steps x" "--shape nope" "--weights q8" \
            "--model a --weights random-f32" "--threads 0" "--backend tpu"; do
  # shellcheck disable=SC2086
  "$bin" bench packed $args >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || say "'$args' exited $rc, want 2"
  grep -q "usage: longtune bench packed" "$tmp/out" || say "'$args' prints no usage"
done

# a cache of 40 sequences of 5..60 tokens with ids in [3, 500) (the tiny shape has V=512)
python3 - "$tmp/tok.bin" "$tmp/big.bin" "$tmp/trunc.bin" <<'PY'
import random, struct, sys
def cache(path, lens, vocab, pad=0):
    rng = random.Random(3)
    offs, toks, sup = [0], [], []
    for n in lens:
        toks += [rng.randrange(3, vocab) for _ in range(n)]
        sup += [0] * (n // 2) + [1] * (n - n // 2)
        offs.append(len(toks))
    b = b"LTTOKv1\0" + struct.pack("<QQii", len(lens), len(toks), pad, 0)
    b += struct.pack(f"<{len(offs)}q", *offs) + struct.pack(f"<{len(toks)}i", *toks) + bytes(sup)
    open(path, "wb").write(b)
    return b
lens = [5 + (7 * i) % 56 for i in range(40)]
cache(sys.argv[1], lens, 500)
cache(sys.argv[2], lens, 5000)
b = open(sys.argv[1], "rb").read()
open(sys.argv[3], "wb").write(b[:-7])
PY
export LONGTUNE_BENCH_WEIGHTS="$tmp/w"
common="--shape tiny --weights random-f32 --seq 64 --threads 1 --out $tmp/res"
# shellcheck disable=SC2086
"$bin" bench packed $common --tokens "$tmp/trunc.bin" >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "truncated" "$tmp/out" || say "a truncated cache is not a clean error: $(cat "$tmp/out")"
printf 'XXXXXXXX' >"$tmp/bad.bin"
# shellcheck disable=SC2086
"$bin" bench packed $common --tokens "$tmp/bad.bin" >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "not a longtune token cache" "$tmp/out" || say "a bad magic is not a clean error"
# shellcheck disable=SC2086
"$bin" bench packed $common --tokens "$tmp/big.bin" >"$tmp/out" 2>&1
[ $? -eq 1 ] && grep -q "outside the model's vocabulary" "$tmp/out" || say "out-of-vocabulary ids are not a clean error"

# shellcheck disable=SC2086
"$bin" bench packed $common --tokens "$tmp/tok.bin" --seconds 0.2 --max-steps 3 --no-peer >"$tmp/out" 2>&1 \
  || say "tiny run failed: $(tail -3 "$tmp/out")"
f="$tmp/res/packed-cpu-tiny-random-f32.json"
[ -f "$f" ] || say "no result $f"
if [ -f "$f" ]; then
  python3 - "$f" <<'PY' || say "tiny run result: $(head -c 1500 "$f")"
import json, sys
r = json.load(open(sys.argv[1]))
arms = {a["name"]: a for a in r["arms"]}
assert set(arms) == {"packed", "unpacked-b1", "padded-b8"}, arms.keys()
for a in arms.values():
    assert 1 <= a["steps"] <= 3 and a["real_tokens_per_s"] > 0
    assert 0 < a["real_tokens"] <= a["computed_tokens"]
assert arms["unpacked-b1"]["real_tokens"] == arms["unpacked-b1"]["computed_tokens"]  # no padding at batch 1
assert arms["packed"]["plan_seqs_per_row"] > 1.5, arms["packed"]
assert abs(arms["unpacked-b1"]["speedup_vs_unpacked_b1"] - 1) < 1e-12
assert r["config"]["sequences"] == 40
PY
fi

# The peers train the same batches (transformers + PEFT on the CPU here; --no-liger: Liger needs a
# GPU). Only where python3 imports torch, transformers and peft.
if python3 -c "import torch, transformers, peft" 2>/dev/null; then
  export TMPDIR="$tmp"
  # shellcheck disable=SC2086
  "$bin" bench packed $common --tokens "$tmp/tok.bin" --seconds 60 --max-steps 2 --no-liger \
    --out "$tmp/peer" >"$tmp/out" 2>&1 || say "peer run failed: $(tail -5 "$tmp/out")"
  ls "$tmp"/longtune-packed-* >/dev/null 2>&1 && say "the peer's batches file was left behind"
  python3 - "$tmp/peer/packed-cpu-tiny-random-f32.json" <<'PY' || say "peer run result: $(tail -5 "$tmp/out")"
import json, sys
r = json.load(open(sys.argv[1]))
arms = {a["name"]: a for a in r["arms"]}
assert r["config"]["peer"]["packing_check"]["isolated"] is True, r["config"]["peer"]
for k in ("packed", "unpacked-b1", "padded-b8"):
    ours, peer = arms[k], arms["torch-peft-" + k]
    assert peer["steps"] == 2 and peer["real_tokens_per_s"] > 0, peer
    assert abs(peer["longtune_speedup"] - ours["real_tokens_per_s"] / peer["real_tokens_per_s"]) < 1e-9
    assert ours["peak_bytes"] > 0
    # the same batches in the same order: the same real tokens over the same two steps
    assert ours["steps"] == 2 and peer["real_tokens"] == ours["real_tokens"], (ours, peer)
assert r["packed_vs_best_peft_arm"] > 0
PY
else
  echo "peer run skipped: python3 cannot import torch, transformers and peft"
fi
[ "$fail" -eq 0 ] && echo "ok"
exit "$fail"
