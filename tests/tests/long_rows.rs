//! Long rows: O and LSE at seqlen_k >= 131072 (one query, as in a decode step over a 128k
//! context, and 64 queries over it; GQA 2:1, head_dim 128, f16 and bf16, causal and not)
//! against the f64 reference, with the standard bar: twice naive attention's error in the
//! same dtype plus a unit roundoff ([`flashattn::reference::tolerance`]).
//!
//! Short rows cannot show an error that grows with the row: over 131072 keys the softmax's
//! running max and sum are rescaled after each of a thousand or more KV tiles and l sums as
//! many terms in f32, so a rescaling factor that is one rounding off 1 while the max stays
//! (the bug that made `flashattn --seqlen 1 --seqlen-k 131072` fail its LSE bar) compounds
//! to a thousand roundings here, about 1.5x the bar.
//!
//! On the GPU only by default (the f64 references take seconds per case, the emulator far
//! longer): without a GPU the cases are reported as ignored, loudly; REQUIRE_GPU=1 makes
//! that a failure. FLASHATTN_EMU_LONG_ROWS=1 runs them on the CPU emulator as well.

use flashattn::{AttnShape, FlashAttn};
use flashattn_tests::{Case, Dt, check_case, gpu_trials};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::Arc;

/// (seqlen_q, seqlen_k): one query over 128k keys and 256k keys, 64 queries over 128k keys
/// and a ragged tail (not a multiple of any KV tile).
const LENGTHS: &[(usize, usize)] = &[(1, 131_072), (64, 131_072 + 77), (1, 262_144)];

fn cases() -> Vec<(String, Case)> {
    let mut v = vec![];
    for &(seqlen_q, seqlen_k) in LENGTHS {
        for dtype in [Dt::Bf16, Dt::F16] {
            for causal in [false, true] {
                let shape = AttnShape { batch: 1, seqlen_q, seqlen_k, heads_q: 4, heads_kv: 2, head_dim: 128 };
                let mask = if causal { "causal" } else { "full" };
                let name = format!("long_rows::{dtype:?}::sq{seqlen_q}_sk{seqlen_k}::{mask}").to_lowercase();
                v.push((
                    name,
                    Case {
                        shape,
                        causal,
                        softmax_scale: None,
                        dtype,
                        seed: (seqlen_q * 31 + seqlen_k) as u64,
                        window: Default::default(),
                        softcap: None,
                        sinks: false,
                        alibi: None,
                    },
                ));
            }
        }
    }
    v
}

fn trials(tag: &str, fa: Option<Arc<FlashAttn>>, unavailable: Option<String>) -> Vec<Trial> {
    cases()
        .into_iter()
        .map(|(name, case)| {
            let (fa, unavailable) = (fa.clone(), unavailable.clone());
            let name = format!("{tag}::{name}");
            Trial::test(name.clone(), move || match (fa, unavailable) {
                (Some(fa), _) => {
                    let m = check_case(&fa, &case).map_err(Failed::from)?;
                    eprintln!(
                        "{name}: O rel err {:.2e} (bar {:.2e}), LSE rel err {:.2e} (bar {:.2e})",
                        m.o_err, m.o_tol, m.lse_err, m.lse_tol
                    );
                    Ok(())
                }
                (None, Some(why)) => Err(format!("REQUIRE_GPU=1 but no GPU: {why}").into()),
                (None, None) => Err("no GPU".into()),
            })
        })
        .collect()
}

fn main() {
    let args = Arguments::from_args();
    let mut all = gpu_trials("long-row GPU tests", |fa, why| trials("gpu", fa, why));
    if std::env::var("FLASHATTN_EMU_LONG_ROWS").is_ok_and(|v| v == "1") {
        all.extend(trials("emulator", Some(Arc::new(FlashAttn::emulator())), None));
    }
    libtest_mimic::run(&args, all).exit();
}
