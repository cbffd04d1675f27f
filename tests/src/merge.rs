//! The merge of partial results by their LSE (`FlashAttn::merge_partials`) against an f64
//! merge, with the bar from a naive f32 merge (the same formula in f32, rounded to the output
//! dtype): parts with no keys (LSE -inf) whose O holds NaN (never read), rows whose parts all
//! have none, LSE from tiny to large magnitudes, parts laid out contiguously or interleaved
//! (as a split-KV kernel writes them), outputs poisoned before the launch.

use crate::Dt;
use flashattn::reference::{lse_tolerance, rel_l2, tolerance};
use flashattn::rng::Rng;
use flashattn::{Dtype, FlashAttn};
use proptest::prelude::*;

/// One merge check.
#[derive(Clone, Debug)]
pub struct MergeCase {
    pub splits: usize,
    pub batch: usize,
    pub seqlen: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// O's parts stored [batch, seqlen, splits, heads, head_dim] (viewed as [splits, ...]).
    pub interleaved: bool,
    pub dtype: Dt,
    pub seed: u64,
}

/// Random merges: 1..=`max_splits` parts, up to `max_rows` rows, head_dim 1..=`max_d`.
pub fn merge_strategy(max_splits: usize, max_rows: usize, max_d: usize) -> impl Strategy<Value = MergeCase> {
    let dt = prop_oneof![Just(Dt::F32), Just(Dt::F16), Just(Dt::Bf16)];
    (1..=max_splits, 1..=3usize, 1..=max_rows, 1..=3usize, 1..=max_d, any::<bool>(), dt, any::<u64>()).prop_map(
        |(splits, batch, seqlen, heads, head_dim, interleaved, dtype, seed)| MergeCase {
            splits,
            batch,
            seqlen,
            heads,
            head_dim,
            interleaved,
            dtype,
            seed,
        },
    )
}

/// The parts' LSE: mostly moderate, some large (the spread makes some parts weigh nothing),
/// a quarter without keys (-inf), and whole rows without keys.
fn draw_lse(rng: &mut Rng, n_rows: usize, splits: usize) -> Vec<f32> {
    let mut lse = vec![0f32; splits * n_rows];
    for r in 0..n_rows {
        let empty_row = rng.uniform() < 0.1;
        let spread = [1.0, 10.0, 1e4][(rng.uniform() * 3.0) as usize % 3];
        for s in 0..splits {
            let x = if empty_row || rng.uniform() < 0.25 { f32::NEG_INFINITY } else { (rng.normal() * spread) as f32 };
            lse[s * n_rows + r] = x;
        }
    }
    lse
}

/// The f64 merge of one row's parts `(lse_s, o_s)`: (O, LSE).
fn merge_f64(parts: &[(f64, &[f64])], d: usize) -> (Vec<f64>, f64) {
    let m = parts.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY {
        return (vec![0.0; d], m);
    }
    let lse = m + parts.iter().map(|p| (p.0 - m).exp()).sum::<f64>().ln();
    let mut o = vec![0.0; d];
    for (x, os) in parts.iter().filter(|p| p.0 != f64::NEG_INFINITY) {
        let w = (x - lse).exp();
        for c in 0..d {
            o[c] += w * os[c];
        }
    }
    (o, lse)
}

/// The same in f32 (naive: no care for rounding).
fn merge_f32(parts: &[(f32, &[f32])], d: usize) -> (Vec<f32>, f32) {
    let m = parts.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return (vec![0.0; d], m);
    }
    let lse = m + parts.iter().map(|p| (p.0 - m).exp()).sum::<f32>().ln();
    let mut o = vec![0f32; d];
    for (x, os) in parts.iter().filter(|p| p.0 != f32::NEG_INFINITY) {
        let w = (x - lse).exp();
        for c in 0..d {
            o[c] += w * os[c];
        }
    }
    (o, lse)
}

/// Runs `case` and checks O and LSE against the f64 merge.
pub fn check_merge(fa: &FlashAttn, case: &MergeCase) -> Result<(), String> {
    match case.dtype {
        Dt::F32 => check_typed::<f32>(fa, case),
        Dt::F16 => check_typed::<half::f16>(fa, case),
        Dt::Bf16 => check_typed::<half::bf16>(fa, case),
    }
    .map_err(|e| format!("{case:?}: {e}"))
}

