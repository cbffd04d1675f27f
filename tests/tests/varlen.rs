//! Variable-length batches (packed sequences, `cu_seqlens`) against the f64 reference, forward
//! and backward, by every family with general entries, each sequence checked as a batch of
//! one; and offsets made wrong on purpose, which must never take a kernel outside the
//! tensors. On the CPU emulator (always) and on the GPU (when there is one; ignored, loudly,
//! when not; failed when REQUIRE_GPU=1).
//!
//! Attention against a KV cache (`FlashAttn::forward_kvcache`, on the same entries): its
//! append and its rows, random calls and refused ones.
//!
//! `FLASHATTN_GPU_VARLEN_CASES` / `FLASHATTN_EMU_VARLEN_CASES` set the number of random cases,
//! `FLASHATTN_GPU_KVCACHE_CASES` / `FLASHATTN_EMU_KVCACHE_CASES` those of the KV cache.

use flashattn::FlashAttn;
use flashattn::kernels::registry::Arch;
use flashattn_tests::kvcache::{KvCase, check_kvcache, check_kvcache_errors, kvcache_strategy};
use flashattn_tests::varlen::{VarCase, check_bad_offsets, check_device_offsets, check_varlen, varlen_strategy};
use flashattn_tests::{AlibiDraw, BackendKind, Dt, env_usize, gpu_trials, push_for_arch, shards};
use libtest_mimic::{Arguments, Failed, Trial};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::Arc;

/// A trial's body, given the backend it runs on.
type TrialBody = Box<dyn FnOnce(&FlashAttn) -> Result<(), Failed> + Send>;

/// The families with variable-length entries: their dtypes, PTX module, and whether their
/// backward takes a variable-length batch (`mma`'s dK/dV kernels spill with one: forward
/// only, `registry`).
const FAMILIES: [(&str, &[Dt], Arch, bool); 3] = [
    ("wgmma", &[Dt::F16, Dt::Bf16], Arch::Sm90a, true),
    ("mma", &[Dt::F16, Dt::Bf16], Arch::Sm80, false),
    ("simt", &[Dt::F32, Dt::F16, Dt::Bf16], Arch::Sm80, true),
];

fn dtype_of(dtype: Dt) -> flashattn::kernels::dtype::DType {
    use flashattn::kernels::dtype::DType;
    match dtype {
        Dt::F32 => DType::F32,
        Dt::F16 => DType::F16,
        Dt::Bf16 => DType::Bf16,
    }
}

/// Whether `family` has a variable-length forward entry for this dtype and head_dim (the
/// variants whose entry would spill have none).
fn has_varlen(family: &str, dtype: Dt, head_dim: usize) -> bool {
    let fam = flashattn::FwdFamily::from_name(family).expect("a forward family");
    flashattn::kernels::registry::fwd_variant(fam, dtype_of(dtype), head_dim as u32).is_some_and(|v| v.varlen_name.is_some())
}

/// Whether `family`'s backward takes a variable-length batch at this dtype and head_dim: each
/// of its passes has a variable-length entry there (or needs none).
fn has_varlen_bwd(family: &str, dtype: Dt, head_dim: usize) -> bool {
    use flashattn::kernels::registry::{BWD_VARIANTS, Entry};
    let fam = flashattn::BwdFamily::from_name(family).expect("a backward family");
    let passes: Vec<_> =
        BWD_VARIANTS.iter().filter(|v| v.family == fam && v.dtype == dtype_of(dtype) && v.serves(head_dim as u32)).collect();
    !passes.is_empty() && passes.iter().all(|v| v.entry(Entry::Varlen).is_some())
}

/// Whether `family`'s backward applies a softcap to a variable-length batch
/// (`BwdFamilyDesc::softcap_in`).
fn bwd_softcap(family: &str) -> bool {
    flashattn::BwdFamily::from_name(family).is_some_and(|f| f.desc().softcap_in(flashattn::Entry::Varlen))
}

/// Whether `family`'s backward takes attention sinks (`BwdFamilyDesc::sinks`).
fn bwd_sinks(family: &str) -> bool {
    flashattn::BwdFamily::from_name(family).is_some_and(|f| f.desc().sinks)
}

/// Whether `family`'s backward applies ALiBi (`BwdFamilyDesc::alibi`), with a softcap when
/// `softcap` (`alibi_softcap`).
fn bwd_alibi(family: &str, softcap: bool) -> bool {
    flashattn::BwdFamily::from_name(family).is_some_and(|f| f.desc().alibi && (f.desc().alibi_softcap || !softcap))
}

