//! The SIMT forward kernel: correct for every shape and dtype, no tensor cores.
//!
//! One block per (query tile of Br rows, head, batch), 4 warps. Q, K, V tiles are staged in
//! shared memory as f32. Each warp owns rows_per_warp query rows; lane l owns score columns
//! l + 32i and output columns l + 32j, so S, P, m_i, l_i and acc_o of a row live in the
//! registers of one warp and the only cross-lane traffic is the warp's own max and sum.

use crate::alibi::Alibi;
use crate::copy::load_tile_f32;
use crate::dev::{self, Shared, block, global, thread, warp};
use crate::dtype::Element;
use crate::mask::{Mask, Window, kv_tiles};
use crate::params::FwdParams;
use crate::sinks;
use crate::softcap::Softcap;
use crate::softmax::{Domain, Natural, RowState, normalize};
use crate::tile::{Config, SimtTile};

/// Entry body for one tile shape; causal or not is chosen at run time; ENTRY: which entry
/// (plain, window, general, variable-length: `with_window_mask!`).
///
/// # Safety
/// `p` must describe valid device buffers, checked by the host; the launch must use
/// `tile.threads()` threads and `tile.smem_bytes(head_dim)` bytes of dynamic shared memory.
#[inline(always)]
pub unsafe fn entry<T: Element, C: Config<Tile = SimtTile>, const ROWS: usize, const DCH: usize, const SC: usize, const ENTRY: u8>(
    p: &FwdParams,
) {
    const { assert!(ROWS == C::TILE.rows_per_warp as usize && DCH == C::TILE.d_chunks as usize && SC == C::TILE.s_cols as usize) };
    unsafe { with_window_mask!(p: T, QueryRows / C::TILE.br(), ENTRY, M => fwd::<T, C, M, ROWS, DCH, SC>(p)) }
}

#[inline(always)]
unsafe fn fwd<T: Element, C: Config<Tile = SimtTile>, M: Mask, const ROWS: usize, const DCH: usize, const SC: usize>(p: &FwdParams) {
    let tile = C::TILE;
    let (br, bc, d) = (tile.br(), tile.bc(), p.pb.head_dim);
    if d > tile.max_head_dim() || block::dim() != tile.threads() {
        thread::trap();
    }
    let (q_blk, h, b) = block::idx();
    let (w, lane) = (warp::id(), warp::lane());
    let sq = p.pb.seqlen_q;
    let h_kv = h / (p.pb.heads_q / p.pb.heads_kv);
    let row0 = q_blk * br;
    let ks = SimtTile::k_stride(d);

    // Shared memory: Q [br][d], K [bc][d+1], V [bc][d], P [br][bc], all f32.
    let q_s: Shared<f32> = unsafe { dev::dynamic_shared((br * d) as usize) };
    let k_s: Shared<f32> = q_s.after((bc * ks) as usize);
    let v_s: Shared<f32> = k_s.after((bc * d) as usize);
    let p_s: Shared<f32> = v_s.after((br * bc) as usize);

    let q_g = unsafe { (p.q as *const T).add(p.q_strides.offset(b, 0, h) as usize) };
    let k_g = unsafe { (p.k as *const T).add(p.k_strides.offset(b, 0, h_kv) as usize) };
    let v_g = unsafe { (p.v as *const T).add(p.v_strides.offset(b, 0, h_kv) as usize) };

    // Q_i: this block's query rows, loaded once.
    unsafe { load_tile_f32(q_s, d, q_g, p.q_strides.row, row0, br, sq, d) };

    // KV tiles: from the first any row sees (a window's left edge), those the mask leaves
    // wholly visible first, then those that need masking (every tile of a window).
    let row_end = if row0 + br < sq { row0 + br } else { sq };
    let win = Window::<M>::new(&p.pb);
    let (n_tiles, first, n_unmasked) = kv_tiles::<M>(&p.pb, row0, row_end, bc);
    let (n_tiles, first, n_unmasked) = (n_tiles as u32, first as u32, n_unmasked as u32);

    let mut acc_o = [[0f32; DCH]; ROWS];
    let mut rows = [RowState::INIT; ROWS];
    let ctx = Step { p, tile, q_s, k_s, v_s, p_s, k_g, v_g, row0, win };
    for j in first..n_unmasked {
        unsafe { ctx.kv_step::<false, ROWS, DCH, SC>(j, &mut acc_o, &mut rows) };
    }
    for j in n_unmasked..n_tiles {
        unsafe { ctx.kv_step::<true, ROWS, DCH, SC>(j, &mut acc_o, &mut rows) };
    }

    // O_i = acc_o / l_i; LSE_i = m_i + log l_i. Rows past seqlen_q still join the warp's
    // reductions, but write nothing.
    let o_g = unsafe { (p.o as *mut T).add(p.o_strides.offset(b, 0, h) as usize) };
    let lse_g = unsafe { (p.lse as *mut f32).add(p.lse_row(b, h) as usize) };
    let sink = unsafe { sinks::of_head(p.sinks, h) };
    for i in 0..ROWS {
        let (inv_l, lse) = rows[i].finish::<Natural, 32>();
        let (inv_l, lse) = sinks::fold_outlined(inv_l, lse, sink);
        let r = row0 + w * ROWS as u32 + i as u32;
        if r < sq {
            for (ch, a) in acc_o[i].iter().enumerate() {
                let col = lane + 32 * ch as u32;
                if col < d {
                    let at = r as u64 * p.o_strides.row + col as u64;
                    unsafe { global::store(o_g.add(at as usize), T::from_f32(normalize(*a, inv_l))) };
                }
            }
            if lane == 0 {
                unsafe { global::store(lse_g.add(r as usize), lse) };
            }
        }
    }
}

