//! Rows of Q, K, V, O between global memory and shared tiles: the block's tile copies into a
//! `smem` layout, a thread's chunk store, and the SIMT kernels' f32 tiles.
//!
//! 16-bit rows whose head_dim is a multiple of 8 are 16-byte aligned (the host's strides are
//! multiples of head_dim) and move in 16-byte chunks; any other head_dim moves element by
//! element, zero-padded to whole chunks in shared memory, so the tensor-core kernels see the
//! same tiles either way.

use crate::dev::{Chunk16, Shared, block, global, thread};
use crate::dtype::{Element, MmaElement};
use crate::smem::{Chunks, TileLayout};

/// The head_dim a kernel body compiled for D works with: D itself for an exact tile (`pad`
/// false, a constant of the tile); for a padded one the run-time `head_dim`, which in a body for whole 16-byte chunks (`EL` false: the kernel's
/// entry checked head_dim % 8 == 0) is known to the compiler as a multiple of 8, so the
/// element-wise paths of [`load_tile_in`], [`store_chunk`] and the kernels fold away there and
/// that body compiles as if they did not exist (inside the KV loop they cost the 255-register
/// kernels spills). EL: the body for any other head_dim.
#[inline(always)]
pub(crate) fn body_head_dim<const D: usize, const EL: bool>(pad: bool, head_dim: u32) -> u32 {
    if !pad {
        D as u32
    } else if EL {
        // SAFETY: the entry runs this body only for such a head_dim (`by_element`); told so,
        // LLVM drops the 16-byte paths from it too.
        unsafe { core::hint::assert_unchecked(!head_dim.is_multiple_of(8)) };
        head_dim
    } else {
        // SAFETY: the entry runs this body only for a multiple of 8 (`by_element` false); the
        // same value, so no second one lives across the kernels' loops.
        unsafe { core::hint::assert_unchecked(head_dim.is_multiple_of(8)) };
        head_dim
    }
}

/// Whether a kernel of a padded tile (`pad`) runs its element-wise body (`EL`) for `head_dim`.
#[inline(always)]
pub(crate) fn by_element(pad: bool, head_dim: u32) -> bool {
    pad && !head_dim.is_multiple_of(8)
}

/// Block of THREADS threads: copies ROWS rows of a [seqlen, d] slice (row stride `stride`)
/// into a tile of layout L and width D; with BOUNDS, rows at or past `limit` and columns at
/// or past `d` are zero-filled (without it every row and column must be valid, and d = D).
/// Thread `x` copies the 16-byte chunks [`Chunks`] gives it: a fixed trip count, so the loop
/// unrolls and, where the mapping keeps the thread's column and swizzle the same for every
/// chunk, each copy is a constant offset (a loop with a thread-dependent trip count cost 27
/// instructions per 16 bytes, a third of the KV loop's instructions at d=128: SASS of
/// 27ff2b2). Asynchronous (cp.async: complete after the caller's commit and
/// wait) when d is a multiple of 8; else synchronous, element by element, the same chunks
/// per thread (the non-finite scans and the sign flips of Q rely on that).
#[inline(always)]
pub(crate) unsafe fn load_tile_in<
    T: MmaElement,
    L: TileLayout,
    const D: usize,
    const ROWS: usize,
    const THREADS: usize,
    const BOUNDS: bool,
>(
    dst: Shared<T>,
    src: *const T,
    stride: u64,
    limit: u32,
    d: u32,
) {
    if BOUNDS && !d.is_multiple_of(8) {
        let cpr = D / 8; // chunks per row
        // Element by element, one at a time: a loop at run time over this thread's chunks'
        // elements, not unrolled (unrolled, its loads are hoisted together and the kernels
        // around it spill), each a 2-byte load and a 2-byte shared store.
        // Everything the loop needs read here (`opaque`): no register of it lives across the
        // caller's loop.
        let n = thread::opaque((Chunks::<D, ROWS, THREADS>::PER_THREAD * 8) as u64) as usize;
        let (x, stride, limit, d) = (
            thread::opaque(thread::idx() as u64) as usize,
            thread::opaque(stride),
            thread::opaque(limit as u64) as u32,
            thread::opaque(d as u64) as u32,
        );
        let src = thread::opaque(src as u64) as *const T;
        let half: Shared<u16> = dst.cast();
        for j in 0..n {
            let (e, k) = (x + THREADS * (j / 8), j % 8);
            let at = if Chunks::<D, ROWS, THREADS>::BY_BLOCK {
                Chunks::<D, ROWS, THREADS>::at(x, j / 8)
            } else {
                (e < ROWS * cpr).then(|| (e / cpr, (e % cpr) * 8)) // `Chunks::at`, flat
            };
            if let Some((r, c0)) = at {
                let c = c0 + k;
                let v = if (r as u32) < limit && (c as u32) < d {
                    unsafe { global::load(src.add(at_of(r, c, stride)) as *const u16) }
                } else {
                    0
                };
                half.st(L::at(r, c), v);
            }
        }
        return;
    }
    unsafe { load_tile_chunks::<T, L, D, ROWS, THREADS, BOUNDS>(dst, src, stride, limit, d) }
}

