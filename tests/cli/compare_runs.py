#!/usr/bin/env python3
"""Compares two `longtune train` output folders for the distributed-training CLI tests: the
metrics (train and validation loss, tokens per step) and the saved adapter must agree within fp32
tolerance, and each metrics step must appear once (one writer). usage: compare_runs.py REF OTHER"""
import json, struct, sys
TOL_REL = 2e-5   # fp32: sums in another order, carried through a few AdamW steps
TOL_ABS = 1e-6
def metrics(d):
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    steps = [r["step"] for r in recs]
    assert len(steps) == len(set(steps)), "%s: duplicated metrics steps %s (more than one writer?)" % (d, steps)
    return {r["step"]: r for r in recs}
def tensors(d):
    b = open(d + "/adapter_model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
a, b = metrics(sys.argv[1]), metrics(sys.argv[2])
bad = []
assert sorted(a) == sorted(b), "steps differ: %s vs %s" % (sorted(a), sorted(b))
for s in sorted(a):
    for key in ("train_loss", "val_loss", "tokens"):
        x, y = a[s].get(key), b[s].get(key)
        if (x is None) != (y is None): bad.append((s, key, x, y)); continue
        if x is not None and abs(x - y) > TOL_ABS + TOL_REL * abs(x): bad.append((s, key, x, y))
ta, tb = tensors(sys.argv[1]), tensors(sys.argv[2])
assert sorted(ta) == sorted(tb), "adapter tensor names differ"
worst = 0.0
for k in ta:
    for x, y in zip(ta[k], tb[k]):
        worst = max(worst, abs(x - y) / (TOL_ABS + TOL_REL * abs(x)))
if worst > 1: bad.append(("adapter", "max error / tolerance", worst, None))
if bad:
    print("FAIL: %s vs %s:" % (sys.argv[1], sys.argv[2]), bad)
    sys.exit(1)
print("%s: %d steps match the single process (adapter max error %.3g of tolerance)" % (sys.argv[2], len(a), worst))
