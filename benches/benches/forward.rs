//! Criterion bench of every forward kernel family at a few FA-paper shapes (hidden 2048,
//! 16k tokens). Inputs are prepared outside the timed region; each sample is timed with CUDA
//! events around back-to-back launches (`FlashAttn::time_forward`, the same timer the CLI
//! and the side-by-side harness use), and reported as time and TFLOP/s.
//! Without a GPU it says so and benches the emulator at one tiny shape.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flashattn::{Attention, AttnShape, FWD_FAMILIES, FlashAttn, FwdOptions, FwdOutput};
use std::time::Duration;

fn bench_forward(c: &mut Criterion) {
    let (fa, why) = FlashAttn::cuda_or_emulator();
    let shapes: Vec<(usize, usize)> = if let Some(e) = &why {
        eprintln!("\n*** No GPU ({e}): benching the CPU emulator at a tiny shape; these numbers say nothing about GPU speed. ***\n");
        vec![(64, 64)]
    } else {
        vec![(64, 1024), (64, 4096), (128, 1024), (128, 4096)]
    };
    let mut g = c.benchmark_group("forward");
    g.sample_size(10).measurement_time(Duration::from_secs(if why.is_some() { 1 } else { 3 }));
    for family in FWD_FAMILIES.iter().map(|f| f.name) {
        for &(d, seqlen) in &shapes {
            for causal in [false, true] {
                let heads = if why.is_some() { 2 } else { 2048 / d };
                let s = AttnShape {
                    batch: (16384 / seqlen).max(1).min(if why.is_some() { 1 } else { usize::MAX }),
                    seqlen_q: seqlen,
                    seqlen_k: seqlen,
                    heads_q: heads,
                    heads_kv: heads,
                    head_dim: d,
                };
                let attn = Attention { causal, ..Default::default() };
                let opts = FwdOptions { kernel: Some(family), ..Default::default() };
                // Not every family serves every head_dim (wgmma_wg2: 64 and 128 only),
                // and sm_90a kernels run on compute capability 9.0 only.
                match flashattn::select_variant(flashattn::kernels::dtype::DType::F16, d, &opts, &fa.archs()) {
                    Ok(v) if fa.archs().contains(&v.arch()) => {}
                    Ok(v) => {
                        eprintln!("skipping {family} d={d}: this device cannot run {:?} kernels ({})", v.arch(), v.name);
                        continue;
                    }
                    Err(e) => {
                        eprintln!("skipping {family} d={d}: {e}");
                        continue;
                    }
                }
                let n_q = s.batch * s.seqlen_q * s.heads_q * d;
                let data: Vec<half::f16> = flashattn::rng::normal_tensor(d as u64 * seqlen as u64, n_q);
                let (Ok(q), Ok(o), Ok(lse)) =
                    (fa.upload(&data, &s.q_shape()), fa.full(half::f16::NAN, &s.q_shape()), fa.full(f32::NAN, &s.lse_shape()))
                else {
                    eprintln!("skipping {family} d={d} s={seqlen}: allocation failed");
                    continue;
                };
                let mut out = FwdOutput::from_buffers(o, lse, None);
                g.throughput(Throughput::Elements(s.fwd_flops(causal) as u64));
                let id = BenchmarkId::new(format!("{family}/f16/d{d}/{}", if causal { "causal" } else { "full" }), seqlen);
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let ms = fa
                            .time_forward(&q, &q, &q, &attn, &opts, &mut out, 1, iters as usize)
                            .unwrap_or_else(|e| panic!("forward failed: {e}"));
                        Duration::from_secs_f64(ms * 1e-3 * iters as f64)
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench_forward);
criterion_main!(benches);
