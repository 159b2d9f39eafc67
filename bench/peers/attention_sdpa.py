"""Peer timings for `longtune bench attention --backend cuda`: PyTorch scaled_dot_product_attention
with the FlashAttention-2 backend and with the cuDNN backend, causal, bf16, forward and backward,
on the same shapes. Prints one JSON object per line. Grouped-query heads are expanded to H heads
outside the timed region when a backend lacks GQA (the FLOPs are the same). Needs PyTorch + a GPU;
never used by the tests."""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(2048, 32, 8, 128), (8192, 32, 8, 128), (32768, 32, 8, 128), (8192, 32, 32, 64), (8192, 32, 8, 96),
          (8192, 16, 8, 256), (32768, 9, 3, 64)]


def time_backend(backend, T, H, Hkv, D, reps):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, Hkv, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, Hkv, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    q.requires_grad_(True); k.requires_grad_(True); v.requires_grad_(True)
    do = torch.randn_like(q)
    tf, tb = [], []
    with sdpa_kernel([backend]):
        for r in range(reps + 2):
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            e1.record()
            o.backward(do)
            e2.record()
            torch.cuda.synchronize()
            if r >= 2:
                tf.append(e0.elapsed_time(e1)); tb.append(e1.elapsed_time(e2))
            q.grad = k.grad = v.grad = None
    tf.sort(); tb.sort()
    return tf[len(tf) // 2], tb[len(tb) // 2]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for (T, H, Hkv, D) in SHAPES:
        ff = 4.0 * H * T * T * D / 2
        for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                mf, mb = time_backend(be, T, H, Hkv, D, reps)
                print(json.dumps({"peer": name, "T": T, "H": H, "Hkv": Hkv, "D": D, "fwd_ms": round(mf, 4),
                                  "bwd_ms": round(mb, 4), "fwdbwd_tflops": round(3.5 * ff / (mf + mb) / 1e9, 1)}),
                      flush=True)
            except Exception as e:  # a backend that refuses the shape is reported, not fatal
                print(json.dumps({"peer": name, "T": T, "D": D, "error": str(e)[:200]}), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
