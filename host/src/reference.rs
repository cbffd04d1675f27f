//! CPU references, public so users can check their own uses.
//!
//! [`attention_f64`] is plain attention in f64 with exactly the kernels' options: the
//! ground truth. [`naive_attention`] is the same computation as a framework would do it in
//! the input dtype (scores and probabilities rounded to it, f32 accumulation); twice its error
//! is FlashAttention's accuracy bar (FA2's rule), see [`tolerance`].

use crate::dtype::Dtype;
use crate::forward::AttnShape;
use crate::options::Attention;

/// Output of a reference: O as f64 in Q's layout, LSE [batch, heads_q, seqlen_q].
#[derive(Clone, Debug)]
pub struct RefOutput {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Whether `opts` hides key `j` from query row `i` (the causal mask and the window).
fn hides(opts: &Attention, i: usize, j: usize, s: &AttnShape) -> bool {
    !opts.sees(i, j, s.seqlen_q, s.seqlen_k)
}

/// The scale the softmax applies to the scores (the kernels' rule, `softmax::score_scale`):
/// softmax_scale, with 0 taken as the smallest positive normal f32, the limit scale -> 0+
/// (uniform weights over finite scores; an infinite score keeps its sign).
fn score_scale(scale: f64) -> f64 {
    if scale == 0.0 { f32::MIN_POSITIVE as f64 } else { scale }
}

/// Max that propagates NaN (`f64::max` drops it).
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
}

/// One (batch, head, query row) of attention in f64: writes the row of O, returns the LSE.
/// Only the keys the row sees take part (a masked key is left out, not weighted by 0, so
/// whatever it holds cannot reach the row); everything else is IEEE arithmetic, so a NaN the
/// row sees makes its LSE NaN and an infinite value makes the outputs it reaches non-finite.
#[allow(clippy::too_many_arguments)]
fn attention_row(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    s: &AttnShape,
    scale: f64,
    opts: &Attention,
    (b, h, i): (usize, usize, usize),
    out: &mut [f64],
    scores: &mut Vec<(usize, f64)>,
) -> f64 {
    let d = s.head_dim;
    let hk = h / (s.heads_q / s.heads_kv);
    let q_row = &q[((b * s.seqlen_q + i) * s.heads_q + h) * d..][..d];
    let sc = score_scale(scale);
    scores.clear();
    for j in (0..s.seqlen_k).filter(|&j| !hides(opts, i, j, s)) {
        let k_row = &k[((b * s.seqlen_k + j) * s.heads_kv + hk) * d..][..d];
        let dot: f64 = q_row.iter().zip(k_row).map(|(a, b)| a * b).sum();
        scores.push((j, opts.capped(dot * sc) + opts.alibi_bias((b, h), i, j, s.seqlen_q, s.seqlen_k)));
    }
    // The head's sink joins the denominator as a key of value 0 (-inf: none).
    let sink = opts.sink(h).unwrap_or(f64::NEG_INFINITY);
    let m = scores.iter().fold(sink, |m, &(_, x)| nan_max(m, x));
    out.iter_mut().for_each(|x| *x = 0.0);
    if m == f64::NEG_INFINITY {
        // No key visible, or every score -inf, and no sink: no weights at all.
        return f64::NEG_INFINITY;
    }
    let mut l = (sink - m).exp();
    for (_, x) in scores.iter_mut() {
        *x = (*x - m).exp();
        l += *x;
    }
    for &(j, p) in scores.iter() {
        let p = p / l;
        let v_row = &v[((b * s.seqlen_k + j) * s.heads_kv + hk) * d..][..d];
        for (o, x) in out.iter_mut().zip(v_row) {
            *o += p * x;
        }
    }
    m + l.ln()
}

/// Exact attention in f64. Q [b, sq, hq, d], K and V [b, sk, hkv, d], row-major; options
/// as the kernels take them (scale, causal bottom-right aligned, sliding window, softcap,
/// ALiBi, sinks, GQA). Fully masked rows give O = 0 and LSE = -inf (with a sink, LSE = the sink).
///
/// # Panics
/// With sinks given on the device ([`Attention::sink`]).
pub fn attention_f64(q: &[f64], k: &[f64], v: &[f64], s: &AttnShape, opts: &Attention) -> RefOutput {
    let d = s.head_dim;
    let scale = opts.scale(d) as f64;
    let mut o = vec![0.0; s.batch * s.seqlen_q * s.heads_q * d];
    let mut lse = vec![0.0; s.batch * s.heads_q * s.seqlen_q];
    let mut scores = Vec::with_capacity(s.seqlen_k);
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            for i in 0..s.seqlen_q {
                let at = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
                let out = &mut o[at..at + d];
                lse[(b * s.heads_q + h) * s.seqlen_q + i] = attention_row(q, k, v, s, scale, opts, (b, h, i), out, &mut scores);
            }
        }
    }
    RefOutput { o, lse }
}

