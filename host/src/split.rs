//! Split-KV's part count (`FwdOptions::splits`): the count asked for, checked, or the
//! automatic choice for a launch.

use crate::error::{Error, Result};
use crate::forward::MAX_GRID_YZ;
use crate::options::FwdOptions;
use flashattn_kernels::registry::{FwdTiles, FwdVariant};

/// Most parts the automatic choice takes.
pub const MAX_AUTO_SPLITS: u32 = 32;
/// Fewest key tiles of a part the automatic choice makes: each part is a block that loads
/// its Q tile again, and the split adds the merge's launch.
pub const MIN_AUTO_PART_TILES: u32 = 4;

/// The parts a forward splits each block's keys into (1: no split), before any launch: the
/// count asked for (refused, [`Error::Splits`], where it cannot run), or without one
/// ([`FwdOptions::splits`] `None`) the automatic choice ([`auto_splits`]) where the family
/// splits and the residual is not saved. `blocks`: the unsplit launch's blocks; `slots`:
/// blocks the device runs at once.
pub(crate) fn split_count(
    opts: &FwdOptions,
    variant: &FwdVariant,
    residual: bool,
    (heads_q, seqlen_k, head_dim): (usize, usize, usize),
    (blocks, slots): (u64, u64),
) -> Result<u32> {
    let splits_keys = variant.family.desc().splits;
    let max = (MAX_GRID_YZ / heads_q.max(1)) as u32;
    let Some(splits) = opts.splits else {
        return Ok(match (splits_keys && !residual, key_tile(variant, head_dim)) {
            (true, Some(bc)) => auto_splits(blocks, slots, (seqlen_k as u64).div_ceil(bc as u64) as u32).min(max),
            _ => 1,
        });
    };
    let why = match splits {
        0 => "the count must be at least 1 (1: no split; None: the automatic choice)".to_string(),
        1 => return Ok(1),
        _ if !splits_keys => format!("the forward family {} does not split the keys (the Hopper families do)", variant.family.name()),
        _ if residual => "save_residual is set: only an unsplit forward writes O's residual".to_string(),
        s if s > max => format!("heads_q ({heads_q}) x splits is {}, over the launch grid's limit {MAX_GRID_YZ}", heads_q * s as usize),
        _ => return Ok(splits),
    };
    Err(Error::Splits { splits, why })
}

/// Whether the part count asked for ([`FwdOptions::splits`]) can run on `variant` with
/// `heads_q` query heads: [`Error::Splits`] where it cannot, as the forward would refuse it
/// (before any allocation: for a caller that reports its plan first, as the CLI).
pub fn check_splits(opts: &FwdOptions, variant: &FwdVariant, heads_q: usize) -> Result<()> {
    let residual = opts.save_residual && variant.family.desc().writes_residual;
    split_count(opts, variant, residual, (heads_q, 0, 0), (0, 1)).map(|_| ())
}

/// Keys per key tile of the variant's kernel at `head_dim` (the families that split).
fn key_tile(variant: &FwdVariant, head_dim: usize) -> Option<u32> {
    match variant.family.desc().tiles {
        FwdTiles::Wgmma(f) => f(head_dim as u32).map(|t| t.bc),
        _ => None,
    }
}

/// How close to the best count's last-wave fill the automatic choice's must come. Rejected:
/// FA2's 0.85, which on an H100 took 7 parts for one decode row of 32 heads over 131,072 keys
/// (bf16, d = 128): 1.28 TB/s against 8 parts' 1.45 with GQA (32 on 8 heads), 2.62 against
/// 2.68 without (benches/RESULTS.md, 2026-12-07).
pub const AUTO_FILL: f64 = 0.95;

/// The automatic part count for a launch of `blocks` blocks on a device that runs `slots` at
/// once, each block over `key_tiles` key tiles (after FA2's `num_splits_heuristic`): no
/// split when the blocks fill 80% of the slots; else, among the counts that change the tiles
/// per part (at most [`MAX_AUTO_SPLITS`], parts of at least [`MIN_AUTO_PART_TILES`] tiles),
/// the smallest whose last wave is filled to within [`AUTO_FILL`] of the best count's (pure:
/// tested below).
pub fn auto_splits(blocks: u64, slots: u64, key_tiles: u32) -> u32 {
    if blocks == 0 || blocks as f64 >= 0.8 * slots as f64 {
        return 1;
    }
    let max = MAX_AUTO_SPLITS.min(key_tiles / MIN_AUTO_PART_TILES).min(slots.min(u32::MAX as u64) as u32);
    let eligible = |s: &u32| *s == 1 || key_tiles.div_ceil(*s) != key_tiles.div_ceil(*s - 1);
    let filled = |s: u32| {
        let waves = (blocks * s as u64) as f64 / slots as f64;
        waves / waves.ceil()
    };
    let best = (1..=max).filter(eligible).map(filled).fold(0.0, f64::max);
    (1..=max).filter(eligible).find(|&s| filled(s) >= AUTO_FILL * best).unwrap_or(1)
}

/// Blocks of a kernel with `smem` bytes of shared memory the device runs at once: by shared
/// memory, at most 2 per multiprocessor (the Hopper forward's registers: 128 threads of up
/// to 255).
pub(crate) fn slots((sms, smem_per_sm): (usize, usize), smem: usize) -> u64 {
    (sms * (smem_per_sm / (smem + 1024)).clamp(1, 2)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_grids_are_not_split() {
        assert_eq!(auto_splits(264, 264, 1000), 1);
        assert_eq!(auto_splits(212, 264, 1000), 1);
        assert_eq!(auto_splits(0, 264, 1000), 1);
    }

    #[test]
    fn small_grids_fill_the_device() {
        // One decode row of 32 heads over 128 key tiles: 8 parts fill 97% of 264 slots (7
        // fill 85%).
        assert_eq!(auto_splits(32, 264, 128), 8);
        // Over 2,048 tiles (131,072 keys at d = 128), the same.
        assert_eq!(auto_splits(32, 264, 2048), 8);
        // Parts keep at least MIN_AUTO_PART_TILES tiles; few tiles, no split.
        assert_eq!(auto_splits(1, 264, 7), 1);
        assert_eq!(auto_splits(1, 264, 8), 2);
        assert!(auto_splits(1, 264, 10_000) <= MAX_AUTO_SPLITS);
        for blocks in 1..300 {
            for tiles in [1, 3, 4, 9, 64, 513] {
                let s = auto_splits(blocks, 264, tiles);
                assert!(s >= 1 && (s == 1 || tiles / s >= MIN_AUTO_PART_TILES), "{blocks} {tiles} {s}");
            }
        }
    }

    #[test]
    fn slots_by_shared_memory() {
        assert_eq!(slots((132, 228 << 10), 80 << 10), 264);
        assert_eq!(slots((132, 228 << 10), 150 << 10), 132);
        assert_eq!(slots((132, 228 << 10), 1 << 10), 264);
    }
}
