//! Checks of the NaN/Inf rule (README, "NaN and Inf"): inputs with a few values replaced by
//! NaN or an infinity, outputs compared with exact attention element by element.
//!
//! The rule: an output element is finite exactly where the f64 reference's is (a key a row
//! cannot see, by the mask or by length, never reaches it; everything else is IEEE
//! arithmetic); where the reference's is NaN, so is the kernel's when only NaNs were planted
//! (an infinity may turn into NaN or stay infinite as the order of the operations makes it;
//! in the backward an infinity that meets only a zero weight may also leave a gradient
//! finite where exact arithmetic's 0 * inf makes it NaN);
//! LSE is NaN exactly where the reference's is, and -inf exactly where it is; the finite
//! elements meet the usual bar.

use crate::Rng;
use crate::{Case, Dt, within};
use flashattn::reference::{attention_backward_f64, attention_f64, l2, rel_l2, tolerance};
use flashattn::{AttnShape, BwdOptions, Dtype, FlashAttn, FwdOptions, FwdOutput};
use std::fmt;

/// Which input a planted value goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    Q,
    K,
    V,
    /// dO (backward only).
    DO,
}

/// A value planted into an input: at element `at` (taken modulo the input's length).
#[derive(Clone, Copy, Debug)]
pub struct Plant {
    pub input: Input,
    pub at: u64,
    /// NaN, +inf or -inf.
    pub value: f64,
}

impl fmt::Display for Plant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}[{}]={}", self.input, self.at, self.value)
    }
}

/// Where an element of a pair (kernel, reference) disagrees with the rule, if anywhere;
/// `lenient`: a finite kernel element where the reference's is not is allowed (the
/// backward with infinities planted: an infinity that meets only a zero weight,
/// exp(-inf) = 0, where exact arithmetic gives 0 * inf = NaN).
fn class_mismatch(got: &[f64], exact: &[f64], nan_only: bool, lenient: bool) -> Option<usize> {
    (0..got.len()).find(|&i| {
        let (g, x) = (got[i].is_finite(), exact[i].is_finite());
        (g != x && !(lenient && g)) || (nan_only && exact[i].is_nan() && !got[i].is_nan())
    })
}

/// Relative L2 error over the elements finite in both, and its bar: the usual one, from the
/// larger of two errors of naive attention in T: on the same inputs without the planted
/// values (`naive_err`; on the few finite elements of a small case naive attention can be
/// exact by luck, where the kernels round P before normalizing it), and on the planted inputs
/// over the same finite elements (`naive`, its output there: where the plants leave a few
/// small outputs, their relative error is larger than the whole unplanted case's).
fn finite_error<T: Dtype>(got: &[f64], exact: &[f64], naive: &[f64], naive_err: f64) -> (f64, f64) {
    let keep: Vec<usize> = (0..got.len()).filter(|&i| got[i].is_finite() && exact[i].is_finite()).collect();
    let pick = |x: &[f64], keep: &[usize]| keep.iter().map(|&i| x[i]).collect::<Vec<_>>();
    // Naive attention's error where it is finite too (its f16 / bf16 S can overflow where the
    // kernels' f32 S does not).
    let both: Vec<usize> = keep.iter().copied().filter(|&i| naive[i].is_finite()).collect();
    // (An infinite one, where those exact outputs are all 0, is no bar.)
    let naive_here = rel_l2(&pick(naive, &both), &pick(exact, &both));
    let naive_err = if naive_here.is_finite() { naive_err.max(naive_here) } else { naive_err };
    (rel_l2(&pick(got, &keep), &pick(exact, &keep)), tolerance::<T>(naive_err))
}

