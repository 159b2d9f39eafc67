#!/usr/bin/env python3
"""Oracle fixtures for the mixture-of-experts model tests: tiny random Qwen3-MoE, Qwen2-MoE (shared
expert) and Mixtral models saved by transformers, with the expected logits, losses and LoRA gradients
of one fp32 forward/backward through transformers + PEFT, in the format tests/helpers/model_fixture.c
reads (expected.safetensors beside config.json + model.safetensors [+ model.gguf]).

The batch is packed: row 0 holds two documents (positions restart at 0 at token 5), row 1 one
document, three leading targets of row 1 masked (-100). The whole batch runs in ONE transformers call
with position_ids and no attention_mask, so transformers' packed-sequence mask keeps the documents'
attention apart (checked against per-document runs) while the router's load-balancing statistics
pool every token of the batch, documents and rows together, exactly as transformers trains on packed
rows. There is no padding, so attention_mask plays no part in the statistics.

Expected tensors (f32) and metadata:
  tokens, targets, positions, seq_offsets  the batch (as gen_family_fixtures.py)
  logits (B, T, V), token_loss (B, T)      per-token cross entropy (0 at masked targets)
  loss_ce (1)     mean cross entropy over the unmasked targets
  aux_loss (1)    transformers' load_balancing_loss_func over all MoE layers (out.aux_loss, unscaled)
  loss (1)        loss_ce + router_aux_loss_coef * aux_loss, what transformers trains on
  router_logits.L (B*T, E)  layer L's router logits (MoE layers only), tokens row-major
  <lora name>, <lora name>.grad          PEFT's adapter values and d loss / d value
  <lora name>.grad_aux                   d aux_loss / d value (the unscaled aux term alone), so
                                         d loss_ce = grad - aux_coef * grad_aux
  metadata: B T S rank alpha num_layers n_lora aux_coef n_moe_layers (+ generator, versions)
Every case's top-k choice has a margin (k-th minus (k+1)-th router probability) of at least
MIN_MARGIN on every token, so an fp32 reimplementation picks the same experts.

File layouts (transformers 5.24):
  In memory transformers 5 holds each MoE layer's experts fused: mlp.experts.gate_up_proj
  (E, 2*moe_F, C), gate rows first, and mlp.experts.down_proj (E, C, moe_F). save_pretrained
  reverts that to the per-expert checkpoint layout the Hub files use, so every model.safetensors
  here is per-expert:
    Qwen3-MoE / Qwen2-MoE: model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight
                           ((moe_F, C), (moe_F, C), (C, moe_F)); router model.layers.N.mlp.gate.weight (E, C)
    Qwen2-MoE shared:      model.layers.N.mlp.shared_expert.{gate,up,down}_proj.weight and
                           model.layers.N.mlp.shared_expert_gate.weight (1, C) (sigmoid gate)
    Mixtral:               model.layers.N.block_sparse_moe.experts.E.w1 (gate), w3 (up), w2 (down)
                           .weight; router model.layers.N.block_sparse_moe.gate.weight (E, C)
  transformers 5 writes qwen3_moe's expert count as "num_local_experts" and the RoPE base inside
  "rope_parameters"; the published Qwen3-MoE files say "num_experts" and "rope_theta". The
  qwen3moe_nonorm case's config.json is rewritten in that published spelling (transformers reads
  it back to the same configuration, checked here), so both spellings are covered.
  model.gguf (qwen3moe and mixtral) is written with gguf-py the way llama.cpp's
  convert_hf_to_gguf.py writes these architectures (it needs a tokenizer, which the tiny models
  lack): experts stacked per layer as blk.N.ffn_gate_exps / ffn_up_exps (numpy (E, moe_F, C), ggml
  ne {C, moe_F, E}), ffn_down_exps ((E, C, moe_F)), router blk.N.ffn_gate_inp (E, C); keys
  ARCH.expert_count, ARCH.expert_used_count, qwen3moe.expert_feed_forward_length; Qwen3-MoE as
  arch qwen3moe (Q/K rows unpermuted, attn_q_norm/attn_k_norm), Mixtral as arch llama with
  permuted Q/K rows. llama.cpp's qwen3moe always renormalises the top-k weights and has no dense
  layers, so the cases with norm_topk_prob false or mlp_only_layers get no GGUF.

Cases:
  qwen3moe          L=2, E=8, k=2, norm_topk_prob true, head_dim 16 (H*D != C), qk-norm; + GGUF
  qwen3moe_fused    qwen3moe's model with the experts fused as transformers 5 holds them in memory
                    (model.layers.N.mlp.experts.gate_up_proj (E, 2*moe_F, C), gate rows first, and
                    .down_proj (E, C, moe_F), written from model.state_dict()); the same
                    config.json and expected.safetensors
  qwen3moe_dense1   L=3, mlp_only_layers [1] (a dense SwiGLU layer between two MoE layers)
  qwen3moe_nonorm   L=2, norm_topk_prob false, config.json in the published (transformers 4) spelling
  qwen2moe_shared   L=2, E=4, k=2, a shared expert (width 24) with its sigmoid gate, q/k/v bias
  mixtral           L=2, E=4, k=2, sliding_window null; + GGUF
  qwen3moe_hd64     L=3, E=4, k=2, head_dim 64 (a head size the CUDA attention kernels serve), qk-norm,
                    mlp_only_layers [1]; top-k margin at least 1e-2 (HD64_MARGIN), so the bf16
                    rounding of a device's attention inputs cannot flip a choice
  mixtral_hd64      L=2, E=4, k=2, head_dim 64 (hidden 32: H*D != C); margin 1e-2; + GGUF
All with output_router_logits true and router_aux_loss_coef 0.02. LoRA r=4, alpha 8 on q/k/v/o
(experts and routers frozen), B initialised nonzero.

Expert LoRA (PEFT's target_parameters on transformers 5's fused expert stacks): subfolders of a case
hold expected.safetensors of the case's saved model (read back from its folder, the same batch) with
LoRA r=4, alpha 8 on q/k/v/o AND on the experts,
  LoraConfig(target_modules=[q,k,v,o], target_parameters=["mlp.experts.gate_up_proj",
             "mlp.experts.down_proj"])
every A and B nonzero (random), PEFT's names and layouts (expert A (r*E, in), B (out, r*E)):
  <case>/xlora/      both expert stacks adapted (qwen3moe, mixtral, qwen2moe_shared, qwen3moe_hd64,
                     mixtral_hd64); qwen3moe/xlora also holds PEFT's saved adapter
                     (adapter_config.json, adapter_model.safetensors)
  <case>/xlora_gu/   gate_up_proj alone (qwen3moe)
Metadata as above plus targets (longtune's --lora-targets spelling). The top-k margin holds with the
adapters applied (the LoRA values are redrawn until it does).

bad/ holds inputs the loader must refuse (see write_bad): top-k larger than the expert count, an
expert tensor missing, a router of the wrong shape, each as a safetensors folder and as a GGUF.

Run with /work/pyenv/bin/python; CI never runs this, only its outputs.
"""
import argparse
import json
import os
import shutil

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

