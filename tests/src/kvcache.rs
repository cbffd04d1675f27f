//! Attention against a KV cache (`FlashAttn::forward_kvcache_into`) against the f64 reference:
//! the append checked element by element (every element of the cache outside the appended
//! rows unchanged, the slots' padding too), then each sequence's query rows checked as a batch
//! of one over the keys its slot holds after the append (`VarCase::seq_case`), the outputs
//! poisoned before the launch.

use crate::varlen::VarCase;
use crate::{AlibiDraw, Dt, Rng, alibi_strategy, check_outputs, scale_strategy, softcap_strategy, window_strategy};
use flashattn::{Dtype, FlashAttn, FwdOptions, FwdOutput, KvCache, Window};
use proptest::prelude::*;
use std::fmt;

/// One KV cache check.
#[derive(Clone, Debug)]
pub struct KvCase {
    /// Keys each sequence's slot holds before the call (as a device holds them: any value,
    /// past the capacity too).
    pub lens: Vec<u32>,
    pub capacity: usize,
    /// Rows from one slot to the next (at least `capacity`: slots may be padded).
    pub slot: usize,
    /// New keys appended per sequence (`None`: no append).
    pub new: Option<usize>,
    pub seqlen_q: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub softmax_scale: Option<f32>,
    pub window: Window,
    pub softcap: Option<f32>,
    pub sinks: bool,
    pub alibi: Option<AlibiDraw>,
    pub dtype: Dt,
    pub seed: u64,
}

impl fmt::Display for KvCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} kvcache lens={:?} capacity={} slot={} new={:?} sq={} hq={} hkv={} d={} causal={} scale={:?} window=({:?}, {:?}) softcap={:?} sinks={} alibi={:?} seed={}",
            self.dtype,
            self.lens,
            self.capacity,
            self.slot,
            self.new,
            self.seqlen_q,
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

impl KvCase {
    /// Keys sequence b holds after the append.
    pub fn held(&self, b: usize) -> usize {
        (self.lens[b] as usize + self.new.unwrap_or(0)).min(self.capacity)
    }
    /// The reference's view of the call: sequence b's `seqlen_q` rows over the keys it holds.
    fn var_case(&self) -> VarCase {
        let batch = self.lens.len();
        VarCase {
            lens_q: vec![self.seqlen_q; batch],
            lens_k: (0..batch).map(|b| self.held(b)).collect(),
            used_k: None,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            causal: self.causal,
            softmax_scale: self.softmax_scale,
            window: self.window,
            softcap: self.softcap,
            sinks: self.sinks,
            alibi: self.alibi,
            dtype: self.dtype,
            seed: self.seed,
        }
    }
}

/// Random KV cache cases: 1..=`max_batch` sequences, a capacity of 1..=`max_capacity` keys in
/// slots padded or not, lengths 0, full, past the capacity (a device's wrong value) or
/// anything between; 0 to the capacity of new keys or no append; 1..=`max_q` query rows;
/// head_dim up to 8 `d_units`, multiple of 8 or not; GQA up to `max_group`:1; every scale,
/// window, softcap, sinks and ALiBi, causal and not.
pub fn kvcache_strategy(
    max_batch: usize,
    max_capacity: usize,
    max_q: usize,
    d_units: usize,
    max_group: usize,
) -> impl Strategy<Value = KvCase> {
    let shape = (1..=max_batch, 1..=max_capacity, 0..=3usize, 1..=max_q, 1..=d_units, any::<bool>(), 1..=2usize, 1..=max_group);
    let opts = (
        any::<bool>(),
        scale_strategy(),
        window_strategy(max_capacity),
        softcap_strategy(),
        proptest::bool::weighted(0.25),
        alibi_strategy(),
    );
    (shape, opts, any::<u64>(), prop::collection::vec((0..4u8, 0.0..=1.0f64), max_batch), (0..3u8, 0.0..=1.0f64)).prop_map(
        |(
            (batch, capacity, pad, seqlen_q, units, odd, heads_kv, group),
            (causal, softmax_scale, window, softcap, sinks, alibi),
            seed,
            lens,
            new,
        )| {
            let lens = lens[..batch]
                .iter()
                .map(|&(kind, f)| match kind {
                    0 => 0,
                    1 => capacity as u32,
                    2 => [capacity as u32 + 1, u32::MAX][(f > 0.5) as usize],
                    _ => (f * capacity as f64) as u32,
                })
                .collect();
            let new = match new.0 {
                0 => None,
                _ => Some(((capacity as f64 + 1.0) * new.1).floor().min(capacity as f64) as usize),
            };
            KvCase {
                lens,
                capacity,
                slot: capacity + pad,
                new,
                seqlen_q,
                heads_q: heads_kv * group,
                heads_kv,
                head_dim: if odd && units > 1 { 8 * units - 3 } else { 8 * units },
                causal,
                softmax_scale,
                window,
                softcap,
                sinks,
                alibi: alibi.map(|a| AlibiDraw { per_batch: a.per_batch, batch0: 0 }),
                dtype: Dt::F16,
                seed,
            }
        },
    )
}

