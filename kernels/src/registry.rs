//! Every kernel variant, by family. A family is one descriptor (its name, PTX module, tile
//! function, passes, and what it promises: determinism, the residual); a variant is one line
//! (its entry name, for a forward also its sliding-window entry's, dtype and head-dim class). Everything else the host needs to launch a
//! variant (rows per block, threads, shared memory, register cap, which head dims it serves)
//! is derived from the family's tile function, so it cannot drift from the kernel.
//!
//! The macros emit the PTX entry points (on nvptx64) and the rows of [`FWD_VARIANTS`] and
//! [`BWD_VARIANTS`], which the host, the tests and the benches read to find, launch and
//! emulate each variant. A new family: its kernel file, its tile function in `tile.rs`, a
//! descriptor and a block of lines here.

// Each PTX module compiles only its own kernels: the other module's helpers go unused there.
#![cfg_attr(target_arch = "nvptx64", allow(unused_imports, unused_macros, dead_code))]

use crate::dtype::{Bf16, F16};
#[cfg(not(target_arch = "nvptx64"))]
use crate::dtype::{DType, Element};
use crate::params::{AppendParams, BwdParams, FwdParams, MergeParams};
use crate::tile::{
    Config, MmaBwdTile, MmaTile, SimtKvTile, SimtTile, WgmmaBwdTile, WgmmaTile, mma_bwd_tile, mma_bwd_tile_atomic, mma_tile, mma_tile_br64,
    mma_tile_unfused, simt_dq_smem_bytes, simt_dq_tile, simt_kv_tile, simt_tile, wgmma_bwd_tile, wgmma_bwd_tile_atomic, wgmma_tile,
    wgmma_tile_wg2, wgmma_window_tile,
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

/// How one variant is launched at one head_dim.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Rows per block along the grid's x (query rows, or keys for a pass over key tiles).
    pub rows: u32,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory in bytes.
    pub smem_bytes: u32,
    /// The `.maxnreg` its entry is loaded with, if any.
    pub max_regs: Option<u32>,
}

/// A family's tile function: which tile serves a head_dim (`tile.rs`), by tile type.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub enum FwdTiles {
    Simt(fn(u32) -> SimtTile),
    Mma(fn(u32) -> Option<MmaTile>),
    Wgmma(fn(u32) -> Option<WgmmaTile>),
}

#[cfg(not(target_arch = "nvptx64"))]
impl FwdTiles {
    /// Whether `head_dim` runs on the tile of `class` (a head_dim of the variant's class).
    fn same_tile(self, class: u32, head_dim: u32) -> bool {
        match self {
            FwdTiles::Simt(f) => (1..=f(class).max_head_dim()).contains(&head_dim) && f(head_dim) == f(class),
            FwdTiles::Mma(f) => f(head_dim).is_some() && f(head_dim) == f(class),
            FwdTiles::Wgmma(f) => f(head_dim).is_some() && f(head_dim) == f(class),
        }
    }
    /// The launch of the tile of `head_dim` (one the variant serves).
    fn launch(self, head_dim: u32) -> Option<Launch> {
        let (rows, threads, smem_bytes) = match self {
            FwdTiles::Simt(f) => (f(head_dim).br(), f(head_dim).threads(), f(head_dim).smem_bytes(head_dim)),
            FwdTiles::Mma(f) => f(head_dim).map(|t| (t.br(), t.threads(), t.smem_bytes()))?,
            FwdTiles::Wgmma(f) => f(head_dim).map(|t| (t.br(), t.threads(), t.smem_bytes()))?,
        };
        Some(Launch { rows, threads, smem_bytes, max_regs: None })
    }
}

/// A forward kernel family.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FwdFamily {
    Wgmma,
    Mma,
    Simt,
    MmaBr64,
    MmaUnfused,
    WgmmaWg2,
}

/// What every variant of a forward family shares.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct FwdFamilyDesc {
    pub family: FwdFamily,
    /// The name users select it by (`FwdOptions::kernel`).
    pub name: &'static str,
    /// The PTX module of its kernels.
    pub arch: Arch,
    /// Tried by automatic selection (in [`FWD_FAMILIES`] order), or chosen only by name.
    pub auto: bool,
    /// Whether its kernels write O's rounding residual when asked (`FwdParams::o_lo`, for the
    /// backward's `prep_residual` pass).
    pub writes_residual: bool,
    /// Whether its kernels split the keys of a block's rows into parts (split-KV,
    /// `FwdParams::splits`).
    pub splits: bool,
    /// Whether its kernels take GQA packing (`FwdParams::gqa_pack`: the query heads of a KV
    /// head as the rows of one tile, for decode).
    pub packs_gqa: bool,
    /// Its tile function.
    pub tiles: FwdTiles,
}

/// The forward families, in the order automatic selection tries them (best first), among
/// those the device runs: the Hopper kernel (`wgmma`, compute capability 9.0, 16-bit,
/// head_dim <= 256), the tensor-core kernel (`mma`, sm_80+, 16-bit), else SIMT. Chosen only
/// by name, for comparison: `mma_br64` (the first tensor-core tile), `mma_unfused` (the
/// softmax on scaled scores, head_dim 64), `wgmma_wg2` (the first Hopper tile: two
/// warpgroups per block, d = 64 and 128).
#[cfg(not(target_arch = "nvptx64"))]
pub const FWD_FAMILIES: &[FwdFamilyDesc] = &[FWD_WGMMA, FWD_MMA, FWD_SIMT, FWD_MMA_BR64, FWD_MMA_UNFUSED, FWD_WGMMA_WG2];
#[cfg(not(target_arch = "nvptx64"))]
const FWD_WGMMA: FwdFamilyDesc = FwdFamilyDesc {
    family: FwdFamily::Wgmma,
    name: "wgmma",
    arch: Arch::Sm90a,
    auto: true,
    writes_residual: true,
    splits: true,
    packs_gqa: true,
    tiles: FwdTiles::Wgmma(wgmma_tile),
};
#[cfg(not(target_arch = "nvptx64"))]
const FWD_MMA: FwdFamilyDesc = FwdFamilyDesc {
    family: FwdFamily::Mma,
    name: "mma",
    arch: Arch::Sm80,
    auto: true,
    writes_residual: false,
    splits: false,
    packs_gqa: false,
    tiles: FwdTiles::Mma(mma_tile),
};
#[cfg(not(target_arch = "nvptx64"))]
const FWD_SIMT: FwdFamilyDesc = FwdFamilyDesc {
    family: FwdFamily::Simt,
    name: "simt",
    arch: Arch::Sm80,
    auto: true,
    writes_residual: false,
    splits: false,
    packs_gqa: false,
    tiles: FwdTiles::Simt(simt_tile),
};
#[cfg(not(target_arch = "nvptx64"))]
const FWD_MMA_BR64: FwdFamilyDesc = FwdFamilyDesc {
    family: FwdFamily::MmaBr64,
    name: "mma_br64",
    arch: Arch::Sm80,
    auto: false,
    writes_residual: false,
    splits: false,
    packs_gqa: false,
    tiles: FwdTiles::Mma(mma_tile_br64),
};
#[cfg(not(target_arch = "nvptx64"))]
const FWD_MMA_UNFUSED: FwdFamilyDesc = FwdFamilyDesc {
    family: FwdFamily::MmaUnfused,
    name: "mma_unfused",
    arch: Arch::Sm80,
    auto: false,
    writes_residual: false,
    splits: false,
    packs_gqa: false,
    tiles: FwdTiles::Mma(mma_tile_unfused),
};
#[cfg(not(target_arch = "nvptx64"))]
const FWD_WGMMA_WG2: FwdFamilyDesc = FwdFamilyDesc {
    family: FwdFamily::WgmmaWg2,
    name: "wgmma_wg2",
    arch: Arch::Sm90a,
    auto: false,
    writes_residual: true,
    splits: true,
    packs_gqa: true,
    tiles: FwdTiles::Wgmma(wgmma_tile_wg2),
};

#[cfg(not(target_arch = "nvptx64"))]
impl FwdFamily {
    /// Its descriptor.
    pub fn desc(self) -> &'static FwdFamilyDesc {
        match self {
            FwdFamily::Wgmma => &FWD_WGMMA,
            FwdFamily::Mma => &FWD_MMA,
            FwdFamily::Simt => &FWD_SIMT,
            FwdFamily::MmaBr64 => &FWD_MMA_BR64,
            FwdFamily::MmaUnfused => &FWD_MMA_UNFUSED,
            FwdFamily::WgmmaWg2 => &FWD_WGMMA_WG2,
        }
    }
    /// The family of that name.
    pub fn from_name(name: &str) -> Option<FwdFamily> {
        FWD_FAMILIES.iter().find(|f| f.name == name).map(|f| f.family)
    }
    pub fn name(self) -> &'static str {
        self.desc().name
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl core::fmt::Display for FwdFamily {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A forward kernel variant, as the host launches it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct FwdVariant {
    /// PTX entry name.
    pub name: &'static str,
    /// PTX entry name of the same kernel with a sliding window (`mask::Windowed`): an entry of
    /// its own, so that the window's code adds no registers to the entry without one.
    pub window_name: &'static str,
    /// PTX entry name of the same kernel for a softcap or ALiBi, with or without a window
    /// (`mask::General`; the entry's name with `_general`): an entry of its own, so that their
    /// code adds no registers to the window entry.
    pub general_name: &'static str,
    pub family: FwdFamily,
    /// Element type of Q, K, V, O.
    pub dtype: DType,
    /// A head_dim of its class: it serves every head_dim its family's tile function maps to
    /// the same tile.
    pub class: u32,
    /// The same kernel body, for the emulator.
    pub emulate: unsafe fn(&FwdParams),
    /// The windowed entry's body, for the emulator.
    pub emulate_window: unsafe fn(&FwdParams),
    /// The general entry's body, for the emulator.
    pub emulate_general: unsafe fn(&FwdParams),
    /// PTX entry name and emulator body of the same kernel for a variable-length batch
    /// (`varlen`, with `mask::General`: any window, causal or not); the families chosen
    /// automatically have one.
    pub varlen_name: Option<&'static str>,
    pub emulate_varlen: Option<unsafe fn(&FwdParams)>,
}

/// Which of a variant's entries a launch takes: each is a kernel of its own, so that what
/// one needs adds no registers to the others.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// Equal lengths, no window: `mask::NoMask` or `mask::Causal` (`crate::ENTRY_PLAIN`).
    Plain,
    /// A sliding window: `mask::Windowed` (`crate::ENTRY_WINDOW`).
    Window,
    /// A softcap or ALiBi, with or without a window: `mask::General` (`crate::ENTRY_GENERAL`).
    General,
    /// A variable-length batch, with or without a window, softcap or ALiBi
    /// (`crate::ENTRY_VARLEN`).
    Varlen,
}