/// What every KV step of one block reads.
struct Step<'a, T, M> {
    p: &'a FwdParams,
    /// The window's bounds (none unless M is `Windowed`).
    win: Window<M>,
    tile: SimtTile,
    q_s: Shared<f32>,
    k_s: Shared<f32>,
    v_s: Shared<f32>,
    p_s: Shared<f32>,
    k_g: *const T,
    v_g: *const T,
    row0: u32,
}

impl<T: Element, M: Mask> Step<'_, T, M> {
    /// One iteration of the KV loop over key tile `j`; MASKED adds the mask and the seqlen_k
    /// bound to the scores.
    #[inline(always)]
    unsafe fn kv_step<const MASKED: bool, const ROWS: usize, const DCH: usize, const SC: usize>(
        &self,
        j: u32,
        acc_o: &mut [[f32; DCH]; ROWS],
        rows: &mut [RowState; ROWS],
    ) {
        let p = self.p;
        let (bc, d, sq, sk) = (self.tile.bc(), p.pb.head_dim, p.pb.seqlen_q, p.pb.seqlen_k);
        let ks = SimtTile::k_stride(d);
        let (w, lane) = (warp::id(), warp::lane());
        let c0 = j * bc;
        let kv_len = if sk - c0 < bc { sk - c0 } else { bc };

        // Block: everyone is done with the previous K_j, V_j, P; load the next K_j, V_j.
        block::sync();
        unsafe {
            load_tile_f32(self.k_s, ks, self.k_g, p.k_strides.row, c0, bc, sk, d);
            load_tile_f32(self.v_s, d, self.v_g, p.v_strides.row, c0, bc, sk, d);
        }
        block::sync();

        // S_ij = Q_i K_j^T * softmax_scale (the Natural domain), for this lane's rows and columns.
        let mut s = [[0f32; SC]; ROWS];
        let r_w = w * ROWS as u32;
        for kk in 0..d {
            let mut k_col = [0f32; SC];
            for (c, kc) in k_col.iter_mut().enumerate() {
                *kc = self.k_s.ld(((lane + 32 * c as u32) * ks + kk) as usize);
            }
            for (i, s_row) in s.iter_mut().enumerate() {
                let q = self.q_s.ld(((r_w + i as u32) * d + kk) as usize);
                for (c, x) in s_row.iter_mut().enumerate() {
                    *x += q * k_col[c];
                }
            }
        }
        // Capped (`softcap`) and biased (`alibi`), in the general entries, before the mask.
        let sc = Softcap::<M>::new(&p.pb);
        // The head's slope read each tile, through an opaque address and value, and the bias
        // from one offset per row (held across the KV loop, or per element, they made the
        // d = 128 variable-length entry spill 16 bytes on sm_80).
        let (_, h, b) = block::idx();
        let al = unsafe { Alibi::<M>::load(thread::opaque(p.alibi), p.alibi_batch, b, h, &p.pb) }.opaque();
        for (i, s_row) in s.iter_mut().enumerate() {
            let row = self.row0 + r_w + i as u32;
            let base = al.offset(row, c0 + lane);
            for (c, x) in s_row.iter_mut().enumerate() {
                let col = c0 + lane + 32 * c as u32;
                *x *= Natural::factor(p.pb.scale);
                if sc.on() {
                    *x = sc.scaled(*x).0;
                }
                if al.on() {
                    *x += al.at(base, (32 * c) as f32);
                }
                if MASKED && (col >= sk || self.win.hidden(row, col, sq, sk)) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }

        // Online softmax: P_ij in place of S_ij, acc_o rescaled by alpha; P to shared memory
        // so every lane of the warp can read the whole row.
        for i in 0..ROWS {
            let alpha = rows[i].update::<Natural, 32>(&mut s[i]);
            for a in acc_o[i].iter_mut() {
                *a *= alpha;
            }
            for c in 0..SC {
                self.p_s.st(((r_w + i as u32) * bc + lane + 32 * c as u32) as usize, s[i][c]);
            }
        }
        warp::sync();

        // acc_o += P_ij V_j, over the keys each row sees (MASKED: a masked key's P is 0, and
        // 0 times a NaN or an infinity in its V would still reach the row).
        for kk in 0..kv_len {
            let mut v_row = [0f32; DCH];
            for (ch, v) in v_row.iter_mut().enumerate() {
                let col = lane + 32 * ch as u32;
                if col < d {
                    *v = self.v_s.ld((kk * d + col) as usize);
                }
            }
            for (i, a_row) in acc_o.iter_mut().enumerate() {
                if MASKED && self.win.hidden(self.row0 + r_w + i as u32, c0 + kk, sq, sk) {
                    continue;
                }
                let pv = self.p_s.ld(((r_w + i as u32) * bc + kk) as usize);
                for (ch, a) in a_row.iter_mut().enumerate() {
                    *a += pv * v_row[ch];
                }
            }
        }
    }
}
