#!/usr/bin/env python3
"""Fixtures for tests/unit/test_quant.c: random but valid blocks of every GGUF block format
longtune reads, dequantised by gguf-py (gguf.quants.dequantize, the definition llama.cpp's
Python tools and transformers' GGUF loader use), and, for the types gguf-py can quantize, random
rows with gguf-py's quantized bytes.

A block's packed levels are uniform random bytes (every bit pattern is a valid level); its f16
scale fields are random finite halves of both signs across the normal and subnormal range, so
the fixtures exercise every field and the scale arithmetic, not one quantizer's habits.

Writes tests/fixtures/quant/<type>.blocks (raw block bytes), <type>.f32 (expected dequantised
float32, little-endian) and, where gguf-py quantizes the type, <type>.qin.f32 (float32 rows) and
<type>.qout (gguf-py's quantized bytes). CI never runs this, only its outputs.
Usage: /work/pyenv/bin/python tests/oracle/gen_quant_vectors.py [--out tests/fixtures/quant] [--seed 1]
"""
import argparse
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

# type -> byte offsets of its f16 fields inside one block
HALF_FIELDS = {
    Q.F16: None, Q.BF16: None,
    Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.IQ4_NL: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208], Q.IQ4_XS: [0],
}
QUANTIZABLE = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.BF16]
WEIGHTS = 1024  # per type: 32 blocks of 32 or 4 super-blocks of 256


def random_halves(rng, n):
    """Finite f16 values of both signs, magnitudes 2^-24 .. 2^8 (subnormals included)."""
    mag = np.exp2(rng.uniform(-24, 8, n)).astype(np.float32)
    h = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    h[0] = np.float16(0.0)  # one zero scale
    return h


def make_blocks(rng, t):
    bs, ts = GGML_QUANT_SIZES[t]
    if t == Q.F16:
        return random_halves(rng, WEIGHTS).view(np.uint8)
    if t == Q.BF16:
        x = rng.standard_normal(WEIGHTS).astype(np.float32) * np.exp2(rng.uniform(-30, 30, WEIGHTS)).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    nb = WEIGHTS // bs
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in HALF_FIELDS[t]:
        raw[:, off:off + 2] = random_halves(rng, nb).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "quant"))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for t in HALF_FIELDS:
        name = t.name.lower()
        raw = make_blocks(rng, t)
        ref = dequantize(raw, t).astype(np.float32).reshape(-1)
        assert ref.size == WEIGHTS and np.all(np.isfinite(ref)), name
        raw.tofile(os.path.join(args.out, name + ".blocks"))
        ref.astype("<f4").tofile(os.path.join(args.out, name + ".f32"))
        if t in QUANTIZABLE:
            # rows with outliers, constant blocks and an all-zero block
            x = rng.standard_normal(WEIGHTS).astype(np.float32) * np.float32(0.05)
            x[rng.integers(0, WEIGHTS, 8)] *= np.float32(40.0)
            x[64:96] = np.float32(0.25)
            x[96:128] = np.float32(0.0)
            q = quantize(x.reshape(1, -1), t).reshape(-1)
            x.astype("<f4").tofile(os.path.join(args.out, name + ".qin.f32"))
            q.tofile(os.path.join(args.out, name + ".qout"))
        print(f"{name}: {raw.size} bytes -> {ref.size} floats")


if __name__ == "__main__":
    main()
