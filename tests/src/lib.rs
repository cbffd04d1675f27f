//! Shared test support: one property-test body that runs on the CUDA device when there is
//! one and on the CPU emulator always, so CI (no GPU) and the GPU machine run the same checks.

pub use flashattn::reference::l2;
use flashattn::reference::{lse_tolerance, naive_attention, reference, rel_l2, tolerance};
use flashattn::{Attention, AttnShape, BwdOptions, Dtype, FlashAttn, FwdOptions, FwdOutput, Window};
use std::fmt;

pub mod kvcache;
pub mod merge;
pub mod nonfinite;
pub mod strided;
pub mod varlen;

pub use flashattn::rng::Rng;

/// Which backend a check runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Gpu,
    Emulator,
}

/// The element type of a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dt {
    F32,
    F16,
    Bf16,
}

impl Dt {
    /// The kernels' element type of a case dtype.
    pub fn dtype(self) -> flashattn::kernels::dtype::DType {
        use flashattn::kernels::dtype::DType;
        match self {
            Dt::F32 => DType::F32,
            Dt::F16 => DType::F16,
            Dt::Bf16 => DType::Bf16,
        }
    }
    /// The case dtype of a kernel's element type.
    pub fn of(d: flashattn::kernels::dtype::DType) -> Dt {
        use flashattn::kernels::dtype::DType;
        match d {
            DType::F32 => Dt::F32,
            DType::F16 => Dt::F16,
            DType::Bf16 => Dt::Bf16,
        }
    }
}

/// One forward check: shape, options, and the seed of its random inputs.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub shape: AttnShape,
    pub causal: bool,
    pub softmax_scale: Option<f32>,
    pub dtype: Dt,
    pub seed: u64,
    /// Sliding window.
    pub window: Window,
    /// Logit soft-capping.
    pub softcap: Option<f32>,
    /// Attention sinks, their logits drawn from the seed ([`Case::sink_values`]).
    pub sinks: bool,
    /// ALiBi, its slopes drawn from the seed ([`Case::alibi_values`]).
    pub alibi: Option<AlibiDraw>,
}

impl Case {
    /// The attention the case computes, its sinks on `fa`.
    pub fn attention_on(&self, fa: &FlashAttn) -> flashattn::Result<Attention> {
        let sinks = self.sink_values(self.shape.heads_q).map(|v| fa.sinks(&v)).transpose()?;
        let alibi = self.alibi_values(self.shape.batch, self.shape.heads_q).map(|(v, shape)| fa.alibi_slopes(&v, &shape)).transpose()?;
        Ok(Attention { causal: self.causal, softmax_scale: self.softmax_scale, window: self.window, softcap: self.softcap, sinks, alibi })
    }
    /// The attention the case computes, for the host references (its sinks on the emulator).
    pub fn attention(&self) -> Attention {
        self.attention_on(&FlashAttn::emulator()).expect("sinks of a case are valid")
    }
    /// The sink logits of `heads` query heads when the case has sinks, from its seed, over
    /// every regime: -inf (no sink for that head), far below the scores (negligible), near
    /// them, and above them (the sink takes most of each row's weight: up to e^10).
    pub fn sink_values(&self, heads: usize) -> Option<Vec<f32>> {
        let mut rng = Rng::new(self.seed ^ 0x5157_0051_5700_5157);
        self.sinks.then(|| {
            (0..heads)
                .map(|_| match rng.next_u64() % 8 {
                    0 => f32::NEG_INFINITY,
                    1 => -60.0 - 40.0 * rng.uniform() as f32,
                    2 => 2.0 + 8.0 * rng.uniform() as f32,
                    _ => 8.0 * rng.uniform() as f32 - 4.0,
                })
                .collect()
        })
    }
}

/// How a case draws its ALiBi slopes ([`Case::alibi_values`]): `[heads]` or `[batch, heads]`,
/// each slope a hash of the case's seed and its place, so that a variable-length batch's
/// sequence b, checked as a case of batch 1 (`batch0` b), gets the slopes of row b.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlibiDraw {
    pub per_batch: bool,
    /// The batch entry the case's entry 0 stands for.
    pub batch0: usize,
}

