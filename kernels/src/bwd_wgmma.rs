//! The Hopper backward kernels (sm_90a): FA2's backward on `wgmma.mma_async` with f32
//! accumulation, one warpgroup per block up to head_dim 128; above it two: in [`dkdv`] the
//! first computes S^T and P^T and accumulates dV, the second dP^T and dS^T (P^T from the
//! first through shared memory) and accumulates dK (one accumulator of D columns each), in
//! [`dq`] they split every key tile (see there). Three launches: `bwd_prep` (m_i, 1 / l_i from the
//! forward's LSE, D~_i = dO_i . O_i), then [`dq`], then [`dkdv`]; a fixed summation order
//! (bitwise deterministic):
//! - [`dq`] ([`DQ_SAVED`]): one block per (64 query rows, head, batch), one pass over the key
//!   tiles: S = Q K_j^T and dP = dO V_j^T with both operands from shared memory, P = exp2(S
//!   scale log2 e - m_i) / l_i, dS~ = P (dP - D~_i), dQ~_i += dS~ K_j with dS~ from registers
//!   and K_j read MN-major. Then the exact correction below, and D_i for the dK/dV kernel.
//!   With [`DQ_STATS`] the rows' m_i, l_i, D_i from S and dP instead (the `wgmma_atomic`
//!   family's first kernel, as `bwd_mma::dq`'s pass 0 explains).
//!
//! - [`dkdv`]: one block per (64 keys, KV head, batch); warp w of a warpgroup owns keys
//!   16w..16w + 16 and the block loops over every query tile (BR rows) of every query head of
//!   the KV head's group, as `bwd_mma::dkdv` does, in the transposed orientation (keys as the
//!   M of every product):
//!   - S^T = K Q_i^T and dP^T = V dO_i^T: both operands from shared memory, K-major over d;
//!   - P^T = exp2(S^T scale log2 e - m_i) / l_i and dS^T = P^T (dP^T - D_i) per query column,
//!     from the statistics `bwd_prep` and the dQ kernel (the atomic family: its statistics
//!     kernel, or `bwd_prep` with the residual) wrote to the workspace;
//!   - dV += P^T dO_i and dK += dS^T Q_i: P^T and dS^T from registers (the accumulator
//!     layout, packed to 16 bits, is wgmma's A layout), dO_i and Q_i read MN-major by the
//!     instruction.
//!
//! Why a correction: FA2's D_i = dO_i . O_i from O rounded to T carries an error of about a
//! unit roundoff of |dO_i| |O_i|. Where a row's softmax has few large weights (one dominant
//! key, or few visible keys) that is larger than the true dS of its other keys: the property
//! tests' bar (twice naive attention's error) was missed in about 1 case in 7 with few
//! visible keys. The exact dS_ij = P_ij (dP_ij - D_i) sum to 0 over j (sum_j P_ij = 1); the
//! kernel's dS~_ij = P_ij (dP_ij - D~_i) rounded to T (the product's operand) sum to delta~_i
//! instead, and D~_i + delta_i (delta_i the f32 sum of the unrounded dS~_ij) is D_i to f32
//! rounding. So, per row, exactly in the kernel's own arithmetic:
//! - dQ_i = dQ~_i - (delta~_i / sigma_i) B_i with B_i = sum_j P_ij K_j and sigma_i = sum_j P_ij
//!   (both of P rounded to T, as the product adds them) over the row's *hot* key tiles, those
//!   where some row of the block has a key with P > 1/8. The coefficients of K then sum to 0
//!   as the exact dS do; the keys left out (P <= 1/8 in tiles no row found hot) leave an
//!   error of delta_i times their weight, at most FA2's. Rows whose hot tiles hold less than
//!   half their weight are left uncorrected (FA2's error). B_i is a second pass over the hot
//!   tiles alone (S and P recomputed, then B += P K_j): a row has fewer than 8 keys with P >
//!   1/8, so few tiles (on random inputs of s >= 1k, typically none past the causal
//!   diagonal's first rows); their list is kept in shared memory ([`crate::tile::HOT_TILES`]). delta~_i
//!   comes from the tensor cores (dS~ times a tile of ones, m64n8k16 beside each dQ~ step),
//!   delta_i from the f32 dS~ on the CUDA cores.
//! - The dK/dV kernel's D_i = D~_i + delta_i: in a row saturated to one key (the others'
//!   weights below f32 rounding), D_i rounds to that key's dP_ij exactly and its dS^T to 0,
//!   as naive attention's does.
//!
//! It passes the tests that made this project recompute the statistics instead (its earlier
//! default, 9 products per tile pair), at 7 products plus the hot tiles.
//!
//! Every dK, dV element is summed by one thread in a fixed order: bitwise deterministic.
//! With DQ (the `wgmma_atomic` family, FA2's single kernel) the dK/dV kernel also writes dS^T
//! to shared memory and adds dQ_i = dS_ij K_j (a wgmma with both operands MN-major) to an f32
//! accumulator with `red.global.add.v2.f32` (with two warpgroups the second writes dS^T and
//! each adds alternate 64-column blocks of dQ): not deterministic, and slower on the H200
//! than the separate dQ kernel at every head_dim (`registry::BWD_FAMILIES`).
//! Shared tiles are 128-byte-swizzle canonical layouts ([`Sw`]); a kernel compiled for D
//! serves every head_dim d <= D (PAD): columns d..D are zero-filled and never stored. Query rows past seqlen_q get Q = dO = 0 and (m, 1 / l, D) = (+inf, 0, 0),
//! so their P and dS are 0.

use crate::dev::{self, Shared, block, global, math, thread, warp, warpgroup};
use crate::dtype::MmaElement;
use crate::frag::{store_rows, to_a};

use crate::block_info::BlockInfo;
use crate::copy::{body_head_dim, by_element, load_tile_in};
use crate::mask::Mask;
use crate::nonfinite::{clean_own_pair, dkdv_tile_masked, own_chunks_nonfinite, warp_fix_stored_dv, zero_own_nonfinite};
use crate::params::BwdParams;
use crate::smem::Sw;
use crate::softmax::QuadRow;
use crate::tile::{Config, HOT_TILES, WgmmaBwdTile};
use core::f32::consts::LOG2_E;
use core::marker::PhantomData;

/// Keys per block: one warpgroup's M.
const KEYS: usize = 64;

/// Thread of a block of THREADS: (its warpgroup, its warp in the warpgroup, its lane); with
/// one warpgroup the first is 0 and the second the warp index for the compiler too.
#[inline(always)]
fn wg_warp_lane<const THREADS: usize>() -> (usize, usize, usize) {
    let (wp, lane) = (warp::id() as usize, warp::lane() as usize);
    if THREADS == warpgroup::SIZE as usize { (0, wp, lane) } else { (warpgroup::id() as usize, wp % 4, lane) }
}

/// Entry body for one tile `C` (`tile::wgmma_bwd_tile`; its const parameters are the tile's
/// fields and counts, checked against it at compile time): D = 8 DN, query tiles of
/// BR = 8 NQ = 16 KQ rows, THREADS / 128 warpgroups of NACC accumulators of D columns
/// each (dK and dV, or with two warpgroups dV in the first and dK in the second).
///
/// # Safety
/// `p` valid (host-checked), `p.pb.head_dim <= D`, THREADS threads,
/// `WgmmaBwdTile::dkdv_smem_bytes()` bytes of dynamic shared memory; the dQ kernel has
/// written the statistics; an sm_90a device.
#[inline(always)]
pub unsafe fn dkdv<
    T: MmaElement,
    C: Config<Tile = WgmmaBwdTile>,
    const D: usize,
    const DN: usize,
    const BR: usize,
    const NQ: usize,
    const KQ: usize,
    const THREADS: usize,
    const NACC: usize,
    const PAD: bool,
    const DQ: bool,
>(
    p: &BwdParams,
) {
    const {
        let t = C::TILE;
        assert!(D == t.head_dim as usize && DN * 8 == D && D.is_multiple_of(64) && PAD == t.padded);
        assert!(BR == t.br as usize && NQ * 8 == BR && KQ * 16 == BR);
        // NACC accumulators of D columns a warpgroup: dK and dV, or with two warpgroups
        // one each (the exchange of P^T holds one 64-query tile).
        assert!(THREADS == 128 * t.split as usize && NACC * t.split as usize == 2);
        assert!(THREADS == 128 || BR == 64);
    }
    // With DQ (the atomic family), head dims that are multiples of 8 only
    // (`registry::BwdFamilyDesc::aligned_only`).
    if DQ && by_element(PAD, p.pb.head_dim) {
        thread::trap();
    }
    unsafe {
        with_mask!(p, M => match !DQ && by_element(PAD, p.pb.head_dim) {
            false => dkdv_masked::<T, M, D, DN, BR, NQ, KQ, THREADS, NACC, PAD, DQ, false>(p),
            true => dkdv_masked::<T, M, D, DN, BR, NQ, KQ, THREADS, NACC, PAD, DQ, true>(p),
        })
    }
}

/// Block (one warpgroup, or two: see [`dkdv`]): the dK/dV kernel for one key block. K_j, V_j
/// loaded once; then, per query tile that sees them (double-buffered), the block's
/// non-finite votes and one step ([`DkdvBlock::step`], or [`DkdvBlock::step_split`] with two
/// warpgroups); then dK_j, dV_j stored.
#[inline(always)]
unsafe fn dkdv_masked<
    T: MmaElement,
    M: Mask,
    const D: usize,
    const DN: usize,
    const BR: usize,
    const NQ: usize,
    const KQ: usize,
    const THREADS: usize,
    const NACC: usize,
    const PAD: bool,
    const DQ: bool,
    const EL: bool,
