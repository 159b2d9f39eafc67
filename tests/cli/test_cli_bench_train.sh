#!/usr/bin/env bash
# `longtune bench train` flag contract (the real shapes take minutes, too slow for CI): --help
# prints the usage, malformed flags exit 2, a missing weights path is a clean error (exit 1) with
# nothing left behind, --backend cuda without a device is a clean error; and one tiny CPU run
# whose result file has the planner equal to the measured high-water.
set -u
bin="$1"
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench train --help >"$tmp/out" 2>&1 || say "--help: rc=$?"
grep -q "^usage: longtune bench train" "$tmp/out" || say "--help does not print the usage line"

for args in "--bogus" "--seq" "--seq 512,x" "--seq 1" "--rank 0" "--threads -1" "--backend gpu" "--repeats 0" "--shape nope" "--seq 64," \
            "--recompute sometimes" "--recompute global" "--recompute none --recompute-attention 1" "--recompute none --recompute-attention-layers 2" \
            "--recompute-attention 1 --recompute-attention-layers 2" "--recompute-attention-layers -1" "--chunk-rows 0" \
            "--fp8-skip down"; do
  # shellcheck disable=SC2086
  "$bin" bench train $args >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || say "'$args' exited $rc, want 2"
  grep -q "usage: longtune bench train" "$tmp/out" || say "'$args' prints no usage"
done

"$bin" bench train --weights "$tmp/no-such-model" --no-peer --threads 1 --out "$tmp/res" >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || say "missing weights exited $rc, want 1"
grep -q "no-such-model" "$tmp/out" || say "missing weights: the message does not name the path: $(cat "$tmp/out")"
[ ! -e "$tmp/res" ] || say "a failed run wrote a result"

if "$bin" info 2>/dev/null | grep -q -e "^cuda: no device" -e "^cuda: not built"; then
  "$bin" bench train --backend cuda --no-peer --out "$tmp/res" >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 1 ] || say "--backend cuda without a device exited $rc, want 1"
  grep -q "no CUDA device" "$tmp/out" || say "--backend cuda: no clear message: $(cat "$tmp/out")"
fi

LONGTUNE_BENCH_WEIGHTS="$tmp/w" "$bin" bench train --shape tiny --seq 32,64 --repeats 1 --warmup 1 --no-peer \
  --threads 1 --out "$tmp/res" >"$tmp/out" 2>&1 || say "tiny run failed: $(tail -3 "$tmp/out")"
f="$tmp/res/train-cpu-tiny-random-f32.json"
[ -f "$f" ] || say "tiny run wrote no $f"
[ -f "$tmp/w/tiny-f32/longtune-random" ] || say "the random checkpoint has no stamp"
if [ -f "$f" ]; then
  python3 - "$f" <<'PY' || say "tiny run result: $(cat "$f" | head -c 600)"
import json, sys
r = json.load(open(sys.argv[1]))
arms = [a for a in r["arms"] if a["name"].startswith("longtune-T")]
assert [a["T"] for a in arms] == [32, 64], arms
for a in arms:
    assert a["plan_bytes"] == a["peak_bytes"], (a["plan_bytes"], a["peak_bytes"])
    assert a["tokens_per_s"] > 0 and a["last_loss"] > 0
assert r["config"]["shape"] == "tiny" and r["config"]["memory_guard"] == "on"
assert "model_flops" in r["config"]["flops"]
PY
fi
# a second run reuses the checkpoint instead of rewriting it; it runs each length without and with
# checkpoint offload (--offload-both; the CPU runs the device's schedule between host blocks)
LONGTUNE_BENCH_WEIGHTS="$tmp/w" "$bin" bench train --shape tiny --seq 32 --repeats 1 --warmup 0 --no-peer \
  --threads 1 --offload-both --out "$tmp/res" >"$tmp/out" 2>&1 || say "second tiny run failed"
grep -q "reused from" "$tmp/out" || say "the second run did not reuse the checkpoint"
python3 - "$tmp/res/train-cpu-tiny-random-f32-offload-both.json" <<'PY' || say "offload arms: $(tail -3 "$tmp/out")"
import json, sys
r = json.load(open(sys.argv[1]))
arms = {a["name"]: a for a in r["arms"]}
assert set(arms) == {"longtune-T32", "longtune-offload-T32"}, arms
assert arms["longtune-offload-T32"]["offload_checkpoints"] and not arms["longtune-T32"]["offload_checkpoints"]
assert all(a["plan_bytes"] == a["peak_bytes"] for a in arms.values()), arms
PY
# without recompute (the peer then without checkpointing) and with every:2, each at a smaller chunk
# of the position-wise work: their own files, the plan still the high-water, no recompute FLOPs
# counted without recompute
for rcp in none every:2; do
  LONGTUNE_BENCH_WEIGHTS="$tmp/w" "$bin" bench train --shape tiny --seq 64 --repeats 1 --warmup 0 --no-peer \
    --threads 1 --recompute "$rcp" --chunk-rows 16 --out "$tmp/res" >"$tmp/out" 2>&1 || say "--recompute $rcp run failed: $(tail -3 "$tmp/out")"
done
python3 - "$tmp/res" <<'PY' || say "recompute arms inconsistent"
import json, sys, os
d = sys.argv[1]
base = json.load(open(os.path.join(d, "train-cpu-tiny-random-f32.json")))
none = json.load(open(os.path.join(d, "train-cpu-tiny-random-f32-norecompute-chunk16.json")))
e2 = json.load(open(os.path.join(d, "train-cpu-tiny-random-f32-every2-chunk16.json")))
assert none["config"]["recompute"] == "none" and e2["config"]["recompute"] == "every:2", (none["config"], e2["config"])
assert none["config"]["chunk_rows"] == 16 and base["config"]["chunk_rows"] == 8192
a0 = [a for a in base["arms"] if a["name"] == "longtune-T64"][0]
for r in (none, e2):
    a = [a for a in r["arms"] if a["name"] == "longtune-T64"][0]
    assert a["plan_bytes"] == a["peak_bytes"], a
n = [a for a in none["arms"] if a["name"] == "longtune-T64"][0]
assert n["hw_gflop"] == n["model_gflop"] and a0["hw_gflop"] > a0["model_gflop"], (n, a0)
PY
# an fp8 base with down left as written: its own file, named by the skipped projection, the plan
# still the high-water; a list naming no projection is refused
LONGTUNE_BENCH_WEIGHTS="$tmp/w" "$bin" bench train --shape tiny --seq 32 --repeats 1 --warmup 0 --no-peer \
  --threads 1 --base-dtype fp8 --fp8-skip down_proj --out "$tmp/res" >"$tmp/out" 2>&1 || say "fp8 run failed: $(tail -3 "$tmp/out")"
python3 - "$tmp/res/train-cpu-tiny-random-f32-fp8-skip-down.json" <<'PY' || say "fp8 arm: $(tail -3 "$tmp/out")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["config"]["base_dtype"].startswith("fp8") and r["config"]["fp8_skip"] == "down_proj", r["config"]
a = [a for a in r["arms"] if a["name"] == "longtune-T32"][0]
assert a["plan_bytes"] == a["peak_bytes"], a
PY
"$bin" bench train --base-dtype fp8 --fp8-skip lm_head --no-peer >"$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "option 'fp8_skip': 'lm_head' is not one of q,k,v,o,gate,up,down" "$tmp/out" ||
  say "--fp8-skip lm_head: rc=$rc, $(tail -1 "$tmp/out")"

[ "$fail" -eq 0 ] && echo "ok"
exit "$fail"