/// Exact attention in f64 of inputs in any [`Dtype`].
pub fn reference<T: Dtype>(q: &[T], k: &[T], v: &[T], shape: &AttnShape, opts: &Attention) -> RefOutput {
    let w = |x: &[T]| x.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    attention_f64(&w(q), &w(k), &w(v), shape, opts)
}

/// Exact f64 attention for selected rows only, `(batch, head, query row)`: O rows and LSEs.
pub fn reference_rows<T: Dtype>(
    q: &[T],
    k: &[T],
    v: &[T],
    shape: &AttnShape,
    opts: &Attention,
    rows: &[(usize, usize, usize)],
) -> Vec<(Vec<f64>, f64)> {
    let w = |x: &[T]| x.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    let (q, k, v) = (w(q), w(k), w(v));
    let scale = opts.scale(shape.head_dim) as f64;
    let mut scores = Vec::new();
    rows.iter()
        .map(|&r| {
            let mut out = vec![0.0; shape.head_dim];
            let lse = attention_row(&q, &k, &v, shape, scale, opts, r, &mut out, &mut scores);
            (out, lse)
        })
        .collect()
}

/// Attention as a framework computes it naively in dtype `T` (PyTorch's math path):
/// S = Q K^T accumulated in f32 and rounded to `T`; softmax of scale * S in f32 with P
/// rounded to `T`; O = P V accumulated in f32 and rounded to `T`. For `T = f32` every step is
/// plain f32 arithmetic. Its error against [`attention_f64`] calibrates [`tolerance`].
pub fn naive_attention<T: Dtype>(q: &[T], k: &[T], v: &[T], s: &AttnShape, opts: &Attention) -> RefOutput {
    let rows: Vec<_> = (0..s.batch).flat_map(|b| (0..s.heads_q).flat_map(move |h| (0..s.seqlen_q).map(move |i| (b, h, i)))).collect();
    let mut o = vec![0.0; s.batch * s.seqlen_q * s.heads_q * s.head_dim];
    let mut lse = vec![0.0; s.batch * s.heads_q * s.seqlen_q];
    for ((b, h, i), (row, l)) in rows.iter().zip(naive_rows(q, k, v, s, opts, &rows)) {
        let at = ((b * s.seqlen_q + i) * s.heads_q + h) * s.head_dim;
        o[at..at + s.head_dim].copy_from_slice(&row);
        lse[(b * s.heads_q + h) * s.seqlen_q + i] = l;
    }
    RefOutput { o, lse }
}

