//! Variable-length batches against the f64 reference: each sequence of a packed batch is
//! checked as a batch of one of its own lengths (`check_outputs`, `check_grads`: the same
//! bars, fully masked rows, unwritten elements), with the outputs poisoned before the launch.

use crate::{
    AlibiDraw, Case, Dt, GradRefs, Rng, alibi_strategy, check_grads_against, check_outputs, ftz_slack, scale_strategy, softcap_strategy,
    window_strategy, within,
};
use flashattn::reference::rel_l2;
use flashattn::{AttnShape, BwdOptions, BwdOutput, Dtype, FlashAttn, FwdOptions, FwdOutput, SeqLenDims, SeqLens, Window};
use proptest::prelude::*;
use std::fmt;

/// One variable-length check: the sequences' lengths (queries, keys), the heads, the options.
#[derive(Clone, Debug)]
pub struct VarCase {
    pub lens_q: Vec<usize>,
    pub lens_k: Vec<usize>,
    /// `seqused_k`: the keys each sequence uses from the start of its slot (`lens_k`).
    pub used_k: Option<Vec<usize>>,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub softmax_scale: Option<f32>,
    pub window: Window,
    pub softcap: Option<f32>,
    /// Attention sinks (logits from the seed, `Case::sink_values`).
    pub sinks: bool,
    /// ALiBi (slopes from the seed, `Case::alibi_values`; per sequence or per head).
    pub alibi: Option<AlibiDraw>,
    pub dtype: Dt,
    pub seed: u64,
}

impl fmt::Display for VarCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} varlen q={:?} k={:?} used_k={:?} hq={} hkv={} d={} causal={} scale={:?} window=({:?}, {:?}) softcap={:?} sinks={} alibi={:?} seed={}",
            self.dtype,
            self.lens_q,
            self.lens_k,
            self.used_k,
            self.heads_q,
            self.heads_kv,
            self.head_dim,
            self.causal,
            self.softmax_scale,
            self.window.left,
            self.window.right,
            self.softcap,
            self.sinks,
            self.alibi,
            self.seed
        )
    }
}

impl VarCase {
    /// Offsets of `lens` (from 0).
    fn offsets(lens: &[usize]) -> Vec<u32> {
        let mut cu = vec![0u32];
        for &l in lens {
            cu.push(cu[cu.len() - 1] + l as u32);
        }
        cu
    }
    /// The keys sequence b uses.
    fn used(&self, b: usize) -> usize {
        self.used_k.as_ref().map_or(self.lens_k[b], |u| u[b])
    }
    /// Sequence b as a fixed-length case of batch 1 (its used keys).
    pub(crate) fn seq_case(&self, b: usize) -> Case {
        let shape = AttnShape {
            batch: 1,
            seqlen_q: self.lens_q[b],
            seqlen_k: self.used(b),
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
        };
        Case {
            shape,
            causal: self.causal,
            softmax_scale: self.softmax_scale,
            dtype: self.dtype,
            seed: self.seed,
            window: self.window,
            softcap: self.softcap,
            sinks: self.sinks,
            alibi: self.alibi.map(|a| AlibiDraw { batch0: b, ..a }),
        }
    }
    /// The attention of the whole batch, its sinks and ALiBi slopes (of every sequence) on `fa`.
    pub(crate) fn attention_on(&self, fa: &FlashAttn) -> flashattn::Result<flashattn::Attention> {
        let all = Case { shape: AttnShape { batch: self.lens_q.len(), ..self.seq_case(0).shape }, ..self.seq_case(0) };
        all.attention_on(fa)
    }
}