>(
    p: &BwdParams,
) {
    // Without PAD, head_dim is exactly D and the padding checks compile away.
    let d = body_head_dim::<D, EL>(PAD, p.pb.head_dim);
    if p.pb.head_dim > D as u32 || (!PAD && p.pb.head_dim != D as u32) || d == 0 || block::dim() != THREADS as u32 {
        thread::trap();
    }
    let mut kb = DkdvBlock::<T, M, D, DN, BR, NQ, KQ, THREADS, NACC, PAD, DQ, EL>::new(p, d);

    // Block: K_j, V_j (zero rows past seqlen_k: their dK, dV are computed and not stored).
    kb.load_k();
    unsafe {
        load_tile_in::<T, Sw<KEYS, D>, D, KEYS, THREADS, true>(
            kb.v_s,
            (kb.p.v as *const T).add(kb.kv_at + kb.first),
            kb.p.k_strides.row,
            kb.sk - kb.j0.min(kb.sk),
            kb.d,
        );
    }

    // The query tiles that see any key of this block, for every query head of the group
    // (as bwd_mma::dkdv); set here, after K's copy was issued, where the kernel always
    // computed them.
    let i_first = M::first_visible_row(kb.j0, kb.sq, kb.sk);
    kb.qt_first = (i_first / BR as u32) as usize;
    kb.n_qt = (kb.sq.div_ceil(BR as u32) as usize).saturating_sub(kb.qt_first);
    kb.group = (kb.p.pb.heads_q / kb.p.pb.heads_kv) as usize;
    let n_iter = kb.group * kb.n_qt;

    if n_iter > 0 {
        kb.fetch(0, 0);
    }
    thread::cp_async_commit();

    // The warpgroup's accumulators: product wg NACC + k of (dV, dK) in acc[k].
    let mut acc = [[[0f32; 4]; DN]; NACC];
    let (mut k_bad, mut any_bad) = (false, false);
    kb.factor = crate::softmax::score_scale(kb.p.pb.scale) * LOG2_E;
    kb.key0 = kb.j0 + (kb.w * 16) as u32; // first key of this warp

    for it in 0..n_iter {
        // One warpgroup: the prefetch first (the loop's last barrier freed its stage); two:
        // after the barrier below (every thread is done with iteration it - 1 there).
        if !kb.split {
            kb.prefetch(it, n_iter);
        }
        if !kb.split && it + 1 < n_iter {
            thread::cp_async_wait::<1>();
        } else {
            thread::cp_async_wait::<0>();
        }
        let (h, i0) = kb.tile_of(it);
        // Masked tiles: the diagonal, the tile past seqlen_q, with DQ the block past seqlen_k
        // (`nonfinite::dkdv_tile_masked`).
        const { assert!(KEYS == 64) };
        let masked = dkdv_tile_masked::<M>(i0, BR as u32, kb.j0, kb.sq, kb.sk, DQ);
        // This tile's copies (and K, V) landed, for every thread and for the async proxy; on
        // masked tiles Q's and dO's NaNs and infinities replaced by 0 first, and with DQ at
        // the first tile the block votes on K's (`nonfinite`).
        let (mut bad, mut kv) = (false, false);
        if masked {
            bad = clean_own_pair::<T, Sw<BR, D>, D, BR, THREADS>(kb.q_s(it % 2), kb.do_s(it % 2));
        }
        if DQ && it == 0 {
            kv = own_chunks_nonfinite::<T, Sw<KEYS, D>, D, KEYS, THREADS>(kb.k_s);
        }
        thread::fence_proxy_async();
        if DQ && it == 0 {
            // K's vote, once (K stays for the whole loop), then the tile's.
            k_bad = block::sync_any(kv);
            bad = block::sync_any(bad);
        } else if masked {
            bad = block::sync_any(bad);
        } else {
            block::sync();
        }
        if kb.split {
            kb.prefetch(it, n_iter);
            kb.step_split(it % 2, h, i0, masked, k_bad, &mut acc[0]);
        } else {
            let (dv, dk) = acc.split_at_mut(1);
            kb.step(it % 2, h, i0, masked, k_bad, &mut dk[0], &mut dv[0]);
        }
        // dO's NaNs and infinities are added back into dV after the store.
        any_bad |= bad;
        if !kb.split {
            // Everyone is done with stage it % 2 (its wgmma complete) before iteration it + 1
            // refills it.
            block::sync();
        }
    }
    if n_iter == 0 {
        thread::cp_async_wait::<0>();
    }

    // Warp: dV_j = acc_dv, dK_j = scale * acc_dk, rows of its 16 keys, in T.
    let p = kb.p;
    for (k, a) in acc.iter().enumerate() {
        let (dst, factor) = if kb.wg * NACC + k == 0 { (p.dv, 1.0) } else { (p.dk, p.pb.scale) };
        unsafe { store_rows::<T, DN, true>(a, factor, (dst as *mut T).add(kb.kv_at), p.k_strides.row, kb.key0, kb.sk, kb.d) };
    }
    if any_bad {
        // dO's NaNs and infinities, zeroed on the masked tiles, into the stored dV of the rows
        // that see them (`nonfinite`), by the first warpgroup's warps once every column is
        // stored.
        if THREADS > 128 {
            block::sync();
        } else {
            warp::sync();
        }
    }
    if any_bad && kb.wg == 0 {
        let group = p.pb.heads_q / p.pb.heads_kv;
        let d_o = p.d_o + 2 * p.q_strides.offset(kb.b, 0, kb.hk * group);
        let do_strides = (p.q_strides.row << 32) | p.q_strides.offset(0, 0, 1);
        let shape = ((group as u64) << 48) | ((kb.d as u64) << 32) | ((BR as u64) << 16) | DQ as u64;
        // SAFETY: dV rows below seqlen_k, dO rows below seqlen_q of the group's heads.
        unsafe {
            warp_fix_stored_dv::<T, M>(
                p.dv + 2 * kb.kv_at as u64,
                p.k_strides.row,
                d_o,
                do_strides,
                ((kb.key0 as u64) << 32) | kb.j0 as u64,
                ((kb.sq as u64) << 32) | kb.sk as u64,
                shape,
            )
        };
    }
}

/// What the dK/dV kernel's steps read ([`dkdv_masked`]): the block (64 keys, KV head,
/// batch), the thread's place in it, the shared tiles and the query tiles.
///
/// It replaces the helper closures the kernel was written with, and keeps their code: one
/// instance per kernel variant (every const parameter of [`dkdv_masked`]), methods inlined as
/// the closures were (`#[inline(always)]` for the steps, `#[inline]`, LLVM's choice, for the
/// loads), and the kernel reads these values through it once K is in flight. Built otherwise
/// (a plain constructor, everything `#[inline(always)]`), the same source moved ptxas's
/// register counts by up to 23 either way.
struct DkdvBlock<
    'a,
    T: Copy,
    M,
    const D: usize,
    const DN: usize,
    const BR: usize,
    const NQ: usize,
    const KQ: usize,
    const THREADS: usize,
    const NACC: usize,
    const PAD: bool,
    const DQ: bool,
    const EL: bool,
> {
    p: &'a BwdParams,
    /// head_dim as the body sees it (`body_head_dim`).
    d: u32,
    /// KV head and batch of the block.
    hk: u32,
    b: u32,
    /// Warp w of warpgroup wg: keys 16w.. of the block; with two warpgroups, S^T and dV
    /// (wg 0) or dP^T and dK (wg 1). Its lane, and (g, t) in the accumulator layout.
    wg: usize,
    w: usize,
    lane: usize,
    g: usize,
    t: usize,
    sq: u32,
    sk: u32,
    /// First key of the block.
    j0: u32,
    /// Two warpgroups.
    split: bool,
    /// Shared memory: K, V [64][D]; Q stages 0, 1 and dO stages 0, 1 ([BR][D] each); with DQ
    /// dS^T [64][BR], with two warpgroups the P^T exchange ([64][BR] f32); then f32 m_i,
    /// 1 / l_i and D_i, stages 0, 1 each ([BR], from `f_s` on).
    smem: Shared<T>,
    ds_s: Shared<T>,
    pt_s: Shared<T>,
    k_s: Shared<T>,
    v_s: Shared<T>,
    f_s: Shared<f32>,
    /// The KV head's offset in K, V, dK, dV, and the block's first row there.
    kv_at: usize,
    first: usize,
    /// The query tiles that see any key of the block: from tile `qt_first`, `n_qt` per query
    /// head, for the `group` query heads of the KV head.
    qt_first: usize,
    n_qt: usize,
    group: usize,
    /// scale log2(e), and the first key of this warp.
    factor: f32,
    key0: u32,
    mask: PhantomData<M>,
}

impl<
    'a,
    T: MmaElement,
    M: Mask,
    const D: usize,
    const DN: usize,
    const BR: usize,
    const NQ: usize,
    const KQ: usize,
    const THREADS: usize,
    const NACC: usize,
    const PAD: bool,
    const DQ: bool,
    const EL: bool,
