#!/usr/bin/env bash
# The bounded fuzz run CI does after the replay of the corpora: every libFuzzer target in fuzz/
# for SECONDS each (default 10), from the committed corpus and regressions, new inputs going to a
# scratch folder (the committed corpus is left alone). Fails on the first crash, leak or sanitizer
# report, leaving the input in fuzz/crashes/TARGET/. Skips, saying why, when clang cannot build
# with -fsanitize=fuzzer. usage: scripts/fuzz-ci.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
cc=${FUZZ_CC:-clang}
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$probe/p.c"
if ! command -v "$cc" >/dev/null || ! "$cc" -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
  echo "fuzz-ci: skipped: $cc cannot build with -fsanitize=fuzzer (libFuzzer); the corpus replay (ctest -L fuzz) still runs"
  exit 0
fi
CC=$cc cmake -S . -B build-fuzz -DLT_FUZZ=ON -DLT_CUDA=OFF -DLT_NATIVE=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" >/dev/null
targets=$(ls fuzz/fuzz_*.c | sed 's|fuzz/fuzz_||; s|\.c$||')
for t in $targets; do
  cmake --build build-fuzz --target "fuzz_$t" -j "${JOBS:-$(nproc)}" >"$probe/build.log" 2>&1 ||
    { echo "fuzz-ci: building fuzz_$t failed:"; tail -30 "$probe/build.log"; exit 1; }
done
fail=0
for t in $targets; do
  mkdir -p "$probe/$t" "fuzz/crashes/$t" "fuzz/corpus/$t" "fuzz/regressions/$t"
  dict=()
  [ -f "fuzz/dict/$t.dict" ] && dict=("-dict=fuzz/dict/$t.dict")
  if build-fuzz/"fuzz_$t" "$probe/$t" "fuzz/corpus/$t" "fuzz/regressions/$t" "${dict[@]}" \
    -max_total_time="$secs" -artifact_prefix="fuzz/crashes/$t/" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    >"$probe/$t.log" 2>&1; then
    echo "fuzz-ci: $t: $(grep -o 'stat::number_of_executed_units: [0-9]*' "$probe/$t.log" | grep -o '[0-9]*$' || echo '?') runs in ${secs} s, no failure"
  else
    echo "fuzz-ci: $t: FAILED (input in fuzz/crashes/$t/):"; tail -30 "$probe/$t.log"; fail=1
  fi
done
exit $fail
