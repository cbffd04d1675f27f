//! Forward pass against the f64 reference: property tests over random shapes, options and
//! dtypes, and named edge cases, each on the CPU emulator (always) and on the GPU (when there
//! is one; ignored, loudly, when not; failed when REQUIRE_GPU=1).
//!
//! `FLASHATTN_GPU_CASES` / `FLASHATTN_EMU_CASES` set the number of random cases (all dtypes).

use flashattn::kernels::registry::FWD_VARIANTS;
use flashattn::{AttnShape, FlashAttn, FwdOptions, Window};
use flashattn_tests::{
    AlibiDraw, BackendKind, Case, Dt, WIDE_WINDOWS, case_strategy, check_case, check_case_opts, check_case_with, env_usize, gpu_trials,
    nonfinite, push_for_arch, shards, wide_window_plants,
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

/// Named cases: the corners a random draw may miss.
fn edge_cases(kind: BackendKind) -> Vec<(&'static str, AttnShape, bool, Option<f32>)> {
    let mut v = vec![
        ("single_query_single_key", shape(1, 1, 1, 1, 1, 8), false, None),
        ("single_query_long_keys", shape(2, 1, 300, 4, 2, 64), true, None),
        ("causal_more_queries_than_keys_fully_masked_rows", shape(1, 100, 37, 2, 1, 64), true, None),
        ("causal_fewer_queries_than_keys", shape(1, 50, 200, 2, 2, 32), true, None),
        ("causal_square_ragged", shape(2, 77, 77, 3, 3, 40), true, None),
        ("gqa_8_to_1", shape(1, 65, 90, 8, 1, 64), false, None),
        ("mqa_causal", shape(1, 70, 70, 6, 1, 128), true, None),
        ("head_dim_8", shape(1, 33, 65, 2, 2, 8), false, None),
        ("head_dim_72", shape(1, 40, 41, 2, 1, 72), true, None),
        ("head_dim_136", shape(1, 40, 70, 2, 2, 136), false, None),
        ("head_dim_256", shape(1, 45, 67, 2, 1, 256), true, None),
        ("peaked_softmax_scale_4", shape(1, 64, 64, 2, 2, 64), false, Some(4.0)),
        ("flat_softmax_scale_0_001", shape(1, 64, 64, 2, 2, 64), false, Some(0.001)),
        ("negative_scale", shape(1, 30, 30, 1, 1, 32), true, Some(-0.2)),
        // A whole row tile (128 rows at d=64/128) sees no key: the mma kernel skips its KV
        // loop and reuses the Q tile for O; with a negative scale Q's sign was flipped first.
        ("causal_row_tile_sees_no_key", shape(1, 300, 9, 2, 1, 64), true, None),
        ("causal_row_tile_sees_no_key_negative_scale", shape(1, 300, 9, 1, 1, 128), true, Some(-0.3)),
        // The same past head_dim 128 (the Hopper kernel's 192 and 256 tiles, Q's sign flipped
        // over all its column blocks), and a padded head_dim with GQA.
        ("causal_row_tile_sees_no_key_negative_scale_d256", shape(1, 200, 9, 1, 1, 256), true, Some(-0.3)),
        ("head_dim_184_gqa_negative_scale", shape(1, 70, 45, 4, 2, 184), false, Some(-0.15)),
    ];
    if kind == BackendKind::Gpu {
        v.push(("long_sequence_1024", shape(1, 1024, 1024, 2, 1, 128), true, None));
        v.push(("many_blocks", shape(4, 300, 500, 16, 4, 64), false, None));
    }
    v
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

fn run_props(fa: &FlashAttn, dtype: Dt, cases: usize, strategy: impl Strategy<Value = Case>) -> Result<(), Failed> {
    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
    let strategy = strategy.prop_map(move |c| Case { dtype, ..c });
    runner.run(&strategy, |case| check_case(fa, &case).map(|_| ()).map_err(TestCaseError::fail)).map_err(|e| Failed::from(format!("{e}")))
}

/// `head_dim` where the family `name` has a variant for it, else 64 or 128 by the seed (the
/// dims every family has; wgmma_wg2 has only those).
fn family_head_dim(fa: &FlashAttn, name: &'static str, dtype: Dt, head_dim: usize, seed: u64) -> usize {
    let opts = FwdOptions { kernel: Some(name), ..Default::default() };
    match flashattn::select_variant(dtype.dtype(), head_dim, &opts, &fa.archs()) {
        Ok(_) => head_dim,
        Err(_) => [64, 128][(seed % 2) as usize],
    }
}

fn trials_for(kind: BackendKind, fa: Option<Arc<FlashAttn>>, unavailable: Option<String>) -> Vec<Trial> {
    let tag = match kind {
        BackendKind::Gpu => "gpu",
        BackendKind::Emulator => "emulator",
    };
    let mut trials = Vec::new();
    let mk = |name: String, f: TrialBody| {
        let fa = fa.clone();
        let unavailable = unavailable.clone();
        Trial::test(name, move || match (fa, unavailable) {
            (Some(fa), _) => f(&fa),
            (None, Some(why)) => Err(format!("REQUIRE_GPU=1 but no GPU: {why}").into()),
            (None, None) => Err("no backend".into()),
        })
    };
    let archs = fa.as_ref().map(|f| f.archs());
    // Random cases over the whole option space, in shards (trials run in parallel), the
    // dtypes taking turns. GPU: sizes up to 257, head_dim to 256, GQA up to 4:1 over 4 KV
    // heads, FLASHATTN_GPU_CASES in all. Emulator: small shapes, so CI stays within minutes on
    // two cores, FLASHATTN_EMU_CASES in all.
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_CASES", 6000), 150),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_CASES", 36), 12),
    };
    for (i, cases) in shards(total, size).into_iter().enumerate() {
        let dtype = [Dt::F32, Dt::F16, Dt::Bf16][i % 3];
        let name = format!("{tag}::props::{dtype:?}::{i:03}").to_lowercase();
        trials.push(mk(
            name,
            Box::new(move |fa| match kind {
                BackendKind::Gpu => run_props(fa, dtype, cases, case_strategy(257, 32, 4, 4, 3, 4_000_000)),
                BackendKind::Emulator => run_props(fa, dtype, cases, case_strategy(70, 32, 2, 3, 2, 120_000)),
            }),
        ));
    }
    // Split-KV (`FwdOptions::splits`), by every family that splits: few query rows (decoding,
    // 1 to 16) against keys over several key tiles, in 1 to 8 parts (more parts than tiles
    // too: empty parts) or the automatic count, over the whole option space
    // (FLASHATTN_GPU_SPLIT_CASES / _EMU_).
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_SPLIT_CASES", 600), 50),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_SPLIT_CASES", 12), 6),
    };
    for family in flashattn::FWD_FAMILIES.iter().filter(|f| f.splits) {
        let name = family.name;
        for (i, cases) in shards(total, size).into_iter().enumerate() {
            let dtype = [Dt::F16, Dt::Bf16][i % 2];
            let label = format!("{tag}::split_kv::{name}::{dtype:?}::{i:03}").to_lowercase();
            let trial = mk(
                label.clone(),
                Box::new(move |fa| {
                    let (max_k, d_units, budget) = match kind {
                        BackendKind::Gpu => (1500, 32, 4_000_000),
                        // Keys over several tiles at every head_dim (128-key tiles to 64).
                        BackendKind::Emulator => (1200, 16, 1_500_000),
                    };
                    let heads = if kind == BackendKind::Gpu { 4 } else { 2 };
                    let strategy = (case_strategy(max_k, d_units, heads, heads, 2, usize::MAX), 1..=16usize, 1..=max_k, 0..=8u32);
                    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                    runner
                        .run(&strategy, |(c, rows, keys, splits)| {
                            let mut shape = AttnShape { seqlen_q: rows, seqlen_k: keys, ..c.shape };
                            shape.head_dim = family_head_dim(fa, name, dtype, shape.head_dim, c.seed);
                            while shape.batch * shape.heads_q * shape.seqlen_q * shape.seqlen_k * shape.head_dim > budget
                                && shape.seqlen_k > 1
                            {
                                shape.seqlen_k = shape.seqlen_k.div_ceil(2);
                            }
                            let case = Case { shape, dtype, ..c };
                            // 0: the automatic choice.
                            let opts = FwdOptions { kernel: Some(name), splits: (splits > 0).then_some(splits), ..Default::default() };
                            check_case_opts(fa, &case, &opts).map(|_| ()).map_err(|e| {
                                // The same case unsplit, beside the failure: whether the split
                                // or the case itself is past the bar.
                                let unsplit = FwdOptions { splits: Some(1), ..opts };
                                let alone = match check_case_opts(fa, &case, &unsplit) {
                                    Ok(m) => format!("unsplit passes: O rel err {:.3e}, LSE rel err {:.3e}", m.o_err, m.lse_err),
                                    Err(e) => format!("unsplit fails too: {e}"),
                                };
                                TestCaseError::fail(format!("[splits {splits}, 0 automatic] {e}; {alone}"))
                            })
                        })
                        .map_err(|e| Failed::from(format!("{e}")))
                }),
            );
            push_for_arch(&mut trials, archs.as_deref(), &label, family.arch, trial);
        }
    }
    // Decode with GQA packing (`FwdParams::gqa_packed`, on the families that take it): one
    // query row, 2 to 16 query heads per KV head, causal or not, any window, softcap and
    // sinks, every scale, split or not, and a fifth unpacked (`FwdOptions::no_gqa_packing`)
    // (FLASHATTN_GPU_DECODE_CASES / _EMU_ in all). Packing takes no ALiBi: the props above
    // draw it, unpacked.
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_DECODE_CASES", 600), 50),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_DECODE_CASES", 12), 6),
    };
    for family in flashattn::FWD_FAMILIES.iter().filter(|f| f.packs_gqa) {
        let name = family.name;
        for (i, cases) in shards(total, size).into_iter().enumerate() {
            let dtype = [Dt::F16, Dt::Bf16][i % 2];
            let label = format!("{tag}::decode::{name}::{dtype:?}::{i:03}").to_lowercase();
            let trial = mk(
                label.clone(),
                Box::new(move |fa| {
                    let (max_k, d_units, max_group): (usize, usize, usize) = match kind {
                        BackendKind::Gpu => (3000, 32, 16),
                        BackendKind::Emulator => (600, 16, 8),
                    };
                    let strategy = (
                        case_strategy(max_k, d_units, 2, 1, 3, usize::MAX),
                        2..=max_group,
                        1..=max_k,
                        0..=8u32,
                        proptest::bool::weighted(0.2),
                    );
                    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                    runner
                        .run(&strategy, |(c, group, keys, splits, no_gqa_packing)| {
                            let mut shape = AttnShape { seqlen_q: 1, seqlen_k: keys, heads_q: c.shape.heads_kv * group, ..c.shape };
                            shape.head_dim = family_head_dim(fa, name, dtype, shape.head_dim, c.seed);
                            let case = Case { shape, dtype, alibi: None, ..c };
                            // 0: the automatic choice.
                            let opts = FwdOptions {
                                kernel: Some(name),
                                splits: (splits > 0).then_some(splits),
                                no_gqa_packing,
                                ..Default::default()
                            };
                            check_case_opts(fa, &case, &opts).map(|_| ()).map_err(|e| {
                                TestCaseError::fail(format!("[splits {splits}, 0 automatic; no_gqa_packing {no_gqa_packing}] {e}"))
                            })
                        })
                        .map_err(|e| Failed::from(format!("{e}")))
                }),
            );
            push_for_arch(&mut trials, archs.as_deref(), &label, family.arch, trial);
        }
    }
    // NaN and infinities planted in Q, K, V (README, "NaN and Inf"): every family, the rule
    // checked element by element (FLASHATTN_GPU_NONFINITE_CASES / _EMU_ in all).
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_NONFINITE_CASES", 1200), 100),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_NONFINITE_CASES", 48), 8),
    };
    let families: [(Option<&'static str>, &[Dt], usize); 4] = [
        (None, &[Dt::F32, Dt::F16, Dt::Bf16], 32),
        (Some("wgmma"), &[Dt::F16, Dt::Bf16], 32),
        (Some("mma"), &[Dt::F16, Dt::Bf16], 32),
        (Some("simt"), &[Dt::F32, Dt::F16, Dt::Bf16], 32),
    ];
    let per = shards(total / families.len(), size);
    for (family, dtypes, d_units) in families {
        for (i, &cases) in per.iter().enumerate() {
            let dtype = dtypes[i % dtypes.len()];
            let name = format!("{tag}::props_nonfinite_{}::{dtype:?}::{i:03}", family.unwrap_or("auto")).to_lowercase();
            let limits = match kind {
                BackendKind::Gpu => (200, 4, 4, 2, 2_000_000),
                BackendKind::Emulator => (70, 2, 2, 2, 60_000),
            };
            let trial = mk(
                name,
                Box::new(move |fa| {
                    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                    let (s, hkv, g, b, budget) = limits;
                    let strategy = (case_strategy(s, d_units, hkv, g, b, budget), nonfinite::plants_strategy(false));
                    runner
                        .run(&strategy, |(c, plants)| {
                            nonfinite::check_forward(fa, &Case { dtype, ..c }, &plants, family).map_err(TestCaseError::fail)
                        })
                        .map_err(|e| Failed::from(format!("{e}")))
                }),
            );
            trials.push(trial);
        }
    }
    // A softcap over a zero or tiny scale: the quotient |scale| / cap is below f32's range,
    // yet an infinite score must stay infinite (capped to the cap), not become inf * 0 = NaN,
    // and a finite one must be capped as its own value, not as one scaled by a clamped
    // quotient (an LSE off by the factor cap on one key) (both found by the GPU's random
    // cases).
    for (family, dtypes) in
        [(Some("wgmma"), &[Dt::F16, Dt::Bf16][..]), (Some("mma"), &[Dt::F16, Dt::Bf16]), (Some("simt"), &[Dt::F32, Dt::F16])]
    {
        for &dtype in dtypes {
            let name = format!("{tag}::edge::softcap_tiny_scale_inf_q::{}::{dtype:?}", family.unwrap_or("auto")).to_lowercase();
            trials.push(mk(
                name,
                Box::new(move |fa| {
                    let scales = [(0.0f32, 1), (-0.0, 2), (1e-44, 2), (-3e-39, 1), (1.637e-42, 1)];
                    for ((scale, sq), cap) in scales.into_iter().flat_map(|x| [(x, 5.0), (x, flashattn::MAX_SOFTCAP)]) {
                        let case = Case {
                            shape: shape(1, sq, 1, 1, 1, 8),
                            causal: false,
                            softmax_scale: Some(scale),
                            dtype,
                            seed: 0,
                            window: Default::default(),
                            softcap: Some(cap),
                            sinks: false,
                            alibi: None,
                        };
                        for value in [f64::INFINITY, f64::NEG_INFINITY] {
                            let plants = [nonfinite::Plant { input: nonfinite::Input::Q, at: 0, value }];
                            nonfinite::check_forward(fa, &case, &plants, family).map_err(Failed::from)?;
                        }
                        check_case_with(fa, &case, family).map_err(Failed::from)?;
                    }
                    Ok(())
                }),
            ));
        }
    }
    // ALiBi with a steep slope (3.58) whose diagonal key sits mid-tile: the Hopper entries
    // split the bias of one-sided tiles into column and row parts, and once split them at
    // every distance, so the heaviest keys carried the far end's rounding (LSE 13x past the
    // bar; found by the GPU's random cases, seed pinned). Then fresh seeds of the same shape.
    for (family, dtypes) in [(Some("wgmma"), &[Dt::F16, Dt::Bf16][..]), (Some("mma"), &[Dt::F16, Dt::Bf16])] {
        for &dtype in dtypes {
            let name = format!("{tag}::edge::alibi_steep_near_diagonal::{}::{dtype:?}", family.unwrap_or("auto")).to_lowercase();
            trials.push(mk(
                name,
                Box::new(move |fa| {
                    let case = Case {
                        shape: shape(1, 16, 527, 2, 1, 1),
                        causal: false,
                        softmax_scale: Some(0.0),
                        dtype,
                        seed: 8_785_750_976_732_973_774,
                        window: Default::default(),
                        softcap: None,
                        sinks: false,
                        alibi: Some(AlibiDraw { per_batch: false, batch0: 0 }),
                    };
                    for seed in [case.seed, fresh_seed(), fresh_seed()] {
                        check_case_with(fa, &Case { seed, ..case }, family).map_err(Failed::from)?;
                    }
                    Ok(())
                }),
            ));
        }
    }
    // Every registered variant, by name, at the largest head_dim its tile serves; a GPU
    // without the variant's architecture (sm_90a kernels off Hopper) reports it ignored.
    for v in FWD_VARIANTS {
        let dtype = Dt::of(v.dtype);
        let d = v.head_dims().1 as usize;
        let case = Case {
            shape: shape(1, 37, 45, 2, 1, d),
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
        let trial = mk(
            format!("{tag}::variant::{name}"),
            Box::new(move |fa| {
                let got = flashattn::select_variant(v.dtype, d, &FwdOptions { kernel: Some(family), ..Default::default() }, &fa.archs())
                    .map_err(|e| Failed::from(e.to_string()))?;
                if got.name != name {
                    return Err(format!("head_dim {d} selects {} instead of {name}", got.name).into());
                }
                // Without and with attention sinks (the epilogue's fold, every family), and with
                // ALiBi (slopes per batch entry; the variant's general entry).
                let alibi = Some(AlibiDraw { per_batch: true, batch0: 0 });
                for (sinks, alibi) in [(false, None), (true, None), (false, alibi)] {
                    check_case_with(fa, &Case { seed: fresh_seed(), sinks, alibi, ..case }, Some(family)).map_err(Failed::from)?;
                }
                Ok(())
            }),
        );
        push_for_arch(&mut trials, archs.as_deref(), &format!("{tag}::variant::{name}"), v.arch(), trial);
    }
    // Sliding windows, softcaps and ALiBi (the window and general entries), by every
    // registered variant at the largest head_dim its tile serves: key tiles left of every
    // row's window skipped, masked tiles at both edges, rows that see no key (seqlen_q >
    // seqlen_k), causal and not; a softcap with and without a window and ALiBi. The last flag:
    // ALiBi; without it and a softcap the window entry runs, else the general one.
    let windows = [
        (shape(1, 100, 230, 2, 1, 0), false, Window { left: Some(37), right: Some(11) }, None, true),
        (shape(1, 130, 250, 2, 1, 0), true, Window { left: Some(70), right: None }, Some(1.5), true),
        (shape(1, 150, 90, 2, 1, 0), false, Window { left: Some(0), right: Some(0) }, None, false),
        (shape(1, 90, 200, 2, 1, 0), false, Window { left: None, right: Some(5) }, None, false),
        (shape(1, 120, 200, 2, 1, 0), true, Window { left: Some(50), right: None }, None, false),
        (shape(1, 97, 180, 2, 1, 0), true, Window::NONE, Some(4.0), false),
        (shape(1, 70, 70, 2, 1, 0), false, Window::NONE, Some(0.7), true),
    ];
    for v in FWD_VARIANTS {
        let dtype = Dt::of(v.dtype);
        let d = v.head_dims().1 as usize;
        let (family, name) = (v.family.name(), v.name);
        let trial = mk(
            format!("{tag}::window::{name}"),
            Box::new(move |fa| {
                for (s, causal, window, softcap, alibi) in windows {
                    let case = Case {
                        shape: AttnShape { head_dim: d, ..s },
                        causal,
                        softmax_scale: None,
                        dtype,
                        seed: fresh_seed(),
                        window,
                        softcap,
                        // Sinks without a softcap, rows that see no key among them.
                        sinks: softcap.is_none(),
                        alibi: alibi.then_some(AlibiDraw { per_batch: false, batch0: 0 }),
                    };
                    check_case_with(fa, &case, Some(family)).map_err(Failed::from)?;
                }
                Ok(())
            }),
        );
        push_for_arch(&mut trials, archs.as_deref(), &format!("{tag}::window::{name}"), v.arch(), trial);
        // On the GPU, windows wide enough that a block's key tiles run masked left of the
        // tiles every row sees whole (which run unmasked) and right of them, for every tile
        // size; then with NaN and infinities planted in K and V on both sides of those tiles
        // and in them (each one's rule checked element by element).
        if kind != BackendKind::Gpu {
            continue;
        }
        let trial = mk(
            format!("{tag}::window_wide::{name}"),
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
                    check_case_with(fa, &case, Some(family)).map_err(Failed::from)?;
                    for plants in wide_window_plants(d, false) {
                        nonfinite::check_forward(fa, &case, &plants, Some(family)).map_err(Failed::from)?;
                    }
                }
                Ok(())
            }),
        );
        push_for_arch(&mut trials, archs.as_deref(), &format!("{tag}::window_wide::{name}"), v.arch(), trial);
    }
    // head_dims that are not multiples of 8 (rows not 16-byte aligned: element-wise loads and
    // stores), by every family with a variant for them.
    let odd = [
        ("head_dim_1", shape(1, 33, 65, 2, 1, 1), true, None),
        ("head_dim_7", shape(1, 40, 41, 2, 2, 7), false, Some(-0.5)),
        ("head_dim_59", shape(2, 70, 66, 2, 1, 59), true, None),
        ("head_dim_111", shape(1, 65, 130, 4, 2, 111), false, None),
        ("head_dim_255", shape(1, 45, 67, 2, 1, 255), true, None),
    ];
    for (name, s, causal, scale) in odd {
        for v in FWD_VARIANTS.iter().filter(|v| v.serves(s.head_dim as u32) && ["wgmma", "mma", "simt"].contains(&v.family.name())) {
            let dtype = Dt::of(v.dtype);
            let case = Case {
                shape: s,
                causal,
                softmax_scale: scale,
                dtype,
                seed: 0,
                window: Default::default(),
                softcap: None,
                sinks: false,
                alibi: None,
            };
            let family = v.family.name();
            let trial = mk(
                format!("{tag}::edge::{name}::{family}::{dtype:?}").to_lowercase(),
                Box::new(move |fa| {
                    check_case_with(fa, &Case { seed: fresh_seed(), ..case }, Some(family)).map(|_| ()).map_err(Failed::from)
                }),
            );
            push_for_arch(&mut trials, archs.as_deref(), &format!("{tag}::edge::{name}::{family}"), v.arch(), trial);
        }
    }
    for (name, s, causal, scale) in edge_cases(kind) {
        for dtype in [Dt::F32, Dt::F16, Dt::Bf16] {
            let case = Case {
                shape: s,
                causal,
                softmax_scale: scale,
                dtype,
                seed: 0,
                window: Default::default(),
                softcap: None,
                sinks: false,
                alibi: None,
            };
            trials.push(mk(
                format!("{tag}::edge::{name}::{dtype:?}").to_lowercase(),
                Box::new(move |fa| {
                    // A fresh seed per run: the same corner, new data each time.
                    check_case(fa, &Case { seed: fresh_seed(), ..case }).map(|_| ()).map_err(Failed::from)
                }),
            ));
        }
    }
    trials
}

/// The test dtype of a kernel dtype.
fn main() {
    let args = Arguments::from_args();
    let mut trials = trials_for(BackendKind::Emulator, Some(Arc::new(FlashAttn::emulator())), None);
    trials.extend(gpu_trials("GPU tests", |fa, why| trials_for(BackendKind::Gpu, fa, why)));
    libtest_mimic::run(&args, trials).exit();
}