#[cfg(not(target_arch = "nvptx64"))]
impl Entry {
    /// The entry for a launch with or without a sliding window (`windowed`), a softcap or
    /// ALiBi (`biased`) and a variable-length batch (`varlen`).
    pub fn of(windowed: bool, biased: bool, varlen: bool) -> Entry {
        match (varlen, biased, windowed) {
            (true, _, _) => Entry::Varlen,
            (false, true, _) => Entry::General,
            (false, false, true) => Entry::Window,
            (false, false, false) => Entry::Plain,
        }
    }
    /// Its `ENTRY` code, the kernels' const parameter (`crate::ENTRY_*`).
    pub fn code(self) -> u8 {
        match self {
            Entry::Plain => crate::ENTRY_PLAIN,
            Entry::Window => crate::ENTRY_WINDOW,
            Entry::General => crate::ENTRY_GENERAL,
            Entry::Varlen => crate::ENTRY_VARLEN,
        }
    }
}

/// A forward entry: its PTX name and its emulator body.
#[cfg(not(target_arch = "nvptx64"))]
pub type FwdEntry = (&'static str, unsafe fn(&FwdParams));

#[cfg(not(target_arch = "nvptx64"))]
impl FwdVariant {
    /// The entry name and emulator body of entry `e` (`None`: the variant has no such entry).
    pub fn entry(&self, e: Entry) -> Option<FwdEntry> {
        match e {
            Entry::Plain => Some((self.name, self.emulate)),
            Entry::Window => Some((self.window_name, self.emulate_window)),
            Entry::General => Some((self.general_name, self.emulate_general)),
            Entry::Varlen => self.varlen_name.zip(self.emulate_varlen),
        }
    }
    /// Whether this variant serves `head_dim`.
    pub fn serves(&self, head_dim: u32) -> bool {
        self.family.desc().tiles.same_tile(self.class, head_dim)
    }
    /// The PTX module that holds it (the devices it runs on).
    pub fn arch(&self) -> Arch {
        self.family.desc().arch
    }
    /// Its launch at `head_dim`, if it serves it.
    pub fn launch(&self, head_dim: u32) -> Option<Launch> {
        if self.serves(head_dim) { self.family.desc().tiles.launch(head_dim) } else { None }
    }
    /// The smallest and largest head_dim it serves.
    pub fn head_dims(&self) -> (u32, u32) {
        head_dim_range(|d| self.serves(d))
    }
}

/// The smallest and largest head_dim (of 1..=256) `serves` takes; (0, 0) for none.
#[cfg(not(target_arch = "nvptx64"))]
fn head_dim_range(serves: impl Fn(u32) -> bool) -> (u32, u32) {
    let lo = (1..=256).find(|&d| serves(d));
    let hi = (1..=256).rev().find(|&d| serves(d));
    lo.zip(hi).unwrap_or((0, 0))
}

/// `Some` of an optional entry's name (or of its body for params `$p`, `$p: $name =>
/// $body`), `None` without one.
macro_rules! opt_entry {
    () => {
        None
    };
    ($name:ident) => {
        Some(stringify!($name))
    };
    ($p:ty: $name:ident => $body:expr) => {
        Some($body as unsafe fn(&$p))
    };
}

/// The SIMT dK/dV variant of a class: `simt_kv_tile(class)`.
macro_rules! bwd_simt_kv {
    ($ty:ty, $d:literal, $w:literal) => {{
        config!(C: SimtKvTile = simt_kv_tile($d));
        crate::bwd_simt::dkdv::<$ty, C, { C::TILE.keys_per_warp as usize }, { C::TILE.d_chunks as usize }, $w>
    }};
}

/// Emits three entry points (without and with a sliding window, and the general one named
/// `entry_name` + `_general`; a fourth for a variable-length batch where one is named) and one
/// registry row per line, family by family: `Family { entry_name, window_entry_name
/// [/ varlen_entry_name] => body_macro(dtype, class), ... }`.
macro_rules! fwd_variants {
    ($( $family:ident @ $arch:ident { $( $name:ident, $wname:ident $(/ $vname:ident)? => $body:ident($dt:ty, $class:literal), )* } )*) => {
        $($(
            in_module!($arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: FwdParams) {
                unsafe { $body!($dt, $class, 0)(&p) }
            });
            in_module!($arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $wname(p: FwdParams) {
                unsafe { $body!($dt, $class, 1)(&p) }
            });
            const _: () = {
                in_module!($arch,
                #[unsafe(export_name = concat!(stringify!($name), "_general"))]
                pub unsafe extern "ptx-kernel" fn general(p: FwdParams) {
                    unsafe { $body!($dt, $class, 3)(&p) }
                });
            };
            $(
            in_module!($arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $vname(p: FwdParams) {
                unsafe { $body!($dt, $class, 2)(&p) }
            });
            )?
        )*)*
        /// All forward variants.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const FWD_VARIANTS: &[FwdVariant] = &[$($(
            FwdVariant {
                name: stringify!($name),
                window_name: stringify!($wname),
                general_name: concat!(stringify!($name), "_general"),
                family: FwdFamily::$family,
                dtype: <$dt as Element>::DTYPE,
                class: $class,
                emulate: $body!($dt, $class, 0),
                emulate_window: $body!($dt, $class, 1),
                emulate_general: $body!($dt, $class, 3),
                varlen_name: opt_entry!($($vname)?),
                emulate_varlen: opt_entry!($(FwdParams: $vname => $body!($dt, $class, 2))?),
            },
        )*)*];
    };
}

/// The tile `$tile($d)` (an `Option` from a tile function of `tile.rs`) as a constant.
macro_rules! tile_const {
    ($ty:ty, $tile:expr) => {{
        const T: $ty = match $tile {
            Some(t) => t,
            None => panic!("no tile for this head_dim class"),
        };
        T
    }};
}

/// Declares `$c`, a `tile::Config` type whose tile is `$tile` (one per variant: the tile
/// reaches the kernel whole, as a type).
macro_rules! config {
    ($c:ident: $ty:ty = $tile:expr) => {
        struct $c;
        impl Config for $c {
            type Tile = $ty;
            const TILE: $ty = $tile;
        }
    };
}

/// The SIMT forward variant of a class: `simt_tile(class)`.
macro_rules! fwd_simt {
    ($ty:ty, $d:literal, $w:literal) => {{
        config!(C: SimtTile = simt_tile($d));
        crate::fwd_simt::entry::<$ty, C, { C::TILE.rows_per_warp as usize }, { C::TILE.d_chunks as usize }, { C::TILE.s_cols as usize }, $w>
    }};
}

/// The tensor-core forward variant of a class, for a tile function: its tile as a
/// `tile::Config` type, and the counts the kernel takes as const parameters.
macro_rules! fwd_mma_with {
    ($ty:ty, $tile:ident, $d:literal, $w:expr) => {{
        config!(C: MmaTile = tile_const!(MmaTile, $tile($d)));
        crate::fwd_mma::entry::<
            $ty,
            C,
            { C::TILE.head_dim as usize },
            { C::TILE.head_dim as usize / 16 },
            { C::TILE.head_dim as usize / 8 },
            { C::TILE.m_tiles as usize },
            { C::TILE.bc as usize },
            { C::TILE.bc as usize / 8 },
            { C::TILE.q_in_regs },
            { C::TILE.padded },
            { C::TILE.fused_exp },
            { $w },
        >
    }};
}
macro_rules! fwd_mma {
    ($ty:ty, $d:literal, $w:literal) => {
        fwd_mma_with!($ty, mma_tile, $d, crate::tile::mma_entry($d, $w))
    };
}
macro_rules! fwd_mma_br64 {
    ($ty:ty, $d:literal, $w:literal) => {
        fwd_mma_with!($ty, mma_tile_br64, $d, $w)
    };
}
macro_rules! fwd_mma_unfused {
    ($ty:ty, $d:literal, $w:literal) => {
        fwd_mma_with!($ty, mma_tile_unfused, $d, $w)
    };
}

/// The Hopper forward variant of a class, for a tile function (as `fwd_mma_with!`).
macro_rules! fwd_wgmma_with {
    ($ty:ty, $tile:ident, $d:literal, $w:literal) => {{
        config!(C: WgmmaTile = tile_const!(WgmmaTile, $tile($d)));
        crate::fwd_wgmma::entry::<
            $ty,
            C,
            { C::TILE.head_dim as usize },
            { C::TILE.warpgroups as usize },
            { C::TILE.bc as usize },
            { C::TILE.bc as usize / 8 },
            { C::TILE.head_dim as usize / 8 },
            { C::TILE.bc as usize / 16 },
            { C::TILE.padded },
            $w,
        >
    }};
}
macro_rules! fwd_wgmma {
    ($ty:ty, $d:literal, 0) => {
        fwd_wgmma_with!($ty, wgmma_tile, $d, 0)
    };
    ($ty:ty, $d:literal, $e:literal) => {
        fwd_wgmma_with!($ty, wgmma_window_tile, $d, $e)
    };
}
macro_rules! fwd_wgmma_wg2 {
    ($ty:ty, $d:literal, $w:literal) => {
        fwd_wgmma_with!($ty, wgmma_tile_wg2, $d, $w)
    };
}