/// [`naive_attention`] for selected rows only, `(batch, head, query row)`: O rows and LSEs.
pub fn naive_rows<T: Dtype>(
    q: &[T],
    k: &[T],
    v: &[T],
    s: &AttnShape,
    opts: &Attention,
    rows: &[(usize, usize, usize)],
) -> Vec<(Vec<f64>, f64)> {
    let d = s.head_dim;
    let scale = opts.scale(d);
    let rt = |x: f32| T::from_f32(x).to_f32();
    let mut p = vec![0f32; s.seqlen_k];
    let mut acc = vec![0f32; d];
    rows.iter()
        .map(|&(b, h, i)| {
            let hk = h / (s.heads_q / s.heads_kv);
            let q_row = &q[((b * s.seqlen_q + i) * s.heads_q + h) * d..][..d];
            for (j, pj) in p.iter_mut().enumerate() {
                *pj = if hides(opts, i, j, s) {
                    f32::NEG_INFINITY
                } else {
                    let k_row = &k[((b * s.seqlen_k + j) * s.heads_kv + hk) * d..][..d];
                    let x = rt(q_row.iter().zip(k_row).fold(0f32, |a, (x, y)| a + x.to_f32() * y.to_f32())) * scale;
                    // Capped in f32 and rounded to T, as a framework stores the capped scores;
                    // the ALiBi bias added in f32.
                    let x = opts.softcap.map_or(x, |c| rt(c * (x / c).tanh()));
                    if opts.alibi.is_some() { x + opts.alibi_bias((b, h), i, j, s.seqlen_q, s.seqlen_k) as f32 } else { x }
                };
            }
            // The head's sink joins the softmax as one more column (-inf: none).
            let sink = opts.sink(h).map_or(f32::NEG_INFINITY, |x| x as f32);
            let m = p.iter().cloned().fold(sink, f32::max);
            if m == f32::NEG_INFINITY {
                return (vec![0.0; d], f64::NEG_INFINITY);
            }
            let mut l = (sink - m).exp();
            for pj in p.iter_mut() {
                *pj = (*pj - m).exp();
                l += *pj;
            }
            acc.iter_mut().for_each(|a| *a = 0.0);
            for (j, &pj) in p.iter().enumerate() {
                let pj = rt(pj / l);
                let v_row = &v[((b * s.seqlen_k + j) * s.heads_kv + hk) * d..][..d];
                for (a, x) in acc.iter_mut().zip(v_row) {
                    *a += pj * x.to_f32();
                }
            }
            (acc.iter().map(|&a| rt(a) as f64).collect(), (m + l.ln()) as f64)
        })
        .collect()
}

/// ||a - b|| / ||b|| over the elements where `b` is finite; infinite elements must match
/// exactly and every element of `a` must be a number, else the result is infinite (fails any
/// bound). NaN never passes. The norms are [`l2`]'s, so gradients of 1e-164 (a hard-max
/// softmax at |scale| 65536) are measured, not lost to underflow.
pub fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "rel_l2 of slices of different lengths");
    let (mut diff, mut base) = (Vec::with_capacity(a.len()), Vec::with_capacity(a.len()));
    for (&x, &y) in a.iter().zip(b) {
        if x.is_nan() || y.is_nan() {
            return f64::INFINITY;
        }
        if y.is_infinite() || x.is_infinite() {
            if x != y {
                return f64::INFINITY;
            }
            continue;
        }
        diff.push(x - y);
        base.push(y);
    }
    let (num, den) = (l2(&diff), l2(&base));
    if num == 0.0 {
        0.0
    } else if den == 0.0 {
        f64::INFINITY
    } else {
        num / den
    }
}

/// The L2 norm, scaled by the largest magnitude first so that neither tiny elements (whose
/// squares underflow) nor huge ones (whose squares overflow) are lost.
pub fn l2(x: &[f64]) -> f64 {
    let m = x.iter().fold(0f64, |m, v| m.max(v.abs()));
    if m == 0.0 || !m.is_finite() {
        return m;
    }
    m * x.iter().map(|v| (v / m) * (v / m)).sum::<f64>().sqrt()
}

/// The accuracy bar for a kernel's output in dtype `T`: twice the relative error of naive
/// attention in `T` on the same inputs (FA2's rule), plus one unit roundoff of `T` for the
/// final rounding of O that both incur in different places.
pub fn tolerance<T: Dtype>(naive_err: f64) -> f64 {
    2.0 * naive_err + T::UNIT_ROUNDOFF
}

/// The accuracy bar for an LSE (f32) against the exact `lse`: [`tolerance`], with naive
/// attention's error taken at least as large as one f32 rounding of each row's sum l. That
/// rounding is an absolute error in ln l (about u, whatever the LSE's size), which a bar
/// relative to the LSE's norm leaves out where the LSEs are near 0 and the naive sum happens
/// to round well (one query of 29 keys at scale 0, LSE 0.031: a kernel error of 1.7 u read as
/// 3.2e-6 against a bar of 1.1e-6). Rows without a key (LSE -inf) do not count.
pub fn lse_tolerance(naive_err: f64, lse: &[f64]) -> f64 {
    let finite: Vec<f64> = lse.iter().copied().filter(|x| x.is_finite()).collect();
    let norm = l2(&finite);
    let floor = if norm > 0.0 { f32::UNIT_ROUNDOFF * (finite.len() as f64).sqrt() / norm } else { 0.0 };
    tolerance::<f32>(naive_err.max(floor))
}

