//! Where kernels run: a CUDA device through cudarc, or the CPU emulator. Tensors live there.

use crate::dtype::Dtype;
use crate::error::{Error, Result, cuda};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use cudarc::nvrtc::Ptx;
use flashattn_kernels::registry::Arch;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A CUDA device with the kernels' module loaded once; functions are looked up once each.
pub(crate) struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// The PTX modules this device runs: sm_80 always, sm_90a on compute capability 9.0; not
    /// loaded: each kernel is loaded on first use as a module of its own
    /// ([`crate::ptx::entry_module`]), JIT-compiled alone (about a second), or with
    /// `FLASHATTN_EAGER_MODULES=1` each loaded whole at start (the driver JIT-compiles every
    /// kernel in it: one to two minutes on a fresh machine).
    modules: Vec<(Arch, Option<Arc<CudaModule>>)>,
    /// `FLASHATTN_MAXNREG=name=regs[,name=regs..]` (an experiment's knob, lazy loading only):
    /// load kernel `name` with `.maxnreg regs` ([`crate::ptx::with_maxnreg`]).
    maxnreg: Vec<(String, u32)>,
    /// Functions, each loaded once (on first use, by whichever thread asks first: other
    /// kernels load meanwhile, each JIT compilation taking about a second), with the dynamic
    /// shared memory each is allowed so far.
    functions: Mutex<HashMap<&'static str, Arc<LoadedFn>>>,
    /// Largest dynamic shared memory a block may opt into.
    pub(crate) max_smem_optin: usize,
    /// Multiprocessors, and the shared memory each holds (split-KV's automatic count).
    pub(crate) sms: usize,
    pub(crate) smem_per_sm: usize,
}

/// One kernel as loaded: the function (or why it could not be loaded) and its shared-memory
/// allowance.
#[derive(Default)]
pub(crate) struct LoadedFn {
    f: OnceLock<std::result::Result<CudaFunction, Error>>,
    smem_allowed: Mutex<usize>,
}

pub(crate) enum Backend {
    Cuda(CudaBackend),
    Emulator,
}

/// Runs attention on one device: a CUDA GPU, or the CPU emulator of the same kernels.
/// Create one and reuse it: the context and module are set up once.
pub struct FlashAttn {
    pub(crate) backend: Backend,
    pub(crate) id: u64,
    /// Device allocations made so far ([`FlashAttn::device_allocations`]).
    allocations: AtomicU64,
}

impl std::fmt::Debug for FlashAttn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlashAttn").field("device", &self.device_name()).field("archs", &self.archs()).finish()
    }
}

/// Whether this machine has a loadable CUDA driver (libcuda).
pub fn driver_present() -> bool {
    // Asked directly, not through cudarc: its own check exists only when it loads the driver,
    // not when another crate has it link the driver (then this process has it already).
    let names: &[&str] = if cfg!(windows) { &["nvcuda.dll"] } else { &["libcuda.so.1", "libcuda.so"] };
    // SAFETY: loading the driver library runs only its initialisers, as cudarc's loading does.
    names.iter().any(|&name| unsafe { libloading::Library::new(name) }.is_ok())
}

