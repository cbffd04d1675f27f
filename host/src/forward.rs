//! The forward pass: validation, launch parameters, and the launch on either backend.

use crate::device::{FlashAttn, Launch, Tensor};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use flashattn_kernels::dev::emu::GlobalRegion;
use flashattn_kernels::params::{FwdParams, Strides};
use flashattn_kernels::registry::{Arch, FAMILIES, FWD_RESIDUAL_FAMILIES, FwdVariant, fwd_variant};

/// Options of the forward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FwdOptions {
    /// Causal masking, bottom-right aligned (FlashAttention >= 2.1): query row i sees key
    /// column j iff j <= i + seqlen_k - seqlen_q. Rows that see no key get O = 0, LSE = -inf.
    pub causal: bool,
    /// Scale applied to QK^T before the softmax; `None` means 1/sqrt(head_dim).
    pub softmax_scale: Option<f32>,
    /// Kernel family by name (`"simt"`); `None` picks the best one that applies.
    pub kernel: Option<&'static str>,
    /// Backward only: bitwise identical gradients from identical inputs on every run. Every
    /// automatically selected backward is; `mma_atomic` (by name) adds dQ with f32 atomics in
    /// a run-dependent order, and naming it with this set is an error.
    pub deterministic: bool,
    /// Forward only, opt-in: also return O's rounding residual ([`FwdOutput::o_lo`], one more
    /// tensor of O's size) where the kernel writes it (the Hopper kernels).
    /// [`FlashAttn::backward_saved`] then takes D~_i = dO_i . (O_i + O_lo_i) in f32 instead of
    /// dO_i . O_i: f32-accurate also in the rows that the Hopper dQ kernel's exact correction
    /// leaves out (rows without a softmax weight above 1/8, `bwd_wgmma`), where the default
    /// carries FA2's error. The same kernels otherwise, about the same speed.
    pub save_residual: bool,
}

impl FwdOptions {
    /// The scale in effect for `head_dim`.
    pub fn scale(&self, head_dim: usize) -> f32 {
        self.softmax_scale.unwrap_or(1.0 / (head_dim as f32).sqrt())
    }
}

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
    /// FLOPs of the forward pass: 4 * b * h * sq * sk * d, halved when causal (the FA papers' count).
    pub fn fwd_flops(&self, causal: bool) -> f64 {
        let f = 4.0 * (self.batch * self.heads_q) as f64 * self.seqlen_q as f64 * self.seqlen_k as f64 * self.head_dim as f64;
        if causal { f / 2.0 } else { f }
    }
}

/// Largest batch and heads_q: the launch grid's y and z limits.
pub const MAX_GRID_YZ: usize = 65_535;
/// Largest |softmax_scale| accepted: far beyond any temperature in use (1/sqrt(head_dim) is
/// 0.06 to 1), and past the point where the softmax is a hard max on any data. Larger scales
/// would carry ordinary scores beyond what the kernels' f32 row statistics (m_i, LSE) hold
/// exactly; they are refused rather than turned into NaN rows.
pub const MAX_SCALE: f32 = 65536.0;
/// Largest sequence length: row indices are u32 in the kernels, with room for one tile past the end.
pub const MAX_SEQLEN: usize = (i32::MAX as usize) - 1024;

/// Checks Q, K, V and the options; returns the problem's dimensions. Runs before any launch.
pub fn validate(q: &[usize], k: &[usize], v: &[usize], opts: &FwdOptions) -> Result<AttnShape> {
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
    if !shape.head_dim.is_multiple_of(8) || shape.head_dim > 256 {
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
    if let Some(scale) = opts.softmax_scale
        && !(scale.abs() <= MAX_SCALE)
    {
        return Err(Error::InvalidScale { scale, max: MAX_SCALE });
    }
    Ok(shape)
}

/// What the forward pass returns.
pub struct FwdOutput<T> {
    /// O: [batch, seqlen_q, heads_q, head_dim], in the input dtype.
    pub o: Tensor<T>,
    /// LSE: [batch, heads_q, seqlen_q], f32, natural log of each row's softmax denominator
    /// (after scaling); -inf for rows that see no key.
    pub lse: Tensor<f32>,
    /// With [`FwdOptions::save_residual`] and a kernel that writes it: O_lo = T(O_f32 - O),
    /// laid out like O, so O + O_lo is the unrounded O to about twice T's precision.
    pub o_lo: Option<Tensor<T>>,
}

/// The variant that will run for this dtype, head_dim and options on a device that runs
/// kernels of `archs` ([`FlashAttn::archs`]): the named family's (whatever its arch: launching
/// it where it cannot run is [`Error::UnsupportedDevice`]), or the first family (in
/// [`FAMILIES`] order) that has one for these archs.
pub fn select_variant(
    dtype: flashattn_kernels::dtype::DType,
    head_dim: usize,
    opts: &FwdOptions,
    archs: &[Arch],
) -> Result<&'static FwdVariant> {
    let d = head_dim as u32;
    match opts.kernel {
        Some(family) if !FAMILIES.contains(&family) => Err(Error::UnknownKernel { name: family.into(), available: FAMILIES.to_vec() }),
        Some(family) => {
            fwd_variant(family, dtype, d).ok_or_else(|| Error::NoVariant { family: family.into(), dtype: dtype.name(), head_dim })
        }
        None => FAMILIES
            .iter()
            .filter_map(|f| fwd_variant(f, dtype, d))
            .find(|v| archs.contains(&v.arch))
            .ok_or_else(|| Error::NoVariant { family: "any".into(), dtype: dtype.name(), head_dim }),
    }
}