/// Gradients of attention with respect to Q, K and V, in their layouts, and to the sinks
/// ([heads_q]; empty without sinks).
#[derive(Clone, Debug)]
pub struct RefGrads {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    pub dsinks: Vec<f64>,
}

impl RefGrads {
    /// Zero gradients for Q, K, V of these lengths and `opts`' sinks.
    fn zeros(q: usize, k: usize, s: &AttnShape, opts: &Attention) -> RefGrads {
        let sinks = if opts.sinks.is_some() { s.heads_q } else { 0 };
        RefGrads { dq: vec![0.0; q], dk: vec![0.0; k], dv: vec![0.0; k], dsinks: vec![0.0; sinks] }
    }
}

/// The analytic gradients of [`attention_f64`] for an upstream gradient `d_o` (O's layout):
/// with S = scale Q K^T (masked), P = softmax(S), O = P V, dP = dO V^T,
/// D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij: dV = P^T dO, dS = P * (dP - D),
/// dQ = scale dS K, dK = scale dS^T Q. With GQA, dK and dV of a KV head sum over the query
/// heads that share it. Fully masked rows contribute nothing. The ground truth for the
/// backward kernels.
///
/// D_i is taken relative to a pivot c_i = dP of the row's largest P: D_i - c_i =
/// sum_j P_ij (dP_ij - c_i) and dS_ij = P_ij ((dP_ij - c_i) - (D_i - c_i)). For a row dominated
/// by one key, dP - D of that key is a sum of terms P_ik (dP_ij - dP_ik), far below |D_i|;
/// D_i itself, even in f64, carries an absolute rounding of about 1e-16 |D_i|, which exceeds
/// that key's whole dS once the other keys' P fall below about 1e-16 (scores 37 or more below
/// the max). dS of that key then came out 0 here, as in naive attention, and a kernel that
/// computes it right (the f32 SIMT kernel) was measured as wrong by up to 100%.
pub fn attention_backward_f64(q: &[f64], k: &[f64], v: &[f64], d_o: &[f64], s: &AttnShape, opts: &Attention) -> RefGrads {
    let d = s.head_dim;
    let scale = opts.scale(d) as f64;
    let fwd = attention_f64(q, k, v, s, opts);
    let mut g = RefGrads::zeros(q.len(), k.len(), s, opts);
    let sc = score_scale(scale);
    // The keys the row sees, and their P and dP: masked keys take no part (whatever they hold
    // cannot reach the row), the rest is IEEE arithmetic.
    let (mut vis, mut p, mut dp, mut dt) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            let hk = h / (s.heads_q / s.heads_kv);
            for i in 0..s.seqlen_q {
                let lse = fwd.lse[(b * s.heads_q + h) * s.seqlen_q + i];
                let qi = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
                let (q_row, do_row) = (&q[qi..qi + d], &d_o[qi..qi + d]);
                vis.clear();
                vis.extend((0..s.seqlen_k).filter(|&j| !(hides(opts, i, j, s))));
                let kj = |j: usize| ((b * s.seqlen_k + j) * s.heads_kv + hk) * d;
                // P_ij = exp(S_ij - LSE_i), recomputed from the saved LSE as the kernels do
                // (0 where the row has no weights at all: LSE -inf).
                p.clear();
                p.extend(vis.iter().map(|&j| {
                    let dot: f64 = q_row.iter().zip(&k[kj(j)..kj(j) + d]).map(|(a, b)| a * b).sum();
                    let x = opts.capped(dot * sc) + opts.alibi_bias((b, h), i, j, s.seqlen_q, s.seqlen_k);
                    if lse == f64::NEG_INFINITY { 0.0 } else { (x - lse).exp() }
                }));
                // The softcap's derivative d(capped S) / d(scale q . k) = 1 - tanh^2 (1 without).
                dt.clear();
                dt.extend(vis.iter().map(|&j| {
                    let dot: f64 = q_row.iter().zip(&k[kj(j)..kj(j) + d]).map(|(a, b)| a * b).sum();
                    opts.softcap.map_or(1.0, |c| 1.0 - (dot * sc / c as f64).tanh().powi(2))
                }));
                // dP_ij = dO_i . V_j.
                dp.clear();
                dp.extend(vis.iter().map(|&j| do_row.iter().zip(&v[kj(j)..kj(j) + d]).map(|(a, b)| a * b).sum::<f64>()));
                if vis.is_empty() {
                    continue;
                }
                // The sink's weight exp(s_h - LSE_i), a key with dP = 0.
                let p_sink = opts.sink(h).map_or(0.0, |x| if lse == f64::NEG_INFINITY { 0.0 } else { (x - lse).exp() });
                // Pivot c_i = dP of the largest P (the sink's 0 where it weighs most);
                // D_i - c_i = sum_j P_ij (dP_ij - c_i), the sink's term -P_sink c_i included.
                let top = (0..p.len()).fold(0, |t, j| if p[j] > p[t] { j } else { t });
                let ci = if p_sink > p[top] { 0.0 } else { dp[top] };
                let dc: f64 = p.iter().zip(&dp).map(|(pj, dpj)| pj * (dpj - ci)).sum::<f64>() - p_sink * ci;
                // ds_h = -sum_i P_sink D_i.
                if let Some(ds) = g.dsinks.get_mut(h) {
                    *ds -= p_sink * (dc + ci);
                }
                for (x, &j) in vis.iter().enumerate() {
                    let kj = kj(j);
                    // dS_ij = P_ij ((dP_ij - c_i) - (D_i - c_i)), through the softcap.
                    let ds = p[x] * ((dp[x] - ci) - dc) * dt[x];
                    for c in 0..d {
                        g.dq[qi + c] += scale * ds * k[kj + c];
                        g.dk[kj + c] += scale * ds * q_row[c];
                        g.dv[kj + c] += p[x] * do_row[c];
                    }
                }
            }
        }
    }
    g
}

