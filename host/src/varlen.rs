//! Variable-length batches (FA2's varlen layout): the sequences of a batch packed one after
//! another, Q, O, dO, dQ as [total_q, heads_q, head_dim], K, V, dK, dV as [total_k, heads_kv,
//! head_dim], LSE as [heads_q, total_q]; sequence b holds query rows
//! `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` and keys `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`, of
//! which it uses the first `seqused_k[b]` when given (a serving engine's padded slots). Every
//! mask is aligned to each sequence's own lengths (causal: bottom-right, per sequence).

use crate::device::{FlashAttn, Tensor};
use crate::error::{Error, Result};
use crate::forward::{MAX_GRID_YZ, MAX_SEQLEN};
use std::ops::Range;
use std::sync::Arc;

/// The sequences of a variable-length batch, on the device (made by [`FlashAttn::seqlens`]).
/// A cheap handle: the forward's output keeps one for its backward.
#[derive(Clone)]
pub struct SeqLens(Arc<Inner>);

struct Inner {
    cu_q: Tensor<u32>,
    cu_k: Tensor<u32>,
    used_k: Option<Tensor<u32>>,
    batch: usize,
    max_q: usize,
    max_k: usize,
    total_q: usize,
    total_k: usize,
    /// The offsets as checked on the host (`None`: given unchecked, as a device would hold them).
    host: Option<HostSeqLens>,
}

/// A variable-length batch's offsets on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HostSeqLens {
    cu_q: Vec<u32>,
    cu_k: Vec<u32>,
    used_k: Option<Vec<u32>>,
}

impl PartialEq for SeqLens {
    /// The same upload.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for SeqLens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.0;
        f.debug_struct("SeqLens")
            .field("batch", &i.batch)
            .field("total_q", &i.total_q)
            .field("total_k", &i.total_k)
            .field("max_seqlen_q", &i.max_q)
            .field("max_seqlen_k", &i.max_k)
            .field("seqused_k", &i.used_k.is_some())
            .field("checked", &i.host.is_some())
            .finish()
    }
}

impl SeqLens {
    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.0.batch
    }
    /// Rows of the packed Q (and O, dO, dQ).
    pub fn total_q(&self) -> usize {
        self.0.total_q
    }
    /// Rows of the packed K (and V, dK, dV).
    pub fn total_k(&self) -> usize {
        self.0.total_k
    }
    /// The longest query sequence.
    pub fn max_seqlen_q(&self) -> usize {
        self.0.max_q
    }
    /// The longest key sequence (keys used, with `seqused_k`).
    pub fn max_seqlen_k(&self) -> usize {
        self.0.max_k
    }
    /// Whether `seqused_k` was given.
    pub fn has_seqused_k(&self) -> bool {
        self.0.used_k.is_some()
    }
    /// Sequence `b`: its packed query rows, its packed keys (those it uses), as checked on
    /// the host (`None` for offsets given unchecked, or b out of range).
    pub fn seq(&self, b: usize) -> Option<(Range<usize>, Range<usize>)> {
        let h = self.0.host.as_ref()?;
        if b >= self.0.batch {
            return None;
        }
        let (q0, q1, k0, k1) = (h.cu_q[b] as usize, h.cu_q[b + 1] as usize, h.cu_k[b] as usize, h.cu_k[b + 1] as usize);
        let used = h.used_k.as_ref().map_or(k1 - k0, |u| u[b] as usize);
        Some((q0..q1, k0..k0 + used))
    }
    /// Q's shape for `heads` heads of `head_dim`: [total_q, heads, head_dim].
    pub fn q_shape(&self, heads: usize, head_dim: usize) -> [usize; 3] {
        [self.0.total_q, heads, head_dim]
    }
    /// K's shape: [total_k, heads, head_dim].
    pub fn kv_shape(&self, heads: usize, head_dim: usize) -> [usize; 3] {
        [self.0.total_k, heads, head_dim]
    }
    /// LSE's shape: [heads_q, total_q].
    pub fn lse_shape(&self, heads_q: usize) -> [usize; 2] {
        [heads_q, self.0.total_q]
    }
    /// The device offsets: cu_seqlens_q, cu_seqlens_k, seqused_k.
    pub(crate) fn tensors(&self) -> (&Tensor<u32>, &Tensor<u32>, Option<&Tensor<u32>>) {
        (&self.0.cu_q, &self.0.cu_k, self.0.used_k.as_ref())
    }
}