fwd_variants! {
    Wgmma @ Sm90a {
        flash_fwd_wgmma_f16_d64p, flash_fwd_wgmma_f16_d64p_window / flash_fwd_wgmma_f16_d64p_varlen => fwd_wgmma(F16, 56),
        flash_fwd_wgmma_f16_d64, flash_fwd_wgmma_f16_d64_window / flash_fwd_wgmma_f16_d64_varlen => fwd_wgmma(F16, 64),
        flash_fwd_wgmma_f16_d128p, flash_fwd_wgmma_f16_d128p_window / flash_fwd_wgmma_f16_d128p_varlen => fwd_wgmma(F16, 120),
        flash_fwd_wgmma_f16_d128, flash_fwd_wgmma_f16_d128_window / flash_fwd_wgmma_f16_d128_varlen => fwd_wgmma(F16, 128),
        flash_fwd_wgmma_f16_d192p, flash_fwd_wgmma_f16_d192p_window / flash_fwd_wgmma_f16_d192p_varlen => fwd_wgmma(F16, 184),
        flash_fwd_wgmma_f16_d192, flash_fwd_wgmma_f16_d192_window / flash_fwd_wgmma_f16_d192_varlen => fwd_wgmma(F16, 192),
        flash_fwd_wgmma_f16_d256p, flash_fwd_wgmma_f16_d256p_window => fwd_wgmma(F16, 248),
        flash_fwd_wgmma_f16_d256, flash_fwd_wgmma_f16_d256_window / flash_fwd_wgmma_f16_d256_varlen => fwd_wgmma(F16, 256),
        flash_fwd_wgmma_bf16_d64p, flash_fwd_wgmma_bf16_d64p_window / flash_fwd_wgmma_bf16_d64p_varlen => fwd_wgmma(Bf16, 56),
        flash_fwd_wgmma_bf16_d64, flash_fwd_wgmma_bf16_d64_window / flash_fwd_wgmma_bf16_d64_varlen => fwd_wgmma(Bf16, 64),
        flash_fwd_wgmma_bf16_d128p, flash_fwd_wgmma_bf16_d128p_window / flash_fwd_wgmma_bf16_d128p_varlen => fwd_wgmma(Bf16, 120),
        flash_fwd_wgmma_bf16_d128, flash_fwd_wgmma_bf16_d128_window / flash_fwd_wgmma_bf16_d128_varlen => fwd_wgmma(Bf16, 128),
        flash_fwd_wgmma_bf16_d192p, flash_fwd_wgmma_bf16_d192p_window / flash_fwd_wgmma_bf16_d192p_varlen => fwd_wgmma(Bf16, 184),
        flash_fwd_wgmma_bf16_d192, flash_fwd_wgmma_bf16_d192_window / flash_fwd_wgmma_bf16_d192_varlen => fwd_wgmma(Bf16, 192),
        flash_fwd_wgmma_bf16_d256p, flash_fwd_wgmma_bf16_d256p_window => fwd_wgmma(Bf16, 248),
        flash_fwd_wgmma_bf16_d256, flash_fwd_wgmma_bf16_d256_window / flash_fwd_wgmma_bf16_d256_varlen => fwd_wgmma(Bf16, 256),
    }
    Mma @ Sm80 {
        flash_fwd_mma_f16_d32, flash_fwd_mma_f16_d32_window / flash_fwd_mma_f16_d32_varlen => fwd_mma(F16, 32),
        flash_fwd_mma_f16_d64p, flash_fwd_mma_f16_d64p_window / flash_fwd_mma_f16_d64p_varlen => fwd_mma(F16, 56),
        flash_fwd_mma_f16_d64, flash_fwd_mma_f16_d64_window / flash_fwd_mma_f16_d64_varlen => fwd_mma(F16, 64),
        flash_fwd_mma_f16_d96, flash_fwd_mma_f16_d96_window / flash_fwd_mma_f16_d96_varlen => fwd_mma(F16, 96),
        flash_fwd_mma_f16_d128p, flash_fwd_mma_f16_d128p_window / flash_fwd_mma_f16_d128p_varlen => fwd_mma(F16, 120),
        flash_fwd_mma_f16_d128, flash_fwd_mma_f16_d128_window => fwd_mma(F16, 128),
        flash_fwd_mma_f16_d192, flash_fwd_mma_f16_d192_window / flash_fwd_mma_f16_d192_varlen => fwd_mma(F16, 192),
        flash_fwd_mma_f16_d256, flash_fwd_mma_f16_d256_window / flash_fwd_mma_f16_d256_varlen => fwd_mma(F16, 256),
        flash_fwd_mma_bf16_d32, flash_fwd_mma_bf16_d32_window / flash_fwd_mma_bf16_d32_varlen => fwd_mma(Bf16, 32),
        flash_fwd_mma_bf16_d64p, flash_fwd_mma_bf16_d64p_window / flash_fwd_mma_bf16_d64p_varlen => fwd_mma(Bf16, 56),
        flash_fwd_mma_bf16_d64, flash_fwd_mma_bf16_d64_window / flash_fwd_mma_bf16_d64_varlen => fwd_mma(Bf16, 64),
        flash_fwd_mma_bf16_d96, flash_fwd_mma_bf16_d96_window / flash_fwd_mma_bf16_d96_varlen => fwd_mma(Bf16, 96),
        flash_fwd_mma_bf16_d128p, flash_fwd_mma_bf16_d128p_window / flash_fwd_mma_bf16_d128p_varlen => fwd_mma(Bf16, 120),
        flash_fwd_mma_bf16_d128, flash_fwd_mma_bf16_d128_window => fwd_mma(Bf16, 128),
        flash_fwd_mma_bf16_d192, flash_fwd_mma_bf16_d192_window / flash_fwd_mma_bf16_d192_varlen => fwd_mma(Bf16, 192),
        flash_fwd_mma_bf16_d256, flash_fwd_mma_bf16_d256_window / flash_fwd_mma_bf16_d256_varlen => fwd_mma(Bf16, 256),
    }
    Simt @ Sm80 {
        flash_fwd_simt_f32_d64, flash_fwd_simt_f32_d64_window / flash_fwd_simt_f32_d64_varlen => fwd_simt(f32, 64),
        flash_fwd_simt_f32_d128, flash_fwd_simt_f32_d128_window / flash_fwd_simt_f32_d128_varlen => fwd_simt(f32, 128),
        flash_fwd_simt_f32_d256, flash_fwd_simt_f32_d256_window / flash_fwd_simt_f32_d256_varlen => fwd_simt(f32, 256),
        flash_fwd_simt_f16_d64, flash_fwd_simt_f16_d64_window / flash_fwd_simt_f16_d64_varlen => fwd_simt(F16, 64),
        flash_fwd_simt_f16_d128, flash_fwd_simt_f16_d128_window / flash_fwd_simt_f16_d128_varlen => fwd_simt(F16, 128),
        flash_fwd_simt_f16_d256, flash_fwd_simt_f16_d256_window / flash_fwd_simt_f16_d256_varlen => fwd_simt(F16, 256),
        flash_fwd_simt_bf16_d64, flash_fwd_simt_bf16_d64_window / flash_fwd_simt_bf16_d64_varlen => fwd_simt(Bf16, 64),
        flash_fwd_simt_bf16_d128, flash_fwd_simt_bf16_d128_window / flash_fwd_simt_bf16_d128_varlen => fwd_simt(Bf16, 128),
        flash_fwd_simt_bf16_d256, flash_fwd_simt_bf16_d256_window / flash_fwd_simt_bf16_d256_varlen => fwd_simt(Bf16, 256),
    }
    MmaBr64 @ Sm80 {
        flash_fwd_mma_br64_f16_d64, flash_fwd_mma_br64_f16_d64_window => fwd_mma_br64(F16, 64),
        flash_fwd_mma_br64_f16_d128, flash_fwd_mma_br64_f16_d128_window => fwd_mma_br64(F16, 128),
        flash_fwd_mma_br64_bf16_d64, flash_fwd_mma_br64_bf16_d64_window => fwd_mma_br64(Bf16, 64),
        flash_fwd_mma_br64_bf16_d128, flash_fwd_mma_br64_bf16_d128_window => fwd_mma_br64(Bf16, 128),
    }
    MmaUnfused @ Sm80 {
        flash_fwd_mma_unfused_f16_d64, flash_fwd_mma_unfused_f16_d64_window => fwd_mma_unfused(F16, 64),
        flash_fwd_mma_unfused_bf16_d64, flash_fwd_mma_unfused_bf16_d64_window => fwd_mma_unfused(Bf16, 64),
    }
    WgmmaWg2 @ Sm90a {
        flash_fwd_wgmma_wg2_f16_d64, flash_fwd_wgmma_wg2_f16_d64_window => fwd_wgmma_wg2(F16, 64),
        flash_fwd_wgmma_wg2_f16_d128, flash_fwd_wgmma_wg2_f16_d128_window => fwd_wgmma_wg2(F16, 128),
        flash_fwd_wgmma_wg2_bf16_d64, flash_fwd_wgmma_wg2_bf16_d64_window => fwd_wgmma_wg2(Bf16, 64),
        flash_fwd_wgmma_wg2_bf16_d128, flash_fwd_wgmma_wg2_bf16_d128_window => fwd_wgmma_wg2(Bf16, 128),
    }
}

/// The variant of `family` for `dtype` and `head_dim`, if there is one.
#[cfg(not(target_arch = "nvptx64"))]
pub fn fwd_variant(family: FwdFamily, dtype: DType, head_dim: u32) -> Option<&'static FwdVariant> {
    FWD_VARIANTS.iter().find(|v| v.family == family && v.dtype == dtype && v.serves(head_dim))
}

/// One kernel launch of a backward family, in launch order.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// The row statistics from the forward's LSE, and D~ from O (`bwd_prep`).
    Prep,
    /// `Prep` with the forward's O residual: D from O + O_lo.
    PrepResidual,
    /// dQ, after writing the row statistics m_i, 1 / l_i and D_i itself.
    Dq,
    /// dQ from the statistics of a `Prep` pass, correcting D~ exactly (`bwd_wgmma`).
    DqSaved,
    /// The statistics alone (the atomic families' first kernel).
    Stats,
    /// dK and dV, over key tiles.
    Dkdv,
    /// dK and dV, and dQ added into an f32 accumulator with atomics, over key tiles.
    Dkdvq,
    /// The f32 dQ accumulator scaled and rounded into dQ (`bwd_convert`).
    DqConvert,
}

#[cfg(not(target_arch = "nvptx64"))]
impl Pass {
    /// Its name in benchmark output and test names.
    pub fn name(self) -> &'static str {
        match self {
            Pass::Prep => "prep",
            Pass::PrepResidual => "prep_residual",
            Pass::Dq => "dq",
            Pass::DqSaved => "dq_saved",
            Pass::Stats => "stats",
            Pass::Dkdv => "dkdv",
            Pass::Dkdvq => "dkdvq",
            Pass::DqConvert => "dq_convert",
        }
    }
    /// Whether its grid runs over key tiles of each KV head (else over query tiles of each
    /// query head).
    pub fn over_keys(self) -> bool {
        matches!(self, Pass::Dkdv | Pass::Dkdvq)
    }
    /// Whether its kernel applies the mask (else one entry serves every mask and window).
    pub fn masks(self) -> bool {
        !self.any_head_dim()
    }
    /// Whether one kernel serves every head_dim of its family (no head-dim class).
    fn any_head_dim(self) -> bool {
        matches!(self, Pass::Prep | Pass::PrepResidual | Pass::DqConvert)
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl core::fmt::Display for Pass {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A backward family's tile function, by tile type.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub enum BwdTiles {
    /// dQ on the forward's tile, dK/dV on its own.
    Simt(fn(u32) -> SimtTile, fn(u32) -> SimtKvTile),
    Mma(fn(u32) -> Option<MmaBwdTile>),
    Wgmma(fn(u32) -> Option<WgmmaBwdTile>),
}

#[cfg(not(target_arch = "nvptx64"))]
impl BwdTiles {
    /// Whether the family has a tile for `head_dim`.
    fn serves(self, head_dim: u32) -> bool {
        match self {
            BwdTiles::Simt(f, _) => (1..=f(head_dim).max_head_dim()).contains(&head_dim),
            BwdTiles::Mma(f) => f(head_dim).is_some(),
            BwdTiles::Wgmma(f) => f(head_dim).is_some(),
        }
    }
    /// Whether `head_dim` runs on the tile of `class` in `pass`.
    fn same_tile(self, pass: Pass, class: u32, head_dim: u32) -> bool {
        match self {
            BwdTiles::Simt(q, _) if pass == Pass::Dq => q(head_dim) == q(class),
            BwdTiles::Simt(_, kv) => kv(head_dim) == kv(class),
            BwdTiles::Mma(f) => f(head_dim) == f(class),
            BwdTiles::Wgmma(f) => f(head_dim) == f(class),
        }
    }
    /// The launch of `pass` at `head_dim` (one the family serves) for entry `e`.
    fn launch(self, pass: Pass, head_dim: u32, e: Entry) -> Option<Launch> {
        let plain = |rows, threads, smem_bytes| Some(Launch { rows, threads, smem_bytes, max_regs: None });
        match (self, pass) {
            (_, Pass::Prep | Pass::PrepResidual) => plain(crate::bwd_prep::PREP_ROWS as u32, 128, 0),
            (_, Pass::DqConvert) => plain(crate::bwd_convert::CONVERT_ROWS as u32, 128, 0),
            (BwdTiles::Simt(q, _), Pass::Dq) => plain(q(head_dim).br(), q(head_dim).threads(), simt_dq_smem_bytes(head_dim)),
            (BwdTiles::Simt(_, kv), _) => plain(kv(head_dim).bn(), kv(head_dim).threads(), kv(head_dim).smem_bytes(head_dim)),
            (BwdTiles::Mma(f), _) => {
                let t = f(head_dim)?;
                let smem = match pass {
                    Pass::Dkdv => t.dkdv_smem_bytes(),
                    Pass::Dkdvq => t.dkdvq_smem_bytes(),
                    _ => t.dq_smem_bytes(),
                };
                plain(MmaBwdTile::ROWS, t.threads(), smem)
            }
            (BwdTiles::Wgmma(f), _) => {
                let t = f(head_dim)?;
                let t = if pass == Pass::Dkdv { t.dkdv_entry(e.code()) } else { t }.caps_in(e.code());
                let (rows, smem, regs) = match pass {
                    Pass::Dkdv => (WgmmaBwdTile::KEYS, t.dkdv_smem_bytes(), t.dkdv_max_regs),
                    Pass::Dkdvq => (WgmmaBwdTile::KEYS, t.dkdvq_smem_bytes(), 0),
                    Pass::DqSaved => (WgmmaBwdTile::ROWS, t.dq_smem_bytes(), t.dq_max_regs),
                    _ => (WgmmaBwdTile::ROWS, t.stats_tile().dq_smem_bytes(), 0),
                };
                let threads = if pass == Pass::Stats { t.stats_tile().threads() } else { t.threads() };
                Some(Launch { rows, threads, smem_bytes: smem, max_regs: (regs > 0).then_some(regs) })
            }
        }
    }
}

/// A backward kernel family.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BwdFamily {
    Wgmma,
    Mma,
    Simt,
    MmaAtomic,
    WgmmaAtomic,
}

