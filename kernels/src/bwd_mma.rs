//! The tensor-core backward kernels (FA2's backward, f16 and bf16): mma.sync m16n8k16 with
//! f32 accumulation, ldmatrix fragments, cp.async double buffering. The deterministic family
//! (`mma`, no atomics) launches, in this order, on one stream:
//! 1. `dq`: one block per (64 query rows, head, batch), as the forward: warp w owns query
//!    rows 16w..16w+16, Q_i and dO_i fragments in registers. It loops over the key tiles
//!    twice. Pass 0: each row's softmax statistics m_i, l_i and D_i = sum_j P_ij dP_ij, in
//!    f32 from the same S_ij and dP_ij = dO_i V_j^T that pass 1 computes (written to the
//!    `stats` workspace for the dK/dV kernel). Pass 1: P_ij = exp(S_ij scale - m_i) / l_i,
//!    dS_ij = P_ij (dP_ij - D_i), dQ_i += dS_ij K_j; dQ_i = scale dQ_i at the end.
//!    Not FA2's P from the saved LSE and D = rowsum(dO * O): with those, the emulator's
//!    property tests failed FA2's own bar (twice naive attention's error) in about 1 case in
//!    7 with few visible keys (causal, seqlen_k <= 3): D from O rounded to 16 bits, and P
//!    not exactly 1 for a row's only key, so dS = dP - D is rounding noise where it should be
//!    0. The extra pass (two of dQ's three products again) makes dS of such rows exactly 0
//!    and D f32-accurate, as the SIMT backward does.
//! 2. `dkdv`: one block per (64 keys, KV head, batch), warp w owns keys 16w..16w+16 and loops
//!    over every query tile of every query head of the KV head's group. It computes in the
//!    transposed orientation (keys as the mma's rows), so P^T and dS^T come out of the mma as
//!    C fragments that are already the A fragments of dV += P^T dO and dK += dS^T Q, with no
//!    shared-memory transpose: S^T = K Q^T, dP^T = V dO^T.
//!
//! Every output element is summed by one lane in a fixed order: bitwise deterministic.
//!
//! The atomic family (`mma_atomic`, FA2's single-kernel structure) launches `dq` with
//! STATS_ONLY (pass 0 alone: the statistics), then `dkdv` with DQ: after dK/dV's products each
//! warp also writes its dS^T slice to shared memory as dS [query][key], and after a barrier the
//! warps split dQ_i += dS_ij K_j (16 query rows x 16 columns per unit) and add it into the f32
//! accumulator `dq_accum` with `red.global.add.f32`; then `bwd_convert::dq_convert` scales and rounds it
//! into dQ. Each dQ element gets seqlen_k / 64 atomic adds in a run-dependent order: not
//! bitwise deterministic, and slower than the deterministic pair on the H200 (tile.rs).
//!
//! A kernel compiled for D serves every head_dim d <= D that is a multiple of 8 (others go to
//! the next family: `registry::BwdFamilyDesc::aligned_only`): columns d..D are zero-filled in shared
//! memory (they add nothing to S or dP) and never stored.
//!
//! Fully masked query rows (causal, seqlen_q > seqlen_k) get m_i = +inf, 1 / l_i = 0, so
//! exp2(S - m_i) / l_i = 0 with no special case. Query rows past seqlen_q (zero-filled Q, dO)
//! get the same, so their P and dS are 0. The forward's O and LSE are not read.

use crate::alibi::Alibi;
use crate::block_info::BlockInfo;
use crate::copy::{load_tile_chunks, load_tile_pair};
use crate::dev::{self, Shared, block, global, math, thread, warp};
use crate::dtype::MmaElement;
use crate::frag::{pair_sum, store_rows, to_a};
use crate::mask::{Mask, Window, kv_tiles, kv_unmasked, q_tiles};
use crate::nonfinite::{add_nonfinite, dkdv_tile_masked, finite_frag, row_at};
use crate::params::BwdParams;
use crate::sinks;
use crate::smem::{LaneAddr, Layout};
use crate::softcap::{Softcap, dtanh};
use crate::softmax::QuadRow;
use crate::tile::{Config, MMA_WARPS, MmaBwdTile, exchange_floats};
use core::f32::consts::LOG2_E;

/// Rows (queries for dq, keys for dkdv) per block: 16 per warp.
const BLOCK_ROWS: usize = 16 * MMA_WARPS as usize;

/// Warp `wb` of a block of MMA_WARPS * SPLIT warps: its 16-row slice and its part of D.
/// SPLIT = 1: warp w owns slice w and all of D; SPLIT = 2 (head_dim above 128,
/// `tile::mma_bwd_tile`): warps w and w + MMA_WARPS share slice w, the first owns columns
/// 0..D/2 of the products and outputs, the second D/2..D.
#[inline(always)]
fn slice_and_half<const SPLIT: usize>(wb: usize) -> (usize, usize) {
    if SPLIT == 1 { (wb, 0) } else { (wb % MMA_WARPS as usize, wb / MMA_WARPS as usize) }
}

/// The warp's half of D (`slice_and_half`), read again where it is used (`opaque`): live
/// across the loops, it and what is built from it took the dK/dV kernel at D = 192 past 255
/// registers on sm_90 (12 bytes of spills).
#[inline(always)]
fn half_now<const SPLIT: usize>() -> usize {
    if SPLIT == 1 { 0 } else { slice_and_half::<SPLIT>(thread::opaque(warp::id() as u64) as usize).1 }
}

/// The lane's ldmatrix addresses `a` for its warp's half `hf` of D: chunk pairs from
/// `pairs` hf on (`pairs` = D / 16 / SPLIT, a constant).
#[inline(always)]
fn half_addr(a: LaneAddr, hf: usize, pairs: usize) -> LaneAddr {
    if hf == 0 { a } else { a.shifted(pairs) }
}

/// Block of MMA_WARPS * SPLIT warps: ROWS rows of a [seqlen, d] slice (row stride `stride`,
/// d a multiple of 8: no element-wise path compiled in) into a [`Layout`] tile of width D,
/// rows at or past `limit` and columns at or past `d` zero-filled.
#[inline(always)]
unsafe fn load<T: MmaElement, const D: usize, const ROWS: usize, const SPLIT: usize>(
    dst: Shared<T>,
    src: *const T,
    stride: u64,
    limit: u32,
    d: u32,
) {
    unsafe {
        if SPLIT == 1 {
            load_tile_chunks::<T, Layout<D>, D, ROWS, { MMA_WARPS as usize * 32 }, true>(dst, src, stride, limit, d)
        } else {
            load_tile_chunks::<T, Layout<D>, D, ROWS, { 2 * MMA_WARPS as usize * 32 }, true>(dst, src, stride, limit, d)
        }
    }
}

