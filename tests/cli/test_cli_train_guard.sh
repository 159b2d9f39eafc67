#!/usr/bin/env bash
# The memory guard's flags on `longtune train`: documented in --help, bad values are usage errors
# (2), and a ceiling below what the process already holds refuses to start (1) before any file is
# read, naming the ceiling.
set -u
bin="$1"
fail=0
say() { echo "FAIL: $*"; fail=1; }
"$bin" train --help | grep -q -- "--memory-ceiling" || say "train --help lacks --memory-ceiling"
"$bin" train --help | grep -q -- "--allow-low-memory" || say "train --help lacks --allow-low-memory"
for bad in "--memory-ceiling lots" "--memory-ceiling=0" "--memory-ceiling"; do
  # shellcheck disable=SC2086
  out=$("$bin" train --model m --data d $bad 2>&1); rc=$?
  [ $rc = 2 ] && grep -q "memory-ceiling" <<<"$out" || say "train $bad -> rc=$rc: $out"
done
out=$("$bin" train --model /nonexistent --data /nonexistent --memory-ceiling 1K 2>&1); rc=$?
[ $rc = 1 ] && grep -q "ceiling of 1024 bytes is below" <<<"$out" || say "tiny ceiling -> rc=$rc: $out"
# The guard's keys in a --config file: a bad size is a usage error naming the key; a good one is
# the ceiling (a flag wins), and what the process holds outside the allocator is said.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo '{"memory_ceiling": "12Q"}' >"$tmp/bad.json"
out=$("$bin" train --config "$tmp/bad.json" --model m --data d 2>&1); rc=$?
[ $rc = 2 ] && grep -q "option 'memory_ceiling' '12Q'" <<<"$out" || say "config memory_ceiling 12Q -> rc=$rc: $out"
echo '{"memory_ceiling": "1K"}' >"$tmp/tiny.json"
out=$("$bin" train --config "$tmp/tiny.json" --model /nonexistent --data /nonexistent 2>&1); rc=$?
[ $rc = 1 ] && grep -q "ceiling of 1024 bytes is below" <<<"$out" || say "config memory_ceiling 1K -> rc=$rc: $out"
out=$("$bin" train --config "$tmp/tiny.json" --memory-ceiling 64G --model /nonexistent --data /nonexistent 2>&1)
grep -q "memory ceiling 64.00 GiB (--memory-ceiling)" <<<"$out" || say "the flag does not win over the config: $out"
grep -q "held already outside the allocator" <<<"$out" || say "the ceiling's part outside the allocator is not said: $out"
exit $fail
