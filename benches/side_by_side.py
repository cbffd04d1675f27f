#!/usr/bin/env python3
"""Time this project's attention forward kernels next to PyTorch SDPA (flash and cuDNN).

Usage (GPU machine, PyTorch with CUDA):

    python3 benches/side_by_side.py --ours target/release/flashattn --commit SHA \
        --date YYYY-MM-DD --out DIR [--dtypes f16,bf16] [--head-dims 64,128] \
        [--seqlens 512,1024,2048,4096,8192,16384] [--hidden 2048] [--tokens 16384] [--iters 10]

Shapes follow the FlashAttention paper: heads = hidden / head_dim, batch = tokens / seqlen
(at least 1), seqlen_q = seqlen_k = seqlen, both non-causal and causal. FLOPs are
4 * batch * heads * seqlen^2 * head_dim, halved when causal.

Ours: `OURS bench --dtype DT ... --causal both --iters N --json` is run once per dtype; every
stdout line starting with `{` is one JSON result, anything else is ignored. A failing binary is
recorded and reported, and the PyTorch side still runs.

PyTorch: `scaled_dot_product_attention` under `sdpa_kernel(SDPBackend.FLASH_ATTENTION)` and
`sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`, 3 warm-up calls, then CUDA events around `iters`
back-to-back calls; mean ms per call. An unsupported backend is reported as "n/a".

Outputs: the table on stdout (progress goes to stderr), and in --out: results.md, results.json
and tflops.png (only if matplotlib imports).

--mock fabricates the PyTorch numbers (no torch or GPU needed); with `--ours mock` it fabricates
ours too, otherwise it runs the given binary, so parsing and reporting can be tested on a CPU.

If the binary prints several rows (kernels) for one shape, the table shows the fastest;
results.json keeps every row.
"""

import argparse
import json
import random
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

from cuda_time import cuda_ms

IMPLS = ("ours", "flash", "cudnn")
LABELS = {"ours": "ours", "flash": "SDPA flash", "cudnn": "SDPA cuDNN"}
COLORS = {"ours": "tab:blue", "flash": "tab:orange", "cudnn": "tab:green"}
TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}
WARMUP = 3
MEM_SEQLENS = (16384, 65536)
MEM_HEAD_DIM = 128


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def first_line(text):
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ours", required=True, help="path to the flashattn binary, or 'mock' with --mock")
    p.add_argument("--commit", required=True)
    p.add_argument("--date", required=True, help="YYYY-MM-DD")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--dtypes", default="f16,bf16", type=lambda s: [x for x in s.split(",") if x])
    p.add_argument("--head-dims", default="64,128", type=int_list)
    p.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384", type=int_list)
    p.add_argument("--hidden", default=2048, type=int)
    p.add_argument("--tokens", default=16384, type=int)
    p.add_argument("--iters", default=10, type=int)
    p.add_argument("--backward", action="store_true",
                   help="time the backward pass (dQ, dK, dV from the forward's O, LSE and a random dO); FLOPs 2.5x the forward's")
    p.add_argument("--fwdbwd", action="store_true",
                   help="time forward and backward together (a training step's attention: ours `bench --fwdbwd`, "
                        "PyTorch SDPA then autograd.grad); FLOPs 3.5x the forward's")
    p.add_argument("--ours-args", default="", metavar="ARGS",
                   help="extra arguments for the first run of ours (use --ours-args=..., e.g. "
                        "--ours-args='--kernel wgmma_atomic')")
    p.add_argument("--ours-alt", default=None, metavar="ARGS",
                   help="also run our binary with these extra arguments (e.g. '--residual') and report it "
                        "as a second column ('alt') beside the first")
    p.add_argument("--mock", action="store_true", help="fabricate PyTorch (and 'mock' ours) numbers")
    args = p.parse_args(argv)
    if args.ours == "mock" and not args.mock:
        p.error("--ours mock needs --mock")
    for dt in args.dtypes:
        if dt not in TORCH_DTYPES:
            p.error(f"--dtypes: unknown dtype {dt!r}")
    return args


# ---------------------------------------------------------------- shapes and FLOPs