B, T, V, C = 2, 12, 64, 32
RANK, ALPHA = 4, 8.0
AUX_COEF = 0.02
MIN_MARGIN = 2e-3
HD64_MARGIN = 1e-2

QWEN3 = dict(model_type="qwen3_moe", head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
             intermediate_size=40, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
             rope_theta=10000.0)
CASES = {
    "qwen3moe": dict(cfg=dict(QWEN3, num_hidden_layers=2), gguf="qwen3moe", fused_copy="qwen3moe_fused"),
    "qwen3moe_dense1": dict(cfg=dict(QWEN3, num_hidden_layers=3, mlp_only_layers=[1])),
    "qwen3moe_nonorm": dict(cfg=dict(QWEN3, num_hidden_layers=2, norm_topk_prob=False), published_spelling=True),
    "qwen2moe_shared": dict(cfg=dict(model_type="qwen2_moe", num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                                     moe_intermediate_size=16, shared_expert_intermediate_size=24,
                                     intermediate_size=40, norm_topk_prob=False, decoder_sparse_step=1,
                                     mlp_only_layers=[], qkv_bias=True, rope_theta=10000.0,
                                     use_sliding_window=False)),
    "mixtral": dict(cfg=dict(model_type="mixtral", num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                             intermediate_size=16, sliding_window=None, rope_theta=1e6), gguf="llama"),
    "qwen3moe_hd64": dict(cfg=dict(QWEN3, num_hidden_layers=3, mlp_only_layers=[1], head_dim=64, num_experts=4),
                          margin=HD64_MARGIN, seed=4100),
    "mixtral_hd64": dict(cfg=dict(model_type="mixtral", num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                                  intermediate_size=16, sliding_window=None, rope_theta=1e6, head_dim=64),
                         gguf="llama", margin=HD64_MARGIN, seed=4200),
}
# The seeds of the first cases: 3000 + 31 * (index in this sorted list); later cases name their own.
SEEDED_BY_INDEX = sorted(["qwen3moe", "qwen3moe_dense1", "qwen3moe_nonorm", "qwen2moe_shared", "mixtral"])


