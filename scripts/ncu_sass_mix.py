#!/usr/bin/env python3
"""Instruction mix of one kernel profiled by Nsight Compute, from its SASS source page.

Reads the CSV that `ncu -i REPORT --page source --csv --print-source sass` writes (one row per SASS
instruction with its executed count and warp-stall samples) and prints the warp instructions
executed, the opcodes by their share of them (with their share of the stall samples), and the
straight-line blocks executed most (a block = consecutive instructions with the same count: the
body of the hottest loop shows up first). This is how the attention kernels' run-time tests that
the compiler if-converted (a tanh per score on every tile) and their per-MMA descriptor
arithmetic were found (dev/cuda/README.md).

Profile first, for example:
  ncu --set full --import-source yes -k regex:attn_fwd_ws_kernel -c 1 -o fwd \\
      longtune bench attention --backend cuda --T 8192 --packed-T 0 --no-peers --repeats 1 --warmup 0
  ncu -i fwd.ncu-rep --page source --csv --print-source sass > fwd-sass.csv

usage: scripts/ncu_sass_mix.py SASS.csv [--top N] [--blocks N] [--json FILE]
"""
import argparse
import collections
import csv
import json
import re
import sys

OPCODE = re.compile(r"^(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def read_rows(path):
    """(opcode, text, executed, stall samples) per SASS instruction of the CSV's one kernel."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r), None)
    if head is None:
        sys.exit(f"{path}: no header with 'Source' and 'Instructions Executed' (was it --page source --csv?)")
    hdr = rows[head]
    i_src, i_exe = hdr.index("Source"), hdr.index("Instructions Executed")
    i_st = hdr.index("Warp Stall Sampling (All Samples)") if "Warp Stall Sampling (All Samples)" in hdr else None
    out = []
    for r in rows[head + 1:]:
        if len(r) <= max(i_src, i_exe):
            continue
        text = r[i_src].strip()
        m = OPCODE.match(text)
        if not m:
            continue
        try:
            exe = int(r[i_exe] or 0)
            st = int(r[i_st] or 0) if i_st is not None else 0
        except ValueError:
            continue
        out.append((m.group(1), text, exe, st))
    if not out:
        sys.exit(f"{path}: no SASS rows")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=20, help="opcodes listed (default 20)")
    ap.add_argument("--blocks", type=int, default=3, help="hottest blocks listed (default 3)")
    ap.add_argument("--json", help="also write the table as JSON to this file")
    a = ap.parse_args()
    rows = read_rows(a.csv)
    total = sum(r[2] for r in rows)
    stalls = sum(r[3] for r in rows) or 1
    ops, op_st = collections.Counter(), collections.Counter()
    for op, _, exe, st in rows:
        ops[op] += exe
        op_st[op] += st
    print(f"{total:,} warp instructions executed, {sum(r[3] for r in rows):,} stall samples")
    table = []
    for op, n in ops.most_common(a.top):
        share, st_share = n / total if total else 0.0, op_st[op] / stalls
        table.append({"opcode": op, "executed": n, "share": share, "stall_share": st_share})
        print(f"  {op:12s} {n:15,d} {100 * share:5.1f} %   stalls {100 * st_share:5.1f} %")
    blocks = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][2] != rows[start][2]:
            if rows[start][2] > 0:
                blocks.append((rows[start][2] * (i - start), rows[start][2], start, i))
            start = i
    blocks.sort(reverse=True)
    out_blocks = []
    for weight, count, s, e in blocks[: a.blocks]:
        mix = collections.Counter(r[0] for r in rows[s:e])
        out_blocks.append({"executions": count, "instructions": e - s, "opcodes": dict(mix.most_common())})
        print(f"block of {e - s} instructions executed {count:,} times "
              f"({100 * weight / total:.1f} % of all): " + ", ".join(f"{k} {v}" for k, v in mix.most_common(10)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"csv": a.csv, "warp_instructions": total, "opcodes": table, "blocks": out_blocks}, f, indent=1)


if __name__ == "__main__":
    main()
