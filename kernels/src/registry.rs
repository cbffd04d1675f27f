//! Every kernel variant, one registration line each. The macros emit the PTX entry point
//! (on nvptx64) and a row of [`FWD_VARIANTS`], which the host, the tests and the benches
//! read to find, launch and emulate each variant.

// Each PTX module compiles only its own kernels: the other module's helpers go unused there.
#![cfg_attr(target_arch = "nvptx64", allow(unused_imports, unused_macros, dead_code))]

use crate::dtype::{Bf16, F16};
#[cfg(not(target_arch = "nvptx64"))]
use crate::dtype::{DType, Element};
use crate::params::{BwdParams, FwdParams};
use crate::tile::{
    MmaBwdTile, MmaTile, WgmmaBwdTile, WgmmaTile, mma_bwd_tile, mma_tile, mma_tile_br64, mma_tile_unfused, simt_dq_smem_bytes,
    simt_kv_tile, simt_tile, wgmma_bwd_tile, wgmma_tile, wgmma_tile_wg2,
};

/// The PTX module a variant is compiled into, and so the devices it runs on.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// `-Ctarget-cpu=sm_80`: every device of compute capability 8.0 and later.
    Sm80,
    /// `-Ctarget-cpu=sm_90a` (wgmma, setmaxnreg): compute capability 9.0 only (H100, H200);
    /// architecture-specific code does not run on later GPUs.
    Sm90a,
}

/// Emits `$item` into the PTX module of `$arch` only: the sm_80 module holds the portable
/// kernels, the sm_90a module only the kernels that need it (so each is built once).
macro_rules! in_module {
    (Sm80, $item:item) => {
        #[cfg(all(target_arch = "nvptx64", not(target_feature = "sm_90a")))]
        $item
    };
    (Sm90a, $item:item) => {
        #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
        $item
    };
}

/// A forward kernel variant, as the host launches it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct FwdVariant {
    /// PTX entry name.
    pub name: &'static str,
    /// Kernel family ("mma", "simt").
    pub family: &'static str,
    /// Element type of Q, K, V, O.
    pub dtype: DType,
    /// Smallest and largest head_dim served.
    pub head_dims: (u32, u32),
    /// Query rows per block (the grid's x is ceil(seqlen_q / br)).
    pub br: u32,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory in bytes, for a head_dim.
    pub smem_bytes: fn(u32) -> u32,
    /// The same kernel body, for the emulator.
    pub emulate: unsafe fn(&FwdParams),
    /// The PTX module that holds it (the devices it runs on).
    pub arch: Arch,
}

#[cfg(not(target_arch = "nvptx64"))]
impl FwdVariant {
    /// Whether this variant serves `head_dim`.
    pub fn serves(&self, head_dim: u32) -> bool {
        self.head_dims.0 <= head_dim && head_dim <= self.head_dims.1
    }
}

/// Emits one entry point and one registry row per line: `name => family, body, head dims,
/// br, threads, smem_bytes(d)`.
macro_rules! fwd_variants {
    ($( $name:ident => $family:literal @ $arch:ident, [$($body:tt)*], $dt:ty, ($lo:expr, $hi:expr), $br:expr, $threads:expr, $smem:expr; )*) => {
        $(
            in_module!($arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
                unsafe { $($body)*(&p) }
            });
        )*
        /// All forward variants.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const FWD_VARIANTS: &[FwdVariant] = &[$(
            FwdVariant {
                name: stringify!($name),
                family: $family,
                dtype: <$dt as Element>::DTYPE,
                head_dims: ($lo, $hi),
                br: $br,
                threads: $threads,
                smem_bytes: $smem,
                emulate: $($body)*,
                arch: Arch::$arch,
            },
        )*];
    };
}

/// One SIMT variant: the head dims that share `simt_tile(D)`, compiled for the largest, D.
macro_rules! simt {
    ($ty:ty, $d:literal) => {
        crate::fwd_simt::entry::<
            $ty,
            { simt_tile($d).rows_per_warp as usize },
            { simt_tile($d).d_chunks as usize },
            { simt_tile($d).s_cols as usize },
        >
    };
}

/// One tensor-core variant: the tile `$tile(d)` (a tile function of `tile.rs`) chooses for
/// head_dim `d`; the variant serves every head_dim that maps to the same tile.
macro_rules! mma {
    ($ty:ty, $tile:ident, $d:literal) => {
        crate::fwd_mma::entry::<
            $ty,
            { mma_field($tile($d), 3) as usize },
            { mma_field($tile($d), 3) as usize / 16 },
            { mma_field($tile($d), 3) as usize / 8 },
            { mma_field($tile($d), 0) as usize },
            { mma_field($tile($d), 1) as usize },
            { mma_field($tile($d), 1) as usize / 8 },
            { mma_field($tile($d), 2) != 0 },
            { mma_field($tile($d), 4) != 0 },
            { mma_field($tile($d), 5) != 0 },
        >
    };
}

/// One Hopper variant: the tile `wgmma_tile(d)` chooses; it serves every head_dim that maps
/// to the same tile.
macro_rules! wgmma {
    ($ty:ty, $tile:ident, $d:literal) => {
        crate::fwd_wgmma::entry::<
            $ty,
            { wg_field($tile($d), 2) as usize },
            { wg_field($tile($d), 0) as usize },
            { wg_field($tile($d), 1) as usize },
            { wg_field($tile($d), 1) as usize / 8 },
            { wg_field($tile($d), 2) as usize / 8 },
            { wg_field($tile($d), 1) as usize / 16 },
            { wg_field($tile($d), 3) != 0 },
        >
    };
}

/// Field `i` of a Hopper tile (warpgroups, bc, head_dim, padded), for const generic arguments.
const fn wg_field(t: Option<WgmmaTile>, i: u32) -> u32 {
    match t {
        Some(t) => match i {
            0 => t.warpgroups,
            1 => t.bc,
            2 => t.head_dim,
            _ => t.padded as u32,
        },
        None => 0,
    }
}
const fn wg_smem(d: u32) -> u32 {
    match wgmma_tile(d) {
        Some(t) => t.smem_bytes(),
        None => 0,
    }
}
const fn wg2_smem(d: u32) -> u32 {
    match wgmma_tile_wg2(d) {
        Some(t) => t.smem_bytes(),
        None => 0,
    }
}
const fn wg_br(t: Option<WgmmaTile>) -> u32 {
    wg_field(t, 0) * 64
}
const fn wg_threads(t: Option<WgmmaTile>) -> u32 {
    wg_field(t, 0) * 128
}

/// Field `i` of a tile (m_tiles, bc, q_in_regs, head_dim, padded, fused_exp), for const
/// generic arguments.
const fn mma_field(t: Option<MmaTile>, i: u32) -> u32 {
    match t {
        Some(t) => match i {
            0 => t.m_tiles,
            1 => t.bc,
            2 => t.q_in_regs as u32,
            3 => t.head_dim,
            4 => t.padded as u32,
            _ => t.fused_exp as u32,
        },
        None => 0,
    }
}
const fn mma_smem(d: u32) -> u32 {
    match mma_tile(d) {
        Some(t) => t.smem_bytes(),
        None => 0,
    }
}
const fn mma_br(d: u32) -> u32 {
    match mma_tile(d) {
        Some(t) => t.br(),
        None => 0,
    }
}
const fn mma_br64_smem(d: u32) -> u32 {
    match mma_tile_br64(d) {
        Some(t) => t.smem_bytes(),
        None => 0,
    }
}
const fn simt_smem(d: u32) -> u32 {
    simt_tile(d).smem_bytes(d)
}
const MMA_THREADS: u32 = crate::tile::MMA_WARPS * 32;

