//! Variable-length batches (FA2's varlen layout): the sequences of a batch packed one after
//! another, Q, O, dO, dQ as [total_q, heads_q, head_dim], K, V, dK, dV as [total_k, heads_kv,
//! head_dim], LSE as [heads_q, total_q]; sequence b holds query rows
//! `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` and keys `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`, of
//! which it uses the first `seqused_k[b]` when given (a serving engine's padded slots). Every
//! mask is aligned to each sequence's own lengths (causal: bottom-right, per sequence).

use crate::device::{FlashAttn, Tensor};
use crate::error::{Error, Result};
use crate::forward::{MAX_GRID_YZ, MAX_SEQLEN};
use cudarc::driver::CudaSlice;
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
    dims: SeqLenDims,
    /// The offsets as checked on the host (`None`: given unchecked, as a device would hold them).
    host: Option<HostSeqLens>,
}

/// The sizes of a variable-length batch whose offsets the host cannot read
/// ([`FlashAttn::seqlens_on_device`]): the packed tensors' rows, and the longest sequences (the
/// grid's size: longer ones are cut there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqLenDims {
    /// Rows of the packed Q (`cu_seqlens_q`'s last offset).
    pub total_q: usize,
    /// Rows of the packed K and V (`cu_seqlens_k`'s last offset).
    pub total_k: usize,
    /// The longest query sequence.
    pub max_seqlen_q: usize,
    /// The longest key sequence (keys used, with `seqused_k`).
    pub max_seqlen_k: usize,
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
            .field("total_q", &i.dims.total_q)
            .field("total_k", &i.dims.total_k)
            .field("max_seqlen_q", &i.dims.max_seqlen_q)
            .field("max_seqlen_k", &i.dims.max_seqlen_k)
            .field("seqused_k", &i.used_k.is_some())
            .field("checked", &i.host.is_some())
            .finish()
    }
}

