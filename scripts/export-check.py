#!/usr/bin/env python3
"""Oracle check of `longtune export` against the tools people run models with.

Given a base (HF folder or .gguf) and a PEFT adapter from `longtune train`, it exports the merged
model as an HF folder (f32), as GGUF (f32 and the base's own types) and the adapter as a GGUF LoRA,
then checks:
  - transformers loads the HF folder with AutoModelForCausalLM / AutoTokenizer and its fp32 logits
    equal longtune's (the same folder, and the base + adapter through longtune's LoRA path);
  - PEFT: PeftModel(base exported without adapter, adapter) equals the merged folder;
  - the tokenizer: AutoTokenizer's ids equal `longtune tokenize` on the base;
  - gguf-py reads the GGUF files: metadata, tensor types, llama Q/K rows in llama.cpp's order;
  - with llama.cpp built (LLAMA_BIN, default /work/cache/llama-build/bin): greedy tokens of
    llama-completion on the f32 GGUF equal transformers', llama-perplexity on the exports (and
    `longtune eval` when this build has it), and llama-perplexity's KL divergence between the
    base + --lora GGUF and the merged f32 GGUF.
Writes bench/results/export-llamacpp.json. Needs /work/pyenv (torch, transformers, peft, gguf).

usage: export-check.py --adapter DIR [--model M] [--build build] [--out FILE]
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

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "def fibonacci(n):\n    "
TEXT = ("The quick brown fox jumps over the lazy dog. In Python, a list comprehension builds a list "
        "from an iterable: [x * x for x in range(10)] gives the squares of 0 to 9, 12345 in all.")


def run(cmd, **kw):
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def build_helper(build, work):
    """Compiles scripts/export_logits.c against the static library of `build`."""
    cache = open(os.path.join(build, "CMakeCache.txt")).read()

    def var(name):
        m = re.search(r"^%s:[A-Z]+=(.*)$" % re.escape(name), cache, re.M)
        return m.group(1) if m and m.group(1) and not m.group(1).endswith("NOTFOUND") else None

    exe = os.path.join(work, "export_logits")
    libs = [os.path.join(build, "liblongtune.a")]
    for v in ("OPENBLAS_LIB", "MPI_mpi_LIBRARY", "NCCL_LIB"):
        if var(v):
            libs.append(var(v))
    if var("CUDAToolkit_LIBRARY_DIR"):
        libs += ["-L" + var("CUDAToolkit_LIBRARY_DIR"), "-lcudart", "-lcublasLt", "-lcublas", "-lstdc++"]
    run(["cc", "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-I", os.path.join(ROOT, "include"),
         os.path.join(ROOT, "scripts", "export_logits.c")] + libs +
        ["-fopenmp", "-lpcre2-8", "-lcjson", "-lm", "-o", exe])
    return exe


def lt_logits(helper, model, adapter, ids, work, V):
    tf = os.path.join(work, "ids.txt")
    with open(tf, "w") as f:
        f.write(" ".join(map(str, ids)))
    out = os.path.join(work, "logits.f32")
    run([helper, model, adapter or "-", tf, out])
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), V)


def rel(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30))


def hf_logits(path, ids, adapter=None):
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if adapter:
        from peft import PeftModel
        m = PeftModel.from_pretrained(m, adapter)
    m.eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].double().numpy(), m


def interleave(w, n_head):
    """llama.cpp's permute of HF q/k rows (convert_hf_to_gguf.LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_gguf(path, hf_dir, cfg, f32):
    import gguf
    from safetensors.numpy import load_file
    r = gguf.GGUFReader(path)
    keys = set(r.fields)
    res = {"file": os.path.basename(path), "tensors": len(r.tensors),
           "types": sorted({t.tensor_type.name for t in r.tensors}),
           "has_tokenizer": "tokenizer.ggml.tokens" in keys,
           "has_chat_template": "tokenizer.chat_template" in keys,
           "arch": bytes(r.fields["general.architecture"].parts[-1]).decode()}
    norms = [t for t in r.tensors if t.name.endswith("norm.weight")]
    res["norms_f32"] = all(t.tensor_type.name == "F32" for t in norms)
    if f32:
        st = {}
        for fn in os.listdir(hf_dir):
            if fn.endswith(".safetensors"):
                st.update(load_file(os.path.join(hf_dir, fn)))
        worst = 0.0
        for t in r.tensors:
            m = re.match(r"blk\.(\d+)\.attn_(q|k)\.weight", t.name)
            if not m:
                continue
            hf = st["model.layers.%s.self_attn.%s_proj.weight" % (m.group(1), m.group(2))]
            heads = cfg["num_attention_heads"] if m.group(2) == "q" else cfg["num_key_value_heads"]
            want = interleave(hf, heads) if res["arch"] == "llama" else hf
            got = np.asarray(t.data).reshape(want.shape)
            worst = max(worst, float(np.max(np.abs(got - want))))
        res["qk_rows_max_abs_vs_hf"] = worst
    return res


