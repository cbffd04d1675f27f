//! Strided views, forward and backward: every tensor in a layout of its own (contiguous,
//! PyTorch's [b, h, s, d], packed QKV [b, s, 3, h, d], or a random order of batch, sequence
//! and head with padding at each level and an offset into a larger buffer), against the f64
//! reference. Inputs' gaps hold NaN, so a read outside a view shows in the result; outputs'
//! gaps hold a poison that must survive bit for bit, so a write outside a view shows too.

use crate::{Case, Dt, Rng, check_grads, check_outputs};
use flashattn::{BwdBuffers, BwdInputs, BwdOptions, Dtype, FlashAttn, FwdBuffers, FwdOptions, Tensor};

/// Where a tensor's elements are: shape, element strides (last 1) and the offset of the first.
#[derive(Clone, Debug)]
pub struct Lay {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Lay {
    fn contiguous(shape: &[usize]) -> Lay {
        Lay { shape: shape.to_vec(), strides: flashattn::contiguous_strides(shape), offset: 0 }
    }
    /// Element index of multi-index `i`.
    fn at(&self, i: &[usize]) -> usize {
        self.offset + i.iter().zip(&self.strides).map(|(a, b)| a * b).sum::<usize>()
    }
    /// Elements the buffer needs.
    fn extent(&self) -> usize {
        self.at(&self.shape.iter().map(|n| n - 1).collect::<Vec<_>>()) + 1
    }
    /// Every multi-index, row-major.
    fn indices(&self) -> Vec<Vec<usize>> {
        let mut out = vec![vec![]];
        for &n in &self.shape {
            out = out.into_iter().flat_map(|p| (0..n).map(move |i| [p.clone(), vec![i]].concat())).collect();
        }
        out
    }
    /// Element `i` of dimension `dim`, without that dimension (what `unbind` views).
    fn unbind(&self, dim: usize, i: usize) -> Lay {
        let (mut shape, mut strides) = (self.shape.clone(), self.strides.clone());
        shape.remove(dim);
        strides.remove(dim);
        Lay { shape, strides, offset: self.offset + i * self.strides[dim] }
    }
    /// Elements `start..start + len` of dimension `dim` (what `narrow` views).
    fn narrow(&self, dim: usize, start: usize, len: usize) -> Lay {
        let mut shape = self.shape.clone();
        shape[dim] = len;
        Lay { shape, strides: self.strides.clone(), offset: self.offset + start * self.strides[dim] }
    }
    /// A random layout of `shape` (the last dimension contiguous): the outer dimensions in a
    /// random order, each level padded by a random multiple of `a` elements, and an offset of
    /// a few `a`s; `a` keeps rows aligned as the kernels need.
    fn random(rng: &mut Rng, shape: &[usize], a: usize) -> Lay {
        let r = shape.len();
        let mut order: Vec<usize> = (0..r - 1).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let pad = |rng: &mut Rng| a * (rng.next_u64() % 3) as usize;
        let mut strides = vec![1; r];
        let mut cur = shape[r - 1] + pad(rng);
        for &dim in order.iter().rev() {
            strides[dim] = cur;
            cur = cur * shape[dim] + pad(rng);
        }
        Lay { shape: shape.to_vec(), strides, offset: pad(rng) }
    }
}

/// Which layouts a case's tensors get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    Contiguous,
    /// [b, h, s, d] memory (PyTorch's usual layout), declared as [b, s, h, d] views.
    Bhsd,
    /// Q, K, V from one packed [b, s, 3, h, d] buffer (needs heads_q = heads_kv and sq = sk);
    /// the rest random.
    PackedQkv,
    /// Every tensor a random layout.
    Random,
}

/// The alignment (in elements of `elem` bytes) of rows of `d` elements in a contiguous
/// tensor, as the kernels need it.
fn align_elems(d: usize, elem: usize) -> usize {
    (((1usize << (d * elem).trailing_zeros()).min(16)) / elem).max(1)
}

/// Runs `case` forward and backward with every tensor in a layout from `pattern` (drawn
/// from `layout_seed`), and checks outputs, gradients and the untouched gaps.
pub fn check_strided(fa: &FlashAttn, case: &Case, pattern: Pattern, layout_seed: u64, saved: bool) -> Result<(), String> {
    // Layouts of Q, K, V and their gradients: sinks (a [heads] tensor of their own) are not
    // in question here.
    let case = &Case { sinks: false, alibi: None, ..*case };
    match case.dtype {
        Dt::F32 => check_typed::<f32>(fa, case, pattern, layout_seed, saved),
        Dt::F16 => check_typed::<half::f16>(fa, case, pattern, layout_seed, saved),
        Dt::Bf16 => check_typed::<half::bf16>(fa, case, pattern, layout_seed, saved),
    }
    .map_err(|e| format!("{case} [{pattern:?} layouts, seed {layout_seed}{}]: {e}", if saved { ", residual" } else { "" }))
}

