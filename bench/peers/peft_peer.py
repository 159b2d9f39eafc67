"""What the transformers + PEFT training peers (train_peft_gpu.py, train_moe_peft_gpu.py) share: the
flags both take, starting torch on the device, the LoRA model with gradient checkpointing and AdamW
built from a transformers config, the ready line's common fields, and the timed steps of the --seq
pass and of a ceiling search, with their JSON lines. Each peer keeps its own shapes, model config
and search order; this module prints only what they ask it to."""
import gc
import json
import os
import statistics
import sys
import time


def emit(obj):
    print(json.dumps(obj), flush=True)


def add_args(ap, shapes, steps, warmup):
    """The flags every training peer takes; the caller adds its own after these."""
    ap.add_argument("--shape", choices=sorted(shapes), required=True)
    ap.add_argument("--seq", default="", help="comma list of tokens per step to time")
    ap.add_argument("--steps", type=int, default=steps, help="timed steps per length (median reported)")
    ap.add_argument("--warmup", type=int, default=warmup, help="untimed steps first per length")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-grad-checkpointing", action="store_true",
                    help="keep every layer's activations (no gradient checkpointing)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (to check the script only)")
    ap.add_argument("--memory-fraction", type=float, default=1.0,
                    help="cap this process at a fraction of device memory (to exercise the OOM path)")


def parse_seqs(ap, args):
    """--seq as a list of lengths; a malformed list is an argparse error naming the flag."""
    try:
        return [int(x) for x in args.seq.split(",") if x.strip()]
    except ValueError:
        ap.error("bad --seq")


def start_torch(args):
    """Imports torch quietly and prepares the device; (torch, cuda), or (None, cuda) after printing
    the not-ready line when no CUDA device is visible."""
    import warnings
    warnings.filterwarnings("ignore")  # deprecation notices would bury the result lines
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            emit({"ready": False, "error": "no CUDA device visible to torch"})
            return None, cuda
        if args.memory_fraction < 1.0:
            torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    return torch, cuda


def lora_model(args, torch, cfg, targets):
    """The bf16 model of cfg built in place on the device (an 8B init on the host would take
    minutes), gradient checkpointing on every layer (unless --no-grad-checkpointing), LoRA r=--rank alpha 2r on targets, AdamW over
    the LoRA parameters; (model, trainable params, optimizer, init seconds)."""
    import peft
    import transformers
    dev = torch.device(args.device)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    with dev:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.config.use_cache = False
    if not args.no_grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lcfg = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, bias="none",
                           task_type="CAUSAL_LM", target_modules=targets)
    model = peft.get_peft_model(model, lcfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return model, params, opt, time.perf_counter() - t0


def checkpointing(args):
    """The ready line's gradient_checkpointing value."""
    return "off" if args.no_grad_checkpointing else "every layer (use_reentrant=False)"


def ready_info(args, torch, shape_cfg, model, params, init_s, targets, **extra):
    """The ready line: versions, device, shape, sizes and the LoRA setup, then `extra` in order, then
    the device's memory figures on CUDA."""
    import peft
    import transformers
    cuda = args.device == "cuda"
    info = {"ready": True, "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "shape": args.shape, "config": shape_cfg,
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "init_s": init_s, "n_params": sum(p.numel() for p in model.parameters()),
            "n_lora_params": sum(p.numel() for p in params),
            "lora_dtype": str(params[0].dtype).replace("torch.", ""), "base_dtype": "bfloat16",
            "lora_rank": args.rank, "lora_alpha": 2 * args.rank, "lora_targets": targets,
            "attention": "sdpa"}
    info.update(extra)
    if cuda:
        info["memory_fraction"] = args.memory_fraction
        info["device_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return info


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


def time_seqs(torch, model, opt, seqs, V, gen, cuda, args):
    """The --seq pass: warmup + steps at each length, one line each (median over the timed steps),
    {"T", "oom": true} for a length that runs out of memory."""
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


def attempt(torch, model, opt, T, V, gen, cuda, tries):
    """One step at T for a ceiling search: appends its record to tries (and prints it on stderr);
    True when it trained."""
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    ms, _ = try_T(torch, model, opt, T, V, gen, cuda, 1)
    rec = dict({"T": T, "ok": ms is not None, "ms": ms[0] if ms else (time.perf_counter() - t0) * 1e3},
               **mem(torch, cuda))
    tries.append(rec)
    print(json.dumps({"try": rec}), file=sys.stderr, flush=True)
    return ms is not None
