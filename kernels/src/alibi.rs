//! ALiBi (Press et al. 2022, FA2's `alibi_slopes`): query head h of batch entry b adds a
//! linear penalty on the distance from the bottom-right diagonal to every score,
//!   S'_ij = S_ij - slope_{b,h} |i + sk - sq - j|,
//! after the scale and the softcap, before the mask (`mask`). The bias is constant in Q and K,
//! so the backward's dS keeps its form: only the recomputed P carries the bias. Unlike FA2's
//! causal shortcut (the column term only), every row gets its exact bias, so the LSE is that
//! of the biased scores in every mode.
//!
//! Only the general entries apply it (`mask::General`, `Mask::BIAS`: [`Alibi`] is constant
//! "off" for the other masks); the host launches an ALiBi attention on a general entry. The
//! slopes are f32 `[heads_q]` or `[batch, heads_q]` (`FwdParams::alibi`, `alibi_batch`); a
//! head whose slope is 0 runs as one without.
//!
//! The kernels that keep raw scores (Q K^T, exponent factor c: `softmax::RowState::update_raw`)
//! take natural units when a bias is on: x = raw u + bias (u: the score scale, or the softcap
//! when capped, the raw scores then being tanh values), c = log2 e, and the LSE's max term
//! the max itself ([`Alibi::units`]).

use crate::dev::global;
use crate::mask::Mask;
use crate::params::Problem;
use crate::softmax::score_scale;
use core::f32::consts::LOG2_E;
use core::marker::PhantomData;

/// The ALiBi bias of one (batch entry, query head) for mask M's entries: off unless M is a
/// general entry's mask (`Mask::BIAS`), the launch has slopes and this head's is not 0.
pub struct Alibi<M> {
    /// The head's slope (0: off).
    slope: f32,
    /// seqlen_k - seqlen_q, as the wrapping difference of the two (`offset`).
    diag: u32,
    _mask: PhantomData<M>,
}

// By hand: derived, they would ask M (a marker type) to be Copy.
impl<M> Clone for Alibi<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Alibi<M> {}

/// How far, in tile widths, [`Alibi::frag_split`] keeps from the diagonal before it splits a
/// bias into column and row parts. Each part is up to slope x (distance + tile width), and its
/// rounding is the bias's own only where the distance dwarfs the width: at 0 a slope of 3.58
/// put a row's LSE 2.9e-5 off (13x the f32 bar); at 1, with a slope of 1e-3, scores 4 ulp off
/// theirs; 2 passes the exhaustive unit test below, and 4 leaves a margin.
pub const SPLIT_FAR: usize = 4;

/// The slope of query head `h` of batch entry `b` from the launch's `slopes` (0: none, 0
/// returned), `batch_stride` elements apart between batch entries (0 for `[heads_q]`).
///
/// # Safety
/// `slopes` is 0 or holds the element `b * batch_stride + h`.
#[inline(always)]
pub unsafe fn slope_of(slopes: u64, batch_stride: u64, b: u32, h: u32) -> f32 {
    match slopes {
        0 => 0.0,
        _ => unsafe { global::load((slopes as *const f32).add((b as u64 * batch_stride + h as u64) as usize)) },
    }
}

impl<M: Mask> Alibi<M> {
    /// The bias of a head of slope `slope` ([`slope_of`]) in the launch (or sequence) `pb`.
    #[inline(always)]
    pub fn new(slope: f32, pb: &Problem) -> Self {
        Alibi { slope: if M::BIAS { slope } else { 0.0 }, diag: pb.seqlen_k.wrapping_sub(pb.seqlen_q), _mask: PhantomData }
    }

    /// The bias of query head `h` of batch entry `b` from the launch's slopes (`slopes`, 0
    /// for none; `batch_stride`: [`slope_of`]), read only in the general entries.
    ///
    /// # Safety
    /// As [`slope_of`].
    #[inline(always)]
    pub unsafe fn load(slopes: u64, batch_stride: u64, b: u32, h: u32, pb: &Problem) -> Self {
        Self::new(if M::BIAS { unsafe { slope_of(slopes, batch_stride, b, h) } } else { 0.0 }, pb)
    }

    /// The same bias through an opaque move (`Window::opaque`'s reason): LLVM can neither
    /// hoist what is computed from it out of a loop nor keep that live across one.
    #[inline(always)]
    pub fn opaque(self) -> Self {
        if !M::BIAS {
            return self;
        }
        let x = crate::dev::thread::opaque(((self.slope.to_bits() as u64) << 32) | self.diag as u64);
        Alibi { slope: f32::from_bits((x >> 32) as u32), diag: x as u32, _mask: PhantomData }
    }