impl Case {
    /// The ALiBi slopes and their shape when the case has ALiBi, over every regime: the
    /// paper's slopes (1/2 to 1/256: the usual locality), 0 (no bias for that head), tiny ones
    /// (1e-6: the bias below the scores' rounding), steep ones (1 to 8: a row sees its nearest
    /// keys only) and negative ones (distant keys favoured).
    pub fn alibi_values(&self, batch: usize, heads: usize) -> Option<(Vec<f32>, Vec<usize>)> {
        let draw = self.alibi?;
        let slope = |b: usize, h: usize| {
            let mut rng = Rng::new(self.seed ^ 0xa11b_1a11_b1a1_1b1a ^ ((b as u64) << 32) ^ h as u64);
            rng.next_u64();
            match rng.next_u64() % 8 {
                0 => 0.0,
                1 => 1e-6 * (rng.uniform() as f32 + 0.5),
                2 => 1.0 + 7.0 * rng.uniform() as f32,
                3 => -0.5 * rng.uniform() as f32,
                _ => 0.5f32.powi(1 + (rng.next_u64() % 8) as i32),
            }
        };
        Some(match draw.per_batch {
            false => ((0..heads).map(|h| slope(0, h)).collect(), vec![heads]),
            true => (
                (0..batch).flat_map(|b| (0..heads).map(move |h| (b, h))).map(|(b, h)| slope(draw.batch0 + b, h)).collect(),
                vec![batch, heads],
            ),
        })
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shape;
        write!(
            f,
            "{:?} b={} sq={} sk={} hq={} hkv={} d={} causal={} scale={:?} seed={}",
            self.dtype, s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim, self.causal, self.softmax_scale, self.seed
        )?;
        if !self.window.is_none() {
            write!(f, " window=({:?}, {:?})", self.window.left, self.window.right)?;
        }
        if let Some(c) = self.softcap {
            write!(f, " softcap={c:e}")?;
        }
        if let Some((v, shape)) = self.alibi_values(self.shape.batch, self.shape.heads_q) {
            write!(f, " alibi{shape:?}={v:?}")?;
        }
        match self.sink_values(self.shape.heads_q) {
            Some(v) => write!(f, " sinks={v:?}"),
            None => Ok(()),
        }
    }
}

/// Errors measured by one check, with the bars they had to meet.
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    pub o_err: f64,
    pub o_tol: f64,
    pub lse_err: f64,
    pub lse_tol: f64,
}

/// Runs `case` on `fa` and compares O and LSE with the f64 reference.
///
/// Fresh random inputs (from the case's seed); outputs poisoned with NaN before the launch, so
/// an element the kernel does not write fails the check (NaN never passes `rel_l2`).
/// Tolerances: twice naive attention's error in the same dtype plus one unit roundoff
/// ([`tolerance`]); for LSE (always f32) the same rule with the f32 unit roundoff, naive's
/// error at least one rounding of each row's sum ([`lse_tolerance`]).
pub fn check_case(fa: &FlashAttn, case: &Case) -> Result<Measured, String> {
    check_case_with(fa, case, None)
}

/// As [`check_case`], with the kernel family named (`None`: the automatic choice).
pub fn check_case_with(fa: &FlashAttn, case: &Case, kernel: Option<&'static str>) -> Result<Measured, String> {
    check_case_opts(fa, case, &FwdOptions { kernel, ..Default::default() })
}

/// As [`check_case`], with the forward's options (a kernel family, split-KV).
pub fn check_case_opts(fa: &FlashAttn, case: &Case, opts: &FwdOptions) -> Result<Measured, String> {
    let r = match case.dtype {
        Dt::F32 => check_typed::<f32>(fa, case, opts),
        Dt::F16 => check_typed::<half::f16>(fa, case, opts),
        Dt::Bf16 => check_typed::<half::bf16>(fa, case, opts),
    };
    r.map_err(|e| match opts.splits {
        Some(n) => format!("[splits {n}] {e}"),
        None => e,
    })
}

/// Split-KV parts for a case (`FwdOptions::splits`), drawn from its seed: the automatic
/// choice in half the draws, else where the forward `fa` selects for it splits the keys
/// (`family`, or the automatic choice) no split (1) or 2 to 6 parts.
pub fn splits_for(fa: &FlashAttn, seed: u64, dtype: Dt, head_dim: usize, family: Option<&'static str>) -> Option<u32> {
    let x = Rng::new(seed ^ 0x5b11_75b1_175b_1175).next_u64() % 12;
    (x >= 6 && family_splits(fa, dtype, head_dim, family)).then_some(1 + (x - 6) as u32)
}

/// Whether the forward `fa` selects for `dtype` and `head_dim` (`family`, or the automatic
/// choice) splits the keys (`FwdOptions::splits`).
pub fn family_splits(fa: &FlashAttn, dtype: Dt, head_dim: usize, family: Option<&'static str>) -> bool {
    let opts = FwdOptions { kernel: family, ..Default::default() };
    flashattn::select_variant(dtype.dtype(), head_dim, &opts, &fa.archs()).is_ok_and(|v| v.family.desc().splits)
}