/// The backward of [`naive_attention`] as autograd computes it in dtype `T`: P as the naive
/// forward makes it (scores and P rounded to `T`), dV = P^T dO, dP = dO V^T, dS = P * (dP -
/// rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q, each product accumulated in f32 and
/// rounded to `T`. Its error against [`attention_backward_f64`] calibrates the backward's
/// tolerance, as the naive forward's does the forward's.
pub fn naive_backward<T: Dtype>(q: &[T], k: &[T], v: &[T], d_o: &[T], s: &AttnShape, opts: &Attention) -> RefGrads {
    let d = s.head_dim;
    let scale = opts.scale(d);
    let rt = |x: f32| T::from_f32(x).to_f32();
    let f = |x: &[T]| x.iter().map(|e| e.to_f32()).collect::<Vec<f32>>();
    let (q, k, v, d_o) = (f(q), f(k), f(v), f(d_o));
    let (mut dq, mut dk, mut dv) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()]);
    let mut dsinks = vec![0f32; if opts.sinks.is_some() { s.heads_q } else { 0 }];
    let mut p = vec![0f32; s.seqlen_k];
    let mut dp = vec![0f32; s.seqlen_k];
    let mut dt = vec![1f32; s.seqlen_k];
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            let hk = h / (s.heads_q / s.heads_kv);
            for i in 0..s.seqlen_q {
                let qi = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
                let kj = |j: usize| ((b * s.seqlen_k + j) * s.heads_kv + hk) * d;
                for (j, pj) in p.iter_mut().enumerate() {
                    *pj = if hides(opts, i, j, s) {
                        f32::NEG_INFINITY
                    } else {
                        let x = rt((0..d).fold(0f32, |a, c| a + q[qi + c] * k[kj(j) + c])) * scale;
                        // Capped as in `naive_rows`; autograd's tanh backward: 1 - t^2 in T.
                        let x = match opts.softcap {
                            Some(c) => {
                                let t = rt((x / c).tanh());
                                dt[j] = rt(1.0 - t * t);
                                rt(c * t)
                            }
                            None => x,
                        };
                        // The ALiBi bias, in f32 as in `naive_rows`.
                        if opts.alibi.is_some() { x + opts.alibi_bias((b, h), i, j, s.seqlen_q, s.seqlen_k) as f32 } else { x }
                    };
                }
                // The sink as one more column of the softmax, with dP = 0 (-inf: none).
                let sink = opts.sink(h).map_or(f32::NEG_INFINITY, |x| x as f32);
                let m = p.iter().cloned().fold(sink, f32::max);
                if m == f32::NEG_INFINITY {
                    continue;
                }
                let l: f32 = p.iter().map(|x| (x - m).exp()).sum::<f32>() + (sink - m).exp();
                for pj in p.iter_mut() {
                    *pj = rt((*pj - m).exp() / l);
                }
                let p_sink = rt((sink - m).exp() / l);
                for (j, dpj) in dp.iter_mut().enumerate() {
                    *dpj = rt((0..d).fold(0f32, |a, c| a + d_o[qi + c] * v[kj(j) + c]));
                }
                let dot: f32 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                // The sink's dS = P_sink (0 - D_i), its gradient (f32, as the parameter).
                if let Some(ds) = dsinks.get_mut(h) {
                    *ds -= p_sink * dot;
                }
                for j in 0..s.seqlen_k {
                    let ds = rt(rt(p[j] * (dp[j] - dot)) * dt[j]);
                    for c in 0..d {
                        dq[qi + c] += scale * ds * k[kj(j) + c];
                        dk[kj(j) + c] += scale * ds * q[qi + c];
                        dv[kj(j) + c] += p[j] * d_o[qi + c];
                    }
                }
            }
        }
    }
    let out = |x: Vec<f32>| x.into_iter().map(|e| rt(e) as f64).collect();
    RefGrads { dq: out(dq), dk: out(dk), dv: out(dv), dsinks: dsinks.into_iter().map(|e| e as f64).collect() }
}