fwd_variants! {
    flash_fwd_mma_f16_d32        => "mma" @ Sm80,      [mma!(F16, mma_tile, 32)],        F16,  (1, 32),    mma_br(32),  MMA_THREADS, mma_smem;
    flash_fwd_mma_f16_d64p       => "mma" @ Sm80,      [mma!(F16, mma_tile, 56)],        F16,  (33, 63),   mma_br(56),  MMA_THREADS, mma_smem;
    flash_fwd_mma_f16_d64        => "mma" @ Sm80,      [mma!(F16, mma_tile, 64)],        F16,  (64, 64),   mma_br(64),  MMA_THREADS, mma_smem;
    flash_fwd_mma_f16_d96        => "mma" @ Sm80,      [mma!(F16, mma_tile, 96)],        F16,  (65, 96),   mma_br(96),  MMA_THREADS, mma_smem;
    flash_fwd_mma_f16_d128p      => "mma" @ Sm80,      [mma!(F16, mma_tile, 120)],       F16,  (97, 127), mma_br(120), MMA_THREADS, mma_smem;
    flash_fwd_mma_f16_d128       => "mma" @ Sm80,      [mma!(F16, mma_tile, 128)],       F16,  (128, 128), mma_br(128), MMA_THREADS, mma_smem;
    flash_fwd_mma_f16_d192       => "mma" @ Sm80,      [mma!(F16, mma_tile, 192)],       F16,  (129, 192), mma_br(192), MMA_THREADS, mma_smem;
    flash_fwd_mma_f16_d256       => "mma" @ Sm80,      [mma!(F16, mma_tile, 256)],       F16,  (193, 256), mma_br(256), MMA_THREADS, mma_smem;
    flash_fwd_mma_bf16_d32       => "mma" @ Sm80,      [mma!(Bf16, mma_tile, 32)],       Bf16, (1, 32),    mma_br(32),  MMA_THREADS, mma_smem;
    flash_fwd_mma_bf16_d64p      => "mma" @ Sm80,      [mma!(Bf16, mma_tile, 56)],       Bf16, (33, 63),   mma_br(56),  MMA_THREADS, mma_smem;
    flash_fwd_mma_bf16_d64       => "mma" @ Sm80,      [mma!(Bf16, mma_tile, 64)],       Bf16, (64, 64),   mma_br(64),  MMA_THREADS, mma_smem;
    flash_fwd_mma_bf16_d96       => "mma" @ Sm80,      [mma!(Bf16, mma_tile, 96)],       Bf16, (65, 96),   mma_br(96),  MMA_THREADS, mma_smem;
    flash_fwd_mma_bf16_d128p     => "mma" @ Sm80,      [mma!(Bf16, mma_tile, 120)],      Bf16, (97, 127), mma_br(120), MMA_THREADS, mma_smem;
    flash_fwd_mma_bf16_d128      => "mma" @ Sm80,      [mma!(Bf16, mma_tile, 128)],      Bf16, (128, 128), mma_br(128), MMA_THREADS, mma_smem;
    flash_fwd_mma_bf16_d192      => "mma" @ Sm80,      [mma!(Bf16, mma_tile, 192)],      Bf16, (129, 192), mma_br(192), MMA_THREADS, mma_smem;
    flash_fwd_mma_bf16_d256      => "mma" @ Sm80,      [mma!(Bf16, mma_tile, 256)],      Bf16, (193, 256), mma_br(256), MMA_THREADS, mma_smem;
    flash_fwd_mma_br64_f16_d64   => "mma_br64" @ Sm80, [mma!(F16, mma_tile_br64, 64)],   F16,  (64, 64),   64,          MMA_THREADS, mma_br64_smem;
    flash_fwd_mma_br64_f16_d128  => "mma_br64" @ Sm80, [mma!(F16, mma_tile_br64, 128)],  F16,  (128, 128), 64,          MMA_THREADS, mma_br64_smem;
    flash_fwd_mma_br64_bf16_d64  => "mma_br64" @ Sm80, [mma!(Bf16, mma_tile_br64, 64)],  Bf16, (64, 64),   64,          MMA_THREADS, mma_br64_smem;
    flash_fwd_mma_br64_bf16_d128 => "mma_br64" @ Sm80, [mma!(Bf16, mma_tile_br64, 128)], Bf16, (128, 128), 64,          MMA_THREADS, mma_br64_smem;
    flash_fwd_mma_unfused_f16_d64   => "mma_unfused" @ Sm80, [mma!(F16, mma_tile_unfused, 64)],   F16,  (64, 64),   mma_br(64),  MMA_THREADS, mma_smem;
    flash_fwd_mma_unfused_bf16_d64  => "mma_unfused" @ Sm80, [mma!(Bf16, mma_tile_unfused, 64)],  Bf16, (64, 64),   mma_br(64),  MMA_THREADS, mma_smem;
    flash_fwd_wgmma_f16_d64p  => "wgmma" @ Sm90a,     [wgmma!(F16, wgmma_tile, 56)],    F16,   (1, 63),    wg_br(wgmma_tile(56)), wg_threads(wgmma_tile(56)), wg_smem;
    flash_fwd_wgmma_f16_d64   => "wgmma" @ Sm90a,     [wgmma!(F16, wgmma_tile, 64)],    F16,   (64, 64),   wg_br(wgmma_tile(64)), wg_threads(wgmma_tile(64)), wg_smem;
    flash_fwd_wgmma_f16_d128p => "wgmma" @ Sm90a,     [wgmma!(F16, wgmma_tile, 120)],   F16,   (65, 127),  wg_br(wgmma_tile(120)), wg_threads(wgmma_tile(120)), wg_smem;
    flash_fwd_wgmma_f16_d128  => "wgmma" @ Sm90a,     [wgmma!(F16, wgmma_tile, 128)],   F16,   (128, 128), wg_br(wgmma_tile(128)), wg_threads(wgmma_tile(128)), wg_smem;
    flash_fwd_wgmma_f16_d192p => "wgmma" @ Sm90a,     [wgmma!(F16, wgmma_tile, 184)],   F16,   (129, 191), wg_br(wgmma_tile(184)), wg_threads(wgmma_tile(184)), wg_smem;
    flash_fwd_wgmma_f16_d192  => "wgmma" @ Sm90a,     [wgmma!(F16, wgmma_tile, 192)],   F16,   (192, 192), wg_br(wgmma_tile(192)), wg_threads(wgmma_tile(192)), wg_smem;
    flash_fwd_wgmma_f16_d256p => "wgmma" @ Sm90a,     [wgmma!(F16, wgmma_tile, 248)],   F16,   (193, 255), wg_br(wgmma_tile(248)), wg_threads(wgmma_tile(248)), wg_smem;
    flash_fwd_wgmma_f16_d256  => "wgmma" @ Sm90a,     [wgmma!(F16, wgmma_tile, 256)],   F16,   (256, 256), wg_br(wgmma_tile(256)), wg_threads(wgmma_tile(256)), wg_smem;
    flash_fwd_wgmma_bf16_d64p  => "wgmma" @ Sm90a,     [wgmma!(Bf16, wgmma_tile, 56)],   Bf16,  (1, 63),    wg_br(wgmma_tile(56)), wg_threads(wgmma_tile(56)), wg_smem;
    flash_fwd_wgmma_bf16_d64   => "wgmma" @ Sm90a,     [wgmma!(Bf16, wgmma_tile, 64)],   Bf16,  (64, 64),   wg_br(wgmma_tile(64)), wg_threads(wgmma_tile(64)), wg_smem;
    flash_fwd_wgmma_bf16_d128p => "wgmma" @ Sm90a,     [wgmma!(Bf16, wgmma_tile, 120)],  Bf16,  (65, 127),  wg_br(wgmma_tile(120)), wg_threads(wgmma_tile(120)), wg_smem;
    flash_fwd_wgmma_bf16_d128  => "wgmma" @ Sm90a,     [wgmma!(Bf16, wgmma_tile, 128)],  Bf16,  (128, 128), wg_br(wgmma_tile(128)), wg_threads(wgmma_tile(128)), wg_smem;
    flash_fwd_wgmma_bf16_d192p => "wgmma" @ Sm90a,     [wgmma!(Bf16, wgmma_tile, 184)],  Bf16,  (129, 191), wg_br(wgmma_tile(184)), wg_threads(wgmma_tile(184)), wg_smem;
    flash_fwd_wgmma_bf16_d192  => "wgmma" @ Sm90a,     [wgmma!(Bf16, wgmma_tile, 192)],  Bf16,  (192, 192), wg_br(wgmma_tile(192)), wg_threads(wgmma_tile(192)), wg_smem;
    flash_fwd_wgmma_bf16_d256p => "wgmma" @ Sm90a,     [wgmma!(Bf16, wgmma_tile, 248)],  Bf16,  (193, 255), wg_br(wgmma_tile(248)), wg_threads(wgmma_tile(248)), wg_smem;
    flash_fwd_wgmma_bf16_d256  => "wgmma" @ Sm90a,     [wgmma!(Bf16, wgmma_tile, 256)],  Bf16,  (256, 256), wg_br(wgmma_tile(256)), wg_threads(wgmma_tile(256)), wg_smem;
    flash_fwd_wgmma_wg2_f16_d64 => "wgmma_wg2" @ Sm90a, [wgmma!(F16, wgmma_tile_wg2, 64)], F16, (64, 64), wg_br(wgmma_tile_wg2(64)), wg_threads(wgmma_tile_wg2(64)), wg2_smem;
    flash_fwd_wgmma_wg2_f16_d128 => "wgmma_wg2" @ Sm90a, [wgmma!(F16, wgmma_tile_wg2, 128)], F16, (128, 128), wg_br(wgmma_tile_wg2(128)), wg_threads(wgmma_tile_wg2(128)), wg2_smem;
    flash_fwd_wgmma_wg2_bf16_d64 => "wgmma_wg2" @ Sm90a, [wgmma!(Bf16, wgmma_tile_wg2, 64)], Bf16, (64, 64), wg_br(wgmma_tile_wg2(64)), wg_threads(wgmma_tile_wg2(64)), wg2_smem;
    flash_fwd_wgmma_wg2_bf16_d128 => "wgmma_wg2" @ Sm90a, [wgmma!(Bf16, wgmma_tile_wg2, 128)], Bf16, (128, 128), wg_br(wgmma_tile_wg2(128)), wg_threads(wgmma_tile_wg2(128)), wg2_smem;
    flash_fwd_simt_f32_d64   => "simt" @ Sm80, [simt!(f32, 64)],     f32,  (1, 64),     simt_tile(64).br(), 128, simt_smem;
    flash_fwd_simt_f32_d128  => "simt" @ Sm80, [simt!(f32, 128)],   f32,  (65, 128),   simt_tile(128).br(), 128, simt_smem;
    flash_fwd_simt_f32_d256  => "simt" @ Sm80, [simt!(f32, 256)],  f32,  (129, 256),  simt_tile(256).br(), 128, simt_smem;
    flash_fwd_simt_f16_d64   => "simt" @ Sm80, [simt!(F16, 64)],     F16,  (1, 64),     simt_tile(64).br(), 128, simt_smem;
    flash_fwd_simt_f16_d128  => "simt" @ Sm80, [simt!(F16, 128)],   F16,  (65, 128),   simt_tile(128).br(), 128, simt_smem;
    flash_fwd_simt_f16_d256  => "simt" @ Sm80, [simt!(F16, 256)],  F16,  (129, 256),  simt_tile(256).br(), 128, simt_smem;
    flash_fwd_simt_bf16_d64  => "simt" @ Sm80, [simt!(Bf16, 64)],    Bf16, (1, 64),     simt_tile(64).br(), 128, simt_smem;
    flash_fwd_simt_bf16_d128 => "simt" @ Sm80, [simt!(Bf16, 128)],  Bf16, (65, 128),   simt_tile(128).br(), 128, simt_smem;
    flash_fwd_simt_bf16_d256 => "simt" @ Sm80, [simt!(Bf16, 256)], Bf16, (129, 256),  simt_tile(256).br(), 128, simt_smem;
}

