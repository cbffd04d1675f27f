//! Online softmax (FA2, Algorithm 1) for one query row held by a group of `W` consecutive
//! lanes of a warp (all 32 in the SIMT kernel, a quad of 4 in the mma layout).
//!
//! The scores' domain is a type ([`Natural`] or [`Log2`]): the kernel multiplies the raw
//! scores by the domain's factor once, and every exponential is one `ex2` of a difference
//! with the running max, so the row's max gives exactly 1. m_i is the running max, the same
//! on every lane of the group; l_i is this lane's partial row sum, reduced across the group
//! once, at the end.

use crate::dev::{math, warp};
use core::f32::consts::LOG2_E;

/// How scores are scaled before the softmax, and what that means for exp and LSE.
pub trait Domain {
    /// The factor the raw scores Q K^T are multiplied by, for softmax scale `scale`.
    fn factor(scale: f32) -> f32;
    /// exp of the natural-domain difference that `d` (score minus max) stands for.
    fn exp(d: f32) -> f32;
    /// The natural-log LSE of a row with max `m` (in this domain) and sum `l` (positive,
    /// finite), rounded once from f64 ([`ln_f64`]).
    fn lse(m: f32, l: f32) -> f32;
}

/// Scores times softmax_scale, as naive attention computes them: m_i and LSE carry no
/// extra rounding (the f32 path needs this to meet FA2's accuracy bar), at one extra multiply
/// per exponential.
pub struct Natural;

/// Scores times softmax_scale * log2(e) (FA2's choice): one multiply fewer per score; LSE
/// carries one more rounding (about 1e-7 relative), far inside the 16-bit kernels' bar.
pub struct Log2;

/// The scale the softmax applies to the scores: softmax_scale, with 0 taken as the smallest
/// positive normal f32 (the limit scale -> 0+: uniform weights over finite scores, while an
/// infinite score keeps its sign instead of becoming 0 * inf = NaN). Gradients are scaled by
/// the true softmax_scale.
#[inline(always)]
pub fn score_scale(scale: f32) -> f32 {
    if scale == 0.0 { f32::MIN_POSITIVE } else { scale }
}

/// |m_i| (the row max of the scores in the kernels' scaled domain) up to which a row's
/// statistics are exact enough in f32: the exponents subtract m_i rounded to f32, which moves
/// every weight of the row by the same factor 2^e, |e| <= ulp(m_i) / 2 (it cancels in O and
/// LSE), and below 2^30 that factor stays under 2^64. Rows at or past it, reachable only with
/// inputs far beyond attention's usual range at the largest scales (`MAX_SCALE`), give NaN.
pub const STAT_LIMIT: f32 = 1_073_741_824.0;

impl Domain for Natural {
    #[inline(always)]
    fn factor(scale: f32) -> f32 {
        score_scale(scale)
    }
    #[inline(always)]
    fn exp(d: f32) -> f32 {
        math::ex2(d * LOG2_E)
    }
    #[inline(always)]
    fn lse(m: f32, l: f32) -> f32 {
        (m as f64 + ln_f64(l)) as f32
    }
}

impl Domain for Log2 {
    #[inline(always)]
    fn factor(scale: f32) -> f32 {
        score_scale(scale) * LOG2_E
    }
    #[inline(always)]
    fn exp(d: f32) -> f32 {
        math::ex2(d)
    }
    #[inline(always)]
    fn lse(m: f32, l: f32) -> f32 {
        (m as f64 * core::f64::consts::LN_2 + ln_f64(l)) as f32
    }
}