fn check_typed<T: Dtype>(fa: &FlashAttn, case: &Case, opts: &FwdOptions) -> Result<Measured, String> {
    let s = case.shape;
    let e = |e: flashattn::Error| format!("{case}: {e}");
    let attn = case.attention_on(fa).map_err(e)?;
    let mut rng = Rng::new(case.seed);
    let q: Vec<T> = rng.tensor(s.batch * s.seqlen_q * s.heads_q * s.head_dim);
    let k: Vec<T> = rng.tensor(s.batch * s.seqlen_k * s.heads_kv * s.head_dim);
    let v: Vec<T> = rng.tensor(s.batch * s.seqlen_k * s.heads_kv * s.head_dim);
    let qd = fa.upload(&q, &s.q_shape()).map_err(e)?;
    let kd = fa.upload(&k, &s.kv_shape()).map_err(e)?;
    let vd = fa.upload(&v, &s.kv_shape()).map_err(e)?;
    let mut out = FwdOutput::from_buffers(fa.full(T::nan(), &s.q_shape()).map_err(e)?, fa.full(f32::NAN, &s.lse_shape()).map_err(e)?, None);
    fa.forward_into(&qd, &kd, &vd, &attn, opts, &mut out).map_err(e)?;
    let o: Vec<f64> = fa.download(out.o()).map_err(e)?.iter().map(|x| x.to_f64()).collect();
    let lse: Vec<f64> = fa.download(out.lse()).map_err(e)?.iter().map(|&x| x as f64).collect();

    check_outputs(case, &q, &k, &v, &o, &lse)
}

/// Compares a forward's O and LSE (contiguous, as f64) for `case`'s inputs with the f64
/// reference ([`check_case`]'s rules).
pub fn check_outputs<T: Dtype>(case: &Case, q: &[T], k: &[T], v: &[T], o: &[f64], lse: &[f64]) -> Result<Measured, String> {
    let (s, attn) = (case.shape, case.attention());
    let exact = reference(q, k, v, &s, &attn);
    let naive = naive_attention(q, k, v, &s, &attn);
    let m = Measured {
        o_err: rel_l2(o, &exact.o),
        o_tol: tolerance::<T>(rel_l2(&naive.o, &exact.o)),
        lse_err: rel_l2(lse, &exact.lse),
        lse_tol: lse_tolerance(rel_l2(&naive.lse, &exact.lse), &exact.lse),
    };
    // Rows that see no key (causal, seqlen_q > seqlen_k) must be exactly 0 with LSE -inf.
    let d = s.head_dim;
    for (r, &l) in exact.lse.iter().enumerate() {
        if l == f64::NEG_INFINITY {
            let (bh, i) = (r / s.seqlen_q, r % s.seqlen_q);
            let (b, h) = (bh / s.heads_q, bh % s.heads_q);
            let at = ((b * s.seqlen_q + i) * s.heads_q + h) * d;
            if lse[r] != f64::NEG_INFINITY || o[at..at + d].iter().any(|&x| x != 0.0) {
                return Err(format!("{case}: fully masked row (b={b}, h={h}, i={i}) has LSE {} and O not all 0", lse[r]));
            }
        }
    }
    let unwritten = o.iter().filter(|x| x.is_nan()).count() + lse.iter().filter(|x| x.is_nan()).count();
    if unwritten > 0 {
        return Err(format!("{case}: {unwritten} output elements still NaN (not written, or NaN computed)"));
    }
    if !within(m.o_err, m.o_tol) || !within(m.lse_err, m.lse_tol) {
        return Err(format!(
            "{case}: O rel err {:.3e} (tol {:.3e}), LSE rel err {:.3e} (tol {:.3e})",
            m.o_err, m.o_tol, m.lse_err, m.lse_tol
        ));
    }
    Ok(m)
}

/// The GPU, if this machine has one. `REQUIRE_GPU=1` turns its absence into an error.
pub enum Gpu {
    Present(FlashAttn),
    /// No GPU, and none required: GPU tests are reported as ignored, loudly.
    Absent(String),
    /// No GPU, but `REQUIRE_GPU=1`: GPU tests fail.
    Required(String),
}

impl Gpu {
    pub fn detect() -> Gpu {
        match FlashAttn::cuda(0) {
            Ok(fa) => Gpu::Present(fa),
            Err(e) if std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1") => Gpu::Required(e.to_string()),
            Err(e) => Gpu::Absent(e.to_string()),
        }
    }
}

