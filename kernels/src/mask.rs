//! Masks as types. Causal masking is bottom-right aligned (FlashAttention >= 2.1): query row
//! i sees key column j iff j <= i + (seqlen_k - seqlen_q). With seqlen_q > seqlen_k the first
//! rows see nothing: their output is 0 and their LSE is -inf.
//!
//! A sliding window (FA2 >= 2.3: query row i sees key j iff
//! i + sk - sq - left <= j <= i + sk - sq + right, each side unbounded when not given) is the
//! mask [`Windowed`] with the bounds of [`Window`], read from the launch parameters; with
//! causal masking the right bound is 0. The windowed entries of every kernel take it
//! (`with_window_mask!`); the tiles outside its key range are never loaded ([`kv_tiles`] for
//! the loops over keys, [`q_tiles`] for those over query rows), the tiles every row of a block
//! sees whole run unmasked on the tensor-core paths ([`kv_unmasked`], and
//! `nonfinite::dkdv_tile_masked` for the dK/dV loops), the others masked (every window tile
//! on the SIMT path). The general entries take [`General`]: the same window, and the softcap
//! and ALiBi bias besides (`Mask::BIAS`).

use crate::params::{NO_WINDOW, Problem};
use core::marker::PhantomData;

/// A mask over the score matrix; also the bounds of the key/value loop.
pub trait Mask {
    /// Whether later query rows see more keys (the work per row tile grows with the row).
    const CAUSAL: bool;
    /// Whether the mask is a sliding window ([`Window`] holds its bounds; the functions
    /// below leave them out).
    const WINDOW: bool = false;
    /// Whether the entry takes a softcap and ALiBi (`softcap`, `alibi`: both off at run time
    /// where the launch has neither); only [`General`] does, so that the window entries carry
    /// no code and no registers for them.
    const BIAS: bool = false;
    /// Whether key column `col` is hidden from query row `row`.
    fn hides(row: u32, col: u32, seqlen_q: u32, seqlen_k: u32) -> bool;
    /// Number of key columns query rows `..row_end` can see at most (the KV loop's end).
    fn visible_cols(row_end: u32, seqlen_q: u32, seqlen_k: u32) -> u32;
    /// Key columns `..n` are visible to every row from `row_start` on (tiles below need no mask).
    fn unmasked_cols(row_start: u32, seqlen_q: u32, seqlen_k: u32) -> u32;
    /// The first query row that sees key column `col` (`seqlen_q` if none): rows from it on
    /// see the column (the dK/dV loop's start).
    fn first_visible_row(col: u32, seqlen_q: u32, seqlen_k: u32) -> u32;
}

/// No mask: every row sees every key.
pub struct NoMask;

/// Causal, bottom-right aligned.
pub struct Causal;

impl Mask for NoMask {
    const CAUSAL: bool = false;
    #[inline(always)]
    fn hides(_row: u32, _col: u32, _sq: u32, _sk: u32) -> bool {
        false
    }
    #[inline(always)]
    fn visible_cols(_row_end: u32, _sq: u32, sk: u32) -> u32 {
        sk
    }
    #[inline(always)]
    fn unmasked_cols(_row_start: u32, _sq: u32, sk: u32) -> u32 {
        sk
    }
    #[inline(always)]
    fn first_visible_row(_col: u32, _sq: u32, _sk: u32) -> u32 {
        0
    }
}

impl Mask for Causal {
    const CAUSAL: bool = true;
    #[inline(always)]
    fn hides(row: u32, col: u32, sq: u32, sk: u32) -> bool {
        // col > row + sk - sq, in i64 so that sq > sk cannot wrap.
        col as i64 > row as i64 + sk as i64 - sq as i64
    }
    #[inline(always)]
    fn visible_cols(row_end: u32, sq: u32, sk: u32) -> u32 {
        // Row row_end-1 sees columns ..row_end + sk - sq.
        (row_end as i64 + sk as i64 - sq as i64).clamp(0, sk as i64) as u32
    }
    #[inline(always)]
    fn unmasked_cols(row_start: u32, sq: u32, sk: u32) -> u32 {
        (row_start as i64 + 1 + sk as i64 - sq as i64).clamp(0, sk as i64) as u32
    }
    #[inline(always)]
    fn first_visible_row(col: u32, sq: u32, sk: u32) -> u32 {
        // col <= row + sk - sq  <=>  row >= col + sq - sk.
        (col as i64 + sq as i64 - sk as i64).clamp(0, sq as i64) as u32
    }
}