/// Checks offsets `cu` (`what`): at least two, the first 0, non-decreasing, the last at most
/// [`MAX_SEQLEN`]... (each sequence) and the total of rows above 0.
fn check_offsets(what: &'static str, cu: &[u32]) -> Result<()> {
    let bad = |index: usize, why: &str| Error::SeqLens { what, index, value: cu.get(index).map_or(0, |&v| v as u64), why: why.into() };
    if cu.len() < 2 {
        return Err(Error::SeqLens { what, index: cu.len(), value: 0, why: "a batch of b sequences needs b + 1 offsets, b >= 1".into() });
    }
    if cu[0] != 0 {
        return Err(bad(0, "the first offset must be 0 (every packed row belongs to a sequence)"));
    }
    for i in 1..cu.len() {
        if cu[i] < cu[i - 1] {
            return Err(bad(i, &format!("offsets must not decrease (the one before is {})", cu[i - 1])));
        }
        if (cu[i] - cu[i - 1]) as usize > MAX_SEQLEN {
            return Err(bad(i, &format!("a sequence may hold at most {MAX_SEQLEN} rows")));
        }
    }
    if cu[cu.len() - 1] == 0 {
        return Err(bad(cu.len() - 1, "the batch must hold at least one row (the last offset is the packed tensor's rows)"));
    }
    Ok(())
}

impl FlashAttn {
    /// A variable-length batch of `cu_seqlens_q.len() - 1` sequences, checked and copied to
    /// the device: query offsets `cu_seqlens_q` and key offsets `cu_seqlens_k` (each starting
    /// at 0, non-decreasing; the last is the packed tensor's rows), and optionally
    /// `seqused_k` (keys each sequence uses from the start of its slot, at most the slot's
    /// length). Sequences of length 0 are allowed (nothing of them is read or written).
    pub fn seqlens(&self, cu_seqlens_q: &[u32], cu_seqlens_k: &[u32], seqused_k: Option<&[u32]>) -> Result<SeqLens> {
        check_offsets("cu_seqlens_q", cu_seqlens_q)?;
        check_offsets("cu_seqlens_k", cu_seqlens_k)?;
        let batch = cu_seqlens_q.len() - 1;
        if cu_seqlens_k.len() != batch + 1 {
            return Err(Error::ShapeMismatch {
                what: "lengths of cu_seqlens_q and cu_seqlens_k",
                left: batch + 1,
                right: cu_seqlens_k.len(),
            });
        }
        if batch > MAX_GRID_YZ {
            return Err(Error::TooLarge { what: "batch", value: batch, max: MAX_GRID_YZ });
        }
        let slot = |b: usize| (cu_seqlens_k[b + 1] - cu_seqlens_k[b]) as usize;
        if let Some(used) = seqused_k {
            if used.len() != batch {
                return Err(Error::ShapeMismatch { what: "sequences of seqused_k and cu_seqlens_k", left: used.len(), right: batch });
            }
            if let Some(b) = (0..batch).find(|&b| used[b] as usize > slot(b)) {
                let why = format!("it must be at most its slot's {} keys (cu_seqlens_k[{}] - cu_seqlens_k[{b}])", slot(b), b + 1);
                return Err(Error::SeqLens { what: "seqused_k", index: b, value: used[b] as u64, why });
            }
        }
        let max_q = (0..batch).map(|b| (cu_seqlens_q[b + 1] - cu_seqlens_q[b]) as usize).max().unwrap_or(0);
        let max_k = (0..batch).map(|b| seqused_k.map_or(slot(b), |u| u[b] as usize)).max().unwrap_or(0);
        let host = HostSeqLens { cu_q: cu_seqlens_q.to_vec(), cu_k: cu_seqlens_k.to_vec(), used_k: seqused_k.map(<[u32]>::to_vec) };
        let (total_q, total_k) = (cu_seqlens_q[batch] as usize, cu_seqlens_k[batch] as usize);
        self.seqlens_inner(cu_seqlens_q, cu_seqlens_k, seqused_k, [batch, total_q, total_k, max_q, max_k], Some(host))
    }

