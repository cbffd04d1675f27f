//! The tensor-core forward kernel (FA2 class): mma.sync m16n8k16 with f32 accumulation for
//! S = Q K^T and O = P V, ldmatrix for fragments, cp.async double-buffering of K and V.
//!
//! One block per (64 query rows, head, batch), 4 warps; warp w owns query rows 16w..16w+16
//! (one m16 tile), so lane 4g + t holds rows g and g + 8 of its warp's tile and the softmax
//! statistics of a row live in one lane quad. Shared tiles are [rows][D] 16-bit with the
//! 16-byte chunks of row r XOR-swizzled by r % 8, so ldmatrix reads are bank-conflict free.

use crate::dev::{self, Shared, block, global, thread, warp};
use crate::dtype::MmaElement;
use crate::mask::{Causal, Mask, NoMask};
use crate::params::FwdParams;
use crate::softmax::RowState;
use crate::tile::mma_tile;

const BR: usize = 64;
const BC: usize = 64;

/// Entry body for head_dim `D` (`DK = D / 16` k-steps of Q K^T, `DN = D / 8` n-tiles of O:
/// stable Rust cannot derive array lengths from a const parameter); causal or not is chosen
/// at run time.
///
/// # Safety
/// As for the SIMT kernel: `p` valid (host-checked), `p.head_dim == D`, 128 threads and
/// `mma_tile(D).smem_bytes()` bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn entry<T: MmaElement, const D: usize, const DK: usize, const DN: usize>(p: &FwdParams) {
    unsafe {
        if p.causal != 0 {
            fwd::<T, Causal, D, DK, DN>(p)
        } else {
            fwd::<T, NoMask, D, DK, DN>(p)
        }
    }
}

/// Element index of (row r, column c) in a swizzled [rows][D] tile.
#[inline(always)]
fn swz<const D: usize>(r: usize, c: usize) -> usize {
    r * D + (((c / 8) ^ (r % 8)) * 8) + c % 8
}

/// Thread: the ldmatrix row addresses of one lane, for a swizzled [rows][D] tile, with the
/// lane-dependent part computed once. The lane reads row `16 a + row16` (row16 < 16, its
/// position inside a 16-row block) at 16-byte chunk `2 c + cbit`. Since 16 a + row16 = row16
/// mod 8, the swizzle splits as (2c + cbit) ^ r = 16-element offset of (c & !3) + x[c & 3] +
/// 8 (cbit ^ (r & 1)): with `a` and `c` unrolled constants the address is a register plus an
/// immediate, so no address registers pile up across the KV loop.
#[derive(Clone, Copy)]
struct LaneAddr {
    base: usize,
    x: [usize; 4],
}

impl LaneAddr {
    #[inline(always)]
    fn new<const D: usize>(row16: usize, cbit: usize) -> LaneAddr {
        let r = row16 % 8;
        LaneAddr { base: row16 * D + 8 * (cbit ^ (r & 1)), x: [0, 1, 2, 3].map(|i| 8 * ((2 * i) ^ (r & 6))) }
    }
    /// Index of this lane's row in 16-row block `a`, chunk pair `c`.
    #[inline(always)]
    fn at<const D: usize>(&self, a: usize, c: usize) -> usize {
        self.base + a * 16 * D + 16 * (c & !3) + self.x[c & 3]
    }
}

/// Block: cp.async of rows `row0..row0+BR_OR_BC` of a [seqlen, D] slice into a swizzled tile;
/// rows at or past `limit` are zero-filled.
#[inline(always)]
unsafe fn load_tile<T: MmaElement, const D: usize, const ROWS: usize>(dst: Shared<T>, src: *const T, stride: u64, row0: u32, limit: u32) {
    let chunks = ROWS * D / 8;
    let mut e = thread::idx() as usize;
    while e < chunks {
        let (r, c) = (e / (D / 8), (e % (D / 8)) * 8);
        let g = row0 + r as u32;
        let valid = g < limit;
        let at = if valid { g as u64 * stride + c as u64 } else { 0 };
        unsafe { thread::cp_async_16(dst, swz::<D>(r, c), src.add(at as usize), valid) };
        e += (crate::tile::MMA_WARPS * 32) as usize;
    }
}

