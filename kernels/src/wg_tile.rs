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
/// branch (`masked`: true on the tiles a mask's edge or seqlen_k crosses). Each row's
/// visible keys are one range (`Window::first_col`, `end_col`), taken as offsets from the
/// lane's first column once per row: two compares an element.
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
        for half in 0..2 {
            let row = row_w + (g + 8 * half) as u32;
            let base = c0 as i64 + 2 * t as i64;
            // Keys lo..hi of the row, from the lane's column 0 of n-tile 0 (clamped just
            // outside the fragment's 8N columns: i32 compares).
            let span = 8 * N as i64 + 1;
            let lo = (win.first_col(row, sq, sk) as i64 - base).clamp(-1, span) as i32;
            let hi = (win.end_col(row + 1, sq, sk) as i64 - base).clamp(-1, span) as i32;
            for (n, x) in s.iter_mut().enumerate() {
                for e in 0..2 {
                    let k = (n * 8 + e) as i32;
                    if k < lo || k >= hi {
                        x[2 * half + e] = hidden;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::{Causal, NoMask, Windowed};
    use crate::params::{NO_WINDOW, Problem};

    /// `mask_frag` hides exactly the elements `Window::hidden` or seqlen_k hide, for every
    /// lane, masks with and without a window, and tiles across both edges and past seqlen_k.
    #[test]
    fn mask_frag_hides_what_the_mask_hides() {
        fn check<M: Mask>(pb: &Problem) {
            let (sq, sk, win) = (pb.seqlen_q, pb.seqlen_k, Window::<M>::new(pb));
            for row_w in (0..sq).step_by(16) {
                for c0 in (0..sk + 8).step_by(24) {
                    for lane in 0..32 {
                        let (g, t) = (lane / 4, lane % 4);
                        let mut s = [[1f32; 4]; 4];
                        mask_frag::<M, 4>(&mut s, c0, row_w, (g, t), (sq, sk), true, -7.0, win);
                        for (n, x) in s.iter().enumerate() {
                            for (e, x) in x.iter().enumerate() {
                                let (row, col) = (row_w + (g + 8 * (e / 2)) as u32, c0 + (n * 8 + 2 * t + e % 2) as u32);
                                let hidden = col >= sk || win.hidden(row, col, sq, sk);
                                assert_eq!(*x == -7.0, hidden, "sq {sq} sk {sk} row {row} col {col}");
                            }
                        }
                    }
                }
            }
        }
        for (sq, sk) in [(40, 90), (90, 40), (64, 64)] {
            let pb = |left, right, causal| Problem {
                seqlen_q: sq,
                seqlen_k: sk,
                causal,
                window_left: left,
                window_right: right,
                ..Problem::default()
            };
            check::<NoMask>(&pb(NO_WINDOW, NO_WINDOW, 0));
            check::<Causal>(&pb(NO_WINDOW, NO_WINDOW, 1));
            for (left, right) in [(0, 0), (13, NO_WINDOW), (NO_WINDOW, 7), (30, 2), (5, 0)] {
                check::<Windowed>(&pb(left, right, 0));
            }
        }
    }
}