/// A host buffer of one or more tensors: poison everywhere, then the inputs' elements.
struct Buf<T> {
    data: Vec<T>,
}

impl<T: Dtype> Buf<T> {
    fn new(len: usize, poison: T) -> Buf<T> {
        Buf { data: vec![poison; len] }
    }
    fn scatter(&mut self, lay: &Lay, values: &[T]) {
        for (i, idx) in lay.indices().iter().enumerate() {
            self.data[lay.at(idx)] = values[i];
        }
    }
}

fn gather<T: Dtype>(data: &[T], lay: &Lay) -> Vec<f64> {
    lay.indices().iter().map(|i| data[lay.at(i)].to_f64()).collect()
}

/// The elements outside every layout in `lays` must still hold `poison`'s bits.
fn gaps_untouched<T: Dtype>(name: &str, data: &[T], lays: &[&Lay], poison: T) -> Result<(), String> {
    let mut inside = vec![false; data.len()];
    for lay in lays {
        for i in lay.indices() {
            inside[lay.at(&i)] = true;
        }
    }
    let bits = |x: &T| -> Vec<u8> {
        // SAFETY: T is plain data (f32, f16, bf16).
        unsafe { std::slice::from_raw_parts(x as *const T as *const u8, std::mem::size_of::<T>()) }.to_vec()
    };
    match (0..data.len()).find(|&i| !inside[i] && bits(&data[i]) != bits(&poison)) {
        Some(i) => Err(format!("{name}: element {i} outside the view was written ({:?})", data[i])),
        None => Ok(()),
    }
}

