#!/usr/bin/env python3
"""PEFT adapters with LoRA on the experts of a mixture-of-experts model, and the checks that
longtune's adapter files and exports agree with PEFT and transformers.

Writes tests/fixtures/moe/peft_experts/<case>/ for the base tests/fixtures/moe/qwen3moe (Qwen3-MoE,
L=2, E=8, k=2, C=32, moe_F=16): adapter_config.json + adapter_model.safetensors exactly as PEFT 0.21
saves them (LoraConfig target_modules + target_parameters, every A and B drawn nonzero), and
expected.safetensors with the batch (tokens (1, T)) and the PEFT model's logits (1, T, V).

PEFT's expert adapter (ParamWrapper): lora_A.weight (r*E, in), lora_B.weight (out, r*E);
delta_e = (alpha / r) * B_e @ A_e with A_e = A.reshape(E, r, in)[e], B_e[o, j] = B[o, j*E + e];
gate_up's out is 2*moe_F (gate rows, then up rows), down's is C. With both parameters targeted the
first listed (gate_up) is nested innermost and saved as "mlp.experts.base_layer.lora_*".

Cases:
  both     q_proj, v_proj + mlp.experts.gate_up_proj, mlp.experts.down_proj; r=2, alpha 4
  gate_up  q_proj, v_proj + mlp.experts.gate_up_proj alone (keys "mlp.experts.lora_*"); r=2, alpha 8
Every token's top-k choice in every layer has a margin of at least MIN_MARGIN under the adapter, so
an fp32 reimplementation (or the merged weights) picks the same experts.

Checks run by hand (CI never runs Python; the results go into the commit that needs them):
  --check-export DIR CASE    DIR is longtune's merged HF export of the base with CASE's adapter
                             (longtune export --format hf): its logits in transformers equal the PEFT
                             model's (max abs difference printed, must be < 1e-4)
  --check-adapter DIR CASE   DIR is an adapter longtune saved (e.g. CASE's loaded and saved back):
                             PeftModel.from_pretrained loads it and gives CASE's logits
  --check-llamacpp LONGTUNE CASE
                             llama.cpp applies longtune's GGUF LoRA of CASE's adapter to the experts
                             as the merged GGUF has them: the base (its vocabulary widened to the
                             bpe-nfc tokenizer's, so llama.cpp has one) is exported to GGUF, the
                             adapter as a GGUF LoRA and the merged model as f32 GGUF by the longtune
                             binary LONGTUNE; llama-perplexity (LLAMA_BIN, default
                             /work/cache/llama-build/bin) of base + --lora must equal the merged file's,
                             and llama-export-lora's merge must equal longtune's tensor for tensor

  --check-fixture LONGTUNE NAME
                             the same as --check-export for another MoE fixture (tests/fixtures/moe/
                             NAME: mixtral, qwen2moe_shared, ...): a PEFT adapter drawn here (q_proj,
                             v_proj and both expert parameters) is merged by `LONGTUNE export --format
                             hf` (from the HF folder and, when there is one, from model.gguf) and the
                             exports' logits must equal the PEFT model's

Run with /work/pyenv/bin/python.
"""
import argparse
import json
import os
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BASE = os.path.join(ROOT, "tests", "fixtures", "moe", "qwen3moe")
OUT = os.path.join(ROOT, "tests", "fixtures", "moe", "peft_experts")
T = 12
MIN_MARGIN = 2e-3
CASES = {
    "both": dict(r=2, alpha=4.0, params=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], seed=5100),
    "gate_up": dict(r=2, alpha=8.0, params=["mlp.experts.gate_up_proj"], seed=5200),
}


def load_base():
    m = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    m.config._attn_implementation = "eager"
    m.eval()
    return m


def tokens_for(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, 64, (1, T), generator=g)


def logits_and_margin(model, tokens):
    with torch.no_grad():
        out = model(input_ids=tokens, output_router_logits=True, use_cache=False)
    worst = 1.0
    for rl in out.router_logits:
        p = torch.softmax(rl.float(), -1)
        top = torch.topk(p, 3, -1).values
        worst = min(worst, float((top[:, 1] - top[:, 2]).min()))
    return out.logits.float(), worst


