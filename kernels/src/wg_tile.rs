//! Warpgroup tile operations of the Hopper backward kernels (`bwd_wgmma`, `bwd_wgmma_dq`):
//! a thread's place in a block of one or two warpgroups, S-like products of two 128-byte-
//! swizzle tiles, P times an MN-major tile, and the mask on an accumulator fragment.

use crate::dev::{warp, warpgroup};
use crate::dtype::MmaElement;
use crate::mask::{Mask, Window};

/// Thread of a block of THREADS: (its warpgroup, its warp in the warpgroup, its lane); with
/// one warpgroup the first is 0 and the second the warp index for the compiler too.
#[inline(always)]
pub(crate) fn wg_warp_lane<const THREADS: usize>() -> (usize, usize, usize) {
    let (wp, lane) = (warp::id() as usize, warp::lane() as usize);
    if THREADS == warpgroup::SIZE as usize { (0, wp, lane) } else { (warpgroup::id() as usize, wp % 4, lane) }
}

/// Warpgroup: acc = A B^T over D, A a [RA][D] and B a [RB][D] tile (both K-major, the
/// descriptors at their first rows): D / 16 k-steps of m64n{8N}k16, issued (the caller commits
/// and waits).
#[inline(always)]
pub(crate) fn issue_abt<T: MmaElement, const N: usize, const D: usize, const RA: usize, const RB: usize>(
    a: warpgroup::Desc,
    b: warpgroup::Desc,
    acc: &mut [[f32; 4]; N],
) {
    for kk in 0..D / 16 {
        let (ao, bo) = (((kk / 4) * RA * 64 + (kk % 4) * 16) * 2, ((kk / 4) * RB * 64 + (kk % 4) * 16) * 2);
        warpgroup::mma_ss::<N>(a.advance(ao), b.advance(bo), acc, kk > 0, T::BF16);
    }
}

/// Warpgroup: acc += P B over one key tile (KS k-steps of m64n{8N}k16, P from registers, B
/// read MN-major from `b`), waited for.
#[inline(always)]
pub(crate) fn add_pk<T: MmaElement, const N: usize, const KS: usize>(acc: &mut [[f32; 4]; N], pa: &mut [[u32; 4]; KS], b: warpgroup::Desc) {
    warpgroup::fence_operands(acc);
    warpgroup::fence_fragments(pa);
    warpgroup::fence();
    for (ks, f) in pa.iter().enumerate() {
        warpgroup::mma_rs::<N, true>(*f, b.advance(ks * 16 * 64 * 2), acc, true, T::BF16);
    }
    warpgroup::commit();
    warpgroup::wait::<0, N>(acc);
    warpgroup::fence_fragments(pa);
}

/// Thread: `hidden` where its S fragment (rows row_w + g, + 8 of lane (g, t), N n-tiles of
/// keys from c0) is hidden by the mask (with its window `win`) or by seqlen_k; one uniform
/// branch (`masked`: true on the last tiles only, every tile of a window).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mask_frag<M: Mask, const N: usize>(
    s: &mut [[f32; 4]; N],
    c0: u32,
    row_w: u32,
    (g, t): (usize, usize),
    (sq, sk): (u32, u32),
    masked: bool,
    hidden: f32,
    win: Window<M>,
) {
    if masked {
        for (n, x) in s.iter_mut().enumerate() {
            for (e, x) in x.iter_mut().enumerate() {
                let row = row_w + (g + 8 * (e / 2)) as u32;
                let col = c0 + (n * 8 + 2 * t + e % 2) as u32;
                if col >= sk || win.hidden(row, col, sq, sk) {
                    *x = hidden;
                }
            }
        }
    }
}
