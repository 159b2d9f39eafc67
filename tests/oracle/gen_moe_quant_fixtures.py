#!/usr/bin/env python3
"""A block-quantized Qwen3-MoE GGUF and its f32 twin, for the model test that quantized experts are
read as they are stored (tests/e2e/test_model_moe.c): a tiny random qwen3moe (C=64, 2 layers,
4 experts of width 32, top-2) written with gguf-py as llama.cpp's converter lays it out
(blk.N.ffn_{gate,up,down}_exps as ggml ne {cols, rows, E}, router blk.N.ffn_gate_inp), the experts
as Q4_0 (gate, up) and Q8_0 (down), everything else f32:
  model_q.gguf    the quantized file
  model_f32.gguf  the same model with every expert dequantized to f32 (gguf-py's dequantize),
                  so the two files hold the same values and must give the same logits.
quant_hd64/ holds the same pair with head_dim 64 (H = 2 heads of 64), a head size the CUDA attention
kernels serve. `--only quant_hd64` writes that folder alone.
Run with /work/pyenv/bin/python; CI never runs this, only its outputs."""
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

import argparse

V, C, F, L, H, HKV, E, K = 48, 64, 32, 2, 2, 1, 4, 2
VARIANTS = {"quant": dict(D=32, seed=4242), "quant_hd64": dict(D=64, seed=4345)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="one variant folder to write (default all)")
    args = ap.parse_args()
    if args.only and args.only not in VARIANTS:
        raise SystemExit(f"unknown variant {args.only}")
    for name, v in VARIANTS.items():
        if not args.only or args.only == name:
            write_variant(name, v["D"], v["seed"])


def write_variant(folder, D, seed):
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "..", "fixtures", "moe", folder)
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    t = {}

    def r(*shape, sd=0.15):
        return (sd * rng.standard_normal(shape)).astype(np.float32)

    t["token_embd.weight"] = r(V, C, sd=0.5)
    t["output_norm.weight"] = (1 + r(C, sd=0.1)).astype(np.float32)
    t["output.weight"] = r(V, C)
    exps = {}
    for l in range(L):
        t[f"blk.{l}.attn_norm.weight"] = (1 + r(C, sd=0.1)).astype(np.float32)
        t[f"blk.{l}.ffn_norm.weight"] = (1 + r(C, sd=0.1)).astype(np.float32)
        t[f"blk.{l}.attn_q.weight"] = r(H * D, C)
        t[f"blk.{l}.attn_k.weight"] = r(HKV * D, C)
        t[f"blk.{l}.attn_v.weight"] = r(HKV * D, C)
        t[f"blk.{l}.attn_output.weight"] = r(C, H * D)
        t[f"blk.{l}.attn_q_norm.weight"] = (1 + r(D, sd=0.1)).astype(np.float32)
        t[f"blk.{l}.attn_k_norm.weight"] = (1 + r(D, sd=0.1)).astype(np.float32)
        t[f"blk.{l}.ffn_gate_inp.weight"] = r(E, C, sd=0.3)
        exps[f"blk.{l}.ffn_gate_exps.weight"] = (r(E, F, C), Q.Q4_0)
        exps[f"blk.{l}.ffn_up_exps.weight"] = (r(E, F, C), Q.Q4_0)
        exps[f"blk.{l}.ffn_down_exps.weight"] = (r(E, C, F), Q.Q8_0)
    for name, quantized in (("model_q.gguf", True), ("model_f32.gguf", False)):
        w = gguf.GGUFWriter(os.path.join(out, name), "qwen3moe")
        w.add_block_count(L)
        w.add_context_length(64)
        w.add_embedding_length(C)
        w.add_feed_forward_length(F)
        w.add_head_count(H)
        w.add_head_count_kv(HKV)
        w.add_key_length(D)
        w.add_value_length(D)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_expert_count(E)
        w.add_expert_used_count(K)
        w.add_expert_feed_forward_length(F)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        for n, a in t.items():
            w.add_tensor(n, a)
        for n, (a, qt) in exps.items():
            q = quants.quantize(a, qt)
            if quantized:
                w.add_tensor(n, q, raw_shape=q.shape, raw_dtype=qt)
            else:
                w.add_tensor(n, np.ascontiguousarray(quants.dequantize(q, qt), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(os.path.join(out, name), 0o644)
    print(f"{folder}: written")


if __name__ == "__main__":
    main()