def build(spec, seed, vocab=V):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=vocab, hidden_size=C, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
               max_position_embeddings=64, tie_word_embeddings=False, hidden_act="silu", bos_token_id=1,
               eos_token_id=2, pad_token_id=0, attention_dropout=0.0, output_router_logits=True,
               router_aux_loss_coef=AUX_COEF)
    cfg.update(spec["cfg"])
    config = AutoConfig.for_model(**cfg)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                p.copy_(0.3 * torch.randn_like(p))  # routers: varied, well separated choices
            else:
                p.copy_(0.15 * torch.randn_like(p))
    model.eval()
    return cfg, config, model


def moe_layers(config):
    n = config.num_hidden_layers
    if config.model_type == "mixtral":
        return list(range(n))
    only = getattr(config, "mlp_only_layers", []) or []
    step = getattr(config, "decoder_sparse_step", 1)
    return [i for i in range(n) if i not in only and (i + 1) % step == 0]


def permute(w, n_head):
    """llama.cpp's LlamaModel.permute: rotate-half rows -> interleaved rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch, config, sd, drop=(), override=None):
    """sd: the per-expert state dict save_pretrained wrote. drop: GGUF tensor names to leave out;
    override: {GGUF name: array} replacing a tensor (bad inputs)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(path, arch)
    H, Hkv = config.num_attention_heads, config.num_key_value_heads
    D = getattr(config, "head_dim", None) or C // H
    E = config.num_local_experts if arch == "llama" else config.num_experts
    L = config.num_hidden_layers
    w.add_block_count(L)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(C)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_freq_base(config.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(config.vocab_size)
    w.add_expert_count(E)
    w.add_expert_used_count(config.num_experts_per_tok)
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    override = override or {}
    out = {}

    def put(name, a):
        out[name] = a

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    put("output.weight", sd["lm_head.weight"])
    for l in range(L):
        p = f"model.layers.{l}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if arch == "llama":
            q, k = permute(q, H), permute(k, Hkv)
        put(f"blk.{l}.attn_q.weight", q)
        put(f"blk.{l}.attn_k.weight", k)
        put(f"blk.{l}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        put(f"blk.{l}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        put(f"blk.{l}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(f"blk.{l}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        if arch == "qwen3moe":
            put(f"blk.{l}.attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            put(f"blk.{l}.attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
            m = p + "mlp."
            names = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
            put(f"blk.{l}.ffn_gate_inp.weight", sd[m + "gate.weight"])
        else:
            m = p + "block_sparse_moe."
            names = {"ffn_gate_exps": "w1", "ffn_up_exps": "w3", "ffn_down_exps": "w2"}
            put(f"blk.{l}.ffn_gate_inp.weight", sd[m + "gate.weight"])
        for g, h in names.items():
            put(f"blk.{l}.{g}.weight", torch.stack([sd[f"{m}experts.{e}.{h}.weight"] for e in range(E)], 0))
    for n, a in out.items():
        if n in drop:
            continue
        a = override.get(n, a)
        if isinstance(a, torch.Tensor):
            a = a.float().contiguous().numpy()
        w.add_tensor(n, np.ascontiguousarray(a, dtype=np.float32))
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


def forward(model, config, tokens, targets, positions):
    out = model(input_ids=tokens, position_ids=positions, output_router_logits=True, use_cache=False)
    lg = out.logits.float()
    tl = torch.nn.functional.cross_entropy(lg.reshape(-1, V), targets.reshape(-1), ignore_index=-100,
                                           reduction="none").reshape(B, T)
    ce = tl.sum() / int((targets != -100).sum())
    return out, lg, tl, ce


def margins(router_logits, k):
    worst = 1.0
    for rl in router_logits:
        p = torch.softmax(rl.detach().float(), -1)
        top = torch.topk(p, k + 1, -1).values if p.shape[-1] > k else None
        if top is not None:
            worst = min(worst, float((top[:, k - 1] - top[:, k]).min()))
    return worst


def lora_wrap(model, seed):
    """PEFT LoRA on q/k/v/o with every A and B drawn from `seed` (B nonzero)."""
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                                  bias="none"))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn_like(p))
    return peft_model


def run_case(out_dir, case, spec, seed):
    # Reseed until every token's top-k choice, with the adapters applied, is well separated.
    seqs, tokens, targets, positions, offsets = batch(seed + 2)
    min_margin = spec.get("margin", MIN_MARGIN)
    for attempt in range(200):
        mseed = seed + 1000 * attempt
        cfg, config, model = build(spec, mseed)
        with torch.no_grad():
            out = lora_wrap(model, seed + 1)(input_ids=tokens, position_ids=positions, output_router_logits=True,
                                             use_cache=False)
        if margins(out.router_logits, config.num_experts_per_tok) >= min_margin:
            break
    else:
        raise SystemExit(f"{case}: no seed with top-k margin {min_margin}")
    cfg, config, model = build(spec, mseed)  # the same model again, unwrapped
    with torch.no_grad():
        out = model(input_ids=tokens, position_ids=positions, output_router_logits=True, use_cache=False)
    mlayers = moe_layers(config)
    assert len(out.router_logits) == len(mlayers), (len(out.router_logits), mlayers)

    d = os.path.join(out_dir, case)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.save_pretrained(d, safe_serialization=True)  # config.json + per-expert model.safetensors
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    sd = load_file(os.path.join(d, "model.safetensors"))
    fused = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}  # transformers 5's own
    if spec.get("published_spelling"):
        p = os.path.join(d, "config.json")
        c = json.load(open(p))
        c["num_experts"] = c.pop("num_local_experts")
        c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
        with open(p, "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
            f.write("\n")
        back = AutoConfig.from_pretrained(d)
        assert back.num_experts == config.num_experts and back.rope_parameters["rope_theta"] == cfg["rope_theta"]
        assert back.norm_topk_prob == config.norm_topk_prob
    # The saved folder reloads to the same model (per-expert files -> fused in memory).
    re = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        o2 = re(input_ids=tokens, position_ids=positions, use_cache=False)
    assert torch.allclose(o2.logits, out.logits, atol=1e-5), f"{case}: reloaded model differs"
    if spec.get("gguf"):
        write_gguf(os.path.join(d, "model.gguf"), spec["gguf"], config, sd)

    peft_model = lora_wrap(model, seed + 1)
    lora = {n.replace(".default", ""): p for n, p in peft_model.named_parameters() if "lora_" in n}
    assert all(p.requires_grad for p in lora.values())
    assert not any(p.requires_grad for n, p in peft_model.named_parameters() if "lora_" not in n)

    out, logits, token_loss, ce = forward(peft_model, config, tokens, targets, positions)
    aux = out.aux_loss
    loss = ce + AUX_COEF * aux
    assert margins(out.router_logits, config.num_experts_per_tok) >= min_margin
    # transformers' own loss on the same batch (it shifts labels itself): the same total.
    labels = torch.full((B, T), -100)
    labels[:, 1:] = targets[:, :-1]
    with torch.no_grad():
        ref = peft_model(input_ids=tokens, position_ids=positions, labels=labels, output_router_logits=True,
                         use_cache=False)
    assert abs(float(ref.loss) - float(loss)) < 1e-5, (float(ref.loss), float(loss))
    # Documents stay apart in attention: each alone gives the same logits.
    with torch.no_grad():
        for r, a, b in seqs:
            lo = peft_model(input_ids=tokens[r:r + 1, a:b], position_ids=positions[r:r + 1, a:b],
                                 use_cache=False).logits[0]
            assert torch.allclose(lo, logits[r, a:b], atol=1e-5), f"{case}: packed attention leaks"

    grads_aux = torch.autograd.grad(aux, list(lora.values()), retain_graph=True)
    loss.backward()
    exp = {"tokens": tokens.float(), "targets": targets.float(), "positions": positions.float(),
           "seq_offsets": offsets.float(), "logits": logits.detach(), "token_loss": token_loss.detach(),
           "loss": loss.detach().reshape(1), "loss_ce": ce.detach().reshape(1),
           "aux_loss": aux.detach().reshape(1)}
    for l, rl in zip(mlayers, out.router_logits):
        exp[f"router_logits.{l}"] = rl.detach().float().reshape(B * T, -1).contiguous()
    for (k, p), ga in zip(lora.items(), grads_aux):
        exp[k] = p.detach().clone().contiguous()
        exp[k + ".grad"] = p.grad.detach().clone().contiguous()
        exp[k + ".grad_aux"] = ga.detach().clone().contiguous()
    n_lora = len(lora)
    import transformers
    meta = {"rank": str(RANK), "alpha": str(ALPHA), "num_layers": str(config.num_hidden_layers),
            "n_lora": str(n_lora), "B": str(B), "T": str(T), "S": "2", "aux_coef": str(AUX_COEF),
            "n_moe_layers": str(len(mlayers)), "generator": "tests/oracle/gen_moe_fixtures.py",
            "torch": torch.__version__, "transformers": transformers.__version__}
    save_file(exp, os.path.join(d, "expected.safetensors"), metadata=meta)
    if spec.get("fused_copy"):
        # the same model with its experts as transformers 5 holds them in memory (a file written
        # from model.state_dict()): transformers reads it back to the same logits
        fd = os.path.join(out_dir, spec["fused_copy"])
        if os.path.isdir(fd):
            shutil.rmtree(fd)
        os.makedirs(fd)
        assert any(k.endswith("mlp.experts.gate_up_proj") for k in fused)
        save_file(fused, os.path.join(fd, "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(os.path.join(d, "config.json"), fd)
        shutil.copy(os.path.join(d, "expected.safetensors"), fd)
        ref = AutoModelForCausalLM.from_pretrained(fd, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            lf = lora_wrap(ref, seed + 1)(input_ids=tokens, position_ids=positions, use_cache=False).logits
        assert torch.allclose(lf, logits, atol=1e-5), f"{case}: the fused copy differs"
        for f in os.listdir(fd):
            os.chmod(os.path.join(fd, f), 0o644)
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    print(f"{case}: loss {loss.item():.6f} (ce {ce.item():.6f}, aux {aux.item():.6f}), {n_lora} LoRA tensors,"
          f" moe layers {mlayers}, attempt {attempt}")


XLORA = {  # case -> {subfolder: expert target parameters}
    "qwen3moe": {"xlora": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                 "xlora_gu": ["mlp.experts.gate_up_proj"]},
    "mixtral": {"xlora": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]},
    "qwen2moe_shared": {"xlora": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]},
    "qwen3moe_hd64": {"xlora": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]},
    "mixtral_hd64": {"xlora": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]},
}