/// What FlashAttention's backward cannot share with naive attention, as an absolute error
/// bound per gradient element: it never stores P, so each pass (the forward, the dQ pass, the
/// dK/dV pass) recomputes S_ij = q_i . k_j and dP_ij = dO_i . v_j in f32, and two
/// recomputations differ by a rounding of each, dS_ij = u_f32 sum_c |q_ic k_jc| in the score
/// and ddP_ij = u_f32 sum_c |dO_ic v_jc| in dP (twice that: one rounding in each pass); and
/// it takes P_ij = exp(S_ij - LSE_i) from the f32 LSE the forward returned, u_f32 |LSE_i| in
/// the exponent (as FA2 and FA3 do: the LSE is the one row statistic the forward keeps). P_ij
/// then moves by a relative |scale| dS_ij + u_f32 |LSE_i|, and to first order:
/// - dV_jc by sum_i P_ij |scale| dS_ij |dO_ic|;
/// - D_i by dD_i = sum_j P_ij (|scale| dS_ij |dP_ij| + ddP_ij);
/// - dS_ij by P_ij (|scale| dS_ij |dP_ij - D_i| + ddP_ij + dD_i), hence dQ_ic by |scale|
///   sum_j |k_jc| times that and dK_jc by |scale| sum_i |q_ic| times that.
///
/// It matters where the exact gradient is far below naive attention's rounding, which then
/// cancels exactly: rows saturated to one key at large scales, where P rounds to exactly 1
/// and 0 in naive attention and dS to exactly 0, while two f32 dot products of the same dP
/// may differ in their last bit. Fully masked rows contribute nothing.
pub fn backward_recompute_bound(q: &[f64], k: &[f64], v: &[f64], d_o: &[f64], s: &AttnShape, opts: &Attention) -> RefGrads {
    backward_recompute_bound_t(q, k, v, d_o, s, opts, 0.0)
}

