#!/usr/bin/env python3
"""Draws peak memory against context length for both arms of a `longtune bench context` result
(bench/results/context-<backend>-<shape>.json) as a standalone SVG: longtune's planner curve and
its measured points (allocation and real steps), the transformers + PEFT peer's real steps (and
the length where it ran out of memory), and the device's memory and ceiling as horizontal lines.
Plain Python (no matplotlib), so CI and a fresh machine can redraw it; it draws, it measures nothing.

usage: python3 scripts/context_chart.py RESULT.json [-o OUT.svg]   (default: RESULT.svg)"""
import argparse
import json
import math
import sys

W, H = 760, 440
ML, MR, MT, MB = 72, 24, 48, 58  # margins
GIB = 1024.0 ** 3


def nice_ticks(hi, n=6):
    """Round tick values from 0 to about hi."""
    if hi <= 0:
        return [0, 1]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(hi / step)) + 1)]


def fmt_tokens(t):
    return f"{t / 1024:.0f}k" if t >= 1024 else f"{t:.0f}"


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    with open(a.result) as f:
        r = json.load(f)
    if r.get("bench") != "context":
        sys.exit(f"{a.result}: not a `bench context` result (bench = {r.get('bench')!r})")
    cfg = r.get("config", {})
    arms = {arm.get("name"): arm for arm in r.get("arms", [])}
    ours, peer = arms.get("longtune", {}), arms.get("torch-peft", {})

    series = []  # (label, colour, points [(T, bytes)], style)
    curve = [(p["T"], p["plan_bytes"]) for p in ours.get("plan_curve", []) if "plan_bytes" in p]
    if curve:
        series.append(("longtune plan", "#1f6feb", curve, "line"))
    meas = [(p["T"], p["peak_bytes"]) for p in ours.get("points", []) if p.get("ok") and "peak_bytes" in p]
    if meas:
        series.append(("longtune measured (allocator high-water)", "#1f6feb", sorted(meas), "dots"))
    pts = [(p["T"], p["max_allocated_bytes"]) for p in peer.get("points", []) if p.get("ok") and "max_allocated_bytes" in p]
    if pts:
        series.append(("transformers + PEFT (max_memory_allocated)", "#d1242f", sorted(pts), "linedots"))
    peer_fail = [p["T"] for p in peer.get("points", []) if not p.get("ok")]

    total = cfg.get("memory_total_bytes", 0)
    ceiling = cfg.get("ceiling_bytes", 0)
    xs = [t for _, _, p, _ in series for t, _ in p] + peer_fail + [ours.get("ceiling_T", 0) or 0]
    ys = [b for _, _, p, _ in series for _, b in p]
    # the memory lines only when they are on the data's scale (a host's RAM is not, for a tiny run)
    ys += [v for v in (total, ceiling) if v and v < 3 * max(ys + [1])]
    xmax = max(xs + [1]) * 1.05
    ymax = max(ys + [1]) / GIB * 1.08
    # x ticks at round numbers of k = 1024 tokens, so they read 32k, 64k, ...
    xt, yt = [t * 1024 for t in nice_ticks(xmax / 1024)], nice_ticks(ymax)
    xmax, ymax = xt[-1], yt[-1]
    pw, ph = W - ML - MR, H - MT - MB

    def X(t):
        return ML + pw * t / xmax

    def Y(b):
        return MT + ph * (1 - (b / GIB) / ymax)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         f'font-family="Helvetica, Arial, sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>']
    title = f"Peak training memory vs context: {cfg.get('model', cfg.get('shape', '?')).split(' (')[0]}"
    o.append(f'<text x="{ML}" y="22" font-size="14" font-weight="bold">{esc(title)}</text>')
    machine = r.get("machine", {})
    sub = f"{machine.get('gpu') or machine.get('cpu', '')} · {cfg.get('backend', '')} · commit {r.get('commit', '?')} · {r.get('date', '')}"
    o.append(f'<text x="{ML}" y="38" fill="#555">{esc(sub)}</text>')
    for t in xt:
        o.append(f'<line x1="{X(t):.1f}" y1="{MT}" x2="{X(t):.1f}" y2="{MT + ph}" stroke="#eee"/>')
        o.append(f'<text x="{X(t):.1f}" y="{MT + ph + 16}" text-anchor="middle">{fmt_tokens(t)}</text>')
    for g in yt:
        y = Y(g * GIB)
        o.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" stroke="#eee"/>')
        o.append(f'<text x="{ML - 6}" y="{y + 4:.1f}" text-anchor="end">{g:g}</text>')
    o.append(f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    o.append(f'<text x="{ML + pw / 2}" y="{H - 14}" text-anchor="middle">context length T (tokens, batch 1)</text>')
    o.append(f'<text x="16" y="{MT + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {MT + ph / 2})">'
             f'peak memory (GiB)</text>')
    for val, label, dash in ((total, "device memory", "6,4"), (ceiling, "guard ceiling", "2,3")):
        if val and val / GIB <= ymax:
            o.append(f'<line x1="{ML}" y1="{Y(val):.1f}" x2="{ML + pw}" y2="{Y(val):.1f}" stroke="#444" '
                     f'stroke-dasharray="{dash}"/>')
            o.append(f'<text x="{ML + pw - 4}" y="{Y(val) - 4:.1f}" text-anchor="end" fill="#444">'
                     f'{label} {val / GIB:.1f} GiB</text>')
    for label, col, p, style in series:
        if style in ("line", "linedots") and len(p) > 1:
            path = " ".join(f"{'M' if i == 0 else 'L'}{X(t):.1f},{Y(b):.1f}" for i, (t, b) in enumerate(p))
            o.append(f'<path d="{path}" fill="none" stroke="{col}" stroke-width="2"/>')
        if style in ("dots", "linedots"):
            for t, b in p:
                o.append(f'<circle cx="{X(t):.1f}" cy="{Y(b):.1f}" r="4" fill="{col}" stroke="white"/>')
    for t in peer_fail:
        x, y = X(t), MT + 10
        o.append(f'<path d="M{x - 5:.1f},{y - 5:.1f} L{x + 5:.1f},{y + 5:.1f} M{x - 5:.1f},{y + 5:.1f} '
                 f'L{x + 5:.1f},{y - 5:.1f}" stroke="#d1242f" stroke-width="2"/>')
    ly = MT + 14
    legend = [(label, col) for label, col, _, _ in series]
    if peer_fail:
        legend.append(("transformers + PEFT out of memory (x)", "#d1242f"))
    for ct, who, capped in ((ours.get("ceiling_T"), "longtune", False),
                            (peer.get("ceiling_T"), "peer", peer.get("search_capped", False))):
        if ct:
            legend.append((f"{who} longest T: {ct:,.0f}" + (" (search stopped there)" if capped else ""), "#444"))
    for label, col in legend:
        o.append(f'<rect x="{ML + 12}" y="{ly - 9}" width="10" height="10" fill="{col}"/>')
        o.append(f'<text x="{ML + 28}" y="{ly}">{esc(label)}</text>')
        ly += 16
    o.append("</svg>")
    out = a.out or (a.result[:-5] if a.result.endswith(".json") else a.result) + ".svg"
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
