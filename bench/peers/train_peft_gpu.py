"""GPU peer of `longtune bench train|context --backend cuda`: LoRA training steps with PyTorch +
transformers + PEFT on one CUDA device, random weights of a real model's shape (the config values
are written below, nothing comes from the hub), bf16 base, LoRA r=8 on q,k,v,o,gate,up,down,
batch 1, gradient checkpointing on every layer, SDPA attention, AdamW over the LoRA parameters.
With --liger, Liger-Kernel's fused kernels (RoPE, RMSNorm, SwiGLU and the fused linear
cross-entropy) are patched into transformers' model classes before the model is built, as Axolotl
and LLaMA-Factory do with their one flag; the wheel comes on PYTHONPATH (the C bench puts the
peer path first) and its version goes into the ready line.
It measures and prints; it installs nothing and never compares itself with longtune (the C bench
does that from these lines).

Output: JSON lines on stdout.
  {"ready": true, versions, device, shape, init_s, n_params, n_lora_params, ...}
  {"T", "median_ms", "tokens_per_s", "step_ms": [...], "max_allocated_bytes", "max_reserved_bytes",
   "loss"}                                    one per --seq length (median over the timed steps)
  {"ceiling": {"fits_T", "fails_T", "step", "tries": [{"T", "ok", "ms", "max_allocated_bytes", ...}]}}
                                              with --ceiling: the longest T that trains one step
                                              (with --ceiling-points: only those lengths, in order;
                                              fits_T the longest success below the first failure)
A length that runs out of memory in the --seq pass prints {"T", "oom": true} and the run goes on."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peft_peer as peer  # noqa: E402  (flags, model, steps and the JSON lines both training peers share)

# Config values of the published checkpoints' config.json (the keys the step's cost depends on).
SHAPES = {
    "qwen3-8b": dict(arch="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=False),
    "smollm2-135m": dict(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    # for checking this script on a machine without a GPU (--device cpu); not a benchmark shape
    "tiny": dict(arch="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                 rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(args, torch, max_T):
    import transformers
    s = dict(SHAPES[args.shape])
    arch = s.pop("arch")
    # RoPE tables are computed from the positions, so this only keeps configs from objecting to
    # lengths beyond the checkpoint's own context
    s["max_position_embeddings"] = max(s["max_position_embeddings"], max_T)
    if arch == "qwen3":
        cfg = transformers.Qwen3Config(attention_bias=False, hidden_act="silu", use_cache=False, **s)
    else:
        cfg = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, hidden_act="silu", use_cache=False, **s)
    cfg._attn_implementation = "sdpa"
    liger = None
    if args.liger:
        import liger_kernel
        from liger_kernel.transformers import apply_liger_kernel_to_llama, apply_liger_kernel_to_qwen3
        # the defaults: rope, rms_norm, swiglu and fused_linear_cross_entropy on, cross_entropy off
        (apply_liger_kernel_to_qwen3 if arch == "qwen3" else apply_liger_kernel_to_llama)()
        try:
            from importlib.metadata import version
            liger = version("liger-kernel")
        except Exception:
            liger = getattr(liger_kernel, "__version__", "unknown")
    model, params, opt, init_s = peer.lora_model(args, torch, cfg, TARGETS)
    loss = "Liger fused linear cross-entropy (labels=input_ids)" if liger else \
        "transformers ForCausalLM loss on full logits (labels=input_ids)"
    info = peer.ready_info(args, torch, SHAPES[args.shape], model, params, init_s, TARGETS,
                           gradient_checkpointing=peer.checkpointing(args), loss=loss, batch=1,
                           alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), liger_kernel=liger)
    return model, opt, info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peer.add_args(ap, SHAPES, steps=5, warmup=2)
    ap.add_argument("--liger", action="store_true", help="patch Liger-Kernel's fused kernels in first")
    ap.add_argument("--ceiling", action="store_true", help="search the longest T that trains a step")
    ap.add_argument("--ceiling-step", type=int, default=8192, help="search resolution in tokens")
    ap.add_argument("--ceiling-start", type=int, default=8192, help="first T tried (doubled until a failure)")
    ap.add_argument("--ceiling-max", type=int, default=1 << 20, help="stop doubling here")
    ap.add_argument("--ceiling-points", default="", help="comma list of T: try these lengths only, no search")
    args = ap.parse_args()
    seqs = peer.parse_seqs(ap, args)
    points = []
    if args.ceiling_points:
        try:
            points = [int(t) for t in args.ceiling_points.split(",")]
        except ValueError:
            ap.error("--ceiling-points: expected a comma list of integers, got %r" % args.ceiling_points)
        if not args.ceiling or any(t < 2 for t in points):
            ap.error("--ceiling-points needs --ceiling and lengths of at least 2")
    if not seqs and not args.ceiling:
        ap.error("nothing to do: give --seq and/or --ceiling")
    if any(T < 2 for T in seqs) or args.ceiling_step < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("bad --seq / --steps / --warmup / --ceiling-step")

    torch, cuda = peer.start_torch(args)
    if torch is None:
        return 1
    max_T = max(seqs + points + ([args.ceiling_max] if args.ceiling and not points else []))
    try:
        model, opt, info = build(args, torch, max_T)
    except ImportError as e:
        peer.emit({"ready": False, "error": "liger-kernel is not importable: %s" % e})
        return 1
    peer.emit(info)
    V = SHAPES[args.shape]["vocab_size"]
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    peer.time_seqs(torch, model, opt, seqs, V, gen, cuda, args)

    if args.ceiling:
        # doubling from ceiling_start until a step fails (or ceiling_max), then bisection in units
        # of ceiling_step between the longest success and the shortest failure
        tries = []

        def attempt(T):
            return peer.attempt(torch, model, opt, T, V, gen, cuda, tries)

        step_t = args.ceiling_step
        lo, hi = 0, None
        if points:
            # the given lengths only: a success counts below the shortest failure seen
            for T in points:
                ok = attempt(T)
                if ok and (hi is None or T < hi):
                    lo = max(lo, T)
                elif not ok:
                    hi = T if hi is None else min(hi, T)
            if hi is not None and lo > hi:
                lo = max([t["T"] for t in tries if t["ok"] and t["T"] < hi] + [0])
            peer.emit({"ceiling": {"fits_T": lo, "fails_T": hi, "step": step_t, "points": points,
                                   "tries": tries}})
            return 0
        T = max(step_t, args.ceiling_start // step_t * step_t)
        while T <= args.ceiling_max:
            if attempt(T):
                lo = T
                T *= 2
            else:
                hi = T
                break
        if hi is not None:
            while hi - lo > step_t:
                mid = (lo + hi) // 2 // step_t * step_t
                if mid <= lo:
                    mid = lo + step_t
                if attempt(mid):
                    lo = mid
                else:
                    hi = mid
        peer.emit({"ceiling": {"fits_T": lo, "fails_T": hi, "step": step_t, "max_searched": args.ceiling_max,
                               "tries": tries}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
