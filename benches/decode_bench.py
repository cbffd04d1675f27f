#!/usr/bin/env python3
"""Decode: this project's attention against a KV cache (`flashattn bench --decode`) next to
PyTorch SDPA's flash and cuDNN backends on the same shapes, one run.

Usage (GPU machine, PyTorch with CUDA):

    python3 benches/decode_bench.py --ours PATH/flashattn --commit SHA --date YYYY-MM-DD \
        [--dtypes bf16,f16] [--head-dims 128,64] [--rows 1] [--iters 20] [--out FILE.json] \
        [--shapes 8x32x8x131072,64x32x8x8192,8x32x32x32768] [--splits auto,1,4]

A shape is BATCH x QUERY_HEADS x KV_HEADS x KEYS (the issue's three by default); each
sequence holds KEYS keys after appending ROWS new ones, and ROWS query rows attend to them
(causal, bottom-right: one row sees every key). Effective bandwidth = the K and V bytes held
(batch * keys * kv_heads * head_dim * 2 * element size) / time, on both sides.

Ours times `forward_kvcache` (the append of ROWS keys and values, then the attention). SDPA
times `scaled_dot_product_attention` alone (no append) on Q [b, hq, rows, d] and K, V [b, hkv,
keys, d] with `enable_gqa=True`, 3 warm-up calls then CUDA events around `iters` calls; a
backend that cannot run a shape is reported "n/a" with the reason.

--splits: ours once per split-KV count (`--splits N`; `auto`: the automatic choice, the
default), each a column of its own.
"""

import argparse
import json
import subprocess
import sys

from cuda_time import cuda_ms


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_shape(text):
    b, hq, hkv, keys = (int(x) for x in text.split("x"))
    return {"batch": b, "heads": hq, "heads_kv": hkv, "keys": keys}


def ours(args, dtype, d, s, splits):
    cmd = [args.ours, "bench", "--decode", "--dtype", dtype, "--head-dims", str(d), "--batch", str(s["batch"]),
           "--heads", str(s["heads"]), "--heads-kv", str(s["heads_kv"]), "--seqlens", str(s["keys"]),
           "--seqlen", str(args.rows), "--iters", str(args.iters), "--json"]
    if splits != "auto":
        cmd += ["--splits", splits]
    log("  $ " + " ".join(cmd))
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return {"us": rows[0]["us"], "tbs": rows[0]["tbs"]}


def ours_key(splits):
    return "ours" if splits == "auto" else f"ours_s{splits}"


def sdpa(args, dtype, d, s, backend_name):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.functional import scaled_dot_product_attention

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend_name]
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    b, hq, hkv, keys, rows = s["batch"], s["heads"], s["heads_kv"], s["keys"], args.rows
    q = torch.randn(b, hq, rows, d, dtype=dt, device="cuda")
    k, v = (torch.randn(b, hkv, keys, d, dtype=dt, device="cuda") for _ in range(2))
    # One row sees every key; more rows see the keys up to theirs (bottom-right).
    mask = causal_lower_right(rows, keys) if rows > 1 else None
    try:
        with sdpa_kernel(backend):
            call = lambda: scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hq != hkv)
            us = cuda_ms(call, args.iters) * 1e3
    except Exception as e:  # an unsupported shape or backend
        return {"error": (str(e).splitlines() or [type(e).__name__])[0][:200]}
    kv_bytes = 2 * b * keys * hkv * d * q.element_size()
    return {"us": us, "tbs": kv_bytes / (us * 1e-6) / 1e12}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ours", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--date", required=True)
    p.add_argument("--dtypes", default="bf16,f16")
    p.add_argument("--head-dims", default="128,64", type=lambda x: [int(v) for v in x.split(",")])
    p.add_argument("--shapes", default="8x32x8x131072,64x32x8x8192,8x32x32x32768",
                   type=lambda x: [parse_shape(v) for v in x.split(",")])
    p.add_argument("--rows", default=1, type=int)
    p.add_argument("--splits", default="auto", type=lambda x: x.split(","))
    p.add_argument("--iters", default=20, type=int)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    results = []
    for dtype in args.dtypes.split(","):
        for d in args.head_dims:
            for s in args.shapes:
                row = {"dtype": dtype, "head_dim": d, "rows": args.rows, **s}
                for sp in args.splits:
                    row[ours_key(sp)] = ours(args, dtype, d, s, sp)
                if not args.no_torch:
                    for side in ("flash", "cudnn"):
                        row[side] = sdpa(args, dtype, d, s, side)
                results.append(row)
                keys = [ours_key(sp) for sp in args.splits] + ["flash", "cudnn"]
                log(f"  {dtype} d{d} {s}: " + ", ".join(f"{k} {row[k].get('tbs', row[k].get('error'))}"
                                                      for k in keys if k in row))
    print(f"commit {args.commit}, {args.date}, {args.rows} query row(s) per sequence; TB/s, ours per split-KV count")
    ours_cols = [ours_key(sp) for sp in args.splits]
    print("| dtype | d | batch | hq | hkv | keys | " + " | ".join(ours_cols) + " | flash | cuDNN | best ours / cuDNN |")
    print("|---|---|---|---|---|---|" + "---|" * (len(ours_cols) + 3))
    cell = lambda r: f"{r['tbs']:.2f}" if "tbs" in r else "n/a"
    for r in results:
        f, c = r.get("flash", {}), r.get("cudnn", {})
        best = max((r[k]["tbs"] for k in ours_cols if "tbs" in r[k]), default=None)
        ratio = f"{best / c['tbs']:.2f}" if best and "tbs" in c else "n/a"
        print(f"| {r['dtype']} | {r['head_dim']} | {r['batch']} | {r['heads']} | {r['heads_kv']} | {r['keys']} | "
              + " | ".join(cell(r[k]) for k in ours_cols) + f" | {cell(f)} | {cell(c)} | {ratio} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"commit": args.commit, "date": args.date, "rows": results}, fh, indent=1)


if __name__ == "__main__":
    main()
