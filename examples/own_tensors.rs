//! Forward and backward on tensors this crate owns: upload Q, K, V, attend, take the
//! gradients, download, and check against the f64 reference. Runs on a CUDA GPU when there
//! is one, else on the CPU emulator (the same kernels, slowly: a small problem there).
//!
//!     cargo run --release -p flashattn-examples --example own_tensors

use flashattn::reference::{attention_backward_f64, reference};
use flashattn::{Attention, BwdOptions, FlashAttn, FwdOptions};
use flashattn_examples::{random, report};
use half::bf16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (fa, why) = FlashAttn::cuda_or_emulator();
    if let Some(why) = why {
        println!("no GPU ({why}): on the CPU emulator");
    }
    // [batch, seqlen, heads, head_dim]; grouped-query attention: 4 query heads per KV head.
    let (b, s, hq, hkv, d) = if fa.is_emulator() { (1, 96, 4, 1, 64) } else { (2, 1024, 16, 4, 128) };
    println!("{}: batch {b}, seqlen {s}, heads {hq} on {hkv}, head_dim {d}, bf16, causal", fa.device_name());
    let (q_shape, kv_shape) = ([b, s, hq, d], [b, s, hkv, d]);
    let (q_h, k_h, v_h) = (random::<bf16>(1, b * s * hq * d), random::<bf16>(2, b * s * hkv * d), random::<bf16>(3, b * s * hkv * d));
    let q = fa.upload(&q_h, &q_shape)?;
    let k = fa.upload(&k_h, &kv_shape)?;
    let v = fa.upload(&v_h, &kv_shape)?;

    // Forward: O [b, s, hq, d] and LSE [b, hq, s]; the output remembers the attention.
    let attention = Attention::causal();
    let out = fa.forward(&q, &k, &v, &attention, &FwdOptions::default())?;
    // Backward: takes the forward's output (its attention, O and LSE) and dO.
    let d_o_h = random::<bf16>(4, b * s * hq * d);
    let d_o = fa.upload(&d_o_h, &q_shape)?;
    let grads = fa.backward(&q, &k, &v, &out, &d_o, &BwdOptions::default())?;

    // Against the f64 reference; bf16 carries about 3 significant digits.
    let shape = flashattn::validate(&q_shape, &kv_shape, &kv_shape, &attention)?;
    let want = reference(&q_h, &k_h, &v_h, &shape, &attention);
    let w = |x: &[bf16]| x.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    let want_grads = attention_backward_f64(&w(&q_h), &w(&k_h), &w(&v_h), &w(&d_o_h), &shape, &attention);
    report("o", &fa.download(out.o())?, &want.o, 1e-2)?;
    report("lse", &fa.download(out.lse())?, &want.lse, 1e-3)?;
    report("dq", &fa.download(&grads.dq)?, &want_grads.dq, 2e-2)?;
    report("dk", &fa.download(&grads.dk)?, &want_grads.dk, 2e-2)?;
    report("dv", &fa.download(&grads.dv)?, &want_grads.dv, 2e-2)?;
    println!("OK");
    Ok(())
}
