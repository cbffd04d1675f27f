//! Logit soft-capping (Gemma 2, Grok): each scaled score S = scale q . k becomes
//! cap tanh(S / cap) before the softmax, so that no score leaves (-cap, cap). The backward
//! multiplies dS by the derivative, 1 - tanh^2.
//!
//! Only the general entries of a kernel (`mask::General`, `Mask::BIAS`: the general and
//! variable-length entries) apply it: [`Softcap`] is constant "off" for the other masks, so the
//! plain and window entries carry no code for it and the host launches a soft-capped
//! attention on a general entry. The Hopper backward applies it in its general entries only
//! ([`Softcap::new_if`]; `registry::BwdFamilyDesc::softcap_varlen`).
//!
//! The kernels that keep raw scores (Q K^T, exponent factor c) take t = tanh((S_raw |scale|)
//! / cap) ([`TanhArg`]; a negative scale is a positive one on -Q, and tanh is odd) in place of
//! the raw score, and c = cap log2(e): the softmax then sees t cap, and its LSE is
//! m cap + log l for the row's largest t, m.

use crate::dev::{math, thread};
use crate::mask::Mask;
use crate::params::Problem;
use crate::softmax::score_scale;
use core::f32::consts::LOG2_E;
use core::marker::PhantomData;

/// The launch's softcap for mask M's entries: off unless M is a general entry's mask
/// (`Mask::BIAS`) and the launch sets one (`Problem::softcap` > 0).
pub struct Softcap<M> {
    cap: f32,
    _mask: PhantomData<M>,
}

// By hand: derived, they would ask M (a marker type) to be Copy.
impl<M> Clone for Softcap<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Softcap<M> {}

impl<M: Mask> Softcap<M> {
    /// The launch's softcap (`Problem::softcap`; none outside the general entries).
    #[inline(always)]
    pub fn new(pb: &Problem) -> Self {
        Softcap { cap: if M::BIAS { pb.softcap } else { 0.0 }, _mask: PhantomData }
    }

    /// [`new`](Self::new) in an entry that `applies` it, else off (constant: no code): the
    /// Hopper backward caps in its general entries, not its variable-length ones (with it,
    /// their dQ kernel spilled).
    #[inline(always)]
    pub fn new_if(applies: bool, pb: &Problem) -> Self {
        Softcap { cap: if M::BIAS && applies { pb.softcap } else { 0.0 }, _mask: PhantomData }
    }

    /// Whether scores are capped (a uniform branch; constant false outside the general entries).
    #[inline(always)]
    pub fn on(self) -> bool {
        M::BIAS && self.cap > 0.0
    }

    /// The cap.
    #[inline(always)]
    pub fn cap(self) -> f32 {
        self.cap
    }

    /// For a kernel on raw scores with |scale| `scale_abs`: (k, c, lse_scale): tanh's
    /// argument per raw score, the factor from the softmax's scores (t, or the raw ones when
    /// off) to the log2 domain, and the factor from the row max to the LSE's max term
    /// (`RowState::finish_raw`).
    #[inline(always)]
    pub fn raw_factors(self, scale_abs: f32) -> (TanhArg, f32, f32) {
        match self.on() {
            true => (self.k(scale_abs), self.cap * LOG2_E, self.cap),
            false => (self.k(scale_abs), score_scale(scale_abs) * LOG2_E, scale_abs),
        }
    }

    /// [`k`](Self::k) from the cap and the scale hidden from the compiler
    /// (`thread::opaque`): called inside the KV loop, it is recomputed each tile instead of
    /// holding registers across the loop (the mma forward at d = 256 sits at 255).
    #[inline(always)]
    pub fn opaque_k(self, scale: f32) -> TanhArg {
        if !self.on() {
            return TanhArg { a: 0.0, b: 0.0 };
        }
        let x = thread::opaque(((self.cap.to_bits() as u64) << 32) | scale.to_bits() as u64);
        let (cap, scale) = (f32::from_bits((x >> 32) as u32), f32::from_bits(x as u32));
        Softcap::<M> { cap, _mask: PhantomData }.k(scale)
    }

    /// tanh's argument per raw score for a signed `scale` (negative for a negative scale;
    /// zeros when off).
    #[inline(always)]
    pub fn k(self, scale: f32) -> TanhArg {
        if !self.on() {
            return TanhArg { a: 0.0, b: 0.0 };
        }
        let a = score_scale(scale.abs());
        TanhArg { a: if scale < 0.0 { -a } else { a }, b: math::rcp_approx(self.cap) }
    }

    /// A scaled score S (natural units) capped: cap tanh(S / cap), and the derivative
    /// 1 - tanh^2 (S itself and 1 when off). S / cap divided, as naive attention in f32 does:
    /// where the cap is far above the scores, the capped score is then S's own f32 value.
    #[inline(always)]
    pub fn scaled(self, s: f32) -> (f32, f32) {
        if !self.on() {
            return (s, 1.0);
        }
        let (t, dt) = tanh_dtanh(s / self.cap);
        (self.cap * t, dt)
    }

