#!/usr/bin/env python3
"""Oracle fixtures for tests/e2e/test_family.c: tiny random Mistral and Phi-3 models saved by
transformers, with the expected logits, loss, per-token loss and LoRA gradients of one fp32
forward/backward on a packed batch (each sequence run alone: oracle_common.run_packed).

Cases: Mistral v0.1 (sliding_window 4), v0.3 (sliding_window null), Nemo-style (explicit head_dim,
H*D != C); Phi-3-mini-4k style (fused qkv_proj / gate_up_proj, no scaling) and Phi-3-128k style
(longrope with every sequence past original_max_position_embeddings, so transformers uses the long
factors as longtune does for that run length, and a sliding window). mistral_v01 and
phi3_longrope are also written as model.gguf the way llama.cpp's converter does (llama arch with
permuted Q/K rows and attention.sliding_window; phi3 arch with attn_qkv, the fused ffn_up,
rope_factors_long/short.weight and rope.scaling.attn_factor).

LoRA through PEFT: Mistral on q/k/v/o/gate/up/down, Phi-3 on its fused modules (qkv_proj, o_proj,
gate_up_proj, down_proj, as PEFT targets them); longtune splits the fused base weights at load and
keeps one adapter per fused module (k and v use q's A, their B rows continue q's), so the tensors
and gradients compare name for name.

Run with /work/pyenv/bin/python; CI never runs this, only its outputs.
"""
import math
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import oracle_common as oc

V = 64

CASES = {
    "mistral_v01": dict(model_type="mistral", extra={"sliding_window": 4}, gguf=True),
    "mistral_v03": dict(model_type="mistral", extra={"sliding_window": None, "rope_theta": 1e6}),
    "mistral_nemo": dict(model_type="mistral", extra={"sliding_window": None, "head_dim": 12}),
    "phi3_mini": dict(model_type="phi3", extra={"sliding_window": None}),
    "phi3_longrope": dict(model_type="phi3", gguf=True, extra={
        "sliding_window": 6, "original_max_position_embeddings": 4,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.05, 1.1, 1.2],
                         "long_factor": [1.0, 2.5, 6.0, 15.0]}}),
}


def build(spec, seed):
    torch.manual_seed(seed)
    cfg = dict(model_type=spec["model_type"], vocab_size=V, hidden_size=32, intermediate_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
               max_position_embeddings=64, tie_word_embeddings=False, hidden_act="silu", bos_token_id=1,
               eos_token_id=2, pad_token_id=0, rope_theta=10000.0, attention_dropout=0.0)
    if spec["model_type"] == "phi3":
        cfg.update(resid_pdrop=0.0, embd_pdrop=0.0, original_max_position_embeddings=64)
    cfg.update(spec["extra"])
    config = AutoConfig.for_model(**cfg)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    oc.randomize_weights(model, 0.15)
    return cfg, config, model


def write_gguf(path, cfg, config, sd):
    import gguf
    import numpy as np

    phi = cfg["model_type"] == "phi3"
    w = gguf.GGUFWriter(path, "phi3" if phi else "llama")
    H, Hkv, C = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    D = cfg.get("head_dim") or C // H
    oc.gguf_shape(w, cfg["num_hidden_layers"], cfg["max_position_embeddings"], C, cfg["intermediate_size"], H, Hkv)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_eot_token_id(3)
    w.add_sliding_window(cfg.get("sliding_window") or 0)
    if phi:
        rs = cfg.get("rope_scaling")
        orig = cfg["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(orig)
        if rs:
            scale = cfg["max_position_embeddings"] / orig
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
            w.add_tensor("rope_factors_long.weight", np.array(rs["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rs["short_factor"], dtype=np.float32))
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}

    def convert(k, mod, a):
        if not phi and mod == "self_attn.q_proj":
            return oc.permute(a, H)
        if not phi and mod == "self_attn.k_proj":
            return oc.permute(a, Hkv)
        return a

    oc.gguf_tensors(w, sd, names, convert)
    oc.gguf_finish(w)


def run_case(out_dir, case, spec, seed):
    cfg, config, model = build(spec, seed)
    d = os.path.join(out_dir, case)
    os.makedirs(d, exist_ok=True)
    sd = oc.state_dict(model)
    model.save_pretrained(d, safe_serialization=True)  # config.json as transformers writes it
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    if spec.get("gguf"):
        write_gguf(os.path.join(d, "model.gguf"), cfg, config, sd)
    phi = spec["model_type"] == "phi3"
    targets_ = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"] if phi else oc.TARGETS
    peft_model = oc.attach_lora(model, seed + 1, targets=targets_, train=False)
    batch = oc.packed_batch(seed + 2, V, lo=4)
    logits, token_loss, loss = oc.run_packed(peft_model, batch[0], batch[1], V)
    loss.backward()
    n_lora = oc.write_expected(os.path.join(d, "expected.safetensors"), peft_model, batch, logits, token_loss, loss,
                               "tests/oracle/gen_family_fixtures.py", 2)
    print(f"{case}: loss {loss.item():.6f}, {n_lora} LoRA tensors")


def write_bad_ggufs(out_dir):
    """Metadata the loader must refuse, each in an otherwise plausible phi3 header."""
    import gguf
    import numpy as np

    d = os.path.join(out_dir, "bad")
    os.makedirs(d, exist_ok=True)

    def header(name, scaling=None, factors=4, eot=3):
        w = gguf.GGUFWriter(os.path.join(d, name), "phi3")
        oc.gguf_shape(w, 1, 64, 32, 64, 4, 2)
        w.add_rope_dimension_count(8)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_scaling_orig_ctx_len(16)
        if scaling:
            w.add_string("phi3.rope.scaling.type", scaling)
        w.add_int32("tokenizer.ggml.eot_token_id", eot)
        w.add_tensor("rope_factors_long.weight", np.ones(factors, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.ones(4, dtype=np.float32))
        w.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
        oc.gguf_finish(w)

    header("rope_type_su.gguf", scaling="su")
    header("rope_factors_short_list.gguf", factors=3)
    header("eot_negative.gguf", eot=-1)


def main():
    out = oc.out_arg("family")
    torch.set_num_threads(1)
    for i, (case, spec) in enumerate(sorted(CASES.items())):
        run_case(out, case, spec, 2000 + 31 * i)
    write_bad_ggufs(out)


if __name__ == "__main__":
    main()
