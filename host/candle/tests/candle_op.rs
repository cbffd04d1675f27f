//! The candle op against the f64 reference and against candle's own attention (matmul and
//! softmax in f32, differentiated by candle's autograd): forward and backward on Q, K, V in
//! three layouts (contiguous; `[b, h, s, d]` transposed; narrowed out of one packed
//! `[b, s, 3, h, d]` projection), every dtype, causal and not, with ALiBi and without, at
//! fixed odd shapes and at random ones drawn as the property tests draw them (every scale,
//! GQA, head_dim 1..=256, ALiBi slopes of every sign and size); and the errors. On the CPU
//! (the emulator) always; on CUDA too when built with `--features cuda` and a GPU is there
//! (`REQUIRE_GPU=1` makes a missing one a failure).
//!
//! `FLASHATTN_CANDLE_CPU_CASES` / `FLASHATTN_CANDLE_GPU_CASES` set the number of random cases.

use candle_core::{D, DType, Device, Tensor, Var};
use flashattn::reference::{naive_attention, reference, rel_l2, tolerance};
use flashattn::{AttnShape, Dtype};
use flashattn_candle::{Attention, flash_attn, flash_attn_alibi, flash_attn_alibi_with, flash_attn_with};
use flashattn_tests::{AlibiDraw, Case, Dt, GradRefs, case_strategy, check_grads_against, env_usize, shards, within};
use libtest_mimic::{Arguments, Failed, Trial};
use proptest::strategy::{Strategy, ValueTree};

#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Q, K, V contiguous `[b, s, h, d]`.
    Contiguous,
    /// Each a `[b, h, s, d]` tensor transposed.
    Bhsd,
    /// Narrowed out of one `[b, s, 3, h, d]` tensor (self-attention: sq = sk, hq = hkv).
    Packed,
}

fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

/// Leaf tensors (whose gradients candle returns) and Q, K, V made from them in `layout`.
fn inputs<T: Dtype + candle_core::WithDType>(
    s: &AttnShape,
    layout: Layout,
    rng: &mut flashattn::rng::Rng,
    dev: &Device,
) -> candle_core::Result<(Vec<Var>, [Tensor; 3])> {
    let (b, sq, sk, hq, hk, d) = (s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim);
    let var =
        |n: usize, shape: &[usize], rng: &mut flashattn::rng::Rng| Var::from_tensor(&Tensor::from_vec(rng.tensor::<T>(n), shape, dev)?);
    Ok(match layout {
        Layout::Contiguous => {
            let vars = vec![
                var(b * sq * hq * d, &[b, sq, hq, d], rng)?,
                var(b * sk * hk * d, &[b, sk, hk, d], rng)?,
                var(b * sk * hk * d, &[b, sk, hk, d], rng)?,
            ];
            let t = [vars[0].as_tensor().clone(), vars[1].as_tensor().clone(), vars[2].as_tensor().clone()];
            (vars, t)
        }
        Layout::Bhsd => {
            let vars = vec![
                var(b * sq * hq * d, &[b, hq, sq, d], rng)?,
                var(b * sk * hk * d, &[b, hk, sk, d], rng)?,
                var(b * sk * hk * d, &[b, hk, sk, d], rng)?,
            ];
            let t = [vars[0].transpose(1, 2)?, vars[1].transpose(1, 2)?, vars[2].transpose(1, 2)?];
            (vars, t)
        }
        Layout::Packed => {
            assert!(sq == sk && hq == hk);
            let qkv = var(b * sq * 3 * hq * d, &[b, sq, 3, hq, d], rng)?;
            let part = |i: usize| qkv.narrow(2, i, 1)?.squeeze(2);
            let t = [part(0)?, part(1)?, part(2)?];
            (vec![qkv], t)
        }
    })
}

/// A tensor's elements in row-major order of its shape.
fn elems<T: candle_core::WithDType>(t: &Tensor) -> candle_core::Result<Vec<T>> {
    t.flatten_all()?.to_vec1::<T>()
}