impl SeqLens {
    /// A batch from offsets and lengths already on the device (the KV cache's: `used_k`
    /// written by its append), unchecked as [`FlashAttn::seqlens_on_device`]'s.
    pub(crate) fn from_device(
        cu_q: Tensor<u32>,
        cu_k: Tensor<u32>,
        used_k: Option<Tensor<u32>>,
        batch: usize,
        dims: SeqLenDims,
    ) -> SeqLens {
        SeqLens(Arc::new(Inner { cu_q, cu_k, used_k, batch, dims, host: None }))
    }
    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.0.batch
    }
    /// Rows of the packed Q (and O, dO, dQ).
    pub fn total_q(&self) -> usize {
        self.0.dims.total_q
    }
    /// Rows of the packed K (and V, dK, dV).
    pub fn total_k(&self) -> usize {
        self.0.dims.total_k
    }
    /// The longest query sequence.
    pub fn max_seqlen_q(&self) -> usize {
        self.0.dims.max_seqlen_q
    }
    /// The longest key sequence (keys used, with `seqused_k`).
    pub fn max_seqlen_k(&self) -> usize {
        self.0.dims.max_seqlen_k
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
    /// The packed keys no sequence uses (each slot's keys past its `seqused_k`), where the
    /// backward writes dK = dV = 0 (the kernels see only the used keys): empty without
    /// `seqused_k`; `None` for offsets the host has not seen ([`FlashAttn::seqlens_on_device`]).
    pub(crate) fn unused_keys(&self) -> Option<Vec<Range<usize>>> {
        let Some(used) = self.0.host.as_ref().map(|h| &h.used_k) else {
            return self.0.used_k.is_none().then(Vec::new);
        };
        let (cu_k, used) = (&self.0.host.as_ref()?.cu_k, used.as_deref().unwrap_or(&[]));
        Some((0..used.len()).map(|b| (cu_k[b] + used[b]) as usize..cu_k[b + 1] as usize).filter(|r| !r.is_empty()).collect())
    }
    /// Q's shape for `heads` heads of `head_dim`: [total_q, heads, head_dim].
    pub fn q_shape(&self, heads: usize, head_dim: usize) -> [usize; 3] {
        [self.0.dims.total_q, heads, head_dim]
    }
    /// K's shape: [total_k, heads, head_dim].
    pub fn kv_shape(&self, heads: usize, head_dim: usize) -> [usize; 3] {
        [self.0.dims.total_k, heads, head_dim]
    }
    /// LSE's shape: [heads_q, total_q].
    pub fn lse_shape(&self, heads_q: usize) -> [usize; 2] {
        [heads_q, self.0.dims.total_q]
    }
    /// The offsets and seqused_k back, when nothing else holds this batch and it has
    /// seqused_k.
    pub(crate) fn into_tensors(self) -> Option<(Tensor<u32>, Tensor<u32>, Tensor<u32>)> {
        let inner = Arc::try_unwrap(self.0).ok()?;
        Some((inner.cu_q, inner.cu_k, inner.used_k?))
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
        let dims = SeqLenDims { total_q, total_k, max_seqlen_q: max_q, max_seqlen_k: max_k };
        self.seqlens_inner(cu_seqlens_q, cu_seqlens_k, seqused_k, batch, dims, Some(host))
    }

    /// A variable-length batch whose offsets are already on the device (a serving engine's,
    /// written by its own kernels): `cu_seqlens_q`, `cu_seqlens_k` (`batch + 1` each) and
    /// optionally `seqused_k` (`batch`), cudarc buffers of this instance's context, used in
    /// the order of its stream (make them on it, or order them before it). The host cannot
    /// read them, so only their counts and `dims` are checked here: the kernels clamp each
    /// sequence into the packed tensors of `dims.total_q` and `dims.total_k` rows and its
    /// lengths to `dims.max_seqlen_q` and `dims.max_seqlen_k`, so that offsets that break
    /// [`FlashAttn::seqlens`]'s rules never take an access outside the tensors (what such a
    /// batch computes is then unspecified; rows of no sequence are not written).
    pub fn seqlens_on_device(
        &self,
        cu_seqlens_q: CudaSlice<u32>,
        cu_seqlens_k: CudaSlice<u32>,
        seqused_k: Option<CudaSlice<u32>>,
        dims: SeqLenDims,
    ) -> Result<SeqLens> {
        let counts = [cu_seqlens_q.len(), cu_seqlens_k.len(), seqused_k.as_ref().map_or(0, |u| u.len())];
        let batch = check_counts(counts, seqused_k.is_some(), &dims)?;
        let wrap = |what, s: CudaSlice<u32>| {
            let n = s.len();
            self.tensor_from_cuda_plain(s, &[n]).map_err(|_| Error::WrongDevice { tensor: what })
        };
        let (cu_q, cu_k) = (wrap("cu_seqlens_q", cu_seqlens_q)?, wrap("cu_seqlens_k", cu_seqlens_k)?);
        let used_k = seqused_k.map(|u| wrap("seqused_k", u)).transpose()?;
        Ok(SeqLens(Arc::new(Inner { cu_q, cu_k, used_k, batch, dims, host: None })))
    }

    /// As [`FlashAttn::seqlens_on_device`], from the host: offsets taken as a device would
    /// hold them, not checked against each other (for tests of exactly that, on the emulator
    /// too).
    #[doc(hidden)]
    pub fn seqlens_unchecked(
        &self,
        cu_seqlens_q: &[u32],
        cu_seqlens_k: &[u32],
        seqused_k: Option<&[u32]>,
        dims: SeqLenDims,
    ) -> Result<SeqLens> {
        let counts = [cu_seqlens_q.len(), cu_seqlens_k.len(), seqused_k.map_or(0, |u| u.len())];
        let batch = check_counts(counts, seqused_k.is_some(), &dims)?;
        self.seqlens_inner(cu_seqlens_q, cu_seqlens_k, seqused_k, batch, dims, None)
    }

    fn seqlens_inner(
        &self,
        cu_q: &[u32],
        cu_k: &[u32],
        used_k: Option<&[u32]>,
        batch: usize,
        dims: SeqLenDims,
        host: Option<HostSeqLens>,
    ) -> Result<SeqLens> {
        let up = |v: &[u32]| self.upload_plain(v, &[v.len()]);
        let used_k = used_k.map(up).transpose()?;
        Ok(SeqLens(Arc::new(Inner { cu_q: up(cu_q)?, cu_k: up(cu_k)?, used_k, batch, dims, host })))
    }
}