/// The GPU's trials, `make(fa, unavailable)`: run on the GPU when there is one; each failing
/// with the reason under `REQUIRE_GPU=1` when there is none; else all reported as ignored,
/// loudly (`what` names them in the notice).
pub fn gpu_trials(
    what: &str,
    make: impl Fn(Option<std::sync::Arc<FlashAttn>>, Option<String>) -> Vec<libtest_mimic::Trial>,
) -> Vec<libtest_mimic::Trial> {
    match Gpu::detect() {
        Gpu::Present(fa) => {
            eprintln!("GPU: {}", fa.device_name());
            make(Some(std::sync::Arc::new(fa)), None)
        }
        Gpu::Required(why) => make(None, Some(why)),
        Gpu::Absent(why) => {
            let gpu = make(None, None);
            eprintln!(
                "\n*** NO GPU ({why}): {} {what} NOT RUN (reported as ignored). Set REQUIRE_GPU=1 to make this a failure. ***\n",
                gpu.len()
            );
            gpu.into_iter().map(|t| t.with_ignored_flag(true)).collect()
        }
    }
}

/// Pushes `trial` (named `label`) for kernels of `arch`: reported ignored, loudly, on a device
/// that cannot run them (`archs`: the device's, `None` for the emulator).
pub fn push_for_arch(
    trials: &mut Vec<libtest_mimic::Trial>,
    archs: Option<&[flashattn::kernels::registry::Arch]>,
    label: &str,
    arch: flashattn::kernels::registry::Arch,
    trial: libtest_mimic::Trial,
) {
    match archs {
        Some(a) if !a.contains(&arch) => {
            eprintln!("\n*** {label}: this device cannot run {arch:?} kernels: NOT RUN (reported as ignored) ***\n");
            trials.push(trial.with_ignored_flag(true));
        }
        _ => trials.push(trial),
    }
}

/// softmax_scale over the whole range the API accepts ([`flashattn::MAX_SCALE`]), either
/// sign: the default 1/sqrt(head_dim), zero (both signs), tiny (down to f32's subnormals),
/// the usual 0.01..2, and large up to the limit (a nearly hard max).
pub fn scale_strategy() -> impl proptest::strategy::Strategy<Value = Option<f32>> {
    use proptest::prelude::*;
    let signed =
        |lo: f32, hi: f32| (lo..hi, any::<bool>()).prop_map(|(e, neg): (f32, bool)| Some(if neg { -10f32.powf(e) } else { 10f32.powf(e) }));
    let max_exp = flashattn::MAX_SCALE.log10();
    prop_oneof![
        3 => Just(None),
        1 => prop_oneof![Just(Some(0.0f32)), Just(Some(-0.0f32))],
        1 => signed(-44.0, -6.0),
        4 => (0.01f32..2.0, any::<bool>()).prop_map(|(x, neg)| Some(if neg { -x } else { x })),
        2 => signed(0.3, max_exp),
    ]
}

/// Softcaps over the whole accepted range ([`flashattn::MIN_SOFTCAP`] to
/// [`flashattn::MAX_SOFTCAP`]): none in half the draws, else the usual 5 to 50, small ones
/// (down to the limit: every score capped to about 0, uniform weights), ones near the scores'
/// own size (0.1 to 5), and large ones (capping nothing).
pub fn softcap_strategy() -> impl proptest::strategy::Strategy<Value = Option<f32>> {
    use proptest::prelude::*;
    let pow = |lo: f32, hi: f32| (lo..hi).prop_map(|e: f32| Some(10f32.powf(e)));
    let (lo, hi) = (flashattn::MIN_SOFTCAP.log10(), flashattn::MAX_SOFTCAP.log10());
    prop_oneof![
        6 => Just(None),
        2 => (5f32..50.0).prop_map(Some),
        2 => pow(-1.0, 0.7),
        1 => prop_oneof![Just(Some(flashattn::MIN_SOFTCAP)), pow(lo, -1.0)],
        1 => prop_oneof![Just(Some(flashattn::MAX_SOFTCAP)), pow(1.7, hi)],
    ]
}

/// ALiBi in a quarter of the draws, its slopes `[heads]` or `[batch, heads]`.
pub fn alibi_strategy() -> impl proptest::strategy::Strategy<Value = Option<AlibiDraw>> {
    use proptest::prelude::*;
    prop_oneof![3 => Just(None), 1 => any::<bool>().prop_map(|per_batch| Some(AlibiDraw { per_batch, batch0: 0 }))]
}