> DkdvBlock<'a, T, M, D, DN, BR, NQ, KQ, THREADS, NACC, PAD, DQ, EL>
{
    /// Thread: the block's indices and shared tiles (the query tiles, `factor` and `key0`
    /// are set by [`dkdv_masked`] once K and V are in flight).
    #[inline(always)]
    fn new(p: &'a BwdParams, d: u32) -> Self {
        let BlockInfo { blk: kv_blk, h: hk, b } = BlockInfo::keys_per_head();
        let (wg, w, lane) = wg_warp_lane::<THREADS>();
        let (g, t) = (lane / 4, lane % 4);
        let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
        let j0 = kv_blk * KEYS as u32;
        let split = THREADS > 128;

        // (The dS^T stores below address one 128-byte row of queries per key.)
        const { assert!(!(DQ || THREADS > 128) || BR == 64) };
        let ds_len = if DQ { KEYS * BR } else { 0 };
        let pt_len = if split { 2 * KEYS * BR } else { 0 };
        let smem: Shared<T> = unsafe { dev::dynamic_shared((2 * KEYS + 4 * BR) * D + ds_len + pt_len) };
        let ds_s = smem.slice((2 * KEYS + 4 * BR) * D, ds_len);
        let pt_s = smem.slice((2 * KEYS + 4 * BR) * D + ds_len, pt_len);
        let k_s = smem.slice(0, KEYS * D);
        let v_s = smem.slice(KEYS * D, KEYS * D);
        let f_s: Shared<f32> = smem.after(6 * BR);

        let kv_at = p.k_strides.offset(b, 0, hk) as usize;
        let first = (j0.min(sk) as u64 * p.k_strides.row) as usize;
        DkdvBlock {
            p,
            d,
            hk,
            b,
            wg,
            w,
            lane,
            g,
            t,
            sq,
            sk,
            j0,
            split,
            smem,
            ds_s,
            pt_s,
            k_s,
            v_s,
            f_s,
            kv_at,
            first,
            qt_first: 0,
            n_qt: 0,
            group: 0,
            factor: 0.0,
            key0: 0,
            mask: PhantomData,
        }
    }

    /// Q_i of stage `stage`.
    #[inline]
    fn q_s(&self, stage: usize) -> Shared<T> {
        self.smem.slice((2 * KEYS + stage * BR) * D, BR * D)
    }
    /// dO_i of stage `stage`.
    #[inline]
    fn do_s(&self, stage: usize) -> Shared<T> {
        self.smem.slice((2 * KEYS + (2 + stage) * BR) * D, BR * D)
    }
    /// m_i of stage `stage`'s query rows.
    #[inline]
    fn m_s(&self, stage: usize) -> Shared<f32> {
        self.f_s.slice(stage * BR, BR)
    }
    /// 1 / l_i of stage `stage`'s query rows.
    #[inline]
    fn il_s(&self, stage: usize) -> Shared<f32> {
        self.f_s.slice((2 + stage) * BR, BR)
    }
    /// D_i of stage `stage`'s query rows.
    #[inline]
    fn dd_s(&self, stage: usize) -> Shared<f32> {
        self.f_s.slice((4 + stage) * BR, BR)
    }

    /// Block: K_j into shared memory (cp.async, not committed).
    #[inline]
    fn load_k(&self) {
        let p = self.p;
        unsafe {
            load_tile_in::<T, Sw<KEYS, D>, D, KEYS, THREADS, true>(
                self.k_s,
                (p.k as *const T).add(self.kv_at + self.first),
                p.k_strides.row,
                self.sk - self.j0.min(self.sk),
                self.d,
            )
        }
    }

    /// Iteration `it`: query head and first row of its tile.
    #[inline]
    fn tile_of(&self, it: usize) -> (u32, u32) {
        ((self.hk as usize * self.group + it / self.n_qt) as u32, ((self.qt_first + it % self.n_qt) * BR) as u32)
    }

    /// Block: Q_i, dO_i (cp.async) and m_i, 1 / l_i, D_i (plain loads) of iteration `it` into
    /// stage `stage`; rows past seqlen_q get Q = dO = 0 and (+inf, 0, 0), so P = 0.
    #[inline]
    fn fetch(&self, it: usize, stage: usize) {
        let (p, b, d, sq, split) = (self.p, self.b, self.d, self.sq, self.split);
        let (h, i0) = self.tile_of(it);
        let q_at = (p.q_strides.offset(b, 0, h) + i0 as u64 * p.q_strides.row) as usize;
        unsafe {
            load_tile_in::<T, Sw<BR, D>, D, BR, THREADS, true>(self.q_s(stage), (p.q as *const T).add(q_at), p.q_strides.row, sq - i0, d);
            load_tile_in::<T, Sw<BR, D>, D, BR, THREADS, true>(
                self.do_s(stage),
                (p.d_o as *const T).add(q_at),
                p.q_strides.row,
                sq - i0,
                d,
            );
        }
        // The statistics' loaders: threads 0..BR, with two warpgroups the second's (the first
        // starts S^T, P^T right after this).
        let tid = if split { (thread::idx() as usize).wrapping_sub(warpgroup::SIZE as usize) } else { thread::idx() as usize };
        if tid < BR {
            let r = i0 + tid as u32;
            let valid = r < sq;
            // The row's address (as `stat_at`) rebuilt here from an `opaque` batch index: its
            // loop-invariant part, hoisted, was the one value ptxas spilled at `.maxnreg 168`
            // (d=64).
            let bh = thread::opaque(b as u64) * p.pb.heads_q as u64 + h as u64;
            let row = bh * p.pb.seqlen_q as u64 + r as u64;
            let n = p.stat_at(1, 0, 0, 0);
            let st = (p.stats as *const f32).wrapping_add(row as usize);
            if !split {
                let ld = |k: usize, dflt: f32| if valid { unsafe { global::load(st.add(k * n)) } } else { dflt };
                self.m_s(stage).st(tid, ld(0, f32::INFINITY));
                self.il_s(stage).st(tid, ld(1, 0.0));
                self.dd_s(stage).st(tid, ld(2, 0.0));
            } else if valid {
                // With two warpgroups (one block per SM, nothing else to hide it) the loads go
                // asynchronously with the tile's group: a plain load held the second
                // warpgroup's dP^T back by an L2 latency every iteration.
                unsafe {
                    thread::cp_async_4(self.m_s(stage), tid, st);
                    thread::cp_async_4(self.il_s(stage), tid, st.add(n));
                    thread::cp_async_4(self.dd_s(stage), tid, st.add(2 * n));
                }
            } else {
                self.m_s(stage).st(tid, f32::INFINITY);
                self.il_s(stage).st(tid, 0.0);
                self.dd_s(stage).st(tid, 0.0);
            }
        }
    }

    /// Block: the next query tile (of `n_iter`) into the other stage, computed while this one
    /// is.
    #[inline]
    fn prefetch(&self, it: usize, n_iter: usize) {
        if it + 1 < n_iter {
            self.fetch(it + 1, (it + 1) % 2);
            thread::cp_async_commit();
        }
    }

    /// Warpgroup: acc = A_j B_i^T over D (D / 16 k-steps of m64n{BR}k16, A [64][D] and
    /// B [BR][D] K-major in shared memory), as one group.
    #[inline(always)]
    fn issue_t(a_s: Shared<T>, b_s: Shared<T>, acc: &mut [[f32; 4]; NQ]) {
        let (a0, b0) = (warpgroup::desc_sw128(a_s, 0, 16, 1024).opaque(), warpgroup::desc_sw128(b_s, 0, 16, 1024).opaque());
        issue_abt::<T, NQ, D, KEYS, BR>(a0, b0, acc);
        warpgroup::commit();
    }

    /// Warpgroup: acc += X^T B_i over the tile's queries (BR / 16 k-steps of m64n{D}k16,
    /// X^T from registers, B [BR][D] read MN-major), as one group.
    #[inline(always)]
    fn issue_acc(x: &[[u32; 4]; KQ], b_s: Shared<T>, acc: &mut [[f32; 4]; DN]) {
        let b0 = warpgroup::desc_sw128(b_s, 0, Sw::<BR, D>::BLOCK_BYTES, 1024).opaque();
        for (kq, f) in x.iter().enumerate() {
            let b = b0.advance(kq * 16 * 64 * 2);
            warpgroup::mma_rs::<DN, true>(*f, b, acc, true, T::BF16);
        }
        warpgroup::commit();
    }

    /// Thread: 16-bit A fragments of X^T from its accumulators (k-step kq: n-tiles 2kq, 2kq + 1).
    #[inline(always)]
    fn pack(x: &[[f32; 4]; NQ]) -> [[u32; 4]; KQ] {
        core::array::from_fn(|kq| to_a::<T>(x[2 * kq], x[2 * kq + 1]))
    }

    /// Warpgroup (one a block): one query tile (stage `st`, query head h, first row i0):
    /// dV_j += P^T dO_i into `acc_dv`, dK_j += dS^T Q_i into `acc_dk`, with DQ dQ_i +=
    /// dS_ij K_j into the f32 accumulator; `masked` applies the causal mask (and with DQ hides
    /// the keys past seqlen_k). `k_bad`: K holds a NaN or an infinity (with DQ; `nonfinite`).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn step(&self, st: usize, h: u32, i0: u32, masked: bool, k_bad: bool, acc_dk: &mut [[f32; 4]; DN], acc_dv: &mut [[f32; 4]; DN]) {
        let (m_row, il_row, d_row) = (self.m_s(st), self.il_s(st), self.dd_s(st));
        // Thread: the statistics of its query columns n * 8 + 2t, + 1 of n-tile n.
        let stat = |i: usize| (m_row.ld(i), il_row.ld(i), d_row.ld(i));

        // S^T = K_j Q_i^T.
        let mut s = [[0f32; 4]; NQ];
        warpgroup::fence_operands(&mut s);
        warpgroup::fence();
        Self::issue_t(self.k_s, self.q_s(st), &mut s);
        warpgroup::wait::<0, NQ>(&mut s);
        // Thread: P^T = exp2(S^T scale log2(e) - m) / l per query column (0 where the row sees
        // no key: m = +inf), then 0 where masked: after the exponential, since with a negative
        // scale a masked -inf score would become +inf.
        for (n, x) in s.iter_mut().enumerate() {
            let c = n * 8 + 2 * self.t;
            let ms = [m_row.ld(c), m_row.ld(c + 1)];
            let ils = [il_row.ld(c), il_row.ld(c + 1)];
            for (e, x) in x.iter_mut().enumerate() {
                *x = math::ex2(*x * self.factor - ms[e % 2]) * ils[e % 2];
            }
        }
        // `masked` is uniform and true on diagonal tiles only: one branch around the whole
        // mask (a branch per element became selects in every tile in the forward kernel).
        let hidden = |n: usize, e: usize| {
            let (key, query) = (self.key0 + (self.g + 8 * (e / 2)) as u32, i0 + (n * 8 + 2 * self.t + e % 2) as u32);
            (DQ && key >= self.sk) || query >= self.sq || M::hides(query, key, self.sq, self.sk)
        };
        if masked {
            // -0.0 marks a masked pair for dS below (a visible P is +0.0 or more).
            for (n, x) in s.iter_mut().enumerate() {
                for (e, x) in x.iter_mut().enumerate() {
                    if hidden(n, e) {
                        *x = -0.0;
                    }
                }
            }
        }
        let mut pa = Self::pack(&s);
        // dV_j += P^T dO_i, then dP^T = V_j dO_i^T, two groups.
        let mut dp = [[0f32; 4]; NQ];
        warpgroup::fence_operands(acc_dv);
        warpgroup::fence_operands(&mut dp);
        warpgroup::fence_fragments(&mut pa);
        warpgroup::fence();
        Self::issue_acc(&pa, self.do_s(st), acc_dv);
        Self::issue_t(self.v_s, self.do_s(st), &mut dp);
        warpgroup::wait::<0, NQ>(&mut dp);
        warpgroup::fence_operands(acc_dv);
        warpgroup::fence_fragments(&mut pa);
        // Thread: dS^T = P^T (dP^T - D) per query column.
        for (n, x) in dp.iter_mut().enumerate() {
            let c = n * 8 + 2 * self.t;
            let dd = [stat(c).2, stat(c + 1).2];
            for (e, x) in x.iter_mut().enumerate() {
                *x = s[n][e] * (*x - dd[e % 2]);
            }
        }
        if masked {
            // 0 where masked (P = -0.0), whatever the row's D and dP hold.
            for (n, x) in dp.iter_mut().enumerate() {
                for (e, x) in x.iter_mut().enumerate() {
                    if s[n][e].to_bits() == 0x8000_0000 {
                        *x = 0.0;
                    }
                }
            }
        }
        let mut da = Self::pack(&dp);
        if DQ {
            // Thread: dS^T into shared memory (`store_ds_t`).
            store_ds_t::<T, KQ>(self.ds_s, self.w, self.g, self.t, &da);
        }
        // dK_j += dS^T Q_i.
        warpgroup::fence_operands(acc_dk);
        warpgroup::fence_fragments(&mut da);
        warpgroup::fence();
        Self::issue_acc(&da, self.q_s(st), acc_dk);
        warpgroup::wait::<0, DN>(acc_dk);
        warpgroup::fence_fragments(&mut da);
        if DQ {
            // Warpgroup: dQ_i = dS_ij K_j over the block's 64 keys (4 k-steps of m64n64k16 per
            // 64 columns, dS and K_j both read MN-major); every warp's dS^T landed first, for
            // the async proxy too.
            if masked && k_bad {
                // Every warp's S^T read K (its wgmma complete), then K's NaNs and infinities
                // as 0 for this product (a masked pair's dS is 0, a
                // visible one's NaN already), restored from global memory after it.
                block::sync();
                zero_own_nonfinite::<T, Sw<KEYS, D>, D, KEYS, THREADS>(self.k_s);
            }
            thread::fence_proxy_async();
            block::sync();
            // Warpgroup: dQ_i = dS_ij K_j in column blocks of 64 (32 accumulators: all D at
            // once spilled at d=128), each added to the accumulator after its wait.
            for cb in 0..D / 64 {
                let mut acc_dq = [[0f32; 4]; 8];
                warpgroup::fence_operands(&mut acc_dq);
                warpgroup::fence();
                issue_dq_block::<T, D>(self.ds_s, self.k_s, cb, &mut acc_dq);
                warpgroup::wait::<0, 8>(&mut acc_dq);
                red_dq_block(self.p, self.b, h, i0 + (self.w * 16 + self.g) as u32, self.t, self.d, cb, &acc_dq);
            }
            if masked && k_bad {
                block::sync();
                self.load_k();
                thread::cp_async_commit();
                thread::cp_async_wait::<0>();
            }
        }
    }

    /// Block of two warpgroups: one query tile (as `step`). The first computes S^T and P^T
    /// and adds P^T dO_i to dV, the second dP^T and dS^T (P^T from the first, through shared
    /// memory as f32, element-major) and adds dS^T Q_i to dK: 4 products, none twice, and
    /// while one warpgroup waits for the exchange or computes its elementwise step the other's
    /// product runs. The same arithmetic as `step`.
    #[inline(always)]
    fn step_split(&self, st: usize, h: u32, i0: u32, masked: bool, k_bad: bool, acc: &mut [[f32; 4]; DN]) {
        let (m_row, il_row, d_row) = (self.m_s(st), self.il_s(st), self.dd_s(st));
        let pf: Shared<f32> = self.pt_s.cast();
        let at = |n: usize, e: usize| (n * 4 + e) * warpgroup::SIZE as usize + self.w * 32 + self.lane;
        // Warpgroup: S^T = K_j Q_i^T (first) or dP^T = V_j dO_i^T (second), over D.
        let (a_s, b_s) = if self.wg == 0 { (self.k_s, self.q_s(st)) } else { (self.v_s, self.do_s(st)) };
        let mut x = [[0f32; 4]; NQ];
        warpgroup::fence_operands(&mut x);
        warpgroup::fence();
        let (a0, b0) = (warpgroup::desc_sw128(a_s, 0, 16, 1024).opaque(), warpgroup::desc_sw128(b_s, 0, 16, 1024).opaque());
        issue_abt::<T, NQ, D, KEYS, BR>(a0, b0, &mut x);
        warpgroup::commit();
        warpgroup::wait::<0, NQ>(&mut x);
        if self.wg == 0 {
            // Thread: P^T = exp2(S^T scale log2(e) - m) / l per query column, then -0.0 where
            // masked (as in `step`), to the exchange.
            for (n, x) in x.iter_mut().enumerate() {
                let c = n * 8 + 2 * self.t;
                let (ms, ils) = ([m_row.ld(c), m_row.ld(c + 1)], [il_row.ld(c), il_row.ld(c + 1)]);
                for (e, x) in x.iter_mut().enumerate() {
                    *x = math::ex2(*x * self.factor - ms[e % 2]) * ils[e % 2];
                }
            }
            if masked {
                for (n, x) in x.iter_mut().enumerate() {
                    for (e, x) in x.iter_mut().enumerate() {
                        let (key, query) = (self.key0 + (self.g + 8 * (e / 2)) as u32, i0 + (n * 8 + 2 * self.t + e % 2) as u32);
                        if (DQ && key >= self.sk) || query >= self.sq || M::hides(query, key, self.sq, self.sk) {
                            *x = -0.0;
                        }
                    }
                }
            }
            for (n, x) in x.iter().enumerate() {
                for (e, x) in x.iter().enumerate() {
                    pf.st(at(n, e), *x);
                }
            }
        }
        // P^T landed.
        block::sync();
        if self.wg == 1 {
            // Thread: dS^T = P^T (dP^T - D) per query column, 0 where masked (P = -0.0).
            for (n, x) in x.iter_mut().enumerate() {
                let c = n * 8 + 2 * self.t;
                let dd = [d_row.ld(c), d_row.ld(c + 1)];
                for (e, x) in x.iter_mut().enumerate() {
                    let pv = pf.ld(at(n, e));
                    *x = if masked && pv.to_bits() == 0x8000_0000 { 0.0 } else { pv * (*x - dd[e % 2]) };
                }
            }
        }
        // Warpgroup: dV_j += P^T dO_i (first) or dK_j += dS^T Q_i (second): BR / 16 k-steps of
        // m64n{D}k16, the 16-bit A from registers, B [BR][D] read MN-major.
        let mut xa: [[u32; 4]; KQ] = core::array::from_fn(|kq| to_a::<T>(x[2 * kq], x[2 * kq + 1]));
        if DQ {
            if self.wg == 1 {
                // Thread: dS^T to shared memory, as `step` stores it.
                store_ds_t::<T, KQ>(self.ds_s, self.w, self.g, self.t, &xa);
            }
            if masked && k_bad {
                // The first warpgroup's S^T read K (waited before the exchange's barrier):
                // K's NaNs and infinities as 0 for dQ's product, restored after it (`step`).
                zero_own_nonfinite::<T, Sw<KEYS, D>, D, KEYS, THREADS>(self.k_s);
            }
        }
        let bm = warpgroup::desc_sw128(if self.wg == 0 { self.do_s(st) } else { self.q_s(st) }, 0, Sw::<BR, D>::BLOCK_BYTES, 1024).opaque();
        warpgroup::fence_operands(acc);
        warpgroup::fence_fragments(&mut xa);
        warpgroup::fence();
        for (kq, f) in xa.iter().enumerate() {
            warpgroup::mma_rs::<DN, true>(*f, bm.advance(kq * 16 * 64 * 2), acc, true, T::BF16);
        }
        warpgroup::commit();
        warpgroup::wait::<0, DN>(acc);
        warpgroup::fence_fragments(&mut xa);
        if DQ {
            // dS^T (and a cleaned K) landed, for the async proxy too. (The barrier follows the
            // products' wait: a branch or a loop with a wgmma in flight makes ptxas serialize
            // them.)
            thread::fence_proxy_async();
            block::sync();
            // Warpgroup: dQ_i = dS_ij K_j for its 64-column blocks of D (the first the even
            // ones: the second also computed dS^T), each added to the accumulator after its
            // wait.
            let mut cb = self.wg;
            while cb < D / 64 {
                let mut acc_dq = [[0f32; 4]; 8];
                warpgroup::fence_operands(&mut acc_dq);
                warpgroup::fence();
                issue_dq_block::<T, D>(self.ds_s, self.k_s, cb, &mut acc_dq);
                warpgroup::wait::<0, 8>(&mut acc_dq);
                red_dq_block(self.p, self.b, h, i0 + (self.w * 16 + self.g) as u32, self.t, self.d, cb, &acc_dq);
                cb += 2;
            }
            if masked && k_bad {
                block::sync();
                self.load_k();
                thread::cp_async_commit();
                thread::cp_async_wait::<0>();
            }
        }
    }
}

