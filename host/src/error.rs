//! Every way a call can fail, as one typed error that names the offending values.

use cudarc::driver::DriverError;
use flashattn_kernels::dev::emu::EmuError;

/// Errors of this crate. Input errors are found before anything is launched.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// libcuda could not be loaded: no NVIDIA driver on this machine.
    NoDriver,
    /// The driver is there but no usable device was found.
    NoDevice {
        /// What the driver said.
        reason: String,
    },
    /// The PTX file an environment variable names in place of the embedded kernels
    /// (`ptx::override_var`) cannot be used.
    PtxOverride {
        /// The variable.
        var: &'static str,
        /// The path it names.
        path: String,
        /// Why not.
        reason: String,
    },
    /// This binary's embedded PTX module holds no kernel (empty in a `DOCS_RS` build, zeroed
    /// in the binaries `.ci/gpu-bundle` packs) and no file replaces it (`ptx::override_var`).
    BlankPtx {
        /// The module's architecture.
        arch: flashattn_kernels::registry::Arch,
        /// The variable that names a replacement.
        var: &'static str,
    },
    /// A CUDA driver call failed.
    Cuda {
        /// Which operation.
        op: &'static str,
        /// The driver's error.
        source: DriverError,
    },
    /// The emulator found a fault in a kernel.
    Emulator(EmuError),
    /// A tensor has the wrong number of dimensions.
    Rank {
        /// Which tensor.
        tensor: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// The rank required.
        expected: usize,
    },
    /// A dimension is zero.
    EmptyDimension {
        /// Which tensor.
        tensor: &'static str,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// Two tensors disagree on a dimension they must share.
    ShapeMismatch {
        /// What must match, e.g. "batch of q and k".
        what: &'static str,
        /// The two values.
        left: usize,
        right: usize,
    },
    /// K and V must have the same shape.
    KvShapeMismatch {
        /// Shape of K.
        k: Vec<usize>,
        /// Shape of V.
        v: Vec<usize>,
    },
    /// head_dim must be 1 to 256.
    UnsupportedHeadDim {
        /// The head_dim given.
        head_dim: usize,
    },
    /// heads_q must be a multiple of heads_kv (GQA/MQA).
    HeadsNotDivisible {
        /// Query heads.
        heads_q: usize,
        /// Key/value heads.
        heads_kv: usize,
    },
    /// A size beyond what the kernels' index arithmetic or the launch grid can hold.
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// Its value.
        value: usize,
        /// The largest value allowed.
        max: usize,
    },
    /// The softmax scale must be finite, of magnitude at most [`crate::MAX_SCALE`].
    InvalidScale {
        /// The scale given.
        scale: f32,
        /// The largest magnitude accepted.
        max: f32,
    },
    /// The softcap must be finite, from [`crate::MIN_SOFTCAP`] to [`crate::MAX_SOFTCAP`].
    InvalidSoftcap {
        /// The softcap given.
        softcap: f32,
        /// The smallest and largest accepted.
        min: f32,
        max: f32,
    },
    /// An output buffer has the wrong shape.
    OutputShape {
        /// Which output.
        tensor: &'static str,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape given.
        got: Vec<usize>,
    },
    /// An input view has the wrong shape.
    InputShape {
        /// Which input.
        tensor: &'static str,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape given.
        got: Vec<usize>,
    },
    /// A view's strides do not fit the kernels.
    Layout {
        /// Which tensor.
        tensor: &'static str,
        /// Its shape and strides.
        shape: Vec<usize>,
        strides: Vec<usize>,
        /// What is wrong.
        why: String,
    },
    /// A sub-view ([`crate::View::narrow`], `split_at`, `unbind`, and those of
    /// [`crate::ViewMut`]) asked for what the view does not have.
    SubView {
        /// The operation: "narrow", "split_at" or "unbind".
        op: &'static str,
        /// The view's shape.
        shape: Vec<usize>,
        /// The dimension asked for.
        dim: usize,
        /// What is wrong, with the values.
        why: String,
    },
    /// A view reaches past the end of its memory.
    OutOfBounds {
        /// Which tensor.
        tensor: &'static str,
        /// Elements the view needs from the memory's start.
        needed: usize,
        /// Elements the memory holds.
        len: usize,
    },
    /// A view's rows are not aligned as the kernels' vector loads need.
    Misaligned {
        /// Which tensor.
        tensor: &'static str,
        /// The address or stride at fault.
        what: &'static str,
        /// Its value in bytes.
        value: usize,
        /// The alignment required in bytes.
        align: usize,
    },
    /// An output shares memory with another output or an input.
    Overlap {
        /// The output.
        output: &'static str,
        /// What it overlaps.
        other: &'static str,
    },
    /// The backward's workspace is too small (or not one-dimensional).
    Workspace {
        /// Elements needed ([`crate::FlashAttn::backward_workspace_len`]).
        needed: usize,
        /// The workspace's shape.
        got: Vec<usize>,
    },
    /// The backward was given an O, LSE or O residual other than the one its forward wrote.
    NotForwardOutput {
        /// Which one.
        tensor: &'static str,
    },
    /// An output the call must write was not given.
    MissingOutput {
        /// Which output.
        tensor: &'static str,
        /// Why it is needed.
        why: &'static str,
    },
    /// The backward was given a forward output that no forward has written (or whose forward
    /// failed).
    NoForward,
    /// The backward was given an input other than the one its forward read.
    NotForwardInput {
        /// Which input.
        tensor: &'static str,
    },
    /// Host data does not fill the shape asked for.
    HostLength {
        /// Elements the shape needs.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A tensor belongs to another [`crate::FlashAttn`] (another device or the emulator).
    WrongDevice {
        /// Which tensor.
        tensor: &'static str,
    },
    /// No kernel family of that name.
    UnknownKernel {
        /// The name asked for.
        name: String,
        /// The families there are.
        available: Vec<&'static str>,
    },
    /// The kernel asked for by name is compiled for an architecture this device lacks.
    UnsupportedDevice {
        /// The kernel's entry name.
        kernel: &'static str,
        /// The PTX module it is in.
        needs: flashattn_kernels::registry::Arch,
        /// The device's name.
        device: String,
    },
    /// A kernel family has no variant for this dtype and head_dim.
    NoVariant {
        /// The family.
        family: String,
        /// The dtype.
        dtype: &'static str,
        /// The head_dim.
        head_dim: usize,
    },
    /// A backward kernel family that is not bitwise deterministic was named with
    /// `deterministic: true`.
    NotDeterministic {
        /// The family.
        family: String,
    },
    /// An attention sink logit that is NaN or +inf (`FlashAttn::sinks`: each must be finite,
    /// or -inf for none).
    InvalidSink {
        /// The query head.
        head: usize,
        /// Its value.
        value: f32,
    },
    /// An ALiBi slope that is not finite, or whose bias over the call's sequences exceeds
    /// `MAX_ALIBI_BIAS` (|slope| above `max`).
    InvalidAlibiSlope {
        /// Its index in the slopes (row-major).
        index: usize,
        /// Its value.
        slope: f32,
        /// The largest magnitude accepted here.
        max: f32,
    },
    /// An option this version does not implement yet (named, with the value given).
    Unsupported {
        /// What is not implemented.
        what: &'static str,
        /// The value given.
        value: String,
    },
    /// A split-KV forward (`FwdOptions::splits`) that cannot run as asked.
    Splits {
        /// The parts asked for.
        splits: u32,
        /// Why not.
        why: String,
    },
    /// A variable-length batch's offsets or lengths are inconsistent (`crate::SeqLens`).
    SeqLens {
        /// Which list (`cu_seqlens_q`, `cu_seqlens_k`, `seqused_k`).
        what: &'static str,
        /// The entry at fault.
        index: usize,
        /// Its value.
        value: u64,
        /// What it must be.
        why: String,
    },
    /// The launch needs more shared memory per block than the device allows.
    SharedMemory {
        /// The kernel.
        kernel: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes the device allows a block.
        available: usize,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoDriver => write!(f, "no CUDA driver: libcuda could not be loaded (is an NVIDIA driver installed?)"),
            Error::NoDevice { reason } => write!(f, "no usable CUDA device: {reason}"),
            Error::PtxOverride { var, path, reason } => write!(f, "{var}={path} cannot replace the embedded kernels: {reason}"),
            Error::BlankPtx { arch, var } => write!(
                f,
                "this binary's embedded {arch:?} PTX is blank (empty in a DOCS_RS build, zeroed in binaries .ci/gpu-bundle packs): set {var} to the module's file (a bundle's .gpu/ptx/; its run.sh sets it)"
            ),
            Error::Cuda { op, source } => write!(f, "CUDA call failed in {op}: {source:?}"),
            Error::Emulator(e) => write!(f, "{e}"),
            Error::Rank { tensor, shape, expected } => {
                write!(f, "{tensor} has shape {shape:?}; expected {expected} dimensions")
            }
            Error::EmptyDimension { tensor, shape } => write!(f, "{tensor} has shape {shape:?}; no dimension may be 0"),
            Error::ShapeMismatch { what, left, right } => write!(f, "{what} differ: {left} vs {right}"),
            Error::KvShapeMismatch { k, v } => write!(f, "k has shape {k:?} but v has shape {v:?}; they must match"),
            Error::UnsupportedHeadDim { head_dim } => {
                write!(f, "head_dim {head_dim} is not supported: it must be from 1 to 256")
            }
            Error::HeadsNotDivisible { heads_q, heads_kv } => {
                write!(f, "heads_q {heads_q} is not a multiple of heads_kv {heads_kv}")
            }
            Error::TooLarge { what, value, max } => write!(f, "{what} is {value}; at most {max} is supported"),
            Error::InvalidScale { scale, max } => write!(
                f,
                "softmax_scale {scale} is outside [-{max}, {max}]: a larger scale leaves the kernels' f32 softmax statistics no precision on ordinary scores (a scale of {max} is already a hard max)"
            ),
            Error::InvalidSoftcap { softcap, min, max } => write!(
                f,
                "softcap {softcap} is outside [{min}, {max}]: below, |scale| / softcap leaves f32's range; above, capped scores leave the kernels' f32 softmax statistics no precision (a softcap of {max} already caps nothing an ordinary score reaches)"
            ),
            Error::OutputShape { tensor, expected, got } => {
                write!(f, "output {tensor} has shape {got:?}; expected {expected:?}")
            }
            Error::InputShape { tensor, expected, got } => write!(f, "{tensor} has shape {got:?}; expected {expected:?}"),
            Error::Layout { tensor, shape, strides, why } => {
                write!(f, "{tensor} (shape {shape:?}, strides {strides:?}) cannot be used: {why}")
            }
            Error::SubView { op, shape, dim, why } => {
                write!(f, "{op} of dimension {dim} of a view of shape {shape:?}: {why}")
            }
            Error::OutOfBounds { tensor, needed, len } => {
                write!(f, "{tensor} reaches element {} of its memory, which holds {len}", needed.saturating_sub(1))
            }
            Error::Misaligned { tensor, what, value, align } => write!(
                f,
                "{tensor}: {what} is {value} bytes, not a multiple of {align} (rows must be aligned as in a contiguous tensor of this head_dim)"
            ),
            Error::Overlap { output, other } => write!(f, "output {output} shares memory with {other}"),
            Error::Workspace { needed, got } => {
                write!(f, "the backward's workspace has shape {got:?}; it needs one dimension of at least {needed} f32 elements")
            }
            Error::NotForwardOutput { tensor } => {
                write!(f, "{tensor} is not what the forward wrote: the backward takes the forward's own o, lse and o_lo")
            }
            Error::MissingOutput { tensor, why } => write!(f, "output {tensor} is missing: {why}"),
            Error::NoForward => {
                write!(f, "the forward output given to the backward holds no forward result (no forward wrote it, or the last one failed)")
            }
            Error::NotForwardInput { tensor } => {
                write!(f, "{tensor} is not the tensor the forward read: the backward takes the forward's own q, k and v")
            }
            Error::HostLength { expected, got } => {
                write!(f, "host data has {got} elements; the shape needs {expected}")
            }
            Error::WrongDevice { tensor } => write!(f, "{tensor} was created by another FlashAttn instance (device)"),
            Error::UnknownKernel { name, available } => {
                write!(f, "no kernel family `{name}`; available: {}", available.join(", "))
            }
            Error::UnsupportedDevice { kernel, needs, device } => {
                write!(f, "kernel {kernel} is built for {needs:?} (compute capability 9.0 for Sm90a), which {device} cannot run")
            }
            Error::NoVariant { family, dtype, head_dim } => {
                write!(f, "kernel family `{family}` has no variant for {dtype} with head_dim {head_dim}")
            }
            Error::NotDeterministic { family } => {
                write!(f, "backward kernel family `{family}` is not bitwise deterministic (atomic adds), but deterministic was requested")
            }
            Error::InvalidSink { head, value } => {
                write!(f, "the attention sink of head {head} is {value}: each sink must be finite, or -inf for none")
            }
            // At creation (no sequences yet) `max` is f32::MAX: only finiteness is checked.
            Error::InvalidAlibiSlope { index, slope, max } if *max == f32::MAX => {
                write!(f, "ALiBi slope {index} is {slope}: each slope must be finite")
            }
            Error::InvalidAlibiSlope { index, slope, max } => write!(
                f,
                "ALiBi slope {index} is {slope}: each slope must be finite, and of magnitude at most {max:e} for these sequences (|slope| (seqlen_q + seqlen_k) <= {:e})",
                crate::alibi::MAX_ALIBI_BIAS
            ),
            Error::Unsupported { what, value } => write!(f, "{what} is not implemented yet (given {value})"),
            Error::Splits { splits, why } => write!(f, "a split-KV forward in {splits} parts cannot run: {why}"),
            Error::SeqLens { what, index, value, why } => write!(f, "{what}[{index}] is {value}: {why}"),
            Error::SharedMemory { kernel, needed, available } => {
                write!(f, "kernel {kernel} needs {needed} bytes of shared memory per block; the device allows {available}")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<EmuError> for Error {
    fn from(e: EmuError) -> Self {
        Error::Emulator(e)
    }
}

/// Shorthand.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps a driver result with the name of the operation.
pub(crate) fn cuda<T>(op: &'static str, r: std::result::Result<T, DriverError>) -> Result<T> {
    r.map_err(|source| Error::Cuda { op, source })
}
