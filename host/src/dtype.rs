//! Host element types and their kernel-side tags.

use cudarc::driver::DeviceRepr;
use flashattn_kernels::dtype::DType;

mod sealed {
    /// The element types the kernels are compiled for; no others can implement [`super::Dtype`].
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type of Q, K, V and O: `f32`, `half::f16` or `half::bf16` (sealed: the kernels
/// exist for these three only).
pub trait Dtype: sealed::Sealed + DeviceRepr + Copy + Default + Send + Sync + std::fmt::Debug + 'static {
    /// The kernel-side tag.
    const DTYPE: DType;
    /// Unit roundoff (half the distance from 1 to the next value).
    const UNIT_ROUNDOFF: f64;
    /// Exact widening.
    fn to_f64(self) -> f64;
    /// Rounds to nearest.
    fn from_f64(x: f64) -> Self;
    /// Rounds to nearest.
    fn from_f32(x: f32) -> Self;
    /// Exact widening.
    fn to_f32(self) -> f32;
    /// A NaN, for poisoning outputs.
    fn nan() -> Self;
}

impl Dtype for f32 {
    const DTYPE: DType = DType::F32;
    const UNIT_ROUNDOFF: f64 = 5.960464477539063e-8; // 2^-24
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn nan() -> Self {
        f32::NAN
    }
}

impl Dtype for half::f16 {
    const DTYPE: DType = DType::F16;
    const UNIT_ROUNDOFF: f64 = 4.8828125e-4; // 2^-11
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    fn nan() -> Self {
        half::f16::NAN
    }
}

impl Dtype for half::bf16 {
    const DTYPE: DType = DType::Bf16;
    const UNIT_ROUNDOFF: f64 = 3.90625e-3; // 2^-8
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    fn nan() -> Self {
        half::bf16::NAN
    }
}
