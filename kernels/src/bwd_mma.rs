//! The tensor-core backward kernels (FA2's backward, f16 and bf16): mma.sync m16n8k16 with
//! f32 accumulation, ldmatrix fragments, cp.async double buffering, no atomics. Launched in
//! this order, on one stream:
//! 1. `dq`: one block per (64 query rows, head, batch), as the forward: warp w owns query
//!    rows 16w..16w+16, Q_i and dO_i fragments in registers. It first computes
//!    D_i = rowsum(dO_i * O_i) in f32 (FA2) and writes D_i and LSE_i log2(e) to the `stats`
//!    workspace for the dK/dV kernel, then loops over the key tiles:
//!    P_ij = exp(S_ij scale - LSE_i) (from the forward's LSE), dP_ij = dO_i V_j^T,
//!    dS_ij = P_ij (dP_ij - D_i), dQ_i += dS_ij K_j; dQ_i = scale dQ_i at the end.
//! 2. `dkdv`: one block per (64 keys, KV head, batch), warp w owns keys 16w..16w+16 and loops
//!    over every query tile of every query head of the KV head's group. It computes in the
//!    transposed orientation (keys as the mma's rows), so P^T and dS^T come out of the mma as
//!    C fragments that are already the A fragments of dV += P^T dO and dK += dS^T Q, with no
//!    shared-memory transpose: S^T = K Q^T, dP^T = V dO^T.
//! Every output element is summed by one lane in a fixed order: bitwise deterministic.
//! A kernel compiled for D serves every head_dim d <= D that is a multiple of 8: columns d..D
//! are zero-filled in shared memory (they add nothing to S or dP) and never stored.
//!
//! Fully masked query rows (causal, seqlen_q > seqlen_k) have LSE = -inf; they are stored as
//! LSE log2(e) = +inf, so exp2(S - LSE) = 0 with no special case. Query rows past seqlen_q
//! (zero-filled Q, dO) get the same, so their P and dS are 0.

use crate::dev::{self, Shared, block, global, math, thread, warp};
use crate::dtype::MmaElement;
use crate::fwd_mma::{LaneAddr, Layout, load_tile};
use crate::mask::{Causal, Mask, NoMask};
use crate::params::BwdParams;
use crate::tile::MMA_WARPS;
use core::f32::consts::LOG2_E;

/// Rows (queries for dq, keys for dkdv) per block: 16 per warp.
const BLOCK_ROWS: usize = 16 * MMA_WARPS as usize;

/// Index of workspace row `r` of statistic `k` (0: LSE log2 e, 2: D) in `stats`.
#[inline(always)]
fn stat_at(p: &BwdParams, k: usize, b: u32, h: u32, r: u32) -> usize {
    let n = p.batch as usize * p.heads_q as usize * p.seqlen_q as usize;
    k * n + (b as usize * p.heads_q as usize + h as usize) * p.seqlen_q as usize + r as usize
}

/// The four A-fragment registers of a 16x16 tile from two adjacent m16n8 C fragments (the C
/// layout of n-tiles 2k, 2k+1 packed to 16 bits is the A layout of k-step k).
#[inline(always)]
fn to_a<T: MmaElement>(lo: [f32; 4], hi: [f32; 4]) -> [u32; 4] {
    [T::pack2(lo[0], lo[1]), T::pack2(lo[2], lo[3]), T::pack2(hi[0], hi[1]), T::pack2(hi[2], hi[3])]
}

/// Warp: stores 16 rows x D columns of C fragments (rows `row0 + g`, `+ 8`) times `factor`
/// to a [seqlen, d] slice in T, skipping rows at or past `limit` and columns at or past `d`.
#[inline(always)]
unsafe fn store_rows<T: MmaElement, const DN: usize>(acc: &[[f32; 4]; DN], factor: f32, dst: *mut T, stride: u64, row0: u32, limit: u32, d: u32) {
    let (g, t) = ((warp::lane() / 4) as usize, (warp::lane() % 4) as usize);
    for half in 0..2 {
        let r = row0 + (g + 8 * half) as u32;
        if r < limit {
            for (n, a) in acc.iter().enumerate() {
                // A guard, not a `break`: an early exit stops the unroll.
                let col = n * 8 + 2 * t;
                if (col as u32) < d {
                    let packed = T::pack2(a[2 * half] * factor, a[2 * half + 1] * factor);
                    unsafe { global::store(dst.add((r as u64 * stride + col as u64) as usize) as *mut u32, packed) };
                }
            }
        }
    }
}

