#!/usr/bin/env python3
"""Where an fp8 base's loss comes from: a rounding study on the demo's model.

The default model (SmolLM2-135M-Instruct Q4_1) is exported by `longtune export --format hf
--outtype f32`; transformers runs it in f32 on the CPU with each projection's weight and input
rounded as a variant says, and the mean loss over the answer tokens of the python-faq validation
and test splits (256-token rows, prompts masked) is compared to the unrounded model's. Variants:
  - e4m3 with a scale per row of W and per row of x (what --base-dtype fp8 does), weights only,
    activations only;
  - finer scales: x in 1 x 128 blocks, W in 128 x 128 blocks (what cuBLASLt's block-scaled FP8
    GEMMs take on Hopper);
  - each projection left out (--fp8-skip P), and gate, up and down left out together;
  - int8 with a scale per row, for contrast.
Rounding is e4m3fn nearest-even after scaling the block's largest magnitude to 448 (int8: to 127),
as lt_fp8_row_scale and lt_f32_to_fp8 do. Writes bench/results/fp8-sensitivity-cpu.json.

Needs torch and transformers (the CPU peer's packages: PYTHONPATH=/tmp/lt-peer).
usage: fp8-sensitivity.py [--build build] [--model GGUF] [--data DIR] [--splits valid,test] [--rows N]
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
F8 = torch.float8_e4m3fn


def round_rows(t, blk, kind):
    """t (R, K) rounded with one scale per row, or per 1 x blk group of a row."""
    K = t.shape[1]
    blk = blk or K
    top = 448.0 if kind == "e4m3" else 127.0
    out = torch.empty_like(t)
    for k0 in range(0, K, blk):
        s = t[:, k0:k0 + blk]
        amax = s.abs().amax(1, keepdim=True).clamp_min(1e-30)
        v = s * (top / amax)
        v = v.to(F8).float() if kind == "e4m3" else torch.round(v).clamp(-127, 127)
        out[:, k0:k0 + blk] = v * (amax / top)
    return out


def round_tiles(w, b):
    """w (O, K) rounded to e4m3 with one scale per b x b tile."""
    out = torch.empty_like(w)
    for o0 in range(0, w.shape[0], b):
        for k0 in range(0, w.shape[1], b):
            s = w[o0:o0 + b, k0:k0 + b]
            amax = s.abs().amax().clamp_min(1e-30)
            out[o0:o0 + b, k0:k0 + b] = (s * (448.0 / amax)).to(F8).float() * (amax / 448.0)
    return out


# name: (weight rounding, activation rounding, projections rounded)
# a rounding is None, ("row", kind) or ("blk", kind, size) / ("tile", size)
ROW8, ROWI = ("row", "e4m3"), ("row", "int8")
VARIANTS = {
    "e4m3, W and x per row (--base-dtype fp8)": (ROW8, ROW8, PROJ),
    "e4m3, W per row only": (ROW8, None, PROJ),
    "e4m3, x per row only": (None, ROW8, PROJ),
    "e4m3, W per row, x per 1x128": (ROW8, ("blk", "e4m3", 128), PROJ),
    "e4m3, W per 128x128, x per 1x128": (("tile", 128), ("blk", "e4m3", 128), PROJ),
    "e4m3, W per 128x128, x per row": (("tile", 128), ROW8, PROJ),
}
for p in PROJ:
    VARIANTS["e4m3 per row, " + p + " skipped"] = (ROW8, ROW8, [q for q in PROJ if q != p])
VARIANTS["e4m3 per row, gate, up and down skipped"] = (ROW8, ROW8, PROJ[:4])
VARIANTS["int8, W and x per row"] = (ROWI, ROWI, PROJ)
VARIANTS["int8, W per row only"] = (ROWI, None, PROJ)


def rounded(t, how):
    if how is None:
        return t
    if how[0] == "row":
        return round_rows(t, 0, how[1])
    if how[0] == "blk":
        return round_rows(t, how[2], how[1])
    return round_tiles(t, how[1])


def main():
    ap = argparse.ArgumentParser()
    cache = os.environ.get("LONGTUNE_CACHE", os.path.expanduser("~/.cache/longtune"))
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default=os.path.join(cache, "smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--data", default=os.path.join(cache, "data", "python-faq"))
    ap.add_argument("--splits", default="valid,test")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--out", default="bench/results/fp8-sensitivity-cpu.json")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        study(a, os.path.join(tmp, "hf"))


def study(a, hf):
    subprocess.run([os.path.join(a.build, "longtune"), "export", "--model", a.model, "--out", hf, "--format", "hf",
                    "--outtype", "f32"], check=True, stdout=subprocess.DEVNULL)
    tok = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    rows = []
    lines = [ln for sp in a.splits.split(",") for ln in open(os.path.join(a.data, sp + ".jsonl"))]
    for line in lines:
        msgs = json.loads(line)["messages"]
        full = tok.apply_chat_template(msgs, tokenize=True)
        prompt = tok.apply_chat_template(msgs[:-1], tokenize=True, add_generation_prompt=True)
        full = full if isinstance(full, list) else full["input_ids"]  # BatchEncoding in transformers 5
        prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
        ids = torch.tensor(full[:a.rows])
        labels = ids.clone()
        labels[:len(prompt)] = -100
        rows.append((ids, labels))
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in PROJ}
    weights = {n: m.weight.data.clone() for n, m in linears.items()}

    def setup(wr, xr, projs):
        for n, m in linears.items():
            on = n.split(".")[-1] in projs
            m.weight.data = rounded(weights[n], wr) if on else weights[n]
            xround = xr if on else None

            def fwd(x, m=m, xround=xround):
                if xround is not None:
                    x = rounded(x.reshape(-1, x.shape[-1]), xround).reshape(x.shape)
                return torch.nn.functional.linear(x, m.weight, m.bias)
            m.forward = fwd

    def loss():
        tot, n = 0.0, 0
        with torch.no_grad():
            for ids, labels in rows:
                out = model(ids[None], labels=labels[None])
                c = int((labels[1:] != -100).sum())
                tot += out.loss.item() * c
                n += c
        return tot / n, n

    setup(None, None, [])
    base, ntok = loss()
    print(f"{'unrounded f32':48s} {base:.5f}")
    res = []
    for name, (wr, xr, projs) in VARIANTS.items():
        setup(wr, xr, projs)
        v, _ = loss()
        res.append({"variant": name, "val_loss": round(v, 5), "over_f32": round(v / base, 5)})
        print(f"{name:48s} {v:.5f} {v / base:.4f}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"bench": "fp8-sensitivity", "commit": commit,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
           "config": {"model": "SmolLM2-135M-Instruct Q4_1 GGUF, exported to f32", "data":
                      "python-faq %s, %d rows of up to %d tokens, answer tokens only (%d)" % (a.splits, len(rows), a.rows, ntok),
                      "torch": torch.__version__, "runs": "transformers in f32 with rounded weights and inputs"},
           "val_loss_f32": round(base, 5), "variants": res}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
