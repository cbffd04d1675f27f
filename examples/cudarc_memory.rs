//! Attention on memory the caller owns, on the caller's stream, with no copies: a packed QKV
//! projection `[batch, seqlen, 3, heads, head_dim]` read in place through strided views, O
//! and LSE written into the caller's buffers, the gradients and the backward's workspace too.
//! Nothing is allocated by flashattn (`device_allocations` stays 0) and nothing waits on the
//! host until the caller downloads.
//!
//! On a CUDA GPU the memory is cudarc's (`CudaSlice` on a stream of the caller's own); without
//! one the same calls run on the CPU emulator over host memory (tensors uploaded there).
//!
//!     cargo run --release -p flashattn-examples --example cudarc_memory

use flashattn::cudarc::driver::CudaContext;
use flashattn::reference::{attention_backward_f64, reference};
use flashattn::{AsView, Attention, BwdBuffers, BwdInputs, BwdOptions, FlashAttn, FwdBuffers, FwdOptions, View, ViewMut};
use flashattn_examples::{random, report};
use half::bf16;

/// Sizes: [batch, seqlen, heads, head_dim].
struct Dims {
    b: usize,
    s: usize,
    h: usize,
    d: usize,
}

impl Dims {
    /// Q, K and V of the packed projection: one buffer, head blocks of 3 h d per position.
    fn packed(&self, which: usize) -> ([usize; 4], [usize; 4], usize) {
        let Dims { s, h, d, .. } = *self;
        ([self.b, s, h, d], [s * 3 * h * d, 3 * h * d, d, 1], which * h * d)
    }
    fn n(&self) -> usize {
        self.b * self.s * self.h * self.d
    }
}

