//! The tensor-core forward kernel (FA2 class): mma.sync m16n8k16 with f32 accumulation for
//! S = Q K^T and O = P V, ldmatrix for fragments, cp.async double-buffering of K and V.
//!
//! One block per (Br query rows, head, batch), 4 warps; warp w owns MT consecutive m16 tiles
//! of query rows, so lane 4g + t holds rows g and g + 8 of each, and a row's softmax
//! statistics live in one lane quad. Each K or V fragment read by ldmatrix feeds 2 * MT mma.
//! Shared tiles are [rows][D] 16-bit, laid out so ldmatrix reads are bank-conflict free:
//! when D is a multiple of 64 the 16-byte chunks of row r are XOR-swizzled by r % 8; other D
//! (32, 96) pad each row by one chunk instead ([`Layout`]). A kernel compiled for D serves
//! every head_dim d <= D: columns d..D are zero-filled in shared memory (they add nothing to
//! Q K^T) and never stored.

use crate::alibi::Alibi;
use crate::block_info::BlockInfo;
use crate::copy::{body_head_dim, by_element, load_tile_in, negate_own_chunks, store_chunk};
use crate::dev::{self, Shared, block, thread, warp};
use crate::dtype::MmaElement;
use crate::epilogue::{quad_store_lse, warp_stage_o};
use crate::mask::{Mask, Window, kv_tiles, kv_unmasked};
use crate::nonfinite::{own_chunks_nonfinite, warp_fix_stored_o, zero_own_nonfinite};
use crate::params::FwdParams;
use crate::sinks;
use crate::smem::{LaneAddr, Layout};
use crate::softcap::Softcap;
use crate::softmax::{Domain, RowState};
use crate::tile::{Config, MMA_WARPS, MmaTile};
use core::marker::PhantomData;

/// Entry body for one tile `C` (`tile::mma_tile`). Its const parameters are the tile's fields
/// and the counts derived from them, checked against it at compile time (see `tile::Config`):
/// D = head_dim, DK = D / 16 (k-steps of Q K^T), DN = D / 8 (n-tiles of O), MT = m_tiles,
/// BC = bc, NS = BC / 8 (n-tiles of S), QREG = q_in_regs, PAD = padded (head_dim may be less
/// than D), FUSED = fused_exp. Causal or not is chosen at run time; ENTRY: which entry
/// (`crate::ENTRY_PLAIN`, `ENTRY_WINDOW`, `ENTRY_GENERAL`, `ENTRY_VARLEN`,
/// `with_window_mask!`).
///
/// # Safety
/// `p` valid (host-checked), `p.pb.head_dim == D`, 128 threads and the tile's
/// `smem_bytes()` bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn entry<
    T: MmaElement,
    C: Config<Tile = MmaTile>,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const MT: usize,
    const BC: usize,
    const NS: usize,
    const QREG: bool,
    const PAD: bool,
    const FUSED: bool,
    const ENTRY: u8,
>(
    p: &FwdParams,
) {
    const {
        let t = C::TILE;
        assert!(D == t.head_dim as usize && DK * 16 == D && DN * 8 == D && MT == t.m_tiles as usize);
        assert!(BC == t.bc as usize && NS * 8 == BC && QREG == t.q_in_regs && PAD == t.padded && FUSED == t.fused_exp);
    }
    unsafe {
        with_window_mask!(p: T, QueryRows / C::TILE.br(), ENTRY, M => match by_element(PAD, p.pb.head_dim) {
            false => fwd::<T, C, M, D, DK, DN, MT, BC, NS, QREG, PAD, FUSED, false>(p),
            true => fwd::<T, C, M, D, DK, DN, MT, BC, NS, QREG, PAD, FUSED, true>(p),
        })
    }
}

/// Block: ROWS rows of a [seqlen, d] slice (row stride `stride`) into a [`Layout`] tile of
/// width D ([`load_tile_in`] for the 128 threads of this kernel's block); with BOUNDS, rows
/// at or past `limit` and columns at or past `d` are zero-filled.
#[inline(always)]
pub(crate) unsafe fn load_tile<T: MmaElement, const D: usize, const ROWS: usize, const BOUNDS: bool>(
    dst: Shared<T>,
    src: *const T,
    stride: u64,
    limit: u32,
    d: u32,
) {
    unsafe { load_tile_in::<T, Layout<D>, D, ROWS, { (MMA_WARPS * 32) as usize }, BOUNDS>(dst, src, stride, limit, d) }
}