impl FlashAttn {
    /// The CUDA device `ordinal` (its primary context, the default stream), with the
    /// kernels' PTX loaded. Errors (never panics) when there is no driver or no such device.
    pub fn cuda(ordinal: usize) -> Result<FlashAttn> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::NoDevice { reason: format!("device {ordinal}: {e:?}") })?;
        FlashAttn::from_stream(ctx.default_stream())
    }

    /// Runs on the caller's cudarc stream (and its context): every kernel, copy and memset is
    /// queued there, in order with the caller's own work, with no synchronisation on the
    /// host. The caller's `CudaSlice`s of this context can be used as views ([`View::cuda`]).
    ///
    /// [`View::cuda`]: crate::View::cuda
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<FlashAttn> {
        let ctx = stream.context().clone();
        let ordinal = ctx.ordinal();
        let cc = (
            cuda("reading the compute capability", ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR))?,
            cuda("reading the compute capability", ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))?,
        );
        if cc < (8, 0) {
            return Err(Error::NoDevice {
                reason: format!("device {ordinal} has compute capability {}.{}; the kernels need 8.0 or later", cc.0, cc.1),
            });
        }
        let mut archs = vec![Arch::Sm80];
        if cc == (9, 0) {
            archs.push(Arch::Sm90a);
        }
        // Per kernel by default (first ran on the H200 at 4256d7d: the wgmma_atomic GPU
        // tests, 22 of 22, and the backward benches).
        let lazy = !std::env::var("FLASHATTN_EAGER_MODULES").is_ok_and(|v| v == "1");
        let maxnreg = std::env::var("FLASHATTN_MAXNREG")
            .unwrap_or_default()
            .split(',')
            .filter_map(|kv| kv.split_once('=').and_then(|(k, v)| Some((k.trim().to_string(), v.trim().parse().ok()?))))
            .collect();
        let mut modules = Vec::new();
        for &arch in &archs {
            let var = crate::ptx::override_var(arch);
            if let Some((path, reason)) = crate::ptx::override_error(arch) {
                return Err(Error::PtxOverride { var, path, reason });
            }
            if crate::ptx::is_overridden(arch) {
                eprintln!("flashattn: {var} is set: the {arch:?} kernels come from that file, not from this build");
            } else if crate::ptx::is_blank(arch) {
                return Err(Error::BlankPtx { arch, var });
            }
        }
        for arch in archs {
            let m = match lazy {
                true => None,
                false => Some(cuda("loading the kernels' PTX", ctx.load_module(Ptx::from_src(crate::ptx::loaded(arch))))?),
            };
            modules.push((arch, m));
        }
        let max_smem_optin = cuda(
            "reading the device's shared-memory limit",
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        )? as usize;
        let sms =
            cuda("reading the multiprocessor count", ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT))? as usize;
        let smem_per_sm = cuda(
            "reading the shared memory per multiprocessor",
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        )? as usize;
        Ok(FlashAttn {
            backend: Backend::Cuda(CudaBackend {
                ctx,
                stream,
                modules,
                maxnreg,
                functions: Mutex::new(HashMap::new()),
                max_smem_optin,
                sms,
                smem_per_sm,
            }),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            allocations: AtomicU64::new(0),
        })
    }

    /// The CPU emulator: runs the same kernel source on the host, checking barriers,
    /// shared-memory bounds, initialisation and races. Slow; for tests and machines without a GPU.
    pub fn emulator() -> FlashAttn {
        FlashAttn { backend: Backend::Emulator, id: NEXT_ID.fetch_add(1, Ordering::Relaxed), allocations: AtomicU64::new(0) }
    }

    /// CUDA device 0 if there is one, else the emulator; the second value says why not CUDA.
    pub fn cuda_or_emulator() -> (FlashAttn, Option<Error>) {
        match FlashAttn::cuda(0) {
            Ok(fa) => (fa, None),
            Err(e) => (FlashAttn::emulator(), Some(e)),
        }
    }

    /// The PTX modules (kernel architectures) this device runs. The emulator runs every
    /// kernel, as an H100/H200 would (compute capability 9.0: sm_80 and sm_90a kernels).
    pub fn archs(&self) -> Vec<Arch> {
        match &self.backend {
            Backend::Cuda(c) => c.modules.iter().map(|(a, _)| *a).collect(),
            Backend::Emulator => vec![Arch::Sm80, Arch::Sm90a],
        }
    }

    /// The device's multiprocessors and the shared memory (bytes) each holds; the emulator
    /// answers as an H100 SXM would (132, 228 KiB), so that it chooses as one does.
    pub fn multiprocessors(&self) -> (usize, usize) {
        match &self.backend {
            Backend::Cuda(c) => (c.sms, c.smem_per_sm),
            Backend::Emulator => (132, 228 << 10),
        }
    }

    /// The stream work is queued on (None on the emulator).
    pub fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        match &self.backend {
            Backend::Cuda(c) => Some(&c.stream),
            Backend::Emulator => None,
        }
    }

    /// Device allocations this instance has made: uploads, outputs of the allocating calls,
    /// the backward's workspace in [`FlashAttn::backward_into`]. The `_into_views` calls make
    /// none.
    pub fn device_allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// Whether this runs on the CPU emulator.
    pub fn is_emulator(&self) -> bool {
        matches!(self.backend, Backend::Emulator)
    }

    /// A human-readable name of the device.
    pub fn device_name(&self) -> String {
        match &self.backend {
            Backend::Cuda(c) => c.ctx.name().unwrap_or_else(|e| format!("CUDA device (name unavailable: {e:?})")),
            Backend::Emulator => "CPU emulator".into(),
        }
    }

    /// Waits for all work queued on the device.
    pub fn synchronize(&self) -> Result<()> {
        match &self.backend {
            Backend::Cuda(c) => cuda("synchronizing the stream", c.stream.synchronize()),
            Backend::Emulator => Ok(()),
        }
    }

    /// Free and total device memory in bytes (None on the emulator).
    pub fn memory_info(&self) -> Result<Option<(usize, usize)>> {
        match &self.backend {
            Backend::Cuda(c) => Ok(Some(cuda("reading memory info", c.ctx.mem_get_info())?)),
            Backend::Emulator => Ok(None),
        }
    }

    /// Copies `data` to the device as a tensor of `shape` (row-major, last dimension contiguous).
    pub fn upload<T: Dtype>(&self, data: &[T], shape: &[usize]) -> Result<Tensor<T>> {
        self.upload_plain(data, shape)
    }

    /// Copies u32 values to the device as a 1-D tensor: a KV cache's lengths
    /// ([`crate::KvCache`]) made on the host.
    pub fn upload_u32(&self, data: &[u32]) -> Result<Tensor<u32>> {
        self.upload_plain(data, &[data.len()])
    }

    /// [`FlashAttn::upload`] for any plain element type (the offsets of a variable-length batch).
    pub(crate) fn upload_plain<T: cudarc::driver::DeviceRepr + Copy>(&self, data: &[T], shape: &[usize]) -> Result<Tensor<T>> {
        let n: usize = shape.iter().product();
        if data.len() != n {
            return Err(Error::HostLength { expected: n, got: data.len() });
        }
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let storage = match &self.backend {
            Backend::Cuda(c) => Storage::Cuda(cuda("copying to the device", c.stream.clone_htod(data))?),
            Backend::Emulator => Storage::Host(HostBuf::from_slice(data)),
        };
        Ok(Tensor { storage, shape: shape.to_vec(), owner: self.id })
    }

    /// A tensor of `shape` with every element `value` (e.g. NaN, to poison an output).
    pub fn full<T: Dtype>(&self, value: T, shape: &[usize]) -> Result<Tensor<T>> {
        let n: usize = shape.iter().product();
        self.upload(&vec![value; n], shape)
    }

    /// An uninitialised u32 tensor of `n` elements (all ones on the emulator), for a kernel to
    /// fill (the KV cache's offsets and lengths).
    pub(crate) fn alloc_u32(&self, n: usize) -> Result<Tensor<u32>> {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let storage = match &self.backend {
            // SAFETY: the kernel writes every element before anyone reads it.
            Backend::Cuda(c) => Storage::Cuda(cuda("allocating device memory", unsafe { c.stream.alloc::<u32>(n) })?),
            Backend::Emulator => Storage::Host(HostBuf::from_slice(&vec![u32::MAX; n])),
        };
        Ok(Tensor { storage, shape: vec![n], owner: self.id })
    }

    /// An uninitialised tensor (device memory as the allocator left it).
    pub(crate) fn alloc<T: Dtype>(&self, shape: &[usize]) -> Result<Tensor<T>> {
        let n: usize = shape.iter().product();
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let storage = match &self.backend {
            // SAFETY: the kernel writes every element before anyone reads it.
            Backend::Cuda(c) => Storage::Cuda(cuda("allocating device memory", unsafe { c.stream.alloc::<T>(n) })?),
            Backend::Emulator => Storage::Host(HostBuf::from_slice(&vec![T::nan(); n])),
        };
        Ok(Tensor { storage, shape: shape.to_vec(), owner: self.id })
    }

    /// Zeroes `bytes` bytes at device (or emulator host) address `addr`, queued on the
    /// stream.
    pub(crate) fn memset_zero(&self, addr: u64, bytes: usize) -> Result<()> {
        match &self.backend {
            // SAFETY: the caller checked that the range is inside memory the call may write.
            Backend::Cuda(c) => {
                cuda("zeroing the workspace", unsafe { cudarc::driver::result::memset_d8_async(addr, 0, bytes, c.stream.cu_stream()) })
            }
            Backend::Emulator => {
                // SAFETY: as above; host memory on the emulator.
                unsafe { std::ptr::write_bytes(addr as *mut u8, 0, bytes) };
                Ok(())
            }
        }
    }

    /// Sets `n` f32 at device (or emulator host) address `addr` to `value`, queued on the
    /// stream.
    pub(crate) fn memset_f32(&self, addr: u64, value: f32, n: usize) -> Result<()> {
        match &self.backend {
            // SAFETY: the caller checked that the range is inside memory the call may write.
            Backend::Cuda(c) => cuda("filling split-KV's LSE parts", unsafe {
                cudarc::driver::sys::cuMemsetD32Async(addr, value.to_bits(), n, c.stream.cu_stream()).result()
            }),
            Backend::Emulator => {
                // SAFETY: as above; host memory on the emulator, f32-aligned.
                unsafe { std::slice::from_raw_parts_mut(addr as *mut f32, n).fill(value) };
                Ok(())
            }
        }
    }

    /// Zeroes `height` rows of `width` bytes, `pitch` bytes apart, from device (or emulator
    /// host) address `addr`, queued on the stream.
    pub(crate) fn memset_zero_2d(&self, addr: u64, pitch: usize, width: usize, height: usize) -> Result<()> {
        match &self.backend {
            // SAFETY: the caller checked that the rows are inside memory the call may write.
            Backend::Cuda(c) => cuda("zeroing unused keys' gradients", unsafe {
                cudarc::driver::sys::cuMemsetD2D8Async(addr, pitch, 0, width, height, c.stream.cu_stream()).result()
            }),
            Backend::Emulator => {
                for r in 0..height {
                    // SAFETY: as above; host memory on the emulator.
                    unsafe { std::ptr::write_bytes((addr + (r * pitch) as u64) as *mut u8, 0, width) };
                }
                Ok(())
            }
        }
    }

    /// Copies a tensor back to the host (waits for the work that writes it).
    pub fn download<T: Dtype>(&self, t: &Tensor<T>) -> Result<Vec<T>> {
        self.check_owner(t, "tensor")?;
        match (&self.backend, &t.storage) {
            (Backend::Cuda(c), Storage::Cuda(s)) => cuda("copying to the host", c.stream.clone_dtoh(s)),
            (_, Storage::Host(v)) => Ok(v.as_slice().to_vec()),
            _ => Err(Error::WrongDevice { tensor: "tensor" }),
        }
    }

    /// `t` was made by this `FlashAttn` (else `WrongDevice`, naming it `name`).
    pub(crate) fn check_owner<T>(&self, t: &Tensor<T>, name: &'static str) -> Result<()> {
        if t.owner == self.id { Ok(()) } else { Err(Error::WrongDevice { tensor: name }) }
    }
}