/// Block: two tiles as [`load`] loads one, through [`load_tile_pair`] when their row strides
/// agree (K and V, Q and dO in one layout).
#[inline(always)]
unsafe fn load2<T: MmaElement, const D: usize, const ROWS: usize, const SPLIT: usize>(
    dst: [Shared<T>; 2],
    src: [*const T; 2],
    strides: [u64; 2],
    limit: u32,
    d: u32,
) {
    unsafe {
        if strides[0] != strides[1] {
            load::<T, D, ROWS, SPLIT>(dst[0], src[0], strides[0], limit, d);
            load::<T, D, ROWS, SPLIT>(dst[1], src[1], strides[1], limit, d);
        } else if SPLIT == 1 {
            load_tile_pair::<T, Layout<D>, D, ROWS, { MMA_WARPS as usize * 32 }>(dst, src, strides[0], limit, d)
        } else {
            load_tile_pair::<T, Layout<D>, D, ROWS, { 2 * MMA_WARPS as usize * 32 }>(dst, src, strides[0], limit, d)
        }
    }
}

/// The dQ kernel for one tile `C` (`tile::mma_bwd_tile`; its const parameters are the tile's
/// fields and counts, checked against it at compile time): D = 16 DK SPLIT = 8 DN SPLIT (DK, DN: per warp, SPLIT warps
/// share each 16 query rows, `slice_and_half`), Bc = BC = 8 NS keys per K/V tile; QREG
/// keeps the warp's Q and dO fragments in registers (else they are re-read from shared memory
/// at every key tile); causal or not at run time. Also writes m_i, 1 / l_i, D_i to the workspace.
///
/// # Safety
/// `p` valid (host-checked), `p.pb.head_dim <= D`, 128 SPLIT threads, `mma_bwd_tile(D).dq_smem_bytes()`
/// bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn dq<
    T: MmaElement,
    C: Config<Tile = MmaBwdTile>,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const BC: usize,
    const NS: usize,
    const QREG: bool,
    const STATS_ONLY: bool,
    const SPLIT: usize,
    const ENTRY: u8,
>(
    p: &BwdParams,
) {
    const {
        let t = C::TILE;
        assert!(D == t.head_dim as usize && SPLIT == t.split as usize && DK * 16 * SPLIT == D && DN * 8 * SPLIT == D);
        assert!(BC == t.dq_bc as usize && NS * 8 == BC && QREG == t.dq_q_in_regs);
    }
    // The statistics' index is `stat_at_equal_lengths`: no variable-length entry.
    const { assert!(ENTRY != crate::ENTRY_VARLEN) };
    unsafe {
        with_window_mask!(p: T, QueryRows / MmaBwdTile::ROWS, ENTRY, M => dq_masked::<T, M, D, DK, DN, BC, NS, QREG, STATS_ONLY, SPLIT>(p))
    }
}

#[inline(always)]
unsafe fn dq_masked<
    T: MmaElement,
    M: Mask,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const BC: usize,
    const NS: usize,
    const QREG: bool,
    const STATS_ONLY: bool,
    const SPLIT: usize,
