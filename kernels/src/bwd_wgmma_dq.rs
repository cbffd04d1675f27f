//! The Hopper dQ kernel (sm_90a), the first of the Hopper backward's two kernels: see
//! [`crate::bwd_wgmma`] for the algorithm, the exact correction and the order of the launches.

use crate::alibi::Alibi;
use crate::block_info::BlockInfo;
use crate::copy::{body_head_dim, by_element, load_tile_in, load_two};
use crate::dev::{self, Shared, block, global, math, thread, warp, warpgroup};
use crate::dtype::MmaElement;
use crate::frag::{store_rows, to_a};
use crate::mask::{Mask, Window, kv_tiles, kv_unmasked};
use crate::nonfinite::{own_chunks_nonfinite, zero_own_nonfinite};
use crate::params::BwdParams;
use crate::sinks;
use crate::smem::Sw;
use crate::softcap::{Softcap, dtanh_mufu};
use crate::softmax::QuadRow;
use crate::tile::{Config, HOT_TILES, WgmmaBwdTile};
use crate::wg_tile::{add_pk, issue_abt, mask_frag, wg_warp_lane};
use core::f32::consts::LOG2_E;
use core::marker::PhantomData;

/// Query rows per dQ block: one warpgroup's M.
const ROWS: usize = 64;
/// DQ_SAVED: a key tile is hot for a dQ block when one of its rows has P > HOT_P there.
const HOT_P: f32 = 0.125;
/// [`dq`] computes dQ (and D_i for [`dkdv`](crate::bwd_wgmma::dkdv)), the statistics read from the workspace (written
/// by `bwd_prep::prep` from the forward's LSE and O).
pub const DQ_SAVED: u8 = 1;
/// [`dq`] computes the statistics m_i, 1 / l_i, D_i for [`dkdv`](crate::bwd_wgmma::dkdv) with DQ (the atomic
/// backward's first kernel), no dQ.
pub const DQ_STATS: u8 = 2;

