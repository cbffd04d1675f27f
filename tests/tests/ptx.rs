//! The embedded PTX: every registered kernel is an entry, nothing is unresolved, and (where
//! ptxas is available) it assembles (the sm_80 module for sm_80 and sm_90, the sm_90a module
//! for sm_90a) with no spills, no stack, and no wgmma serialised or waited for by ptxas.
//!
//! ptxas comes from PyPI's `nvidia-cuda-nvcc` (no CUDA toolkit needed). It is found through
//! `PTXAS`, then PATH, then the Python package. `REQUIRE_PTXAS=1` (set by .ci/run) makes a
//! missing ptxas a failure; otherwise the ptxas test says loudly that it did not run.

use flashattn::kernels::registry::{Arch, BWD_VARIANTS, FWD_VARIANTS};
use flashattn::ptx::{MODULES, entries, unresolved};
use libtest_mimic::{Arguments, Failed, Trial};
use std::path::PathBuf;
use std::process::Command;

fn every_registered_kernel_is_an_entry() {
    for (target, arch, ptx) in MODULES {
        let names = entries(ptx);
        let bwd = BWD_VARIANTS.iter().filter(|v| v.arch == *arch).map(|v| v.name);
        let registered: Vec<&str> = FWD_VARIANTS.iter().filter(|v| v.arch == *arch).map(|v| v.name).chain(bwd).collect();
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

fn find_ptxas() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("PTXAS") {
        return Some(PathBuf::from(p));
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some(PathBuf::from("ptxas"));
    }
    let out = Command::new("python3")
        .args(["-c", "import nvidia, os; print(' '.join(os.path.join(p, d, 'bin', 'ptxas') for p in nvidia.__path__ for d in os.listdir(p)))"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(PathBuf::from).find(|p| p.is_file())
}

fn ptxas_no_spills_no_stack(ptxas: PathBuf) {
    let dir = std::env::temp_dir().join(format!("flashattn-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (target, arch, ptx) in MODULES {
        let file = dir.join(format!("{target}.ptx"));
        std::fs::write(&file, ptx).unwrap();
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
            for line in report.lines().filter(|l| l.contains("C7515") || l.contains("C7517")) {
                panic!("{arch} on {target} PTX: {line}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let ptxas = find_ptxas();
    let required = std::env::var("REQUIRE_PTXAS").is_ok_and(|v| v == "1");
    let mut trials = vec![
        Trial::test("every_registered_kernel_is_an_entry", || Ok(every_registered_kernel_is_an_entry())),
        Trial::test("nothing_unresolved", || Ok(nothing_unresolved())),
    ];
    let absent = "ptxas not found (pip install nvidia-cuda-nvcc, or set PTXAS)";
    let t = match ptxas.clone() {
        Some(p) => Trial::test("ptxas_no_spills_no_stack", move || Ok(ptxas_no_spills_no_stack(p))),
        None if required => Trial::test("ptxas_no_spills_no_stack", move || Err(Failed::from(format!("REQUIRE_PTXAS=1 but {absent}")))),
        None => {
            eprintln!("\n*** ptxas check NOT RUN: {absent} (reported as ignored) ***\n");
            Trial::test("ptxas_no_spills_no_stack", || Ok(())).with_ignored_flag(true)
        }
    };
    trials.push(t);
    libtest_mimic::run(&Arguments::from_args(), trials).exit();
}