/// Gradients of Q, K, V (row-major `[b, s, h, d]`) from the leaves' gradients.
fn grads_of(layout: Layout, vars: &[Var], g: &candle_core::backprop::GradStore) -> candle_core::Result<[Tensor; 3]> {
    let get = |v: &Var| g.get(v.as_tensor()).cloned().ok_or_else(|| candle_core::Error::Msg("no gradient".into()));
    Ok(match layout {
        Layout::Contiguous => [get(&vars[0])?, get(&vars[1])?, get(&vars[2])?],
        Layout::Bhsd => [get(&vars[0])?.transpose(1, 2)?, get(&vars[1])?.transpose(1, 2)?, get(&vars[2])?.transpose(1, 2)?],
        Layout::Packed => {
            let g = get(&vars[0])?;
            [g.narrow(2, 0, 1)?.squeeze(2)?, g.narrow(2, 1, 1)?.squeeze(2)?, g.narrow(2, 2, 1)?.squeeze(2)?]
        }
    })
}

/// Forward and backward of one case: O within twice naive attention's error of the f64
/// reference, and dQ, dK, dV by the property tests' rules (`check_grads`); then both against
/// candle's own attention ([`against_candle`]).
fn check<T: Dtype + candle_core::WithDType>(dev: &Device, case: &Case, layout: Layout) -> Result<(), String> {
    let s = case.shape;
    let e = |x: candle_core::Error| format!("{case} {layout:?}: {x}");
    let mut rng = flashattn::rng::Rng::new(case.seed);
    let (vars, [q, k, v]) = inputs::<T>(&s, layout, &mut rng, dev).map_err(e)?;
    let attn = case.attention();
    // ALiBi slopes as a candle tensor (the op's own FlashAttn takes no slopes made on another).
    let slopes = match case.alibi_values(s.batch, s.heads_q) {
        Some((values, shape)) => Some(Tensor::from_vec(values, shape, dev).map_err(e)?),
        None => None,
    };
    let op = |q: &Tensor, k: &Tensor, v: &Tensor| match &slopes {
        Some(sl) => flash_attn_alibi_with(q, k, v, sl, Attention { alibi: None, ..attn.clone() }),
        None => flash_attn_with(q, k, v, attn.clone()),
    };
    let o = op(&q, &k, &v).map_err(e)?;
    if o.dims() != q.dims() || o.dtype() != q.dtype() {
        return Err(format!("{case} {layout:?}: O is {:?} {:?}", o.dims(), o.dtype()));
    }
    let (qh, kh, vh) = (elems::<T>(&q).map_err(e)?, elems::<T>(&k).map_err(e)?, elems::<T>(&v).map_err(e)?);
    let got: Vec<f64> = elems::<T>(&o).map_err(e)?.iter().map(|&x| Dtype::to_f64(x)).collect();
    // The same forward with no input tracked (no backward can follow: on CUDA its LSE goes to
    // the device's reused scratch buffer): the same O, bit for bit.
    let untracked = op(&q.detach(), &k.detach(), &v.detach()).map_err(e)?;
    let bits = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let got_untracked: Vec<f64> = elems::<T>(&untracked).map_err(e)?.iter().map(|&x| Dtype::to_f64(x)).collect();
    if bits(&got_untracked) != bits(&got) {
        return Err(format!("{case} {layout:?}: O of untracked inputs differs from O of tracked ones"));
    }
    let (exact, naive) = (reference(&qh, &kh, &vh, &s, &attn), naive_attention(&qh, &kh, &vh, &s, &attn));
    let (err, tol) = (rel_l2(&got, &exact.o), tolerance::<T>(rel_l2(&naive.o, &exact.o)));
    if !flashattn_tests::within(err, tol) {
        return Err(format!("{case} {layout:?}: O rel err {err:.3e} (tol {tol:.3e})"));
    }
    // loss = sum(O * dO): candle hands the op dO exactly.
    let d_o_h = rng.tensor::<T>(got.len());
    let d_o = Tensor::from_vec(d_o_h.clone(), o.dims(), dev).map_err(e)?;
    let grads = (&o * &d_o).and_then(|x| x.sum_all()).and_then(|l| l.backward()).map_err(e)?;
    let [dq, dk, dv] = grads_of(layout, &vars, &grads).map_err(e)?;
    let f = |t: &Tensor| -> Result<Vec<f64>, String> { Ok(elems::<T>(t).map_err(e)?.iter().map(|&x| Dtype::to_f64(x)).collect()) };
    let grads = [f(&dq)?, f(&dk)?, f(&dv)?];
    let refs = GradRefs::new(case, &qh, &kh, &vh, &d_o_h);
    check_grads_against(case, &qh, &kh, &vh, &d_o_h, &refs, &grads).map_err(|m| format!("{layout:?}: {m}"))?;
    let ours = Ours { o: &got, o_exact: &exact.o, o_bar: tol, grads: &grads, refs: &refs };
    against_candle(dev, case, [&qh, &kh, &vh], &d_o_h, &ours).map_err(|m| format!("{case} {layout:?}: {m}"))
}