/// Sliding windows, none in half the draws, else each side unbounded or from 0 (a row sees
/// its diagonal key only) past `max_seqlen` (as good as unbounded).
pub fn window_strategy(max_seqlen: usize) -> impl proptest::strategy::Strategy<Value = Window> {
    use proptest::prelude::*;
    let side = move || {
        let max = max_seqlen as u32 + 1;
        prop_oneof![1 => Just(None), 1 => Just(Some(0)), 3 => (0..=max).prop_map(Some), 1 => Just(Some(u32::MAX))]
    };
    prop_oneof![1 => Just(Window::NONE), 1 => (side(), side()).prop_map(|(left, right)| Window { left, right })]
}

/// Sliding windows over sequences of several hundred keys, for the per-variant GPU trials:
/// wide enough that for every tile size a block of query rows has key tiles its window's left
/// edge crosses (masked), then tiles every row sees whole (unmasked), then tiles its right
/// edge or the causal diagonal crosses (masked); causal and not, seqlen_q above and below
/// seqlen_k. head_dim 0: the variant's.
pub const WIDE_WINDOWS: [(AttnShape, bool, Window); 2] = [
    (
        AttnShape { batch: 1, seqlen_q: 640, seqlen_k: 700, heads_q: 2, heads_kv: 1, head_dim: 0 },
        true,
        Window { left: Some(500), right: None },
    ),
    (
        AttnShape { batch: 1, seqlen_q: 600, seqlen_k: 520, heads_q: 2, heads_kv: 1, head_dim: 0 },
        false,
        Window { left: Some(200), right: Some(150) },
    ),
];

/// NaN and infinities for [`WIDE_WINDOWS`] at head_dim `d`: sets of values in K and V at keys
/// spread over the sequence (left of most rows' windows, inside them, right of them); with
/// `backward` also in Q and dO.
pub fn wide_window_plants(d: usize, backward: bool) -> Vec<Vec<nonfinite::Plant>> {
    use nonfinite::{Input, Plant};
    // Element (row, head 0, column 3 mod d) of a [1, rows, heads, d] input with 1 KV head
    // (K, V) or 2 query heads (Q, dO).
    let kv = |key: u64| key * d as u64 + 3 % d as u64;
    let q = |row: u64| row * 2 * d as u64 + 5 % d as u64;
    let mut sets = vec![
        vec![Plant { input: Input::V, at: kv(40), value: f64::NAN }, Plant { input: Input::V, at: kv(300), value: f64::INFINITY }],
        vec![
            Plant { input: Input::K, at: kv(450), value: f64::NEG_INFINITY },
            Plant { input: Input::V, at: kv(150), value: f64::NEG_INFINITY },
        ],
    ];
    if backward {
        sets.push(vec![
            Plant { input: Input::Q, at: q(350), value: f64::NAN },
            Plant { input: Input::DO, at: q(500), value: f64::INFINITY },
        ]);
    }
    sets
}

/// A proptest strategy for forward cases whose problem size (b * hq * sq * sk * d) stays
/// under `budget`, so the f64 reference stays cheap; head_dim up to 8 `max_d_units`.
pub fn case_strategy(
    max_seqlen: usize,
    max_d_units: usize,
    max_heads_kv: usize,
    max_group: usize,
    max_batch: usize,
    budget: usize,
) -> impl proptest::strategy::Strategy<Value = Case> {
    use proptest::prelude::*;
    (
        1..=max_batch,
        1..=max_seqlen,
        1..=max_seqlen,
        1..=max_heads_kv,
        1..=max_group,
        // head_dim: a multiple of 8 (the usual sizes) or any size up to 8 max_d_units, even
        // and odd (rows not 16-byte aligned: the kernels' element-wise loads).
        prop_oneof![(1..=max_d_units).prop_map(|u| u * 8), 1..=max_d_units * 8],
        any::<bool>(),
        scale_strategy(),
        prop_oneof![Just(Dt::F32), Just(Dt::F16), Just(Dt::Bf16)],
        (any::<u64>(), window_strategy(max_seqlen), softcap_strategy(), proptest::bool::weighted(0.25), alibi_strategy()),
    )
        .prop_map(move |(batch, sq, sk, hkv, group, head_dim, causal, scale, dtype, (seed, window, softcap, sinks, alibi))| {
            let mut shape = AttnShape { batch, seqlen_q: sq, seqlen_k: sk, heads_q: hkv * group, heads_kv: hkv, head_dim };
            // Shrink the longer sequence until the problem fits the budget.
            while shape.batch * shape.heads_q * shape.seqlen_q * shape.seqlen_k * shape.head_dim > budget
                && shape.seqlen_q.max(shape.seqlen_k) > 1
            {
                if shape.seqlen_q >= shape.seqlen_k {
                    shape.seqlen_q = shape.seqlen_q.div_ceil(2)
                } else {
                    shape.seqlen_k = shape.seqlen_k.div_ceil(2)
                }
            }
            Case { shape, causal, softmax_scale: scale, dtype, seed, window, softcap, sinks, alibi }
        })
}

