//! The candle op against the f64 reference: forward and backward (through candle's autograd)
//! on Q, K, V in three layouts (contiguous; `[b, h, s, d]` transposed; narrowed out of one
//! packed `[b, s, 3, h, d]` projection), every dtype, causal and not; and the errors. On the
//! CPU (the emulator) always; on CUDA too when built with `--features cuda` and a GPU is
//! there (`REQUIRE_GPU=1` makes a missing one a failure).

use candle_core::{DType, Device, Tensor, Var};
use flashattn::reference::{naive_attention, reference, rel_l2, tolerance};
use flashattn::{AttnShape, Dtype};
use flashattn_candle::{Attention, flash_attn, flash_attn_with};
use flashattn_tests::{Case, Dt, check_grads};
use libtest_mimic::{Arguments, Failed, Trial};

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
/// reference, and dQ, dK, dV by the property tests' rules (`check_grads`).
fn check<T: Dtype + candle_core::WithDType>(dev: &Device, case: &Case, layout: Layout) -> Result<(), String> {
    let s = case.shape;
    let e = |x: candle_core::Error| format!("{case} {layout:?}: {x}");
    let mut rng = flashattn::rng::Rng::new(case.seed);
    let (vars, [q, k, v]) = inputs::<T>(&s, layout, &mut rng, dev).map_err(e)?;
    let attn = case.attention();
    let o = flash_attn_with(&q, &k, &v, attn).map_err(e)?;
    if o.dims() != q.dims() || o.dtype() != q.dtype() {
        return Err(format!("{case} {layout:?}: O is {:?} {:?}", o.dims(), o.dtype()));
    }
    let (qh, kh, vh) = (elems::<T>(&q).map_err(e)?, elems::<T>(&k).map_err(e)?, elems::<T>(&v).map_err(e)?);
    let got: Vec<f64> = elems::<T>(&o).map_err(e)?.iter().map(|&x| Dtype::to_f64(x)).collect();
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
    check_grads(case, &qh, &kh, &vh, &d_o_h, &[f(&dq)?, f(&dk)?, f(&dv)?]).map_err(|m| format!("{layout:?}: {m}"))
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
                let case = Case { shape, causal, softmax_scale: scale, dtype: dt, seed: 0 };
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
    let dev = dev.clone();
    trials.push(Trial::test(format!("{tag}::errors"), move || errors(&dev).map_err(Failed::from)));
    trials
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