fn check_typed<T: Dtype>(fa: &FlashAttn, case: &Case, pattern: Pattern, layout_seed: u64, saved: bool) -> Result<(), String> {
    let s = case.shape;
    let (qs, kvs) = (s.q_shape().to_vec(), s.kv_shape().to_vec());
    let ls = s.lse_shape().to_vec();
    let a = align_elems(s.head_dim, std::mem::size_of::<T>());
    let mut lrng = Rng::new(layout_seed);
    let packed = pattern == Pattern::PackedQkv && s.heads_q == s.heads_kv && s.seqlen_q == s.seqlen_k;
    let mut lay = |shape: &[usize], a: usize| -> Lay {
        match pattern {
            Pattern::Contiguous => Lay::contiguous(shape),
            Pattern::Bhsd if shape.len() == 4 => {
                let [_, sl, h, d] = [shape[0], shape[1], shape[2], shape[3]];
                Lay { shape: shape.to_vec(), strides: vec![h * sl * d, d, sl * d, 1], offset: 0 }
            }
            Pattern::Bhsd => Lay::contiguous(shape),
            Pattern::PackedQkv | Pattern::Random => Lay::random(&mut lrng, shape, a),
        }
    };
    // Packed: Q, K and V the pieces of one contiguous [b, s, 3, h, d] projection.
    let packed_shape = [s.batch, s.seqlen_q, 3, s.heads_q, s.head_dim];
    let (lq, lk, lv) = if packed {
        let l = Lay::contiguous(&packed_shape);
        (l.unbind(2, 0), l.unbind(2, 1), l.unbind(2, 2))
    } else {
        (lay(&qs, a), lay(&kvs, a), lay(&kvs, a))
    };
    let (lo, ldo, llse) = (lay(&qs, a), lay(&qs, a), lay(&ls, 1));
    let (ldq, ldk, ldv) = (lay(&qs, a), lay(&kvs, a), lay(&kvs, a));

    let mut rng = Rng::new(case.seed);
    let (nq, nk) = (qs.iter().product::<usize>(), kvs.iter().product::<usize>());
    let (q, k, v, d_o): (Vec<T>, Vec<T>, Vec<T>, Vec<T>) = (rng.tensor(nq), rng.tensor(nk), rng.tensor(nk), rng.tensor(nq));
    let e = |e: flashattn::Error| e.to_string();
    let nan = T::nan();
    // Inputs: Q, K, V (one buffer when packed) and dO, NaN between their elements.
    let (qb, kb, vb);
    if packed {
        let mut buf = Buf::new(lv.extent(), nan);
        buf.scatter(&lq, &q);
        buf.scatter(&lk, &k);
        buf.scatter(&lv, &v);
        let t = fa.upload(&buf.data, &[buf.data.len()]).map_err(e)?;
        (qb, kb, vb) = (t, None, None);
    } else {
        let up = |lay: &Lay, x: &[T]| -> Result<Tensor<T>, String> {
            let mut buf = Buf::new(lay.extent(), nan);
            buf.scatter(lay, x);
            fa.upload(&buf.data, &[buf.data.len()]).map_err(e)
        };
        (qb, kb, vb) = (up(&lq, &q)?, Some(up(&lk, &k)?), Some(up(&lv, &v)?));
    }
    let mut db = Buf::new(ldo.extent(), nan);
    db.scatter(&ldo, &d_o);
    let dob = fa.upload(&db.data, &[db.data.len()]).map_err(e)?;
    // Outputs: poisoned buffers (a finite poison in O's gaps: NaN there would not show a
    // write of NaN).
    let poison = T::from_f64(-7.25);
    let out_buf = |lay: &Lay| fa.full(poison, &[lay.extent()]).map_err(e);
    let (mut ob, mut lseb) = (out_buf(&lo)?, fa.full(-7.25f32, &[llse.extent()]).map_err(e)?);
    let mut olob = if saved { Some(out_buf(&lo)?) } else { None };
    let (mut dqb, mut dkb, mut dvb) = (out_buf(&ldq)?, out_buf(&ldk)?, out_buf(&ldv)?);

    fn view<'t, T>(t: &'t Tensor<T>, l: &Lay) -> flashattn::View<'t, T> {
        t.view().strided(&l.shape, &l.strides, l.offset)
    }
    let (qv, kv, vv) = match packed {
        true => {
            let [q, k, v] = qb.view().reshaped(&packed_shape, 0).unbind::<3>(2).map_err(e)?;
            (q, k, v)
        }
        false => (view(&qb, &lq), view(kb.as_ref().unwrap_or(&qb), &lk), view(vb.as_ref().unwrap_or(&qb), &lv)),
    };
    let attention = case.attention();
    let fopts = FwdOptions { save_residual: saved, ..Default::default() };
    let mut fout = FwdBuffers {
        o: ob.view_mut().strided(&lo.shape, &lo.strides, lo.offset),
        lse: lseb.view_mut().strided(&llse.shape, &llse.strides, llse.offset),
        o_lo: olob.as_mut().map(|t| t.view_mut().strided(&lo.shape, &lo.strides, lo.offset)),
    };
    let fwd = fa.forward_into_views(&qv, &kv, &vv, &attention, &fopts, &mut fout).map_err(e)?;
    let bopts = BwdOptions::default();
    let n_ws = fa.backward_workspace_len::<T>(&fwd, &bopts).map_err(e)?;
    let mut ws = fa.full(f32::NAN, &[n_ws]).map_err(e)?;
    let FwdBuffers { o, lse, o_lo } = fout;
    let inputs = BwdInputs {
        q: qv,
        k: kv,
        v: vv,
        o: o.into_view(),
        lse: lse.into_view(),
        o_lo: o_lo.filter(|_| fwd.residual()).map(|t| t.into_view()),
        d_o: dob.view().strided(&ldo.shape, &ldo.strides, ldo.offset),
    };
    let mut grads = BwdBuffers {
        dsinks: None,
        dq: dqb.view_mut().strided(&ldq.shape, &ldq.strides, ldq.offset),
        dk: dkb.view_mut().strided(&ldk.shape, &ldk.strides, ldk.offset),
        dv: dvb.view_mut().strided(&ldv.shape, &ldv.strides, ldv.offset),
        workspace: ws.view_mut(),
    };
    fa.backward_into_views(&fwd, &inputs, &mut grads, &bopts).map_err(e)?;
    drop(grads);
    drop(inputs);

    let o_h = fa.download(&ob).map_err(e)?;
    let lse_h = fa.download(&lseb).map_err(e)?;
    gaps_untouched("o", &o_h, &[&lo], poison)?;
    gaps_untouched("lse", &lse_h, &[&llse], -7.25f32)?;
    if let Some(t) = &olob
        && fwd.residual()
    {
        gaps_untouched("o_lo", &fa.download(t).map_err(e)?, &[&lo], poison)?;
    }
    check_outputs(case, &q, &k, &v, &gather(&o_h, &lo), &gather(&lse_h, &llse))?;
    let (dq_h, dk_h, dv_h) = (fa.download(&dqb).map_err(e)?, fa.download(&dkb).map_err(e)?, fa.download(&dvb).map_err(e)?);
    gaps_untouched("dq", &dq_h, &[&ldq], poison)?;
    gaps_untouched("dk", &dk_h, &[&ldk], poison)?;
    gaps_untouched("dv", &dv_h, &[&ldv], poison)?;
    check_grads(case, &q, &k, &v, &d_o, &[gather(&dq_h, &ldq), gather(&dk_h, &ldk), gather(&dv_h, &ldv)])
}

