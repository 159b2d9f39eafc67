#!/usr/bin/env bash
# `longtune bench train` flag contract only (the bench itself takes minutes and loads 135M
# parameters, too slow for CI): --help prints the usage, malformed flags exit 2 naming the flag,
# a missing weights path is a clean error (exit 1) with nothing left behind.
set -u
bin="$1"
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench train --help >"$tmp/out" 2>&1 || say "--help: rc=$?"
grep -q "^usage: longtune bench train" "$tmp/out" || say "--help does not print the usage line"

for args in "--bogus" "--seq" "--seq 512,x" "--seq 1" "--rank 0" "--threads -1" "--backend cuda" "--repeats 0"; do
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

[ "$fail" -eq 0 ] && echo "ok"
exit "$fail"
