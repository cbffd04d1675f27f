//! CPU tensors: the kernels on `flashattn`'s emulator, on contiguous copies of candle's
//! elements (the emulator's memory is its own, aligned as a GPU's).

use crate::{Elem, FlashAttnOp, wrap};
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use flashattn::{BwdOptions, FlashAttn, FwdOptions};
use std::sync::OnceLock;

fn emulator() -> &'static FlashAttn {
    static EMULATOR: OnceLock<FlashAttn> = OnceLock::new();
    EMULATOR.get_or_init(FlashAttn::emulator)
}

/// The elements of a rank-4 layout over `s`, in row-major order.
fn gather<T: Elem>(s: &CpuStorage, l: &Layout) -> Result<Vec<T>> {
    let data = s.as_slice::<T>()?;
    if let Some((start, end)) = l.contiguous_offsets() {
        return Ok(data[start..end].to_vec());
    }
    let (d, st) = (l.dims(), l.stride());
    let mut out = Vec::with_capacity(l.shape().elem_count());
    for i0 in 0..d[0] {
        for i1 in 0..d[1] {
            for i2 in 0..d[2] {
                let row = l.start_offset() + i0 * st[0] + i1 * st[1] + i2 * st[2];
                out.extend((0..d[3]).map(|i3| data[row + i3 * st[3]]));
            }
        }
    }
    Ok(out)
}

/// The forward: O in `q`'s shape.
pub(crate) fn forward<T: Elem>(op: &FlashAttnOp, [(q, lq), (k, lk), (v, lv)]: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
    let fa = emulator();
    let attention = &op.attention_on(fa)?;
    let upload = |s: &CpuStorage, l: &Layout| fa.upload(&gather::<T>(s, l)?, l.dims()).map_err(wrap);
    let (q, k, v) = (upload(q, lq)?, upload(k, lk)?, upload(v, lv)?);
    let out = fa.forward(&q, &k, &v, attention, &FwdOptions::default()).map_err(wrap)?;
    Ok((T::to_cpu_storage_owned(fa.download(out.o()).map_err(wrap)?), lq.shape().clone()))
}

/// The backward: dQ, dK, dV. The forward runs again first for its O and LSE (the emulator is
/// deterministic: the O that candle holds).
pub(crate) fn backward<T: Elem>(op: &FlashAttnOp, [q, k, v, d_o]: [&Tensor; 4]) -> Result<[Tensor; 3]> {
    let fa = emulator();
    let attention = &op.attention_on(fa)?;
    let upload = |t: &Tensor| fa.upload(&t.flatten_all()?.to_vec1::<T>()?, t.dims()).map_err(wrap);
    let (qe, ke, ve, doe) = (upload(q)?, upload(k)?, upload(v)?, upload(d_o)?);
    let out = fa.forward(&qe, &ke, &ve, attention, &FwdOptions::default()).map_err(wrap)?;
    let g = fa.backward(&qe, &ke, &ve, &out, &doe, &BwdOptions::default()).map_err(wrap)?;
    let back = |t: &flashattn::Tensor<T>, like: &Tensor| Tensor::from_vec(fa.download(t).map_err(wrap)?, like.dims(), like.device());
    Ok([back(&g.dq, q)?, back(&g.dk, k)?, back(&g.dv, v)?])
}
