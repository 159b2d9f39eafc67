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
A length that runs out of memory in the --seq pass prints {"T", "oom": true} and the run goes on."""
import argparse
import gc
import json
import os
import statistics
import sys
import time

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


def emit(obj):
    print(json.dumps(obj), flush=True)


def build(args, torch, max_T):
    import peft
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
    dev = torch.device(args.device)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    # built in place on the device: an 8B init on the host would take minutes
    with dev:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lcfg = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, bias="none",
                           task_type="CAUSAL_LM", target_modules=TARGETS)
    model = peft.get_peft_model(model, lcfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    info = {"ready": True, "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "shape": args.shape, "config": SHAPES[args.shape],
            "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            "init_s": init_s, "n_params": sum(p.numel() for p in model.parameters()),
            "n_lora_params": sum(p.numel() for p in params),
            "lora_dtype": str(params[0].dtype).replace("torch.", ""), "base_dtype": "bfloat16",
            "lora_rank": args.rank, "lora_alpha": 2 * args.rank, "lora_targets": TARGETS,
            "attention": "sdpa", "gradient_checkpointing": "every layer (use_reentrant=False)",
            "loss": "transformers ForCausalLM loss on full logits (labels=input_ids)", "batch": 1,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "liger_kernel": liger}
    if liger:
        info["loss"] = "Liger fused linear cross-entropy (labels=input_ids)"
    if dev.type == "cuda":
        info["memory_fraction"] = args.memory_fraction
        info["device_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return model, opt, info


def step(torch, model, opt, ids):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(out.loss.detach())


def timed_step(torch, model, opt, ids, cuda):
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = step(torch, model, opt, ids)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, loss


def try_T(torch, model, opt, T, V, gen, cuda, n):
    """n steps at T; (list of ms, last loss) or None when the device ran out of memory."""
    oom = False
    ms, loss = [], float("nan")
    try:
        for _ in range(n):
            ids = torch.randint(0, V, (1, T), generator=gen, device=gen.device)
            t, loss = timed_step(torch, model, opt, ids, cuda)
            ms.append(t)
            del ids
    except torch.OutOfMemoryError:
        oom = True
    if oom:
        # drop what the failed step left (gradients, cached blocks) so the next try starts clean
        opt.zero_grad(set_to_none=True)
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        return None, loss
    return ms, loss


def mem(torch, cuda):
    if not cuda:
        return {}
    return {"max_allocated_bytes": torch.cuda.max_memory_allocated(),
            "max_reserved_bytes": torch.cuda.max_memory_reserved()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--seq", default="", help="comma list of tokens per step to time")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per length (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first per length")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (to check the script only)")
    ap.add_argument("--liger", action="store_true", help="patch Liger-Kernel's fused kernels in first")
    ap.add_argument("--ceiling", action="store_true", help="search the longest T that trains a step")
    ap.add_argument("--ceiling-step", type=int, default=8192, help="search resolution in tokens")
    ap.add_argument("--ceiling-start", type=int, default=8192, help="first T tried (doubled until a failure)")
    ap.add_argument("--ceiling-max", type=int, default=1 << 20, help="stop doubling here")
    ap.add_argument("--memory-fraction", type=float, default=1.0,
                    help="cap this process at a fraction of device memory (to exercise the OOM path)")
    args = ap.parse_args()
    seqs = [int(x) for x in args.seq.split(",") if x.strip()]
    if not seqs and not args.ceiling:
        ap.error("nothing to do: give --seq and/or --ceiling")
    if any(T < 2 for T in seqs) or args.ceiling_step < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("bad --seq / --steps / --warmup / --ceiling-step")

    import warnings
    warnings.filterwarnings("ignore")  # deprecation notices would bury the result lines
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            emit({"ready": False, "error": "no CUDA device visible to torch"})
            return 1
        if args.memory_fraction < 1.0:
            torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    max_T = max(seqs + ([args.ceiling_max] if args.ceiling else []))
    try:
        model, opt, info = build(args, torch, max_T)
    except ImportError as e:
        emit({"ready": False, "error": "liger-kernel is not importable: %s" % e})
        return 1
    emit(info)
    V = SHAPES[args.shape]["vocab_size"]
    gen = torch.Generator(device=args.device).manual_seed(args.seed)

    for T in seqs:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        ms, loss = try_T(torch, model, opt, T, V, gen, cuda, args.warmup + args.steps)
        if ms is None:
            emit({"T": T, "oom": True})
            continue
        timed = ms[args.warmup:]
        med = statistics.median(timed)
        emit(dict({"T": T, "median_ms": med, "tokens_per_s": T / (med * 1e-3), "step_ms": timed,
                   "warmup_ms": ms[:args.warmup], "loss": loss}, **mem(torch, cuda)))

    if args.ceiling:
        # doubling from ceiling_start until a step fails (or ceiling_max), then bisection in units
        # of ceiling_step between the longest success and the shortest failure
        tries = []

        def attempt(T):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            ms, _ = try_T(torch, model, opt, T, V, gen, cuda, 1)
            rec = dict({"T": T, "ok": ms is not None, "ms": ms[0] if ms else (time.perf_counter() - t0) * 1e3},
                       **mem(torch, cuda))
            tries.append(rec)
            print(json.dumps({"try": rec}), file=sys.stderr, flush=True)
            return ms is not None

        step_t = args.ceiling_step
        lo, hi = 0, None
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
        emit({"ceiling": {"fits_T": lo, "fails_T": hi, "step": step_t, "max_searched": args.ceiling_max,
                          "tries": tries}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