/// [`load_tile_in`] for a d that is a multiple of 8 (16-byte chunks, cp.async), with no
/// element-wise path compiled in: for kernels that serve only such head dims (the 255-register
/// backward kernels, where ptxas's allocation shifts with any extra code).
#[inline(always)]
pub(crate) unsafe fn load_tile_chunks<
    T: MmaElement,
    L: TileLayout,
    const D: usize,
    const ROWS: usize,
    const THREADS: usize,
    const BOUNDS: bool,
>(
    dst: Shared<T>,
    src: *const T,
    stride: u64,
    limit: u32,
    d: u32,
) {
    let stride = thread::opaque(stride);
    let x = thread::opaque(thread::idx() as u64) as usize;
    let cpr = D / 8; // chunks per row
    for i in 0..Chunks::<D, ROWS, THREADS>::PER_THREAD {
        let (r, c) = if Chunks::<D, ROWS, THREADS>::BY_BLOCK {
            let Some(at) = Chunks::<D, ROWS, THREADS>::at(x, i) else { continue };
            at
        } else {
            // `Chunks::at`, written out as the register budgets of the kernels were measured.
            let e = x + THREADS * i;
            if !(ROWS * cpr).is_multiple_of(THREADS) && e >= ROWS * cpr {
                continue;
            }
            if THREADS.is_multiple_of(cpr) { (x / cpr + i * (THREADS / cpr), (x % cpr) * 8) } else { (e / cpr, (e % cpr) * 8) }
        };
        let valid = !BOUNDS || ((r as u32) < limit && (c as u32) < d);
        let at = if valid { r as u64 * stride + c as u64 } else { 0 };
        unsafe { thread::cp_async_16(dst, L::at(r, c), src.add(at as usize), valid) };
    }
}

/// Block: two tiles of one row stride (K and V, or Q and dO, in one layout) as
/// [`load_tile_chunks`] loads one: the same chunks of both, each address computed once
/// (separate address arithmetic for the two tiles cost the Hopper backward 3-4% at d=128).
#[inline(always)]
pub(crate) unsafe fn load_tile_pair<T: MmaElement, L: TileLayout, const D: usize, const ROWS: usize, const THREADS: usize>(
    dst: [Shared<T>; 2],
    src: [*const T; 2],
    stride: u64,
    limit: u32,
    d: u32,
) {
    let stride = thread::opaque(stride);
    let x = thread::opaque(thread::idx() as u64) as usize;
    for i in 0..Chunks::<D, ROWS, THREADS>::PER_THREAD {
        let Some((r, c)) = Chunks::<D, ROWS, THREADS>::at(x, i) else { continue };
        let valid = (r as u32) < limit && (c as u32) < d;
        let at = if valid { r as u64 * stride + c as u64 } else { 0 };
        for k in 0..2 {
            unsafe { thread::cp_async_16(dst[k], L::at(r, c), src[k].add(at as usize), valid) };
        }
    }
}

/// Block: rows `row0..row0 + ROWS` of two [seqlen, d] slices (`src`: each slice's row 0, row
/// strides `strides`, which may differ) into tiles `dst` of one layout L; rows at or past
/// `limit` and columns at or past `d` zero-filled. Each chunk's address is its row in the
/// slice times the slice's stride: nothing of it is invariant over a caller's loop of tiles,
/// so nothing is held across it (from the tile's first row, each slice's per-chunk offsets
/// were: the Hopper d=192 dK/dV kernel 168 -> 212 registers, 0.89x, once Q and dO had strides
/// of their own). A d not a multiple of 8: one [`load_tile_in`] each.
#[inline(always)]
pub(crate) unsafe fn load_two<T: MmaElement, L: TileLayout, const D: usize, const ROWS: usize, const THREADS: usize>(
    dst: [Shared<T>; 2],
    src: [*const T; 2],
    strides: [u64; 2],
    row0: u32,
    limit: u32,
    d: u32,
) {
    if !d.is_multiple_of(8) {
        for k in 0..2 {
            let first = (row0.min(limit) as u64 * strides[k]) as usize;
            unsafe { load_tile_in::<T, L, D, ROWS, THREADS, true>(dst[k], src[k].add(first), strides[k], limit - row0.min(limit), d) };
        }
        return;
    }
    let x = thread::opaque(thread::idx() as u64) as usize;
    for i in 0..Chunks::<D, ROWS, THREADS>::PER_THREAD {
        let Some((r, c)) = Chunks::<D, ROWS, THREADS>::at(x, i) else { continue };
        let row = row0 + r as u32;
        let valid = row < limit && (c as u32) < d;
        for k in 0..2 {
            let at = if valid { row as u64 * strides[k] + c as u64 } else { 0 };
            unsafe { thread::cp_async_16(dst[k], L::at(r, c), src[k].add(at as usize), valid) };
        }
    }
}

