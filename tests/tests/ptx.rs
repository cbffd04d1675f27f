//! The embedded PTX: every registered kernel is an entry, nothing is unresolved, every entry
//! splits into a module of its own (`ptx::entry_module`, how kernels are loaded), and
//! (where ptxas is available) it assembles (the sm_80 module for sm_80 and sm_90, the sm_90a
//! module for sm_90a) with no spills, no stack, and no wgmma serialised or waited for by ptxas;
//! so does one split module per family and pass.
//!
//! ptxas comes from PyPI's `nvidia-cuda-nvcc` (no CUDA toolkit needed). It is found through
//! `PTXAS`, then PATH, then the Python package. `REQUIRE_PTXAS=1` (set by .ci/run) makes a
//! missing ptxas a failure; otherwise the ptxas test says loudly that it did not run.

use flashattn::kernels::registry::{APPEND_VARIANTS, Arch, BWD_VARIANTS, FWD_VARIANTS, MERGE_VARIANTS, SINK_VARIANTS};
use flashattn::ptx::{MODULES, entries, entry_module, loaded, unresolved, with_maxnreg};
use libtest_mimic::{Arguments, Failed, Trial};
use std::path::PathBuf;
use std::process::Command;

/// A check that runs ptxas (found at the given path) over the PTX; it panics on failure.
type PtxasCheck = fn(PathBuf);

fn every_registered_kernel_is_an_entry() {
    for (target, arch, ptx) in MODULES {
        let names = entries(ptx);
        let bwd = BWD_VARIANTS.iter().filter(|v| v.arch() == *arch).flat_map(|v| v.entry_names());
        let fwd = FWD_VARIANTS
            .iter()
            .filter(|v| v.arch() == *arch)
            .flat_map(|v| [Some(v.name), Some(v.window_name), Some(v.general_name), v.varlen_name])
            .flatten();
        let merge = MERGE_VARIANTS.iter().filter(|_| *arch == Arch::Sm80).map(|v| v.name);
        let sinks = SINK_VARIANTS.iter().filter(|_| *arch == Arch::Sm80).map(|v| v.name);
        let append = APPEND_VARIANTS.iter().filter(|_| *arch == Arch::Sm80).map(|v| v.name);
        let registered: Vec<&str> = fwd.chain(bwd).chain(merge).chain(sinks).chain(append).collect();
        for name in &registered {
            assert!(names.contains(name), "{target}: no entry {name} in the PTX");
        }
        assert_eq!(names.len(), registered.len(), "{target}: entries {names:?}");
    }
}

fn nothing_unresolved() {
    for (target, _, ptx) in MODULES {
        assert!(unresolved(ptx).is_empty(), "{target}: unresolved {:?}", unresolved(ptx));
        // panic=immediate-abort turns panics into `trap`: no panic machinery may remain.
        assert!(!ptx.contains("panic"), "{target}: a panic path survived");
    }
}

/// The loaded modules carry each variant's `.maxnreg` on its entry and are otherwise the
/// built PTX.
fn loaded_modules_carry_the_register_caps() {
    for (target, arch, ptx) in MODULES {
        let mut added = 0;
        for v in BWD_VARIANTS.iter().filter(|v| v.arch() == *arch) {
            for (e, name) in v.entries() {
                if let Some(regs) = v.max_regs_in(e) {
                    let one = entry_module(loaded(*arch), name).unwrap_or_else(|| panic!("{target}: {name} not split"));
                    assert!(one.contains(&format!(")\n.maxnreg {regs}\n{{\n")), "{target} {name}: no .maxnreg {regs}");
                    added += format!(".maxnreg {regs}\n").len();
                }
            }
        }
        assert_eq!(loaded(*arch).len(), ptx.len() + added, "{target}: the loaded module differs by more than its caps");
    }
    // (The Hopper backward's d = 64 entries are capped at 168 but for the variable-length
    // ones: `tile::wgmma_bwd_tile`, `WgmmaBwdTile::caps_in`. Beside the caps the loaded
    // modules must be the built PTX exactly, which the length check above asserts.)
}