>(
    p: &BwdParams,
) {
    let br = BLOCK_ROWS;
    // Head dims that are multiples of 8 only (`registry::BwdFamilyDesc::aligned_only`).
    let d = p.pb.head_dim;
    if d > D as u32 || !d.is_multiple_of(8) || block::dim() != MMA_WARPS * 32 * SPLIT as u32 {
        thread::trap();
    }
    let BlockInfo { blk: q_blk, h, b } = BlockInfo::rows_per_head::<M>(p.pb.seqlen_q.div_ceil(br as u32));
    let (wb, lane) = (warp::id() as usize, warp::lane() as usize);
    // Warp: its 16 query rows (slice w) and its half hf of D's columns.
    let (w, hf) = slice_and_half::<SPLIT>(wb);
    let (g, t) = (lane / 4, lane % 4);
    let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
    let hk = h / (p.pb.heads_q / p.pb.heads_kv);
    let row0 = q_blk * br as u32;

    // Shared memory: Q, dO [br][D], then K stages 0 and 1, V stages 0 and 1 ([BC][D] each).
    let rs = Layout::<D>::STRIDE;
    let smem: Shared<T> = unsafe { dev::dynamic_shared((2 * br + 4 * BC) * rs) };
    let q_s = smem.slice(0, br * rs);
    let do_s = smem.slice(br * rs, br * rs);
    let k_s = |stage: usize| smem.slice((2 * br + stage * BC) * rs, BC * rs);
    let v_s = |stage: usize| smem.slice((2 * br + (2 + stage) * BC) * rs, BC * rs);
    // With SPLIT: the warps' partial S and dP ([16][BC] f32 each per warp).
    let xs: Shared<f32> = smem.after(exchange_floats(SPLIT, BC));

    let (q_g, do_g) = unsafe {
        ((p.q as *const T).add(p.q_strides.offset(b, 0, h) as usize), (p.d_o as *const T).add(p.do_strides.offset(b, 0, h) as usize))
    };
    let (k_g, v_g) = unsafe {
        ((p.k as *const T).add(p.k_strides.offset(b, 0, hk) as usize), (p.v as *const T).add(p.v_strides.offset(b, 0, hk) as usize))
    };
    let r0 = row0.min(sq) as u64;

    // Key tiles first..end (a window's left edge first), masked from n_unmasked on (with a
    // window, outside from..n_unmasked: `mask::kv_unmasked`); n_tiles of them.
    let row_end = (row0 + br as u32).min(sq);
    let (end, first, n_unmasked) = kv_tiles::<M>(&p.pb, row0, row_end, BC as u32);
    let (from, n_unmasked) = match M::WINDOW {
        true => kv_unmasked::<M>(&p.pb, row0, row_end, BC as u32),
        false => (first, n_unmasked),
    };
    let n_tiles = end - first;

    // Block: Q_i, dO_i and the first K, V tile in flight.
    unsafe {
        load::<T, D, BLOCK_ROWS, SPLIT>(q_s, q_g.add((r0 * p.q_strides.row) as usize), p.q_strides.row, sq - row0.min(sq), d);
        load::<T, D, BLOCK_ROWS, SPLIT>(do_s, do_g.add((r0 * p.do_strides.row) as usize), p.do_strides.row, sq - row0.min(sq), d);
        if n_tiles > 0 {
            let c1 = (first * BC) as u32;
            let (k1, v1) = (k_g.add((c1 as u64 * p.k_strides.row) as usize), v_g.add((c1 as u64 * p.v_strides.row) as usize));
            load::<T, D, BC, SPLIT>(k_s(0), k1, p.k_strides.row, sk - c1, d);
            load::<T, D, BC, SPLIT>(v_s(0), v1, p.v_strides.row, sk - c1, d);
        }
    }
    thread::cp_async_commit();

    let mut acc_dq = [[0f32; 4]; DN];
    let mut q_frag = [[0u32; 4]; DK];
    let mut do_frag = [[0u32; 4]; DK];
    // Rows g and g + 8 of the warp's m16 tile: running statistics (pass 0), then the final
    // m_i, 1 / l_i, D_i (pass 1).
    let mut rows = [QuadRow::INIT; 2];
    let mut fin = [(f32::INFINITY, 0f32, 0f32); 2];
    // A fragments (rows of a 16-row block, chunk pairs) and transposed B fragments share
    // these addresses; non-transposed B fragments (rows as n) use `b_addr`.
    let a_addr = half_addr(LaneAddr::new::<D>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16), hf, DK);
    let b_addr = half_addr(LaneAddr::new::<D>(lane % 8 + 8 * (lane / 16), (lane / 8) % 2), hf, DK);
    // Lane quad: the rows' final statistics, also to the workspace.
    let publish = |rows: &[QuadRow; 2]| publish_stats(p, (b, h), row0 + (w * 16 + g) as u32, t == 0 && half_now::<SPLIT>() == 0, rows);
    // Two passes over the key tiles, one pipeline: iteration `it` reads tile
    // first + it % n_tiles. STATS_ONLY (the atomic backward's first kernel): pass 0 alone.
    let n_iter = if STATS_ONLY { n_tiles } else { 2 * n_tiles };
    // The head's ALiBi slope (`alibi`; the general entries only).
    let slope = unsafe { Alibi::<M>::load(p.alibi, p.alibi_batch, b, h, &p.pb) }.slope();
    for it in 0..n_iter {
        let j = first + it % n_tiles;
        // Block: prefetch the next iteration's K, V into the other stage while this one is
        // computed.
        if it + 1 < n_iter {
            let c1 = ((first + (it + 1) % n_tiles) * BC) as u32;
            unsafe {
                let (kr, vr) = (p.k_strides.row, p.v_strides.row);
                let src = [k_g.add((c1 as u64 * kr) as usize), v_g.add((c1 as u64 * vr) as usize)];
                load2::<T, D, BC, SPLIT>([k_s((it + 1) % 2), v_s((it + 1) % 2)], src, [kr, vr], sk - c1, d);
            }
            thread::cp_async_commit();
            thread::cp_async_wait::<1>();
        } else {
            thread::cp_async_wait::<0>();
        }
        block::sync();
        if QREG && it == 0 {
            // Warp: Q_i and dO_i fragments of its 16 rows, kept for both passes.
            for kk in 0..DK {
                q_frag[kk] = warp::ldmatrix_x4(q_s, a_addr.at::<D>(w, kk));
                do_frag[kk] = warp::ldmatrix_x4(do_s, a_addr.at::<D>(w, kk));
            }
        }
        if !STATS_ONLY && it == n_tiles {
            fin = publish(&rows);
        }
        let ctx = DqStep::<T, D, DK, QREG, SPLIT> {
            p,
            x: xs,
            q: q_s,
            d_o: do_s,
            w,
            k: k_s(it % 2),
            v: v_s(it % 2),
            q_frag: &q_frag,
            do_frag: &do_frag,
            a_addr,
            b_addr,
            row0: row0 + (w * 16) as u32,
            g,
            t,
            slope,
        };
        match (STATS_ONLY || it < n_tiles, j < n_unmasked && !(M::WINDOW && j < from)) {
            (true, true) => ctx.stats::<M, false, BC, NS>(j, &mut rows),
            (true, false) => ctx.stats::<M, true, BC, NS>(j, &mut rows),
            (false, true) => ctx.step::<M, false, DN, BC, NS>(j, &fin, &mut acc_dq),
            (false, false) => ctx.step::<M, true, DN, BC, NS>(j, &fin, &mut acc_dq),
        }
        // Everyone is done with stage it % 2 before iteration it + 1 refills it.
        block::sync();
    }
    if n_tiles == 0 {
        thread::cp_async_wait::<0>();
        publish(&rows);
    } else if STATS_ONLY {
        publish(&rows);
    }

    // Warp: dQ_i = scale * acc, rows of its m16 tile and columns of its half, in T.
    if !STATS_ONLY {
        let c0 = half_now::<SPLIT>() * DN * 8;
        let dq_g = unsafe { (p.dq as *mut T).add(p.dq_strides.offset(b, 0, h) as usize + c0) };
        unsafe { store_rows::<T, DN, false>(&acc_dq, p.pb.scale, dq_g, p.dq_strides.row, row0 + (w * 16) as u32, sq, d - c0 as u32) };
    }
}

/// What one key tile of the dQ kernel reads, per warp.
struct DqStep<'a, T: Copy, const D: usize, const DK: usize, const QREG: bool, const SPLIT: usize> {
    p: &'a BwdParams,
    /// With SPLIT: the S / dP exchange ([`pair_sum`]).
    x: Shared<f32>,
    /// Q_i, dO_i tiles and the warp (for re-reading fragments when not QREG).
    q: Shared<T>,
    d_o: Shared<T>,
    w: usize,
    k: Shared<T>,
    v: Shared<T>,
    q_frag: &'a [[u32; 4]; DK],
    do_frag: &'a [[u32; 4]; DK],
    a_addr: LaneAddr,
    b_addr: LaneAddr,
    /// First query row of this warp.
    row0: u32,
    g: usize,
    t: usize,
    /// The head's ALiBi slope (`alibi`; 0: none).
    slope: f32,
}

