#!/usr/bin/env python3
"""Prepares the Alpaca-shaped instruction data of `longtune bench packed`: the 805 instruction /
output pairs of AlpacaEval's example outputs (example/outputs.json in the source distribution of the
PyPI package alpaca-eval 0.6.6, fetched with pip, checked by SHA-256) written as an mlx-lm chat
dataset: <out>/train.jsonl, one {"messages": [user instruction, assistant output]} per line, in the
file's order. It reads and rewrites; it does not filter, tokenise or shuffle (the bench packs).

usage: python3 scripts/prepare_alpaca.py [--out bench/data/alpaca-eval] [--sdist FILE]"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "alpaca-eval==0.6.6"
SDIST = "alpaca_eval-0.6.6.tar.gz"
SHA256 = "94db28994674800f59de9983a275bab6c543c8f0478a039b421dd9456a9e43de"
MEMBER = "alpaca_eval-0.6.6/example/outputs.json"


def fetch(dest):
    """pip download of the source distribution into dest; returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", dest, PACKAGE]
    subprocess.run(cmd, check=True)
    return os.path.join(dest, SDIST)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "data",
                                                 "alpaca-eval"))
    ap.add_argument("--sdist", help=f"an already downloaded {SDIST} (else pip downloads it)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = a.sdist or fetch(tmp)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != SHA256:
            sys.exit(f"{path}: SHA-256 {digest}, expected {SHA256}")
        with tarfile.open(path) as tf:
            records = json.load(tf.extractfile(MEMBER))
    if not isinstance(records, list):
        sys.exit(f"{MEMBER}: expected a list of records")
    os.makedirs(a.out, exist_ok=True)
    out = os.path.join(a.out, "train.jsonl")
    tmp_out = out + ".tmp"
    n = 0
    with open(tmp_out, "w", encoding="utf-8") as f:
        for i, r in enumerate(records):
            ins, outp = r.get("instruction"), r.get("output")
            if not isinstance(ins, str) or not isinstance(outp, str):
                sys.exit(f"{MEMBER}: record {i}: instruction/output missing or not text")
            f.write(json.dumps({"messages": [{"role": "user", "content": ins},
                                             {"role": "assistant", "content": outp}]}, ensure_ascii=False) + "\n")
            n += 1
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_out, out)
    print(f"wrote {n} records to {out} ({os.path.getsize(out)} bytes) from {PACKAGE} {MEMBER}")


if __name__ == "__main__":
    main()
