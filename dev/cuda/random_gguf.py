#!/usr/bin/env python3
"""A GGUF with a real model's metadata (architecture, tokenizer, chat template) and tensor table but
random weights, for device runs that cannot carry the real file (the device sessions take at most a
few MiB per helper; SmolLM2-135M Q4_1 is 94 MB). Two steps:

  random_gguf.py head REAL.gguf HEAD.bin      # here: the header (metadata + tensor infos) only
  random_gguf.py fill HEAD.bin OUT.gguf SEED  # there: header + random blocks at the same offsets

Weights are drawn so each tensor has roughly transformers' initialisation scale (std 0.02) with
norms at 1: Q8_0 blocks get a random int8 payload and a matching scale, Q4_1 blocks random nibbles
with scale and minimum centring them, F32/F16 tensors normal values. Only those four types are
written; any other is refused. Not a converter: real weights never enter the output."""
import struct
import sys

import numpy as np

ALIGN = 32
# type id: (block elements, block bytes)
TYPES = {0: (1, 4), 1: (1, 2), 3: (32, 20), 8: (32, 34)}


def read_header(buf):
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, buf, off)
        off += struct.calcsize(fmt)
        return v

    def string():
        nonlocal off
        (n,) = take("<Q")
        s = bytes(buf[off:off + n])
        off += n
        return s

    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}

    def value(t):
        nonlocal off
        if t == 8:
            return string()
        if t == 9:
            (et,) = take("<I")
            (n,) = take("<Q")
            if et in (8, 9):
                return [value(et) for _ in range(n)]
            off += struct.calcsize(scalar[et]) * n  # numeric arrays are skipped
            return None
        return take(scalar[t])[0]

    magic = bytes(buf[:4])
    if magic != b"GGUF":
        sys.exit("not a GGUF file")
    off = 4
    (version,) = take("<I")
    n_tensors, n_kv = take("<QQ")
    align = ALIGN
    for _ in range(n_kv):
        key = string()
        (t,) = take("<I")
        v = value(t)
        if key == b"general.alignment":
            align = int(v)
    tensors = []
    for _ in range(n_tensors):
        name = string()
        (nd,) = take("<I")
        dims = take("<%dQ" % nd)
        (tt,) = take("<I")
        (toff,) = take("<Q")
        tensors.append((name.decode(), dims, tt, toff))
    return version, align, off, tensors


def tensor_bytes(dims, tt):
    if tt not in TYPES:
        sys.exit("tensor type %d is not written by this script" % tt)
    be, bb = TYPES[tt]
    n = int(np.prod(dims))
    return n // be * bb


def head(real, out):
    with open(real, "rb") as f:
        buf = f.read(64 << 20)
    _, _, end, tensors = read_header(buf)
    for name, dims, tt, _ in tensors:
        tensor_bytes(dims, tt)  # refuse early
    with open(out, "wb") as f:
        f.write(buf[:end])
    print("header: %d bytes, %d tensors" % (end, len(tensors)))


def fill(head_path, out, seed):
    with open(head_path, "rb") as f:
        hdr = f.read()
    _, align, end, tensors = read_header(hdr)
    rng = np.random.default_rng(seed)
    data0 = (end + align - 1) // align * align
    with open(out, "wb") as f:
        f.write(hdr)
        f.write(b"\0" * (data0 - end))
        for name, dims, tt, toff in sorted(tensors, key=lambda t: t[3]):
            pos = f.tell() - data0
            if toff < pos:
                sys.exit("overlapping tensors at %s" % name)
            f.write(b"\0" * (toff - pos))
            n = int(np.prod(dims))
            if tt in (0, 1):
                v = np.ones(n) if "norm" in name else rng.normal(0, 0.02, n)
                f.write(v.astype(np.float32 if tt == 0 else np.float16).tobytes())
            elif tt == 8:  # Q8_0: f16 d, 32 int8 q; w = d·q
                nb = n // 32
                blk = np.zeros((nb, 34), np.uint8)
                blk[:, :2] = np.full(nb, 0.02 / 73.0, np.float16).view(np.uint8).reshape(nb, 2)
                blk[:, 2:] = rng.integers(-127, 128, (nb, 32), dtype=np.int16).astype(np.int8).view(np.uint8)
                f.write(blk.tobytes())
            else:  # Q4_1: f16 d, f16 m, 16 bytes of nibbles; w = d·q + m, q in 0..15
                nb = n // 32
                d = 0.02 / 4.6
                blk = np.zeros((nb, 20), np.uint8)
                blk[:, :2] = np.full(nb, d, np.float16).view(np.uint8).reshape(nb, 2)
                blk[:, 2:4] = np.full(nb, -7.5 * d, np.float16).view(np.uint8).reshape(nb, 2)
                blk[:, 4:] = rng.integers(0, 256, (nb, 16), dtype=np.int16).astype(np.uint8)
                f.write(blk.tobytes())
    print("wrote %s (%d tensors, random weights, seed %d)" % (out, len(tensors), seed))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "head":
        head(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "fill":
        fill(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