/// Random inputs of `case` with `plants` in them: (Q, K, V, dO).
fn inputs<T: Dtype>(case: &Case, plants: &[Plant]) -> [Vec<T>; 4] {
    let s = case.shape;
    let mut rng = Rng::new(case.seed);
    let (nq, nk) = (s.batch * s.seqlen_q * s.heads_q * s.head_dim, s.batch * s.seqlen_k * s.heads_kv * s.head_dim);
    let mut x = [rng.tensor(nq), rng.tensor(nk), rng.tensor(nk), rng.tensor(nq)];
    for p in plants {
        let t = &mut x[p.input as usize];
        let n = t.len() as u64;
        t[(p.at % n) as usize] = T::from_f64(p.value);
    }
    x
}

/// Forward of `case` with `plants` in Q, K, V, on `fa` (family `kernel` or automatic),
/// against the rule.
pub fn check_forward(fa: &FlashAttn, case: &Case, plants: &[Plant], kernel: Option<&'static str>) -> Result<(), String> {
    // Without sinks: their part of the rule (a row without weights has O = 0 and LSE = its
    // sink; dsinks) is not checked here yet.
    let case = &checked_case(case);
    match case.dtype {
        Dt::F32 => forward_typed::<f32>(fa, case, plants, kernel),
        Dt::F16 => forward_typed::<half::f16>(fa, case, plants, kernel),
        Dt::Bf16 => forward_typed::<half::bf16>(fa, case, plants, kernel),
    }
}

/// The case checked: `case` without sinks, and without ALiBi where it has a softcap. ALiBi's
/// bias is finite, so the rule holds with it as drawn; but with a softcap an infinite input
/// makes scores of exactly +-cap, which the bias then tells apart only to f32's resolution at
/// the cap (a unit roundoff of 1e8 is 6: P off by e^6), an error the bars here, taken from
/// the inputs without the planted values, do not count (found at 2e-1 against 1e-3).
fn checked_case(case: &Case) -> Case {
    Case { sinks: false, alibi: if case.softcap.is_some() { None } else { case.alibi }, ..*case }
}

fn describe(case: &Case, plants: &[Plant], kernel: Option<&str>) -> String {
    let p: Vec<String> = plants.iter().map(|p| p.to_string()).collect();
    format!("[{}] {case} planted {}", kernel.unwrap_or("auto"), p.join(", "))
}

fn forward_typed<T: Dtype>(fa: &FlashAttn, case: &Case, plants: &[Plant], kernel: Option<&'static str>) -> Result<(), String> {
    let s = case.shape;
    let what = describe(case, plants, kernel);
    let e = |e: flashattn::Error| format!("{what}: {e}");
    let [q, k, v, _] = inputs::<T>(case, plants);
    let (qd, kd, vd) =
        (fa.upload(&q, &s.q_shape()).map_err(e)?, fa.upload(&k, &s.kv_shape()).map_err(e)?, fa.upload(&v, &s.kv_shape()).map_err(e)?);
    // Poisoned with a finite value: NaN is a legitimate output here.
    let poison = T::from_f64(-7777.0);
    let mut out = FwdOutput::from_buffers(fa.full(poison, &s.q_shape()).map_err(e)?, fa.full(-7777.0f32, &s.lse_shape()).map_err(e)?, None);
    let attn = case.attention_on(fa).map_err(e)?;
    fa.forward_into(&qd, &kd, &vd, &attn, &FwdOptions { kernel, ..Default::default() }, &mut out).map_err(e)?;
    let o: Vec<f64> = fa.download(out.o()).map_err(e)?.iter().map(|x| x.to_f64()).collect();
    let lse: Vec<f64> = fa.download(out.lse()).map_err(e)?.iter().map(|&x| x as f64).collect();
    let w = |x: &[T]| x.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    let exact = attention_f64(&w(&q), &w(&k), &w(&v), &s, &case.attention());
    let [q0, k0, v0, _] = inputs::<T>(case, &[]);
    let naive_err = rel_l2(
        &flashattn::reference::naive_attention(&q0, &k0, &v0, &s, &case.attention()).o,
        &flashattn::reference::reference(&q0, &k0, &v0, &s, &case.attention()).o,
    );
    let nan_only = plants.iter().all(|p| p.value.is_nan());
    if let Some(i) = o.iter().chain(lse.iter()).position(|&x| x == -7777.0) {
        return Err(format!("{what}: output element {i} (O then LSE) not written"));
    }
    if let Some(i) = class_mismatch(&o, &exact.o, nan_only, false) {
        return Err(format!("{what}: O[{i}] = {} where exact attention gives {} ({})", o[i], exact.o[i], at(&s, i, false)));
    }
    if let Some(i) = (0..lse.len())
        .find(|&i| lse[i].is_nan() != exact.lse[i].is_nan() || (lse[i] == f64::NEG_INFINITY) != (exact.lse[i] == f64::NEG_INFINITY))
    {
        return Err(format!("{what}: LSE[{i}] = {} where exact attention gives {}", lse[i], exact.lse[i]));
    }
    let naive = flashattn::reference::naive_attention(&q, &k, &v, &s, &case.attention()).o;
    let (err, tol) = finite_error::<T>(&o, &exact.o, &naive, naive_err);
    if !within(err, tol) {
        return Err(format!("{what}: finite O elements rel err {err:.3e} (tol {tol:.3e})"));
    }
    Ok(())
}

