//! Criterion bench of every backward kernel family at a few FA-paper shapes (hidden 2048,
//! 16k tokens, f16). Inputs, the forward's O and LSE, and the gradient buffers are prepared
//! outside the timed region; each sample is timed with CUDA events around back-to-back
//! backward passes (`FlashAttn::time_backward`), and reported as time and TFLOP/s with the
//! FA papers' count (2.5 times the forward's FLOPs: five matrix products against two).
//! Without a GPU it says so and benches the emulator at one tiny shape.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flashattn::{Attention, AttnShape, BWD_FAMILIES, BwdOptions, BwdOutput, FlashAttn, FwdOptions};
use std::time::Duration;

fn bench_backward(c: &mut Criterion) {
    let (fa, why) = FlashAttn::cuda_or_emulator();
    let shapes: Vec<(usize, usize)> = if let Some(e) = &why {
        eprintln!("\n*** No GPU ({e}): benching the CPU emulator at a tiny shape; these numbers say nothing about GPU speed. ***\n");
        vec![(64, 64)]
    } else {
        vec![(64, 1024), (64, 4096), (128, 1024), (128, 4096)]
    };
    let mut g = c.benchmark_group("backward");
    g.sample_size(10).measurement_time(Duration::from_secs(if why.is_some() { 1 } else { 3 }));
    for family in BWD_FAMILIES.iter().map(|f| f.name) {
        for &(d, seqlen) in &shapes {
            for causal in [false, true] {
                let heads = if why.is_some() { 2 } else { 2048 / d };
                let batch = if why.is_some() { 1 } else { (16384 / seqlen).max(1) };
                let s = AttnShape { batch, seqlen_q: seqlen, seqlen_k: seqlen, heads_q: heads, heads_kv: heads, head_dim: d };
                let attn = Attention { causal, ..Default::default() };
                let opts = BwdOptions { kernel: Some(family), ..Default::default() };
                let n_q = s.batch * s.seqlen_q * s.heads_q * d;
                let data: Vec<half::f16> = flashattn::rng::normal_tensor(d as u64 * seqlen as u64, n_q);
                // The family must run here (sm_90a kernels on compute capability 9.0 only); the
                // forward is the automatic one (backward-only families are no forward family).
                let archs = fa.archs();
                match flashattn::select_bwd_variants(
                    flashattn::kernels::dtype::DType::F16,
                    d,
                    &opts,
                    &archs,
                    false,
                    flashattn::Entry::Plain,
                    &attn,
                ) {
                    Ok(vs) if vs.iter().all(|v| archs.contains(&v.arch())) => {}
                    Ok(_) => {
                        eprintln!("skipping {family}: this device cannot run its kernels");
                        continue;
                    }
                    Err(e) => {
                        eprintln!("skipping {family} d={d}: {e}");
                        continue;
                    }
                }
                let prepared = (|| -> flashattn::Result<_> {
                    let q = fa.upload(&data, &s.q_shape())?;
                    let fwd = fa.forward(&q, &q, &q, &attn, &FwdOptions::default())?;
                    let grads = BwdOutput {
                        dq: fa.full(half::f16::NAN, &s.q_shape())?,
                        dk: fa.full(half::f16::NAN, &s.kv_shape())?,
                        dv: fa.full(half::f16::NAN, &s.kv_shape())?,
                        dsinks: None,
                    };
                    Ok((q, fwd, grads))
                })();
                let (q, fwd, mut grads) = match prepared {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("skipping {family} d={d} s={seqlen}: {e}");
                        continue;
                    }
                };
                g.throughput(Throughput::Elements((2.5 * s.fwd_flops(causal)) as u64));
                let id = BenchmarkId::new(format!("{family}/f16/d{d}/{}", if causal { "causal" } else { "full" }), seqlen);
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let ms = fa
                            .time_backward(&q, &q, &q, &fwd, &q, &opts, &mut grads, 1, iters as usize)
                            .unwrap_or_else(|e| panic!("backward failed: {e}"));
                        Duration::from_secs_f64(ms * 1e-3 * iters as f64)
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench_backward);
criterion_main!(benches);