/// Random variable-length cases: 1..=`max_batch` sequences of 0..=`max_len` queries and keys
/// (lengths 0 and 1 drawn often; keys equal to queries half the time; a third of the batches
/// with `seqused_k`, any part of each slot down to none), head_dim up to 8
/// `d_units`, a multiple of 8 or (unless `aligned`) not, GQA up to `max_group`:1, every scale
/// window and softcap ([`scale_strategy`], [`window_strategy`], [`softcap_strategy`]), causal
/// and not.
pub fn varlen_strategy(
    max_batch: usize,
    max_len: usize,
    d_units: usize,
    max_group: usize,
    aligned: bool,
) -> impl Strategy<Value = VarCase> {
    let len = prop_oneof![1 => Just(0usize), 1 => Just(1usize), 4 => 0..=max_len];
    let seqs = prop::collection::vec((len.clone(), len, any::<bool>(), 0.0..=1.0f64), 1..=max_batch);
    let dims = (1..=d_units, any::<bool>()).prop_map(move |(u, odd)| if odd && u > 1 && !aligned { 8 * u - 3 } else { 8 * u });
    let used = prop_oneof![2 => Just(false), 1 => Just(true)];
    (
        seqs,
        dims,
        1..=2usize,
        1..=max_group,
        any::<bool>(),
        scale_strategy(),
        window_strategy(max_len),
        any::<u64>(),
        used,
        (softcap_strategy(), proptest::bool::weighted(0.25), alibi_strategy()),
    )
        .prop_map(|(seqs, head_dim, heads_kv, group, causal, softmax_scale, window, seed, used, (softcap, sinks, alibi))| {
            let mut lens_q: Vec<usize> = seqs.iter().map(|s| s.0).collect();
            let mut lens_k: Vec<usize> = seqs.iter().map(|s| if s.2 { s.0 } else { s.1 }).collect();
            // A batch holds at least one query row and one key.
            if lens_q.iter().sum::<usize>() == 0 {
                lens_q[0] = 1;
            }
            if lens_k.iter().sum::<usize>() == 0 {
                lens_k[0] = 1;
            }
            // Part of each slot (rounded to any count from 0 to all of it; all 0 too).
            let used_k =
                used.then(|| seqs.iter().zip(&lens_k).map(|(s, &n)| ((n as f64 + 1.0) * s.3).floor().min(n as f64) as usize).collect());
            let heads_q = heads_kv * group;
            VarCase {
                lens_q,
                lens_k,
                used_k,
                heads_q,
                heads_kv,
                head_dim,
                causal,
                softmax_scale,
                window,
                softcap,
                sinks,
                alibi,
                dtype: Dt::F16,
                seed,
            }
        })
}

/// Runs `case` forward (and with `backward` backward) by kernel family `family` (`None`: the
/// automatic choice) and checks every sequence against the f64 reference.
pub fn check_varlen(fa: &FlashAttn, case: &VarCase, family: Option<&'static str>, backward: bool) -> Result<(), String> {
    let r = match case.dtype {
        Dt::F32 => check_typed::<f32>(fa, case, family, backward),
        Dt::F16 => check_typed::<half::f16>(fa, case, family, backward),
        Dt::Bf16 => check_typed::<half::bf16>(fa, case, family, backward),
    };
    let splits = crate::splits_for(fa, case.seed, case.dtype, case.head_dim, family);
    r.map_err(|e| format!("[{}, splits {splits:?}] {e}", family.unwrap_or("auto")))
}