/// Where element `i` of Q's layout (or K's, `kv`) is: (b, position, head, column).
fn at(s: &AttnShape, i: usize, kv: bool) -> String {
    let (seq, heads) = if kv { (s.seqlen_k, s.heads_kv) } else { (s.seqlen_q, s.heads_q) };
    let (c, r) = (i % s.head_dim, i / s.head_dim);
    let (h, r) = (r % heads, r / heads);
    let (pos, b) = (r % seq, r / seq);
    format!("b={b} {}={pos} h={h} c={c}", if kv { "key" } else { "row" })
}

/// Forward then backward of `case` with `plants` in Q, K, V, dO (backward family `kernel` or
/// automatic; `saved`: the forward saves O's residual), against the rule for dQ, dK, dV.
pub fn check_backward(fa: &FlashAttn, case: &Case, plants: &[Plant], kernel: Option<&'static str>, saved: bool) -> Result<(), String> {
    // As `check_forward`.
    let case = &checked_case(case);
    match case.dtype {
        Dt::F32 => backward_typed::<f32>(fa, case, plants, kernel, saved),
        Dt::F16 => backward_typed::<half::f16>(fa, case, plants, kernel, saved),
        Dt::Bf16 => backward_typed::<half::bf16>(fa, case, plants, kernel, saved),
    }
}

