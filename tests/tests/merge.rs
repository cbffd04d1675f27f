//! The merge of partial results by their LSE (`FlashAttn::merge_partials`) against an f64
//! merge: random merges (every dtype, 1 to many parts, parts without keys, whole rows without
//! keys, contiguous and interleaved parts), the NaN rule, and the shapes it refuses. On the
//! CPU emulator (always) and on the GPU (when there is one; ignored, loudly, when not; failed
//! when REQUIRE_GPU=1).
//!
//! `FLASHATTN_GPU_MERGE_CASES` / `FLASHATTN_EMU_MERGE_CASES` set the number of random cases.

use flashattn::FlashAttn;
use flashattn::kernels::registry::Arch;
use flashattn_tests::merge::{check_merge, check_merge_errors, check_merge_nan, merge_strategy};
use flashattn_tests::{BackendKind, env_usize, gpu_trials, push_for_arch, shards};
use libtest_mimic::{Arguments, Failed, Trial};
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::Arc;

type TrialBody = fn(&FlashAttn) -> Result<(), String>;
/// A trial's body, given the backend it runs on.
type BoxedBody = Box<dyn FnOnce(&FlashAttn) -> Result<(), String> + Send>;

fn trials_for(kind: BackendKind, fa: Option<Arc<FlashAttn>>, unavailable: Option<String>) -> Vec<Trial> {
    let tag = match kind {
        BackendKind::Gpu => "gpu",
        BackendKind::Emulator => "emulator",
    };
    let archs = fa.as_ref().map(|f| f.archs());
    let mut trials = Vec::new();
    let mk = |name: String, f: BoxedBody| {
        let fa = fa.clone();
        let unavailable = unavailable.clone();
        Trial::test(name, move || match (fa, unavailable) {
            (Some(fa), _) => f(&fa).map_err(Failed::from),
            (None, Some(why)) => Err(format!("REQUIRE_GPU=1 but no GPU: {why}").into()),
            (None, None) => Err("no backend".into()),
        })
    };
    let (total, size, max_splits, max_rows, max_d) = match kind {
        BackendKind::Gpu => (env_usize("FLASHATTN_GPU_MERGE_CASES", 600), 100, 80, 300, 256),
        BackendKind::Emulator => (env_usize("FLASHATTN_EMU_MERGE_CASES", 64), 16, 40, 40, 72),
    };
    for (i, cases) in shards(total, size).into_iter().enumerate() {
        let name = format!("{tag}::props::{i:03}");
        let trial = mk(
            name.clone(),
            Box::new(move |fa| {
                let mut runner = TestRunner::new(Config { cases: cases as u32, failure_persistence: None, ..Config::default() });
                runner
                    .run(&merge_strategy(max_splits, max_rows, max_d), |c| check_merge(fa, &c).map_err(TestCaseError::fail))
                    .map_err(|e| format!("{e}"))
            }),
        );
        push_for_arch(&mut trials, archs.as_deref(), &name, Arch::Sm80, trial);
    }
    for (what, f) in [("nan_rule", check_merge_nan as TrialBody), ("refused_shapes", check_merge_errors)] {
        let name = format!("{tag}::{what}");
        push_for_arch(&mut trials, archs.as_deref(), &name, Arch::Sm80, mk(name.clone(), Box::new(f)));
    }
    trials
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = trials_for(BackendKind::Emulator, Some(Arc::new(FlashAttn::emulator())), None);
    trials.extend(gpu_trials("GPU merge tests", |fa, why| trials_for(BackendKind::Gpu, fa, why)));
    libtest_mimic::run(&args, trials).exit();
}