fn every_entry_splits_into_a_module_of_its_own() {
    for (target, _, ptx) in MODULES {
        let names = entries(ptx);
        for name in &names {
            let one = entry_module(ptx, name).unwrap_or_else(|| panic!("{target}: {name} not split"));
            assert_eq!(entries(&one), [*name], "{target}: the split module of {name}");
            assert!(unresolved(&one).is_empty(), "{target} {name}: unresolved {:?}", unresolved(&one));
            assert!(one.starts_with(&ptx[..ptx.find(".visible .entry").unwrap_or(0)]), "{target} {name}: the header changed");
            // FLASHATTN_MAXNREG's edit: the directive between the parameter list and the body.
            let capped = with_maxnreg(&one, name, 128).unwrap_or_else(|| panic!("{target}: no parameter list for {name}"));
            assert!(capped.contains(")\n.maxnreg 128\n{\n"), "{target} {name}: .maxnreg misplaced");
            assert_eq!(
                with_maxnreg(&capped, name, 96).map(|m| m.replace(".maxnreg 96", ".maxnreg 128")),
                Some(capped.clone()),
                "{target} {name}: .maxnreg not replaced"
            );
        }
        assert!(entry_module(ptx, "no_such_kernel").is_none());
        // Every line of the module is in exactly one entry's split or in all of them.
        let kept: usize = names.iter().map(|n| entry_module(ptx, n).map_or(0, |m| m.lines().count())).sum();
        let shared = entry_module(ptx, names[0]).map_or(0, |m| m.lines().count()) - body_lines(ptx, names[0]);
        assert_eq!(kept - shared * (names.len() - 1), ptx.lines().count(), "{target}: lines lost or duplicated by the split");
    }
}

/// Lines of entry `name`'s definition in `ptx` (from `.visible .entry` to its closing brace).
fn body_lines(ptx: &str, name: &str) -> usize {
    let mut inside = false;
    let mut n = 0;
    for line in ptx.lines() {
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            inside = rest.starts_with(name) && rest[name.len()..].starts_with(|c: char| c == '(' || c.is_whitespace());
        }
        if inside {
            n += 1;
            if line == "}" {
                inside = false;
            }
        }
    }
    n
}

fn find_ptxas() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("PTXAS") {
        return Some(PathBuf::from(p));
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some(PathBuf::from("ptxas"));
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia, os; print(' '.join(os.path.join(p, d, 'bin', 'ptxas') for p in nvidia.__path__ for d in os.listdir(p)))",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(PathBuf::from).find(|p| p.is_file())
}

