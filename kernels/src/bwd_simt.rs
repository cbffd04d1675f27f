//! The SIMT backward kernels (FA2's backward, correctness first, no tensor cores, no atomics),
//! launched in this order:
//! 1. `dq`: one block per (query tile, head, batch) loops over the key tiles twice: first for
//!    the row's softmax statistics m_i, l_i and D_i = sum_j P_ij dP_ij (written out), then
//!    dS = P * (dP - D) and dQ += scale dS K, in registers. FA2 takes D = rowsum(dO * O) from
//!    O rounded to the input dtype, and P from the saved LSE. Measured in the emulator against
//!    the FA2 bar (twice naive attention's error): D from O made f16 dQ up to 1.8x worse than
//!    naive, and P from LSE made f32 dQ up to 2x worse (LSE's absolute rounding, about
//!    u |LSE|, becomes a relative error of every P of the row). So this path recomputes both
//!    in f32, at one more pass over K and V; O and LSE are not read.
//! 2. `dkdv`: one block per (key tile, KV head, batch) loops over every query row of the KV
//!    head's query-head group, recomputing P from the saved LSE: dV += P^T dO,
//!    dS = P * (dO V^T - D), dK += scale dS^T Q, in registers.
//!
//! Each output element is summed by one thread in a fixed order, so the results are bitwise
//! deterministic (at the price of computing S and dP three times).

use crate::alibi::Alibi;
use crate::block_info::BlockInfo;
use crate::copy::{load_tile_f32, store_tile_f32};
use crate::dev::{self, Shared, block, global, math, thread, warp};
use crate::dtype::Element;
use crate::mask::{Mask, Window, kv_tiles, q_tiles};
use crate::params::BwdParams;
use crate::sinks;
use crate::softcap::Softcap;
use crate::softmax::score_scale;
use crate::tile::{Config, SimtKvTile, SimtTile};
use core::f32::consts::LOG2_E;

/// P_ij = exp(x - m_i) / l_i of the scaled score x, 0 where masked or where the row sees no
/// key (inv_l = 0).
#[inline(always)]
fn prob(x: f32, m: f32, inv_l: f32, masked: bool) -> f32 {
    if masked || inv_l == 0.0 { 0.0 } else { math::ex2((x - m) * LOG2_E) * inv_l }
}

/// The softmax's score from a raw one of (row, col), S_ij * scale (capped: `softcap`; biased:
/// `alibi`), and the factor dS takes from its derivative (1 without a softcap).
#[inline(always)]
fn scaled<M: Mask>(s: f32, scale: f32, (sc, al): (Softcap<M>, Alibi<M>), (row, col): (u32, u32)) -> (f32, f32) {
    let (x, dt) = sc.scaled_rcp(s * score_scale(scale));
    if al.on() { (x + al.bias(row, col), dt) } else { (x, dt) }
}

/// One lane's running softmax statistics of a row, with D_i taken relative to a pivot:
/// c = dP_ij of the key that gives the running max m (its exp is exactly 1) and
/// n = sum_j exp(x_j - m) (dP_ij - c), so D_i - c = n / l. dS_ij = P_ij ((dP_ij - c) - (D_i - c))
/// then cancels in exact terms where dP_ij - D_i is a small difference of large numbers: a row
/// dominated by one key has dP - D = -(D - c) for that key, and D - c (a sum of small terms)
/// carries a relative rounding of a few units, where D itself (about dP_ij, large) would
/// carry an absolute one of u |D_i| (the f32 dQ/dK error of rows that see 2-3 keys, up to
/// 1.8x FA2's bar).
#[derive(Clone, Copy)]
struct RowStats {
    m: f32,
    l: f32,
    n: f32,
    c: f32,
}

