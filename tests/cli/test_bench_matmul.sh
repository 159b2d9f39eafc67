#!/usr/bin/env bash
# `longtune bench matmul`: flags are parsed (bad ones exit 2 with usage), and a tiny CPU run writes
# a result JSON with one arm per dtype, mode and CPU dequantizer path (--isa; by default the one in
# use), plus the dequantizer-only arms. LONGTUNE_CPU_ISA and --isa values that are unknown or that
# the CPU lacks are errors naming the value. Timings are not checked here.
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
"$bin" bench matmul --isa avx3 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: unknown --isa not exit 2"; fail=1; }
msg=$(LONGTUNE_CPU_ISA=avx3 "$bin" bench matmul --shapes 96x64 --out "$out" 2>&1); rc=$?
[ $rc = 2 ] && echo "$msg" | grep -q "LONGTUNE_CPU_ISA=avx3: unknown path" ||
  { echo "FAIL: unknown LONGTUNE_CPU_ISA not refused ($rc): $msg"; fail=1; }
if ! grep -qw avx512bw /proc/cpuinfo 2>/dev/null; then
  msg=$(LONGTUNE_CPU_ISA=avx512 "$bin" bench matmul --shapes 96x64 --out "$out" 2>&1); rc=$?
  [ $rc = 2 ] && echo "$msg" | grep -q "LONGTUNE_CPU_ISA=avx512: the CPU lacks" ||
    { echo "FAIL: LONGTUNE_CPU_ISA=avx512 without AVX-512 not refused ($rc): $msg"; fail=1; }
fi
"$bin" bench matmul --n 9 --shapes 96x64 --dtypes bf16,q4_0 --repeats 1 --warmup 0 --out "$out" >/dev/null 2>&1 ||
  { echo "FAIL: tiny run"; fail=1; }
f="$out/matmul-cpu.json"
[ -f "$f" ] || { echo "FAIL: no $f"; exit 1; }
python3 - "$f" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
names = [a["name"] for a in r["arms"]]
isa = r["config"]["isa"]
assert len(isa) == 1 and isa[0] in ("scalar", "avx2", "avx512"), isa
i = isa[0]
assert names == [f"bf16-nt-96x64-{i}", f"dequant-bf16-96x64-{i}", f"q4_0-nt-96x64-{i}", f"dequant-q4_0-96x64-{i}",
                 f"bf16-nn-96x64-{i}", f"q4_0-nn-96x64-{i}",
                 "gemm-f32-lora-fwd", "gemm-f32-lora-dA", "gemm-f32-lora-dB", "gemm-f32-lora-dx"], names
for a in r["arms"]:
    assert a["median_ms"] > 0 and (a.get("tflops", 1) > 0 and a.get("weights_per_ns", 1) > 0), a
PY
"$bin" bench matmul --n 9 --shapes 96x64 --dtypes f32,q8_0 --isa scalar,all --repeats 1 --warmup 0 --out "$out" \
  >/dev/null 2>&1 || { echo "FAIL: --isa scalar,all run"; fail=1; }
python3 - "$f" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
isa = r["config"]["isa"]
assert isa[0] == "scalar" and len(set(isa)) == len(isa), isa
nt = [a for a in r["arms"] if a["name"].startswith("q8_0-nt-")]
assert [a["isa"] for a in nt] == isa, nt
assert all(a["vs_f32"] > 0 for a in nt), nt
assert sum(a["name"].startswith("f32-nt-") for a in r["arms"]) == 1
PY
exit $fail