/// Query rows per dQ block: one warpgroup's M.
const ROWS: usize = 64;
/// DQ_SAVED: a key tile is hot for a dQ block when one of its rows has P > HOT_P there.
const HOT_P: f32 = 0.125;
/// [`dq`] computes dQ (and D_i for [`dkdv`]), the statistics read from the workspace (written
/// by `bwd_prep::prep` from the forward's LSE and O).
pub const DQ_SAVED: u8 = 1;
/// [`dq`] computes the statistics m_i, 1 / l_i, D_i for [`dkdv`] with DQ (the atomic
/// backward's first kernel), no dQ.
pub const DQ_STATS: u8 = 2;

/// Thread (the DQ dK/dV kernels): its dS^T fragments (16-bit, as the dK product sees them)
/// into `ds_s` as [key][query] (64 queries along each 128-byte row: dS, MN-major). Fragment
/// register r of k-step kq holds key 16w + g + 8 (r % 2) at queries 16 kq + 8 (r / 2) + 2t
/// and the next, that is 16-byte chunk 2 kq + r / 2 of its row, swizzled by the row's g. The
/// lane's part is rebuilt per tile (`opaque`), not hoisted as sixteen live addresses.
#[inline(always)]
fn store_ds_t<T: MmaElement, const KQ: usize>(ds_s: Shared<T>, w: usize, g: usize, t: usize, da: &[[u32; 4]; KQ]) {
    const { assert!(KQ == 4) };
    let lane = thread::opaque((((w * 16 + g) << 2) | t) as u64) as usize;
    let (row, t2) = (lane >> 2, 2 * (lane & 3));
    let ds32: Shared<u32> = ds_s.cast();
    for (kq, f) in da.iter().enumerate() {
        for (r, &x) in f.iter().enumerate() {
            let at = (row + 8 * (r % 2)) * 64 + (((2 * kq + r / 2) ^ (row % 8)) * 8) + t2;
            ds32.st(at / 2, x);
        }
    }
}