impl FlashAttn {
    /// The variant [`select_variant`] picks for this device; a named one this device cannot
    /// run (an sm_90a kernel off compute capability 9.0) is [`Error::UnsupportedDevice`].
    fn fwd_variant_for(&self, dtype: flashattn_kernels::dtype::DType, head_dim: usize, opts: &FwdOptions) -> Result<&'static FwdVariant> {
        let archs = self.archs();
        let variant = select_variant(dtype, head_dim, opts, &archs)?;
        if !archs.contains(&variant.arch) {
            return Err(Error::UnsupportedDevice { kernel: variant.name, needs: variant.arch, device: self.device_name() });
        }
        Ok(variant)
    }

    /// Attention forward: O = softmax(scale * Q K^T \[masked\]) V, and its LSE.
    /// Q: [batch, seqlen_q, heads_q, head_dim]; K, V: [batch, seqlen_k, heads_kv, head_dim].
    pub fn forward<T: Dtype>(&self, q: &Tensor<T>, k: &Tensor<T>, v: &Tensor<T>, opts: &FwdOptions) -> Result<FwdOutput<T>> {
        let shape = validate(q.shape(), k.shape(), v.shape(), opts)?;
        let variant = self.fwd_variant_for(T::DTYPE, shape.head_dim, opts)?;
        let mut o = self.alloc::<T>(&shape.q_shape())?;
        let mut lse = self.alloc::<f32>(&shape.lse_shape())?;
        let mut o_lo = match opts.save_residual && FWD_RESIDUAL_FAMILIES.contains(&variant.family) {
            true => Some(self.alloc::<T>(&shape.q_shape())?),
            false => None,
        };
        self.forward_impl(q, k, v, &mut o, &mut lse, o_lo.as_mut(), opts)?;
        Ok(FwdOutput { o, lse, o_lo })
    }

    /// As [`FlashAttn::forward`], writing into existing buffers `o` and `lse`.
    pub fn forward_into<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        o: &mut Tensor<T>,
        lse: &mut Tensor<f32>,
        opts: &FwdOptions,
    ) -> Result<()> {
        self.forward_impl(q, k, v, o, lse, None, opts)
    }

    /// The forward, writing O's residual to `o_lo` when given (the caller checked that the
    /// selected kernel writes it).
    #[allow(clippy::too_many_arguments)]
    fn forward_impl<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        o: &mut Tensor<T>,
        lse: &mut Tensor<f32>,
        mut o_lo: Option<&mut Tensor<T>>,
        opts: &FwdOptions,
    ) -> Result<()> {
        let shape = validate(q.shape(), k.shape(), v.shape(), opts)?;
        for (name, got, expected) in [("o", o.shape(), &shape.q_shape()[..]), ("lse", lse.shape(), &shape.lse_shape()[..])] {
            if got != expected {
                return Err(Error::OutputShape { tensor: name, expected: expected.to_vec(), got: got.to_vec() });
            }
        }
        self.check_owner(q, "q")?;
        self.check_owner(k, "k")?;
        self.check_owner(v, "v")?;
        self.check_owner(o, "o")?;
        self.check_owner(lse, "lse")?;
        if let Some(t) = &o_lo {
            self.check_owner(*t, "o_lo")?;
        }
        let variant = self.fwd_variant_for(T::DTYPE, shape.head_dim, opts)?;
        let d = shape.head_dim as u32;
        let smem = (variant.smem_bytes)(d) as usize;
        let grid = ((shape.seqlen_q as u32).div_ceil(variant.br), shape.heads_q as u32, shape.batch as u32);
        let stream = self.stream();
        let params = FwdParams {
            q: q.addr(stream),
            k: k.addr(stream),
            v: v.addr(stream),
            o: o.addr_mut(stream),
            lse: lse.addr_mut(stream),
            o_lo: o_lo.as_mut().map_or(0, |t| t.addr_mut(stream)),
            q_strides: shape.q_strides(),
            k_strides: shape.kv_strides(),
            v_strides: shape.kv_strides(),
            o_strides: shape.q_strides(),
            batch: shape.batch as u32,
            heads_q: shape.heads_q as u32,
            heads_kv: shape.heads_kv as u32,
            seqlen_q: shape.seqlen_q as u32,
            seqlen_k: shape.seqlen_k as u32,
            head_dim: d,
            scale: opts.scale(shape.head_dim),
            causal: opts.causal as u32,
        };
        let regions = [
            GlobalRegion { start: params.q as usize, len: q.bytes(), writable: false },
            GlobalRegion { start: params.k as usize, len: k.bytes(), writable: false },
            GlobalRegion { start: params.v as usize, len: v.bytes(), writable: false },
            GlobalRegion { start: params.o as usize, len: o.bytes(), writable: true },
            GlobalRegion { start: params.lse as usize, len: lse.bytes(), writable: true },
            GlobalRegion { start: params.o_lo as usize, len: o_lo.as_ref().map_or(0, |t| t.bytes()), writable: true },
        ];
        let launch = Launch { name: variant.name, arch: variant.arch, grid, threads: variant.threads, smem, emulate: variant.emulate };
        // SAFETY: the parameters were validated against the buffers above; the kernel reads q,
        // k, v and writes o and lse within their shapes.
        unsafe { self.launch("launching the forward kernel", &[launch], params, &regions) }
    }
}
