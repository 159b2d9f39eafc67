#!/usr/bin/env python3
"""Builds a long-document dataset from Debian's python3.11-doc: every reST source of the Python
documentation (/usr/share/doc/python3.11/html/_sources/**/*.rst.txt) of at least --min-chars
characters becomes one {"text": ...} record, whole (the library reference's module pages run from
about 6k to over 60k tokens). Records are split deterministically by the hash of their path into
train / valid / test (--valid-percent, --test-percent each). Standard library only; nothing is
downloaded (scripts/setup.sh installs the package). Output goes to a temporary folder, is fsynced
and renamed over --out; SOURCE.json records the inputs' hashes, and a second run with the same
inputs does nothing.

usage: scripts/prepare_longdocs.py --out DIR [--src DIR] [--min-chars N]
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

VERSION = 1
DEFAULT_SRC = "/usr/share/doc/python3.11/html/_sources"


def sources(src, min_chars):
    out = []
    for root, dirs, files in os.walk(src):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith(".rst.txt"):
                continue
            p = os.path.join(root, f)
            with open(p, encoding="utf-8") as fh:
                text = fh.read()
            if len(text) >= min_chars:
                out.append((os.path.relpath(p, src), text))
    return out


def split_of(rel, valid_pct, test_pct):
    h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:4], "little") % 100
    return "valid" if h < valid_pct else "test" if h < valid_pct + test_pct else "train"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--src", default=DEFAULT_SRC)
    ap.add_argument("--min-chars", type=int, default=24000)
    ap.add_argument("--valid-percent", type=int, default=10)
    ap.add_argument("--test-percent", type=int, default=10)
    a = ap.parse_args()
    if not os.path.isdir(a.src):
        sys.exit("prepare_longdocs: %s is missing: apt-get install python3.11-doc (scripts/setup.sh does)" % a.src)
    if a.min_chars < 1 or not (0 <= a.valid_percent <= 50 and 0 <= a.test_percent <= 50):
        sys.exit("prepare_longdocs: bad --min-chars / --valid-percent / --test-percent")
    docs = sources(a.src, a.min_chars)
    if not docs:
        sys.exit("prepare_longdocs: no document of %d characters under %s" % (a.min_chars, a.src))
    h = hashlib.sha256(json.dumps([VERSION, a.min_chars, a.valid_percent, a.test_percent]).encode())
    for rel, text in docs:
        h.update(rel.encode() + b"\0" + hashlib.sha256(text.encode()).digest())
    stamp = {"version": VERSION, "inputs_sha256": h.hexdigest(), "documents": len(docs)}
    stamp_path = os.path.join(a.out, "SOURCE.json")
    if os.path.exists(stamp_path):
        with open(stamp_path) as f:
            if json.load(f).get("inputs_sha256") == stamp["inputs_sha256"]:
                print("prepare_longdocs: %s is up to date" % a.out)
                return
    parent = os.path.dirname(os.path.abspath(a.out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".longdocs.", dir=parent)
    counts = {"train": 0, "valid": 0, "test": 0}
    chars = dict(counts)
    files = {k: open(os.path.join(tmp, k + ".jsonl"), "w", encoding="utf-8") for k in counts}
    for rel, text in docs:
        k = split_of(rel, a.valid_percent, a.test_percent)
        files[k].write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        counts[k] += 1
        chars[k] += len(text)
    stamp["splits"] = {k: {"documents": counts[k], "chars": chars[k]} for k in counts}
    for f in files.values():
        f.flush()
        os.fsync(f.fileno())
        f.close()
    with open(os.path.join(tmp, "SOURCE.json"), "w") as f:
        json.dump(stamp, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.rename(tmp, a.out)
    print("prepare_longdocs: %d documents (%s) -> %s" % (len(docs), ", ".join(
        "%s %d" % (k, counts[k]) for k in counts), a.out))


if __name__ == "__main__":
    main()
