//! The merge of partial attention results by their LSE: split-KV decoding's combine step, and
//! the step cascade and ring attention need (the kernel: `flashattn_kernels::merge`).

use crate::device::{FlashAttn, Launch, Tensor};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::forward::{MAX_GRID_YZ, check_no_overlap};
use crate::view::{AsView, Binds, Bound, ViewMut, check};
use flashattn_kernels::dev::emu::GlobalRegion;
use flashattn_kernels::merge::{MERGE_ROWS, MERGE_THREADS};
use flashattn_kernels::params::{MergeParams, Strides};
use flashattn_kernels::registry::{Arch, merge_variant};

/// Element strides (split, batch, row, head) of a rank-5 [splits, batch, seqlen, heads,
/// head_dim] view, or (split, batch, head, row) of a rank-4 LSE [splits, batch, heads, seqlen]
/// as the kernels' (split stride, `Strides`).
fn part_strides(b: &Bound<'_>, lse: bool) -> (u64, Strides) {
    let s: Vec<u64> = b.layout.strides.iter().map(|&x| x as u64).collect();
    match lse {
        true => (s[0], Strides { batch: s[1], row: s[3], head: s[2] }),
        false => (s[0], Strides { batch: s[1], row: s[2], head: s[3] }),
    }
}

impl FlashAttn {
    /// Merges `splits` partial results of the same rows, each over a part of the keys, into
    /// the result over all of them: O_parts f32 [splits, batch, seqlen, heads, head_dim] (each
    /// part's output, normalised over its own keys) and LSE_parts f32 [splits, batch, heads,
    /// seqlen] give O [batch, seqlen, heads, head_dim] (rounded to `T`) and LSE f32 [batch,
    /// heads, seqlen]:
    ///
    /// LSE = log sum_s exp(LSE_s), O = sum_s exp(LSE_s - LSE) O_s.
    ///
    /// A part with LSE_s = -inf (no keys) weighs 0, whatever its O_s holds; a row whose parts
    /// all have none gets O = 0, LSE = -inf; a NaN in a part's LSE, or in the O of a part
    /// that weighs in, makes the row NaN. Exact to f32 rounding (one split gives O_0 and
    /// LSE_0 back).
    pub fn merge_partials<T: Dtype>(&self, o_parts: &impl AsView<f32>, lse_parts: &impl AsView<f32>) -> Result<(Tensor<T>, Tensor<f32>)> {
        let sh = o_parts.as_view().shape().to_vec();
        if sh.len() != 5 {
            return Err(Error::Rank { tensor: "o_parts", shape: sh, expected: 5 });
        }
        let mut o = self.alloc::<T>(&[sh[1], sh[2], sh[3], sh[4]])?;
        let mut lse = self.alloc::<f32>(&[sh[1], sh[3], sh[2]])?;
        self.merge_partials_into(o_parts, lse_parts, &mut o.view_mut(), &mut lse.view_mut())?;
        Ok((o, lse))
    }

    /// As [`FlashAttn::merge_partials`], into the caller's O and LSE (any strides, head_dim
    /// contiguous). Allocates nothing.
    pub fn merge_partials_into<T: Dtype>(
        &self,
        o_parts: &impl AsView<f32>,
        lse_parts: &impl AsView<f32>,
        o: &mut ViewMut<'_, T>,
        lse: &mut ViewMut<'_, f32>,
    ) -> Result<()> {
        let (op, lp) = (o_parts.as_view(), lse_parts.as_view());
        let sh = op.shape().to_vec();
        if sh.len() != 5 {
            return Err(Error::Rank { tensor: "o_parts", shape: sh, expected: 5 });
        }
        let [splits, batch, seqlen, heads, head_dim] = [sh[0], sh[1], sh[2], sh[3], sh[4]];
        if splits == 0 || head_dim == 0 {
            // No part to merge from, or rows of nothing.
            return Err(Error::EmptyDimension { tensor: "o_parts", shape: sh });
        }
        for (what, value, max) in [
            ("splits", splits, u32::MAX as usize),
            ("batch", batch, MAX_GRID_YZ),
            ("heads", heads, MAX_GRID_YZ),
            ("seqlen", seqlen, i32::MAX as usize),
        ] {
            if value > max {
                return Err(Error::TooLarge { what, value, max });
            }
        }
        if head_dim > u32::MAX as usize {
            return Err(Error::TooLarge { what: "head_dim", value: head_dim, max: u32::MAX as usize });
        }
        let mut binds = Binds::new(&[("o", o.key()), ("lse", lse.key())]);
        let (bop, blp) = (self.bind(&mut binds, "o_parts", &op)?, self.bind(&mut binds, "lse_parts", &lp)?);
        check(&bop, &sh, 4, false)?;
        check(&blp, &[splits, batch, heads, seqlen], 4, false)?;
        let bo = self.bind_mut(&mut binds, "o", o)?;
        check(&bo, &[batch, seqlen, heads, head_dim], std::mem::size_of::<T>(), true)?;
        let bl = self.bind_mut(&mut binds, "lse", lse)?;
        check(&bl, &[batch, heads, seqlen], 4, true)?;
        check_no_overlap(&[&bo, &bl], &[&bop, &blp])?;
        if batch * seqlen * heads == 0 {
            // No rows: nothing to write.
            return Ok(());
        }
        let ((o_parts_split, o_parts_strides), (lse_parts_split, lse_parts_strides)) =
            (part_strides(&bop, false), part_strides(&blp, true));
        let ls = &bl.layout.strides;
        let params = MergeParams {
            o_parts: bop.addr(),
            lse_parts: blp.addr(),
            lse_parts_lo: 0,
            o: bo.addr(),
            lse: bl.addr(),
            o_parts_split,
            lse_parts_split,
            o_parts_strides,
            lse_parts_strides,
            o_strides: bo.strides4(),
            lse_strides: Strides { batch: ls[0] as u64, row: ls[2] as u64, head: ls[1] as u64 },
            splits: splits as u32,
            batch: batch as u32,
            seqlen: seqlen as u32,
            heads: heads as u32,
            head_dim: head_dim as u32,
        };
        let regions: Vec<_> = [&bop, &blp, &bo, &bl].iter().map(|b| b.region()).collect();
        // SAFETY: every view was checked above against the memory it is in.
        unsafe { self.queue_merge::<T>(params, &regions) }
    }

    /// Queues the merge kernel on `params` (no launch for no rows).
    ///
    /// # Safety
    /// Every part, O and LSE inside the memory of `regions` (bound for the call): the kernel
    /// reads the parts and writes O and LSE within their shapes.
    pub(crate) unsafe fn queue_merge<T: Dtype>(&self, params: MergeParams, regions: &[GlobalRegion]) -> Result<()> {
        let variant = merge_variant(T::DTYPE).ok_or(Error::NoVariant {
            family: "merge".into(),
            dtype: T::DTYPE.name(),
            head_dim: params.head_dim as usize,
        })?;
        if params.batch as u64 * params.seqlen as u64 * params.heads as u64 == 0 {
            return Ok(());
        }
        let launch = Launch {
            name: variant.name,
            arch: Arch::Sm80,
            grid: (params.seqlen.div_ceil(MERGE_ROWS), params.heads, params.batch),
            threads: MERGE_THREADS,
            smem: 0,
            emulate: variant.emulate,
        };
        unsafe { self.launch("launching the merge kernel", &[launch], params, regions) }
    }
}