impl CudaBackend {
    /// The function `name`, allowed `smem` bytes of dynamic shared memory.
    pub(crate) fn function(&self, name: &'static str, arch: Arch, smem: usize) -> Result<CudaFunction> {
        if smem > self.max_smem_optin {
            return Err(Error::SharedMemory { kernel: name, needed: smem, available: self.max_smem_optin });
        }
        let entry = {
            let mut fns = self.functions.lock().unwrap_or_else(|p| p.into_inner());
            fns.entry(name).or_default().clone()
        };
        let f = entry.f.get_or_init(|| self.load_function(name, arch)).clone()?;
        let mut allowed = entry.smem_allowed.lock().unwrap_or_else(|p| p.into_inner());
        if smem > *allowed {
            use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYN;
            cuda("raising a kernel's shared-memory limit", f.set_attribute(MAX_DYN, smem as i32))?;
            *allowed = smem;
        }
        Ok(f)
    }

    /// Loads kernel `name` of the module of `arch`: looked up in the whole module when it was
    /// loaded eagerly, else JIT-compiled as a module of its own.
    fn load_function(&self, name: &'static str, arch: Arch) -> Result<CudaFunction> {
        let Some((_, module)) = self.modules.iter().find(|(a, _)| *a == arch) else {
            let device = self.ctx.name().unwrap_or_else(|_| "this device".into());
            return Err(Error::UnsupportedDevice { kernel: name, needs: arch, device });
        };
        match module {
            Some(module) => cuda("looking up a kernel", module.load_function(name)),
            None => {
                // A registered kernel is always an entry (tests/tests/ptx.rs): the driver's
                // own answer for a missing name otherwise.
                let not_found = cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_FOUND);
                let mut ptx = crate::ptx::entry_module(crate::ptx::loaded(arch), name)
                    .ok_or(Error::Cuda { op: "finding a kernel in the PTX", source: not_found })?;
                if let Some((_, regs)) = self.maxnreg.iter().find(|(k, _)| k == name) {
                    ptx = crate::ptx::with_maxnreg(&ptx, name, *regs)
                        .ok_or(Error::Cuda { op: "adding .maxnreg to a kernel's PTX", source: not_found })?;
                }
                let module = cuda("loading a kernel's PTX", self.ctx.load_module(Ptx::from_src(ptx)))?;
                cuda("looking up a kernel", module.load_function(name))
            }
        }
    }
}