/// What every variant of a backward family shares.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct BwdFamilyDesc {
    pub family: BwdFamily,
    /// The name users select it by (`BwdOptions::kernel`).
    pub name: &'static str,
    /// The PTX module of its kernels.
    pub arch: Arch,
    /// Tried by automatic selection (in [`BWD_FAMILIES`] order), or chosen only by name.
    pub auto: bool,
    /// Bitwise deterministic (no atomic adds in a run-dependent order); `deterministic`
    /// backward options skip the others.
    pub deterministic: bool,
    /// Serves only head dims that are multiples of 8 (others go to the next family: SIMT off
    /// Hopper). Their dK/dV kernels sit at 255 registers, and the element-wise body for other
    /// head dims (`copy::load_tile_in`) spills there (ptxas 13.0, sm_80: mma dK/dV 12-16 bytes
    /// at d = 64 and 128, mma_atomic 4-84 bytes, wgmma_atomic 4 bytes at d = 128 padded).
    pub aligned_only: bool,
    /// Whether its kernels apply a softcap (`Problem::softcap`, in their general entries):
    /// automatic selection skips the others for a soft-capped attention, and naming one is
    /// an error. Not the atomic families (no general entries).
    pub softcap: bool,
    /// Whether its variable-length entries apply it too (as `softcap` for a soft-capped
    /// variable-length batch). Not `wgmma`'s: with it, its dQ kernel's variable-length
    /// entries spilled (sm_90a, 12 to 164 bytes at head_dim 128 to 256), so their softcap
    /// is off at compile time (`softcap::Softcap::new_if`).
    pub softcap_varlen: bool,
    /// Whether its kernels apply ALiBi (`BwdParams::alibi`, in their general entries), as
    /// [`BwdFamilyDesc::softcap`] for a softcap: every family with general entries (not the
    /// atomic ones).
    pub alibi: bool,
    /// Whether its kernels apply ALiBi and a softcap together: not `mma` (its dK/dV kernel
    /// at d = 64 has no registers left for tanh's value beside the biased score); automatic
    /// selection skips it for that combination, and naming it is an error.
    pub alibi_softcap: bool,
    /// Whether its kernels take attention sinks (`BwdParams::sinks`): automatic selection
    /// skips the others when the attention has sinks, and naming one is an error. Every
    /// family does.
    pub sinks: bool,
    /// Its passes in launch order, without and with the forward's O residual at hand
    /// (`FwdParams::o_lo`).
    pub passes: [&'static [Pass]; 2],
    /// Its tile function.
    pub tiles: BwdTiles,
}

/// The backward families, in the order automatic selection tries them (best first), among
/// those the device runs: on Hopper `wgmma` (`prep`, dQ and dK/dV kernels on warpgroup MMA;
/// compute capability 9.0, f16 and bf16, head_dim <= 256), the tensor-core kernels (`mma`)
/// where they apply, else SIMT. By name only: `mma_atomic` (FA2's single dK/dV/dQ kernel with
/// atomic dQ) and `wgmma_atomic` (the same structure on warpgroup MMA): their f32 atomics,
/// one per dQ element per 64 keys, cost more than the dQ kernel they replace
/// (benches/RESULTS.md).
#[cfg(not(target_arch = "nvptx64"))]
pub const BWD_FAMILIES: &[BwdFamilyDesc] = &[BWD_WGMMA, BWD_MMA, BWD_SIMT, BWD_MMA_ATOMIC, BWD_WGMMA_ATOMIC];
#[cfg(not(target_arch = "nvptx64"))]
const BWD_WGMMA: BwdFamilyDesc = BwdFamilyDesc {
    family: BwdFamily::Wgmma,
    name: "wgmma",
    arch: Arch::Sm90a,
    auto: true,
    deterministic: true,
    aligned_only: false,
    softcap: true,
    softcap_varlen: false,
    alibi: true,
    alibi_softcap: true,
    sinks: true,
    passes: [&[Pass::Prep, Pass::DqSaved, Pass::Dkdv], &[Pass::PrepResidual, Pass::DqSaved, Pass::Dkdv]],
    tiles: BwdTiles::Wgmma(wgmma_bwd_tile),
};
#[cfg(not(target_arch = "nvptx64"))]
const BWD_MMA: BwdFamilyDesc = BwdFamilyDesc {
    family: BwdFamily::Mma,
    name: "mma",
    arch: Arch::Sm80,
    auto: true,
    deterministic: true,
    aligned_only: true,
    softcap: true,
    softcap_varlen: true,
    alibi: true,
    alibi_softcap: false,
    sinks: true,
    passes: [&[Pass::Dq, Pass::Dkdv], &[Pass::Dq, Pass::Dkdv]],
    tiles: BwdTiles::Mma(mma_bwd_tile),
};
#[cfg(not(target_arch = "nvptx64"))]
const BWD_SIMT: BwdFamilyDesc = BwdFamilyDesc {
    family: BwdFamily::Simt,
    name: "simt",
    arch: Arch::Sm80,
    auto: true,
    deterministic: true,
    aligned_only: false,
    softcap: true,
    softcap_varlen: true,
    alibi: true,
    alibi_softcap: true,
    sinks: true,
    passes: [&[Pass::Dq, Pass::Dkdv], &[Pass::Dq, Pass::Dkdv]],
    tiles: BwdTiles::Simt(simt_dq_tile, simt_kv_tile),
};
#[cfg(not(target_arch = "nvptx64"))]
const BWD_MMA_ATOMIC: BwdFamilyDesc = BwdFamilyDesc {
    family: BwdFamily::MmaAtomic,
    name: "mma_atomic",
    arch: Arch::Sm80,
    auto: false,
    deterministic: false,
    aligned_only: true,
    softcap: false,
    softcap_varlen: false,
    alibi: false,
    alibi_softcap: false,
    sinks: true,
    passes: [&[Pass::Stats, Pass::Dkdvq, Pass::DqConvert], &[Pass::Stats, Pass::Dkdvq, Pass::DqConvert]],
    tiles: BwdTiles::Mma(mma_bwd_tile_atomic),
};
#[cfg(not(target_arch = "nvptx64"))]
const BWD_WGMMA_ATOMIC: BwdFamilyDesc = BwdFamilyDesc {
    family: BwdFamily::WgmmaAtomic,
    name: "wgmma_atomic",
    arch: Arch::Sm90a,
    auto: false,
    deterministic: false,
    aligned_only: true,
    softcap: false,
    softcap_varlen: false,
    alibi: false,
    alibi_softcap: false,
    sinks: true,
    passes: [&[Pass::Stats, Pass::Dkdvq, Pass::DqConvert], &[Pass::PrepResidual, Pass::Dkdvq, Pass::DqConvert]],
    tiles: BwdTiles::Wgmma(wgmma_bwd_tile_atomic),
};