def build_case(name, spec):
    for attempt in range(64):
        seed = spec["seed"] + attempt
        torch.manual_seed(seed)
        model = load_base()
        cfg = LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                         target_parameters=spec["params"])
        pm = get_peft_model(model, cfg)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_" in n:
                    p.copy_(0.2 * torch.randn_like(p))
        pm.eval()
        tokens = tokens_for(seed)
        logits, margin = logits_and_margin(pm, tokens)
        if margin >= MIN_MARGIN:
            return pm, tokens, logits, seed
    sys.exit(f"{name}: no seed gives a top-k margin of {MIN_MARGIN}")


def generate():
    for name, spec in CASES.items():
        pm, tokens, logits, seed = build_case(name, spec)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        pm.save_pretrained(d)
        if os.path.exists(os.path.join(d, "README.md")):
            os.remove(os.path.join(d, "README.md"))  # PEFT's model card template
        c = json.load(open(os.path.join(d, "adapter_config.json")))
        c["base_model_name_or_path"] = "tests/fixtures/moe/qwen3moe"
        json.dump(c, open(os.path.join(d, "adapter_config.json"), "w"), indent=2, sort_keys=True)
        sd = load_file(os.path.join(d, "adapter_model.safetensors"))
        assert sorted(c["target_parameters"]) == sorted(spec["params"]), c["target_parameters"]
        for k, v in sd.items():
            print(f"  {name}: {k} {tuple(v.shape)}")
        # The saved adapter reloads to the same model.
        again = PeftModel.from_pretrained(load_base(), d)
        got, _ = logits_and_margin(again, tokens)
        assert torch.equal(got, logits), f"{name}: PEFT's reload differs"
        meta = {"case": name, "seed": str(seed), "r": str(spec["r"]), "alpha": str(spec["alpha"]),
                "generator": "tests/oracle/gen_moe_peft_adapter.py", "transformers": __import__("transformers").__version__,
                "peft": __import__("peft").__version__}
        save_file({"tokens": tokens.to(torch.float32).contiguous(), "logits": logits.contiguous()},
                  os.path.join(d, "expected.safetensors"), metadata=meta)
        print(f"{name}: seed {seed}, written to {d}")


def expected(case):
    e = load_file(os.path.join(OUT, case, "expected.safetensors"))
    return e["tokens"].to(torch.long), e["logits"]


def check_export(folder, case):
    tokens, want = expected(case)
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    m.config._attn_implementation = "eager"
    m.eval()
    got, margin = logits_and_margin(m, tokens)
    diff = float((got - want).abs().max())
    print(f"merged export {folder} vs PEFT ({case}): max |logit diff| {diff:.3g}, top-k margin {margin:.3g}")
    return diff < 1e-4


def check_adapter(folder, case):
    tokens, want = expected(case)
    pm = PeftModel.from_pretrained(load_base(), folder)
    got, _ = logits_and_margin(pm, tokens)
    diff = float((got - want).abs().max())
    ref = load_file(os.path.join(OUT, case, "adapter_model.safetensors"))
    mine = load_file(os.path.join(folder, "adapter_model.safetensors"))
    same = sorted(ref) == sorted(mine) and all(torch.equal(ref[k], mine[k].to(ref[k].dtype)) for k in ref)
    print(f"adapter {folder} in PEFT vs {case}: max |logit diff| {diff:.3g}, tensors identical: {same}")
    return diff < 1e-5 and same


def widened_base(out):
    """The base with its vocabulary widened to the bpe-nfc tokenizer's 1200 ids (embedding and head
    rows repeated), so that llama.cpp has a tokenizer; the adapters do not touch those rows."""
    import shutil
    os.makedirs(out)
    V = 1200
    c = json.load(open(os.path.join(BASE, "config.json")))
    v0 = c["vocab_size"]
    c["vocab_size"] = V
    json.dump(c, open(os.path.join(out, "config.json"), "w"))
    sd = load_file(os.path.join(BASE, "model.safetensors"))
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        sd[k] = sd[k][torch.arange(V) % v0].contiguous()
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    tok = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "bpe-nfc")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, fn), os.path.join(out, fn))


