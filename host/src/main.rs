//! `flashattn`: runs the FlashAttention forward kernel, checks it, and times it.
//!
//! `flashattn [run] [options]` runs one shape, checks sampled rows against the f64 reference,
//! and prints time, TFLOP/s and memory; with `--backward`, the same for dQ, dK, dV.
//! `flashattn bench [options]` times the FA paper's settings. Without a GPU, `run` falls back
//! to the CPU emulator at a small shape.

use flashattn::kernels::registry::{BwdVariant, Entry, FwdVariant};
use flashattn::reference::{
    attention_backward_f64, backward_recompute_bound, lse_tolerance, naive_backward, naive_rows, reference_rows, rel_l2, tolerance,
};
use flashattn::{
    Attention, AttnShape, BWD_FAMILIES, BwdOptions, BwdOutput, Dtype, Error, FWD_FAMILIES, FlashAttn, FwdOptions, FwdOutput, Tensor, Window,
};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: flashattn [run] [--batch B] [--seqlen S] [--seqlen-k S] [--heads H] [--heads-kv H]
                       [--head-dim D] [--dtype f16|bf16|f32] [--causal] [--scale X]
                       [--window LEFT[,RIGHT]] [--softcap C] [--sinks] [--alibi] [--kernel NAME]
                       [--iters N] [--emulator] [--splits N] [--no-gqa-packing]
                       [--backward|--fwdbwd [--deterministic] [--residual]]
       flashattn bench [--dtype f16|bf16|f32] [--head-dims 64,128] [--seqlens 512,1024,...]
                       [--hidden 2048] [--tokens 16384] [--causal on|off|both] [--kernel NAME]
                       [--window LEFT[,RIGHT]] [--softcap C] [--sinks] [--alibi] [--varlen MEAN]
                       [--iters N] [--json]
                       [--backward|--fwdbwd [--deterministic] [--residual]]
       flashattn bench --decode [--batch B] [--heads H] [--heads-kv H] [--head-dims 128]
                       [--seqlens 8192,...] [--seqlen ROWS] [--dtype ...] [--causal on|off]
                       [--window ...] [--softcap C] [--sinks] [--alibi] [--kernel NAME]
                       [--splits N] [--no-gqa-packing] [--iters N] [--json]
run:   one shape (GPU default: batch 8, seqlen 2048, 32 heads of 64, f16 -- the FA paper's
       hidden 2048 with 16k tokens; emulator default: batch 1, seqlen 128, 2 heads of 64),
       checked on sampled rows against the f64 reference, timed with CUDA events;
       --backward also checks dQ, dK, dV (on sampled (batch, KV head) slices, all of them
       for small shapes) and times the backward (--kernel names the forward's family, the
       backward's, or both); --fwdbwd also times the two together.
bench: the FA paper's settings (hidden 2048, batch * seqlen = 16k; emulator default: seqlen
       128, hidden 128, 128 tokens), TFLOP/s per shape;
       --window: a sliding window (keys i + sk - sq - LEFT ..= i + sk - sq + RIGHT; a side
       -1 or left out: unbounded; with causal masking RIGHT is 0), TFLOP/s then counting the
       visible (query, key) pairs exactly;
       --softcap C: scores capped to C tanh(S / C) before the softmax (Gemma 2, Grok);
       --sinks: attention sinks (gpt-oss), a logit per head in [-1, 1] (a fixed pattern);
       --alibi: ALiBi with the paper's slopes for the query heads (flashattn::alibi_paper_slopes);
       --varlen MEAN: a variable-length batch of --tokens tokens in sequences of random
       lengths (uniform 1..2 MEAN - 1, a fixed seed), next to the fixed-length batch of
       sequences of MEAN; TFLOP/s counting the pairs each sequence computes;
       --backward times dQ, dK, dV instead (--deterministic: only bitwise-deterministic
       kernels; --residual: after a forward that saves O's residual, so that D~ comes
       from the unrounded O, see FwdOptions::save_residual); --fwdbwd times the forward
       and the backward together (a training step's attention; FLOPs 3.5x the forward's);
       --decode: attention against a KV cache (FlashAttn::forward_kvcache) holding each of
       --seqlens keys per sequence after appending --seqlen new keys and values (default 1:
       one decode step; GPU default: batch 8, 32 query heads on 8 KV heads, head_dim 128,
       8k, 32k and 128k keys), time and effective bandwidth (K and V bytes held / time);
--splits N: split-KV, each block's keys in N parts merged by their LSE (FwdOptions::splits;
       the Hopper forward only);
--no-gqa-packing: each query head a block's head of its own also in decode
       (FwdOptions::no_gqa_packing), for comparison.";

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
    window: Window,
    softcap: Option<f32>,
    /// `--sinks`: attention sinks, one logit per head.
    sinks: bool,
    /// `--alibi`: ALiBi, the paper's slopes.
    alibi: bool,
    kernel: Option<&'static str>,
    iters: Option<usize>,
    emulator: bool,
    head_dims: Vec<usize>,
    /// Unset: the FA paper's settings on a GPU, a small shape on the emulator (see `bench`).
    seqlens: Option<Vec<usize>>,
    hidden: Option<usize>,
    tokens: Option<usize>,
    json: bool,
    /// `bench --varlen MEAN`: the mean sequence length of a variable-length batch.
    varlen: Option<usize>,
    /// `bench --decode`: attention against a KV cache.
    decode: bool,
    backward: bool,
    fwdbwd: bool,
    deterministic: bool,
    residual: bool,
    /// `--splits N`: split-KV (`FwdOptions::splits`).
    splits: Option<u32>,
    /// `--no-gqa-packing` (`FwdOptions::no_gqa_packing`).
    no_gqa_packing: bool,
}