def llama_tools(bin_dir):
    tools = {}
    for name in ("llama-completion", "llama-cli", "llama-perplexity"):
        p = os.path.join(bin_dir, name)
        if os.access(p, os.X_OK):
            tools[name] = p
    return tools


def ppl_of(out):
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/longtune/smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "export-llamacpp.json"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN", "/work/cache/llama-build/bin"))
    ap.add_argument("--text", help="text file for perplexity (default: a fixed paragraph repeated)")
    args = ap.parse_args()
    lt = os.path.join(args.build, "longtune")
    work = tempfile.mkdtemp(prefix="export-check.")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    result = {"bench": "export-llamacpp", "commit": commit,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": {"cpu": cpu},
              "config": {"model": args.model, "adapter": args.adapter}, "checks": {}}
    chk = result["checks"]
    try:
        exports = {}
        for name, fmt, extra in (("hf", "hf", ["--outtype", "f32"]), ("base_hf", "hf", ["--outtype", "f32"]),
                                 ("f32.gguf", "gguf", ["--outtype", "f32"]), ("own.gguf", "gguf", []),
                                 ("lora.gguf", "gguf-lora", [])):
            out = os.path.join(work, name)
            cmd = [lt, "export", "--model", args.model, "--out", out, "--format", fmt, "--json"] + extra
            if name != "base_hf":
                cmd += ["--adapter", args.adapter]
            exports[name] = json.loads(run(cmd).stdout)
        result["exports"] = exports
        hf = os.path.join(work, "hf")
        cfg = json.load(open(os.path.join(hf, "config.json")))
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(hf)
        ids = tok(TEXT).input_ids
        lt_ids = [int(x) for x in run([lt, "tokenize", "--model", args.model], input=TEXT).stdout.split()]
        chk["tokenizer_ids_equal_longtune"] = ids == lt_ids
        helper = build_helper(args.build, work)
        V = cfg["vocab_size"]
        t_hf, model = hf_logits(hf, ids)
        l_merged = lt_logits(helper, hf, None, ids, work, V)
        l_lora = lt_logits(helper, args.model, args.adapter, ids, work, V)
        chk["transformers_vs_longtune_merged_rel"] = rel(l_merged, t_hf)
        chk["transformers_vs_longtune_base_plus_adapter_rel"] = rel(l_lora, t_hf)
        chk["fp32_within_1e-5"] = chk["transformers_vs_longtune_merged_rel"] <= 1e-5
        t_peft, _ = hf_logits(os.path.join(work, "base_hf"), ids, adapter=args.adapter)
        chk["peft_on_exported_base_vs_merged_rel"] = rel(t_peft.astype(np.float32), t_hf)
        l_gguf = lt_logits(helper, os.path.join(work, "f32.gguf"), None, ids, work, V)
        chk["longtune_f32_gguf_vs_transformers_rel"] = rel(l_gguf, t_hf)
        chk["gguf_f32"] = check_gguf(os.path.join(work, "f32.gguf"), hf, cfg, True)
        # transformers' own GGUF reader (it un-permutes llama Q/K itself) on the merged f32 GGUF.
        import torch
        from transformers import AutoModelForCausalLM
        tg = AutoModelForCausalLM.from_pretrained(work, gguf_file="f32.gguf", dtype=torch.float32)
        with torch.no_grad():
            t_gguf = tg(torch.tensor([ids])).logits[0].double().numpy()
        chk["transformers_gguf_f32_vs_hf_rel"] = rel(t_gguf.astype(np.float32), t_hf)
        del tg
        chk["gguf_own_types"] = check_gguf(os.path.join(work, "own.gguf"), hf, cfg, False)
        import gguf
        lr = gguf.GGUFReader(os.path.join(work, "lora.gguf"))
        chk["gguf_lora"] = {"tensors": len(lr.tensors),
                            "type": bytes(lr.fields["general.type"].parts[-1]).decode(),
                            "alpha": float(lr.fields["adapter.lora.alpha"].parts[-1][0]),
                            "first": [lr.tensors[0].name, [int(x) for x in lr.tensors[0].shape]]}
        import torch
        pids = tok(PROMPT).input_ids
        gen = model.generate(torch.tensor([pids]), max_new_tokens=16, do_sample=False)[0][len(pids):].tolist()
        tools = llama_tools(args.llama_bin)
        result["llama_cpp"] = {"bin": args.llama_bin, "tools": sorted(tools)}
        if "llama-completion" in tools:
            want = tok.decode(gen, skip_special_tokens=True)
            greedy = {"transformers": want}
            for name, cmd in (("merged_f32", ["-m", os.path.join(work, "f32.gguf")]),
                              ("base_plus_lora", ["-m", args.model, "--lora", os.path.join(work, "lora.gguf")])):
                out = subprocess.run([tools["llama-completion"]] + cmd +
                                     ["-p", PROMPT, "-n", "16", "--temp", "0", "--top-k", "1", "-no-cnv",
                                      "--no-display-prompt", "--no-warmup", "-t", "2", "-s", "0"],
                                     capture_output=True, text=True)
                text = out.stdout.replace("[end of text]", "")
                greedy[name] = text
                chk["llama_cpp_greedy_%s_equal_transformers" % name] = text.strip() == want.strip()
            result["llama_cpp"]["greedy"] = greedy
        if "llama-perplexity" in tools:
            tf = args.text
            if not tf:
                tf = os.path.join(work, "ppl.txt")
                with open(tf, "w") as f:
                    f.write((TEXT + "\n") * 40)
            ppl = {}
            base_logits = os.path.join(work, "kl-base.bin")
            for name, cmd in (("merged_f32", ["-m", os.path.join(work, "f32.gguf"),
                                              "--kl-divergence-base", base_logits]),
                              ("merged_own_types", ["-m", os.path.join(work, "own.gguf")]),
                              ("base_plus_lora", ["-m", args.model, "--lora", os.path.join(work, "lora.gguf")])):
                out = subprocess.run([tools["llama-perplexity"], "-f", tf, "-c", "128", "-t", "2"] + cmd,
                                     capture_output=True, text=True)
                ppl[name] = ppl_of(out.stdout + out.stderr)
            out = subprocess.run([tools["llama-perplexity"], "-f", tf, "-c", "128", "-t", "2", "-m", args.model,
                                  "--lora", os.path.join(work, "lora.gguf"), "--kl-divergence-base", base_logits,
                                  "--kl-divergence"], capture_output=True, text=True)
            txt = out.stdout + out.stderr
            m = re.search(r"Mean\s+KLD:\s+([-0-9.e]+)", txt)
            s = re.search(r"Same top p:\s+([0-9.]+)", txt)
            ppl["kld_base_plus_lora_vs_merged_f32"] = float(m.group(1)) if m else None
            ppl["same_top_base_plus_lora_vs_merged_f32_pct"] = float(s.group(1)) if s else None
            result["llama_cpp"]["perplexity"] = ppl
            ev = subprocess.run([lt, "eval", "--help"], capture_output=True, text=True)
            if ev.returncode == 0:
                ev = subprocess.run([lt, "eval", "--model", os.path.join(work, "f32.gguf"), "--text", tf,
                                     "--ctx", "128", "--json"], capture_output=True, text=True)
                result["llama_cpp"]["longtune_eval"] = ev.stdout.strip() or ev.stderr.strip()[-300:]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result["checks"], indent=1))
    ok = chk.get("fp32_within_1e-5") and chk.get("tokenizer_ids_equal_longtune")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
