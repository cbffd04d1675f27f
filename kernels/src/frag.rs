//! Register fragments of the tensor-core kernels: packing mma C fragments into A fragments,
//! a warp's store of C fragments to global memory, and the sum of partial fragments across a
//! warp pair. Who takes part is named in each doc: thread, warp, warp pair.

use crate::dev::{Shared, block, global, thread, warp};
use crate::dtype::MmaElement;
use crate::tile::MMA_WARPS;

/// The four A-fragment registers of a 16x16 tile from two adjacent m16n8 C fragments (the C
/// layout of n-tiles 2k, 2k+1 packed to 16 bits is the A layout of k-step k).
#[inline(always)]
pub(crate) fn to_a<T: MmaElement>(lo: [f32; 4], hi: [f32; 4]) -> [u32; 4] {
    [T::pack2(lo[0], lo[1]), T::pack2(lo[2], lo[3]), T::pack2(hi[0], hi[1]), T::pack2(hi[2], hi[3])]
}

/// Warp: stores 16 rows x D columns of C fragments (rows `row0 + g`, `+ 8`) times `factor`
/// to a [seqlen, d] slice in T, skipping rows at or past `limit` and columns at or past `d`:
/// a lane's column pair as one 4-byte store, or (with ANY_D: d may be odd) two 2-byte ones
/// when d is odd.
#[inline(always)]
pub(crate) unsafe fn store_rows<T: MmaElement, const DN: usize, const ANY_D: bool>(
    acc: &[[f32; 4]; DN],
    factor: f32,
    dst: *mut T,
    stride: u64,
    row0: u32,
    limit: u32,
    d: u32,
) {
    let (g, t) = ((warp::lane() / 4) as usize, (warp::lane() % 4) as usize);
    for half in 0..2 {
        let r = row0 + (g + 8 * half) as u32;
        if r < limit {
            for (n, a) in acc.iter().enumerate() {
                // A guard, not a `break`: an early exit stops the unroll.
                let col = n * 8 + 2 * t;
                if (col as u32) < d {
                    let packed = T::pack2(a[2 * half] * factor, a[2 * half + 1] * factor);
                    let at = dst.wrapping_add((r as u64 * stride + col as u64) as usize);
                    if !ANY_D || d.is_multiple_of(2) {
                        unsafe { global::store(at as *mut u32, packed) };
                    } else {
                        // Odd head_dim: rows are 2-byte aligned only; the pair's second
                        // element may be past d.
                        unsafe { global::store(at as *mut u16, packed as u16) };
                        if (col as u32) + 1 < d {
                            unsafe { global::store(at.wrapping_add(1) as *mut u16, (packed >> 16) as u16) };
                        }
                    }
                }
            }
        }
    }
}

/// Warp of a pair that splits D (SPLIT = 2): S and dP (N m16n8 C fragments each) summed
/// over the pair's two halves of D. Its partial products into its slot of `x`, a block
/// barrier, the partner's slot added: both warps add the same two values (a + b = b + a in
/// IEEE arithmetic), so both hold bitwise the same S and dP. The caller's next block barrier
/// orders the slot's next write after the partner's read. Slot layout [S, dP][n][e][lane]:
/// a warp's 32 lanes touch 32 consecutive words (no bank conflict). The lane's addresses are
/// rebuilt at each call (`opaque`), not kept live across the caller's loop.
#[inline(always)]
pub(crate) fn pair_sum<const N: usize>(x: Shared<f32>, s: &mut [[f32; 4]; N], dp: &mut [[f32; 4]; N]) {
    let tid = thread::opaque(thread::idx() as u64) as usize;
    let (wb, lane) = (tid / 32, tid % 32);
    let at = |w: usize, k: usize, n: usize, e: usize| ((w * 2 + k) * N + n) * 128 + e * 32 + lane;
    for n in 0..N {
        for e in 0..4 {
            x.st(at(wb, 0, n, e), s[n][e]);
            x.st(at(wb, 1, n, e), dp[n][e]);
        }
    }
    block::sync();
    let partner = (wb + MMA_WARPS as usize) % (2 * MMA_WARPS as usize);
    for n in 0..N {
        for e in 0..4 {
            s[n][e] += x.ld(at(partner, 0, n, e));
            dp[n][e] += x.ld(at(partner, 1, n, e));
        }
    }
}