/// Block: the Q tile (MT m16 tiles per warp), rows past `limit` zero-filled.
#[inline(always)]
unsafe fn load_q<T: MmaElement, const D: usize, const MT: usize>(dst: Shared<T>, src: *const T, stride: u64, limit: u32, d: u32) {
    // Br = 64 MT rows; ROWS must be a constant, so one arm per m-tile count.
    unsafe {
        match MT {
            1 => load_tile::<T, D, 64, true>(dst, src, stride, limit, d),
            2 => load_tile::<T, D, 128, true>(dst, src, stride, limit, d),
            _ => thread::trap(),
        }
    }
}

/// Block: one K and one V tile of BC keys; the bounds checks only where the tile reaches past
/// seqlen_k (`limit` < BC) or head_dim is padded.
#[inline(always)]
unsafe fn load_kv<T: MmaElement, const D: usize, const BC: usize, const PAD: bool>(
    k_dst: Shared<T>,
    v_dst: Shared<T>,
    k: *const T,
    v: *const T,
    p: &FwdParams,
    limit: u32,
    d: u32,
) {
    unsafe {
        if PAD || limit < BC as u32 {
            load_tile::<T, D, BC, true>(k_dst, k, p.k_strides.row, limit, d);
            load_tile::<T, D, BC, true>(v_dst, v, p.v_strides.row, limit, d);
        } else {
            load_tile::<T, D, BC, false>(k_dst, k, p.k_strides.row, limit, d);
            load_tile::<T, D, BC, false>(v_dst, v, p.v_strides.row, limit, d);
        }
    }
}

/// Block, negative scale: the Q tile's sign bits flipped once its copies completed.
#[inline(always)]
fn negate_q<const D: usize, const MT: usize>(q: Shared<u32>) {
    thread::cp_async_wait::<0>();
    match MT {
        1 => negate_own_chunks::<Layout<D>, D, 64, { (MMA_WARPS * 32) as usize }>(q),
        2 => negate_own_chunks::<Layout<D>, D, 128, { (MMA_WARPS * 32) as usize }>(q),
        _ => thread::trap(),
    }
}

/// Warp w: the A fragments of its MT m16 tiles of Q, kept in registers for the KV loop (QREG).
#[inline(always)]
fn load_q_frag<T: MmaElement, const D: usize, const DK: usize, const MT: usize>(
    q_s: Shared<T>,
    q_addr: LaneAddr,
    w: usize,
    q_frag: &mut [[[u32; 4]; DK]; MT],
) {
    for (mt, qf) in q_frag.iter_mut().enumerate() {
        for (kk, f) in qf.iter_mut().enumerate() {
            *f = warp::ldmatrix_x4(q_s, q_addr.at::<D>(w * MT + mt, kk));
        }
    }
}

/// Block (4 warps): the forward pass of one (Br query rows, head, batch): Q and the first
/// K, V tile in flight, then the KV loop (tile j + 1 prefetched while every warp runs
/// [`Step::step`] on tile j: S = Q K^T, mask, online softmax, rescale, P V), then the
/// epilogue ([`Out::store_o`]) and, if a masked V held NaN or Inf, the fix of the stored O.
#[inline(always)]
unsafe fn fwd<
    T: MmaElement,
    C: Config<Tile = MmaTile>,
    M: Mask,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const MT: usize,
    const BC: usize,
    const NS: usize,
    const QREG: bool,
    const PAD: bool,
    const FUSED: bool,
    const EL: bool,
