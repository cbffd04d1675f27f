//! Online softmax (FA2, Algorithm 1) for one query row held by a group of `W` consecutive
//! lanes of a warp (all 32 in the SIMT kernel, a quad of 4 in the mma layout).
//!
//! Scores arrive multiplied by softmax_scale (the natural-log domain, as in naive attention,
//! so m_i and LSE carry no extra rounding); each exponential is one `ex2` of
//! (s - m_i) * log2(e). m_i is the running max, the same on every lane of the group; l_i is
//! this lane's partial row sum, reduced across the group once, at the end.

use crate::dev::{math, warp};
use core::f32::consts::{LN_2, LOG2_E};

/// Running statistics of one query row.
#[derive(Clone, Copy)]
pub struct RowState {
    /// m_i: running max of the scaled scores seen so far; -inf before any.
    pub m: f32,
    /// l_i: this lane's share of the running sum of exp(s - m_i).
    pub l: f32,
}

impl RowState {
    /// No scores seen yet.
    pub const INIT: RowState = RowState { m: f32::NEG_INFINITY, l: 0.0 };

    /// Lane group: folds this lane's scores `s` of a new key tile into the row. Turns `s` into
    /// P = exp(s - m_new) in place and returns alpha = exp(m_old - m_new), the factor by which
    /// acc_o (and l_i, done here) must be rescaled. Masked scores are -inf and give P = 0.
    #[inline(always)]
    pub fn update<const W: u32, const N: usize>(&mut self, s: &mut [f32; N]) -> f32 {
        // m_new = max(m_old, rowmax(S_ij)): this lane's max, then across the warp.
        let mut mx = self.m;
        for x in s.iter() {
            mx = mx.max(*x);
        }
        let m_new = warp::allreduce_max_in::<W>(mx);
        // Every score so far masked: subtract 0, not -inf, so ex2 gives 0 rather than NaN.
        let m_base = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
        // alpha = exp(m_old - m_new) rescales what was accumulated against m_old.
        let alpha = math::ex2((self.m - m_base) * LOG2_E);
        // P_ij = exp(S_ij - m_new) = ex2((S_ij - m_new) log2 e): the difference first, so the
        // row's max gives exactly 1; l_i = alpha l_i + rowsum(P_ij).
        let mut sum = 0.0;
        for x in s.iter_mut() {
            *x = math::ex2((*x - m_base) * LOG2_E);
            sum += *x;
        }
        self.l = self.l * alpha + sum;
        self.m = m_new;
        alpha
    }

    /// Lane group: the row's final 1 / l_i (0 for a fully masked row) and its log-sum-exp in the
    /// natural log, LSE = m_i + log2(l_i) ln 2 (-inf for a fully masked row).
    #[inline(always)]
    pub fn finish<const W: u32>(&self) -> (f32, f32) {
        let l = warp::allreduce_sum_in::<W>(self.l);
        if l > 0.0 {
            (math::rcp(l), self.m + math::lg2(l) * LN_2)
        } else {
            (0.0, f32::NEG_INFINITY)
        }
    }
}
