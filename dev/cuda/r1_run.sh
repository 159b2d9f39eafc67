#!/usr/bin/env bash
# Session 3, round 1 (attn3): v8 attention kernels. GPU tests with the new default plan, with the
# old paths forced and with the deferred dQ; the CLI bench per variant (packed row of 91
# sequences, causal 8k/32k, D=64 8k); test_cuda_lce; memcheck and racecheck. Logs under $OUT.
set -u
. ./round_lib.sh
{
t info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT
tst default LONGTUNE_X=0
cli default 8192,32768 LONGTUNE_X=0
cli defer 8192,32768 LONGTUNE_ATTN_BWD_DEFER=1
cli red_v2 8192,32768 LONGTUNE_ATTN_DQ_RED=v2
cli defer_v2 8192 LONGTUNE_ATTN_BWD_DEFER=1 LONGTUNE_ATTN_DQ_RED=v2
cli bn128 2048 LONGTUNE_ATTN_BWD_BN=128
cli delta_sep 2048 LONGTUNE_ATTN_DELTA=sep
cli offs_copy 2048 LONGTUNE_ATTN_OFFS=copy
cli v7_paths 2048 LONGTUNE_ATTN_BWD_BN=128 LONGTUNE_ATTN_DELTA=sep LONGTUNE_ATTN_OFFS=copy LONGTUNE_ATTN_DQ_RED=v2
cli default_again 2048 LONGTUNE_X=0
tst old_paths LONGTUNE_ATTN_BWD_BN=128 LONGTUNE_ATTN_DELTA=sep LONGTUNE_ATTN_OFFS=copy LONGTUNE_ATTN_DQ_RED=v2
tst defer LONGTUNE_ATTN_BWD_DEFER=1
tst dense_forced LONGTUNE_ATTN_FWD=wg LONGTUNE_ATTN_DQ=atomic LONGTUNE_ATTN_BWD_DEFER=1
t test_cuda_lce
timeout 15 $B/test_cuda_lce > "$OUT/test_cuda_lce.log" 2>&1; echo "rc=$?"
grep -E "seed|FAILED|PASSED|ERROR" "$OUT/test_cuda_lce.log" | head -6
t memcheck default
timeout 10 compute-sanitizer --tool memcheck --print-limit 10 $B/test_cuda_attention > "$OUT/memcheck.log" 2>&1; echo "rc=$?"; tail -2 "$OUT/memcheck.log"
t racecheck defer
LONGTUNE_ATTN_BWD_DEFER=1 timeout 14 compute-sanitizer --tool racecheck --print-limit 10 $B/test_cuda_attention > "$OUT/racecheck.log" 2>&1; echo "rc=$?"; tail -2 "$OUT/racecheck.log"
t end
} 2>&1 | tee "$OUT/device.log"