impl<T: MmaElement, const D: usize, const DK: usize, const QREG: bool, const SPLIT: usize> DqStep<'_, T, D, DK, QREG, SPLIT> {
    /// Warp: S_ij = Q_i K_j^T times scale log2(e), or with a softcap t_ij = tanh(S_ij k)
    /// (in (-1, 1): the caller takes it to the log2 domain, [`Self::capped`]) (-inf where
    /// masked, with MASKED) and dP_ij = dO_i V_j^T for key tile `j`, as NS m16n8 C fragments
    /// each; k over D (over the warp's half of D, then the pair's halves summed, with SPLIT).
    #[inline(always)]
    fn scores<M: Mask, const MASKED: bool, const BC: usize, const NS: usize>(&self, j: usize) -> ([[f32; 4]; NS], [[f32; 4]; NS]) {
        let p = self.p;
        let (g, t) = (self.g, self.t);
        let c0 = (j * BC) as u32;
        // With a softcap: tanh(S k) (`softcap`), left for the caller to scale.
        let sc = Softcap::<M>::new(&p.pb);
        let factor = if sc.on() { 1.0 } else { crate::softmax::score_scale(p.pb.scale) * LOG2_E };
        let mut s = [[0f32; 4]; NS];
        let mut dp = [[0f32; 4]; NS];
        for kk in 0..DK {
            let qf = if QREG { self.q_frag[kk] } else { warp::ldmatrix_x4(self.q, self.a_addr.at::<D>(self.w, kk)) };
            let of = if QREG { self.do_frag[kk] } else { warp::ldmatrix_x4(self.d_o, self.a_addr.at::<D>(self.w, kk)) };
            for np in 0..NS / 2 {
                let kb = warp::ldmatrix_x4(self.k, self.b_addr.at::<D>(np, kk));
                s[2 * np] = T::mma(qf, [kb[0], kb[1]], s[2 * np]);
                s[2 * np + 1] = T::mma(qf, [kb[2], kb[3]], s[2 * np + 1]);
                let vb = warp::ldmatrix_x4(self.v, self.b_addr.at::<D>(np, kk));
                dp[2 * np] = T::mma(of, [vb[0], vb[1]], dp[2 * np]);
                dp[2 * np + 1] = T::mma(of, [vb[2], vb[3]], dp[2 * np + 1]);
            }
        }
        if SPLIT > 1 {
            pair_sum(self.x, &mut s, &mut dp);
        }
        // A softcap: t = tanh(S k) in place of each raw score, in one uniform branch.
        if sc.on() {
            let kf = sc.opaque_k(p.pb.scale);
            for x in s.as_flattened_mut() {
                *x = kf.tanh_16(*x);
            }
        }
        // The window's bounds fresh each tile (`Window::opaque`).
        let win = Window::<M>::new(&p.pb).opaque();
        for (n, x) in s.iter_mut().enumerate() {
            for (e, x) in x.iter_mut().enumerate() {
                *x *= factor;
                if MASKED {
                    let row = self.row0 + (g + 8 * (e / 2)) as u32;
                    let col = c0 + (n * 8 + 2 * t + e % 2) as u32;
                    if col >= p.pb.seqlen_k || win.hidden(row, col, p.pb.seqlen_q, p.pb.seqlen_k) {
                        *x = f32::NEG_INFINITY;
                    }
                }
            }
        }
        (s, dp)
    }

    /// A score of [`Self::scores`] in the log2 domain: with a softcap t cap log2(e), else
    /// itself (-inf stays -inf).
    #[inline(always)]
    fn capped<M: Mask>(&self, s: f32) -> f32 {
        let sc = Softcap::<M>::new(&self.p.pb);
        if sc.on() { s * (sc.cap() * LOG2_E) } else { s }
    }

    /// Pass 0, warp: folds key tile `j` into the running statistics of rows g and g + 8.
    #[inline(always)]
    fn stats<M: Mask, const MASKED: bool, const BC: usize, const NS: usize>(&self, j: usize, rows: &mut [QuadRow; 2]) {
        let (mut x, dp) = self.scores::<M, MASKED, BC, NS>(j);
        for x in x.as_flattened_mut() {
            *x = self.capped::<M>(*x);
        }
        // ALiBi, in the log2 domain (`alibi`; a masked -inf stays -inf).
        let al = Alibi::<M>::new(self.slope, &self.p.pb).log2();
        if al.on() {
            al.frag::<NS>(&mut x, 1.0, (j * BC) as u32, self.row0, (self.g, self.t));
        }
        for (half, row) in rows.iter_mut().enumerate() {
            row.push::<MASKED, NS>(
                core::array::from_fn::<_, NS, _>(|n| [x[n][2 * half], x[n][2 * half + 1]]),
                core::array::from_fn(|n| [dp[n][2 * half], dp[n][2 * half + 1]]),
            );
        }
    }

    /// Pass 1, warp: dQ_i += dS_ij K_j for key tile `j`, with the rows' final (m_i, 1 / l_i,
    /// D_i) in `fin`.
    #[inline(always)]
    fn step<M: Mask, const MASKED: bool, const DN: usize, const BC: usize, const NS: usize>(
        &self,
        j: usize,
        fin: &[(f32, f32, f32); 2],
        acc_dq: &mut [[f32; 4]; DN],
    ) {
        let (mut s, dp) = self.scores::<M, MASKED, BC, NS>(j);
        // With a softcap, dS takes tanh's derivative 1 - t^2 of the scores' t itself (from
        // the score in the log2 domain divided back, 1 - t^2 took that quotient's rounding:
        // about 1e-7 where t = 1 and the derivative is 0).
        let sc = Softcap::<M>::new(&self.p.pb);
        // ALiBi's bias in the log2 domain (`alibi`), from the offset of the lane's first
        // column in each row.
        let al = Alibi::<M>::new(self.slope, &self.p.pb).log2();
        let c0 = (j * BC + 2 * self.t) as u32;
        let base = [al.offset(self.row0 + self.g as u32, c0), al.offset(self.row0 + self.g as u32 + 8, c0)];
        // P_ij = exp2(S_ij - m_i) / l_i (0 where the row sees no key), then dS_ij = P_ij
        // (dP_ij - D_i), in place of S; 0 where masked, whatever the row's statistics and dP.
        for n in 0..NS {
            for e in 0..4 {
                let (m, inv_l, dd) = fin[e / 2];
                let hidden = MASKED && s[n][e] == f32::NEG_INFINITY;
                let dt = if sc.on() { dtanh(s[n][e]) } else { 1.0 };
                let x = self.capped::<M>(s[n][e]);
                let x = if al.on() { x + al.at(base[e / 2], (8 * n + e % 2) as f32) } else { x };
                s[n][e] = if hidden { 0.0 } else { math::ex2(x - m) * inv_l * (dp[n][e] - dd) * dt };
            }
        }

        // dQ_i += dS_ij K_j: dS's C fragments are the A fragments; K is the B operand with
        // keys as the reduction dimension (ldmatrix .trans, as the forward reads V). On masked
        // tiles K's NaNs and infinities are taken as 0: a masked key's dS is 0, and a visible
        // one's is NaN already (its score was: `nonfinite`).
        for kc in 0..NS / 2 {
            let a = to_a::<T>(s[2 * kc], s[2 * kc + 1]);
            for dn in 0..DN / 2 {
                let kb = warp::ldmatrix_x4_trans(self.k, self.a_addr.at::<D>(kc, dn));
                let kb = if MASKED { finite_frag::<T>(kb).0 } else { kb };
                acc_dq[2 * dn] = T::mma(a, [kb[0], kb[1]], acc_dq[2 * dn]);
                acc_dq[2 * dn + 1] = T::mma(a, [kb[2], kb[3]], acc_dq[2 * dn + 1]);
            }
        }
    }
}

