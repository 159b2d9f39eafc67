#!/usr/bin/env bash
# Long-run check: STEPS (default 500) CPU training steps of a tiny random Llama (tests/cli/tiny_model.py)
# on short rows, sampling the process's resident set every 0.2 s and the accounting allocator's
# high-water from metrics.jsonl; then the same run under LeakSanitizer (an ASan build, `make asan`)
# must exit cleanly. Writes bench/results/long-run-<date>.json and fails if host memory grows after
# warm-up (RSS beyond RSS_SLACK_KIB, default 1024, or any rise of the allocator high-water after
# step 10) or if LSan reports a leak.
# usage: scripts/long-run.sh [STEPS] [BIN] [ASAN_BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-500}
bin=${2:-build/longtune}
asan_bin=${3:-build-asan/longtune}
slack_kib=${RSS_SLACK_KIB:-1024}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 tests/cli/tiny_model.py "$dir/model" --hidden 16 --layers 2
mkdir -p "$dir/data"
for i in $(seq 1 200); do echo "{\"text\": \"row $i: a short line of text for a long run, number $((i * 7 % 13))\"}"; done > "$dir/data/train.jsonl"
head -8 "$dir/data/train.jsonl" > "$dir/data/valid.jsonl"
args=(--model "$dir/model" --data "$dir/data" --iters "$steps" --batch-size 2 --max-seq-length 32 --threads 1
      --steps-per-report 10 --steps-per-eval 100 --val-batches 2 --save-every 100 --learning-rate 1e-3 --seed 3)

"$bin" train "${args[@]}" --adapter-path "$dir/ad" > "$dir/out" 2>&1 &
pid=$!
t0=$(date +%s%N)
: > "$dir/rss"
while kill -0 $pid 2>/dev/null; do
  r=$(awk '/^VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null || true)
  [ -n "$r" ] && echo "$(( ($(date +%s%N) - t0) / 1000000 )) $r" >> "$dir/rss"  # ms, KiB
  sleep 0.2
done
wait $pid || { echo "run failed:"; tail -5 "$dir/out"; exit 1; }

lsan_rc=skipped
if [ -x "$asan_bin" ]; then
  set +e
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 "$asan_bin" train "${args[@]}" --adapter-path "$dir/ad_asan" > "$dir/out_asan" 2>&1
  lsan_rc=$?
  set -e
  grep -q "LeakSanitizer" "$dir/out_asan" && lsan_rc="leaks"
fi

python3 - "$dir" "$steps" "$slack_kib" "$lsan_rc" "$bin" <<'PY'
import json, os, subprocess, sys, time, statistics
d, steps, slack, lsan, binary = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rss = [tuple(map(float, l.split())) for l in open(os.path.join(d, "rss")) if l.strip()]
met = [json.loads(l) for l in open(os.path.join(d, "ad", "metrics.jsonl"))]
train = [m for m in met if "train_loss" in m]
peaks = [(m["step"], m["peak_bytes"]) for m in train]
after10 = [p for s, p in peaks if s >= 10]
peak_growth = max(after10) - min(after10) if after10 else 0
# Resident set: the first fifth of the samples is warm-up; compare the rest's max to its start.
n = len(rss)
steady = [r for _, r in rss[n // 5:]] if n >= 10 else [r for _, r in rss]
rss_growth_kib = max(steady) - steady[0] if steady else 0
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
res = {
    "what": "long CPU run on a tiny random Llama: host memory after warm-up and LeakSanitizer",
    "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "machine": os.uname().nodename + " (shared, 2 cores, loaded by other jobs)",
    "steps": steps, "rss_samples": n,
    "rss_kib_first": rss[0][1] if rss else None, "rss_kib_steady_start": steady[0] if steady else None,
    "rss_kib_max": max(r for _, r in rss) if rss else None, "rss_kib_end": rss[-1][1] if rss else None,
    "rss_growth_after_warmup_kib": rss_growth_kib, "rss_slack_kib": slack,
    "alloc_peak_bytes_step10": after10[0] if after10 else None, "alloc_peak_bytes_end": peaks[-1][1] if peaks else None,
    "alloc_peak_growth_after_step10": peak_growth,
    "train_loss_first": train[0]["train_loss"], "train_loss_last": train[-1]["train_loss"],
    "lsan": lsan,
    "ok": rss_growth_kib <= slack and peak_growth == 0 and lsan in ("0", "skipped"),
}
os.makedirs("bench/results", exist_ok=True)
out = "bench/results/long-run-%s.json" % time.strftime("%Y%m%d")
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1))
print("wrote", out)
sys.exit(0 if res["ok"] else 1)
PY
