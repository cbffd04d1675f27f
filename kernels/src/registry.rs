//! Every kernel variant, one registration line each. The macro emits the PTX entry point
//! (on nvptx64) and a row of [`FWD_VARIANTS`], which the host, the tests and the benches
//! read to find, launch and emulate each variant.

#[cfg(not(target_arch = "nvptx64"))]
use crate::dtype::{DType, Element};
use crate::dtype::Bf16;
use crate::params::FwdParams;
#[cfg(not(target_arch = "nvptx64"))]
use crate::tile::SimtTile;
use crate::tile::simt_tile;

/// A forward kernel variant.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct FwdVariant {
    /// PTX entry name.
    pub name: &'static str,
    /// Kernel family ("simt").
    pub family: &'static str,
    /// Element type of Q, K, V, O.
    pub dtype: DType,
    /// Tile shape; it also bounds head_dim.
    pub tile: SimtTile,
    /// The same kernel body, for the emulator.
    pub emulate: unsafe fn(&FwdParams),
}

macro_rules! fwd_variants {
    ($( $name:ident => $family:literal, $m:ident, $ty:ty, d <= $d:literal; )*) => {
        $(
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
                unsafe {
                    crate::$m::entry::<$ty, { simt_tile($d).rows_per_warp as usize }, { simt_tile($d).d_chunks as usize }, { simt_tile($d).s_cols as usize }>(&p)
                }
            }
        )*
        /// All forward variants.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const FWD_VARIANTS: &[FwdVariant] = &[$(
            FwdVariant {
                name: stringify!($name),
                family: $family,
                dtype: <$ty as Element>::DTYPE,
                tile: simt_tile($d),
                emulate: crate::$m::entry::<$ty, { simt_tile($d).rows_per_warp as usize }, { simt_tile($d).d_chunks as usize }, { simt_tile($d).s_cols as usize }>,
            },
        )*];
    };
}

fwd_variants! {
    flash_fwd_simt_f32_d64   => "simt", fwd_simt, f32,  d <= 64;
    flash_fwd_simt_f32_d128  => "simt", fwd_simt, f32,  d <= 128;
    flash_fwd_simt_f32_d256  => "simt", fwd_simt, f32,  d <= 256;
    flash_fwd_simt_f16_d64   => "simt", fwd_simt, f16,  d <= 64;
    flash_fwd_simt_f16_d128  => "simt", fwd_simt, f16,  d <= 128;
    flash_fwd_simt_f16_d256  => "simt", fwd_simt, f16,  d <= 256;
    flash_fwd_simt_bf16_d64  => "simt", fwd_simt, Bf16, d <= 64;
    flash_fwd_simt_bf16_d128 => "simt", fwd_simt, Bf16, d <= 128;
    flash_fwd_simt_bf16_d256 => "simt", fwd_simt, Bf16, d <= 256;
}

#[cfg(not(target_arch = "nvptx64"))]
/// The SIMT forward variant for `dtype` and `head_dim`: the one whose tile is `simt_tile(head_dim)`.
pub fn simt_fwd_variant(dtype: DType, head_dim: u32) -> Option<&'static FwdVariant> {
    let tile = simt_tile(head_dim);
    FWD_VARIANTS.iter().find(|v| v.family == "simt" && v.dtype == dtype && v.tile == tile)
}
