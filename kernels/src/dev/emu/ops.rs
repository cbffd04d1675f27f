//! The device-support operations, as the emulator implements them for the running thread.

use super::sched::{Event, current, fault};
use core::panic::Location;
use std::format;

pub fn thread_idx_x() -> u32 {
    current().tid
}
pub fn block_idx() -> (u32, u32, u32) {
    current().block.block
}
pub fn block_dim_x() -> u32 {
    current().block.block_dim
}
#[track_caller]
pub fn trap() -> ! {
    fault(format!("thread {} executed trap at {}", current().tid, Location::caller()))
}
#[track_caller]
pub fn sync_block() {
    current().wait(Event::Barrier { vote: None, at: Location::caller() });
}
#[track_caller]
pub fn sync_block_any(v: bool) -> bool {
    current().wait(Event::Barrier { vote: Some(v), at: Location::caller() })[0] != 0
}
#[track_caller]
pub fn sync_warp() {
    current().wait(Event::WarpSync(Location::caller()));
}
#[track_caller]
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    let r = current().wait(Event::ShflXor { v: v.to_bits(), lane_mask, at: Location::caller() });
    f32::from_bits(r[0])
}
pub fn opaque(x: u64) -> u64 {
    x
}
#[track_caller]
pub fn vote_any(v: bool) -> bool {
    current().wait(Event::VoteAny { v, at: Location::caller() })[0] != 0
}

#[track_caller]
fn check_global(addr: usize, size: usize, write: bool) {
    let t = current();
    if !addr.is_multiple_of(size.min(16)) {
        fault(format!(
            "thread {} accesses {size} bytes of global memory at {addr:#x}, not aligned to {size}, at {}",
            t.tid,
            Location::caller()
        ));
    }
    let ok = t.block.regions.iter().any(|r| addr >= r.start && addr + size <= r.start + r.len && (r.writable || !write));
    if !ok {
        let kind = if write { "writes" } else { "reads" };
        fault(format!(
            "thread {} {kind} {size} bytes of global memory at {addr:#x}, outside every {}buffer of the launch, at {}",
            t.tid,
            if write { "writable " } else { "" },
            Location::caller()
        ));
    }
}
#[track_caller]
pub unsafe fn global_load<T: Copy>(ptr: *const T) -> T {
    check_global(ptr as usize, size_of::<T>(), false);
    unsafe { ptr.read() }
}
#[track_caller]
pub unsafe fn global_store<T: Copy>(ptr: *mut T, v: T) {
    check_global(ptr as usize, size_of::<T>(), true);
    unsafe { ptr.write(v) }
}
#[track_caller]
pub unsafe fn global_red_add(ptr: *mut f32, v: f32) {
    use std::sync::atomic::{AtomicU32, Ordering};
    check_global(ptr as usize, 4, true);
    // Blocks run on several OS threads: a real atomic, as on the GPU.
    let a = unsafe { &*(ptr as *const AtomicU32) };
    let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some((f32::from_bits(x) + v).to_bits()));
}
#[track_caller]
pub unsafe fn global_red_add_v2(ptr: *mut f32, v: [f32; 2]) {
    if !(ptr as usize).is_multiple_of(8) {
        fault(format!("red.global.add.v2.f32 at a misaligned address {ptr:?}"));
    }
    unsafe {
        global_red_add(ptr, v[0]);
        global_red_add(ptr.add(1), v[1]);
    }
}
#[track_caller]
pub unsafe fn global_store_16(ptr: *mut crate::dev::Chunk16, v: crate::dev::Chunk16) {
    unsafe { global_store(ptr, v) }
}
#[track_caller]
pub unsafe fn shared_load_16(ptr: *const crate::dev::Chunk16) -> crate::dev::Chunk16 {
    unsafe { shared_load(ptr) }
}
#[track_caller]
pub unsafe fn shared_load<T: Copy>(ptr: *const T) -> T {
    current().shared_access(ptr as usize, size_of::<T>(), false, Location::caller());
    unsafe { ptr.read() }
}
#[track_caller]
pub unsafe fn shared_store<T: Copy>(ptr: *mut T, v: T) {
    current().shared_access(ptr as usize, size_of::<T>(), true, Location::caller());
    unsafe { ptr.write(v) }
}
pub fn ex2(x: f32) -> f32 {
    x.exp2()
}
pub fn rcp_approx(x: f32) -> f32 {
    1.0 / x
}
/// `tanh.approx.f32` at its measured error bound (`math::tanh_approx`): tanh in f64 with
/// its significand cut to 16 bits, toward zero, so that every result is up to 2^-16 below
/// the exact one in magnitude, as far as the hardware's may be (a kernel that passes here
/// passes with any error inside that bound). +-1 past saturation, +-0 at +-0; NaN stays NaN.
pub fn tanh_approx(x: f32) -> f32 {
    let t = (x as f64).tanh() as f32;
    if !t.is_finite() || t == 0.0 {
        return t;
    }
    let cut = f32::from_bits(t.to_bits() & !((1u32 << 7) - 1));
    if t.abs() == 1.0 { t } else { cut }
}
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
pub fn dynamic_shared_base() -> *mut u8 {
    current().shared_base()
}
#[track_caller]
pub unsafe fn ldmatrix_x4<T>(row: *const T) -> [u32; 4] {
    current().wait(Event::Ldmatrix { addr: row as usize, trans: false, at: Location::caller() })
}
#[track_caller]
pub unsafe fn ldmatrix_x4_trans<T>(row: *const T) -> [u32; 4] {
    current().wait(Event::Ldmatrix { addr: row as usize, trans: true, at: Location::caller() })
}
#[track_caller]
fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4], bf16: bool) -> [f32; 4] {
    let c = c.map(f32::to_bits);
    current().wait(Event::Mma { a, b, c, bf16, at: Location::caller() }).map(f32::from_bits)
}
#[track_caller]
pub fn mma_f16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    mma(a, b, c, false)
}
#[track_caller]
pub fn mma_bf16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    mma(a, b, c, true)
}
/// The emulator copies at issue and tracks the bytes as in flight until the wait.
#[track_caller]
pub unsafe fn cp_async_16<T>(dst: *mut T, src: *const T, valid: bool) {
    let t = current();
    let at = Location::caller();
    if !(dst as usize).is_multiple_of(16) || (valid && !(src as usize).is_multiple_of(16)) {
        fault(format!("thread {} cp.async of 16 bytes with a misaligned address at {at}", t.tid));
    }
    let mut bytes = [0u8; 16];
    if valid {
        check_global(src as usize, 16, false);
        unsafe { core::ptr::copy_nonoverlapping(src as *const u8, bytes.as_mut_ptr(), 16) };
    }
    t.shared_async_write(dst as usize, 16, at);
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, 16) };
}
#[track_caller]
pub unsafe fn cp_async_4<T>(dst: *mut T, src: *const T) {
    let t = current();
    let at = Location::caller();
    if !(dst as usize).is_multiple_of(4) || !(src as usize).is_multiple_of(4) {
        fault(format!("thread {} cp.async of 4 bytes with a misaligned address at {at}", t.tid));
    }
    let mut bytes = [0u8; 4];
    check_global(src as usize, 4, false);
    unsafe { core::ptr::copy_nonoverlapping(src as *const u8, bytes.as_mut_ptr(), 4) };
    t.shared_async_write(dst as usize, 4, at);
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, 4) };
}
pub fn cp_async_commit() {
    current().async_commit()
}
pub fn cp_async_wait<const N: u32>() {
    current().async_wait(N as usize)
}
pub fn f16_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    f32_to_f16(lo) as u32 | (f32_to_f16(hi) as u32) << 16
}
/// cvt.rn.bf16x2.f32: round to nearest even, as `dtype::Bf16::from_f32`.
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    half::bf16::from_f32(lo).to_bits() as u32 | (half::bf16::from_f32(hi).to_bits() as u32) << 16
}