/// Runs the forward and then the backward of `case` on `fa` and compares dQ, dK, dV with the
/// f64 analytic gradients ([`flashattn::reference::attention_backward_f64`]), each within
/// twice the error of naive autograd-style attention in the same dtype plus one unit roundoff.
/// Gradient buffers are poisoned with NaN first. With `repeat`, runs the backward again and
/// requires bitwise identical gradients (determinism).
///
/// `saved`: the forward saves O's residual (`FwdOptions::save_residual`): on Hopper the
/// backward's D~ then comes from O + O_lo (`prep_residual`).
pub fn check_backward(fa: &FlashAttn, case: &Case, repeat: bool, saved: bool) -> Result<(), String> {
    check_backward_with(fa, case, repeat, None, saved)
}

/// As [`check_backward`], with the kernel family named (`Some("mma")`, `Some("simt")`: the
/// forward and the backward both run that family) or chosen automatically (`None`).
pub fn check_backward_with(fa: &FlashAttn, case: &Case, repeat: bool, kernel: Option<&'static str>, saved: bool) -> Result<(), String> {
    let r = match case.dtype {
        Dt::F32 => check_backward_typed::<f32>(fa, case, repeat, kernel, saved),
        Dt::F16 => check_backward_typed::<half::f16>(fa, case, repeat, kernel, saved),
        Dt::Bf16 => check_backward_typed::<half::bf16>(fa, case, repeat, kernel, saved),
    };
    let path = if saved { ", residual" } else { "" };
    r.map_err(|e| match kernel {
        Some(k) => format!("[kernel {k}{path}] {e}"),
        None => format!("[auto{path}] {e}"),
    })
}