fn backward_typed<T: Dtype>(
    fa: &FlashAttn,
    case: &Case,
    plants: &[Plant],
    kernel: Option<&'static str>,
    saved: bool,
) -> Result<(), String> {
    let s = case.shape;
    let what = format!("{}{}", describe(case, plants, kernel), if saved { ", residual" } else { "" });
    let e = |e: flashattn::Error| format!("{what}: {e}");
    let [q, k, v, d_o] = inputs::<T>(case, plants);
    let (qd, kd, vd, dod) = (
        fa.upload(&q, &s.q_shape()).map_err(e)?,
        fa.upload(&k, &s.kv_shape()).map_err(e)?,
        fa.upload(&v, &s.kv_shape()).map_err(e)?,
        fa.upload(&d_o, &s.q_shape()).map_err(e)?,
    );
    let attn = case.attention_on(fa).map_err(e)?;
    let fwd = fa.forward(&qd, &kd, &vd, &attn, &FwdOptions { kernel: None, save_residual: saved, ..Default::default() }).map_err(e)?;
    let poison = T::from_f64(-7777.0);
    let mut g = flashattn::BwdOutput {
        dq: fa.full(poison, &s.q_shape()).map_err(e)?,
        dk: fa.full(poison, &s.kv_shape()).map_err(e)?,
        dv: fa.full(poison, &s.kv_shape()).map_err(e)?,
        dsinks: None,
    };
    fa.backward_into(&qd, &kd, &vd, &fwd, &dod, &BwdOptions { kernel, deterministic: false }, &mut g).map_err(e)?;
    let down =
        |t: &flashattn::Tensor<T>| -> Result<Vec<f64>, String> { Ok(fa.download(t).map_err(e)?.iter().map(|x| x.to_f64()).collect()) };
    let got = [down(&g.dq)?, down(&g.dk)?, down(&g.dv)?];
    let w = |x: &[T]| x.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    let exact = attention_backward_f64(&w(&q), &w(&k), &w(&v), &w(&d_o), &s, &case.attention());
    // The bar's naive error from the same inputs without the planted values (see
    // `finite_error`).
    let [q0, k0, v0, do0] = inputs::<T>(case, &[]);
    let naive = flashattn::reference::naive_backward(&q0, &k0, &v0, &do0, &s, &case.attention());
    let exact0 = attention_backward_f64(&w(&q0), &w(&k0), &w(&v0), &w(&do0), &s, &case.attention());
    let floor = flashattn::reference::backward_recompute_bound(&w(&q0), &w(&k0), &w(&v0), &w(&do0), &s, &case.attention());
    let nan_only = plants.iter().all(|p| p.value.is_nan());
    let unresolved = unresolved_keys::<T>(&attention_f64(&w(&q), &w(&k), &w(&v), &s, &case.attention()).lse, &s);
    for (name, g, ex, (nv, ex0, fl), kv) in [
        ("dQ", &got[0], &exact.dq, (&naive.dq, &exact0.dq, &floor.dq), false),
        ("dK", &got[1], &exact.dk, (&naive.dk, &exact0.dk, &floor.dk), true),
        ("dV", &got[2], &exact.dv, (&naive.dv, &exact0.dv, &floor.dv), true),
    ] {
        if let Some(i) = g.iter().position(|&x| x == -7777.0) {
            return Err(format!("{what}: {name}[{i}] not written"));
        }
        // The exact gradient rounded to T: at large scales an element can be finite in f64 and
        // past T's range (f16: 65504), where the kernel's is rightly infinite. Where the exact
        // one lies within the kernel's error of that range (the larger of 32 units roundoff
        // and the whole gradient's error bar below, as an absolute error), either side is
        // right: an infinity of the exact one's sign, or a finite value (then measured with
        // the others). The error below is measured against the unrounded one.
        let naive_tol = tolerance::<T>(rel_l2(nv, ex0));
        let budget = naive_tol * l2(ex0) + l2(fl);
        let straddles = |x: f64| {
            let m = (32.0 * T::UNIT_ROUNDOFF * x.abs()).max(budget);
            x.is_finite() && T::from_f64(x.abs() + m).to_f64().is_infinite() && T::from_f64((x.abs() - m).max(0.0)).to_f64().is_finite()
        };
        let ex_t: Vec<f64> = (0..g.len())
            .map(|i| {
                let x = ex[i];
                let either = straddles(x) && (g[i].is_finite() || g[i].signum() == x.signum());
                if either { g[i] } else { T::from_f64(x).to_f64() }
            })
            .collect();
        if let Some(i) = class_mismatch(g, &ex_t, nan_only, !nan_only) {
            return Err(format!("{what}: {name}[{i}] = {} where exact attention gives {} ({})", g[i], ex[i], at(&s, i, kv)));
        }
        // dV's element i is of key (b, j, KV head) i / head_dim.
        let resolved = |i: usize| name != "dV" || !unresolved[i / s.head_dim];
        let keep: Vec<usize> = (0..g.len()).filter(|&i| g[i].is_finite() && ex_t[i].is_finite() && resolved(i)).collect();
        let pick = |x: &[f64]| keep.iter().map(|&i| x[i]).collect::<Vec<_>>();
        let (gp, ep, fp) = (pick(g), pick(ex), pick(fl));
        if ex0.iter().all(|&x| x == 0.0) || ep.iter().all(|&x| x == 0.0) {
            // Gradients that vanish exactly (a single key): the regular tests bound them.
            continue;
        }
        // Relative to the larger of the kept elements' norm and their share of the unplanted
        // gradient's (RMS): a few elements that are tiny here (a weight of e^-35 that rounds
        // to 0 in P, as it does in naive attention) are measured against the gradient's size.
        // Norms scaled against underflow (gradients of 1e-170 at scales in the thousands); the
        // bar adds the smallest positive value of T per element, below which T cannot follow.
        let share = l2(ex0) * (ep.len() as f64 / ex0.len() as f64).sqrt();
        let denom = l2(&ep).max(share);
        let diff: Vec<f64> = gp.iter().zip(&ep).map(|(a, b)| a - b).collect();
        let err = if denom > 0.0 {
            l2(&diff) / denom
        } else if l2(&diff) == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        let floor_t = smallest_positive::<T>() * (ep.len() as f64).sqrt();
        let tol = naive_tol + if denom > 0.0 { (l2(&fp) + floor_t) / denom } else { 0.0 };
        if !within(err, tol) {
            return Err(format!("{what}: finite {name} elements rel err {err:.3e} (tol {tol:.3e})"));
        }
    }
    Ok(())
}

