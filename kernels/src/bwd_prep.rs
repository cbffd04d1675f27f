//! The backward's preprocessing from what the forward saved (FA2's `dot(dO, O)` step), for
//! the Hopper families (`wgmma`; `wgmma_atomic` with the forward's residual). Per query row,
//! into the `stats` workspace:
//! - m_i = LSE_i log2(e) and 1 / l_i = 1, so the kernels' P = exp2(S scale log2(e) - m_i) / l_i
//!   is exp(S scale - LSE_i);
//! - D~_i = sum_c dO_ic O_ic in f32 (FA2's D, O rounded to T), or with RESIDUAL sum_c dO_ic
//!   (O_ic + O_lo_ic), where O + O_lo is the forward's f32 O to about twice T's precision
//!   (O_lo = T(O_f32 - O), `FwdParams::o_lo`; the sum is exact in f32).
//!
//! D~ from O rounded to T carries an error of about a unit roundoff of |dO_i| |O_i|: larger
//! than the true dS of a row whose softmax has few large weights. The `wgmma` dQ kernel
//! corrects it exactly and replaces D~_i by D_i (`bwd_wgmma`); `wgmma_atomic` (RESIDUAL only)
//! uses D~ from O + O_lo as it is (f32-accurate, short of rows saturated below f32 rounding).
//!
//! Fully masked rows (LSE = -inf) get (m, 1 / l, D) = (+inf, 0, 0): their P and dS are 0.
//! One warp per row, `PREP_ROWS` rows per block; lane l reads column pairs 2l + 64i.

use crate::dev::{block, global, warp};
use crate::dtype::MmaElement;
use crate::params::BwdParams;
use crate::varlen::{self, Over};
use core::f32::consts::LOG2_E;

/// Query rows per block.
pub const PREP_ROWS: usize = 16;

/// The statistics of one block's rows (see the module doc).
///
/// # Safety
/// `p` valid (host-checked), with RESIDUAL `p.o_lo` the forward's residual of `p.o`, a multiple of 32
/// threads.
#[inline(always)]
pub unsafe fn prep<T: MmaElement, const RESIDUAL: bool>(p: &BwdParams) {
    // One entry for every launch: a variable-length batch's sequence, if it is one.
    let Some(p) = (unsafe { varlen::resolve::<T, _>(p, Over::QueryRows, PREP_ROWS as u32) }) else {
        return;
    };
    let p = &p;
    let (blk, h, b) = block::idx();
    let (sq, d) = (p.pb.seqlen_q, p.pb.head_dim);
    let (w, lane, warps) = (warp::id(), warp::lane(), block::dim() / 32);
    let r0 = blk * PREP_ROWS as u32;
    let end = (r0 + PREP_ROWS as u32).min(sq);
    let lse_row = p.lse_row(b, h);
    let mut r = r0 + w;
    while r < end {
        // Warp: D_i, lane partial sums over column pairs, then a butterfly sum.
        // O and its residual share O's strides; dO has its own.
        let (at, at_do) = (p.o_strides.offset(b, r, h), p.do_strides.offset(b, r, h));
        let mut acc = 0f32;
        if d.is_multiple_of(2) {
            // Column pairs, one 4-byte load each.
            let mut c = 2 * lane;
            while c < d {
                let (i, j) = ((at + c as u64) as usize, (at_do + c as u64) as usize);
                let (o, g) = unsafe {
                    (global::load((p.o as *const T).add(i) as *const u32), global::load((p.d_o as *const T).add(j) as *const u32))
                };
                let ((o0, o1), (g0, g1)) = (T::unpack2(o), T::unpack2(g));
                if RESIDUAL {
                    let (l0, l1) = T::unpack2(unsafe { global::load((p.o_lo as *const T).add(i) as *const u32) });
                    acc += g0 * (o0 + l0) + g1 * (o1 + l1);
                } else {
                    acc += g0 * o0 + g1 * o1;
                }
                c += 64;
            }
        } else {
            // Odd head_dim: rows are 2-byte aligned only, element by element.
            let mut c = lane;
            while c < d {
                let (i, j) = ((at + c as u64) as usize, (at_do + c as u64) as usize);
                let (o, g) =
                    unsafe { (global::load((p.o as *const T).add(i)).to_f32(), global::load((p.d_o as *const T).add(j)).to_f32()) };
                let l = if RESIDUAL { unsafe { global::load((p.o_lo as *const T).add(i)) }.to_f32() } else { 0.0 };
                acc += g * (o + l);
                c += 32;
            }
        }
        let dd = warp::allreduce_sum(acc);
        if lane == 0 {
            let lse = unsafe { global::load((p.lse as *const f32).add((lse_row + r as u64) as usize)) };
            let (m, inv_l, dd) = if lse == f32::NEG_INFINITY { (f32::INFINITY, 0.0, 0.0) } else { (lse * LOG2_E, 1.0, dd) };
            let st = p.stats as *mut f32;
            unsafe {
                global::store(st.add(p.stat_at(0, b, h, r)), m);
                global::store(st.add(p.stat_at(1, b, h, r)), inv_l);
                global::store(st.add(p.stat_at(2, b, h, r)), dd);
            }
        }
        r += warps;
    }
}
