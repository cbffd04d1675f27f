#!/usr/bin/env python3
"""Softcap's cost: this project's forward and backward with a softcap next to the same shapes
without one, one run.

Usage (GPU machine):

    python3 benches/softcap_bench.py --ours PATH/flashattn --commit SHA --date YYYY-MM-DD \
        [--dtypes f16,bf16] [--head-dims 64,128] [--seqlens 1024,4096,16384] [--softcap 30] \
        [--hidden 2048] [--tokens 16384] [--iters 10] [--out FILE.json]

Shapes: the FA paper's (heads = hidden / head_dim, batch = tokens / seqlen), causal and not.
Without a softcap a launch runs the kernels' plain entries; with one, their general entries
(the window and variable-length ones, `softcap` in the kernel crate), so the ratio counts both
the capping and the general entry. The issue's bar: with / without >= 0.9 (a cost <= 10%).
"""

import argparse
import json
import subprocess
import sys


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
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        for backward in (False, True):
            for causal in (False, True):
                for softcap in (None, args.softcap):
                    rows += ours(args, dtype, causal, backward, softcap)
    print(f"# softcap {args.softcap}, commit {args.commit}, {args.date}")
    print("| pass | dtype | causal | d | seqlen | TFLOP/s without | with softcap | with / without | kernels (without / with) |")
    print("|---|---|---|---|---|---|---|---|---|")
    key = lambda r: (r["pass_"], r["dtype"], r["causal_"], r["head_dim"], r["seqlen"])
    base = {key(r): r for r in rows if r["softcap"] is None}
    for r in rows:
        b = base.get(key(r))
        if r["softcap"] is None or b is None:
            continue
        print(f"| {r['pass_']} | {r['dtype']} | {'yes' if r['causal_'] else 'no'} | {r['head_dim']} | {r['seqlen']} "
              f"| {b['tflops']:.1f} | {r['tflops']:.1f} | {r['tflops'] / b['tflops']:.2f} | {b.get('impl', '-')} / {r.get('impl', '-')} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"commit": args.commit, "date": args.date, "softcap": args.softcap, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