fn check_typed<T: Dtype>(fa: &FlashAttn, case: &VarCase, family: Option<&'static str>, backward: bool) -> Result<(), String> {
    let (hq, hkv, d) = (case.heads_q, case.heads_kv, case.head_dim);
    let (cu_q, cu_k) = (VarCase::offsets(&case.lens_q), VarCase::offsets(&case.lens_k));
    let (tq, tk) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
    let e = |e: flashattn::Error| format!("{case}: {e}");
    let used_k: Option<Vec<u32>> = case.used_k.as_ref().map(|u| u.iter().map(|&x| x as u32).collect());
    let seqs: SeqLens = fa.seqlens(&cu_q, &cu_k, used_k.as_deref()).map_err(e)?;
    let mut rng = Rng::new(case.seed);
    let (q, k, v, d_o): (Vec<T>, Vec<T>, Vec<T>, Vec<T>) =
        (rng.tensor(tq * hq * d), rng.tensor(tk * hkv * d), rng.tensor(tk * hkv * d), rng.tensor(tq * hq * d));
    let (qs, kvs) = ([tq, hq, d], [tk, hkv, d]);
    let (qd, kd, vd, dod) = (
        fa.upload(&q, &qs).map_err(e)?,
        fa.upload(&k, &kvs).map_err(e)?,
        fa.upload(&v, &kvs).map_err(e)?,
        fa.upload(&d_o, &qs).map_err(e)?,
    );
    let attn = case.attention_on(fa).map_err(e)?;
    let splits = crate::splits_for(fa, case.seed, case.dtype, d, family);
    let fwd_opts = FwdOptions { kernel: family, splits, ..Default::default() };
    let mut out = FwdOutput::from_buffers(fa.full(T::nan(), &qs).map_err(e)?, fa.full(f32::NAN, &[hq, tq]).map_err(e)?, None);
    fa.forward_varlen_into(&qd, &kd, &vd, &seqs, &attn, &fwd_opts, &mut out).map_err(e)?;
    let o: Vec<f64> = fa.download(out.o()).map_err(e)?.iter().map(|x| x.to_f64()).collect();
    let lse: Vec<f64> = fa.download(out.lse()).map_err(e)?.iter().map(|&x| x as f64).collect();
    let grads = match backward {
        true => {
            let opts = BwdOptions { kernel: family, deterministic: false };
            let mut g = BwdOutput {
                dq: fa.full(T::nan(), &qs).map_err(e)?,
                dk: fa.full(T::nan(), &kvs).map_err(e)?,
                dv: fa.full(T::nan(), &kvs).map_err(e)?,
                dsinks: if case.sinks { Some(fa.full(f32::NAN, &[hq]).map_err(e)?) } else { None },
            };
            fa.backward_into(&qd, &kd, &vd, &out, &dod, &opts, &mut g).map_err(e)?;
            let w = |t: &flashattn::Tensor<T>| -> Result<Vec<f64>, String> {
                Ok(fa.download(t).map_err(e)?.iter().map(|x| x.to_f64()).collect())
            };
            let ds = match &g.dsinks {
                Some(t) => fa.download(t).map_err(e)?.iter().map(|&x| x as f64).collect(),
                None => vec![],
            };
            Some(([w(&g.dq)?, w(&g.dk)?, w(&g.dv)?], ds))
        }
        false => None,
    };
    // With sinks, their gradient sums over the sequences: the references' sums (exact, naive,
    // floor), checked after the loop.
    let mut ds_refs = [vec![0.0; hq], vec![0.0; hq], vec![0.0; hq]];
    for b in 0..case.lens_q.len() {
        let c = case.seq_case(b);
        let (q0, q1, k0, k1) = (cu_q[b] as usize, cu_q[b + 1] as usize, cu_k[b] as usize, cu_k[b + 1] as usize);
        // The keys it uses, and those of its slot it does not.
        let ku = k0 + case.used(b);
        let (qr, kr, unused) = (q0 * hq * d..q1 * hq * d, k0 * hkv * d..ku * hkv * d, ku * hkv * d..k1 * hkv * d);
        let in_seq = |r: Result<(), String>| r.map_err(|m| format!("{case}: sequence {b}: {m}"));
        if q1 > q0 {
            // LSE [heads_q, total_q]: the sequence's rows of each head, as [1, heads_q, sq].
            let lse_b: Vec<f64> = (0..hq).flat_map(|h| lse[h * tq + q0..h * tq + q1].iter().copied()).collect();
            in_seq(check_outputs(&c, &q[qr.clone()], &k[kr.clone()], &v[kr.clone()], &o[qr.clone()], &lse_b).map(|_| ()))?;
        }
        let Some((g, _)) = &grads else { continue };
        // Keys of the slot past seqused_k: no query sees them, dK = dV = 0, written.
        if let Some(x) = g[1][unused.clone()].iter().chain(&g[2][unused]).find(|x| **x != 0.0) {
            return Err(format!("{case}: sequence {b}'s keys past seqused_k have dK or dV {x}, not 0"));
        }
        if q1 == q0 {
            // No query sees the sequence's keys: dK = dV = 0, written.
            if let Some(x) = g[1][kr.clone()].iter().chain(&g[2][kr.clone()]).find(|x| **x != 0.0) {
                return Err(format!("{case}: sequence {b} has no queries, but its dK or dV holds {x}"));
            }
            continue;
        }
        let got = [g[0][qr.clone()].to_vec(), g[1][kr.clone()].to_vec(), g[2][kr.clone()].to_vec()];
        let (qb, kb, vb, dob) = (&q[qr.clone()], &k[kr.clone()], &v[kr.clone()], &d_o[qr]);
        let mut refs = GradRefs::new(&c, qb, kb, vb, dob);
        for (sum, part) in ds_refs.iter_mut().zip([&mut refs.exact, &mut refs.naive, &mut refs.floor]) {
            for (s, x) in sum.iter_mut().zip(std::mem::take(&mut part.dsinks)) {
                *s += x;
            }
        }
        in_seq(check_grads_against(&c, qb, kb, vb, dob, &refs, &got))?;
    }
    if let Some((_, ds)) = grads.as_ref().filter(|_| case.sinks) {
        let [exact, naive, floor] = &ds_refs;
        // All 0 (every head's sink -inf, or no row with weights): exactly 0, as the kernels
        // skip such heads and add 0 for such rows; else the relative bar.
        let (err, tol) = match exact.iter().all(|&x| x == 0.0) {
            true => (ds.iter().fold(0f64, |m, x| m.max(x.abs())), 0.0),
            false => (rel_l2(ds, exact), GradRefs::bar::<T>(exact, naive, floor) + ftz_slack(tq, exact)),
        };
        if !within(err, tol) {
            return Err(format!("{case}: dsinks rel err {err:.3e} (tol {tol:.3e}): got {ds:?}, exact {exact:?}"));
        }
    }
    Ok(())
}