impl RowStats {
    const INIT: RowStats = RowStats { m: f32::NEG_INFINITY, l: 0.0, n: 0.0, c: 0.0 };
    /// Folds in one scaled score x (-inf: masked) with its dP.
    #[inline(always)]
    fn push(&mut self, x: f32, dp: f32) {
        if x == f32::NEG_INFINITY {
            return;
        }
        if x > self.m {
            // New max and pivot: alpha = exp(m_old - x), l = alpha l + 1,
            // n = alpha (n + l_old (c_old - dP)) (the new key's own term dP - c is 0), c = dP.
            let alpha = math::ex2((self.m - x) * LOG2_E);
            self.n = (self.n + self.l * (self.c - dp)) * alpha;
            self.l = self.l * alpha + 1.0;
            self.c = dp;
            self.m = x;
        } else {
            // e = exp(x - m): l += e, n += e (dP - c).
            let e = math::ex2((x - self.m) * LOG2_E);
            self.l += e;
            self.n += e * (dp - self.c);
        }
    }
    /// Warp: the row's (m_i, 1 / l_i, D_i - c_i, c_i), combining the lanes on the pivot of a
    /// lane that holds the row's max (the largest such pivot if several do: deterministic),
    /// then the attention sink `sink` (-inf: none, `sinks`) as one more key with dP 0. A row
    /// that sees no key gives (-inf, 0, 0, 0).
    #[inline(always)]
    fn finish(&self, sink: f32) -> (f32, f32, f32, f32) {
        let m = warp::allreduce_max(self.m);
        // A NaN score made its lane's l NaN (the max skips NaNs): the row's statistics are NaN,
        // so are its P and dS (the forward's `softmax::finish_stats` rule). Every lane takes
        // the same branch.
        if warp::any(self.l.is_nan()) {
            return (f32::NAN, f32::NAN, f32::NAN, f32::NAN);
        }
        if m == f32::NEG_INFINITY {
            // Every lane: the warp took the same branch, so the reductions below are skipped
            // by all of it.
            return (m, 0.0, 0.0, 0.0);
        }
        let c = warp::allreduce_max(if self.m == m { self.c } else { f32::NEG_INFINITY });
        // alpha = exp(m_lane - m); l = sum alpha l_lane; n = sum alpha (n_lane + l_lane (c_lane - c)).
        let alpha = math::ex2((self.m - m) * LOG2_E);
        let l = warp::allreduce_sum(self.l * alpha);
        let n = warp::allreduce_sum((self.n + self.l * (self.c - c)) * alpha);
        // (NaN l or m fails both comparisons: a NaN row.)
        if l.is_nan() || l >= f32::INFINITY || m.is_nan() || m.abs() >= crate::softmax::STAT_LIMIT {
            return (f32::NAN, f32::NAN, f32::NAN, f32::NAN);
        }
        // The sink: the whole row's statistics, the same on every lane, take it as a lane's would.
        let mut all = RowStats { m, l, n, c };
        if sink.is_nan() {
            return (f32::NAN, f32::NAN, f32::NAN, f32::NAN);
        }
        all.push(sink, 0.0);
        (all.m, math::rcp(all.l), all.n / all.l, all.c)
    }
}

/// The dK/dV kernel, one tile shape; causal or not at run time, ENTRY: which entry (plain,
/// window, variable-length: `with_window_mask!`). Reads D from the dQ kernel.
///
/// # Safety
/// `p` valid (host-checked); launch with `simt_kv_tile(d)`'s threads and shared memory.
#[inline(always)]
pub unsafe fn dkdv<T: Element, C: Config<Tile = SimtKvTile>, const RK: usize, const DCH: usize, const ENTRY: u8>(p: &BwdParams) {
    const { assert!(RK == C::TILE.keys_per_warp as usize && DCH == C::TILE.d_chunks as usize) };
    unsafe { with_window_mask!(p: T, Keys / C::TILE.bn(), ENTRY, M => dkdv_masked::<T, C, M, RK, DCH>(p)) }
}

