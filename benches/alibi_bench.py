#!/usr/bin/env python3
"""ALiBi's cost: this project's forward and backward with ALiBi next to the same shapes
without it, and PyTorch FlexAttention with the same bias, one run.

Usage (GPU machine, PyTorch with CUDA):

    python3 benches/alibi_bench.py --ours PATH/flashattn --commit SHA --date YYYY-MM-DD \
        [--dtypes f16,bf16] [--head-dims 64,128] [--seqlens 4096,16384] [--hidden 2048] \
        [--tokens 16384] [--iters 10] [--bwd-kernels auto,mma] [--no-flex] [--out FILE.json]

Shapes: the FA paper's (heads = hidden / head_dim, batch = tokens / seqlen), causal and not;
ALiBi with the paper's slopes (`bench --alibi`). Without ALiBi a launch runs the kernels'
plain entries; with it, their general entries, so the ratio counts both the bias and the
general entry. The backward runs once with automatic selection (on Hopper: `wgmma` without
ALiBi, `mma` with it, the families that take it) and once per named family in
`--bwd-kernels`, so that a family's own cost is apart from the change of family. The issue's
bar: with / without >= 0.9 (a cost <= 10%).

FlexAttention (torch.compile'd `flex_attention`, ALiBi as a score_mod, the causal mask as a
block mask) is timed as in window_bench.py: 3 warm-up calls, then CUDA events around `iters`
calls; anything it cannot run is reported "n/a" with the reason. FLOPs: 4 b h s^2 d, halved
when causal, x2.5 for the backward.
"""

import argparse
import json
import subprocess
import sys

from flex_time import flex_ms


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ours(args, dtype, causal, backward, alibi, kernel):
    cmd = [args.ours, "bench", "--dtype", dtype, "--head-dims", ",".join(map(str, args.head_dims)),
           "--seqlens", ",".join(map(str, args.seqlens)), "--hidden", str(args.hidden), "--tokens",
           str(args.tokens), "--causal", "on" if causal else "off", "--iters", str(args.iters), "--json"]
    cmd += ["--alibi"] if alibi else []
    cmd += ["--backward"] if backward else []
    cmd += ["--kernel", kernel] if kernel != "auto" else []
    log("  $ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0:
        log(f"  ours failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    for r in rows:
        r.update(side="ours", alibi=alibi, causal_=causal, pass_="bwd" if backward else "fwd", family=kernel)
    return rows


def paper_slopes(n):
    """The ALiBi paper's slopes (as `flashattn::alibi_paper_slopes`)."""
    m = 1 << (n.bit_length() - 1)
    pow2 = lambda k: [2.0 ** (-8.0 * i / k) for i in range(1, k + 1)]
    return pow2(m) + pow2(2 * m)[::2][: n - m]


def flex(args, dtype, d, s, causal, backward):
    import torch
    heads, batch = args.hidden // d, max(1, args.tokens // s)
    slopes = torch.tensor(paper_slopes(heads), device="cuda", dtype=torch.float32)

    def score_mod(score, b, h, q, kv):
        return score - slopes[h] * (q - kv).abs()

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
    p.add_argument("--seqlens", default="4096,16384", type=lambda x: [int(v) for v in x.split(",")])
    p.add_argument("--hidden", default=2048, type=int)
    p.add_argument("--tokens", default=16384, type=int)
    p.add_argument("--iters", default=10, type=int)
    p.add_argument("--bwd-kernels", default="auto,mma", type=lambda x: x.split(","))
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        for causal in (False, True):
            for backward, kernels in ((False, ["auto"]), (True, args.bwd_kernels)):
                for kernel in kernels:
                    for alibi in (False, True):
                        rows += ours(args, dtype, causal, backward, alibi, kernel)
    if not args.no_flex:
        for dtype in args.dtypes.split(","):
            for d in args.head_dims:
                for s in args.seqlens:
                    for causal in (False, True):
                        for backward in (False, True):
                            try:
                                rows.append(flex(args, dtype, d, s, causal, backward))
                            except Exception as e:  # noqa: BLE001 -- reported, the rest still runs
                                why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                                rows.append({"side": "flex", "dtype": dtype, "head_dim": d, "seqlen": s, "causal_": causal,
                                             "pass_": "bwd" if backward else "fwd", "error": why})
                            r = rows[-1]
                            log(f"  flex {dtype} d{d} s{s} causal={causal} {r['pass_']}: "
                                + (f"{r['tflops']:.1f}" if "tflops" in r else r["error"]))
    print(f"# ALiBi (paper slopes), commit {args.commit}, {args.date}")
    print("| pass | family | dtype | d | seqlen | causal | ms without | ms with | with / without | flex TFLOP/s | ours with / flex |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    key = lambda r: (r["pass_"], r["family"], r["dtype"], r["head_dim"], r["seqlen"], r["causal_"])
    plain = {key(r): r for r in rows if r["side"] == "ours" and not r["alibi"]}
    for r in rows:
        if r["side"] != "ours" or not r["alibi"]:
            continue
        b = plain.get(key(r))
        f = next((x for x in rows if x["side"] == "flex" and (x["pass_"], x["dtype"], x["head_dim"], x["seqlen"], x["causal_"])
                  == (r["pass_"], r["dtype"], r["head_dim"], r["seqlen"], r["causal_"])), {})
        ratio = f"{b['ms'] / r['ms']:.3f}" if b else "-"
        ft = f"{f['tflops']:.1f}" if "tflops" in f else ("n/a" if f else "-")
        vs = f"{r['tflops'] / f['tflops']:.2f}x" if "tflops" in f else "-"
        bm = f"{b['ms']:.3f}" if b else "-"
        fam = lambda x: x.get("impl", "").split("/")[-1]
        family = r["family"] if r["family"] != "auto" else f"auto: {fam(b) if b else '?'} / {fam(r)}"
        print(f"| {r['pass_']} | {family} | {r['dtype']} | {r['head_dim']} | {r['seqlen']} | {'yes' if r['causal_'] else 'no'} | "
              f"{bm} | {r['ms']:.3f} | {ratio} | {ft} | {vs} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"commit": args.commit, "date": args.date, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
