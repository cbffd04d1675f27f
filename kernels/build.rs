//! Publishes where this crate's sources are, for the build script of `flashattn`, which
//! compiles them to PTX (as `DEP_FLASHATTN_KERNELS_ROOT`, through `links`). Nothing is built
//! here.

fn main() {
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo::metadata=root={root}");
    println!("cargo::rerun-if-changed=build.rs");
}
