#!/usr/bin/env python3
"""Writes tests/fixtures/rope/cases.json: RoPE frequency tables as transformers computes them.

Each case holds a config.json text (as transformers 5 saves it, or as a transformers 4.x file
reads with rope_scaling), the sequence length the table is for, and what transformers'
ROPE_INIT_FUNCTIONS (modeling_rope_utils) return for it: inv_freq and the attention factor cos and
sin are multiplied by. tests/unit/test_rope_table.c reads each config with longtune's config
reader, computes the table and compares. Run with /work/pyenv/bin/python; CI never runs it.
"""
import json
import os
import random

import torch
from transformers import LlamaConfig, MistralConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "rope", "cases.json")
rng = random.Random(7)


def base(**kw):
    d = dict(vocab_size=64, hidden_size=256, intermediate_size=64, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    d.update(kw)
    return d


def table(cfg, seq_len):
    rp = cfg.rope_parameters
    t = rp.get("rope_type", "default")
    if t == "default":
        D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        return inv, 1.0
    inv, att = ROPE_INIT_FUNCTIONS[t](cfg, "cpu", seq_len=seq_len)
    return inv, float(att)


cases = []


def add(name, cls, cfgdict, seq_lens, legacy=False):
    """legacy: the config text is cfgdict itself (a transformers-4 file); else as saved."""
    cfg = cls(**cfgdict)
    text = json.dumps(dict(cfgdict, model_type=cls.model_type)) if legacy else cfg.to_json_string()
    for T in seq_lens:
        inv, att = table(cfg, T)
        cases.append(dict(name=f"{name} T={T}", config=text, T=T,
                          inv_freq=[float(x) for x in inv.tolist()], attention_factor=att))


add("default theta 10000", LlamaConfig, base(), [128])
add("rope_parameters only (transformers 5)", LlamaConfig,
    base(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), [128])
add("rope_theta top-level (transformers 4)", LlamaConfig, base(rope_theta=1e6), [128], legacy=True)
add("linear 2", LlamaConfig, base(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}), [128])
add("linear 4 legacy type", LlamaConfig, base(rope_theta=50000.0, rope_scaling={"type": "linear", "factor": 4.0}),
    [128], legacy=True)
add("dynamic 2", LlamaConfig, base(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
    [1024, 4096, 12288])
add("dynamic 8 legacy", LlamaConfig, base(max_position_embeddings=2048, rope_theta=10000.0,
                                          rope_scaling={"type": "dynamic", "factor": 8.0}), [32768], legacy=True)
add("yarn 4", LlamaConfig, base(max_position_embeddings=16384, rope_parameters={
    "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 4096}), [8192])
add("yarn betas no truncate", LlamaConfig, base(max_position_embeddings=32768, rope_parameters={
    "rope_type": "yarn", "factor": 8.0, "rope_theta": 1e6, "original_max_position_embeddings": 4096,
    "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}), [8192])
add("yarn mscale", LlamaConfig, base(max_position_embeddings=16384, rope_parameters={
    "rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 4096,
    "mscale": 0.707, "mscale_all_dim": 1.0}), [8192])
add("yarn attention_factor legacy", LlamaConfig, base(max_position_embeddings=16384, rope_theta=10000.0, rope_scaling={
    "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "attention_factor": 1.25}),
    [8192], legacy=True)
add("yarn factor from contexts", MistralConfig, base(max_position_embeddings=8192, rope_parameters={
    "rope_type": "yarn", "rope_theta": 10000.0, "original_max_position_embeddings": 2048, "factor": None}), [4096])
add("llama3", LlamaConfig, base(max_position_embeddings=131072, rope_parameters={
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192, "rope_theta": 500000.0}), [4096])
half = 48  # Phi-3-mini's head dim 96
short = [round(1.0 + 0.05 * rng.random(), 6) for _ in range(half)]
long_ = [round(1.0 + 30.0 * rng.random(), 6) for _ in range(half)]
phi = dict(vocab_size=64, hidden_size=384, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
           num_key_value_heads=4, max_position_embeddings=131072, original_max_position_embeddings=4096,
           pad_token_id=0, bos_token_id=1, eos_token_id=2,
           rope_parameters={"rope_type": "longrope", "short_factor": short, "long_factor": long_,
                            "rope_theta": 10000.0})
add("longrope phi3", Phi3Config, phi, [2048, 4096, 8192])
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump(cases, f, indent=0)
print(f"{len(cases)} cases -> {OUT}")