/// Kernel families in the order automatic selection tries them (best first), among those the
/// device runs: the Hopper kernel (`wgmma`, compute capability 9.0, 16-bit, head_dim <= 256),
/// the tensor-core kernel (`mma`, sm_80+, 16-bit), else SIMT. Chosen only by name, for
/// comparison: `mma_br64` (the first tensor-core tile), `mma_unfused` (the softmax on scaled
/// scores, head_dim 64), `wgmma_wg2` (the first Hopper tile: two warpgroups per block, d = 64 and 128).
#[cfg(not(target_arch = "nvptx64"))]
pub const FAMILIES: &[&str] = &["wgmma", "mma", "simt", "mma_br64", "mma_unfused", "wgmma_wg2"];
/// The forward families whose kernels write O's rounding residual when asked
/// (`FwdParams::o_lo`, for the backward's `prep` pass).
#[cfg(not(target_arch = "nvptx64"))]
pub const FWD_RESIDUAL_FAMILIES: &[&str] = &["wgmma", "wgmma_wg2"];

/// The variant of `family` for `dtype` and `head_dim`, if there is one.
#[cfg(not(target_arch = "nvptx64"))]
pub fn fwd_variant(family: &str, dtype: DType, head_dim: u32) -> Option<&'static FwdVariant> {
    FWD_VARIANTS.iter().find(|v| v.family == family && v.dtype == dtype && v.serves(head_dim))
}

/// A backward kernel variant, as the host launches it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct BwdVariant {
    /// PTX entry name.
    pub name: &'static str,
    /// Kernel family ([`BWD_FAMILIES`]).
    pub family: &'static str,
    /// The PTX module it is in (the GPUs that can run it).
    pub arch: Arch,
    /// Which pass: "dq" (also writes D) or "dkdv".
    pub pass: &'static str,
    /// Element type of Q, K, V, O, dO and the gradients.
    pub dtype: DType,
    /// Smallest and largest head_dim served.
    pub head_dims: (u32, u32),
    /// Rows per block along the grid's x (query rows for dq, key rows for dkdv).
    pub rows: u32,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory in bytes, for a head_dim.
    pub smem_bytes: fn(u32) -> u32,
    /// The same kernel body, for the emulator.
    pub emulate: unsafe fn(&BwdParams),
}

