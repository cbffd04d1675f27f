//! The candle op: attention of a packed QKV projection `[batch, seqlen, 3, heads, head_dim]`
//! (Q, K and V narrowed out of it, read in place), a loss, and its gradient through candle's
//! autograd, whose attention step is flashattn's backward. Checked against candle's own
//! attention (matmul and softmax in f32) on the same values.
//!
//! On a CUDA GPU when built with the `cuda` feature (candle's CUDA backend; its nvcc setup is
//! in host/candle/README.md), else on the CPU, where the same kernels run in the emulator:
//!
//!     cargo run --release -p flashattn-examples --example candle_op
//!     cargo run --release -p flashattn-examples --example candle_op --features cuda

use candle_core::{D, DType, Device, Tensor, Var};

/// candle's own attention in f32 (`[b, s, h, d]` in and out), causal.
fn attention_f32(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    let (q, k, v) =
        (q.to_dtype(DType::F32)?.transpose(1, 2)?, k.to_dtype(DType::F32)?.transpose(1, 2)?, v.to_dtype(DType::F32)?.transpose(1, 2)?);
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let s = q.dim(2)?;
    let mask: Vec<f32> = (0..s).flat_map(|i| (0..s).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY })).collect();
    let scores = q.matmul(&k.t()?)?.affine(scale, 0.0)?.broadcast_add(&Tensor::from_vec(mask, (s, s), q.device())?)?;
    let e = scores.broadcast_sub(&scores.max_keepdim(D::Minus1)?.detach())?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v)?.transpose(1, 2)
}

fn rel_err(got: &Tensor, want: &Tensor) -> candle_core::Result<f32> {
    let (got, want) = (got.to_dtype(DType::F32)?, want.to_dtype(DType::F32)?);
    let num = (&got - &want)?.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()?;
    Ok(num / want.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::cuda_if_available(0)?;
    let (b, s, h, d) = if dev.is_cuda() { (2, 1024, 16, 128) } else { (1, 64, 2, 64) };
    println!("{:?}: packed QKV [{b}, {s}, 3, {h}, {d}], bf16, causal", dev.location());

    // The projection's output, as a training step would have it; Q, K, V are views into it.
    let qkv = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, s, 3, h, d), &dev)?.to_dtype(DType::BF16)?)?;
    let part = |i: usize| qkv.narrow(2, i, 1)?.squeeze(2);
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let scale = 1.0 / (d as f32).sqrt();
    let o = flashattn_candle::flash_attn(&q, &k, &v, scale, true)?;

    // A loss and its gradient: candle's autograd calls flashattn's backward for the attention.
    let d_o = Tensor::randn(0f32, 1.0, (b, s, h, d), &dev)?.to_dtype(DType::BF16)?;
    let grads = (&o * &d_o)?.sum_all()?.backward()?;
    let dqkv = grads.get(&qkv).ok_or("no gradient for qkv")?;

    // The same in candle's own f32 attention.
    let o_ref = attention_f32(&q, &k, &v, scale as f64)?;
    let grads_ref = (&o_ref * &d_o.to_dtype(DType::F32)?)?.sum_all()?.backward()?;
    let dqkv_ref = grads_ref.get(&qkv).ok_or("no reference gradient for qkv")?;
    let (e_o, e_g) = (rel_err(&o, &o_ref)?, rel_err(dqkv, dqkv_ref)?);
    println!("  o     relative error against candle's f32 attention {e_o:.2e}");
    println!("  dqkv  relative error against candle's f32 attention {e_g:.2e}");
    // bf16 carries about 3 significant digits (and candle's reference rounds its gradient to
    // bf16 at the leaf too).
    if e_o > 1e-2 || e_g > 2e-2 {
        return Err(format!("relative errors {e_o:.2e} (o), {e_g:.2e} (dqkv) above 1e-2, 2e-2").into());
    }
    println!("OK");
    Ok(())
}