/// The dK/dV kernel for one tile `C` (`tile::mma_bwd_tile`, with DQ `mma_bwd_tile_atomic`;
/// const parameters checked against it as for [`dq`]): D = 16 DK SPLIT = 8 DN SPLIT (DK, DN: per warp, SPLIT warps
/// share each 16 keys, `slice_and_half`), query tiles of BR = 8 NQ rows; KVREG keeps
/// the warp's K and V fragments in registers (else they are re-read from shared memory at
/// every query tile). Causal or not at run time. Reads m_i, 1 / l_i, D_i from the dQ
/// kernel's workspace.
///
/// # Safety
/// `p` valid (host-checked), `p.pb.head_dim <= D`, 128 SPLIT threads,
/// `mma_bwd_tile(D).dkdv_smem_bytes()` (with DQ: `dkdvq_smem_bytes()`) bytes of dynamic shared
/// memory; the dQ kernel (with DQ: the statistics kernel) has run, and with DQ `p.dq_accum` is
/// zeroed.
#[inline(always)]
pub unsafe fn dkdv<
    T: MmaElement,
    C: Config<Tile = MmaBwdTile>,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const BR: usize,
    const NQ: usize,
    const KVREG: bool,
    const DQ: bool,
    const SPLIT: usize,
    const ENTRY: u8,
>(
    p: &BwdParams,
) {
    const {
        let t = C::TILE;
        assert!(D == t.head_dim as usize && SPLIT == t.split as usize && DK * 16 * SPLIT == D && DN * 8 * SPLIT == D);
        assert!(BR == t.kv_br as usize && NQ * 8 == BR && KVREG == t.kv_in_regs);
    }
    // The statistics' index is `stat_at_equal_lengths`: no variable-length entry.
    const { assert!(ENTRY != crate::ENTRY_VARLEN) };
    unsafe { with_window_mask!(p: T, Keys / MmaBwdTile::ROWS, ENTRY, M => dkdv_masked::<T, M, D, DK, DN, BR, NQ, KVREG, DQ, SPLIT>(p)) }
}

#[inline(always)]
unsafe fn dkdv_masked<
    T: MmaElement,
    M: Mask,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const BR: usize,
    const NQ: usize,
    const KVREG: bool,
    const DQ: bool,
    const SPLIT: usize,