#[cfg(not(target_arch = "nvptx64"))]
impl BwdVariant {
    /// Whether this variant serves `head_dim`.
    pub fn serves(&self, head_dim: u32) -> bool {
        self.head_dims.0 <= head_dim
            && head_dim <= self.head_dims.1
            && (head_dim.is_multiple_of(8) || !BWD_ALIGNED_FAMILIES.contains(&self.family))
    }
    /// The `.maxnreg` its entry is loaded with, if any (`wgmma_bwd_tile`).
    pub fn max_regs(&self) -> Option<u32> {
        let regs = match (self.family, self.pass) {
            ("wgmma", "dkdv") => wgmma_bwd_tile(self.head_dims.1)?.dkdv_max_regs,
            ("wgmma", "dq_saved") => wgmma_bwd_tile(self.head_dims.1)?.dq_max_regs,
            _ => 0,
        };
        (regs > 0).then_some(regs)
    }
}

/// As `fwd_variants!`, for the backward kernels.
macro_rules! bwd_variants {
    ($( $name:ident => $family:literal @ $arch:ident, $pass:literal, [$($body:tt)*], $dt:ty, ($lo:expr, $hi:expr), $rows:expr, $threads:expr, $smem:expr; )*) => {
        $(
            in_module!($arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: BwdParams) {
                unsafe { $($body)*(&p) }
            });
        )*
        /// All backward variants.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const BWD_VARIANTS: &[BwdVariant] = &[$(
            BwdVariant {
                name: stringify!($name),
                family: $family,
                arch: Arch::$arch,
                pass: $pass,
                dtype: <$dt as Element>::DTYPE,
                head_dims: ($lo, $hi),
                rows: $rows,
                threads: $threads,
                smem_bytes: $smem,
                emulate: $($body)*,
            },
        )*];
    };
}

/// The dK/dV variant for the head dims sharing `simt_kv_tile(D)`.
macro_rules! bwd_kv {
    ($ty:ty, $d:literal) => {
        crate::bwd_simt::dkdv::<$ty, { simt_kv_tile($d).keys_per_warp as usize }, { simt_kv_tile($d).d_chunks as usize }>
    };
}

/// The dQ variant for the head dims sharing `simt_tile(D)`.
macro_rules! bwd_q {
    ($ty:ty, $d:literal) => {
        crate::bwd_simt::dq::<
            $ty,
            { simt_tile($d).rows_per_warp as usize },
            { simt_tile($d).d_chunks as usize },
            { simt_tile($d).s_cols as usize },
        >
    };
}

/// The tensor-core dQ variant for the head dims sharing `mma_bwd_tile(D)`; with `stats`, its
/// first pass alone (the atomic backward's statistics kernel).
macro_rules! bwd_mma_q {
    ($ty:ty, $d:literal) => {
        bwd_mma_q!($ty, $d, false)
    };
    ($ty:ty, $d:literal, $stats:literal) => {
        crate::bwd_mma::dq::<
            $ty,
            { bwd_field(mma_bwd_tile($d), 0) as usize },
            { bwd_field(mma_bwd_tile($d), 0) as usize / 16 / bwd_field(mma_bwd_tile($d), 7) as usize },
            { bwd_field(mma_bwd_tile($d), 0) as usize / 8 / bwd_field(mma_bwd_tile($d), 7) as usize },
            { bwd_field(mma_bwd_tile($d), 1) as usize },
            { bwd_field(mma_bwd_tile($d), 1) as usize / 8 },
            { bwd_field(mma_bwd_tile($d), 4) != 0 },
            $stats,
            { bwd_field(mma_bwd_tile($d), 7) as usize },
        >
    };
}

/// The tensor-core dK/dV variant for the head dims sharing `mma_bwd_tile(D)`; with `dq`, it
/// also adds dQ to the f32 accumulator with atomics (the atomic backward's main kernel).
macro_rules! bwd_mma_kv {
    ($ty:ty, $d:literal) => {
        bwd_mma_kv!($ty, $d, false)
    };
    ($ty:ty, $d:literal, $dq:literal) => {
        crate::bwd_mma::dkdv::<
            $ty,
            { bwd_field(mma_bwd_tile($d), 0) as usize },
            { bwd_field(mma_bwd_tile($d), 0) as usize / 16 / bwd_field(mma_bwd_tile($d), 7) as usize },
            { bwd_field(mma_bwd_tile($d), 0) as usize / 8 / bwd_field(mma_bwd_tile($d), 7) as usize },
            { bwd_field(mma_bwd_tile($d), if $dq { 5 } else { 2 }) as usize },
            { bwd_field(mma_bwd_tile($d), if $dq { 5 } else { 2 }) as usize / 8 },
            { bwd_field(mma_bwd_tile($d), if $dq { 6 } else { 3 }) != 0 },
            $dq,
            { bwd_field(mma_bwd_tile($d), 7) as usize },
        >
    };
}

/// The Hopper dK/dV variant for the head dims sharing `wgmma_bwd_tile(D)`; with `dq`, it also
/// adds dQ to the f32 accumulator with atomics (the atomic backward's main kernel).
macro_rules! bwd_wgmma_kv {
    ($ty:ty, $d:literal) => {
        bwd_wgmma_kv!($ty, $d, false)
    };
    ($ty:ty, $d:literal, $dq:literal) => {
        crate::bwd_wgmma::dkdv::<
            $ty,
            { wg_bwd_field(wgmma_bwd_tile($d), 1) as usize },
            { wg_bwd_field(wgmma_bwd_tile($d), 1) as usize / 8 },
            { wg_bwd_field(wgmma_bwd_tile($d), 0) as usize },
            { wg_bwd_field(wgmma_bwd_tile($d), 0) as usize / 8 },
            { wg_bwd_field(wgmma_bwd_tile($d), 0) as usize / 16 },
            { wg_bwd_field(wgmma_bwd_tile($d), 2) != 0 },
            $dq,
        >
    };
}
/// The Hopper dQ variant for the head dims sharing `wgmma_bwd_tile(D)`: both passes, or the
/// passes of `mode` (`bwd_wgmma::DQ_SAVED`, `DQ_STATS`).
macro_rules! bwd_wgmma_q {
    ($ty:ty, $d:literal, $mode:ident) => {
        crate::bwd_wgmma::dq::<
            $ty,
            { wg_bwd_field(wgmma_bwd_tile($d), 1) as usize },
            { wg_bwd_field(wgmma_bwd_tile($d), 1) as usize / 8 },
            { wg_bwd_field(wgmma_bwd_tile($d), 3) as usize },
            { wg_bwd_field(wgmma_bwd_tile($d), 3) as usize / 8 },
            { wg_bwd_field(wgmma_bwd_tile($d), 3) as usize / 16 },
            { wg_bwd_field(wgmma_bwd_tile($d), 2) != 0 },
            { crate::bwd_wgmma::$mode },
        >
    };
}
/// Field `i` of a Hopper backward tile (br, head_dim, padded, dq_bc), for const generic
/// arguments.
const fn wg_bwd_field(t: Option<WgmmaBwdTile>, i: u32) -> u32 {
    match t {
        Some(t) => match i {
            0 => t.br,
            1 => t.head_dim,
            2 => t.padded as u32,
            _ => t.dq_bc,
        },
        None => 0,
    }
}
const fn wg_dq_smem(d: u32) -> u32 {
    match wgmma_bwd_tile(d) {
        Some(t) => t.dq_smem_bytes(),
        None => 0,
    }
}
const WG_BWD_ROWS: u32 = WgmmaBwdTile::ROWS;
const fn wg_dkdv_smem(d: u32) -> u32 {
    match wgmma_bwd_tile(d) {
        Some(t) => t.dkdv_smem_bytes(),
        None => 0,
    }
}
const WG_BWD_KEYS: u32 = WgmmaBwdTile::KEYS;
const fn wg_dkdvq_smem(d: u32) -> u32 {
    match wgmma_bwd_tile(d) {
        Some(t) => t.dkdvq_smem_bytes(),
        None => 0,
    }
}
/// Field `i` of a backward tile (head_dim, dq_bc, kv_br, kv_in_regs, dq_q_in_regs, atomic_kv_br,
/// atomic_kv_in_regs, split), for const generic arguments.
const fn bwd_field(t: Option<MmaBwdTile>, i: u32) -> u32 {
    match t {
        Some(t) => match i {
            0 => t.head_dim,
            1 => t.dq_bc,
            2 => t.kv_br,
            3 => t.kv_in_regs as u32,
            5 => t.atomic_kv_br,
            6 => t.atomic_kv_in_regs as u32,
            7 => t.split,
            _ => t.dq_q_in_regs as u32,
        },
        None => 1,
    }
}
const fn mma_bwd_threads(d: u32) -> u32 {
    match mma_bwd_tile(d) {
        Some(t) => t.threads(),
        None => 0,
    }
}
const fn mma_dq_smem(d: u32) -> u32 {
    match mma_bwd_tile(d) {
        Some(t) => t.dq_smem_bytes(),
        None => 0,
    }
}
const fn mma_dkdv_smem(d: u32) -> u32 {
    match mma_bwd_tile(d) {
        Some(t) => t.dkdv_smem_bytes(),
        None => 0,
    }
}
const fn mma_dkdvq_smem(d: u32) -> u32 {
    match mma_bwd_tile(d) {
        Some(t) => t.dkdvq_smem_bytes(),
        None => 0,
    }
}
const fn no_smem(_: u32) -> u32 {
    0
}
const MMA_BWD_ROWS: u32 = MmaBwdTile::ROWS;
const CONVERT_ROWS: u32 = crate::bwd_mma::CONVERT_ROWS as u32;
const PREP_ROWS: u32 = crate::bwd_prep::PREP_ROWS as u32;

