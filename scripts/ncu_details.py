#!/usr/bin/env python3
"""Why each kernel launch takes its time, from an Nsight Compute details CSV.

Reads what `ncu --section SpeedOfLight --section Occupancy --section LaunchStats --section
WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --metrics
smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio,... --csv --page details
--print-units base` writes, and prints a row per launch: the kernel, its grid and block, its
duration, achieved against theoretical occupancy, the warps a scheduler issues from per cycle and
how many it had eligible, DRAM and SM throughput, registers and shared memory per CTA, and the stall
reasons with the most cycles per issued instruction. Lines before the CSV header (the profiled
program's own output) are skipped. With --match TEXT only kernels whose name holds TEXT.

usage: scripts/ncu_details.py DETAILS.csv [--match TEXT] [--stalls N]
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_kernels import launch_rows  # noqa: E402

FIELDS = [
    ("us", "Duration", 1e-3),
    ("occ%", "Achieved Occupancy", 1),
    ("occ_max%", "Theoretical Occupancy", 1),
    ("issued/sched", "Issued Warp Per Scheduler", 1),
    ("eligible/sched", "Eligible Warps Per Scheduler", 1),
    ("active/sched", "Active Warps Per Scheduler", 1),
    ("dram%", "DRAM Throughput", 1),
    ("sm%", "Compute (SM) Throughput", 1),
    ("regs", "Registers Per Thread", 1),
    ("smem_B", "Dynamic Shared Memory Per Block", 1),
]


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--match", default="")
    ap.add_argument("--stalls", type=int, default=4)
    args = ap.parse_args()
    launches = collections.OrderedDict()
    for row in launch_rows(args.csv):
        d = launches.setdefault(int(row["ID"]), {"name": row["Kernel Name"], "grid": row.get("Grid Size", ""),
                                                  "block": row.get("Block Size", ""), "m": {}})
        d["m"][row["Metric Name"]] = row["Metric Value"]
    for lid, d in launches.items():
        if args.match not in d["name"]:
            continue
        name = d["name"].split("(")[0] if not d["name"].startswith("void") else d["name"][:60]
        parts = [f"{lid:4d} {name[:56]:56s} grid {d['grid']} block {d['block']}"]
        for label, key, scale in FIELDS:
            v = number(d["m"].get(key))
            if v is not None:
                parts.append(f"{label} {v * scale:.6g}")
        stalls = []
        for key, val in d["m"].items():
            if "issue_stalled_" in key:
                v = number(val)
                if v is not None:
                    stalls.append((v, key.split("issue_stalled_")[1].split("_per_issue")[0]))
        stalls.sort(reverse=True)
        if stalls:
            parts.append("stalls " + ", ".join(f"{r} {v:.2f}" for v, r in stalls[: args.stalls]))
        print("; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
