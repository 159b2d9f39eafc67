#!/usr/bin/env bash
# `longtune bench --tier` (the community suite): --help, bad tiers and flags exit 2, --dry-run
# describes the machine and prints the plan with an estimate and runs nothing, the smoke tier runs
# its tiny benches and writes one suite file with every result, and scripts/fold_results.py turns
# it into a table row (and into README markers).
set -u
bin="$1"
src="${LONGTUNE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench --tier --help >"$tmp/out" 2>&1 || true
"$bin" bench suite --help >"$tmp/out" 2>&1 || say "suite --help: rc=$?"
grep -q "^usage: longtune bench --tier" "$tmp/out" || say "--help does not print the usage line"
for args in "--tier" "--tier nope" "--tier=huge" "--tier quick --bogus" "--tier quick --repeats 3" "--dry-run"; do
  # shellcheck disable=SC2086
  "$bin" bench $args >"$tmp/out" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || say "'bench $args' exited $rc, want 2"
done
"$bin" bench suite --dry-run >"$tmp/out" 2>&1; [ $? -eq 2 ] || say "suite without --tier is not a usage error"

for t in quick full; do
  "$bin" bench --tier "$t" --dry-run --out "$tmp/dry" >"$tmp/out" 2>&1 || say "--tier $t --dry-run failed"
  grep -q "^machine: " "$tmp/out" || say "$t: no machine line"
  grep -q "estimated total: " "$tmp/out" || say "$t: no estimate"
  grep -q "longtune bench train" "$tmp/out" || say "$t: the plan has no training bench"
done
[ ! -e "$tmp/dry" ] || say "--dry-run wrote files"

LONGTUNE_BENCH_WEIGHTS="$tmp/w" "$bin" bench --tier=smoke --out "$tmp/res" >"$tmp/out" 2>&1 || say "smoke tier failed: $(tail -5 "$tmp/out")"
f=$(ls "$tmp"/res/suite-smoke-*.json 2>/dev/null | head -1)
[ -n "$f" ] || say "no suite file"
if [ -n "$f" ]; then
  python3 - "$f" <<'PY' || say "suite file: $(head -c 600 "$f")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "suite" and r["config"]["tier"] == "smoke" and r["config"]["failed"] == 0
assert r["machine"]["cpu"] and r["commit"] and r["date"]
names = [a["result"]["bench"] for a in r["arms"]]
assert names[:3] == ["sgemm", "train", "context"], names
assert all(a["exit_status"] == 0 and a["seconds"] > 0 for a in r["arms"])
PY
  python3 "$src/scripts/fold_results.py" "$f" >"$tmp/table" || say "fold_results failed"
  grep -q "| smoke |" "$tmp/table" || say "no table row: $(cat "$tmp/table")"
  printf 'a\n<!-- community-results:begin -->\nold\n<!-- community-results:end -->\nb\n' >"$tmp/README.md"
  python3 "$src/scripts/fold_results.py" "$f" --readme "$tmp/README.md" >/dev/null || say "fold --readme failed"
  grep -q "| smoke |" "$tmp/README.md" && ! grep -q "^old$" "$tmp/README.md" || say "README markers not rewritten"
  python3 "$src/scripts/fold_results.py" "$tmp/res/suite-smoke-"*/train-*.json >/dev/null 2>&1 && say "a non-suite file was folded"
fi
[ "$fail" -eq 0 ] && echo "ok"
exit "$fail"