/// Warpgroup (the DQ dK/dV kernels): acc = dS_ij K_j for D's 64-column block `cb`, over the
/// block's 64 keys (4 k-steps of m64n64k16, dS^T [64][64] and K_j [64][D] both read
/// MN-major), as one group, issued and committed (the caller waits).
#[inline(always)]
fn issue_dq_block<T: MmaElement, const D: usize>(ds_s: Shared<T>, k_s: Shared<T>, cb: usize, acc: &mut [[f32; 4]; 8]) {
    let a0 = warpgroup::desc_sw128(ds_s, 0, Sw::<KEYS, 64>::BLOCK_BYTES, 1024).opaque();
    let b0 = warpgroup::desc_sw128(k_s, 0, Sw::<KEYS, D>::BLOCK_BYTES, 1024).opaque();
    let b1 = b0.advance(cb * Sw::<KEYS, D>::BLOCK_BYTES as usize);
    for ks in 0..KEYS / 16 {
        warpgroup::mma_ss_mn::<8>(a0.advance(ks * 16 * 128), b1.advance(ks * 16 * 128), acc, ks > 0, T::BF16);
    }
    warpgroup::commit();
}

/// Thread (the DQ dK/dV kernels): its dQ_i elements of column block `cb` (rows `row`, + 8,
/// columns 64 cb + 8n + 2t, + 1) added to the f32 accumulator of query head h, two per red;
/// rows past seqlen_q and columns past head_dim `d` left out. The lane's address is rebuilt
/// per block (`opaque`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn red_dq_block(p: &BwdParams, b: u32, h: u32, row: u32, t: usize, d: u32, cb: usize, acc: &[[f32; 4]; 8]) {
    let sq = p.pb.seqlen_q;
    let at = ((b as u64 * p.pb.heads_q as u64 + h as u64) * sq as u64 + row as u64) * d as u64 + 2 * t as u64;
    let acc_g = thread::opaque(p.dq_accum + at * 4) as *mut f32;
    let col0 = 2 * t as u32;
    for (n, x) in acc.iter().enumerate() {
        let col = (cb * 64 + n * 8) as u32;
        for half in 0..2usize {
            let r = row + 8 * half as u32;
            if r < sq && col0 + col < d {
                let off = (8 * half as u64 * d as u64 + col as u64) as usize;
                // SAFETY: a row below seqlen_q and a column below head_dim of the accumulator.
                unsafe { global::red_add_v2(acc_g.add(off), [x[2 * half], x[2 * half + 1]]) };
            }
        }
    }
}

/// Warpgroup: acc = A B^T over D, A a [RA][D] and B a [RB][D] tile (both K-major, the
/// descriptors at their first rows): D / 16 k-steps of m64n{8N}k16, issued (the caller commits
/// and waits).
#[inline(always)]
fn issue_abt<T: MmaElement, const N: usize, const D: usize, const RA: usize, const RB: usize>(
    a: warpgroup::Desc,
    b: warpgroup::Desc,
    acc: &mut [[f32; 4]; N],
) {
    for kk in 0..D / 16 {
        let (ao, bo) = (((kk / 4) * RA * 64 + (kk % 4) * 16) * 2, ((kk / 4) * RB * 64 + (kk % 4) * 16) * 2);
        warpgroup::mma_ss::<N>(a.advance(ao), b.advance(bo), acc, kk > 0, T::BF16);
    }
}

/// Warpgroup: acc += P B over one key tile (KS k-steps of m64n{8N}k16, P from registers, B
/// read MN-major from `b`), waited for.
#[inline(always)]
fn add_pk<T: MmaElement, const N: usize, const KS: usize>(acc: &mut [[f32; 4]; N], pa: &mut [[u32; 4]; KS], b: warpgroup::Desc) {
    warpgroup::fence_operands(acc);
    warpgroup::fence_fragments(pa);
    warpgroup::fence();
    for (ks, f) in pa.iter().enumerate() {
        warpgroup::mma_rs::<N, true>(*f, b.advance(ks * 16 * 64 * 2), acc, true, T::BF16);
    }
    warpgroup::commit();
    warpgroup::wait::<0, N>(acc);
    warpgroup::fence_fragments(pa);
}

/// Thread: `hidden` where its S fragment (rows row_w + g, + 8 of lane (g, t), N n-tiles of
/// keys from c0) is hidden by the mask or by seqlen_k; one uniform branch (`masked`: true on
/// the last tiles only).
#[inline(always)]
fn mask_frag<M: Mask, const N: usize>(
    s: &mut [[f32; 4]; N],
    c0: u32,
    row_w: u32,
    (g, t): (usize, usize),
    (sq, sk): (u32, u32),
    masked: bool,
    hidden: f32,
) {
    if masked {
        for (n, x) in s.iter_mut().enumerate() {
            for (e, x) in x.iter_mut().enumerate() {
                let row = row_w + (g + 8 * (e / 2)) as u32;
                let col = c0 + (n * 8 + 2 * t + e % 2) as u32;
                if col >= sk || M::hides(row, col, sq, sk) {
                    *x = hidden;
                }
            }
        }
    }
}

/// The dQ kernel for one tile `C` (as [`dkdv`]): D = 8 DN, key tiles of BC = 8 NS = 16 KS keys,
/// THREADS / 128 warpgroups; MODE [`DQ_SAVED`] or [`DQ_STATS`] (see the module doc). With two
/// warpgroups, each takes BC / 2 = 8 NSW = 16 KSW keys of every tile (S, dP and dQ~ over D of
/// its keys, no product done twice) and the two halves of dQ~ and of the rows' sums are added
/// after the loop, warpgroup wg keeping DW = 8 DNW columns (the hot tiles' pass, over every
/// key of a tile, then gives each warpgroup its columns of B_i).
///
/// # Safety
/// `p` valid (host-checked), `p.pb.head_dim <= D`, THREADS threads,
/// `WgmmaBwdTile::dq_smem_bytes()` bytes of dynamic shared memory; an sm_90a device; with
/// DQ_SAVED, the statistics written.
#[inline(always)]
pub unsafe fn dq<
    T: MmaElement,
    C: Config<Tile = WgmmaBwdTile>,
    const D: usize,
    const DN: usize,
    const BC: usize,
    const NS: usize,
    const KS: usize,
    const NSW: usize,
    const KSW: usize,
    const THREADS: usize,
    const DW: usize,
    const DNW: usize,
    const PAD: bool,
    const MODE: u8,
>(
    p: &BwdParams,
) {
    const {
        let t = C::TILE;
        assert!(D == t.head_dim as usize && DN * 8 == D && D.is_multiple_of(64) && PAD == t.padded);
        assert!(BC == t.dq_bc as usize && NS * 8 == BC && KS * 16 == BC);
        // DQ_STATS with one warpgroup; with two, halves of D (of 96 columns at D = 192).
        assert!(THREADS == 128 * t.split as usize && DW * t.split as usize == D && DNW * 8 == DW && DW.is_multiple_of(32));
        assert!(NSW * t.split as usize == NS && KSW * 2 == NSW && (MODE == DQ_SAVED || THREADS == 128));
    }
    // DQ_STATS (the atomic family): head dims that are multiples of 8 only
    // (`registry::BwdFamilyDesc::aligned_only`).
    if MODE == DQ_STATS && by_element(PAD, p.pb.head_dim) {
        thread::trap();
    }
    unsafe {
        with_mask!(p, M => match MODE != DQ_STATS && by_element(PAD, p.pb.head_dim) {
            false => dq_masked::<T, M, D, DN, BC, NS, KS, NSW, KSW, THREADS, DW, DNW, PAD, MODE, false>(p),
            true => dq_masked::<T, M, D, DN, BC, NS, KS, NSW, KSW, THREADS, DW, DNW, PAD, MODE, true>(p),
        })
    }
}

/// Block (one warpgroup, or two: see [`dq`]): the dQ kernel for one block of 64 query rows.
/// Q_i and dO_i loaded once; one pass over the key tiles (double-buffered): per tile the
/// block's votes on K, S and dP ([`DqBlock::scores`]), then DQ_STATS folds them into the
/// rows' statistics and DQ_SAVED takes dQ~_i's step ([`DqBlock::dq_step`]) and the block
/// lists the hot tiles; then with two warpgroups the halves are added ([`DqBlock::halves`]);
/// DQ_SAVED corrects dQ~_i and writes D_i ([`DqBlock::correct`]); dQ_i stored.
#[inline(always)]
unsafe fn dq_masked<
    T: MmaElement,
    M: Mask,
    const D: usize,
    const DN: usize,
    const BC: usize,
    const NS: usize,
    const KS: usize,
    const NSW: usize,
    const KSW: usize,
    const THREADS: usize,
    const DW: usize,
    const DNW: usize,
    const PAD: bool,
    const MODE: u8,
    const EL: bool,
