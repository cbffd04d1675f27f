//! Which tile of which head and batch entry a thread block computes (FA2's `BlockInfo`), in
//! the order the grid runs them (the tile scheduler).
//!
//! Every kernel's grid is (tiles, heads, batch): query-row tiles of query heads (the forward,
//! the dQ kernels) or key tiles of KV heads (the dK/dV kernels). Without a causal mask every
//! tile costs the same and a block computes the tile of its own index. With one, the tiles'
//! costs differ (a query-row tile's grows with its row, a key tile's falls with its key), and
//! the GPU starts blocks in index order: blocks are then given tiles longest first over the
//! whole grid (LPT order), so that the grid ends on the lightest tiles, not on the heaviest
//! tile of the last heads. To keep the K and V (or Q and dO) that concurrent blocks stream in
//! L2, the (head, batch) pairs are taken in sections: all tiles of one section, heaviest first,
//! before the next section (FA3's `SingleTileLPTScheduler` does the same). The Hopper
//! forward (`fwd_wgmma`) takes this order; the `mma` forward (its d = 128 kernel spilled 4
//! bytes on sm_90) and the backward kernels keep the per-head one
//! ([`BlockInfo::rows_per_head`]).

use crate::dev::block;
use crate::mask::Mask;

/// Bytes of the streamed tensors of one section of heads the order plans to keep in L2
/// (H100 and H200 have 50 MB; FA3 plans with 32 MiB). Rejected: 24 MiB, 0.89-0.95x of
/// 32 MiB at d = 256, causal, s = 512..8k.
pub const L2_PLAN_BYTES: u64 = 32 << 20;

/// A block's work: tile `blk` of head `h` of batch entry `b` (the grid's head: a query head
/// for query-row tiles, a KV head for key tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub blk: u32,
    pub h: u32,
    pub b: u32,
}

impl BlockInfo {
    /// Block: its tile of a (n_blk, heads_q, batch) grid of query-row tiles (the last tile of
    /// a causal mask is the heaviest). `stream_bytes`: bytes of K and V of one KV head, shared
    /// by heads_q / heads_kv consecutive query heads.
    #[inline(always)]
    pub fn rows<M: Mask>(n_blk: u32, heads_q: u32, heads_kv: u32, batch: u32, stream_bytes: u64) -> BlockInfo {
        Self::of::<M>(block::idx(), n_blk, heads_q, batch, section_heads(stream_bytes, heads_q / heads_kv))
    }

    /// Block: [`BlockInfo::rows`] on a grid whose y is heads_q x `splits` (split-KV), and
    /// which part of the keys it takes: y = split heads_q + h. With one part, the same tile
    /// as [`BlockInfo::rows`] and part 0.
    #[inline(always)]
    pub fn rows_split<M: Mask>(
        n_blk: u32,
        (heads_q, heads_kv, batch): (u32, u32, u32),
        stream_bytes: u64,
        splits: u32,
    ) -> (BlockInfo, u32) {
        if splits <= 1 {
            return (Self::rows::<M>(n_blk, heads_q, heads_kv, batch, stream_bytes), 0);
        }
        let group = heads_q / heads_kv;
        let bi = Self::of::<M>(block::idx(), n_blk, heads_q * splits, batch, section_heads(stream_bytes, group));
        (BlockInfo { h: bi.h % heads_q, ..bi }, bi.h / heads_q)
    }

    /// Block: its tile of a (n_blk, heads, batch) grid of query-row tiles, heaviest first
    /// within each head only, its head and batch entry the grid's (the backward kernels:
    /// with the whole-grid order the Hopper backward ran 0.93-0.97x at d = 64 and at 512-1k
    /// rows, and the mma kernels at the register limit spilled, head and batch no longer
    /// free reads of the block index; `benches/RESULTS.md`).
    #[inline(always)]
    pub fn rows_per_head<M: Mask>(n_blk: u32) -> BlockInfo {
        let (x, h, b) = block::idx();
        BlockInfo { blk: if M::CAUSAL { n_blk - 1 - x } else { x }, h, b }
    }

    /// Block: its tile, head and batch entry as the grid's own (the first key tile, the
    /// heaviest, first within each head); see [`BlockInfo::rows_per_head`].
    #[inline(always)]
    pub fn keys_per_head() -> BlockInfo {
        let (blk, h, b) = block::idx();
        BlockInfo { blk, h, b }
    }

    /// The tile of grid block `(x, y, z)`; with a causal mask, the k-th heaviest tile of a
    /// section (the last tile first) goes to the k-th run of `section` blocks of that section
    /// (pure: tested below).
    #[inline(always)]
    fn of<M: Mask>((x, y, z): (u32, u32, u32), n_blk: u32, heads: u32, batch: u32, section: u32) -> BlockInfo {
        if !M::CAUSAL {
            return BlockInfo { blk: x, h: y, b: z };
        }
        // The block's place in launch order, then its section and its place in the section.
        let section = section.min(heads * batch);
        let l = x + n_blk * (y + heads * z);
        let sec_blocks = section * n_blk;
        let sec = l / sec_blocks;
        let in_sec = l - sec * sec_blocks;
        // The last section holds what is left of the heads * batch pairs.
        let width = section.min(heads * batch - sec * section);
        let k = in_sec / width;
        let hb = sec * section + (in_sec - k * width);
        BlockInfo { blk: n_blk - 1 - k, h: hb % heads, b: hb / heads }
    }
}