#[inline(always)]
unsafe fn dkdv_masked<T: Element, C: Config<Tile = SimtKvTile>, M: Mask, const RK: usize, const DCH: usize>(p: &BwdParams) {
    let tile = C::TILE;
    let (bn, bm, d) = (tile.bn(), SimtKvTile::BM, p.pb.head_dim);
    if d > 32 * DCH as u32 || block::dim() != tile.threads() {
        thread::trap();
    }
    let BlockInfo { blk: kv_blk, h: hk, b } = BlockInfo::keys_per_head();
    let (w, lane) = (warp::id(), warp::lane());
    let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
    let j0 = kv_blk * bn;
    let ds = d + 1; // padded f32 rows: lanes reading one column of different rows hit different banks

    // Shared memory: K, V [bn][d+1]; Q, dO [32][d+1]; m, 1/l, D - c, c [32]; P, dS [bn][32].
    let k_s: Shared<f32> = unsafe { dev::dynamic_shared((bn * ds) as usize) };
    let v_s: Shared<f32> = k_s.after((bn * ds) as usize);
    let q_s: Shared<f32> = v_s.after((bm * ds) as usize);
    let do_s: Shared<f32> = q_s.after((bm * ds) as usize);
    let m_s: Shared<f32> = do_s.after(bm as usize);
    let il_s: Shared<f32> = m_s.after(bm as usize);
    let d_s: Shared<f32> = il_s.after(bm as usize);
    let c_s: Shared<f32> = d_s.after(bm as usize);
    let p_s: Shared<f32> = c_s.after((bn * bm) as usize);
    let ds_s: Shared<f32> = p_s.after((bn * bm) as usize);

    // K_j, V_j: this block's key rows, loaded once.
    unsafe {
        load_tile_f32(k_s, ds, (p.k as *const T).add(p.k_strides.offset(b, 0, hk) as usize), p.k_strides.row, j0, bn, sk, d);
        load_tile_f32(v_s, ds, (p.v as *const T).add(p.v_strides.offset(b, 0, hk) as usize), p.v_strides.row, j0, bn, sk, d);
    }
    let mut acc_dk = [[0f32; DCH]; RK];
    let mut acc_dv = [[0f32; DCH]; RK];
    let group = p.pb.heads_q / p.pb.heads_kv;
    let (win, sc) = (Window::<M>::new(&p.pb), Softcap::<M>::new(&p.pb));
    // The query tiles with rows that see a key of this block (`mask::q_tiles`).
    let (qt_first, n_qt) = q_tiles::<M>(&p.pb, j0, bn, bm);
    // (sq itself without a window: the bound computed from the tile count took the d = 64
    // entry from 167 to 244 registers.)
    let i_end = if M::WINDOW { ((qt_first + n_qt) as u32 * bm).min(sq) } else { sq };
    for g in 0..group {
        let h = hk * group + g;
        let al = unsafe { Alibi::<M>::load(p.alibi, p.alibi_batch, b, h, &p.pb) };
        let (q_g, do_g) = unsafe {
            ((p.q as *const T).add(p.q_strides.offset(b, 0, h) as usize), (p.d_o as *const T).add(p.do_strides.offset(b, 0, h) as usize))
        };
        let mut i0 = qt_first as u32 * bm;
        while i0 < i_end {
            // Block: Q_i, dO_i and the row statistics (m_i, 1/l_i, D_i - c_i, c_i) for query rows i0..i0+32.
            block::sync();
            unsafe {
                load_tile_f32(q_s, ds, q_g, p.q_strides.row, i0, bm, sq, d);
                load_tile_f32(do_s, ds, do_g, p.do_strides.row, i0, bm, sq, d);
                let t = thread::idx();
                if t < bm {
                    let (r, valid) = (i0 + t, i0 + t < sq);
                    let ld =
                        |k: usize, dflt: f32| if valid { global::load((p.stats as *const f32).add(p.stat_at(k, b, h, r))) } else { dflt };
                    m_s.st(t as usize, ld(0, f32::NEG_INFINITY));
                    il_s.st(t as usize, ld(1, 0.0));
                    d_s.st(t as usize, ld(2, 0.0));
                    c_s.st(t as usize, ld(3, 0.0));
                }
            }
            block::sync();

            // Thread (w, lane): query row i0 + lane against the warp's RK key rows.
            let i = i0 + lane;
            let (m_i, il_i, d_i, c_i) = (m_s.ld(lane as usize), il_s.ld(lane as usize), d_s.ld(lane as usize), c_s.ld(lane as usize));
            for r in 0..RK {
                let jl = w * RK as u32 + r as u32;
                let (mut s, mut dp) = (0.0, 0.0);
                for c in 0..d {
                    s += q_s.ld((lane * ds + c) as usize) * k_s.ld((jl * ds + c) as usize);
                    dp += do_s.ld((lane * ds + c) as usize) * v_s.ld((jl * ds + c) as usize);
                }
                let j = j0 + jl;
                let hidden = i >= sq || j >= sk || win.hidden(i, j, sq, sk);
                let (x, dt) = scaled(s, p.pb.scale, (sc, al), (i, j));
                let pij = prob(x, m_i, il_i, hidden);
                p_s.st((jl * bm + lane) as usize, pij);
                // dS_ij = P_ij ((dP_ij - c_i) - (D_i - c_i)), c_i the row's pivot (see `RowStats`),
                // times the softcap's derivative; 0 where hidden, whatever dP holds there.
                ds_s.st((jl * bm + lane) as usize, if hidden { 0.0 } else { pij * ((dp - c_i) - d_i) * dt });
            }
            warp::sync();
            // dV_j += sum_i P_ij dO_i, dK_j += sum_i dS_ij Q_i (scale applied at the end).
            for l in 0..bm {
                let mut q_row = [0f32; DCH];
                let mut do_row = [0f32; DCH];
                for ch in 0..DCH {
                    let c = lane + 32 * ch as u32;
                    if c < d {
                        q_row[ch] = q_s.ld((l * ds + c) as usize);
                        do_row[ch] = do_s.ld((l * ds + c) as usize);
                    }
                }
                for r in 0..RK {
                    let jl = w * RK as u32 + r as u32;
                    // A hidden pair adds nothing (its Q and dO may hold anything): selects, not
                    // a `continue`, which stopped the unroll and sent the accumulators to local
                    // memory.
                    let vis = i0 + l < sq && !win.hidden(i0 + l, j0 + jl, sq, sk);
                    let (pv, dsv) = (p_s.ld((jl * bm + l) as usize), ds_s.ld((jl * bm + l) as usize));
                    for ch in 0..DCH {
                        acc_dv[r][ch] += if vis { pv * do_row[ch] } else { 0.0 };
                        acc_dk[r][ch] += if vis { dsv * q_row[ch] } else { 0.0 };
                    }
                }
            }
            i0 += bm;
        }
    }

    // dK = scale * sum dS^T Q, dV = sum P^T dO: through shared memory (K, V are done with),
    // so the conversion to T runs in a plain block loop and the accumulators keep constant
    // indices (a bf16 conversion inside the unrolled loops stopped the unroll and sent them to
    // local memory).
    block::sync();
    for r in 0..RK {
        let jl = w * RK as u32 + r as u32;
        for ch in 0..DCH {
            let c = lane + 32 * ch as u32;
            if c < d {
                k_s.st((jl * ds + c) as usize, acc_dk[r][ch] * p.pb.scale);
                v_s.st((jl * ds + c) as usize, acc_dv[r][ch]);
            }
        }
    }
    block::sync();
    unsafe {
        store_tile_f32(k_s, ds, (p.dk as *mut T).add(p.dk_strides.offset(b, 0, hk) as usize), p.dk_strides.row, j0, bn, sk, d);
        store_tile_f32(v_s, ds, (p.dv as *mut T).add(p.dv_strides.offset(b, 0, hk) as usize), p.dv_strides.row, j0, bn, sk, d);
    }
}