/// The dQ kernel for one tile: D = 16 DK = 8 DN, Bc = BC = 8 NS keys per K/V tile; causal
/// or not at run time. Also writes D_i and LSE_i log2(e) to the workspace.
///
/// # Safety
/// `p` valid (host-checked), `p.head_dim <= D`, 128 threads, `mma_bwd_tile(D).dq_smem_bytes()`
/// bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn dq<T: MmaElement, const D: usize, const DK: usize, const DN: usize, const BC: usize, const NS: usize>(p: &BwdParams) {
    unsafe {
        if p.causal != 0 { dq_masked::<T, Causal, D, DK, DN, BC, NS>(p) } else { dq_masked::<T, NoMask, D, DK, DN, BC, NS>(p) }
    }
}

#[inline(always)]
unsafe fn dq_masked<T: MmaElement, M: Mask, const D: usize, const DK: usize, const DN: usize, const BC: usize, const NS: usize>(
    p: &BwdParams,
) {
    let br = BLOCK_ROWS;
    let d = p.head_dim;
    if d > D as u32 || d % 8 != 0 || DK * 16 != D || DN * 8 != D || NS * 8 != BC || block::dim() != MMA_WARPS * 32 {
        thread::trap();
    }
    let (q_blk, h, b) = block::idx();
    let (w, lane) = (warp::id() as usize, warp::lane() as usize);
    let (g, t) = (lane / 4, lane % 4);
    let (sq, sk) = (p.seqlen_q, p.seqlen_k);
    let hk = h / (p.heads_q / p.heads_kv);
    let row0 = q_blk * br as u32;

    // Shared memory: Q, dO [br][D], then K stages 0 and 1, V stages 0 and 1 ([BC][D] each).
    let rs = Layout::<D>::STRIDE;
    let smem: Shared<T> = unsafe { dev::dynamic_shared((2 * br + 4 * BC) * rs) };
    let q_s = smem.slice(0, br * rs);
    let do_s = smem.slice(br * rs, br * rs);
    let k_s = |stage: usize| smem.slice((2 * br + stage * BC) * rs, BC * rs);
    let v_s = |stage: usize| smem.slice((2 * br + (2 + stage) * BC) * rs, BC * rs);

    let q_at = p.q_strides.offset(b, 0, h) as usize;
    let kv_at = p.k_strides.offset(b, 0, hk) as usize;
    let (q_g, do_g, o_g) = unsafe { ((p.q as *const T).add(q_at), (p.d_o as *const T).add(q_at), (p.o as *const T).add(q_at)) };
    let (k_g, v_g) = unsafe { ((p.k as *const T).add(kv_at), (p.v as *const T).add(kv_at)) };
    let first = (row0.min(sq) as u64 * p.q_strides.row) as usize;

    let row_end = (row0 + br as u32).min(sq);
    let n_tiles = M::visible_cols(row_end, sq, sk).div_ceil(BC as u32) as usize;
    let n_unmasked = ((M::unmasked_cols(row0, sq, sk) / BC as u32) as usize).min(n_tiles);

    // Block: Q_i, dO_i and the first K, V tile in flight.
    unsafe {
        load_tile::<T, D>(q_s, br, q_g.add(first), p.q_strides.row, sq - row0.min(sq), d);
        load_tile::<T, D>(do_s, br, do_g.add(first), p.q_strides.row, sq - row0.min(sq), d);
        if n_tiles > 0 {
            load_tile::<T, D>(k_s(0), BC, k_g, p.k_strides.row, sk, d);
            load_tile::<T, D>(v_s(0), BC, v_g, p.k_strides.row, sk, d);
        }
    }
    thread::cp_async_commit();

    // Lane quad: D_i = rowsum(dO_i * O_i) in f32 for rows g and g + 8 of the warp's m16 tile
    // (lane 4g + t takes column pairs 2t + 8k), and LSE_i log2(e) (+inf for a row that sees no
    // key, or past seqlen_q); both to the workspace for the dK/dV kernel.
    let mut lse2 = [f32::INFINITY; 2];
    let mut d_row = [0f32; 2];
    for half in 0..2 {
        let r = row0 + (w * 16 + g + 8 * half) as u32;
        let mut acc = 0f32;
        if r < sq {
            let at = (r as u64 * p.q_strides.row) as usize;
            let mut c = 2 * t as u32;
            while c < d {
                unsafe {
                    let (x0, x1) = (global::load(do_g.add(at + c as usize)), global::load(do_g.add(at + c as usize + 1)));
                    let (y0, y1) = (global::load(o_g.add(at + c as usize)), global::load(o_g.add(at + c as usize + 1)));
                    acc += x0.to_f32() * y0.to_f32() + x1.to_f32() * y1.to_f32();
                }
                c += 8;
            }
        }
        d_row[half] = warp::allreduce_sum_in::<4>(acc);
        if r < sq {
            let lse = unsafe { global::load((p.lse as *const f32).add(stat_at(p, 0, b, h, r))) };
            lse2[half] = if lse == f32::NEG_INFINITY { f32::INFINITY } else { lse * LOG2_E };
            if t == 0 {
                unsafe {
                    global::store((p.stats as *mut f32).add(stat_at(p, 0, b, h, r)), lse2[half]);
                    global::store((p.stats as *mut f32).add(stat_at(p, 2, b, h, r)), d_row[half]);
                }
            }
        }
    }

    let mut acc_dq = [[0f32; 4]; DN];
    let mut q_frag = [[0u32; 4]; DK];
    let mut do_frag = [[0u32; 4]; DK];
    // A fragments (rows of a 16-row block, chunk pairs) and transposed B fragments share
    // these addresses; non-transposed B fragments (rows as n) use `b_addr`.
    let a_addr = LaneAddr::new::<D>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
    let b_addr = LaneAddr::new::<D>(lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
    for j in 0..n_tiles {
        // Block: prefetch K_{j+1}, V_{j+1} into the other stage while tile j is computed.
        if j + 1 < n_tiles {
            let c1 = ((j + 1) * BC) as u32;
            unsafe {
                load_tile::<T, D>(k_s((j + 1) % 2), BC, k_g.add((c1 as u64 * p.k_strides.row) as usize), p.k_strides.row, sk - c1, d);
                load_tile::<T, D>(v_s((j + 1) % 2), BC, v_g.add((c1 as u64 * p.k_strides.row) as usize), p.k_strides.row, sk - c1, d);
            }
            thread::cp_async_commit();
            thread::cp_async_wait::<1>();
        } else {
            thread::cp_async_wait::<0>();
        }
        block::sync();
        if j == 0 {
            // Warp: Q_i and dO_i fragments of its 16 rows, kept for the whole loop.
            for kk in 0..DK {
                q_frag[kk] = warp::ldmatrix_x4(q_s, a_addr.at::<D>(w, kk));
                do_frag[kk] = warp::ldmatrix_x4(do_s, a_addr.at::<D>(w, kk));
            }
        }
        let ctx = DqStep::<T, D, DK> {
            p,
            k: k_s(j % 2),
            v: v_s(j % 2),
            q_frag: &q_frag,
            do_frag: &do_frag,
            a_addr,
            b_addr,
            row0: row0 + (w * 16) as u32,
            g,
            t,
            lse2,
            d_row,
        };
        if j < n_unmasked {
            ctx.step::<M, false, DN, BC, NS>(j, &mut acc_dq);
        } else {
            ctx.step::<M, true, DN, BC, NS>(j, &mut acc_dq);
        }
        // Everyone is done with stage j % 2 before iteration j + 1 refills it.
        block::sync();
    }
    if n_tiles == 0 {
        thread::cp_async_wait::<0>();
    }

    // Warp: dQ_i = scale * acc, rows of its m16 tile, in T.
    unsafe { store_rows::<T, DN>(&acc_dq, p.scale, (p.dq as *mut T).add(q_at), p.q_strides.row, row0 + (w * 16) as u32, sq, d) };
}

/// What one key tile of the dQ kernel reads, per warp.
struct DqStep<'a, T: Copy, const D: usize, const DK: usize> {
    p: &'a BwdParams,
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
    /// LSE_i log2(e) and D_i of rows g and g + 8.
    lse2: [f32; 2],
    d_row: [f32; 2],
}