fn ptxas_no_spills_no_stack(ptxas: PathBuf) {
    let dir = std::env::temp_dir().join(format!("flashattn-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (target, arch, _) in MODULES {
        let file = dir.join(format!("{target}.ptx"));
        // As the driver gets it: with the variants' `.maxnreg`.
        std::fs::write(&file, loaded(*arch)).unwrap();
        // The portable module on Ampere and Hopper; the sm_90a one where it runs.
        let gpus: &[&str] = if *arch == Arch::Sm90a { &["sm_90a"] } else { &["sm_80", "sm_90"] };
        for arch in gpus {
            let out = Command::new(&ptxas).arg(format!("-arch={arch}")).arg("-v").arg(&file).arg("-o").arg("/dev/null").output().unwrap();
            let report = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "ptxas {arch} on {target} PTX failed:\n{report}");
            println!("--- ptxas -arch={arch} -v ({target} PTX)\n{report}");
            for line in report.lines().filter(|l| l.contains("spill") || l.contains("stack frame")) {
                assert!(line.contains("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"), "{arch}: {line}");
            }
            assert!(report.contains("Used"), "no resource report from ptxas");
            // ptxas reports these as "info", not warnings: wgmma serialised because a
            // non-wgmma instruction writes an accumulator inside a pipeline stage (C7515), or a
            // wait it had to add (C7517). Either undoes the asynchrony the kernel is built on.
            if let Some(line) = report.lines().find(|l| l.contains("C7515") || l.contains("C7517")) {
                panic!("{arch} on {target} PTX: {line}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The split modules assemble on their own: the first variant of each (family, pass).
fn ptxas_split_modules(ptxas: PathBuf) {
    let dir = std::env::temp_dir().join(format!("flashattn-ptx-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fwd = FWD_VARIANTS
        .iter()
        .flat_map(|v| {
            let varlen = v.varlen_name.map(|n| (v.family.name(), "fwd_varlen", n, v.arch()));
            let general = Some((v.family.name(), "fwd_general", v.general_name, v.arch()));
            [
                Some((v.family.name(), "fwd", v.name, v.arch())),
                Some((v.family.name(), "fwd_window", v.window_name, v.arch())),
                general,
                varlen,
            ]
        })
        .flatten();
    let bwd = BWD_VARIANTS.iter().map(|v| (v.family.name(), v.pass.name(), v.name, v.arch()));
    let merge = MERGE_VARIANTS.iter().map(|v| ("merge", "merge", v.name, Arch::Sm80));
    let sinks = SINK_VARIANTS.iter().map(|v| ("sinks", v.name, v.name, Arch::Sm80));
    let append = APPEND_VARIANTS.iter().map(|v| ("kv_append", "kv_append", v.name, Arch::Sm80));
    let mut seen = std::collections::HashSet::new();
    for (family, pass, name, arch) in fwd.chain(bwd).chain(merge).chain(sinks).chain(append).filter(|k| seen.insert((k.0, k.1))) {
        let one = entry_module(loaded(arch), name).unwrap_or_else(|| panic!("{name} not split"));
        let file = dir.join(format!("{name}.ptx"));
        std::fs::write(&file, one).unwrap();
        let gpu = if arch == Arch::Sm90a { "sm_90a" } else { "sm_80" };
        let out = Command::new(&ptxas).arg(format!("-arch={gpu}")).arg(&file).arg("-o").arg("/dev/null").output().unwrap();
        assert!(
            out.status.success(),
            "ptxas {gpu} on the split module of {name} ({family} {pass}) failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let ptxas = find_ptxas();
    let required = std::env::var("REQUIRE_PTXAS").is_ok_and(|v| v == "1");
    let mut trials = vec![
        Trial::test("every_registered_kernel_is_an_entry", || {
            every_registered_kernel_is_an_entry();
            Ok(())
        }),
        Trial::test("nothing_unresolved", || {
            nothing_unresolved();
            Ok(())
        }),
        Trial::test("every_entry_splits_into_a_module_of_its_own", || {
            every_entry_splits_into_a_module_of_its_own();
            Ok(())
        }),
        Trial::test("loaded_modules_carry_the_register_caps", || {
            loaded_modules_carry_the_register_caps();
            Ok(())
        }),
    ];
    let absent = "ptxas not found (pip install nvidia-cuda-nvcc, or set PTXAS)";
    if ptxas.is_none() && !required {
        eprintln!("\n*** ptxas checks NOT RUN: {absent} (reported as ignored) ***\n");
    }
    let checks: [(&str, PtxasCheck); 2] =
        [("ptxas_no_spills_no_stack", ptxas_no_spills_no_stack), ("ptxas_split_modules", ptxas_split_modules)];
    for (name, check) in checks {
        trials.push(match ptxas.clone() {
            Some(p) => Trial::test(name, move || {
                let _: () = check(p);
                Ok(())
            }),
            None if required => Trial::test(name, move || Err(Failed::from(format!("REQUIRE_PTXAS=1 but {absent}")))),
            None => Trial::test(name, || Ok(())).with_ignored_flag(true),
        });
    }
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}