/// The dQ kernel, one tile shape (the forward's SIMT tile); causal or not at run time, ENTRY:
/// which entry (plain, window, general, variable-length: `with_window_mask!`). Also writes D for the dK/dV kernel.
///
/// # Safety
/// `p` valid (host-checked); launch with `simt_dq_tile(d)`'s threads and `simt_dq_smem_bytes(d)`.
#[inline(always)]
pub unsafe fn dq<T: Element, C: Config<Tile = SimtTile>, const ROWS: usize, const DCH: usize, const SC: usize, const ENTRY: u8>(
    p: &BwdParams,
) {
    const { assert!(ROWS == C::TILE.rows_per_warp as usize && DCH == C::TILE.d_chunks as usize && SC == C::TILE.s_cols as usize) };
    unsafe { with_window_mask!(p: T, QueryRows / C::TILE.br(), ENTRY, M => dq_masked::<T, C, M, ROWS, DCH, SC>(p)) }
}

#[inline(always)]
unsafe fn dq_masked<T: Element, C: Config<Tile = SimtTile>, M: Mask, const ROWS: usize, const DCH: usize, const SC: usize>(p: &BwdParams) {
    let tile = C::TILE;
    let (br, bc, d) = (tile.br(), tile.bc(), p.pb.head_dim);
    if d > tile.max_head_dim() || block::dim() != tile.threads() {
        thread::trap();
    }
    let BlockInfo { blk: q_blk, h, b } = BlockInfo::rows_per_head::<M>(p.pb.seqlen_q.div_ceil(br));
    let (w, lane) = (warp::id(), warp::lane());
    let (sq, sk) = (p.pb.seqlen_q, p.pb.seqlen_k);
    let hk = h / (p.pb.heads_q / p.pb.heads_kv);
    let row0 = q_blk * br;
    let ks = SimtTile::k_stride(d);

    // Shared memory: Q, dO [br][d]; K, V [bc][d+1]; dS [br][bc]; m, 1/l, D - c, c [br], all f32.
    let q_s: Shared<f32> = unsafe { dev::dynamic_shared((br * d) as usize) };
    let do_s: Shared<f32> = q_s.after((br * d) as usize);
    let k_s: Shared<f32> = do_s.after((bc * ks) as usize);
    let v_s: Shared<f32> = k_s.after((bc * ks) as usize);
    let ds_s: Shared<f32> = v_s.after((br * bc) as usize);
    let m_s: Shared<f32> = ds_s.after(br as usize);
    let il_s: Shared<f32> = m_s.after(br as usize);
    let d_s: Shared<f32> = il_s.after(br as usize);
    let c_s: Shared<f32> = d_s.after(br as usize);

    unsafe {
        load_tile_f32(q_s, d, (p.q as *const T).add(p.q_strides.offset(b, 0, h) as usize), p.q_strides.row, row0, br, sq, d);
        load_tile_f32(do_s, d, (p.d_o as *const T).add(p.do_strides.offset(b, 0, h) as usize), p.do_strides.row, row0, br, sq, d);
    }
    let row_end = if row0 + br < sq { row0 + br } else { sq };
    // Key tiles first..n_tiles (`mask::kv_tiles`), every one masked.
    let (n_tiles, first, _) = kv_tiles::<M>(&p.pb, row0, row_end, bc);
    let (n_tiles, first) = (n_tiles as u32, first as u32);
    let (win, sc) = (Window::<M>::new(&p.pb), Softcap::<M>::new(&p.pb));
    let al = unsafe { Alibi::<M>::load(p.alibi, p.alibi_batch, b, h, &p.pb) };
    let r_w = w * ROWS as u32;
    let ctx = DqTile::<T> { p, q_s, do_s, k_s, v_s, _t: core::marker::PhantomData, b, hk, bc, r_w, lane };
    let hidden = |i: usize, c: usize, c0: u32| {
        let (row, col) = (row0 + r_w + i as u32, c0 + lane + 32 * c as u32);
        row >= sq || col >= sk || win.hidden(row, col, sq, sk)
    };

    // Pass 0: the row's softmax statistics m_i, l_i and D_i = sum_j P_ij dP_ij (as D_i - c_i
    // and the pivot c_i, see `RowStats`), from f32 scores and dP.
    let mut part = [RowStats::INIT; ROWS];
    let sink = unsafe { sinks::of_head(p.sinks, h) };
    for jt in first..n_tiles {
        let (s, dp) = unsafe { ctx.scores::<ROWS, SC>(jt) };
        for i in 0..ROWS {
            for c in 0..SC {
                let (row, col) = (row0 + r_w + i as u32, jt * bc + lane + 32 * c as u32);
                part[i].push(
                    if hidden(i, c, jt * bc) { f32::NEG_INFINITY } else { scaled(s[i][c], p.pb.scale, (sc, al), (row, col)).0 },
                    dp[i][c],
                );
            }
        }
    }
    // To shared memory for pass 1, and to the workspace for the dK/dV kernel.
    for (i, rs) in part.iter().enumerate() {
        let (m, il, dd, cc) = rs.finish(sink);
        let r = r_w + i as u32;
        if lane == 0 {
            m_s.st(r as usize, m);
            il_s.st(r as usize, il);
            d_s.st(r as usize, dd);
            c_s.st(r as usize, cc);
            if row0 + r < sq {
                let st = p.stats as *mut f32;
                let at = |k| p.stat_at(k, b, h, row0 + r);
                unsafe {
                    global::store(st.add(at(0)), m);
                    global::store(st.add(at(1)), il);
                    global::store(st.add(at(2)), dd);
                    global::store(st.add(at(3)), cc);
                }
            }
        }
    }
    warp::sync();

    // Pass 1: dS_ij = P_ij ((dP_ij - c_i) - (D_i - c_i)) (times the softcap's derivative),
    // then dQ_i += sum_j dS_ij K_j (scale at the end).
    let mut acc_dq = [[0f32; DCH]; ROWS];
    for jt in first..n_tiles {
        let c0 = jt * bc;
        let kv_len = if sk - c0 < bc { sk - c0 } else { bc };
        let (s, dp) = unsafe { ctx.scores::<ROWS, SC>(jt) };
        for i in 0..ROWS {
            let r = (r_w + i as u32) as usize;
            let (m, il, dd, cc) = (m_s.ld(r), il_s.ld(r), d_s.ld(r), c_s.ld(r));
            for c in 0..SC {
                let hid = hidden(i, c, c0);
                let (x, dt) = scaled(s[i][c], p.pb.scale, (sc, al), (row0 + r as u32, c0 + lane + 32 * c as u32));
                let pij = prob(x, m, il, hid);
                let ds = if hid { 0.0 } else { pij * ((dp[i][c] - cc) - dd) * dt };
                ds_s.st(r * bc as usize + (lane + 32 * c as u32) as usize, ds);
            }
        }
        warp::sync();
        for kk in 0..kv_len {
            let mut k_row = [0f32; DCH];
            for ch in 0..DCH {
                let c = lane + 32 * ch as u32;
                if c < d {
                    k_row[ch] = k_s.ld((kk * ks + c) as usize);
                }
            }
            for i in 0..ROWS {
                // A hidden pair adds nothing (its K may hold anything): selects, as in `dkdv`.
                let row = row0 + r_w + i as u32;
                let vis = row < sq && !win.hidden(row, c0 + kk, sq, sk);
                let dsv = ds_s.ld(((r_w + i as u32) * bc + kk) as usize);
                for ch in 0..DCH {
                    acc_dq[i][ch] += if vis { dsv * k_row[ch] } else { 0.0 };
                }
            }
        }
    }

    // dQ = scale * acc, through shared memory (Q is done with), as in `dkdv`.
    block::sync();
    for i in 0..ROWS {
        for ch in 0..DCH {
            let c = lane + 32 * ch as u32;
            if c < d {
                q_s.st(((r_w + i as u32) * d + c) as usize, acc_dq[i][ch] * p.pb.scale);
            }
        }
    }
    block::sync();
    unsafe { store_tile_f32(q_s, d, (p.dq as *mut T).add(p.dq_strides.offset(b, 0, h) as usize), p.dq_strides.row, row0, br, sq, d) };
}

