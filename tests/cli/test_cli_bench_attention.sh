#!/usr/bin/env bash
# `longtune bench attention`: --help and bad flags follow the CLI contract, and a tiny run writes a
# result JSON with naive, flash and packed arms whose numbers are positive; --bf16-products adds a flash
# arm with bf16 products per T (and is refused with --backend cuda).
set -u
bin="$1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
"$bin" bench attention --help | grep -q "usage: longtune bench attention" || { echo "FAIL: --help"; fail=1; }
"$bin" bench attention --T 0 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: --T 0 should exit 2"; fail=1; }
"$bin" bench attention --nope >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: unknown flag should exit 2"; fail=1; }
# forced kernels: CUDA only, and only the names of the kernel table
"$bin" bench attention --kernel-bwd mma --T 64 --packed-T 0 >/dev/null 2>"$out/err"; rc=$?
{ [ $rc = 2 ] && grep -q "need --backend cuda" "$out/err"; } || { echo "FAIL: --kernel-bwd on the CPU should exit 2 (got $rc)"; fail=1; }
"$bin" bench attention --split 2 --T 64 --packed-T 0 >/dev/null 2>"$out/err"; rc=$?
{ [ $rc = 2 ] && grep -q "need --backend cuda" "$out/err"; } || { echo "FAIL: --split on the CPU should exit 2 (got $rc)"; fail=1; }
"$bin" bench attention --bwd-bn 96 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: --bwd-bn 96 should exit 2"; fail=1; }
"$bin" bench attention --backend cuda --kernel-dq sideways >/dev/null 2>"$out/err"; rc=$?
if grep -q "no CUDA backend" "$out/err"; then :; else
  { [ $rc = 2 ] && grep -q "got 'sideways'" "$out/err"; } || { echo "FAIL: an unknown dQ name should exit 2 naming it (got $rc)"; fail=1; }
fi
"$bin" bench attention --backend cuda --kernel-fwd sideways >/dev/null 2>"$out/err"; rc=$?
if grep -q "no CUDA backend" "$out/err"; then :; else
  { [ $rc = 2 ] && grep -q "got 'sideways'" "$out/err"; } || { echo "FAIL: an unknown kernel name should exit 2 naming it (got $rc)"; fail=1; }
fi
if ! "$bin" bench attention --T 64,128 --packed-T 256 --repeats 1 --warmup 0 --threads 1 --sgemm-n 128 --out "$out" 2>/dev/null; then
  echo "FAIL: tiny run"; fail=1
fi
f="$out/attention-cpu-f32.json"
python3 - "$f" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
names = [a["name"] for a in r["arms"]]
want = ["flash-T64", "naive-T64", "flash-T128", "naive-T128", "flash-causal-T256", "flash-packed-T256"]
assert names == want, names
for a in r["arms"]:
    assert a["fwd_ms"] > 0 and a["bwd_ms"] > 0 and a["fwdbwd_gflops"] > 0, a
    assert a["peak_bytes"] > 0, a
assert r["config"]["sgemm_gflops"] > 0
assert "packed_speedup_over_causal" in r["targets"]
PY
"$bin" bench attention --backend cuda --bf16-products >/dev/null 2>"$out/err"; rc=$?
{ [ $rc = 2 ] && grep -q "CPU option" "$out/err"; } || { echo "FAIL: --bf16-products with cuda should exit 2 (got $rc)"; fail=1; }
if ! "$bin" bench attention --T 64 --packed-T 0 --naive-max-T 0 --bf16-products --repeats 1 --warmup 0 --threads 1 \
  --sgemm-n 128 --out "$out" 2>/dev/null; then
  echo "FAIL: tiny --bf16-products run"; fail=1
fi
python3 - "$out/attention-cpu-f32-bf16-products.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
assert r["config"]["bf16_products"] is True
names = [a["name"] for a in r["arms"]]
assert names == ["flash-T64", "flash-bf16-products-T64"], names
assert [a["bf16_products"] for a in r["arms"]] == [False, True]
assert r["arms"][1]["speedup_over_f32_products"] > 0
PY
exit $fail
