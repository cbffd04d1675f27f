//! FlashAttention for [candle](https://github.com/huggingface/candle): [`flash_attn`]
//! computes O = softmax(scale Q K^T \[causal mask\]) V with the `flashattn` crate's kernels,
//! and candle's autograd differentiates it with their backward.
//!
//! - Q, K, V are `[batch, seqlen, heads, head_dim]` (candle-flash-attn's layout), f16, bf16
//!   or f32, on one device; K and V may have fewer heads than Q (grouped-query attention,
//!   `heads_q` a multiple of `heads_kv`); every head_dim from 1 to 256.
//! - Any strides whose last is 1 are read in place: a `[b, h, s, d]` tensor transposed to
//!   `[b, s, h, d]`, or Q, K and V narrowed out of one packed `[b, s, 3, h, d]` projection.
//!   A tensor whose last dimension is strided is made contiguous first (candle's copy).
//! - On CUDA the kernels run on candle's stream, read candle's memory and write O and the
//!   gradients into allocations of candle's device: no copies, no host synchronisation. The
//!   forward keeps its row statistics (LSE: 4 bytes per query row and head) for the backward.
//! - On the CPU the same kernels run in `flashattn`'s emulator: slow, for tests and machines
//!   without a GPU.
//! - [`flash_attn_with`] takes `flashattn`'s [`Attention`] (sliding window, softcap);
//!   [`flash_attn_alibi`] and [`flash_attn_alibi_with`] add ALiBi from a candle tensor of
//!   slopes (candle-flash-attn's `flash_attn_alibi`).
//! - Invalid input (shapes that do not match, a head_dim above 256, a scale out of range, a
//!   dtype the kernels do not take, slopes of the wrong shape or not finite) is an error before
//!   any launch; `flashattn`'s typed error is inside candle's ([`candle_core::Error::Wrapped`]).
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::cuda_if_available(0)?;
//! let q = Tensor::randn(0f32, 1.0, (2, 1024, 16, 128), &dev)?.to_dtype(DType::BF16)?;
//! let (k, v) = (q.clone(), q.clone());
//! let o = flashattn_candle::flash_attn(&q, &k, &v, 1.0 / (128f32).sqrt(), true)?;
//! # Ok(()) }
//! ```

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
pub use flashattn::Attention;

/// Attention of `q` over `k`, `v` (`[batch, seqlen, heads, head_dim]` each), scores scaled
/// by `softmax_scale` (usually `1 / sqrt(head_dim)`), causal or not (bottom-right aligned:
/// query row i sees keys j <= i + seqlen_k - seqlen_q). O has `q`'s shape and dtype.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    flash_attn_with(q, k, v, Attention { causal, softmax_scale: Some(softmax_scale), ..Default::default() })
}

/// [`flash_attn`] with `flashattn`'s [`Attention`] (a scale of `None` is
/// `1 / sqrt(head_dim)`). Its sinks and ALiBi slopes, made on a `flashattn::FlashAttn` of
/// one's own, are not the op's device's (an error): ALiBi comes in by
/// [`flash_attn_alibi_with`].
pub fn flash_attn_with(q: &Tensor, k: &Tensor, v: &Tensor, attention: Attention) -> Result<Tensor> {
    apply(q, k, v, attention, None)
}

/// [`flash_attn`] with ALiBi (candle-flash-attn's `flash_attn_alibi`): query head h of
/// batch entry b adds -slope |i + seqlen_k - seqlen_q - j| to the score of query row i and
/// key j. `alibi_slopes` is f32, `[heads_q]` or `[batch, heads_q]`, on any device; its values
/// are read once per call (on CUDA a copy to the host: slopes are a handful of numbers).
/// Each must be finite; 0 is no bias for that head. The backward uses the same slopes (no
/// gradient for them).
pub fn flash_attn_alibi(q: &Tensor, k: &Tensor, v: &Tensor, alibi_slopes: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    flash_attn_alibi_with(q, k, v, alibi_slopes, Attention { causal, softmax_scale: Some(softmax_scale), ..Default::default() })
}

/// [`flash_attn_with`] and ALiBi slopes as [`flash_attn_alibi`] takes them (in place of any in
/// `attention`).
pub fn flash_attn_alibi_with(q: &Tensor, k: &Tensor, v: &Tensor, alibi_slopes: &Tensor, attention: Attention) -> Result<Tensor> {
    if alibi_slopes.dtype() != DType::F32 || !(1..=2).contains(&alibi_slopes.rank()) {
        candle_core::bail!(
            "flash_attn: alibi_slopes is {:?} of shape {:?}; expected F32 [heads_q] or [batch, heads_q]",
            alibi_slopes.dtype(),
            alibi_slopes.dims()
        );
    }
    let slopes = Slopes { values: alibi_slopes.flatten_all()?.to_vec1::<f32>()?, shape: alibi_slopes.dims().to_vec() };
    apply(q, k, v, Attention { alibi: None, ..attention }, Some(slopes))
}

