//! Keys a row cannot see never reach it, whatever they hold (README, "NaN and Inf").
//!
//! The tensor-core products add over whole tiles: a masked pair's weight is 0, and 0 times a
//! NaN or an infinity is NaN. On the masked tiles (the causal diagonal; keys past seqlen_k
//! are zero-filled already), an accumulating product's operand tile (V for O += P V; K for
//! dQ += dS K; Q and dO for dK += dS^T Q and dV += P^T dO) is scanned by the threads that
//! copied it, and the block votes at a barrier it has anyway ([`crate::dev::block::sync_any`]). Where a
//! NaN or an infinity is there (never on finite inputs), its threads replace those values by 0
//! before the product ([`zero_own_nonfinite`]), and after it [`add_nonfinite`] adds each one
//! to the outputs whose row sees it, which makes exactly those non-finite again (finite plus
//! NaN or an infinity is not finite; as in IEEE arithmetic, a NaN stays NaN).
//!
//! Products that only feed a masked score (S = Q K^T, dP = dO V^T) need nothing: the mask
//! replaces the masked scores, P and dS (by a select: 0 times NaN is NaN).
//!
//! In the backward, an operand held in registers (the mma kernels' ldmatrix fragments: each
//! warp reads the whole tile it multiplies) is cleaned in the registers ([`finite_frag`]).
//! Only dO needs its values added back (into dV): where K, Q or dO is not finite for a visible
//! pair, that pair's dS is NaN already (the row's statistics are, or its D), and an infinity
//! that meets only a 0 weight (exp(-inf) = 0, where exact arithmetic would give 0 * inf = NaN)
//! leaves the gradient finite (README, "NaN and Inf").

use crate::dev::{Shared, global, thread, warp};
use crate::dtype::{Element, MmaElement};
use crate::mask::{Mask, Window};
use crate::smem::{Chunks, TileLayout};

/// The exponent bits of T's 16-bit format: all set in a NaN or an infinity.
#[inline(always)]
fn exponent_bits<T: MmaElement>() -> u32 {
    if T::BF16 { 0x7f80 } else { 0x7c00 }
}

/// Bit 15 of each 16-bit half: where [`nonfinite_flags`] marks a NaN or an infinity.
const FLAG_BITS: u32 = 0x8000_8000;

/// Whether either 16-bit half of `w` is a NaN or an infinity.
#[inline(always)]
fn pair_nonfinite<T: MmaElement>(w: u32) -> bool {
    nonfinite_flags::<T>(w) & FLAG_BITS != 0
}

/// Bit 15 of each 16-bit half of the result is set iff that half of `w` is a NaN or an
/// infinity: the half's exponent field plus 0x8000 - e reaches 0x8000 exactly when the field
/// is all ones (e), and never carries into the next half; the bits below are noise. An OR of
/// these keeps the flags: a chunk's check is three integer operations a word.
#[inline(always)]
fn nonfinite_flags<T: MmaElement>(w: u32) -> u32 {
    let e = exponent_bits::<T>();
    (w & (e * 0x1_0001)) + (0x8000 - e) * 0x1_0001
}

/// `w` with each 16-bit half that is a NaN or an infinity replaced by 0.
#[inline(always)]
fn finite_pair<T: MmaElement>(w: u32) -> u32 {
    let e = exponent_bits::<T>();
    let lo = if (w & e) == e { 0 } else { w & 0xffff };
    let hi = if ((w >> 16) & e) == e { 0 } else { w & 0xffff_0000 };
    lo | hi
}

