#!/usr/bin/env python3
"""Compares two `longtune train` output folders for the distributed-training tests: the metrics
(train and validation loss, tokens per step) and the saved adapter must agree, and each metrics
step must appear once (one writer). usage: compare_runs.py [--tol fp32|bf16] REF OTHER

--tol fp32 (default): host runs, where the only difference is the order of f32 sums.
--tol bf16: CUDA runs, whose matmuls and attention round operands to bf16 (unit roundoff 2^-8):
another split of the batch over ranks changes which partial sums are rounded, so losses may differ
by 2 x 2^-8 relative and each adapter tensor by 2 x 2^-8 of its largest magnitude, per element
(AdamW normalises updates, so a bf16-sized gradient difference moves every element by about the
same absolute amount, small against the tensor's scale, not against each small element)."""
import json, struct, sys
args = sys.argv[1:]
mode = "fp32"
if len(args) >= 2 and args[0] == "--tol":
    mode = args[1]; args = args[2:]
if mode not in ("fp32", "bf16") or len(args) != 2:
    sys.exit("usage: compare_runs.py [--tol fp32|bf16] REF OTHER")
if mode == "fp32":
    TOL_REL, TOL_ABS, TENSOR_SCALED = 2e-5, 1e-6, False  # fp32: sums in another order, a few AdamW steps
else:
    TOL_REL, TOL_ABS, TENSOR_SCALED = 2 * 2.0 ** -8, 1e-6, True
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
a, b = metrics(args[0]), metrics(args[1])
bad = []
assert sorted(a) == sorted(b), "steps differ: %s vs %s" % (sorted(a), sorted(b))
for s in sorted(a):
    for key in ("train_loss", "val_loss", "tokens"):
        x, y = a[s].get(key), b[s].get(key)
        if (x is None) != (y is None): bad.append((s, key, x, y)); continue
        if x is not None and abs(x - y) > TOL_ABS + TOL_REL * abs(x): bad.append((s, key, x, y))
ta, tb = tensors(args[0]), tensors(args[1])
assert sorted(ta) == sorted(tb), "adapter tensor names differ"
worst = 0.0
for k in ta:
    scale = max(abs(x) for x in ta[k]) if TENSOR_SCALED and ta[k] else None
    for x, y in zip(ta[k], tb[k]):
        worst = max(worst, abs(x - y) / (TOL_ABS + TOL_REL * (scale if scale is not None else abs(x))))
if worst > 1: bad.append(("adapter", "max error / tolerance", worst, None))
if bad:
    print("FAIL (%s tolerance): %s vs %s:" % (mode, args[0], args[1]), bad)
    sys.exit(1)
print("%s: %d steps match the reference within %s tolerance (adapter max error %.3g of tolerance)" %
      (args[1], len(a), mode, worst))