pub(crate) enum Storage<T> {
    Cuda(CudaSlice<T>),
    Host(HostBuf<T>),
}

/// The emulator's tensor memory: 16-byte aligned, as device allocations are (the kernels'
/// 16-byte copies need it, and the emulator checks alignment like the GPU does).
pub(crate) struct HostBuf<T> {
    words: Vec<u128>,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

impl<T> HostBuf<T> {
    const FITS: () = assert!(std::mem::align_of::<T>() <= 16);

    fn from_slice(data: &[T]) -> HostBuf<T>
    where
        T: Copy,
    {
        let () = Self::FITS;
        let bytes = std::mem::size_of_val(data);
        let mut words = vec![0u128; bytes.div_ceil(16)];
        // SAFETY: `words` holds at least `bytes` bytes; the regions do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr() as *const u8, words.as_mut_ptr() as *mut u8, bytes) };
        HostBuf { words, len: data.len(), _elem: std::marker::PhantomData }
    }
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: `words` holds `len` initialised, suitably aligned elements of T.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const T, self.len) }
    }
    pub(crate) fn as_mut_ptr(&mut self) -> *mut T {
        self.words.as_mut_ptr() as *mut T
    }
}

/// A dense row-major tensor on a [`FlashAttn`]'s device (or in the emulator's host memory).
pub struct Tensor<T> {
    pub(crate) storage: Storage<T>,
    shape: Vec<usize>,
    owner: u64,
}