fn check_typed<T: Dtype>(fa: &FlashAttn, c: &MergeCase) -> Result<(), String> {
    let (sp, b, s, h, d) = (c.splits, c.batch, c.seqlen, c.heads, c.head_dim);
    let rows = b * s * h;
    let mut rng = Rng::new(c.seed);
    // LSE parts [splits, batch, heads, seqlen]; row index (b, h, r) = (b * h_n + h) * s + r.
    let lse_parts = draw_lse(&mut rng, rows, sp);
    // O parts in logical order [splits, batch, seqlen, heads, d]; NaN where the part has no
    // keys (it must not be read).
    let o_at = |si: usize, bi: usize, r: usize, hi: usize| (((si * b + bi) * s + r) * h + hi) * d;
    let lse_at = |si: usize, bi: usize, hi: usize, r: usize| si * rows + (bi * h + hi) * s + r;
    let mut o_parts = vec![0f32; sp * rows * d];
    for si in 0..sp {
        for bi in 0..b {
            for r in 0..s {
                for hi in 0..h {
                    let empty = lse_parts[lse_at(si, bi, hi, r)] == f32::NEG_INFINITY;
                    for x in &mut o_parts[o_at(si, bi, r, hi)..][..d] {
                        *x = if empty { f32::NAN } else { rng.normal() as f32 };
                    }
                }
            }
        }
    }
    let e = |e: flashattn::Error| format!("{e}");
    let lse_t = fa.upload(&lse_parts, &[sp, b, h, s]).map_err(e)?;
    // O's parts as stored: logical order, or [batch, seqlen, splits, heads, d] viewed as
    // [splits, batch, seqlen, heads, d].
    let (stored, strides) = match c.interleaved {
        false => (o_parts.clone(), vec![rows * d, s * h * d, h * d, d, 1]),
        true => {
            let mut v = vec![0f32; o_parts.len()];
            for si in 0..sp {
                for bi in 0..b {
                    for r in 0..s {
                        for hi in 0..h {
                            let at = (((bi * s + r) * sp + si) * h + hi) * d;
                            v[at..at + d].copy_from_slice(&o_parts[o_at(si, bi, r, hi)..][..d]);
                        }
                    }
                }
            }
            (v, vec![h * d, s * sp * h * d, sp * h * d, d, 1])
        }
    };
    let o_t = fa.upload(&stored, &[stored.len()]).map_err(e)?;
    let o_view = o_t.view().strided(&[sp, b, s, h, d], &strides, 0);
    let mut o = fa.full(T::nan(), &[b, s, h, d]).map_err(e)?;
    let mut lse = fa.full(f32::NAN, &[b, h, s]).map_err(e)?;
    fa.merge_partials_into(&o_view, &lse_t, &mut o.view_mut(), &mut lse.view_mut()).map_err(e)?;
    let got_o: Vec<f64> = fa.download(&o).map_err(e)?.iter().map(|x| x.to_f64()).collect();
    let got_lse: Vec<f64> = fa.download(&lse).map_err(e)?.iter().map(|&x| x as f64).collect();
    // The f64 and the naive f32 merges, row by row.
    let (mut ref_o, mut ref_lse, mut nv_o, mut nv_lse) = (vec![0.0; rows * d], vec![0.0; rows], vec![0.0; rows * d], vec![0.0; rows]);
    for bi in 0..b {
        for r in 0..s {
            for hi in 0..h {
                let o64: Vec<Vec<f64>> =
                    (0..sp).map(|si| o_parts[o_at(si, bi, r, hi)..][..d].iter().map(|&x| x as f64).collect()).collect();
                let p64: Vec<(f64, &[f64])> = (0..sp).map(|si| (lse_parts[lse_at(si, bi, hi, r)] as f64, &o64[si][..])).collect();
                let p32: Vec<(f32, &[f32])> =
                    (0..sp).map(|si| (lse_parts[lse_at(si, bi, hi, r)], &o_parts[o_at(si, bi, r, hi)..][..d])).collect();
                let ((xo, xl), (no, nl)) = (merge_f64(&p64, d), merge_f32(&p32, d));
                let (oa, la) = (((bi * s + r) * h + hi) * d, (bi * h + hi) * s + r);
                ref_o[oa..oa + d].copy_from_slice(&xo);
                ref_lse[la] = xl;
                for cc in 0..d {
                    nv_o[oa + cc] = T::from_f32(no[cc]).to_f64();
                }
                nv_lse[la] = nl as f64;
            }
        }
    }
    let (o_err, o_bar) = (rel_l2(&got_o, &ref_o), tolerance::<T>(rel_l2(&nv_o, &ref_o)));
    let (l_err, l_bar) = (rel_l2(&got_lse, &ref_lse), lse_tolerance(rel_l2(&nv_lse, &ref_lse), &ref_lse));
    if o_err > o_bar || l_err > l_bar || o_err.is_nan() || l_err.is_nan() {
        return Err(format!("O rel err {o_err:.3e} (bar {o_bar:.3e}), LSE rel err {l_err:.3e} (bar {l_bar:.3e})"));
    }
    // One part: its O (rounded to T) and LSE, bit for bit.
    if sp == 1 {
        for (i, (&g, &x)) in got_o.iter().zip(&o_parts).enumerate() {
            let row_empty = lse_parts[(i / d / h / s) * h * s + ((i / d) % h) * s + (i / d / h) % s] == f32::NEG_INFINITY;
            let want = if row_empty { 0.0 } else { T::from_f32(x).to_f64() };
            if g.to_bits() != want.to_bits() {
                return Err(format!("one part: O[{i}] = {g}, not the part's {want}"));
            }
        }
        for (i, (&g, &x)) in got_lse.iter().zip(&lse_parts).enumerate() {
            if g != x as f64 {
                return Err(format!("one part: LSE[{i}] = {g}, not the part's {x}"));
            }
        }
    }
    Ok(())
}

