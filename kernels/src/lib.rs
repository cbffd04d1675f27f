//! FlashAttention kernels, written once in `no_std` Rust.
//!
//! The same source compiles two ways:
//! - for `nvptx64-nvidia-cuda` (by `host/build.rs`) into the PTX the host loads on a GPU;
//! - for the host, where [`dev`] is backed by a CPU emulator of the CUDA execution model
//!   ([`dev::emu`]), so every kernel can be run and property-tested without a GPU.
//!
//! Kernels contain no emulator-specific code: everything a kernel does beyond plain
//! arithmetic goes through the device-support layer [`dev`].
//!
//! Layout, from the ground up: [`dev`] (the device-support layer); the tile layer below every
//! kernel: [`params`] (the launch parameters shared with the host, and their index helpers),
//! [`tile`] (every tile decision, in one place), `smem` (shared-memory layouts), `copy`
//! (global <-> shared copies), `frag` (register fragments), [`dtype`], [`mask`], the score
//! options ([`softcap`], [`alibi`], [`sinks`]), [`softmax`] (online softmax and the
//! backward's row statistics), [`nonfinite`] (the NaN/Inf rule),
//! [`block_info`] (a block's tile, head and batch entry, and the grid's order); one file per
//! kernel (`fwd_*.rs`, `bwd_*.rs`; no kernel file imports another); and [`registry`] (one
//! line per variant).
#![no_std]
// Nightly features for the nvptx build alone (host/build.rs builds it with the pinned nightly):
// the host build, the emulator, compiles on stable Rust.
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        abi_ptx,
        asm_experimental_arch,
        stdarch_nvptx,
        link_llvm_intrinsics,
        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem
    )
)]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]
// Kernel loops index several register arrays with one unrolled counter.
#![allow(clippy::needless_range_loop)]

/// The one mask switch of every kernel entry: `$body` with `$m` the mask type the launch
/// asks for (`mask::Causal` when `p.pb.causal != 0`, else `mask::NoMask`), chosen at run time.
/// (No sliding window here: the windowed entries take `mask::Windowed`
/// ([`with_window_mask!`]).)
macro_rules! with_mask {
    ($p:expr, $m:ident => $body:expr) => {
        if $p.pb.causal != 0 {
            type $m = $crate::mask::Causal;
            $body
        } else {
            type $m = $crate::mask::NoMask;
            $body
        }
    };
}

/// A kernel entry for launches of equal lengths without a window (`mask::NoMask`,
/// `mask::Causal`): the `ENTRY` parameter of every kernel's entry function.
pub const ENTRY_PLAIN: u8 = 0;
/// A kernel entry for a sliding window alone (`mask::Windowed`).
pub const ENTRY_WINDOW: u8 = 1;
/// A kernel entry for a variable-length batch (`varlen`; `mask::General`: any window,
/// softcap and ALiBi).
pub const ENTRY_VARLEN: u8 = 2;
/// A kernel entry for a softcap or ALiBi, with or without a window (`mask::General`).
pub const ENTRY_GENERAL: u8 = 3;

/// Every kernel's mask switch, by the entry `$e` it is compiled for: `mask::Windowed` in the
/// window entries, `mask::General` in the general and variable-length entries (causal or not:
/// the window's bounds say), with `$p` narrowed to the block's sequence in the latter
/// (`varlen::resolve`: the block's tiles are `$rows` rows of `varlen::Over::$over`, elements
/// `$t`; a block past its sequence's end returns); else [`with_mask!`]'s.
macro_rules! with_window_mask {
    ($p:ident: $t:ty, $over:ident / $rows:expr, $e:expr, $m:ident => $body:expr) => {
        if $e == $crate::ENTRY_PLAIN {
            with_mask!($p, $m => $body)
        } else if $e == $crate::ENTRY_WINDOW {
            type $m = $crate::mask::Windowed;
            $body
        } else if $e == $crate::ENTRY_GENERAL {
            type $m = $crate::mask::General;
            $body
        } else {
            type $m = $crate::mask::General;
            let Some(seq) = $crate::varlen::resolve::<$t, _>($p, $crate::varlen::Over::$over, $rows) else {
                return;
            };
            let $p = &seq;
            $body
        }
    };
}

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod alibi;
pub mod block_info;
pub mod bwd_convert;
pub mod bwd_mma;
pub mod bwd_prep;
pub mod bwd_simt;
pub mod bwd_sinks;
pub mod bwd_wgmma;
pub mod bwd_wgmma_dq;
mod copy;
pub mod dev;
pub mod dtype;
mod epilogue;
mod frag;
pub mod fwd_mma;
pub mod fwd_simt;
pub mod fwd_wgmma;
pub mod kvcache;
pub mod mask;
pub mod merge;
pub mod nonfinite;
pub mod params;
pub mod registry;
pub mod sinks;
mod smem;
pub mod softcap;
pub mod softmax;
pub mod tile;
pub mod varlen;
mod wg_tile;
