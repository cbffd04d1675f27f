//! ALiBi (Press et al. 2022, FA2's `alibi_slopes`): query head h of batch entry b adds
//! -slope_{b,h} |i + seqlen_k - seqlen_q - j| to the score of query row i and key j (after the
//! scale and the softcap, before the mask): a penalty linear in the key's distance from the
//! row's bottom-right diagonal (the kernels' side: `flashattn_kernels::alibi`). The slopes
//! are f32 `[heads_q]` (every batch entry alike) or `[batch, heads_q]`.

use crate::device::{FlashAttn, Tensor};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Largest ALiBi bias accepted, |slope| (seqlen_q + seqlen_k): the biased scores stay far
/// inside the kernels' exact f32 row statistics (`softmax::STAT_LIMIT`, 2^30 in the log2
/// domain) beside any accepted score, and a bias this size is a hard mask already.
pub const MAX_ALIBI_BIAS: f32 = 1e8;

/// ALiBi slopes on the device (made by [`FlashAttn::alibi_slopes`]; set in
/// [`crate::Attention::alibi`]). A cheap handle: the forward's record keeps one, so its
/// backward uses the very slopes the forward did.
#[derive(Clone)]
pub struct AlibiSlopes(Arc<Inner>);

struct Inner {
    values: Tensor<f32>,
    host: Vec<f32>,
    /// Batch entries of a `[batch, heads_q]` tensor (`None`: `[heads_q]`).
    batch: Option<usize>,
    heads: usize,
}

impl PartialEq for AlibiSlopes {
    /// The same upload.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for AlibiSlopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlibiSlopes").field("batch", &self.0.batch).field("heads", &self.0.heads).field("slopes", &self.0.host).finish()
    }
}

impl AlibiSlopes {
    /// Query heads it has a slope for.
    pub fn heads(&self) -> usize {
        self.0.heads
    }
    /// Batch entries of a `[batch, heads_q]` tensor; `None` for `[heads_q]`.
    pub fn batch(&self) -> Option<usize> {
        self.0.batch
    }
    /// The slopes, row-major.
    pub fn values(&self) -> &[f32] {
        &self.0.host
    }
    /// The slope of query head `h` in batch entry `b`.
    pub fn slope(&self, b: usize, h: usize) -> f32 {
        self.0.host[if self.0.batch.is_some() { b * self.0.heads + h } else { h }]
    }
    /// Elements between consecutive batch entries in [`AlibiSlopes::tensor`] (0 for
    /// `[heads_q]`).
    pub fn batch_stride(&self) -> u64 {
        if self.0.batch.is_some() { self.0.heads as u64 } else { 0 }
    }
    /// The device tensor, f32 `[heads_q]` or `[batch, heads_q]`.
    pub fn tensor(&self) -> &Tensor<f32> {
        &self.0.values
    }
    /// Checks the slopes against a problem of `batch` entries, `heads_q` query heads and the
    /// (longest) sequence lengths: their shape, and each bias within [`MAX_ALIBI_BIAS`].
    pub(crate) fn check(&self, batch: usize, heads_q: usize, seqlen_q: usize, seqlen_k: usize) -> Result<()> {
        if self.0.heads != heads_q {
            return Err(Error::ShapeMismatch { what: "heads of alibi_slopes and heads_q of q", left: self.0.heads, right: heads_q });
        }
        if let Some(b) = self.0.batch
            && b != batch
        {
            return Err(Error::ShapeMismatch { what: "batch of alibi_slopes and batch of q", left: b, right: batch });
        }
        let max = MAX_ALIBI_BIAS / (seqlen_q + seqlen_k) as f32;
        match self.0.host.iter().position(|s| s.abs() > max) {
            Some(i) => Err(Error::InvalidAlibiSlope { index: i, slope: self.0.host[i], max }),
            None => Ok(()),
        }
    }
}

/// The slopes of the ALiBi paper for `heads` heads: 2^(-8 i / n) for i = 1..=n when n is a
/// power of two; otherwise those of the largest power of two m below n, then every other
/// slope of 2m for the remaining n - m heads (the reference implementation's rule, which
/// BLOOM, MPT and FA2's tests use).
pub fn alibi_paper_slopes(heads: usize) -> Vec<f32> {
    let pow2 = |n: usize| (1..=n).map(move |i| 2f64.powf(-8.0 * i as f64 / n as f64) as f32);
    if heads == 0 {
        return Vec::new();
    }
    let m = 1usize << heads.ilog2();
    pow2(m).chain(pow2(2 * m).step_by(2).take(heads - m)).collect()
}

impl FlashAttn {
    /// ALiBi slopes from the host, `shape` `[heads_q]` or `[batch, heads_q]` (row-major
    /// `slopes`), each finite (0: no bias for that head; negative: a bonus for distance),
    /// checked and copied to the device. Their size against the sequences is checked at each
    /// call ([`MAX_ALIBI_BIAS`]). [`alibi_paper_slopes`] gives the paper's.
    pub fn alibi_slopes(&self, slopes: &[f32], shape: &[usize]) -> Result<AlibiSlopes> {
        let (batch, heads) = match *shape {
            [h] => (None, h),
            [b, h] => (Some(b), h),
            _ => return Err(Error::Rank { tensor: "alibi_slopes", shape: shape.to_vec(), expected: 1 }),
        };
        if shape.contains(&0) {
            return Err(Error::EmptyDimension { tensor: "alibi_slopes", shape: shape.to_vec() });
        }
        if let Some(i) = slopes.iter().position(|s| !s.is_finite()) {
            return Err(Error::InvalidAlibiSlope { index: i, slope: slopes[i], max: f32::MAX });
        }
        let values = self.upload_plain(slopes, shape)?;
        Ok(AlibiSlopes(Arc::new(Inner { values, host: slopes.to_vec(), batch, heads })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's slopes: 8 heads 1/2 .. 1/256; 12 heads: 8's, then 16's odd ones.
    #[test]
    fn paper_slopes() {
        let s8 = alibi_paper_slopes(8);
        assert_eq!(s8, (1..=8).map(|i| 0.5f32.powi(i)).collect::<Vec<_>>());
        let s12 = alibi_paper_slopes(12);
        assert_eq!(&s12[..8], &s8[..]);
        let s16 = alibi_paper_slopes(16);
        assert_eq!(&s12[8..], &[s16[0], s16[2], s16[4], s16[6]]);
        assert_eq!(alibi_paper_slopes(1), vec![2f32.powi(-8)]);
    }
}
