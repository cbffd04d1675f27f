//! A CPU emulator of the CUDA execution model, for running the kernels without a GPU.
//!
//! [`launch`] runs the full grid. Blocks are spread over a few OS threads; inside a block
//! every GPU thread is a stackful coroutine, and one scheduler per block runs them in turn,
//! switching only where a thread must wait for others (a block barrier, a warp collective).
//! So barriers and warp collectives behave as on the GPU, and results are deterministic.
//!
//! It reports, as an [`EmuError`] naming the kernel, block and threads, what a GPU would hide
//! or hang on:
//! - a block barrier or warp collective reached by only some of the threads that must take
//!   part, or reached at different places in the code (divergent barrier);
//! - a shared-memory access outside the block's allocation;
//! - a read of shared memory that no thread has written (shared memory is poisoned with NaN
//!   bytes at block start, and tracked);
//! - a race: two threads touching the same shared-memory bytes, at least one writing, with
//!   no barrier between them (a missing `block::sync` or `warp::sync`);
//! - shared memory read (or overwritten) while a `cp.async` to it is still in flight: before
//!   the issuing thread's `cp_async_wait` retired its group;
//! - a global-memory access outside the buffers passed to the launch;
//! - `trap`, and any panic in the kernel code.
//!
//! Limits, by design: `cp.async` copies at issue (its data is tracked as in flight until the
//! wait); `ex2` is exact where the GPU approximates; `mma` accumulates in f32 in k order, where the tensor
//! cores' internal order and precision differ slightly. Results therefore match the GPU to
//! rounding, not bitwise.

pub(crate) mod ops;
mod sched;
mod warp_ops;

use std::string::String;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The geometry of one launch.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block (1-D), a multiple of the warp size.
    pub block_threads: u32,
    /// Bytes of launch-sized shared memory per block.
    pub dynamic_shared_bytes: usize,
}

/// A buffer of global memory the kernel may touch: `len` bytes at address `start`.
#[derive(Clone, Copy, Debug)]
pub struct GlobalRegion {
    /// Host address of the first byte.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
    /// Whether the kernel may write it.
    pub writable: bool,
}

/// What went wrong in an emulated launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuError {
    /// The kernel's name, as given to [`launch`].
    pub kernel: String,
    /// The block in which the fault was found.
    pub block: (u32, u32, u32),
    /// What was found, with the threads and source locations involved.
    pub message: String,
}

impl core::fmt::Display for EmuError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (x, y, z) = self.block;
        write!(f, "emulated kernel `{}`, block ({x},{y},{z}): {}", self.kernel, self.message)
    }
}

impl std::error::Error for EmuError {}

/// Runs `body` as kernel `kernel` over the whole grid of `cfg`.
///
/// `body` is the kernel's code for one thread (it reads its indices through [`crate::dev`]).
/// `regions` lists every global buffer the launch may touch. On the first fault the launch
/// stops and the fault is returned; the contents of writable buffers are then unspecified.
/// `FLASHATTN_EMU_THREADS` sets how many OS threads run blocks (default: all cores).
pub fn launch(kernel: &str, cfg: &LaunchConfig, regions: &[GlobalRegion], body: &(dyn Fn() + Sync)) -> Result<(), EmuError> {
    let (gx, gy, gz) = cfg.grid;
    let n_blocks = gx as usize * gy as usize * gz as usize;
    let fail = |message: String| EmuError { kernel: kernel.into(), block: (0, 0, 0), message };
    if cfg.block_threads == 0 || !cfg.block_threads.is_multiple_of(32) || cfg.block_threads > 1024 {
        return Err(fail(std::format!("block of {} threads: the emulator takes whole warps, 32 to 1024 threads", cfg.block_threads)));
    }
    if n_blocks == 0 {
        return Ok(());
    }
    let workers = std::env::var("FLASHATTN_EMU_THREADS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, n_blocks);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first_error: Mutex<Option<(usize, EmuError)>> = Mutex::new(None);
    let work = || {
        let mut stacks = sched::StackPool::default();
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let b = next.fetch_add(1, Ordering::Relaxed);
            if b >= n_blocks {
                return;
            }
            let idx = ((b % gx as usize) as u32, ((b / gx as usize) % gy as usize) as u32, (b / (gx as usize * gy as usize)) as u32);
            if let Err(message) = sched::run_block(idx, cfg, regions, body, &mut stacks) {
                stop.store(true, Ordering::Relaxed);
                let mut e = first_error.lock().unwrap_or_else(|p| p.into_inner());
                // Keep the lowest-numbered failing block, so reports are reproducible.
                if e.as_ref().is_none_or(|(eb, _)| b < *eb) {
                    *e = Some((b, EmuError { kernel: kernel.into(), block: idx, message }));
                }
                return;
            }
        }
    };
    if workers == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(work);
            }
        });
    }
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}
