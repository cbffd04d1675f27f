//! The forward pass: validation, launch parameters, and the launch on either backend.

use crate::device::{FlashAttn, Launch, Tensor};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::options::{Attention, FwdOptions};
use crate::varlen::SeqLens;
use crate::view::{AsView, Binds, Bound, View, ViewId, ViewMut, check, overlap, row_align};
use flashattn_kernels::params::{FwdParams, MergeParams, NO_WINDOW, Problem, Strides, Varlen};
use flashattn_kernels::registry::{Arch, Entry, FWD_FAMILIES, FwdFamily, FwdVariant, fwd_variant};

/// The problem's dimensions, as validated from Q and K.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
}

impl AttnShape {
    /// Shape of Q and O: [batch, seqlen_q, heads_q, head_dim].
    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_q, self.heads_q, self.head_dim]
    }
    /// Shape of K and V: [batch, seqlen_k, heads_kv, head_dim].
    pub fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_k, self.heads_kv, self.head_dim]
    }
    /// Shape of LSE: [batch, heads_q, seqlen_q].
    pub fn lse_shape(&self) -> [usize; 3] {
        [self.batch, self.heads_q, self.seqlen_q]
    }
    /// Element strides of Q, O, dO and dQ (contiguous).
    pub fn q_strides(&self) -> Strides {
        Strides::contiguous(self.seqlen_q as u64, self.heads_q as u64, self.head_dim as u64)
    }
    /// Element strides of K, V, dK and dV (contiguous).
    pub fn kv_strides(&self) -> Strides {
        Strides::contiguous(self.seqlen_k as u64, self.heads_kv as u64, self.head_dim as u64)
    }
    /// The problem as the kernels read it (`params::Problem`): these sizes (validated to fit
    /// u32), `attention`'s scale (its default from the true head_dim) and mask. `varlen`:
    /// for the kernels' variable-length entries (`mask::General` whatever the window), where
    /// causal masking is the window's right side 0.
    pub fn problem(&self, attention: &Attention, varlen: bool) -> Problem {
        Problem {
            batch: self.batch as u32,
            heads_q: self.heads_q as u32,
            heads_kv: self.heads_kv as u32,
            seqlen_q: self.seqlen_q as u32,
            seqlen_k: self.seqlen_k as u32,
            head_dim: self.head_dim as u32,
            scale: attention.scale(self.head_dim),
            causal: attention.causal as u32,
            // A bound past every sequence (u32::MAX included) is no bound; with causal
            // masking the right side is 0 (the masks' intersection), which is how the window,
            // general and variable-length entries (`mask::Windowed`, `mask::General`) mask.
            window_left: attention.window.left.unwrap_or(NO_WINDOW),
            window_right: match attention.entry(varlen) == Entry::Plain {
                true => NO_WINDOW,
                false if attention.causal => 0,
                false => attention.window.right.unwrap_or(NO_WINDOW),
            },
            softcap: attention.softcap.unwrap_or(0.0),
        }
    }
    /// Shapes of Q (and O, dO, dQ), K (V, dK, dV) and LSE: [batch, seqlen, heads, head_dim]
    /// and [batch, heads_q, seqlen_q], or a variable-length batch's packed [total, heads,
    /// head_dim] and [heads_q, total_q].
    pub fn shapes(&self, seqs: Option<&SeqLens>) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        match seqs {
            None => (self.q_shape().to_vec(), self.kv_shape().to_vec(), self.lse_shape().to_vec()),
            Some(s) => (
                s.q_shape(self.heads_q, self.head_dim).to_vec(),
                s.kv_shape(self.heads_kv, self.head_dim).to_vec(),
                s.lse_shape(self.heads_q).to_vec(),
            ),
        }
    }
    /// FLOPs of the forward pass: 4 * b * h * sq * sk * d, halved when causal (the FA papers' count).
    pub fn fwd_flops(&self, causal: bool) -> f64 {
        let f = 4.0 * (self.batch * self.heads_q) as f64 * self.seqlen_q as f64 * self.seqlen_k as f64 * self.head_dim as f64;
        if causal { f / 2.0 } else { f }
    }
    /// (query, key) pairs one head of one batch entry computes under `attn`'s mask (causal
    /// and window), counted exactly.
    pub fn visible_pairs(&self, attn: &Attention) -> f64 {
        (0..self.seqlen_q).map(|i| attn.visible_cols(i, self.seqlen_q, self.seqlen_k)).map(|(lo, hi)| (hi - lo) as f64).sum()
    }
    /// The forward's FLOPs under a sliding window: 4 head_dim per visible pair, per head and
    /// batch entry; without a window the paper's count ([`AttnShape::fwd_flops`]).
    pub fn window_fwd_flops(&self, attn: &Attention) -> f64 {
        match attn.window.is_none() {
            true => self.fwd_flops(attn.causal),
            false => 4.0 * (self.batch * self.heads_q) as f64 * self.visible_pairs(attn) * self.head_dim as f64,
        }
    }
}

