//! CUDA tensors: the kernels on candle's stream, reading candle's memory in place (its
//! layouts as `flashattn` views) and writing allocations of candle's device.

use crate::{Elem, FlashAttnOp, wrap};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaDevice, DeviceId};
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, Layout, Result, Shape, Storage, Tensor};
use flashattn::cudarc::driver::CudaSlice;
use flashattn::{BwdBuffers, BwdInputs, BwdOptions, FlashAttn, Forward, FwdBuffers, FwdOptions, View, ViewMut};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// What the forward leaves for its backward: its record (which memory it read and wrote)
/// and the row statistics, LSE [batch, heads_q, seqlen_q].
pub(crate) struct Saved {
    fwd: Forward,
    lse: CudaSlice<f32>,
}

/// One `FlashAttn` per candle device, on its stream (each kernel JIT-compiled once, on
/// first use).
fn flashattn_for(dev: &CudaDevice) -> Result<Arc<FlashAttn>> {
    static DEVICES: OnceLock<Mutex<HashMap<DeviceId, Arc<FlashAttn>>>> = OnceLock::new();
    let mut devices = DEVICES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(fa) = devices.get(&dev.id()) {
        return Ok(fa.clone());
    }
    let fa = Arc::new(FlashAttn::from_stream(dev.cuda_stream()).map_err(wrap)?);
    devices.insert(dev.id(), fa.clone());
    Ok(fa)
}

/// A candle tensor's memory as the view its layout describes.
fn view<'a, T>(s: &'a CudaSlice<T>, l: &Layout) -> View<'a, T> {
    View::cuda(s, &[s.len()]).strided(l.dims(), l.stride(), l.start_offset())
}

/// LSE's shape: [batch, heads_q, seqlen_q] of a `[batch, seqlen_q, heads_q, head_dim]` Q.
fn lse_shape(q: &[usize]) -> [usize; 3] {
    [q[0], q[2], q[1]]
}

/// The forward: O in a new allocation of `q`'s shape; the LSE kept in `op` when a backward
/// may follow, else written to the device's scratch LSE ([`SCRATCH_LSE`]).
pub(crate) fn forward<T: Elem>(
    op: &FlashAttnOp,
    [(q, lq), (k, lk), (v, lv)]: [(&CudaStorage, &Layout); 3],
) -> Result<(CudaStorage, Shape)> {
    let dev = q.device().clone();
    let fa = flashattn_for(&dev)?;
    let lse_dims = lse_shape(lq.dims());
    let lse_len = lse_dims.iter().product();
    // SAFETY: the forward writes every element of O and LSE, or fails before its launch
    // (then O is dropped unread; the scratch LSE is only ever written).
    let mut o = unsafe { dev.alloc::<T>(lq.shape().elem_count())? };
    let mut lse = match op.backward {
        true => unsafe { dev.alloc::<f32>(lse_len)? },
        false => take_scratch_lse(&dev, lse_len)?,
    };
    let fwd = {
        let mut out = FwdBuffers { o: ViewMut::cuda(&mut o, lq.dims()), lse: ViewMut::cuda(&mut lse, &lse_dims), o_lo: None };
        let (q, k, v) = (view(q.as_cuda_slice::<T>()?, lq), view(k.as_cuda_slice::<T>()?, lk), view(v.as_cuda_slice::<T>()?, lv));
        fa.forward_into_views(&q, &k, &v, &op.attention_on(&fa)?, &FwdOptions::default(), &mut out).map_err(wrap)?
    };
    match op.backward {
        true => *op.saved.lock().unwrap_or_else(|p| p.into_inner()) = Some(Saved { fwd, lse }),
        false => put_back_scratch_lse(&dev, lse),
    }
    Ok((CudaStorage::wrap_cuda_slice(o, dev), lq.shape().clone()))
}

/// The LSE buffers of forwards that no backward follows, one per device, reused from call
/// to call: [`take_scratch_lse`] takes it out, [`put_back_scratch_lse`] returns it. Reuse is
/// ordered by candle's stream, which every call on the device is queued on, and by cudarc's
/// events on the buffer.
static SCRATCH_LSE: OnceLock<Mutex<HashMap<DeviceId, CudaSlice<f32>>>> = OnceLock::new();