/// Runs `case` (its seqlen_k made seqlen_q: one projection) forward and backward on packed
/// projections, as a fused QKV linear layer makes them: Q, K and V the pieces of one buffer,
/// and dQ, dK and dV the pieces of one gradient buffer written by ONE backward call. With
/// heads_q = heads_kv the buffers are `[b, s, 3, h, d]`, cut by `unbind` on dimension 2;
/// with GQA `[b, s, hq + 2 hkv, d]`, cut by `narrow` (Q, K, V) and `split_at` (dQ, dK, dV)
/// on dimension 2. Each packed buffer is contiguous or (from `layout_seed`) a random layout
/// of its shape (outer dimensions in a random order, padding, an offset); O, LSE and dO a
/// random layout each. Checks as [`check_strided`]: the f64 reference, and gaps untouched.
pub fn check_packed(fa: &FlashAttn, case: &Case, layout_seed: u64, saved: bool) -> Result<(), String> {
    let mut case = Case { sinks: false, alibi: None, ..*case };
    case.shape.seqlen_k = case.shape.seqlen_q;
    match case.dtype {
        Dt::F32 => check_packed_typed::<f32>(fa, &case, layout_seed, saved),
        Dt::F16 => check_packed_typed::<half::f16>(fa, &case, layout_seed, saved),
        Dt::Bf16 => check_packed_typed::<half::bf16>(fa, &case, layout_seed, saved),
    }
    .map_err(|e| format!("{case} [packed QKV and dQKV, seed {layout_seed}{}]: {e}", if saved { ", residual" } else { "" }))
}

