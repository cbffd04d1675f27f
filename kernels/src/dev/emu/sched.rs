//! One block of the emulator: its shared memory with a shadow that tracks every access, and
//! the scheduler that runs the block's threads as coroutines.

use super::{GlobalRegion, LaunchConfig};
use core::cell::{Cell, RefCell, UnsafeCell};
use core::panic::Location;
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};
use std::boxed::Box;
use std::format;
use std::string::{String, ToString};
use std::vec::Vec;

/// Where a thread stopped to wait for others.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    /// `block::sync` (vote None) or `block::sync_any` (this thread's predicate).
    Barrier { vote: Option<bool>, at: &'static Location<'static> },
    /// `warp::sync`.
    WarpSync(&'static Location<'static>),
    /// `warp::shfl_xor`: this lane's value and lane mask.
    ShflXor { v: u32, lane_mask: u32, at: &'static Location<'static> },
    /// `warp::any`: this lane's predicate.
    VoteAny { v: bool, at: &'static Location<'static> },
    /// `warp::ldmatrix_x4[_trans]`: the address of the 16-byte row this lane supplies.
    Ldmatrix { addr: usize, trans: bool, at: &'static Location<'static> },
    /// `warp::mma_*`: this lane's A, B, C fragments (m16n8k16, row.col, f32 accumulate).
    Mma { a: [u32; 4], b: [u32; 2], c: [u32; 4], bf16: bool, at: &'static Location<'static> },
    /// `warpgroup::mma_*`: A by descriptor (`a_desc`) or this thread's A fragment, B's
    /// descriptor, and this thread's `4 nt` accumulators (on its stack, written when the
    /// warpgroup's 128 threads have met).
    Wgmma {
        a_desc: Option<u64>,
        a_regs: [u32; 4],
        b: u64,
        acc: *mut f32,
        nt: u32,
        accumulate: bool,
        trans_a: bool,
        trans_b: bool,
        bf16: bool,
        at: &'static Location<'static>,
    },
}

impl Event {
    fn at(&self) -> &'static Location<'static> {
        match *self {
            Event::WarpSync(at) => at,
            Event::Barrier { at, .. }
            | Event::ShflXor { at, .. }
            | Event::VoteAny { at, .. }
            | Event::Ldmatrix { at, .. }
            | Event::Mma { at, .. }
            | Event::Wgmma { at, .. } => at,
        }
    }
    fn what(&self) -> &'static str {
        match self {
            Event::Barrier { .. } => "block barrier",
            Event::WarpSync(_) => "warp barrier",
            Event::ShflXor { .. } => "warp shuffle",
            Event::VoteAny { .. } => "warp vote",
            Event::Ldmatrix { .. } => "warp ldmatrix",
            Event::Mma { .. } => "warp mma",
            Event::Wgmma { .. } => "warpgroup mma",
        }
    }
    fn same_op(&self, other: &Event) -> bool {
        core::mem::discriminant(self) == core::mem::discriminant(other) && self.at() == other.at()
    }
}

/// A fault found by the emulator; unwinds out of the kernel without running the panic hook.
pub(crate) struct Fault(pub String);

pub(crate) fn fault(msg: String) -> ! {
    std::panic::resume_unwind(Box::new(Fault(msg)))
}

const NONE: u16 = u16::MAX;
const MANY: u16 = u16::MAX - 1;
const NO_EPOCH: u32 = u32::MAX;

/// What is known of one 2-byte unit of shared memory.
#[derive(Clone, Copy)]
struct Shadow {
    /// Last writer (NONE: never written) and the block and warp epochs of that write.
    w_tid: u16,
    w_be: u32,
    w_we: u32,
    /// Readers since the last write, in block epoch `r_be` (NO_EPOCH: none).
    r_tid: u16,
    r_warp: u16,
    r_be: u32,
    r_we: u32,
    /// Whether the last write is a `cp.async` its thread has not yet waited for.
    pending: bool,
}

const UNWRITTEN: Shadow = Shadow { w_tid: NONE, w_be: 0, w_we: 0, r_tid: NONE, r_warp: NONE, r_be: NO_EPOCH, r_we: 0, pending: false };

