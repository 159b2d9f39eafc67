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
import argparse
import json
import os

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

B, T = 2, 12
RANK, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

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
    cfg = dict(model_type=spec["model_type"], vocab_size=96, hidden_size=64, intermediate_size=128,
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
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # norms away from 1 so a wrong one shows
            else:
                p.copy_(0.08 * torch.randn_like(p))
            if spec["dtype"] == "bf16":
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    model.eval()
    return cfg, model


def permute(w, n_head, n_head_kv):
    """llama.cpp's LlamaModel.permute: rotate-half rows → interleaved rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, cfg, sd):
    import math

    import gguf
    import numpy as np

    w = gguf.GGUFWriter(path, "llama")
    H, Hkv, C = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    D = C // H
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(C)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
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
            if mod == "self_attn.q_proj":
                a = permute(a, H, H)
            elif mod == "self_attn.k_proj":
                a = permute(a, H, Hkv)
        w.add_tensor(n, a.contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    # Row 0 packs two sequences (5 + 7 tokens); row 1 holds one of 12 with the first 3 targets
    # ignored (a prompt mask) — offsets as attention.h: (B, S+1) with S = 2, row 1 padded by T.
    seqs = [(0, 0, 5), (0, 5, 12), (1, 0, 12)]
    tokens = torch.randint(3, 96, (B, T), generator=g)
    targets = torch.full((B, T), -100)
    positions = torch.zeros((B, T), dtype=torch.long)
    for r, a, b in seqs:
        targets[r, a:b - 1] = tokens[r, a + 1:b]
        positions[r, a:b] = torch.arange(b - a)
    targets[1, 0:3] = -100
    offsets = torch.tensor([[0, 5, 12], [0, 12, 12]])
    return seqs, tokens, targets, positions, offsets


def run_case(out_dir, case, spec, seed):
    cfg, model = build(case, spec, seed)
    os.makedirs(os.path.join(out_dir, case), exist_ok=True)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if spec["tie"]:
        sd.pop("lm_head.weight", None)
    if spec["dtype"] == "bf16":
        sd = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    save_file(sd, os.path.join(out_dir, case, "model.safetensors"), metadata={"format": "pt"})
    if spec["model_type"] == "llama":
        write_gguf(os.path.join(out_dir, case, "model.gguf"), cfg, sd)
    cfg_out = dict(cfg)
    cfg_out["architectures"] = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                 "qwen3": "Qwen3ForCausalLM"}[spec["model_type"]]]
    with open(os.path.join(out_dir, case, "config.json"), "w") as f:
        json.dump(cfg_out, f, indent=1)

    last_k = spec.get("last_k", 2)
    lcfg = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS,
                      layers_to_transform=list(range(2 - last_k, 2)), bias="none")
    peft_model = get_peft_model(model, lcfg)
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # B = 0 at init would make every A gradient zero: randomise both
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn_like(p))
    peft_model.train()  # dropout is 0; train mode only to keep autograd semantics obvious

    seqs, tokens, targets, positions, offsets = batch(seed + 2)
    logits = torch.zeros(B, T, 96)
    total = torch.zeros(())
    token_loss = torch.zeros(B, T)
    n_tok = int((targets != -100).sum())
    for r, a, b in seqs:
        ids = tokens[r, a:b].unsqueeze(0)
        out = peft_model(input_ids=ids, position_ids=torch.arange(b - a).unsqueeze(0))
        lg = out.logits[0].float()
        logits[r, a:b] = lg.detach()
        tl = torch.nn.functional.cross_entropy(lg, targets[r, a:b], ignore_index=-100, reduction="none")
        token_loss[r, a:b] = tl.detach()
        total = total + tl.sum()
    loss = total / n_tok
    loss.backward()

    exp = {
        "tokens": tokens.float(), "targets": targets.float(), "positions": positions.float(),
        "seq_offsets": offsets.float(), "logits": logits, "loss": loss.detach().reshape(1),
        "token_loss": token_loss,
    }
    n_lora = 0
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            key = name.replace(".default", "")
            exp[key] = p.detach().clone().contiguous()
            exp[key + ".grad"] = p.grad.detach().clone().contiguous()
            n_lora += 1
    meta = {"rank": str(RANK), "alpha": str(ALPHA), "num_layers": str(last_k), "n_lora": str(n_lora),
            "B": str(B), "T": str(T), "S": "2", "generator": "tests/oracle/gen_model_fixtures.py",
            "torch": torch.__version__}
    save_file(exp, os.path.join(out_dir, case, "expected.safetensors"), metadata=meta)
    print(f"{case}: loss {loss.item():.6f}, {n_lora} LoRA tensors, {n_tok} targets")


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "model"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for i, (case, spec) in enumerate(sorted(CASES.items())):
        run_case(args.out, case, spec, 1000 + 17 * i)


if __name__ == "__main__":
    main()
