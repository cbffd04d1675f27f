//! Masks as types. Causal masking is bottom-right aligned (FlashAttention >= 2.1): query row
//! i sees key column j iff j <= i + (seqlen_k - seqlen_q). With seqlen_q > seqlen_k the first
//! rows see nothing: their output is 0 and their LSE is -inf.

/// A mask over the score matrix; also the bounds of the key/value loop.
pub trait Mask {
    /// Whether later query rows see more keys (the work per row tile grows with the row).
    const CAUSAL: bool;
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