>(
    p: &FwdParams,
) {
    let tile = C::TILE;
    let br = tile.br() as usize;
    // Without PAD, head_dim is exactly D and the padding checks compile away.
    let d = body_head_dim::<D, EL>(PAD, p.pb.head_dim);
    if p.pb.head_dim > D as u32 || (!PAD && p.pb.head_dim != D as u32) || d == 0 || block::dim() != tile.threads() {
        thread::trap();
    }
    let BlockInfo { blk: q_blk, h, b } = BlockInfo::rows_per_head::<M>(p.pb.seqlen_q.div_ceil(br as u32));
    let (w, lane) = (warp::id() as usize, warp::lane() as usize);
    let (g, t) = (lane / 4, lane % 4);
    let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
    let h_kv = h / (p.pb.heads_q / p.pb.heads_kv);
    let row0 = q_blk * br as u32;

    // Shared memory: Q [br][D], then K stages 0 and 1, V stages 0 and 1 ([BC][D] each).
    let rs = Layout::<D>::STRIDE;
    let smem: Shared<T> = unsafe { dev::dynamic_shared((br + 4 * BC) * rs) };
    let q_s = smem.slice(0, br * rs);
    let k_s = |stage: usize| smem.slice((br + stage * BC) * rs, BC * rs);
    let v_s = |stage: usize| smem.slice((br + (2 + stage) * BC) * rs, BC * rs);
    // After the tiles: whether a masked tile's V held a NaN or an infinity (`nonfinite`), in
    // shared memory rather than a register kept live across the KV loop (d = 128 spilled).
    let bad_flag: Shared<u32> = smem.after(4);
    if thread::idx() == 0 {
        bad_flag.st(0, 0);
    }

    let q_g = unsafe { (p.q as *const T).add(p.q_strides.offset(b, row0.min(sq), h) as usize) };
    let k_g = unsafe { (p.k as *const T).add(p.k_strides.offset(b, 0, h_kv) as usize) };
    let v_g = unsafe { (p.v as *const T).add(p.v_strides.offset(b, 0, h_kv) as usize) };

    // Key tiles first..n_tiles (a window's left edge first), masked from n_unmasked on;
    // with a window, masked outside from..n_unmasked (`mask::kv_unmasked`).
    let row_end = (row0 + br as u32).min(sq);
    let (n_tiles, first, n_unmasked) = kv_tiles::<M>(&p.pb, row0, row_end, BC as u32);
    let (from, n_unmasked) = match M::WINDOW {
        true => kv_unmasked::<M>(&p.pb, row0, row_end, BC as u32),
        false => (first, n_unmasked),
    };

    // Prologue: Q and the first K, V tile in flight.
    unsafe {
        load_q::<T, D, MT>(q_s, q_g, p.q_strides.row, sq - row0.min(sq), d);
        if n_tiles > first {
            let c1 = (first * BC) as u32;
            let (k1, v1) = (k_g.add((c1 as u64 * p.k_strides.row) as usize), v_g.add((c1 as u64 * p.v_strides.row) as usize));
            load_kv::<T, D, BC, PAD>(k_s(first % 2), v_s(first % 2), k1, v1, p, sk - c1, d);
        }
    }
    thread::cp_async_commit();

    let mut acc_o = [[[0f32; 4]; DN]; MT];
    let mut rows = [[RowState::INIT; 2]; MT]; // rows g and g + 8 of each m16 tile
    let mut q_frag = [[[0u32; 4]; DK]; MT];
    // A fragments of Q: rows of this warp's m16 tiles; B fragments: K rows (keys) at chunk
    // pairs of d, V rows (keys) at chunk pairs of d, transposed.
    let q_addr = LaneAddr::new::<D>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
    let k_addr = LaneAddr::new::<D>(lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
    let v_addr = LaneAddr::new::<D>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
    // Scores stay raw (Q K^T); c = |softmax_scale| log2 e turns them into the exponent with
    // one FFMA. A negative scale is a positive one on -Q: Q's sign bits are flipped in shared
    // memory once. (A zero scale is the smallest normal one, `softmax::score_scale`: uniform
    // weights rather than 0 * -inf = NaN at masked keys.)
    // Without FUSED, c is the signed factor and the scores are scaled before the softmax.
    let c = if FUSED { T::Dm::factor(p.pb.scale.abs()) } else { T::Dm::factor(p.pb.scale) };
    // A softcap (the general entries): t = tanh(raw kf) in place of the raw score, c = cap
    // log2 e, LSE's max term m cap (`softcap`).
    // (k is recomputed each tile, `Softcap::opaque_k`, and the LSE's factor after the loop:
    // neither holds a register across it.)
    let sc = Softcap::<M>::new(&p.pb);
    let c = if sc.on() { sc.raw_factors(p.pb.scale.abs()).1 } else { c };
    // ALiBi (the general entries): FUSED, natural units (x = raw u + bias, c = log2 e), else
    // the bias in the log2 domain added to the scaled scores (`alibi`).
    let alibi = unsafe { Alibi::<M>::load(p.alibi, p.alibi_batch, b, h, &p.pb) };
    let slope = alibi.slope();
    let c = if FUSED { alibi.units(c, 1.0).1 } else { c };
    if FUSED && p.pb.scale < 0.0 {
        negate_q::<D, MT>(q_s.cast());
    }
    for j in first..n_tiles {
        // Prefetch K_{j+1}, V_{j+1} into the other stage while tile j is computed.
        if j + 1 < n_tiles {
            let c1 = ((j + 1) * BC) as u32;
            unsafe {
                let (k1, v1) = (k_g.add((c1 as u64 * p.k_strides.row) as usize), v_g.add((c1 as u64 * p.v_strides.row) as usize));
                load_kv::<T, D, BC, PAD>(k_s((j + 1) % 2), v_s((j + 1) % 2), k1, v1, p, sk - c1, d);
            }
            thread::cp_async_commit();
            thread::cp_async_wait::<1>();
        } else {
            thread::cp_async_wait::<0>();
        }
        // Masked tiles: this thread's chunks of V_j with their NaNs and infinities set to 0,
        // and the block told whether there were any (`nonfinite`).
        let masked = (M::WINDOW && j < from) || j >= n_unmasked;
        let bad_v = clean_v_vote::<T, D, BC>(v_s(j % 2), masked);
        if QREG && j == first {
            load_q_frag::<T, D, DK, MT>(q_s, q_addr, w, &mut q_frag);
        }
        let ctx = Step::<T, D, DK, MT, QREG, FUSED> {
            p,
            q: q_s,
            q_addr,
            w,
            k: k_s(j % 2),
            v: v_s(j % 2),
            q_frag: &q_frag,
            row0: row0 + (w * MT * 16) as u32,
            g,
            t,
            k_addr,
            v_addr,
            c,
            slope,
        };
        if !masked {
            ctx.step::<M, false, DN, BC, NS>(j, &mut acc_o, &mut rows);
        } else {
            ctx.step::<M, true, DN, BC, NS>(j, &mut acc_o, &mut rows);
        }
        if bad_v && thread::idx() == 0 {
            // Zeroed for the product, added back after the loop.
            bad_flag.st(0, 1);
        }
        // Everyone is done with stage j % 2 before iteration j + 1 refills it.
        block::sync();
    }
    if n_tiles <= first {
        // No key visible: no loop, so no barrier has ordered the block's Q copies (and the
        // sign flips of a negative scale) before the epilogue reuses the Q tile for O.
        thread::cp_async_wait::<0>();
        block::sync();
    }

    let out = Out::<T, D, MT> { p, q_len: br * rs, b, h, d, sq, row0, _elem: PhantomData };
    let lse_scale = alibi.units(c, sc.raw_factors(p.pb.scale.abs()).2).2;
    out.store_o::<FUSED, DN>(&acc_o, &rows, c, lse_scale);
    // (Written before the loop's last barrier, or with no loop, unwritten and 0.)
    if bad_flag.ld(0) != 0 {
        fix_stored_o::<T, M, MT, BC>(p, br, w, (d, sq, sk));
    }
}

/// Block, once V_j's copies landed (every thread's, then the barrier): on a masked tile
/// (`masked`), this thread's chunks of V_j with their NaNs and infinities set to 0, and
/// whether the block found any (`nonfinite`).
#[inline(always)]
fn clean_v_vote<T: MmaElement, const D: usize, const BC: usize>(v_s: Shared<T>, masked: bool) -> bool {
    if !masked {
        block::sync();
        return false;
    }
    let found = own_chunks_nonfinite::<T, Layout<D>, D, BC, { (MMA_WARPS * 32) as usize }>(v_s);
    if found {
        zero_own_nonfinite::<T, Layout<D>, D, BC, { (MMA_WARPS * 32) as usize }>(v_s);
    }
    block::sync_any(found)
}

/// Warp, after the block stored O (`Out::store_o`) and some masked tile's V held a NaN or an
/// infinity: the zeroed values, into the stored O of the rows that see their keys
/// (`nonfinite`). What it needs is rebuilt here from the block index (`opaque`): kept live
/// across the KV loop, it made d = 128 spill.
#[inline(always)]
fn fix_stored_o<T: MmaElement, M: Mask, const MT: usize, const BC: usize>(
    p: &FwdParams,
    br: usize,
    w: usize,
    (d, sq, sk): (u32, u32, u32),
) {
    warp::sync();
    let BlockInfo { blk: q_blk, h, b } = BlockInfo::rows_per_head::<M>(sq.div_ceil(br as u32));
    let (h, b) = (thread::opaque(h as u64) as u32, thread::opaque(b as u64) as u32);
    let row0 = q_blk * br as u32;
    let (n_tiles, first, n_unmasked) = kv_tiles::<M>(&p.pb, row0, (row0 + br as u32).min(sq), BC as u32);
    // The masked tiles' keys, with a window all of them (its unmasked tiles among them
    // change nothing: their V's NaNs and infinities are in O already, and adding one twice
    // leaves O's NaN or infinity as it was).
    let c0 = if M::WINDOW { first * BC } else { n_unmasked * BC };
    let (n_tiles, c0) = (n_tiles as u32, c0 as u32);
    let v0 = p.v + 2 * p.v_strides.offset(b, 0, h / (p.pb.heads_q / p.pb.heads_kv));
    let o_g = p.o + 2 * p.o_strides.offset(b, 0, h);
    let lse_g = p.lse + 4 * p.lse_row(b, h);
    let rows = ((row0 as u64 + (w * MT * 16) as u64) << 32) | (((MT * 16) as u64) << 16) | d as u64;
    let keys = ((c0 as u64) << 32) | (n_tiles * BC as u32 - c0) as u64;
    // SAFETY: O and LSE rows below seqlen_q, V rows below seqlen_k.
    let (seqlens, window) = (((sq as u64) << 32) | sk as u64, Window::<M>::new(&p.pb).pack());
    unsafe { warp_fix_stored_o::<T, M>(o_g, p.o_strides.row, lse_g, v0, p.v_strides.row, rows, keys, seqlens, window) };
}

/// What one KV step of one warp reads.
struct Step<'a, T: Copy, const D: usize, const DK: usize, const MT: usize, const QREG: bool, const FUSED: bool> {
    p: &'a FwdParams,
    /// Q tile, its A-fragment addresses and the warp (for reloading Q when not QREG).
    q: Shared<T>,
    q_addr: LaneAddr,
    w: usize,
    k: Shared<T>,
    v: Shared<T>,
    /// Q fragments, when kept in registers (QREG).
    q_frag: &'a [[[u32; 4]; DK]; MT],
    /// First query row of this warp's tiles.
    row0: u32,
    g: usize,
    t: usize,
    k_addr: LaneAddr,
    v_addr: LaneAddr,
    /// Factor from raw scores to the log2 domain (positive when FUSED); with a softcap, from
    /// tanh's value t; FUSED with ALiBi, from natural units (log2 e).
    c: f32,
    /// The head's ALiBi slope (`alibi`; 0: none).
    slope: f32,
}