fn check_backward_typed<T: Dtype>(
    fa: &FlashAttn,
    case: &Case,
    repeat: bool,
    kernel: Option<&'static str>,
    saved: bool,
) -> Result<(), String> {
    use flashattn::BwdOutput;
    let s = case.shape;
    // With `repeat`, determinism is asked for; a backward-only family (`mma_atomic`) runs
    // after the automatically chosen forward.
    let e = |e: flashattn::Error| format!("{case}: {e}");
    let attn = case.attention_on(fa).map_err(e)?;
    let opts = BwdOptions { kernel: kernel.filter(|k| flashattn::BwdFamily::from_name(k).is_some()), deterministic: repeat };
    let fwd_opts =
        FwdOptions { kernel: kernel.filter(|k| flashattn::FwdFamily::from_name(k).is_some()), save_residual: saved, ..Default::default() };
    let mut rng = Rng::new(case.seed);
    let (nq, nk) = (s.batch * s.seqlen_q * s.heads_q * s.head_dim, s.batch * s.seqlen_k * s.heads_kv * s.head_dim);
    let (q, k, v, d_o): (Vec<T>, Vec<T>, Vec<T>, Vec<T>) = (rng.tensor(nq), rng.tensor(nk), rng.tensor(nk), rng.tensor(nq));
    let (qd, kd, vd, dod) = (
        fa.upload(&q, &s.q_shape()).map_err(e)?,
        fa.upload(&k, &s.kv_shape()).map_err(e)?,
        fa.upload(&v, &s.kv_shape()).map_err(e)?,
        fa.upload(&d_o, &s.q_shape()).map_err(e)?,
    );
    let fwd = fa.forward(&qd, &kd, &vd, &attn, &fwd_opts).map_err(e)?;
    if saved {
        // The residual is there exactly when the forward's kernel writes it, and each element
        // is O's rounding error: at most half a unit in the last place of O.
        let family = flashattn::select_variant(T::DTYPE, s.head_dim, &fwd_opts, &fa.archs()).map_err(e)?.family;
        let writes = T::DTYPE != flashattn::kernels::dtype::DType::F32 && family.desc().writes_residual;
        match (fwd.o_lo(), writes) {
            (Some(lo), true) => {
                let (o, lo) = (fa.download(fwd.o()).map_err(e)?, fa.download(lo).map_err(e)?);
                if let Some(i) = (0..o.len()).find(|&i| !within(lo[i].to_f64().abs(), o[i].to_f64().abs() * T::UNIT_ROUNDOFF + 1e-7)) {
                    return Err(format!(
                        "{case}: O residual {} at element {i} is not a rounding error of O = {}",
                        lo[i].to_f64(),
                        o[i].to_f64()
                    ));
                }
            }
            (None, false) => {}
            (got, _) => {
                return Err(format!(
                    "{case}: forward family {family}: O residual {} though it {} write one",
                    if got.is_some() { "returned" } else { "missing" },
                    if writes { "does" } else { "does not" }
                ));
            }
        }
    }
    // dQ, dK, dV (and dsinks), each poisoned with NaN.
    let run = || -> Result<Vec<Vec<f64>>, String> {
        let mut g = BwdOutput {
            dq: fa.full(T::nan(), &s.q_shape()).map_err(e)?,
            dk: fa.full(T::nan(), &s.kv_shape()).map_err(e)?,
            dv: fa.full(T::nan(), &s.kv_shape()).map_err(e)?,
            dsinks: if case.sinks { Some(fa.full(f32::NAN, &[s.heads_q]).map_err(e)?) } else { None },
        };
        fa.backward_into(&qd, &kd, &vd, &fwd, &dod, &opts, &mut g).map_err(e)?;
        let w =
            |t: &flashattn::Tensor<T>| -> Result<Vec<f64>, String> { Ok(fa.download(t).map_err(e)?.iter().map(|x| x.to_f64()).collect()) };
        let mut got = vec![w(&g.dq)?, w(&g.dk)?, w(&g.dv)?];
        if let Some(ds) = &g.dsinks {
            got.push(fa.download(ds).map_err(e)?.iter().map(|&x| x as f64).collect());
        }
        Ok(got)
    };
    let got = run()?;
    check_grads(case, &q, &k, &v, &d_o, &got)?;
    if repeat {
        for round in 0..3 {
            let again = run()?;
            for ((name, a), b) in ["dQ", "dK", "dV", "dsinks"].into_iter().zip(&got).zip(&again) {
                if a.iter().zip(b.iter()).any(|(x, y)| x.to_bits() != y.to_bits()) {
                    return Err(format!("{case}: {name} differs bitwise on repeat {round}"));
                }
            }
        }
    }
    Ok(())
}

/// One gradient's references: (name, exact, naive, floor).
pub type GradRef<'a> = (&'static str, &'a [f64], &'a [f64], &'a [f64]);

/// What a backward is measured against: the f64 gradients, naive autograd's in the case's
/// dtype, and the f32 recomputation bound ([`flashattn::reference::backward_recompute_bound`]).
pub struct GradRefs {
    pub exact: flashattn::reference::RefGrads,
    pub naive: flashattn::reference::RefGrads,
    pub floor: flashattn::reference::RefGrads,
}

impl GradRefs {
    /// The references of `case`'s inputs and dO.
    pub fn new<T: Dtype>(case: &Case, q: &[T], k: &[T], v: &[T], d_o: &[T]) -> GradRefs {
        use flashattn::reference::{attention_backward_f64, backward_recompute_bound_t, naive_backward};
        let (s, attn) = (case.shape, case.attention());
        let w = |x: &[T]| x.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
        GradRefs {
            exact: attention_backward_f64(&w(q), &w(k), &w(v), &w(d_o), &s, &attn),
            naive: naive_backward(q, k, v, d_o, &s, &attn),
            floor: backward_recompute_bound_t(&w(q), &w(k), &w(v), &w(d_o), &s, &attn, T::UNIT_ROUNDOFF),
        }
    }

    /// dQ, dK, dV (and with sinks dsinks) by name: (name, exact, naive, floor).
    pub fn each(&self) -> Vec<GradRef<'_>> {
        let (e, n, f) = (&self.exact, &self.naive, &self.floor);
        let mut all = vec![("dQ", &e.dq[..], &n.dq[..], &f.dq[..]), ("dK", &e.dk, &n.dk, &f.dk), ("dV", &e.dv, &n.dv, &f.dv)];
        if !e.dsinks.is_empty() {
            all.push(("dsinks", &e.dsinks, &n.dsinks, &f.dsinks));
        }
        all
    }

    /// The relative L2 bar of a gradient in dtype `T`: twice naive attention's error (and a
    /// unit roundoff), plus the f32 recomputation of S and dP that naive attention, storing P,
    /// does not incur (as a share of the exact gradient's norm).
    pub fn bar<T: Dtype>(exact: &[f64], naive: &[f64], floor: &[f64]) -> f64 {
        tolerance::<T>(rel_l2(naive, exact)) + l2(floor) / l2(exact)
    }
}

