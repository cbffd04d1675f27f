//! Attention on memory the caller owns, on the caller's stream, with no copies: a packed QKV
//! projection `[batch, seqlen, 3, heads, head_dim]` read in place as Q, K and V (`unbind`),
//! O and LSE written into the caller's buffers, dQ, dK and dV into one packed dQKV buffer of
//! the same layout (three pieces of one `ViewMut`, one backward call), the workspace too.
//! Nothing is allocated by flashattn (`device_allocations` stays 0) and nothing waits on the
//! host until the caller downloads.
//!
//! On a CUDA GPU the memory is cudarc's (`CudaSlice` on a stream of the caller's own); without
//! one the same calls run on the CPU emulator over host memory (tensors uploaded there).
//!
//!     cargo run --release -p flashattn-examples --example cudarc_memory

use flashattn::cudarc::driver::CudaContext;
use flashattn::reference::{attention_backward_f64, reference};
use flashattn::{Attention, BwdBuffers, BwdInputs, BwdOptions, FlashAttn, FwdBuffers, FwdOptions, View, ViewMut};
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
    /// The packed projection's shape: Q, K and V heads side by side at each position.
    fn packed(&self) -> [usize; 5] {
        [self.b, self.s, 3, self.h, self.d]
    }
    fn n(&self) -> usize {
        self.b * self.s * self.h * self.d
    }
    /// Piece `which` (0: Q, 1: K, 2: V) of a packed host buffer, contiguous.
    fn unpack<T: Copy>(&self, packed: &[T], which: usize) -> Vec<T> {
        let row = self.h * self.d;
        packed.chunks(3 * row).flat_map(|pos| pos[which * row..(which + 1) * row].to_vec()).collect()
    }
}

/// The forward and the backward on views: Q, K, V cut from the packed projection, dQ, dK,
/// dV from the packed gradient buffer. Returns nothing: the results are in the caller's
/// buffers.
fn attend<'a>(
    fa: &FlashAttn,
    qkv: View<'a, bf16>,
    o: ViewMut<'a, bf16>,
    lse: ViewMut<'a, f32>,
    d_o: View<'a, bf16>,
    dqkv: ViewMut<'a, bf16>,
    workspace: ViewMut<'a, f32>,
) -> Result<(), flashattn::Error> {
    let [q, k, v] = qkv.unbind::<3>(2)?;
    let attention = Attention::causal();
    let mut out = FwdBuffers { o, lse, o_lo: None };
    let fwd = fa.forward_into_views(&q, &k, &v, &attention, &FwdOptions::default(), &mut out)?;
    let opts = BwdOptions::default();
    let needed = fa.backward_workspace_len::<bf16>(&fwd, &opts)?;
    assert!(workspace.shape()[0] >= needed, "workspace sized by backward_workspace_len");
    let FwdBuffers { o, lse, .. } = out;
    let inputs = BwdInputs { q, k, v, o: o.into_view(), lse: lse.into_view(), o_lo: None, d_o };
    // Three outputs in one memory: pieces of one ViewMut, checked apart by the call.
    let [dq, dk, dv] = dqkv.unbind::<3>(2)?;
    fa.backward_into_views(&fwd, &inputs, &mut BwdBuffers { dq, dk, dv, workspace, dsinks: None }, &opts)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let on_gpu = flashattn::driver_present() && CudaContext::device_count().is_ok_and(|n| n > 0);
    let dims = if on_gpu { Dims { b: 2, s: 1024, h: 16, d: 128 } } else { Dims { b: 1, s: 80, h: 2, d: 64 } };
    let n = dims.n();
    let qkv_h = random::<bf16>(1, 3 * n);
    let d_o_h = random::<bf16>(2, n);
    let lse_len = dims.b * dims.h * dims.s;
    let (o_h, lse_h, dqkv_h);
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
        let mut dqkv = stream.alloc_zeros::<bf16>(3 * n)?;
        let mut ws = stream.alloc_zeros::<f32>(4 * lse_len + 16)?;
        let shape = [dims.b, dims.s, dims.h, dims.d];
        attend(
            &fa,
            View::cuda(&qkv, &dims.packed()),
            ViewMut::cuda(&mut o, &shape),
            ViewMut::cuda(&mut lse, &[dims.b, dims.h, dims.s]),
            View::cuda(&d_o, &shape),
            ViewMut::cuda(&mut dqkv, &dims.packed()),
            ViewMut::cuda(&mut ws, &[4 * lse_len + 16]),
        )?;
        println!("flashattn device allocations: {}", fa.device_allocations());
        (o_h, lse_h, dqkv_h) = (stream.clone_dtoh(&o)?, stream.clone_dtoh(&lse)?, stream.clone_dtoh(&dqkv)?);
    } else {
        // The emulator runs on host memory; the buffers come from its uploads.
        let fa = FlashAttn::emulator();
        println!("no GPU: on the CPU emulator");
        let qkv = fa.upload(&qkv_h, &dims.packed())?;
        let d_o = fa.upload(&d_o_h, &[n])?;
        let nan = bf16::NAN;
        let (mut o, mut lse) = (fa.full(nan, &[n])?, fa.full(f32::NAN, &[lse_len])?);
        let mut dqkv = fa.full(nan, &dims.packed())?;
        let mut ws = fa.full(f32::NAN, &[4 * lse_len + 16])?;
        let before = fa.device_allocations();
        let shape = [dims.b, dims.s, dims.h, dims.d];
        attend(
            &fa,
            qkv.view(),
            o.view_mut().reshaped(&shape, 0),
            lse.view_mut().reshaped(&[dims.b, dims.h, dims.s], 0),
            d_o.view().reshaped(&shape, 0),
            dqkv.view_mut(),
            ws.view_mut(),
        )?;
        println!("flashattn allocations during the calls: {}", fa.device_allocations() - before);
        (o_h, lse_h, dqkv_h) = (fa.download(&o)?, fa.download(&lse)?, fa.download(&dqkv)?);
    }

    // Against the f64 reference, on contiguous copies of the packed inputs and gradients.
    let (q, k, v) = (dims.unpack(&qkv_h, 0), dims.unpack(&qkv_h, 1), dims.unpack(&qkv_h, 2));
    let (dq_h, dk_h, dv_h) = (dims.unpack(&dqkv_h, 0), dims.unpack(&dqkv_h, 1), dims.unpack(&dqkv_h, 2));
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