impl<T: MmaElement, const D: usize, const DK: usize, const MT: usize, const QREG: bool, const FUSED: bool>
    Step<'_, T, D, DK, MT, QREG, FUSED>
{
    /// One iteration of the KV loop over key tile `j`, for this warp's MT m16 tiles;
    /// MASKED adds the mask and the seqlen_k bound to the scores.
    #[inline(always)]
    fn step<M: Mask, const MASKED: bool, const DN: usize, const BC: usize, const NS: usize>(
        &self,
        j: usize,
        acc_o: &mut [[[f32; 4]; DN]; MT],
        rows: &mut [[RowState; 2]; MT],
    ) {
        let p = self.p;
        let (g, t) = (self.g, self.t);
        let c0 = (j * BC) as u32;

        // S_ij = Q_i K_j^T: NS n-tiles of m16n8 per m-tile, k over D in steps of 16; each K
        // fragment feeds every m-tile.
        let mut acc_s = [[[0f32; 4]; NS]; MT];
        for kk in 0..DK {
            let qf: [[u32; 4]; MT] = core::array::from_fn(|mt| {
                if QREG { self.q_frag[mt][kk] } else { warp::ldmatrix_x4(self.q, self.q_addr.at::<D>(self.w * MT + mt, kk)) }
            });
            for np in 0..NS / 2 {
                let b = warp::ldmatrix_x4(self.k, self.k_addr.at::<D>(np, kk));
                for mt in 0..MT {
                    acc_s[mt][2 * np] = T::mma(qf[mt], [b[0], b[1]], acc_s[mt][2 * np]);
                    acc_s[mt][2 * np + 1] = T::mma(qf[mt], [b[2], b[3]], acc_s[mt][2 * np + 1]);
                }
            }
        }

        let mut alpha = [[1f32; 2]; MT];
        let mut p_16 = [[[0u32; 2]; NS]; MT];
        // The window's bounds fresh each tile (`Window::opaque`).
        let win = Window::<M>::new(&p.pb).opaque();
        // A softcap: tanh(raw k) in place of each raw score, in one uniform branch (`softcap`).
        let sc = Softcap::<M>::new(&p.pb);
        let kf = sc.opaque_k(if FUSED { p.pb.scale.abs() } else { p.pb.scale });
        // ALiBi after the cap (`alibi`): FUSED, x = raw u + bias in natural units; else
        // x = raw c + bias log2 e.
        let al = Alibi::<M>::new(self.slope, &p.pb);
        let (al, u) =
            if FUSED { (al, al.units(0.0, sc.raw_factors(p.pb.scale.abs()).2).0) } else { (al.scaled(T::Dm::factor(1.0)), self.c) };
        for mt in 0..MT {
            if sc.on() {
                for a in acc_s[mt].as_flattened_mut() {
                    *a = kf.tanh_16(*a);
                }
            }
            if al.on() {
                al.frag::<NS>(&mut acc_s[mt], u, c0, self.row0 + (mt * 16) as u32, (g, t));
            }
            // Raw scores (FUSED) or scaled ones, -inf where MASKED; split by row (g, g + 8).
            let mut s = [[[0f32; 2]; NS]; 2];
            for (n, a) in acc_s[mt].iter().enumerate() {
                for e in 0..4 {
                    let half = e / 2;
                    let mut x = if FUSED || al.on() { a[e] } else { a[e] * self.c };
                    if MASKED {
                        let row = self.row0 + (mt * 16 + g + 8 * half) as u32;
                        let col = c0 + (n * 8 + 2 * t + e % 2) as u32;
                        if col >= p.pb.seqlen_k || win.hidden(row, col, p.pb.seqlen_q, p.pb.seqlen_k) {
                            x = f32::NEG_INFINITY;
                        }
                    }
                    s[half][n][e % 2] = x;
                }
            }
            // Online softmax per row over the lane quad; alpha rescales acc_o below.
            for half in 0..2 {
                let s = s[half].as_flattened_mut();
                alpha[mt][half] = if FUSED { rows[mt][half].update_raw::<4>(s, self.c) } else { rows[mt][half].update::<T::Dm, 4>(s) };
            }
            // P's C-fragment layout is the A-fragment layout of the P V mma; rounded to 16 bits
            // now, so P holds half the registers through the P V loop.
            for (n, pn) in p_16[mt].iter_mut().enumerate() {
                *pn = [T::pack2(s[0][n][0], s[0][n][1]), T::pack2(s[1][n][0], s[1][n][1])];
            }
        }

        // acc_o *= alpha, skipped when no row of the warp got a new max (alpha = 1 exactly:
        // ex2(0)), which after the first few tiles is nearly every tile: 4 DN FMUL per m-tile.
        if warp::any(alpha.as_flattened().iter().any(|&a| a != 1.0)) {
            for (acc, al) in acc_o.iter_mut().zip(alpha.iter()) {
                for a in acc.iter_mut() {
                    a[0] *= al[0];
                    a[1] *= al[0];
                    a[2] *= al[1];
                    a[3] *= al[1];
                }
            }
        }

        // O += P_ij V_j: each V fragment feeds every m-tile.
        for kc in 0..NS / 2 {
            let pa: [[u32; 4]; MT] = core::array::from_fn(|mt| {
                let (lo, hi) = (p_16[mt][2 * kc], p_16[mt][2 * kc + 1]);
                [lo[0], lo[1], hi[0], hi[1]]
            });
            for dp in 0..DN / 2 {
                let b = warp::ldmatrix_x4_trans(self.v, self.v_addr.at::<D>(kc, dp));
                for mt in 0..MT {
                    acc_o[mt][2 * dp] = T::mma(pa[mt], [b[0], b[1]], acc_o[mt][2 * dp]);
                    acc_o[mt][2 * dp + 1] = T::mma(pa[mt], [b[2], b[3]], acc_o[mt][2 * dp + 1]);
                }
            }
        }
    }
}