/// The op's results and what [`check`] measured them against: O and its f64 reference and
/// bar, dQ, dK, dV and their references.
struct Ours<'a> {
    o: &'a [f64],
    o_exact: &'a [f64],
    o_bar: f64,
    grads: &'a [Vec<f64>; 3],
    refs: &'a GradRefs,
}

/// candle's own attention in f32 on `[b, s, h, d]` inputs: Q K^T (K and V heads repeated for
/// GQA), scaled, ALiBi's bias added, the causal mask as -inf (rows that see no key: O = 0),
/// softmax, P V.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, s: &AttnShape, attn: &Attention) -> candle_core::Result<Tensor> {
    let (b, sq, sk, hq, hk, d) = (s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim);
    let heads = |t: &Tensor| -> candle_core::Result<Tensor> {
        // [b, sk, hk, d] -> [b, hq, sk, d]
        t.transpose(1, 2)?.unsqueeze(2)?.broadcast_as((b, hk, hq / hk, sk, d))?.reshape((b, hq, sk, d))
    };
    let (q, k, v) = (q.transpose(1, 2)?.contiguous()?, heads(k)?, heads(v)?);
    let scores = q.matmul(&k.t()?.contiguous()?)?.affine(attn.scale(d) as f64, 0.0)?;
    let scores = match attn.alibi {
        Some(_) => {
            let bias = (0..b * hq * sq * sk)
                .map(|x| attn.alibi_bias((x / (hq * sq * sk), x / (sq * sk) % hq), x / sk % sq, x % sk, sq, sk) as f32)
                .collect::<Vec<_>>();
            (scores + Tensor::from_vec(bias, (b, hq, sq, sk), q.device())?)?
        }
        None => scores,
    };
    let (scores, seen) = if attn.causal {
        // Query row i sees keys j <= i + sk - sq; a row that sees none gets bias 0 and is
        // zeroed after P V.
        let lim = |i: usize| i as i64 + sk as i64 - sq as i64;
        let bias: Vec<f32> =
            (0..sq).flat_map(|i| (0..sk).map(move |j| if lim(i) < 0 || j as i64 <= lim(i) { 0.0 } else { f32::NEG_INFINITY })).collect();
        let seen: Vec<f32> = (0..sq).map(|i| if lim(i) < 0 { 0.0 } else { 1.0 }).collect();
        let dev = q.device();
        (scores.broadcast_add(&Tensor::from_vec(bias, (sq, sk), dev)?)?, Some(Tensor::from_vec(seen, (sq, 1), dev)?))
    } else {
        (scores, None)
    };
    let m = scores.max_keepdim(D::Minus1)?.detach();
    let e = scores.broadcast_sub(&m)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let o = p.matmul(&v)?;
    let o = match seen {
        Some(seen) => o.broadcast_mul(&seen)?,
        None => o,
    };
    o.transpose(1, 2)
}