def make_shapes(args):
    """All (dtype, d, seqlen, causal) problems, in the order the binary runs them."""
    shapes = []
    for dtype in args.dtypes:
        for d in args.head_dims:
            for seqlen in args.seqlens:
                for causal in (False, True):
                    shapes.append({"dtype": dtype, "head_dim": d, "seqlen": seqlen, "causal": causal,
                                   "batch": max(1, args.tokens // seqlen), "heads": args.hidden // d})
    return shapes


BACKWARD = False  # set from --backward (or --fwdbwd) in main()
FWDBWD = False  # set from --fwdbwd in main(): forward and backward timed together


def attn_flops(s):
    """FA paper FLOPs: 4 b h s^2 d, halved when causal, times 2.5 for the backward pass (3.5
    for forward and backward together)."""
    flops = 4 * s["batch"] * s["heads"] * s["seqlen"] ** 2 * s["head_dim"]
    flops = flops / 2 if s["causal"] else flops
    return flops * (3.5 if FWDBWD else 2.5 if BACKWARD else 1)


def key(row):
    return (row["dtype"], row["head_dim"], row["seqlen"], row["causal"])


def mock_tflops(side, s, rng):
    """A plausible saturating TFLOP/s curve; only used with --mock."""
    peak = {"ours": 45.0, "flash": 340.0, "cudnn": 520.0}[side] * (0.8 if s["head_dim"] == 64 else 1.0)
    knee = 1024 if s["causal"] else 384
    return peak * s["seqlen"] / (s["seqlen"] + knee) * rng.uniform(0.95, 1.05)


# ---------------------------------------------------------------- ours

def parse_ours_output(text, side="ours"):
    """One dict per JSON line of the binary's stdout; other lines are skipped."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            log(f"  skipping malformed JSON line ({e}): {line[:120]}")
            continue
        row["side"] = side
        rows.append(row)
    return rows


def mock_ours_stdout(args, dtype, rng):
    """What the binary would print, so the mock path still goes through the parser."""
    lines = ["device: mock"]
    for s in make_shapes(args):
        if s["dtype"] != dtype:
            continue
        tflops = mock_tflops("ours", s, rng)
        ms = attn_flops(s) / (tflops * 1e12) * 1e3
        row = {"impl": "flashattn-rs/simt", "kernel": f"flash_fwd_simt_{dtype}_d{s['head_dim']}", **s,
               "ms": round(ms, 5), "tflops": round(tflops, 3)}
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


def run_ours(args, dtype, rng, extra=(), side="ours"):
    """Run the binary for one dtype (with `extra` arguments, rows labelled `side`). Returns
    (rows, error or None)."""
    if args.ours == "mock":
        return parse_ours_output(mock_ours_stdout(args, dtype, rng), side), None
    cmd = [args.ours, "bench", "--dtype", dtype,
           "--head-dims", ",".join(map(str, args.head_dims)),
           "--seqlens", ",".join(map(str, args.seqlens)),
           "--hidden", str(args.hidden), "--tokens", str(args.tokens),
           "--causal", "both", "--iters", str(args.iters), "--json"] + (["--fwdbwd"] if args.fwdbwd else ["--backward"] if args.backward else []) + list(extra)
    log("  $ " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    except OSError as e:
        return [], f"could not run {args.ours}: {e}"
    rows = parse_ours_output(proc.stdout, side)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "(no stderr)"
        return rows, f"exit {proc.returncode}: {tail}"
    if not rows:
        return rows, "no JSON rows on stdout"
    return rows, None


# ---------------------------------------------------------------- PyTorch

def time_sdpa(torch, backend, q, k, v, causal, iters):
    """Mean ms per SDPA call under one backend; raises if the backend can't run it."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
        warnings.simplefilter("always")
        try:
            if FWDBWD:
                # A training step's attention: the forward, then autograd.grad of its output.
                q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
                d_o = torch.randn_like(q)
                call = lambda: torch.autograd.grad(sdpa(q, k, v, is_causal=causal), (q, k, v), d_o)
            elif BACKWARD:
                # The backward alone: one forward, then autograd.grad of its output repeatedly.
                q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
                out = sdpa(q, k, v, is_causal=causal)
                d_o = torch.randn_like(out)
                call = lambda: torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)
            else:
                call = lambda: sdpa(q, k, v, is_causal=causal)
            return cuda_ms(call, iters, WARMUP)
        except Exception as e:
            why = [first_line(e) or type(e).__name__] + [first_line(w.message) for w in caught[:2]]
            raise RuntimeError("; ".join(filter(None, why))) from None


def torch_row(side, s, ms=None, error=None):
    row = dict(s, side=side, impl=f"torch-sdpa/{side}", ms=ms, tflops=None, error=error)
    if ms is not None:
        row["tflops"] = attn_flops(s) / (ms * 1e-3) / 1e12
    return row


def run_torch(shapes, iters):
    import torch
    from torch.nn.attention import SDPBackend
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    torch.manual_seed(0)
    rows = []
    for s in shapes:
        dtype = getattr(torch, TORCH_DTYPES[s["dtype"]])
        shape = (s["batch"], s["heads"], s["seqlen"], s["head_dim"])
        q, k, v = (torch.randn(shape, dtype=dtype, device="cuda") for _ in range(3))
        for side, backend in backends.items():
            try:
                rows.append(torch_row(side, s, ms=time_sdpa(torch, backend, q, k, v, s["causal"], iters)))
            except RuntimeError as e:
                rows.append(torch_row(side, s, error=str(e)))
            r = rows[-1]
            log(f"  {side:5} {s['dtype']} d{s['head_dim']} s{s['seqlen']} causal={s['causal']}: "
                + (f"{r['tflops']:.1f} TFLOP/s" if r["error"] is None else f"n/a ({r['error']})"))
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def mock_torch(shapes, rng):
    rows = []
    for s in shapes:
        for side in ("flash", "cudnn"):
            if s["dtype"] == "f32":
                rows.append(torch_row(side, s, error="mock: f32 not supported"))
                continue
            rows.append(torch_row(side, s, ms=attn_flops(s) / (mock_tflops(side, s, rng) * 1e12) * 1e3))
    return rows


def mem_problem(hidden, seqlen):
    s = {"batch": 1, "heads": hidden // MEM_HEAD_DIM, "seqlen": seqlen, "head_dim": MEM_HEAD_DIM}
    elems = s["batch"] * s["heads"] * seqlen * MEM_HEAD_DIM
    s["qkvo_bytes"] = 4 * elems * 2
    s["naive_scores_bytes"] = s["batch"] * s["heads"] * seqlen * seqlen * 2
    return s


def flash_extra_bytes(torch, s):
    """Peak bytes SDPA flash allocates beyond q, k, v and o for one memory problem."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    shape = (s["batch"], s["heads"], s["seqlen"], MEM_HEAD_DIM)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    q, k, v = (torch.randn(shape, dtype=torch.float16, device="cuda") for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        sdpa(q, k, v, is_causal=False)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before - s["qkvo_bytes"]


def torch_peak_memory(hidden):
    """Peak extra memory of SDPA flash (f16, non-causal, batch 1, d 128), OOM recorded."""
    import torch
    out = []
    for seqlen in MEM_SEQLENS:
        s = mem_problem(hidden, seqlen)
        try:
            s["extra_bytes"] = flash_extra_bytes(torch, s)
        except torch.cuda.OutOfMemoryError as e:
            s["error"] = "OOM: " + first_line(e)
        except RuntimeError as e:
            s["error"] = first_line(e) or type(e).__name__
        torch.cuda.empty_cache()
        log(f"  s{seqlen}: " + (fmt_bytes(s["extra_bytes"]) if "extra_bytes" in s else s["error"]))
        out.append(s)
    return out


def mock_peak_memory(hidden):
    out = []
    for seqlen in MEM_SEQLENS:
        s = mem_problem(hidden, seqlen)
        s["extra_bytes"] = s["batch"] * s["heads"] * seqlen * 4  # ~ logsumexp only
        out.append(s)
    return out


# ---------------------------------------------------------------- report

def fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def best_tflops(rows):
    """(side, dtype, d, seqlen, causal) -> highest TFLOP/s among that shape's timed rows."""
    best = {}
    for r in rows:
        k = (r["side"],) + key(r)
        if r.get("tflops") is not None and r["tflops"] > best.get(k, -1.0):
            best[k] = r["tflops"]
    return best


def table_rows(shapes, rows, ours_errors):
    """One list of cells per shape: the columns of the side-by-side table (and those of the
    second run of ours, `--ours-alt`, when there is one)."""
    best = best_tflops(rows)
    alt = any(r["side"] == "alt" for r in rows)
    out = []
    for s in shapes:
        cells, tf = [s["dtype"], str(s["head_dim"]), str(s["seqlen"]), "yes" if s["causal"] else "no"], {}
        for side in IMPLS:
            tf[side] = best.get((side,) + key(s))
            if tf[side] is not None:
                cells.append(f"{tf[side]:.1f}")
            elif side == "ours":
                cells.append("error" if ours_errors.get(s["dtype"]) else "missing")
            else:
                cells.append("n/a")
        for other in ("flash", "cudnn"):
            ok = tf["ours"] is not None and tf[other]
            cells.append(f"{tf['ours'] / tf[other]:.2f}x" if ok else "-")
        if alt:
            a = best.get(("alt",) + key(s))
            cells.append(f"{a:.1f}" if a is not None else "missing")
            for other in ("flash", "cudnn"):
                cells.append(f"{a / tf[other]:.2f}x" if a is not None and tf[other] else "-")
        out.append(cells)
    return out


def markdown_table(cells):
    header = ["dtype", "d", "seqlen", "causal", "ours TFLOP/s", "flash TFLOP/s",
              "cudnn TFLOP/s", "ours/flash", "ours/cudnn"]
    if cells and len(cells[0]) > len(header):
        header += ["alt TFLOP/s", "alt/flash", "alt/cudnn"]
    widths = [max(len(str(r[i])) for r in [header] + cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in cells])


def notes(rows, ours_errors):
    """Errors of our binary and distinct reasons why a PyTorch backend was n/a."""
    out = [f"- ours ({dt}) failed: {err}" for dt, err in ours_errors.items() if err]
    seen = set()
    for r in rows:
        if r["side"] != "ours" and r.get("error") and (r["side"], r["error"]) not in seen:
            seen.add((r["side"], r["error"]))
            where = f"{r['dtype']} d{r['head_dim']} s{r['seqlen']}"
            out.append(f"- {LABELS[r['side']]} n/a (first at {where}): {r['error']}")
    return "\n".join(out)


def memory_section(mem):
    if not mem:
        # The backward run does not measure memory (the forward's table covers it).
        return "Peak memory: not measured in this run (it is measured with the forward)."
    lines = ["### Peak memory (PyTorch flash)", "",
             f"f16, non-causal, batch 1, head_dim {MEM_HEAD_DIM}; extra = peak allocated - (q,k,v,o).", "",
             "| seqlen | heads | q,k,v,o | extra peak | naive S matrix |", "|---:|---:|---:|---:|---:|"]
    for s in mem:
        extra = fmt_bytes(s["extra_bytes"]) if "extra_bytes" in s else s.get("error", "?")
        lines.append(f"| {s['seqlen']} | {s['heads']} | {fmt_bytes(s['qkvo_bytes'])} | {extra} "
                     f"| {fmt_bytes(s['naive_scores_bytes'])} |")
    return "\n".join(lines)


def method_line(args):
    if FWDBWD:
        return (f"Method: forward and backward together (PyTorch: SDPA, then torch.autograd.grad of its output "
                f"with a random dO; ours: forward, then backward from its output), CUDA events around {args.iters} "
                f"back-to-back steps after {WARMUP} warm-up steps (mean ms/step), ours timed by `bench --fwdbwd --json` "
                f"with --iters {args.iters}; hidden {args.hidden}, heads = hidden/d, batch = {args.tokens}/seqlen; "
                f"FLOPs = 3.5 * 4*b*h*s^2*d, halved when causal.")
    if BACKWARD:
        return (f"Method: backward only (dQ, dK, dV given the forward's output and a random dO; PyTorch: "
                f"torch.autograd.grad of one SDPA output, retain_graph), CUDA events around {args.iters} back-to-back "
                f"calls after {WARMUP} warm-up calls (mean ms/call), ours timed by `bench --backward --json` with "
                f"--iters {args.iters}; hidden {args.hidden}, heads = hidden/d, batch = {args.tokens}/seqlen; "
                f"FLOPs = 2.5 * 4*b*h*s^2*d, halved when causal.")
    return (f"Method: forward only; PyTorch SDPA timed with CUDA events around {args.iters} back-to-back "
            f"calls after {WARMUP} warm-up calls (mean ms/call), ours timed by `bench --json` with "
            f"--iters {args.iters}; hidden {args.hidden}, heads = hidden/d, batch = {args.tokens}/seqlen, "
            f"randn q,k,v in [batch, heads, seqlen, d]; FLOPs = 4*b*h*s^2*d, halved when causal.")


def write_markdown(path, args, gpu, table, note_text, mem):
    parts = [f"## {args.date} {args.commit} {gpu}", "", method_line(args), "", table]
    if args.ours_alt:
        parts[4:4] = [f"alt: ours with `{args.ours_alt}`.", ""]
    if args.ours_args:
        parts[4:4] = [f"ours: with `{args.ours_args}`.", ""]
    if note_text:
        parts += ["", note_text]
    parts += ["", memory_section(mem), ""]
    path.write_text("\n".join(parts))


def write_plot(path, args, gpu, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: skipping tflops.png")
        return False
    panels = [(dtype, d) for dtype in args.dtypes for d in args.head_dims]
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.6 * len(panels)), squeeze=False)
    best = best_tflops(rows)
    for i, (dtype, d) in enumerate(panels):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            for side in IMPLS + ("alt",):
                pts = [(n, best[(side, dtype, d, n, causal)]) for n in args.seqlens
                       if (side, dtype, d, n, causal) in best]
                if pts:
                    label = LABELS.get(side, f"ours {args.ours_alt}")
                    ax.plot(*zip(*pts), marker="o", label=label, color=COLORS.get(side, "tab:purple"),
                            linestyle="--" if side == "alt" else "-")
            ax.set_xscale("log", base=2)
            ax.set_xlim(min(args.seqlens) / 1.4, max(args.seqlens) * 1.4)
            ax.set_xticks(args.seqlens, [f"{s // 1024}k" if s >= 1024 else str(s) for s in args.seqlens])
            ax.set_title(f"{dtype}, d={d}, {'causal' if causal else 'non-causal'}", fontsize=10)
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
    what = "forward + backward" if FWDBWD else "backward" if BACKWARD else "forward"
    fig.suptitle(f"Attention {what}, {gpu}, {args.commit} ({args.date})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main

def main(argv=None):
    global BACKWARD, FWDBWD
    args = parse_args(argv)
    args.backward = args.backward or args.fwdbwd
    BACKWARD, FWDBWD = args.backward, args.fwdbwd
    rng = random.Random(0)
    shapes = make_shapes(args)
    args.out.mkdir(parents=True, exist_ok=True)

    rows, ours_errors = [], {}
    for dtype in args.dtypes:
        log(f"ours: {dtype}")
        ours, ours_errors[dtype] = run_ours(args, dtype, rng, shlex.split(args.ours_args))
        rows += ours
        log(f"  {len(ours)} rows" + (f", error: {ours_errors[dtype]}" if ours_errors[dtype] else ""))
        if args.ours_alt:
            alt, err = run_ours(args, dtype, rng, shlex.split(args.ours_alt), "alt")
            rows += alt
            log(f"  alt ({args.ours_alt}): {len(alt)} rows" + (f", error: {err}" if err else ""))

    if args.mock:
        gpu = "mock GPU"
        rows += mock_torch(shapes, rng)
        mem = [] if args.backward else mock_peak_memory(args.hidden)
    else:
        import torch
        gpu = torch.cuda.get_device_name()
        log(f"PyTorch {torch.__version__} SDPA on {gpu}")
        rows += run_torch(shapes, args.iters)
        log("peak memory (PyTorch flash)")
        mem = [] if args.backward else torch_peak_memory(args.hidden)

    table = markdown_table(table_rows(shapes, rows, ours_errors))
    note_text = notes(rows, ours_errors)
    print(f"{args.date} {args.commit} {gpu}\n\n{table}")
    if note_text:
        print("\n" + note_text)
    print("\n" + memory_section(mem))

    write_markdown(args.out / "results.md", args, gpu, table, note_text, mem)
    meta = {"date": args.date, "commit": args.commit, "gpu": gpu, "iters": args.iters, "warmup": WARMUP,
            "hidden": args.hidden, "tokens": args.tokens, "mock": args.mock, "ours": args.ours,
            "ours_alt": args.ours_alt, "ours_args": args.ours_args}
    (args.out / "results.json").write_text(json.dumps(
        {"meta": meta, "ours_errors": ours_errors, "rows": rows, "peak_memory": mem}, indent=1) + "\n")
    plotted = write_plot(args.out / "tflops.png", args, gpu, rows)
    log(f"wrote {args.out}/results.md, results.json" + (", tflops.png" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