    /// [`scaled`](Self::scaled) with S / cap as S times 1 / cap: one rounding more (half an
    /// ulp of tanh's argument), no division per score (with one, the SIMT dK/dV kernel at
    /// d = 64 spills on sm_80).
    #[inline(always)]
    pub fn scaled_rcp(self, s: f32) -> (f32, f32) {
        if !self.on() {
            return (s, 1.0);
        }
        let (t, dt) = tanh_dtanh(s * (1.0 / self.cap));
        (self.cap * t, dt)
    }
}

/// tanh's argument per raw score, (S_raw a) b with a = the scale (`score_scale`) and b = 1 /
/// cap, in naive attention's order: the quotient a / cap as one factor leaves f32's normal
/// range wherever |scale| < cap 2^-126 (a zero or tiny scale; a cap reaches 1e8), and
/// flushed or clamped, it turns an infinite raw score into inf * 0 = NaN or every raw score
/// into a different capped one. Both factors are normal for every accepted scale and cap
/// (`MAX_SCALE`, `MIN_SOFTCAP`, `MAX_SOFTCAP` on the host).
#[derive(Clone, Copy)]
pub struct TanhArg {
    a: f32,
    b: f32,
}

impl TanhArg {
    /// t = tanh((raw a) b) for a 16-bit kernel ([`tanh_16`]).
    #[inline(always)]
    pub fn tanh_16(self, raw: f32) -> f32 {
        tanh_16((raw * self.a) * self.b)
    }

    /// t = tanh((raw a) b) with [`tanh_mufu`].
    #[inline(always)]
    pub fn tanh_mufu(self, raw: f32) -> f32 {
        tanh_mufu((raw * self.a) * self.b)
    }
}

/// tanh(x) and 1 - tanh(x)^2, each to a few f32 ulps for every x (the latter to (1 + |x|)
/// 4e-7 relative): an odd Taylor series where
/// |x| < 1/2, else from u = 1 - |tanh x| = 2 / (e^(2|x|) + 1) (no cancellation in 1 - t^2 =
/// u (2 - u) near saturation). tanh(+-inf) = +-1 (derivative 0); NaN stays NaN.
#[inline(always)]
pub fn tanh_dtanh(x: f32) -> (f32, f32) {
    let a = x.abs();
    if a < 0.5 {
        // x + x^3 (c3 + x^2 (c5 + ...)), through x^17: the next term is below 1e-9 relative.
        let x2 = x * x;
        let p = 6404582.0f32 / 10854718875.0;
        let p = -929569.0 / 638512875.0 + x2 * p;
        let p = 21844.0 / 6081075.0 + x2 * p;
        let p = -1382.0 / 155925.0 + x2 * p;
        let p = 62.0 / 2835.0 + x2 * p;
        let p = -17.0 / 315.0 + x2 * p;
        let p = 2.0 / 15.0 + x2 * p;
        let p = -1.0 / 3.0 + x2 * p;
        let t = x + x * x2 * p;
        (t, 1.0 - t * t)
    } else {
        let e = math::ex2(a * (2.0 * LOG2_E));
        // e = inf past |x| ~ 44: u = 0, t = 1.
        let u = 2.0 * math::rcp_approx(e + 1.0);
        let t = 1.0 - u;
        (if x < 0.0 { -t } else { t }, u * (2.0 - u))
    }
}

/// tanh(x) to about 2e-6 relative, for the `mma` kernels, whose scores go on in 16 bits (`fwd_mma`,
/// `bwd_mma`: P and dS are rounded to f16 or bf16, 2^-11 or 2^-8, before the
/// next product): an odd series through x^7 below |x| = 1/4 (truncation under 4e-7
/// relative), else 1 - 2 / (e^(2|x|) + 1) with the hardware's `ex2` and reciprocal (a few
/// 2^-24 absolute, so under 2e-6 relative past 1/4): half the instructions of
/// [`tanh_dtanh`], and no division. tanh(+-inf) = +-1; NaN stays NaN.
#[inline(always)]
pub fn tanh_16(x: f32) -> f32 {
    let a = x.abs();
    if a < 0.25 {
        let x2 = x * x;
        let p = -17.0f32 / 315.0;
        let p = 2.0 / 15.0 + x2 * p;
        let p = -1.0 / 3.0 + x2 * p;
        x + x * x2 * p
    } else {
        let t = 1.0 - 2.0 * math::rcp_approx(math::ex2(a * (2.0 * LOG2_E)) + 1.0);
        if x < 0.0 { -t } else { t }
    }
}