/// Largest batch and heads_q: the launch grid's y and z limits.
pub const MAX_GRID_YZ: usize = 65_535;
/// Largest |softmax_scale| accepted: far beyond any temperature in use (1/sqrt(head_dim) is
/// 0.06 to 1), and past the point where the softmax is a hard max on any data. Larger scales
/// would carry ordinary scores beyond what the kernels' f32 row statistics (m_i, LSE) hold
/// exactly; they are refused rather than turned into NaN rows.
pub const MAX_SCALE: f32 = 65536.0;
/// Smallest softcap accepted: |scale| / softcap, tanh's factor on the raw scores, stays
/// finite for every accepted scale.
pub const MIN_SOFTCAP: f32 = 1e-30;
/// Largest softcap accepted: capped scores times log2(e) stay below the kernels' f32 row
/// statistics' exact range (`softmax::STAT_LIMIT`, 2^30); far beyond any softcap in use
/// (30 to 50), where tanh caps nothing an ordinary score reaches.
pub const MAX_SOFTCAP: f32 = 1e8;
/// Largest sequence length: row indices are u32 in the kernels, with room for one tile past the end.
pub const MAX_SEQLEN: usize = (i32::MAX as usize) - 1024;

/// Checks Q, K, V and the options; returns the problem's dimensions. Runs before any launch.
pub fn validate(q: &[usize], k: &[usize], v: &[usize], attention: &Attention) -> Result<AttnShape> {
    for (tensor, s) in [("q", q), ("k", k), ("v", v)] {
        if s.len() != 4 {
            return Err(Error::Rank { tensor, shape: s.to_vec(), expected: 4 });
        }
        if s.contains(&0) {
            return Err(Error::EmptyDimension { tensor, shape: s.to_vec() });
        }
    }
    if k != v {
        return Err(Error::KvShapeMismatch { k: k.to_vec(), v: v.to_vec() });
    }
    if q[0] != k[0] {
        return Err(Error::ShapeMismatch { what: "batch of q and k", left: q[0], right: k[0] });
    }
    if q[3] != k[3] {
        return Err(Error::ShapeMismatch { what: "head_dim of q and k", left: q[3], right: k[3] });
    }
    let shape = AttnShape { batch: q[0], seqlen_q: q[1], heads_q: q[2], seqlen_k: k[1], heads_kv: k[2], head_dim: q[3] };
    if shape.head_dim > 256 {
        return Err(Error::UnsupportedHeadDim { head_dim: shape.head_dim });
    }
    if !shape.heads_q.is_multiple_of(shape.heads_kv) {
        return Err(Error::HeadsNotDivisible { heads_q: shape.heads_q, heads_kv: shape.heads_kv });
    }
    for (what, value, max) in [
        ("batch", shape.batch, MAX_GRID_YZ),
        ("heads_q", shape.heads_q, MAX_GRID_YZ),
        ("seqlen_q", shape.seqlen_q, MAX_SEQLEN),
        ("seqlen_k", shape.seqlen_k, MAX_SEQLEN),
    ] {
        if value > max {
            return Err(Error::TooLarge { what, value, max });
        }
    }
    // Element offsets are u64 in the kernels; byte sizes must fit an isize on the host.
    let max_elems = isize::MAX as usize / 4;
    for (what, s) in [("elements of q", q), ("elements of k", k)] {
        let n = s.iter().try_fold(1usize, |a, &x| a.checked_mul(x)).unwrap_or(usize::MAX);
        if n > max_elems {
            return Err(Error::TooLarge { what, value: n, max: max_elems });
        }
    }
    if let Some(scale) = attention.softmax_scale
        && (scale.is_nan() || scale.abs() > MAX_SCALE)
    {
        return Err(Error::InvalidScale { scale, max: MAX_SCALE });
    }
    if let Some(softcap) = attention.softcap
        && !(MIN_SOFTCAP..=MAX_SOFTCAP).contains(&softcap)
    {
        return Err(Error::InvalidSoftcap { softcap, min: MIN_SOFTCAP, max: MAX_SOFTCAP });
    }
    if let Some(sinks) = &attention.sinks
        && sinks.heads() != shape.heads_q
    {
        return Err(Error::ShapeMismatch { what: "heads of sinks and heads_q of q", left: sinks.heads(), right: shape.heads_q });
    }
    if let Some(alibi) = &attention.alibi {
        alibi.check(shape.batch, shape.heads_q, shape.seqlen_q, shape.seqlen_k)?;
    }
    Ok(shape)
}