/// ALiBi slopes from the host, made into `flashattn`'s on the device the op runs on.
struct Slopes {
    values: Vec<f32>,
    shape: Vec<usize>,
}

/// The checks and the op, for [`flash_attn_with`] and [`flash_attn_alibi_with`].
fn apply(q: &Tensor, k: &Tensor, v: &Tensor, attention: Attention, alibi: Option<Slopes>) -> Result<Tensor> {
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        if t.rank() != 4 {
            candle_core::bail!("flash_attn: {name} has shape {:?}; expected [batch, seqlen, heads, head_dim]", t.dims());
        }
        if t.dtype() != q.dtype() {
            candle_core::bail!("flash_attn: {name} is {:?} and q {:?}; they must be one dtype", t.dtype(), q.dtype());
        }
        if !t.device().same_device(q.device()) {
            candle_core::bail!("flash_attn: {name} is on {:?} and q on {:?}", t.device().location(), q.device().location());
        }
    }
    let (q, k, v) = (unit_last(q)?, unit_last(k)?, unit_last(v)?);
    // candle calls the op's backward only when an input is tracked; without one the LSE is
    // not kept (on CUDA it goes to a reused scratch buffer: one allocation a call fewer).
    let backward = q.track_op() || k.track_op() || v.track_op();
    q.apply_op3(
        &k,
        &v,
        FlashAttnOp {
            attention,
            alibi,
            backward,
            #[cfg(feature = "cuda")]
            saved: Default::default(),
        },
    )
}

/// The tensor itself when its last stride is 1 (the kernels read rows), else a contiguous
/// copy.
fn unit_last(t: &Tensor) -> Result<Tensor> {
    if t.stride().last() == Some(&1) { Ok(t.clone()) } else { t.contiguous() }
}

/// `flashattn`'s error inside candle's.
fn wrap(e: flashattn::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// The element types both crates share.
#[cfg(not(feature = "cuda"))]
trait Elem: flashattn::Dtype + candle_core::WithDType {}
#[cfg(feature = "cuda")]
trait Elem: flashattn::Dtype + candle_core::WithDType + candle_core::cuda_backend::CudaDType + flashattn::cudarc::driver::DeviceRepr {}
impl Elem for f32 {}
impl Elem for half::f16 {}
impl Elem for half::bf16 {}

/// `$body` with `$t` the element type of `$dtype` (f16, bf16, f32; others an error).
macro_rules! with_elem {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            DType::F32 => {
                type $t = f32;
                $body
            }
            other => Err(candle_core::Error::UnsupportedDTypeForOp(other, "flash_attn")),
        }
    };
}

/// The op in candle's graph: one per [`flash_attn`] call. On CUDA it keeps what the forward
/// wrote beside O for its backward.
struct FlashAttnOp {
    attention: Attention,
    /// ALiBi slopes, made on the device at each forward (and backward on the CPU).
    alibi: Option<Slopes>,
    /// Whether candle may call `bwd` (an input is tracked): the forward keeps its LSE.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    backward: bool,
    #[cfg(feature = "cuda")]
    saved: std::sync::Mutex<Option<cuda::Saved>>,
}

impl FlashAttnOp {
    /// The attention with its ALiBi slopes on `fa` (checked there: each finite).
    fn attention_on(&self, fa: &flashattn::FlashAttn) -> Result<Attention> {
        let alibi = match &self.alibi {
            Some(s) => Some(fa.alibi_slopes(&s.values, &s.shape).map_err(wrap)?),
            None => self.attention.alibi.clone(),
        };
        Ok(Attention { alibi, ..self.attention.clone() })
    }
}

impl CustomOp3 for FlashAttnOp {
    fn name(&self) -> &'static str {
        "flashattn"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        lq: &Layout,
        k: &CpuStorage,
        lk: &Layout,
        v: &CpuStorage,
        lv: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        with_elem!(q.dtype(), T => cpu::forward::<T>(self, [(q, lq), (k, lk), (v, lv)]))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        lq: &Layout,
        k: &candle_core::CudaStorage,
        lk: &Layout,
        v: &candle_core::CudaStorage,
        lv: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        with_elem!(q.dtype(), T => cuda::forward::<T>(self, [(q, lq), (k, lk), (v, lv)]))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d_o = unit_last(d_o)?;
        let _ = o;
        let [dq, dk, dv] = match q.device() {
            candle_core::Device::Cpu => with_elem!(q.dtype(), T => cpu::backward::<T>(self, [q, k, v, &d_o]))?,
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(_) => with_elem!(q.dtype(), T => cuda::backward::<T>(self, [q, k, v, o, &d_o]))?,
            other => candle_core::bail!("flash_attn: no backward on {:?}", other.location()),
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