/// Part `split` of `splits` of the key tiles first..end: consecutive runs whose lengths
/// differ by at most one, the longer ones first; empty when there are fewer tiles than parts.
#[inline(always)]
pub fn split_tiles(first: usize, end: usize, split: u32, splits: u32) -> (usize, usize) {
    let (s, k) = (split as usize, splits.max(1) as usize);
    let n = end.saturating_sub(first);
    let (len, extra) = (n / k, n % k);
    let a = first + s * len + s.min(extra);
    (a, a + len + usize::from(s < extra))
}

/// Bytes of two [rows][d] tensors of `T` (K and V of a KV head).
#[inline(always)]
pub fn stream_bytes<T>(rows: u32, d: usize) -> u64 {
    2 * rows as u64 * (d * core::mem::size_of::<T>()) as u64
}

/// (head, batch) pairs per section: as many KV heads' streams as fit the L2 plan (at least
/// one), times the query heads that share each.
#[inline(always)]
fn section_heads(stream_bytes: u64, group: u32) -> u32 {
    let kv_heads = (L2_PLAN_BYTES / stream_bytes.max(1)).clamp(1, 1 << 16) as u32;
    kv_heads * group
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::{Causal, NoMask};
    use std::vec::Vec;

    /// Every (tile, head, batch) exactly once, for both orders and many grid shapes and
    /// section widths (including sections wider than the grid and a short last section).
    #[test]
    fn every_tile_once() {
        for n_blk in [1, 2, 3, 8, 33] {
            for heads in [1, 2, 5, 8] {
                for batch in [1, 3, 4] {
                    for section in [1, 2, 3, 7, 64, 1 << 16] {
                        let mut seen = Vec::new();
                        for z in 0..batch {
                            for y in 0..heads {
                                for x in 0..n_blk {
                                    let bi = BlockInfo::of::<Causal>((x, y, z), n_blk, heads, batch, section);
                                    assert!(bi.blk < n_blk && bi.h < heads && bi.b < batch);
                                    seen.push((bi.blk, bi.h, bi.b));
                                }
                            }
                        }
                        seen.sort();
                        seen.dedup();
                        assert_eq!(seen.len(), (n_blk * heads * batch) as usize, "{n_blk} {heads} {batch} {section}");
                    }
                }
            }
        }
    }

    /// Within a section, launch order visits tiles heaviest first; without a mask the grid's
    /// own order.
    #[test]
    fn heaviest_first_within_sections() {
        let (n_blk, heads, batch, section) = (4, 3, 2, 4);
        let mut order = Vec::new();
        for z in 0..batch {
            for y in 0..heads {
                for x in 0..n_blk {
                    order.push(BlockInfo::of::<Causal>((x, y, z), n_blk, heads, batch, section));
                }
            }
        }
        // Section 0: pairs 0..4, tiles 3, 2, 1, 0; section 1: pairs 4, 5 (the rest).
        let sec0: Vec<u32> = order[..16].iter().map(|b| b.blk).collect();
        assert_eq!(sec0, [3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0]);
        let sec1: Vec<(u32, u32, u32)> = order[16..].iter().map(|b| (b.blk, b.h, b.b)).collect();
        assert_eq!(sec1, [(3, 1, 1), (3, 2, 1), (2, 1, 1), (2, 2, 1), (1, 1, 1), (1, 2, 1), (0, 1, 1), (0, 2, 1)]);
        assert_eq!(BlockInfo::of::<NoMask>((2, 1, 0), n_blk, heads, batch, section), BlockInfo { blk: 2, h: 1, b: 0 });
    }

    /// The parts of a tile range cover it once, in order, their lengths within one.
    #[test]
    fn split_tiles_cover_the_range() {
        for first in [0, 1, 5] {
            for n in [0, 1, 2, 3, 7, 64, 65] {
                for splits in [1, 2, 3, 4, 8, 70] {
                    let mut at = first;
                    let (mut lo, mut hi) = (usize::MAX, 0);
                    for s in 0..splits {
                        let (a, b) = split_tiles(first, first + n, s, splits);
                        assert_eq!(a, at, "{first} {n} {splits} {s}");
                        assert!(b >= a);
                        (lo, hi) = (lo.min(b - a), hi.max(b - a));
                        at = b;
                    }
                    assert_eq!(at, first + n);
                    assert!(hi - lo <= 1, "{first} {n} {splits}");
                }
            }
        }
        assert_eq!(split_tiles(3, 1, 0, 2), (3, 3));
    }

    #[test]
    fn sections_fit_the_plan() {
        assert_eq!(section_heads(L2_PLAN_BYTES, 1), 1);
        assert_eq!(section_heads(L2_PLAN_BYTES * 4, 4), 4);
        assert_eq!(section_heads(512 << 10, 1), 64);
        assert_eq!(section_heads(512 << 10, 4), 256);
        assert_eq!(section_heads(0, 1), 1 << 16);
    }
}
