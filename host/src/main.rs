//! `flashattn`: runs the FlashAttention forward kernel, checks it, and times it.
//!
//! `flashattn [run] [options]` runs one shape, checks sampled rows against the f64 reference,
//! and prints time, TFLOP/s and memory. `flashattn bench [options]` times the FA paper's
//! settings. Without a GPU, `run` falls back to the CPU emulator at a small shape.

use flashattn::reference::{naive_rows, reference_rows, rel_l2, tolerance};
use flashattn::{Attention, AttnShape, BwdOptions, Dtype, FlashAttn, FwdOptions, FwdOutput, Tensor, select_variant};
use std::process::ExitCode;

const USAGE: &str = "\
usage: flashattn [run] [--batch B] [--seqlen S] [--seqlen-k S] [--heads H] [--heads-kv H]
                       [--head-dim D] [--dtype f16|bf16|f32] [--causal] [--scale X]
                       [--kernel NAME] [--iters N] [--emulator]
       flashattn bench [--dtype f16|bf16|f32] [--head-dims 64,128] [--seqlens 512,1024,...]
                       [--hidden 2048] [--tokens 16384] [--causal on|off|both] [--kernel NAME]
                       [--iters N] [--json] [--backward|--fwdbwd [--deterministic] [--residual]]
run:   one shape (GPU default: batch 8, seqlen 2048, 32 heads of 64, f16 -- the FA paper's
       hidden 2048 with 16k tokens; emulator default: batch 1, seqlen 128, 2 heads of 64),
       checked on sampled rows against the f64 reference, timed with CUDA events.
bench: the FA paper's settings (hidden 2048, batch * seqlen = 16k; emulator default: seqlen
       128, hidden 128, 128 tokens), TFLOP/s per shape;
       --backward times dQ, dK, dV instead (--deterministic: only bitwise-deterministic
       kernels; --residual: after a forward that saves O's residual, so that D~ comes
       from the unrounded O, see FwdOptions::save_residual); --fwdbwd times the forward
       and the backward together (a training step's attention; FLOPs 3.5x the forward's).";