/// ln(x) for a positive finite f32, in f64 to about 1e-15 relative, so the LSE above is
/// rounded once: within half an f32 ulp of m + ln l where naive attention's f32 log is
/// (`lg2.approx` was up to 2 ulp off, past the bar where l is exact: scale 0, every weight 1).
/// Once per row, so its cost (a division and a dozen f64 FMAs) does not show.
/// x = 2^e f with f in [sqrt(1/2), sqrt(2)); ln f = 2 atanh(s), s = (f - 1) / (f + 1),
/// |s| <= 0.172, as the series 2 (s + s^3 / 3 + ... + s^19 / 19).
#[inline(always)]
pub fn ln_f64(x: f32) -> f64 {
    let (x, e0) = if x < f32::MIN_POSITIVE { (x * 16_777_216.0, -24) } else { (x, 0) }; // subnormal: scale by 2^24
    let bits = x.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 127 + e0;
    let f = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000) as f64; // [1, 2)
    ln_parts(f, e)
}

/// [`ln_f64`] of a normal positive finite f64 (the merge's sum of part weights, in [1,
/// parts]).
#[inline(always)]
pub fn ln_f64_of(x: f64) -> f64 {
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i32 - 1023;
    let f = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000); // [1, 2)
    ln_parts(f, e)
}

/// ln(2^e f), f in [1, 2) (see [`ln_f64`]).
#[inline(always)]
fn ln_parts(mut f: f64, mut e: i32) -> f64 {
    if f > core::f64::consts::SQRT_2 {
        f *= 0.5;
        e += 1;
    }
    // s by f32's (correctly rounded) reciprocal and two Newton steps (2^-24 -> 2^-48 ->
    // below f64's rounding): no f64 division, whose slow path is a subroutine with a stack.
    let r = (1.0 / (f + 1.0) as f32) as f64;
    let r = r * (2.0 - (f + 1.0) * r);
    let r = r * (2.0 - (f + 1.0) * r);
    let s = (f - 1.0) * r;
    let s2 = s * s;
    // Horner, written out: a coefficient array became a 72-byte stack frame in every kernel.
    let t = 1.0 / 17.0 + s2 * (1.0 / 19.0);
    let t = 1.0 / 15.0 + s2 * t;
    let t = 1.0 / 13.0 + s2 * t;
    let t = 1.0 / 11.0 + s2 * t;
    let t = 1.0 / 9.0 + s2 * t;
    let t = 1.0 / 7.0 + s2 * t;
    let t = 1.0 / 5.0 + s2 * t;
    let t = 1.0 / 3.0 + s2 * t;
    let series = 1.0 + s2 * t;
    e as f64 * core::f64::consts::LN_2 + 2.0 * s * series
}

/// exp(x) for x <= 0 in f64 to about 1e-15 relative (0 below -708: f64's normal range), for
/// the merge's part weights, whose f32 `ex2.approx` (2 ulp) alone was past the LSE's bar.
/// x = k ln 2 + r, |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact to f64's rounding);
/// exp r by its Taylor series to r^12 / 12! (below 2^-53 relative), 2^k by the exponent.
#[inline(always)]
pub fn exp_f64(x: f64) -> f64 {
    if x < -708.0 || x.is_nan() {
        return if x.is_nan() { x } else { 0.0 };
    }
    // fdlibm's split of ln 2: k LN2_HI exact for |k| < 2^11.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    let kf = x * core::f64::consts::LOG2_E;
    // The nearest integer: kf <= 0, so the cast's truncation of kf - 0.5 is its ceiling.
    let k = (kf - 0.5) as i64 as f64;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let t = 1.0 / 479_001_600.0;
    let t = 1.0 / 39_916_800.0 + r * t;
    let t = 1.0 / 3_628_800.0 + r * t;
    let t = 1.0 / 362_880.0 + r * t;
    let t = 1.0 / 40_320.0 + r * t;
    let t = 1.0 / 5_040.0 + r * t;
    let t = 1.0 / 720.0 + r * t;
    let t = 1.0 / 120.0 + r * t;
    let t = 1.0 / 24.0 + r * t;
    let t = 1.0 / 6.0 + r * t;
    let t = 0.5 + r * t;
    let t = 1.0 + r * t;
    let er = 1.0 + r * t;
    // 2^k, k in [-1022, 0] here (x in [-708, 0]).
    er * f64::from_bits(((k as i64 + 1023) as u64) << 52)
}