/// Compares dQ, dK, dV (contiguous, as f64) for `case`'s inputs and dO with the f64
/// gradients ([`check_backward`]'s rules).
pub fn check_grads<T: Dtype>(case: &Case, q: &[T], k: &[T], v: &[T], d_o: &[T], got: &[Vec<f64>]) -> Result<(), String> {
    check_grads_against(case, q, k, v, d_o, &GradRefs::new(case, q, k, v, d_o), got)
}

/// [`check_grads`] against references already computed for these inputs.
pub fn check_grads_against<T: Dtype>(
    case: &Case,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    refs: &GradRefs,
    got: &[Vec<f64>],
) -> Result<(), String> {
    let (s, attn) = (case.shape, case.attention());
    let each = refs.each();
    if each.len() != got.len() {
        return Err(format!("{case}: {} gradients returned, {} expected", got.len(), each.len()));
    }
    for ((name, ex, nv, fl), g) in each.into_iter().zip(got) {
        let unwritten = g.iter().filter(|x| x.is_nan()).count();
        if unwritten > 0 {
            return Err(format!("{case}: {name}: {unwritten} elements still NaN"));
        }
        if ex.iter().all(|&x| x == 0.0) {
            // With a single key (seqlen_k = 1) P = 1, dS = dP - D = 0: dQ and dK vanish exactly
            // and a relative error is undefined. The kernels compute dS as a difference of two
            // terms of size |D| = |dO . O| each carrying one rounding to T, so the bar is
            // absolute: 4 unit roundoffs of T times |scale| * max_i |dO_i| |V| * max |K|.
            let amax = |x: &[T]| x.iter().fold(0f64, |m, e| m.max(e.to_f64().abs()));
            let row = |x: &[T], r: usize| -> f64 { x[r * s.head_dim..(r + 1) * s.head_dim].iter().map(|e| e.to_f64().abs()).sum() };
            let dov = (0..d_o.len() / s.head_dim).map(|r| row(d_o, r)).fold(0f64, f64::max) * amax(v);
            let bound = 4.0 * T::UNIT_ROUNDOFF * (attn.scale(s.head_dim) as f64).abs() * dov * amax(k).max(amax(q));
            let worst = g.iter().fold(0f64, |m, x| m.max(x.abs()));
            if !within(worst, bound) {
                return Err(format!("{case}: {name} is exactly 0; got max |{name}| {worst:.3e} (bound {bound:.3e})"));
            }
            continue;
        }
        // Each element is a sum of at most `terms` products (flushed below f32's normal range).
        let terms = match name {
            "dQ" => s.seqlen_k,
            "dsinks" => s.batch * s.seqlen_q,
            _ => s.seqlen_q * (s.heads_q / s.heads_kv.max(1)),
        };
        let (err, tol) = (rel_l2(g, ex), GradRefs::bar::<T>(ex, nv, fl) + ftz_slack(terms, ex));
        if !within(err, tol) {
            return Err(format!("{case}: {name} rel err {err:.3e} (tol {tol:.3e})"));
        }
    }
    Ok(())
}

/// The relative error a gradient `exact` may show from f32 results below the normal range
/// flushed to 0 (FTZ, as the kernels' f32 arithmetic runs on a GPU) when each of its elements
/// is a sum of at most `terms` products, each of which may lose up to `f32::MIN_POSITIVE`
/// that way: an exact dsinks of 2e-41 (a sink of -83 against its row's scores) comes back 0.
/// Negligible beside any gradient of normal size.
pub fn ftz_slack(terms: usize, exact: &[f64]) -> f64 {
    terms as f64 * f32::MIN_POSITIVE as f64 * (exact.len() as f64).sqrt() / l2(exact)
}

/// Whether a measured error is within its bar: false for a NaN error (`err <= bar` is).
pub fn within(err: f64, bar: f64) -> bool {
    err <= bar
}

/// `total` cases split into shards of at most `size`, each run as a trial of its own (the
/// harness runs trials in parallel, so a GPU run of thousands of cases takes minutes, not an
/// hour of one thread's f64 references).
pub fn shards(total: usize, size: usize) -> Vec<usize> {
    let n = total.div_ceil(size.max(1));
    (0..n).map(|i| (total - i * total / n) - (total - (i + 1) * total / n)).filter(|&c| c > 0).collect()
}

/// A `usize` from the environment, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
