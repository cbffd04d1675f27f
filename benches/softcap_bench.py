#!/usr/bin/env python3
"""Softcap's cost: this project's forward and backward with a softcap next to the same shapes
without one, one run.

Usage (GPU machine):

    python3 benches/softcap_bench.py --ours PATH/flashattn --commit SHA --date YYYY-MM-DD \
        [--dtypes f16,bf16] [--head-dims 64,128] [--seqlens 1024,4096,16384] [--softcap 30] \
        [--hidden 2048] [--tokens 16384] [--iters 10] [--no-flex] [--out FILE.json]

Shapes: the FA paper's (heads = hidden / head_dim, batch = tokens / seqlen), causal and not.
Without a softcap a launch runs the kernels' plain entries; with one, their general entries
(the window and variable-length ones, `softcap` in the kernel crate), so the ratio counts both
the capping and the general entry. The issue's bar: with / without >= 0.9 (a cost <= 10%).
Beside them, PyTorch's FlexAttention on the same shapes (torch.compile'd `flex_attention`, the
softcap as a score_mod, the causal mask as a block mask), timed in the same run.
"""

import argparse
import json
import subprocess
import sys

from flex_time import flex_ms


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ours(args, dtype, causal, backward, softcap):
    cmd = [args.ours, "bench", "--dtype", dtype, "--head-dims", ",".join(map(str, args.head_dims)),
           "--seqlens", ",".join(map(str, args.seqlens)), "--hidden", str(args.hidden), "--tokens",
           str(args.tokens), "--causal", "on" if causal else "off", "--iters", str(args.iters), "--json"]
    cmd += ["--softcap", str(softcap)] if softcap is not None else []
    cmd += ["--backward"] if backward else []
    log("  $ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0:
        log(f"  ours failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    for r in rows:
        r.update(softcap=softcap, causal_=causal, pass_="bwd" if backward else "fwd")
    return rows


def flex(args, dtype, d, s, causal, backward):
    heads, batch = args.hidden // d, max(1, args.tokens // s)
    cap = args.softcap
    import torch

    def score_mod(score, b, h, q, kv):
        return cap * torch.tanh(score / cap)

    def mask_mod(b, h, q, kv):
        return q >= kv

    ms = flex_ms(dtype, batch, heads, s, d, backward, args.iters, score_mod=score_mod,
                 mask_mod=mask_mod if causal else None)
    flops = 4 * batch * heads * s * s * d * (0.5 if causal else 1) * (2.5 if backward else 1)
    return {"side": "flex", "dtype": dtype, "head_dim": d, "seqlen": s, "causal_": causal,
            "pass_": "bwd" if backward else "fwd", "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ours", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--date", required=True)
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--head-dims", default="64,128", type=lambda x: [int(v) for v in x.split(",")])
    p.add_argument("--seqlens", default="1024,4096,16384", type=lambda x: [int(v) for v in x.split(",")])
    p.add_argument("--softcap", default=30.0, type=float)
    p.add_argument("--hidden", default=2048, type=int)
    p.add_argument("--tokens", default=16384, type=int)
    p.add_argument("--iters", default=10, type=int)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        for backward in (False, True):
            for causal in (False, True):
                for softcap in (None, args.softcap):
                    rows += ours(args, dtype, causal, backward, softcap)
    flex_rows = {}
    if not args.no_flex:
        for dtype in args.dtypes.split(","):
            for d in args.head_dims:
                for s in args.seqlens:
                    for causal in (False, True):
                        for backward in (False, True):
                            try:
                                r = flex(args, dtype, d, s, causal, backward)
                            except Exception as e:  # noqa: BLE001 -- reported, the rest still runs
                                why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                                r = {"side": "flex", "dtype": dtype, "head_dim": d, "seqlen": s, "causal_": causal,
                                     "pass_": "bwd" if backward else "fwd", "error": why}
                            flex_rows[(r["pass_"], dtype, causal, d, s)] = r
                            log(f"  flex {dtype} d{d} s{s} causal={causal} {r['pass_']}: "
                                + (f"{r['tflops']:.1f}" if "tflops" in r else r["error"]))
    print(f"# softcap {args.softcap}, commit {args.commit}, {args.date}")
    print("| pass | dtype | causal | d | seqlen | TFLOP/s without | with softcap | with / without | kernels (without / with) "
          "| flex TFLOP/s | ours with / flex |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    key = lambda r: (r["pass_"], r["dtype"], r["causal_"], r["head_dim"], r["seqlen"])
    base = {key(r): r for r in rows if r["softcap"] is None}
    for r in rows:
        b = base.get(key(r))
        if r["softcap"] is None or b is None:
            continue
        f = flex_rows.get(key(r), {})
        ft = f"{f['tflops']:.1f}" if "tflops" in f else ("n/a" if f else "-")
        vs = f"{r['tflops'] / f['tflops']:.2f}x" if "tflops" in f else "-"
        print(f"| {r['pass_']} | {r['dtype']} | {'yes' if r['causal_'] else 'no'} | {r['head_dim']} | {r['seqlen']} "
              f"| {b['tflops']:.1f} | {r['tflops']:.1f} | {r['tflops'] / b['tflops']:.2f} | {b.get('impl', '-')} / {r.get('impl', '-')} "
              f"| {ft} | {vs} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"commit": args.commit, "date": args.date, "softcap": args.softcap, "rows": rows,
                       "flex": list(flex_rows.values())}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