def xlora_case(out_dir, case, sub, params, seed, min_margin, save_adapter):
    """The case's saved model with LoRA on attention and the experts (see the module docstring)."""
    d = os.path.join(out_dir, case)
    ex = load_file(os.path.join(d, "expected.safetensors"))
    tokens, targets = ex["tokens"].long(), ex["targets"].long()
    positions = ex["positions"].long()
    for attempt in range(200):
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        config = model.config
        pm = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                              target_parameters=params, bias="none"))
        torch.manual_seed(seed + 7919 * attempt)
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if "lora_" in name:
                    p.copy_(0.1 * torch.randn_like(p))
        with torch.no_grad():
            o = pm(input_ids=tokens, position_ids=positions, output_router_logits=True, use_cache=False)
        if margins(o.router_logits, config.num_experts_per_tok) >= min_margin:
            break
    else:
        raise SystemExit(f"{case}/{sub}: no LoRA draw with top-k margin {min_margin}")
    lora = {n.replace(".default", ""): p for n, p in pm.named_parameters() if "lora_" in n}
    assert any(".experts." in n for n in lora), list(lora)
    assert not any(p.requires_grad for n, p in pm.named_parameters() if "lora_" not in n)
    out, logits, token_loss, ce = forward(pm, config, tokens, targets, positions)
    aux = out.aux_loss
    loss = ce + AUX_COEF * aux
    # the last MoE layer's experts reach no router: their aux gradient is zero
    grads_aux = torch.autograd.grad(aux, list(lora.values()), retain_graph=True, allow_unused=True)
    grads_aux = [torch.zeros_like(p) if g is None else g for p, g in zip(lora.values(), grads_aux)]
    loss.backward()
    exp = {k: ex[k] for k in ("tokens", "targets", "positions", "seq_offsets")}
    exp.update({"logits": logits.detach(), "token_loss": token_loss.detach(), "loss": loss.detach().reshape(1),
                "loss_ce": ce.detach().reshape(1), "aux_loss": aux.detach().reshape(1)})
    for (k, p), ga in zip(lora.items(), grads_aux):
        exp[k] = p.detach().clone().contiguous()
        exp[k + ".grad"] = p.grad.detach().clone().contiguous()
        exp[k + ".grad_aux"] = ga.detach().clone().contiguous()
    import transformers
    import peft
    names = {"mlp.experts.gate_up_proj": "experts.gate_up_proj", "mlp.experts.down_proj": "experts.down_proj"}
    meta = {"rank": str(RANK), "alpha": str(ALPHA), "num_layers": str(config.num_hidden_layers),
            "n_lora": str(len(lora)), "B": str(B), "T": str(T), "S": "2", "aux_coef": str(AUX_COEF),
            "n_moe_layers": str(len(moe_layers(config))),
            "targets": ",".join(["q_proj", "k_proj", "v_proj", "o_proj"] + [names[p] for p in params]),
            "generator": "tests/oracle/gen_moe_fixtures.py", "torch": torch.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__}
    sd_dir = os.path.join(d, sub)
    if os.path.isdir(sd_dir):
        shutil.rmtree(sd_dir)
    os.makedirs(sd_dir)
    save_file(exp, os.path.join(sd_dir, "expected.safetensors"), metadata=meta)
    if save_adapter:
        pm.save_pretrained(sd_dir)
        for f in ("README.md",):
            if os.path.exists(os.path.join(sd_dir, f)):
                os.remove(os.path.join(sd_dir, f))
    for f in os.listdir(sd_dir):
        os.chmod(os.path.join(sd_dir, f), 0o644)
    print(f"{case}/{sub}: loss {loss.item():.6f} (ce {ce.item():.6f}, aux {aux.item():.6f}), {len(lora)} LoRA "
          f"tensors, attempt {attempt}")


