#!/usr/bin/env bash
# `longtune train`/`plan` RoPE scaling flags (--rope-scaling, --rope-factor, --original-max-position,
# --yarn-beta-fast/slow, --rope-attn-factor): bad values are usage errors (exit 2) or typed run
# errors (exit 1) naming the flag; a scaled run trains. --chat-template NAME|FILE and a
# chat_template.jinja beside tokenizer_config.json give chat records their template; without one
# the error names --chat-template. Tiny random model from tests/cli/tiny_model.py (python3).
set -u
bin="$1"
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
python3 "$here/tiny_model.py" "$dir/model" || { echo "FAIL: tiny model"; exit 1; }
mkdir -p "$dir/text" "$dir/chat"
for i in $(seq 1 8); do echo "{\"text\": \"record $i: the quick brown fox\"}"; done > "$dir/text/train.jsonl"
for i in $(seq 1 8); do
  printf '{"messages": [{"role": "user", "content": "Question %d?"}, {"role": "assistant", "content": "Answer %d."}]}\n' "$i" "$i"
done > "$dir/chat/train.jsonl"

expect() { # expect EXIT FRAGMENT CMD ARGS...
  local want=$1 frag=$2; shift 2
  local out rc
  out=$("$bin" "$@" 2>&1); rc=$?
  if [ $rc != "$want" ] || ! grep -qF -- "$frag" <<<"$out"; then
    echo "FAIL: $* -> exit $rc (want $want), output lacks '$frag':"; echo "$out" | tail -3; fail=1
  fi
}
run=(--model "$dir/model" --iters 2 --batch-size 2 --max-seq-length 32 --threads 1 --adapter-path "$dir/ad" --overwrite)

expect 2 "option 'rope-scaling': 'ntk' is not linear|dynamic|yarn|llama3|longrope" train "${run[@]}" --data "$dir/text" --rope-scaling ntk
expect 2 "needs 'rope_factor' > 0 (got 0)" train "${run[@]}" --data "$dir/text" --rope-scaling yarn --rope-factor 0
expect 2 "needs 'rope_factor' > 0 (got -2)" train "${run[@]}" --data "$dir/text" --rope-scaling linear --rope-factor -2
expect 2 "option 'rope-factor': 'nan'" train "${run[@]}" --data "$dir/text" --rope-factor nan
expect 2 "need 'rope_scaling'" train "${run[@]}" --data "$dir/text" --rope-factor 2
expect 2 "need 'rope_scaling' yarn" train "${run[@]}" --data "$dir/text" --rope-scaling linear --rope-factor 2 --yarn-beta-fast 8
expect 1 "--original-max-position 1000000 is longer than the model's context" train "${run[@]}" --data "$dir/text" \
  --rope-scaling yarn --rope-factor 2 --original-max-position 1000000
expect 1 "original context 256 is longer than the extended one" train "${run[@]}" --data "$dir/text" \
  --rope-scaling dynamic --rope-factor 0.5 --original-max-position 256
expect 1 "longrope needs the model's short_factor/long_factor" train "${run[@]}" --data "$dir/text" \
  --rope-scaling longrope --rope-factor 4
expect 0 "step" train "${run[@]}" --data "$dir/text" --rope-scaling yarn --rope-factor 4 --yarn-beta-fast 16 --yarn-beta-slow 2
expect 0 "step" train "${run[@]}" --data "$dir/text" --rope-scaling dynamic --rope-factor 2
expect 1 "factor 0.5" plan --model "$dir/model" --budget 1000000000 --rope-scaling linear --rope-factor 0.5
expect 0 "" plan --model "$dir/model" --budget 1000000000 --rope-scaling linear --rope-factor 4

# Chat records: a tokenizer without a template (the fixture's config minus its chat_template).
python3 - "$dir/model/tokenizer_config.json" <<'P'
import json, sys
d = json.load(open(sys.argv[1])); del d["chat_template"]; json.dump(d, open(sys.argv[1], "w"))
P
expect 1 "pass --chat-template NAME" train "${run[@]}" --data "$dir/chat"
expect 0 "chat template chatml" train "${run[@]}" --data "$dir/chat" --chat-template chatml
expect 1 "--chat-template vicuna: no such file" train "${run[@]}" --data "$dir/chat" --chat-template vicuna
cat > "$dir/chatml.jinja" <<'T'
{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
T
expect 0 "chat template chatml" train "${run[@]}" --data "$dir/chat" --chat-template "$dir/chatml.jinja"
cp "$dir/chatml.jinja" "$dir/model/chat_template.jinja" # transformers 5 keeps it beside the config
expect 0 "chat template chatml" train "${run[@]}" --data "$dir/chat"
[ $fail = 0 ] && echo "ok"
exit $fail