#[cfg(not(target_arch = "nvptx64"))]
impl BwdFamilyDesc {
    /// Whether its kernels of entry `e` apply a softcap (`softcap`, `softcap_varlen`).
    pub fn softcap_in(&self, e: Entry) -> bool {
        self.softcap && (e != Entry::Varlen || self.softcap_varlen)
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl BwdFamily {
    /// Its descriptor.
    pub fn desc(self) -> &'static BwdFamilyDesc {
        match self {
            BwdFamily::Wgmma => &BWD_WGMMA,
            BwdFamily::Mma => &BWD_MMA,
            BwdFamily::Simt => &BWD_SIMT,
            BwdFamily::MmaAtomic => &BWD_MMA_ATOMIC,
            BwdFamily::WgmmaAtomic => &BWD_WGMMA_ATOMIC,
        }
    }
    /// The family of that name.
    pub fn from_name(name: &str) -> Option<BwdFamily> {
        BWD_FAMILIES.iter().find(|f| f.name == name).map(|f| f.family)
    }
    pub fn name(self) -> &'static str {
        self.desc().name
    }
    /// Its passes in launch order; `saved`: with the forward's O residual at hand.
    pub fn passes(self, saved: bool) -> &'static [Pass] {
        self.desc().passes[saved as usize]
    }
    /// Whether it takes entry `e` (a sliding window, a variable-length batch): every
    /// variant has a kernel for it ([`BwdVariant::entry`]; the atomic families have none).
    pub fn takes(self, e: Entry) -> bool {
        BWD_VARIANTS.iter().filter(|v| v.family == self).all(|v| v.entry(e).is_some())
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl core::fmt::Display for BwdFamily {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A backward kernel's PTX entry name and its body for the emulator.
#[cfg(not(target_arch = "nvptx64"))]
pub type BwdEntry = (&'static str, unsafe fn(&BwdParams));

/// A backward kernel variant, as the host launches it.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct BwdVariant {
    /// PTX entry name.
    pub name: &'static str,
    pub family: BwdFamily,
    pub pass: Pass,
    /// Element type of Q, K, V, O, dO and the gradients.
    pub dtype: DType,
    /// A head_dim of its class (as [`FwdVariant::class`]); ignored by the passes that serve
    /// every head_dim of their family (prep, dq_convert).
    pub class: u32,
    /// The same kernel body, for the emulator.
    pub emulate: unsafe fn(&BwdParams),
    /// PTX entry name and emulator body of the same kernel with a sliding window, for a pass
    /// that masks (`None`: no windowed kernel; for the passes that take no mask, prep and
    /// dq_convert, the entry above serves a window); also with a softcap or ALiBi
    /// (`mask::General`) where the variant has no general entry below.
    pub window_name: Option<&'static str>,
    pub emulate_window: Option<unsafe fn(&BwdParams)>,
    /// The same with a softcap or ALiBi, a window or not (`mask::General`), where it has an
    /// entry of its own (`wgmma`; the window entry above is then window-only).
    pub general_name: Option<&'static str>,
    pub emulate_general: Option<unsafe fn(&BwdParams)>,
    /// The same for a variable-length batch (`varlen`, `mask::General`); for prep, the
    /// entry above.
    pub varlen_name: Option<&'static str>,
    pub emulate_varlen: Option<unsafe fn(&BwdParams)>,
}

#[cfg(not(target_arch = "nvptx64"))]
impl BwdVariant {
    /// Whether this variant serves `head_dim`.
    pub fn serves(&self, head_dim: u32) -> bool {
        let f = self.family.desc();
        f.tiles.serves(head_dim)
            && (head_dim.is_multiple_of(8) || !f.aligned_only)
            && (self.pass.any_head_dim() || f.tiles.same_tile(self.pass, self.class, head_dim))
    }
    /// The PTX module it is in (the GPUs that can run it).
    pub fn arch(&self) -> Arch {
        self.family.desc().arch
    }
    /// Its plain entry's launch at `head_dim`, if it serves it.
    pub fn launch(&self, head_dim: u32) -> Option<Launch> {
        self.launch_entry(head_dim, Entry::Plain)
    }
    /// The launch of its entry `e` at `head_dim`, if it serves it (an entry may take
    /// another tile: `WgmmaBwdTile::dkdv_entry`).
    pub fn launch_entry(&self, head_dim: u32, e: Entry) -> Option<Launch> {
        if self.serves(head_dim) { self.family.desc().tiles.launch(self.pass, head_dim, e) } else { None }
    }
    /// The smallest and largest head_dim it serves.
    pub fn head_dims(&self) -> (u32, u32) {
        head_dim_range(|d| self.serves(d))
    }
    /// The entry name and emulator body of entry `e`; `None` where it has no such kernel
    /// (the passes that take no mask, prep and dq_convert, serve every entry with one; prep
    /// narrows to a variable-length batch's sequence at run time).
    pub fn entry(&self, e: Entry) -> Option<BwdEntry> {
        let (name, body) = match e {
            Entry::Plain => (Some(self.name), Some(self.emulate)),
            Entry::Window => (self.window_name, self.emulate_window),
            // Without a general entry the window entry takes a softcap and ALiBi too
            // (`bwd_variants!`).
            Entry::General if self.general_name.is_some() => (self.general_name, self.emulate_general),
            Entry::General => (self.window_name, self.emulate_window),
            Entry::Varlen => (self.varlen_name, self.emulate_varlen),
        };
        match name.zip(body) {
            Some(entry) => Some(entry),
            None if self.pass.masks() || (e == Entry::Varlen && self.pass == Pass::DqConvert) => None,
            None => Some((self.name, self.emulate)),
        }
    }
    /// Its PTX entry names: plain, window, general, variable-length (those it has).
    pub fn entry_names(&self) -> impl Iterator<Item = &'static str> {
        self.entries().map(|(_, name)| name)
    }
    /// Its PTX entries, each with the entry kind it is ([`Entry`]).
    pub fn entries(&self) -> impl Iterator<Item = (Entry, &'static str)> {
        let named = [
            (Entry::Plain, Some(self.name)),
            (Entry::Window, self.window_name),
            (Entry::General, self.general_name),
            (Entry::Varlen, self.varlen_name),
        ];
        named.into_iter().filter_map(|(e, n)| Some((e, n?)))
    }
    /// The `.maxnreg` its entry `e` is loaded with, if any (the tile's, `wgmma_bwd_tile`,
    /// `WgmmaBwdTile::caps_in`).
    pub fn max_regs_in(&self, e: Entry) -> Option<u32> {
        self.family.desc().tiles.launch(self.pass, self.class, e)?.max_regs
    }
}

/// The window entry of a backward variant, and its general entry where it has one
/// (`bwd_variants!`): the window entry is then window-only (`crate::ENTRY_WINDOW`), else it
/// is the general one (`crate::ENTRY_GENERAL`).
macro_rules! bwd_window_entries {
    ($arch:ident, $body:ident, $dt:ty, $class:literal, $wname:ident) => {
        in_module!(
            $arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $wname(p: BwdParams) {
                unsafe { $body!($dt, $class, 3)(&p) }
            }
        );
    };
    ($arch:ident, $body:ident, $dt:ty, $class:literal, $wname:ident, $gname:ident) => {
        in_module!(
            $arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $wname(p: BwdParams) {
                unsafe { $body!($dt, $class, 1)(&p) }
            }
        );
        in_module!(
            $arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $gname(p: BwdParams) {
                unsafe { $body!($dt, $class, 3)(&p) }
            }
        );
    };
}

/// The window entry's body (as `bwd_window_entries!`).
macro_rules! bwd_window_body {
    ($body:ident, $dt:ty, $class:literal) => {
        $body!($dt, $class, 3)
    };
    ($body:ident, $dt:ty, $class:literal, $gname:ident) => {
        $body!($dt, $class, 1)
    };
}

/// As `fwd_variants!`, for the backward kernels: `Family { entry_name[, window_entry_name[ +
/// general_entry_name]][ / varlen_entry_name] => Pass: body_macro(dtype, class), ... }` (a
/// window entry where the pass masks and the family takes windows). Without a general entry
/// of its own the window entry is the general one (`crate::ENTRY_GENERAL`: window, softcap and
/// ALiBi); with one, window-only (`crate::ENTRY_WINDOW`), so that a window launch carries no
/// code and no registers for the others.
macro_rules! bwd_variants {
    ($( $family:ident @ $arch:ident { $( $name:ident $(, $wname:ident $(+ $gname:ident)?)? $(/ $vname:ident)? => $pass:ident: $body:ident($dt:ty, $class:literal), )* } )*) => {
        $($(
            in_module!($arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: BwdParams) {
                unsafe { $body!($dt, $class, 0)(&p) }
            });
            $(
            bwd_window_entries!($arch, $body, $dt, $class, $wname $(, $gname)?);
            )?
            $(
            in_module!($arch,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $vname(p: BwdParams) {
                unsafe { $body!($dt, $class, 2)(&p) }
            });
            )?
        )*)*
        /// All backward variants.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const BWD_VARIANTS: &[BwdVariant] = &[$($(
            BwdVariant {
                name: stringify!($name),
                family: BwdFamily::$family,
                pass: Pass::$pass,
                dtype: <$dt as Element>::DTYPE,
                class: $class,
                emulate: $body!($dt, $class, 0),
                window_name: opt_entry!($($wname)?),
                emulate_window: opt_entry!($(BwdParams: $wname => bwd_window_body!($body, $dt, $class $(, $gname)?))?),
                general_name: opt_entry!($($($gname)?)?),
                emulate_general: opt_entry!($($(BwdParams: $gname => $body!($dt, $class, 3))?)?),
                varlen_name: opt_entry!($($vname)?),
                emulate_varlen: opt_entry!($(BwdParams: $vname => $body!($dt, $class, 2))?),
            },
        )*)*];
    };
}

/// The SIMT dQ variant of a class: `simt_dq_tile(class)`.
macro_rules! bwd_simt_q {
    ($ty:ty, $d:literal, $w:literal) => {{
        config!(C: SimtTile = simt_dq_tile($d));
        crate::bwd_simt::dq::<$ty, C, { C::TILE.rows_per_warp as usize }, { C::TILE.d_chunks as usize }, { C::TILE.s_cols as usize }, $w>
    }};
}

/// The tensor-core dQ kernel of a class, `mma_bwd_tile(class)`; with `$stats`, its first pass
/// alone (the atomic backward's statistics kernel).
macro_rules! bwd_mma_q_with {
    ($ty:ty, $d:literal, $stats:literal, $w:literal) => {{
        config!(C: MmaBwdTile = tile_const!(MmaBwdTile, mma_bwd_tile($d)));
        crate::bwd_mma::dq::<
            $ty,
            C,
            { C::TILE.head_dim as usize },
            { C::TILE.head_dim as usize / 16 / C::TILE.split as usize },
            { C::TILE.head_dim as usize / 8 / C::TILE.split as usize },
            { C::TILE.dq_bc as usize },
            { C::TILE.dq_bc as usize / 8 },
            { C::TILE.dq_q_in_regs },
            $stats,
            { C::TILE.split as usize },
            $w,
        >
    }};
}
macro_rules! bwd_mma_q {
    ($ty:ty, $d:literal, $w:literal) => {
        bwd_mma_q_with!($ty, $d, false, $w)
    };
}
macro_rules! bwd_mma_stats {
    ($ty:ty, $d:literal, $w:literal) => {
        bwd_mma_q_with!($ty, $d, true, $w)
    };
}

/// The tensor-core dK/dV kernel of a class for a tile function; with `$dq`, it also adds dQ
/// to the f32 accumulator with atomics (the atomic backward's main kernel).
macro_rules! bwd_mma_kv_with {
    ($ty:ty, $tile:ident, $d:literal, $dq:literal, $w:literal) => {{
        config!(C: MmaBwdTile = tile_const!(MmaBwdTile, $tile($d)));
        crate::bwd_mma::dkdv::<
            $ty,
            C,
            { C::TILE.head_dim as usize },
            { C::TILE.head_dim as usize / 16 / C::TILE.split as usize },
            { C::TILE.head_dim as usize / 8 / C::TILE.split as usize },
            { C::TILE.kv_br as usize },
            { C::TILE.kv_br as usize / 8 },
            { C::TILE.kv_in_regs },
            $dq,
            { C::TILE.split as usize },
            $w,
        >
    }};
}
macro_rules! bwd_mma_kv {
    ($ty:ty, $d:literal, $w:literal) => {
        bwd_mma_kv_with!($ty, mma_bwd_tile, $d, false, $w)
    };
}
macro_rules! bwd_mma_kvq {
    ($ty:ty, $d:literal, $w:literal) => {
        bwd_mma_kv_with!($ty, mma_bwd_tile_atomic, $d, true, $w)
    };
}

/// The Hopper dK/dV kernel of a class, `wgmma_bwd_tile(class)`; with `$dq`, it also adds dQ
/// to the f32 accumulator with atomics (the atomic backward's main kernel).
macro_rules! bwd_wgmma_kv_with {
    ($ty:ty, $d:literal, $dq:literal, $w:literal) => {{
        config!(C: WgmmaBwdTile = tile_const!(WgmmaBwdTile, wgmma_bwd_tile($d)).dkdv_entry($w));
        crate::bwd_wgmma::dkdv::<
            $ty,
            C,
            { C::TILE.head_dim as usize },
            { C::TILE.head_dim as usize / 8 },
            { C::TILE.br as usize },
            { C::TILE.br as usize / 8 },
            { C::TILE.br as usize / 16 },
            { C::TILE.threads() as usize },
            { 2 / C::TILE.split as usize },
            { C::TILE.padded },
            $dq,
            $w,
        >
    }};
}
macro_rules! bwd_wgmma_kv {
    ($ty:ty, $d:literal, $w:literal) => {
        bwd_wgmma_kv_with!($ty, $d, false, $w)
    };
}
macro_rules! bwd_wgmma_kvq {
    ($ty:ty, $d:literal, $w:literal) => {
        bwd_wgmma_kv_with!($ty, $d, true, $w)
    };
}