def write_bad(out_dir):
    """Inputs the loader must refuse with a typed error naming the key or tensor:
    topk_gt_experts/      config.json num_experts_per_tok 5 > num_experts 4 (otherwise valid files)
    missing_expert/       model.safetensors without model.layers.0.mlp.experts.3.up_proj.weight
    router_shape/         model.layers.0.mlp.gate.weight (3, 32) for 4 experts
    router_shape_cols/    model.layers.0.mlp.gate.weight (4, 31) for hidden_size 32
    topk_gt_experts.gguf  qwen3moe.expert_used_count 5 > expert_count 4
    missing_expert.gguf   blk.0.ffn_up_exps.weight absent
    expert_shape.gguf     blk.0.ffn_up_exps.weight holding 3 experts for expert_count 4
    router_shape.gguf     blk.0.ffn_gate_inp.weight (3, 32) for 4 experts"""
    d = os.path.join(out_dir, "bad")
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    spec = dict(cfg=dict(QWEN3, num_hidden_layers=1, num_experts=4, moe_intermediate_size=8, head_dim=8))
    cfg, config, model = build(spec, 99, vocab=16)
    good = os.path.join(d, "good")
    model.save_pretrained(good, safe_serialization=True)
    sd = load_file(os.path.join(good, "model.safetensors"))
    conf = json.load(open(os.path.join(good, "config.json")))

    def folder(name, conf_, sd_):
        p = os.path.join(d, name)
        os.makedirs(p)
        with open(os.path.join(p, "config.json"), "w") as f:
            json.dump(conf_, f, indent=2, sort_keys=True)
            f.write("\n")
        save_file(sd_, os.path.join(p, "model.safetensors"), metadata={"format": "pt"})

    folder("topk_gt_experts", dict(conf, num_experts_per_tok=5), sd)
    folder("missing_expert", conf, {k: v for k, v in sd.items() if k != "model.layers.0.mlp.experts.3.up_proj.weight"})
    folder("router_shape", conf, dict(sd, **{"model.layers.0.mlp.gate.weight": sd["model.layers.0.mlp.gate.weight"][:3].clone()}))
    folder("router_shape_cols", conf,
           dict(sd, **{"model.layers.0.mlp.gate.weight": sd["model.layers.0.mlp.gate.weight"][:, :31].clone()}))
    shutil.rmtree(good)

    write_gguf(os.path.join(d, "topk_gt_experts.gguf"), "qwen3moe",
               AutoConfig.for_model(**dict(cfg, num_experts_per_tok=5)), sd)
    write_gguf(os.path.join(d, "missing_expert.gguf"), "qwen3moe", config, sd, drop=("blk.0.ffn_up_exps.weight",))
    up = torch.stack([sd[f"model.layers.0.mlp.experts.{e}.up_proj.weight"] for e in range(3)], 0)
    write_gguf(os.path.join(d, "expert_shape.gguf"), "qwen3moe", config, sd, override={"blk.0.ffn_up_exps.weight": up})
    write_gguf(os.path.join(d, "router_shape.gguf"), "qwen3moe", config, sd,
               override={"blk.0.ffn_gate_inp.weight": sd["model.layers.0.mlp.gate.weight"][:3]})
    for f in os.listdir(d):
        for g in [os.path.join(d, f)] + [os.path.join(d, f, x) for x in (os.listdir(os.path.join(d, f)) if os.path.isdir(os.path.join(d, f)) else [])]:
            if os.path.isfile(g):
                os.chmod(g, 0o644)
    print("bad: written")


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "moe"))
    ap.add_argument("--cases", default="", help="comma-separated cases to (re)write; default all and bad/")
    ap.add_argument("--xlora-only", action="store_true",
                    help="write only the expert-LoRA subfolders, from the cases' saved models")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    only = [c for c in args.cases.split(",") if c]
    for c in only:
        if c not in CASES and c != "bad":
            raise SystemExit(f"unknown case {c}")
    for case, spec in sorted(CASES.items()):
        if only and case not in only:
            continue
        seed = spec["seed"] if "seed" in spec else 3000 + 31 * SEEDED_BY_INDEX.index(case)
        if not args.xlora_only:
            run_case(args.out, case, spec, seed)
        for i, (sub, params) in enumerate(sorted(XLORA.get(case, {}).items())):
            xlora_case(args.out, case, sub, params, seed + 50 + i, spec.get("margin", MIN_MARGIN),
                       case == "qwen3moe" and sub == "xlora")
    if (not only or "bad" in only) and not args.xlora_only:
        write_bad(args.out)


if __name__ == "__main__":
    main()
