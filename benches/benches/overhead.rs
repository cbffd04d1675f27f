//! What a call costs beyond its kernels: the same attention through each way in, timed the
//! same way (wall clock over back-to-back calls, then one synchronisation; every way in turn
//! each round, the median round of each), with the device allocations each call makes.
//!
//! - `direct`: contiguous tensors of this crate, `forward_into` / `backward_into` (the
//!   backward allocates its workspace each call).
//! - `views`: the same tensors as views, outputs and the backward's workspace the caller's
//!   (`forward_into_views` / `backward_into_views`): no allocation.
//! - `packed`: Q, K, V strided views into one packed `[b, s, 3, h, d]` projection
//!   (`unbind`), dO, O, LSE, the gradients and the workspace the caller's.
//! - `alloc` (forward): `forward`, O and LSE in new allocations each call.
//! - `candle`, `candle_packed` (with `--features cuda`): the candle op on contiguous and on
//!   packed-projection (narrowed) candle tensors; O is a new candle tensor each call.
//!   `candle_no_events`: contiguous, on a candle device with cudarc's event tracking off.
//!
//! `FLASHATTN_BENCH_KEEP_POOL=1` keeps freed device memory in the driver's pool across
//! synchronisations (without it the allocating ways map fresh memory after each one).
//!
//! One JSON row per line (`us`: microseconds per call; `tflops`: FA-paper FLOPs / time).
//! Without a GPU it says so and runs one tiny shape on the emulator (no meaningful times).
//!
//!     cargo bench -p flashattn-benches --bench overhead [--features cuda]

use flashattn::{
    AsView, Attention, AttnShape, BwdBuffers, BwdInputs, BwdOptions, BwdOutput, FlashAttn, Forward, FwdBuffers, FwdOptions, FwdOutput,
    Tensor, View,
};
use half::bf16;
use std::time::Instant;

/// Microseconds per call of one batch: wall clock of `n` back-to-back calls and one
/// synchronisation, / n.
fn batch(n: usize, sync: &dyn Fn(), call: &mut dyn FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        call();
    }
    sync();
    start.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// One way in: its pass and name, and a call that owns everything it touches.
struct Way<'a> {
    pass: &'static str,
    name: &'static str,
    call: Box<dyn FnMut() + 'a>,
    /// Whether its allocations are flashattn's (counted) or candle's.
    ours: bool,
}

struct Row<'a> {
    pass: &'a str,
    way: &'a str,
    shape: AttnShape,
    causal: bool,
    us: f64,
    /// Device allocations per call made by flashattn (None: not counted, candle's).
    allocs: Option<u64>,
}

impl Row<'_> {
    fn print(&self) {
        let s = &self.shape;
        let flops = s.fwd_flops(self.causal) * if self.pass == "backward" { 2.5 } else { 1.0 };
        let allocs = self.allocs.map_or("null".to_string(), |a| a.to_string());
        println!(
            "{{\"pass\": \"{}\", \"way\": \"{}\", \"batch\": {}, \"seqlen\": {}, \"heads\": {}, \"head_dim\": {}, \"causal\": {}, \"dtype\": \"bf16\", \"us\": {:.2}, \"tflops\": {:.1}, \"allocs_per_call\": {allocs}}}",
            self.pass,
            self.way,
            s.batch,
            s.seqlen_q,
            s.heads_q,
            s.head_dim,
            self.causal,
            self.us,
            flops / self.us * 1e-6,
        );
    }
}

/// The caller's outputs and workspace.
struct Bufs {
    o: Tensor<bf16>,
    lse: Tensor<f32>,
    dq: Tensor<bf16>,
    dk: Tensor<bf16>,
    dv: Tensor<bf16>,
    ws: Tensor<f32>,
}

fn fwd_views(fa: &FlashAttn, qkv: [&View<bf16>; 3], attn: &Attention, bufs: &mut Bufs) -> Forward {
    let mut out = FwdBuffers { o: bufs.o.view_mut(), lse: bufs.lse.view_mut(), o_lo: None };
    fa.forward_into_views(qkv[0], qkv[1], qkv[2], attn, &FwdOptions::default(), &mut out).unwrap_or_else(|e| panic!("forward: {e}"))
}