/// [`backward_recompute_bound`], with the sinks' gradient also taking the rounding of P to
/// the inputs' dtype (unit roundoff `unit_t`) in D_i = sum_j P_ij dP_ij: P_sink,i unit_t
/// sum_j P_ij |dP_ij| per row. A backward that takes D_i from the forward's O (`wgmma_atomic`
/// with the residual: O + O_lo is the f32 O of a P V product with P rounded to T) carries it,
/// as naive attention's D from its stored P does; but dsinks has only heads_q elements, too
/// few for naive attention's error on them to stand for the class (twice it was beaten by 1.1
/// to 1.5 times).
pub fn backward_recompute_bound_t(q: &[f64], k: &[f64], v: &[f64], d_o: &[f64], s: &AttnShape, opts: &Attention, unit_t: f64) -> RefGrads {
    let d = s.head_dim;
    let scale = opts.scale(d) as f64;
    let sc = score_scale(scale);
    let u = f32::EPSILON as f64; // two f32 roundings of half an ulp each
    let fwd = attention_f64(q, k, v, s, opts);
    let mut g = RefGrads::zeros(q.len(), k.len(), s, opts);
    for b in 0..s.batch {
        for h in 0..s.heads_q {
            let hk = h / (s.heads_q / s.heads_kv);
            for i in 0..s.seqlen_q {
                let lse = fwd.lse[(b * s.heads_q + h) * s.seqlen_q + i];
                if !lse.is_finite() {
                    continue;
                }
                let qi = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
                let (q_row, do_row) = (&q[qi..qi + d], &d_o[qi..qi + d]);
                let kj = |j: usize| ((b * s.seqlen_k + j) * s.heads_kv + hk) * d;
                let vis: Vec<usize> = (0..s.seqlen_k).filter(|&j| !(hides(opts, i, j, s))).collect();
                let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
                let dot_abs = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum::<f64>();
                // The biased scores (ALiBi; the plain ones without).
                let x: Vec<f64> = vis
                    .iter()
                    .map(|&j| opts.capped(dot(q_row, &k[kj(j)..kj(j) + d]) * sc) + opts.alibi_bias((b, h), i, j, s.seqlen_q, s.seqlen_k))
                    .collect();
                let p: Vec<f64> = x.iter().map(|x| (x - lse).exp()).collect();
                let dp: Vec<f64> = vis.iter().map(|&j| dot(do_row, &v[kj(j)..kj(j) + d])).collect();
                // With a softcap, tanh t of each score and its derivative dt = 1 - t^2: the
                // capped score moves by dt times the score's rounding, and dt by 2 |t| dt / cap
                // times it.
                let (t, dt): (Vec<f64>, Vec<f64>) = vis
                    .iter()
                    .map(|&j| match opts.softcap {
                        Some(c) => {
                            let t = (dot(q_row, &k[kj(j)..kj(j) + d]) * sc / c as f64).tanh();
                            (t, 1.0 - t * t)
                        }
                        None => (0.0, 1.0),
                    })
                    .unzip();
                let raw_s: Vec<f64> = vis.iter().map(|&j| scale.abs() * u * dot_abs(q_row, &k[kj(j)..kj(j) + d])).collect();
                // With ALiBi the biased score, and with a softcap the capped one, is rounded
                // again, to f32 at its own size: one more rounding u |x| of its own in each pass.
                // And each pass recomputes P_ij = exp(x_ij - LSE_i) from the forward's f32 LSE
                // (stored, then scaled by log2 e: u |LSE_i|), where naive attention takes the
                // row's max and sum directly; at large scores (|LSE| ~ 1e4: 1e-3) that is as
                // large as a 16-bit rounding.
                let rounded_x = opts.alibi.is_some() || opts.softcap.is_some();
                let ds_s: Vec<f64> =
                    (0..vis.len()).map(|n| raw_s[n] * dt[n] + if rounded_x { u * x[n].abs() } else { 0.0 } + u * lse.abs()).collect();
                let ddp: Vec<f64> = vis.iter().map(|&j| u * dot_abs(do_row, &v[kj(j)..kj(j) + d])).collect();
                let dd: f64 = p.iter().zip(&dp).map(|(pj, dpj)| pj * dpj).sum();
                let d_err: f64 = (0..vis.len()).map(|x| p[x] * (ds_s[x] * dp[x].abs() + ddp[x])).sum();
                // ds_h = -sum_i P_sink D_i moves by P_sink dD_i.
                if let (Some(ds), Some(x)) = (g.dsinks.get_mut(h), opts.sink(h)) {
                    let d_t: f64 = p.iter().zip(&dp).map(|(pj, dpj)| pj * dpj.abs()).sum();
                    *ds += (x - lse).exp() * (d_err + unit_t * d_t);
                }
                for (x, &j) in vis.iter().enumerate() {
                    let kj = kj(j);
                    let ds_err = p[x] * (ds_s[x] * (dp[x] - dd).abs() + ddp[x] + d_err) * dt[x]
                        + opts.softcap.map_or(0.0, |c| p[x] * (dp[x] - dd).abs() * 2.0 * t[x].abs() * dt[x] * raw_s[x] / c as f64);
                    for c in 0..d {
                        g.dq[qi + c] += scale.abs() * ds_err * k[kj + c].abs();
                        g.dk[kj + c] += scale.abs() * ds_err * q_row[c].abs();
                        g.dv[kj + c] += p[x] * ds_s[x] * do_row[c].abs();
                    }
                }
            }
        }
    }
    g
}