/// Running statistics of one query row.
#[derive(Clone, Copy)]
pub struct RowState {
    /// m_i: running max of the scores seen so far, in the kernel's domain; -inf before any.
    pub m: f32,
    /// l_i: this lane's share of the running sum of exp(s - m_i).
    pub l: f32,
}

impl RowState {
    /// No scores seen yet.
    pub const INIT: RowState = RowState { m: f32::NEG_INFINITY, l: 0.0 };

    /// Lane group: folds this lane's scores `s` (in domain `Dm`) of a new key tile into the
    /// row. Turns `s` into P = exp(s - m_new) in place and returns alpha = exp(m_old - m_new),
    /// the factor by which acc_o (and l_i, done here) must be rescaled. Masked scores are -inf
    /// and give P = 0.
    #[inline(always)]
    pub fn update<Dm: Domain, const W: u32>(&mut self, s: &mut [f32]) -> f32 {
        // m_new = max(m_old, rowmax(S_ij)): this lane's max, then across the warp.
        let mut mx = self.m;
        for x in s.iter() {
            mx = mx.max(*x);
        }
        let m_new = warp::allreduce_max_in::<W>(mx);
        // Every score so far masked: subtract 0, not -inf, so ex2 gives 0 rather than NaN.
        let m_base = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
        // alpha = exp(m_old - m_new) rescales what was accumulated against m_old.
        let alpha = Dm::exp(self.m - m_base);
        // P_ij = exp(S_ij - m_new), the difference first; l_i = alpha l_i + rowsum(P_ij).
        let mut sum = 0.0;
        for x in s.iter_mut() {
            *x = Dm::exp(*x - m_base);
            sum += *x;
        }
        self.l = self.l * alpha + sum;
        self.m = m_new;
        alpha
    }

    /// As [`RowState::update`] for raw scores S = Q K^T and a positive factor `c` to the
    /// log2 domain (softmax_scale * log2 e): m_i is kept in raw units and each
    /// P = 2^((S - m_i) c) is an FADD, an FMUL and an ex2 (the scaled update's count, without
    /// a pass that scales the scores first). Pair with [`RowState::finish_raw`].
    #[inline(always)]
    pub fn update_raw<const W: u32>(&mut self, s: &mut [f32], c: f32) -> f32 {
        // m_new = max(m_old, rowmax(S_ij)), raw.
        let mut mx = self.m;
        for x in s.iter() {
            mx = mx.max(*x);
        }
        let m_new = warp::allreduce_max_in::<W>(mx);
        // P = 2^((S - m_new) c): the difference first, so the row's max weighs exactly 1, as in
        // naive attention. (FA2's fused fma(S, c, -m_new c) weighs it 2^(the rounding error of
        // m_new c), up to 2^0.03 at |m_new c| ~ 1e6, and P is rounded to 16 bits for P V while
        // l_i keeps it: past the bar at huge scales. Choosing between the two per warp
        // (a vote and two loops) took the d=64 Hopper forward from 162 to 195 registers.)
        // m_new, or 0 while every score so far is masked (-inf), so ex2 gives 0, not NaN.
        let m_sub = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
        // alpha = 2^((m_old - m_new) c), exactly 1 while the max stays (no drift over a long
        // row's tiles).
        let alpha = if m_new == self.m { 1.0 } else { math::ex2((self.m - m_sub) * c) };
        // P_ij = 2^((S_ij - m_new) c); l_i = alpha l_i + rowsum(P_ij).
        let mut sum = 0.0;
        for x in s.iter_mut() {
            *x = math::ex2((*x - m_sub) * c);
            sum += *x;
        }
        self.l = self.l * alpha + sum;
        self.m = m_new;
        alpha
    }

    /// As [`RowState::update_raw`] for scores that leave out a constant `r` of this tile's row
    /// (`alibi::Alibi::frag_split`): the row's true scores are s + r. m_i stays in true
    /// units, unchanged (not rounded through m_i - r + r) while the tile brings no new max.
    #[inline(always)]
    pub fn update_raw_shifted<const W: u32>(&mut self, s: &mut [f32], c: f32, r: f32) -> f32 {
        let (m_old, m_shifted) = (self.m, self.m - r);
        self.m = m_shifted;
        let alpha = self.update_raw::<W>(s, c);
        self.m = if self.m == m_shifted { m_old } else { self.m + r };
        alpha
    }