fn bwd_views(fa: &FlashAttn, rec: &Forward, qkv: [&View<bf16>; 3], d_o: &View<bf16>, bufs: &mut Bufs) {
    let Bufs { o, lse, dq, dk, dv, ws } = bufs;
    let [q, k, v] = qkv.map(|t| t.as_view());
    let inputs = BwdInputs { q, k, v, o: o.view(), lse: lse.view(), o_lo: None, d_o: d_o.as_view() };
    let mut out = BwdBuffers { dq: dq.view_mut(), dk: dk.view_mut(), dv: dv.view_mut(), workspace: ws.view_mut(), dsinks: None };
    fa.backward_into_views(rec, &inputs, &mut out, &BwdOptions::default()).unwrap_or_else(|e| panic!("backward: {e}"))
}

/// `FLASHATTN_BENCH_KEEP_POOL=1`: device 0's default memory pool (where cudarc's
/// stream-ordered allocations come from) keeps freed memory across synchronisations
/// (release threshold: unbounded, as a caching allocator does) instead of returning it to the
/// driver at each one, so that the allocating ways reuse mapped memory in every batch.
fn keep_pool() -> Result<(), Box<dyn std::error::Error>> {
    use flashattn::cudarc::driver::sys;
    let mut pool = std::ptr::null_mut();
    let mut keep = u64::MAX;
    // SAFETY: device 0 exists (the bench runs on it); the attribute takes a u64.
    let r = unsafe {
        match sys::cuDeviceGetDefaultMemPool(&mut pool, 0) {
            sys::CUresult::CUDA_SUCCESS => sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep as *mut u64).cast(),
            ),
            e => e,
        }
    };
    match r {
        sys::CUresult::CUDA_SUCCESS => {
            eprintln!("device 0's default memory pool: release threshold unbounded");
            Ok(())
        }
        e => Err(format!("setting the default memory pool's release threshold: {e:?}").into()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (fa, why) = FlashAttn::cuda_or_emulator();
    let (seqlens, (rounds, n, warm)) = match &why {
        Some(e) => {
            eprintln!("\n*** No GPU ({e}): one tiny shape on the CPU emulator; these times say nothing about GPU overhead. ***\n");
            (vec![32], (1, 1, 0))
        }
        None => (vec![512, 1024], (9, 40, 10)),
    };
    if why.is_none() && std::env::var("FLASHATTN_BENCH_KEEP_POOL").is_ok_and(|v| v == "1") {
        keep_pool()?;
    }
    #[cfg(feature = "cuda")]
    let candle_dev = if why.is_none() { Some(candle_core::Device::new_cuda(0)?) } else { None };
    let sync = || {
        fa.synchronize().unwrap_or_else(|e| panic!("synchronize: {e}"));
        #[cfg(feature = "cuda")]
        if let Some(dev) = &candle_dev {
            dev.synchronize().unwrap_or_else(|e| panic!("synchronize: {e}"));
        }
    };
    for &s in &seqlens {
        for causal in [false, true] {
            let (b, h, d) = if why.is_some() { (1, 2, 64) } else { (16384 / s, 16, 128) };
            let shape = AttnShape { batch: b, seqlen_q: s, seqlen_k: s, heads_q: h, heads_kv: h, head_dim: d };
            let attn = Attention { causal, ..Default::default() };
            #[allow(unused_mut)]
            let mut ways = our_ways(&fa, &shape, &attn)?;
            #[cfg(feature = "cuda")]
            if let Some(dev) = &candle_dev {
                ways.extend(candle::ways(dev, &shape, causal)?);
            }
            // Warm up each way, then time them in turn, round after round, so that clock
            // drift falls on every way alike; the median round of each.
            for w in ways.iter_mut() {
                for _ in 0..warm {
                    (w.call)();
                }
            }
            sync();
            let mut times = vec![Vec::new(); ways.len()];
            for _ in 0..rounds {
                for (w, t) in ways.iter_mut().zip(&mut times) {
                    t.push(batch(n, &sync, &mut w.call));
                }
            }
            for (w, mut t) in ways.iter_mut().zip(times) {
                t.sort_by(f64::total_cmp);
                let allocs = w.ours.then(|| {
                    let before = fa.device_allocations();
                    (w.call)();
                    fa.device_allocations() - before
                });
                Row { pass: w.pass, way: w.name, shape, causal, us: t[t.len() / 2], allocs }.print();
            }
            sync();
        }
    }
    #[cfg(not(feature = "cuda"))]
    eprintln!("\n*** built without the `cuda` feature: the candle op is not timed. ***\n");
    Ok(())
}

/// This crate's ways in at `shape`: direct, views, packed (forward and backward each).
fn our_ways<'a>(fa: &'a FlashAttn, shape: &AttnShape, attn: &'a Attention) -> Result<Vec<Way<'a>>, Box<dyn std::error::Error>> {
    let (b, s, h, d) = (shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
    let n_el = b * s * h * d;
    let qs = shape.q_shape();
    let random = |seed, len, shape: &[usize]| fa.upload(&flashattn::rng::normal_tensor::<bf16>(seed, len), shape);
    let nan = |shape: &[usize]| fa.full(bf16::NAN, shape);
    let (fopts, bopts) = (FwdOptions::default(), BwdOptions::default());
    let mut ways = Vec::new();

    // direct: contiguous tensors of this crate; the backward allocates its workspace.
    let (q, k, v, d_o) = (random(1, n_el, &qs)?, random(2, n_el, &qs)?, random(3, n_el, &qs)?, random(4, n_el, &qs)?);
    let mut out = FwdOutput::from_buffers(nan(&qs)?, fa.full(f32::NAN, &shape.lse_shape())?, None);
    fa.forward_into(&q, &k, &v, attn, &fopts, &mut out)?;
    let record = out.record().cloned().ok_or("no forward record")?;
    let ws_len = fa.backward_workspace_len::<bf16>(&record, &bopts)?;
    let (q2, k2, v2) = (random(1, n_el, &qs)?, random(2, n_el, &qs)?, random(3, n_el, &qs)?);
    let mut out2 = FwdOutput::from_buffers(nan(&qs)?, fa.full(f32::NAN, &shape.lse_shape())?, None);
    ways.push(Way {
        pass: "forward",
        name: "direct",
        call: Box::new(move || fa.forward_into(&q2, &k2, &v2, attn, &fopts, &mut out2).unwrap_or_else(|e| panic!("forward: {e}"))),
        ours: true,
    });
    // alloc: the same call with O and LSE in new allocations each call (as the candle op's).
    let (q3, k3, v3) = (random(1, n_el, &qs)?, random(2, n_el, &qs)?, random(3, n_el, &qs)?);
    ways.push(Way {
        pass: "forward",
        name: "alloc",
        call: Box::new(move || drop(fa.forward(&q3, &k3, &v3, attn, &fopts).unwrap_or_else(|e| panic!("forward: {e}")))),
        ours: true,
    });
    let mut grads = BwdOutput { dq: nan(&qs)?, dk: nan(&qs)?, dv: nan(&qs)?, dsinks: None };
    ways.push(Way {
        pass: "backward",
        name: "direct",
        call: Box::new(move || fa.backward_into(&q, &k, &v, &out, &d_o, &bopts, &mut grads).unwrap_or_else(|e| panic!("backward: {e}"))),
        ours: true,
    });

    // views: Q, K, V as views of separate tensors, or unbound from one packed
    // [b, s, 3, h, d] projection; outputs and the workspace the caller's.
    for (name, packed) in [("views", false), ("packed", true)] {
        let bufs = || -> Result<Bufs, flashattn::Error> {
            Ok(Bufs {
                o: nan(&qs)?,
                lse: fa.full(f32::NAN, &shape.lse_shape())?,
                dq: nan(&qs)?,
                dk: nan(&qs)?,
                dv: nan(&qs)?,
                ws: fa.full(f32::NAN, &[ws_len])?,
            })
        };
        let inputs = std::sync::Arc::new(match packed {
            true => Inputs::Packed(random(5, 3 * n_el, &[b, s, 3, h, d])?),
            false => Inputs::Separate([random(1, n_el, &qs)?, random(2, n_el, &qs)?, random(3, n_el, &qs)?]),
        });
        let (mut fb, mut bb) = (bufs()?, bufs()?);
        let rec = inputs.with(|qkv| fwd_views(fa, qkv, attn, &mut bb));
        let (fi, bi, dov) = (inputs.clone(), inputs, random(4, n_el, &qs)?);
        ways.push(Way {
            pass: "forward",
            name,
            call: Box::new(move || drop(fi.with(|qkv| fwd_views(fa, qkv, attn, &mut fb)))),
            ours: true,
        });
        ways.push(Way {
            pass: "backward",
            name,
            call: Box::new(move || bi.with(|qkv| bwd_views(fa, &rec, qkv, &dov.view(), &mut bb))),
            ours: true,
        });
    }
    Ok(ways)
}

/// Q, K, V: three tensors, or one packed projection `[b, s, 3, h, d]`.
enum Inputs {
    Separate([Tensor<bf16>; 3]),
    Packed(Tensor<bf16>),
}

impl Inputs {
    /// `f` on the views of Q, K and V.
    fn with<R>(&self, f: impl FnOnce([&View<bf16>; 3]) -> R) -> R {
        match self {
            Inputs::Separate([q, k, v]) => f([&q.view(), &k.view(), &v.view()]),
            Inputs::Packed(qkv) => {
                let [q, k, v] = qkv.view().unbind::<3>(2).unwrap_or_else(|e| panic!("unbind: {e}"));
                f([&q, &k, &v])
            }
        }
    }
}

#[cfg(feature = "cuda")]
mod candle {
    use super::Way;
    use candle_core::{DType, Device, Tensor};

    /// The candle op's forward on contiguous and on packed-projection (narrowed) tensors.
    pub fn ways(dev: &Device, shape: &flashattn::AttnShape, causal: bool) -> candle_core::Result<Vec<Way<'static>>> {
        let (b, s, h, d) = (shape.batch, shape.seqlen_q, shape.heads_q, shape.head_dim);
        let qkv = Tensor::randn(0f32, 1.0, (b, s, 3, h, d), dev)?.to_dtype(DType::BF16)?;
        let part = |i: usize| qkv.narrow(2, i, 1)?.squeeze(2);
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let (qc, kc, vc) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        let scale = 1.0 / (d as f32).sqrt();
        let way = |name, [q, k, v]: [Tensor; 3]| Way {
            pass: "forward",
            name,
            call: Box::new(move || {
                drop(flashattn_candle::flash_attn(&q, &k, &v, scale, causal).unwrap_or_else(|e| panic!("candle op: {e}")))
            }),
            ours: false,
        };
        let mut ways = vec![way("candle", [qc, kc, vc]), way("candle_packed", [q, k, v])];
        // The same on a second candle device whose slices carry no cudarc stream events
        // (candle's own stream makes cudarc record and wait on an event per tensor a call
        // touches): what that bookkeeping costs a call.
        let quiet = Device::new_cuda(0)?;
        if let Device::Cuda(c) = &quiet {
            // SAFETY: only this device's own stream touches the tensors made on it below.
            unsafe { c.disable_event_tracking() };
        }
        let qkv = Tensor::randn(0f32, 1.0, (b, s, 3, h, d), &quiet)?.to_dtype(DType::BF16)?;
        let part = |i: usize| qkv.narrow(2, i, 1)?.squeeze(2)?.contiguous();
        ways.push(way("candle_no_events", [part(0)?, part(1)?, part(2)?]));
        Ok(ways)
    }
}
