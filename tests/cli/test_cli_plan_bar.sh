#!/usr/bin/env bash
# The planner's bar on the default model (SmolLM2-135M-Instruct q4_1, python-faq data) on the CPU
# (DEVICE=cuda: on the GPU, where the plan and high-water are the device's; MODEL and DATA override
# the paths):
# `longtune plan` and `longtune train --iters 2` with the same flags, at T = 256 and 1024 with
# recompute none and all, and at 256 with an fp8 base whose down projection stays q4_1. `plan` must give the very number train reports as its plan
# (metrics.jsonl plan_bytes, and the memory guard's plan: one planner path), and train's measured high-water (the largest
# peak_bytes in metrics.jsonl) over that plan must lie in [0.99, 1.00]: the plan is an upper
# bound at most 1 % above what train holds. Skips when the model or the data are absent
# (scripts/setup.sh fetches them).
set -u
bin="$1"
cache="${LONGTUNE_CACHE:-$HOME/.cache/longtune}"
model="${MODEL:-$cache/smollm2-135m-instruct-q4_1.gguf}"
data="${DATA:-$cache/data/python-faq}"
device="${DEVICE:-cpu}"
[ -f "$model" ] || { echo "skipped: $model not found (scripts/setup.sh fetches it)"; exit 77; }
[ -f "$data/train.jsonl" ] || { echo "skipped: $data/train.jsonl not found (scripts/setup.sh fetches it)"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: python3 not found (used to read JSON)"; exit 77; }
fail=0
say() { echo "FAIL: $*"; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# each run: T, recompute policy, and the base's flags (the last: an fp8 base with down as written)
for run in "256 none" "256 all" "1024 none" "1024 all" "256 none --base-dtype fp8 --fp8-skip down"; do
    read -r T R base <<<"$run"
    flags=(--model "$model" --data "$data" --batch-size 1 --max-seq-length "$T" --recompute "$R"
           --val-batches 1 --steps-per-eval 100 --device "$device")
    # shellcheck disable=SC2206
    [ -n "$base" ] && flags+=($base)
    out="$tmp/a-$T-$R${base:+-fp8}"
    if ! "$bin" plan "${flags[@]}" --budget 64G --json >"$tmp/p.json" 2>"$tmp/e"; then
      say "plan T=$T recompute $R: $(cat "$tmp/e")"; continue
    fi
    if ! "$bin" train "${flags[@]}" --iters 2 --adapter-path "$out" >"$tmp/t.out" 2>&1; then
      say "train T=$T recompute $R: $(tail -5 "$tmp/t.out")"; continue
    fi
    python3 - "$tmp/p.json" "$out/metrics.jsonl" "$T" "$R" "$tmp/t.out" "$device" <<'EOF' || fail=1
import json, re, sys
plan = json.load(open(sys.argv[1]))
recs = [json.loads(line) for line in open(sys.argv[2]) if line.strip()]
assert recs, "metrics.jsonl is empty"
planned = plan["peak_bytes"]
train_plan = {r["plan_bytes"] for r in recs}
peak = max(r["peak_bytes"] for r in recs)
ratio = peak / planned
print(f"{sys.argv[6]} T={sys.argv[3]} recompute {sys.argv[4]}: plan {planned}, train's plan {sorted(train_plan)}, "
      f"high-water {peak}, ratio {ratio:.6f}")
cpu = sys.argv[6] == "cpu"
assert not cpu or (plan["data_counted"] and plan["classes"]["held"] > 0), plan
assert train_plan == {planned}, f"train planned {train_plan}, plan said {planned}"
assert 0.99 <= ratio <= 1.00, f"high-water / plan = {ratio:.6f} outside [0.99, 1.00]"
if not cpu:
    sys.exit(0)
# The run's last word (after the adapter is saved): "host peak X MiB (plan Y MiB)"; the guard's
# plan, printed as the run starts, is the same number.
text = open(sys.argv[5]).read()
m = re.search(r"host peak ([0-9.]+) (\w+) \(plan ([0-9.]+ \w+)\)", text)
assert m and m.group(3).endswith(m.group(2)) and float(m.group(1)) <= float(m.group(3).split()[0]), m and m.group(0)
g = re.search(r"memory ceiling .*, plan ([0-9.]+ \w+)", text)
assert g and g.group(1) == m.group(3), (g and g.group(0), m.group(0))
EOF
    if [ -n "$base" ] && [ "$device" = cpu ]; then
      grep -q "fp8 on the CPU emulates the FP8 products" "$tmp/t.out" || say "fp8 on the CPU: no warning"
      grep -q "projections fp8 (down_proj q4_1)" "$tmp/t.out" || say "fp8 base: the model line does not name down"
    fi
done
exit $fail