/// Runs `case` by kernel family `family` (`None`: the automatic choice) and checks the cache
/// and every sequence's rows.
pub fn check_kvcache(fa: &FlashAttn, case: &KvCase, family: Option<&'static str>) -> Result<(), String> {
    let r = match case.dtype {
        Dt::F32 => check_typed::<f32>(fa, case, family),
        Dt::F16 => check_typed::<half::f16>(fa, case, family),
        Dt::Bf16 => check_typed::<half::bf16>(fa, case, family),
    };
    let splits = crate::splits_for(fa, case.seed, case.dtype, case.head_dim, family);
    r.map_err(|e| format!("[{}, splits {splits:?}] {case}: {e}", family.unwrap_or("auto")))
}

fn check_typed<T: Dtype>(fa: &FlashAttn, case: &KvCase, family: Option<&'static str>) -> Result<(), String> {
    let (batch, sq, hq, hkv, d) = (case.lens.len(), case.seqlen_q, case.heads_q, case.heads_kv, case.head_dim);
    let (cap, slot, new) = (case.capacity, case.slot, case.new.unwrap_or(0));
    let e = |e: flashattn::Error| e.to_string();
    let mut rng = Rng::new(case.seed);
    let row = hkv * d;
    let (q, k, v): (Vec<T>, Vec<T>, Vec<T>) =
        (rng.tensor(batch * sq * hq * d), rng.tensor(batch * slot * row), rng.tensor(batch * slot * row));
    let (k_new, v_new): (Vec<T>, Vec<T>) = (rng.tensor(batch * new * row), rng.tensor(batch * new * row));
    let qd = fa.upload(&q, &[batch, sq, hq, d]).map_err(e)?;
    let (mut kd, mut vd) = (fa.upload(&k, &[batch, slot, hkv, d]).map_err(e)?, fa.upload(&v, &[batch, slot, hkv, d]).map_err(e)?);
    let (knd, vnd) = (fa.upload(&k_new, &[batch, new, hkv, d]).map_err(e)?, fa.upload(&v_new, &[batch, new, hkv, d]).map_err(e)?);
    let lens = fa.upload_u32(&case.lens).map_err(e)?;
    let var = case.var_case();
    let attn = var.attention_on(fa).map_err(e)?;
    let opts = FwdOptions { kernel: family, splits: crate::splits_for(fa, case.seed, case.dtype, d, family), ..Default::default() };
    let mut out = FwdOutput::from_buffers(
        fa.full(T::nan(), &[batch * sq, hq, d]).map_err(e)?,
        fa.full(f32::NAN, &[hq, batch * sq]).map_err(e)?,
        None,
    );
    // The caches as [batch, capacity, hkv, d] views of the padded slots.
    let (shape, strides) = ([batch, cap, hkv, d], [slot * row, row, d, 1]);
    let cache = KvCache { k: kd.view_mut().strided(&shape, &strides, 0), v: vd.view_mut().strided(&shape, &strides, 0), lens: lens.view() };
    let new_kv = case.new.map(|_| (knd.view(), vnd.view()));
    fa.forward_kvcache_into(&qd, cache, new_kv, &attn, &opts, &mut out).map_err(e)?;
    // The caches: new key i of sequence b at row lens[b] + i while below the capacity; every
    // other element as it was.
    let (kc, vc) = (fa.download(&kd).map_err(e)?, fa.download(&vd).map_err(e)?);
    for (name, got, before, added) in [("K", &kc, &k, &k_new), ("V", &vc, &v, &v_new)] {
        let mut want = before.clone();
        for b in 0..batch {
            for r in case.lens[b] as usize..case.held(b) {
                let i = r - case.lens[b] as usize;
                want[(b * slot + r) * row..][..row].copy_from_slice(&added[(b * new + i) * row..][..row]);
            }
        }
        if let Some(at) = (0..want.len()).find(|&i| got[i].to_f64().to_bits() != want[i].to_f64().to_bits()) {
            let (b, r) = (at / row / slot, at / row % slot);
            return Err(format!("{name} cache element {at} (sequence {b}, row {r}) is {}, not {}", got[at].to_f64(), want[at].to_f64()));
        }
    }
    // Each sequence's rows over the keys it holds.
    let o: Vec<f64> = fa.download(out.o()).map_err(e)?.iter().map(|x| x.to_f64()).collect();
    let lse: Vec<f64> = fa.download(out.lse()).map_err(e)?.iter().map(|&x| x as f64).collect();
    let tq = batch * sq;
    for b in 0..batch {
        let c = var.seq_case(b);
        let keys = b * slot * row..(b * slot + case.held(b)) * row;
        let rows = b * sq * hq * d..(b + 1) * sq * hq * d;
        let lse_b: Vec<f64> = (0..hq).flat_map(|h| lse[h * tq + b * sq..h * tq + (b + 1) * sq].iter().copied()).collect();
        check_outputs(&c, &q[rows.clone()], &kc[keys.clone()], &vc[keys], &o[rows], &lse_b).map_err(|m| format!("sequence {b}: {m}"))?;
    }
    Ok(())
}