/// O and dQ, dK, dV (`ours`: row-major `[b, s, h, d]`) against candle's attention in f32
/// ([`candle_attention`]) on the same inputs, differentiated by candle's autograd with the
/// same dO: each within our bar (the one [`check`] used against the f64 reference) plus
/// candle's own error against the f64 reference, counted up to twice our bar: a candle result
/// further off than that, or a wrong op, fails.
fn against_candle<T: Dtype>(dev: &Device, case: &Case, qkv: [&[T]; 3], d_o: &[T], ours: &Ours) -> Result<(), String> {
    let (s, attn) = (case.shape, case.attention());
    let e = |x: candle_core::Error| format!("candle's attention: {x}");
    let f32s = |x: &[T]| x.iter().map(|v| Dtype::to_f64(*v) as f32).collect::<Vec<f32>>();
    let var = |x: &[T], shape: [usize; 4]| Var::from_tensor(&Tensor::from_vec(f32s(x), &shape, dev)?);
    let (q, k, v) = (var(qkv[0], s.q_shape()).map_err(e)?, var(qkv[1], s.kv_shape()).map_err(e)?, var(qkv[2], s.kv_shape()).map_err(e)?);
    let o = candle_attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &s, &attn).map_err(e)?;
    let d_o_t = Tensor::from_vec(f32s(d_o), &s.q_shape(), dev).map_err(e)?;
    let g = (&o * &d_o_t).and_then(|x| x.sum_all()).and_then(|l| l.backward()).map_err(e)?;
    let vec = |t: &Tensor| -> Result<Vec<f64>, String> {
        Ok(t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(e)?.iter().map(|&x| x as f64).collect())
    };
    let grad = |v: &Var| g.get(v.as_tensor()).ok_or_else(|| "no gradient".to_string()).and_then(vec);
    // Our bar plus candle's own error against the f64 reference, which counts up to twice
    // our bar only.
    let bar = |tol: f64, c: &[f64], exact: &[f64]| tol + rel_l2(c, exact).min(2.0 * tol);
    let c_o = vec(&o)?;
    let (err, tol) = (rel_l2(ours.o, &c_o), bar(ours.o_bar, &c_o, ours.o_exact));
    if !within(err, tol) {
        return Err(format!("O against candle's: rel err {err:.3e} (bar {tol:.3e})"));
    }
    for (((name, ex, nv, fl), g), var) in ours.refs.each().into_iter().zip(ours.grads).zip([&q, &k, &v]) {
        if ex.iter().all(|&x| x.abs() < f32::MIN_POSITIVE as f64) {
            // A vanishing gradient (check_grads holds it to an absolute bar), or one below
            // f32's normal range (|scale| near the limit: about 1e-160), which candle's f32
            // computation flushes to 0: no relative error to compare.
            continue;
        }
        let c = grad(var)?;
        let (err, tol) = (rel_l2(g, &c), bar(GradRefs::bar::<T>(ex, nv, fl), &c, ex));
        if !within(err, tol) {
            return Err(format!("{name} against candle's: rel err {err:.3e} (bar {tol:.3e})"));
        }
    }
    Ok(())
}

fn cases(dev: &Device, tag: &str) -> Vec<Trial> {
    let mut trials = Vec::new();
    let layouts = [Layout::Contiguous, Layout::Bhsd, Layout::Packed];
    for layout in layouts {
        for (dt, name) in [(Dt::F16, "f16"), (Dt::Bf16, "bf16"), (Dt::F32, "f32")] {
            for causal in [false, true] {
                // GQA and unequal lengths where the layout allows; odd sizes throughout.
                let shape = match layout {
                    Layout::Packed => AttnShape { batch: 2, seqlen_q: 41, seqlen_k: 41, heads_q: 3, heads_kv: 3, head_dim: 40 },
                    _ => AttnShape { batch: 2, seqlen_q: 37, seqlen_k: 53, heads_q: 4, heads_kv: 2, head_dim: 72 },
                };
                let scale = if causal { None } else { Some(-0.3) };
                let case = Case {
                    shape,
                    causal,
                    softmax_scale: scale,
                    dtype: dt,
                    seed: 0,
                    window: Default::default(),
                    softcap: None,
                    sinks: false,
                    // ALiBi per batch entry with causal masking (a 0, a negative, a steep or
                    // the paper's slope: whatever the seed draws).
                    alibi: causal.then_some(AlibiDraw { per_batch: true, batch0: 0 }),
                };
                let dev = dev.clone();
                let trial_name = format!("{tag}::{layout:?}::{name}::{}", if causal { "causal" } else { "negative_scale" }).to_lowercase();
                trials.push(Trial::test(trial_name, move || {
                    let case = Case { seed: seed(), ..case };
                    match dt {
                        Dt::F16 => check::<half::f16>(&dev, &case, layout),
                        Dt::Bf16 => check::<half::bf16>(&dev, &case, layout),
                        Dt::F32 => check::<f32>(&dev, &case, layout),
                    }
                    .map_err(Failed::from)
                }));
            }
        }
    }
    trials.extend(random_trials(dev, tag));
    let dev = dev.clone();
    trials.push(Trial::test(format!("{tag}::errors"), move || errors(&dev).map_err(Failed::from)));
    trials
}

