//! Builds the kernel crate to PTX with a nested cargo (own target directory, so it never
//! waits on the outer build's lock) and leaves the PTX in OUT_DIR for `include_str!`.
//! A compile error in a kernel fails this build with the kernel compiler's own messages.
//! No CUDA toolkit is involved: rustc's NVPTX backend writes the PTX.
//!
//! The workspace builds on stable Rust; only the kernels' nvptx build needs nightly
//! (`-Zbuild-std=core`, the nvptx intrinsics). It runs on the pinned toolchain
//! [`KERNEL_TOOLCHAIN`] through rustup, which this script installs (with `rust-src`) when it
//! is missing: machines that run rustup with automatic installation off
//! (`RUSTUP_AUTO_INSTALL=0`) get it too. `FLASHATTN_KERNEL_TOOLCHAIN` names another one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fs};

/// The nightly the kernels are built with (and tested with: a newer one may generate other
/// PTX, with other register counts).
const KERNEL_TOOLCHAIN: &str = "nightly-2026-05-20";

/// (file stem, -Ctarget-cpu, extra target features): one PTX module each. The sm_90a module
/// holds only the kernels that need Hopper's own instructions (wgmma); see
/// `registry::in_module`.
const PTX_TARGETS: &[(&str, &str, &str)] = &[("flashattn_sm80", "sm_80", ""), ("flashattn_sm90a", "sm_90a", "+ptx81")];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let kernels = manifest.join("..").join("kernels");
    println!("cargo:rerun-if-changed={}", kernels.join("src").display());
    println!("cargo:rerun-if-changed={}", kernels.join("Cargo.toml").display());
    println!("cargo:rerun-if-env-changed=FLASHATTN_KERNEL_TOOLCHAIN");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let toolchain = env::var("FLASHATTN_KERNEL_TOOLCHAIN").unwrap_or_else(|_| KERNEL_TOOLCHAIN.into());
    let rustup = rustup();
    ensure_toolchain(&rustup, &toolchain);
    for (stem, cpu, features) in PTX_TARGETS {
        let ptx = build_ptx(&rustup, &toolchain, &kernels, &out.join(format!("ptx-{cpu}")), cpu, features);
        fs::write(out.join(format!("{stem}.ptx")), ptx).expect("write PTX to OUT_DIR");
    }
}

/// Stops the build with `msg` (cargo shows a build script's stderr when it fails).
fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}

/// The rustup binary: `RUSTUP` if set, else `rustup` on PATH, else `$CARGO_HOME/bin/rustup`
/// (or `~/.cargo/bin/rustup`).
fn rustup() -> PathBuf {
    if let Ok(p) = env::var("RUSTUP") {
        return PathBuf::from(p);
    }
    let works = |p: &Path| Command::new(p).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    let on_path = PathBuf::from("rustup");
    if works(&on_path) {
        return on_path;
    }
    let home = env::var("CARGO_HOME").map(PathBuf::from).or_else(|_| env::var("HOME").map(|h| Path::new(&h).join(".cargo")));
    if let Ok(home) = home {
        let p = home.join("bin").join("rustup");
        if works(&p) {
            return p;
        }
    }
    fail(&format!(
        "building the kernels needs rustup (https://rustup.rs), which installs their toolchain {KERNEL_TOOLCHAIN} with rust-src; \
         none was found on PATH or in $CARGO_HOME/bin (set RUSTUP to its path)"
    ))
}

/// A `rustup` command without the outer build's toolchain choice (rustup's proxies set
/// RUSTUP_TOOLCHAIN for the processes below them).
fn rustup_cmd(rustup: &Path) -> Command {
    let mut cmd = Command::new(rustup);
    cmd.env_remove("RUSTUP_TOOLCHAIN");
    cmd
}

/// Installs `toolchain` with rust-src if it is not there (an explicit install, which rustup
/// does with automatic installation off too).
fn ensure_toolchain(rustup: &Path, toolchain: &str) {
    let installed = rustup_cmd(rustup).args(["run", toolchain, "rustc", "--version"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    let has_src = || {
        rustup_cmd(rustup)
            .args(["component", "list", "--installed", "--toolchain", toolchain])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.starts_with("rust-src")))
    };
    if installed.is_ok_and(|s| s.success()) && has_src() {
        return;
    }
    println!("cargo:warning=installing the kernels' toolchain {toolchain} with rust-src (once; about 300 MB)");
    let status = rustup_cmd(rustup)
        .args(["toolchain", "install", toolchain, "--profile", "minimal", "--component", "rust-src", "--no-self-update"])
        .stdout(Stdio::from(std::io::stderr()))
        .status();
    if !status.is_ok_and(|s| s.success()) || !has_src() {
        fail(&format!(
            "could not install the kernels' toolchain {toolchain} (rustup's output above); \
             install it by hand: rustup toolchain install {toolchain} --profile minimal --component rust-src"
        ));
    }
}

fn build_ptx(rustup: &Path, toolchain: &str, kernels: &Path, target_dir: &Path, cpu: &str, features: &str) -> String {
    let mut rustflags = vec![format!("-Ctarget-cpu={cpu}"), "-Zunstable-options".into(), "-Cpanic=immediate-abort".into()];
    if !features.is_empty() {
        rustflags.push(format!("-Ctarget-feature={features}"));
    }
    let mut cmd = rustup_cmd(rustup);
    cmd.args(["run", toolchain, "cargo", "rustc", "--lib", "--release", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
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
    // The outer build's settings are for the host and its toolchain, not for nvptx64.
    for var in [
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTFLAGS",
        "CARGO",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_PROFILE_RELEASE_LTO",
        "CARGO_PROFILE_RELEASE_PANIC",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().unwrap_or_else(|e| fail(&format!("could not run `{}` to build the kernels: {e}", rustup.display())));
    if !status.success() {
        fail(&format!("building the kernel crate to PTX for {cpu} with {toolchain} failed (kernel compiler output above)"));
    }
    // The newest flashattn_kernels-*.s under deps/ is this build's PTX.
    let deps = target_dir.join("nvptx64-nvidia-cuda").join("release").join("deps");
    let newest = fs::read_dir(&deps)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", deps.display())))
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("flashattn_kernels-") && n.ends_with(".s")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| fail(&format!("no flashattn_kernels-*.s in {}", deps.display())));
    fs::read_to_string(newest.path()).unwrap_or_else(|e| fail(&format!("reading the PTX {}: {e}", newest.path().display())))
}
