#!/usr/bin/env python3
"""Per-kernel device time of a program profiled by Nsight Compute.

Reads the CSV that `ncu --metrics gpu__time_duration.sum --csv --print-units base` writes (a row
per launch with --page raw, else a row per launch and metric) and prints, per kernel name (template arguments kept, parameters cut), the launches,
the total and the mean time, largest first, with each kernel's share of the sum. With --json FILE
the same table is written as JSON.

With --from A --to B only the launches from the first whose name holds A to the first one after
it whose name holds B are counted (one call's kernels out of a program's).

usage: scripts/ncu_kernels.py NCU.csv [--top N] [--json FILE] [--from TEXT --to TEXT]
"""
import argparse
import collections
import csv
import io
import json
import sys


def kernel_key(name):
    """The kernel's name with its template arguments but without its parameter list."""
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            return name[:i]
    return name


def launch_rows(path):
    """The CSV's rows from its header ("ID", ...) on, as dicts, the launches' only: lines before the
    header (the profiled program's own output) and rows without a launch ID (units) are dropped.
    Exits with a message when the file has no Nsight Compute header."""
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"{path}: no Nsight Compute CSV header (\"ID\", ...) found")
    return [r for r in csv.DictReader(io.StringIO(text[start:])) if (r.get("ID") or "").isdigit()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json")
    ap.add_argument("--from", dest="span_from", metavar="TEXT",
                    help="only the launches from the first whose kernel name holds TEXT ...")
    ap.add_argument("--to", dest="span_to", metavar="TEXT",
                    help="... to the first one after it whose name holds TEXT (both included)")
    a = ap.parse_args()
    launches = []
    for r in launch_rows(a.csv):
        # --page raw: a column per metric; the default details page: a row per metric
        if "gpu__time_duration.sum" in r:
            value = r["gpu__time_duration.sum"]
        elif r.get("Metric Name") == "gpu__time_duration.sum":
            value = r.get("Metric Value", "")
        else:
            continue
        try:
            launches.append((r["Kernel Name"], float(value.replace(",", ""))))
        except (KeyError, ValueError):
            continue
    if a.span_from or a.span_to:
        i0 = next((i for i, (n, _) in enumerate(launches) if (a.span_from or "") in n), None)
        i1 = next((i for i, (n, _) in enumerate(launches) if i0 is not None and i > i0 and (a.span_to or "") in n),
                  None)
        if i0 is None or (a.span_to and i1 is None):
            sys.exit(f"{a.csv}: no launch span from {a.span_from!r} to {a.span_to!r}")
        launches = launches[i0:(i1 + 1 if a.span_to else None)]
    agg = collections.defaultdict(lambda: [0, 0.0])
    for name, ns in launches:
        k = kernel_key(name)
        agg[k][0] += 1
        agg[k][1] += ns
    total = sum(v[1] for v in agg.values())
    table = sorted(((k, c, ns) for k, (c, ns) in agg.items()), key=lambda t: -t[2])
    print(f"{sum(c for _, c, _ in table)} launches, {total / 1e6:.2f} ms of kernel time")
    print(f"{'ms':>9} {'share':>6} {'calls':>6} {'us/call':>9}  kernel")
    for k, c, ns in table[: a.top]:
        print(f"{ns / 1e6:9.2f} {100 * ns / total:5.1f}% {c:6d} {ns / c / 1e3:9.1f}  {k[:100]}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"total_ms": total / 1e6,
                       "kernels": [{"name": k, "calls": c, "ms": ns / 1e6} for k, c, ns in table]}, f, indent=1)


if __name__ == "__main__":
    main()