>(
    p: &BwdParams,
) {
    // The atomic dQ product is not split.
    const { assert!(SPLIT == 1 || !DQ) };
    let bc = BLOCK_ROWS;
    // Head dims that are multiples of 8 only (`registry::BwdFamilyDesc::aligned_only`).
    let d = p.pb.head_dim;
    if d > D as u32 || !d.is_multiple_of(8) || block::dim() != MMA_WARPS * 32 * SPLIT as u32 {
        thread::trap();
    }
    let BlockInfo { blk: kv_blk, h: hk, b } = BlockInfo::keys_per_head();
    let (wb, lane) = (warp::id() as usize, warp::lane() as usize);
    // Warp: its 16 keys (slice w) and its half hf of D's columns.
    let (w, hf) = slice_and_half::<SPLIT>(wb);
    let (g, t) = (lane / 4, lane % 4);
    let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
    let j0 = kv_blk * bc as u32;

    // Shared memory: K, V [bc][D]; Q stages 0, 1 and dO stages 0, 1 ([BR][D] each); then f32
    // m_i, 1 / l_i and D_i, stages 0, 1 each ([BR]).
    let rs = Layout::<D>::STRIDE;
    let smem: Shared<T> = unsafe { dev::dynamic_shared((2 * bc + 4 * BR) * rs) };
    let k_s = smem.slice(0, bc * rs);
    let v_s = smem.slice(bc * rs, bc * rs);
    let q_s = |stage: usize| smem.slice((2 * bc + stage * BR) * rs, BR * rs);
    let do_s = |stage: usize| smem.slice((2 * bc + (2 + stage) * BR) * rs, BR * rs);
    let f_s: Shared<f32> = smem.after(6 * BR);
    let m_s = |stage: usize| f_s.slice(stage * BR, BR);
    let il_s = |stage: usize| f_s.slice((2 + stage) * BR, BR);
    let dd_s = |stage: usize| f_s.slice((4 + stage) * BR, BR);
    // With DQ: dS of the current query tile, [BR][bc] 16-bit, swizzled as a Layout<64> tile.
    let ds_s: Shared<u16> = f_s.after(if DQ { BR * BLOCK_ROWS } else { 0 });
    // With SPLIT (never with DQ): the warps' partial S^T and dP^T ([16][BR] f32 each per warp).
    let xs: Shared<f32> = f_s.after(exchange_floats(SPLIT, BR));

    let first = j0.min(sk);
    unsafe {
        let (k_g, v_g) = (
            (p.k as *const T).add(p.k_strides.offset(b, first, hk) as usize),
            (p.v as *const T).add(p.v_strides.offset(b, first, hk) as usize),
        );
        load::<T, D, BLOCK_ROWS, SPLIT>(k_s, k_g, p.k_strides.row, sk - first, d);
        load::<T, D, BLOCK_ROWS, SPLIT>(v_s, v_g, p.v_strides.row, sk - first, d);
    }

    // The query tiles that see any key of this block (`mask::q_tiles`; bottom-right causal:
    // from row j0 - (sk - sq) on), for every query head of the group.
    let (qt_first, n_qt) = match M::WINDOW {
        true => q_tiles::<M>(&p.pb, j0, bc as u32, BR as u32),
        // The same tiles, written out: through `q_tiles` ptxas numbered two registers the
        // other way round and the atomic kernel at d = 64 (255 registers) spilled 8 bytes.
        false => {
            let qt_first = (M::first_visible_row(j0, sq, sk) / BR as u32) as usize;
            (qt_first, (sq.div_ceil(BR as u32) as usize).saturating_sub(qt_first))
        }
    };
    let group = (p.pb.heads_q / p.pb.heads_kv) as usize;
    let n_iter = group * n_qt;
    // Iteration it: query head and first row of its tile.
    let tile_of = |it: usize| ((hk as usize * group + it / n_qt) as u32, ((qt_first + it % n_qt) * BR) as u32);

    // Block: Q_i, dO_i (cp.async) and m_i, 1 / l_i, D_i (plain loads) of iteration `it` into
    // stage `stage`; rows past seqlen_q get Q = dO = 0 and (+inf, 0, 0), so P = 0.
    let fetch = |it: usize, stage: usize| {
        let (h, i0) = tile_of(it);
        let (q_at, do_at) = (p.q_strides.offset(b, i0, h) as usize, p.do_strides.offset(b, i0, h) as usize);
        unsafe {
            let src = [(p.q as *const T).add(q_at), (p.d_o as *const T).add(do_at)];
            load2::<T, D, BR, SPLIT>([q_s(stage), do_s(stage)], src, [p.q_strides.row, p.do_strides.row], sq - i0, d);
        }
        let tid = thread::idx() as usize;
        if tid < BR {
            let r = i0 + tid as u32;
            let valid = r < sq;
            let ld = |k: usize, dflt: f32| {
                if valid { unsafe { global::load((p.stats as *const f32).add(p.stat_at_equal_lengths(k, b, h, r))) } } else { dflt }
            };
            m_s(stage).st(tid, ld(0, f32::INFINITY));
            il_s(stage).st(tid, ld(1, 0.0));
            dd_s(stage).st(tid, ld(2, 0.0));
        }
    };
    if n_iter > 0 {
        fetch(0, 0);
    }
    thread::cp_async_commit();

    let mut acc_dk = [[0f32; 4]; DN];
    let mut acc_dv = [[0f32; 4]; DN];
    let mut k_frag = [[0u32; 4]; DK];
    let mut v_frag = [[0u32; 4]; DK];
    let a_addr = half_addr(LaneAddr::new::<D>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16), hf, DK);
    let b_addr = half_addr(LaneAddr::new::<D>(lane % 8 + 8 * (lane / 16), (lane / 8) % 2), hf, DK);
    for it in 0..n_iter {
        // Block: prefetch the next query tile into the other stage while this one is computed.
        if it + 1 < n_iter {
            fetch(it + 1, (it + 1) % 2);
            thread::cp_async_commit();
            thread::cp_async_wait::<1>();
        } else {
            thread::cp_async_wait::<0>();
        }
        block::sync();
        if KVREG && it == 0 {
            // Warp: K_j and V_j fragments of its 16 keys, kept for the whole loop.
            for kk in 0..DK {
                k_frag[kk] = warp::ldmatrix_x4(k_s, a_addr.at::<D>(w, kk));
                v_frag[kk] = warp::ldmatrix_x4(v_s, a_addr.at::<D>(w, kk));
            }
        }
        let (h, i0) = tile_of(it);
        let ctx = KvStep::<T, D, DK, KVREG, SPLIT> {
            p,
            x: xs,
            k: k_s,
            v: v_s,
            q: q_s(it % 2),
            d_o: do_s(it % 2),
            m_row: m_s(it % 2),
            il_row: il_s(it % 2),
            d_row: dd_s(it % 2),
            k_frag: &k_frag,
            v_frag: &v_frag,
            a_addr,
            b_addr,
            w,
            key0: j0 + (w * 16) as u32,
            i0,
            g,
            t,
            ds: ds_s,
            b,
            h,
        };
        // Masked tiles: those a window's edge crosses, the diagonal, the tile past seqlen_q,
        // with DQ the block past seqlen_k.
        const { assert!(BLOCK_ROWS == 64) };
        let masked = dkdv_tile_masked::<M>(i0, BR as u32, j0, sq, sk, DQ, Window::<M>::new(&p.pb).opaque());
        if masked {
            ctx.step::<M, true, DN, BR, NQ, DQ>(&mut acc_dk, &mut acc_dv);
        } else {
            ctx.step::<M, false, DN, BR, NQ, DQ>(&mut acc_dk, &mut acc_dv);
        }
        if DQ {
            // Block: every warp's slice of dS is in shared memory; then dQ_i += dS_ij K_j.
            block::sync();
            let (h, _) = tile_of(it);
            let base = (b as u64 * p.pb.heads_q as u64 + h as u64) * sq as u64 * d as u64;
            ctx.dq_atomic::<BR>(unsafe { (p.dq_accum as *mut f32).add(base as usize) });
        }
        // Everyone is done with stage it % 2 before iteration it + 1 refills it.
        block::sync();
    }
    if n_iter == 0 {
        thread::cp_async_wait::<0>();
    }

    store_dk_dv::<T, DN, SPLIT>(p, (b, hk, sk, d), j0 + (w * 16) as u32, &acc_dk, &acc_dv);
}

/// Warp: dK_j = scale * acc_dk, dV_j = acc_dv, rows key0.. (its 16 keys) and columns of its
/// half, in T, of batch `b`, KV head `hk`; keys below `sk`, columns below `d`.
#[inline(always)]
fn store_dk_dv<T: MmaElement, const DN: usize, const SPLIT: usize>(
    p: &BwdParams,
    (b, hk, sk, d): (u32, u32, u32, u32),
    key0: u32,
    acc_dk: &[[f32; 4]; DN],
    acc_dv: &[[f32; 4]; DN],
) {
    let c0 = half_now::<SPLIT>() * DN * 8;
    unsafe {
        let (dk_g, dv_g) = (
            (p.dk as *mut T).add(p.dk_strides.offset(b, 0, hk) as usize + c0),
            (p.dv as *mut T).add(p.dv_strides.offset(b, 0, hk) as usize + c0),
        );
        store_rows::<T, DN, false>(acc_dk, p.pb.scale, dk_g, p.dk_strides.row, key0, sk, d - c0 as u32);
        store_rows::<T, DN, false>(acc_dv, 1.0, dv_g, p.dv_strides.row, key0, sk, d - c0 as u32);
    }
}

/// Lane quad (the writers: `write`), rows r0 and r0 + 8 of head `h`, batch `b`: their final
/// statistics (m_i, 1 / l_i, D_i) from the running ones, also to the workspace for the dK/dV
/// kernel (every row below seqlen_q, fully masked ones too).
#[inline(always)]
fn publish_stats(p: &BwdParams, (b, h): (u32, u32), r0: u32, write: bool, rows: &[QuadRow; 2]) -> [(f32, f32, f32); 2] {
    // The head's attention sink, in the log2 domain of the statistics (-inf: none).
    let sink2 = unsafe { sinks::of_head(p.sinks, h) } * LOG2_E;
    let fin = [rows[0].finish(sink2), rows[1].finish(sink2)];
    for (half, f) in fin.iter().enumerate() {
        let r = r0 + (8 * half) as u32;
        if write && r < p.pb.seqlen_q {
            let st = p.stats as *mut f32;
            unsafe {
                global::store(st.add(p.stat_at_equal_lengths(0, b, h, r)), f.0);
                global::store(st.add(p.stat_at_equal_lengths(1, b, h, r)), f.1);
                global::store(st.add(p.stat_at_equal_lengths(2, b, h, r)), f.2);
            }
        }
    }
    fin
}

