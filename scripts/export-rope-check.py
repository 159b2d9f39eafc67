#!/usr/bin/env python3
"""Oracle check that an export carries its RoPE scaling the way transformers and llama.cpp read it.

Exports a base (default: the tiny committed fixture tests/fixtures/model/llama_tied) with a RoPE
override (default YaRN, factor 4, beta_fast 16, beta_slow 2, attention factor 1.3) as an HF folder
and an f32 GGUF with `longtune export --rope-scaling ...`, then checks:
  - transformers: AutoConfig reads the folder's scaling (type, factor, original context, betas,
    attention factor, max_position_embeddings); its rope init function gives the inverse
    frequencies and attention scaling; AutoModelForCausalLM loads the folder and its fp32 logits
    equal longtune's logits of the exported GGUF (longtune reading the GGUF's scaling keys);
  - gguf-py: the GGUF's {arch}.rope.scaling.* keys give the same scaling as llama.cpp computes it
    (llama-model.cpp / llama-context.cpp: freq_scale = 1/factor, n_ctx_orig_yarn, YaRN's attention
    factor 0.1·ln(factor) + 1 times rope.scaling.attn_factor).
  - with --llama-model GGUF (a real model with a tokenizer, e.g. the default SmolLM2 Q4_1) and
    llama.cpp built: that model exported as f32 GGUF with the same override, and llama.cpp's
    llama-perplexity -c 256 against `longtune eval --text --ctx 256` on the demo data's held-back
    text (the windows llama-perplexity scores): llama.cpp applying the written keys and longtune
    applying them give the same perplexity, which differs from the unscaled export's. llama.cpp's
    llama loader does not read the YaRN betas (it keeps 32 and 1), so it runs once on the keys
    alone and once with --yarn-beta-fast/--yarn-beta-slow, as the export's note says.
Writes bench/results/export-rope.json. Needs /work/pyenv (torch, transformers, gguf).

usage: export-rope-check.py [--model M] [--build build] [--scaling yarn|linear] [--factor F]
                            [--llama-model GGUF [--llama-bin DIR]] [--out FILE]
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import shutil

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_export_check():
    spec = importlib.util.spec_from_file_location("export_check", os.path.join(ROOT, "scripts", "export-check.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gguf_field(r, key):
    f = r.fields.get(key)
    if f is None:
        return None
    v = f.parts[-1]
    try:
        return bytes(v).decode() if f.types and f.types[0].name == "STRING" else float(v[0])
    except Exception:
        return float(v[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "tests", "fixtures", "model", "llama_tied"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--scaling", default="yarn", choices=["yarn", "linear"])
    ap.add_argument("--factor", type=float, default=4.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "export-rope.json"))
    ap.add_argument("--llama-model", help="a GGUF with a tokenizer for the llama-perplexity arm")
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN", "/work/cache/llama-build/bin"))
    ap.add_argument("--data", default=os.path.join(os.path.expanduser("~/.cache/longtune"), "data", "python-faq"))
    args = ap.parse_args()
    ec = load_export_check()
    lt = os.path.join(args.build, "longtune")
    work = tempfile.mkdtemp(prefix="export-rope.")
    rope = ["--rope-scaling", args.scaling, "--rope-factor", str(args.factor)]
    if args.scaling == "yarn":
        rope += ["--yarn-beta-fast", "16", "--yarn-beta-slow", "2", "--rope-attn-factor", "1.3"]
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"bench": "export-rope", "commit": commit,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "config": {"model": os.path.relpath(args.model, ROOT), "override": rope}, "checks": {}}
    chk = result["checks"]
    try:
        hf = os.path.join(work, "hf")
        gg = os.path.join(work, "f32.gguf")
        ec.run([lt, "export", "--model", args.model, "--out", hf, "--format", "hf", "--outtype", "f32"] + rope)
        ec.run([lt, "export", "--model", args.model, "--out", gg, "--format", "gguf", "--outtype", "f32"] + rope)
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        cfg = AutoConfig.from_pretrained(hf)
        rp = dict(getattr(cfg, "rope_parameters", None) or cfg.rope_scaling)
        inv_freq, att = ROPE_INIT_FUNCTIONS[rp["rope_type"]](cfg, "cpu")
        result["transformers"] = {"rope_parameters": rp, "max_position_embeddings": cfg.max_position_embeddings,
                                  "attention_scaling": float(att)}
        orig = int(rp["original_max_position_embeddings"])
        import gguf
        r = gguf.GGUFReader(gg)
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        keys = {k: gguf_field(r, k) for k in r.fields if k.startswith(arch + ".rope") or k == arch + ".context_length"}
        result["gguf"] = keys
        g_type = keys.get(arch + ".rope.scaling.type")
        g_factor = keys.get(arch + ".rope.scaling.factor")
        chk["type_equal"] = g_type == rp["rope_type"]
        chk["factor_equal"] = g_factor is not None and abs(g_factor - float(rp["factor"])) < 1e-6
        chk["original_context_equal"] = keys.get(arch + ".rope.scaling.original_context_length") == orig
        chk["context_length_equal"] = keys.get(arch + ".context_length") == cfg.max_position_embeddings
        if rp["rope_type"] == "yarn":
            # llama.cpp: yarn_attn_factor = (0.1·ln(factor) + 1) · rope.scaling.attn_factor
            mul = keys.get(arch + ".rope.scaling.attn_factor") or 1.0
            f = float(rp["factor"])
            llama_att = (0.1 * math.log(f) + 1.0 if f > 1 else 1.0) * mul
            chk["llama_cpp_attention_factor"] = llama_att
            chk["attention_factor_equal"] = abs(llama_att - float(att)) < 1e-5
            chk["betas_equal"] = (keys.get(arch + ".rope.scaling.yarn_beta_fast") == float(rp["beta_fast"]) and
                                  keys.get(arch + ".rope.scaling.yarn_beta_slow") == float(rp["beta_slow"]))
        model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
        rot = model.model.rotary_emb
        chk["transformers_model_inv_freq_equal_init"] = bool(torch.allclose(rot.inv_freq.float(), inv_freq.float()))
        ids = [int(x) for x in np.random.default_rng(0).integers(0, cfg.vocab_size, 48)]
        with torch.no_grad():
            t_logits = model(torch.tensor([ids])).logits[0].double().numpy()
        helper = ec.build_helper(args.build, work)
        l_gguf = ec.lt_logits(helper, gg, None, ids, work, cfg.vocab_size)
        l_hf = ec.lt_logits(helper, hf, None, ids, work, cfg.vocab_size)
        chk["longtune_gguf_vs_transformers_rel"] = ec.rel(l_gguf, t_logits)
        chk["longtune_hf_vs_transformers_rel"] = ec.rel(l_hf, t_logits)
        # the base without the override gives other logits: the comparison sees the scaling
        l_base = ec.lt_logits(helper, args.model, None, ids, work, cfg.vocab_size)
        chk["base_without_override_rel"] = ec.rel(l_base, t_logits)
        chk["override_moves_logits"] = chk["base_without_override_rel"] > 1e-3
        chk["logits_within_1e-5"] = max(chk["longtune_gguf_vs_transformers_rel"],
                                        chk["longtune_hf_vs_transformers_rel"]) <= 1e-5
        if args.llama_model:
            spec = importlib.util.spec_from_file_location("eval_llamacpp",
                                                          os.path.join(ROOT, "scripts", "eval-llamacpp.py"))
            ev = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(ev)
            betas = ["--yarn-beta-fast", "16", "--yarn-beta-slow", "2"] if args.scaling == "yarn" else []
            text = os.path.join(work, "heldback.txt")
            ev.held_back(os.path.join(args.data, "test.jsonl"), text)
            ppl = {}
            for name, extra in (("scaled", rope), ("unscaled", [])):
                out = os.path.join(work, "llama-%s.gguf" % name)
                ec.run([lt, "export", "--model", args.llama_model, "--out", out, "--format", "gguf",
                        "--outtype", "f32"] + extra)
                ppl[name] = {"longtune_eval": ev.longtune_eval(lt, out, text, 256, 2)["ppl"]}
                if name == "scaled":
                    tool = os.path.join(args.llama_bin, "llama-perplexity")
                    ppl[name]["llama_perplexity"] = ev.llama_ppl(tool, out, text, 256, 2)["ppl"]
                    if betas:  # what the export's note says: llama.cpp's llama loader keeps 32 and 1
                        ppl[name]["llama_perplexity_with_beta_flags"] = ev.llama_ppl(tool, out, text, 256, 2,
                                                                                     betas)["ppl"]
            result["llama_cpp"] = {"model": args.llama_model, "ctx": 256, "perplexity": ppl,
                                   "beta_flags": betas}
            s = ppl["scaled"]
            ll = s.get("llama_perplexity_with_beta_flags", s["llama_perplexity"])
            chk["llama_cpp_keys_only_ratio"] = s["longtune_eval"] / s["llama_perplexity"]
            chk["llama_cpp_scaled_ratio"] = s["longtune_eval"] / ll
            chk["llama_cpp_reads_the_same_scaling"] = abs(chk["llama_cpp_scaled_ratio"] - 1) < 1e-3
            chk["scaling_moves_perplexity"] = abs(s["longtune_eval"] / ppl["unscaled"]["longtune_eval"] - 1) > 1e-2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(chk, indent=1))
    ok = all(v for k, v in chk.items() if isinstance(v, bool))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
