#!/usr/bin/env python3
"""Sliding-window attention: this project's forward and backward next to its own full causal
attention and PyTorch FlexAttention, one run, the same shapes.

Usage (GPU machine, PyTorch with CUDA):

    python3 benches/window_bench.py --ours PATH/flashattn --commit SHA --date YYYY-MM-DD \
        [--dtypes f16,bf16] [--head-dims 64,128] [--seqlen 16384] [--windows 512,2048,4096] \
        [--hidden 2048] [--tokens 16384] [--iters 10] [--no-flex] [--out FILE.json]

Shapes: the FA paper's (heads = hidden / head_dim, batch = tokens / seqlen), causal, with a
window of w keys before each row's own (`--window w`: key j visible to row i iff
i - w <= j <= i). FLOPs count the visible (query, key) pairs exactly, 4 d per pair (x2.5 for
the backward); the full causal rows use the paper's count (s^2 / 2 pairs). The table gives each
window's TFLOP/s over the full causal figure of the same dtype, head_dim and pass (the issue's
bar: >= 0.9).

FlexAttention (torch.compile'd `flex_attention` with a block mask of the same window) is
timed the same way, 3 warm-up calls then CUDA events around `iters` calls; anything it cannot
run is reported "n/a" with the reason.
"""

import argparse
import json
import subprocess
import sys

from flex_time import flex_ms


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def pairs(s, w):
    """Visible (query, key) pairs of a causal window of w keys before the row's own; the paper's
    s^2 / 2 without a window."""
    if w is None:
        return s * s / 2
    return sum(min(i, w) + 1 for i in range(s))


def ours(args, dtype, window, backward):
    cmd = [args.ours, "bench", "--dtype", dtype, "--head-dims", ",".join(map(str, args.head_dims)),
           "--seqlens", str(args.seqlen), "--hidden", str(args.hidden), "--tokens", str(args.tokens),
           "--causal", "on", "--iters", str(args.iters), "--json"]
    cmd += ["--window", str(window)] if window is not None else []
    cmd += ["--backward"] if backward else []
    log("  $ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0:
        log(f"  ours failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    for r in rows:
        r.update(side="ours", window=window, pass_="bwd" if backward else "fwd")
    return rows


def flex(args, dtype, d, window, backward):
    import torch
    s, heads, batch = args.seqlen, args.hidden // d, max(1, args.tokens // args.seqlen)
    w = torch.tensor(window if window is not None else s, device="cuda")

    def mask_mod(b, h, q, kv):
        return (q >= kv) & (q - kv <= w)

    ms = flex_ms(dtype, batch, heads, s, d, backward, args.iters, mask_mod=mask_mod)
    flops = 4 * batch * heads * pairs(s, window) * d * (2.5 if backward else 1)
    return {"side": "flex", "dtype": dtype, "head_dim": d, "seqlen": s, "window": window,
            "pass_": "bwd" if backward else "fwd", "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ours", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--date", required=True)
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--head-dims", default="64,128", type=lambda x: [int(v) for v in x.split(",")])
    p.add_argument("--seqlen", default=16384, type=int)
    p.add_argument("--windows", default="512,2048,4096", type=lambda x: [int(v) for v in x.split(",")])
    p.add_argument("--hidden", default=2048, type=int)
    p.add_argument("--tokens", default=16384, type=int)
    p.add_argument("--iters", default=10, type=int)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        for backward in (False, True):
            for window in [None] + args.windows:
                rows += ours(args, dtype, window, backward)
    if not args.no_flex:
        for dtype in args.dtypes.split(","):
            for d in args.head_dims:
                for backward in (False, True):
                    for window in [None] + args.windows:
                        try:
                            rows.append(flex(args, dtype, d, window, backward))
                        except Exception as e:  # noqa: BLE001 -- reported, the rest still runs
                            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                            rows.append({"side": "flex", "dtype": dtype, "head_dim": d, "seqlen": args.seqlen,
                                         "window": window, "pass_": "bwd" if backward else "fwd", "error": why})
                        r = rows[-1]
                        log(f"  flex {dtype} d{d} w{window} {r['pass_']}: " + (f"{r['tflops']:.1f}" if "tflops" in r else r["error"]))
    full = {(r["side"], r["dtype"], r["head_dim"], r["pass_"]): r.get("tflops") for r in rows if r["window"] is None}
    print(f"# sliding window, causal, seqlen {args.seqlen}, commit {args.commit}, {args.date}")
    print("| pass | dtype | d | window | ours ms | ours TFLOP/s | / ours causal | flex TFLOP/s | ours / flex |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["side"] != "ours":
            continue
        key = (r["dtype"], r["head_dim"], r["pass_"])
        f = next((x for x in rows if x["side"] == "flex" and (x["dtype"], x["head_dim"], x["pass_"]) == key and x["window"] == r["window"]), {})
        base = full.get(("ours",) + key)
        ratio = f"{r['tflops'] / base:.2f}" if base else "-"
        ft = f"{f['tflops']:.1f}" if "tflops" in f else ("n/a" if f else "-")
        vs = f"{r['tflops'] / f['tflops']:.2f}x" if "tflops" in f else "-"
        w = "full" if r["window"] is None else r["window"]
        print(f"| {r['pass_']} | {r['dtype']} | {r['head_dim']} | {w} | {r['ms']:.3f} | {r['tflops']:.1f} | {ratio} | {ft} | {vs} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"commit": args.commit, "date": args.date, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
