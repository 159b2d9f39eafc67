#!/usr/bin/env bash
# Session 3, round 2 (attn3): the v8 kernels as committed (64-key dK/dV kernel and delta inside the
# dQ kernel for sparse rows, offsets as a kernel parameter; deferred dQ and 16-byte reductions
# removed after round 1). GPU tests (default plan, old paths forced, dense paths forced), the
# attention bench with the SDPA peers, packed-row variants (head split 2/4, v7 paths), the LCE
# test and bench with peers, memcheck and racecheck. Logs and JSON under $OUT.
set -u
. ./round_lib.sh
{
t info; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT
tst default LONGTUNE_X=0
t "cli with peers (bench/results/attention-cuda-bf16.json)"
mkdir -p "$OUT/attention"
timeout 30 $B/longtune bench attention --backend cuda --repeats 20 --out "$OUT/attention" 2>&1 | grep -v "^wrote"
cli split2 2048 LONGTUNE_ATTN_SPLIT=2
cli split4 2048 LONGTUNE_ATTN_SPLIT=4
cli v7_paths 2048 LONGTUNE_ATTN_BWD_BN=128 LONGTUNE_ATTN_DELTA=sep LONGTUNE_ATTN_OFFS=copy
cli default_again 2048 LONGTUNE_X=0
tst old_paths LONGTUNE_ATTN_BWD_BN=128 LONGTUNE_ATTN_DELTA=sep LONGTUNE_ATTN_OFFS=copy
tst dense_forced LONGTUNE_ATTN_FWD=wg LONGTUNE_ATTN_DQ=atomic
t test_cuda_lce
timeout 15 $B/test_cuda_lce > "$OUT/test_cuda_lce.log" 2>&1; echo "rc=$?"
grep -E "seed|FAILED|PASSED|ERROR" "$OUT/test_cuda_lce.log" | head -6
t "lce bench with peers (bench/results/lce-cuda-bf16.json)"
mkdir -p "$OUT/lce"
timeout 20 $B/longtune bench lce --backend cuda --repeats 5 --out "$OUT/lce" 2>&1 | grep -v "^wrote"
t memcheck default
timeout 8 compute-sanitizer --tool memcheck --print-limit 10 $B/test_cuda_attention > "$OUT/memcheck.log" 2>&1; echo "rc=$?"; tail -2 "$OUT/memcheck.log"
t racecheck default
timeout 12 compute-sanitizer --tool racecheck --print-limit 10 $B/test_cuda_attention > "$OUT/racecheck.log" 2>&1; echo "rc=$?"; tail -2 "$OUT/racecheck.log"
t end
} 2>&1 | tee "$OUT/device.log"
