#!/usr/bin/env python3
"""Oracle fixtures for tests/e2e/test_model_gemma.c: tiny random Gemma 2 and Gemma 3 (text) models
built with transformers (eager attention: SDPA ignores the attention softcap), LoRA adapters from
PEFT, and the expected logits, loss and every LoRA gradient after one fp32 forward/backward on a
packed batch (oracle_common's batch and packing, as gen_model_fixtures.py: every sequence run
alone from position 0, the loss the mean over the batch's targets).

The sliding window (4 or 5 keys) is shorter than the longer sequences (7 and 12 tokens), so
sliding and global layers both matter; the softcaps are small enough to bend the scores and
logits; the norm weights are random around 0 (Gemma's RMSNorm multiplies by 1 + w).

Cases, per tests/fixtures/gemma/<case>/{config.json, model.safetensors, expected.safetensors}:
  gemma2       Gemma 2: even layers slide, attention and final softcaps; config.json written in
               the transformers 4 style (rope_theta, no layer_types) as the Hub's checkpoints are.
  gemma3       Gemma 3 text: q/k norms, a global layer every 3rd (layer_types), the sliding layers'
               own RoPE base; config.json as transformers 5 writes it (rope_parameters per type).
  gemma3_d256  Gemma 3 with head_dim 256 and query_pre_attn_scalar 48 (a score scale other than
               1/sqrt(D)).
Weights are stored in bf16 to keep the files small (the models compute in fp32).
gemma2 and gemma3 are also written as model.gguf the way llama.cpp's converter writes them
(1 added to every norm weight, no output.weight, softcaps, sliding window and the swa RoPE base
as metadata; the same values in f32), to test the GGUF loader against the same expected values. GGUF holds no
query_pre_attn_scalar (llama.cpp uses 1/sqrt(D) below 27B), so those two cases keep it at D; their
head dim 64 is one the CUDA attention kernels serve (tests/e2e/test_cuda_gemma.c).

Needs torch, transformers, peft, safetensors and gguf; CI never runs this, only its outputs.
Usage: python3 tests/oracle/gen_gemma_fixtures.py [--out tests/fixtures/gemma]
"""
import json
import os

import torch
from transformers import AutoModelForCausalLM, Gemma2Config
from transformers.models.gemma3 import Gemma3TextConfig

import oracle_common as oc

V = 96

CASES = {
    "gemma2": dict(kind="gemma2", L=3, D=64, qpas=64, window=5, attn_cap=1.0, final_cap=2.0, dtype="bf16",
                   last_k=2, gguf=True),
    "gemma3": dict(kind="gemma3", L=3, D=64, qpas=64, window=4, attn_cap=None, final_cap=2.5, dtype="bf16",
                   last_k=3, gguf=True, layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "gemma3_d256": dict(kind="gemma3", L=2, D=256, qpas=48, window=4, attn_cap=None, final_cap=None, dtype="bf16",
                        last_k=2, gguf=False, layer_types=["sliding_attention", "full_attention"]),
}


def make_config(spec):
    common = dict(vocab_size=V, hidden_size=64, intermediate_size=64, num_hidden_layers=spec["L"],
                  num_attention_heads=2, num_key_value_heads=1, head_dim=spec["D"], rms_norm_eps=1e-6,
                  max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1,
                  pad_token_id=0, query_pre_attn_scalar=spec["qpas"], sliding_window=spec["window"],
                  attn_logit_softcapping=spec["attn_cap"], final_logit_softcapping=spec["final_cap"],
                  hidden_activation="gelu_pytorch_tanh", attention_dropout=0.0)
    if spec["kind"] == "gemma2":
        return Gemma2Config(**common)
    cfg = Gemma3TextConfig(**common, layer_types=spec["layer_types"],
                           rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    return cfg


def config_json(spec, config):
    if spec["kind"] == "gemma2":  # the Hub's (transformers 4) form: no layer_types, rope_theta
        d = dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], vocab_size=V, hidden_size=64,
                 intermediate_size=64, num_hidden_layers=spec["L"], num_attention_heads=2, num_key_value_heads=1,
                 head_dim=spec["D"], rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=True,
                 bos_token_id=2, eos_token_id=1, pad_token_id=0, query_pre_attn_scalar=spec["qpas"],
                 sliding_window=spec["window"], attn_logit_softcapping=spec["attn_cap"],
                 final_logit_softcapping=spec["final_cap"], hidden_act="gelu_pytorch_tanh",
                 hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0, attention_bias=False,
                 cache_implementation="hybrid")
        return d
    d = config.to_dict()
    d["architectures"] = ["Gemma3ForCausalLM"]
    return d


def build(spec, seed):
    torch.manual_seed(seed)
    config = make_config(spec)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # norms around 0: Gemma multiplies by (1 + w), so a missing +1 shows at once
    oc.randomize_weights(model, 0.08, norm_center=0.0, bf16=spec["dtype"] == "bf16")
    return config, model


def write_gguf(path, spec, config, sd):
    import gguf

    arch = spec["kind"]
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_block_count(spec["L"])
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(spec["D"])
    w.add_value_length(spec["D"])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    if arch == "gemma2":
        w.add_rope_freq_base(10000.0)
        w.add_attn_logit_softcapping(spec["attn_cap"])
        w.add_final_logit_softcapping(spec["final_cap"])
        w.add_sliding_window(spec["window"])
    else:
        w.add_rope_freq_base(1000000.0)
        w.add_rope_freq_base_swa(10000.0)
        if spec["final_cap"]:
            w.add_final_logit_softcapping(spec["final_cap"])
        w.add_sliding_window(spec["window"])
        w.add_sliding_window_pattern(spec["layer_types"].index("full_attention") + 1)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
             "post_feedforward_layernorm": "post_ffw_norm", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm"}

    def convert(k, mod, a):
        return a + 1 if k.endswith("norm.weight") else a  # the converter's Gemma shift: (1 + w) stored

    oc.gguf_tensors(w, sd, names, convert)
    oc.gguf_finish(w)


def run_case(out_dir, case, spec, seed):
    config, model = build(spec, seed)
    d = os.path.join(out_dir, case)
    os.makedirs(d, exist_ok=True)
    sd = oc.state_dict(model, tied=True, bf16=spec["dtype"] == "bf16")
    oc.save_model(os.path.join(d, "model.safetensors"), sd)
    if spec["gguf"]:
        write_gguf(os.path.join(d, "model.gguf"), spec, config, sd)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config_json(spec, config), f, indent=1)

    L, last_k = spec["L"], spec["last_k"]
    peft_model = oc.attach_lora(model, seed + 1, layers=list(range(L - last_k, L)))
    batch = oc.packed_batch(seed + 2, V)
    logits, token_loss, loss = oc.run_packed(peft_model, batch[0], batch[1], V)
    loss.backward()
    n_lora = oc.write_expected(os.path.join(d, "expected.safetensors"), peft_model, batch, logits, token_loss, loss,
                               "tests/oracle/gen_gemma_fixtures.py", last_k)
    for fn in os.listdir(d):
        os.chmod(os.path.join(d, fn), 0o644)
    n_tok = int((batch[1] != -100).sum())
    print(f"{case}: loss {loss.item():.6f}, {n_lora} LoRA tensors, {n_tok} targets")


def main():
    out = oc.out_arg("gemma")
    torch.set_num_threads(1)
    for i, (case, spec) in enumerate(sorted(CASES.items())):
        run_case(out, case, spec, 2000 + 17 * i)


if __name__ == "__main__":
    main()
