#!/usr/bin/env python3
"""Oracle fixtures for tests/e2e/test_family.c: tiny random Mistral and Phi-3 models saved by
transformers, with the expected logits, loss, per-token loss and LoRA gradients of one fp32
forward/backward on a packed batch (each sequence run alone, as gen_model_fixtures.py does).

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
import argparse
import json
import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

B, T, V = 2, 12, 64
RANK, ALPHA = 4, 8.0
SCALE = ALPHA / RANK

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
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.eval()
    return cfg, config, model


def permute(w, n_head):
    """llama.cpp's LlamaModel.permute: rotate-half rows → interleaved rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, cfg, config, sd):
    import math

    import gguf
    import numpy as np

    phi = cfg["model_type"] == "phi3"
    w = gguf.GGUFWriter(path, "phi3" if phi else "llama")
    H, Hkv, C = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    D = cfg.get("head_dim") or C // H
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(C)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
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
    for k, v in sd.items():
        a = v.float()
        if k == "model.embed_tokens.weight":
            n = "token_embd.weight"
        elif k == "lm_head.weight":
            n = "output.weight"
        elif k == "model.norm.weight":
            n = "output_norm.weight"
        else:
            parts = k.split(".")
            layer, mod = parts[2], ".".join(parts[3:-1])
            n = f"blk.{layer}.{names[mod]}.weight"
            if not phi and mod == "self_attn.q_proj":
                a = permute(a, H)
            elif not phi and mod == "self_attn.k_proj":
                a = permute(a, Hkv)
        w.add_tensor(n, a.contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    seqs = [(0, 0, 5), (0, 5, 12), (1, 0, 12)]
    tokens = torch.randint(4, V, (B, T), generator=g)
    targets = torch.full((B, T), -100)
    positions = torch.zeros((B, T), dtype=torch.long)
    for r, a, b in seqs:
        targets[r, a:b - 1] = tokens[r, a + 1:b]
        positions[r, a:b] = torch.arange(b - a)
    targets[1, 0:3] = -100
    offsets = torch.tensor([[0, 5, 12], [0, 12, 12]])
    return seqs, tokens, targets, positions, offsets


def run(model, seqs, tokens, targets):
    logits = torch.zeros(B, T, V)
    token_loss = torch.zeros(B, T)
    total = torch.zeros(())
    for r, a, b in seqs:
        out = model(input_ids=tokens[r, a:b].unsqueeze(0), position_ids=torch.arange(b - a).unsqueeze(0))
        lg = out.logits[0].float()
        logits[r, a:b] = lg.detach()
        tl = torch.nn.functional.cross_entropy(lg, targets[r, a:b], ignore_index=-100, reduction="none")
        token_loss[r, a:b] = tl.detach()
        total = total + tl.sum()
    return logits, token_loss, total / int((targets != -100).sum())


def run_case(out_dir, case, spec, seed):
    cfg, config, model = build(spec, seed)
    d = os.path.join(out_dir, case)
    os.makedirs(d, exist_ok=True)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    model.save_pretrained(d, safe_serialization=True)  # config.json as transformers writes it
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    if spec.get("gguf"):
        write_gguf(os.path.join(d, "model.gguf"), cfg, config, sd)
    phi = spec["model_type"] == "phi3"
    targets_ = (["qkv_proj", "o_proj", "gate_up_proj", "down_proj"] if phi else
                ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                  target_modules=targets_, bias="none"))
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn_like(p))
    seqs, tokens, targets, positions, offsets = batch(seed + 2)
    logits, token_loss, loss = run(peft_model, seqs, tokens, targets)
    loss.backward()
    fused = {n.replace(".default", ""): p for n, p in peft_model.named_parameters() if "lora_" in n}
    exp = {"tokens": tokens.float(), "targets": targets.float(), "positions": positions.float(),
           "seq_offsets": offsets.float(), "logits": logits, "loss": loss.detach().reshape(1),
           "token_loss": token_loss}
    for k, p in fused.items():
        exp[k] = p.detach().clone().contiguous()
        exp[k + ".grad"] = p.grad.detach().clone().contiguous()
    n_lora = sum(1 for k in exp if k.endswith(".grad"))
    meta = {"rank": str(RANK), "alpha": str(ALPHA), "num_layers": "2", "n_lora": str(n_lora), "B": str(B),
            "T": str(T), "S": "2", "generator": "tests/oracle/gen_family_fixtures.py", "torch": torch.__version__}
    save_file(exp, os.path.join(d, "expected.safetensors"), metadata=meta)
    print(f"{case}: loss {loss.item():.6f}, {n_lora} LoRA tensors")


def write_bad_ggufs(out_dir):
    """Metadata the loader must refuse, each in an otherwise plausible phi3 header."""
    import gguf
    import numpy as np

    d = os.path.join(out_dir, "bad")
    os.makedirs(d, exist_ok=True)

    def header(name, scaling=None, factors=4, eot=3):
        w = gguf.GGUFWriter(os.path.join(d, name), "phi3")
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(32)
        w.add_feed_forward_length(64)
        w.add_head_count(4)
        w.add_head_count_kv(2)
        w.add_rope_dimension_count(8)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_scaling_orig_ctx_len(16)
        if scaling:
            w.add_string("phi3.rope.scaling.type", scaling)
        w.add_int32("tokenizer.ggml.eot_token_id", eot)
        w.add_tensor("rope_factors_long.weight", np.ones(factors, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.ones(4, dtype=np.float32))
        w.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    header("rope_type_su.gguf", scaling="su")
    header("rope_factors_short_list.gguf", factors=3)
    header("eot_negative.gguf", eot=-1)


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "family"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for i, (case, spec) in enumerate(sorted(CASES.items())):
        run_case(args.out, case, spec, 2000 + 31 * i)
    write_bad_ggufs(args.out)


if __name__ == "__main__":
    main()