>(
    p: &BwdParams,
) {
    const { assert!(MODE == DQ_SAVED || MODE == DQ_STATS) };
    let (saved, stats_only) = (MODE == DQ_SAVED, MODE == DQ_STATS);
    // Without PAD, head_dim is exactly D and the padding checks compile away.
    let d = body_head_dim::<D, EL>(PAD, p.pb.head_dim);
    if p.pb.head_dim > D as u32 || (!PAD && p.pb.head_dim != D as u32) || d == 0 || block::dim() != THREADS as u32 {
        thread::trap();
    }
    let mut qb = DqBlock::<T, M, D, DN, BC, NS, KS, NSW, KSW, THREADS, DW, DNW, PAD, MODE, EL>::new(p, d, saved);
    let (n_tiles, n_unmasked) = (qb.n_tiles, qb.n_unmasked);

    // Block: Q_i, dO_i and the first K, V tile in flight.
    qb.load_q();
    if n_tiles > 0 {
        qb.load_kv(0, 0);
    }
    thread::cp_async_commit();

    qb.factor = crate::softmax::score_scale(qb.p.pb.scale) * LOG2_E;
    // dQ~ over the warpgroup's keys, every column (then `halves`).
    let mut acc_dq = [[0f32; 4]; DN];
    // Rows g and g + 8 of the warp's 16: running statistics (DQ_STATS), or m_i, 1 / l_i, D~_i
    // from the workspace (DQ_SAVED).
    let mut rows = [QuadRow::INIT; 2];
    let mut fin = [(f32::INFINITY, 0f32, 0f32); 2];
    // DQ_SAVED, rows g and g + 8: delta_i = sum_j dS~_ij in f32 (this thread's columns), and
    // delta~_i, the sum of the dS~ rounded to T, from the tensor cores (dS~ times the ones:
    // acc_one[0][2 half] is row g + 8 half's, over all columns); dS~ = P (dP - D~_i).
    let (mut delta, mut acc_one) = ([0f32; 2], [[0f32; 4]; 1]);
    if saved {
        qb.fill_ones();
        fin = qb.load_stats();
    }
    // DQ_SAVED: how many key tiles are on the block's list of hot tiles (block-uniform).
    let mut n_hot = 0usize;

    // One pass over the key tiles (DQ_SAVED: dQ, DQ_STATS: the statistics), double-buffered.
    for it in 0..n_tiles {
        let j = it;
        // Block: prefetch the next iteration's K, V into the other stage while this one is
        // computed.
        if it + 1 < n_tiles {
            qb.load_kv(it + 1, (it + 1) % 2);
            thread::cp_async_commit();
            thread::cp_async_wait::<1>();
        } else {
            thread::cp_async_wait::<0>();
        }
        // This tile's copies landed, for every thread and for the async proxy; on masked tiles
        // the block votes on whether K holds a NaN or an infinity (`nonfinite`).
        let masked = j >= n_unmasked;
        let bad_k = qb.clean_k_vote(it % 2, masked && !stats_only);
        let (s, dp) = qb.scores(j, it % 2, masked);
        qb.clean_k(it % 2, bad_k);
        if stats_only {
            fold_stats(&mut rows, (&s, &dp), masked);
        } else {
            qb.dq_step(j, it, masked, (&s, &dp), &fin, &mut delta, &mut acc_one, &mut acc_dq);
        }
        // Everyone is done with stage it % 2 (its wgmma complete) before iteration it + 1
        // refills it.
        block::sync();
        if saved {
            n_hot = qb.list_hot(it, n_hot);
        }
    }
    if n_tiles == 0 {
        thread::cp_async_wait::<0>();
    }
    if stats_only {
        qb.publish(&rows);
    }
    // Block: warpgroup wg keeps dQ~'s columns DW wg.. over every key; DQ_SAVED corrects them.
    let mut acc_dq = qb.halves(&acc_dq, &mut delta, &mut acc_one);
    if saved {
        qb.correct(n_hot, &fin, &delta, &acc_one, &mut acc_dq);
    }
    if !stats_only {
        qb.store_dq(&acc_dq);
    }
}

/// Lane quad (DQ_STATS, pass 0): key tile j's S and dP (`sdp`) folded into the running
/// statistics of rows g and g + 8.
#[inline(always)]
fn fold_stats<const NSW: usize>(rows: &mut [QuadRow; 2], (s, dp): (&[[f32; 4]; NSW], &[[f32; 4]; NSW]), masked: bool) {
    for (half, row) in rows.iter_mut().enumerate() {
        let (x, dpx) = (
            core::array::from_fn::<_, NSW, _>(|n| [s[n][2 * half], s[n][2 * half + 1]]),
            core::array::from_fn(|n| [dp[n][2 * half], dp[n][2 * half + 1]]),
        );
        if masked { row.push::<true, NSW>(x, dpx) } else { row.push::<false, NSW>(x, dpx) }
    }
}

/// What the dQ kernel's steps read ([`dq_masked`]): the block (64 query rows, head, batch),
/// the thread's place in it, the shared tiles and the key tiles. One instance per kernel
/// variant, methods inlined as the closures they replace were, as [`DkdvBlock`] (why there).
struct DqBlock<
    'a,
    T: Copy,
    M,
    const D: usize,
    const DN: usize,
    const BC: usize,
    const NS: usize,
    const KS: usize,
    const NSW: usize,
    const KSW: usize,
    const THREADS: usize,
    const DW: usize,
    const DNW: usize,
    const PAD: bool,
    const MODE: u8,
    const EL: bool,
> {
    p: &'a BwdParams,
    /// head_dim as the body sees it (`body_head_dim`).
    d: u32,
    /// DQ_SAVED (else DQ_STATS).
    saved: bool,
    /// Head and batch of the block.
    h: u32,
    b: u32,
    /// Warpgroups (1 or 2); warp w of warpgroup wg: rows 16w.. of the block; in the loop keys
    /// `key_w` = BC / split wg.. of each tile, after it dQ columns `col0` = DW wg..; its lane,
    /// and (g, t) in the accumulator layout.
    split: usize,
    wg: usize,
    w: usize,
    lane: usize,
    g: usize,
    t: usize,
    col0: usize,
    key_w: usize,
    sq: u32,
    sk: u32,
    /// First query row of the block and of this warp.
    row0: u32,
    row_w: u32,
    /// Shared memory: Q, dO [64][D], then K stages 0 and 1, V stages 0 and 1 ([BC][D] each),
    /// then (DQ_SAVED) 8 x 64 ones, then (u32) 8 votes a warpgroup and HOT_TILES tile indices.
    smem: Shared<T>,
    ones: Shared<T>,
    q_s: Shared<T>,
    do_s: Shared<T>,
    /// DQ_SAVED: per-warp votes of the current tile (two slots, by iteration parity) and the
    /// list of the hot key tiles.
    votes: Shared<u32>,
    hot: Shared<u32>,
    /// The head's Q (and dO, dQ) offset, its Q, dO and KV head's K, V, and the block's first
    /// row there.
    q_at: usize,
    q_g: *const T,
    do_g: *const T,
    k_g: *const T,
    v_g: *const T,
    first: usize,
    /// Key tiles the block's rows see, and those below `n_unmasked` no row's mask hides.
    n_tiles: usize,
    n_unmasked: usize,
    /// scale log2(e), for exp2.
    factor: f32,
    mask: PhantomData<M>,
}

impl<
    'a,
    T: MmaElement,
    M: Mask,
    const D: usize,
    const DN: usize,
    const BC: usize,
    const NS: usize,
    const KS: usize,
    const NSW: usize,
    const KSW: usize,
    const THREADS: usize,
    const DW: usize,
    const DNW: usize,
    const PAD: bool,
    const MODE: u8,
    const EL: bool,