/// Thread (one of THREADS that copied a [ROWS][D] tile of layout L with
/// `copy::load_tile_in`, the same chunks): whether a chunk it copied holds a NaN or an
/// infinity. After this thread's copies completed (its own data: no barrier needed).
#[inline(always)]
pub(crate) fn own_chunks_nonfinite<T: MmaElement, L: TileLayout, const D: usize, const ROWS: usize, const THREADS: usize>(
    tile: Shared<T>,
) -> bool {
    let words: Shared<u32> = tile.cast();
    // Every chunk's load independent of the others' checks (no early exit): the loads
    // overlap and each word costs three integer operations.
    let mut flags = 0u32;
    each_own_chunk::<D, ROWS, THREADS>(|r, c| {
        let w = words.ld_16(L::at(r, c) / 2).0;
        flags |= nonfinite_flags::<T>(w[0]) | nonfinite_flags::<T>(w[1]) | nonfinite_flags::<T>(w[2]) | nonfinite_flags::<T>(w[3]);
    });
    flags & FLAG_BITS != 0
}

/// Thread: a 16-bit fragment (4 registers of 2 values) with its NaNs and infinities replaced
/// by 0, and whether it had any. For operands held in registers (ldmatrix), where each warp
/// reads the whole operand tile it multiplies: no barrier, no shared-memory write.
#[inline(always)]
pub(crate) fn finite_frag<T: MmaElement>(f: [u32; 4]) -> ([u32; 4], bool) {
    let mut bad = false;
    let out = f.map(|w| {
        let c = finite_pair::<T>(w);
        bad |= c != w;
        c
    });
    (out, bad)
}

/// [`own_chunks_nonfinite`] of two tiles copied alike (one index walk for both), and where
/// found [`zero_own_nonfinite`] of both: whether either held a NaN or an infinity.
#[inline(always)]
pub(crate) fn clean_own_pair<T: MmaElement, L: TileLayout, const D: usize, const ROWS: usize, const THREADS: usize>(
    a: Shared<T>,
    b: Shared<T>,
) -> bool {
    let (wa, wb): (Shared<u32>, Shared<u32>) = (a.cast(), b.cast());
    let mut found = false;
    each_own_chunk::<D, ROWS, THREADS>(|r, c| {
        if !found {
            let at = L::at(r, c) / 2;
            let (x, y) = (wa.ld_16(at).0, wb.ld_16(at).0);
            found = (0..4).any(|k| pair_nonfinite::<T>(x[k]) | pair_nonfinite::<T>(y[k]));
        }
    });
    if found {
        zero_own_nonfinite::<T, L, D, ROWS, THREADS>(a);
        zero_own_nonfinite::<T, L, D, ROWS, THREADS>(b);
    }
    found
}

/// Thread: replaces by 0 every NaN and infinity in the chunks it copied into `tile` (as
/// [`own_chunks_nonfinite`]). Other threads see the writes after a barrier; wgmma after this
/// thread's `thread::fence_proxy_async` and then a barrier.
#[inline(always)]
pub(crate) fn zero_own_nonfinite<T: MmaElement, L: TileLayout, const D: usize, const ROWS: usize, const THREADS: usize>(tile: Shared<T>) {
    let words: Shared<u32> = tile.cast();
    each_own_chunk::<D, ROWS, THREADS>(|r, c| {
        let at = L::at(r, c) / 2;
        for k in 0..4 {
            let w = words.ld(at + k);
            let clean = finite_pair::<T>(w);
            if clean != w {
                words.st(at + k, clean);
            }
        }
    });
}

/// Thread: the (row, column) of each 16-byte chunk of a [ROWS][D] tile that
/// `copy::load_tile_in` gives it ([`Chunks`]).
#[inline(always)]
fn each_own_chunk<const D: usize, const ROWS: usize, const THREADS: usize>(mut f: impl FnMut(usize, usize)) {
    // Recomputed where used (`opaque`), not hoisted out of the KV loop as live addresses.
    let x = thread::opaque(thread::idx() as u64) as usize;
    if Chunks::<D, ROWS, THREADS>::BY_BLOCK {
        for i in 0..Chunks::<D, ROWS, THREADS>::PER_THREAD {
            if let Some((r, c)) = Chunks::<D, ROWS, THREADS>::at(x, i) {
                f(r, c);
            }
        }
    } else {
        // The flat walk (the same chunks as `Chunks::at`): a loop at run time, as the callers'
        // register budgets were measured with.
        let cpr = D / 8;
        let mut e = x;
        while e < ROWS * cpr {
            f(e / cpr, (e % cpr) * 8);
            e += THREADS;
        }
    }
}