fn check_packed_typed<T: Dtype>(fa: &FlashAttn, case: &Case, layout_seed: u64, saved: bool) -> Result<(), String> {
    let s = case.shape;
    let (b, sl, hq, hkv, d) = (s.batch, s.seqlen_q, s.heads_q, s.heads_kv, s.head_dim);
    let (qs, kvs, ls) = (s.q_shape().to_vec(), s.kv_shape().to_vec(), s.lse_shape().to_vec());
    let a = align_elems(d, std::mem::size_of::<T>());
    let mha = hq == hkv;
    let packed_shape = if mha { vec![b, sl, 3, hq, d] } else { vec![b, sl, hq + 2 * hkv, d] };
    let mut lrng = Rng::new(layout_seed);
    let plain = lrng.next_u64().is_multiple_of(2);
    let mut packed = || if plain { Lay::contiguous(&packed_shape) } else { Lay::random(&mut lrng, &packed_shape, a) };
    let (lqkv, ldqkv) = (packed(), packed());
    // Where each piece's elements are, worked out here from the packed layout (the views
    // come from the API's unbind / narrow / split_at).
    let pieces = |l: &Lay| match mha {
        true => [l.unbind(2, 0), l.unbind(2, 1), l.unbind(2, 2)],
        false => [l.narrow(2, 0, hq), l.narrow(2, hq, hkv), l.narrow(2, hq + hkv, hkv)],
    };
    let ([lq, lk, lv], [ldq, ldk, ldv]) = (pieces(&lqkv), pieces(&ldqkv));
    let (lo, ldo, llse) = (Lay::random(&mut lrng, &qs, a), Lay::random(&mut lrng, &qs, a), Lay::random(&mut lrng, &ls, 1));

    let mut rng = Rng::new(case.seed);
    let (nq, nk) = (qs.iter().product::<usize>(), kvs.iter().product::<usize>());
    let (q, k, v, d_o): (Vec<T>, Vec<T>, Vec<T>, Vec<T>) = (rng.tensor(nq), rng.tensor(nk), rng.tensor(nk), rng.tensor(nq));
    let e = |e: flashattn::Error| e.to_string();
    let nan = T::nan();
    let mut buf = Buf::new(lqkv.extent(), nan);
    buf.scatter(&lq, &q);
    buf.scatter(&lk, &k);
    buf.scatter(&lv, &v);
    let qkvb = fa.upload(&buf.data, &[buf.data.len()]).map_err(e)?;
    let mut db = Buf::new(ldo.extent(), nan);
    db.scatter(&ldo, &d_o);
    let dob = fa.upload(&db.data, &[db.data.len()]).map_err(e)?;
    let poison = T::from_f64(-7.25);
    let (mut ob, mut lseb) = (fa.full(poison, &[lo.extent()]).map_err(e)?, fa.full(-7.25f32, &[llse.extent()]).map_err(e)?);
    let mut olob = if saved { Some(fa.full(poison, &[lo.extent()]).map_err(e)?) } else { None };
    let mut dqkvb = fa.full(poison, &[ldqkv.extent()]).map_err(e)?;

    let qkv = qkvb.view().strided(&lqkv.shape, &lqkv.strides, lqkv.offset);
    let (qv, kv, vv) = match mha {
        true => {
            let [q, k, v] = qkv.unbind::<3>(2).map_err(e)?;
            (q, k, v)
        }
        false => {
            (qkv.clone().narrow(2, 0, hq).map_err(e)?, qkv.clone().narrow(2, hq, hkv).map_err(e)?, qkv.narrow(2, hq + hkv, hkv).map_err(e)?)
        }
    };
    let attention = case.attention();
    let fopts = FwdOptions { save_residual: saved, ..Default::default() };
    let mut fout = FwdBuffers {
        o: ob.view_mut().strided(&lo.shape, &lo.strides, lo.offset),
        lse: lseb.view_mut().strided(&llse.shape, &llse.strides, llse.offset),
        o_lo: olob.as_mut().map(|t| t.view_mut().strided(&lo.shape, &lo.strides, lo.offset)),
    };
    let fwd = fa.forward_into_views(&qv, &kv, &vv, &attention, &fopts, &mut fout).map_err(e)?;
    let bopts = BwdOptions::default();
    let mut ws = fa.full(f32::NAN, &[fa.backward_workspace_len::<T>(&fwd, &bopts).map_err(e)?]).map_err(e)?;
    let FwdBuffers { o, lse, o_lo } = fout;
    let inputs = BwdInputs {
        q: qv,
        k: kv,
        v: vv,
        o: o.into_view(),
        lse: lse.into_view(),
        o_lo: o_lo.filter(|_| fwd.residual()).map(|t| t.into_view()),
        d_o: dob.view().strided(&ldo.shape, &ldo.strides, ldo.offset),
    };
    // dQ, dK and dV: pieces of ONE buffer, into one call.
    let dqkv = dqkvb.view_mut().strided(&ldqkv.shape, &ldqkv.strides, ldqkv.offset);
    let [dq, dk, dv] = match mha {
        true => dqkv.unbind::<3>(2).map_err(e)?,
        false => {
            let (dq, dkv) = dqkv.split_at(2, hq).map_err(e)?;
            let (dk, dv) = dkv.split_at(2, hkv).map_err(e)?;
            [dq, dk, dv]
        }
    };
    if (dq.shape(), dk.shape(), dv.shape()) != (&qs[..], &kvs[..], &kvs[..]) {
        return Err(format!("pieces of shapes {:?}, {:?}, {:?}", dq.shape(), dk.shape(), dv.shape()));
    }
    let mut grads = BwdBuffers { dq, dk, dv, workspace: ws.view_mut(), dsinks: None };
    fa.backward_into_views(&fwd, &inputs, &mut grads, &bopts).map_err(e)?;
    drop(grads);
    drop(inputs);

    let o_h = fa.download(&ob).map_err(e)?;
    let lse_h = fa.download(&lseb).map_err(e)?;
    gaps_untouched("o", &o_h, &[&lo], poison)?;
    gaps_untouched("lse", &lse_h, &[&llse], -7.25f32)?;
    if let Some(t) = &olob
        && fwd.residual()
    {
        gaps_untouched("o_lo", &fa.download(t).map_err(e)?, &[&lo], poison)?;
    }
    check_outputs(case, &q, &k, &v, &gather(&o_h, &lo), &gather(&lse_h, &llse))?;
    let dqkv_h = fa.download(&dqkvb).map_err(e)?;
    gaps_untouched("dqkv", &dqkv_h, &[&ldq, &ldk, &ldv], poison)?;
    check_grads(case, &q, &k, &v, &d_o, &[gather(&dqkv_h, &ldq), gather(&dqkv_h, &ldk), gather(&dqkv_h, &ldv)])
}
