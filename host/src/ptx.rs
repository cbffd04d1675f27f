//! The kernels' PTX, built from `kernels/` by `build.rs` and embedded here.

/// PTX for sm_80 and newer (the driver compiles it for the device at module load).
pub const PTX_SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/flashattn_sm80.ptx"));

/// PTX for sm_90a (compute capability 9.0 only): the kernels that use wgmma.
pub const PTX_SM90A: &str = include_str!(concat!(env!("OUT_DIR"), "/flashattn_sm90a.ptx"));

/// Every PTX module: the target it was built for, the variants' arch, the PTX.
pub const MODULES: &[(&str, flashattn_kernels::registry::Arch, &str)] =
    &[("sm_80", flashattn_kernels::registry::Arch::Sm80, PTX_SM80), ("sm_90a", flashattn_kernels::registry::Arch::Sm90a, PTX_SM90A)];

/// The module that holds the variants of `arch`: the embedded one, or the file named by
/// [`override_var`] when that is set (and readable: [`override_error`]).
pub fn module(arch: flashattn_kernels::registry::Arch) -> &'static str {
    match replacement(arch) {
        Some(Ok(ptx)) => ptx,
        _ => embedded(arch),
    }
}

/// The module of `arch` built into this binary.
fn embedded(arch: flashattn_kernels::registry::Arch) -> &'static str {
    use flashattn_kernels::registry::Arch;
    match arch {
        Arch::Sm80 => PTX_SM80,
        Arch::Sm90a => PTX_SM90A,
    }
}

/// The environment variable that names a PTX file to load instead of the embedded module of
/// `arch`, for trying a kernel variant without rebuilding the host: `FLASHATTN_PTX_SM80`,
/// `FLASHATTN_PTX_SM90A`. The file must come from kernel sources whose parameter structs and
/// entry names match this build's (the host does not check that); a GPU context reports
/// the replacement on stderr when it loads it.
pub fn override_var(arch: flashattn_kernels::registry::Arch) -> &'static str {
    use flashattn_kernels::registry::Arch;
    match arch {
        Arch::Sm80 => "FLASHATTN_PTX_SM80",
        Arch::Sm90a => "FLASHATTN_PTX_SM90A",
    }
}

/// Why the file [`override_var`] names cannot serve (unreadable, or no entry in it), if it
/// is set and cannot: a GPU context is then refused, not silently given the embedded module.
pub fn override_error(arch: flashattn_kernels::registry::Arch) -> Option<(String, String)> {
    match replacement(arch) {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    }
}

/// The replacement module of `arch`, read once per process: None where the variable is not
/// set, else the PTX or (path, reason).
fn replacement(arch: flashattn_kernels::registry::Arch) -> Option<&'static Result<String, (String, String)>> {
    use flashattn_kernels::registry::Arch;
    use std::sync::OnceLock;
    type Slot = OnceLock<Option<Result<String, (String, String)>>>;
    static SM80: Slot = OnceLock::new();
    static SM90A: Slot = OnceLock::new();
    let cell = match arch {
        Arch::Sm80 => &SM80,
        Arch::Sm90a => &SM90A,
    };
    cell.get_or_init(|| {
        let path = std::env::var_os(override_var(arch))?;
        let shown = path.to_string_lossy().into_owned();
        Some(match std::fs::read_to_string(&path) {
            Ok(ptx) if !entries(&ptx).is_empty() => Ok(ptx),
            Ok(_) => Err((shown, "no .entry in it".into())),
            Err(e) => Err((shown, e.to_string())),
        })
    })
    .as_ref()
}

/// Whether the embedded module of `arch` is blank: empty (a `DOCS_RS` build) or zeroed after
/// the build (as `.ci/gpu-bundle` does to the binaries it packs, handing the PTX back
/// through [`override_var`]).
pub fn is_blank(arch: flashattn_kernels::registry::Arch) -> bool {
    embedded(arch).bytes().take(64).all(|b| b == 0)
}

/// Whether [`module`] of `arch` is a replacement ([`override_var`]).
pub fn is_overridden(arch: flashattn_kernels::registry::Arch) -> bool {
    matches!(replacement(arch), Some(Ok(_)))
}

/// The module of `arch` as the driver gets it: [`module`] with `.maxnreg` on every entry whose
/// variant asks for one there ([`BwdVariant::max_regs_in`](flashattn_kernels::registry::BwdVariant::max_regs_in)).
/// Built once per process.
pub fn loaded(arch: flashattn_kernels::registry::Arch) -> &'static str {
    use flashattn_kernels::registry::{Arch, BWD_VARIANTS};
    use std::sync::OnceLock;
    static SM80: OnceLock<String> = OnceLock::new();
    static SM90A: OnceLock<String> = OnceLock::new();
    let cell = match arch {
        Arch::Sm80 => &SM80,
        Arch::Sm90a => &SM90A,
    };
    cell.get_or_init(|| {
        let mut ptx = module(arch).to_string();
        for v in BWD_VARIANTS.iter().filter(|v| v.arch() == arch) {
            // A registered variant is always an entry, and so are its window, general and
            // variable-length twins (tests/tests/ptx.rs); each takes its entry's cap.
            for (e, name) in v.entries() {
                if let Some(regs) = v.max_regs_in(e) {
                    ptx = with_maxnreg(&ptx, name, regs).unwrap_or(ptx);
                }
            }
        }
        ptx
    })
}

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
    ptx.lines().map(str::trim).filter(|l| l.starts_with(".extern") && !l.starts_with(".extern .shared")).collect()
}

/// A module with the single entry `name` of `ptx`: every top-level item but the other
/// entries (the header, shared and global declarations, `.func` helpers), so the driver
/// JIT-compiles one kernel instead of the whole module (~1.5 minutes for sm_80's, measured
/// with ptxas 13.0). `None` if `ptx` has no such entry.
pub fn entry_module(ptx: &str, name: &str) -> Option<String> {
    let mut out = String::with_capacity(ptx.len() / 8);
    let (mut found, mut skipping) = (false, false);
    for line in ptx.lines() {
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            let this = rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or(rest);
            skipping = this != name;
            found |= this == name;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        } else if line == "}" {
            // The entry's body ends at the first closing brace in column 0.
            skipping = false;
        }
    }
    found.then_some(out)
}

/// `module` (one that has entry `name`) with the performance directive `.maxnreg regs` on
/// that entry: ptxas then fits it in `regs` registers per thread (for more
/// blocks per SM), spilling if it must. `None` if the entry's parameter list is not found.
pub fn with_maxnreg(module: &str, name: &str, regs: u32) -> Option<String> {
    let start = module.find(&format!(".visible .entry {name}("))?;
    // The parameter list closes on a line of its own, before the body's brace; a `.maxnreg`
    // already there is replaced.
    let close = start + module[start..].find("\n)\n")? + 3;
    let rest = &module[close..];
    let rest = if rest.starts_with(".maxnreg ") { rest.split_once('\n').map_or("", |(_, r)| r) } else { rest };
    Some(format!("{}.maxnreg {regs}\n{rest}", &module[..close]))
}