    /// Offsets taken as a device would hold them: not checked against each other, only
    /// counted (batch + 1 of each, `batch` of `seqused_k`). The kernels clamp each sequence
    /// into the packed tensors of `total_q` and `total_k` rows and the grid of `max_q` and
    /// `max_k` (whatever the offsets say, no access leaves the tensors; rows of no sequence
    /// are not written). For tests of exactly that.
    #[doc(hidden)]
    pub fn seqlens_unchecked(
        &self,
        cu_seqlens_q: &[u32],
        cu_seqlens_k: &[u32],
        seqused_k: Option<&[u32]>,
        [total_q, total_k, max_q, max_k]: [usize; 4],
    ) -> Result<SeqLens> {
        let batch = cu_seqlens_q.len().saturating_sub(1);
        if batch == 0 || cu_seqlens_k.len() != batch + 1 || seqused_k.is_some_and(|u| u.len() != batch) {
            return Err(Error::ShapeMismatch { what: "offsets of q and k", left: cu_seqlens_q.len(), right: cu_seqlens_k.len() });
        }
        for (what, value, max) in [("batch", batch, MAX_GRID_YZ), ("max_seqlen_q", max_q, MAX_SEQLEN), ("max_seqlen_k", max_k, MAX_SEQLEN)]
        {
            if value > max || value == 0 {
                return Err(Error::TooLarge { what, value, max });
            }
        }
        self.seqlens_inner(cu_seqlens_q, cu_seqlens_k, seqused_k, [batch, total_q, total_k, max_q, max_k], None)
    }

    fn seqlens_inner(
        &self,
        cu_q: &[u32],
        cu_k: &[u32],
        used_k: Option<&[u32]>,
        [batch, total_q, total_k, max_q, max_k]: [usize; 5],
        host: Option<HostSeqLens>,
    ) -> Result<SeqLens> {
        let up = |v: &[u32]| self.upload_plain(v, &[v.len()]);
        let used_k = used_k.map(up).transpose()?;
        Ok(SeqLens(Arc::new(Inner { cu_q: up(cu_q)?, cu_k: up(cu_k)?, used_k, batch, max_q, max_k, total_q, total_k, host })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_checked() {
        let fa = FlashAttn::emulator();
        let s = fa.seqlens(&[0, 3, 3, 10], &[0, 5, 6, 6], Some(&[4, 1, 0])).unwrap();
        assert_eq!((s.batch(), s.total_q(), s.total_k(), s.max_seqlen_q(), s.max_seqlen_k()), (3, 10, 6, 7, 4));
        assert_eq!(s.seq(0), Some((0..3, 0..4)));
        assert_eq!(s.seq(2), Some((3..10, 6..6)));
        let err = |q: &[u32], k: &[u32], u: Option<&[u32]>| fa.seqlens(q, k, u).unwrap_err().to_string();
        assert!(err(&[0, 3, 2], &[0, 1, 2], None).contains("cu_seqlens_q[2] is 2"));
        assert!(err(&[1, 3], &[0, 1], None).contains("first offset must be 0"));
        assert!(err(&[0, 3], &[0, 0], None).contains("at least one row"));
        assert!(err(&[0], &[0], None).contains("b + 1 offsets"));
        assert!(err(&[0, 3], &[0, 2, 4], None).contains("lengths of cu_seqlens_q and cu_seqlens_k"));
        assert!(err(&[0, 3, 4], &[0, 2, 4], Some(&[2, 3])).contains("seqused_k[1] is 3"));
        assert!(err(&[0, 3, 4], &[0, 2, 4], Some(&[2])).contains("seqused_k"));
    }
}
