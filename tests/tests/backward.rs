//! Backward pass against the f64 analytic gradients: property tests over random shapes,
//! options and dtypes (automatic selection: for f16/bf16 the Hopper kernels up to head_dim
//! 128, the mma.sync ones for the other multiples of 8 up to 256, SIMT otherwise; plus cases
//! of the other families by name for f16/bf16), every
//! registered variant by name, named edge cases of both families and a determinism check
//! (bitwise identical gradients on repeated runs), on the CPU emulator always and on the GPU
//! when there is one (ignored, loudly, when not; failed when REQUIRE_GPU=1).

use flashattn::kernels::registry::{BWD_FAMILIES, BWD_VARIANTS, BwdFamily, Entry, Pass};
use flashattn::{AttnShape, FlashAttn, Window};
use flashattn_tests::{
    AlibiDraw, BackendKind, Case, Dt, WIDE_WINDOWS, case_strategy, check_backward, check_backward_with, env_usize, gpu_trials, nonfinite,
    push_for_arch, shards, wide_window_plants,
};
use libtest_mimic::{Arguments, Failed, Trial};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::Arc;

/// A trial's body, given the backend it runs on.
type TrialBody = Box<dyn FnOnce(&FlashAttn) -> Result<(), Failed> + Send>;

fn shape(batch: usize, seqlen_q: usize, seqlen_k: usize, heads_q: usize, heads_kv: usize, head_dim: usize) -> AttnShape {
    AttnShape { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim }
}