/// Which (batch, key, KV head) a row sees whose P the backward cannot resolve: it recomputes
/// P_ij = exp(S_ij - LSE_i) from the forward's f32 LSE, which moves P by a factor e^(u |LSE_i|)
/// (`backward_recompute_bound`). The bar's floor comes from the unplanted inputs; a planted
/// row can have an LSE they do not: an infinite query element with a softcap makes the row's
/// scores +-cap (LSE ~ 1e8 at the largest cap: P off by e^12, as in FA2 and FA3, whose
/// backward also keeps the LSE alone). The dV of keys such a row sees (u |LSE| > 2^-10, or
/// T's unit roundoff where larger; any key of its batch entry and KV head) is left out.
/// `lse`: the exact LSE of the planted inputs, [batch, heads_q, seqlen_q].
fn unresolved_keys<T: Dtype>(lse: &[f64], s: &AttnShape) -> Vec<bool> {
    let limit = T::UNIT_ROUNDOFF.max(2f64.powi(-10)) / f32::UNIT_ROUNDOFF;
    let group = s.heads_q / s.heads_kv;
    let mut out = vec![false; s.batch * s.seqlen_k * s.heads_kv];
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            let rows = &lse[(b * s.heads_q + h) * s.seqlen_q..][..s.seqlen_q];
            if rows.iter().any(|x| x.is_finite() && x.abs() > limit) {
                for j in 0..s.seqlen_k {
                    out[(b * s.seqlen_k + j) * s.heads_kv + h / group] = true;
                }
            }
        }
    }
    out
}

/// The smallest positive value of T (its smallest subnormal).
fn smallest_positive<T: Dtype>() -> f64 {
    let mut x = 1.0f64;
    while T::from_f64(x / 2.0).to_f64() != 0.0 {
        x /= 2.0;
    }
    x
}

/// A proptest strategy of 1 to 3 planted values in the inputs a pass reads (dO only with
/// `backward`), NaN in half the cases and an infinity of either sign otherwise.
pub fn plants_strategy(backward: bool) -> impl proptest::strategy::Strategy<Value = Vec<Plant>> {
    use proptest::prelude::*;
    let inputs = if backward { vec![Input::Q, Input::K, Input::V, Input::DO] } else { vec![Input::Q, Input::K, Input::V] };
    let one = (proptest::sample::select(inputs), any::<u64>(), 0..4u8).prop_map(|(input, at, kind)| Plant {
        input,
        at,
        value: match kind {
            0 | 1 => f64::NAN,
            2 => f64::INFINITY,
            _ => f64::NEG_INFINITY,
        },
    });
    proptest::collection::vec(one, 1..=3)
}