/// Checks a variable-length batch's packed Q [total_q, heads_q, head_dim], K and V [total_k,
/// heads_kv, head_dim] against its sequences `seqs`, and the options; returns the problem's
/// dimensions with the longest sequences as seqlen_q and seqlen_k (the grid's).
pub fn validate_varlen(q: &[usize], k: &[usize], v: &[usize], seqs: &SeqLens, attention: &Attention) -> Result<AttnShape> {
    for (tensor, s) in [("q", q), ("k", k), ("v", v)] {
        if s.len() != 3 {
            return Err(Error::Rank { tensor, shape: s.to_vec(), expected: 3 });
        }
    }
    for (tensor, s, rows) in [("q", q, seqs.total_q()), ("k", k, seqs.total_k()), ("v", v, seqs.total_k())] {
        if s[0] != rows {
            return Err(Error::InputShape { tensor, expected: vec![rows, s[1], s[2]], got: s.to_vec() });
        }
    }
    // The rest as for a batch of equal lengths, the longest ones.
    let (b, mq, mk) = (seqs.batch(), seqs.max_seqlen_q(), seqs.max_seqlen_k());
    let shape = validate(&[b, mq.max(1), q[1], q[2]], &[b, mk.max(1), k[1], k[2]], &[b, mk.max(1), v[1], v[2]], attention)?;
    Ok(AttnShape { seqlen_q: mq, seqlen_k: mk, ..shape })
}

/// [`validate`] for a batch of equal lengths, [`validate_varlen`] for the sequences `seqs`.
pub(crate) fn validate_seqs(q: &[usize], k: &[usize], v: &[usize], seqs: Option<&SeqLens>, attention: &Attention) -> Result<AttnShape> {
    match seqs {
        None => validate(q, k, v, attention),
        Some(s) => validate_varlen(q, k, v, s, attention),
    }
}

/// What the forward pass returns, and what its backward needs: O, LSE, O's residual when
/// it was saved, and a record of the forward that wrote them (its attention, its inputs).
/// [`FlashAttn::backward`] takes the attention from here, so it is always the forward's.
pub struct FwdOutput<T> {
    o: Tensor<T>,
    lse: Tensor<f32>,
    o_lo: Option<Tensor<T>>,
    written: Option<Forward>,
}

/// What a forward computed and where: its attention, its shape, the views it read (Q, K, V)
/// and wrote (O, LSE, O's residual). The backward takes it with those views, so that it
/// computes the gradient of that forward.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    pub(crate) attention: Attention,
    pub(crate) shape: AttnShape,
    pub(crate) inputs: [ViewId; 3],
    pub(crate) outputs: [Option<ViewId>; 3],
    /// Whether it wrote O's residual.
    pub(crate) residual: bool,
    /// A variable-length batch's sequences.
    pub(crate) seqs: Option<SeqLens>,
}

impl Forward {
    /// The attention it computed.
    pub fn attention(&self) -> Attention {
        self.attention.clone()
    }
    /// Its dimensions.
    pub fn shape(&self) -> AttnShape {
        self.shape
    }
    /// Whether it wrote O's residual (O_lo).
    pub fn residual(&self) -> bool {
        self.residual
    }
    /// The sequences of a variable-length batch (`None` for equal lengths).
    pub fn seqlens(&self) -> Option<&SeqLens> {
        self.seqs.as_ref()
    }
}

/// The views a forward writes ([`FlashAttn::forward_into_views`]): O [batch, seqlen_q,
/// heads_q, head_dim], LSE [batch, heads_q, seqlen_q] (f32, the sequence contiguous) and, to
/// save the residual, O_lo with O's shape and strides.
#[derive(Debug)]
pub struct FwdBuffers<'a, T> {
    pub o: ViewMut<'a, T>,
    pub lse: ViewMut<'a, f32>,
    pub o_lo: Option<ViewMut<'a, T>>,
}

impl<T> FwdOutput<T> {
    /// Buffers for [`FlashAttn::forward_into`] to write (a record of no forward yet): O
    /// [batch, seqlen_q, heads_q, head_dim], LSE [batch, heads_q, seqlen_q] and, to save the
    /// residual, an O_lo of O's shape.
    pub fn from_buffers(o: Tensor<T>, lse: Tensor<f32>, o_lo: Option<Tensor<T>>) -> FwdOutput<T> {
        FwdOutput { o, lse, o_lo, written: None }
    }
    /// Its O and LSE buffers as views to write (no residual).
    pub(crate) fn buffers(&mut self) -> FwdBuffers<'_, T> {
        FwdBuffers { o: self.o.view_mut(), lse: self.lse.view_mut(), o_lo: None }
    }
    /// O: [batch, seqlen_q, heads_q, head_dim], in the input dtype.
    pub fn o(&self) -> &Tensor<T> {
        &self.o
    }
    /// LSE: [batch, heads_q, seqlen_q], f32, natural log of each row's softmax denominator
    /// (after scaling; with sinks, the sink's term included): -inf for rows that see no key
    /// (with a sink, the sink), NaN for rows that see a NaN.
    pub fn lse(&self) -> &Tensor<f32> {
        &self.lse
    }
    /// O_lo = T(O_f32 - O), laid out like O (O + O_lo is the unrounded O to about twice T's
    /// precision), when the forward saved it ([`FwdOptions::save_residual`] and a kernel that
    /// writes it).
    pub fn o_lo(&self) -> Option<&Tensor<T>> {
        self.written.as_ref().filter(|r| r.residual).and(self.o_lo.as_ref())
    }
    /// The attention the forward computed (`None` before any forward wrote these buffers).
    pub fn attention(&self) -> Option<Attention> {
        self.written.as_ref().map(|r| r.attention.clone())
    }
    /// O, LSE and the residual buffer, given back.
    pub fn into_parts(self) -> (Tensor<T>, Tensor<f32>, Option<Tensor<T>>) {
        (self.o, self.lse, self.o_lo)
    }
    /// The record of the forward that wrote these buffers (`None` before any did).
    pub fn record(&self) -> Option<&Forward> {
        self.written.as_ref()
    }
}