/// Offsets only a device holds, made wrong on purpose: decreasing, past the packed tensors,
/// past the grid's maxima, `seqused_k` past the slot. The kernels must stay inside the
/// tensors (on the emulator every access is checked: one outside fails the launch), and the
/// call must succeed. With `backward`, the backward too (without `seqused_k`).
pub fn check_bad_offsets<T: Dtype>(fa: &FlashAttn, family: Option<&'static str>, head_dim: usize, backward: bool) -> Result<(), String> {
    let (tq, tk, hq, hkv, d) = (60usize, 40usize, 2usize, 1usize, head_dim);
    let cu_q = [0u32, 50, 20, 1000, u32::MAX, 7, 60];
    let cu_k = [5u32, 3, 100_000, 7, 9, 0, u32::MAX];
    let used = [1000u32, 0, 5, u32::MAX, 2, 17];
    let mut rng = Rng::new(7);
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) = (rng.tensor(tq * hq * d), rng.tensor(tk * hkv * d), rng.tensor(tk * hkv * d));
    let e = |e: flashattn::Error| format!("bad offsets [{}] d={d}: {e}", family.unwrap_or("auto"));
    let (qs, kvs) = ([tq, hq, d], [tk, hkv, d]);
    let (qd, kd, vd, dod) =
        (fa.upload(&q, &qs).map_err(e)?, fa.upload(&k, &kvs).map_err(e)?, fa.upload(&v, &kvs).map_err(e)?, fa.upload(&q, &qs).map_err(e)?);
    for (used_k, causal, window) in
        [(Some(&used[..]), false, Window::NONE), (None, true, Window::NONE), (None, false, Window { left: Some(3), right: Some(9) })]
    {
        let seqs = fa
            .seqlens_unchecked(&cu_q, &cu_k, used_k, SeqLenDims { total_q: tq, total_k: tk, max_seqlen_q: 32, max_seqlen_k: 48 })
            .map_err(e)?;
        // Sinks with the window: their gradient's partial sums must stay inside too (where the
        // family's backward takes sinks).
        let takes = family.and_then(flashattn::BwdFamily::from_name).is_none_or(|f| f.desc().sinks);
        let sinks = if window.is_none() || !takes { None } else { Some(fa.sinks(&vec![0.5; hq]).map_err(e)?) };
        let attn = flashattn::Attention { causal, softmax_scale: None, window, softcap: None, sinks, alibi: None };
        let out = fa.forward_varlen(&qd, &kd, &vd, &seqs, &attn, &FwdOptions { kernel: family, ..Default::default() }).map_err(e)?;
        // Split-KV too (where the family splits): its parts and merge stay inside as well.
        if crate::family_splits(fa, Dt::of(T::DTYPE), d, family) {
            let opts = FwdOptions { kernel: family, splits: Some(3), ..Default::default() };
            drop(fa.forward_varlen(&qd, &kd, &vd, &seqs, &attn, &opts).map_err(e)?);
        }
        let bwd_opts = BwdOptions { kernel: family, deterministic: false };
        match (backward, used_k) {
            (true, None) => drop(fa.backward(&qd, &kd, &vd, &out, &dod, &bwd_opts).map_err(e)?),
            // With seqused_k, the backward writes dK = dV = 0 past each sequence's used keys,
            // which it must know on the host: refused, before any launch, for offsets it has not seen.
            (true, Some(_)) => match fa.backward(&qd, &kd, &vd, &out, &dod, &bwd_opts) {
                Err(flashattn::Error::Unsupported { .. }) => {}
                r => return Err(format!("backward with unchecked seqused_k: {:?}, not Unsupported", r.map(|_| ()))),
            },
            (false, _) => {}
        }
        fa.synchronize().map_err(e)?;
    }
    Ok(())
}

