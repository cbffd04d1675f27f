//! The kernels' PTX, built from `kernels/` by `build.rs` and embedded here.

/// PTX for sm_80 and newer (the driver compiles it for the device at module load).
pub const PTX_SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/flashattn_sm80.ptx"));

/// Every PTX module, with the target it was built for.
pub const MODULES: &[(&str, &str)] = &[("sm_80", PTX_SM80)];

/// The `.entry` names in a PTX module.
pub fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|rest| rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or(rest))
        .collect()
}

/// Declarations of symbols the module uses but does not define, other than the launch-sized
/// shared memory (an `extern .shared` array by design). A loadable module has none.
pub fn unresolved(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .map(str::trim)
        .filter(|l| l.starts_with(".extern") && !l.starts_with(".extern .shared"))
        .collect()
}
