"""Peer timings for `longtune bench lce --backend cuda`: the naive PyTorch loss layer (bf16 logits
h·Wᵀ then cross_entropy) and the transformers-style fp32 upcast (logits.float()), forward plus the
gradient of h, with the extra device memory each takes (peak minus inputs). Also the bf16 GEMM rate
at the loss GEMM's shape, the floor the fused loss is measured against. Prints JSON lines; needs PyTorch."""
import json
import sys

import torch
import torch.nn.functional as F


def run(name, N, V, C, reps, upcast):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = (torch.randn(N, C, device="cuda", generator=g) ).to(torch.bfloat16).requires_grad_(True)
    w = (torch.randn(V, C, device="cuda", generator=g) * 0.03).to(torch.bfloat16)
    t = torch.randint(0, V, (N,), device="cuda", generator=g)
    times = []
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for r in range(reps + 1):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        logits = h @ w.t()
        if upcast:
            logits = logits.float()
        loss = F.cross_entropy(logits, t)
        loss.backward()
        e1.record()
        torch.cuda.synchronize()
        if r >= 1:
            times.append(e0.elapsed_time(e1))
        h.grad = None
        del logits, loss
    extra = torch.cuda.max_memory_allocated() - base
    times.sort()
    print(json.dumps({"peer": name, "N": N, "V": V, "C": C, "total_ms": round(times[len(times) // 2], 3),
                      "extra_bytes": extra}), flush=True)


def gemm_rate(N, V, C, reps):
    a = torch.randn(N, C, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(V, C, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        c = a @ b.t()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        c = a @ b.t()
    e1.record()
    torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / reps
    print(json.dumps({"peer": "torch_gemm_bf16", "N": N, "V": V, "C": C, "ms": round(ms, 3),
                      "tflops": round(2.0 * N * V * C / ms / 1e9, 1)}), flush=True)


if __name__ == "__main__":
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    N, V, C = (int(x) for x in sys.argv[2:5]) if len(sys.argv) > 4 else (8192, 151936, 4096)
    gemm_rate(N, V, C, reps)
    torch.cuda.empty_cache()
    run("torch_naive_bf16", N, V, C, reps, False)
    torch.cuda.empty_cache()
    run("torch_fp32_upcast", N, V, C, reps, True)