impl<T> std::fmt::Debug for FwdOutput<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FwdOutput")
            .field("o", &self.o.shape())
            .field("lse", &self.lse.shape())
            .field("o_lo", &self.o_lo().map(|t| t.shape()))
            .field("attention", &self.attention())
            .finish()
    }
}

/// The variant that will run for this dtype, head_dim and options on a device that runs
/// kernels of `archs` ([`FlashAttn::archs`]): the named family's (whatever its arch: launching
/// it where it cannot run is [`Error::UnsupportedDevice`]), or the first family (in
/// [`FWD_FAMILIES`] order, among those tried automatically) that has one for these archs.
pub fn select_variant(
    dtype: flashattn_kernels::dtype::DType,
    head_dim: usize,
    opts: &FwdOptions,
    archs: &[Arch],
) -> Result<&'static FwdVariant> {
    select_variant_for(dtype, head_dim, opts, archs, Entry::Plain)
}

/// As [`select_variant`], for a launch that takes entry `entry` (a sliding window, a
/// variable-length batch): automatic selection skips the variants without it; a named
/// family's variant without it is [`Error::Unsupported`].
pub fn select_variant_for(
    dtype: flashattn_kernels::dtype::DType,
    head_dim: usize,
    opts: &FwdOptions,
    archs: &[Arch],
    entry: Entry,
) -> Result<&'static FwdVariant> {
    let d = head_dim as u32;
    match opts.kernel {
        Some(name) => {
            let family = FwdFamily::from_name(name)
                .ok_or_else(|| Error::UnknownKernel { name: name.into(), available: FWD_FAMILIES.iter().map(|f| f.name).collect() })?;
            let v = fwd_variant(family, dtype, d).ok_or_else(|| Error::NoVariant { family: name.into(), dtype: dtype.name(), head_dim })?;
            match v.entry(entry) {
                Some(_) => Ok(v),
                None => Err(Error::Unsupported { what: "a variable-length batch in the forward variant", value: v.name.into() }),
            }
        }
        None => FWD_FAMILIES
            .iter()
            .filter(|f| f.auto && archs.contains(&f.arch))
            .find_map(|f| fwd_variant(f.family, dtype, d).filter(|v| v.entry(entry).is_some()))
            .ok_or_else(|| Error::NoVariant { family: "any".into(), dtype: dtype.name(), head_dim }),
    }
}

