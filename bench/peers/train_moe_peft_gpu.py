"""GPU peer of `longtune bench moe --backend cuda`: LoRA training steps of a mixture-of-experts model
with PyTorch + transformers + PEFT on one CUDA device, random weights of a real model's shape (the
config values are written below, nothing comes from the hub): Qwen3-MoE built from its config, bf16
base, LoRA r=8 alpha 16 on q,k,v,o (experts and routers frozen), batch 1, gradient checkpointing on
every layer, SDPA attention, transformers' default experts implementation (grouped_mm where torch
has it), the router's load-balancing loss added as transformers adds it (output_router_logits true,
router_aux_loss_coef), AdamW over the LoRA parameters.
It measures and prints; it installs nothing and never compares itself with longtune (the C bench
does that from these lines).

Output: JSON lines on stdout, the protocol of train_peft_gpu.py.
  {"ready": true, versions, device, shape, experts_implementation, init_s, n_params, ...}
  {"T", "median_ms", "tokens_per_s", "step_ms": [...], "max_allocated_bytes", "max_reserved_bytes",
   "loss"}                                    one per --seq length (median over the timed steps)
  {"T", "oom": true}                          a --seq length that ran out of device memory
  {"ceiling": {"fits_T", "fails_T", "tries": [{"T", "ok", "ms", "max_allocated_bytes", ...}],
               "candidates": [...]}}          with --ceiling: the longest T of the candidates
                                              (powers of 2 and their midpoints from --ceiling-start
                                              to --ceiling-max) that trains one step, stopping at
                                              the first that runs out of memory"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peft_peer as peer  # noqa: E402  (flags, model, steps and the JSON lines both training peers share)

# Config values of the published checkpoints' config.json (the keys the step's cost depends on);
# the -l4 shape keeps 4 of Qwen3-30B-A3B's 48 layers.
SHAPES = {
    "qwen3-30b-a3b-l4": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=4,
                             num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                             max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                             tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
                             moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
                             mlp_only_layers=[], router_aux_loss_coef=0.001),
    # for checking this script on a machine without a GPU (--device cpu); not a benchmark shape
    "tiny-moe": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                     rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                     mlp_only_layers=[], router_aux_loss_coef=0.001),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def build(args, torch, max_T):
    import transformers
    s = dict(SHAPES[args.shape])
    s["max_position_embeddings"] = max(s["max_position_embeddings"], max_T)
    cfg = transformers.AutoConfig.for_model("qwen3_moe", attention_bias=False, hidden_act="silu", use_cache=False,
                                            output_router_logits=True, **s)
    model, params, opt, init_s = peer.lora_model(args, torch, cfg, TARGETS)
    base_cfg = model.get_base_model().config
    experts = getattr(base_cfg, "_experts_implementation_internal", None) or getattr(
        base_cfg, "_experts_implementation", None) or "eager"
    info = peer.ready_info(args, torch, SHAPES[args.shape], model, params, init_s, TARGETS,
                           experts_implementation=experts,
                           gradient_checkpointing=peer.checkpointing(args),
                           loss="transformers ForCausalLM loss on full logits (labels=input_ids) + "
                                "router_aux_loss_coef * load-balancing loss (output_router_logits)", batch=1,
                           alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    return model, opt, info


def candidates(start, hi):
    """Powers of 2 and their midpoints (1.5x) from start to hi, ascending."""
    out, p = [], 1
    while p * 2 <= start:
        p *= 2
    while p <= hi:
        for T in (p, p + p // 2):
            if start <= T <= hi:
                out.append(T)
        p *= 2
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer.add_args(ap, SHAPES, steps=3, warmup=1)
    ap.add_argument("--ceiling", action="store_true", help="search the longest T that trains a step")
    ap.add_argument("--ceiling-start", type=int, default=8192, help="shortest candidate")
    ap.add_argument("--ceiling-max", type=int, default=1 << 18, help="longest candidate")
    args = ap.parse_args()
    seqs = peer.parse_seqs(ap, args)
    if not seqs and not args.ceiling:
        ap.error("nothing to do: give --seq and/or --ceiling")
    if any(T < 2 for T in seqs) or args.steps < 1 or args.warmup < 0 or args.ceiling_start < 2 or \
            args.ceiling_max < args.ceiling_start:
        ap.error("bad --seq / --steps / --warmup / --ceiling-start / --ceiling-max")

    torch, cuda = peer.start_torch(args)
    if torch is None:
        return 1
    max_T = max(seqs + ([args.ceiling_max] if args.ceiling else []))
    model, opt, info = build(args, torch, max_T)
    peer.emit(info)
    V = SHAPES[args.shape]["vocab_size"]
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    peer.time_seqs(torch, model, opt, seqs, V, gen, cuda, args)

    if args.ceiling:
        tries, lo, hi = [], 0, None
        cand = candidates(args.ceiling_start, args.ceiling_max)
        for T in cand:
            if not peer.attempt(torch, model, opt, T, V, gen, cuda, tries):
                hi = T
                break
            lo = T
        peer.emit({"ceiling": {"fits_T": lo, "fails_T": hi, "max_searched": args.ceiling_max, "candidates": cand,
                               "tries": tries}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