/// The Hopper dQ kernel of a class, `wgmma_bwd_tile(class)`, with the passes of `$mode`
/// (`bwd_wgmma_dq::DQ_SAVED`, `DQ_STATS`).
macro_rules! bwd_wgmma_q_with {
    ($ty:ty, $d:literal, $mode:ident, $w:literal) => {
        bwd_wgmma_q_with!($ty, tile_const!(WgmmaBwdTile, wgmma_bwd_tile($d)), $mode, $w)
    };
    ($ty:ty, $tile:expr, $mode:ident, $w:literal) => {{
        config!(C: WgmmaBwdTile = $tile);
        crate::bwd_wgmma_dq::dq::<
            $ty,
            C,
            { C::TILE.head_dim as usize },
            { C::TILE.head_dim as usize / 8 },
            { C::TILE.dq_bc as usize },
            { C::TILE.dq_bc as usize / 8 },
            { C::TILE.dq_bc as usize / 16 },
            { (C::TILE.dq_bc / C::TILE.split) as usize / 8 },
            { (C::TILE.dq_bc / C::TILE.split) as usize / 16 },
            { C::TILE.threads() as usize },
            { (C::TILE.head_dim / C::TILE.split) as usize },
            { (C::TILE.head_dim / C::TILE.split) as usize / 8 },
            { C::TILE.padded },
            { crate::bwd_wgmma_dq::$mode },
            $w,
        >
    }};
}
macro_rules! bwd_wgmma_dq_saved {
    ($ty:ty, $d:literal, $w:literal) => {
        bwd_wgmma_q_with!($ty, $d, DQ_SAVED, $w)
    };
}
macro_rules! bwd_wgmma_stats {
    ($ty:ty, $d:literal, $w:literal) => {
        bwd_wgmma_q_with!($ty, tile_const!(WgmmaBwdTile, wgmma_bwd_tile_atomic($d)).stats_tile(), DQ_STATS, $w)
    };
}

/// The `prep` kernel (every head_dim of its family; the class is 0).
macro_rules! bwd_prep {
    ($ty:ty, $d:literal, $w:literal) => {
        crate::bwd_prep::prep::<$ty, false>
    };
}
macro_rules! bwd_prep_residual {
    ($ty:ty, $d:literal, $w:literal) => {
        crate::bwd_prep::prep::<$ty, true>
    };
}
/// dQ's conversion from the f32 accumulator (every head_dim of its family; the class is 0).
macro_rules! bwd_dq_convert {
    ($ty:ty, $d:literal, $w:literal) => {
        crate::bwd_convert::dq_convert::<$ty>
    };
}