/// A case `family` serves: head_dim rounded up to a multiple of 8 for the families that
/// take only those (`BwdFamilyDesc::aligned_only`; automatic selection takes every head_dim);
/// no sliding window, softcap or ALiBi for those without a general entry (`BwdFamily::takes`:
/// the atomic families), no softcap, ALiBi or sinks for those whose kernels do not apply them
/// (`BwdFamilyDesc::softcap`, `alibi`, `alibi_softcap`, `sinks`).
fn for_family(family: Option<&str>, c: Case) -> Case {
    let windowless = family.and_then(BwdFamily::from_name).is_some_and(|f| !f.takes(Entry::Window));
    let c = if windowless { Case { window: Default::default(), softcap: None, alibi: None, ..c } } else { c };
    let c = match family.and_then(BwdFamily::from_name).is_some_and(|f| !f.desc().softcap) {
        true => Case { softcap: None, ..c },
        false => c,
    };
    let c = match family.and_then(BwdFamily::from_name).is_some_and(|f| !f.desc().alibi) {
        true => Case { alibi: None, ..c },
        false => c,
    };
    let c = match family.and_then(BwdFamily::from_name).is_some_and(|f| !f.desc().alibi_softcap) && c.softcap.is_some() {
        true => Case { alibi: None, ..c },
        false => c,
    };
    let c = match family.and_then(BwdFamily::from_name).is_some_and(|f| !f.desc().sinks) {
        true => Case { sinks: false, ..c },
        false => c,
    };
    match family {
        Some(f) if BwdFamily::from_name(f).is_some_and(|f| f.desc().aligned_only) => {
            Case { shape: AttnShape { head_dim: c.shape.head_dim.next_multiple_of(8), ..c.shape }, ..c }
        }
        _ => c,
    }
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

fn trials_for(kind: BackendKind, fa: Option<Arc<FlashAttn>>, unavailable: Option<String>) -> Vec<Trial> {
    let tag = if kind == BackendKind::Gpu { "gpu" } else { "emulator" };
    let mk = |name: String, f: TrialBody| {
        let (fa, unavailable) = (fa.clone(), unavailable.clone());
        Trial::test(name, move || match (fa, unavailable) {
            (Some(fa), _) => f(&fa),
            (None, Some(why)) => Err(format!("REQUIRE_GPU=1 but no GPU: {why}").into()),
            (None, None) => Err("no backend".into()),
        })
    };
    let mut trials = Vec::new();
    // Random cases, FLASHATTN_GPU_BWD_CASES (GPU) or FLASHATTN_EMU_BWD_CASES (emulator) in
    // all, shared among the configurations below by weight, each in shards that run in
    // parallel. (family: None for automatic selection; saved: the forward saves O's residual;
    // few_keys: causal with seqlen_k <= 3.)
    // - Automatic selection, with the residual (on Hopper D~ from O + O_lo) and, for the
    //   16-bit types, without it (the default: D~ from O).
    // - The other families by name for the 16-bit types, which select the Hopper kernels
    //   (`wgmma`) automatically where the device has them (the emulator does): the mma.sync
    //   ones (the choice elsewhere), SIMT and the atomic tensor-core kernels (`wgmma_atomic`
    //   also with the residual, which changes its first pass).
    // - Few visible keys, any scale: the regime where dS of a row's large weights must cancel
    //   exactly (FA2's D = rowsum(dO * O) failed here in 1 case in 7; the Hopper dQ kernel's
    //   correction, `bwd_wgmma`, is what passes it: with a dominant key alone, K_dom instead
    //   of B_i, it still missed by 1.1x within 1200 cases). f32, the SIMT kernel, is left out:
    //   with one query head the whole gradient can come from a single row of 2-3 dS values,
    //   naive's error is then now and then far below one unit roundoff by luck (0.25 u seen),
    //   and the kernel's error of 1-3 u misses twice it in about 1 case in 200; the two f32
    //   edge cases below cover the cancellation.
    struct Props {
        family: Option<&'static str>,
        dtype: Dt,
        saved: bool,
        few_keys: bool,
        weight: usize,
    }
    let p = |family, dtype, saved, few_keys, weight| Props { family, dtype, saved, few_keys, weight };
    let mut configs = vec![];
    for (dtype, saved) in [(Dt::F32, true), (Dt::F16, true), (Dt::Bf16, true), (Dt::F16, false), (Dt::Bf16, false)] {
        configs.push(p(None, dtype, saved, false, 2));
    }
    for (family, saved) in [("mma", false), ("simt", false), ("mma_atomic", false), ("wgmma_atomic", false), ("wgmma_atomic", true)] {
        for dtype in [Dt::F16, Dt::Bf16] {
            configs.push(p(Some(family), dtype, saved, false, 1));
        }
    }
    for (family, saved) in [(None, false), (None, true), (Some("mma_atomic"), false), (Some("wgmma_atomic"), false)] {
        for dtype in [Dt::F16, Dt::Bf16] {
            configs.push(p(family, dtype, saved, true, 6));
        }
    }
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_BWD_CASES", 4000), 60),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_BWD_CASES", 272), 8),
    };
    let weights: usize = configs.iter().map(|c| c.weight).sum();
    for c in configs {
        let (family, dtype, saved, few_keys) = (c.family, c.dtype, c.saved, c.few_keys);
        let kind_name = match (few_keys, family) {
            (false, None) => format!("props{}", if saved { "" } else { "_no_residual" }),
            (false, Some(f)) => format!("props_{f}{}", if saved { "_residual" } else { "" }),
            (true, None) => format!("props_few_keys{}", if saved { "_residual" } else { "" }),
            (true, Some(f)) => format!("props_few_keys_{f}"),
        };
        // `mma_atomic` serves head_dim <= 128 (16 units of 8), the others up to 256.
        let d_units = if family == Some("mma_atomic") { 16 } else { 32 };
        let (max_s, max_d, max_hkv, max_group, max_b, budget) = match (kind, few_keys) {
            (_, true) => (50, d_units, 2, 2, 1, 60_000),
            (BackendKind::Gpu, false) => (200, d_units, 4, 4, 2, 2_000_000),
            (BackendKind::Emulator, false) => (50, d_units, 2, 2, 2, 60_000),
        };
        for (i, cases) in shards(total * c.weight / weights, size).into_iter().enumerate() {
            trials.push(mk(
                format!("{tag}::{kind_name}::{dtype:?}::{i:03}").to_lowercase(),
                Box::new(move |fa| {
                    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                    let strategy = case_strategy(max_s, max_d, max_hkv, max_group, max_b, budget).prop_map(move |c| {
                        let c = for_family(family, c);
                        match few_keys {
                            true => Case { dtype, causal: true, shape: AttnShape { seqlen_k: 1 + c.shape.seqlen_k % 3, ..c.shape }, ..c },
                            false => Case { dtype, ..c },
                        }
                    });
                    runner
                        .run(&strategy, |case| check_backward_with(fa, &case, false, family, saved).map_err(TestCaseError::fail))
                        .map_err(|e| Failed::from(format!("{e}")))
                }),
            ));
        }
    }
    // NaN and infinities planted in Q, K, V, dO (README, "NaN and Inf"): every family, with
    // and without the forward's residual, the rule checked element by element
    // (FLASHATTN_GPU_NONFINITE_BWD_CASES / _EMU_ in all).
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_NONFINITE_BWD_CASES", 1200), 60),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_NONFINITE_BWD_CASES", 56), 8),
    };
    let families: [(Option<&'static str>, bool, &[Dt], usize); 7] = [
        (None, false, &[Dt::F32, Dt::F16, Dt::Bf16], 32),
        (None, true, &[Dt::F16, Dt::Bf16], 16),
        (Some("mma"), false, &[Dt::F16, Dt::Bf16], 32),
        (Some("simt"), false, &[Dt::F32, Dt::F16, Dt::Bf16], 32),
        (Some("mma_atomic"), false, &[Dt::F16, Dt::Bf16], 16),
        (Some("wgmma_atomic"), false, &[Dt::F16, Dt::Bf16], 32),
        (Some("wgmma_atomic"), true, &[Dt::F16, Dt::Bf16], 32),
    ];
    let per = shards(total / families.len(), size);
    for (family, saved, dtypes, d_units) in families {
        for (i, &cases) in per.iter().enumerate() {
            let dtype = dtypes[i % dtypes.len()];
            let name =
                format!("{tag}::props_nonfinite_{}{}::{dtype:?}::{i:03}", family.unwrap_or("auto"), if saved { "_residual" } else { "" })
                    .to_lowercase();
            let limits = match kind {
                BackendKind::Gpu => (150, 4, 4, 2, 1_000_000),
                BackendKind::Emulator => (50, 2, 2, 2, 40_000),
            };
            trials.push(mk(
                name,
                Box::new(move |fa| {
                    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                    let (s, hkv, g, b, budget) = limits;
                    let strategy = (
                        case_strategy(s, d_units, hkv, g, b, budget).prop_map(move |c| for_family(family, c)),
                        nonfinite::plants_strategy(true),
                    );
                    runner
                        .run(&strategy, |(c, plants)| {
                            nonfinite::check_backward(fa, &Case { dtype, ..c }, &plants, family, saved).map_err(TestCaseError::fail)
                        })
                        .map_err(|e| Failed::from(format!("{e}")))
                }),
            ));
        }
    }
    // Every registered variant set (a family's passes, with and without the forward's O
    // residual where that changes them), by family name, at the largest head_dim of each
    // variant of its first pass other than `prep` (a family's passes serve the same head
    // dims); a GPU without the variant's architecture (sm_90a kernels off Hopper) reports it
    // ignored.
    let archs = fa.as_ref().map(|f| f.archs());
    let lead = |f: BwdFamily, saved: bool| f.passes(saved).iter().copied().find(|p| !matches!(p, Pass::Prep | Pass::PrepResidual));
    let sets = BWD_VARIANTS.iter().flat_map(|v| [(v, false), (v, true)]);
    for (v, saved) in
        sets.filter(|&(v, saved)| lead(v.family, saved) == Some(v.pass) && (!saved || v.family.passes(true) != v.family.passes(false)))
    {
        let dtype = Dt::of(v.dtype);
        // The largest head_dim the variant serves.
        let d = v.head_dims().1 as usize;
        let case = Case {
            shape: shape(1, 37, 70, 2, 1, d),
            causal: true,
            softmax_scale: None,
            dtype,
            seed: 0,
            window: Default::default(),
            softcap: None,
            sinks: false,
            alibi: None,
        };
        let (family, name) = (v.family.name(), v.name);
        // Also with attention sinks, by the families that take them.
        let sinks = if v.family.desc().sinks { &[false, true][..] } else { &[false] };
        // The sets with the residual apart (the same lead variant, other passes).
        let tail = if saved { "_residual" } else { "" };
        let trial = mk(
            format!("{tag}::variant{tail}::{name}"),
            Box::new(move |fa| {
                let opts = flashattn::BwdOptions { kernel: Some(family), ..Default::default() };
                let got = flashattn::select_bwd_variants(v.dtype, d, &opts, &fa.archs(), saved, Entry::Plain, &Default::default())
                    .map_err(|e| Failed::from(e.to_string()))?;
                let mine = got.iter().find(|g| g.pass == v.pass).map(|g| g.name);
                if mine != Some(name) || got.iter().any(|g| g.family != v.family) {
                    let names = got.iter().map(|g| g.name).collect::<Vec<_>>().join(", ");
                    return Err(format!("head_dim {d} selects {names} instead of {name}").into());
                }
                for &sinks in sinks {
                    check_backward_with(fa, &Case { seed: fresh_seed(), sinks, ..case }, false, Some(family), saved)
                        .map_err(Failed::from)?;
                }
                Ok(())
            }),
        );
        push_for_arch(&mut trials, archs.as_deref(), &format!("{tag}::variant{tail}::{name}"), v.arch(), trial);
        // Sliding windows, by the families that take them (the windowed entry of every pass):
        // key blocks whose first query tiles are skipped, query blocks whose first key tile is,
        // the tiles its edges cross masked, rows that see no key (seqlen_q > seqlen_k), causal and
        // not.
        if !v.family.takes(Entry::Window) {
            continue;
        }
        let desc = v.family.desc();
        let (capped, sinks, alibi, both) = (desc.softcap, desc.sinks, desc.alibi, desc.alibi_softcap);
        let windows = [
            (shape(1, 100, 150, 2, 1, d), true, Window { left: Some(30), right: None }),
            (shape(1, 140, 90, 2, 1, d), false, Window { left: Some(3), right: Some(20) }),
        ];
        let trial = mk(
            format!("{tag}::window{tail}::{name}"),
            Box::new(move |fa| {
                for (s, causal, window) in windows {
                    // A softcap on the causal window, sinks on the other (rows that see no key
                    // among its rows), ALiBi on both (with the softcap where the family takes
                    // the two together), by the families that apply them.
                    let softcap = if causal && capped { Some(2.0) } else { None };
                    let sinks = !causal && sinks;
                    let alibi = (alibi && (softcap.is_none() || both)).then_some(AlibiDraw { per_batch: causal, batch0: 0 });
                    let case = Case { shape: s, causal, softmax_scale: None, dtype, seed: fresh_seed(), window, softcap, sinks, alibi };
                    check_backward_with(fa, &case, false, Some(family), saved).map_err(Failed::from)?;
                }
                Ok(())
            }),
        );
        push_for_arch(&mut trials, archs.as_deref(), &format!("{tag}::window{tail}::{name}"), v.arch(), trial);
        // On the GPU, windows with tiles that run unmasked between masked ones, in both loops
        // (`flashattn_tests::WIDE_WINDOWS`), then with NaN and infinities planted on both
        // sides of them and in them.
        if kind != BackendKind::Gpu {
            continue;
        }
        let trial = mk(
            format!("{tag}::window_wide{tail}::{name}"),
            Box::new(move |fa| {
                for (s, causal, window) in WIDE_WINDOWS {
                    let case = Case {
                        shape: AttnShape { head_dim: d, ..s },
                        causal,
                        softmax_scale: None,
                        dtype,
                        seed: fresh_seed(),
                        window,
                        softcap: None,
                        sinks: false,
                        alibi: None,
                    };
                    check_backward_with(fa, &case, false, Some(family), saved).map_err(Failed::from)?;
                    for plants in wide_window_plants(d, true) {
                        nonfinite::check_backward(fa, &case, &plants, Some(family), saved).map_err(Failed::from)?;
                    }
                }
                Ok(())
            }),
        );
        push_for_arch(&mut trials, archs.as_deref(), &format!("{tag}::window_wide{tail}::{name}"), v.arch(), trial);
    }
    let edges = [
        ("single_query_single_key", shape(1, 1, 1, 1, 1, 8), false),
        ("causal_more_queries_than_keys_fully_masked_rows", shape(1, 40, 17, 2, 1, 64), true),
        ("causal_fewer_queries_than_keys", shape(1, 20, 70, 2, 2, 32), true),
        ("gqa_4_to_1", shape(1, 33, 45, 4, 1, 64), false),
        ("head_dim_136", shape(1, 21, 30, 2, 1, 136), true),
        ("head_dim_256", shape(1, 19, 23, 1, 1, 256), false),
        // Tensor-core path (f16, bf16): several query and key blocks, ragged ends, GQA.
        ("ragged_several_blocks_gqa_2_to_1", shape(1, 131, 150, 4, 2, 64), true),
        ("ragged_noncausal", shape(2, 70, 67, 2, 2, 32), false),
        ("causal_more_queries_than_keys_several_blocks", shape(1, 150, 70, 2, 2, 64), true),
        ("padded_head_dim_40", shape(1, 45, 38, 2, 1, 40), true),
        ("padded_head_dim_72", shape(1, 30, 41, 2, 1, 72), false),
        ("padded_head_dim_120", shape(1, 33, 29, 2, 2, 120), true),
        ("head_dim_128_causal", shape(1, 40, 75, 2, 1, 128), true),
        // head_dims that are not multiples of 8 (rows not 16-byte aligned).
        ("head_dim_1", shape(1, 33, 41, 2, 1, 1), true),
        ("head_dim_7", shape(1, 30, 35, 2, 2, 7), false),
        ("head_dim_59", shape(1, 70, 66, 2, 1, 59), true),
        ("head_dim_111", shape(1, 65, 80, 4, 2, 111), false),
        ("head_dim_255", shape(1, 19, 23, 1, 1, 255), true),
        ("seqlen_q_1", shape(1, 1, 70, 2, 1, 64), true),
        ("seqlen_k_1", shape(1, 70, 1, 2, 1, 64), false),
    ];
    // Each with the forward's O residual and, for the 16-bit types, without it.
    let with_and_without = [(Dt::F32, true), (Dt::F16, true), (Dt::Bf16, true), (Dt::F16, false), (Dt::Bf16, false)];
    let suffix = |saved: bool| if saved { "" } else { "_no_residual" };
    // Every edge trial below by name, each run in every dtype, with and without the residual.
    let edge = |shape, causal, softmax_scale, softcap| Case {
        shape,
        causal,
        softmax_scale,
        dtype: Dt::F32,
        seed: 0,
        window: Default::default(),
        softcap,
        sinks: false,
        alibi: None,
    };
    let mut edge_cases: Vec<(&str, Case)> = edges.into_iter().map(|(name, s, causal)| (name, edge(s, causal, None, None))).collect();
    // Attention sinks: rows that see no key (their gradient terms 0), a single key (its dS no
    // longer 0: the sink takes part of the weight), GQA, several blocks.
    let sinks = [
        ("sinks_causal_fully_masked_rows", shape(1, 40, 17, 2, 1, 64), true),
        ("sinks_seqlen_k_1", shape(1, 70, 1, 2, 1, 64), false),
        // One key of small weight beside a large sink, d = 4 (dP small beside |dO| |V|): the
        // Hopper dQ kernel once took a key as hot only where P > 1/8 and left these rows to
        // FA2's D error (dQ 1.04e-2 vs 6.5e-3 in `props_few_keys`, bf16, sq 4 sk 1 d 4).
        ("sinks_seqlen_k_1_head_dim_4", shape(1, 40, 1, 2, 1, 4), false),
        ("sinks_ragged_several_blocks_gqa_2_to_1", shape(1, 131, 150, 4, 2, 64), true),
    ];
    edge_cases.extend(sinks.map(|(name, s, causal)| (name, Case { sinks: true, ..edge(s, causal, None, None) })));
    // A negative scale with causal masking (the Hopper dK/dV kernel once masked the raw
    // scores with -inf before scaling them: with scale < 0 they became +inf and dK, dV NaN),
    // square and ragged, and the other corners of the scale range.
    let scaled = [
        ("negative_scale_causal_64", shape(1, 64, 64, 2, 2, 128), -0.2),
        ("negative_scale_causal_300", shape(1, 300, 300, 2, 1, 64), -1.0),
        ("negative_scale_causal_64x300", shape(1, 64, 300, 2, 2, 128), -0.2),
        ("negative_scale_causal_300x64", shape(1, 300, 64, 2, 1, 96), -1.0),
        ("zero_scale_causal", shape(1, 70, 90, 2, 1, 64), 0.0),
        ("large_scale_causal", shape(1, 70, 90, 2, 1, 64), 3000.0),
        ("large_negative_scale_causal", shape(1, 90, 70, 2, 1, 128), -flashattn::MAX_SCALE),
    ];
    edge_cases.extend(scaled.map(|(name, s, scale)| (name, edge(s, true, Some(scale), None))));
    // Rows that see one to three keys (dS of a row's only key must come out exactly 0), on
    // the tensor-core path (f16, bf16) and the SIMT one (f32: before D_i was taken relative to
    // a pivot, see `bwd_simt`, it missed the bar here in about 1 run in 12, by up to 1.8x, on
    // dQ and dK).
    edge_cases.push(("causal_two_keys", edge(shape(1, 26, 2, 2, 1, 112), true, None, None)));
    edge_cases.push(("causal_three_keys", edge(shape(1, 39, 3, 2, 1, 40), true, None, None)));
    // Peaked softmax over several key tiles (scale 1.5, d 64: most rows have a key with P >
    // 1/8, in any of the four key tiles): the Hopper dQ kernel's hot-tile pass over many tiles.
    edge_cases.push(("peaked_many_key_tiles", edge(shape(1, 70, 250, 2, 1, 64), false, Some(1.5), None)));
    // A softcap that saturates most scores (scale 4, cap 3: tanh' near 0 for most pairs, the
    // row max shared by several keys), causal, over several key tiles.
    edge_cases.push(("softcap_saturated", edge(shape(1, 70, 250, 2, 1, 64), true, Some(4.0), Some(3.0))));
    for (name, case) in edge_cases {
        for (dtype, saved) in with_and_without {
            let case = Case { dtype, ..case };
            trials.push(mk(
                format!("{tag}::edge{}::{name}::{dtype:?}", suffix(saved)).to_lowercase(),
                Box::new(move |fa| check_backward(fa, &Case { seed: fresh_seed(), ..case }, false, saved).map_err(Failed::from)),
            ));
        }
    }
    // An infinite query element with a softcap, by every family that takes one, with and
    // without the residual: the capped scores of its row stay finite (+-cap), so its row and
    // every gradient are finite. On masked tiles (causal, ragged) too: the Hopper dK/dV kernel
    // once cleaned Q of infinities before S^T there, which made those scores 0 (finite dV
    // off by 0.99 on an H100; the random planted cases rarely drew a softcap).
    let capped = BWD_FAMILIES.iter().filter(|f| f.softcap).map(|f| f.name);
    for family in capped {
        for (dtype, saved) in with_and_without.into_iter().filter(|&(dt, _)| dt != Dt::F32 || family == "simt") {
            trials.push(mk(
                format!("{tag}::edge{}::softcap_inf_q::{family}::{dtype:?}", suffix(saved)).to_lowercase(),
                Box::new(move |fa| {
                    let shapes = [(shape(1, 70, 90, 2, 1, 64), true), (shape(1, 45, 33, 2, 2, 32), false)];
                    // At the largest cap the infinite row's scores are +-1e8, beyond what the
                    // f32 LSE the backward recomputes P from can resolve: the dV of the keys
                    // it sees is left out (`nonfinite::check_backward`), the rest checked.
                    let caps = [5.0, flashattn::MAX_SOFTCAP];
                    for ((s, causal), &cap) in shapes.into_iter().flat_map(|x| caps.iter().map(move |c| (x, c))) {
                        let case = Case { dtype, seed: fresh_seed(), softcap: Some(cap), ..edge(s, causal, None, None) };
                        for value in [f64::INFINITY, f64::NEG_INFINITY] {
                            // Row 0's first element, and an element of a row in the middle.
                            for at in [0, 37 * s.head_dim as u64 + 5] {
                                let plants = [nonfinite::Plant { input: nonfinite::Input::Q, at, value }];
                                nonfinite::check_backward(fa, &case, &plants, Some(family), saved).map_err(Failed::from)?;
                            }
                        }
                    }
                    Ok(())
                }),
            ));
        }
    }
    for (dtype, saved) in with_and_without {
        let case = Case {
            shape: shape(2, 45, 70, 4, 2, 64),
            causal: true,
            softmax_scale: None,
            dtype,
            seed: 0,
            window: Default::default(),
            softcap: None,
            sinks: false,
            alibi: None,
        };
        trials.push(mk(
            format!("{tag}::deterministic{}::{dtype:?}", suffix(saved)).to_lowercase(),
            Box::new(move |fa| check_backward(fa, &Case { seed: fresh_seed(), ..case }, true, saved).map_err(Failed::from)),
        ));
    }
    // The tensor-core path with K/V re-read from shared memory (head_dim 128), GQA 2:1; and
    // with warp pairs splitting D (the mma kernels above 128: d = 256 exactly and 200 padded,
    // several query and key blocks, causal).
    for (d, sq, sk, causal) in [(128, 70, 45, false), (256, 70, 80, true), (200, 80, 66, true)] {
        for (dtype, saved) in with_and_without.into_iter().filter(|&(dt, _)| dt != Dt::F32) {
            let case = Case {
                shape: shape(1, sq, sk, 4, 2, d),
                causal,
                softmax_scale: None,
                dtype,
                seed: 0,
                window: Default::default(),
                softcap: None,
                sinks: false,
                alibi: None,
            };
            trials.push(mk(
                format!("{tag}::deterministic_d{d}{}::{dtype:?}", suffix(saved)).to_lowercase(),
                Box::new(move |fa| check_backward(fa, &Case { seed: fresh_seed(), ..case }, true, saved).map_err(Failed::from)),
            ));
        }
    }
    trials
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = trials_for(BackendKind::Emulator, Some(Arc::new(FlashAttn::emulator())), None);
    trials.extend(gpu_trials("GPU backward tests", |fa, why| trials_for(BackendKind::Gpu, fa, why)));
    libtest_mimic::run(&args, trials).exit();
}
