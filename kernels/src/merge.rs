//! The merge of partial attention results by their LSE (flash-decoding's combine; cascade and
//! ring attention need the same step): a row whose keys were split into `splits` parts, each
//! part's output O_s (normalised over its own keys, f32) and LSE_s, becomes the row over all
//! the keys:
//!   LSE = log sum_s exp(LSE_s),   O = sum_s exp(LSE_s - LSE) O_s.
//! A part without keys (LSE_s = -inf) weighs 0 and its O_s is not read; a row whose parts
//! all have none gets O = 0, LSE = -inf (as the forward writes for a row that sees no key);
//! a NaN in a part's LSE, or in the O of a part that weighs in, makes the row's outputs NaN.
//! One warp per row; lane l reads parts l + 32 i, then columns l + 32 j.

use crate::dev::{block, global, warp};
use crate::dtype::Element;
use crate::params::MergeParams;
use crate::softmax::{Domain, Natural, ln_f64};

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
        // LSE_s of the row's part s.
        let lse_s = |s: u32| unsafe {
            let at = s as u64 * p.lse_parts_split + p.lse_parts_strides.offset(b, r, h);
            global::load((p.lse_parts as *const f32).add(at as usize))
        };
        // m = max_s LSE_s, and whether one is NaN (the max skips NaNs).
        let (mut m, mut nan) = (f32::NEG_INFINITY, false);
        let mut s = lane;
        while s < p.splits {
            let x = lse_s(s);
            m = m.max(x);
            nan |= x.is_nan();
            s += 32;
        }
        let (m, nan) = (warp::allreduce_max(m), warp::any(nan));
        // l = sum_s exp(LSE_s - m), each term at most 1.
        let mut l = 0f32;
        let mut s = lane;
        while s < p.splits {
            l += Natural::exp(lse_s(s) - m);
            s += 32;
        }
        let l = warp::allreduce_sum(l);
        // LSE = m + log l, rounded once; -inf for a row without keys, NaN for a NaN part or
        // an infinite one (+inf: a part whose statistics overflowed).
        let lse = if nan || m == f32::INFINITY {
            f32::NAN
        } else if m == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else {
            (m as f64 + ln_f64(l)) as f32
        };
        // O = sum_s exp(LSE_s - LSE) O_s over the parts that weigh in, column by column.
        let mut c = lane;
        while c < p.head_dim {
            let mut acc = if lse.is_nan() { f32::NAN } else { 0.0 };
            if lse.is_finite() {
                for s in 0..p.splits {
                    let x = lse_s(s);
                    if x != f32::NEG_INFINITY {
                        let at = s as u64 * p.o_parts_split + p.o_parts_strides.offset(b, r, h) + c as u64;
                        acc += Natural::exp(x - lse) * unsafe { global::load((p.o_parts as *const f32).add(at as usize)) };
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
