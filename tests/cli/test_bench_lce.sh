#!/usr/bin/env bash
# `longtune bench lce`: flags are parsed (bad ones exit 2 with usage; the CPU arms' options and arms
# that --backend cuda has not are refused there, before any device is looked for, so in every
# build), and a tiny run writes a result JSON with the four arms (naive, chunked, fused, fused-fb)
# agreeing on the loss. Timings are not checked here.
set -u
bin="$1"
fail=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" bench lce --help | grep -q "usage: longtune bench lce" || { echo "FAIL: --help"; fail=1; }
"$bin" bench lce --shape 1,2 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: bad --shape not exit 2"; fail=1; }
"$bin" bench lce --hidden f64 >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: bad --hidden not exit 2"; fail=1; }
"$bin" bench lce --arms fused,fast >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: unknown arm not exit 2"; fail=1; }
for bad in "--arms naive" "--arms chunked,fused" "--threads 2" "--hidden bf16" "--head q4_0" "--dw"; do
  # shellcheck disable=SC2086
  msg=$("$bin" bench lce --backend cuda $bad --out "$out" 2>&1 >/dev/null)
  [ $? = 2 ] || { echo "FAIL: --backend cuda $bad not exit 2"; fail=1; }
  echo "$msg" | grep -q "CPU options\|has the arms chunked and fused-fb" ||
    { echo "FAIL: --backend cuda $bad: message '$msg'"; fail=1; }
done
"$bin" bench lce --shape 37,300,64 --head q4_1 --repeats 1 --warmup 0 --out "$out" >/dev/null 2>&1 ||
  { echo "FAIL: tiny run"; fail=1; }
f="$out/lce-custom-f32-q4_1.json"
[ -f "$f" ] || { echo "FAIL: no $f"; exit 1; }
python3 - "$f" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
names = [a["name"] for a in r["arms"]]
assert names == ["naive", "chunked", "fused", "fused-fb"], names
for a in r["arms"]:
    assert a["loss_rel_diff_vs_first_arm"] < 1e-5, a
    ws = a["workspace_bytes_fwd_bwd"] if a["name"] == "fused-fb" else a["workspace_bytes_bwd"]
    assert a["peak_bytes"] > 0 and a["peak_bytes"] >= ws, a
assert r["summary"]["fused_fb_extra_memory_fraction_of_naive"] > 0, r["summary"]  # tiny shape: fused may exceed naive
PY
exit $fail