impl<T> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match self.storage {
            Storage::Cuda(_) => "cuda",
            Storage::Host(_) => "emulator",
        };
        write!(f, "Tensor<{}>{:?} on {place}", std::any::type_name::<T>(), self.shape)
    }
}

impl<T> Tensor<T> {
    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of storage.
    pub fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
    /// The cudarc buffer under it (None on the emulator), e.g. to hand O to the caller's
    /// next kernel.
    pub fn cuda_slice(&self) -> Option<&CudaSlice<T>> {
        match &self.storage {
            Storage::Cuda(s) => Some(s),
            Storage::Host(_) => None,
        }
    }
    /// The cudarc buffer, given back (None on the emulator).
    pub fn into_cuda_slice(self) -> Option<CudaSlice<T>> {
        match self.storage {
            Storage::Cuda(s) => Some(s),
            Storage::Host(_) => None,
        }
    }
}

impl FlashAttn {
    /// Takes ownership of the caller's cudarc buffer as a contiguous tensor of `shape`
    /// (it must hold exactly that many elements, in this instance's context).
    pub fn tensor_from_cuda<T: Dtype>(&self, slice: CudaSlice<T>, shape: &[usize]) -> Result<Tensor<T>> {
        self.tensor_from_cuda_plain(slice, shape)
    }

