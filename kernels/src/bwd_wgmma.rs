//! The Hopper backward kernels (sm_90a): FA2's backward on `wgmma.mma_async` with f32
//! accumulation, one warpgroup per block up to head_dim 128; above it two: in [`dkdv`] the
//! first computes S^T and P^T and accumulates dV, the second dP^T and dS^T (P^T from the
//! first through shared memory) and accumulates dK (one accumulator of D columns each), in
//! [`dq`](crate::bwd_wgmma_dq::dq) they split every key tile (see there). Three launches: `bwd_prep` (m_i, 1 / l_i from the
//! forward's LSE, D~_i = dO_i . O_i), then [`dq`](crate::bwd_wgmma_dq::dq), then [`dkdv`]; a fixed summation order
//! (bitwise deterministic):
//! - [`dq`](crate::bwd_wgmma_dq::dq) ([`DQ_SAVED`](crate::bwd_wgmma_dq::DQ_SAVED)): one block per (64 query rows, head, batch), one pass over the key
//!   tiles: S = Q K_j^T and dP = dO V_j^T with both operands from shared memory, P = exp2(S
//!   scale log2 e - m_i) / l_i, dS~ = P (dP - D~_i), dQ~_i += dS~ K_j with dS~ from registers
//!   and K_j read MN-major. Then the exact correction below, and D_i for the dK/dV kernel.
//!   With [`DQ_STATS`](crate::bwd_wgmma_dq::DQ_STATS) the rows' m_i, l_i, D_i from S and dP instead (the `wgmma_atomic`
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
//! - With an attention sink (`sinks`) the row's key weights sum to 1 - P_sink,i (P_sink,i =
//!   exp(s_h - LSE_i), LSE_i the forward's): delta_i = D_i - D~_i (1 - P_sink,i), so D_i =
//!   D~_i (1 - P_sink,i) + delta_i, the exact dS_ij sum to D_i P_sink,i, and the correction
//!   takes ((delta~_i - D_i P_sink,i) / sigma_i) B_i where the hot tiles hold at least half
//!   of the row's key weight; a key is hot where P > (1 - P_sink,i) / 8 (a row dominated by
//!   its sink has keys of small P whose dS still cancel). D_i is also what the sink's
//!   gradient sums (`bwd_sinks`).
//!
//! ALiBi (`alibi`, the general entries): the recomputed P and P^T take the bias in the log2
//! domain (S scale log2 e + bias log2 e - m_i, m_i from the forward's LSE, which counts it);
//! dS keeps its form and the correction its reasoning.
//!
//! A softcap (`softcap`, the general entries, not the variable-length ones): P and P^T from
//! t = tanh(S k) (`tanh.approx`, as the forward computed it) in the log2 domain, t cap log2 e
//! (+ ALiBi's bias) - m_i, and dS_ij = P_ij (1 - t_ij^2) (dP_ij - D_i), the derivative taken
//! element by element beside P (a tile of it held spilled the d = 128 dK/dV and d = 192 dQ
//! entries). The exact dS then no longer sum to 0 over a row: the dQ kernel's delta_i (from
//! P (dP - D~_i), without the derivative) still gives D_i = D~_i + delta_i, and the
//! correction becomes dQ_i -= (D_i - D~_i) B_i with B_i = sum_j P_ij (1 - t_ij^2) K_j over
//! the hot tiles (wherever there are any): the keys left out keep FA2's error, as above.
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

use crate::alibi::Alibi;
use crate::block_info::BlockInfo;
use crate::copy::{body_head_dim, by_element, load_tile_in, load_two};
use crate::mask::{Mask, Window, q_tiles};
use crate::nonfinite::{clean_own_pair, dkdv_tile_masked, own_chunks_nonfinite, warp_fix_stored_dv, zero_own_nonfinite};
use crate::params::BwdParams;
use crate::smem::Sw;
use crate::softcap::{Softcap, dtanh_mufu};
use crate::tile::{Config, WgmmaBwdTile};
use crate::wg_tile::{issue_abt, wg_warp_lane};
use core::f32::consts::LOG2_E;
use core::marker::PhantomData;

