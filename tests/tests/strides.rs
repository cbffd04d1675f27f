//! Strided views forward and backward (`flashattn_tests::strided`): random shapes, options and
//! dtypes, each case with every tensor in a layout of its own (`strided`), or with Q, K, V
//! cut from one packed projection and dQ, dK, dV written through pieces of one packed
//! gradient buffer in one call (`packed`: `unbind`, GQA through `narrow` / `split_at`), on the
//! CPU emulator (always) and on the GPU (when there is one; ignored, loudly, when not; failed
//! when REQUIRE_GPU=1).
//!
//! `FLASHATTN_GPU_STRIDE_CASES` / `FLASHATTN_EMU_STRIDE_CASES` and
//! `FLASHATTN_GPU_PACKED_CASES` / `FLASHATTN_EMU_PACKED_CASES` set the number of cases.

use flashattn::FlashAttn;
use flashattn_tests::strided::{Pattern, check_packed, check_strided};
use flashattn_tests::{BackendKind, Case, case_strategy, env_usize, gpu_trials, shards};
use libtest_mimic::{Arguments, Failed, Trial};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use std::sync::Arc;

const PATTERNS: [Pattern; 4] = [Pattern::Contiguous, Pattern::Bhsd, Pattern::PackedQkv, Pattern::Random];

/// Which check a trial runs.
#[derive(Clone, Copy)]
enum Check {
    /// Every tensor in a layout of its own ([`check_strided`], patterns in turn).
    Strided,
    /// Packed QKV in, packed dQKV out ([`check_packed`]).
    Packed,
}

/// `cases` random cases from `strategy`, every one checked (no shrinking: a failure names
/// its case, its layout pattern and seeds).
fn run(fa: &FlashAttn, check: Check, cases: usize, shard: usize, strategy: impl Strategy<Value = Case>) -> Result<(), Failed> {
    let mut runner = TestRunner::new_with_rng(
        Default::default(),
        proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &seed32(shard)),
    );
    for i in 0..cases {
        // Forward and backward: no sliding window (its backward is not implemented yet).
        let case =
            Case { window: Default::default(), ..strategy.new_tree(&mut runner).map_err(|e| Failed::from(e.to_string()))?.current() };
        let (layout_seed, saved) = (case.seed ^ 0x9e37_79b9_7f4a_7c15, i % 3 == 2);
        match check {
            Check::Strided => check_strided(fa, &case, PATTERNS[(i + shard) % PATTERNS.len()], layout_seed, saved)?,
            Check::Packed => check_packed(fa, &case, layout_seed, saved)?,
        }
    }
    Ok(())
}

/// A fresh seed per run and shard.
fn seed32(shard: usize) -> [u8; 32] {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&t.to_le_bytes());
    s[8..16].copy_from_slice(&(shard as u64).to_le_bytes());
    s
}

fn trials_for(kind: BackendKind, fa: Option<Arc<FlashAttn>>, unavailable: Option<String>) -> Vec<Trial> {
    let tag = match kind {
        BackendKind::Gpu => "gpu",
        BackendKind::Emulator => "emulator",
    };
    // (check, trial name, environment variable, GPU cases, emulator cases)
    let checks = [(Check::Strided, "strided", "STRIDE", 1200, 24), (Check::Packed, "packed", "PACKED", 400, 12)];
    checks
        .into_iter()
        .flat_map(|(check, name, var, gpu, emu)| {
            let (total, size) = match kind {
                BackendKind::Gpu => (env_usize(&format!("FLASHATTN_GPU_{var}_CASES"), gpu), 100),
                BackendKind::Emulator => (env_usize(&format!("FLASHATTN_EMU_{var}_CASES"), emu), 6),
            };
            let (fa, unavailable) = (fa.clone(), unavailable.clone());
            shards(total, size).into_iter().enumerate().map(move |(i, cases)| {
                let (fa, unavailable) = (fa.clone(), unavailable.clone());
                Trial::test(format!("{tag}::{name}::{i:03}"), move || match (fa, unavailable) {
                    (Some(fa), _) => match kind {
                        BackendKind::Gpu => run(&fa, check, cases, i, case_strategy(200, 32, 3, 3, 2, 2_000_000)),
                        BackendKind::Emulator => run(&fa, check, cases, i, case_strategy(48, 16, 2, 2, 2, 60_000)),
                    },
                    (None, Some(why)) => Err(format!("REQUIRE_GPU=1 but no GPU: {why}").into()),
                    (None, None) => Err("no backend".into()),
                })
            })
        })
        .collect()
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = trials_for(BackendKind::Emulator, Some(Arc::new(FlashAttn::emulator())), None);
    trials.extend(gpu_trials("GPU tests", |fa, why| trials_for(BackendKind::Gpu, fa, why)));
    libtest_mimic::run(&args, trials).exit();
}
