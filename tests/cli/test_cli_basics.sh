#!/usr/bin/env bash
# The CLI's contract: --version and --help succeed; every subcommand answers --help; unknown
# subcommands and unknown flags exit 2 with a usage line.
set -u
bin="$1"
fail=0
expect() { # expect STATUS PATTERN -- args...
  local want=$1 pat=$2; shift 3
  out=$("$bin" "$@" 2>&1); rc=$?
  if [ "$rc" != "$want" ] || ! grep -q -- "$pat" <<<"$out"; then
    echo "FAIL: longtune $* -> rc=$rc (want $want), output: $out"; fail=1
  fi
}
expect 0 "longtune [0-9]" -- --version
expect 0 "usage: longtune" -- --help
expect 2 "usage:" -- no-such-command
expect 2 "usage:" --
for cmd in $("$bin" --help | awk '/^commands:/{f=1;next} f && !NF {exit} f {print $1}'); do
  expect 0 "usage: longtune $cmd" -- "$cmd" --help
  expect 2 "usage: longtune $cmd" -- "$cmd" --no-such-flag
done
exit $fail