/// The dQ kernel for one tile `C` (as [`dkdv`](crate::bwd_wgmma::dkdv)): D = 8 DN, key tiles of BC = 8 NS = 16 KS keys,
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
    const ENTRY: u8,
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
        with_window_mask!(p: T, QueryRows / WgmmaBwdTile::ROWS, ENTRY, M => match MODE != DQ_STATS && by_element(PAD, p.pb.head_dim) {
            false => dq_masked::<T, M, D, DN, BC, NS, KS, NSW, KSW, THREADS, DW, DNW, PAD, MODE, false, ENTRY>(p),
            true => dq_masked::<T, M, D, DN, BC, NS, KS, NSW, KSW, THREADS, DW, DNW, PAD, MODE, true, ENTRY>(p),
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
    const ENTRY: u8,
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
    let mut qb = DqBlock::<T, M, D, DN, BC, NS, KS, NSW, KSW, THREADS, DW, DNW, PAD, MODE, EL, ENTRY>::new(p, d, saved);
    let (n_tiles, first) = (qb.n_tiles, qb.first);

    // Block: Q_i, dO_i and the first K, V tile in flight.
    qb.load_q();
    if n_tiles > 0 {
        qb.load_kv(first, 0);
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

    // One pass over the key tiles first.. (DQ_SAVED: dQ, DQ_STATS: the statistics),
    // double-buffered.
    for it in 0..n_tiles {
        let j = first + it;
        // Block: prefetch the next iteration's K, V into the other stage while this one is
        // computed.
        if it + 1 < n_tiles {
            qb.load_kv(j + 1, (it + 1) % 2);
            thread::cp_async_commit();
            thread::cp_async_wait::<1>();
        } else {
            thread::cp_async_wait::<0>();
        }
        // This tile's copies landed, for every thread and for the async proxy; on masked tiles
        // the block votes on whether K holds a NaN or an infinity (`nonfinite`).
        let masked = qb.tile_masked(j);
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
            n_hot = qb.list_hot(it, j, n_hot);
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
/// variant, methods inlined as the closures they replace were, as `bwd_wgmma::DkdvBlock` (why there).
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
    const ENTRY: u8,
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
    /// The block's first row of Q and dO, row 0 of its KV head's K and V.
    q_g: *const T,
    do_g: *const T,
    k_g: *const T,
    v_g: *const T,
    /// Key tiles the block's rows see: `n_tiles` from tile `first` on (a window's left edge),
    /// and those below `n_unmasked` no row's mask hides; with a window, those of
    /// `from..n_unmasked` (`mask::kv_unmasked`: [`tile_masked`](Self::tile_masked)).
    n_tiles: usize,
    first: usize,
    from: usize,
    n_unmasked: usize,
    /// scale log2(e), for exp2.
    factor: f32,
    /// The head's ALiBi bias in the log2 domain (`alibi`; off outside the general entries).
    alibi: Alibi<M>,
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
    const ENTRY: u8,
> DqBlock<'a, T, M, D, DN, BC, NS, KS, NSW, KSW, THREADS, DW, DNW, PAD, MODE, EL, ENTRY>
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

        let r0 = row0.min(sq);
        let (q_g, do_g) = unsafe {
            ((p.q as *const T).add(p.q_strides.offset(b, r0, h) as usize), (p.d_o as *const T).add(p.do_strides.offset(b, r0, h) as usize))
        };
        let (k_g, v_g) = unsafe {
            ((p.k as *const T).add(p.k_strides.offset(b, 0, hk) as usize), (p.v as *const T).add(p.v_strides.offset(b, 0, hk) as usize))
        };

        let row_end = (row0 + ROWS as u32).min(sq);
        let (end, first, n_unmasked) = kv_tiles::<M>(&p.pb, row0, row_end, BC as u32);
        let (from, n_unmasked) = match M::WINDOW {
            true => kv_unmasked::<M>(&p.pb, row0, row_end, BC as u32),
            false => (first, n_unmasked),
        };
        let n_tiles = end - first;
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
            q_g,
            do_g,
            k_g,
            v_g,
            n_tiles,
            first,
            from,
            n_unmasked,
            factor: 0.0,
            alibi: unsafe { Alibi::<M>::load(p.alibi, p.alibi_batch, b, h, &p.pb) }.log2(),
            mask: PhantomData,
        }
    }

    /// The launch's softcap (DQ_SAVED): off but in the general entries (the variable-length
    /// ones leave it to another family: `registry::BwdFamilyDesc::softcap_varlen`).
    #[inline(always)]
    fn softcap(&self) -> Softcap<M> {
        Softcap::new_if(ENTRY == crate::ENTRY_GENERAL && MODE == DQ_SAVED, &self.p.pb)
    }

    /// Thread (DQ_SAVED): P = exp2(S scale log2(e) + bias - m_i) in place of the unscaled
    /// scores `s` of the keys from `c0` on (`prep` gives 1 / l_i = 1; the bias is ALiBi's, in
    /// one uniform branch). Without a softcap (`capped`).
    #[inline(always)]
    fn probs<const N: usize>(&self, s: &mut [[f32; 4]; N], c0: u32, fin: &[(f32, f32, f32); 2]) {
        let u = self.factor;
        let al = self.alibi.opaque();
        if al.on() {
            al.frag::<N>(s, u, c0, self.row_w, (self.g, self.t));
            for x in s.iter_mut() {
                for (e, x) in x.iter_mut().enumerate() {
                    *x = math::ex2(*x - fin[e / 2].0);
                }
            }
        } else {
            for x in s.iter_mut() {
                for (e, x) in x.iter_mut().enumerate() {
                    *x = math::ex2(math::fma(*x, u, -fin[e / 2].0));
                }
            }
        }
    }

    /// Thread (DQ_SAVED), with a softcap: for each element of the unscaled scores `s` of the
    /// keys from `c0` on, t = tanh(S k) and P = exp2(t cap log2(e) + bias - m_i) (the bias
    /// ALiBi's, as `Alibi::frag`), then `f(row half, n-tile, element, P, 1 - t^2, hidden)` in
    /// the element's place, with P = 1 - t^2 = 0 where `masked` hides the key (as
    /// `mask_frag`); element by element, so that no
    /// tile of t or P is held beside the scores (with a tile of 1 - t^2 the entry spilled
    /// at d = 192).
    #[inline(always)]
    fn capped<const N: usize>(
        &self,
        s: &mut [[f32; 4]; N],
        c0: u32,
        fin: &[(f32, f32, f32); 2],
        masked: bool,
        mut f: impl FnMut(usize, usize, usize, f32, f32, bool) -> f32,
    ) {
        let sc = self.softcap();
        let (kf, u) = (sc.opaque_k(self.p.pb.scale), sc.cap() * LOG2_E);
        let al = self.alibi.opaque();
        let win = Window::<M>::new(&self.p.pb).opaque();
        for half in 0..2 {
            let row = self.row_w + (self.g + 8 * half) as u32;
            let lane_c0 = c0 + 2 * self.t as u32;
            let base = al.offset(row, lane_c0);
            // The row's visible keys lo..hi from the lane's first column (`mask_frag`).
            let span = 8 * N as i64 + 1;
            let lo = (win.first_col(row, self.sq, self.sk) as i64 - lane_c0 as i64).clamp(-1, span) as i32;
            let hi = (win.end_col(row + 1, self.sq, self.sk) as i64 - lane_c0 as i64).clamp(-1, span) as i32;
            for (n, x) in s.iter_mut().enumerate() {
                for e in 0..2 {
                    let t = kf.tanh_mufu(x[2 * half + e]);
                    let k = (n * 8 + e) as i32;
                    let y = if al.on() { t * u + al.at(base, k as f32) } else { t * u };
                    let hidden = masked && (k < lo || k >= hi);
                    let (p, dt) = if hidden { (0.0, 0.0) } else { (math::ex2(y - fin[half].0), dtanh_mufu(t)) };
                    x[2 * half + e] = f(half, n, 2 * half + e, p, dt, hidden);
                }
            }
        }
    }

    /// Block: Q_i and dO_i (zero rows past seqlen_q), cp.async, not committed.
    #[inline(always)]
    fn load_q(&self) {
        let (p, row0, sq, d) = (self.p, self.row0, self.sq, self.d);
        unsafe {
            load_tile_in::<T, Sw<ROWS, D>, D, ROWS, THREADS, true>(self.q_s, self.q_g, p.q_strides.row, sq - row0.min(sq), d);
            load_tile_in::<T, Sw<ROWS, D>, D, ROWS, THREADS, true>(self.do_s, self.do_g, p.do_strides.row, sq - row0.min(sq), d);
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
                (p.dq as *mut T).add(p.dq_strides.offset(self.b, 0, self.h) as usize + col0),
                p.dq_strides.row,
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
        let (k_row, v_row) = (self.p.k_strides.row, self.p.v_strides.row);
        unsafe {
            load_two::<T, Sw<BC, D>, D, BC, THREADS>(
                [self.k_s(stage), self.v_s(stage)],
                [self.k_g, self.v_g],
                [k_row, v_row],
                c1,
                self.sk,
                self.d,
            )
        };
    }

    /// Lane quad: the rows' final statistics, also to the workspace for the dK/dV kernel
    /// (every row below seqlen_q, fully masked ones too).
    #[inline]
    fn publish(&self, rows: &[QuadRow; 2]) -> [(f32, f32, f32); 2] {
        // The head's attention sink, in the log2 domain of the statistics (-inf: none).
        let sink2 = unsafe { sinks::of_head(self.p.sinks, self.h) } * LOG2_E;
        let fin = [rows[0].finish(sink2), rows[1].finish(sink2)];
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

    /// Whether key tile `j` needs the mask (some row of the block does not see some key of
    /// it, or it reaches past seqlen_k).
    #[inline(always)]
    fn tile_masked(&self, j: usize) -> bool {
        match M::WINDOW {
            true => j < self.from || j >= self.n_unmasked,
            false => j >= self.n_unmasked,
        }
    }

    /// Block (DQ_SAVED), after iteration `it`'s barrier: its key tile `j` joins the list of hot
    /// tiles if a warp voted so (every thread reads the same votes; at most HOT_TILES are
    /// listed); returns the new length.
    #[inline(always)]
    fn list_hot(&self, it: usize, j: usize, n_hot: usize) -> usize {
        let at = 4 * self.split * (it % 2);
        let mut any = 0;
        for v in 0..4 * self.split {
            any |= self.votes.ld(at + v);
        }
        if any == 0 || n_hot >= HOT_TILES {
            return n_hot;
        }
        if self.wg == 0 && self.w == 0 && self.lane == 0 {
            self.hot.st(n_hot, j as u32);
        }
        n_hot + 1
    }

    /// Thread: `hidden` where key tile j hides S (one uniform branch: true on the last tiles
    /// only).
    #[inline(always)]
    fn mask(&self, s: &mut [[f32; 4]; NSW], j: usize, masked: bool, hidden: f32) {
        let win = Window::<M>::new(&self.p.pb).opaque();
        mask_frag::<M, NSW>(s, (j * BC + self.key_w) as u32, self.row_w, (self.g, self.t), (self.sq, self.sk), masked, hidden, win)
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
        let mut ds = [[0f32; 4]; NSW];
        let mut p_max = [0f32; 2]; // rows g and g + 8: the warp votes on any of its rows
        if self.softcap().on() {
            // With a softcap (`capped`): delta from dS~ as above, the product's dS~ times
            // 1 - t^2 (0 where masked, whatever the row's D and dP hold).
            ds = *s;
            self.capped::<NSW>(&mut ds, (j * BC + self.key_w) as u32, fin, masked, |half, n, e, p, dt, hidden| {
                let x = if hidden { 0.0 } else { p * (dp[n][e] - fin[half].2) };
                p_max[half] = p_max[half].max(p);
                delta[half] += x;
                x * dt
            });
        } else {
            let mut pt = *s;
            self.probs::<NSW>(&mut pt, (j * BC + self.key_w) as u32, fin);
            self.mask(&mut pt, j, masked, 0.0);
            for n in 0..NSW {
                for e in 0..4 {
                    ds[n][e] = pt[n][e] * (dp[n][e] - fin[e / 2].2);
                }
            }
            // 0 where masked, whatever the row's D and dP hold.
            self.mask(&mut ds, j, masked, 0.0);
            for n in 0..NSW {
                for e in 0..4 {
                    p_max[e / 2] = p_max[e / 2].max(pt[n][e]);
                    delta[e / 2] += ds[n][e];
                }
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
            // Warp: whether one of its rows has a key with P > HOT_P (1 - P_sink,i), a large
            // part of the row's key weight, among its warpgroup's keys of this tile.
            let hot = |half: usize| p_max[half] > HOT_P * (1.0 - self.sink_weight(fin[half].0));
            let v = warp::any(hot(0) || hot(1));
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
            // P_sink = exp(s_h - LSE_i): the row's key weights sum to 1 - P_sink, so delta_i =
            // D_i - D~_i (1 - P_sink) and the exact dS_ij sum to D_i P_sink over the keys.
            let ps = self.sink_weight(fin[half].0);
            let dd = if ps == 0.0 { fin[half].2 + dl } else { fin[half].2 * (1.0 - ps) + dl };
            let r = self.row_w + (self.g + 8 * half) as u32;
            if self.wg == 0 && self.t == 0 && r < self.sq {
                unsafe { global::store((self.p.stats as *mut f32).add(self.p.stat_at(2, b_late, self.h, r)), dd) };
            }
            // With a softcap the exact dS_ij = P_ij (1 - t_ij^2) (dP_ij - D_i) do not sum to
            // 0: dQ_i -= (D_i - D~_i) B_i, B_i over P (1 - t^2) (`hot_sums`), wherever a tile
            // is hot; the other keys keep FA2's error.
            let cap = self.softcap().on();
            if (cap && n_hot > 0) || (!cap && sg > 0.0 && sg >= 0.5 * (1.0 - ps)) {
                let c = match (cap, ps == 0.0) {
                    (true, _) => dd - fin[half].2,
                    (false, true) => dl_t / sg,
                    (false, false) => (dl_t - dd * ps) / sg,
                };
                let b_mine: [[f32; 4]; DNW] = core::array::from_fn(|n| if full_b && self.wg == 1 { acc_b[DNW + n] } else { acc_b[n] });
                for (acc, bb) in acc_dq.iter_mut().zip(b_mine.iter()) {
                    acc[2 * half] -= c * bb[2 * half];
                    acc[2 * half + 1] -= c * bb[2 * half + 1];
                }
            }
        }
    }

    /// Thread: P_sink,i = exp(s_h - LSE_i) of a row whose m_i is `m` (0 without a sink, in a
    /// uniform branch; 0 for m = +inf).
    #[inline(always)]
    fn sink_weight(&self, m: f32) -> f32 {
        // The head's attention sink in the log2 domain of m_i (-inf: none).
        let sink2 = unsafe { sinks::of_head(self.p.sinks, self.h) } * LOG2_E;
        if sink2 == f32::NEG_INFINITY { 0.0 } else { math::ex2(sink2 - m) }
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
            let bad_k = self.clean_k_vote(0, self.tile_masked(j));
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
            if self.softcap().on() {
                // With a softcap, B_i over P (1 - t^2), dQ's coefficients (`correct`).
                self.capped::<NS>(&mut s, (j * BC) as u32, fin, self.tile_masked(j), |_, _, _, p, dt, _| p * dt);
            } else {
                self.probs::<NS>(&mut s, (j * BC) as u32, fin);
                let win = Window::<M>::new(&self.p.pb).opaque();
                mask_frag::<M, NS>(
                    &mut s,
                    (j * BC) as u32,
                    self.row_w,
                    (self.g, self.t),
                    (self.sq, self.sk),
                    self.tile_masked(j),
                    0.0,
                    win,
                );
            }
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
