#!/usr/bin/env python3
"""Writes the Qwen3-MoE fixture SRC into OUT with its vocabulary widened to the bpe-nfc test
tokenizer's 1200 ids (embedding and head rows repeated) and that tokenizer beside it, so the CLI
can train it on text. usage: widen_moe_vocab.py SRC OUT"""
import json, os, shutil, struct, sys
src, out = sys.argv[1], sys.argv[2]
V = 1200
os.makedirs(out)
c = json.load(open(os.path.join(src, "config.json")))
v0 = c["vocab_size"]
c["vocab_size"] = V
json.dump(c, open(os.path.join(out, "config.json"), "w"))
b = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n])
hdr.pop("__metadata__", None)
tensors = {}
for k, e in hdr.items():
    a, z = e["data_offsets"]
    data = b[8 + n + a:8 + n + z]
    if k in ("model.embed_tokens.weight", "lm_head.weight"):  # rows repeated up to V
        row = len(data) // v0
        data = b"".join(data[(i % v0) * row:(i % v0 + 1) * row] for i in range(V))
        e["shape"] = [V, e["shape"][1]]
    tensors[k] = (e, data)
off, h = 0, {}
for k, (e, data) in tensors.items():
    h[k] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [off, off + len(data)]}
    off += len(data)
hj = json.dumps(h).encode()
hj += b" " * (-len(hj) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hj)) + hj)
    for k, (e, data) in tensors.items():
        f.write(data)
tok = os.path.join(src, "..", "..", "tokenizer", "bpe-nfc")
for fn in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(tok, fn), os.path.join(out, fn))
