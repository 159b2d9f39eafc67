#!/usr/bin/env python3
"""Folds `longtune bench --tier ...` suite files (bench/results/suite-*.json) into the README's
community table: one row per suite file with its machine, tier, commit and date, the training-step
rate of each shape and length (with the ratio to the transformers + PEFT peer of the same run), the
longest trainable context of both arms, and packed against unpacked throughput. It prints the
table, or with --readme rewrites the part of README.md between the community-results markers
(atomically). It reads result files only; it runs and measures nothing.

usage: python3 scripts/fold_results.py SUITE.json... [--readme README.md]"""
import argparse
import json
import os
import sys

BEGIN, END = "<!-- community-results:begin -->", "<!-- community-results:end -->"


def fmt_rate(x):
    return f"{x / 1000:.1f}k" if x >= 10000 else f"{x:,.0f}"


def fmt_T(t):
    t = int(t)
    return f"{t // 1024}k" if t % 1024 == 0 and t >= 1024 else str(t)


def train_cell(res):
    cfg = res.get("config", {})
    arms = {a["name"]: a for a in res.get("arms", [])}
    parts = []
    for name, a in arms.items():
        if not name.startswith("longtune-T"):
            continue
        T = a["T"]
        s = f"{cfg.get('shape', '?')} {fmt_T(T)}: {fmt_rate(a['tokens_per_s'])} tok/s"
        if "mfu" in a:
            s += f", MFU {a['mfu'] * 100:.0f}%"
        p = arms.get(f"torch-peft-T{int(T)}", {})
        if "longtune_speedup" in p:
            s += f" ({p['longtune_speedup']:.2f}x peer"
            if "longtune_memory_ratio" in p:
                s += f", {p['longtune_memory_ratio']:.2f}x memory"
            s += ")"
        parts.append(s)
    return parts


def context_cell(res):
    cfg = res.get("config", {})
    arms = {a["name"]: a for a in res.get("arms", [])}
    ours, peer = arms.get("longtune", {}), arms.get("torch-peft", {})
    if not ours.get("ceiling_T"):
        return []
    s = f"{cfg.get('shape', '?')}: {int(ours['ceiling_T']):,} tokens"
    if ours.get("step_confirmed_T") and ours["step_confirmed_T"] != ours["ceiling_T"]:
        s += f" (step run at {int(ours['step_confirmed_T']):,})"
    if peer.get("ceiling_T"):
        s += f" vs peer {int(peer['ceiling_T']):,}"
    return [s]


def packed_cell(res):
    arms = {a["name"]: a for a in res.get("arms", [])}
    p, u, b8 = arms.get("packed"), arms.get("unpacked-b1"), arms.get("padded-b8")
    if not p or not u:
        return []
    s = f"{fmt_rate(p['real_tokens_per_s'])} real tok/s, {p['real_tokens_per_s'] / u['real_tokens_per_s']:.2f}x unpacked b1"
    if b8:
        s += f", {p['real_tokens_per_s'] / b8['real_tokens_per_s']:.2f}x padded b8"
    return [s]


def row(suite, path):
    if suite.get("bench") != "suite":
        raise ValueError(f"{path}: not a suite file (bench = {suite.get('bench')!r})")
    m = suite.get("machine", {})
    gpu = m.get("gpu")
    mach = f"{gpu} ({m.get('gpu_memory_bytes', 0) / 2**30:.0f} GiB)" if gpu else f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores)"
    cols = {"train": [], "context": [], "packed": []}
    for run in suite.get("arms", []):
        res = run.get("result")
        if not res:
            continue
        b = res.get("bench")
        if b == "train":
            cols["train"] += train_cell(res)
        elif b == "context":
            cols["context"] += context_cell(res)
        elif b == "packed":
            cols["packed"] += packed_cell(res)
    cfg = suite.get("config", {})
    failed = cfg.get("failed", 0)
    return (f"| {suite.get('date', '?')[:10]} | {mach} | {cfg.get('tier', '?')} | `{suite.get('commit', '?')}` | "
            + " | ".join("<br>".join(cols[k]) or "–" for k in ("train", "context", "packed"))
            + f" | {failed} |")


def table(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows.append(row(json.load(f), p))
    head = ("| date | machine | tier | commit | training step (tokens/s, vs transformers + PEFT) | "
            "longest context | packed vs unpacked | failed |\n|---|---|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--readme", help="rewrite the table between the community-results markers of this file")
    a = ap.parse_args()
    try:
        t = table(a.files)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        sys.exit(f"fold_results: {e}")
    if not a.readme:
        sys.stdout.write(t)
        return
    with open(a.readme) as f:
        text = f.read()
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        sys.exit(f"{a.readme}: no {BEGIN} ... {END} markers")
    text = text[:i + len(BEGIN)] + "\n" + t + text[j:]
    tmp = a.readme + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, a.readme)
    print(f"{a.readme}: table of {len(a.files)} suite file(s) written")


if __name__ == "__main__":
    main()