def check_llamacpp(longtune, case):
    import re
    import subprocess
    import tempfile
    import numpy as np
    import gguf
    llama = os.environ.get("LLAMA_BIN", "/work/cache/llama-build/bin")
    work = tempfile.mkdtemp()
    base = os.path.join(work, "base")
    widened_base(base)
    adapter = os.path.join(OUT, case)
    run = lambda cmd: subprocess.run(cmd, check=True, capture_output=True, text=True)
    run([longtune, "export", "--model", base, "--out", work + "/base.gguf", "--format", "gguf", "--outtype", "f32"])
    run([longtune, "export", "--model", base, "--adapter", adapter, "--out", work + "/merged.gguf", "--format", "gguf",
         "--outtype", "f32"])
    run([longtune, "export", "--model", base, "--adapter", adapter, "--out", work + "/lora.gguf", "--format",
         "gguf-lora"])
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        f.write(" ".join(f"record {i}: the quick brown fox jumps over the lazy dog." for i in range(40)))
    ppl = {}
    for name, args in (("merged", ["-m", work + "/merged.gguf"]),
                       ("base_plus_lora", ["-m", work + "/base.gguf", "--lora", work + "/lora.gguf"]),
                       ("base", ["-m", work + "/base.gguf"])):
        out = subprocess.run([os.path.join(llama, "llama-perplexity"), "-f", text, "-c", "32", "-b", "32", "-t", "2"] +
                             args, capture_output=True, text=True)
        m = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
        if not m:
            print(f"llama-perplexity {name}: exit {out.returncode}, no final estimate: {out.stderr[-1500:]}")
            return False
        ppl[name] = float(m.group(1))
    run([os.path.join(llama, "llama-export-lora"), "-m", work + "/base.gguf", "--lora", work + "/lora.gguf", "-o",
         work + "/llama_merged.gguf"])
    a = {t.name: np.array(t.data, dtype=np.float64) for t in gguf.GGUFReader(work + "/llama_merged.gguf").tensors}
    b = {t.name: np.array(t.data, dtype=np.float64) for t in gguf.GGUFReader(work + "/merged.gguf").tensors}
    same_names = set(a) == set(b)
    worst = max(float(np.abs(a[k].reshape(-1) - b[k].reshape(-1)).max()) for k in b) if same_names else float("inf")
    print(f"llama-perplexity -c 32 ({case}): merged {ppl['merged']}, base + --lora {ppl['base_plus_lora']}, "
          f"base alone {ppl['base']}; llama-export-lora vs longtune's merged GGUF: max |diff| {worst:.3g}")
    return abs(ppl["merged"] - ppl["base_plus_lora"]) <= 1e-3 * ppl["merged"] and ppl["base"] != ppl["merged"] and \
        worst < 1e-5


def check_fixture(longtune, name):
    import subprocess
    import tempfile
    base = os.path.join(ROOT, "tests", "fixtures", "moe", name)
    work = tempfile.mkdtemp()
    torch.manual_seed(77)
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    m.config._attn_implementation = "eager"
    pm = get_peft_model(m, LoraConfig(r=2, lora_alpha=4.0, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                      target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(0.2 * torch.randn_like(p))
    pm.eval()
    adapter = os.path.join(work, "adapter")
    pm.save_pretrained(adapter)
    tokens = tokens_for(77)
    want, margin = logits_and_margin(pm, tokens)
    ok = True
    sources = [base] + ([os.path.join(base, "model.gguf")] if os.path.exists(os.path.join(base, "model.gguf")) else [])
    for src in sources:
        out = os.path.join(work, "merged_" + os.path.basename(src))
        subprocess.run([longtune, "export", "--model", src, "--adapter", adapter, "--out", out, "--format", "hf",
                        "--outtype", "f32"], check=True, capture_output=True)
        mm = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        mm.config._attn_implementation = "eager"
        got, _ = logits_and_margin(mm.eval(), tokens)
        diff = float((got - want).abs().max())
        print(f"{name}: merged export of {os.path.relpath(src, ROOT)} vs PEFT: max |logit diff| {diff:.3g} "
              f"(top-k margin {margin:.3g})")
        ok &= diff < 1e-4
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-export", nargs=2, metavar=("DIR", "CASE"))
    ap.add_argument("--check-adapter", nargs=2, metavar=("DIR", "CASE"))
    ap.add_argument("--check-llamacpp", nargs=2, metavar=("LONGTUNE", "CASE"))
    ap.add_argument("--check-fixture", nargs=2, metavar=("LONGTUNE", "NAME"))
    a = ap.parse_args()
    ok = True
    if a.check_fixture:
        ok &= check_fixture(*a.check_fixture)
    if a.check_llamacpp:
        ok &= check_llamacpp(*a.check_llamacpp)
    if a.check_export:
        ok &= check_export(*a.check_export)
    if a.check_adapter:
        ok &= check_adapter(*a.check_adapter)
    if not (a.check_export or a.check_adapter or a.check_llamacpp or a.check_fixture):
        generate()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