    /// Whether scores are biased (a uniform branch; constant false outside the general entries).
    #[inline(always)]
    pub fn on(self) -> bool {
        M::BIAS && self.slope != 0.0
    }

    /// The slope.
    #[inline(always)]
    pub fn slope(self) -> f32 {
        self.slope
    }

    /// Key `col`'s signed distance from query row `row`'s diagonal, j - (i + sk - sq), as f32:
    /// exact in u32's wrapping arithmetic (the true value lies in (-2^31, 2^31)), rounded once.
    #[inline(always)]
    pub fn offset(self, row: u32, col: u32) -> f32 {
        col.wrapping_sub(row).wrapping_sub(self.diag) as i32 as f32
    }

    /// The bias of (row, col) in natural units, -slope |offset|.
    #[inline(always)]
    pub fn bias(self, row: u32, col: u32) -> f32 {
        self.at(self.offset(row, col), 0.0)
    }

    /// The bias at offset `base + k` (`base` from [`Alibi::offset`] of a fragment's first
    /// column, `k` a column's constant distance from it: one FADD and one FMUL per score),
    /// times `factor` folded into the slope by the caller ([`Alibi::scaled`]).
    #[inline(always)]
    pub fn at(self, base: f32, k: f32) -> f32 {
        -self.slope * (base + k).abs()
    }

    /// The same bias with the slope times `f` (log2 e for a kernel on log2-domain scores).
    #[inline(always)]
    pub fn scaled(self, f: f32) -> Self {
        Alibi { slope: self.slope * f, ..self }
    }

    /// The same bias in the log2 domain (slope times log2 e).
    #[inline(always)]
    pub fn log2(self) -> Self {
        self.scaled(LOG2_E)
    }

    /// Thread: x = x u + bias for this lane's elements of N m16n8 C fragments (the mma.sync
    /// and wgmma accumulator layout: rows `row_w` + g and + 8, columns c0 + 8 n + 2 t and + 1),
    /// in naive attention's order (the scaled score rounded, then the sum).
    #[inline(always)]
    pub fn frag<const N: usize>(self, s: &mut [[f32; 4]; N], u: f32, c0: u32, row_w: u32, (g, t): (usize, usize)) {
        for half in 0..2 {
            let base = self.offset(row_w + (g + 8 * half) as u32, c0 + 2 * t as u32);
            for (n, x) in s.iter_mut().enumerate() {
                for e in 0..2 {
                    let v = &mut x[2 * half + e];
                    *v = *v * u + self.at(base, (8 * n + e) as f32);
                }
            }
        }
    }

    /// Thread: as [`Alibi::frag`], each score x = fma(x, u, bias) (one rounding), except where
    /// the tile's columns c0..c0 + 8 N lie on one side of the diagonal of every row of the
    /// warp's 16, at least [`SPLIT_FAR`] tile widths from it. There the bias
    /// -slope |o| = ss o (ss = slope left of the diagonal, o <= 0; -slope right of it) splits
    /// into a column part, ss (2 t + 8 n + e), shared by the lane's two rows, and a row part,
    /// ss (c0 - row - seqlen_k + seqlen_q), which a softmax row may leave out of its scores
    /// (`RowState::update_raw_shifted`): x = fma(x, u, column part), returned the two rows'
    /// parts (0 on the band near the diagonal). 1.5 FP operations a score off the band, 3 on
    /// it (4 in [`Alibi::frag`]).
    #[inline(always)]
    pub fn frag_split<const N: usize>(self, s: &mut [[f32; 4]; N], u: f32, c0: u32, row_w: u32, (g, t): (usize, usize)) -> [f32; 2] {
        use crate::dev::math::fma;
        // Fresh each tile: no product of it hoisted out of the KV loop (`opaque`).
        let a = self.opaque();
        // The warp's largest and smallest offsets, exact in i32's wrapping arithmetic.
        let hi = (c0 + 8 * N as u32 - 1).wrapping_sub(row_w).wrapping_sub(a.diag) as i32;
        let lo = c0.wrapping_sub(row_w + 15).wrapping_sub(a.diag) as i32;
        let far = (SPLIT_FAR * 8 * N) as i32;
        if hi <= -far || lo >= far {
            let ss = if hi <= 0 { a.slope } else { -a.slope };
            let col_t = ss * (2 * t) as f32;
            for (n, x) in s.iter_mut().enumerate() {
                for e in 0..2 {
                    let b = fma(ss, (8 * n + e) as f32, col_t);
                    x[e] = fma(x[e], u, b);
                    x[2 + e] = fma(x[2 + e], u, b);
                }
            }
            [0, 1].map(|half| ss * a.offset(row_w + (g + 8 * half) as u32, c0))
        } else {
            for half in 0..2 {
                let base = a.offset(row_w + (g + 8 * half) as u32, c0 + 2 * t as u32);
                for (n, x) in s.iter_mut().enumerate() {
                    for e in 0..2 {
                        let v = &mut x[2 * half + e];
                        *v = fma(*v, u, a.at(base, (8 * n + e) as f32));
                    }
                }
            }
            [0.0; 2]
        }
    }