/// A sliding window, causal or not: its bounds are the launch's ([`Window`]).
pub struct Windowed;

impl Mask for Windowed {
    const CAUSAL: bool = false;
    const WINDOW: bool = true;
    #[inline(always)]
    fn hides(_row: u32, _col: u32, _sq: u32, _sk: u32) -> bool {
        false
    }
    #[inline(always)]
    fn visible_cols(_row_end: u32, _sq: u32, sk: u32) -> u32 {
        sk
    }
    #[inline(always)]
    fn unmasked_cols(_row_start: u32, _sq: u32, _sk: u32) -> u32 {
        0
    }
    #[inline(always)]
    fn first_visible_row(_col: u32, _sq: u32, _sk: u32) -> u32 {
        0
    }
}

/// The general entries' mask: [`Windowed`]'s window, and the softcap and ALiBi bias the
/// launch may set (`Mask::BIAS`).
pub struct General;

impl Mask for General {
    const CAUSAL: bool = false;
    const WINDOW: bool = true;
    const BIAS: bool = true;
    #[inline(always)]
    fn hides(row: u32, col: u32, sq: u32, sk: u32) -> bool {
        Windowed::hides(row, col, sq, sk)
    }
    #[inline(always)]
    fn visible_cols(row_end: u32, sq: u32, sk: u32) -> u32 {
        Windowed::visible_cols(row_end, sq, sk)
    }
    #[inline(always)]
    fn unmasked_cols(row_start: u32, sq: u32, sk: u32) -> u32 {
        Windowed::unmasked_cols(row_start, sq, sk)
    }
    #[inline(always)]
    fn first_visible_row(col: u32, sq: u32, sk: u32) -> u32 {
        Windowed::first_visible_row(col, sq, sk)
    }
}

/// The window bounds of mask `M` (none unless `M::WINDOW`): each side's distance from the
/// bottom-right diagonal, [`NO_WINDOW`] for unbounded. Every function is also right for
/// masks without a window (then constant: no code).
pub struct Window<M> {
    left: u32,
    right: u32,
    _mask: PhantomData<M>,
}

// By hand: derived, they would ask M (a marker type) to be Copy.
impl<M> Clone for Window<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Window<M> {}

impl<M: Mask> Window<M> {
    /// The launch's window (`Problem::window_left`, `window_right`).
    #[inline(always)]
    pub fn new(pb: &Problem) -> Self {
        match M::WINDOW {
            true => Window { left: pb.window_left, right: pb.window_right, _mask: PhantomData },
            false => Window { left: NO_WINDOW, right: NO_WINDOW, _mask: PhantomData },
        }
    }

    /// The bounds packed in one word (left << 32 | right), for a call that must keep its
    /// arguments few; [`Window::unpack`] reverses it.
    #[inline(always)]
    pub fn pack(self) -> u64 {
        ((self.left as u64) << 32) | self.right as u64
    }

    #[inline(always)]
    pub fn unpack(w: u64) -> Self {
        Window { left: (w >> 32) as u32, right: w as u32, _mask: PhantomData }
    }

    /// The same bounds through an opaque move: LLVM can neither hoist what is computed from
    /// them out of a loop nor keep it live across one (at head_dim 192 the Hopper forward's
    /// per-row bounds, hoisted out of the KV loop, spilled).
    #[inline(always)]
    pub fn opaque(self) -> Self {
        if !M::WINDOW {
            return self;
        }
        Self::unpack(crate::dev::thread::opaque(self.pack()))
    }

    /// Whether the window hides key `col` (below seqlen_k) from query row `row` (M's own
    /// mask aside): the key's distance from the row's diagonal outside [-left, right] (no
    /// clamped column bounds: with them the d = 64 mma dK/dV windowed entry spilled 4 bytes
    /// on sm_90).
    #[inline(always)]
    pub fn hides(self, row: u32, col: u32, sq: u32, sk: u32) -> bool {
        if !M::WINDOW {
            return false;
        }
        let off = col as i64 - (row as i64 + sk as i64 - sq as i64);
        (self.left != NO_WINDOW && off < -(self.left as i64)) || (self.right != NO_WINDOW && off > self.right as i64)
    }