impl<T: MmaElement, const D: usize, const DK: usize> DqStep<'_, T, D, DK> {
    /// Warp: dQ_i += dS_ij K_j for key tile `j`; MASKED applies the mask and seqlen_k.
    #[inline(always)]
    fn step<M: Mask, const MASKED: bool, const DN: usize, const BC: usize, const NS: usize>(&self, j: usize, acc_dq: &mut [[f32; 4]; DN]) {
        let p = self.p;
        let (g, t) = (self.g, self.t);
        let c0 = (j * BC) as u32;
        let factor = p.scale * LOG2_E;

        // S_ij = Q_i K_j^T and dP_ij = dO_i V_j^T: NS n-tiles of m16n8, k over D.
        let mut s = [[0f32; 4]; NS];
        let mut dp = [[0f32; 4]; NS];
        for kk in 0..DK {
            for np in 0..NS / 2 {
                let kb = warp::ldmatrix_x4(self.k, self.b_addr.at::<D>(np, kk));
                s[2 * np] = T::mma(self.q_frag[kk], [kb[0], kb[1]], s[2 * np]);
                s[2 * np + 1] = T::mma(self.q_frag[kk], [kb[2], kb[3]], s[2 * np + 1]);
                let vb = warp::ldmatrix_x4(self.v, self.b_addr.at::<D>(np, kk));
                dp[2 * np] = T::mma(self.do_frag[kk], [vb[0], vb[1]], dp[2 * np]);
                dp[2 * np + 1] = T::mma(self.do_frag[kk], [vb[2], vb[3]], dp[2 * np + 1]);
            }
        }

        // P_ij = exp2(S_ij scale log2(e) - LSE_i log2(e)), 0 where masked; then
        // dS_ij = P_ij (dP_ij - D_i), in place of S.
        for n in 0..NS {
            for e in 0..4 {
                let half = e / 2;
                let mut x = s[n][e] * factor - self.lse2[half];
                if MASKED {
                    let row = self.row0 + (g + 8 * half) as u32;
                    let col = c0 + (n * 8 + 2 * t + e % 2) as u32;
                    if col >= p.seqlen_k || M::hides(row, col, p.seqlen_q, p.seqlen_k) {
                        x = f32::NEG_INFINITY;
                    }
                }
                s[n][e] = math::ex2(x) * (dp[n][e] - self.d_row[half]);
            }
        }

        // dQ_i += dS_ij K_j: dS's C fragments are the A fragments; K is the B operand with
        // keys as the reduction dimension (ldmatrix .trans, as the forward reads V).
        for kc in 0..NS / 2 {
            let a = to_a::<T>(s[2 * kc], s[2 * kc + 1]);
            for dn in 0..DN / 2 {
                let kb = warp::ldmatrix_x4_trans(self.k, self.a_addr.at::<D>(kc, dn));
                acc_dq[2 * dn] = T::mma(a, [kb[0], kb[1]], acc_dq[2 * dn]);
                acc_dq[2 * dn + 1] = T::mma(a, [kb[2], kb[3]], acc_dq[2 * dn + 1]);
            }
        }
    }
}