/// Element offset of (row r, column c) in a slice of row stride `stride`.
#[inline(always)]
fn at_of(r: usize, c: usize, stride: u64) -> usize {
    (r as u64 * stride + c as u64) as usize
}

/// Thread: elements col..min(col + 8, d) of a row's chunk `v` (col < d, a multiple of 8) to
/// that row at `row` in global memory: one 16-byte store when d is a multiple of 8, else
/// element by element.
///
/// # Safety
/// `row` must point to `d` writable elements, 16-byte aligned when d is a multiple of 8.
#[inline(always)]
pub(crate) unsafe fn store_chunk<T: Copy>(row: *mut T, col: u32, d: u32, v: Chunk16) {
    if d.is_multiple_of(8) {
        unsafe { global::store_16(row.add(col as usize) as *mut Chunk16, v) };
    } else {
        for e in 0..8u32 {
            if col + e < d {
                let x = (v.0[(e / 2) as usize] >> (16 * (e % 2))) as u16;
                unsafe { global::store(row.add((col + e) as usize) as *mut u16, x) };
            }
        }
    }
}

/// Thread (one of a block of THREADS): flips the sign of every element of the 16-byte chunks
/// this thread copied into a [ROWS][D] Q tile of layout L (the chunks [`load_tile_in`] gives
/// it), after its copies completed: a negative softmax scale becomes a positive one on -Q. A
/// block barrier must order these writes before any warp reads Q.
#[inline(always)]
pub(crate) fn negate_own_chunks<L: TileLayout, const D: usize, const ROWS: usize, const THREADS: usize>(words: Shared<u32>) {
    let flip = |r: usize, c: usize| {
        let at = L::at(r, c) / 2;
        for k in 0..4 {
            words.st(at + k, words.ld(at + k) ^ 0x8000_8000); // both 16-bit sign bits
        }
    };
    let x = thread::idx() as usize;
    if Chunks::<D, ROWS, THREADS>::BY_BLOCK {
        for i in 0..Chunks::<D, ROWS, THREADS>::PER_THREAD {
            if let Some((r, c)) = Chunks::<D, ROWS, THREADS>::at(x, i) {
                flip(r, c);
            }
        }
    } else {
        let (cpr, mut e) = (D / 8, x); // `Chunks::at`, flat
        while e < ROWS * cpr {
            flip(e / cpr, (e % cpr) * 8);
            e += THREADS;
        }
    }
}

/// Block: copies rows `row0..row0+rows` of a [seqlen, d] slice (row stride `src_stride`) into
/// `dst` as f32 with row stride `dst_stride`; rows at or past `row_limit` become 0.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn load_tile_f32<T: Element>(
    dst: Shared<f32>,
    dst_stride: u32,
    src: *const T,
    src_stride: u64,
    row0: u32,
    rows: u32,
    row_limit: u32,
    d: u32,
) {
    let mut e = thread::idx();
    while e < rows * d {
        let (r, c) = (e / d, e % d);
        let g = row0 + r;
        let x = if g < row_limit { unsafe { global::load(src.add((g as u64 * src_stride + c as u64) as usize)) }.to_f32() } else { 0.0 };
        dst.st((r * dst_stride + c) as usize, x);
        e += block::dim();
    }
}

/// Block: the inverse of [`load_tile_f32`]: writes rows `0..rows` of the f32 tile `src` (row
/// stride `src_stride`) as `T` to rows `row0..` of a [seqlen, d] slice (row stride
/// `dst_stride`), skipping rows at or past `row_limit`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn store_tile_f32<T: Element>(
    src: Shared<f32>,
    src_stride: u32,
    dst: *mut T,
    dst_stride: u64,
    row0: u32,
    rows: u32,
    row_limit: u32,
    d: u32,
) {
    let mut e = thread::idx();
    while e < rows * d {
        let (r, c) = (e / d, e % d);
        let g = row0 + r;
        if g < row_limit {
            let x = T::from_f32(src.ld((r * src_stride + c) as usize));
            unsafe { global::store(dst.add((g as u64 * dst_stride + c as u64) as usize), x) };
        }
        e += block::dim();
    }
}