/// Offsets already on the device ([`FlashAttn::seqlens_on_device`], cudarc buffers on the
/// instance's stream) give bit for bit what the same offsets checked on the host give, forward
/// and backward (`Err` on the emulator, which has no device buffers).
pub fn check_device_offsets(fa: &FlashAttn, family: Option<&'static str>, head_dim: usize) -> Result<(), String> {
    let stream = fa.cuda_stream().ok_or("device offsets need a GPU")?.clone();
    let (lens_q, lens_k) = ([37u32, 0, 1, 70, 9], [37u32, 5, 1, 45, 0]);
    let cu = |l: &[u32]| {
        std::iter::once(0)
            .chain(l.iter().scan(0, |a, x| {
                *a += x;
                Some(*a)
            }))
            .collect::<Vec<u32>>()
    };
    let (cu_q, cu_k) = (cu(&lens_q), cu(&lens_k));
    let (tq, tk, hq, hkv, d) = (cu_q[5] as usize, cu_k[5] as usize, 4usize, 2usize, head_dim);
    let e = |e: flashattn::Error| format!("device offsets [{}] d={d}: {e}", family.unwrap_or("auto"));
    let mut rng = Rng::new(fresh_seed());
    let (q, k, v, d_o): (Vec<half::f16>, Vec<half::f16>, Vec<half::f16>, Vec<half::f16>) =
        (rng.tensor(tq * hq * d), rng.tensor(tk * hkv * d), rng.tensor(tk * hkv * d), rng.tensor(tq * hq * d));
    let (qs, kvs) = ([tq, hq, d], [tk, hkv, d]);
    let up = |x: &[half::f16], s: &[usize]| fa.upload(x, s).map_err(e);
    let (qd, kd, vd, dod) = (up(&q, &qs)?, up(&k, &kvs)?, up(&v, &kvs)?, up(&d_o, &qs)?);
    let host = fa.seqlens(&cu_q, &cu_k, None).map_err(e)?;
    let htod = |x: &[u32]| stream.clone_htod(x).map_err(|err| format!("copying offsets: {err}"));
    let dims = SeqLenDims { total_q: tq, total_k: tk, max_seqlen_q: 70, max_seqlen_k: 45 };
    let dev = fa.seqlens_on_device(htod(&cu_q)?, htod(&cu_k)?, None, dims).map_err(e)?;
    let attn = flashattn::Attention { causal: true, softmax_scale: None, window: Window::NONE, softcap: None, sinks: None, alibi: None };
    let run = |seqs: &SeqLens| -> Result<[Vec<half::f16>; 4], String> {
        let out = fa.forward_varlen(&qd, &kd, &vd, seqs, &attn, &FwdOptions { kernel: family, ..Default::default() }).map_err(e)?;
        let g = fa.backward(&qd, &kd, &vd, &out, &dod, &BwdOptions { kernel: family, deterministic: true }).map_err(e)?;
        let dl = |t: &flashattn::Tensor<half::f16>| fa.download(t).map_err(e);
        Ok([dl(out.o())?, dl(&g.dq)?, dl(&g.dk)?, dl(&g.dv)?])
    };
    let (a, b) = (run(&host)?, run(&dev)?);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x.iter().map(|t| t.to_bits()).ne(y.iter().map(|t| t.to_bits())) {
            return Err(format!("device offsets: {} differs from the host offsets' result", ["O", "dQ", "dK", "dV"][i]));
        }
    }
    Ok(())
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}