/// Random cases as the property tests draw them (`case_strategy`: every scale, GQA, unequal
/// lengths, head_dim up to 256 on CUDA), each in a layout of the three in turn (packed QKV
/// takes the shorter length and the KV heads for all three), in shards run in parallel.
fn random_trials(dev: &Device, tag: &str) -> Vec<Trial> {
    let gpu = !dev.is_cpu();
    let (total, size) = match gpu {
        true => (env_usize("FLASHATTN_CANDLE_GPU_CASES", 300), 25),
        false => (env_usize("FLASHATTN_CANDLE_CPU_CASES", 9), 3),
    };
    let stamp = seed();
    shards(total, size)
        .into_iter()
        .enumerate()
        .map(|(shard, cases)| {
            let dev = dev.clone();
            Trial::test(format!("{tag}::random::{shard:03}"), move || {
                let strategy = match gpu {
                    true => case_strategy(160, 32, 3, 3, 2, 1_000_000).boxed(),
                    false => case_strategy(40, 12, 2, 2, 2, 30_000).boxed(),
                };
                let mut key = [0u8; 32];
                key[..8].copy_from_slice(&stamp.to_le_bytes());
                key[8..16].copy_from_slice(&(shard as u64).to_le_bytes());
                let rng = proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &key);
                let mut runner = proptest::test_runner::TestRunner::new_with_rng(Default::default(), rng);
                for i in 0..cases {
                    let mut case = strategy.new_tree(&mut runner).map_err(|e| Failed::from(e.to_string()))?.current();
                    // No sliding window, no softcap (candle's attention here has neither), no
                    // sinks (the op's own FlashAttn takes none made on another); ALiBi as
                    // drawn, by `flash_attn_alibi_with`.
                    case.window = Default::default();
                    case.softcap = None;
                    case.sinks = false;
                    let layout = [Layout::Contiguous, Layout::Bhsd, Layout::Packed][(i + shard) % 3];
                    if let Layout::Packed = layout {
                        let n = case.shape.seqlen_q.min(case.shape.seqlen_k);
                        (case.shape.seqlen_q, case.shape.seqlen_k, case.shape.heads_q) = (n, n, case.shape.heads_kv);
                    }
                    match case.dtype {
                        Dt::F16 => check::<half::f16>(&dev, &case, layout),
                        Dt::Bf16 => check::<half::bf16>(&dev, &case, layout),
                        Dt::F32 => check::<f32>(&dev, &case, layout),
                    }?;
                }
                Ok(())
            })
        })
        .collect()
}