/// Shared state of one running block; only its own OS thread touches it.
pub(crate) struct BlockState<'a> {
    pub(crate) block: (u32, u32, u32),
    pub(crate) block_dim: u32,
    pub(crate) regions: &'a [GlobalRegion],
    smem: UnsafeCell<Vec<u128>>,
    smem_len: usize,
    shadow: UnsafeCell<Vec<Shadow>>,
    /// Incremented at every block barrier.
    block_epoch: Cell<u32>,
    /// Per warp: incremented at every block barrier and every barrier of that warp.
    warp_epoch: Vec<Cell<u32>>,
}

/// The running thread's identity; `ops` reaches it through `CURRENT`.
pub(crate) struct ThreadCtx<'a> {
    pub(crate) tid: u32,
    pub(crate) block: &'a BlockState<'a>,
    yielder: Cell<*const Yielder<[u32; 4], Event>>,
    /// This thread's cp.async copies: shadow units of the open group, then committed groups,
    /// oldest first.
    async_open: RefCell<Vec<usize>>,
    async_groups: RefCell<Vec<Vec<usize>>>,
}

std::thread_local! {
    static CURRENT: Cell<*const ThreadCtx<'static>> = const { Cell::new(core::ptr::null()) };
}

/// The thread whose code is running. Panics outside an emulated launch.
pub(crate) fn current() -> &'static ThreadCtx<'static> {
    let p = CURRENT.with(|c| c.get());
    if p.is_null() {
        panic!("a flashattn-kernels device function was called outside an emulated launch");
    }
    // SAFETY: set by `run_block` to a context that outlives the coroutine being resumed.
    unsafe { &*p }
}