    /// [`FlashAttn::tensor_from_cuda`] for any plain element type (offsets: u32).
    pub(crate) fn tensor_from_cuda_plain<T>(&self, slice: CudaSlice<T>, shape: &[usize]) -> Result<Tensor<T>> {
        let Backend::Cuda(c) = &self.backend else { return Err(Error::WrongDevice { tensor: "tensor" }) };
        if !Arc::ptr_eq(slice.context(), &c.ctx) {
            return Err(Error::WrongDevice { tensor: "tensor" });
        }
        let n: usize = shape.iter().product();
        if slice.len() != n {
            return Err(Error::HostLength { expected: n, got: slice.len() });
        }
        Ok(Tensor { storage: Storage::Cuda(slice), shape: shape.to_vec(), owner: self.id })
    }
}

/// A kernel parameter struct the kernels take by value: `#[repr(C)]` plain data defined in
/// `flashattn-kernels`, with the same layout in PTX.
pub(crate) trait KernelParams: Copy + Sync {}
impl KernelParams for flashattn_kernels::params::FwdParams {}
impl KernelParams for flashattn_kernels::params::BwdParams {}
impl KernelParams for flashattn_kernels::params::MergeParams {}
impl KernelParams for flashattn_kernels::params::AppendParams {}

#[repr(transparent)]
struct ParamsArg<P>(P);
// SAFETY: only KernelParams (#[repr(C)] structs of u64, u32 and f32) are wrapped.
unsafe impl<P: KernelParams> cudarc::driver::DeviceRepr for ParamsArg<P> {}

/// One launch: which kernel, its geometry, and its body for the emulator.
pub(crate) struct Launch<P> {
    pub(crate) name: &'static str,
    /// The module that holds it.
    pub(crate) arch: Arch,
    pub(crate) grid: (u32, u32, u32),
    pub(crate) threads: u32,
    pub(crate) smem: usize,
    pub(crate) emulate: unsafe fn(&P),
}

impl FlashAttn {
    /// The stream kernels are queued on (None on the emulator), for tensor addresses.
    pub(crate) fn stream(&self) -> Option<&CudaStream> {
        match &self.backend {
            Backend::Cuda(c) => Some(c.stream.as_ref()),
            Backend::Emulator => None,
        }
    }

    /// Runs `launches` in order with `params`, on the GPU or in the emulator (where `regions`
    /// are the global buffers they may touch).
    ///
    /// # Safety
    /// `params` must describe buffers, validated by the caller, that the kernels may read and
    /// write within their shapes; `regions` must cover them.
    pub(crate) unsafe fn launch<P: KernelParams>(
        &self,
        what: &'static str,
        launches: &[Launch<P>],
        params: P,
        regions: &[flashattn_kernels::dev::emu::GlobalRegion],
    ) -> Result<()> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        use flashattn_kernels::dev::emu;
        match &self.backend {
            Backend::Cuda(c) => {
                let arg = ParamsArg(params);
                // A grid of no blocks (a variable-length batch's keys all unused) has nothing to do.
                for l in launches.iter().filter(|l| l.grid.0 > 0 && l.grid.1 > 0 && l.grid.2 > 0) {
                    let f = c.function(l.name, l.arch, l.smem)?;
                    let cfg = LaunchConfig { grid_dim: l.grid, block_dim: (l.threads, 1, 1), shared_mem_bytes: l.smem as u32 };
                    let mut builder = c.stream.launch_builder(&f);
                    builder.arg(&arg);
                    // SAFETY: the caller's contract.
                    cuda(what, unsafe { builder.launch(cfg) })?;
                }
                Ok(())
            }
            Backend::Emulator => {
                for l in launches.iter().filter(|l| l.grid.0 > 0 && l.grid.1 > 0 && l.grid.2 > 0) {
                    let cfg = emu::LaunchConfig { grid: l.grid, block_threads: l.threads, dynamic_shared_bytes: l.smem };
                    let body = l.emulate;
                    // SAFETY: the caller's contract; the emulator also checks every access.
                    emu::launch(l.name, &cfg, regions, &|| unsafe { body(&params) })?;
                }
                Ok(())
            }
        }
    }
}
