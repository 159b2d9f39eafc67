#!/usr/bin/env bash
# `longtune bench moe` flag contract and one tiny CPU run: --help prints the usage, malformed flags
# and dense shapes exit 2, --backend cuda without a device is a clean error (exit 1); the tiny
# Qwen3-MoE run (tiny-moe shape, a random checkpoint in the per-expert layout) writes its result
# with every timed point planned exactly (plan == the allocator's peak), the unchunked dispatch
# holding more than 64-token chunks at T=512, and both ceilings searched to --max with a real step.
# A build whose model does not run Qwen3-MoE yet reports that in the result and the test skips (77).
set -u
bin="$1"
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench moe --help >"$tmp/out" 2>&1 || say "--help: rc=$?"
grep -q "^usage: longtune bench moe" "$tmp/out" || say "--help does not print the usage line"
for args in "--bogus" "--seq" "--seq 0" "--seq 8,x" "--max 1" "--shape tiny" "--shape nope" "--weights q4" \
            "--moe-chunk-tokens 0" "--rank 0" "--backend tpu" "--peer-max -5"; do
  # shellcheck disable=SC2086
  "$bin" bench moe $args >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || say "'$args' exited $rc, want 2"
  grep -q "usage: longtune bench moe" "$tmp/out" || say "'$args' prints no usage"
done
if "$bin" info 2>/dev/null | grep -q -e "^cuda: no device" -e "^cuda: not built"; then
  "$bin" bench moe --backend cuda --no-peer --out "$tmp/res" >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 1 ] || say "--backend cuda without a device exited $rc, want 1"
  grep -q "no CUDA device" "$tmp/out" || say "--backend cuda: no clear message"
fi

LONGTUNE_BENCH_WEIGHTS="$tmp/w" "$bin" bench moe --shape tiny-moe --seq 256,512 --moe-chunk-tokens 64 --max 1024 \
  --repeats 1 --warmup 0 --threads 1 --out "$tmp/res" >"$tmp/out" 2>&1
rc=$?
f="$tmp/res/moe-cpu-tiny-moe.json"
[ -f "$f" ] || say "tiny run wrote no $f (rc $rc): $(tail -3 "$tmp/out")"
grep -q '"model_type": "qwen3_moe"' "$tmp/w/tiny-moe-f32/config.json" 2>/dev/null ||
  say "the random checkpoint's config.json is not a qwen3_moe one"
# the experts per expert, as transformers' save_pretrained writes them (E=8, moe_F=32, C=64)
python3 - "$tmp/w/tiny-moe-f32/model.safetensors" <<'PY' || say "the random checkpoint's tensors are not the per-expert layout"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
for l in range(2):
    assert h[f"model.layers.{l}.mlp.gate.weight"]["shape"] == [8, 64]
    for e in range(8):
        assert h[f"model.layers.{l}.mlp.experts.{e}.gate_proj.weight"]["shape"] == [32, 64]
        assert h[f"model.layers.{l}.mlp.experts.{e}.up_proj.weight"]["shape"] == [32, 64]
        assert h[f"model.layers.{l}.mlp.experts.{e}.down_proj.weight"]["shape"] == [64, 32]
assert not any(k.endswith("mlp.gate_proj.weight") for k in h)
assert len([k for k in h if k != "__metadata__"]) == 3 + 2 * (8 + 1 + 3 * 8)
PY
if [ -f "$f" ] && [ "$rc" -ne 0 ] && grep -q 'model_type \\"qwen3_moe\\" is not supported' "$f"; then
  [ "$rc" -eq 1 ] || say "a refused model exited $rc, want 1"
  [ "$fail" -eq 0 ] && echo "skipped: this build's model does not run Qwen3-MoE"
  [ "$fail" -eq 0 ] && exit 77
  exit 1
fi
[ "$rc" -eq 0 ] || say "tiny run failed (rc $rc): $(tail -3 "$tmp/out")"
if [ -f "$f" ]; then
  python3 - "$f" <<'PY' || say "tiny run result inconsistent: $(head -c 1500 "$f")"
import json, math, sys
r = json.load(open(sys.argv[1]))
arms = {a["name"]: a for a in r["arms"]}
ch, un = arms["longtune-chunked"], arms["longtune-unchunked"]
for a in (ch, un):
    assert "error" not in a, a["error"]
    pts = a["points"]
    assert [p["T"] for p in pts] == [256, 512], pts
    for p in pts:
        assert p["ok"] and p["median_ms"] > 0 and p["tokens_per_s"] > 0 and math.isfinite(p["loss"]), p
        assert p["plan_bytes"] == p["peak_bytes"], p
    c = a["ceiling"]
    assert c["candidates"] == [256, 384, 512, 768, 1024], c
    assert c["alloc_ceiling_T"] == 1024 and c["search_capped"] and c["step_confirmed_T"] == 1024, c
    assert c["plan_max_T"] == 1024, c
assert [p["moe_chunk_tokens"] for p in ch["points"]] == [64, 64]
assert [p["moe_chunk_tokens"] for p in un["points"]] == [256, 512]
assert un["points"][1]["peak_bytes"] > ch["points"][1]["peak_bytes"], (un["points"][1], ch["points"][1])
cmp = {q["T"]: q for q in r["comparison"]}
assert cmp[512]["unchunked_minus_chunked_peak_bytes"] > 0, cmp
PY
fi
[ "$fail" -eq 0 ] && echo "ok"
exit "$fail"