    /// Whether the window shows every key of `col0..=col_last` to every query row of
    /// `row0..=row_last` (M's own mask and seqlen_k aside): the pair farthest left of the
    /// diagonal (last row, first key) and the one farthest right (first row, last key) both
    /// inside [-left, right].
    #[inline(always)]
    pub fn shows_block(self, row0: u32, row_last: u32, col0: u32, col_last: u32, sq: u32, sk: u32) -> bool {
        if !M::WINDOW {
            return true;
        }
        let diag = sk as i64 - sq as i64;
        let (off_min, off_max) = (col0 as i64 - (row_last as i64 + diag), col_last as i64 - (row0 as i64 + diag));
        (self.left == NO_WINDOW || off_min >= -(self.left as i64)) && (self.right == NO_WINDOW || off_max <= self.right as i64)
    }

    /// Whether mask M or the window hides key `col` from query row `row`.
    #[inline(always)]
    pub fn hidden(self, row: u32, col: u32, sq: u32, sk: u32) -> bool {
        M::hides(row, col, sq, sk) || self.hides(row, col, sq, sk)
    }

    /// The first key column any row from `row_start` on sees (the KV loop's start).
    #[inline(always)]
    pub fn first_col(self, row_start: u32, sq: u32, sk: u32) -> u32 {
        if !M::WINDOW || self.left == NO_WINDOW {
            return 0;
        }
        (row_start as i64 + sk as i64 - sq as i64 - self.left as i64).clamp(0, sk as i64) as u32
    }

    /// Key columns `..n` hold every key rows `..row_end` see (the KV loop's end), with M's
    /// own bound.
    #[inline(always)]
    pub fn end_col(self, row_end: u32, sq: u32, sk: u32) -> u32 {
        let end = M::visible_cols(row_end, sq, sk);
        if !M::WINDOW || self.right == NO_WINDOW || row_end == 0 {
            return end;
        }
        let last = row_end as i64 - 1 + sk as i64 - sq as i64 + self.right as i64;
        (last + 1).clamp(0, end as i64) as u32
    }

    /// The first query row that sees any key from column `col0` on, with M's own bound (the
    /// dK/dV loop's start): j <= i + sk - sq + right  <=>  i >= j - right + sq - sk.
    #[inline(always)]
    pub fn first_row(self, col0: u32, sq: u32, sk: u32) -> u32 {
        let first = M::first_visible_row(col0, sq, sk);
        if !M::WINDOW || self.right == NO_WINDOW {
            return first;
        }
        (col0 as i64 - self.right as i64 + sq as i64 - sk as i64).clamp(first as i64, sq as i64) as u32
    }

    /// Query rows `..n` hold every row that sees a key below column `col_end` (the dK/dV
    /// loop's end): j >= i + sk - sq - left  <=>  i <= j + left + sq - sk.
    #[inline(always)]
    pub fn end_row(self, col_end: u32, sq: u32, sk: u32) -> u32 {
        if !M::WINDOW || self.left == NO_WINDOW || col_end == 0 {
            return sq;
        }
        (col_end as i64 + self.left as i64 + sq as i64 - sk as i64).clamp(0, sq as i64) as u32
    }
}

/// The query tiles (of `br` rows) a block of `keys` keys from `col0` runs, as (first, count):
/// tiles `first..first + count` hold every query row that sees a key of the block (the dK/dV
/// loop; which of them are masked: `nonfinite::dkdv_tile_masked`).
#[inline(always)]
pub fn q_tiles<M: Mask>(pb: &Problem, col0: u32, keys: u32, br: u32) -> (usize, usize) {
    let (sq, sk, win) = (pb.seqlen_q, pb.seqlen_k, Window::<M>::new(pb));
    let first = (win.first_row(col0, sq, sk) / br) as usize;
    // The block's end only with a window (without, `col0 + keys` merged with the kernels' own
    // and moved, and the atomic mma dK/dV kernel at d = 64 spilled 8 bytes).
    let end_row = if M::WINDOW { win.end_row((col0 + keys).min(sk), sq, sk) } else { sq };
    (first, (end_row.div_ceil(br) as usize).saturating_sub(first))
}

