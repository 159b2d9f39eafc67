#!/usr/bin/env bash
# The flagship GPU benchmarks of README's benchmark section in one go, on one CUDA device, each
# against transformers + PEFT in the same invocation: training steps of the Qwen3-8B and SmolLM2-135M
# shapes, the Qwen3-8B context ceiling (with its chart) and packed throughput on Alpaca-shaped data.
# Each step has its own time limit (840 s in all, more than one 10-minute device call: run it as
# two, `train8b profile8b train135m nograph135m` and `context8b packed135m packed8b chart`; the 16 GB
# random Qwen3-8B checkpoint is written once in ~11 s and reused); results and logs go to $OUT
# (default bench/results). It builds nothing and installs nothing; the peers' Liger arms need the
# liger-kernel wheel unpacked onto the peer path.
#
# usage: scripts/gpu-bench.sh [step ...]   steps: train8b profile8b train135m nograph135m context8b packed135m
#        packed8b chart
#        (default: all, in that order). BIN=path/to/longtune overrides build/longtune.
#        Opt-in steps, named only: traincpu kernels8b offload8b offload8b-start offload8b-every2-start
#        offload8b-wait fp8 fp8-vs-bf16 attention attention256 lora atliger8b atliger135m lce kernelslce
#        kernelspacked sectionspacked packedsweep (each described at its case below).
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-build/longtune}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
export LONGTUNE_SOURCE_DIR=$PWD
export LONGTUNE_BENCH_WEIGHTS=${LONGTUNE_BENCH_WEIGHTS:-/tmp/longtune-bench-weights}
export PYTHONUNBUFFERED=1
# a build linked against NCCL finds the library PyTorch ships when the toolkit has none
if ldd "$BIN" 2>/dev/null | grep -q "libnccl.* not found"; then
  d=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