    /// [`RowState::finish`] for a row kept by [`RowState::update_raw`] with factor `c`
    /// (`Log2::factor(scale)`): the LSE's max term is the raw max times `scale` (> 0, as the
    /// score scale) in f64, rounded once with the log: c itself is rounded, and at tiny
    /// scales (subnormal c) that rounding alone is far more than naive attention's error.
    #[inline(always)]
    pub fn finish_raw<const W: u32>(&self, c: f32, scale: f32) -> (f32, f32) {
        let l = warp::allreduce_sum_in::<W>(self.l);
        let (inv_l, lse) = finish_stats::<Log2>(self.m * c, l);
        if inv_l > 0.0 { (inv_l, (self.m as f64 * score_scale(scale) as f64 + ln_f64(l)) as f32) } else { (inv_l, lse) }
    }

    /// [`RowState::finish_raw`] with the LSE left in f64 (split-KV's parts: the merge rounds
    /// once, after adding the parts up).
    #[inline(always)]
    pub fn finish_raw64<const W: u32>(&self, c: f32, scale: f32) -> (f32, f64) {
        let l = warp::allreduce_sum_in::<W>(self.l);
        let (inv_l, lse) = finish_stats::<Log2>(self.m * c, l);
        if inv_l > 0.0 { (inv_l, self.m as f64 * score_scale(scale) as f64 + ln_f64(l)) } else { (inv_l, lse as f64) }
    }

    /// Lane group: the row's final 1 / l_i and its log-sum-exp in the natural log:
    /// (0, -inf) for a row that sees no key (every score masked or -inf), (NaN, NaN) for a row
    /// whose scores hold a NaN (l_i is NaN: the NaN reached P) or whose statistics left f32's
    /// range ([`STAT_LIMIT`], or l_i overflowed), else (1 / l_i, m_i + log l_i).
    #[inline(always)]
    pub fn finish<Dm: Domain, const W: u32>(&self) -> (f32, f32) {
        let l = warp::allreduce_sum_in::<W>(self.l);
        finish_stats::<Dm>(self.m, l)
    }
}

/// The row statistics' end (see [`RowState::finish`]) from the scaled max `m` and the whole
/// row's sum `l`.
#[inline(always)]
pub fn finish_stats<Dm: Domain>(m: f32, l: f32) -> (f32, f32) {
    if m == f32::NEG_INFINITY && l == 0.0 {
        (0.0, f32::NEG_INFINITY)
    } else if l > 0.0 && l < f32::INFINITY && m.abs() < STAT_LIMIT {
        (math::rcp(l), Dm::lse(m, l))
    } else {
        (f32::NAN, f32::NAN)
    }
}

/// O = acc_o / l_i from `inv_l` ([`finish_stats`]): exactly 0 for a row without weights
/// (inv_l = 0: no key visible, or every score -inf), whatever 0 times its keys' V gave (an
/// infinite V times a weight of 0 is NaN); NaN for a NaN row.
#[inline(always)]
pub fn normalize(acc: f32, inv_l: f32) -> f32 {
    if inv_l == 0.0 { 0.0 } else { acc * inv_l }
}

/// A row's whole (m, l, n) in the log2 domain (`QuadRow`) with one more key of score `x2`
/// and dP 0: an attention sink (`sinks`). -inf adds nothing, +inf leaves every key weight 0,
/// NaN makes the row NaN.
#[inline(always)]
fn push_sink(m: f32, l: f32, n: f32, x2: f32) -> (f32, f32, f32) {
    if x2 <= m {
        (m, l + math::ex2(x2 - m), n)
    } else if x2 > m {
        // A new max: the keys' sums rescaled by alpha = exp2(m - x2); the sink weighs 1.
        let alpha = math::ex2(m - x2);
        (x2, l * alpha + 1.0, n * alpha)
    } else {
        (f32::NAN, f32::NAN, f32::NAN)
    }
}

