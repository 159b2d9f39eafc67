#!/usr/bin/env python3
"""Writes a tiny random Llama (Hugging Face folder: config.json, model.safetensors in f32, tied
embeddings) with the bpe-nfc fixture tokenizer (1200 ids, ChatML template) for the CLI reliability
tests and scripts/long-run.sh. Standard library only; not a model anyone should train for real.
usage: tiny_model.py OUT_DIR [--vocab V] [--hidden C] [--layers L] [--heads H] [--kv-heads HKV] [--seed S] [--bf16]
(--bf16: matrices stored as bf16, as the CUDA loss needs its head; norms stay f32; heads default 2
and 1; Ulysses context parallel over K ranks needs HKV a multiple of K)"""
import argparse, json, os, random, shutil, struct

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--vocab", type=int, default=1200)
ap.add_argument("--hidden", type=int, default=16)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--heads", type=int, default=2)
ap.add_argument("--kv-heads", type=int, default=1)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--bf16", action="store_true")
a = ap.parse_args()
V, C, L, H, HKV = a.vocab, a.hidden, a.layers, a.heads, a.kv_heads
D, F = C // H, 2 * C
rng = random.Random(a.seed)
os.makedirs(a.out, exist_ok=True)
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
       "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": HKV,
       "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
       "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"))
tensors = [("model.embed_tokens.weight", [V, C], 1.0), ("model.norm.weight", [C], None)]
for l in range(L):
    p = "model.layers.%d." % l
    tensors += [(p + "input_layernorm.weight", [C], None), (p + "post_attention_layernorm.weight", [C], None),
                (p + "self_attn.q_proj.weight", [H * D, C], 0.2), (p + "self_attn.k_proj.weight", [HKV * D, C], 0.2),
                (p + "self_attn.v_proj.weight", [HKV * D, C], 0.2), (p + "self_attn.o_proj.weight", [C, H * D], 0.2),
                (p + "mlp.gate_proj.weight", [F, C], 0.2), (p + "mlp.up_proj.weight", [F, C], 0.2),
                (p + "mlp.down_proj.weight", [C, F], 0.2)]
header, blobs, off = {}, [], 0
for name, shape, std in tensors:
    n = 1
    for s in shape:
        n *= s
    vals = [1.0 + 0.05 * rng.gauss(0, 1) if std is None else std * rng.gauss(0, 1) for _ in range(n)]
    if a.bf16 and len(shape) == 2:
        # Round to nearest even on the upper 16 bits of each f32.
        bits = struct.unpack("<%dI" % n, struct.pack("<%df" % n, *vals))
        blob = struct.pack("<%dH" % n, *[((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF for b in bits])
        dt = "BF16"
    else:
        blob = struct.pack("<%df" % n, *vals)
        dt = "F32"
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
    blobs.append(blob)
    off += len(blob)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "tokenizer", "bpe-nfc")
for fn in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tok, fn), os.path.join(a.out, fn))
