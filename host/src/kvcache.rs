//! Attention against a KV cache (decode, speculative decoding, chunked prefill): new keys and
//! values appended to the cache in place (the kernel: `flashattn_kernels::kvcache`), then
//! the new query rows attend to every key each sequence holds, on the forward's
//! variable-length entries (each sequence's slot is its keys; the keys it holds are its
//! `seqused_k`, written on the device by the append).

use crate::device::{FlashAttn, Launch, Tensor};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::forward::{FwdOutput, MAX_GRID_YZ, Run, check_no_overlap};
use crate::options::{Attention, FwdOptions};
use crate::varlen::{SeqLenDims, SeqLens};
use crate::view::{AsView, Binds, View, ViewMut, check, row_align};
use flashattn_kernels::kvcache::APPEND_THREADS;
use flashattn_kernels::params::AppendParams;
use flashattn_kernels::registry::{Arch, append_variant};

/// A KV cache: K and V [batch, capacity, heads_kv, head_dim] (any strides whose batch stride
/// is a whole number of rows, at least `capacity` of them: one slot per sequence), and the
/// keys each sequence's slot holds, u32 [batch] on the device (read by the kernels only: the
/// host never sees them, so they are clamped there, never trusted).
pub struct KvCache<'a, T> {
    pub k: ViewMut<'a, T>,
    pub v: ViewMut<'a, T>,
    pub lens: View<'a, u32>,
}

/// The shapes of a call, checked.
struct Dims {
    batch: usize,
    seqlen_q: usize,
    capacity: usize,
    heads_kv: usize,
    head_dim: usize,
    /// New keys per sequence.
    new: usize,
    /// Rows from one sequence's slot to the next.
    slot: usize,
}

fn rank4(tensor: &'static str, shape: &[usize]) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(shape).map_err(|_| Error::Rank { tensor, shape: shape.to_vec(), expected: 4 })
}

/// Rows from one batch entry to the next of a [batch, rows, heads, head_dim] view: its batch
/// stride over its row stride, a whole number of at least `rows` (one batch entry needs none).
fn rows_per_entry(tensor: &'static str, shape: &[usize], strides: &[usize], rows: usize, exact: bool) -> Result<usize> {
    if shape[0] <= 1 {
        return Ok(rows);
    }
    let (bs, rs) = (strides[0], strides[1]);
    let whole = rs > 0 && bs % rs == 0 && bs / rs >= rows && (!exact || bs / rs == rows);
    match (whole, rows) {
        (true, _) => Ok(bs / rs),
        // One row per entry: its row stride is never stepped, the batch stride is the row's.
        (false, 1) if bs > 0 => Ok(1),
        _ => Err(Error::Layout {
            tensor,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: match exact {
                true => format!("its batch stride must be its {rows} rows (the sequences packed one after another)"),
                false => format!("its batch stride must be a whole number of rows, at least its {rows}"),
            },
        }),
    }
}

/// A [batch, rows, heads, head_dim] view as the packed [rows_total, heads, head_dim] of a
/// variable-length batch whose entry b starts at row b * `slot`.
fn packed<'v, T>(v: View<'v, T>, slot: usize, rows: usize) -> View<'v, T> {
    let (sh, st, off) = (v.shape().to_vec(), v.strides().to_vec(), v.offset());
    let total = (sh[0] - 1) * slot + rows;
    let row = if sh[0] > 1 && slot == 1 { st[0] } else { st[1] };
    v.strided(&[total, sh[2], sh[3]], &[row, st[2], st[3]], off)
}