#[derive(Clone, Debug)]
struct Args {
    cmd: String,
    batch: Option<usize>,
    seqlen: Option<usize>,
    seqlen_k: Option<usize>,
    heads: Option<usize>,
    heads_kv: Option<usize>,
    head_dim: Option<usize>,
    dtype: String,
    causal: bool,
    causal_mode: String,
    scale: Option<f32>,
    kernel: Option<&'static str>,
    iters: Option<usize>,
    emulator: bool,
    head_dims: Vec<usize>,
    /// Unset: the FA paper's settings on a GPU, a small shape on the emulator (see `bench`).
    seqlens: Option<Vec<usize>>,
    hidden: Option<usize>,
    tokens: Option<usize>,
    json: bool,
    backward: bool,
    fwdbwd: bool,
    deterministic: bool,
    residual: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        cmd: "run".into(),
        batch: None,
        seqlen: None,
        seqlen_k: None,
        heads: None,
        heads_kv: None,
        head_dim: None,
        dtype: "f16".into(),
        causal: false,
        causal_mode: "both".into(),
        scale: None,
        kernel: None,
        iters: None,
        emulator: false,
        head_dims: vec![64, 128],
        seqlens: None,
        hidden: None,
        tokens: None,
        json: false,
        backward: false,
        fwdbwd: false,
        deterministic: false,
        residual: false,
    };
    let mut it = std::env::args().skip(1).peekable();
    if let Some(c) = it.peek()
        && (c == "run" || c == "bench")
    {
        a.cmd = it.next().unwrap_or_default();
    }
    fn val<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag}: cannot parse `{v}`"))
    }
    fn list(flag: &str, v: Option<String>) -> Result<Vec<usize>, String> {
        let v: String = val(flag, v)?;
        v.split(',').map(|x| x.trim().parse().map_err(|_| format!("{flag}: cannot parse `{x}`"))).collect()
    }
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--batch" => a.batch = Some(val(&flag, it.next())?),
            "--seqlen" => a.seqlen = Some(val(&flag, it.next())?),
            "--seqlen-k" => a.seqlen_k = Some(val(&flag, it.next())?),
            "--heads" => a.heads = Some(val(&flag, it.next())?),
            "--heads-kv" => a.heads_kv = Some(val(&flag, it.next())?),
            "--head-dim" => a.head_dim = Some(val(&flag, it.next())?),
            "--dtype" => a.dtype = val(&flag, it.next())?,
            "--causal" if a.cmd == "run" => a.causal = true,
            "--causal" => a.causal_mode = val(&flag, it.next())?,
            "--scale" => a.scale = Some(val(&flag, it.next())?),
            "--kernel" => {
                let k: String = val(&flag, it.next())?;
                let all = || flashattn::FAMILIES.iter().chain(flashattn::BWD_FAMILIES);
                a.kernel = Some(all().find(|f| **f == k).copied().ok_or_else(|| {
                    format!(
                        "--kernel: no kernel family `{k}` (forward: {}; backward: {})",
                        flashattn::FAMILIES.join(", "),
                        flashattn::BWD_FAMILIES.join(", ")
                    )
                })?);
            }
            "--iters" => a.iters = Some(val(&flag, it.next())?),
            "--emulator" => a.emulator = true,
            "--head-dims" => a.head_dims = list(&flag, it.next())?,
            "--seqlens" => a.seqlens = Some(list(&flag, it.next())?),
            "--hidden" => a.hidden = Some(val(&flag, it.next())?),
            "--tokens" => a.tokens = Some(val(&flag, it.next())?),
            "--json" => a.json = true,
            "--backward" => a.backward = true,
            "--fwdbwd" => {
                a.backward = true;
                a.fwdbwd = true;
            }
            "--deterministic" => a.deterministic = true,
            "--residual" => a.residual = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if !["f16", "bf16", "f32"].contains(&a.dtype.as_str()) {
        return Err(format!("--dtype: `{}` is not one of f16, bf16, f32", a.dtype));
    }
    if !["on", "off", "both"].contains(&a.causal_mode.as_str()) {
        return Err(format!("--causal: `{}` is not one of on, off, both", a.causal_mode));
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("error: {e}");
            }
            eprintln!("{USAGE}");
            return if e.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) };
        }
    };
    let fa = if args.emulator {
        println!("backend: CPU emulator (--emulator)");
        FlashAttn::emulator()
    } else {
        match FlashAttn::cuda(0) {
            Ok(fa) => fa,
            Err(e) if args.cmd == "run" => {
                println!("*** No GPU: {e}");
                println!("*** Falling back to the CPU emulator (same kernel source, emulated) at a small shape.");
                FlashAttn::emulator()
            }
            Err(e) => {
                eprintln!("error: bench needs a GPU: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let r = match (args.cmd.as_str(), args.dtype.as_str()) {
        ("run", "f16") => run::<half::f16>(&fa, &args),
        ("run", "bf16") => run::<half::bf16>(&fa, &args),
        ("run", _) => run::<f32>(&fa, &args),
        (_, "f16") => bench::<half::f16>(&fa, &args),
        (_, "bf16") => bench::<half::bf16>(&fa, &args),
        (_, _) => bench::<f32>(&fa, &args),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Problem<T> {
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
}

/// Standard normal Q, K, V for shape `s`.
fn random_problem<T: Dtype>(s: &AttnShape, seed: u64) -> Problem<T> {
    let mut rng = flashattn::rng::Rng::new(seed);
    let nq = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let nk = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
    Problem { q: rng.tensor(nq), k: rng.tensor(nk), v: rng.tensor(nk) }
}

fn fmt_bytes(b: f64) -> String {
    if b >= 1e9 { format!("{:.2} GB", b / 1e9) } else { format!("{:.1} MB", b / 1e6) }
}

fn run<T: Dtype>(fa: &FlashAttn, a: &Args) -> flashattn::Result<bool> {
    let emu = fa.is_emulator();
    let head_dim = a.head_dim.unwrap_or(64);
    let heads = a.heads.unwrap_or(if emu { 2 } else { 2048 / head_dim.max(1) });
    let seqlen = a.seqlen.unwrap_or(if emu { 128 } else { 2048 });
    let s = AttnShape {
        batch: a.batch.unwrap_or(if emu { 1 } else { (16384 / seqlen.max(1)).max(1) }),
        seqlen_q: seqlen,
        seqlen_k: a.seqlen_k.unwrap_or(seqlen),
        heads_q: heads,
        heads_kv: a.heads_kv.unwrap_or(heads),
        head_dim,
    };
    let attn = Attention { causal: a.causal, softmax_scale: a.scale };
    let opts = FwdOptions { kernel: a.kernel, ..Default::default() };
    let variant = select_variant(T::DTYPE, s.head_dim, &opts, &fa.archs())?;
    println!("device:  {}", fa.device_name());
    println!(
        "problem: batch {} seqlen_q {} seqlen_k {} heads_q {} heads_kv {} head_dim {} {} causal={}",
        s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim, a.dtype, a.causal
    );
    println!("kernel:  {}", variant.name);

    let p = random_problem::<T>(&s, 0x5eed);
    let free_before = fa.memory_info()?.map(|(f, _)| f);
    let q = fa.upload(&p.q, &s.q_shape())?;
    let k = fa.upload(&p.k, &s.kv_shape())?;
    let v = fa.upload(&p.v, &s.kv_shape())?;
    let mut out = FwdOutput::from_buffers(fa.full(T::nan(), &s.q_shape())?, fa.full(f32::NAN, &s.lse_shape())?, None);
    let iters = a.iters.unwrap_or(if emu { 1 } else { 20 });
    let ms = fa.time_forward(&q, &k, &v, &attn, &opts, &mut out, if emu { 0 } else { 3 }, iters)?;
    let free_after = fa.memory_info()?.map(|(f, _)| f);
    let o_h = fa.download(out.o())?;
    let lse_h = fa.download(out.lse())?;

    // Check sampled rows (first, last, and a spread between) against the f64 reference,
    // with the same bar as the tests: twice naive attention's error in this dtype.
    let n_rows = s.batch * s.heads_q * s.seqlen_q;
    let rows: Vec<(usize, usize, usize)> = (0..16)
        .map(|i| i * (n_rows - 1) / 15)
        .map(|r| (r / (s.heads_q * s.seqlen_q), (r / s.seqlen_q) % s.heads_q, r % s.seqlen_q))
        .collect();
    let exact = reference_rows(&p.q, &p.k, &p.v, &s, &attn, &rows);
    let naive = naive_rows(&p.q, &p.k, &p.v, &s, &attn, &rows);
    let d = s.head_dim;
    let (mut got_o, mut got_l, mut ref_o, mut ref_l, mut nv_o, mut nv_l) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    for (((b, h, i), (eo, el)), (no, nl)) in rows.iter().zip(&exact).zip(&naive) {
        let at = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
        got_o.extend(o_h[at..at + d].iter().map(|x| x.to_f64()));
        got_l.push(lse_h[(b * s.heads_q + h) * s.seqlen_q + i] as f64);
        ref_o.extend_from_slice(eo);
        ref_l.push(*el);
        nv_o.extend_from_slice(no);
        nv_l.push(*nl);
    }
    let unwritten = o_h.iter().filter(|x| x.to_f64().is_nan()).count() + lse_h.iter().filter(|x| x.is_nan()).count();
    let (err_o, err_l) = (rel_l2(&got_o, &ref_o), rel_l2(&got_l, &ref_l));
    let (tol_o, tol_l) = (tolerance::<T>(rel_l2(&nv_o, &ref_o)), tolerance::<f32>(rel_l2(&nv_l, &ref_l)));
    let ok = unwritten == 0 && err_o <= tol_o && err_l <= tol_l;
    println!(
        "check:   {} sampled rows vs f64 reference: O rel err {err_o:.2e} (bar {tol_o:.2e}), LSE rel err {err_l:.2e} (bar {tol_l:.2e}); {} unwritten elements: {}",
        rows.len(),
        unwritten,
        if ok { "OK" } else { "FAILED" }
    );

    let flops = s.fwd_flops(a.causal);
    println!("time:    {ms:.3} ms per forward ({iters} timed runs) = {:.2} TFLOP/s", flops / (ms * 1e-3) / 1e12);
    let tensors = (q.bytes() + k.bytes() + v.bytes() + out.o().bytes() + out.lse().bytes()) as f64;
    let scores = (s.batch * s.heads_q * s.seqlen_q * s.seqlen_k * std::mem::size_of::<T>()) as f64;
    let used = match (free_before, free_after) {
        (Some(b), Some(a)) => format!("{} device memory in use for the call", fmt_bytes(b.saturating_sub(a) as f64)),
        _ => "host memory (emulator)".into(),
    };
    println!(
        "memory:  Q,K,V,O,LSE {} ({used}; no workspace); naive attention's score matrix alone would be {}",
        fmt_bytes(tensors),
        fmt_bytes(scores)
    );
    if emu {
        println!("note:    emulated on the CPU: the time says nothing about GPU speed.");
    }
    Ok(ok)
}

fn upload_problem<T: Dtype>(fa: &FlashAttn, s: &AttnShape) -> flashattn::Result<(Tensor<T>, Tensor<T>, Tensor<T>)> {
    let p = random_problem::<T>(s, 0xbe_7c4);
    Ok((fa.upload(&p.q, &s.q_shape())?, fa.upload(&p.k, &s.kv_shape())?, fa.upload(&p.v, &s.kv_shape())?))
}

fn bench<T: Dtype>(fa: &FlashAttn, a: &Args) -> flashattn::Result<bool> {
    let causals: &[bool] = match a.causal_mode.as_str() {
        "on" => &[true],
        "off" => &[false],
        _ => &[false, true],
    };
    if !a.json {
        println!("device: {}", fa.device_name());
        println!(
            "{:<28} {:>5} {:>4} {:>6} {:>6} {:>4} {:>7} {:>10} {:>9}",
            "kernel", "dtype", "d", "seqlen", "batch", "h", "causal", "ms", "TFLOP/s"
        );
    }
    // The FA paper's settings on a GPU; on the emulator (minutes per FA shape) one small one.
    let emu = fa.is_emulator();
    let seqlens = a.seqlens.clone().unwrap_or_else(|| if emu { vec![128] } else { vec![512, 1024, 2048, 4096, 8192, 16384] });
    let hidden = a.hidden.unwrap_or(if emu { 128 } else { 2048 });
    let tokens = a.tokens.unwrap_or(if emu { 128 } else { 16384 });
    for &d in &a.head_dims {
        for &seqlen in &seqlens {
            for &causal in causals {
                let heads = (hidden / d).max(1);
                let s = AttnShape {
                    batch: (tokens / seqlen).max(1),
                    seqlen_q: seqlen,
                    seqlen_k: seqlen,
                    heads_q: heads,
                    heads_kv: heads,
                    head_dim: d,
                };
                let attn = Attention { causal, softmax_scale: None };
                let iters = a.iters.unwrap_or(10);
                let (family, name, ms, flops) = if a.backward {
                    // The forward's O and LSE (automatic kernel), a random dO; then dQ, dK, dV
                    // timed with the requested backward family. FLOPs: 2.5x the forward's.
                    let fwd_opts = FwdOptions { kernel: None, save_residual: a.residual };
                    let bwd_opts = BwdOptions { kernel: a.kernel, deterministic: a.deterministic };
                    let (q, k, v) = upload_problem::<T>(fa, &s)?;
                    let out = fa.forward(&q, &k, &v, &attn, &fwd_opts)?;
                    let d_o = fa.upload(&random_problem::<T>(&s, 0xd0).q, &s.q_shape())?;
                    let mut grads = flashattn::BwdOutput {
                        dq: fa.full(T::nan(), &s.q_shape())?,
                        dk: fa.full(T::nan(), &s.kv_shape())?,
                        dv: fa.full(T::nan(), &s.kv_shape())?,
                    };
                    let passes = flashattn::select_bwd_variants(T::DTYPE, d, &bwd_opts, &fa.archs(), out.o_lo().is_some())?;
                    let names = passes.iter().map(|v| v.name).collect::<Vec<_>>().join("+");
                    let family = passes[passes.len() - 1].family.to_string();
                    if a.fwdbwd {
                        // With --fwdbwd the forward too, each step (FLOPs 1 + 2.5 forwards).
                        let ms = fa.time_forward_backward(&q, &k, &v, &d_o, &attn, &fwd_opts, &bwd_opts, &mut grads, 2, iters)?;
                        let fwd = select_variant(T::DTYPE, d, &fwd_opts, &fa.archs())?.name;
                        (family, format!("{fwd}+{names}"), ms, 3.5 * s.fwd_flops(causal))
                    } else {
                        let ms = fa.time_backward(&q, &k, &v, &out, &d_o, &bwd_opts, &mut grads, 2, iters)?;
                        (family, names, ms, 2.5 * s.fwd_flops(causal))
                    }
                } else {
                    let opts = FwdOptions { kernel: a.kernel, ..Default::default() };
                    let variant = select_variant(T::DTYPE, d, &opts, &fa.archs())?;
                    let (q, k, v) = upload_problem::<T>(fa, &s)?;
                    let mut out = FwdOutput::from_buffers(fa.full(T::nan(), &s.q_shape())?, fa.full(f32::NAN, &s.lse_shape())?, None);
                    let ms = fa.time_forward(&q, &k, &v, &attn, &opts, &mut out, 2, iters)?;
                    (variant.family.to_string(), variant.name.to_string(), ms, s.fwd_flops(causal))
                };
                let tflops = flops / (ms * 1e-3) / 1e12;
                let pass = match (a.fwdbwd, a.backward) {
                    (true, _) => "fwdbwd",
                    (_, true) => "bwd",
                    _ => "fwd",
                };
                if a.json {
                    println!(
                        "{{\"impl\":\"flashattn-rs/{family}\",\"pass\":\"{pass}\",\"kernel\":\"{name}\",\"dtype\":\"{}\",\"head_dim\":{d},\"seqlen\":{seqlen},\"batch\":{},\"heads\":{heads},\"causal\":{causal},\"ms\":{ms:.5},\"tflops\":{tflops:.3}}}",
                        a.dtype, s.batch
                    );
                } else {
                    println!("{name:<28} {:>5} {d:>4} {seqlen:>6} {:>6} {heads:>4} {causal:>7} {ms:>10.3} {tflops:>9.2}", a.dtype, s.batch);
                }
            }
        }
    }
    Ok(true)
}