fi
steps=${*:-train8b profile8b train135m nograph135m context8b packed135m packed8b chart}
log="$OUT/gpu-bench.log"
t0=$(date +%s)
run() { # limit label command...
  local limit=$1 label=$2; shift 2
  echo "=== $label ($(date -u +%T), limit ${limit}s, $(( $(date +%s) - t0 ))s so far): $*"
  timeout -k 10 "$limit" "$@"
  echo "=== $label: exit $?"
}
{
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for s in $steps; do
  case $s in
  train8b)
    run 150 "train qwen3-8b" "$BIN" bench train --backend cuda --shape qwen3-8b --seq 8192,32768 \
      --repeats 3 --warmup 1 --out "$OUT" ;;
  profile8b) # where an 8k step's time goes (CUDA events around every op; ~12 s with the weights written)
    run 40 "profile qwen3-8b 8k" "$BIN" bench train --backend cuda --shape qwen3-8b --seq 8192 --no-peer \
      --repeats 1 --warmup 1 --profile --out "$OUT" ;;
  train135m)
    run 70 "train smollm2-135m" "$BIN" bench train --backend cuda --shape smollm2-135m --seq 2048,8192,32768 \
      --repeats 5 --warmup 2 --out "$OUT" ;;
  nograph135m) # the per-step-overhead case without the CUDA graph (train135m replays it): ~10 s
    run 30 "train smollm2-135m 2k, --cuda-graph off" "$BIN" bench train --backend cuda --shape smollm2-135m \
      --seq 2048 --no-peer --cuda-graph off --repeats 10 --warmup 2 --out "$OUT" ;;
  context8b)
    run 200 "context qwen3-8b" "$BIN" bench context --backend cuda --shape qwen3-8b --confirm-seconds 110 \
      --peer-max 65536 --out "$OUT" ;;
  packed135m) # longtune's three arms, then the same batches in transformers + PEFT and + Liger
    run 150 "packed smollm2-135m" "$BIN" bench packed --backend cuda --shape smollm2-135m --seconds 8 --out "$OUT" ;;
  packed8b)
    run 200 "packed qwen3-8b" "$BIN" bench packed --backend cuda --shape qwen3-8b --seconds 10 --out "$OUT" ;;
  chart)
    for f in "$OUT"/context-cuda-*.json; do [ -f "$f" ] && python3 scripts/context_chart.py "$f"; done ;;
  traincpu) # opt-in (not in the default list): the CPU training bench on the device's cores, both
    # arms (longtune, PyTorch + transformers + PEFT), all cores; ~60 s expected at 16 threads (peer
    # start 16 s, a T=512 step pair 2.5 s). Memory guard off: after the GPU steps other processes
    # can hold 3/4 of host memory, and the guard would then refuse to start.
    run 150 "train cpu smollm2-135m" env CUDA_VISIBLE_DEVICES= "$BIN" bench train --shape smollm2-135m \
      --seq 512,2048 --repeats 3 --warmup 1 --no-memory-guard --out "$OUT" ;;
  kernels8b) # opt-in: the 8k Qwen3-8B step without recompute kernel by kernel under Nsight Compute
    # (scripts/gpu-kernels.sh; ~90 s; the table on stdout, kernels.json under $OUT/kernels)
    run 200 "kernels qwen3-8b 8k" env BIN="$BIN" OUT="$OUT/kernels" scripts/gpu-kernels.sh ;;
  offload8b) # opt-in, alone in a command: the Qwen3-8B ceiling with the layer checkpoints in pinned
    # host memory and one real step at 417,792 tokens on the search's allocation (preparing it pins
    # ~108 GiB in ~50 s; the step itself ran past 505 s on an H200: LT_OFFLOAD8B_LIMIT seconds, 1500 by default)
    run "${LT_OFFLOAD8B_LIMIT:-1500}" "context qwen3-8b offload, a step at 417792" "$BIN" bench context --backend cuda --shape qwen3-8b \
      --offload-checkpoints --confirm-T 417792 --no-peer --out "$OUT" ;;
  offload8b-start|offload8b-every2-start) # opt-in: the same step detached from the command (setsid),
    # for a device whose commands stop at 10 minutes: it runs on while the machine stays warm between
    # calls; its log, exit status and result go to $LT_DETACH_DIR (default /tmp/lt-offload8b on that
    # machine). offload8b-every2-start: one checkpoint per two layers, a step at 565,248 tokens (the
    # allocated ceiling of that policy with offload; the 417,792-token step took 548.5 s, so expect
    # about twice that: start it first and collect it with offload8b-wait over the following calls)
    d=${LT_DETACH_DIR:-/tmp/lt-offload8b}
    rm -rf "$d" && mkdir -p "$d"
    bin=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
    if [ "$s" = offload8b-start ]; then extra=(--confirm-T 417792)
    else extra=(--recompute every:2 --confirm-T 565248); fi
    (cd "$d" && exec setsid bash -c 'echo $$ > pid; "$@" > log 2>&1; echo $? > rc' step "$bin" bench context \
      --backend cuda --shape qwen3-8b --offload-checkpoints "${extra[@]}" --no-peer --out "$d") \
      < /dev/null > /dev/null 2>&1 &
    sleep 5
    echo "=== $s: pid $(cat "$d/pid" 2>/dev/null), log $d/log"
    tail -3 "$d/log" 2>/dev/null ;;
  offload8b-wait) # opt-in, after offload8b-start (consecutive calls, the machine kept warm): waits up to
    # LT_WAIT seconds (580 by default) for the detached step, then copies its result into $OUT
    d=${LT_DETACH_DIR:-/tmp/lt-offload8b}
    end=$(( $(date +%s) + ${LT_WAIT:-580} ))
    while [ -f "$d/pid" ] && [ ! -f "$d/rc" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 2; done
    tail -5 "$d/log" 2>/dev/null
    if [ -f "$d/rc" ]; then
      echo "=== offload8b-wait: the step exited $(cat "$d/rc")"
      cp "$d"/*.json "$d"/*.svg "$OUT"/ 2>/dev/null
    elif [ -f "$d/pid" ]; then
      echo "=== offload8b-wait: still running (pid $(cat "$d/pid")), $(( $(date +%s) - $(stat -c %Y "$d/pid") )) s so far"
    else
      echo "=== offload8b-wait: nothing started in $d (run offload8b-start first)"
    fi ;;
  atliger8b|atliger135m) # opt-in: both arms checkpointing every layer, longtune in the setting the
    # planner fits under PEFT + Liger's own measured peak (`longtune plan ... --recompute auto --budget
    # <Liger's peak>`): Qwen3-8B at 8k under 20.31 GiB, chunks of 4,096 rows with attention rerun in 25
    # of 36 layers (plan 20.27 GiB), and at 32k under 34.53 GiB, rerun in 16 (34.46 GiB); SmolLM2-135M
    # at 32k under 2.70 GiB, one checkpoint per two layers and chunks of 4,096 rows, attention kept
    # (2.68 GiB). All three arms in each invocation (~150 s each for Qwen3-8B, ~60 s for SmolLM2)
    if [ "$s" = atliger8b ]; then
      run 230 "train qwen3-8b 8k at Liger's peak" "$BIN" bench train --backend cuda --shape qwen3-8b --seq 8192 \
        --chunk-rows 4096 --recompute-attention-layers 25 --repeats 3 --warmup 1 --out "$OUT"
      run 300 "train qwen3-8b 32k at Liger's peak" "$BIN" bench train --backend cuda --shape qwen3-8b \
        --seq 32768 --recompute-attention-layers 16 --repeats 3 --warmup 1 --out "$OUT"
    else
      run 100 "train smollm2-135m 32k at Liger's peak" "$BIN" bench train --backend cuda --shape smollm2-135m \
        --seq 32768 --recompute every:2 --chunk-rows 4096 --repeats 5 --warmup 2 --out "$OUT"
    fi ;;
  fp8) # opt-in: the Qwen3-8B 8k step without recompute, the base held in fp8 (--base-dtype fp8),
    # with both peers (train-cuda-qwen3-8b-random-bf16-norecompute-fp8.json; ~60 s), then
    run 150 "train qwen3-8b 8k fp8 base" "$BIN" bench train --backend cuda --shape qwen3-8b --seq 8192 \
      --recompute none --base-dtype fp8 --out "$OUT"
    # and with the MLP's down projection left in bf16 (--fp8-skip down: the held-out bar on the
    # demo's fine-tune, scripts/fp8-heldout.sh), its own file (...-fp8-skip-down.json; ~45 s, no peers)
    run 100 "train qwen3-8b 8k fp8 base, down in bf16" "$BIN" bench train --backend cuda --shape qwen3-8b \
      --seq 8192 --recompute none --base-dtype fp8 --fp8-skip down --no-peer --out "$OUT"
    # and the default recompute at 8k and 32k with both peers (train-cuda-qwen3-8b-random-bf16-fp8.json;
    # ~140 s): speed and peak against PEFT + Liger with checkpointing on both sides
    run 300 "train qwen3-8b 8k,32k fp8 base, recompute" "$BIN" bench train --backend cuda --shape qwen3-8b \
      --seq 8192,32768 --base-dtype fp8 --repeats 3 --warmup 1 --out "$OUT" ;;
  fp8-vs-bf16) # opt-in: the Qwen3-8B 8k step with recompute on the bf16 base and on the fp8 base,
    # alternated twice in one call, no peers (...-ab-file.json, ...-ab-fp8.json: the second run of each;
    # docs/formats.md; ~2 min)
    for rep in 1 2; do
      for base in file fp8; do
        run 120 "train qwen3-8b 8k, base $base, run $rep" "$BIN" bench train --backend cuda --shape qwen3-8b \
          --seq 8192 --base-dtype $base --no-peer --repeats 3 --warmup 1 --name-suffix ab-$base --out "$OUT"
      done
    done ;;
  attention) # opt-in: the attention kernels (forward, fwd+bwd) at T=2k/8k/32k, D=64 and a packed row, with
    # the SDPA FlashAttention-2 and cuDNN peers in the same run (bench/results/attention-cuda-bf16.json; ~25 s)
    run 60 "attention kernels" "$BIN" bench attention --backend cuda --repeats 20 --out "$OUT" ;;
  attention256) # opt-in: T = 8192 at D = 128, 64 and 256 (Gemma's, H = 16, Hkv = 8) with both SDPA peers,
    # then the same arms with the mma.sync backward forced (--kernel-bwd mma, no peers; file suffix
    # bwd-mma): the D = 256 wgmma backward (bwd_wg256.cu) against the kernel it replaces, one run (~60 s)
    run 100 "attention T=8192, D=128/64/256" "$BIN" bench attention --backend cuda --T 8192 --packed-T 0 \
      --repeats 20 --name-suffix t8192-d64-d128-d256 --out "$OUT"
    run 80 "attention T=8192, the mma.sync backward" "$BIN" bench attention --backend cuda --T 8192 \
      --packed-T 0 --repeats 20 --kernel-bwd mma --no-peers --name-suffix t8192-bwd-mma --out "$OUT" ;;
  lora) # opt-in: what the LoRA products add to one layer's base GEMMs (q,k,v; gate,up; o; down) over
    # one 8,192-row chunk, with and without adapters alternating, at SmolLM2-135M's and Qwen3-8B's
    # widths (a few seconds each)
    for sh in smollm2-135m qwen3-8b; do
      run 60 "lora products $sh" "$BIN" bench lora --backend cuda --shape $sh --repeats 20 --out "$OUT"
    done ;;
  lce) # opt-in: the fused loss at N=8192, V=151936, C=4096 with its PyTorch peers (lce-cuda-bf16.json; ~15 s)
    run 60 "fused loss" "$BIN" bench lce --backend cuda --repeats 10 --out "$OUT" ;;
  kernelslce|kernelspacked) # opt-in: device time per kernel under Nsight Compute (its default clock
    # control: clocks held at base, so the times run over a free-running card's), summed per kernel
    # by scripts/ncu_kernels.py: the fused loss's own kernels in its one-call arms (cuBLASLt's left
    # out; then one call's every kernel at free clocks),
    # or every attention kernel of `bench attention --T 2048 --packed-T 8192` (the packed row's are
    # the last launches; the CSV keeps each launch with its grid). ~30 s each; CSVs under $OUT/ncu
    command -v ncu >/dev/null || { echo "=== $s: ncu (Nsight Compute) not found"; continue; }
    mkdir -p "$OUT/ncu"
    if [ "$s" = kernelslce ]; then
      run 150 "fused loss kernels" ncu -k regex:lce --metrics gpu__time_duration.sum,launch__grid_size --csv \
        --print-units base "$BIN" bench lce --backend cuda --arms fused-fb --no-peers --repeats 1 --warmup 0 \
        --out "$OUT/ncu/lce" >"$OUT/ncu/lce.csv"
      python3 scripts/ncu_kernels.py "$OUT/ncu/lce.csv" --top 12
      # one default call's every kernel, cuBLASLt's too, with the clocks left free and the caches
      # not flushed: what the call's kernels add up to, against the call's own time
      run 150 "fused loss, one call's kernels at free clocks" ncu --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,launch__grid_size --csv --print-units base "$BIN" bench lce --backend cuda \
        --arms fused-fb --no-peers --repeats 1 --warmup 0 --out "$OUT/ncu/lce-free" >"$OUT/ncu/lce-free.csv"
      python3 scripts/ncu_kernels.py "$OUT/ncu/lce-free.csv" --from lce_weights --to lce_fwd_reduce_out --top 8
    else
      run 150 "attention kernels, packed row last" ncu -k regex:attn --metrics gpu__time_duration.sum,launch__grid_size \
        --csv --print-units base "$BIN" bench attention --backend cuda --T 2048 --packed-T 8192 --no-peers \
        --repeats 2 --warmup 0 --out "$OUT/ncu/attention" >"$OUT/ncu/attention.csv"
      python3 scripts/ncu_kernels.py "$OUT/ncu/attention.csv" --top 20
    fi ;;
  packedsweep) # opt-in: the packed row of T = 8192 (91 sequences, D = 128) under each forced choice of
    # the sparse plan (the dQ route, the query-head split, 128 keys per CTA, the forward kernel), the
    # list run twice, no peers; the arm's line of each run on stdout, the JSON files in a scratch
    # folder (~75 s on an H100). Compare the arm's times: a forced choice also applies to the causal
    # sequence the "x faster" line divides by.
    for r in 1 2; do
      for v in "" "--kernel-dq atomic" "--split 2" "--split 4" "--bwd-bn 128" "--kernel-fwd wg" "--kernel-fwd ws3"; do
        echo "packed row, pass $r, [${v:-heuristics}]:"
        # shellcheck disable=SC2086 # $v is a list of flags
        timeout -k 10 40 "$BIN" bench attention --backend cuda --T 2048 --repeats 10 --no-peers $v \
          --out "${TMPDIR:-/tmp}/packedsweep" 2>&1 | grep -E "^cuda-packed|packed row:"
      done
    done ;;
  sectionspacked) # opt-in: why the attention kernels of `bench attention --T 8192 --packed-T 8192`
    # take their time, under Nsight Compute's occupancy, scheduler, warp-state and memory sections
    # with the stall reasons per issued instruction (clocks at base; the packed row's launches
    # last), a row per launch by scripts/ncu_details.py. ~30 s; the CSV under $OUT/ncu
    command -v ncu >/dev/null || { echo "=== $s: ncu (Nsight Compute) not found"; continue; }
    mkdir -p "$OUT/ncu"
    stalls=""
    for r in long_scoreboard short_scoreboard barrier wait mio_throttle lg_throttle math_pipe_throttle \
      not_selected selected dispatch_stall membar no_instruction branch_resolving imc_miss sleeping; do
      stalls="$stalls${stalls:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
    done
    run 200 "attention kernels' sections, packed row last" ncu -k regex:attn --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --metrics "$stalls" --csv --page details --print-units base "$BIN" \
      bench attention --backend cuda --T 8192 --packed-T 8192 --no-peers --repeats 1 --warmup 0 \
      --out "$OUT/ncu/attention-sections" >"$OUT/ncu/attention-sections.csv"
    python3 scripts/ncu_details.py "$OUT/ncu/attention-sections.csv" --match attn_ ;;
  *) echo "unknown step $s" ;;
  esac
done
echo "=== done in $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$log"