/// The device's scratch LSE for a call that writes `len` elements (a new one when it is out
/// or shorter).
fn take_scratch_lse(dev: &CudaDevice, len: usize) -> Result<CudaSlice<f32>> {
    let taken = SCRATCH_LSE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner()).remove(&dev.id());
    match taken {
        Some(s) if s.len() >= len => Ok(s),
        // SAFETY: a scratch LSE is only ever written (by the forward), never read.
        _ => Ok(unsafe { dev.alloc::<f32>(len)? }),
    }
}

/// Returns a scratch LSE for later calls (the longer one, where two calls overlapped).
fn put_back_scratch_lse(dev: &CudaDevice, lse: CudaSlice<f32>) {
    let mut scratch = SCRATCH_LSE.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if scratch.get(&dev.id()).is_none_or(|s| s.len() < lse.len()) {
        scratch.insert(dev.id(), lse);
    }
}

/// The backward: dQ, dK, dV in new allocations, from the forward's record and LSE (Q, K, V
/// and O are the memory it read and wrote: `flashattn` checks).
pub(crate) fn backward<T: Elem>(op: &FlashAttnOp, [q, k, v, o, d_o]: [&Tensor; 5]) -> Result<[Tensor; 3]> {
    let saved = op.saved.lock().unwrap_or_else(|p| p.into_inner());
    let Some(saved) = saved.as_ref() else {
        candle_core::bail!("flash_attn: backward of a forward that did not run on CUDA");
    };
    let guards = [q, k, v, o, d_o].map(|t| t.storage_and_layout());
    let mut slices = Vec::with_capacity(5);
    for (storage, layout) in &guards {
        let Storage::Cuda(s) = &**storage else {
            candle_core::bail!("flash_attn: backward with a tensor off the forward's CUDA device");
        };
        slices.push((s, *layout));
    }
    let dev = slices[0].0.device().clone();
    let fa = flashattn_for(&dev)?;
    let opts = BwdOptions::default();
    let workspace = fa.backward_workspace_len::<T>(&saved.fwd, &opts).map_err(wrap)?;
    let (nq, nk) = (q.elem_count(), k.elem_count());
    // SAFETY: the backward writes every element of dQ, dK and dV, or fails before its first
    // launch; it initialises the parts of its workspace it reads.
    let (mut dq, mut dk, mut dv, mut ws) =
        unsafe { (dev.alloc::<T>(nq)?, dev.alloc::<T>(nk)?, dev.alloc::<T>(nk)?, dev.alloc::<f32>(workspace)?) };
    {
        let v_of = |i: usize| -> Result<View<'_, T>> { Ok(view(slices[i].0.as_cuda_slice::<T>()?, slices[i].1)) };
        let inputs = BwdInputs {
            q: v_of(0)?,
            k: v_of(1)?,
            v: v_of(2)?,
            o: v_of(3)?,
            lse: View::cuda(&saved.lse, &lse_shape(q.dims())),
            o_lo: None,
            d_o: v_of(4)?,
        };
        let mut out = BwdBuffers {
            dq: ViewMut::cuda(&mut dq, q.dims()),
            dk: ViewMut::cuda(&mut dk, k.dims()),
            dv: ViewMut::cuda(&mut dv, v.dims()),
            workspace: ViewMut::cuda(&mut ws, &[workspace]),
            dsinks: None,
        };
        fa.backward_into_views(&saved.fwd, &inputs, &mut out, &opts).map_err(wrap)?;
    }
    let tensor = |s: CudaSlice<T>, like: &Tensor| {
        Tensor::from_storage(Storage::Cuda(CudaStorage::wrap_cuda_slice(s, dev.clone())), like.shape().clone(), BackpropOp::none(), false)
    };
    Ok([tensor(dq, q), tensor(dk, k), tensor(dv, v)])
}