/// The dK/dV kernel for one tile: D = 16 DK = 8 DN, query tiles of BR = 8 NQ rows; KVREG keeps
/// the warp's K and V fragments in registers (else they are re-read from shared memory at
/// every query tile). Causal or not at run time. Reads D_i and LSE_i log2(e) from the dQ
/// kernel's workspace.
///
/// # Safety
/// `p` valid (host-checked), `p.head_dim <= D`, 128 threads,
/// `mma_bwd_tile(D).dkdv_smem_bytes()` bytes of dynamic shared memory; the dQ kernel has run.
#[inline(always)]
pub unsafe fn dkdv<T: MmaElement, const D: usize, const DK: usize, const DN: usize, const BR: usize, const NQ: usize, const KVREG: bool>(
    p: &BwdParams,
) {
    unsafe {
        if p.causal != 0 {
            dkdv_masked::<T, Causal, D, DK, DN, BR, NQ, KVREG>(p)
        } else {
            dkdv_masked::<T, NoMask, D, DK, DN, BR, NQ, KVREG>(p)
        }
    }
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
>(
    p: &BwdParams,
) {
    let bc = BLOCK_ROWS;
    let d = p.head_dim;
    if d > D as u32 || d % 8 != 0 || DK * 16 != D || DN * 8 != D || NQ * 8 != BR || block::dim() != MMA_WARPS * 32 {
        thread::trap();
    }
    let (kv_blk, hk, b) = block::idx();
    let (w, lane) = (warp::id() as usize, warp::lane() as usize);
    let (g, t) = (lane / 4, lane % 4);
    let (sq, sk) = (p.seqlen_q, p.seqlen_k);
    let j0 = kv_blk * bc as u32;

    // Shared memory: K, V [bc][D]; Q stages 0, 1 and dO stages 0, 1 ([BR][D] each); then f32
    // LSE_i log2(e) stages 0, 1 and D_i stages 0, 1 ([BR] each).
    let rs = Layout::<D>::STRIDE;
    let smem: Shared<T> = unsafe { dev::dynamic_shared((2 * bc + 4 * BR) * rs) };
    let k_s = smem.slice(0, bc * rs);
    let v_s = smem.slice(bc * rs, bc * rs);
    let q_s = |stage: usize| smem.slice((2 * bc + stage * BR) * rs, BR * rs);
    let do_s = |stage: usize| smem.slice((2 * bc + (2 + stage) * BR) * rs, BR * rs);
    let f_s: Shared<f32> = smem.after(4 * BR);
    let lse_s = |stage: usize| f_s.slice(stage * BR, BR);
    let dd_s = |stage: usize| f_s.slice((2 + stage) * BR, BR);

    let kv_at = p.k_strides.offset(b, 0, hk) as usize;
    let first = (j0.min(sk) as u64 * p.k_strides.row) as usize;
    unsafe {
        load_tile::<T, D>(k_s, bc, (p.k as *const T).add(kv_at + first), p.k_strides.row, sk - j0.min(sk), d);
        load_tile::<T, D>(v_s, bc, (p.v as *const T).add(kv_at + first), p.k_strides.row, sk - j0.min(sk), d);
    }

    // The query tiles that see any key of this block: from the first row that sees key j0
    // (bottom-right causal: i >= j0 - (sk - sq)), for every query head of the group.
    let i_first = M::first_visible_row(j0, sq, sk);
    let qt_first = (i_first / BR as u32) as usize;
    let n_qt = (sq.div_ceil(BR as u32) as usize).saturating_sub(qt_first);
    let group = (p.heads_q / p.heads_kv) as usize;
    let n_iter = group * n_qt;
    // Iteration it: query head and first row of its tile.
    let tile_of = |it: usize| ((hk as usize * group + it / n_qt) as u32, ((qt_first + it % n_qt) * BR) as u32);

    // Block: Q_i, dO_i (cp.async) and LSE_i log2(e), D_i (plain loads) of iteration `it` into
    // stage `stage`; rows past seqlen_q get Q = dO = 0, LSE log2(e) = +inf, D = 0.
    let fetch = |it: usize, stage: usize| {
        let (h, i0) = tile_of(it);
        let q_at = (p.q_strides.offset(b, 0, h) + i0 as u64 * p.q_strides.row) as usize;
        unsafe {
            load_tile::<T, D>(q_s(stage), BR, (p.q as *const T).add(q_at), p.q_strides.row, sq - i0, d);
            load_tile::<T, D>(do_s(stage), BR, (p.d_o as *const T).add(q_at), p.q_strides.row, sq - i0, d);
        }
        let tid = thread::idx() as usize;
        if tid < BR {
            let r = i0 + tid as u32;
            let valid = r < sq;
            let ld = |k: usize, dflt: f32| if valid { unsafe { global::load((p.stats as *const f32).add(stat_at(p, k, b, h, r))) } } else { dflt };
            lse_s(stage).st(tid, ld(0, f32::INFINITY));
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
    let a_addr = LaneAddr::new::<D>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
    let b_addr = LaneAddr::new::<D>(lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
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
        let (_, i0) = tile_of(it);
        let ctx = KvStep::<T, D, DK, KVREG> {
            p,
            k: k_s,
            v: v_s,
            q: q_s(it % 2),
            d_o: do_s(it % 2),
            lse2: lse_s(it % 2),
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
        };
        // Diagonal tiles: the tile's first row hides the block's last key.
        if M::hides(i0, j0 + bc as u32 - 1, sq, sk) {
            ctx.step::<M, true, DN, BR, NQ>(&mut acc_dk, &mut acc_dv);
        } else {
            ctx.step::<M, false, DN, BR, NQ>(&mut acc_dk, &mut acc_dv);
        }
        // Everyone is done with stage it % 2 before iteration it + 1 refills it.
        block::sync();
    }
    if n_iter == 0 {
        thread::cp_async_wait::<0>();
    }

    // Warp: dK_j = scale * acc_dk, dV_j = acc_dv, rows of its 16 keys, in T.
    let key0 = j0 + (w * 16) as u32;
    unsafe {
        store_rows::<T, DN>(&acc_dk, p.scale, (p.dk as *mut T).add(kv_at), p.k_strides.row, key0, sk, d);
        store_rows::<T, DN>(&acc_dv, 1.0, (p.dv as *mut T).add(kv_at), p.k_strides.row, key0, sk, d);
    }
}

/// What one query tile of the dK/dV kernel reads, per warp.
struct KvStep<'a, T: Copy, const D: usize, const DK: usize, const KVREG: bool> {
    p: &'a BwdParams,
    k: Shared<T>,
    v: Shared<T>,
    q: Shared<T>,
    d_o: Shared<T>,
    lse2: Shared<f32>,
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
}

impl<T: MmaElement, const D: usize, const DK: usize, const KVREG: bool> KvStep<'_, T, D, DK, KVREG> {
    /// Warp: dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i for this query tile; MASKED applies
    /// the causal mask.
    #[inline(always)]
    fn step<M: Mask, const MASKED: bool, const DN: usize, const BR: usize, const NQ: usize>(
        &self,
        acc_dk: &mut [[f32; 4]; DN],
        acc_dv: &mut [[f32; 4]; DN],
    ) {
        let p = self.p;
        let (g, t) = (self.g, self.t);
        let factor = p.scale * LOG2_E;

        // S^T = K_j Q_i^T and dP^T = V_j dO_i^T (keys x queries): NQ n-tiles of m16n8, k over D.
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

        // P^T = exp2(S^T scale log2(e) - LSE log2(e)) per query column, 0 where masked;
        // dS^T = P^T (dP^T - D) per query column, in place of dP^T.
        for n in 0..NQ {
            let c = n * 8 + 2 * t;
            let (l0, l1) = (self.lse2.ld(c), self.lse2.ld(c + 1));
            let (d0, d1) = (self.d_row.ld(c), self.d_row.ld(c + 1));
            for e in 0..4 {
                let (lse, dd) = if e % 2 == 0 { (l0, d0) } else { (l1, d1) };
                let mut x = s[n][e] * factor - lse;
                if MASKED {
                    let key = self.key0 + (g + 8 * (e / 2)) as u32;
                    if M::hides(self.i0 + (c + e % 2) as u32, key, p.seqlen_q, p.seqlen_k) {
                        x = f32::NEG_INFINITY;
                    }
                }
                let pe = math::ex2(x);
                s[n][e] = pe;
                dp[n][e] = pe * (dp[n][e] - dd);
            }
        }

        // dV_j += P^T dO_i and dK_j += dS^T Q_i: P^T and dS^T C fragments are A fragments;
        // dO and Q are B operands with queries as the reduction dimension (ldmatrix .trans).
        for kc in 0..NQ / 2 {
            let pa = to_a::<T>(s[2 * kc], s[2 * kc + 1]);
            let da = to_a::<T>(dp[2 * kc], dp[2 * kc + 1]);
            for dn in 0..DN / 2 {
                let ob = warp::ldmatrix_x4_trans(self.d_o, self.a_addr.at::<D>(kc, dn));
                acc_dv[2 * dn] = T::mma(pa, [ob[0], ob[1]], acc_dv[2 * dn]);
                acc_dv[2 * dn + 1] = T::mma(pa, [ob[2], ob[3]], acc_dv[2 * dn + 1]);
                let qb = warp::ldmatrix_x4_trans(self.q, self.a_addr.at::<D>(kc, dn));
                acc_dk[2 * dn] = T::mma(da, [qb[0], qb[1]], acc_dk[2 * dn]);
                acc_dk[2 * dn + 1] = T::mma(da, [qb[2], qb[3]], acc_dk[2 * dn + 1]);
            }
        }
    }
}