/// What each key tile of the dQ kernel reads.
struct DqTile<'a, T> {
    _t: core::marker::PhantomData<T>,
    p: &'a BwdParams,
    q_s: Shared<f32>,
    do_s: Shared<f32>,
    k_s: Shared<f32>,
    v_s: Shared<f32>,
    /// Batch and KV head: K_j and V_j are found from them at each load (two pointers kept
    /// across the loop cost the d=64 kernel spills).
    b: u32,
    hk: u32,
    bc: u32,
    r_w: u32,
    lane: u32,
}

impl<T: Element> DqTile<'_, T> {
    /// Block: loads key tile `jt` (K, V) and returns this lane's S_ij and dP_ij = dO_i . V_j
    /// for its rows and key columns.
    #[inline(always)]
    unsafe fn scores<const ROWS: usize, const SC: usize>(&self, jt: u32) -> ([[f32; SC]; ROWS], [[f32; SC]; ROWS]) {
        let (p, d, lane) = (self.p, self.p.pb.head_dim, self.lane);
        let ks = SimtTile::k_stride(d);
        block::sync();
        unsafe {
            let (k_g, v_g) = (
                (p.k as *const T).add(p.k_strides.offset(self.b, 0, self.hk) as usize),
                (p.v as *const T).add(p.v_strides.offset(self.b, 0, self.hk) as usize),
            );
            load_tile_f32(self.k_s, ks, k_g, p.k_strides.row, jt * self.bc, self.bc, p.pb.seqlen_k, d);
            load_tile_f32(self.v_s, ks, v_g, p.v_strides.row, jt * self.bc, self.bc, p.pb.seqlen_k, d);
        }
        block::sync();
        let mut s = [[0f32; SC]; ROWS];
        let mut dp = [[0f32; SC]; ROWS];
        for kk in 0..d {
            let mut kc = [0f32; SC];
            let mut vc = [0f32; SC];
            for c in 0..SC {
                kc[c] = self.k_s.ld(((lane + 32 * c as u32) * ks + kk) as usize);
                vc[c] = self.v_s.ld(((lane + 32 * c as u32) * ks + kk) as usize);
            }
            for i in 0..ROWS {
                let qv = self.q_s.ld(((self.r_w + i as u32) * d + kk) as usize);
                let dov = self.do_s.ld(((self.r_w + i as u32) * d + kk) as usize);
                for c in 0..SC {
                    s[i][c] += qv * kc[c];
                    dp[i][c] += dov * vc[c];
                }
            }
        }
        (s, dp)
    }
}
