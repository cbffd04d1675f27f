//! Where 16-bit tiles live in shared memory: the element index of (row, column) in each
//! layout the tensor-core kernels use, and a lane's ldmatrix addresses in one. No copies and
//! no arithmetic on the data: `copy` fills these layouts, the kernels read them.

/// Where element (row r, column c) of a 16-bit tile lives in shared memory (the mma kernels'
/// [`Layout`], the wgmma kernels' [`Sw`]). Lets one copy routine fill either.
pub(crate) trait TileLayout {
    /// Element index of (r, c), c a multiple of 8 (chunk start) or inside one.
    fn at(r: usize, c: usize) -> usize;
}

/// The shared-memory layout of a [rows][D] 16-bit tile.
pub(crate) struct Layout<const D: usize>;

impl<const D: usize> Layout<D> {
    /// Swizzled (D a multiple of 64, at least 8 chunks a row) or padded.
    pub(crate) const SWIZZLED: bool = D.is_multiple_of(64);
    /// Elements per row: D, or D plus one 16-byte chunk of padding.
    pub(crate) const STRIDE: usize = if Self::SWIZZLED { D } else { D + 8 };
    /// Element index of (row r, column c), c a multiple of 8 (chunk start) or inside one.
    #[inline(always)]
    pub(crate) fn at(r: usize, c: usize) -> usize {
        if Self::SWIZZLED { r * D + (((c / 8) ^ (r % 8)) * 8) + c % 8 } else { r * Self::STRIDE + c }
    }
}

impl<const D: usize> TileLayout for Layout<D> {
    #[inline(always)]
    fn at(r: usize, c: usize) -> usize {
        Layout::<D>::at(r, c)
    }
}

/// Thread: the ldmatrix row addresses of one lane in a [`Layout`] tile, with the
/// lane-dependent part computed once. The lane reads row `16 a + row16` (row16 < 16, its
/// position inside a 16-row block) at 16-byte chunk `2 c + cbit`. Swizzled, since
/// 16 a + row16 = row16 mod 8, (2c + cbit) ^ r splits into the 16-element offset of
/// (c & !3), plus x[c & 3], plus 8 (cbit ^ (r & 1)); padded, it is plainly 16 c + 8 cbit.
/// With `a` and `c` unrolled constants the address is a register plus an immediate, so no
/// address registers pile up across the KV loop. (Recomputing x at each use instead of
/// keeping four registers raised pressure: ptxas spilled more.)
#[derive(Clone, Copy)]
pub(crate) struct LaneAddr {
    base: usize,
    x: [usize; 4],
}

impl LaneAddr {
    #[inline(always)]
    pub(crate) fn new<const D: usize>(row16: usize, cbit: usize) -> LaneAddr {
        let r = row16 % 8;
        if Layout::<D>::SWIZZLED {
            LaneAddr { base: row16 * D + 8 * (cbit ^ (r & 1)), x: [0, 1, 2, 3].map(|i| 8 * ((2 * i) ^ (r & 6))) }
        } else {
            LaneAddr { base: row16 * Layout::<D>::STRIDE + 8 * cbit, x: [0, 16, 32, 48] }
        }
    }
    /// Index of this lane's row in 16-row block `a`, chunk pair `c`.
    #[inline(always)]
    pub(crate) fn at<const D: usize>(&self, a: usize, c: usize) -> usize {
        self.base + a * 16 * Layout::<D>::STRIDE + 16 * (c & !3) + self.x[c & 3]
    }
    /// The same lane's addresses with chunk pair `c0` as pair 0 (a warp that works on the
    /// columns from 16 c0 on): `at(a, c)` of the result is `at(a, c0 + c)` of this one. For a
    /// constant `c0` (the indices into x must fold).
    #[inline(always)]
    pub(crate) fn shifted(&self, c0: usize) -> LaneAddr {
        let x = self.x;
        LaneAddr { base: self.base + 16 * (c0 & !3), x: [0, 1, 2, 3].map(|k| 16 * ((c0 % 4 + k) & !3) + x[(c0 % 4 + k) & 3]) }
    }
}

/// The 128-byte-swizzle canonical layout of a [ROWS][D] 16-bit tile (D a multiple of 64):
/// D / 64 column blocks of [ROWS][64], each row 128 bytes, the 16-byte chunks of row r
/// XOR-swizzled by r % 8 (wgmma reads it through a descriptor, 8-row groups 1024 bytes apart).
pub(crate) struct Sw<const ROWS: usize, const D: usize>;

impl<const ROWS: usize, const D: usize> Sw<ROWS, D> {
    /// Element index of (row r, column c).
    #[inline(always)]
    pub(crate) fn at(r: usize, c: usize) -> usize {
        (c / 64) * ROWS * 64 + r * 64 + ((((c % 64) / 8) ^ (r % 8)) * 8) + c % 8
    }
    /// Bytes between column blocks (the LBO of an MN-major operand).
    pub(crate) const BLOCK_BYTES: u32 = (ROWS * 64 * 2) as u32;
}