/// tanh(x) within 2^-16 of its magnitude: the hardware's `tanh.approx` (`math::tanh_approx`),
/// one MUFU instruction where [`tanh_16`] takes two and a select; for the Hopper forward
/// (`fwd_wgmma`), whose capped scores go on in 16 bits as [`tanh_16`]'s do. (In the `mma`
/// kernels ptxas spills with it: 8 / 8 bytes in the forward at d = 128 on sm_80, 8 / 16 in
/// the dK/dV step at d = 64 on sm_90.)
#[inline(always)]
pub fn tanh_mufu(x: f32) -> f32 {
    math::tanh_approx(x)
}

/// 1 - t^2 of a tanh value t (for a kernel that keeps only t: near saturation it carries
/// t's rounding, about 2^-24 absolute, where [`tanh_dtanh`]'s is relative).
#[inline(always)]
pub fn dtanh(t: f32) -> f32 {
    1.0 - t * t
}

/// Below this, 1 - t^2 of a [`tanh_mufu`] value is its error (t within 2^-16 of its magnitude
/// gives 1 - t^2 within 2^-15) more than its value.
pub const DTANH_MUFU_FLOOR: f32 = 1.0 / 16384.0;

/// 1 - t^2 of a [`tanh_mufu`] value t, 0 where it is below [`DTANH_MUFU_FLOOR`]: near saturation
/// the hardware's tanh cannot resolve it, and the unresolved rest made a whole row's gradient
/// its noise (dQ relative error 29 where every score of a row saturated: scale 360, cap 37.6;
/// a 16-bit naive attention rounds t to 1 there and takes 0 as well).
#[inline(always)]
pub fn dtanh_mufu(t: f32) -> f32 {
    let d = 1.0 - t * t;
    if d < DTANH_MUFU_FLOOR { 0.0 } else { d }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against f64's tanh over the whole f32 range that matters (both signs, 1e-30 to 60),
    /// infinities and NaN: tanh within 4 ulps of its own magnitude (or 1e-30 absolute), and
    /// 1 - tanh^2 within (1 + |x|) 4e-7 relative (past 1/2, e^(2|x|) carries the rounding of
    /// its argument, about |x| 2^-23).
    #[test]
    fn tanh_matches_f64() {
        let mut x = 1e-30f64;
        while x < 60.0 {
            for s in [x, -x] {
                let (t, dt) = tanh_dtanh(s as f32);
                let s = (s as f32) as f64;
                let (tr, dtr) = (s.tanh(), 1.0 / s.cosh().powi(2));
                assert!((t as f64 - tr).abs() <= 4.0 * f32::EPSILON as f64 * tr.abs() + 1e-30, "tanh({s}) = {t}, f64 {tr}");
                let bound = 4e-7 * (1.0 + s.abs()) * dtr + 1e-38;
                assert!((dt as f64 - dtr).abs() <= bound, "1 - tanh^2({s}) = {dt}, f64 {dtr}");
            }
            x *= 1.0137;
        }
        assert_eq!(tanh_dtanh(f32::INFINITY), (1.0, 0.0));
        assert_eq!(tanh_dtanh(f32::NEG_INFINITY), (-1.0, 0.0));
        assert!(tanh_dtanh(f32::NAN).0.is_nan());
        assert_eq!(tanh_dtanh(0.0).0, 0.0);
    }

    /// Checks `ok(t, exact)` for tanh `f` at every x from 1e-30 to 60 (steps of 1.37%, both
    /// signs) against f64's tanh of the same f32, and f's ends: +-inf, NaN, 0.
    fn sweep(f: fn(f32) -> f32, ok: impl Fn(f64, f64) -> bool) {
        let mut x = 1e-30f64;
        while x < 60.0 {
            for s in [x, -x] {
                let (t, tr) = (f(s as f32) as f64, ((s as f32) as f64).tanh());
                assert!(ok(t, tr), "tanh({s}) = {t}, f64 {tr}");
            }
            x *= 1.0137;
        }
        assert_eq!(f(f32::INFINITY), 1.0);
        assert_eq!(f(f32::NEG_INFINITY), -1.0);
        assert!(f(f32::NAN).is_nan());
        assert_eq!(f(0.0), 0.0);
    }

    /// [`tanh_16`] against f64's tanh: within 2e-6 of its magnitude (exact `exp2` and
    /// division here, so this checks the series and the formula).
    #[test]
    fn tanh_16_matches_f64() {
        sweep(tanh_16, |t, tr| (t - tr).abs() <= 2e-6 * tr.abs() + 1e-37);
    }

    /// [`tanh_mufu`] (the emulator's `tanh.approx`) against f64's tanh: within 2^-16 of its
    /// magnitude and not above it (each to f32's rounding).
    #[test]
    fn tanh_mufu_matches_f64() {
        sweep(tanh_mufu, |t, tr| (t - tr).abs() <= tr.abs() * (1.0 / 65536.0 + 1.2e-7) && t.abs() <= tr.abs() * (1.0 + 1.2e-7));
    }
}