/// Thread, in the C-fragment layout of a 16-row tile (lane 4g + t holds rows g and g + 8 at
/// columns 8n + 2t, + 1 of `acc[n]`): after a product whose operand had its NaNs and
/// infinities replaced by 0, adds each of them, read back from the operand in global memory
/// (row k of it at `row(k)`, `None` past its end; the `keys` rows of the tile), to the
/// outputs of the rows that see k (`visible(h, k)`, h = 0 for row g, 1 for g + 8), columns
/// below `d`.
///
/// # Safety
/// `row(k)` must point to `d` readable elements.
#[inline(always)]
pub(crate) unsafe fn add_nonfinite<T: Element, const DN: usize>(
    acc: &mut [[f32; 4]; DN],
    keys: usize,
    d: u32,
    row: impl Fn(usize) -> Option<*const T>,
    visible: impl Fn(usize, usize) -> bool,
) {
    let t = (warp::lane() % 4) as usize;
    // A loop at run time, not unrolled: it runs only where a NaN or infinity was found. The
    // lane's column offset is added to the row address once per row (an address per column,
    // hoisted out of the loop, made the 256-column kernels spill).
    let keys = thread::opaque(keys as u64) as usize;
    for k in 0..keys {
        let Some(r) = row(k) else { continue };
        let r = thread::opaque(unsafe { r.add(2 * t) } as u64) as *const T;
        for (n, a) in acc.iter_mut().enumerate() {
            for e in 0..2 {
                if ((n * 8 + 2 * t + e) as u32) < d {
                    let v = unsafe { global::load(r.add(n * 8 + e)) }.to_f32();
                    if !v.is_finite() {
                        for h in 0..2 {
                            if visible(h, k) {
                                a[2 * h + e] += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Row `r` of a [rows][d] slice in global memory at `base` (row stride `stride`), `None` at
/// or past row `limit`.
#[inline(always)]
pub(crate) fn row_at<T: Element>(base: *const T, stride: u64, limit: u32, r: usize) -> Option<*const T> {
    ((r as u32) < limit).then(|| base.wrapping_add((r as u64 * stride) as usize))
}

/// Warp, after the forward stored its rows of O and LSE and `warp::sync`: the same as
/// [`add_nonfinite`] on the stored O instead of the accumulators, over keys
/// `c0..c0 + keys` (below seqlen_k), for the `rows` rows of the warp from `row0` (below
/// seqlen_q): O and LSE of those rows at `o` (row stride `o_stride`) and `lse`, V's rows from
/// key 0 at `v` (row stride `v_stride`); mask M with window `window` (`Window::pack`). For a kernel with no registers to spare for
/// it in the accumulators' company: a function of its own, not inlined (inlined, its code
/// made the d = 128 tensor-core forward spill, and so did a call with the launch parameters
/// by value or a dozen arguments: the pairs are packed into u64s). Rows without weights (LSE
/// -inf: O is 0) are left alone.
///
/// # Safety
/// The slices must be live and in bounds for those rows.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn warp_fix_stored_o<T: Element, M: Mask>(
    o: u64,
    o_stride: u64,
    lse: u64,
    v: u64,
    v_stride: u64,
    rows_from: u64,
    keys_from: u64,
    seqlens: u64,
    window: u64,
) {
    let (o, lse, v) = (o as *mut T, lse as *const f32, v as *const T);
    let win = Window::<M>::unpack(window);
    let (row0, rows, d) = ((rows_from >> 32) as u32, (rows_from >> 16) as u32 & 0xffff, rows_from as u32 & 0xffff);
    let (c0, keys) = ((keys_from >> 32) as u32, keys_from as u32);
    let (sq, sk) = ((seqlens >> 32) as u32, seqlens as u32);
    let mut e = warp::lane();
    while e < rows * d {
        let (r, c) = (row0 + e / d, e % d);
        if r < sq && unsafe { global::load(lse.add(r as usize)) } != f32::NEG_INFINITY {
            let mut add = 0f32;
            let mut key = c0;
            while key < (c0 + keys).min(sk) {
                if !win.hidden(r, key, sq, sk) {
                    let x = unsafe { global::load(v.add((key as u64 * v_stride + c as u64) as usize)) }.to_f32();
                    if !x.is_finite() {
                        add += x;
                    }
                }
                key += 1;
            }
            if !add.is_finite() {
                let at = unsafe { o.add((r as u64 * o_stride + c as u64) as usize) };
                unsafe { global::store(at, T::from_f32(global::load(at).to_f32() + add)) };
            }
        }
        e += warp::SIZE;
    }
}

/// Whether a dK/dV kernel's query tile from row `i0` (`br` rows) is masked for its block of
/// 64 keys from `j0`, the tiles where the operands are cleaned: a window's tiles that cross
/// one of its edges (`win`: some row of the tile does not see some key of the block), the
/// causal diagonal (the tile's first row hides the block's last key), the tile
/// past seqlen_q (its zero-filled rows' scores are NaN against an infinite key) and, with
/// `dq` (the atomic dQ), every tile of a block past seqlen_k (its zero-filled keys' P is not
/// 0 and can overflow: dS K_j must not see it). One definition for the kernels and
/// [`warp_fix_stored_dv`], which must agree.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dkdv_tile_masked<M: Mask>(i0: u32, br: u32, j0: u32, sq: u32, sk: u32, dq: bool, win: Window<M>) -> bool {
    let edge = match M::WINDOW {
        true => !win.shows_block(i0, i0 + br - 1, j0, j0 + 63, sq, sk),
        false => M::hides(i0, j0 + 63, sq, sk),
    };
    edge || i0 + br > sq || (dq && j0 + 64 > sk)
}

/// Warp, after a dK/dV kernel stored the dV rows of its 16 keys from `key0` and `warp::sync`:
/// adds the NaNs and infinities of dO that were replaced by 0 on the block's masked query
/// tiles (those are the only ones zeroed) into dV, where the row sees the key: the post-store
/// counterpart of [`add_nonfinite`] for a kernel without registers to spare for it
/// (inlined, the Hopper dK/dV kernel spilled at d = 128). Arguments packed into u64s (a call
/// with many arguments spilled): `dv` at key 0 of the block's head (row stride `dv_stride`);
/// `d_o` at row 0 of the group's first query head, `do_strides` = row stride << 32 | head
/// stride; `keys` = key0 << 32 | j0 (the block's first key, 64 keys a block); `seqlens` =
/// seqlen_q << 32 | seqlen_k; `shape` = group << 48 | head_dim << 32 | BR << 16 | DQ (the
/// query tile rows; DQ: every tile counts as masked when the block passes seqlen_k); `window`:
/// mask M's window (`Window::pack`).
///
/// # Safety
/// The slices must be live and in bounds for those rows.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn warp_fix_stored_dv<T: Element, M: Mask>(
    dv: u64,
    dv_stride: u64,
    d_o: u64,
    do_strides: u64,
    keys: u64,
    seqlens: u64,
    shape: u64,
    window: u64,
) {
    let (dv, d_o, win) = (dv as *mut T, d_o as *const T, Window::<M>::unpack(window));
    let (do_row, do_head) = (do_strides >> 32, do_strides & 0xffff_ffff);
    let (key0, j0) = ((keys >> 32) as u32, keys as u32);
    let (sq, sk) = ((seqlens >> 32) as u32, seqlens as u32);
    let (group, d, br, dq) = ((shape >> 48) as u32, (shape >> 32) as u32 & 0xffff, (shape >> 16) as u32 & 0xffff, shape & 1 != 0);
    // The block's query tiles (`mask::q_tiles`).
    let (first_tile, end) = (win.first_row(j0, sq, sk) / br * br, win.end_row((j0 + 64).min(sk), sq, sk));
    let mut e = warp::lane();
    while e < 16 * d {
        let (key, c) = (key0 + e / d, e % d);
        if key < sk {
            let mut add = 0f32;
            for h in 0..group {
                let mut i0 = first_tile;
                while i0 < end {
                    if dkdv_tile_masked::<M>(i0, br, j0, sq, sk, dq, win) {
                        let mut i = i0;
                        while i < (i0 + br).min(sq) {
                            if !win.hidden(i, key, sq, sk) {
                                let at = h as u64 * do_head + i as u64 * do_row + c as u64;
                                let x = unsafe { global::load(d_o.add(at as usize)) }.to_f32();
                                if !x.is_finite() {
                                    add += x;
                                }
                            }
                            i += 1;
                        }
                    }
                    i0 += br;
                }
            }
            if !add.is_finite() {
                let at = unsafe { dv.add((key as u64 * dv_stride + c as u64) as usize) };
                unsafe { global::store(at, T::from_f32(global::load(at).to_f32() + add)) };
            }
        }
        e += warp::SIZE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{Bf16, F16};

    /// The flag trick against the value itself, for every 16-bit pattern in either half
    /// (the other half finite, NaN or infinite).
    fn check<T: MmaElement>() {
        let e = exponent_bits::<T>();
        let others = [0u32, 0x3c00, e, e | 1, 0x8000 | e, 0xffff];
        for x in 0..=0xffffu32 {
            let (v, _) = T::unpack2(x);
            for &o in &others {
                let (ov, _) = T::unpack2(o);
                let want = !v.is_finite() || !ov.is_finite();
                assert_eq!(pair_nonfinite::<T>(x | (o << 16)), want, "{x:#06x} / {o:#06x}");
                assert_eq!(pair_nonfinite::<T>(o | (x << 16)), want, "{o:#06x} / {x:#06x}");
                let folded = nonfinite_flags::<T>(x | (o << 16)) | nonfinite_flags::<T>(0x3c00_3c00);
                assert_eq!(folded & FLAG_BITS != 0, want);
            }
        }
    }

    /// A dK/dV tile left unmasked under a window has every (row, key) pair of its rows and
    /// the block's keys below seqlen_k visible, for many shapes, windows and tiles; and
    /// interior tiles exist (the mask is not every tile).
    #[test]
    fn window_dkdv_tiles_masked_where_an_edge_crosses() {
        use crate::mask::Windowed;
        use crate::params::{NO_WINDOW, Problem};
        let mut unmasked = 0;
        for (sq, sk) in [(64, 64), (300, 300), (200, 450), (450, 200), (1000, 1000)] {
            for (left, right) in [(Some(0), Some(0)), (Some(100), Some(0)), (Some(300), Some(40)), (None, Some(10)), (Some(70), None)] {
                let pb = Problem {
                    seqlen_q: sq,
                    seqlen_k: sk,
                    window_left: left.unwrap_or(NO_WINDOW),
                    window_right: right.unwrap_or(NO_WINDOW),
                    ..Problem::default()
                };
                let win = Window::<Windowed>::new(&pb);
                for br in [32u32, 64] {
                    let mut j0 = 0;
                    while j0 < sk {
                        let mut i0 = 0;
                        while i0 < sq {
                            if !dkdv_tile_masked::<Windowed>(i0, br, j0, sq, sk, false, win) {
                                unmasked += 1;
                                for i in i0..i0 + br {
                                    for j in j0..(j0 + 64).min(sk) {
                                        assert!(!win.hidden(i, j, sq, sk), "sq {sq} sk {sk} {left:?} {right:?}: row {i} key {j}");
                                    }
                                }
                            }
                            i0 += br;
                        }
                        j0 += 64;
                    }
                }
            }
        }
        assert!(unmasked > 100, "{unmasked} unmasked tiles");
    }

    #[test]
    fn nonfinite_flags_bf16() {
        check::<Bf16>();
    }

    #[test]
    fn nonfinite_flags_f16() {
        check::<F16>();
    }
}
