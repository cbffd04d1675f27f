//! Builds the kernel crate to PTX with a nested cargo (own target directory, so it never
//! waits on the outer build's lock) and leaves the PTX in OUT_DIR for `include_str!`.
//! A compile error in a kernel fails this build with the kernel compiler's own messages.
//! No CUDA toolkit is involved: rustc's NVPTX backend writes the PTX.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fs};

/// (file stem, -Ctarget-cpu, extra target features): one PTX module each. The sm_90a module
/// holds only the kernels that need Hopper's own instructions (wgmma); see
/// `registry::in_module`.
const PTX_TARGETS: &[(&str, &str, &str)] = &[("flashattn_sm80", "sm_80", ""), ("flashattn_sm90a", "sm_90a", "+ptx81")];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let kernels = manifest.join("..").join("kernels");
    println!("cargo:rerun-if-changed={}", kernels.join("src").display());
    println!("cargo:rerun-if-changed={}", kernels.join("Cargo.toml").display());
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for (stem, cpu, features) in PTX_TARGETS {
        let ptx = build_ptx(&cargo, &kernels, &out.join(format!("ptx-{cpu}")), cpu, features);
        fs::write(out.join(format!("{stem}.ptx")), ptx).expect("write PTX to OUT_DIR");
    }
}

fn build_ptx(cargo: &str, kernels: &Path, target_dir: &Path, cpu: &str, features: &str) -> String {
    let mut rustflags = vec![format!("-Ctarget-cpu={cpu}"), "-Zunstable-options".into(), "-Cpanic=immediate-abort".into()];
    if !features.is_empty() {
        rustflags.push(format!("-Ctarget-feature={features}"));
    }
    let mut cmd = Command::new(cargo);
    cmd.args(["rustc", "--lib", "--release", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .arg("--manifest-path")
        .arg(kernels.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        // PTX is the assembly output; a full unroll keeps register arrays in registers.
        .args(["--", "--emit=asm", "-Cllvm-args=-unroll-threshold=4000"])
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags.join("\x1f"))
        // One codegen unit: one .s file holding every kernel.
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .stdout(Stdio::from(std::io::stderr()));
    // The outer build's settings are for the host, not for nvptx64.
    for var in [
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PROFILE_RELEASE_LTO",
        "CARGO_PROFILE_RELEASE_PANIC",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("could not run `{cargo}` to build the kernels: {e}"));
    if !status.success() {
        eprintln!("error: building the kernel crate to PTX for {cpu} failed (kernel compiler output above)");
        std::process::exit(1);
    }
    // The newest flashattn_kernels-*.s under deps/ is this build's PTX.
    let deps = target_dir.join("nvptx64-nvidia-cuda").join("release").join("deps");
    let newest = fs::read_dir(&deps)
        .unwrap_or_else(|e| panic!("reading {}: {e}", deps.display()))
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("flashattn_kernels-") && n.ends_with(".s")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("no flashattn_kernels-*.s in {}", deps.display()));
    fs::read_to_string(newest.path()).expect("read PTX")
}
