#!/usr/bin/env bash
# `longtune train` interrupted: SIGINT saves a checkpoint and exits 130, SIGTERM exits 143, and
# either checkpoint resumes; SIGKILL at a random moment of a run that saves every step leaves a
# checkpoint and adapter that resume and load. Runs on a tiny random model written by
# tests/cli/tiny_model.py (python3, standard library only).
set -u
bin="$1"
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
python3 "$here/tiny_model.py" "$dir/model" || { echo "FAIL: tiny model"; exit 1; }
mkdir -p "$dir/data"
for i in $(seq 1 40); do echo "{\"text\": \"record $i: the quick brown fox jumps over the lazy dog\"}"; done > "$dir/data/train.jsonl"
head -4 "$dir/data/train.jsonl" > "$dir/data/valid.jsonl"
common=(--model "$dir/model" --data "$dir/data" --batch-size 2 --max-seq-length 48 --threads 1 --steps-per-report 1 --val-batches 1)

# Starts a run in the background (arguments after the output file), waits until it has done a
# training step past metrics step $2, sends signal $3 and prints the exit status.
run_and_signal() {
  local out=$1 after=$2 sig=$3 ad=$4; shift 4
  "$bin" train "${common[@]}" --iters 100000 --adapter-path "$ad" "$@" >"$out" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do
    [ "$(last_step "$ad")" -gt "$after" ] 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  [ "$sig" = KILL ] && sleep 0.$((RANDOM % 10))
  kill -$sig $pid 2>/dev/null
  wait $pid
  echo $?
}
last_step() {
  local s
  s=$(grep -o '"step":[0-9]*,"train_loss"' "$1/metrics.jsonl" 2>/dev/null | tail -1 | grep -o '[0-9][0-9]*')
  echo "${s:--1}"
}

for sig in INT TERM; do
  want=$([ $sig = INT ] && echo 130 || echo 143)
  ad="$dir/ad_$sig"
  rc=$(run_and_signal "$dir/out_$sig" 0 $sig "$ad" --save-every 100000)
  if [ "$rc" != $want ]; then echo "FAIL: SIG$sig: exit $rc, expected $want: $(tail -3 "$dir/out_$sig")"; fail=1; fi
  num=$([ $sig = INT ] && echo 2 || echo 15)
  if ! grep -q "stopped (signal $num) at step [0-9]*; checkpoint saved to $ad/checkpoint.ltck" "$dir/out_$sig"; then echo "FAIL: SIG$sig: no interruption message: $(tail -3 "$dir/out_$sig")"; fail=1; fi
  if [ ! -s "$ad/checkpoint.ltck" ] || [ ! -s "$ad/adapter_model.safetensors" ]; then
    echo "FAIL: SIG$sig: no checkpoint/adapter saved"; fail=1; continue
  fi
  # The checkpoint resumes and the run goes on past it (interrupted again).
  step=$(last_step "$ad")
  rc=$(run_and_signal "$dir/out2_$sig" "$step" $sig "$ad" --save-every 100000 --resume-adapter-file "$ad/checkpoint.ltck")
  if [ "$rc" != $want ] || [ "$(last_step "$ad")" -le "$step" ]; then
    echo "FAIL: SIG$sig: resume from step $step (exit $rc, now at $(last_step "$ad")): $(tail -3 "$dir/out2_$sig")"; fail=1
  fi
done

# SIGKILL at random moments of a run that checkpoints every step: what is on disk always resumes.
ad="$dir/ad_KILL"
for trial in 1 2 3; do
  resume=()
  [ -s "$ad/checkpoint.ltck" ] && resume=(--resume-adapter-file "$ad/checkpoint.ltck")
  rc=$(run_and_signal "$dir/out_kill" "$(last_step "$ad")" KILL "$ad" --save-every 1 "${resume[@]}")
  if [ "$rc" != 137 ]; then echo "FAIL: KILL $trial: exit $rc: $(tail -3 "$dir/out_kill")"; fail=1; break; fi
  rm -f "$ad"/*.tmp.*
  [ -s "$ad/checkpoint.ltck" ] || { echo "FAIL: KILL $trial: no checkpoint"; fail=1; break; }
done
step=$(last_step "$ad")
rc=$(run_and_signal "$dir/out_kill" "$step" INT "$ad" --save-every 1 --resume-adapter-file "$ad/checkpoint.ltck")
if [ "$rc" != 130 ] || [ "$(last_step "$ad")" -le "$step" ]; then
  echo "FAIL: KILL: resume after kills (exit $rc): $(tail -3 "$dir/out_kill")"; fail=1
fi
out=$("$bin" generate --model "$dir/model" --adapter "$ad" --prompt "hi" --max-tokens 2 --no-chat-template 2>&1); rc=$?
if [ $rc != 0 ]; then echo "FAIL: KILL: adapter does not load (rc=$rc): $out"; fail=1; fi
exit $fail