/// What the epilogue reads: the launch, the Q tile (O's staging area), the block's rows.
struct Out<'a, T: Copy, const D: usize, const MT: usize> {
    p: &'a FwdParams,
    /// Elements of the Q tile (O's staging area, at the start of the dynamic shared memory).
    q_len: usize,
    /// Batch and query head.
    b: u32,
    h: u32,
    /// head_dim (columns stored), seqlen_q, first query row of the block.
    d: u32,
    sq: u32,
    row0: u32,
    _elem: PhantomData<T>,
}

impl<T: MmaElement, const D: usize, const MT: usize> Out<'_, T, D, MT> {
    /// Warp: O = acc_o / l_i, LSE = m_i + log l_i, rows g and g + 8 of each m16 tile, by the
    /// `epilogue` (O staged in the warp's own rows of the Q tile, free since the loop's last
    /// barrier).
    #[inline(always)]
    fn store_o<const FUSED: bool, const DN: usize>(
        &self,
        acc_o: &[[[f32; 4]; DN]; MT],
        rows: &[[RowState; 2]; MT],
        c: f32,
        lse_scale: f32,
    ) {
        let (p, b, h, d, sq, row0) = (self.p, self.b, self.h, self.d, self.sq, self.row0);
        // The Q tile, the warp and the lane taken again here, not from fields: LLVM optimizes
        // this method before inlining it, and so knows the tile's base and their ranges (from
        // fields, the staging addresses came out other: PTX changed).
        let q_s: Shared<T> = unsafe { dev::dynamic_shared(self.q_len) };
        let (w, lane) = (warp::id() as usize, warp::lane() as usize);
        let (g, t) = (lane / 4, lane % 4);
        let o_g = unsafe { (p.o as *mut T).add(p.o_strides.offset(b, 0, h) as usize) };
        let lse_g = unsafe { (p.lse as *mut f32).add(p.lse_row(b, h) as usize) };
        let o_words: Shared<u32> = q_s.cast();
        let sink = unsafe { sinks::of_head(p.sinks, h) };
        for mt in 0..MT {
            for half in 0..2 {
                let (inv_l, lse) = if FUSED { rows[mt][half].finish_raw::<4>(c, lse_scale) } else { rows[mt][half].finish::<T::Dm, 4>() };
                let (inv_l, lse) = sinks::fold((inv_l, lse), sink);
                let r_tile = (w * MT + mt) * 16 + g + 8 * half;
                warp_stage_o::<T, DN>(o_words, Layout::<D>::at, (r_tile, t), &acc_o[mt], half, inv_l);
                // Consecutive LSE rows: this family takes no GQA packing.
                unsafe { quad_store_lse(lse_g, (row0 + r_tile as u32, 1), sq, t, lse) };
            }
        }
        warp::sync();
        // Warp: its MT * 16 rows, D / 8 chunks each, lane l taking chunks l + 32 i (columns
        // d..D are zero padding, not stored): `epilogue::warp_store_staged`'s loop, written
        // out here because through that function LLVM rebuilt the staging addresses otherwise
        // and d = 256 ran 0.8% slower (benches/RESULTS.md, 2026-12-03).
        let cpr = D / 8;
        for i in 0..MT * 16 * cpr / 32 {
            let e = lane + 32 * i;
            let (r_tile, col) = (w * MT * 16 + e / cpr, (e % cpr) * 8);
            let r = row0 + r_tile as u32;
            if r < sq && (col as u32) < d {
                let v = q_s.ld_16(Layout::<D>::at(r_tile, col));
                unsafe { store_chunk(o_g.add((r as u64 * p.o_strides.row) as usize), col as u32, d, v) };
            }
        }
    }
}
