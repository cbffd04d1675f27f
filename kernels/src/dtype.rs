//! Element types of Q, K, V and O. Arithmetic is always f32; these only load and store.

/// Which element type a buffer holds; part of every variant's identity.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32 = 0,
    /// IEEE binary16.
    F16 = 1,
    /// bfloat16 (the top half of a binary32).
    Bf16 = 2,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }
    /// Short name, as used in kernel entry names.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }
}

/// An element type the kernels read and write.
pub trait Element: Copy + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// Widens to f32 (exact for all three types).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type, to nearest even.
    fn from_f32(x: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

/// IEEE binary16, bit-compatible with `half::f16` on the host (a plain struct rather than
/// Rust's `f16`, which is nightly-only: the host build compiles on stable).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct F16(pub u16);

impl Element for F16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::dev::math::f16_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        F16(crate::dev::math::f32_to_f16(x))
    }
}

/// bfloat16, bit-compatible with `half::bf16` on the host.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16(pub u16);

impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        let b = x.to_bits();
        if x.is_nan() {
            // Keep it a (quiet) NaN: truncation could clear every mantissa bit.
            return Bf16(((b >> 16) as u16) | 0x0040);
        }
        // Round to nearest, ties to even.
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
        Bf16((rounded >> 16) as u16)
    }
}

/// A 16-bit element type the tensor cores take (mma.sync m16n8k16 with f32 accumulation).
pub trait MmaElement: Element {
    /// The softmax domain of the 16-bit kernels (see [`crate::softmax`]).
    type Dm: crate::softmax::Domain;
    /// Whether this is bf16 (the wgmma instruction's type suffix).
    const BF16: bool;
    /// D = A B + C for the warp (see [`crate::dev::warp::mma_f16`]).
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];
    /// Two f32 rounded to this type, packed into an operand register (lo in the low half).
    fn pack2(lo: f32, hi: f32) -> u32;
    /// The two values of a [`MmaElement::pack2`] register, exactly, as f32.
    #[inline(always)]
    fn unpack2(w: u32) -> (f32, f32) {
        let half = |b: u16| if Self::BF16 { f32::from_bits((b as u32) << 16) } else { crate::dev::math::f16_to_f32(b) };
        (half(w as u16), half((w >> 16) as u16))
    }
}

impl MmaElement for F16 {
    type Dm = crate::softmax::Log2;
    const BF16: bool = false;
    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        crate::dev::warp::mma_f16(a, b, c)
    }
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        crate::dev::math::pack_f16x2(lo, hi)
    }
}

impl MmaElement for Bf16 {
    type Dm = crate::softmax::Log2;
    const BF16: bool = true;
    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        crate::dev::warp::mma_bf16(a, b, c)
    }
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        crate::dev::math::pack_bf16x2(lo, hi)
    }
}