impl FlashAttn {
    /// The variant [`select_variant`] picks for this device; a named one this device cannot
    /// run (an sm_90a kernel off compute capability 9.0) is [`Error::UnsupportedDevice`].
    fn fwd_variant_for(
        &self,
        dtype: flashattn_kernels::dtype::DType,
        head_dim: usize,
        opts: &FwdOptions,
        entry: Entry,
    ) -> Result<&'static FwdVariant> {
        let archs = self.archs();
        let variant = select_variant_for(dtype, head_dim, opts, &archs, entry)?;
        if !archs.contains(&variant.arch()) {
            return Err(Error::UnsupportedDevice { kernel: variant.name, needs: variant.arch(), device: self.device_name() });
        }
        Ok(variant)
    }

    /// Attention forward: O = softmax(scale * Q K^T \[masked\]) V, and its LSE.
    /// Q: [batch, seqlen_q, heads_q, head_dim]; K, V: [batch, seqlen_k, heads_kv, head_dim].
    /// The output also records the attention for [`FlashAttn::backward`].
    pub fn forward<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        attention: &Attention,
        opts: &FwdOptions,
    ) -> Result<FwdOutput<T>> {
        self.forward_alloc(q, k, v, None, attention, opts)
    }

    /// Attention forward over a variable-length batch (`seqs`, from [`FlashAttn::seqlens`]):
    /// Q packed as [total_q, heads_q, head_dim], K and V as [total_k, heads_kv, head_dim]; O
    /// is packed as Q, LSE is [heads_q, total_q]. Each sequence attends to its own keys,
    /// masks aligned to its own lengths (any [`crate::Window`], causal or not), on the
    /// kernels' variable-length entries; the output records `seqs` for [`FlashAttn::backward`].
    pub fn forward_varlen<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        seqs: &SeqLens,
        attention: &Attention,
        opts: &FwdOptions,
    ) -> Result<FwdOutput<T>> {
        self.forward_alloc(q, k, v, Some(seqs), attention, opts)
    }

    /// [`FlashAttn::forward`] or [`FlashAttn::forward_varlen`]: allocates the outputs, runs.
    fn forward_alloc<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        seqs: Option<&SeqLens>,
        attention: &Attention,
        opts: &FwdOptions,
    ) -> Result<FwdOutput<T>> {
        let (qv, kv, vv) = (q.as_view(), k.as_view(), v.as_view());
        let shape = validate_seqs(qv.shape(), kv.shape(), vv.shape(), seqs, attention)?;
        let variant = self.fwd_variant_for(T::DTYPE, shape.head_dim, opts, attention.entry(seqs.is_some()))?;
        let (qs, _, ls) = shape.shapes(seqs);
        let o = self.alloc::<T>(&qs)?;
        let lse = self.alloc::<f32>(&ls)?;
        let o_lo = match opts.save_residual && variant.family.desc().writes_residual {
            true => Some(self.alloc::<T>(&qs)?),
            false => None,
        };
        let mut out = FwdOutput::from_buffers(o, lse, o_lo);
        self.forward_into_seqs(q, k, v, seqs, attention, opts, &mut out)?;
        Ok(out)
    }

    /// As [`FlashAttn::forward`], writing into the buffers of `out` (which then records this
    /// forward). With [`FwdOptions::save_residual`] and a kernel that writes the residual,
    /// `out` must hold an O_lo buffer. A call refused by its checks leaves `out` as it was.
    pub fn forward_into<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut FwdOutput<T>,
    ) -> Result<()> {
        self.forward_into_seqs(q, k, v, None, attention, opts, out)
    }

    /// As [`FlashAttn::forward_varlen`], writing into the buffers of `out`: O packed as Q,
    /// LSE [heads_q, total_q] (and O_lo as [`FlashAttn::forward_into`] says).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_into<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        seqs: &SeqLens,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut FwdOutput<T>,
    ) -> Result<()> {
        self.forward_into_seqs(q, k, v, Some(seqs), attention, opts, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_into_seqs<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        seqs: Option<&SeqLens>,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut FwdOutput<T>,
    ) -> Result<()> {
        let prev = out.written.take();
        let FwdOutput { o, lse, o_lo, .. } = out;
        let mut bufs = FwdBuffers { o: o.view_mut(), lse: lse.view_mut(), o_lo: o_lo.as_mut().map(|t| t.view_mut()) };
        let mut run = Run::Launch;
        match self.forward_views(q, k, v, seqs, attention, opts, &mut bufs, &mut run) {
            Ok(record) => out.written = Some(record),
            Err(e) => {
                if run != Run::Launched {
                    out.written = prev;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// The forward on views (the caller's memory, strided layouts), writing O, LSE and O's
    /// residual into `out`; returns the record the backward ([`FlashAttn::backward_into_views`])
    /// takes with the same views. Allocates nothing but split-KV's parts when a count is asked
    /// for ([`FwdOptions::splits`]; `None` is no split here).
    pub fn forward_into_views<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut FwdBuffers<'_, T>,
    ) -> Result<Forward> {
        // Nothing allocated: no automatic split (its parts are allocated).
        let opts = FwdOptions { splits: Some(opts.splits.unwrap_or(1)), ..*opts };
        self.forward_views(q, k, v, None, attention, &opts, out, &mut Run::Launch)
    }

    /// The forward: every check, then the launch (`run` becomes [`Run::Launched`] when the
    /// buffers may change); with [`Run::CheckOnly`] every check and no launch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_views<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        seqs: Option<&SeqLens>,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut FwdBuffers<'_, T>,
        run: &mut Run,
    ) -> Result<Forward> {
        let (q, k, v) = (q.as_view(), k.as_view(), v.as_view());
        let shape = validate_seqs(q.shape(), k.shape(), v.shape(), seqs, attention)?;
        let variant = self.fwd_variant_for(T::DTYPE, shape.head_dim, opts, attention.entry(seqs.is_some()))?;
        let residual = opts.save_residual && variant.family.desc().writes_residual;
        // A part count that cannot run is named first (save_residual with splits: the
        // conflict, not the missing residual buffer).
        crate::split::check_splits(opts, variant, shape.heads_q)?;
        if residual && out.o_lo.is_none() {
            return Err(Error::MissingOutput { tensor: "o_lo", why: "save_residual is set and the selected forward kernel writes it" });
        }
        let (qs, kvs, ls) = shape.shapes(seqs);
        let l = variant.launch(shape.head_dim as u32).ok_or_else(|| Error::NoVariant {
            family: variant.family.name().into(),
            dtype: T::DTYPE.name(),
            head_dim: shape.head_dim,
        })?;
        // GQA packing (one block per KV head for its query heads' rows, `FwdParams::gqa_packed`):
        // the grid's rows and heads.
        let pack = match variant.family.desc().packs_gqa && !opts.no_gqa_packing {
            true => gqa_pack(&shape, attention, l.rows),
            false => 0,
        };
        let (grid_rows, grid_heads) = match pack {
            0 => (shape.seqlen_q as u32, shape.heads_q as u32),
            g => (g, shape.heads_kv as u32),
        };
        let blocks = (grid_rows as u64).div_ceil(l.rows as u64) * (grid_heads as usize * shape.batch) as u64;
        let slots = crate::split::slots(self.multiprocessors(), l.smem_bytes as usize);
        // The keys a block walks: one row sees no key left of its window.
        let keys = match (shape.seqlen_q, attention.window.left) {
            (1, Some(left)) => shape.seqlen_k.min(left as usize + 1),
            _ => shape.seqlen_k,
        };
        let dims = (shape.heads_q, keys, shape.head_dim);
        let splits = crate::split::split_count(opts, variant, residual, dims, (blocks, slots))?;
        // Split-KV: the parts' f32 O, [splits] x O's shape, and LSE, [2 splits] x LSE's
        // shape, for a launch.
        // A variable-length batch's packed rows that no sequence holds (offsets only the
        // device knows may leave gaps) are written by no block: their parts' LSE is set to
        // -inf first (below), so the merge gives them O = 0, LSE = -inf, not what the memory
        // held.
        let mut parts = match splits > 1 && *run != Run::CheckOnly {
            true => Some((
                self.alloc::<f32>(&[&[splits as usize], &qs[..]].concat())?,
                // Hi for each part, then lo for each (`FwdParams::o_part`).
                self.alloc::<f32>(&[&[2 * splits as usize], &ls[..]].concat())?,
            )),
            false => None,
        };
        let mut part_views = parts.as_mut().map(|(o, l)| (o.view_mut(), l.view_mut()));
        let align = row_align(shape.head_dim, std::mem::size_of::<T>());
        let offset_views = seqs.map(offset_views);
        let sink_view = attention.sinks.as_ref().map(|s| s.tensor().view());
        let alibi_view = attention.alibi.as_ref().map(|a| a.tensor().view());
        let FwdBuffers { o, lse, o_lo } = out;
        let o_lo = o_lo.as_mut().filter(|_| residual);
        // Each memory bound once for the call, mutably where an output writes it; the binds
        // (cudarc's stream-order records) are kept until the launch is queued.
        let part_keys = part_views.as_ref().map_or((None, None), |(o, l)| (o.key(), l.key()));
        let mut binds = Binds::new(&[
            ("o", o.key()),
            ("lse", lse.key()),
            ("o_lo", o_lo.as_ref().and_then(|t| t.key())),
            ("o_parts", part_keys.0),
            ("lse_parts", part_keys.1),
        ]);
        let (bq, bk, bv) = (self.bind(&mut binds, "q", &q)?, self.bind(&mut binds, "k", &k)?, self.bind(&mut binds, "v", &v)?);
        for (b, expected) in [(&bq, &qs), (&bk, &kvs), (&bv, &kvs)] {
            check(b, expected, align, false)?;
        }
        let bo = self.bind_mut(&mut binds, "o", o)?;
        check(&bo, &qs, align, true)?;
        let blse = self.bind_mut(&mut binds, "lse", lse)?;
        check(&blse, &ls, 4, true)?;
        let bo_lo = match o_lo {
            Some(t) => {
                let b = self.bind_mut(&mut binds, "o_lo", t)?;
                check(&b, &qs, align, true)?;
                if b.layout.strides != bo.layout.strides {
                    let (shape, strides) = (b.layout.shape.clone(), b.layout.strides.clone());
                    return Err(Error::Layout { tensor: "o_lo", shape, strides, why: "O's residual must have O's strides".into() });
                }
                Some(b)
            }
            None => None,
        };
        let bparts = match part_views.as_mut() {
            Some((o, l)) => Some((self.bind_mut(&mut binds, "o_parts", o)?, self.bind_mut(&mut binds, "lse_parts", l)?)),
            None => None,
        };
        let bsinks = match &sink_view {
            Some(v) => Some(self.bind_input(&mut binds, "sinks", v, &[shape.heads_q], 4)?),
            None => None,
        };
        let balibi = match (&alibi_view, &attention.alibi) {
            (Some(v), Some(a)) => Some(self.bind_input(&mut binds, "alibi_slopes", v, a.tensor().shape(), 4)?),
            _ => None,
        };
        let outputs: Vec<&Bound<'_>> = [Some(&bo), Some(&blse), bo_lo.as_ref()].into_iter().flatten().collect();
        let inputs: Vec<&Bound<'_>> = [&bq, &bk, &bv].into_iter().chain(bsinks.as_ref()).chain(balibi.as_ref()).collect();
        check_no_overlap(&outputs, &inputs)?;
        let offsets = match (&offset_views, seqs) {
            (Some(views), Some(seqs)) => Some(self.bind_offsets(&mut binds, views, seqs)?),
            _ => None,
        };

        let mut params = FwdParams {
            q: bq.addr(),
            k: bk.addr(),
            v: bv.addr(),
            o: bo.addr(),
            lse: blse.addr(),
            o_lo: bo_lo.as_ref().map_or(0, |b| b.addr()),
            sinks: bsinks.as_ref().map_or(0, |b| b.addr()),
            alibi: balibi.as_ref().map_or(0, |b| b.addr()),
            alibi_batch: attention.alibi.as_ref().map_or(0, |a| a.batch_stride()),
            q_strides: bq.strides4(),
            k_strides: bk.strides4(),
            v_strides: bv.strides4(),
            o_strides: bo.strides4(),
            lse_strides: blse.lse_strides(),
            varlen: offsets.as_ref().map_or(Varlen::default(), |o| o.params),
            pb: shape.problem(attention, seqs.is_some()),
            ..FwdParams::default()
        };
        if pack > 1 {
            // One query row per sequence: neither causal masking nor a window's right edge
            // hides a key (both off; the kernels drop the keys left of the window).
            params.gqa_pack = pack;
            (params.pb.causal, params.pb.window_right) = (0, NO_WINDOW);
        }
        if let Some((bop, blp)) = &bparts {
            // Split-KV: the kernel writes the parts; the merge then O and LSE.
            let (o_part, lse_part) = part_layouts(&qs, &ls);
            (params.o_part, params.o_strides, params.o_split) = (bop.addr(), o_part.0, o_part.1);
            (params.lse, params.lse_strides, params.lse_split) = (blp.addr(), lse_part.0, lse_part.1);
            params.splits = splits;
        }
        let part_bounds: Vec<&Bound<'_>> = bparts.iter().flat_map(|(o, l)| [o, l]).collect();
        let regions: Vec<_> = [&bq, &bk, &bv, &bo, &blse]
            .into_iter()
            .chain(part_bounds.iter().copied())
            .chain(bo_lo.as_ref())
            .chain(bsinks.as_ref())
            .chain(balibi.as_ref())
            .chain(offsets.iter().flat_map(|o| o.bound.iter()))
            .map(|b| b.region())
            .collect();
        // The variant's entry for a sliding window, a variable-length batch, or neither.
        let (name, emulate) = variant.entry(attention.entry(seqs.is_some())).ok_or_else(|| Error::Unsupported {
            what: "a variable-length batch in the forward family",
            value: variant.family.name().into(),
        })?;
        let launch = Launch {
            name,
            arch: variant.arch(),
            grid: (grid_rows.div_ceil(l.rows), grid_heads * params.splits.max(1), shape.batch as u32),
            threads: l.threads,
            smem: l.smem_bytes as usize,
            emulate,
        };
        let record = Forward {
            attention: attention.clone(),
            shape,
            inputs: [bq.id(), bk.id(), bv.id()],
            outputs: [Some(bo.id()), Some(blse.id()), bo_lo.as_ref().map(|b| b.id())],
            residual,
            seqs: seqs.cloned(),
        };
        if *run == Run::CheckOnly {
            return Ok(record);
        }
        *run = Run::Launched;
        if let (Some((_, blp)), Some(_)) = (&bparts, seqs) {
            self.memset_f32(blp.addr(), f32::NEG_INFINITY, params.lse_split as usize * splits as usize)?;
        }
        // SAFETY: every view was checked above against the memory it is in; the kernel reads
        // q, k, v and writes o, lse (and o_lo) within their shapes.
        unsafe { self.launch("launching the forward kernel", &[launch], params, &regions) }?;
        if let Some((bop, blp)) = &bparts {
            // The parts into O and LSE: rows of [batch, seqlen_q], or the packed total_q.
            let (batch, seqlen) = match seqs {
                Some(s) => (1, s.total_q() as u32),
                None => (shape.batch as u32, shape.seqlen_q as u32),
            };
            let merge = MergeParams {
                o_parts: bop.addr(),
                lse_parts: blp.addr(),
                lse_parts_lo: blp.addr() + params.lse_split * splits as u64 * 4,
                o: bo.addr(),
                lse: blse.addr(),
                o_parts_split: params.o_split,
                lse_parts_split: params.lse_split,
                o_parts_strides: params.o_strides,
                lse_parts_strides: params.lse_strides,
                o_strides: bo.strides4(),
                lse_strides: blse.lse_strides(),
                splits,
                batch,
                seqlen,
                heads: shape.heads_q as u32,
                head_dim: shape.head_dim as u32,
            };
            let regions: Vec<_> = [bop, blp, &bo, &blse].iter().map(|b| b.region()).collect();
            // SAFETY: the parts were allocated above with these layouts, O and LSE checked.
            unsafe { self.queue_merge::<T>(merge, &regions) }?;
        }
        Ok(record)
    }
}

/// GQA packing for a launch whose blocks take `rows` query rows, on a family that takes it
/// (`FwdFamilyDesc::packs_gqa`; FA2's decode packing, made a launch parameter:
/// `FwdParams::gqa_packed`): the query heads per KV head, where there are
/// several, each sequence has one query row, they fit one block's rows, and no bias depends
/// on a row's query head (ALiBi; the kernels read sinks by row); else 0 (pure: tested below).
/// A single row, bottom-right aligned, sees every key but those before a window's left edge:
/// the kernels drop those and mask nothing.
pub(crate) fn gqa_pack(shape: &AttnShape, attention: &Attention, rows: u32) -> u32 {
    let group = shape.heads_q / shape.heads_kv.max(1);
    match shape.seqlen_q == 1 && group > 1 && group <= rows as usize && attention.alibi.is_none() {
        true => group as u32,
        false => 0,
    }
}

/// The kernels' layouts (strides, elements from one part to the next) of split-KV's
/// contiguous parts of O ([splits] x `qs`) and of LSE ([splits] x `ls`): `qs` is [batch,
/// seqlen, heads, head_dim] or a variable-length batch's [total_q, heads, head_dim] (batch
/// stride 0), `ls` [batch, heads, seqlen] or [heads, total_q].
fn part_layouts(qs: &[usize], ls: &[usize]) -> ((Strides, u64), (Strides, u64)) {
    let n = |s: &[usize]| s.iter().product::<usize>() as u64;
    let (rows, heads, d) = (qs[qs.len() - 3] as u64, qs[qs.len() - 2] as u64, qs[qs.len() - 1] as u64);
    let batch = |full: u64| if qs.len() == 4 { full } else { 0 };
    let o = Strides { batch: batch(rows * heads * d), row: heads * d, head: d };
    let lse = Strides { batch: batch(heads * rows), row: 1, head: rows };
    ((o, n(qs)), (lse, n(ls)))
}

/// What [`FlashAttn::forward_views`] is to do, and what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Run {
    /// Every check, then the launch.
    Launch,
    /// Every check, no launch (a caller that changes memory only once the forward is sure to
    /// run, as the KV cache's append).
    CheckOnly,
    /// The launch was queued (the buffers may have changed, even if it then failed).
    Launched,
}

/// Outputs must not share an element with each other or with an input.
pub(crate) fn check_no_overlap(outputs: &[&Bound<'_>], inputs: &[&Bound<'_>]) -> Result<()> {
    for (i, a) in outputs.iter().enumerate() {
        for b in outputs[i + 1..].iter().chain(inputs) {
            if overlap(a, b) {
                return Err(Error::Overlap { output: a.name, other: b.name });
            }
        }
    }
    Ok(())
}

/// Views of a variable-length batch's device offsets (cu_seqlens_q, cu_seqlens_k, seqused_k).
pub(crate) fn offset_views(seqs: &SeqLens) -> (View<'_, u32>, View<'_, u32>, Option<View<'_, u32>>) {
    let (q, k, u) = seqs.tensors();
    (q.view(), k.view(), u.map(|t| t.view()))
}

/// A variable-length batch's offsets, bound for one call: the kernels' `params::Varlen` and
/// the bound memories (for the emulator's regions).
pub(crate) struct BoundOffsets<'s> {
    pub(crate) params: Varlen,
    pub(crate) bound: Vec<Bound<'s>>,
}