/// One lane's running softmax statistics of a query row held by a lane quad (scores in the
/// log2 domain), with n = sum_j exp2(x_j - m) dP_ij, so that D_i = n / l_i.
#[derive(Clone, Copy)]
pub(crate) struct QuadRow {
    /// Running max of the row, the same on the four lanes.
    m: f32,
    /// This lane's share of l_i and of n.
    l: f32,
    n: f32,
}

impl QuadRow {
    pub(crate) const INIT: QuadRow = QuadRow { m: f32::NEG_INFINITY, l: 0.0, n: 0.0 };

    /// Lane quad: folds this lane's scaled scores `x` (-inf: masked, with MASKED) and their dP
    /// in; a masked key adds nothing, whatever its dP holds.
    #[inline(always)]
    pub(crate) fn push<const MASKED: bool, const NS: usize>(&mut self, x: [[f32; 2]; NS], dp: [[f32; 2]; NS]) {
        let mut mx = self.m;
        for x in x.iter() {
            mx = mx.max(x[0]).max(x[1]);
        }
        let m_new = warp::allreduce_max_in::<4>(mx);
        // Everything masked so far: subtract 0, not -inf, so ex2 gives 0 rather than NaN.
        let base = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
        let alpha = math::ex2(self.m - base);
        let (mut l, mut n) = (0f32, 0f32);
        for (x, dp) in x.iter().zip(dp.iter()) {
            for e in 0..2 {
                let pe = math::ex2(x[e] - base);
                l += pe;
                n += if MASKED && x[e] == f32::NEG_INFINITY { 0.0 } else { pe * dp[e] };
            }
        }
        self.l = self.l * alpha + l;
        self.n = self.n * alpha + n;
        self.m = m_new;
    }

    /// Lane quad: the row's (m_i, 1 / l_i, D_i) with the attention sink `sink2` (its logit
    /// times log2 e, -inf for none: `sinks`) as one more key whose dP is 0; (+inf, 0, 0) for a
    /// row that sees no key, so that exp2(x - m_i) / l_i is 0 without a special case; NaNs for
    /// a row whose scores hold a NaN or whose statistics left f32's range (as the forward's
    /// `softmax::finish_stats`).
    #[inline(always)]
    pub(crate) fn finish(&self, sink2: f32) -> (f32, f32, f32) {
        let l = warp::allreduce_sum_in::<4>(self.l);
        let n = warp::allreduce_sum_in::<4>(self.n);
        if self.m == f32::NEG_INFINITY && l == 0.0 {
            (f32::INFINITY, 0.0, 0.0)
        } else if l > 0.0 && l < f32::INFINITY && self.m.abs() < crate::softmax::STAT_LIMIT {
            let (m, l, n) = push_sink(self.m, l, n, sink2);
            (m, math::rcp(l), n / l)
        } else {
            (f32::NAN, f32::NAN, f32::NAN)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merge's f64 exp and log against std's, over the range they take.
    #[test]
    fn exp_ln_f64_match_std() {
        let mut x = -745.0f64;
        while x <= 0.0 {
            let (got, want) = (exp_f64(x), x.exp());
            assert!((got - want).abs() <= 4.0 * f64::EPSILON * want + 1e-307, "exp({x}): {got} vs {want}");
            x += 0.0137;
        }
        assert_eq!(exp_f64(0.0), 1.0);
        assert_eq!(exp_f64(f64::NEG_INFINITY), 0.0);
        assert!(exp_f64(f64::NAN).is_nan());
        let mut x = 1.0f64;
        while x < 70_000.0 {
            let (got, want) = (ln_f64_of(x), x.ln());
            assert!((got - want).abs() <= 4.0 * f64::EPSILON * want.abs().max(1e-3), "ln({x}): {got} vs {want}");
            x *= 1.000_37;
        }
    }
}
