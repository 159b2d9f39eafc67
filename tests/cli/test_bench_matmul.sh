#!/usr/bin/env bash
# `longtune bench matmul`: flags are parsed (bad ones exit 2 with usage), and a tiny CPU run writes
# a result JSON with one arm per dtype and mode. Timings are not checked here.
set -u
bin="$1"
fail=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" bench matmul --help | grep -q "usage: longtune bench matmul" || { echo "FAIL: --help"; fail=1; }
"$bin" bench matmul --shapes 12 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: bad --shapes not exit 2"; fail=1; }
"$bin" bench matmul --dtypes f64 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: bad --dtypes not exit 2"; fail=1; }
"$bin" bench matmul --n 0 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: bad --n not exit 2"; fail=1; }
"$bin" bench matmul --bogus 1 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: unknown flag not exit 2"; fail=1; }
"$bin" bench matmul --n 9 --shapes 96x64 --dtypes bf16,q4_0 --repeats 1 --warmup 0 --out "$out" >/dev/null 2>&1 ||
  { echo "FAIL: tiny run"; fail=1; }
f="$out/matmul-cpu.json"
[ -f "$f" ] || { echo "FAIL: no $f"; exit 1; }
python3 - "$f" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
names = [a["name"] for a in r["arms"]]
assert names == ["bf16-nt-96x64", "q4_0-nt-96x64", "bf16-nn-96x64", "q4_0-nn-96x64",
                 "gemm-f32-lora-fwd", "gemm-f32-lora-dA", "gemm-f32-lora-dB", "gemm-f32-lora-dx"], names
for a in r["arms"]:
    assert a["median_ms"] > 0 and a["tflops"] > 0, a
PY
exit $fail
