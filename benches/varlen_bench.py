#!/usr/bin/env python3
"""Variable-length batches: this project's forward and backward over packed sequences of random
lengths, next to its own fixed-length batch at the mean length and PyTorch SDPA on nested
jagged tensors (its flash backend), one run, the same lengths.

Usage (GPU machine, PyTorch with CUDA):

    python3 benches/varlen_bench.py --ours PATH/flashattn --commit SHA --date YYYY-MM-DD \
        [--dtypes bf16,f16] [--head-dims 64,128] [--means 1024,4096] [--hidden 2048] \
        [--tokens 16384] [--iters 10] [--no-torch] [--out FILE.json]

Our binary draws the lengths (uniform 1..2 mean - 1, a fixed seed, `bench --varlen MEAN`) and
prints them; PyTorch gets the same. FLOPs count the (query, key) pairs each sequence computes
(causal: s (s + 1) / 2), 4 d per pair and head, x2.5 for the backward. The issue's bar: varlen
TFLOP/s >= 0.95x the fixed-length batch at the mean length.
"""

import argparse
import json
import subprocess
import sys

from cuda_time import cuda_ms


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def ours(args, dtype, mean, backward):
    cmd = [args.ours, "bench", "--varlen", str(mean), "--dtype", dtype, "--head-dims", ",".join(map(str, args.head_dims)),
           "--hidden", str(args.hidden), "--tokens", str(args.tokens), "--causal", "both", "--iters", str(args.iters), "--json"]
    cmd += ["--backward"] if backward else []
    log("  $ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0:
        log(f"  ours failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    return rows


def pairs(lengths, causal):
    return sum(l * (l + 1) / 2 if causal else l * l for l in lengths)


def torch_njt(args, dtype, d, lengths, causal, backward):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    heads = args.hidden // d
    def njt():
        parts = [torch.randn(l, heads, d, device="cuda", dtype=dt) for l in lengths]
        t = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=backward)
        return t
    q, k, v = njt(), njt(), njt()
    def fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    if backward:
        out = fwd()
        grad = torch.ones_like(out)
        def call():
            q.grad = k.grad = v.grad = None
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    else:
        call = fwd
    ms = cuda_ms(call, args.iters)
    flops = pairs(lengths, causal) * 4 * heads * d * (2.5 if backward else 1.0)
    return ms, flops / (ms * 1e-3) / 1e12


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ours", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--date", required=True)
    p.add_argument("--dtypes", default="bf16,f16")
    p.add_argument("--head-dims", default="64,128", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--means", default="1024,4096", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    rows = []
    for dtype in args.dtypes.split(","):
        for mean in args.means:
            for backward in (False, True):
                for r in ours(args, dtype, mean, backward):
                    r.update(side="ours")
                    if not args.no_torch:
                        try:
                            ms, tf = torch_njt(args, dtype, r["head_dim"], r["lengths"], r["causal"], backward)
                            r.update(torch_ms=round(ms, 5), torch_tflops=round(tf, 3), vs_torch=round(r["varlen_tflops"] / tf, 3))
                        except Exception as e:  # noqa: BLE001 -- reported, not fatal
                            r.update(torch_ms=None, torch_error=str(e)[:200])
                    rows.append(r)
                    log(f"{dtype} mean {mean} d {r['head_dim']} causal {r['causal']} {r['pass']}: varlen {r['varlen_tflops']:.1f} "
                        f"fixed {r['fixed_tflops']:.1f} ratio {r['ratio']:.3f} torch {r.get('torch_tflops')}")
    out = {"commit": args.commit, "date": args.date, "rows": rows}
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