const fn kv_smem(d: u32) -> u32 {
    simt_kv_tile(d).smem_bytes(d)
}

bwd_variants! {
    flash_bwd_wgmma_dqs_f16_d64p => "wgmma" @ Sm90a, "dq_saved", [bwd_wgmma_q!(F16, 56, DQ_SAVED)], F16, (1, 63), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_dqs_f16_d64 => "wgmma" @ Sm90a, "dq_saved", [bwd_wgmma_q!(F16, 64, DQ_SAVED)], F16, (64, 64), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_dqs_f16_d128p => "wgmma" @ Sm90a, "dq_saved", [bwd_wgmma_q!(F16, 120, DQ_SAVED)], F16, (65, 127), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_dqs_f16_d128 => "wgmma" @ Sm90a, "dq_saved", [bwd_wgmma_q!(F16, 128, DQ_SAVED)], F16, (128, 128), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_dqs_bf16_d64p => "wgmma" @ Sm90a, "dq_saved", [bwd_wgmma_q!(Bf16, 56, DQ_SAVED)], Bf16, (1, 63), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_dqs_bf16_d64 => "wgmma" @ Sm90a, "dq_saved", [bwd_wgmma_q!(Bf16, 64, DQ_SAVED)], Bf16, (64, 64), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_dqs_bf16_d128p => "wgmma" @ Sm90a, "dq_saved", [bwd_wgmma_q!(Bf16, 120, DQ_SAVED)], Bf16, (65, 127), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_dqs_bf16_d128 => "wgmma" @ Sm90a, "dq_saved", [bwd_wgmma_q!(Bf16, 128, DQ_SAVED)], Bf16, (128, 128), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_prep_f16  => "wgmma" @ Sm90a, "prep", [crate::bwd_prep::prep::<F16, false>],  F16,  (1, 128), PREP_ROWS, 128, no_smem;
    flash_bwd_prep_bf16 => "wgmma" @ Sm90a, "prep", [crate::bwd_prep::prep::<Bf16, false>], Bf16, (1, 128), PREP_ROWS, 128, no_smem;
    flash_bwd_prep_residual_f16  => "wgmma" @ Sm90a, "prep_residual", [crate::bwd_prep::prep::<F16, true>],  F16,  (1, 128), PREP_ROWS, 128, no_smem;
    flash_bwd_prep_residual_bf16 => "wgmma" @ Sm90a, "prep_residual", [crate::bwd_prep::prep::<Bf16, true>], Bf16, (1, 128), PREP_ROWS, 128, no_smem;
    flash_bwd_wgmma_dkdv_f16_d64p   => "wgmma" @ Sm90a, "dkdv", [bwd_wgmma_kv!(F16, 56)],   F16,  (1, 63),    WG_BWD_KEYS, 128, wg_dkdv_smem;
    flash_bwd_wgmma_dkdv_f16_d64    => "wgmma" @ Sm90a, "dkdv", [bwd_wgmma_kv!(F16, 64)],   F16,  (64, 64),   WG_BWD_KEYS, 128, wg_dkdv_smem;
    flash_bwd_wgmma_dkdv_f16_d128p  => "wgmma" @ Sm90a, "dkdv", [bwd_wgmma_kv!(F16, 120)],  F16,  (65, 127),  WG_BWD_KEYS, 128, wg_dkdv_smem;
    flash_bwd_wgmma_dkdv_f16_d128   => "wgmma" @ Sm90a, "dkdv", [bwd_wgmma_kv!(F16, 128)],  F16,  (128, 128), WG_BWD_KEYS, 128, wg_dkdv_smem;
    flash_bwd_wgmma_dkdv_bf16_d64p  => "wgmma" @ Sm90a, "dkdv", [bwd_wgmma_kv!(Bf16, 56)],  Bf16, (1, 63),    WG_BWD_KEYS, 128, wg_dkdv_smem;
    flash_bwd_wgmma_dkdv_bf16_d64   => "wgmma" @ Sm90a, "dkdv", [bwd_wgmma_kv!(Bf16, 64)],  Bf16, (64, 64),   WG_BWD_KEYS, 128, wg_dkdv_smem;
    flash_bwd_wgmma_dkdv_bf16_d128p => "wgmma" @ Sm90a, "dkdv", [bwd_wgmma_kv!(Bf16, 120)], Bf16, (65, 127),  WG_BWD_KEYS, 128, wg_dkdv_smem;
    flash_bwd_wgmma_dkdv_bf16_d128  => "wgmma" @ Sm90a, "dkdv", [bwd_wgmma_kv!(Bf16, 128)], Bf16, (128, 128), WG_BWD_KEYS, 128, wg_dkdv_smem;
    flash_bwd_wgmma_atomic_stats_f16_d64p => "wgmma_atomic" @ Sm90a, "stats", [bwd_wgmma_q!(F16, 56, DQ_STATS)], F16, (1, 63), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_atomic_stats_f16_d64 => "wgmma_atomic" @ Sm90a, "stats", [bwd_wgmma_q!(F16, 64, DQ_STATS)], F16, (64, 64), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_atomic_stats_f16_d128p => "wgmma_atomic" @ Sm90a, "stats", [bwd_wgmma_q!(F16, 120, DQ_STATS)], F16, (65, 127), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_atomic_stats_f16_d128 => "wgmma_atomic" @ Sm90a, "stats", [bwd_wgmma_q!(F16, 128, DQ_STATS)], F16, (128, 128), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_atomic_stats_bf16_d64p => "wgmma_atomic" @ Sm90a, "stats", [bwd_wgmma_q!(Bf16, 56, DQ_STATS)], Bf16, (1, 63), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_atomic_stats_bf16_d64 => "wgmma_atomic" @ Sm90a, "stats", [bwd_wgmma_q!(Bf16, 64, DQ_STATS)], Bf16, (64, 64), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_atomic_stats_bf16_d128p => "wgmma_atomic" @ Sm90a, "stats", [bwd_wgmma_q!(Bf16, 120, DQ_STATS)], Bf16, (65, 127), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_atomic_stats_bf16_d128 => "wgmma_atomic" @ Sm90a, "stats", [bwd_wgmma_q!(Bf16, 128, DQ_STATS)], Bf16, (128, 128), WG_BWD_ROWS, 128, wg_dq_smem;
    flash_bwd_wgmma_atomic_dkdvq_f16_d64p => "wgmma_atomic" @ Sm90a, "dkdvq", [bwd_wgmma_kv!(F16, 56, true)], F16, (1, 63), WG_BWD_KEYS, 128, wg_dkdvq_smem;
    flash_bwd_wgmma_atomic_dkdvq_f16_d64 => "wgmma_atomic" @ Sm90a, "dkdvq", [bwd_wgmma_kv!(F16, 64, true)], F16, (64, 64), WG_BWD_KEYS, 128, wg_dkdvq_smem;
    flash_bwd_wgmma_atomic_dkdvq_f16_d128p => "wgmma_atomic" @ Sm90a, "dkdvq", [bwd_wgmma_kv!(F16, 120, true)], F16, (65, 127), WG_BWD_KEYS, 128, wg_dkdvq_smem;
    flash_bwd_wgmma_atomic_dkdvq_f16_d128 => "wgmma_atomic" @ Sm90a, "dkdvq", [bwd_wgmma_kv!(F16, 128, true)], F16, (128, 128), WG_BWD_KEYS, 128, wg_dkdvq_smem;
    flash_bwd_wgmma_atomic_dkdvq_bf16_d64p => "wgmma_atomic" @ Sm90a, "dkdvq", [bwd_wgmma_kv!(Bf16, 56, true)], Bf16, (1, 63), WG_BWD_KEYS, 128, wg_dkdvq_smem;
    flash_bwd_wgmma_atomic_dkdvq_bf16_d64 => "wgmma_atomic" @ Sm90a, "dkdvq", [bwd_wgmma_kv!(Bf16, 64, true)], Bf16, (64, 64), WG_BWD_KEYS, 128, wg_dkdvq_smem;
    flash_bwd_wgmma_atomic_dkdvq_bf16_d128p => "wgmma_atomic" @ Sm90a, "dkdvq", [bwd_wgmma_kv!(Bf16, 120, true)], Bf16, (65, 127), WG_BWD_KEYS, 128, wg_dkdvq_smem;
    flash_bwd_wgmma_atomic_dkdvq_bf16_d128 => "wgmma_atomic" @ Sm90a, "dkdvq", [bwd_wgmma_kv!(Bf16, 128, true)], Bf16, (128, 128), WG_BWD_KEYS, 128, wg_dkdvq_smem;
    flash_bwd_wgmma_atomic_prep_f16 => "wgmma_atomic" @ Sm90a, "prep_residual", [crate::bwd_prep::prep::<F16, true>], F16, (1, 128), PREP_ROWS, 128, no_smem;
    flash_bwd_wgmma_atomic_prep_bf16 => "wgmma_atomic" @ Sm90a, "prep_residual", [crate::bwd_prep::prep::<Bf16, true>], Bf16, (1, 128), PREP_ROWS, 128, no_smem;
    flash_bwd_wgmma_atomic_convert_f16 => "wgmma_atomic" @ Sm90a, "dq_convert", [crate::bwd_mma::dq_convert::<F16>], F16, (1, 128), CONVERT_ROWS, 128, no_smem;
    flash_bwd_wgmma_atomic_convert_bf16 => "wgmma_atomic" @ Sm90a, "dq_convert", [crate::bwd_mma::dq_convert::<Bf16>], Bf16, (1, 128), CONVERT_ROWS, 128, no_smem;
    flash_bwd_mma_dq_f16_d32     => "mma" @ Sm80, "dq",   [bwd_mma_q!(F16, 32)],    F16,  (1, 32),    MMA_BWD_ROWS, mma_bwd_threads(32), mma_dq_smem;
    flash_bwd_mma_dq_f16_d64     => "mma" @ Sm80, "dq",   [bwd_mma_q!(F16, 64)],    F16,  (33, 64),   MMA_BWD_ROWS, mma_bwd_threads(64), mma_dq_smem;
    flash_bwd_mma_dq_f16_d96     => "mma" @ Sm80, "dq",   [bwd_mma_q!(F16, 96)],    F16,  (65, 96),   MMA_BWD_ROWS, mma_bwd_threads(96), mma_dq_smem;
    flash_bwd_mma_dq_f16_d128    => "mma" @ Sm80, "dq",   [bwd_mma_q!(F16, 128)],   F16,  (97, 128), MMA_BWD_ROWS, mma_bwd_threads(128), mma_dq_smem;
    flash_bwd_mma_dq_f16_d192    => "mma" @ Sm80, "dq",  [bwd_mma_q!(F16, 192)],  F16,  (129, 192), MMA_BWD_ROWS, mma_bwd_threads(192), mma_dq_smem;
    flash_bwd_mma_dq_f16_d256    => "mma" @ Sm80, "dq",  [bwd_mma_q!(F16, 256)],  F16,  (193, 256), MMA_BWD_ROWS, mma_bwd_threads(256), mma_dq_smem;
    flash_bwd_mma_dq_bf16_d32    => "mma" @ Sm80, "dq",   [bwd_mma_q!(Bf16, 32)],   Bf16, (1, 32),    MMA_BWD_ROWS, mma_bwd_threads(32), mma_dq_smem;
    flash_bwd_mma_dq_bf16_d64    => "mma" @ Sm80, "dq",   [bwd_mma_q!(Bf16, 64)],   Bf16, (33, 64),   MMA_BWD_ROWS, mma_bwd_threads(64), mma_dq_smem;
    flash_bwd_mma_dq_bf16_d96    => "mma" @ Sm80, "dq",   [bwd_mma_q!(Bf16, 96)],   Bf16, (65, 96),   MMA_BWD_ROWS, mma_bwd_threads(96), mma_dq_smem;
    flash_bwd_mma_dq_bf16_d128   => "mma" @ Sm80, "dq",   [bwd_mma_q!(Bf16, 128)],  Bf16, (97, 128), MMA_BWD_ROWS, mma_bwd_threads(128), mma_dq_smem;
    flash_bwd_mma_dq_bf16_d192   => "mma" @ Sm80, "dq",  [bwd_mma_q!(Bf16, 192)],  Bf16, (129, 192), MMA_BWD_ROWS, mma_bwd_threads(192), mma_dq_smem;
    flash_bwd_mma_dq_bf16_d256   => "mma" @ Sm80, "dq",  [bwd_mma_q!(Bf16, 256)],  Bf16, (193, 256), MMA_BWD_ROWS, mma_bwd_threads(256), mma_dq_smem;
    flash_bwd_mma_dkdv_f16_d32   => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(F16, 32)],   F16,  (1, 32),    MMA_BWD_ROWS, mma_bwd_threads(32), mma_dkdv_smem;
    flash_bwd_mma_dkdv_f16_d64   => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(F16, 64)],   F16,  (33, 64),   MMA_BWD_ROWS, mma_bwd_threads(64), mma_dkdv_smem;
    flash_bwd_mma_dkdv_f16_d96   => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(F16, 96)],   F16,  (65, 96),   MMA_BWD_ROWS, mma_bwd_threads(96), mma_dkdv_smem;
    flash_bwd_mma_dkdv_f16_d128  => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(F16, 128)],  F16,  (97, 128), MMA_BWD_ROWS, mma_bwd_threads(128), mma_dkdv_smem;
    flash_bwd_mma_dkdv_f16_d192  => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(F16, 192)],  F16,  (129, 192), MMA_BWD_ROWS, mma_bwd_threads(192), mma_dkdv_smem;
    flash_bwd_mma_dkdv_f16_d256  => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(F16, 256)],  F16,  (193, 256), MMA_BWD_ROWS, mma_bwd_threads(256), mma_dkdv_smem;
    flash_bwd_mma_dkdv_bf16_d32  => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(Bf16, 32)],  Bf16, (1, 32),    MMA_BWD_ROWS, mma_bwd_threads(32), mma_dkdv_smem;
    flash_bwd_mma_dkdv_bf16_d64  => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(Bf16, 64)],  Bf16, (33, 64),   MMA_BWD_ROWS, mma_bwd_threads(64), mma_dkdv_smem;
    flash_bwd_mma_dkdv_bf16_d96  => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(Bf16, 96)],  Bf16, (65, 96),   MMA_BWD_ROWS, mma_bwd_threads(96), mma_dkdv_smem;
    flash_bwd_mma_dkdv_bf16_d128 => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(Bf16, 128)], Bf16, (97, 128), MMA_BWD_ROWS, mma_bwd_threads(128), mma_dkdv_smem;
    flash_bwd_mma_dkdv_bf16_d192 => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(Bf16, 192)],  Bf16, (129, 192), MMA_BWD_ROWS, mma_bwd_threads(192), mma_dkdv_smem;
    flash_bwd_mma_dkdv_bf16_d256 => "mma" @ Sm80, "dkdv", [bwd_mma_kv!(Bf16, 256)],  Bf16, (193, 256), MMA_BWD_ROWS, mma_bwd_threads(256), mma_dkdv_smem;
    flash_bwd_mma_atomic_stats_f16_d32    => "mma_atomic" @ Sm80, "stats", [bwd_mma_q!(F16, 32, true)],    F16,  (1, 32),    MMA_BWD_ROWS, MMA_THREADS, mma_dq_smem;
    flash_bwd_mma_atomic_stats_f16_d64    => "mma_atomic" @ Sm80, "stats", [bwd_mma_q!(F16, 64, true)],    F16,  (33, 64),   MMA_BWD_ROWS, MMA_THREADS, mma_dq_smem;
    flash_bwd_mma_atomic_stats_f16_d96    => "mma_atomic" @ Sm80, "stats", [bwd_mma_q!(F16, 96, true)],    F16,  (65, 96),   MMA_BWD_ROWS, MMA_THREADS, mma_dq_smem;
    flash_bwd_mma_atomic_stats_f16_d128   => "mma_atomic" @ Sm80, "stats", [bwd_mma_q!(F16, 128, true)],   F16,  (97, 128), MMA_BWD_ROWS, MMA_THREADS, mma_dq_smem;
    flash_bwd_mma_atomic_stats_bf16_d32   => "mma_atomic" @ Sm80, "stats", [bwd_mma_q!(Bf16, 32, true)],   Bf16, (1, 32),    MMA_BWD_ROWS, MMA_THREADS, mma_dq_smem;
    flash_bwd_mma_atomic_stats_bf16_d64   => "mma_atomic" @ Sm80, "stats", [bwd_mma_q!(Bf16, 64, true)],   Bf16, (33, 64),   MMA_BWD_ROWS, MMA_THREADS, mma_dq_smem;
    flash_bwd_mma_atomic_stats_bf16_d96   => "mma_atomic" @ Sm80, "stats", [bwd_mma_q!(Bf16, 96, true)],   Bf16, (65, 96),   MMA_BWD_ROWS, MMA_THREADS, mma_dq_smem;
    flash_bwd_mma_atomic_stats_bf16_d128  => "mma_atomic" @ Sm80, "stats", [bwd_mma_q!(Bf16, 128, true)],  Bf16, (97, 128), MMA_BWD_ROWS, MMA_THREADS, mma_dq_smem;
    flash_bwd_mma_atomic_dkdvq_f16_d32    => "mma_atomic" @ Sm80, "dkdvq", [bwd_mma_kv!(F16, 32, true)],   F16,  (1, 32),    MMA_BWD_ROWS, MMA_THREADS, mma_dkdvq_smem;
    flash_bwd_mma_atomic_dkdvq_f16_d64    => "mma_atomic" @ Sm80, "dkdvq", [bwd_mma_kv!(F16, 64, true)],   F16,  (33, 64),   MMA_BWD_ROWS, MMA_THREADS, mma_dkdvq_smem;
    flash_bwd_mma_atomic_dkdvq_f16_d96    => "mma_atomic" @ Sm80, "dkdvq", [bwd_mma_kv!(F16, 96, true)],   F16,  (65, 96),   MMA_BWD_ROWS, MMA_THREADS, mma_dkdvq_smem;
    flash_bwd_mma_atomic_dkdvq_f16_d128   => "mma_atomic" @ Sm80, "dkdvq", [bwd_mma_kv!(F16, 128, true)],  F16,  (97, 128), MMA_BWD_ROWS, MMA_THREADS, mma_dkdvq_smem;
    flash_bwd_mma_atomic_dkdvq_bf16_d32   => "mma_atomic" @ Sm80, "dkdvq", [bwd_mma_kv!(Bf16, 32, true)],  Bf16, (1, 32),    MMA_BWD_ROWS, MMA_THREADS, mma_dkdvq_smem;
    flash_bwd_mma_atomic_dkdvq_bf16_d64   => "mma_atomic" @ Sm80, "dkdvq", [bwd_mma_kv!(Bf16, 64, true)],  Bf16, (33, 64),   MMA_BWD_ROWS, MMA_THREADS, mma_dkdvq_smem;
    flash_bwd_mma_atomic_dkdvq_bf16_d96   => "mma_atomic" @ Sm80, "dkdvq", [bwd_mma_kv!(Bf16, 96, true)],  Bf16, (65, 96),   MMA_BWD_ROWS, MMA_THREADS, mma_dkdvq_smem;
    flash_bwd_mma_atomic_dkdvq_bf16_d128  => "mma_atomic" @ Sm80, "dkdvq", [bwd_mma_kv!(Bf16, 128, true)], Bf16, (97, 128), MMA_BWD_ROWS, MMA_THREADS, mma_dkdvq_smem;
    flash_bwd_mma_atomic_convert_f16      => "mma_atomic" @ Sm80, "dq_convert", [crate::bwd_mma::dq_convert::<F16>],  F16,  (1, 128), CONVERT_ROWS, MMA_THREADS, no_smem;
    flash_bwd_mma_atomic_convert_bf16     => "mma_atomic" @ Sm80, "dq_convert", [crate::bwd_mma::dq_convert::<Bf16>], Bf16, (1, 128), CONVERT_ROWS, MMA_THREADS, no_smem;
    flash_bwd_dkdv_f32_d64   => "simt" @ Sm80, "dkdv", [bwd_kv!(f32, 64)],    f32,  (1, 64),    simt_kv_tile(64).bn(),  128, kv_smem;
    flash_bwd_dkdv_f32_d128  => "simt" @ Sm80, "dkdv", [bwd_kv!(f32, 128)],   f32,  (65, 128),  simt_kv_tile(128).bn(), 128, kv_smem;
    flash_bwd_dkdv_f32_d256  => "simt" @ Sm80, "dkdv", [bwd_kv!(f32, 256)],   f32,  (129, 256), simt_kv_tile(256).bn(), 128, kv_smem;
    flash_bwd_dkdv_f16_d64   => "simt" @ Sm80, "dkdv", [bwd_kv!(F16, 64)],    F16,  (1, 64),    simt_kv_tile(64).bn(),  128, kv_smem;
    flash_bwd_dkdv_f16_d128  => "simt" @ Sm80, "dkdv", [bwd_kv!(F16, 128)],   F16,  (65, 128),  simt_kv_tile(128).bn(), 128, kv_smem;
    flash_bwd_dkdv_f16_d256  => "simt" @ Sm80, "dkdv", [bwd_kv!(F16, 256)],   F16,  (129, 256), simt_kv_tile(256).bn(), 128, kv_smem;
    flash_bwd_dkdv_bf16_d64  => "simt" @ Sm80, "dkdv", [bwd_kv!(Bf16, 64)],   Bf16, (1, 64),    simt_kv_tile(64).bn(),  128, kv_smem;
    flash_bwd_dkdv_bf16_d128 => "simt" @ Sm80, "dkdv", [bwd_kv!(Bf16, 128)],  Bf16, (65, 128),  simt_kv_tile(128).bn(), 128, kv_smem;
    flash_bwd_dkdv_bf16_d256 => "simt" @ Sm80, "dkdv", [bwd_kv!(Bf16, 256)],  Bf16, (129, 256), simt_kv_tile(256).bn(), 128, kv_smem;
    flash_bwd_dq_f32_d64     => "simt" @ Sm80, "dq",   [bwd_q!(f32, 64)],     f32,  (1, 64),    simt_tile(64).br(),  128, simt_dq_smem_bytes;
    flash_bwd_dq_f32_d128    => "simt" @ Sm80, "dq",   [bwd_q!(f32, 128)],    f32,  (65, 128),  simt_tile(128).br(), 128, simt_dq_smem_bytes;
    flash_bwd_dq_f32_d256    => "simt" @ Sm80, "dq",   [bwd_q!(f32, 256)],    f32,  (129, 256), simt_tile(256).br(), 128, simt_dq_smem_bytes;
    flash_bwd_dq_f16_d64     => "simt" @ Sm80, "dq",   [bwd_q!(F16, 64)],     F16,  (1, 64),    simt_tile(64).br(),  128, simt_dq_smem_bytes;
    flash_bwd_dq_f16_d128    => "simt" @ Sm80, "dq",   [bwd_q!(F16, 128)],    F16,  (65, 128),  simt_tile(128).br(), 128, simt_dq_smem_bytes;
    flash_bwd_dq_f16_d256    => "simt" @ Sm80, "dq",   [bwd_q!(F16, 256)],    F16,  (129, 256), simt_tile(256).br(), 128, simt_dq_smem_bytes;
    flash_bwd_dq_bf16_d64    => "simt" @ Sm80, "dq",   [bwd_q!(Bf16, 64)],    Bf16, (1, 64),    simt_tile(64).br(),  128, simt_dq_smem_bytes;
    flash_bwd_dq_bf16_d128   => "simt" @ Sm80, "dq",   [bwd_q!(Bf16, 128)],   Bf16, (65, 128),  simt_tile(128).br(), 128, simt_dq_smem_bytes;
    flash_bwd_dq_bf16_d256   => "simt" @ Sm80, "dq",   [bwd_q!(Bf16, 256)],   Bf16, (129, 256), simt_tile(256).br(), 128, simt_dq_smem_bytes;
}

