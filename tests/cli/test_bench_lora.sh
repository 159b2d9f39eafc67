#!/usr/bin/env bash
# `longtune bench lora`: flags are parsed (bad ones exit 2 with usage; a mixture-of-experts shape
# and an unknown backend are refused by name), and a tiny CPU run writes a result JSON with one arm
# per group and pass plus the layer sums, each with its time with adapters, without them, and the
# difference. Timings are not checked here.
set -u
bin="$1"
fail=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" bench lora --help | grep -q "usage: longtune bench lora" || { echo "FAIL: --help"; fail=1; }
for bad in "--rank 0" "--rank 65" "--n 0" "--shape qwen9" "--bogus 1"; do
  # shellcheck disable=SC2086
  "$bin" bench lora $bad --out "$out" >/dev/null 2>&1; [ $? = 2 ] || { echo "FAIL: '$bad' not exit 2"; fail=1; }
done
msg=$("$bin" bench lora --shape tiny-moe --out "$out" 2>&1); rc=$?
[ $rc = 2 ] && echo "$msg" | grep -q "tiny-moe is a mixture of experts" ||
  { echo "FAIL: a mixture-of-experts shape not refused ($rc): $msg"; fail=1; }
msg=$("$bin" bench lora --backend tpu --out "$out" 2>&1); rc=$?
[ $rc = 2 ] && echo "$msg" | grep -q "'tpu' for --backend" || { echo "FAIL: unknown backend not refused ($rc): $msg"; fail=1; }
"$bin" bench lora --shape tiny --n 17 --rank 4 --repeats 2 --warmup 0 --out "$out" >/dev/null 2>&1 ||
  { echo "FAIL: tiny run"; fail=1; }
f="$out/lora-cpu-tiny.json"
[ -f "$f" ] || { echo "FAIL: no $f"; exit 1; }
python3 - "$f" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
c = r["config"]
assert (c["backend"], c["shape"], c["n"], c["rank"], c["repeats"]) == ("cpu", "tiny", 17, 4, 2), c
names = [a["name"] for a in r["arms"]]
assert names == ["qkv-fwd", "qkv-bwd", "gate_up-fwd", "gate_up-bwd", "o-fwd", "o-bwd", "down-fwd", "down-bwd",
                 "layer-fwd", "layer-bwd"], names
for a in r["arms"]:
    assert a["median_ms"] > 0 and a["base_ms"] > 0, a
    assert abs(a["lora_ms"] - (a["median_ms"] - a["base_ms"])) < 1e-9, a
groups = {a["name"]: a for a in r["arms"]}
assert len(groups["qkv-fwd"]["out"]) == 3 and len(groups["gate_up-bwd"]["out"]) == 2, groups
for p in ("fwd", "bwd"):
    s = sum(groups[g + "-" + p]["median_ms"] for g in ("qkv", "gate_up", "o", "down"))
    assert abs(groups["layer-" + p]["median_ms"] - s) < 1e-9, p
PY
exit $fail