/// The counts of offsets given as a device holds them (`batch + 1` of `cu_seqlens_q` and of
/// `cu_seqlens_k`, `batch` of `seqused_k` when given) and their `dims`: the batch.
fn check_counts([nq, nk, nu]: [usize; 3], has_used: bool, dims: &SeqLenDims) -> Result<usize> {
    let batch = nq.saturating_sub(1);
    if nq < 2 {
        return Err(Error::SeqLens {
            what: "cu_seqlens_q",
            index: nq,
            value: 0,
            why: "a batch of b sequences needs b + 1 offsets, b >= 1".into(),
        });
    }
    if nk != nq {
        return Err(Error::ShapeMismatch { what: "lengths of cu_seqlens_q and cu_seqlens_k", left: nq, right: nk });
    }
    if has_used && nu != batch {
        return Err(Error::ShapeMismatch { what: "sequences of seqused_k and cu_seqlens_k", left: nu, right: batch });
    }
    let d = dims;
    for (what, value, max) in [
        ("batch", batch, MAX_GRID_YZ),
        ("max_seqlen_q", d.max_seqlen_q, MAX_SEQLEN),
        ("max_seqlen_k", d.max_seqlen_k, MAX_SEQLEN),
        ("total_q", d.total_q, u32::MAX as usize),
        ("total_k", d.total_k, u32::MAX as usize),
    ] {
        if value > max {
            return Err(Error::TooLarge { what, value, max });
        }
    }
    for (what, value) in
        [("max_seqlen_q", d.max_seqlen_q), ("max_seqlen_k", d.max_seqlen_k), ("total_q", d.total_q), ("total_k", d.total_k)]
    {
        if value == 0 {
            return Err(Error::SeqLens { what, index: 0, value: 0, why: "the batch must hold at least one row and one key".into() });
        }
    }
    Ok(batch)
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
        // Offsets as a device holds them: only their counts and the sizes are checked.
        let dims = SeqLenDims { total_q: 10, total_k: 6, max_seqlen_q: 7, max_seqlen_k: 4 };
        let unchecked = |q: &[u32], k: &[u32], u: Option<&[u32]>, d| fa.seqlens_unchecked(q, k, u, d);
        let s = unchecked(&[9, 0, 99], &[0, 7, 1], Some(&[5, 5]), dims).unwrap();
        assert_eq!((s.batch(), s.total_q(), s.max_seqlen_k(), s.seq(0)), (2, 10, 4, None));
        let uerr = |q: &[u32], k: &[u32], u: Option<&[u32]>, d| unchecked(q, k, u, d).unwrap_err().to_string();
        assert!(uerr(&[0], &[0], None, dims).contains("b + 1 offsets"));
        assert!(uerr(&[0, 1], &[0, 1, 2], None, dims).contains("lengths of cu_seqlens_q and cu_seqlens_k"));
        assert!(uerr(&[0, 1], &[0, 1], Some(&[1, 1]), dims).contains("seqused_k"));
        assert!(uerr(&[0, 1], &[0, 1], None, SeqLenDims { max_seqlen_q: MAX_SEQLEN + 1, ..dims }).contains("max_seqlen_q"));
        assert!(uerr(&[0, 1], &[0, 1], None, SeqLenDims { total_k: 0, ..dims }).contains("total_k"));
    }
}