#[inline(always)]
unsafe fn fwd<T: MmaElement, M: Mask, const D: usize, const DK: usize, const DN: usize>(p: &FwdParams) {
    let Some(tile) = mma_tile(D as u32) else { thread::trap() };
    if p.head_dim != D as u32 || DK * 16 != D || DN * 8 != D || block::dim() != tile.threads() {
        thread::trap();
    }
    let (q_blk, h, b) = block::idx();
    let (w, lane) = (warp::id() as usize, warp::lane() as usize);
    let (g, t) = (lane / 4, lane % 4);
    let (sq, sk) = (p.seqlen_q, p.seqlen_k);
    let h_kv = h / (p.heads_q / p.heads_kv);
    let row0 = q_blk * BR as u32;

    // Shared memory: Q [BR][D], then K stages 0 and 1, V stages 0 and 1 ([BC][D] each).
    let smem: Shared<T> = unsafe { dev::dynamic_shared(BR * D + 4 * BC * D) };
    let q_s = smem.slice(0, BR * D);
    let k_s = |stage: usize| smem.slice(BR * D + stage * BC * D, BC * D);
    let v_s = |stage: usize| smem.slice(BR * D + (2 + stage) * BC * D, BC * D);

    let q_g = unsafe { (p.q as *const T).add(p.q_strides.offset(b, 0, h) as usize) };
    let k_g = unsafe { (p.k as *const T).add(p.k_strides.offset(b, 0, h_kv) as usize) };
    let v_g = unsafe { (p.v as *const T).add(p.v_strides.offset(b, 0, h_kv) as usize) };

    let row_end = if row0 + (BR as u32) < sq { row0 + BR as u32 } else { sq };
    let n_tiles = M::visible_cols(row_end, sq, sk).div_ceil(BC as u32) as usize;
    let n_unmasked = ((M::unmasked_cols(row0, sq, sk) / BC as u32) as usize).min(n_tiles);

    // Prologue: Q and the first K, V tile in flight.
    unsafe {
        load_tile::<T, D, BR>(q_s, q_g, p.q_strides.row, row0, sq);
        if n_tiles > 0 {
            load_tile::<T, D, BC>(k_s(0), k_g, p.k_strides.row, 0, sk);
            load_tile::<T, D, BC>(v_s(0), v_g, p.v_strides.row, 0, sk);
        }
    }
    thread::cp_async_commit();

    let mut acc_o = [[0f32; 4]; DN];
    let mut rows = [RowState::INIT; 2]; // rows g and g + 8 of this warp's tile
    let mut q_frag = [[0u32; 4]; DK];
    // B fragments: K rows (keys) at chunk pairs of d; V rows (keys) at chunk pairs of d, transposed.
    let k_addr = LaneAddr::new::<D>(lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
    let v_addr = LaneAddr::new::<D>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
    for j in 0..n_tiles {
        // Prefetch K_{j+1}, V_{j+1} into the other stage while tile j is computed.
        if j + 1 < n_tiles {
            let c1 = ((j + 1) * BC) as u32;
            unsafe {
                load_tile::<T, D, BC>(k_s((j + 1) % 2), k_g.add((c1 as u64 * p.k_strides.row) as usize), p.k_strides.row, 0, sk - c1);
                load_tile::<T, D, BC>(v_s((j + 1) % 2), v_g.add((c1 as u64 * p.v_strides.row) as usize), p.v_strides.row, 0, sk - c1);
            }
            thread::cp_async_commit();
            thread::cp_async_wait::<1>();
        } else {
            thread::cp_async_wait::<0>();
        }
        block::sync();
        if j == 0 {
            // Q_i fragments, kept in registers for the whole KV loop.
            let qa = LaneAddr::new::<D>(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
            for (kk, f) in q_frag.iter_mut().enumerate() {
                *f = warp::ldmatrix_x4(q_s, qa.at::<D>(w, kk));
            }
        }
        let ctx: Step<T, D, DK> = Step { p, k: k_s(j % 2), v: v_s(j % 2), q_frag: &q_frag, row0: row0 + (w * 16) as u32, g, t, k_addr, v_addr };
        if j < n_unmasked {
            ctx.step::<M, false, DN>(j, &mut acc_o, &mut rows);
        } else {
            ctx.step::<M, true, DN>(j, &mut acc_o, &mut rows);
        }
        // Everyone is done with stage j % 2 before iteration j + 1 refills it.
        block::sync();
    }
    if n_tiles == 0 {
        thread::cp_async_wait::<0>();
    }

    // O = acc_o / l_i, LSE = m_i + log l_i, rows g and g + 8.
    let o_g = unsafe { (p.o as *mut T).add(p.o_strides.offset(b, 0, h) as usize) };
    let lse_g = unsafe { (p.lse as *mut f32).add(((b as u64 * p.heads_q as u64 + h as u64) * sq as u64) as usize) };
    for (half, rs) in rows.iter().enumerate() {
        let (inv_l, lse) = rs.finish::<4>();
        let r = row0 + (w * 16 + g + 8 * half) as u32;
        if r < sq {
            for (n, acc) in acc_o.iter().enumerate() {
                let col = n * 8 + 2 * t;
                let packed = T::pack2(acc[2 * half] * inv_l, acc[2 * half + 1] * inv_l);
                let at = r as u64 * p.o_strides.row + col as u64;
                unsafe { global::store(o_g.add(at as usize) as *mut u32, packed) };
            }
            if t == 0 {
                unsafe { global::store(lse_g.add(r as usize), lse) };
            }
        }
    }
}

/// What one KV step of one warp reads.
struct Step<'a, T: Copy, const D: usize, const DK: usize> {
    p: &'a FwdParams,
    k: Shared<T>,
    v: Shared<T>,
    q_frag: &'a [[u32; 4]; DK],
    /// First query row of this warp's tile.
    row0: u32,
    g: usize,
    t: usize,
    k_addr: LaneAddr,
    v_addr: LaneAddr,
}

impl<T: MmaElement, const D: usize, const DK: usize> Step<'_, T, D, DK> {
    /// One iteration of the KV loop over key tile `j`, for this warp's 16 query rows;
    /// MASKED adds the mask and the seqlen_k bound to the scores.
    #[inline(always)]
    fn step<M: Mask, const MASKED: bool, const DN: usize>(&self, j: usize, acc_o: &mut [[f32; 4]; DN], rows: &mut [RowState; 2]) {
        let p = self.p;
        let (g, t) = (self.g, self.t);
        let c0 = (j * BC) as u32;

        // S_ij = Q_i K_j^T: BC/8 n-tiles of m16n8, k over D in steps of 16.
        let mut acc_s = [[0f32; 4]; BC / 8];
        for (kk, qf) in self.q_frag.iter().enumerate() {
            for np in 0..BC / 16 {
                let b = warp::ldmatrix_x4(self.k, self.k_addr.at::<D>(np, kk));
                acc_s[2 * np] = T::mma(*qf, [b[0], b[1]], acc_s[2 * np]);
                acc_s[2 * np + 1] = T::mma(*qf, [b[2], b[3]], acc_s[2 * np + 1]);
            }
        }

        // Scores times softmax_scale, masked where MASKED; split by row (g, g + 8).
        let mut s = [[0f32; BC / 4]; 2];
        for (n, a) in acc_s.iter().enumerate() {
            for e in 0..4 {
                let (half, c) = (e / 2, n * 8 + 2 * t + e % 2);
                let mut x = a[e] * p.scale;
                if MASKED {
                    let (row, col) = (self.row0 + (g + 8 * half) as u32, c0 + c as u32);
                    if col >= p.seqlen_k || M::hides(row, col, p.seqlen_q, p.seqlen_k) {
                        x = f32::NEG_INFINITY;
                    }
                }
                s[half][n * 2 + e % 2] = x;
            }
        }

        // Online softmax per row over the lane quad; rescale acc_o by alpha.
        for half in 0..2 {
            let alpha = rows[half].update::<4, { BC / 4 }>(&mut s[half]);
            for a in acc_o.iter_mut() {
                a[2 * half] *= alpha;
                a[2 * half + 1] *= alpha;
            }
        }

        // O += P_ij V_j: P's C-fragment layout is the A-fragment layout of the next mma.
        for kc in 0..BC / 16 {
            let pa = [
                T::pack2(s[0][4 * kc], s[0][4 * kc + 1]),
                T::pack2(s[1][4 * kc], s[1][4 * kc + 1]),
                T::pack2(s[0][4 * kc + 2], s[0][4 * kc + 3]),
                T::pack2(s[1][4 * kc + 2], s[1][4 * kc + 3]),
            ];
            for dp in 0..DN / 2 {
                let b = warp::ldmatrix_x4_trans(self.v, self.v_addr.at::<D>(kc, dp));
                acc_o[2 * dp] = T::mma(pa, [b[0], b[1]], acc_o[2 * dp]);
                acc_o[2 * dp + 1] = T::mma(pa, [b[2], b[3]], acc_o[2 * dp + 1]);
            }
        }
    }
}