/// Backward families whose kernels serve only head dims that are multiples of 8 (others go
/// to the next family: SIMT off Hopper). Their dK/dV kernels sit at 255 registers, and the
/// element-wise body for other head dims (`copy::load_tile_in`) spills there (ptxas 13.0,
/// sm_80: mma dK/dV 12-16 bytes at d = 64 and 128, mma_atomic 4-84 bytes, wgmma_atomic 4
/// bytes at d = 128 padded).
pub const BWD_ALIGNED_FAMILIES: &[&str] = &["mma", "mma_atomic", "wgmma_atomic"];

/// Backward kernel families in the order automatic selection tries them (best first), among
/// those the device runs: on Hopper `wgmma` (`prep`, dQ and dK/dV kernels on warpgroup MMA;
/// compute capability 9.0, f16 and bf16, head_dim <= 128), the tensor-core kernels (`mma`) where they
/// apply, else SIMT. By name only: `mma_atomic` (FA2's single dK/dV/dQ kernel with atomic dQ;
/// on the H200 0.69-0.76x of `mma`, benches/RESULTS.md, 6282a3e) and `wgmma_atomic` (the same
/// structure on warpgroup MMA, 64 keys per block: on the H200, f16, 4256d7d, 0.93-1.01x
/// `wgmma` at d=64 and 0.85-0.91x at d=128 with recomputed statistics, 0.80-0.92x and
/// 0.75-0.84x with the forward's residual, s = 1k-16k: its f32 atomics, one per dQ element per
/// 64 keys, cost more than the dQ kernel they replace; measured before `wgmma` dropped its
/// statistics pass, which made `wgmma` faster still).
#[cfg(not(target_arch = "nvptx64"))]
pub const BWD_FAMILIES: &[&str] = &["wgmma", "mma", "simt", "mma_atomic", "wgmma_atomic"];
/// Backward families that are not bitwise deterministic (atomic f32 adds in a run-dependent
/// order); `deterministic` backward options skip them.
#[cfg(not(target_arch = "nvptx64"))]
pub const BWD_NONDETERMINISTIC: &[&str] = &["mma_atomic", "wgmma_atomic"];
/// The passes a backward family launches, in order: `wgmma` the row statistics from the
/// forward's LSE and D~ from O (`prep`; with `saved`, the forward's O residual at hand,
/// `FwdParams::o_lo`, from O + O_lo: `prep_residual`), its dQ kernel (`dq_saved`, which
/// corrects D~ exactly, `bwd_wgmma`) and its dK/dV kernel; `mma` and `simt` a dQ kernel (which
/// also writes the row statistics) and a dK/dV kernel; `mma_atomic` a statistics kernel, a
/// dK/dV kernel that also adds dQ into an f32 accumulator, and dQ's conversion;
/// `wgmma_atomic` the same, with `prep_residual` for the statistics kernel when `saved`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn bwd_passes(family: &str, saved: bool) -> &'static [&'static str] {
    match (family, saved) {
        ("mma_atomic", _) | ("wgmma_atomic", false) => &["stats", "dkdvq", "dq_convert"],
        ("wgmma_atomic", true) => &["prep_residual", "dkdvq", "dq_convert"],
        ("wgmma", false) => &["prep", "dq_saved", "dkdv"],
        ("wgmma", true) => &["prep_residual", "dq_saved", "dkdv"],
        _ => &["dq", "dkdv"],
    }
}
/// The backward variant of `family` and `pass` for `dtype` and `head_dim`, if there is one.
#[cfg(not(target_arch = "nvptx64"))]
pub fn bwd_variant(family: &'static str, pass: &str, dtype: DType, head_dim: u32) -> Option<&'static BwdVariant> {
    BWD_VARIANTS.iter().find(|v| v.family == family && v.pass == pass && v.dtype == dtype && v.serves(head_dim))
}