/// Keys per block: one warpgroup's M.
const KEYS: usize = 64;

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
    const ENTRY: u8,
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
        with_window_mask!(p: T, Keys / WgmmaBwdTile::KEYS, ENTRY, M => match !DQ && by_element(PAD, p.pb.head_dim) {
            false => dkdv_masked::<T, M, D, DN, BR, NQ, KQ, THREADS, NACC, PAD, DQ, false, ENTRY>(p),
            true => dkdv_masked::<T, M, D, DN, BR, NQ, KQ, THREADS, NACC, PAD, DQ, true, ENTRY>(p),
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
    const ENTRY: u8,
>(
    p: &BwdParams,
) {
    // Without PAD, head_dim is exactly D and the padding checks compile away.
    let d = body_head_dim::<D, EL>(PAD, p.pb.head_dim);
    if p.pb.head_dim > D as u32 || (!PAD && p.pb.head_dim != D as u32) || d == 0 || block::dim() != THREADS as u32 {
        thread::trap();
    }
    let mut kb = DkdvBlock::<T, M, D, DN, BR, NQ, KQ, THREADS, NACC, PAD, DQ, EL, ENTRY>::new(p, d);

    // Block: K_j, V_j (zero rows past seqlen_k: their dK, dV are computed and not stored).
    kb.load_k();
    unsafe {
        load_tile_in::<T, Sw<KEYS, D>, D, KEYS, THREADS, true>(
            kb.v_s,
            (kb.p.v as *const T).add(kb.v_at),
            kb.p.v_strides.row,
            kb.sk - kb.j0.min(kb.sk),
            kb.d,
        );
    }

    // The query tiles that see any key of this block, for every query head of the group
    // (as bwd_mma::dkdv); set here, after K's copy was issued, where the kernel always
    // computed them.
    (kb.qt_first, kb.n_qt) = q_tiles::<M>(&kb.p.pb, kb.j0, KEYS as u32, BR as u32);
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
        // Masked tiles: those a window's edge crosses, the diagonal, the tile past seqlen_q,
        // with DQ the block past seqlen_k (`nonfinite::dkdv_tile_masked`).
        const { assert!(KEYS == 64) };
        let masked = dkdv_tile_masked::<M>(i0, BR as u32, kb.j0, kb.sq, kb.sk, DQ, Window::<M>::new(&kb.p.pb).opaque());
        // This tile's copies (and K, V) landed, for every thread and for the async proxy; on
        // masked tiles Q's and dO's NaNs and infinities replaced by 0 first, and with DQ at
        // the first tile the block votes on K's (`nonfinite`).
        let (mut bad, mut kv) = (false, false);
        // With a softcap an infinite Q element gives finite scores (+-cap, tanh' = 0): S^T
        // must see Q as it is, so only dO is cleaned here and Q once S^T is done (`q_late`).
        let capped = kb.softcap().on();
        if masked && capped {
            bad = own_chunks_nonfinite::<T, Sw<BR, D>, D, BR, THREADS>(kb.q_s(it % 2))
                | own_chunks_nonfinite::<T, Sw<BR, D>, D, BR, THREADS>(kb.do_s(it % 2));
            if bad {
                zero_own_nonfinite::<T, Sw<BR, D>, D, BR, THREADS>(kb.do_s(it % 2));
            }
        } else if masked {
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
        let q_late = capped && bad;
        if kb.split {
            kb.prefetch(it, n_iter);
            kb.step_split(it % 2, h, i0, (masked, k_bad, q_late), &mut acc[0]);
        } else {
            let (dv, dk) = acc.split_at_mut(1);
            kb.step(it % 2, h, i0, (masked, k_bad, q_late), &mut dk[0], &mut dv[0]);
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
        let (dst, st, factor) = if kb.wg * NACC + k == 0 { (p.dv, &p.dv_strides, 1.0) } else { (p.dk, &p.dk_strides, p.pb.scale) };
        let dst = unsafe { (dst as *mut T).add(st.offset(kb.b, 0, kb.hk) as usize) };
        unsafe { store_rows::<T, DN, true>(a, factor, dst, st.row, kb.key0, kb.sk, kb.d) };
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
        let d_o = p.d_o + 2 * p.do_strides.offset(kb.b, 0, kb.hk * group);
        // Both below 2^32 (the host's validation).
        let do_strides = (p.do_strides.row << 32) | p.do_strides.head;
        let shape = ((group as u64) << 48) | ((kb.d as u64) << 32) | ((BR as u64) << 16) | DQ as u64;
        // SAFETY: dV rows below seqlen_k, dO rows below seqlen_q of the group's heads.
        unsafe {
            warp_fix_stored_dv::<T, M>(
                p.dv + 2 * p.dv_strides.offset(kb.b, 0, kb.hk),
                p.dv_strides.row,
                d_o,
                do_strides,
                ((kb.key0 as u64) << 32) | kb.j0 as u64,
                ((kb.sq as u64) << 32) | kb.sk as u64,
                shape,
                Window::<M>::new(&p.pb).pack(),
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
    const ENTRY: u8,
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
    /// Offsets of the block's first key row in K and in V.
    k_at: usize,
    v_at: usize,
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
    const ENTRY: u8,
> DkdvBlock<'a, T, M, D, DN, BR, NQ, KQ, THREADS, NACC, PAD, DQ, EL, ENTRY>
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
        let (k_at, v_at) = (p.k_strides.offset(b, j0.min(sk), hk) as usize, p.v_strides.offset(b, j0.min(sk), hk) as usize);

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
            k_at,
            v_at,
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
                (p.k as *const T).add(self.k_at),
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
        // From an `opaque` batch index: the offsets' loop-invariant parts, hoisted, held two
        // 64-bit registers more over the loop (the atomic kernel spilled at d=128).
        let bo = thread::opaque(b as u64) as u32;
        let (q_at, do_at) = (p.q_strides.offset(bo, 0, h) as usize, p.do_strides.offset(bo, 0, h) as usize);
        let src = unsafe { [(p.q as *const T).add(q_at), (p.d_o as *const T).add(do_at)] };
        unsafe {
            load_two::<T, Sw<BR, D>, D, BR, THREADS>(
                [self.q_s(stage), self.do_s(stage)],
                src,
                [p.q_strides.row, p.do_strides.row],
                i0,
                sq,
                d,
            )
        };
        // The statistics' loaders: threads 0..BR, with two warpgroups the second's (the first
        // starts S^T, P^T right after this).
        let tid = if split { (thread::idx() as usize).wrapping_sub(warpgroup::SIZE as usize) } else { thread::idx() as usize };
        if tid < BR {
            let r = i0 + tid as u32;
            let valid = r < sq;
            // The row's address (as `stat_at`) rebuilt here from an `opaque` batch index: its
            // loop-invariant part, hoisted, was the one value ptxas spilled at `.maxnreg 168`
            // (d=64).
            let row = p.stats_strides.offset(thread::opaque(b as u64) as u32, r, h);
            let n = p.stats_plane as usize;
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

    /// The launch's softcap: off but in the general entries (the variable-length ones leave
    /// it to another family: `registry::BwdFamilyDesc::softcap_varlen`).
    #[inline(always)]
    fn softcap(&self) -> Softcap<M> {
        Softcap::new_if(ENTRY == crate::ENTRY_GENERAL && !DQ, &self.p.pb)
    }

    /// Thread: P^T = exp2(x u + bias - m) / l per query column in place of the unscaled S^T
    /// `s` of query head `h`'s tile from row `i0`: x the raw score and u = scale log2(e), or
    /// with a softcap x = t = tanh(S^T k) and u = cap log2(e), 1 - t^2 into `dt` (`softcap`);
    /// the bias is ALiBi's in the log2 domain (each in one uniform branch; m, 1 / l from the
    /// stage's `m_row`, `il_row`).
    #[inline(always)]
    fn probs_t(&self, s: &mut [[f32; 4]; NQ], dt: &mut [[f32; 4]; NQ], h: u32, i0: u32, m_row: Shared<f32>, il_row: Shared<f32>) {
        let sc = self.softcap();
        let mut u = self.factor;
        if sc.on() {
            let kf = sc.opaque_k(self.p.pb.scale);
            for (x, d) in s.as_flattened_mut().iter_mut().zip(dt.as_flattened_mut()) {
                *x = kf.tanh_mufu(*x);
                *d = dtanh_mufu(*x);
            }
            u = sc.cap() * LOG2_E;
        }
        let al = unsafe { Alibi::<M>::load(self.p.alibi, self.p.alibi_batch, self.b, h, &self.p.pb) }.log2();
        let u = if al.on() {
            al.frag_t::<NQ>(s, u, i0, self.key0, (self.g, self.t));
            1.0
        } else {
            u
        };
        for (n, x) in s.iter_mut().enumerate() {
            let c = n * 8 + 2 * self.t;
            let (ms, ils) = ([m_row.ld(c), m_row.ld(c + 1)], [il_row.ld(c), il_row.ld(c + 1)]);
            for (e, x) in x.iter_mut().enumerate() {
                *x = math::ex2(*x * u - ms[e % 2]) * ils[e % 2];
            }
        }
    }

    /// Thread: whether element e of n-tile n of S^T (query tile from row `i0`) is a masked
    /// pair under the window `win` (with DQ, also a key past seqlen_k). For the masked tiles
    /// only: `masked` is uniform and true on diagonal and window-edge tiles, one branch around
    /// the whole mask (a branch per element became selects in every tile in the forward
    /// kernel); the window's bounds fresh each tile (`Window::opaque`).
    #[inline(always)]
    fn hidden_t(&self, win: Window<M>, n: usize, e: usize, i0: u32) -> bool {
        let (key, query) = (self.key0 + (self.g + 8 * (e / 2)) as u32, i0 + (n * 8 + 2 * self.t + e % 2) as u32);
        (DQ && key >= self.sk) || query >= self.sq || win.hidden(query, key, self.sq, self.sk)
    }

    /// Thread, with a softcap (`probs_t`'s work, fused): per pair of n-tiles, t = tanh(S^T k),
    /// P^T = exp2(t cap log2(e) + bias - m) / l (-0.0 where `masked` hides the pair), P^T to
    /// its 16-bit A fragment (returned), then P^T (1 - t^2) in place of S^T, dS^T's factor (a
    /// masked -0.0 stays): the derivative is never held for the whole tile (with a tile of it,
    /// the entry spilled at d = 128).
    #[inline(always)]
    fn probs_capped_t(
        &self,
        s: &mut [[f32; 4]; NQ],
        h: u32,
        i0: u32,
        (m_row, il_row): (Shared<f32>, Shared<f32>),
        masked: bool,
        win: Window<M>,
    ) -> [[u32; 4]; KQ] {
        let sc = self.softcap();
        let (kf, u) = (sc.opaque_k(self.p.pb.scale), sc.cap() * LOG2_E);
        // ALiBi's bias in the log2 domain, from each key row's offset (as `Alibi::frag_t`).
        let al = unsafe { Alibi::<M>::load(self.p.alibi, self.p.alibi_batch, self.b, h, &self.p.pb) }.log2();
        let base = core::array::from_fn::<_, 2, _>(|half| al.offset(i0 + 2 * self.t as u32, self.key0 + (self.g + 8 * half) as u32));
        core::array::from_fn(|kq| {
            let mut q = [[0f32; 4]; 2];
            for (k, q) in q.iter_mut().enumerate() {
                let n = 2 * kq + k;
                let c = n * 8 + 2 * self.t;
                let (ms, ils) = ([m_row.ld(c), m_row.ld(c + 1)], [il_row.ld(c), il_row.ld(c + 1)]);
                for (e, q) in q.iter_mut().enumerate() {
                    let t = kf.tanh_mufu(s[n][e]);
                    let x = if al.on() { t * u + al.at(base[e / 2], -((8 * n + e % 2) as f32)) } else { t * u };
                    let hidden = masked && self.hidden_t(win, n, e, i0);
                    s[n][e] = if hidden { -0.0 } else { math::ex2(x - ms[e % 2]) * ils[e % 2] };
                    *q = if hidden { -0.0 } else { s[n][e] * dtanh_mufu(t) };
                }
            }
            let a = to_a::<T>(s[2 * kq], s[2 * kq + 1]);
            (s[2 * kq], s[2 * kq + 1]) = (q[0], q[1]);
            a
        })
    }

    /// Block, once every S^T of stage `st` is done: Q's NaNs and infinities replaced by 0
    /// (each thread's own chunks), visible to the async proxy before dK's product.
    #[inline(always)]
    fn clean_q_late(&self, st: usize) {
        block::sync();
        zero_own_nonfinite::<T, Sw<BR, D>, D, BR, THREADS>(self.q_s(st));
        thread::fence_proxy_async();
        block::sync();
    }

    /// Warpgroup (one a block): one query tile (stage `st`, query head h, first row i0):
    /// dV_j += P^T dO_i into `acc_dv`, dK_j += dS^T Q_i into `acc_dk`, with DQ dQ_i +=
    /// dS_ij K_j into the f32 accumulator; `masked` applies the causal mask (and with DQ hides
    /// the keys past seqlen_k). `k_bad`: K holds a NaN or an infinity (with DQ; `nonfinite`).
    /// `q_late`: Q's NaNs and infinities are replaced by 0 once S^T is done, for dK's product
    /// (with a softcap, on masked tiles where the block found one).
    #[inline(always)]
    fn step(
        &self,
        st: usize,
        h: u32,
        i0: u32,
        (masked, k_bad, q_late): (bool, bool, bool),
        acc_dk: &mut [[f32; 4]; DN],
        acc_dv: &mut [[f32; 4]; DN],
    ) {
        let (m_row, il_row, d_row) = (self.m_s(st), self.il_s(st), self.dd_s(st));
        // Thread: the statistics of its query columns n * 8 + 2t, + 1 of n-tile n.
        let stat = |i: usize| (m_row.ld(i), il_row.ld(i), d_row.ld(i));

        // S^T = K_j Q_i^T.
        let mut s = [[0f32; 4]; NQ];
        warpgroup::fence_operands(&mut s);
        warpgroup::fence();
        Self::issue_t(self.k_s, self.q_s(st), &mut s);
        warpgroup::wait::<0, NQ>(&mut s);
        if q_late {
            // Every warp's S^T read Q: its NaNs and infinities as 0 for dK's product.
            self.clean_q_late(st);
        }
        // Thread: P^T = exp2(S^T scale log2(e) - m) / l per query column (0 where the row sees
        // no key: m = +inf), then 0 where masked: after the exponential, since with a negative
        // scale a masked -inf score would become +inf. With a softcap, `probs_capped_t`.
        let win = Window::<M>::new(&self.p.pb).opaque();
        let mut pa = if self.softcap().on() {
            self.probs_capped_t(&mut s, h, i0, (m_row, il_row), masked, win)
        } else {
            self.probs_t(&mut s, &mut [[0f32; 4]; NQ], h, i0, m_row, il_row);
            if masked {
                // -0.0 marks a masked pair for dS below (a visible P is +0.0 or more).
                for (n, x) in s.iter_mut().enumerate() {
                    for (e, x) in x.iter_mut().enumerate() {
                        if self.hidden_t(win, n, e, i0) {
                            *x = -0.0;
                        }
                    }
                }
            }
            Self::pack(&s)
        };
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
    fn step_split(&self, st: usize, h: u32, i0: u32, (masked, k_bad, q_late): (bool, bool, bool), acc: &mut [[f32; 4]; DN]) {
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
            // masked (as in `step`), to the exchange; with a softcap P^T (1 - t^2) to it.
            let mut dt = [[0f32; 4]; NQ];
            self.probs_t(&mut x, &mut dt, h, i0, m_row, il_row);
            if masked {
                let win = Window::<M>::new(&self.p.pb).opaque();
                for (n, x) in x.iter_mut().enumerate() {
                    for (e, x) in x.iter_mut().enumerate() {
                        let (key, query) = (self.key0 + (self.g + 8 * (e / 2)) as u32, i0 + (n * 8 + 2 * self.t + e % 2) as u32);
                        if (DQ && key >= self.sk) || query >= self.sq || win.hidden(query, key, self.sq, self.sk) {
                            *x = -0.0;
                            dt[n][e] = 0.0;
                        }
                    }
                }
            }
            let cap = self.softcap().on();
            for (n, x) in x.iter().enumerate() {
                for (e, x) in x.iter().enumerate() {
                    pf.st(at(n, e), if cap { *x * dt[n][e] } else { *x });
                }
            }
        }
        // P^T landed.
        block::sync();
        if q_late {
            // The first warpgroup's S^T read Q (waited before the barrier): as `step`.
            self.clean_q_late(st);
        }
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