/// The key tiles (of `bc` keys) a block of query rows `row0..row_end` runs, as
/// (end, first, first masked): tiles `first..end` hold every key its rows see (from a
/// window's left edge), and from the third on they need the mask (with a window, every tile:
/// [`kv_unmasked`] has those a kernel can run unmasked).
#[inline(always)]
pub fn kv_tiles<M: Mask>(pb: &Problem, row0: u32, row_end: u32, bc: u32) -> (usize, usize, usize) {
    let (sq, sk, win) = (pb.seqlen_q, pb.seqlen_k, Window::<M>::new(pb));
    let n_tiles = win.end_col(row_end, sq, sk).div_ceil(bc) as usize;
    let first = (win.first_col(row0, sq, sk) / bc) as usize;
    let n_unmasked = ((M::unmasked_cols(row0, sq, sk) / bc) as usize).min(n_tiles).max(first);
    (n_tiles, first, n_unmasked)
}

/// The key tiles (of `bc` keys) that every row of `row0..row_end` sees whole, as a range
/// `from..to` within [`kv_tiles`]' `first..end`: the tiles a kernel can run unmasked. Without
/// a window, `first..n_unmasked` of [`kv_tiles`]; with one, the tiles between the window's
/// left edge for the block's last row and its right edge (or the causal diagonal) for its
/// first row: lo(row_end - 1) <= c0 and c0 + bc <= hi(row0).
#[inline(always)]
pub fn kv_unmasked<M: Mask>(pb: &Problem, row0: u32, row_end: u32, bc: u32) -> (usize, usize) {
    let (n_tiles, first, n_unmasked) = kv_tiles::<M>(pb, row0, row_end, bc);
    if !M::WINDOW || row_end <= row0 {
        return (first, n_unmasked);
    }
    let (sq, sk, win) = (pb.seqlen_q as i64, pb.seqlen_k as i64, Window::<M>::new(pb));
    // Keys lo.. are inside the left edge for the block's last row (and so for all of its
    // rows), keys ..hi inside the right edge for its first row, and below seqlen_k.
    let diag = sk - sq;
    let lo = match win.left {
        NO_WINDOW => 0,
        left => (row_end as i64 - 1 + diag - left as i64).max(0),
    };
    let hi = match win.right {
        NO_WINDOW => sk,
        right => (row0 as i64 + diag + right as i64 + 1).clamp(0, sk),
    };
    let from = ((lo as u64).div_ceil(bc as u64) as usize).clamp(first, n_tiles.max(first));
    let to = ((hi as u64 / bc as u64) as usize).clamp(from, n_tiles.max(from));
    (from, to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    /// For every shape, window and block of rows: the tiles `kv_tiles` runs hold every key a
    /// row of the block sees (for every block of keys, the tiles `q_tiles` runs every row that
    /// sees one of its keys), and the tiles it runs unmasked hide nothing (with the window's
    /// rule written out here: i + sk - sq - left <= j <= i + sk - sq + right, causal: j <=
    /// i + sk - sq).
    #[test]
    fn window_tiles_cover_every_visible_key() {
        let sides = [None, Some(0), Some(1), Some(5), Some(17), Some(64), Some(1000)];
        for (sq, sk) in [(1, 1), (7, 30), (30, 7), (64, 64), (100, 230), (150, 90), (129, 257)] {
            for causal in [false, true] {
                for left in sides {
                    for right in sides {
                        let pb = Problem {
                            seqlen_q: sq,
                            seqlen_k: sk,
                            causal: causal as u32,
                            window_left: left.unwrap_or(NO_WINDOW),
                            window_right: match (left, right) {
                                (None, None) => NO_WINDOW,
                                _ if causal => 0,
                                _ => right.unwrap_or(NO_WINDOW),
                            },
                            ..Problem::default()
                        };
                        let sees = |i: u32, j: u32| {
                            let diag = i as i64 + sk as i64 - sq as i64;
                            let right = if causal { Some(0) } else { right };
                            j < sk && right.is_none_or(|r| j as i64 <= diag + r as i64) && left.is_none_or(|l| j as i64 >= diag - l as i64)
                        };
                        for (br, bc) in [(16, 16), (64, 64), (128, 176), (1, 32)] {
                            let mut row0 = 0;
                            while row0 < sq {
                                let row_end = (row0 + br).min(sq);
                                let (n, first, unmasked) = match (pb.windowed(), causal) {
                                    (true, _) => kv_tiles::<Windowed>(&pb, row0, row_end, bc),
                                    (false, true) => kv_tiles::<Causal>(&pb, row0, row_end, bc),
                                    (false, false) => kv_tiles::<NoMask>(&pb, row0, row_end, bc),
                                };
                                let hidden = |i: u32, j: u32| match (pb.windowed(), causal) {
                                    (true, _) => Window::<Windowed>::new(&pb).hidden(i, j, sq, sk),
                                    (false, true) => Window::<Causal>::new(&pb).hidden(i, j, sq, sk),
                                    (false, false) => Window::<NoMask>::new(&pb).hidden(i, j, sq, sk),
                                };
                                let ctx =
                                    || format!("sq {sq} sk {sk} causal {causal} window {left:?} {right:?} rows {row0}..{row_end} bc {bc}");
                                assert!(first <= unmasked && unmasked <= n.max(first), "{}: {first} {unmasked} {n}", ctx());
                                let (from, to) = match (pb.windowed(), causal) {
                                    (true, _) => kv_unmasked::<Windowed>(&pb, row0, row_end, bc),
                                    (false, true) => kv_unmasked::<Causal>(&pb, row0, row_end, bc),
                                    (false, false) => kv_unmasked::<NoMask>(&pb, row0, row_end, bc),
                                };
                                assert!(first <= from && from <= to && to <= n.max(first), "{}: unmasked {from}..{to}", ctx());
                                for i in row0..row_end {
                                    for j in 0..sk {
                                        let tile = (j / bc) as usize;
                                        if tile >= from && tile < to {
                                            assert!(sees(i, j), "{}: kv_unmasked tile {tile} hides key {j} from row {i}", ctx());
                                        }
                                    }
                                }
                                // And no tile is left masked that could run unmasked: each
                                // other tile has a pair the block cannot see, or ends past sk.
                                for tile in (first..n).filter(|&t| t < from || t >= to) {
                                    let cols = tile as u32 * bc..(tile as u32 + 1) * bc;
                                    let needs_mask = cols.clone().any(|j| j >= sk || (row0..row_end).any(|i| !sees(i, j)));
                                    assert!(needs_mask, "{}: tile {tile} is whole to every row but masked ({from}..{to})", ctx());
                                }
                                for i in row0..row_end {
                                    for j in 0..sk {
                                        assert_eq!(!hidden(i, j), sees(i, j), "{}: row {i} key {j}", ctx());
                                        let tile = (j / bc) as usize;
                                        if sees(i, j) {
                                            assert!(
                                                first <= tile && tile < n,
                                                "{}: row {i} sees key {j} outside tiles {first}..{n}",
                                                ctx()
                                            );
                                        }
                                        if tile >= first && tile < unmasked {
                                            assert!(sees(i, j), "{}: unmasked tile {tile} hides key {j} from row {i}", ctx());
                                        }
                                    }
                                }
                                row0 = row_end;
                            }
                            // Key blocks of bc keys: the query tiles of br rows `q_tiles` runs
                            // hold every row that sees a key of the block.
                            let mut col0 = 0;
                            while col0 < sk {
                                let col_end = (col0 + bc).min(sk);
                                let (first, count) = match (pb.windowed(), causal) {
                                    (true, _) => q_tiles::<Windowed>(&pb, col0, bc, br),
                                    (false, true) => q_tiles::<Causal>(&pb, col0, bc, br),
                                    (false, false) => q_tiles::<NoMask>(&pb, col0, bc, br),
                                };
                                let end = first + count;
                                assert!(end <= sq.div_ceil(br) as usize, "sq {sq} sk {sk} keys {col0}..{col_end}");
                                for i in 0..sq {
                                    for j in col0..col_end {
                                        let tile = (i / br) as usize;
                                        assert!(
                                            !sees(i, j) || (first <= tile && tile < end),
                                            "sq {sq} sk {sk} causal {causal} window {left:?} {right:?} keys {col0}..{col_end} br {br}: row {i} sees key {j} outside tiles {first}..{end}"
                                        );
                                    }
                                }
                                col0 = col_end;
                            }
                        }
                    }
                }
            }
        }
    }
}
