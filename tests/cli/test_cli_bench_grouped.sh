#!/usr/bin/env bash
# `longtune bench grouped` flag contract, and on a CUDA device one small run whose result JSON has
# the bench's shape: every dtype and product timed once against its per-expert cuBLASLt peer, with
# positive medians, TFLOP/s and ratios and the host setup recorded. Without a device (or a build
# without CUDA) the run is a clean error (exit 1) and the test reports skipped (77) after the flags.
set -u
bin="$1"
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench grouped --help >"$tmp/out" 2>&1 || say "--help: rc=$?"
grep -q "^usage: longtune bench grouped" "$tmp/out" || say "--help does not print the usage line"
for args in "--bogus" "--n" "--n 0" "--n x" "--dtypes" "--dtypes f64" "--dtypes i32" "--dtypes bf16,,nope" \
            "--repeats 0" "--warmup -1" "--backend tpu"; do
  # shellcheck disable=SC2086
  "$bin" bench grouped $args >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || say "'$args' exited $rc, want 2"
  grep -q "usage: longtune bench grouped" "$tmp/out" || say "'$args' prints no usage"
done

if "$bin" info 2>/dev/null | grep -q -e "^cuda: no device" -e "^cuda: not built"; then
  "$bin" bench grouped --backend cuda --out "$tmp/res" >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 1 ] || say "--backend cuda without a device exited $rc, want 1"
  grep -q -e "no CUDA device" -e "no CUDA backend" "$tmp/out" || say "--backend cuda: no clear message"
  [ -e "$tmp/res" ] && say "a run without a device wrote $(ls "$tmp/res")"
  [ "$fail" -eq 0 ] || exit 1
  echo "flags ok; skipped: the JSON check of bench grouped needs a CUDA device"
  exit 77
fi

"$bin" bench grouped --backend cuda --n 512 --dtypes bf16,q4_k,iq4_xs --repeats 2 --warmup 0 \
  --out "$tmp/res" >"$tmp/out" 2>&1 || say "small run failed: $(tail -3 "$tmp/out")"
f="$tmp/res/grouped-cuda.json"
[ -f "$f" ] || say "the small run wrote no $f"
if [ -f "$f" ]; then
  python3 - "$f" <<'PY' || say "result has the wrong shape: $(head -c 800 "$f")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "grouped" and r["commit"] and r["machine"]["gpu"], r.get("machine")
cfg = r["config"]
assert cfg["n"] == 512 and cfg["repeats"] == 2 and cfg["warmup"] == 0, cfg
assert 0 <= cfg["setup_s"] <= cfg["total_s"], cfg
prods = ["gate_up_fwd", "gate_up_bwd", "down_fwd", "down_bwd"]
names = [a["name"] for a in r["arms"]]
want = ["cublaslt-per-expert-" + p for p in prods]
want += ["grouped-%s-%s" % (d, p) for d in ["bf16", "q4_k", "iq4_xs"] for p in prods]
assert names == want, names
for a in r["arms"]:
    assert a["median_ms"] > 0 and a["tflops"] > 0, a
    assert a["product"] in prods, a
    if a["name"].startswith("grouped-"):
        assert a["name"] == "grouped-%s-%s" % (a["dtype"], a["product"]), a
        assert a["ratio_to_cublaslt_per_expert"] > 0 and a["tokens_per_s"] > 0, a
PY
fi
[ "$fail" -eq 0 ] && echo "ok"
exit "$fail"