bwd_variants! {
    Wgmma @ Sm90a {
        flash_bwd_prep_f16 => Prep: bwd_prep(F16, 0),
        flash_bwd_prep_bf16 => Prep: bwd_prep(Bf16, 0),
        flash_bwd_prep_residual_f16 => PrepResidual: bwd_prep_residual(F16, 0),
        flash_bwd_prep_residual_bf16 => PrepResidual: bwd_prep_residual(Bf16, 0),
        flash_bwd_wgmma_dqs_f16_d64p, flash_bwd_wgmma_dqs_f16_d64p_window + flash_bwd_wgmma_dqs_f16_d64p_general / flash_bwd_wgmma_dqs_f16_d64p_varlen => DqSaved: bwd_wgmma_dq_saved(F16, 56),
        flash_bwd_wgmma_dqs_f16_d64, flash_bwd_wgmma_dqs_f16_d64_window + flash_bwd_wgmma_dqs_f16_d64_general / flash_bwd_wgmma_dqs_f16_d64_varlen => DqSaved: bwd_wgmma_dq_saved(F16, 64),
        flash_bwd_wgmma_dqs_f16_d128p, flash_bwd_wgmma_dqs_f16_d128p_window + flash_bwd_wgmma_dqs_f16_d128p_general / flash_bwd_wgmma_dqs_f16_d128p_varlen => DqSaved: bwd_wgmma_dq_saved(F16, 120),
        flash_bwd_wgmma_dqs_f16_d128, flash_bwd_wgmma_dqs_f16_d128_window + flash_bwd_wgmma_dqs_f16_d128_general / flash_bwd_wgmma_dqs_f16_d128_varlen => DqSaved: bwd_wgmma_dq_saved(F16, 128),
        flash_bwd_wgmma_dqs_bf16_d64p, flash_bwd_wgmma_dqs_bf16_d64p_window + flash_bwd_wgmma_dqs_bf16_d64p_general / flash_bwd_wgmma_dqs_bf16_d64p_varlen => DqSaved: bwd_wgmma_dq_saved(Bf16, 56),
        flash_bwd_wgmma_dqs_bf16_d64, flash_bwd_wgmma_dqs_bf16_d64_window + flash_bwd_wgmma_dqs_bf16_d64_general / flash_bwd_wgmma_dqs_bf16_d64_varlen => DqSaved: bwd_wgmma_dq_saved(Bf16, 64),
        flash_bwd_wgmma_dqs_bf16_d128p, flash_bwd_wgmma_dqs_bf16_d128p_window + flash_bwd_wgmma_dqs_bf16_d128p_general / flash_bwd_wgmma_dqs_bf16_d128p_varlen => DqSaved: bwd_wgmma_dq_saved(Bf16, 120),
        flash_bwd_wgmma_dqs_bf16_d128, flash_bwd_wgmma_dqs_bf16_d128_window + flash_bwd_wgmma_dqs_bf16_d128_general / flash_bwd_wgmma_dqs_bf16_d128_varlen => DqSaved: bwd_wgmma_dq_saved(Bf16, 128),
        flash_bwd_wgmma_dqs_f16_d192p, flash_bwd_wgmma_dqs_f16_d192p_window + flash_bwd_wgmma_dqs_f16_d192p_general / flash_bwd_wgmma_dqs_f16_d192p_varlen => DqSaved: bwd_wgmma_dq_saved(F16, 184),
        flash_bwd_wgmma_dqs_f16_d192, flash_bwd_wgmma_dqs_f16_d192_window + flash_bwd_wgmma_dqs_f16_d192_general / flash_bwd_wgmma_dqs_f16_d192_varlen => DqSaved: bwd_wgmma_dq_saved(F16, 192),
        flash_bwd_wgmma_dqs_f16_d256p, flash_bwd_wgmma_dqs_f16_d256p_window + flash_bwd_wgmma_dqs_f16_d256p_general / flash_bwd_wgmma_dqs_f16_d256p_varlen => DqSaved: bwd_wgmma_dq_saved(F16, 248),
        flash_bwd_wgmma_dqs_f16_d256, flash_bwd_wgmma_dqs_f16_d256_window + flash_bwd_wgmma_dqs_f16_d256_general / flash_bwd_wgmma_dqs_f16_d256_varlen => DqSaved: bwd_wgmma_dq_saved(F16, 256),
        flash_bwd_wgmma_dqs_bf16_d192p, flash_bwd_wgmma_dqs_bf16_d192p_window + flash_bwd_wgmma_dqs_bf16_d192p_general / flash_bwd_wgmma_dqs_bf16_d192p_varlen => DqSaved: bwd_wgmma_dq_saved(Bf16, 184),
        flash_bwd_wgmma_dqs_bf16_d192, flash_bwd_wgmma_dqs_bf16_d192_window + flash_bwd_wgmma_dqs_bf16_d192_general / flash_bwd_wgmma_dqs_bf16_d192_varlen => DqSaved: bwd_wgmma_dq_saved(Bf16, 192),
        flash_bwd_wgmma_dqs_bf16_d256p, flash_bwd_wgmma_dqs_bf16_d256p_window + flash_bwd_wgmma_dqs_bf16_d256p_general / flash_bwd_wgmma_dqs_bf16_d256p_varlen => DqSaved: bwd_wgmma_dq_saved(Bf16, 248),
        flash_bwd_wgmma_dqs_bf16_d256, flash_bwd_wgmma_dqs_bf16_d256_window + flash_bwd_wgmma_dqs_bf16_d256_general / flash_bwd_wgmma_dqs_bf16_d256_varlen => DqSaved: bwd_wgmma_dq_saved(Bf16, 256),
        // The variable-length dK/dV entries at d = 128 split over two warpgroups
        // (`WgmmaBwdTile::dkdv_entry`).
        flash_bwd_wgmma_dkdv_f16_d64p, flash_bwd_wgmma_dkdv_f16_d64p_window + flash_bwd_wgmma_dkdv_f16_d64p_general / flash_bwd_wgmma_dkdv_f16_d64p_varlen => Dkdv: bwd_wgmma_kv(F16, 56),
        flash_bwd_wgmma_dkdv_f16_d64, flash_bwd_wgmma_dkdv_f16_d64_window + flash_bwd_wgmma_dkdv_f16_d64_general / flash_bwd_wgmma_dkdv_f16_d64_varlen => Dkdv: bwd_wgmma_kv(F16, 64),
        flash_bwd_wgmma_dkdv_f16_d128p, flash_bwd_wgmma_dkdv_f16_d128p_window + flash_bwd_wgmma_dkdv_f16_d128p_general / flash_bwd_wgmma_dkdv_f16_d128p_varlen => Dkdv: bwd_wgmma_kv(F16, 120),
        flash_bwd_wgmma_dkdv_f16_d128, flash_bwd_wgmma_dkdv_f16_d128_window + flash_bwd_wgmma_dkdv_f16_d128_general / flash_bwd_wgmma_dkdv_f16_d128_varlen => Dkdv: bwd_wgmma_kv(F16, 128),
        flash_bwd_wgmma_dkdv_bf16_d64p, flash_bwd_wgmma_dkdv_bf16_d64p_window + flash_bwd_wgmma_dkdv_bf16_d64p_general / flash_bwd_wgmma_dkdv_bf16_d64p_varlen => Dkdv: bwd_wgmma_kv(Bf16, 56),
        flash_bwd_wgmma_dkdv_bf16_d64, flash_bwd_wgmma_dkdv_bf16_d64_window + flash_bwd_wgmma_dkdv_bf16_d64_general / flash_bwd_wgmma_dkdv_bf16_d64_varlen => Dkdv: bwd_wgmma_kv(Bf16, 64),
        flash_bwd_wgmma_dkdv_bf16_d128p, flash_bwd_wgmma_dkdv_bf16_d128p_window + flash_bwd_wgmma_dkdv_bf16_d128p_general / flash_bwd_wgmma_dkdv_bf16_d128p_varlen => Dkdv: bwd_wgmma_kv(Bf16, 120),
        flash_bwd_wgmma_dkdv_bf16_d128, flash_bwd_wgmma_dkdv_bf16_d128_window + flash_bwd_wgmma_dkdv_bf16_d128_general / flash_bwd_wgmma_dkdv_bf16_d128_varlen => Dkdv: bwd_wgmma_kv(Bf16, 128),
        flash_bwd_wgmma_dkdv_f16_d192p, flash_bwd_wgmma_dkdv_f16_d192p_window + flash_bwd_wgmma_dkdv_f16_d192p_general / flash_bwd_wgmma_dkdv_f16_d192p_varlen => Dkdv: bwd_wgmma_kv(F16, 184),
        flash_bwd_wgmma_dkdv_f16_d192, flash_bwd_wgmma_dkdv_f16_d192_window + flash_bwd_wgmma_dkdv_f16_d192_general / flash_bwd_wgmma_dkdv_f16_d192_varlen => Dkdv: bwd_wgmma_kv(F16, 192),
        flash_bwd_wgmma_dkdv_f16_d256p, flash_bwd_wgmma_dkdv_f16_d256p_window + flash_bwd_wgmma_dkdv_f16_d256p_general / flash_bwd_wgmma_dkdv_f16_d256p_varlen => Dkdv: bwd_wgmma_kv(F16, 248),
        flash_bwd_wgmma_dkdv_f16_d256, flash_bwd_wgmma_dkdv_f16_d256_window + flash_bwd_wgmma_dkdv_f16_d256_general / flash_bwd_wgmma_dkdv_f16_d256_varlen => Dkdv: bwd_wgmma_kv(F16, 256),
        flash_bwd_wgmma_dkdv_bf16_d192p, flash_bwd_wgmma_dkdv_bf16_d192p_window + flash_bwd_wgmma_dkdv_bf16_d192p_general / flash_bwd_wgmma_dkdv_bf16_d192p_varlen => Dkdv: bwd_wgmma_kv(Bf16, 184),
        flash_bwd_wgmma_dkdv_bf16_d192, flash_bwd_wgmma_dkdv_bf16_d192_window + flash_bwd_wgmma_dkdv_bf16_d192_general / flash_bwd_wgmma_dkdv_bf16_d192_varlen => Dkdv: bwd_wgmma_kv(Bf16, 192),
        flash_bwd_wgmma_dkdv_bf16_d256p, flash_bwd_wgmma_dkdv_bf16_d256p_window + flash_bwd_wgmma_dkdv_bf16_d256p_general / flash_bwd_wgmma_dkdv_bf16_d256p_varlen => Dkdv: bwd_wgmma_kv(Bf16, 248),
        flash_bwd_wgmma_dkdv_bf16_d256, flash_bwd_wgmma_dkdv_bf16_d256_window + flash_bwd_wgmma_dkdv_bf16_d256_general / flash_bwd_wgmma_dkdv_bf16_d256_varlen => Dkdv: bwd_wgmma_kv(Bf16, 256),
    }
    WgmmaAtomic @ Sm90a {
        flash_bwd_wgmma_atomic_stats_f16_d64p => Stats: bwd_wgmma_stats(F16, 56),
        flash_bwd_wgmma_atomic_stats_f16_d64 => Stats: bwd_wgmma_stats(F16, 64),
        flash_bwd_wgmma_atomic_stats_f16_d128p => Stats: bwd_wgmma_stats(F16, 120),
        flash_bwd_wgmma_atomic_stats_f16_d128 => Stats: bwd_wgmma_stats(F16, 128),
        flash_bwd_wgmma_atomic_stats_bf16_d64p => Stats: bwd_wgmma_stats(Bf16, 56),
        flash_bwd_wgmma_atomic_stats_bf16_d64 => Stats: bwd_wgmma_stats(Bf16, 64),
        flash_bwd_wgmma_atomic_stats_bf16_d128p => Stats: bwd_wgmma_stats(Bf16, 120),
        flash_bwd_wgmma_atomic_stats_bf16_d128 => Stats: bwd_wgmma_stats(Bf16, 128),
        flash_bwd_wgmma_atomic_dkdvq_f16_d64p => Dkdvq: bwd_wgmma_kvq(F16, 56),
        flash_bwd_wgmma_atomic_dkdvq_f16_d64 => Dkdvq: bwd_wgmma_kvq(F16, 64),
        flash_bwd_wgmma_atomic_dkdvq_f16_d128p => Dkdvq: bwd_wgmma_kvq(F16, 120),
        flash_bwd_wgmma_atomic_dkdvq_f16_d128 => Dkdvq: bwd_wgmma_kvq(F16, 128),
        flash_bwd_wgmma_atomic_dkdvq_bf16_d64p => Dkdvq: bwd_wgmma_kvq(Bf16, 56),
        flash_bwd_wgmma_atomic_dkdvq_bf16_d64 => Dkdvq: bwd_wgmma_kvq(Bf16, 64),
        flash_bwd_wgmma_atomic_dkdvq_bf16_d128p => Dkdvq: bwd_wgmma_kvq(Bf16, 120),
        flash_bwd_wgmma_atomic_dkdvq_bf16_d128 => Dkdvq: bwd_wgmma_kvq(Bf16, 128),
        flash_bwd_wgmma_atomic_stats_f16_d192p => Stats: bwd_wgmma_stats(F16, 184),
        flash_bwd_wgmma_atomic_stats_f16_d192 => Stats: bwd_wgmma_stats(F16, 192),
        flash_bwd_wgmma_atomic_stats_f16_d256p => Stats: bwd_wgmma_stats(F16, 248),
        flash_bwd_wgmma_atomic_stats_f16_d256 => Stats: bwd_wgmma_stats(F16, 256),
        flash_bwd_wgmma_atomic_stats_bf16_d192p => Stats: bwd_wgmma_stats(Bf16, 184),
        flash_bwd_wgmma_atomic_stats_bf16_d192 => Stats: bwd_wgmma_stats(Bf16, 192),
        flash_bwd_wgmma_atomic_stats_bf16_d256p => Stats: bwd_wgmma_stats(Bf16, 248),
        flash_bwd_wgmma_atomic_stats_bf16_d256 => Stats: bwd_wgmma_stats(Bf16, 256),
        flash_bwd_wgmma_atomic_dkdvq_f16_d192p => Dkdvq: bwd_wgmma_kvq(F16, 184),
        flash_bwd_wgmma_atomic_dkdvq_f16_d192 => Dkdvq: bwd_wgmma_kvq(F16, 192),
        flash_bwd_wgmma_atomic_dkdvq_f16_d256p => Dkdvq: bwd_wgmma_kvq(F16, 248),
        flash_bwd_wgmma_atomic_dkdvq_f16_d256 => Dkdvq: bwd_wgmma_kvq(F16, 256),
        flash_bwd_wgmma_atomic_dkdvq_bf16_d192p => Dkdvq: bwd_wgmma_kvq(Bf16, 184),
        flash_bwd_wgmma_atomic_dkdvq_bf16_d192 => Dkdvq: bwd_wgmma_kvq(Bf16, 192),
        flash_bwd_wgmma_atomic_dkdvq_bf16_d256p => Dkdvq: bwd_wgmma_kvq(Bf16, 248),
        flash_bwd_wgmma_atomic_dkdvq_bf16_d256 => Dkdvq: bwd_wgmma_kvq(Bf16, 256),
        flash_bwd_wgmma_atomic_prep_f16 => PrepResidual: bwd_prep_residual(F16, 0),
        flash_bwd_wgmma_atomic_prep_bf16 => PrepResidual: bwd_prep_residual(Bf16, 0),
        flash_bwd_wgmma_atomic_convert_f16 => DqConvert: bwd_dq_convert(F16, 0),
        flash_bwd_wgmma_atomic_convert_bf16 => DqConvert: bwd_dq_convert(Bf16, 0),
    }
    Mma @ Sm80 {
        flash_bwd_mma_dq_f16_d32, flash_bwd_mma_dq_f16_d32_window => Dq: bwd_mma_q(F16, 32),
        flash_bwd_mma_dq_f16_d64, flash_bwd_mma_dq_f16_d64_window => Dq: bwd_mma_q(F16, 64),
        flash_bwd_mma_dq_f16_d96, flash_bwd_mma_dq_f16_d96_window => Dq: bwd_mma_q(F16, 96),
        flash_bwd_mma_dq_f16_d128, flash_bwd_mma_dq_f16_d128_window => Dq: bwd_mma_q(F16, 128),
        flash_bwd_mma_dq_f16_d192, flash_bwd_mma_dq_f16_d192_window => Dq: bwd_mma_q(F16, 192),
        flash_bwd_mma_dq_f16_d256, flash_bwd_mma_dq_f16_d256_window => Dq: bwd_mma_q(F16, 256),
        flash_bwd_mma_dq_bf16_d32, flash_bwd_mma_dq_bf16_d32_window => Dq: bwd_mma_q(Bf16, 32),
        flash_bwd_mma_dq_bf16_d64, flash_bwd_mma_dq_bf16_d64_window => Dq: bwd_mma_q(Bf16, 64),
        flash_bwd_mma_dq_bf16_d96, flash_bwd_mma_dq_bf16_d96_window => Dq: bwd_mma_q(Bf16, 96),
        flash_bwd_mma_dq_bf16_d128, flash_bwd_mma_dq_bf16_d128_window => Dq: bwd_mma_q(Bf16, 128),
        flash_bwd_mma_dq_bf16_d192, flash_bwd_mma_dq_bf16_d192_window => Dq: bwd_mma_q(Bf16, 192),
        flash_bwd_mma_dq_bf16_d256, flash_bwd_mma_dq_bf16_d256_window => Dq: bwd_mma_q(Bf16, 256),
        flash_bwd_mma_dkdv_f16_d32, flash_bwd_mma_dkdv_f16_d32_window => Dkdv: bwd_mma_kv(F16, 32),
        flash_bwd_mma_dkdv_f16_d64, flash_bwd_mma_dkdv_f16_d64_window => Dkdv: bwd_mma_kv(F16, 64),
        flash_bwd_mma_dkdv_f16_d96, flash_bwd_mma_dkdv_f16_d96_window => Dkdv: bwd_mma_kv(F16, 96),
        flash_bwd_mma_dkdv_f16_d128, flash_bwd_mma_dkdv_f16_d128_window => Dkdv: bwd_mma_kv(F16, 128),
        flash_bwd_mma_dkdv_f16_d192, flash_bwd_mma_dkdv_f16_d192_window => Dkdv: bwd_mma_kv(F16, 192),
        flash_bwd_mma_dkdv_f16_d256, flash_bwd_mma_dkdv_f16_d256_window => Dkdv: bwd_mma_kv(F16, 256),
        flash_bwd_mma_dkdv_bf16_d32, flash_bwd_mma_dkdv_bf16_d32_window => Dkdv: bwd_mma_kv(Bf16, 32),
        flash_bwd_mma_dkdv_bf16_d64, flash_bwd_mma_dkdv_bf16_d64_window => Dkdv: bwd_mma_kv(Bf16, 64),
        flash_bwd_mma_dkdv_bf16_d96, flash_bwd_mma_dkdv_bf16_d96_window => Dkdv: bwd_mma_kv(Bf16, 96),
        flash_bwd_mma_dkdv_bf16_d128, flash_bwd_mma_dkdv_bf16_d128_window => Dkdv: bwd_mma_kv(Bf16, 128),
        flash_bwd_mma_dkdv_bf16_d192, flash_bwd_mma_dkdv_bf16_d192_window => Dkdv: bwd_mma_kv(Bf16, 192),
        flash_bwd_mma_dkdv_bf16_d256, flash_bwd_mma_dkdv_bf16_d256_window => Dkdv: bwd_mma_kv(Bf16, 256),
    }
    MmaAtomic @ Sm80 {
        flash_bwd_mma_atomic_stats_f16_d32 => Stats: bwd_mma_stats(F16, 32),
        flash_bwd_mma_atomic_stats_f16_d64 => Stats: bwd_mma_stats(F16, 64),
        flash_bwd_mma_atomic_stats_f16_d96 => Stats: bwd_mma_stats(F16, 96),
        flash_bwd_mma_atomic_stats_f16_d128 => Stats: bwd_mma_stats(F16, 128),
        flash_bwd_mma_atomic_stats_bf16_d32 => Stats: bwd_mma_stats(Bf16, 32),
        flash_bwd_mma_atomic_stats_bf16_d64 => Stats: bwd_mma_stats(Bf16, 64),
        flash_bwd_mma_atomic_stats_bf16_d96 => Stats: bwd_mma_stats(Bf16, 96),
        flash_bwd_mma_atomic_stats_bf16_d128 => Stats: bwd_mma_stats(Bf16, 128),
        flash_bwd_mma_atomic_dkdvq_f16_d32 => Dkdvq: bwd_mma_kvq(F16, 32),
        flash_bwd_mma_atomic_dkdvq_f16_d64 => Dkdvq: bwd_mma_kvq(F16, 64),
        flash_bwd_mma_atomic_dkdvq_f16_d96 => Dkdvq: bwd_mma_kvq(F16, 96),
        flash_bwd_mma_atomic_dkdvq_f16_d128 => Dkdvq: bwd_mma_kvq(F16, 128),
        flash_bwd_mma_atomic_dkdvq_bf16_d32 => Dkdvq: bwd_mma_kvq(Bf16, 32),
        flash_bwd_mma_atomic_dkdvq_bf16_d64 => Dkdvq: bwd_mma_kvq(Bf16, 64),
        flash_bwd_mma_atomic_dkdvq_bf16_d96 => Dkdvq: bwd_mma_kvq(Bf16, 96),
        flash_bwd_mma_atomic_dkdvq_bf16_d128 => Dkdvq: bwd_mma_kvq(Bf16, 128),
        flash_bwd_mma_atomic_convert_f16 => DqConvert: bwd_dq_convert(F16, 0),
        flash_bwd_mma_atomic_convert_bf16 => DqConvert: bwd_dq_convert(Bf16, 0),
    }
    Simt @ Sm80 {
        flash_bwd_dkdv_f32_d64, flash_bwd_dkdv_f32_d64_window / flash_bwd_dkdv_f32_d64_varlen => Dkdv: bwd_simt_kv(f32, 64),
        flash_bwd_dkdv_f32_d128, flash_bwd_dkdv_f32_d128_window / flash_bwd_dkdv_f32_d128_varlen => Dkdv: bwd_simt_kv(f32, 128),
        flash_bwd_dkdv_f32_d256, flash_bwd_dkdv_f32_d256_window / flash_bwd_dkdv_f32_d256_varlen => Dkdv: bwd_simt_kv(f32, 256),
        flash_bwd_dkdv_f16_d64, flash_bwd_dkdv_f16_d64_window / flash_bwd_dkdv_f16_d64_varlen => Dkdv: bwd_simt_kv(F16, 64),
        flash_bwd_dkdv_f16_d128, flash_bwd_dkdv_f16_d128_window / flash_bwd_dkdv_f16_d128_varlen => Dkdv: bwd_simt_kv(F16, 128),
        flash_bwd_dkdv_f16_d256, flash_bwd_dkdv_f16_d256_window / flash_bwd_dkdv_f16_d256_varlen => Dkdv: bwd_simt_kv(F16, 256),
        flash_bwd_dkdv_bf16_d64, flash_bwd_dkdv_bf16_d64_window / flash_bwd_dkdv_bf16_d64_varlen => Dkdv: bwd_simt_kv(Bf16, 64),
        flash_bwd_dkdv_bf16_d128, flash_bwd_dkdv_bf16_d128_window / flash_bwd_dkdv_bf16_d128_varlen => Dkdv: bwd_simt_kv(Bf16, 128),
        flash_bwd_dkdv_bf16_d256, flash_bwd_dkdv_bf16_d256_window / flash_bwd_dkdv_bf16_d256_varlen => Dkdv: bwd_simt_kv(Bf16, 256),
        flash_bwd_dq_f32_d64, flash_bwd_dq_f32_d64_window / flash_bwd_dq_f32_d64_varlen => Dq: bwd_simt_q(f32, 64),
        flash_bwd_dq_f32_d128, flash_bwd_dq_f32_d128_window / flash_bwd_dq_f32_d128_varlen => Dq: bwd_simt_q(f32, 128),
        flash_bwd_dq_f32_d256, flash_bwd_dq_f32_d256_window / flash_bwd_dq_f32_d256_varlen => Dq: bwd_simt_q(f32, 256),
        flash_bwd_dq_f16_d64, flash_bwd_dq_f16_d64_window / flash_bwd_dq_f16_d64_varlen => Dq: bwd_simt_q(F16, 64),
        flash_bwd_dq_f16_d128, flash_bwd_dq_f16_d128_window / flash_bwd_dq_f16_d128_varlen => Dq: bwd_simt_q(F16, 128),
        flash_bwd_dq_f16_d256, flash_bwd_dq_f16_d256_window / flash_bwd_dq_f16_d256_varlen => Dq: bwd_simt_q(F16, 256),
        flash_bwd_dq_bf16_d64, flash_bwd_dq_bf16_d64_window / flash_bwd_dq_bf16_d64_varlen => Dq: bwd_simt_q(Bf16, 64),
        flash_bwd_dq_bf16_d128, flash_bwd_dq_bf16_d128_window / flash_bwd_dq_bf16_d128_varlen => Dq: bwd_simt_q(Bf16, 128),
        flash_bwd_dq_bf16_d256, flash_bwd_dq_bf16_d256_window / flash_bwd_dq_bf16_d256_varlen => Dq: bwd_simt_q(Bf16, 256),
    }
}

