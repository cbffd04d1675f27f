//! Attention sinks (gpt-oss): a learned logit s_h per query head that joins every row's
//! softmax denominator as a key whose value is zero. With the row's key scores S_ij (scaled,
//! capped, masked):
//!   P_ij = exp(S_ij - LSE_i),   LSE_i = log(exp(s_h) + sum_j exp(S_ij)),   O_i = sum_j P_ij V_j,
//! so the rows' weights sum to 1 - exp(s_h - LSE_i), and a row that sees no key gets O = 0,
//! LSE = s_h. In the backward the sink is one more key with dP = 0: D_i = sum_j P_ij dP_ij
//! and dS_ij = P_ij (dP_ij - D_i) keep their form, and ds_h = -sum_i exp(s_h - LSE_i) D_i
//! (`bwd_sinks`).
//!
//! A sink of -inf is no sink; NaN makes every row of its head NaN.
//! The forward folds the sink into a finished row ([`fold`]); the backward's statistics
//! passes push it as their last key (`softmax::QuadRow::finish`, `bwd_simt`).

use crate::dev::{global, math};
use crate::params::FwdParams;
use crate::softmax::ln_f64;
use core::f32::consts::LOG2_E;

/// The sink logit of query head `h` from the launch's `sinks` array (f32 [heads_q]; 0: the
/// launch has none, -inf returned).
///
/// # Safety
/// `sinks` is 0 or holds more than `h` values.
#[inline(always)]
pub unsafe fn of_head(sinks: u64, h: u32) -> f32 {
    if sinks == 0 { f32::NEG_INFINITY } else { unsafe { global::load((sinks as *const f32).add(h as usize)) } }
}

/// The sink logit of row `r` of a block of head `h` (`sinks` as in [`of_head`]): under GQA
/// packing (`FwdParams::gqa_packed`, one query row per sequence) row r of KV head h is query
/// head h g + r, and rows from g on hold no query (-inf, nothing read); else head h's.
///
/// # Safety
/// `p.sinks` is 0 or holds a value for each of the launch's query heads.
#[inline(always)]
pub unsafe fn of_row(p: &FwdParams, h: u32, r: u32) -> f32 {
    match p.gqa_pack {
        0 | 1 => unsafe { of_head(p.sinks, h) },
        g if r < g => unsafe { of_head(p.sinks, h * g + r) },
        _ => f32::NEG_INFINITY,
    }
}

/// Lane: a finished row's (1 / l_i, LSE_i) (`softmax::finish_stats`: (0, -inf) without
/// weights, NaN for a NaN row) with the sink `sink` joined to its denominator: LSE' =
/// log(exp(LSE) + exp(sink)) and 1 / l' = (1 / l) exp(LSE - LSE'), so O = acc_o / l' is
/// the sinked output. Each side of the log-add-exp from the larger one: e = exp(-|LSE - sink|)
/// <= 1, LSE' = max + ln(1 + e) in f64 ([`ln_f64`]), rounded once.
#[inline(always)]
pub fn fold((inv_l, lse): (f32, f32), sink: f32) -> (f32, f32) {
    if sink == f32::NEG_INFINITY {
        // No sink: the row as it is.
        (inv_l, lse)
    } else if lse.is_nan() || sink.is_nan() {
        (f32::NAN, f32::NAN)
    } else if lse == f32::NEG_INFINITY || sink == f32::INFINITY {
        // No key weighs against the sink: O = 0, LSE = sink.
        (0.0, sink)
    } else if lse >= sink {
        // The keys dominate: e = exp(sink - LSE), l' = l (1 + e).
        let e = math::ex2((sink - lse) * LOG2_E);
        (inv_l / (1.0 + e), (lse as f64 + ln_f64(1.0 + e)) as f32)
    } else {
        // The sink dominates: e = exp(LSE - sink), l' = l (1 + e) / e.
        let e = math::ex2((lse - sink) * LOG2_E);
        (inv_l * (e / (1.0 + e)), (sink as f64 + ln_f64(1.0 + e)) as f32)
    }
}

/// [`fold`] for an LSE kept in f64 (split-KV's parts, `softmax::RowState::finish_raw64`).
#[inline(always)]
pub fn fold64((inv_l, lse): (f32, f64), sink: f32) -> (f32, f64) {
    let s = sink as f64;
    if sink == f32::NEG_INFINITY {
        (inv_l, lse)
    } else if lse.is_nan() || sink.is_nan() {
        (f32::NAN, f64::NAN)
    } else if lse == f64::NEG_INFINITY || sink == f32::INFINITY {
        (0.0, s)
    } else if lse >= s {
        let e = math::ex2((s - lse) as f32 * LOG2_E);
        (inv_l / (1.0 + e), lse + ln_f64(1.0 + e))
    } else {
        let e = math::ex2((lse - s) as f32 * LOG2_E);
        (inv_l * (e / (1.0 + e)), s + ln_f64(1.0 + e))
    }
}

/// [`fold`], not inlined: for a kernel that folds rows in a loop whose body it would grow
/// past unrolling (the SIMT forward's, over its warp's rows: inlined, the loop stayed rolled
/// and its accumulators went to a 256-384 byte stack frame).
#[inline(never)]
pub fn fold_outlined(inv_l: f32, lse: f32, sink: f32) -> (f32, f32) {
    fold((inv_l, lse), sink)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 log-add-exp and the weight the keys keep.
    fn exact(lse: f64, sink: f64) -> (f64, f64) {
        let m = lse.max(sink);
        let lse2 = m + ((lse - m).exp() + (sink - m).exp()).ln();
        (lse2, (lse - lse2).exp())
    }

    /// Against f64 over both orders and wide gaps, within a few f32 units.
    #[test]
    fn fold_matches_f64() {
        for &lse in &[-80.0f32, -3.5, -0.7, 0.0, 0.3, 2.0, 17.25, 1e4] {
            for &sink in &[-90.0f32, -4.0, -0.7, 0.0, 0.5, 3.0, 1e4 + 1.0] {
                let (inv_l, lse2) = fold((0.25, lse), sink);
                let (want_lse, keep) = exact(lse as f64, sink as f64);
                let tol_lse = 4.0 * f32::EPSILON as f64 * want_lse.abs().max(1.0);
                assert!((lse2 as f64 - want_lse).abs() <= tol_lse, "lse {lse} sink {sink}: {lse2} vs {want_lse}");
                // The factor's error: exp of an argument of magnitude |lse - sink|, and ex2's own.
                let tol = 4.0 * f32::EPSILON as f64 * (1.0 + (lse as f64 - sink as f64).abs()) * keep;
                assert!((inv_l as f64 - 0.25 * keep).abs() <= tol + 1e-45, "lse {lse} sink {sink}: {inv_l} vs {}", 0.25 * keep);
            }
        }
    }

    /// The ends: no sink, no keys, NaN either side, an infinite sink.
    #[test]
    fn fold_ends() {
        assert_eq!(fold((0.5, 1.5), f32::NEG_INFINITY), (0.5, 1.5));
        assert_eq!(fold((0.0, f32::NEG_INFINITY), f32::NEG_INFINITY), (0.0, f32::NEG_INFINITY));
        assert_eq!(fold((0.0, f32::NEG_INFINITY), 2.0), (0.0, 2.0));
        assert_eq!(fold((0.5, 1.5), f32::INFINITY), (0.0, f32::INFINITY));
        let (a, b) = fold((0.5, 1.5), f32::NAN);
        assert!(a.is_nan() && b.is_nan());
        let (a, b) = fold((f32::NAN, f32::NAN), 1.0);
        assert!(a.is_nan() && b.is_nan());
    }
}
