//! Builds the kernel crate to PTX with a nested cargo (own target directory, so it never
//! waits on the outer build's lock) and leaves the PTX in OUT_DIR for `include_str!`. The
//! sources are those of the `flashattn-kernels` dependency, wherever cargo has them (this
//! workspace, a git checkout, a registry), staged into OUT_DIR as a crate of their own.
//! A compile error in a kernel fails this build with the kernel compiler's own messages.
//! The two modules build side by side, and their PTX is kept in the outer target directory
//! for the crate's other builds there (see [`PtxCache`]).
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
    println!("cargo::rerun-if-env-changed=FLASHATTN_KERNEL_TOOLCHAIN");
    println!("cargo::rerun-if-env-changed=DOCS_RS");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    // docs.rs builds documentation only, with no toolchain to install: empty PTX modules.
    if env::var_os("DOCS_RS").is_some() {
        for (stem, _, _) in PTX_TARGETS {
            fs::write(out.join(format!("{stem}.ptx")), "").expect("write PTX to OUT_DIR");
        }
        return;
    }
    let kernels = kernel_sources();
    println!("cargo::rerun-if-changed={}", kernels.join("src").display());
    println!("cargo::rerun-if-changed={}", kernels.join("Cargo.toml").display());
    let toolchain = env::var("FLASHATTN_KERNEL_TOOLCHAIN").unwrap_or_else(|_| KERNEL_TOOLCHAIN.into());
    let cache = PtxCache::new(&out, &kernels, &toolchain);
    let missing: Vec<_> = PTX_TARGETS.iter().filter(|(stem, ..)| !cache.restore(stem, &out.join(format!("{stem}.ptx")))).collect();
    if missing.is_empty() {
        return;
    }
    let crate_dir = stage_kernel_crate(&kernels, &out.join("kernels"));
    let rustup = rustup();
    ensure_toolchain(&rustup, &toolchain);
    // One nested build per module, side by side (each is one codegen unit: one core).
    std::thread::scope(|s| {
        for &&(stem, cpu, features) in &missing {
            let (rustup, toolchain, crate_dir, out, cache) = (&rustup, &toolchain, &crate_dir, &out, &cache);
            s.spawn(move || {
                let ptx = build_ptx(rustup, toolchain, crate_dir, &out.join(format!("ptx-{cpu}")), cpu, features);
                fs::write(out.join(format!("{stem}.ptx")), &ptx).expect("write PTX to OUT_DIR");
                cache.store(stem, &ptx);
            });
        }
    });
}

/// PTX already built from the same kernel sources with the same toolchain, kept in the outer
/// target directory (`<target>/flashattn-ptx/`), so that the other builds of this crate
/// there (another profile, other features, clippy) copy it instead of compiling the kernels
/// again (minutes per module). An entry's name holds a hash of everything the PTX depends on:
/// the sources, the toolchain's name and this script (targets, flags, settings). A toolchain
/// named by channel alone (`FLASHATTN_KERNEL_TOOLCHAIN=nightly`) that rustup updates keeps
/// its old entries: `cargo clean` drops them.
struct PtxCache {
    dir: Option<PathBuf>,
    key: u64,
}

impl PtxCache {
    fn new(out: &Path, kernels: &Path, toolchain: &str) -> Self {
        // OUT_DIR is <target>[/<triple>]/<profile>/build/<package>-<hash>/out.
        let dir = out
            .ancestors()
            .nth(2)
            .filter(|b| b.file_name().is_some_and(|n| n == "build"))
            .and_then(|b| b.ancestors().nth(2))
            .map(|t| t.join("flashattn-ptx"));
        let mut key = Fnv::default();
        key.add(toolchain.as_bytes());
        // This script's own text: the targets, flags and settings of the nested build.
        key.add(include_bytes!("build.rs"));
        let mut files = Vec::new();
        collect_rs(&kernels.join("src"), &mut files);
        files.sort();
        for f in files {
            key.add(f.strip_prefix(kernels).unwrap_or(&f).to_string_lossy().as_bytes());
            key.add(&fs::read(&f).unwrap_or_else(|e| fail(&format!("reading {}: {e}", f.display()))));
        }
        PtxCache { dir, key: key.0 }
    }

    fn entry(&self, stem: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{stem}-{:016x}.ptx", self.key)))
    }

    /// Copies the cached module to `to`; false when there is none.
    fn restore(&self, stem: &str, to: &Path) -> bool {
        self.entry(stem).and_then(|e| fs::read(e).ok()).filter(|ptx| !ptx.is_empty()).is_some_and(|ptx| fs::write(to, ptx).is_ok())
    }

    /// Keeps `ptx` as the module's only entry (written whole, then renamed: a concurrent
    /// reader sees the old file or the new one). A cache that cannot be written is no error.
    fn store(&self, stem: &str, ptx: &str) {
        let (Some(dir), Some(entry)) = (&self.dir, self.entry(stem)) else { return };
        if fs::create_dir_all(dir).is_err() {
            return;
        }
        for old in fs::read_dir(dir).into_iter().flatten().filter_map(|e| e.ok()) {
            if old.file_name().to_string_lossy().starts_with(&format!("{stem}-")) {
                let _ = fs::remove_file(old.path());
            }
        }
        let tmp = dir.join(format!(".{stem}-{}.tmp", std::process::id()));
        if fs::write(&tmp, ptx).is_ok() {
            let _ = fs::rename(&tmp, &entry);
        }
    }
}