impl ThreadCtx<'_> {
    /// Suspends this thread until the scheduler resolves `ev`; returns the collective's result.
    pub(crate) fn wait(&self, ev: Event) -> [u32; 4] {
        // SAFETY: set at coroutine start; the yielder lives as long as the coroutine.
        unsafe { (*self.yielder.get()).suspend(ev) }
    }
    fn warp(&self) -> usize {
        self.tid as usize / 32
    }
    fn epochs(&self) -> (u32, u32) {
        (self.block.block_epoch.get(), self.block.warp_epoch[self.warp()].get())
    }
    /// Whether a past access by `other` in epochs (be, we) is ordered before this thread now.
    fn ordered_after(&self, other: u16, be: u32, we: u32) -> bool {
        let (be_now, we_now) = self.epochs();
        other as u32 == self.tid || be < be_now || (other as usize / 32 == self.warp() && we < we_now)
    }

    /// Checks and records an access of `size` bytes at host address `addr` in shared memory.
    pub(crate) fn shared_access(&self, addr: usize, size: usize, write: bool, at: &Location<'_>) {
        self.shared_access_as(addr, size, write, false, at)
    }

    /// Records a cp.async write: checked like a write, and unreadable until this thread's
    /// `cp_async_wait` retires its group.
    pub(crate) fn shared_async_write(&self, addr: usize, size: usize, at: &Location<'_>) {
        self.shared_access_as(addr, size, true, true, at)
    }

    /// `cp.async.commit_group`: closes the open group.
    pub(crate) fn async_commit(&self) {
        let open = core::mem::take(&mut *self.async_open.borrow_mut());
        self.async_groups.borrow_mut().push(open);
    }

    /// `cp.async.wait_group n`: retires all but the newest `n` committed groups.
    pub(crate) fn async_wait(&self, n: usize) {
        let mut groups = self.async_groups.borrow_mut();
        let shadow = unsafe { &mut *self.block.shadow.get() };
        while groups.len() > n {
            for unit in groups.remove(0) {
                if shadow[unit].w_tid == self.tid as u16 {
                    shadow[unit].pending = false;
                }
            }
        }
    }

    fn shared_access_as(&self, addr: usize, size: usize, write: bool, is_async: bool, at: &Location<'_>) {
        let b = self.block;
        // SAFETY: only this OS thread touches the block's state, one coroutine at a time.
        let base = unsafe { (*b.smem.get()).as_ptr() as usize };
        let off = addr.wrapping_sub(base);
        let kind = if write { "write" } else { "read" };
        if addr < base || off + size > b.smem_len {
            fault(format!(
                "thread {} {kind}s {size} bytes of shared memory at offset {} outside the block's {} bytes, at {at}",
                self.tid,
                addr as isize - base as isize,
                b.smem_len
            ));
        }
        let (be, we) = self.epochs();
        let shadow = unsafe { &mut *b.shadow.get() };
        for unit in off / 2..(off + size).div_ceil(2) {
            let s = &mut shadow[unit];
            if s.pending {
                fault(format!(
                    "thread {} {kind}s shared offset {} while thread {}'s cp.async to it is still in flight (no cp_async_wait retired it), at {at}",
                    self.tid,
                    unit * 2,
                    s.w_tid
                ));
            }
            if write {
                if s.w_tid != NONE && !self.ordered_after(s.w_tid, s.w_be, s.w_we) {
                    fault(format!(
                        "race: thread {} writes shared offset {} that thread {} wrote with no barrier between, at {at}",
                        self.tid,
                        unit * 2,
                        s.w_tid
                    ));
                }
                if s.r_be == be && s.r_tid != self.tid as u16 && !(s.r_warp as usize == self.warp() && s.r_we < we) {
                    let who = if s.r_tid == MANY { "other threads".to_string() } else { format!("thread {}", s.r_tid) };
                    fault(format!(
                        "race: thread {} writes shared offset {} that {who} read with no barrier between, at {at}",
                        self.tid,
                        unit * 2
                    ));
                }
                *s = Shadow { w_tid: self.tid as u16, w_be: be, w_we: we, pending: is_async, ..UNWRITTEN };
                if is_async {
                    self.async_open.borrow_mut().push(unit);
                }
            } else {
                if s.w_tid == NONE {
                    fault(format!("thread {} reads shared offset {} that no thread has written, at {at}", self.tid, unit * 2));
                }
                if !self.ordered_after(s.w_tid, s.w_be, s.w_we) {
                    fault(format!(
                        "race: thread {} reads shared offset {} that thread {} wrote with no barrier between, at {at}",
                        self.tid,
                        unit * 2,
                        s.w_tid
                    ));
                }
                if s.r_be != be {
                    s.r_tid = self.tid as u16;
                    s.r_warp = self.warp() as u16;
                    s.r_be = be;
                } else {
                    if s.r_tid != self.tid as u16 {
                        s.r_tid = MANY;
                    }
                    if s.r_warp != self.warp() as u16 {
                        s.r_warp = MANY;
                    }
                }
                s.r_we = we;
            }
        }
    }

    /// Base address of the block's dynamic shared memory.
    pub(crate) fn shared_base(&self) -> *mut u8 {
        unsafe { (*self.block.smem.get()).as_mut_ptr() as *mut u8 }
    }
}

/// Coroutine stacks, kept across blocks so that each block does not map new ones.
#[derive(Default)]
pub(crate) struct StackPool(Vec<DefaultStack>);

/// Stack of one emulated GPU thread. Kernels keep their tiles in registers (local arrays).
const STACK_BYTES: usize = 256 * 1024;

impl StackPool {
    fn take(&mut self) -> Result<DefaultStack, String> {
        match self.0.pop() {
            Some(s) => Ok(s),
            None => DefaultStack::new(STACK_BYTES).map_err(|e| format!("cannot map a coroutine stack: {e}")),
        }
    }
}

enum St {
    Ready([u32; 4]),
    Wait(Event),
    Done,
}

fn lane_mask_of(ev: &Event) -> usize {
    match ev {
        Event::ShflXor { lane_mask, .. } => *lane_mask as usize,
        _ => 0,
    }
}

/// "3, 5-9, 12": a compact list of thread ids.
fn ranges(ids: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        if i == j {
            out.push_str(&format!("{}", ids[i]));
        } else {
            out.push_str(&format!("{}-{}", ids[i], ids[j]));
        }
        i = j + 1;
    }
    out
}

