#!/usr/bin/env python3
"""tests/fixtures/moe/qwen2moe_shared/model.gguf: the Qwen2-MoE fixture (gen_moe_fixtures.py) as
llama.cpp's converter writes arch qwen2moe: q/k/v biases, experts stacked as
blk.N.ffn_{gate,up,down}_exps (numpy (E, rows, cols)), router blk.N.ffn_gate_inp, the shared expert
as blk.N.ffn_{gate,up,down}_shexp and its gate blk.N.ffn_gate_inp_shexp (1-D, hidden_size), keys
qwen2moe.expert_count / expert_used_count / expert_feed_forward_length /
expert_shared_feed_forward_length; llama.cpp's qwen2moe does not renormalise the top-k weights,
as the fixture's config (norm_topk_prob false). Run after gen_moe_fixtures.py with
/work/pyenv/bin/python; CI never runs this, only its outputs."""
import json
import os

import gguf
import numpy as np
from safetensors.numpy import load_file


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    d = os.path.join(here, "..", "fixtures", "moe", "qwen2moe_shared")
    c = json.load(open(os.path.join(d, "config.json")))
    sd = load_file(os.path.join(d, "model.safetensors"))
    assert not c["norm_topk_prob"]
    L, E, C, H = c["num_hidden_layers"], c["num_experts"], c["hidden_size"], c["num_attention_heads"]
    w = gguf.GGUFWriter(os.path.join(d, "model.gguf"), "qwen2moe")
    w.add_block_count(L)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(C)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    t = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
         "output.weight": sd["lm_head.weight"]}
    for l in range(L):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        for x, y in (("q", "q"), ("k", "k"), ("v", "v")):
            t[b + f"attn_{y}.weight"] = sd[p + f"self_attn.{x}_proj.weight"]
            t[b + f"attn_{y}.bias"] = sd[p + f"self_attn.{x}_proj.bias"]
        t[b + "attn_output.weight"] = sd[p + "self_attn.o_proj.weight"]
        t[b + "attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        t[b + "ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        t[b + "ffn_gate_inp.weight"] = sd[p + "mlp.gate.weight"]
        for g, h in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            t[b + f"ffn_{g}_exps.weight"] = np.stack([sd[p + f"mlp.experts.{e}.{h}.weight"] for e in range(E)], 0)
            t[b + f"ffn_{g}_shexp.weight"] = sd[p + f"mlp.shared_expert.{h}.weight"]
        t[b + "ffn_gate_inp_shexp.weight"] = sd[p + "mlp.shared_expert_gate.weight"].reshape(-1)
    for n, a in t.items():
        w.add_tensor(n, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.chmod(os.path.join(d, "model.gguf"), 0o644)
    print("qwen2moe_shared/model.gguf: written")


if __name__ == "__main__":
    main()
