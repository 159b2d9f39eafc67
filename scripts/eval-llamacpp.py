#!/usr/bin/env python3
"""longtune's evaluation and generation against llama.cpp's on the same exported GGUF.

On the default model (SmolLM2-135M-Instruct Q4_1 GGUF as scripts/setup.sh caches it) after a short
fine-tune (the demo's recipe for --iters steps, or --adapter DIR), the merged model is exported as
f32 and f16 GGUF by `longtune export`, and on each:
  - perplexity of a held-back text (the test split of the demo's data, never trained on, written
    as plain text): llama.cpp's `llama-perplexity -c N` and `longtune eval --text FILE --ctx N`,
    which scores the same windows (the file tokenized whole, windows of N tokens, each window's
    first token BOS when the tokenizer adds one, the second half of each window scored);
  - on the f32 export, greedy generation: `llama-completion --temp 0` and `longtune generate
    --temp 0` on the same plain-text prompts; both replies re-tokenized with the model's
    tokenizer, and how many of the first N tokens agree (the common prefix) is reported.
Writes bench/results/eval-llamacpp.json with both perplexities, their ratio, the token matches,
the commit and the machine. Needs a built longtune (--build) and llama.cpp's tools (--llama-bin).

usage: eval-llamacpp.py [--model M] [--adapter DIR | --iters N] [--ctx N] [--n-gen N] [--out FILE]
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("LONGTUNE_CACHE", os.path.expanduser("~/.cache/longtune"))


def run(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def held_back(test_jsonl, path):
    """The test split as plain text: every turn's content, blank-line separated."""
    parts = []
    for line in open(test_jsonl, encoding="utf-8"):
        rec = json.loads(line)
        if "messages" in rec:
            parts += [m["content"] for m in rec["messages"]]
        elif "text" in rec:
            parts.append(rec["text"])
        else:
            parts += [rec.get("prompt", ""), rec.get("completion", "")]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join(p for p in parts if p) + "\n")


def questions(test_jsonl, n):
    """Plain-text prompts: a held-out question and the first words of its answer (a bare
    "Answer:" ends at once with EOS on the base model)."""
    out = []
    for line in open(test_jsonl, encoding="utf-8"):
        rec = json.loads(line)
        msgs = rec.get("messages", [])
        q = next((m["content"] for m in msgs if m["role"] == "user"), rec.get("prompt"))
        a = next((m["content"] for m in msgs if m["role"] == "assistant"), rec.get("completion", ""))
        if q:
            out.append("Question: %s\nAnswer: %s" % (q.strip(), " ".join(a.split()[:4])))
        if len(out) == n:
            break
    return out


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average": list(os.getloadavg())}


def llama_ppl(tool, model, text, ctx, threads, extra=()):
    out = run([tool, "-m", model, "-f", text, "-c", str(ctx), "-b", str(ctx), "-t", str(threads)] + list(extra))
    log = out.stdout + out.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    return {"ppl": float(m.group(1)), "ppl_stderr": float(m.group(2)),
            "windows": int(chunks.group(1)) if chunks else None}


def longtune_eval(lt, model, text, ctx, threads):
    out = run([lt, "eval", "--model", model, "--text", text, "--ctx", str(ctx), "--threads", str(threads), "--json"])
    return json.loads(out.stdout.strip().splitlines()[-1])


