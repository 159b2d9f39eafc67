"""Peer arm of `longtune bench train`: one LoRA training step of a Hugging Face model folder with
PyTorch + transformers + PEFT on the CPU (f32 weights, SDPA attention, gradient checkpointing
unless told not to, LoRA on q,k,v,o,gate,up,down, batch 1, AdamW), driven step by step over stdin
so the C bench can interleave it with its own steps. It only times; it does not install anything
(the bench's --install-peer does that with pip).

Protocol: argv = model_dir threads rank alpha seed [checkpointing|no-checkpointing] [f32|bf16]
(bf16: the model held in bf16, its linear layers bf16 products through oneDNN, the adapters in
f32 as PEFT keeps them by default; f32, the default: everything in f32). Prints
{"ready": ...} once loaded; then for each stdin line "T" runs one step on a fresh random batch of
T tokens and prints one JSON line {"T", "ms", "cpu_ms", "loss", "max_rss_bytes"} (cpu_ms: process
CPU time, all threads); "quit" (or EOF) exits."""
import json
import resource
import sys
import time


def main():
    model_dir, threads, rank, alpha, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    ckpt = len(sys.argv) < 7 or sys.argv[6] != "no-checkpointing"
    bf16 = len(sys.argv) >= 8 and sys.argv[7] == "bf16"
    import os
    import warnings
    warnings.filterwarnings("ignore")  # deprecation notices would bury the bench's own lines
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    import peft
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    dtype = torch.bfloat16 if bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    V = model.config.vocab_size
    print(json.dumps({"ready": True, "torch": torch.__version__, "transformers": transformers.__version__,
                      "peft": peft.__version__, "threads": torch.get_num_threads(),
                      "n_lora_params": sum(p.numel() for p in params), "dtype": str(dtype).replace("torch.", ""),
                      "adapter_dtype": str(params[0].dtype).replace("torch.", ""),
                      "gradient_checkpointing": "every layer (use_reentrant=False)" if ckpt else "off"}), flush=True)
    g = torch.Generator().manual_seed(seed)
    for line in sys.stdin:
        line = line.strip()
        if not line or line == "quit":
            break
        T = int(line)
        ids = torch.randint(0, V, (1, T), generator=g)
        c0 = time.process_time()
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - t0) * 1e3
        cpu_ms = (time.process_time() - c0) * 1e3
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"T": T, "ms": ms, "cpu_ms": cpu_ms, "loss": float(out.loss.detach()), "max_rss_bytes": rss}), flush=True)


if __name__ == "__main__":
    main()
