#!/usr/bin/env python3
"""Oracle fixtures for tests/e2e/test_model.c: tiny random Llama / Qwen2 / Qwen3 models (tied and
untied, one with llama3 rope scaling) built with transformers, LoRA adapters from PEFT, and the
expected logits, loss and every LoRA gradient after one fp32 forward/backward on a packed batch.

Packing is reproduced the unambiguous way: every sequence is run alone (batch of one, positions
from 0) and its logits are placed where the packed row holds it; the loss is the mean over all
non-ignored targets of the batch, as longtune's default grad_scale. Writes, per case,
tests/fixtures/model/<case>/{config.json, model.safetensors, expected.safetensors}. Integers are
stored as F32 (exact below 2^24) because the fixture reader takes F32/F16/BF16 only.

The Llama cases are also written as model.gguf the way llama.cpp's converter does (Q/K rows
permuted for interleaved RoPE, llama3 scaling as a rope_freqs.weight factor tensor, no
output.weight when tied; f32 so the comparison stays exact) to test the GGUF loader against the
same expected values.

Needs torch, transformers, peft, safetensors and gguf (pip); CI never runs this, only its outputs.
Usage: python3 tests/oracle/gen_model_fixtures.py [--out tests/fixtures/model]
"""
import json
import math
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import oracle_common as oc

V = 96

CASES = {
    # SmolLM2-like: Llama with tied embeddings; weights stored in bf16 (computed in fp32).
    "llama_tied": dict(model_type="llama", tie=True, dtype="bf16", extra={}),
    # Llama 3.x rope scaling, untied head, LoRA on the last layer only.
    "llama3_untied": dict(model_type="llama", tie=False, dtype="f32", last_k=1,
                          extra={"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 16},
                                 "rope_theta": 500000.0}),
    "qwen2_untied": dict(model_type="qwen2", tie=False, dtype="bf16", extra={}),
    "qwen3_tied": dict(model_type="qwen3", tie=True, dtype="f32", extra={"head_dim": 24}),
}


def build(case, spec, seed):
    torch.manual_seed(seed)
    cfg = dict(model_type=spec["model_type"], vocab_size=V, hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
               max_position_embeddings=64, tie_word_embeddings=spec["tie"], hidden_act="silu",
               bos_token_id=1, eos_token_id=2, rope_theta=10000.0, attention_dropout=0.0)
    if spec["model_type"] == "llama":
        cfg.update(attention_bias=False, mlp_bias=False)
    if spec["model_type"] in ("qwen2", "qwen3"):
        cfg.update(use_sliding_window=False, sliding_window=None)
    if spec["model_type"] == "qwen3":
        cfg.update(attention_bias=False)
    cfg.update(spec["extra"])
    config = AutoConfig.for_model(**cfg)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    oc.randomize_weights(model, 0.08, bf16=spec["dtype"] == "bf16")
    return cfg, model


def write_gguf(path, cfg, sd):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(path, "llama")
    H, Hkv, C = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    D = C // H
    oc.gguf_shape(w, cfg["num_hidden_layers"], cfg["max_position_embeddings"], C, cfg["intermediate_size"], H, Hkv)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(D)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type") == "llama3":
        base, factor = cfg["rope_theta"], rs["factor"]
        lo, hi, old = rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        freqs = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        factors = []
        for f in freqs.tolist():
            wl = 2 * math.pi / f
            if wl < old / hi:
                factors.append(1.0)
            elif wl > old / lo:
                factors.append(factor)
            else:
                sm = (old / wl - lo) / (hi - lo)
                factors.append(1 / ((1 - sm) / factor + sm))
        w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))

    def convert(k, mod, a):
        if mod == "self_attn.q_proj":
            return oc.permute(a, H)
        if mod == "self_attn.k_proj":
            return oc.permute(a, Hkv)
        return a

    oc.gguf_tensors(w, sd, names, convert)
    oc.gguf_finish(w)


def run_case(out_dir, case, spec, seed):
    cfg, model = build(case, spec, seed)
    d = os.path.join(out_dir, case)
    os.makedirs(d, exist_ok=True)
    sd = oc.state_dict(model, tied=spec["tie"], bf16=spec["dtype"] == "bf16")
    oc.save_model(os.path.join(d, "model.safetensors"), sd)
    if spec["model_type"] == "llama":
        write_gguf(os.path.join(d, "model.gguf"), cfg, sd)
    cfg_out = dict(cfg)
    cfg_out["architectures"] = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                 "qwen3": "Qwen3ForCausalLM"}[spec["model_type"]]]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_out, f, indent=1)

    last_k = spec.get("last_k", 2)
    peft_model = oc.attach_lora(model, seed + 1, layers=list(range(2 - last_k, 2)))
    batch = oc.packed_batch(seed + 2, V)
    logits, token_loss, loss = oc.run_packed(peft_model, batch[0], batch[1], V)
    loss.backward()
    n_lora = oc.write_expected(os.path.join(d, "expected.safetensors"), peft_model, batch, logits, token_loss, loss,
                               "tests/oracle/gen_model_fixtures.py", last_k)
    n_tok = int((batch[1] != -100).sum())
    print(f"{case}: loss {loss.item():.6f}, {n_lora} LoRA tensors, {n_tok} targets")


def main():
    out = oc.out_arg("model")
    torch.set_num_threads(1)
    for i, (case, spec) in enumerate(sorted(CASES.items())):
        run_case(out, case, spec, 1000 + 17 * i)


if __name__ == "__main__":
    main()