impl<const ROWS: usize, const D: usize> TileLayout for Sw<ROWS, D> {
    #[inline(always)]
    fn at(r: usize, c: usize) -> usize {
        Sw::<ROWS, D>::at(r, c)
    }
}

/// Which 16-byte chunks of a [ROWS][D] 16-bit tile thread `x` of a block of THREADS copies
/// (`copy::load_tile_in`) and then scans, cleans or negates (`nonfinite`, `copy`): one
/// mapping for every routine that touches a tile chunk by chunk, so that a thread only ever
/// reads back chunks its own copies wrote (no barrier between them).
/// - A row's chunks divide the block (D / 8 divides THREADS): row-major, thread x at column
///   8 (x % cpr) of rows x / cpr + i THREADS / cpr.
/// - Else, D a multiple of 64 and 8 ROWS a multiple of THREADS (a multiple of 64): by 64-column
///   block, thread x at chunk x % 8 of each block's rows x / 8 + k THREADS / 8. Its chunk
///   within a block and its row mod 8 (the swizzle's) are the same for every i, so every
///   address is a constant offset from two per-thread bases.
/// - Else row-major over the flat chunk index x + THREADS i.
pub(crate) struct Chunks<const D: usize, const ROWS: usize, const THREADS: usize>;

impl<const D: usize, const ROWS: usize, const THREADS: usize> Chunks<D, ROWS, THREADS> {
    /// Chunks per row.
    const CPR: usize = D / 8;
    /// Chunks per thread, the last ones past the tile for some threads (`at` is `None`).
    pub(crate) const PER_THREAD: usize = (ROWS * Self::CPR).div_ceil(THREADS);
    /// Whether a row's chunks divide the block.
    const ROW_MAJOR: bool = THREADS.is_multiple_of(Self::CPR);
    /// Whether the tile is taken by 64-column block.
    pub(crate) const BY_BLOCK: bool =
        !Self::ROW_MAJOR && D.is_multiple_of(64) && THREADS.is_multiple_of(64) && (8 * ROWS).is_multiple_of(THREADS);

    /// (row, column) of thread `x`'s chunk `i` (i < PER_THREAD), `None` past the tile.
    #[inline(always)]
    pub(crate) fn at(x: usize, i: usize) -> Option<(usize, usize)> {
        if Self::ROW_MAJOR {
            let r = x / Self::CPR + i * (THREADS / Self::CPR);
            ((ROWS * Self::CPR).is_multiple_of(THREADS) || r < ROWS).then_some((r, (x % Self::CPR) * 8))
        } else if Self::BY_BLOCK {
            let passes = 8 * ROWS / THREADS; // row passes per 64-column block
            Some((x / 8 + (i % passes) * (THREADS / 8), (i / passes) * 64 + (x % 8) * 8))
        } else {
            let e = x + THREADS * i;
            (e < ROWS * Self::CPR).then_some((e / Self::CPR, (e % Self::CPR) * 8))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Chunks;
    use std::{vec, vec::Vec};

    /// Every chunk of the tile is some thread's, exactly once, for each shape the kernels copy
    /// (and more); the by-block mapping keeps a thread's column within a block and its row
    /// mod 8 (the swizzle) fixed.
    fn covers_once<const D: usize, const ROWS: usize, const THREADS: usize>() {
        let mut seen = vec![0u32; ROWS * D / 8];
        for x in 0..THREADS {
            let mut mine = Vec::new();
            for i in 0..Chunks::<D, ROWS, THREADS>::PER_THREAD {
                if let Some((r, c)) = Chunks::<D, ROWS, THREADS>::at(x, i) {
                    assert!(r < ROWS && c < D && c % 8 == 0, "D {D} ROWS {ROWS} THREADS {THREADS}: ({r}, {c})");
                    seen[r * D / 8 + c / 8] += 1;
                    mine.push((r, c));
                }
            }
            if Chunks::<D, ROWS, THREADS>::BY_BLOCK {
                assert!(mine.iter().all(|&(r, c)| r % 8 == mine[0].0 % 8 && c % 64 == mine[0].1 % 64), "D {D} thread {x}: {mine:?}");
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "D {D} ROWS {ROWS} THREADS {THREADS}: chunk counts {seen:?}");
    }

    #[test]
    fn every_chunk_has_one_owner() {
        macro_rules! all {
            ($($d:literal),*) => {$(
                covers_once::<$d, 16, 128>();
                covers_once::<$d, 32, 128>();
                covers_once::<$d, 64, 128>();
                covers_once::<$d, 128, 128>();
                covers_once::<$d, 32, 256>();
                covers_once::<$d, 64, 256>();
                covers_once::<$d, 128, 256>();
                covers_once::<$d, 192, 384>();
            )*};
        }
        all!(32, 64, 96, 128, 192, 256);
        const { assert!(Chunks::<192, 64, 256>::BY_BLOCK && Chunks::<192, 32, 128>::BY_BLOCK && !Chunks::<256, 64, 256>::BY_BLOCK) };
    }
}