/// Bad input is an error naming what is wrong, before any launch.
fn errors(dev: &Device) -> Result<(), String> {
    let t = |shape: &[usize], dt: DType| Tensor::ones(shape, dt, dev).map_err(|e| e.to_string());
    let q = t(&[1, 8, 2, 64], DType::BF16)?;
    let expect = |r: candle_core::Result<Tensor>, what: &str, needle: &str| -> Result<(), String> {
        match r {
            Ok(_) => Err(format!("{what}: accepted")),
            Err(e) if e.to_string().contains(needle) => Ok(()),
            Err(e) => Err(format!("{what}: error {e} does not say {needle:?}")),
        }
    };
    expect(flash_attn(&t(&[8, 2, 64], DType::BF16)?, &q, &q, 0.1, false), "rank 3", "[8, 2, 64]")?;
    expect(flash_attn(&q, &t(&[1, 8, 2, 64], DType::F16)?, &q, 0.1, false), "dtype mismatch", "F16")?;
    expect(
        flash_attn(&t(&[1, 8, 2, 64], DType::U32)?, &t(&[1, 8, 2, 64], DType::U32)?, &t(&[1, 8, 2, 64], DType::U32)?, 0.1, false),
        "u32",
        "flash_attn",
    )?;
    expect(flash_attn(&q, &t(&[1, 8, 2, 32], DType::BF16)?, &q, 0.1, false), "head_dim mismatch", "32")?;
    let big = t(&[1, 8, 2, 264], DType::BF16)?;
    expect(flash_attn(&big, &big, &big, 0.1, false), "head_dim 264", "264")?;
    expect(flash_attn(&q, &q, &q, f32::NAN, false), "NaN scale", "NaN")?;
    // ALiBi slopes: f32, [heads_q] or [batch, heads_q] matching the call, each finite.
    let slopes = |v: &[f32], shape: &[usize], dt: DType| Tensor::from_vec(v.to_vec(), shape, dev).and_then(|t| t.to_dtype(dt));
    let sl = |v: &[f32], shape: &[usize], dt| slopes(v, shape, dt).map_err(|e| e.to_string());
    expect(flash_attn_alibi(&q, &q, &q, &sl(&[0.5, 0.25], &[2], DType::BF16)?, 0.1, true), "bf16 slopes", "BF16")?;
    expect(flash_attn_alibi(&q, &q, &q, &sl(&[0.5; 8], &[2, 2, 2], DType::F32)?, 0.1, true), "rank-3 slopes", "[2, 2, 2]")?;
    expect(flash_attn_alibi(&q, &q, &q, &sl(&[0.5; 3], &[3], DType::F32)?, 0.1, true), "3 slopes for 2 heads", "heads")?;
    expect(flash_attn_alibi(&q, &q, &q, &sl(&[0.5; 4], &[2, 2], DType::F32)?, 0.1, true), "slopes of 2 batch entries for 1", "batch")?;
    expect(flash_attn_alibi(&q, &q, &q, &sl(&[0.5, f32::NAN], &[2], DType::F32)?, 0.1, true), "NaN slope", "NaN")?;
    flash_attn_alibi(&q, &q, &q, &sl(&[0.5, -0.25], &[1, 2], DType::F32)?, 0.1, true).map_err(|e| format!("[batch, heads] slopes: {e}"))?;
    let _ = Attention::default();
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = cases(&Device::Cpu, "cpu");
    trials.extend(gpu_trials());
    libtest_mimic::run(&args, trials).exit();
}

#[cfg(not(feature = "cuda"))]
fn gpu_trials() -> Vec<Trial> {
    eprintln!("\n*** built without the `cuda` feature: the candle op's CUDA tests are NOT RUN (reported as ignored). ***\n");
    let require = std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1");
    vec![
        Trial::test("cuda::all", move || if require { Err("REQUIRE_GPU=1 but built without the `cuda` feature".into()) } else { Ok(()) })
            .with_ignored_flag(!require),
    ]
}

#[cfg(feature = "cuda")]
fn gpu_trials() -> Vec<Trial> {
    let require = std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1");
    match Device::new_cuda(0) {
        Ok(dev) => cases(&dev, "cuda"),
        Err(e) => {
            eprintln!(
                "\n*** NO GPU ({e}): the candle op's CUDA tests NOT RUN (reported as ignored). Set REQUIRE_GPU=1 to make this a failure. ***\n"
            );
            let why = e.to_string();
            vec![
                Trial::test("cuda::all", move || if require { Err(format!("REQUIRE_GPU=1: {why}").into()) } else { Ok(()) })
                    .with_ignored_flag(!require),
            ]
        }
    }
}
