#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS: scripts/fuzz.sh TARGET SECONDS [extra libFuzzer flags]
# Builds with clang into build-fuzz/, starts from the committed corpus fuzz/corpus/TARGET (new
# interesting inputs are added there) and leaves crashes in fuzz/crashes/TARGET/. A crash that is
# fixed gets its input committed under fuzz/regressions/TARGET/ so CI replays it forever.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh TARGET SECONDS}
secs=${2:?usage: scripts/fuzz.sh TARGET SECONDS}
shift 2
CC=clang cmake -S . -B build-fuzz -DLT_FUZZ=ON -DLT_CUDA=OFF -DLT_NATIVE=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build build-fuzz --target "fuzz_$target" -j "$(nproc)"
mkdir -p "fuzz/corpus/$target" "fuzz/regressions/$target" "fuzz/crashes/$target"
dict=""
[ -f "fuzz/dict/$target.dict" ] && dict="-dict=fuzz/dict/$target.dict"
exec build-fuzz/"fuzz_$target" "fuzz/corpus/$target" "fuzz/regressions/$target" $dict \
  -max_total_time="$secs" -artifact_prefix="fuzz/crashes/$target/" -rss_limit_mb=2048 \
  -max_len=65536 -print_final_stats=1 "$@"