/// The forward and the backward on views; returns nothing: the results are in the caller's
/// buffers.
#[allow(clippy::too_many_arguments)]
fn attend<'a>(
    fa: &FlashAttn,
    dims: &Dims,
    qkv: &'a View<'a, bf16>,
    o: ViewMut<'a, bf16>,
    lse: ViewMut<'a, f32>,
    d_o: &'a View<'a, bf16>,
    grads: [ViewMut<'a, bf16>; 3],
    workspace: ViewMut<'a, f32>,
) -> Result<(), flashattn::Error> {
    let view = |which| {
        let (shape, strides, offset) = dims.packed(which);
        qkv.as_view().strided(&shape, &strides, offset)
    };
    let (q, k, v) = (view(0), view(1), view(2));
    let attention = Attention::causal();
    let mut out = FwdBuffers { o, lse, o_lo: None };
    let fwd = fa.forward_into_views(&q, &k, &v, &attention, &FwdOptions::default(), &mut out)?;
    let opts = BwdOptions::default();
    let needed = fa.backward_workspace_len::<bf16>(&fwd, &opts)?;
    assert!(workspace.shape()[0] >= needed, "workspace sized by backward_workspace_len");
    let FwdBuffers { o, lse, .. } = out;
    let inputs = BwdInputs { q, k, v, o: o.into_view(), lse: lse.into_view(), o_lo: None, d_o: d_o.as_view() };
    let [dq, dk, dv] = grads;
    fa.backward_into_views(&fwd, &inputs, &mut BwdBuffers { dq, dk, dv, workspace }, &opts)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let on_gpu = flashattn::driver_present() && CudaContext::device_count().is_ok_and(|n| n > 0);
    let dims = if on_gpu { Dims { b: 2, s: 1024, h: 16, d: 128 } } else { Dims { b: 1, s: 80, h: 2, d: 64 } };
    let n = dims.n();
    let qkv_h = random::<bf16>(1, 3 * n);
    let d_o_h = random::<bf16>(2, n);
    let lse_len = dims.b * dims.h * dims.s;
    let (o_h, lse_h, dq_h, dk_h, dv_h);
    if on_gpu {
        // The caller's context, stream and memory.
        let ctx = CudaContext::new(0)?;
        let stream = ctx.new_stream()?;
        let fa = FlashAttn::from_stream(stream.clone())?;
        println!("{} on the caller's stream", fa.device_name());
        let qkv = stream.clone_htod(&qkv_h)?;
        let d_o = stream.clone_htod(&d_o_h)?;
        let mut o = stream.alloc_zeros::<bf16>(n)?;
        let mut lse = stream.alloc_zeros::<f32>(lse_len)?;
        let (mut dq, mut dk, mut dv) = (stream.alloc_zeros::<bf16>(n)?, stream.alloc_zeros::<bf16>(n)?, stream.alloc_zeros::<bf16>(n)?);
        let mut ws = stream.alloc_zeros::<f32>(4 * lse_len + 16)?;
        let shape = [dims.b, dims.s, dims.h, dims.d];
        attend(
            &fa,
            &dims,
            &View::cuda(&qkv, &[3 * n]),
            ViewMut::cuda(&mut o, &shape),
            ViewMut::cuda(&mut lse, &[dims.b, dims.h, dims.s]),
            &View::cuda(&d_o, &shape),
            [ViewMut::cuda(&mut dq, &shape), ViewMut::cuda(&mut dk, &shape), ViewMut::cuda(&mut dv, &shape)],
            ViewMut::cuda(&mut ws, &[4 * lse_len + 16]),
        )?;
        println!("flashattn device allocations: {}", fa.device_allocations());
        (o_h, lse_h) = (stream.clone_dtoh(&o)?, stream.clone_dtoh(&lse)?);
        (dq_h, dk_h, dv_h) = (stream.clone_dtoh(&dq)?, stream.clone_dtoh(&dk)?, stream.clone_dtoh(&dv)?);
    } else {
        // The emulator runs on host memory; the buffers come from its uploads.
        let fa = FlashAttn::emulator();
        println!("no GPU: on the CPU emulator");
        let qkv = fa.upload(&qkv_h, &[3 * n])?;
        let d_o = fa.upload(&d_o_h, &[n])?;
        let nan = bf16::NAN;
        let (mut o, mut lse) = (fa.full(nan, &[n])?, fa.full(f32::NAN, &[lse_len])?);
        let (mut dq, mut dk, mut dv) = (fa.full(nan, &[n])?, fa.full(nan, &[n])?, fa.full(nan, &[n])?);
        let mut ws = fa.full(f32::NAN, &[4 * lse_len + 16])?;
        let before = fa.device_allocations();
        let shape = [dims.b, dims.s, dims.h, dims.d];
        attend(
            &fa,
            &dims,
            &qkv.view(),
            o.view_mut().reshaped(&shape, 0),
            lse.view_mut().reshaped(&[dims.b, dims.h, dims.s], 0),
            &d_o.view().reshaped(&shape, 0),
            [dq.view_mut().reshaped(&shape, 0), dk.view_mut().reshaped(&shape, 0), dv.view_mut().reshaped(&shape, 0)],
            ws.view_mut(),
        )?;
        println!("flashattn allocations during the calls: {}", fa.device_allocations() - before);
        (o_h, lse_h) = (fa.download(&o)?, fa.download(&lse)?);
        (dq_h, dk_h, dv_h) = (fa.download(&dq)?, fa.download(&dk)?, fa.download(&dv)?);
    }

    // Against the f64 reference, on contiguous copies of the packed inputs.
    let unpack = |which: usize| -> Vec<bf16> {
        let (_, strides, offset) = dims.packed(which);
        let mut out = Vec::with_capacity(n);
        for b in 0..dims.b {
            for s in 0..dims.s {
                for h in 0..dims.h {
                    let at = offset + b * strides[0] + s * strides[1] + h * strides[2];
                    out.extend_from_slice(&qkv_h[at..at + dims.d]);
                }
            }
        }
        out
    };
    let (q, k, v) = (unpack(0), unpack(1), unpack(2));
    let shape_4 = [dims.b, dims.s, dims.h, dims.d];
    let attention = Attention::causal();
    let shape = flashattn::validate(&shape_4, &shape_4, &shape_4, &attention)?;
    let want = reference(&q, &k, &v, &shape, &attention);
    let w = |x: &[bf16]| x.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    let g = attention_backward_f64(&w(&q), &w(&k), &w(&v), &w(&d_o_h), &shape, &attention);
    report("o", &o_h, &want.o, 1e-2)?;
    report("lse", &lse_h, &want.lse, 1e-3)?;
    report("dq", &dq_h, &g.dq, 2e-2)?;
    report("dk", &dk_h, &g.dk, 2e-2)?;
    report("dv", &dv_h, &g.dv, 2e-2)?;
    println!("OK");
    Ok(())
}