> DqBlock<'a, T, M, D, DN, BC, NS, KS, NSW, KSW, THREADS, DW, DNW, PAD, MODE, EL>
{
    /// Thread: the block's indices, shared tiles and key tiles (`factor` is set by
    /// [`dq_masked`] once the first tiles are in flight).
    #[inline(always)]
    fn new(p: &'a BwdParams, d: u32, saved: bool) -> Self {
        let BlockInfo { blk: q_blk, h, b } = BlockInfo::rows_per_head::<M>(p.pb.seqlen_q.div_ceil(ROWS as u32));
        let split = THREADS / warpgroup::SIZE as usize;
        let (wg, w, lane) = wg_warp_lane::<THREADS>();
        let (g, t) = (lane / 4, lane % 4);
        let (col0, key_w) = (wg * DW, wg * (BC / split));
        let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
        let hk = h / (p.pb.heads_q / p.pb.heads_kv);
        let row0 = q_blk * ROWS as u32;
        let row_w = row0 + (w * 16) as u32; // first query row of this warp

        let smem: Shared<T> = unsafe { dev::dynamic_shared((2 * ROWS + 4 * BC) * D) };
        let ones: Shared<T> = smem.after(8 * 64);
        let q_s = smem.slice(0, ROWS * D);
        let do_s = smem.slice(ROWS * D, ROWS * D);

        let q_at = p.q_strides.offset(b, 0, h) as usize;
        let kv_at = p.k_strides.offset(b, 0, hk) as usize;
        let (q_g, do_g) = unsafe { ((p.q as *const T).add(q_at), (p.d_o as *const T).add(q_at)) };
        let (k_g, v_g) = unsafe { ((p.k as *const T).add(kv_at), (p.v as *const T).add(kv_at)) };
        let first = (row0.min(sq) as u64 * p.q_strides.row) as usize;

        let row_end = (row0 + ROWS as u32).min(sq);
        let n_tiles = M::visible_cols(row_end, sq, sk).div_ceil(BC as u32) as usize;
        let n_unmasked = ((M::unmasked_cols(row0, sq, sk) / BC as u32) as usize).min(n_tiles);
        let votes: Shared<u32> = ones.after(8 * split);
        let hot: Shared<u32> = votes.after(HOT_TILES);
        DqBlock {
            p,
            d,
            saved,
            h,
            b,
            split,
            wg,
            w,
            lane,
            g,
            t,
            col0,
            key_w,
            sq,
            sk,
            row0,
            row_w,
            smem,
            ones,
            q_s,
            do_s,
            votes,
            hot,
            q_at,
            q_g,
            do_g,
            k_g,
            v_g,
            first,
            n_tiles,
            n_unmasked,
            factor: 0.0,
            mask: PhantomData,
        }
    }

    /// Block: Q_i and dO_i (zero rows past seqlen_q), cp.async, not committed.
    #[inline(always)]
    fn load_q(&self) {
        let (p, row0, sq, d) = (self.p, self.row0, self.sq, self.d);
        unsafe {
            load_tile_in::<T, Sw<ROWS, D>, D, ROWS, THREADS, true>(
                self.q_s,
                self.q_g.add(self.first),
                p.q_strides.row,
                sq - row0.min(sq),
                d,
            );
            load_tile_in::<T, Sw<ROWS, D>, D, ROWS, THREADS, true>(
                self.do_s,
                self.do_g.add(self.first),
                p.q_strides.row,
                sq - row0.min(sq),
                d,
            );
        }
    }

    /// Warp: dQ_i = scale * acc (the warpgroup's columns), rows of its 16, in T.
    #[inline(always)]
    fn store_dq(&self, acc_dq: &[[f32; 4]; DNW]) {
        let (p, col0) = (self.p, self.col0);
        let d_wg = self.d.saturating_sub(col0 as u32);
        unsafe {
            store_rows::<T, DNW, true>(
                acc_dq,
                p.pb.scale,
                (p.dq as *mut T).add(self.q_at + col0),
                p.q_strides.row,
                self.row_w,
                self.sq,
                d_wg,
            )
        };
    }

    /// K_j of stage `stage`.
    #[inline]
    fn k_s(&self, stage: usize) -> Shared<T> {
        self.smem.slice((2 * ROWS + stage * BC) * D, BC * D)
    }
    /// V_j of stage `stage`.
    #[inline]
    fn v_s(&self, stage: usize) -> Shared<T> {
        self.smem.slice((2 * ROWS + (2 + stage) * BC) * D, BC * D)
    }

    /// Block: K_j and V_j (key tile j) into `stage` (cp.async, not committed).
    /// (Inlined by force: at D = 192, 256 with one warpgroup, the statistics kernel, LLVM
    /// called it with its captures on the stack.)
    #[inline(always)]
    fn load_kv(&self, j: usize, stage: usize) {
        let c1 = (j * BC) as u32;
        let off = (c1 as u64 * self.p.k_strides.row) as usize;
        unsafe {
            load_tile_in::<T, Sw<BC, D>, D, BC, THREADS, true>(
                self.k_s(stage),
                self.k_g.add(off),
                self.p.k_strides.row,
                self.sk - c1,
                self.d,
            );
            load_tile_in::<T, Sw<BC, D>, D, BC, THREADS, true>(
                self.v_s(stage),
                self.v_g.add(off),
                self.p.k_strides.row,
                self.sk - c1,
                self.d,
            );
        }
    }

    /// Lane quad: the rows' final statistics, also to the workspace for the dK/dV kernel
    /// (every row below seqlen_q, fully masked ones too).
    #[inline]
    fn publish(&self, rows: &[QuadRow; 2]) -> [(f32, f32, f32); 2] {
        let fin = [rows[0].finish(), rows[1].finish()];
        for (half, f) in fin.iter().enumerate() {
            let r = self.row_w + (self.g + 8 * half) as u32;
            if self.t == 0 && r < self.sq {
                let st = self.p.stats as *mut f32;
                unsafe {
                    global::store(st.add(self.p.stat_at(0, self.b, self.h, r)), f.0);
                    global::store(st.add(self.p.stat_at(1, self.b, self.h, r)), f.1);
                    global::store(st.add(self.p.stat_at(2, self.b, self.h, r)), f.2);
                }
            }
        }
        fin
    }

    /// Block (DQ_SAVED): the ones (1024 bytes, a 1024-byte-aligned 128-byte-swizzle atom:
    /// every layout reads them as ones); visible to the async proxy after the loop's first
    /// barrier.
    #[inline(always)]
    fn fill_ones(&self) {
        let ones32 = self.ones.cast::<u32>();
        let mut i = thread::idx() as usize;
        while i < ones32.len() {
            ones32.st(i, T::pack2(1.0, 1.0));
            i += THREADS;
        }
    }

    /// Thread (DQ_SAVED): its rows' (g and g + 8) m_i, 1 / l_i, D~_i from the workspace;
    /// rows past seqlen_q keep (+inf, 0, 0).
    #[inline(always)]
    fn load_stats(&self) -> [(f32, f32, f32); 2] {
        let mut fin = [(f32::INFINITY, 0f32, 0f32); 2];
        for (half, f) in fin.iter_mut().enumerate() {
            let r = self.row_w + (self.g + 8 * half) as u32;
            if r < self.sq {
                let (p, b, h) = (self.p, self.b, self.h);
                let st = p.stats as *const f32;
                *f = unsafe {
                    (
                        global::load(st.add(p.stat_at(0, b, h, r))),
                        global::load(st.add(p.stat_at(1, b, h, r))),
                        global::load(st.add(p.stat_at(2, b, h, r))),
                    )
                };
            }
        }
        fin
    }

    /// Block (DQ_SAVED), after iteration `it`'s barrier: key tile `it` joins the list of hot
    /// tiles if a warp voted so (every thread reads the same votes; at most HOT_TILES are
    /// listed); returns the new length.
    #[inline(always)]
    fn list_hot(&self, it: usize, n_hot: usize) -> usize {
        let at = 4 * self.split * (it % 2);
        let mut any = 0;
        for v in 0..4 * self.split {
            any |= self.votes.ld(at + v);
        }
        if any == 0 || n_hot >= HOT_TILES {
            return n_hot;
        }
        if self.wg == 0 && self.w == 0 && self.lane == 0 {
            self.hot.st(n_hot, it as u32);
        }
        n_hot + 1
    }

    /// Thread: `hidden` where key tile j hides S (one uniform branch: true on the last tiles
    /// only).
    #[inline(always)]
    fn mask(&self, s: &mut [[f32; 4]; NSW], j: usize, masked: bool, hidden: f32) {
        mask_frag::<M, NSW>(s, (j * BC + self.key_w) as u32, self.row_w, (self.g, self.t), (self.sq, self.sk), masked, hidden)
    }

    /// Block, after the copies of key tile `stage` landed: the barrier that makes them visible
    /// (to the async proxy too); with `check`, it also votes on whether K holds a NaN or an
    /// infinity (`nonfinite`).
    #[inline(always)]
    fn clean_k_vote(&self, stage: usize, check: bool) -> bool {
        let found = check && own_chunks_nonfinite::<T, Sw<BC, D>, D, BC, THREADS>(self.k_s(stage));
        thread::fence_proxy_async();
        if check {
            block::sync_any(found)
        } else {
            block::sync();
            false
        }
    }

    /// Block, once S = Q K^T is done with key tile `stage` and with `bad`: K's NaNs and
    /// infinities replaced by 0 for the products that add over keys (dS K, P K), where a masked
    /// key's weight is 0 and a visible one's is NaN already (its score was).
    #[inline(always)]
    fn clean_k(&self, stage: usize, bad: bool) {
        if bad {
            block::sync();
            zero_own_nonfinite::<T, Sw<BC, D>, D, BC, THREADS>(self.k_s(stage));
            thread::fence_proxy_async();
            block::sync();
        }
    }

    /// Warpgroup: S = Q K_j^T times scale log2(e), -inf where masked (DQ_SAVED: unscaled and
    /// unmasked), and dP = dO V_j^T for
    /// key tile j in `stage` (D / 16 k-steps of m64n{BC}k16 each, one group).
    #[inline(always)]
    fn scores(&self, j: usize, stage: usize, masked: bool) -> ([[f32; 4]; NSW], [[f32; 4]; NSW]) {
        let mut s = [[0f32; 4]; NSW];
        let mut dp = [[0f32; 4]; NSW];
        warpgroup::fence_operands(&mut s);
        warpgroup::fence_operands(&mut dp);
        warpgroup::fence();
        let (qd, od) = (warpgroup::desc_sw128(self.q_s, 0, 16, 1024).opaque(), warpgroup::desc_sw128(self.do_s, 0, 16, 1024).opaque());
        // The warpgroup's keys: rows key_w.. of the tile (a multiple of 8 rows).
        let at = Sw::<BC, D>::at(self.key_w, 0);
        let (kd, vd) =
            (warpgroup::desc_sw128(self.k_s(stage), at, 16, 1024).opaque(), warpgroup::desc_sw128(self.v_s(stage), at, 16, 1024).opaque());
        issue_abt::<T, NSW, D, ROWS, BC>(qd, kd, &mut s);
        issue_abt::<T, NSW, D, ROWS, BC>(od, vd, &mut dp);
        warpgroup::commit();
        warpgroup::wait::<0, NSW>(&mut s);
        warpgroup::fence_operands(&mut dp);
        if !self.saved {
            for x in s.iter_mut() {
                for x in x.iter_mut() {
                    *x *= self.factor;
                }
            }
            self.mask(&mut s, j, masked, f32::NEG_INFINITY);
        }
        (s, dp)
    }

    /// Warpgroup (DQ_SAVED), key tile j (iteration `it`) from its unscaled S and dP (`sdp`)
    /// and the rows' statistics `fin`: dQ~_i += dS~ K_j, the rows' delta and delta~, and the
    /// warps' votes on whether the tile is hot.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn dq_step(
        &self,
        j: usize,
        it: usize,
        masked: bool,
        (s, dp): (&[[f32; 4]; NSW], &[[f32; 4]; NSW]),
        fin: &[(f32, f32, f32); 2],
        delta: &mut [f32; 2],
        acc_one: &mut [[f32; 4]; 1],
        acc_dq: &mut [[f32; 4]; DN],
    ) {
        // Thread: P = exp2(S scale log2 e - m_i) (`prep` gives 1 / l_i = 1, and m_i = +inf
        // to rows with no visible key), 0 where masked; dS~ = P (dP - D~_i) to 16-bit A
        // fragments (k-step ks: n-tiles 2ks, 2ks + 1); then dQ~_i += dS~ K_j, K_j read
        // MN-major.
        let mut pt = *s;
        for x in pt.iter_mut() {
            for (e, x) in x.iter_mut().enumerate() {
                *x = math::ex2(math::fma(*x, self.factor, -fin[e / 2].0));
            }
        }
        self.mask(&mut pt, j, masked, 0.0);
        let mut ds = [[0f32; 4]; NSW];
        let mut p_max = 0f32; // over both rows: the warp votes on any of its rows
        for n in 0..NSW {
            for e in 0..4 {
                ds[n][e] = pt[n][e] * (dp[n][e] - fin[e / 2].2);
            }
        }
        // 0 where masked, whatever the row's D and dP hold.
        self.mask(&mut ds, j, masked, 0.0);
        for n in 0..NSW {
            for e in 0..4 {
                p_max = p_max.max(pt[n][e]);
                delta[e / 2] += ds[n][e];
            }
        }
        let mut da: [[u32; 4]; KSW] = core::array::from_fn(|ks| to_a::<T>(ds[2 * ks], ds[2 * ks + 1]));
        warpgroup::fence_operands(acc_dq);
        warpgroup::fence_operands(acc_one);
        warpgroup::fence_fragments(&mut da);
        warpgroup::fence();
        // K_j's rows key_w.. read MN-major (N = D), as many k-steps as the warpgroup's keys.
        let kd = warpgroup::desc_sw128(self.k_s(it % 2), Sw::<BC, D>::at(self.key_w, 0), Sw::<BC, D>::BLOCK_BYTES, 1024).opaque();
        let od = warpgroup::desc_sw128(self.ones, 0, 16, 1024).opaque();
        for (ks, f) in da.iter().enumerate() {
            warpgroup::mma_rs::<DN, true>(*f, kd.advance(ks * 16 * 64 * 2), acc_dq, true, T::BF16);
            // delta_t += dS~ 1 (the sum of the rounded dS~, what the product adds).
            warpgroup::mma_rs::<1, false>(*f, od.advance(ks * 32), acc_one, true, T::BF16);
        }
        warpgroup::commit();
        warpgroup::wait::<0, DN>(acc_dq);
        warpgroup::fence_operands(acc_one);
        warpgroup::fence_fragments(&mut da);
        if self.saved {
            // Warp: whether one of its rows has a key with P > HOT_P among its
            // warpgroup's keys of this tile.
            let v = warp::any(p_max > HOT_P);
            if self.lane == 0 {
                self.votes.st(4 * self.split * (it % 2) + 4 * self.wg + self.w, v as u32);
            }
        }
    }

    /// Block after the key loop: warpgroup wg keeps columns DW wg.. of dQ~ (`acc_dq`, over its
    /// keys), summed with the other warpgroup's, and the rows' delta and delta~ over every key.
    /// With two warpgroups, through the V stages and K stage 1 (free now): each thread's part
    /// of the other's columns, and its sums, for the thread of the same place in the other
    /// warpgroup. a + b = b + a: both warpgroups hold the same sums.
    #[inline(always)]
    fn halves(&self, acc_dq: &[[f32; 4]; DN], delta: &mut [f32; 2], acc_one: &mut [[f32; 4]; 1]) -> [[f32; 4]; DNW] {
        let (wg, tid) = (self.wg, thread::idx() as usize);
        if THREADS == warpgroup::SIZE as usize {
            return core::array::from_fn(|n| acc_dq[n]);
        }
        let (xs, ss) = (self.smem.slice((2 * ROWS + 2 * BC) * D, 2 * BC * D).cast::<f32>(), self.k_s(1).cast::<f32>());
        let other = tid ^ warpgroup::SIZE as usize;
        for n in 0..DNW {
            for e in 0..4 {
                xs.st((n * 4 + e) * THREADS + tid, if wg == 0 { acc_dq[DNW + n][e] } else { acc_dq[n][e] });
            }
        }
        for i in 0..2 {
            ss.st(i * THREADS + tid, delta[i]);
        }
        for e in 0..4 {
            ss.st((2 + e) * THREADS + tid, acc_one[0][e]);
        }
        block::sync();
        let mine: [[f32; 4]; DNW] = core::array::from_fn(|n| if wg == 0 { acc_dq[n] } else { acc_dq[DNW + n] });
        let sum = core::array::from_fn(|n| core::array::from_fn(|e| mine[n][e] + xs.ld((n * 4 + e) * THREADS + other)));
        for i in 0..2 {
            delta[i] += ss.ld(i * THREADS + other);
        }
        for e in 0..4 {
            acc_one[0][e] += ss.ld((2 + e) * THREADS + other);
        }
        // Everyone has read the other's part before the V stages are reused.
        block::sync();
        sum
    }

    /// Block (DQ_SAVED), after the key loop: B_i and sigma_i over the `n_hot` hot tiles
    /// ([`hot_sums`](Self::hot_sums)); then, lane quad: the rows' delta, delta~, sigma;
    /// D_i = D~_i + delta_i to the workspace for the dK/dV kernel; where the hot tiles hold at
    /// least half of a row's P, dQ_i -= (delta~_i / sigma_i) B_i: the coefficients of K in
    /// dQ_i then sum to 0 as the exact dS_ij do (see the module doc).
    #[inline(always)]
    fn correct(&self, n_hot: usize, fin: &[(f32, f32, f32); 2], delta: &[f32; 2], acc_one: &[[f32; 4]; 1], acc_dq: &mut [[f32; 4]; DNW]) {
        // Over the warpgroup's columns, or (FULL_B: its columns do not start a 64-column
        // swizzle block, where an MN-major operand cannot start) over all D, the warpgroup's
        // columns taken after.
        let full_b = !DW.is_multiple_of(64);
        let (acc_b, sigma) = self.hot_sums(n_hot, fin, acc_dq);
        // (The row's address rebuilt from an opaque batch index: hoisted from the loads of
        // `fin` it was kept across the loop and spilled at 128 registers.)
        let b_late = thread::opaque(self.b as u64) as u32;
        for half in 0..2 {
            let (dl, dl_t, sg) = (warp::allreduce_sum_in::<4>(delta[half]), acc_one[0][2 * half], warp::allreduce_sum_in::<4>(sigma[half]));
            let r = self.row_w + (self.g + 8 * half) as u32;
            if self.wg == 0 && self.t == 0 && r < self.sq {
                unsafe { global::store((self.p.stats as *mut f32).add(self.p.stat_at(2, b_late, self.h, r)), fin[half].2 + dl) };
            }
            if sg >= 0.5 {
                let c = dl_t / sg;
                let b_mine: [[f32; 4]; DNW] = core::array::from_fn(|n| if full_b && self.wg == 1 { acc_b[DNW + n] } else { acc_b[n] });
                for (acc, bb) in acc_dq.iter_mut().zip(b_mine.iter()) {
                    acc[2 * half] -= c * bb[2 * half];
                    acc[2 * half + 1] -= c * bb[2 * half + 1];
                }
            }
        }
    }

    /// Block (DQ_SAVED): B_i = sum P_ij K_j over the `n_hot` hot tiles (S and P recomputed:
    /// at most one tile per key with P > HOT_P), and sigma_i = sum of those P rounded to T
    /// (what the product adds), for rows g and g + 8: over the warpgroup's columns, or with
    /// FULL_B (`correct`) over all D. dQ~ (`acc_dq`) waits in the V stages meanwhile.
    #[inline(always)]
    fn hot_sums(&self, n_hot: usize, fin: &[(f32, f32, f32); 2], acc_dq: &mut [[f32; 4]; DNW]) -> ([[f32; 4]; DN], [f32; 2]) {
        let (p, tid) = (self.p, thread::idx() as usize);
        let full_b = !DW.is_multiple_of(64);
        let mut acc_b = [[0f32; 4]; DN];
        let mut sigma = [0f32; 2];
        // Thread: dQ~ parked in the V stages (free now; conflict-free, element-major) while the
        // hot tiles need the registers.
        let park = self.smem.slice((2 * ROWS + 2 * BC) * D, 2 * BC * D).cast::<f32>();
        if n_hot > 0 {
            for (n, acc) in acc_dq.iter().enumerate() {
                for (e, x) in acc.iter().enumerate() {
                    park.st((n * 4 + e) * THREADS + tid, *x);
                }
            }
        }
        for ix in 0..n_hot {
            // The list is written, and the last product is done with stage 0.
            block::sync();
            let j = self.hot.ld(ix) as usize;
            let c1 = (j * BC) as u32;
            unsafe {
                load_tile_in::<T, Sw<BC, D>, D, BC, THREADS, true>(
                    self.k_s(0),
                    self.k_g.add((c1 as u64 * p.k_strides.row) as usize),
                    p.k_strides.row,
                    self.sk - c1,
                    self.d,
                )
            };
            thread::cp_async_commit();
            thread::cp_async_wait::<0>();
            let bad_k = self.clean_k_vote(0, j >= self.n_unmasked);
            // Warpgroup: S = Q K_j^T, then thread: P to 16-bit A fragments.
            let mut s = [[0f32; 4]; NS];
            warpgroup::fence_operands(&mut s);
            warpgroup::fence();
            let (qd, kd) =
                (warpgroup::desc_sw128(self.q_s, 0, 16, 1024).opaque(), warpgroup::desc_sw128(self.k_s(0), 0, 16, 1024).opaque());
            issue_abt::<T, NS, D, ROWS, BC>(qd, kd, &mut s);
            warpgroup::commit();
            warpgroup::wait::<0, NS>(&mut s);
            self.clean_k(0, bad_k);
            for x in s.iter_mut() {
                for (e, x) in x.iter_mut().enumerate() {
                    *x = math::ex2(math::fma(*x, self.factor, -fin[e / 2].0));
                }
            }
            mask_frag::<M, NS>(&mut s, (j * BC) as u32, self.row_w, (self.g, self.t), (self.sq, self.sk), j >= self.n_unmasked, 0.0);
            let mut pa: [[u32; 4]; KS] = core::array::from_fn(|ks| to_a::<T>(s[2 * ks], s[2 * ks + 1]));
            for f in pa.iter() {
                for (e, w) in f.iter().enumerate() {
                    let (a, b) = T::unpack2(*w);
                    sigma[e % 2] += a + b;
                }
            }
            // Warpgroup: B += P K_j, K_j read MN-major (every column with FULL_B).
            let kd =
                warpgroup::desc_sw128(self.k_s(0), Sw::<BC, D>::at(0, if full_b { 0 } else { self.col0 }), Sw::<BC, D>::BLOCK_BYTES, 1024);
            if full_b {
                add_pk::<T, DN, KS>(&mut acc_b, &mut pa, kd.opaque());
            } else if let Some(mine) = acc_b.first_chunk_mut::<DNW>() {
                add_pk::<T, DNW, KS>(mine, &mut pa, kd.opaque());
            }
        }
        if n_hot > 0 {
            for (n, acc) in acc_dq.iter_mut().enumerate() {
                for (e, x) in acc.iter_mut().enumerate() {
                    *x = park.ld((n * 4 + e) * THREADS + tid);
                }
            }
        }
        (acc_b, sigma)
    }
}