/// A call on the caches K and V that must be refused.
type Refused<'a, T> = dyn Fn(&mut flashattn::Tensor<T>, &mut flashattn::Tensor<T>) -> flashattn::Result<()> + 'a;

/// Calls the KV cache must refuse before touching the cache: each with the error it gives,
/// and the cache checked unchanged.
pub fn check_kvcache_errors(fa: &FlashAttn) -> Result<(), String> {
    type T = half::f16;
    let (batch, cap, hkv, d) = (2usize, 8usize, 2usize, 64usize);
    let e = |e: flashattn::Error| e.to_string();
    let mut rng = Rng::new(7);
    let k: Vec<T> = rng.tensor(batch * cap * hkv * d);
    let mut kd = fa.upload(&k, &[batch, cap, hkv, d]).map_err(e)?;
    let mut vd = fa.upload(&k, &[batch, cap, hkv, d]).map_err(e)?;
    let lens = fa.upload_u32(&[3, 5]).map_err(e)?;
    let q = fa.upload(&rng.tensor::<T>(batch * 4 * d), &[batch, 1, 4, d]).map_err(e)?;
    let too_many = fa.upload(&rng.tensor::<T>(batch * (cap + 1) * hkv * d), &[batch, cap + 1, hkv, d]).map_err(e)?;
    let wrong_heads = fa.upload(&rng.tensor::<T>(batch * 3 * d), &[batch, 1, 3, d]).map_err(e)?;
    let q_odd_heads = fa.upload(&rng.tensor::<T>(batch * 3 * d), &[batch, 1, 3, d]).map_err(e)?;
    let attn = flashattn::Attention::default();
    let opts = FwdOptions::default();
    let cases: [(&str, Box<Refused<'_, T>>); 4] = [
        (
            "more new keys than the capacity",
            Box::new(|kd, vd| {
                let cache = KvCache { k: kd.view_mut(), v: vd.view_mut(), lens: lens.view() };
                fa.forward_kvcache(&q, cache, Some((too_many.view(), too_many.view())), &attn, &opts).map(|_| ())
            }),
        ),
        (
            "new keys of other heads",
            Box::new(|kd, vd| {
                let cache = KvCache { k: kd.view_mut(), v: vd.view_mut(), lens: lens.view() };
                fa.forward_kvcache(&q, cache, Some((wrong_heads.view(), wrong_heads.view())), &attn, &opts).map(|_| ())
            }),
        ),
        (
            // Refused by the forward's own checks (3 query heads on 2 KV heads), after the
            // append's would have passed.
            "query heads not a multiple of the KV heads",
            Box::new(|kd, vd| {
                let cache = KvCache { k: kd.view_mut(), v: vd.view_mut(), lens: lens.view() };
                let knew = too_many.view().narrow(1, 0, 1)?;
                fa.forward_kvcache(&q_odd_heads, cache, Some((knew.clone(), knew)), &attn, &opts).map(|_| ())
            }),
        ),
        (
            "lengths of another batch",
            Box::new(|kd, vd| {
                let cache = KvCache { k: kd.view_mut(), v: vd.view_mut(), lens: lens.view().narrow(0, 0, 1)? };
                fa.forward_kvcache(&q, cache, None, &attn, &opts).map(|_| ())
            }),
        ),
    ];
    for (what, call) in cases {
        match call(&mut kd, &mut vd) {
            Ok(()) => return Err(format!("{what}: accepted")),
            Err(err) => {
                let msg = err.to_string();
                if msg.is_empty() {
                    return Err(format!("{what}: an error without a message"));
                }
            }
        }
        if fa.download(&kd).map_err(e)? != k || fa.download(&vd).map_err(e)? != k {
            return Err(format!("{what}: refused, but the cache changed"));
        }
    }
    Ok(())
}