/// What one query tile of the dK/dV kernel reads, per warp.
struct KvStep<'a, T: Copy, const D: usize, const DK: usize, const KVREG: bool, const SPLIT: usize> {
    p: &'a BwdParams,
    /// With SPLIT: the S^T / dP^T exchange ([`pair_sum`]).
    x: Shared<f32>,
    k: Shared<T>,
    v: Shared<T>,
    q: Shared<T>,
    d_o: Shared<T>,
    /// m_i, 1 / l_i and D_i of the tile's query rows.
    m_row: Shared<f32>,
    il_row: Shared<f32>,
    d_row: Shared<f32>,
    k_frag: &'a [[u32; 4]; DK],
    v_frag: &'a [[u32; 4]; DK],
    a_addr: LaneAddr,
    b_addr: LaneAddr,
    w: usize,
    /// First key of this warp and first query row of the tile.
    key0: u32,
    i0: u32,
    g: usize,
    t: usize,
    /// dS of the tile, [BR][64] as a `Layout<64>` tile (only with DQ).
    ds: Shared<u16>,
    /// Batch and query head of the tile.
    b: u32,
    h: u32,
}

impl<T: MmaElement, const D: usize, const DK: usize, const KVREG: bool, const SPLIT: usize> KvStep<'_, T, D, DK, KVREG, SPLIT> {
    /// Warp: dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i for this query tile; MASKED applies
    /// the causal mask.
    #[inline(always)]
    fn step<M: Mask, const MASKED: bool, const DN: usize, const BR: usize, const NQ: usize, const DQ: bool>(
        &self,
        acc_dk: &mut [[f32; 4]; DN],
        acc_dv: &mut [[f32; 4]; DN],
    ) {
        let p = self.p;
        let (g, t) = (self.g, self.t);
        // With a softcap: the score tanh(S k) times cap log2(e), dS times 1 - tanh^2.
        let sc = Softcap::<M>::new(&p.pb);
        let factor = if sc.on() { sc.cap() * LOG2_E } else { crate::softmax::score_scale(p.pb.scale) * LOG2_E };

        // S^T = K_j Q_i^T and dP^T = V_j dO_i^T (keys x queries): NQ n-tiles of m16n8, k over D
        // (over the warp's half of D, then the pair's halves summed, with SPLIT).
        let mut s = [[0f32; 4]; NQ];
        let mut dp = [[0f32; 4]; NQ];
        for kk in 0..DK {
            let kf = if KVREG { self.k_frag[kk] } else { warp::ldmatrix_x4(self.k, self.a_addr.at::<D>(self.w, kk)) };
            let vf = if KVREG { self.v_frag[kk] } else { warp::ldmatrix_x4(self.v, self.a_addr.at::<D>(self.w, kk)) };
            for np in 0..NQ / 2 {
                let qb = warp::ldmatrix_x4(self.q, self.b_addr.at::<D>(np, kk));
                s[2 * np] = T::mma(kf, [qb[0], qb[1]], s[2 * np]);
                s[2 * np + 1] = T::mma(kf, [qb[2], qb[3]], s[2 * np + 1]);
                let ob = warp::ldmatrix_x4(self.d_o, self.b_addr.at::<D>(np, kk));
                dp[2 * np] = T::mma(vf, [ob[0], ob[1]], dp[2 * np]);
                dp[2 * np + 1] = T::mma(vf, [ob[2], ob[3]], dp[2 * np + 1]);
            }
        }
        if SPLIT > 1 {
            pair_sum(self.x, &mut s, &mut dp);
        }
        // A softcap: t = tanh(S k) in place of each raw score: here in one uniform branch with
        // the pair's split, else in the loop below (each where ptxas fits the kernel in 255
        // registers on sm_90: d = 256 and 128 respectively, spilling in the other).
        let kf = sc.k(p.pb.scale);
        if SPLIT > 1 && sc.on() {
            for x in s.as_flattened_mut() {
                *x = kf.tanh_16(*x);
            }
        }

        // P^T = exp2(S^T scale log2(e) - m) / l per query column (0 where masked or where the
        // row sees no key); dS^T = P^T (dP^T - D) per query column, in place of dP^T. The
        // window's bounds fresh each tile (`Window::opaque`).
        let win = Window::<M>::new(&p.pb).opaque();
        // ALiBi (`alibi`): the scores in the log2 domain with their bias, in place, before the
        // loop (factor 1 in it). Not with a softcap, whose dS needs tanh's value beside the
        // biased score: the host runs that combination on `simt`
        // (`BwdFamilyDesc::alibi_softcap`). (Biased inside the loop, the d = 64 entry spilled
        // 16 to 104 bytes on sm_80.)
        let al = unsafe { Alibi::<M>::load(p.alibi, p.alibi_batch, self.b, self.h, &p.pb) }.log2();
        if al.on() {
            if sc.on() {
                thread::trap();
            }
            for (n, x) in s.iter_mut().enumerate() {
                let c = n * 8 + 2 * t;
                for (e, x) in x.iter_mut().enumerate() {
                    let (key, query) = (self.key0 + (g + 8 * (e / 2)) as u32, self.i0 + (c + e % 2) as u32);
                    *x = *x * factor + al.bias(query, key);
                }
            }
        }
        let factor = if al.on() { 1.0 } else { factor };
        for n in 0..NQ {
            let c = n * 8 + 2 * t;
            let stat = |i: usize| (self.m_row.ld(i), self.il_row.ld(i), self.d_row.ld(i));
            let cols = [stat(c), stat(c + 1)];
            for e in 0..4 {
                let (m, inv_l, dd) = cols[e % 2];
                let key = self.key0 + (g + 8 * (e / 2)) as u32;
                let query = self.i0 + (c + e % 2) as u32;
                let hidden = MASKED
                    && (query >= p.pb.seqlen_q || (DQ && key >= p.pb.seqlen_k) || win.hidden(query, key, p.pb.seqlen_q, p.pb.seqlen_k));
                // 0 where masked, whatever the row's statistics and dP hold.
                // A softcap: t = tanh(S k) in place of the raw score, dS times 1 - t^2.
                let x = if SPLIT == 1 && sc.on() { kf.tanh_16(s[n][e]) } else { s[n][e] };
                let dt = if sc.on() { dtanh(x) } else { 1.0 };
                let pe = if hidden { 0.0 } else { math::ex2(x * factor - m) * inv_l };
                s[n][e] = pe;
                dp[n][e] = if hidden { 0.0 } else { pe * (dp[n][e] - dd) * dt };
            }
        }

        // With DQ, thread: dS (rounded to T, as the mma sees it) into shared memory, transposed
        // to [query][key] for the block's dQ product. A-fragment register r of k-step kc holds
        // key g + 8 (r % 2), queries 16 kc + 8 (r / 2) + 2 t and + 1 (low, high half).
        if DQ {
            // The lane's part of the indices, rebuilt here each time (`opaque`): hoisted out of
            // the loop as eight live offsets it made ptxas spill at head_dim 128.
            let (gw, t2) = (thread::opaque((self.w * 16 + g) as u64) as usize, 2 * t);
            for kc in 0..NQ / 2 {
                let da = to_a::<T>(dp[2 * kc], dp[2 * kc + 1]);
                for (r, &pk) in da.iter().enumerate() {
                    let key = gw + 8 * (r % 2);
                    let query = 16 * kc + 8 * (r / 2) + t2;
                    self.ds.st(Layout::<64>::at(query, key), pk as u16);
                    self.ds.st(Layout::<64>::at(query + 1, key), (pk >> 16) as u16);
                }
            }
        }

        // dV_j += P^T dO_i and dK_j += dS^T Q_i: P^T and dS^T C fragments are A fragments;
        // dO and Q are B operands with queries as the reduction dimension (ldmatrix .trans).
        // On masked tiles their NaNs and infinities are taken as 0 (`nonfinite`): a masked
        // pair's P and dS are 0; a visible pair's dS is NaN already where Q or dO is (the row's
        // statistics or D are), and dO's are added back to dV after the product.
        let mut bad = false;
        for kc in 0..NQ / 2 {
            let pa = to_a::<T>(s[2 * kc], s[2 * kc + 1]);
            let da = to_a::<T>(dp[2 * kc], dp[2 * kc + 1]);
            for dn in 0..DN / 2 {
                let ob = warp::ldmatrix_x4_trans(self.d_o, self.a_addr.at::<D>(kc, dn));
                let ob = if MASKED {
                    let (f, b) = finite_frag::<T>(ob);
                    bad |= b;
                    f
                } else {
                    ob
                };
                acc_dv[2 * dn] = T::mma(pa, [ob[0], ob[1]], acc_dv[2 * dn]);
                acc_dv[2 * dn + 1] = T::mma(pa, [ob[2], ob[3]], acc_dv[2 * dn + 1]);
                let qb = warp::ldmatrix_x4_trans(self.q, self.a_addr.at::<D>(kc, dn));
                let qb = if MASKED { finite_frag::<T>(qb).0 } else { qb };
                acc_dk[2 * dn] = T::mma(da, [qb[0], qb[1]], acc_dk[2 * dn]);
                acc_dk[2 * dn + 1] = T::mma(da, [qb[2], qb[3]], acc_dk[2 * dn + 1]);
            }
        }
        if MASKED && warp::any(bad) {
            // The warp's fragments cover the whole dO tile: dO_i's NaNs and infinities into dV_j
            // where row i sees key j (rows past seqlen_q were zero-filled).
            // Rebuilt here from opaque indices, not kept live across the loop.
            let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
            let (b, h) = (thread::opaque(self.b as u64) as u32, thread::opaque(self.h as u64) as u32);
            // The warp's columns from c0 on.
            let c0 = (half_now::<SPLIT>() * DN * 8) as u32;
            let do_g = unsafe { (p.d_o as *const T).add((p.do_strides.offset(b, self.i0, h) + c0 as u64) as usize) };
            unsafe {
                add_nonfinite::<T, DN>(
                    acc_dv,
                    BR,
                    p.pb.head_dim - c0,
                    |k| row_at(do_g, p.do_strides.row, sq - self.i0.min(sq), k),
                    |h, k| !Window::<M>::new(&p.pb).hidden(self.i0 + k as u32, self.key0 + (g + 8 * h) as u32, sq, sk),
                )
            };
        }
    }

    /// Warp: its share of dQ_i += dS_ij K_j for this query tile (BR rows, all 64 keys of the
    /// block), added to the f32 accumulator `acc` ([seqlen_q][head_dim] of the tile's query
    /// head) with `red.global.add`. The BR/16 x D/16 units (16 query rows, 16 columns) go to
    /// the warps round robin; a unit's k-loop reads dS (A, ldmatrix) and K (B, keys as the
    /// reduction dimension, ldmatrix .trans) from shared memory.
    #[inline(always)]
    fn dq_atomic<const BR: usize>(&self, acc: *mut f32) {
        let p = self.p;
        // Rebuilt per query tile (`opaque`), not hoisted out of the loop as live registers.
        let acc = thread::opaque(acc as u64) as *mut f32;
        let (g, t, lane) = (self.g, self.t, warp::lane() as usize);
        let ds_addr = LaneAddr::new::<64>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
        let pairs = D / 16;
        for mt in 0..BR / 16 {
            for cp in 0..pairs {
                // A warp-uniform guard on unrolled indices keeps every address an immediate
                // (a guard, not a `continue`: an early exit stops the unroll).
                if (mt * pairs + cp) % MMA_WARPS as usize == self.w {
                    let mut c = [[0f32; 4]; 2];
                    for kc in 0..BLOCK_ROWS / 16 {
                        let a = warp::ldmatrix_x4(self.ds, ds_addr.at::<64>(mt, kc));
                        let kb = warp::ldmatrix_x4_trans(self.k, self.a_addr.at::<D>(kc, cp));
                        // K's NaNs and infinities as 0 (as in the dQ kernel; on every tile:
                        // a branch on `masked` here took d = 96 past 255 registers).
                        let kb = finite_frag::<T>(kb).0;
                        c[0] = T::mma(a, [kb[0], kb[1]], c[0]);
                        c[1] = T::mma(a, [kb[2], kb[3]], c[1]);
                    }
                    for (n, c) in c.iter().enumerate() {
                        for (e, &x) in c.iter().enumerate() {
                            let row = self.i0 + (mt * 16 + g + 8 * (e / 2)) as u32;
                            let col = (cp * 16 + n * 8 + 2 * t + e % 2) as u32;
                            if row < p.pb.seqlen_q && col < p.pb.head_dim {
                                unsafe { global::red_add(acc.add((row as u64 * p.pb.head_dim as u64 + col as u64) as usize), x) };
                            }
                        }
                    }
                }
            }
        }
    }
}