impl FlashAttn {
    /// Attention of new query rows against a KV cache, after appending new keys and values to
    /// it in place: Q [batch, seqlen_q, heads_q, head_dim] (its sequences packed one after
    /// another: batch stride seqlen_q rows); `cache` (see [`KvCache`]); with `new_kv`, K_new and
    /// V_new [batch, seqlen_new, heads_kv, head_dim] (seqlen_new <= capacity) are written at
    /// rows `lens[b]..` of sequence b's slot first. Nothing else of the cache is written, and
    /// `lens` is not advanced (the caller's, as FA2's `flash_attn_with_kvcache`).
    ///
    /// Sequence b's rows attend to the first `min(lens[b] + seqlen_new, capacity)` keys of
    /// its slot, every mask aligned to them (causal: bottom-right, row i of seqlen_q sees the
    /// keys up to `held - seqlen_q + i`), as [`FlashAttn::forward_varlen`] with those keys as
    /// `seqused_k`. A sequence whose keys would pass the capacity keeps those that fit (the
    /// rest of its new keys are dropped) and attends to its whole slot.
    ///
    /// O is packed as [batch * seqlen_q, heads_q, head_dim] (the memory of [batch, seqlen_q,
    /// heads_q, head_dim]), LSE as [heads_q, batch * seqlen_q], as the variable-length
    /// forward writes them. Every check runs before the append: a refused call leaves the
    /// cache as it was.
    pub fn forward_kvcache<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        cache: KvCache<'_, T>,
        new_kv: Option<(View<'_, T>, View<'_, T>)>,
        attention: &Attention,
        opts: &FwdOptions,
    ) -> Result<FwdOutput<T>> {
        let sh = q.as_view().shape().to_vec();
        let [batch, seqlen_q, heads_q, head_dim] = rank4("q", &sh)?;
        if batch * seqlen_q * heads_q * head_dim == 0 {
            return Err(Error::EmptyDimension { tensor: "q", shape: sh });
        }
        let o = self.alloc::<T>(&[batch * seqlen_q, heads_q, head_dim])?;
        let mut out = FwdOutput::from_buffers(o, self.alloc::<f32>(&[heads_q, batch * seqlen_q])?, None);
        self.forward_kvcache_into(q, cache, new_kv, attention, opts, &mut out)?;
        Ok(out)
    }

    /// As [`FlashAttn::forward_kvcache`], writing O and LSE into the buffers of `out` (O
    /// [batch * seqlen_q, heads_q, head_dim], LSE [heads_q, batch * seqlen_q]; O's residual is
    /// not saved). A refused call leaves the cache and `out` as they were.
    pub fn forward_kvcache_into<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        cache: KvCache<'_, T>,
        new_kv: Option<(View<'_, T>, View<'_, T>)>,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut FwdOutput<T>,
    ) -> Result<()> {
        let KvCache { k: mut k_cache, v: mut v_cache, lens } = cache;
        let q = q.as_view();
        let dims = self.kvcache_dims(&q, &k_cache, &v_cache, &lens, new_kv.as_ref())?;
        let Dims { batch, seqlen_q, capacity, slot, .. } = dims;
        // The forward's offsets and the keys each sequence holds (seqused_k), written on the
        // device by the append (nothing copied from the host).
        let total_k = (batch - 1) * slot + capacity;
        let seq_dims = SeqLenDims { total_q: batch * seqlen_q, total_k, max_seqlen_q: seqlen_q, max_seqlen_k: capacity };
        let offsets = || -> Result<_> { Ok((self.alloc_u32(batch + 1)?, self.alloc_u32(batch + 1)?, self.alloc_u32(batch)?)) };
        let (cu_q, cu_k, used) = offsets()?;
        let opts = FwdOptions { save_residual: false, ..*opts };
        let qp = packed(q.clone(), seqlen_q, seqlen_q);
        // Every check of the forward, before the append changes the cache (the offsets are
        // not read: nothing is launched).
        let seqs = SeqLens::from_device(cu_q, cu_k, Some(used), batch, seq_dims);
        {
            let (kp, vp) = (packed(k_cache.reader(), slot, capacity), packed(v_cache.reader(), slot, capacity));
            let mut bufs = out.buffers();
            self.forward_views(&qp, &kp, &vp, Some(&seqs), attention, &opts, &mut bufs, &mut Run::CheckOnly)?;
        }
        // The check's record is dropped: the offsets come back (else fresh ones).
        let (mut cu_q, mut cu_k, mut used) = match seqs.into_tensors() {
            Some(t) => t,
            None => offsets()?,
        };
        self.append(&q, &mut k_cache, &mut v_cache, &lens, new_kv.as_ref(), [&mut cu_q, &mut cu_k, &mut used], &dims)?;
        let seqs = SeqLens::from_device(cu_q, cu_k, Some(used), batch, seq_dims);
        let (kp, vp) = (packed(k_cache.into_view(), slot, capacity), packed(v_cache.into_view(), slot, capacity));
        self.forward_varlen_into(&qp, &kp, &vp, &seqs, attention, &opts, out)
    }

    /// The shapes of a KV cache call, checked against each other.
    fn kvcache_dims<T>(
        &self,
        q: &View<'_, T>,
        k: &ViewMut<'_, T>,
        v: &ViewMut<'_, T>,
        lens: &View<'_, u32>,
        new_kv: Option<&(View<'_, T>, View<'_, T>)>,
    ) -> Result<Dims> {
        let [batch, seqlen_q, _, head_dim] = rank4("q", q.shape())?;
        let [kb, capacity, heads_kv, kd] = rank4("k_cache", k.shape())?;
        if k.shape() != v.shape() {
            return Err(Error::KvShapeMismatch { k: k.shape().to_vec(), v: v.shape().to_vec() });
        }
        for (what, left, right) in [("batch of q and k_cache", batch, kb), ("head_dim of q and k_cache", head_dim, kd)] {
            if left != right {
                return Err(Error::ShapeMismatch { what, left, right });
            }
        }
        if lens.shape() != [batch] {
            return Err(Error::InputShape { tensor: "cache_lens", expected: vec![batch], got: lens.shape().to_vec() });
        }
        if batch == 0 || seqlen_q == 0 {
            return Err(Error::EmptyDimension { tensor: "q", shape: q.shape().to_vec() });
        }
        if capacity == 0 {
            return Err(Error::EmptyDimension { tensor: "k_cache", shape: k.shape().to_vec() });
        }
        let new = match new_kv {
            Some((kn, vn)) => {
                let [nb, new, nh, nd] = rank4("k_new", kn.shape())?;
                if kn.shape() != vn.shape() {
                    return Err(Error::KvShapeMismatch { k: kn.shape().to_vec(), v: vn.shape().to_vec() });
                }
                if [nb, nh, nd] != [batch, heads_kv, head_dim] {
                    let expected = vec![batch, new, heads_kv, head_dim];
                    return Err(Error::InputShape { tensor: "k_new", expected, got: kn.shape().to_vec() });
                }
                if new > capacity {
                    return Err(Error::TooLarge {
                        what: "new keys per sequence (k_new's dimension 1, at most the cache's capacity)",
                        value: new,
                        max: capacity,
                    });
                }
                new
            }
            None => 0,
        };
        if batch > MAX_GRID_YZ || heads_kv > MAX_GRID_YZ {
            let (what, value) = if batch > MAX_GRID_YZ { ("batch", batch) } else { ("heads_kv", heads_kv) };
            return Err(Error::TooLarge { what, value, max: MAX_GRID_YZ });
        }
        let slot = rows_per_entry("k_cache", k.shape(), k.strides(), capacity, false)?;
        if rows_per_entry("v_cache", v.shape(), v.strides(), capacity, false)? != slot {
            let why = format!("V's slots must be as K's: {slot} rows apart");
            return Err(Error::Layout { tensor: "v_cache", shape: v.shape().to_vec(), strides: v.strides().to_vec(), why });
        }
        rows_per_entry("q", q.shape(), q.strides(), seqlen_q, true)?;
        // The packed offsets are u32.
        let rows = batch.saturating_sub(1).saturating_mul(slot).saturating_add(capacity);
        if rows > u32::MAX as usize || batch * seqlen_q > u32::MAX as usize {
            return Err(Error::TooLarge { what: "rows of the packed cache", value: rows, max: u32::MAX as usize });
        }
        Ok(Dims { batch, seqlen_q, capacity, heads_kv, head_dim, new, slot })
    }

    /// The append (see [`FlashAttn::forward_kvcache`]): new keys and values into the cache,
    /// the forward's offsets into `cu_q`, `cu_k` and the keys each sequence holds after it
    /// into `used`. Q is bound only to be kept apart from what the append writes.
    #[allow(clippy::too_many_arguments)]
    fn append<T: Dtype>(
        &self,
        q: &View<'_, T>,
        k_cache: &mut ViewMut<'_, T>,
        v_cache: &mut ViewMut<'_, T>,
        lens: &View<'_, u32>,
        new_kv: Option<&(View<'_, T>, View<'_, T>)>,
        [cu_q, cu_k, used]: [&mut Tensor<u32>; 3],
        dims: &Dims,
    ) -> Result<()> {
        let variant = append_variant(T::DTYPE).ok_or(Error::NoVariant {
            family: "kv_append".into(),
            dtype: T::DTYPE.name(),
            head_dim: dims.head_dim,
        })?;
        let align = row_align(dims.head_dim, std::mem::size_of::<T>());
        let cache_shape = [dims.batch, dims.capacity, dims.heads_kv, dims.head_dim];
        let (mut cu_q, mut cu_k, mut used) = (cu_q.view_mut(), cu_k.view_mut(), used.view_mut());
        let outputs =
            [("k_cache", k_cache.key()), ("v_cache", v_cache.key()), ("cu_q", cu_q.key()), ("cu_k", cu_k.key()), ("seqused_k", used.key())];
        let mut binds = Binds::new(&outputs);
        let blens = self.bind_input(&mut binds, "cache_lens", lens, &[dims.batch], 4)?;
        let new_shape = [dims.batch, dims.new, dims.heads_kv, dims.head_dim];
        // Zero new keys: nothing of K_new, V_new is read (an empty view binds nowhere).
        let bnew = match new_kv.filter(|_| dims.new > 0) {
            Some((kn, vn)) => {
                let (bk, bv) = (self.bind(&mut binds, "k_new", kn)?, self.bind(&mut binds, "v_new", vn)?);
                check(&bk, &new_shape, align, false)?;
                check(&bv, &new_shape, align, false)?;
                Some((bk, bv))
            }
            None => None,
        };
        let bk = self.bind_mut(&mut binds, "k_cache", k_cache)?;
        check(&bk, &cache_shape, align, true)?;
        let bv = self.bind_mut(&mut binds, "v_cache", v_cache)?;
        check(&bv, &cache_shape, align, true)?;
        let bused = self.bind_mut(&mut binds, "seqused_k", &mut used)?;
        check(&bused, &[dims.batch], 4, true)?;
        let bcu_q = self.bind_mut(&mut binds, "cu_q", &mut cu_q)?;
        check(&bcu_q, &[dims.batch + 1], 4, true)?;
        let bcu_k = self.bind_mut(&mut binds, "cu_k", &mut cu_k)?;
        check(&bcu_k, &[dims.batch + 1], 4, true)?;
        // Q is read by the forward after the append: the cache's new rows must not be in it.
        let bq = self.bind(&mut binds, "q", q)?;
        let inputs: Vec<_> = [&blens, &bq].into_iter().chain(bnew.iter().flat_map(|(k, v)| [k, v])).collect();
        check_no_overlap(&[&bk, &bv, &bused, &bcu_q, &bcu_k], &inputs)?;
        let params = AppendParams {
            k_new: bnew.as_ref().map_or(0, |b| b.0.addr()),
            v_new: bnew.as_ref().map_or(0, |b| b.1.addr()),
            k_cache: bk.addr(),
            v_cache: bv.addr(),
            lens: blens.addr(),
            used: bused.addr(),
            cu_q: bcu_q.addr(),
            cu_k: bcu_k.addr(),
            k_new_strides: bnew.as_ref().map_or(Default::default(), |b| b.0.strides4()),
            v_new_strides: bnew.as_ref().map_or(Default::default(), |b| b.1.strides4()),
            k_cache_strides: bk.strides4(),
            v_cache_strides: bv.strides4(),
            capacity: dims.capacity as u32,
            new: dims.new as u32,
            head_dim: dims.head_dim as u32,
            batch: dims.batch as u32,
            seqlen_q: dims.seqlen_q as u32,
            slot: dims.slot as u32,
        };
        let launch = Launch {
            name: variant.name,
            arch: Arch::Sm80,
            grid: (dims.new.max(1) as u32, dims.heads_kv as u32, dims.batch as u32),
            threads: APPEND_THREADS,
            smem: 0,
            emulate: variant.emulate,
        };
        let regions: Vec<_> = [&bk, &bv, &bused, &bcu_q, &bcu_k].into_iter().chain(inputs).map(|b| b.region()).collect();
        // SAFETY: every view was checked above against the memory it is in; the kernel reads
        // the lengths and the new rows, and writes `used`, the offsets and rows of the caches
        // below their capacity only.
        unsafe { self.launch("launching the KV cache's append", &[launch], params, &regions) }
    }
}
