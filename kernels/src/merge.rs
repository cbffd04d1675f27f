//! The merge of partial attention results by their LSE (flash-decoding's combine; cascade and
//! ring attention need the same step): a row whose keys were split into `splits` parts, each
//! part's output O_s (normalised over its own keys, f32) and LSE_s, becomes the row over all
//! the keys:
//!   LSE = log sum_s exp(LSE_s),   O = sum_s exp(LSE_s - LSE) O_s.
//! A part without keys (LSE_s = -inf) weighs 0 and its O_s is not read; a row whose parts
//! all have none gets O = 0, LSE = -inf (as the forward writes for a row that sees no key);
//! a NaN in a part's LSE, or in the O of a part that weighs in, makes the row's outputs NaN.
//! The LSE is summed in f64 and rounded once (a part may give its LSE_s as f32 hi and lo,
//! as split-KV's forward does). One warp per row; every lane reads every part's LSE, lane l
//! columns l + 32 j.

use crate::dev::{block, global, warp};
use crate::dtype::Element;
use crate::params::MergeParams;
use crate::softmax::{Domain, Natural, exp_f64, ln_f64_of};

/// Rows per block (one warp each, `MERGE_THREADS / 32` at a time).
pub const MERGE_ROWS: u32 = 16;
/// Threads per block.
pub const MERGE_THREADS: u32 = 128;

/// The merge of one block's rows (see the module doc).
///
/// # Safety
/// `p` valid (host-checked: every view inside its memory), `MERGE_THREADS` threads, grid
/// (seqlen / `MERGE_ROWS` rounded up, heads, batch).
#[inline(always)]
pub unsafe fn merge<T: Element>(p: &MergeParams) {
    let (blk, h, b) = block::idx();
    let (lane, w, warps) = (warp::lane(), warp::id(), block::dim() / 32);
    let end = ((blk + 1) * MERGE_ROWS).min(p.seqlen);
    let mut r = blk * MERGE_ROWS + w;
    while r < end {
        // LSE_s of the row's part s in f64: hi + lo where the parts have lo and hi is finite.
        let lse_s = |s: u32| unsafe {
            let at = (s as u64 * p.lse_parts_split + p.lse_parts_strides.offset(b, r, h)) as usize;
            let hi = global::load((p.lse_parts as *const f32).add(at));
            match p.lse_parts_lo != 0 && hi.is_finite() {
                true => hi as f64 + global::load((p.lse_parts_lo as *const f32).add(at)) as f64,
                false => hi as f64,
            }
        };
        // m = max_s LSE_s, and whether one is NaN (the max skips NaNs). Every lane takes
        // every part (the loads are the warp's broadcasts).
        let (mut m, mut nan) = (f64::NEG_INFINITY, false);
        for s in 0..p.splits {
            let x = lse_s(s);
            m = m.max(x);
            nan |= x.is_nan();
        }
        // LSE = m + log sum_s exp(LSE_s - m) in f64 (each term at most 1, one of them 1),
        // rounded once; -inf for a row without keys, NaN for a NaN part or an infinite one
        // (+inf: a part whose statistics overflowed).
        let lse64 = if nan || m == f64::INFINITY {
            f64::NAN
        } else if m == f64::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            let mut l = 0f64;
            for s in 0..p.splits {
                l += exp_f64(lse_s(s) - m);
            }
            m + ln_f64_of(l)
        };
        let lse = lse64 as f32;
        // O = sum_s exp(LSE_s - LSE) O_s over the parts that weigh in, column by column.
        let mut c = lane;
        while c < p.head_dim {
            let mut acc = if lse.is_nan() { f32::NAN } else { 0.0 };
            if lse.is_finite() {
                for s in 0..p.splits {
                    let x = lse_s(s);
                    if x != f64::NEG_INFINITY {
                        let at = s as u64 * p.o_parts_split + p.o_parts_strides.offset(b, r, h) + c as u64;
                        acc += Natural::exp((x - lse64) as f32) * unsafe { global::load((p.o_parts as *const f32).add(at as usize)) };
                    }
                }
            }
            let at = p.o_strides.offset(b, r, h) + c as u64;
            unsafe { global::store((p.o as *mut T).add(at as usize), T::from_f32(acc)) };
            c += 32;
        }
        if lane == 0 {
            let at = p.lse_strides.offset(b, r, h);
            unsafe { global::store((p.lse as *mut f32).add(at as usize), lse) };
        }
        r += warps;
    }
}