def tokenize(lt, model, text):
    out = run([lt, "tokenize", "--model", model, "--json", "--delimiter", "\\0"], input=text)
    return json.loads(out.stdout.strip().splitlines()[0]) if out.stdout.strip() else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(CACHE, "smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--data", default=os.path.join(CACHE, "data", "python-faq"))
    ap.add_argument("--adapter", help="a PEFT adapter to merge (default: fine-tune one for --iters steps)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=256, help="context of the windows (the fine-tune's rows)")
    ap.add_argument("--n-gen", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN", "/work/cache/llama-build/bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "eval-llamacpp.json"))
    args = ap.parse_args()
    lt = os.path.join(args.build, "longtune")
    ppl_tool = os.path.join(args.llama_bin, "llama-perplexity")
    gen_tool = os.path.join(args.llama_bin, "llama-completion")
    for p in (lt, ppl_tool, gen_tool, args.model, os.path.join(args.data, "test.jsonl")):
        if not os.path.exists(p):
            sys.exit("eval-llamacpp: %s is missing" % p)
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    os.environ.update(env)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="eval-llamacpp.")
    result = {"bench": "eval-llamacpp", "commit": commit,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "machine": machine(),
              "config": {"model": args.model, "data": args.data, "ctx": args.ctx, "threads": args.threads,
                         "n_gen": args.n_gen, "llama_bin": args.llama_bin,
                         "scoring": "llama-perplexity's: windows of ctx tokens, each window's first token BOS when "
                                    "the tokenizer adds one, the second half of each window scored; longtune eval "
                                    "--text --ctx scores the same tokens"}}
    try:
        adapter = args.adapter
        if not adapter:
            adapter = os.path.join(work, "adapter")
            run([lt, "train", "--model", args.model, "--data", args.data, "--adapter-path", adapter,
                 "--iters", str(args.iters), "--batch-size", "1", "--max-seq-length", str(args.ctx),
                 "--num-layers", "4", "--lora-rank", "8", "--lora-alpha", "16", "--learning-rate", "1e-3",
                 "--lr-schedule", "cosine", "--warmup", "4", "--mask-prompt", "--seed", "0",
                 "--threads", str(args.threads), "--overwrite"])
            result["config"]["fine_tune"] = "the demo's recipe (scripts/demo.sh), %d steps, rows of %d" % (
                args.iters, args.ctx)
        else:
            result["config"]["adapter"] = adapter
        text = os.path.join(work, "heldback.txt")
        held_back(os.path.join(args.data, "test.jsonl"), text)
        result["config"]["text"] = "the test split of %s as plain text (%d bytes)" % (args.data,
                                                                                   os.path.getsize(text))
        exports = {}
        for t in ("f32", "f16"):
            exports[t] = os.path.join(work, "merged-%s.gguf" % t)
            run([lt, "export", "--model", args.model, "--adapter", adapter, "--out", exports[t], "--format", "gguf",
                 "--outtype", t])
        ppl = {}
        for t, path in exports.items():
            a = llama_ppl(ppl_tool, path, text, args.ctx, args.threads)
            b = longtune_eval(lt, path, text, args.ctx, args.threads)
            ppl[t] = {"llama_perplexity": a["ppl"], "llama_perplexity_stderr": a["ppl_stderr"],
                      "llama_windows": a["windows"], "longtune_eval": b["ppl"], "longtune_windows": b["windows"],
                      "scored_tokens": b["n_tokens"], "text_tokens": b["text_tokens"],
                      "ratio_longtune_over_llama": b["ppl"] / a["ppl"]}
            print(t, json.dumps(ppl[t]), file=sys.stderr, flush=True)
        result["perplexity"] = ppl
        gens, matched, total = [], 0, 0
        for p in questions(os.path.join(args.data, "test.jsonl"), args.prompts):
            ll = run([gen_tool, "-m", exports["f32"], "-p", p, "-n", str(args.n_gen), "--temp", "0", "--top-k", "1",
                      "-no-cnv", "--no-display-prompt", "--no-warmup", "-t", str(args.threads), "-s", "0"])
            ll_text = ll.stdout.replace("[end of text]", "").rstrip("\n")
            lg = run([lt, "generate", "--model", exports["f32"], "--prompt", p, "--no-chat-template", "--temp", "0",
                      "--max-tokens", str(args.n_gen), "--threads", str(args.threads)])
            lt_text = lg.stdout.rstrip("\n")
            a, b = tokenize(lt, exports["f32"], ll_text), tokenize(lt, exports["f32"], lt_text)
            n = min(args.n_gen, max(len(a), len(b)))
            k = 0
            while k < min(len(a), len(b), n) and a[k] == b[k]:
                k += 1
            matched += k
            total += n
            gens.append({"prompt": p, "llama_completion": ll_text, "longtune_generate": lt_text,
                         "tokens": n, "matching_prefix_tokens": k, "texts_equal": ll_text.strip() == lt_text.strip()})
            print("greedy: %d of %d tokens" % (k, n), file=sys.stderr, flush=True)
        result["greedy_f32"] = {"prompts": gens, "matching_tokens": matched, "tokens": total}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["machine"]["load_average_after"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps({"perplexity": result.get("perplexity"),
                      "greedy": {k: result["greedy_f32"][k] for k in ("matching_tokens", "tokens")}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