/// Byte offset from the block's shared-memory base: the emulator's shared address (the
/// base stands for a 1024-byte-aligned one, as on the GPU).
pub fn shared_offset(p: *const u8) -> u32 {
    (p as usize).wrapping_sub(current().shared_base() as usize) as u32
}
pub fn fence_proxy_async() {}
pub fn wgmma_fence() {}
pub fn wgmma_commit() {}
pub fn wgmma_wait<const N: u32>() {}
pub fn pin_f32(_: &mut f32) {}
pub fn pin_u32(_: &mut u32) {}
/// A wgmma shape (m64, n = 8 NT, A as `a`, B MN- or K-major) that the PTX build does not
/// have faults here, as it would trap on the GPU.
#[track_caller]
fn fault_unless_compiled(compiled: bool, nt: usize, a: &str, b_mn_major: bool) {
    if !compiled {
        let b = if b_mn_major { "MN-major" } else { "K-major" };
        fault(format!("wgmma m64n{}k16 ({a}, B {b}) is not compiled for the GPU, at {}", 8 * nt, Location::caller()));
    }
}
/// wgmma completes at issue in the emulator: the warpgroup's 128 threads meet, and the
/// scheduler writes each thread's accumulators through the pointer it passed.
#[track_caller]
pub fn wgmma_ss<const NT: usize, const TA: bool, const TB: bool>(a: u64, b: u64, acc: &mut [[f32; 4]; NT], accumulate: bool, bf16: bool) {
    // The shapes the PTX build has (`nvptx::wgmma_ss`; any other traps on the GPU).
    let compiled = matches!((NT, TA, TB), (4, false, false) | (8 | 16, false, false) | (8 | 16, true, true));
    fault_unless_compiled(compiled, NT, if TA { "A MN-major" } else { "A K-major" }, TB);
    let ev = Event::Wgmma {
        a_desc: Some(a),
        a_regs: [0; 4],
        b,
        acc: acc.as_flattened_mut().as_mut_ptr(),
        nt: NT as u32,
        accumulate,
        trans_a: TA,
        trans_b: TB,
        bf16,
        at: Location::caller(),
    };
    current().wait(ev);
}
#[track_caller]
pub fn wgmma_rs<const NT: usize, const TRANS_B: bool>(a: [u32; 4], b: u64, acc: &mut [[f32; 4]; NT], accumulate: bool, bf16: bool) {
    // The shapes the PTX build has (`nvptx::wgmma_rs`; any other traps on the GPU).
    fault_unless_compiled(matches!((NT, TRANS_B), (1, false) | (8, _) | (16, _) | (24 | 32, true)), NT, "A from registers", TRANS_B);
    let ev = Event::Wgmma {
        a_desc: None,
        a_regs: a,
        b,
        acc: acc.as_flattened_mut().as_mut_ptr(),
        nt: NT as u32,
        accumulate,
        trans_a: false,
        trans_b: TRANS_B,
        bf16,
        at: Location::caller(),
    };
    current().wait(ev);
}