    /// Thread: as [`Alibi::frag`] for S^T (keys as rows: rows `key_w` + g and + 8, queries
    /// as columns c0 + 8 n + 2 t and + 1), the backward's transposed products.
    #[inline(always)]
    pub fn frag_t<const N: usize>(self, s: &mut [[f32; 4]; N], u: f32, c0: u32, key_w: u32, (g, t): (usize, usize)) {
        for half in 0..2 {
            // key - (query + sk - sq): the offset with the roles of row and column swapped,
            // falling by one per query column.
            let base = self.offset(c0 + 2 * t as u32, key_w + (g + 8 * half) as u32);
            for (n, x) in s.iter_mut().enumerate() {
                for e in 0..2 {
                    let v = &mut x[2 * half + e];
                    *v = *v * u + self.at(base, -((8 * n + e) as f32));
                }
            }
        }
    }

    /// For a kernel on raw scores (`softcap::Softcap::raw_factors`' c and lse_scale, the raw
    /// units): with the bias on, (u, log2 e, 1): u the factor taking raw scores to natural
    /// ones (`softmax::score_scale` of lse_scale: a zero scale is the smallest normal one, so
    /// an infinite raw score keeps its sign), c and the LSE's factor for natural units; off,
    /// (1, c, lse_scale) as given.
    #[inline(always)]
    pub fn units(self, c: f32, lse_scale: f32) -> (f32, f32, f32) {
        match self.on() {
            true => (score_scale(lse_scale), LOG2_E, 1.0),
            false => (1.0, c, lse_scale),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mask::{General, NoMask, Windowed};

    fn pb(sq: u32, sk: u32) -> Problem {
        Problem { seqlen_q: sq, seqlen_k: sk, ..Problem::default() }
    }

    /// Offsets and biases against i64 arithmetic, at the ends of the u32 range too.
    #[test]
    fn offsets_are_exact() {
        let big = i32::MAX as u32 - 1024;
        for (sq, sk) in [(5u32, 9u32), (9, 5), (1, big), (big, 1), (big, big)] {
            let a = Alibi::<General>::new(0.25, &pb(sq, sk));
            for (row, col) in [(0u32, 0u32), (sq - 1, 0), (0, sk - 1), (sq - 1, sk - 1), (sq / 2, sk / 3)] {
                let want = col as i64 - (row as i64 + sk as i64 - sq as i64);
                assert_eq!(a.offset(row, col), want as f32, "sq {sq} sk {sk} row {row} col {col}");
                assert_eq!(a.bias(row, col), -0.25 * (want as f32).abs());
            }
        }
    }

    /// `frag` adds to every element of every lane's fragments the bias of its (row, col), x u
    /// first, as `bias` gives it.
    #[test]
    fn frag_adds_each_elements_bias() {
        let pb = pb(40, 70);
        let a = Alibi::<General>::new(0.375, &pb);
        for (c0, row_w) in [(0u32, 0u32), (32, 16), (64, 24)] {
            for lane in 0..32usize {
                let (g, t) = (lane / 4, lane % 4);
                let mut s = [[1.5f32; 4]; 3];
                a.frag::<3>(&mut s, 2.0, c0, row_w, (g, t));
                for (n, x) in s.iter().enumerate() {
                    for (e, &v) in x.iter().enumerate() {
                        let (row, col) = (row_w + (g + 8 * (e / 2)) as u32, c0 + (8 * n + 2 * t + e % 2) as u32);
                        assert_eq!(v, 3.0 + a.bias(row, col), "lane {lane} n {n} e {e}");
                    }
                }
            }
        }
    }

    /// `frag_split` adds the same biases, less the row part it returns, on tiles far left of,
    /// far right of, near and across the diagonal (exact here: small integers times a slope
    /// of few bits).
    #[test]
    fn frag_split_adds_each_elements_bias() {
        let pb = pb(1000, 2000);
        let far = (SPLIT_FAR * 24) as u32;
        for slope in [0.375f32, -0.375] {
            let a = Alibi::<General>::new(slope, &pb);
            // Offsets col - row - 1000 over rows 600..616 and columns c0..c0 + 24.
            let cases =
                [(1600 - far - 24, 600u32, true), (1616 + far, 600, true), (1560, 600, false), (1590, 600, false), (1632, 600, false)];
            for (c0, row_w, sided) in cases {
                for lane in 0..32usize {
                    let (g, t) = (lane / 4, lane % 4);
                    let mut s = [[1.5f32; 4]; 3];
                    let r = a.frag_split::<3>(&mut s, 2.0, c0, row_w, (g, t));
                    assert_eq!(r != [0.0; 2], sided, "c0 {c0} row_w {row_w} lane {lane}");
                    for (n, x) in s.iter().enumerate() {
                        for (e, &v) in x.iter().enumerate() {
                            let (row, col) = (row_w + (g + 8 * (e / 2)) as u32, c0 + (8 * n + 2 * t + e % 2) as u32);
                            assert_eq!(v + r[e / 2], 3.0 + a.bias(row, col), "slope {slope} c0 {c0} lane {lane} n {n} e {e}");
                        }
                    }
                }
            }
        }
    }

    /// Split or not, each score plus its row part is within rounding of the exact
    /// x u - slope |offset|: at most the two roundings of naive attention (the bias's, and
    /// the sum's) plus an eighth of an ulp, at every distance from the diagonal, for slopes
    /// that leave no low bits to spare.
    #[test]
    fn frag_split_keeps_the_bias_rounding() {
        let pb = pb(16, 20_000);
        for slope in [3.581_863_9f32, 0.167_871_01, -0.148_452_64, 7.889_570_7, 1.374_961_6, 1e-3] {
            let a = Alibi::<General>::new(slope, &pb);
            for c0 in (0..20_000u32).step_by(128) {
                for lane in 0..32usize {
                    let (g, t) = (lane / 4, lane % 4);
                    let mut s = [[0.25f32; 4]; 16];
                    let r = a.frag_split::<16>(&mut s, 0.5, c0, 0, (g, t));
                    for (n, x) in s.iter().enumerate() {
                        for (e, &v) in x.iter().enumerate() {
                            let (row, col) = ((g + 8 * (e / 2)) as i64, (c0 as usize + 8 * n + 2 * t + e % 2) as i64);
                            let o = (col - (row + 20_000 - 16)) as f64;
                            let exact = 0.125 - slope as f64 * o.abs();
                            let got = v as f64 + r[e / 2] as f64;
                            let ulp = f64::from(f32::EPSILON) * exact.abs().max(f64::from(f32::MIN_POSITIVE));
                            let naive = 0.5 * ulp + 0.5 * f64::from(f32::EPSILON) * (slope as f64 * o).abs();
                            let err = (got - exact).abs();
                            assert!(
                                err <= 0.625 * ulp + naive,
                                "slope {slope} c0 {c0} lane {lane} n {n} e {e}: {got} vs {exact}, err {err:e} > {:e}",
                                0.625 * ulp + naive
                            );
                        }
                    }
                }
            }
        }
    }

    /// `frag_t` adds to every element of the transposed fragments (keys as rows) the bias of
    /// its (query, key).
    #[test]
    fn frag_t_adds_each_elements_bias() {
        let pb = pb(70, 40);
        let a = Alibi::<General>::new(0.375, &pb);
        for (c0, key_w) in [(0u32, 0u32), (32, 16), (64, 24)] {
            for lane in 0..32usize {
                let (g, t) = (lane / 4, lane % 4);
                let mut s = [[1.5f32; 4]; 3];
                a.frag_t::<3>(&mut s, 2.0, c0, key_w, (g, t));
                for (n, x) in s.iter().enumerate() {
                    for (e, &v) in x.iter().enumerate() {
                        let (key, query) = (key_w + (g + 8 * (e / 2)) as u32, c0 + (8 * n + 2 * t + e % 2) as u32);
                        assert_eq!(v, 3.0 + a.bias(query, key), "lane {lane} n {n} e {e}");
                    }
                }
            }
        }
    }

    /// Off outside the general entries, for a zero slope, and on for a negative one.
    #[test]
    fn on_only_where_applied() {
        assert!(!Alibi::<NoMask>::new(0.5, &pb(4, 4)).on());
        assert!(!Alibi::<Windowed>::new(0.5, &pb(4, 4)).on());
        assert!(!Alibi::<General>::new(0.0, &pb(4, 4)).on());
        assert!(!Alibi::<General>::new(-0.0, &pb(4, 4)).on());
        assert!(Alibi::<General>::new(-0.5, &pb(4, 4)).on());
        assert_eq!(Alibi::<General>::new(-0.5, &pb(4, 4)).bias(0, 3), 1.5);
    }
}
