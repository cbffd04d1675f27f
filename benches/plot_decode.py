#!/usr/bin/env python3
"""Decode bandwidth against cache length, as an SVG line chart (no plotting library needed).

Usage: python3 benches/plot_decode.py RESULTS.json [--title TEXT] [--peak TBS] > plot.svg

RESULTS.json is what `decode_bench.py --out` wrote for one batch, head and dtype setting over
several cache lengths (`--shapes 8x32x8x1024,8x32x8x4096,...`): x is the keys per sequence
(log scale), y the effective bandwidth (K and V bytes / time, TB/s), one line per column
(ours at each split setting, SDPA flash, SDPA cuDNN); a column's failed shapes are left out.
--peak draws the GPU's memory bandwidth as a dashed line.
"""

import argparse
import json
import math

W, H, LEFT, RIGHT, TOP, BOTTOM = 720, 420, 70, 170, 40, 60
COLORS = ["#d62728", "#ff7f0e", "#9467bd", "#1f77b4", "#2ca02c", "#8c564b"]


def series(rows):
    """{column: [(keys, tbs)]} over the rows, columns in first-seen order."""
    out = {}
    for r in rows:
        for col, cell in r.items():
            if isinstance(cell, dict) and "tbs" in cell:
                out.setdefault(col, []).append((r["keys"], cell["tbs"]))
    return {c: sorted(pts) for c, pts in out.items()}


def svg(data, title, peak):
    keys = [k for pts in data.values() for k, _ in pts]
    x0, x1 = math.log2(min(keys)), math.log2(max(keys))
    y1 = max([t for pts in data.values() for _, t in pts] + [peak or 0]) * 1.1
    x = lambda k: LEFT + (math.log2(k) - x0) / max(x1 - x0, 1e-9) * (W - LEFT - RIGHT)
    y = lambda t: H - BOTTOM - t / y1 * (H - TOP - BOTTOM)
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
          f'<rect width="{W}" height="{H}" fill="white"/>',
          f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
          f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="black"/>',
          f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" stroke="black"/>',
          f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 15}" text-anchor="middle">keys per sequence</text>',
          f'<text x="18" y="{H / 2}" text-anchor="middle" transform="rotate(-90 18 {H / 2})">TB/s (K + V bytes / time)</text>']
    for k in sorted(set(keys)):
        el.append(f'<text x="{x(k):.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{k}</text>')
    step = 0.5 if y1 <= 5 else 1.0
    for i in range(int(y1 / step) + 1):
        t = i * step
        el.append(f'<line x1="{LEFT}" y1="{y(t):.1f}" x2="{W - RIGHT}" y2="{y(t):.1f}" stroke="#ddd"/>')
        el.append(f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    if peak:
        el.append(f'<line x1="{LEFT}" y1="{y(peak):.1f}" x2="{W - RIGHT}" y2="{y(peak):.1f}" stroke="gray" stroke-dasharray="6 4"/>')
        el.append(f'<text x="{W - RIGHT + 6}" y="{y(peak) + 4:.1f}" fill="gray">peak {peak:g}</text>')
    for i, (col, pts) in enumerate(data.items()):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{x(k):.1f},{y(t):.1f}" for k, t in pts)
        el.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        el += [f'<circle cx="{x(k):.1f}" cy="{y(t):.1f}" r="3" fill="{color}"/>' for k, t in pts]
        ly = TOP + 20 * i + 10
        el.append(f'<line x1="{W - RIGHT + 10}" y1="{ly}" x2="{W - RIGHT + 30}" y2="{ly}" stroke="{color}" stroke-width="2"/>')
        el.append(f'<text x="{W - RIGHT + 36}" y="{ly + 4}">{col}</text>')
    el.append("</svg>")
    return "\n".join(el)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results")
    p.add_argument("--title", default=None)
    p.add_argument("--peak", type=float, default=None)
    args = p.parse_args()
    with open(args.results) as fh:
        doc = json.load(fh)
    rows = doc["rows"]
    r0 = rows[0]
    title = args.title or (f"decode, {r0['dtype']} d={r0['head_dim']}, batch {r0['batch']}, {r0['heads']} query heads "
                           f"on {r0['heads_kv']} KV heads ({doc['commit']}, {doc['date']})")
    print(svg(series(rows), title, args.peak))


if __name__ == "__main__":
    main()