/// The backward variant of `family` and `pass` for `dtype` and `head_dim`, if there is one.
#[cfg(not(target_arch = "nvptx64"))]
pub fn bwd_variant(family: BwdFamily, pass: Pass, dtype: DType, head_dim: u32) -> Option<&'static BwdVariant> {
    BWD_VARIANTS.iter().find(|v| v.family == family && v.pass == pass && v.dtype == dtype && v.serves(head_dim))
}

/// The merge of partial results by their LSE (`merge`), one entry per output dtype, in the
/// portable module.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct MergeVariant {
    pub name: &'static str,
    pub dtype: DType,
    /// Its body, for the emulator.
    pub emulate: unsafe fn(&MergeParams),
}

/// `entry_name => dtype` for each merge entry.
macro_rules! merge_variants {
    ($( $name:ident => $dt:ty, )*) => {
        $(
            in_module!(Sm80,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: MergeParams) {
                unsafe { crate::merge::merge::<$dt>(&p) }
            });
        )*
        /// Every merge entry.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const MERGE_VARIANTS: &[MergeVariant] = &[$(
            MergeVariant { name: stringify!($name), dtype: <$dt as Element>::DTYPE, emulate: crate::merge::merge::<$dt> },
        )*];
    };
}

merge_variants! {
    flash_merge_f32 => f32,
    flash_merge_f16 => F16,
    flash_merge_bf16 => Bf16,
}

/// The merge entry writing `dtype`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn merge_variant(dtype: DType) -> Option<&'static MergeVariant> {
    MERGE_VARIANTS.iter().find(|v| v.dtype == dtype)
}

/// A KV cache's append (`kvcache`), one entry per dtype, in the portable module.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct AppendVariant {
    pub name: &'static str,
    pub dtype: DType,
    /// Its body, for the emulator.
    pub emulate: unsafe fn(&AppendParams),
}

/// `entry_name => dtype` for each append entry.
macro_rules! append_variants {
    ($( $name:ident => $dt:ty, )*) => {
        $(
            in_module!(Sm80,
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: AppendParams) {
                unsafe { crate::kvcache::append::<$dt>(&p) }
            });
        )*
        /// Every append entry.
        #[cfg(not(target_arch = "nvptx64"))]
        pub const APPEND_VARIANTS: &[AppendVariant] = &[$(
            AppendVariant { name: stringify!($name), dtype: <$dt as Element>::DTYPE, emulate: crate::kvcache::append::<$dt> },
        )*];
    };
}

append_variants! {
    flash_kv_append_f32 => f32,
    flash_kv_append_f16 => F16,
    flash_kv_append_bf16 => Bf16,
}

/// The append entry of `dtype`.
#[cfg(not(target_arch = "nvptx64"))]
pub fn append_variant(dtype: DType) -> Option<&'static AppendVariant> {
    APPEND_VARIANTS.iter().find(|v| v.dtype == dtype)
}

/// The attention sinks' gradient (`bwd_sinks`): its partial sums from statistics with D_i or
/// with a pivot (`bwd_simt`), and their sum, in the portable module (after any backward
/// family, whatever its dtype).
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug)]
pub struct SinkVariant {
    pub name: &'static str,
    /// Its body, for the emulator.
    pub emulate: unsafe fn(&BwdParams),
}

in_module!(
    Sm80,
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn flash_bwd_sinks(p: BwdParams) {
        unsafe { crate::bwd_sinks::partials::<false>(&p) }
    }
);
in_module!(
    Sm80,
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn flash_bwd_sinks_pivot(p: BwdParams) {
        unsafe { crate::bwd_sinks::partials::<true>(&p) }
    }
);
in_module!(
    Sm80,
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn flash_bwd_sinks_sum(p: BwdParams) {
        unsafe { crate::bwd_sinks::sum(&p) }
    }
);

/// Every entry of the sinks' gradient: partial sums (D_i, then with a pivot), their sum.
#[cfg(not(target_arch = "nvptx64"))]
pub const SINK_VARIANTS: [SinkVariant; 3] = [
    SinkVariant { name: "flash_bwd_sinks", emulate: crate::bwd_sinks::partials::<false> },
    SinkVariant { name: "flash_bwd_sinks_pivot", emulate: crate::bwd_sinks::partials::<true> },
    SinkVariant { name: "flash_bwd_sinks_sum", emulate: crate::bwd_sinks::sum },
];

/// The sinks' gradient launches after backward family `family`: partial sums from its
/// statistics, then their sum.
#[cfg(not(target_arch = "nvptx64"))]
pub fn sink_variants(family: BwdFamily) -> [&'static SinkVariant; 2] {
    let pivot = family == BwdFamily::Simt;
    [&SINK_VARIANTS[pivot as usize], &SINK_VARIANTS[2]]
}