/// The forward kernel families' names ([`FWD_FAMILIES`]).
fn fwd_names() -> impl Iterator<Item = &'static str> {
    FWD_FAMILIES.iter().map(|f| f.name)
}
/// The backward kernel families' names ([`BWD_FAMILIES`]).
fn bwd_names() -> impl Iterator<Item = &'static str> {
    BWD_FAMILIES.iter().map(|f| f.name)
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
        window: Window::default(),
        softcap: None,
        sinks: false,
        alibi: false,
        kernel: None,
        iters: None,
        emulator: false,
        head_dims: vec![64, 128],
        seqlens: None,
        hidden: None,
        tokens: None,
        json: false,
        varlen: None,
        decode: false,
        backward: false,
        fwdbwd: false,
        deterministic: false,
        residual: false,
        splits: None,
        no_gqa_packing: false,
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
            "--window" => {
                let v: String = val(&flag, it.next())?;
                let side = |x: &str| match x.trim().parse::<i64>() {
                    Ok(-1) => Ok(None),
                    Ok(n) if (0..=u32::MAX as i64).contains(&n) => Ok(Some(n as u32)),
                    _ => Err(format!("--window: `{x}` is not -1 or a key count")),
                };
                let mut parts = v.split(',');
                let left = side(parts.next().unwrap_or_default())?;
                let right = parts.next().map_or(Ok(None), side)?;
                if parts.next().is_some() {
                    return Err(format!("--window: `{v}` is not LEFT[,RIGHT]"));
                }
                a.window = Window::new(left, right);
            }
            "--softcap" => a.softcap = Some(val(&flag, it.next())?),
            "--sinks" => a.sinks = true,
            "--alibi" => a.alibi = true,
            "--kernel" => {
                let k: String = val(&flag, it.next())?;
                a.kernel = Some(fwd_names().chain(bwd_names()).find(|f| *f == k).ok_or_else(|| {
                    format!(
                        "--kernel: no kernel family `{k}` (forward: {}; backward: {})",
                        fwd_names().collect::<Vec<_>>().join(", "),
                        bwd_names().collect::<Vec<_>>().join(", ")
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
            "--varlen" => a.varlen = Some(val(&flag, it.next())?),
            "--decode" => a.decode = true,
            "--backward" => a.backward = true,
            "--fwdbwd" => {
                a.backward = true;
                a.fwdbwd = true;
            }
            "--deterministic" => a.deterministic = true,
            "--residual" => a.residual = true,
            "--splits" => a.splits = Some(val(&flag, it.next())?),
            "--no-gqa-packing" => a.no_gqa_packing = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if !["f16", "bf16", "f32"].contains(&a.dtype.as_str()) {
        return Err(format!("--dtype: `{}` is not one of f16, bf16, f32", a.dtype));
    }
    if let Some(k) = a.kernel
        && !a.backward
        && !fwd_names().any(|f| f == k)
    {
        return Err(format!("--kernel: `{k}` is a backward kernel family (no forward of that name): add --backward"));
    }
    if a.varlen.is_some_and(|m| m == 0) || (a.varlen.is_some() && (a.cmd != "bench" || a.fwdbwd)) {
        return Err("--varlen MEAN: bench only, MEAN at least 1, with or without --backward (not --fwdbwd)".into());
    }
    if a.decode && (a.cmd != "bench" || a.backward || a.fwdbwd || a.varlen.is_some()) {
        return Err("--decode: bench only, forward only (not with --backward, --fwdbwd or --varlen)".into());
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

/// Standard normal Q, K, V for shape `s`, generated on all cores ([`flashattn::rng::normal_tensor`]:
/// the values depend on the seed alone, not on the number of threads).
fn random_problem<T: Dtype>(s: &AttnShape, seed: u64) -> Problem<T> {
    let nq = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let nk = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
    let start = Instant::now();
    let p = Problem { q: random_tensor(seed, nq), k: random_tensor(seed ^ 0x6b, nk), v: random_tensor(seed ^ 0x76, nk) };
    if start.elapsed() > Duration::from_secs(2) {
        println!("inputs:  {} random elements in {:.1} s", nq + 2 * nk, start.elapsed().as_secs_f64());
    }
    p
}

fn random_tensor<T: Dtype>(seed: u64, n: usize) -> Vec<T> {
    flashattn::rng::normal_tensor(seed, n)
}

fn fmt_bytes(b: f64) -> String {
    if b >= 1e9 { format!("{:.2} GB", b / 1e9) } else { format!("{:.1} MB", b / 1e6) }
}

/// The kernels a request runs, found before anything about it is printed or launched.
struct Plan {
    fwd: &'static FwdVariant,
    fwd_opts: FwdOptions,
    /// The backward's passes (with `--backward`), and its options.
    bwd: Vec<&'static BwdVariant>,
    bwd_opts: BwdOptions,
    /// The forward saves O's residual (`--residual` and a forward kernel that writes it).
    saved: bool,
    /// Which of the kernels' entries run (a sliding window: the windowed ones).
    entry: Entry,
}

impl Plan {
    /// The forward's entry, as launched.
    fn fwd_name(&self) -> &'static str {
        self.fwd.entry(self.entry).map_or(self.fwd.name, |e| e.0)
    }
    /// The backward's entries, as launched, joined by `sep`.
    fn bwd_names(&self, sep: &str) -> String {
        self.bwd.iter().map(|v| v.entry(self.entry).map_or(v.name, |e| e.0)).collect::<Vec<_>>().join(sep)
    }
}

/// Checks everything about a request that can be refused: the shape and options
/// ([`flashattn::validate`]), a kernel for the dtype and head_dim, and that this device runs
/// it. `--kernel` names the forward's family, or with `--backward` the backward's: in `run`
/// a family of both names both (the other pass chosen automatically otherwise), in `bench`
/// the backward only (the forward automatic, as the bench has always timed it).
fn plan<T: Dtype>(fa: &FlashAttn, s: &AttnShape, attn: &Attention, a: &Args) -> flashattn::Result<Plan> {
    flashattn::validate(&s.q_shape(), &s.kv_shape(), &s.kv_shape(), attn)?;
    let archs = fa.archs();
    let runs = |kernel: &'static str, needs| match archs.contains(&needs) {
        true => Ok(()),
        false => Err(Error::UnsupportedDevice { kernel, needs, device: fa.device_name() }),
    };
    let (fwd_kernel, bwd_kernel) = match (a.backward, a.cmd == "bench") {
        (false, _) => (a.kernel, None),
        (true, true) => (None, a.kernel),
        (true, false) => (a.kernel.filter(|k| fwd_names().any(|f| f == *k)), a.kernel.filter(|k| bwd_names().any(|f| f == *k))),
    };
    let fwd_opts =
        FwdOptions { kernel: fwd_kernel, save_residual: a.backward && a.residual, splits: a.splits, no_gqa_packing: a.no_gqa_packing };
    let fwd = flashattn::select_variant(T::DTYPE, s.head_dim, &fwd_opts, &archs)?;
    runs(fwd.name, fwd.arch())?;
    flashattn::check_splits(&fwd_opts, fwd, s.heads_q)?;
    let saved = fwd_opts.save_residual && fwd.family.desc().writes_residual;
    let bwd_opts = BwdOptions { kernel: bwd_kernel, deterministic: a.deterministic };
    let bwd = match a.backward {
        true => flashattn::select_bwd_variants(T::DTYPE, s.head_dim, &bwd_opts, &archs, saved, attn.entry(false), attn)?,
        false => vec![],
    };
    for v in &bwd {
        runs(v.name, v.arch())?;
    }
    Ok(Plan { fwd, fwd_opts, bwd, bwd_opts, saved, entry: attn.entry(false) })
}

/// `f` of each item, on all cores, in the items' order. Once it has taken more than a few
/// seconds, a line on stderr every few seconds says how far it is (`what`: what it computes).
fn par_map<I: Sync, R: Send>(items: &[I], what: &str, f: impl Fn(&I) -> R + Sync) -> Vec<R> {
    const EVERY: Duration = Duration::from_secs(3);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, items.len().max(1));
    let (next, done, start) = (AtomicUsize::new(0), AtomicUsize::new(0), Instant::now());
    let parts: Vec<Vec<(usize, R)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = vec![];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break mine };
                        mine.push((i, f(item)));
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let mut last = start;
        while workers.iter().any(|w| !w.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            if last.elapsed() >= EVERY {
                last = Instant::now();
                let n = done.load(Ordering::Relaxed);
                eprintln!("  {what}: {n} of {} done after {:.0} s", items.len(), start.elapsed().as_secs_f64());
            }
        }
        workers.into_iter().map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    let mut out: Vec<Option<R>> = items.iter().map(|_| None).collect();
    for (i, r) in parts.into_iter().flatten() {
        out[i] = Some(r);
    }
    out.into_iter().map(|r| r.expect("every item mapped")).collect()
}

/// Query row `(b, h, i)` as a problem of its own: that row of Q, and K, V of its KV head cut
/// to the keys it sees (`Attention::visible_cols`: the causal mask and the window), unmasked.
/// The references compute the same thing, in the same order, as for the row of the whole
/// problem (they leave masked keys out, or add their exact zeros), without converting all of
/// K and V.
fn row_problem<T: Dtype>(p: &Problem<T>, s: &AttnShape, attn: &Attention, (b, h, i): (usize, usize, usize)) -> (Problem<T>, AttnShape) {
    let d = s.head_dim;
    let hk = h / (s.heads_q / s.heads_kv);
    let (lo, hi) = attn.visible_cols(i, s.seqlen_q, s.seqlen_k);
    let keys = |x: &[T]| (lo..hi).flat_map(|j| &x[((b * s.seqlen_k + j) * s.heads_kv + hk) * d..][..d]).copied().collect();
    let q = p.q[((b * s.seqlen_q + i) * s.heads_q + h) * d..][..d].to_vec();
    let shape = AttnShape { batch: 1, seqlen_q: 1, seqlen_k: hi - lo, heads_q: 1, heads_kv: 1, head_dim: d };
    (Problem { q, k: keys(&p.k), v: keys(&p.v) }, shape)
}

/// Heads `h0 .. h0 + nh` of batch `b` of a [batch, rows, heads, d] tensor: [1, rows, nh, d].
fn heads_of<T: Copy>(x: &[T], rows: usize, heads: usize, d: usize, (b, h0, nh): (usize, usize, usize)) -> Vec<T> {
    (0..rows).flat_map(|r| &x[((b * rows + r) * heads + h0) * d..][..nh * d]).copied().collect()
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
    let attn = cli_attention(fa, a, a.causal, a.scale, heads)?;
    // The whole request is checked before anything about it is printed.
    let plan = plan::<T>(fa, &s, &attn, a)?;
    println!("device:  {}", fa.device_name());
    println!(
        "problem: batch {} seqlen_q {} seqlen_k {} heads_q {} heads_kv {} head_dim {} {} causal={}{}",
        s.batch,
        s.seqlen_q,
        s.seqlen_k,
        s.heads_q,
        s.heads_kv,
        s.head_dim,
        a.dtype,
        a.causal,
        window_label(&a.window).map_or(String::new(), |w| format!(" window={w}"))
            + &a.softcap.map_or(String::new(), |c| format!(" softcap={c}"))
            + if a.sinks { " sinks" } else { "" }
            + if a.alibi { " alibi" } else { "" }
    );
    println!("kernel:  {}", plan.fwd_name());
    if a.backward {
        let names = plan.bwd_names(" + ");
        println!("backward: {names}{}", if plan.saved { " (from the forward's saved O residual)" } else { "" });
    }

    let p = random_problem::<T>(&s, 0x5eed);
    let free_before = fa.memory_info()?.map(|(f, _)| f);
    let q = fa.upload(&p.q, &s.q_shape())?;
    let k = fa.upload(&p.k, &s.kv_shape())?;
    let v = fa.upload(&p.v, &s.kv_shape())?;
    let o_lo = if plan.saved { Some(fa.full(T::nan(), &s.q_shape())?) } else { None };
    let mut out = FwdOutput::from_buffers(fa.full(T::nan(), &s.q_shape())?, fa.full(f32::NAN, &s.lse_shape())?, o_lo);
    let iters = a.iters.unwrap_or(if emu { 1 } else { 20 });
    let warmup = if emu { 0 } else { 3 };
    let ms = fa.time_forward(&q, &k, &v, &attn, &plan.fwd_opts, &mut out, warmup, iters)?;
    let free_after = fa.memory_info()?.map(|(f, _)| f);
    let o_h = fa.download(out.o())?;
    let lse_h = fa.download(out.lse())?;
    let mut ok = check_forward(&p, &s, &attn, &o_h, &lse_h)?;

    let flops = s.window_fwd_flops(&attn);
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

    if a.backward {
        // dQ, dK, dV for a random dO from the timed forward's output (the last run's).
        let d_o_h: Vec<T> = random_tensor(0xd0, p.q.len());
        let d_o = fa.upload(&d_o_h, &s.q_shape())?;
        let mut grads = BwdOutput {
            dq: fa.full(T::nan(), &s.q_shape())?,
            dk: fa.full(T::nan(), &s.kv_shape())?,
            dv: fa.full(T::nan(), &s.kv_shape())?,
            dsinks: attn.sinks.as_ref().map(|_| fa.full(f32::NAN, &[s.heads_q])).transpose()?,
        };
        let bwd_ms = fa.time_backward(&q, &k, &v, &out, &d_o, &plan.bwd_opts, &mut grads, warmup, iters)?;
        let got = [fa.download(&grads.dq)?, fa.download(&grads.dk)?, fa.download(&grads.dv)?];
        ok &= check_backward(&p, &d_o_h, &s, &attn, &got)?;
        println!(
            "time:    {bwd_ms:.3} ms per backward ({iters} timed runs) = {:.2} TFLOP/s (2.5 forwards' FLOPs)",
            2.5 * flops / (bwd_ms * 1e-3) / 1e12
        );
        if a.fwdbwd {
            let step = fa.time_forward_backward(&q, &k, &v, &d_o, &attn, &plan.fwd_opts, &plan.bwd_opts, &mut grads, warmup, iters)?;
            println!(
                "time:    {step:.3} ms per forward + backward ({iters} timed runs) = {:.2} TFLOP/s (3.5 forwards' FLOPs)",
                3.5 * flops / (step * 1e-3) / 1e12
            );
        }
    }
    if emu {
        println!("note:    emulated on the CPU: the time says nothing about GPU speed.");
    }
    Ok(ok)
}

/// `attn` for the sub-problem of query heads `h0..h0 + n` of batch entry `b` (as batch entry
/// 0): those heads' sinks and ALiBi slopes, on the emulator (the references read their host
/// values).
fn sub_attention(attn: &Attention, b: usize, h0: usize, n: usize) -> flashattn::Result<Attention> {
    let emu = FlashAttn::emulator();
    let sinks = match attn.sinks.as_ref().and_then(|x| x.host_values()) {
        Some(v) => Some(emu.sinks(&v[h0..h0 + n])?),
        None => None,
    };
    let alibi = match &attn.alibi {
        Some(a) => Some(emu.alibi_slopes(&(h0..h0 + n).map(|h| a.slope(b, h)).collect::<Vec<_>>(), &[n])?),
        None => None,
    };
    Ok(Attention { sinks, alibi, ..attn.clone() })
}

/// Checks O and LSE on sampled rows (first, last, and a spread between) against the f64
/// reference, with the same bar as the tests: twice naive attention's error in this dtype
/// (for LSE, always f32, in f32), plus a unit roundoff ([`tolerance`]). Prints the result.
///
/// Naive attention's LSE error includes both the rounding of S to the dtype and its f32 sum of
/// every exponential in row order. At 131072 keys (one query, head_dim 128, emulator) that is
/// 1.9e-6 in bf16, 5.5e-7 in f16 and 1.4e-7 in f32 (the sum alone), so the LSE bar in bf16 is
/// about 4e-6, while a kernel's f32 scores and blockwise sums give about 5e-8 there: an LSE
/// above the bar (5.9e-6 on an H200 before alpha was exactly 1 while the max stays) is a
/// kernel error growing with the row, not a bar blind to the long f32 sum.
fn check_forward<T: Dtype>(p: &Problem<T>, s: &AttnShape, attn: &Attention, o_h: &[T], lse_h: &[f32]) -> flashattn::Result<bool> {
    let n_rows = s.batch * s.heads_q * s.seqlen_q;
    let mut rows: Vec<(usize, usize, usize)> = (0..16)
        .map(|i| i * (n_rows - 1) / 15)
        .map(|r| (r / (s.heads_q * s.seqlen_q), (r / s.seqlen_q) % s.heads_q, r % s.seqlen_q))
        .collect();
    rows.dedup();
    // Each row on its own (its query, the keys it sees): the references then need neither all
    // of K and V in f64 nor one core for every row.
    let checked: Vec<_> = match attn.alibi.is_some() {
        // ALiBi's bias needs the row's and keys' own positions: the references on the whole
        // problem, every sampled row in one call.
        true => reference_rows(&p.q, &p.k, &p.v, s, attn, &rows).into_iter().zip(naive_rows(&p.q, &p.k, &p.v, s, attn, &rows)).collect(),
        false => {
            let subs: Vec<Attention> = rows.iter().map(|&(b, h, _)| sub_attention(attn, b, h, 1)).collect::<flashattn::Result<_>>()?;
            let at: Vec<usize> = (0..rows.len()).collect();
            par_map(&at, "forward check (f64 reference and naive attention per sampled row)", |&x| {
                let (rp, rs) = row_problem(p, s, attn, rows[x]);
                let one = Attention { causal: false, window: Window::default(), ..subs[x].clone() };
                let exact = reference_rows(&rp.q, &rp.k, &rp.v, &rs, &one, &[(0, 0, 0)]).remove(0);
                let naive = naive_rows(&rp.q, &rp.k, &rp.v, &rs, &one, &[(0, 0, 0)]).remove(0);
                (exact, naive)
            })
        }
    };
    let d = s.head_dim;
    let (mut got_o, mut got_l, mut ref_o, mut ref_l, mut nv_o, mut nv_l) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    for ((b, h, i), ((eo, el), (no, nl))) in rows.iter().zip(checked) {
        let at = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
        got_o.extend(o_h[at..at + d].iter().map(|x| x.to_f64()));
        got_l.push(lse_h[(b * s.heads_q + h) * s.seqlen_q + i] as f64);
        ref_o.extend(eo);
        ref_l.push(el);
        nv_o.extend(no);
        nv_l.push(nl);
    }
    let unwritten = o_h.iter().filter(|x| x.to_f64().is_nan()).count() + lse_h.iter().filter(|x| x.is_nan()).count();
    let (err_o, err_l) = (rel_l2(&got_o, &ref_o), rel_l2(&got_l, &ref_l));
    let (tol_o, tol_l) = (tolerance::<T>(rel_l2(&nv_o, &ref_o)), lse_tolerance(rel_l2(&nv_l, &ref_l), &ref_l));
    let ok = unwritten == 0 && err_o <= tol_o && err_l <= tol_l;
    println!(
        "check:   {} sampled rows vs f64 reference: O rel err {err_o:.2e} (bar {tol_o:.2e}), LSE rel err {err_l:.2e} (bar {tol_l:.2e}); {} unwritten elements: {}",
        rows.len(),
        unwritten,
        if ok { "OK" } else { "FAILED" }
    );
    Ok(ok)
}

/// Checks dQ, dK, dV against the f64 gradients, on up to 4 (batch, KV head) slices spread over
/// the problem (all of them when there are at most 4): a slice's dK, dV and the dQ of its query
/// heads depend on nothing outside it. The bar is the tests': twice naive (autograd-style)
/// attention's error in this dtype plus a unit roundoff, plus the f32 recomputation of S and
/// dP that naive attention does not incur ([`backward_recompute_bound`]). Prints the result.
fn check_backward<T: Dtype>(p: &Problem<T>, d_o: &[T], s: &AttnShape, attn: &Attention, got: &[Vec<T>; 3]) -> flashattn::Result<bool> {
    let (d, group) = (s.head_dim, s.heads_q / s.heads_kv);
    let total = s.batch * s.heads_kv;
    let picks: Vec<usize> = if total <= 4 { (0..total).collect() } else { (0..4).map(|x| x * (total - 1) / 3).collect() };
    let sub = AttnShape { batch: 1, heads_q: group, heads_kv: 1, ..*s };
    let w = |x: &[T]| x.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    let subs: Vec<Attention> =
        picks.iter().map(|&bk| sub_attention(attn, bk / s.heads_kv, (bk % s.heads_kv) * group, group)).collect::<flashattn::Result<_>>()?;
    let slices = par_map(&picks, "backward check (f64 gradients and naive backward per slice)", |&bk| {
        let (b, hk) = (bk / s.heads_kv, bk % s.heads_kv);
        let attn = &subs[picks.iter().position(|&x| x == bk).unwrap_or(0)];
        let qs = |x: &[T]| heads_of(x, s.seqlen_q, s.heads_q, d, (b, hk * group, group));
        let ks = |x: &[T]| heads_of(x, s.seqlen_k, s.heads_kv, d, (b, hk, 1));
        let (q, k, v, d_o) = (qs(&p.q), ks(&p.k), ks(&p.v), qs(d_o));
        let (qf, kf, vf, dof) = (w(&q), w(&k), w(&v), w(&d_o));
        let exact = attention_backward_f64(&qf, &kf, &vf, &dof, &sub, attn);
        let naive = naive_backward(&q, &k, &v, &d_o, &sub, attn);
        let floor = backward_recompute_bound(&qf, &kf, &vf, &dof, &sub, attn);
        let mine = [w(&qs(&got[0])), w(&ks(&got[1])), w(&ks(&got[2]))];
        // The bar of a gradient that is exactly 0 (seqlen_k = 1: P = 1, dS = 0), as the tests
        // set it: 4 unit roundoffs of T times |scale| max_i |dO_i| |V| max(|K|, |Q|).
        let amax = |x: &[f64]| x.iter().fold(0f64, |m, e| m.max(e.abs()));
        let dov = dof.chunks(d).map(|r| r.iter().map(|x| x.abs()).sum::<f64>()).fold(0f64, f64::max) * amax(&vf);
        let zero_bar = 4.0 * T::UNIT_ROUNDOFF * (attn.scale(d) as f64).abs() * dov * amax(&kf).max(amax(&qf));
        ([mine, [exact.dq, exact.dk, exact.dv], [naive.dq, naive.dk, naive.dv], [floor.dq, floor.dk, floor.dv]], zero_bar)
    });
    let l2 = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
    let mut ok = true;
    let mut report = vec![];
    for (g, name) in ["dQ", "dK", "dV"].into_iter().enumerate() {
        // Over the slices: the kernel's, the exact, naive attention's, the recomputation bound.
        let cat = |which: usize| slices.iter().flat_map(|x| x.0[which][g].iter().copied()).collect::<Vec<f64>>();
        let (mine, exact, naive, floor) = (cat(0), cat(1), cat(2), cat(3));
        let (err, bar) = if exact.iter().all(|&x| x == 0.0) {
            let worst = mine.iter().fold(0f64, |m, x| if x.is_nan() { f64::NAN } else { m.max(x.abs()) });
            (worst, slices.iter().map(|x| x.1).fold(0f64, f64::max))
        } else {
            (rel_l2(&mine, &exact), tolerance::<T>(rel_l2(&naive, &exact)) + l2(&floor) / l2(&exact))
        };
        ok &= err <= bar;
        let kind = if exact.iter().all(|&x| x == 0.0) { "max abs (exactly 0)" } else { "rel err" };
        report.push(format!("{name} {kind} {err:.2e} (bar {bar:.2e})"));
    }
    let unwritten: usize = got.iter().map(|t| t.iter().filter(|x| x.to_f64().is_nan()).count()).sum();
    ok &= unwritten == 0;
    println!(
        "check:   backward on {} of {total} (batch, KV head) slices vs f64 gradients: {}; {unwritten} unwritten elements: {}",
        picks.len(),
        report.join(", "),
        if ok { "OK" } else { "FAILED" }
    );
    Ok(ok)
}

/// The window as `LEFT,RIGHT` (-1: unbounded), `None` without one.
fn window_label(w: &Window) -> Option<String> {
    let side = |x: Option<u32>| x.map_or("-1".to_string(), |n| n.to_string());
    (!w.is_none()).then(|| format!("{},{}", side(w.left), side(w.right)))
}

/// The attention the command line asks for, with `heads` query heads: its window and
/// softcap; `--sinks`: a logit per head in [-1, 1] (h * 0.37 folded into it); `--alibi`: the
/// paper's slopes.
fn cli_attention(fa: &FlashAttn, a: &Args, causal: bool, softmax_scale: Option<f32>, heads: usize) -> flashattn::Result<Attention> {
    let sinks = match a.sinks {
        true => Some(fa.sinks(&(0..heads).map(|h| ((h as f32 * 0.37) % 2.0) - 1.0).collect::<Vec<_>>())?),
        false => None,
    };
    let alibi = match a.alibi {
        true => Some(fa.alibi_slopes(&flashattn::alibi_paper_slopes(heads), &[heads])?),
        false => None,
    };
    Ok(Attention { causal, softmax_scale, window: a.window, softcap: a.softcap, sinks, alibi })
}

fn upload_problem<T: Dtype>(fa: &FlashAttn, s: &AttnShape) -> flashattn::Result<(Tensor<T>, Tensor<T>, Tensor<T>)> {
    let p = random_problem::<T>(s, 0xbe_7c4);
    Ok((fa.upload(&p.q, &s.q_shape())?, fa.upload(&p.k, &s.kv_shape())?, fa.upload(&p.v, &s.kv_shape())?))
}

fn bench<T: Dtype>(fa: &FlashAttn, a: &Args) -> flashattn::Result<bool> {
    if a.decode {
        return bench_decode::<T>(fa, a);
    }
    if let Some(mean) = a.varlen {
        return bench_varlen::<T>(fa, a, mean);
    }
    let causals: &[bool] = match a.causal_mode.as_str() {
        "on" => &[true],
        "off" => &[false],
        _ => &[false, true],
    };
    // The FA paper's settings on a GPU; on the emulator (minutes per FA shape) one small one.
    let emu = fa.is_emulator();
    let seqlens = a.seqlens.clone().unwrap_or_else(|| if emu { vec![128] } else { vec![512, 1024, 2048, 4096, 8192, 16384] });
    let hidden = a.hidden.unwrap_or(if emu { 128 } else { 2048 });
    let tokens = a.tokens.unwrap_or(if emu { 128 } else { 16384 });
    // Every shape, and its kernels, checked before anything is printed or launched.
    let mut cases = vec![];
    for &d in &a.head_dims {
        for &seqlen in &seqlens {
            for &causal in causals {
                let heads = (hidden / d.max(1)).max(1);
                let s = AttnShape {
                    batch: (tokens / seqlen.max(1)).max(1),
                    seqlen_q: seqlen,
                    seqlen_k: seqlen,
                    heads_q: heads,
                    heads_kv: heads,
                    head_dim: d,
                };
                let attn = cli_attention(fa, a, causal, None, heads)?;
                let plan = plan::<T>(fa, &s, &attn, a)?;
                cases.push((s, attn, plan));
            }
        }
    }
    if !a.json {
        println!("device: {}", fa.device_name());
        println!(
            "{:<28} {:>5} {:>4} {:>6} {:>6} {:>4} {:>7} {:>10} {:>10} {:>9}",
            "kernel", "dtype", "d", "seqlen", "batch", "h", "causal", "window", "ms", "TFLOP/s"
        );
    }
    for (s, attn, plan) in cases {
        let (d, seqlen, heads, causal) = (s.head_dim, s.seqlen_q, s.heads_q, attn.causal);
        // FLOPs of the forward: the paper's count, or under a window the visible pairs'.
        let fwd_flops = s.window_fwd_flops(&attn);
        let iters = a.iters.unwrap_or(10);
        let (q, k, v) = upload_problem::<T>(fa, &s)?;
        let (family, name, ms, flops) = if a.backward {
            // The forward's O and LSE (automatic kernel), a random dO; then dQ, dK, dV
            // timed with the requested backward family. FLOPs: 2.5x the forward's.
            let out = fa.forward(&q, &k, &v, &attn, &plan.fwd_opts)?;
            let d_o = fa.upload(&random_tensor::<T>(0xd0, q.len()), &s.q_shape())?;
            let mut grads = BwdOutput {
                dq: fa.full(T::nan(), &s.q_shape())?,
                dk: fa.full(T::nan(), &s.kv_shape())?,
                dv: fa.full(T::nan(), &s.kv_shape())?,
                dsinks: attn.sinks.as_ref().map(|_| fa.full(f32::NAN, &[s.heads_q])).transpose()?,
            };
            let names = plan.bwd_names("+");
            let family = plan.bwd[plan.bwd.len() - 1].family.name().to_string();
            if a.fwdbwd {
                // With --fwdbwd the forward too, each step (FLOPs 1 + 2.5 forwards).
                let ms = fa.time_forward_backward(&q, &k, &v, &d_o, &attn, &plan.fwd_opts, &plan.bwd_opts, &mut grads, 2, iters)?;
                (family, format!("{}+{names}", plan.fwd_name()), ms, 3.5 * fwd_flops)
            } else {
                let ms = fa.time_backward(&q, &k, &v, &out, &d_o, &plan.bwd_opts, &mut grads, 2, iters)?;
                (family, names, ms, 2.5 * fwd_flops)
            }
        } else {
            let mut out = FwdOutput::from_buffers(fa.full(T::nan(), &s.q_shape())?, fa.full(f32::NAN, &s.lse_shape())?, None);
            let ms = fa.time_forward(&q, &k, &v, &attn, &plan.fwd_opts, &mut out, 2, iters)?;
            (plan.fwd.family.name().to_string(), plan.fwd_name().to_string(), ms, fwd_flops)
        };
        let tflops = flops / (ms * 1e-3) / 1e12;
        let pass = match (a.fwdbwd, a.backward) {
            (true, _) => "fwdbwd",
            (_, true) => "bwd",
            _ => "fwd",
        };
        let window = window_label(&attn.window);
        if a.json {
            let w = window.as_ref().map_or("null".to_string(), |w| format!("\"{w}\""));
            println!(
                "{{\"impl\":\"flashattn-rs/{family}\",\"pass\":\"{pass}\",\"kernel\":\"{name}\",\"dtype\":\"{}\",\"head_dim\":{d},\"seqlen\":{seqlen},\"batch\":{},\"heads\":{heads},\"causal\":{causal},\"window\":{w},\"ms\":{ms:.5},\"tflops\":{tflops:.3}}}",
                a.dtype, s.batch
            );
        } else {
            let w = window.unwrap_or_else(|| "-".into());
            println!("{name:<28} {:>5} {d:>4} {seqlen:>6} {:>6} {heads:>4} {causal:>7} {w:>10} {ms:>10.3} {tflops:>9.2}", a.dtype, s.batch);
        }
    }
    Ok(true)
}

/// Sequence lengths of a variable-length batch of `tokens` tokens: uniform in 1..=2 mean - 1
/// (the last cut to fit), from a fixed seed.
fn varlen_lengths(tokens: usize, mean: usize) -> Vec<usize> {
    let mut rng = flashattn::rng::Rng::new(0x7a11e9);
    let (mut lens, mut total) = (vec![], 0);
    while total < tokens {
        let l = (1 + rng.next_u64() % (2 * mean as u64 - 1)) as usize;
        lens.push(l.min(tokens - total));
        total += lens[lens.len() - 1];
    }
    lens
}

/// `bench --varlen MEAN`: per head_dim and mask, a variable-length batch of random lengths of
/// mean MEAN (self-attention: keys as queries) and the fixed-length batch of MEAN, each
/// forward (or with --backward backward) timed; TFLOP/s count the pairs each sequence
/// computes (4 d per pair and head, x2.5 backward), the ratio is varlen over fixed.
fn bench_varlen<T: Dtype>(fa: &FlashAttn, a: &Args, mean: usize) -> flashattn::Result<bool> {
    let causals: &[bool] = match a.causal_mode.as_str() {
        "on" => &[true],
        "off" => &[false],
        _ => &[false, true],
    };
    let hidden = a.hidden.unwrap_or(if fa.is_emulator() { 128 } else { 2048 });
    let tokens = a.tokens.unwrap_or(if fa.is_emulator() { 256 } else { 16384 });
    let lens = varlen_lengths(tokens, mean);
    let mut cu = vec![0u32];
    for &l in &lens {
        cu.push(cu[cu.len() - 1] + l as u32);
    }
    let seqs = fa.seqlens(&cu, &cu, None)?;
    let iters = a.iters.unwrap_or(10);
    if !a.json {
        println!(
            "device: {}; {} sequences, {tokens} tokens, lengths {}..={} (mean {mean})",
            fa.device_name(),
            lens.len(),
            lens.iter().min().unwrap_or(&0),
            lens.iter().max().unwrap_or(&0)
        );
        println!(
            "{:<8} {:>5} {:>4} {:>7} {:>10} {:>10} {:>10} {:>10} {:>6}",
            "pass", "dtype", "d", "causal", "varlen ms", "TFLOP/s", "fixed ms", "TFLOP/s", "ratio"
        );
    }
    for &d in &a.head_dims {
        for &causal in causals {
            let heads = (hidden / d.max(1)).max(1);
            let attn = cli_attention(fa, a, causal, None, heads)?;
            // Fixed length: the batch of MEAN (timed as `bench` times it).
            let fixed =
                AttnShape { batch: (tokens / mean).max(1), seqlen_q: mean, seqlen_k: mean, heads_q: heads, heads_kv: heads, head_dim: d };
            let plan = plan::<T>(fa, &fixed, &attn, a)?;
            let (q, k, v) = upload_problem::<T>(fa, &fixed)?;
            // Varlen: packed [tokens, heads, d].
            let packed = [tokens, heads, d];
            let (vq, vk, vv) = (
                fa.upload(&random_tensor::<T>(0x71, tokens * heads * d), &packed)?,
                fa.upload(&random_tensor::<T>(0x72, tokens * heads * d), &packed)?,
                fa.upload(&random_tensor::<T>(0x73, tokens * heads * d), &packed)?,
            );
            let pairs: f64 = lens
                .iter()
                .map(|&l| AttnShape { batch: 1, seqlen_q: l, seqlen_k: l, heads_q: 1, heads_kv: 1, head_dim: d }.visible_pairs(&attn))
                .sum();
            let fixed_pairs = fixed.batch as f64 * fixed.visible_pairs(&attn);
            let per_pair = 4.0 * heads as f64 * d as f64 * if a.backward { 2.5 } else { 1.0 };
            let (ms_v, ms_f) = if a.backward {
                let d_o = fa.upload(&random_tensor::<T>(0xd0, q.len()), &fixed.q_shape())?;
                let out = fa.forward(&q, &k, &v, &attn, &plan.fwd_opts)?;
                let mut g = BwdOutput {
                    dq: fa.full(T::nan(), &fixed.q_shape())?,
                    dk: fa.full(T::nan(), &fixed.kv_shape())?,
                    dv: fa.full(T::nan(), &fixed.kv_shape())?,
                    dsinks: attn.sinks.as_ref().map(|_| fa.full(f32::NAN, &[fixed.heads_q])).transpose()?,
                };
                let ms_f = fa.time_backward(&q, &k, &v, &out, &d_o, &plan.bwd_opts, &mut g, 2, iters)?;
                let vd_o = fa.upload(&random_tensor::<T>(0xd1, tokens * heads * d), &packed)?;
                let vout = fa.forward_varlen(&vq, &vk, &vv, &seqs, &attn, &plan.fwd_opts)?;
                let mut vg = BwdOutput {
                    dq: fa.full(T::nan(), &packed)?,
                    dk: fa.full(T::nan(), &packed)?,
                    dv: fa.full(T::nan(), &packed)?,
                    dsinks: attn.sinks.as_ref().map(|_| fa.full(f32::NAN, &[heads])).transpose()?,
                };
                (fa.time_backward(&vq, &vk, &vv, &vout, &vd_o, &plan.bwd_opts, &mut vg, 2, iters)?, ms_f)
            } else {
                let mut out = FwdOutput::from_buffers(fa.full(T::nan(), &fixed.q_shape())?, fa.full(f32::NAN, &fixed.lse_shape())?, None);
                let ms_f = fa.time_forward(&q, &k, &v, &attn, &plan.fwd_opts, &mut out, 2, iters)?;
                let mut vout = FwdOutput::from_buffers(fa.full(T::nan(), &packed)?, fa.full(f32::NAN, &[heads, tokens])?, None);
                (fa.time_forward_varlen(&vq, &vk, &vv, &seqs, &attn, &plan.fwd_opts, &mut vout, 2, iters)?, ms_f)
            };
            let tf_v = pairs * per_pair / (ms_v * 1e-3) / 1e12;
            let tf_f = fixed_pairs * per_pair / (ms_f * 1e-3) / 1e12;
            let pass = if a.backward { "bwd" } else { "fwd" };
            if a.json {
                println!(
                    "{{\"impl\":\"flashattn-rs\",\"pass\":\"{pass}\",\"dtype\":\"{}\",\"head_dim\":{d},\"heads\":{heads},\"causal\":{causal},\"tokens\":{tokens},\"mean\":{mean},\"sequences\":{},\"lengths\":{:?},\"varlen_ms\":{ms_v:.5},\"varlen_tflops\":{tf_v:.3},\"fixed_ms\":{ms_f:.5},\"fixed_tflops\":{tf_f:.3},\"ratio\":{:.3}}}",
                    a.dtype,
                    lens.len(),
                    lens,
                    tf_v / tf_f
                );
            } else {
                println!(
                    "{pass:<8} {:>5} {d:>4} {causal:>7} {ms_v:>10.3} {tf_v:>10.2} {ms_f:>10.3} {tf_f:>10.2} {:>6.3}",
                    a.dtype,
                    tf_v / tf_f
                );
            }
        }
    }
    Ok(true)
}

/// `bench --decode`: per cache length, attention of `--seqlen` new rows per sequence against a
/// KV cache holding that many keys after appending theirs (`FlashAttn::forward_kvcache`),
/// causal unless `--causal off`; effective bandwidth counts the K and V bytes each sequence
/// holds once (what a decode step must read), over the whole call (append included).
fn bench_decode<T: Dtype>(fa: &FlashAttn, a: &Args) -> flashattn::Result<bool> {
    let emu = fa.is_emulator();
    let batch = a.batch.unwrap_or(if emu { 2 } else { 8 });
    let heads = a.heads.unwrap_or(if emu { 4 } else { 32 });
    let heads_kv = a.heads_kv.unwrap_or(if emu { 2 } else { 8 });
    let rows = a.seqlen.unwrap_or(1);
    let lengths = a.seqlens.clone().unwrap_or(if emu { vec![64, 256] } else { vec![8192, 32768, 131072] });
    let head_dims: Vec<usize> = if a.head_dims == [64, 128] { vec![if emu { 64 } else { 128 }] } else { a.head_dims.clone() };
    let causal = a.causal_mode != "off";
    let iters = a.iters.unwrap_or(if emu { 2 } else { 20 });
    if let Some(&keys) = lengths.iter().find(|&&keys| keys < rows) {
        return Err(Error::TooLarge { what: "--seqlen (new rows per sequence, at most the keys held)", value: rows, max: keys });
    }
    if !a.json {
        println!(
            "device: {}; decode: batch {batch}, {heads} query heads on {heads_kv} KV heads, {rows} new rows per sequence",
            fa.device_name()
        );
        println!("{:>5} {:>4} {:>8} {:>6} {:>10} {:>8}", "dtype", "d", "keys", "causal", "us", "TB/s");
    }
    for &d in &head_dims {
        let attn = cli_attention(fa, a, causal, None, heads)?;
        for &keys in &lengths {
            let cache = [batch, keys, heads_kv, d];
            let (mut k_cache, mut v_cache) = (
                fa.upload(&random_tensor::<T>(0xc1, batch * keys * heads_kv * d), &cache)?,
                fa.upload(&random_tensor::<T>(0xc2, batch * keys * heads_kv * d), &cache)?,
            );
            let new = [batch, rows, heads_kv, d];
            let (k_new, v_new) = (
                fa.upload(&random_tensor::<T>(0xc3, batch * rows * heads_kv * d), &new)?,
                fa.upload(&random_tensor::<T>(0xc4, batch * rows * heads_kv * d), &new)?,
            );
            let q = fa.upload(&random_tensor::<T>(0xc5, batch * rows * heads * d), &[batch, rows, heads, d])?;
            let lens = fa.upload_u32(&vec![(keys - rows) as u32; batch])?;
            let mut out =
                FwdOutput::from_buffers(fa.full(T::nan(), &[batch * rows, heads, d])?, fa.full(f32::NAN, &[heads, batch * rows])?, None);
            let opts = FwdOptions { kernel: a.kernel, splits: a.splits, no_gqa_packing: a.no_gqa_packing, ..Default::default() };
            let ms =
                fa.time_forward_kvcache(&q, &mut k_cache, &mut v_cache, &lens, Some((&k_new, &v_new)), &attn, &opts, &mut out, 3, iters)?;
            let bytes = 2.0 * (batch * keys * heads_kv * d * std::mem::size_of::<T>()) as f64;
            let tbs = bytes / (ms * 1e-3) / 1e12;
            if a.json {
                println!(
                    "{{\"impl\":\"flashattn-rs\",\"pass\":\"decode\",\"dtype\":\"{}\",\"batch\":{batch},\"heads\":{heads},\"heads_kv\":{heads_kv},\"head_dim\":{d},\"keys\":{keys},\"rows\":{rows},\"splits\":{},\"gqa_packing\":{},\"causal\":{causal},\"us\":{:.2},\"tbs\":{tbs:.3}}}",
                    a.dtype,
                    a.splits.unwrap_or(1),
                    !a.no_gqa_packing,
                    ms * 1e3
                );
            } else {
                println!("{:>5} {d:>4} {keys:>8} {causal:>6} {:>10.1} {tbs:>8.3}", a.dtype, ms * 1e3);
            }
        }
    }
    Ok(true)
}
