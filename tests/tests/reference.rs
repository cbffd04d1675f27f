//! Properties of the f64 reference itself (CPU only), so the ground truth is trusted.

use flashattn::reference::{attention_f64, naive_attention, reference, rel_l2};
use flashattn::{Attention, AttnShape, Window};
use flashattn_tests::Rng;
use proptest::prelude::*;

fn shape(batch: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> AttnShape {
    AttnShape { batch, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d }
}

fn inputs(s: &AttnShape, seed: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut r = Rng::new(seed);
    let nq = s.batch * s.seqlen_q * s.heads_q * s.head_dim;
    let nk = s.batch * s.seqlen_k * s.heads_kv * s.head_dim;
    ((0..nq).map(|_| r.normal()).collect(), (0..nk).map(|_| r.normal()).collect(), (0..nk).map(|_| r.normal()).collect())
}

fn small_shape() -> impl Strategy<Value = (AttnShape, bool, u64)> {
    (1..3usize, 1..20usize, 1..20usize, 1..3usize, 1..3usize, 1..41usize, any::<bool>(), any::<u64>())
        .prop_map(|(b, sq, sk, hkv, g, du, causal, seed)| (shape(b, sq, sk, hkv * g, hkv, du), causal, seed))
}

proptest! {
    /// Rows of the attention matrix sum to one: with V = 1 everywhere, every visible row of O is 1.
    #[test]
    fn probabilities_sum_to_one((s, causal, seed) in small_shape()) {
        let (q, k, _) = inputs(&s, seed);
        let v = vec![1.0; k.len()];
        let opts = Attention { causal, ..Default::default() };
        let r = attention_f64(&q, &k, &v, &s, &opts);
        for row in r.o.chunks(s.head_dim) {
            for &x in row {
                prop_assert!(x == 0.0 || (x - 1.0).abs() < 1e-12, "row value {x}");
            }
        }
    }

    /// Each output row is a convex combination of V rows: inside V's per-column range.
    #[test]
    fn output_is_convex_combination((s, causal, seed) in small_shape()) {
        let (q, k, v) = inputs(&s, seed);
        let r = attention_f64(&q, &k, &v, &s, &Attention { causal, ..Default::default() });
        let d = s.head_dim;
        for b in 0..s.batch { for i in 0..s.seqlen_q { for h in 0..s.heads_q {
            let hk = h / (s.heads_q / s.heads_kv);
            let lse = r.lse[(b * s.heads_q + h) * s.seqlen_q + i];
            for c in 0..d {
                let o = r.o[((b * s.seqlen_q + i) * s.heads_q + h) * d + c];
                if lse == f64::NEG_INFINITY { prop_assert_eq!(o, 0.0); continue; }
                let col = (0..s.seqlen_k).map(|j| v[((b * s.seqlen_k + j) * s.heads_kv + hk) * d + c]);
                let (lo, hi) = col.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
                prop_assert!(o >= lo - 1e-12 && o <= hi + 1e-12);
            }
        }}}
    }

    /// Permuting the K/V pairs together leaves O and LSE unchanged (without a mask).
    #[test]
    fn kv_permutation_invariance((s, _causal, seed) in small_shape(), rot in 0usize..100) {
        let (q, k, v) = inputs(&s, seed);
        let opts = Attention::default();
        let a = attention_f64(&q, &k, &v, &s, &opts);
        let row = s.heads_kv * s.head_dim;
        let permute = |x: &[f64]| -> Vec<f64> {
            let mut out = x.to_vec();
            for b in 0..s.batch {
                for j in 0..s.seqlen_k {
                    let dst_j = (j + rot) % s.seqlen_k; // a rotation of the keys: a bijection
                    out[(b * s.seqlen_k + dst_j) * row..][..row].copy_from_slice(&x[(b * s.seqlen_k + j) * row..][..row]);
                }
            }
            out
        };
        let b = attention_f64(&q, &permute(&k), &permute(&v), &s, &opts);
        prop_assert!(rel_l2(&b.o, &a.o) < 1e-12);
        prop_assert!(rel_l2(&b.lse, &a.lse) < 1e-12);
    }

    /// O is linear in V and LSE does not depend on V.
    #[test]
    fn linear_in_v((s, causal, seed) in small_shape(), c in -3.0f64..3.0) {
        let (q, k, v) = inputs(&s, seed);
        let opts = Attention { causal, ..Default::default() };
        let a = attention_f64(&q, &k, &v, &s, &opts);
        let vc: Vec<f64> = v.iter().map(|x| x * c).collect();
        let b = attention_f64(&q, &k, &vc, &s, &opts);
        let ac: Vec<f64> = a.o.iter().map(|x| x * c).collect();
        prop_assert!(rel_l2(&b.o, &ac) < 1e-12 || c == 0.0);
        prop_assert!(rel_l2(&b.lse, &a.lse) == 0.0);
    }
}

/// Causal with seqlen_q == seqlen_k: row 0 sees only key 0, so O row 0 is V row 0 and
/// LSE row 0 is that single score.
#[test]
fn causal_row0_equals_v_row0() {
    let s = shape(1, 9, 9, 2, 1, 16);
    let (q, k, v) = inputs(&s, 3);
    let opts = Attention { causal: true, softmax_scale: Some(0.5), ..Default::default() };
    let r = attention_f64(&q, &k, &v, &s, &opts);
    for h in 0..2 {
        let o = &r.o[h * 16..h * 16 + 16];
        assert_eq!(o, &v[..16]);
        let dot: f64 = (0..16).map(|c| q[h * 16 + c] * k[c]).sum();
        assert!((r.lse[h * 9] - 0.5 * dot).abs() < 1e-12);
    }
}

/// Bottom-right alignment: with seqlen_q > seqlen_k the first sq - sk rows see nothing.
#[test]
fn causal_bottom_right_alignment() {
    let s = shape(1, 7, 3, 1, 1, 8);
    let (q, k, v) = inputs(&s, 4);
    let r = attention_f64(&q, &k, &v, &s, &Attention::causal());
    for i in 0..7 {
        let fully_masked = i < 4;
        assert_eq!(r.lse[i] == f64::NEG_INFINITY, fully_masked, "row {i}");
        if fully_masked {
            assert!(r.o[i * 8..i * 8 + 8].iter().all(|&x| x == 0.0));
        }
    }
    // The last row sees every key: it equals the non-causal last row.
    let nc = attention_f64(&q, &k, &v, &s, &Attention::default());
    assert_eq!(&r.o[6 * 8..], &nc.o[6 * 8..]);
}

/// GQA: each query head uses KV head h / (hq / hkv); equals MHA with K/V heads repeated.
#[test]
fn gqa_equals_repeated_kv_heads() {
    let s = shape(2, 5, 6, 4, 2, 8);
    let (q, k, v) = inputs(&s, 5);
    let rep = |x: &[f64]| -> Vec<f64> {
        let mut out = Vec::new();
        for row in x.chunks(2 * 8) {
            for h in 0..4 {
                out.extend_from_slice(&row[(h / 2) * 8..(h / 2) * 8 + 8]);
            }
        }
        out
    };
    let mha = shape(2, 5, 6, 4, 4, 8);
    let opts = Attention::causal();
    let a = attention_f64(&q, &k, &v, &s, &opts);
    let b = attention_f64(&q, &rep(&k), &rep(&v), &mha, &opts);
    assert_eq!(a.o, b.o);
    assert_eq!(a.lse, b.lse);
}

/// The naive low-precision reference is close to, but not the same as, the exact one, and
/// its error grows as the dtype gets coarser: it calibrates the tolerances.
#[test]
fn naive_error_ordered_by_dtype() {
    let s = shape(1, 64, 64, 2, 2, 64);
    let mut r = Rng::new(11);
    let n = 64 * 2 * 64;
    let q32: Vec<f32> = r.tensor(n);
    let k32: Vec<f32> = r.tensor(n);
    let v32: Vec<f32> = r.tensor(n);
    let conv = |x: &[f32]| -> (Vec<half::f16>, Vec<half::bf16>) {
        (x.iter().map(|&e| half::f16::from_f32(e)).collect(), x.iter().map(|&e| half::bf16::from_f32(e)).collect())
    };
    let opts = Attention::default();
    let err = |o: &[f64], e: &[f64]| rel_l2(o, e);
    let e32 = err(&naive_attention(&q32, &k32, &v32, &s, &opts).o, &reference(&q32, &k32, &v32, &s, &opts).o);
    let ((q16, qb), (k16, kb), (v16, vb)) = (conv(&q32), conv(&k32), conv(&v32));
    let e16 = err(&naive_attention(&q16, &k16, &v16, &s, &opts).o, &reference(&q16, &k16, &v16, &s, &opts).o);
    let eb = err(&naive_attention(&qb, &kb, &vb, &s, &opts).o, &reference(&qb, &kb, &vb, &s, &opts).o);
    assert!(0.0 < e32 && e32 < 1e-6, "f32 {e32}");
    assert!(e32 < e16 && e16 < 5e-3, "f16 {e16}");
    assert!(e16 < eb && eb < 3e-2, "bf16 {eb}");
}

/// A centred finite difference of the reference in f64 matches the analytic softmax
/// Jacobian direction: d O / d V is P, so perturbing V[j] by eps moves O by eps * P[:, j].
#[test]
fn finite_difference_in_v_matches_probabilities() {
    let s = shape(1, 3, 4, 1, 1, 8);
    let (q, k, v) = inputs(&s, 6);
    let opts = Attention::default();
    let base = attention_f64(&q, &k, &v, &s, &opts);
    let eps = 1e-6;
    for j in 0..4 {
        let mut vp = v.clone();
        let mut vm = v.clone();
        vp[j * 8] += eps;
        vm[j * 8] -= eps;
        let (op, om) = (attention_f64(&q, &k, &vp, &s, &opts), attention_f64(&q, &k, &vm, &s, &opts));
        for i in 0..3 {
            let fd = (op.o[i * 8] - om.o[i * 8]) / (2.0 * eps);
            let scale = opts.scale(8) as f64;
            let score = |jj: usize| (0..8).map(|c| q[i * 8 + c] * k[jj * 8 + c]).sum::<f64>() * scale;
            let p = (score(j) - base.lse[i]).exp();
            assert!((fd - p).abs() < 1e-8, "row {i} key {j}: fd {fd} vs P {p}");
        }
    }
}

/// The analytic gradients match centred finite differences of L = sum(O * G) in f64, for
/// Q, K and V, with causal masking (rows that see nothing included), GQA and softcaps (one
/// that saturates the larger scores, one that bends them little).
#[test]
fn backward_matches_finite_differences() {
    use flashattn::reference::attention_backward_f64;
    for (s, causal, softcap) in [
        (shape(1, 5, 4, 4, 2, 8), true, None),
        (shape(2, 3, 6, 2, 1, 16), false, None),
        (shape(1, 6, 6, 3, 3, 8), true, None),
        (shape(2, 3, 6, 2, 1, 16), false, Some(0.8)),
        (shape(1, 6, 6, 3, 3, 8), true, Some(5.0)),
    ] {
        let (q, k, v) = inputs(&s, 21);
        let mut r = Rng::new(22);
        let g: Vec<f64> = (0..q.len()).map(|_| r.normal()).collect();
        let opts = Attention { causal, softmax_scale: Some(0.7), softcap, ..Default::default() };
        let loss =
            |q: &[f64], k: &[f64], v: &[f64]| -> f64 { attention_f64(q, k, v, &s, &opts).o.iter().zip(&g).map(|(o, g)| o * g).sum() };
        let grads = attention_backward_f64(&q, &k, &v, &g, &s, &opts);
        let eps = 1e-6;
        for (which, x, dx) in [(0, &q, &grads.dq), (1, &k, &grads.dk), (2, &v, &grads.dv)] {
            for idx in (0..x.len()).step_by(7) {
                let (mut xp, mut xm) = (x.clone(), x.clone());
                xp[idx] += eps;
                xm[idx] -= eps;
                let (lp, lm) = match which {
                    0 => (loss(&xp, &k, &v), loss(&xm, &k, &v)),
                    1 => (loss(&q, &xp, &v), loss(&q, &xm, &v)),
                    _ => (loss(&q, &k, &xp), loss(&q, &k, &xm)),
                };
                let fd = (lp - lm) / (2.0 * eps);
                assert!((fd - dx[idx]).abs() <= 1e-6 * (1.0 + fd.abs()), "tensor {which} element {idx}: fd {fd} vs analytic {}", dx[idx]);
            }
        }
    }
}

/// The relative error is scale-free: gradients of 1e-164 (a hard-max softmax at |scale|
/// 65536; their squares underflow) and of 1e160 (squares overflow) measure as those of 1 do,
/// and an infinity, a NaN or a mismatched infinity never pass.
#[test]
fn rel_l2_is_scale_free_and_never_passes_nan() {
    let (a, b) = ([1.0, -2.0, 3.5, 0.25], [1.01, -1.98, 3.5, 0.2]);
    let at = |s: f64| rel_l2(&a.map(|x| x * s), &b.map(|x| x * s));
    let one = at(1.0);
    assert!(one > 0.0 && one.is_finite());
    for s in [1e-164, 1e-300, 1e160, 1e300] {
        assert!((at(s) / one - 1.0).abs() < 1e-12, "scale {s}: {} vs {one}", at(s));
    }
    assert_eq!(flashattn::reference::l2(&[3e-170, 4e-170]), 5e-170);
    assert_eq!(rel_l2(&[f64::NAN, 1.0], &[1.0, 1.0]), f64::INFINITY);
    assert_eq!(rel_l2(&[f64::INFINITY, 1.0], &[1e300, 1.0]), f64::INFINITY);
    assert_eq!(rel_l2(&[1.0, 1.0], &[f64::NEG_INFINITY, 1.0]), f64::INFINITY);
    assert_eq!(rel_l2(&[f64::INFINITY, 1.0], &[f64::INFINITY, 1.0]), 0.0);
    assert_eq!(rel_l2(&[1e-300, 0.0], &[0.0, 0.0]), f64::INFINITY);
}

/// The window's rule, written out for one small shape (seqlen_q 4, seqlen_k 6: row i's
/// diagonal is key i + 2): left 2, right 1; with causal masking the right side is 0; and
/// the reference leaves exactly the hidden keys out (a hidden key's V changes nothing).
#[test]
fn sliding_window_visibility() {
    let w = Window::new(Some(2), Some(1));
    let rows = |attn: Attention| -> Vec<String> {
        (0..4).map(|i| (0..6).map(|j| if attn.sees(i, j, 4, 6) { '1' } else { '.' }).collect()).collect()
    };
    let plain = Attention { window: w, ..Default::default() };
    assert_eq!(rows(plain.clone()), ["1111..", ".1111.", "..1111", "...111"]);
    assert_eq!(rows(Attention::causal().with_window(w)), ["111...", ".111..", "..111.", "...111"]);
    assert_eq!(rows(Attention { window: Window::new(None, Some(0)), ..Default::default() }), rows(Attention::causal()));
    let s = AttnShape { batch: 1, seqlen_q: 4, seqlen_k: 6, heads_q: 1, heads_kv: 1, head_dim: 2 };
    let (q, k) = ((0..8).map(|x| x as f64 * 0.1).collect::<Vec<_>>(), (0..12).map(|x| (x as f64 * 0.37).sin()).collect::<Vec<_>>());
    let v: Vec<f64> = (0..12).map(|x| x as f64).collect();
    let base = attention_f64(&q, &k, &v, &s, &plain);
    let mut v2 = v.clone();
    v2[5 * 2] = 1e9; // key 5: hidden from rows 0 and 1 only
    let moved = attention_f64(&q, &k, &v2, &s, &plain);
    assert_eq!(base.o[..4], moved.o[..4]);
    assert_ne!(base.o[4..6], moved.o[4..6]);
}

/// Attention sinks, written out: the sink joins each row's denominator as a key of value 0
/// (row 2 of head 0 by hand), a row that sees no key gets O = 0 and LSE = its sink, a sink
/// of -inf is none; and the reference's sink gradient matches central differences of
/// L = sum dO . O.
#[test]
fn sinks_reference() {
    use flashattn::FlashAttn;
    use flashattn::reference::attention_backward_f64;
    let fa = FlashAttn::emulator();
    // Causal, 3 rows on 2 keys: row 0 sees none, row 1 key 0, row 2 both.
    let s = shape(1, 3, 2, 2, 1, 2);
    let (q, k, v) = inputs(&s, 11);
    let with = |sinks: &[f32]| Attention::causal().with_scale(0.8).with_sinks(fa.sinks(sinks).unwrap());
    let attn = with(&[0.3, -1.2]);
    let out = attention_f64(&q, &k, &v, &s, &attn);
    let lse = |h: usize, i: usize| out.lse[h * 3 + i];
    for h in 0..2 {
        assert_eq!(lse(h, 0), [0.3f32, -1.2][h] as f64, "a row that sees no key has LSE = its sink");
        assert!(out.o[h * 2..h * 2 + 2].iter().all(|&x| x == 0.0));
    }
    // Row 2, head 0, by hand.
    let x = |j: usize| 0.8f32 as f64 * (q[2 * 4] * k[2 * j] + q[2 * 4 + 1] * k[2 * j + 1]);
    let want_lse = (x(0).exp() + x(1).exp() + (0.3f32 as f64).exp()).ln();
    assert!((lse(0, 2) - want_lse).abs() < 1e-14, "{} vs {want_lse}", lse(0, 2));
    for c in 0..2 {
        let want = (x(0) - want_lse).exp() * v[c] + (x(1) - want_lse).exp() * v[2 + c];
        assert!((out.o[2 * 4 + c] - want).abs() < 1e-14);
    }
    // -inf: no sink.
    let none = attention_f64(&q, &k, &v, &s, &with(&[f32::NEG_INFINITY, f32::NEG_INFINITY]));
    let plain = attention_f64(&q, &k, &v, &s, &Attention::causal().with_scale(0.8));
    assert_eq!((none.o, none.lse), (plain.o, plain.lse));
    // dsinks against central differences (in f32 sink steps of 2^-10).
    let d_o: Vec<f64> = (0..q.len()).map(|i| ((i * 7 % 5) as f64 - 2.0) * 0.3).collect();
    let g = attention_backward_f64(&q, &k, &v, &d_o, &s, &attn);
    let loss = |sinks: &[f32]| attention_f64(&q, &k, &v, &s, &with(sinks)).o.iter().zip(&d_o).map(|(a, b)| a * b).sum::<f64>();
    let h = 1.0f32 / 1024.0;
    for (i, base) in [0.3f32, -1.2].into_iter().enumerate() {
        let (mut up, mut dn) = ([0.3f32, -1.2], [0.3f32, -1.2]);
        up[i] = base + h;
        dn[i] = base - h;
        let fd = (loss(&up) - loss(&dn)) / (up[i] as f64 - dn[i] as f64);
        assert!((g.dsinks[i] - fd).abs() <= 1e-4 * fd.abs().max(1e-3), "head {i}: dsink {} vs {fd}", g.dsinks[i]);
    }
}

/// ALiBi in the f64 reference: a row by hand (the bias -slope |i + sk - sq - j|, slopes per
/// batch entry and head, one negative, one 0), 0 slopes equal to no ALiBi, and the backward
/// reference's dQ and dK against central differences of L = sum dO . O.
#[test]
fn alibi_reference() {
    use flashattn::FlashAttn;
    use flashattn::reference::attention_backward_f64;
    let fa = FlashAttn::emulator();
    // 2 batch entries, 3 rows on 5 keys (diagonal offset 2), 2 heads of 2.
    let s = shape(2, 3, 5, 2, 1, 2);
    let (q, k, v) = inputs(&s, 12);
    let slopes = [0.5f32, -0.25, 0.0, 1.5];
    let attn = Attention::default().with_scale(0.7).with_alibi(fa.alibi_slopes(&slopes, &[2, 2]).unwrap());
    let out = attention_f64(&q, &k, &v, &s, &attn);
    for (b, h, i) in [(0, 0, 0), (0, 1, 2), (1, 1, 1)] {
        let slope = slopes[b * 2 + h] as f64;
        let qi = ((b * 3 + i) * 2 + h) * 2;
        let kj = |j: usize| (b * 5 + j) * 2;
        let x = |j: usize| 0.7f32 as f64 * (q[qi] * k[kj(j)] + q[qi + 1] * k[kj(j) + 1]) - slope * (j as f64 - (i + 2) as f64).abs();
        let want_lse = (0..5).map(|j| x(j).exp()).sum::<f64>().ln();
        let lse = out.lse[(b * 2 + h) * 3 + i];
        assert!((lse - want_lse).abs() < 1e-13, "({b}, {h}, {i}): LSE {lse} vs {want_lse}");
        for c in 0..2 {
            let want: f64 = (0..5).map(|j| (x(j) - want_lse).exp() * v[kj(j) + c]).sum();
            assert!((out.o[qi + c] - want).abs() < 1e-13, "({b}, {h}, {i}) column {c}");
        }
    }
    // Zero slopes: no bias.
    let zero = attention_f64(&q, &k, &v, &s, &Attention::default().with_scale(0.7).with_alibi(fa.alibi_slopes(&[0.0; 2], &[2]).unwrap()));
    let plain = attention_f64(&q, &k, &v, &s, &Attention::default().with_scale(0.7));
    assert_eq!((zero.o, zero.lse), (plain.o, plain.lse));
    // dQ and dK of the causal attention against central differences.
    let attn = Attention { causal: true, ..attn };
    let d_o: Vec<f64> = (0..q.len()).map(|i| ((i * 7 % 5) as f64 - 2.0) * 0.3).collect();
    let g = attention_backward_f64(&q, &k, &v, &d_o, &s, &attn);
    let loss = |q: &[f64], k: &[f64]| attention_f64(q, k, &v, &s, &attn).o.iter().zip(&d_o).map(|(a, b)| a * b).sum::<f64>();
    let step = 1e-6;
    for at in [0, 5, 9, 14] {
        let (mut up, mut dn) = (q.clone(), q.clone());
        up[at] += step;
        dn[at] -= step;
        let fd = (loss(&up, &k) - loss(&dn, &k)) / (2.0 * step);
        assert!((g.dq[at] - fd).abs() <= 1e-7 * fd.abs().max(1.0), "dQ[{at}] {} vs {fd}", g.dq[at]);
        let (mut up, mut dn) = (k.clone(), k.clone());
        up[at] += step;
        dn[at] -= step;
        let fd = (loss(&q, &up) - loss(&q, &dn)) / (2.0 * step);
        assert!((g.dk[at] - fd).abs() <= 1e-7 * fd.abs().max(1.0), "dK[{at}] {} vs {fd}", g.dk[at]);
    }
}
