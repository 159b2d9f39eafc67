#!/usr/bin/env python3
"""Peer of `longtune bench tokenizer`: encodes the same documents with the Hugging Face `tokenizers`
library on one thread and prints one JSON object: the median seconds over repeats, bytes, tokens
and an FNV-1a hash of all ids (so the bench can confirm both sides produced the same tokens).

usage: tokenizers_peer.py (--gguf M.gguf | --tokenizer tokenizer.json) --docs FILE [--repeats N] [--warmup N]
FILE holds the documents separated by NUL bytes. The GGUF's tokenizer is rebuilt as a
tokenizer.json the way tests/oracle/gen_tokenizer_fixtures.py does (SmolLM2 layout)."""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "oracle"))


def from_gguf(path):
    from gen_tokenizer_fixtures import gguf_read_meta
    meta = gguf_read_meta(path)
    if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") not in ("smollm", "starcoder"):
        sys.exit("peer: only SmolLM2/StarCoder-layout GGUF tokenizers are rebuilt here; pass --tokenizer")
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf")
    ap.add_argument("--tokenizer")
    ap.add_argument("--docs", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    tok = from_gguf(a.gguf) if a.gguf else Tokenizer.from_file(a.tokenizer)
    raw = open(a.docs, "rb").read()
    docs = [d.decode("utf-8", errors="replace") for d in raw.split(b"\0") if d]
    times = []
    ids_all = None
    for r in range(a.warmup + a.repeats):
        t0 = time.perf_counter()
        out = [tok.encode(d, add_special_tokens=False).ids for d in docs]
        dt = time.perf_counter() - t0
        if r >= a.warmup:
            times.append(dt)
        ids_all = out
    h = 0xCBF29CE484222325
    n = 0
    for ids in ids_all:
        for i in ids:
            for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
                h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
            n += 1
    print(json.dumps({"median_s": statistics.median(times), "bytes": sum(len(d) for d in raw.split(b"\0")),
                      "docs": len(docs), "tokens": n, "ids_fnv1a": "%016x" % h,
                      "tokenizers_version": __import__("tokenizers").__version__}))


if __name__ == "__main__":
    main()
