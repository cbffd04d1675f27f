//! FlashAttention in Rust.
//!
//! The kernels are `no_std` Rust (crate `flashattn-kernels`), compiled to PTX at build time
//! by this crate's `build.rs` with rustc's NVPTX backend: no CUDA toolkit is needed to build,
//! and the CUDA driver is loaded at run time through `cudarc`. The same kernel source also
//! runs on the CPU under an emulator of the CUDA execution model ([`FlashAttn::emulator`]).
//!
//! ```no_run
//! use flashattn::{Attention, BwdOptions, FlashAttn, FwdOptions};
//! # fn main() -> Result<(), flashattn::Error> {
//! let fa = FlashAttn::cuda(0)?; // or FlashAttn::emulator()
//! let (b, s, h, d) = (2, 1024, 16, 64);
//! let host: Vec<half::f16> = (0..b * s * h * d).map(|i| half::f16::from_f32((i % 7) as f32 / 7.0)).collect();
//! let q = fa.upload(&host, &[b, s, h, d])?;
//! let k = fa.upload(&host, &[b, s, h, d])?;
//! let v = fa.upload(&host, &[b, s, h, d])?;
//! let out = fa.forward(&q, &k, &v, &Attention::causal(), &FwdOptions::default())?;
//! let o: Vec<half::f16> = fa.download(out.o())?; // [b, s, h, d]
//! let lse: Vec<f32> = fa.download(out.lse())?; // [b, h, s]
//! // The backward takes the forward's output: its attention, O and LSE.
//! let d_o = fa.upload(&host, &[b, s, h, d])?;
//! let grads = fa.backward(&q, &k, &v, &out, &d_o, &BwdOptions::default())?;
//! let dq: Vec<half::f16> = fa.download(&grads.dq)?;
//! # Ok(()) }
//! ```

mod alibi;
mod backward;
mod device;
mod dtype;
mod error;
mod forward;
mod kvcache;
mod merge;
mod options;
#[doc(hidden)]
pub mod ptx;
pub mod reference;
#[doc(hidden)]
pub mod rng;
mod sinks;
mod split;
mod timing;
mod varlen;
mod view;

pub use alibi::{AlibiSlopes, MAX_ALIBI_BIAS, alibi_paper_slopes};
pub use backward::{BwdBuffers, BwdInputs, BwdOutput, select_bwd_variants};
/// cudarc, as this crate uses it (the types of [`View::cuda`] and [`FlashAttn::from_stream`]).
pub use cudarc;
pub use device::{FlashAttn, Tensor, driver_present};
pub use dtype::Dtype;
pub use error::{Error, Result};
pub use flashattn_kernels as kernels;
pub use flashattn_kernels::registry::{Arch, BWD_FAMILIES, BwdFamily, Entry, FWD_FAMILIES, FwdFamily, Pass};
pub use forward::{
    AttnShape, Forward, FwdBuffers, FwdOutput, MAX_GRID_YZ, MAX_SCALE, MAX_SEQLEN, MAX_SOFTCAP, MIN_SOFTCAP, select_variant,
    select_variant_for, validate, validate_varlen,
};
pub use kvcache::KvCache;
pub use options::{Attention, BwdOptions, FwdOptions, Window};
pub use sinks::Sinks;
pub use split::{MAX_AUTO_SPLITS, MIN_AUTO_PART_TILES, auto_splits, check_splits};
pub use varlen::{SeqLenDims, SeqLens};
pub use view::{AsView, View, ViewMut, contiguous_strides};