/// FNV-1a, 64 bits: a hash that is the same in every build (std's hasher makes no such
/// promise). Each part is followed by its length, so that parts cannot run together.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for &b in bytes.iter().chain(&(bytes.len() as u64).to_le_bytes()) {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn collect_rs(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| fail(&format!("reading {}: {e}", dir.display()))).filter_map(|e| e.ok()) {
        let p = entry.path();
        if p.is_dir() {
            collect_rs(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

/// The `flashattn-kernels` sources this crate depends on: where its build script says they
/// are (`links`), which holds in this workspace, from git and from a registry alike.
fn kernel_sources() -> PathBuf {
    match env::var_os("DEP_FLASHATTN_KERNELS_ROOT") {
        Some(root) => PathBuf::from(root),
        None => fail("DEP_FLASHATTN_KERNELS_ROOT is not set: the flashattn-kernels dependency's build script did not run"),
    }
}

/// Copies the kernel crate's sources into `dir` as a crate of its own (its own workspace, no
/// build script, no dependencies: the nvptx build uses none), so that the nested build
/// writes nothing beside the sources (a registry's or a package's copy) and never finds an
/// enclosing workspace. Files whose contents are unchanged are not rewritten, so the nested
/// cargo rebuilds only when a source changed.
fn stage_kernel_crate(kernels: &Path, dir: &Path) -> PathBuf {
    fn copy_tree(from: &Path, to: &Path, keep: &mut Vec<PathBuf>) {
        fs::create_dir_all(to).unwrap_or_else(|e| fail(&format!("creating {}: {e}", to.display())));
        let entries = fs::read_dir(from).unwrap_or_else(|e| fail(&format!("reading {}: {e}", from.display())));
        for entry in entries.filter_map(|e| e.ok()) {
            let (src, dst) = (entry.path(), to.join(entry.file_name()));
            if src.is_dir() {
                copy_tree(&src, &dst, keep);
            } else if src.extension().is_some_and(|x| x == "rs") {
                write_if_changed(&dst, &fs::read(&src).unwrap_or_else(|e| fail(&format!("reading {}: {e}", src.display()))));
                keep.push(dst);
            }
        }
    }
    let mut keep = Vec::new();
    copy_tree(&kernels.join("src"), &dir.join("src"), &mut keep);
    remove_stale(&dir.join("src"), &keep);
    let manifest = "[package]\nname = \"flashattn-kernels\"\nversion = \"0.0.0\"\nedition = \"2024\"\nbuild = false\n\n\
                    [lib]\nname = \"flashattn_kernels\"\npath = \"src/lib.rs\"\n\n[workspace]\n";
    write_if_changed(&dir.join("Cargo.toml"), manifest.as_bytes());
    dir.to_path_buf()
}

fn write_if_changed(path: &Path, bytes: &[u8]) {
    if fs::read(path).is_ok_and(|old| old == bytes) {
        return;
    }
    fs::write(path, bytes).unwrap_or_else(|e| fail(&format!("writing {}: {e}", path.display())));
}

/// Removes staged sources that are no longer in the kernel crate (a deleted or renamed file).
fn remove_stale(dir: &Path, keep: &[PathBuf]) {
    for entry in fs::read_dir(dir).into_iter().flatten().filter_map(|e| e.ok()) {
        let p = entry.path();
        if p.is_dir() {
            remove_stale(&p, keep);
        } else if !keep.contains(&p) {
            let _ = fs::remove_file(&p);
        }
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
    // On stderr, not as a cargo warning: cargo replays a build script's warnings on every
    // later build, where "installing" would be false.
    eprintln!("installing the kernels' toolchain {toolchain} with rust-src (once; about 300 MB)");
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
    println!("cargo:warning=installed the kernels' toolchain {toolchain} with rust-src (a one-time step of the first build)");
}

/// The nested build's rustc flags for one module.
fn rustflags(cpu: &str, features: &str) -> Vec<String> {
    let mut flags = vec![format!("-Ctarget-cpu={cpu}"), "-Zunstable-options".into(), "-Cpanic=immediate-abort".into()];
    if !features.is_empty() {
        flags.push(format!("-Ctarget-feature={features}"));
    }
    flags
}

/// The nested build's arguments after `--`. PTX is the assembly output; a full unroll keeps
/// register arrays in registers.
const NESTED_ARGS: &[&str] = &["--emit=asm", "-Cllvm-args=-unroll-threshold=4000"];

fn build_ptx(rustup: &Path, toolchain: &str, crate_dir: &Path, target_dir: &Path, cpu: &str, features: &str) -> String {
    let rustflags = rustflags(cpu, features);
    let mut cmd = rustup_cmd(rustup);
    cmd.args(["run", toolchain, "cargo", "rustc", "--lib", "--release", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .arg("--manifest-path")
        .arg(crate_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--")
        .args(NESTED_ARGS)
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