impl FlashAttn {
    /// Binds the offsets' views (read only) for a call of `seqs`' batch.
    pub(crate) fn bind_offsets<'s>(
        &'s self,
        binds: &mut Binds<'s>,
        (q, k, u): &'s (View<'_, u32>, View<'_, u32>, Option<View<'_, u32>>),
        seqs: &SeqLens,
    ) -> Result<BoundOffsets<'s>> {
        let (bq, bk) = (self.bind(binds, "cu_seqlens_q", q)?, self.bind(binds, "cu_seqlens_k", k)?);
        let bu = match u {
            Some(u) => Some(self.bind(binds, "seqused_k", u)?),
            None => None,
        };
        let params = Varlen {
            cu_q: bq.addr(),
            cu_k: bk.addr(),
            used_k: bu.as_ref().map_or(0, |b| b.addr()),
            total_q: seqs.total_q() as u32,
            total_k: seqs.total_k() as u32,
        };
        Ok(BoundOffsets { params, bound: [Some(bq), Some(bk), bu].into_iter().flatten().collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Window;

    fn shape(seqlen_q: usize, heads_q: usize, heads_kv: usize) -> AttnShape {
        AttnShape { batch: 3, seqlen_q, seqlen_k: 1000, heads_q, heads_kv, head_dim: 128 }
    }

    /// Packed only where each sequence has one row, several query heads share a KV head,
    /// and they fit a block (ALiBi, which no test here can build without a device, aside).
    #[test]
    fn gqa_pack_only_where_rows_are_interchangeable() {
        let plain = Attention::default();
        let causal = Attention { causal: true, ..Attention::default() };
        let capped = Attention { softcap: Some(30.0), ..Attention::default() };
        assert_eq!(gqa_pack(&shape(1, 32, 8), &plain, 64), 4);
        assert_eq!(gqa_pack(&shape(1, 32, 8), &causal, 64), 4);
        assert_eq!(gqa_pack(&shape(1, 32, 8), &capped, 64), 4);
        assert_eq!(gqa_pack(&shape(1, 64, 1), &plain, 64), 64);
        for window in [Window::new(Some(5), None), Window::new(None, Some(0)), Window::new(Some(0), Some(3))] {
            assert_eq!(gqa_pack(&shape(1, 32, 8), &Attention { window, ..Attention::default() }, 64), 4);
        }
        // Not: two rows, no sharing, more heads than a block's rows.
        assert_eq!(gqa_pack(&shape(2, 32, 8), &plain, 64), 0);
        assert_eq!(gqa_pack(&shape(1, 8, 8), &plain, 64), 0);
        assert_eq!(gqa_pack(&shape(1, 128, 1), &plain, 64), 0);
    }
}