fn trials_for(kind: BackendKind, fa: Option<Arc<FlashAttn>>, unavailable: Option<String>) -> Vec<Trial> {
    let tag = match kind {
        BackendKind::Gpu => "gpu",
        BackendKind::Emulator => "emulator",
    };
    let archs = fa.as_ref().map(|f| f.archs());
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
    // Random batches over the whole option space, forward and backward, each family by name.
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_VARLEN_CASES", 1500), 50),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_VARLEN_CASES", 24), 4),
    };
    let (max_batch, max_len, d_units, group) = match kind {
        BackendKind::Gpu => (8, 300, 32, 4),
        BackendKind::Emulator => (4, 40, 16, 2),
    };
    let per = shards(total / FAMILIES.len(), size);
    for (family, dtypes, arch, backward) in FAMILIES {
        for (i, &cases) in per.iter().enumerate() {
            let dtype = dtypes[i % dtypes.len()];
            let name = format!("{tag}::props::{family}::{dtype:?}::{i:03}").to_lowercase();
            let trial = mk(
                name.clone(),
                Box::new(move |fa| {
                    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                    let strategy = varlen_strategy(max_batch, max_len, d_units, group, false)
                        .prop_map(move |c| VarCase { dtype, ..c })
                        .prop_filter("a variant with a variable-length entry", move |c| has_varlen(family, dtype, c.head_dim));
                    runner
                        .run(&strategy, |c| {
                            let backward = backward
                                && has_varlen_bwd(family, dtype, c.head_dim)
                                && (c.softcap.is_none() || bwd_softcap(family))
                                && (!c.sinks || bwd_sinks(family))
                                && (c.alibi.is_none() || bwd_alibi(family, c.softcap.is_some()));
                            check_varlen(fa, &c, Some(family), backward).map_err(TestCaseError::fail)
                        })
                        .map_err(|e| Failed::from(format!("{e}")))
                }),
            );
            push_for_arch(&mut trials, archs.as_deref(), &name, arch, trial);
        }
    }
    // Every tile of each family: a fixed batch (lengths 0, 1, ragged, GQA, causal with more
    // queries than keys) at the largest head_dim of each of its variants.
    for v in flashattn::kernels::registry::FWD_VARIANTS.iter().filter(|v| v.varlen_name.is_some()) {
        let (family, arch, dtype) = (v.family.name(), v.arch(), Dt::of(v.dtype));
        // The largest head_dim of the variant; the backward where the family takes one.
        let d = v.head_dims().1 as usize;
        let backward = FAMILIES.iter().any(|f| f.0 == family && f.3) && has_varlen_bwd(family, dtype, d);
        let name = format!("{tag}::variant::{}", v.varlen_name.unwrap_or(v.name));
        let trial = mk(
            name.clone(),
            Box::new(move |fa| {
                for causal in [false, true] {
                    let case = VarCase {
                        lens_q: vec![37, 0, 1, 70, 9],
                        lens_k: vec![37, 5, 1, 45, 0],
                        used_k: if causal { Some(vec![30, 5, 0, 45, 0]) } else { None },
                        heads_q: 4,
                        heads_kv: 2,
                        head_dim: d,
                        causal,
                        softmax_scale: None,
                        window: flashattn::Window::NONE,
                        // The softcap through every variant's variable-length entry.
                        softcap: if causal { Some(2.5) } else { None },
                        // Sinks likewise, without it; ALiBi (slopes per sequence) with it.
                        sinks: !causal,
                        alibi: causal.then_some(AlibiDraw { per_batch: true, batch0: 0 }),
                        dtype,
                        seed: fresh_seed(),
                    };
                    let backward = backward
                        && (case.softcap.is_none() || bwd_softcap(family))
                        && (!case.sinks || bwd_sinks(family))
                        && (case.alibi.is_none() || bwd_alibi(family, case.softcap.is_some()));
                    check_varlen(fa, &case, Some(family), backward).map_err(Failed::from)?;
                }
                Ok(())
            }),
        );
        push_for_arch(&mut trials, archs.as_deref(), &name, arch, trial);
    }
    // Offsets made wrong on purpose (only a device holds them): no access outside the
    // tensors, forward and backward, every family, padded and whole head dims.
    for (family, dtypes, arch, backward) in FAMILIES {
        for d in [64usize, 120] {
            let dtype = dtypes[0];
            let backward = backward && has_varlen_bwd(family, dtype, d);
            let name = format!("{tag}::bad_offsets::{family}::d{d}");
            let trial = mk(
                name.clone(),
                Box::new(move |fa| {
                    let r = match dtype {
                        Dt::F32 => check_bad_offsets::<f32>(fa, Some(family), d, backward),
                        Dt::F16 => check_bad_offsets::<half::f16>(fa, Some(family), d, backward),
                        Dt::Bf16 => check_bad_offsets::<half::bf16>(fa, Some(family), d, backward),
                    };
                    r.map_err(Failed::from)
                }),
            );
            push_for_arch(&mut trials, archs.as_deref(), &name, arch, trial);
        }
    }
    // Attention against a KV cache with its append, random calls over the whole option space
    // (lengths past the capacity included), each family by name.
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_KVCACHE_CASES", 900), 50),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_KVCACHE_CASES", 12), 4),
    };
    let (max_batch, max_capacity, max_q, d_units, group) = match kind {
        BackendKind::Gpu => (6, 400, 16, 32, 4),
        BackendKind::Emulator => (3, 40, 5, 16, 2),
    };
    let per = shards(total / FAMILIES.len(), size);
    for (family, dtypes, arch, _) in FAMILIES {
        for (i, &cases) in per.iter().enumerate() {
            let dtype = dtypes[i % dtypes.len()];
            let name = format!("{tag}::kvcache::{family}::{dtype:?}::{i:03}").to_lowercase();
            let trial = mk(
                name.clone(),
                Box::new(move |fa| {
                    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                    let strategy = kvcache_strategy(max_batch, max_capacity, max_q, d_units, group)
                        .prop_map(move |c| KvCase { dtype, ..c })
                        .prop_filter("a variant with a variable-length entry", move |c| has_varlen(family, dtype, c.head_dim));
                    runner
                        .run(&strategy, |c| check_kvcache(fa, &c, Some(family)).map_err(TestCaseError::fail))
                        .map_err(|e| Failed::from(format!("{e}")))
                }),
            );
            push_for_arch(&mut trials, archs.as_deref(), &name, arch, trial);
        }
    }
    // Decode steps with GQA packing (`FwdParams::gqa_packed`, the families that take it):
    // one query row per sequence, 2 to 16 query heads per KV head, any window, softcap and
    // sinks, no ALiBi (FLASHATTN_GPU_KVDECODE_CASES / _EMU_ in all).
    let (total, size) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_KVDECODE_CASES", 300), 50),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_KVDECODE_CASES", 8), 4),
    };
    let (max_capacity, max_group): (usize, usize) = match kind {
        BackendKind::Gpu => (3000, 16),
        BackendKind::Emulator => (300, 8),
    };
    // (wgmma_wg2 has no variable-length entry.)
    let packs = flashattn::FWD_FAMILIES.iter().filter(|f| f.packs_gqa && [64, 128].iter().any(|&d| has_varlen(f.name, Dt::F16, d)));
    for family in packs {
        let (name, arch) = (family.name, family.arch);
        for (i, &cases) in shards(total, size).iter().enumerate() {
            let dtype = [Dt::F16, Dt::Bf16][i % 2];
            let label = format!("{tag}::kvdecode::{name}::{dtype:?}::{i:03}").to_lowercase();
            let trial = mk(
                label.clone(),
                Box::new(move |fa| {
                    let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                    let strategy = (kvcache_strategy(max_batch, max_capacity, 1, d_units, 1), 2..=max_group).prop_map(move |(c, group)| {
                        KvCase {
                            dtype,
                            heads_q: c.heads_kv * group,
                            // A head dim of the family's variable-length entries.
                            head_dim: match has_varlen(name, dtype, c.head_dim) {
                                true => c.head_dim,
                                false => [64, 128][(c.seed % 2) as usize],
                            },
                            alibi: None,
                            ..c
                        }
                    });
                    runner
                        .run(&strategy, |c| check_kvcache(fa, &c, Some(name)).map_err(TestCaseError::fail))
                        .map_err(|e| Failed::from(format!("{e}")))
                }),
            );
            push_for_arch(&mut trials, archs.as_deref(), &label, arch, trial);
        }
    }
    trials.push(mk(format!("{tag}::kvcache::refused"), Box::new(|fa| check_kvcache_errors(fa).map_err(Failed::from))));
    // Offsets already on the device: the same result as from the host (GPU only: the
    // emulator has no device buffers).
    if kind == BackendKind::Gpu {
        for (family, _, arch, _) in FAMILIES.into_iter().filter(|f| f.3) {
            let name = format!("{tag}::device_offsets::{family}");
            let trial = mk(name.clone(), Box::new(move |fa| check_device_offsets(fa, Some(family), 64).map_err(Failed::from)));
            push_for_arch(&mut trials, archs.as_deref(), &name, arch, trial);
        }
    }
    trials
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = trials_for(BackendKind::Emulator, Some(Arc::new(FlashAttn::emulator())), None);
    trials.extend(gpu_trials("GPU varlen tests", |fa, why| trials_for(BackendKind::Gpu, fa, why)));
    libtest_mimic::run(&args, trials).exit();
}