/// What each thread is doing, grouped: for deadlock and divergence reports.
fn describe(st: &[St]) -> String {
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    for (t, s) in st.iter().enumerate() {
        let key = match s {
            St::Ready(_) => "running".to_string(),
            St::Done => "exited".to_string(),
            St::Wait(ev) => format!("wait at {} {}", ev.what(), ev.at()),
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push(t as u32),
            None => groups.push((key, std::vec![t as u32])),
        }
    }
    groups.iter().map(|(k, ids)| format!("threads {} {k}", ranges(ids))).collect::<Vec<_>>().join("; ")
}

fn panic_message(p: Box<dyn core::any::Any + Send>) -> String {
    if let Some(f) = p.downcast_ref::<Fault>() {
        f.0.clone()
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("kernel panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<&str>() {
        format!("kernel panicked: {s}")
    } else {
        "kernel panicked".to_string()
    }
}

/// Runs one block to completion, or to its first fault.
pub(crate) fn run_block(
    block: (u32, u32, u32),
    cfg: &LaunchConfig,
    regions: &[GlobalRegion],
    body: &(dyn Fn() + Sync),
    stacks: &mut StackPool,
) -> Result<(), String> {
    let n = cfg.block_threads as usize;
    let warps = n / 32;
    let smem_len = cfg.dynamic_shared_bytes;
    let state = BlockState {
        block,
        block_dim: cfg.block_threads,
        regions,
        // Poison: every byte 0xFF, so a float read of it is NaN.
        smem: UnsafeCell::new(std::vec![u128::MAX; smem_len.div_ceil(16)]),
        smem_len,
        shadow: UnsafeCell::new(std::vec![UNWRITTEN; smem_len.div_ceil(2)]),
        block_epoch: Cell::new(0),
        warp_epoch: (0..warps).map(|_| Cell::new(0)).collect(),
    };
    let ctxs: Vec<ThreadCtx> = (0..n)
        .map(|t| ThreadCtx {
            tid: t as u32,
            block: &state,
            yielder: Cell::new(core::ptr::null()),
            async_open: RefCell::new(Vec::new()),
            async_groups: RefCell::new(Vec::new()),
        })
        .collect();
    let mut cos = Vec::with_capacity(n);
    for ctx in &ctxs {
        let stack = stacks.take()?;
        let ctx_ptr: *const ThreadCtx = ctx;
        // SAFETY: `ctxs`, `state` and `body` outlive `cos`, which is dropped (or run to
        // completion) before this function returns.
        let co = unsafe {
            Coroutine::<[u32; 4], Event, (), DefaultStack>::with_stack_unchecked(stack, move |y: &Yielder<[u32; 4], Event>, _| {
                (*ctx_ptr).yielder.set(y);
                body()
            })
        };
        cos.push(Some(co));
    }
    let mut st: Vec<St> = (0..n).map(|_| St::Ready([0; 4])).collect();

    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<(), String> {
        loop {
            // Run every ready thread until it waits or exits.
            for t in 0..n {
                if let St::Ready(v) = st[t] {
                    CURRENT.with(|c| c.set((&ctxs[t] as *const ThreadCtx).cast::<ThreadCtx<'static>>()));
                    let co = cos[t].as_mut().expect("live coroutine");
                    let r = co.resume(v);
                    CURRENT.with(|c| c.set(core::ptr::null()));
                    st[t] = match r {
                        CoroutineResult::Yield(ev) => St::Wait(ev),
                        CoroutineResult::Return(()) => {
                            if let Some(co) = cos[t].take() {
                                stacks.0.push(co.into_stack());
                            }
                            St::Done
                        }
                    };
                }
            }
            if st.iter().all(|s| matches!(s, St::Done)) {
                return Ok(());
            }
            let mut released = false;
            // Warp collectives: resolved once all 32 lanes of the warp wait at the same one.
            for w in 0..warps {
                let lanes = &st[w * 32..w * 32 + 32];
                let evs: Vec<Event> = lanes
                    .iter()
                    .filter_map(|s| match s {
                        St::Wait(
                            ev @ (Event::WarpSync(_)
                            | Event::ShflXor { .. }
                            | Event::VoteAny { .. }
                            | Event::Ldmatrix { .. }
                            | Event::Mma { .. }),
                        ) => Some(*ev),
                        _ => None,
                    })
                    .collect();
                if evs.len() != 32 {
                    continue;
                }
                if !evs.iter().all(|e| e.same_op(&evs[0])) {
                    return Err(format!("divergent warp collective in warp {w}: {}", describe(&st[w * 32..w * 32 + 32])));
                }
                let results: Vec<[u32; 4]> = match evs[0] {
                    Event::WarpSync(_) => {
                        let e = &state.warp_epoch[w];
                        e.set(e.get() + 1);
                        std::vec![[0; 4]; 32]
                    }
                    Event::ShflXor { .. } => (0..32)
                        .map(|l| match (evs[l], evs[(l ^ lane_mask_of(&evs[l])) & 31]) {
                            (_, Event::ShflXor { v, .. }) => [v, 0, 0, 0],
                            _ => unreachable!(),
                        })
                        .collect(),
                    Event::VoteAny { .. } => {
                        let any = evs.iter().any(|e| matches!(e, Event::VoteAny { v: true, .. }));
                        std::vec![[any as u32, 0, 0, 0]; 32]
                    }
                    Event::Ldmatrix { .. } => super::warp_ops::ldmatrix(&evs, &ctxs[w * 32..w * 32 + 32]),
                    Event::Mma { .. } => super::warp_ops::mma(&evs),
                    Event::Barrier { .. } | Event::Wgmma { .. } => unreachable!(),
                };
                for (l, r) in results.into_iter().enumerate() {
                    st[w * 32 + l] = St::Ready(r);
                }
                released = true;
            }
            // Warpgroup collectives (wgmma): resolved once all 128 threads wait at the same one.
            for wg in 0..n / 128 {
                let lanes = &st[wg * 128..wg * 128 + 128];
                let evs: Vec<Event> = lanes
                    .iter()
                    .filter_map(|s| match s {
                        St::Wait(ev @ Event::Wgmma { .. }) => Some(*ev),
                        _ => None,
                    })
                    .collect();
                if evs.len() != 128 {
                    continue;
                }
                if !evs.iter().all(|e| e.same_op(&evs[0])) {
                    return Err(format!("divergent warpgroup collective in warpgroup {wg}: {}", describe(lanes)));
                }
                super::warp_ops::wgmma(&evs, &ctxs[wg * 128..wg * 128 + 128], state.smem_len);
                for s in &mut st[wg * 128..wg * 128 + 128] {
                    *s = St::Ready([0; 4]);
                }
                released = true;
            }
            if released {
                continue;
            }
            // Block barrier: resolved once every thread waits at the same one.
            let at_barrier: Vec<(&'static Location<'static>, Option<bool>)> = st
                .iter()
                .filter_map(|s| match s {
                    St::Wait(Event::Barrier { at, vote }) => Some((*at, *vote)),
                    _ => None,
                })
                .collect();
            if at_barrier.len() == n {
                if at_barrier.iter().any(|a| a.0 != at_barrier[0].0) {
                    return Err(format!("divergent block barrier: {}", describe(&st)));
                }
                // `block::sync_any`: every thread gets whether any thread's predicate held.
                let any = at_barrier.iter().any(|a| a.1 == Some(true)) as u32;
                state.block_epoch.set(state.block_epoch.get() + 1);
                for e in &state.warp_epoch {
                    e.set(e.get() + 1);
                }
                st.iter_mut().for_each(|s| *s = St::Ready([any, 0, 0, 0]));
                continue;
            }
            // Nothing can move: some threads wait for others that will never come.
            return Err(format!("deadlock: barrier or collective not reached by every thread: {}", describe(&st)));
        }
    }));
    // Unfinished coroutines are unwound as they drop, before `ctxs` and `state` go.
    drop(cos);
    match result {
        Ok(r) => r,
        Err(p) => Err(panic_message(p)),
    }
}