/// A NaN in a part's LSE makes its row's O and LSE NaN; a NaN in the O of a part that weighs
/// in makes that element NaN; nothing else changes.
pub fn check_merge_nan(fa: &FlashAttn) -> Result<(), String> {
    let (sp, s, d) = (3usize, 4usize, 5usize);
    let e = |e: flashattn::Error| format!("{e}");
    let mut lse = vec![0.5f32; sp * s];
    lse[s + 1] = f32::NAN; // part 1, row 1
    let mut o = vec![1.0f32; sp * s * d];
    o[(2 * s + 2) * d + 3] = f32::NAN; // part 2, row 2, column 3
    let (lt, ot) = (fa.upload(&lse, &[sp, 1, 1, s]).map_err(e)?, fa.upload(&o, &[sp, 1, s, 1, d]).map_err(e)?);
    let (go, gl) = fa.merge_partials::<f32>(&ot, &lt).map_err(e)?;
    let (go, gl) = (fa.download(&go).map_err(e)?, fa.download(&gl).map_err(e)?);
    let lse_all = 0.5 + (3f32).ln();
    for r in 0..s {
        let nan_row = r == 1;
        if gl[r].is_nan() != nan_row || (!nan_row && (gl[r] - lse_all).abs() > 1e-6) {
            return Err(format!("LSE[{r}] = {}", gl[r]));
        }
        for c in 0..d {
            let x = go[r * d + c];
            let nan = nan_row || (r == 2 && c == 3);
            if x.is_nan() != nan || (!nan && (x - 1.0).abs() > 1e-6) {
                return Err(format!("O[{r}][{c}] = {x}"));
            }
        }
    }
    Ok(())
}

/// Shapes the merge refuses, with typed errors before any launch.
pub fn check_merge_errors(fa: &FlashAttn) -> Result<(), String> {
    let e = |e: flashattn::Error| format!("{e}");
    let o = fa.upload(&[1f32; 24], &[2, 1, 3, 1, 4]).map_err(e)?;
    let lse = fa.upload(&[0f32; 6], &[2, 1, 1, 3]).map_err(e)?;
    let bad_lse = fa.upload(&[0f32; 3], &[1, 1, 1, 3]).map_err(e)?;
    let flat = fa.upload(&[1f32; 24], &[24]).map_err(e)?;
    let empty = o.view().narrow(0, 0, 0).map_err(e)?;
    for (what, r) in [
        ("lse of another split count", fa.merge_partials::<half::f16>(&o, &bad_lse).err()),
        ("rank-1 parts", fa.merge_partials::<half::f16>(&flat, &lse).err()),
        ("no parts", fa.merge_partials::<half::f16>(&empty, &lse).err()),
    ] {
        match r {
            Some(flashattn::Error::InputShape { .. } | flashattn::Error::Rank { .. } | flashattn::Error::EmptyDimension { .. }) => {}
            other => return Err(format!("{what}: {other:?}, not a shape error")),
        }
    }
    Ok(())
}
