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
    current().wait(Event::Barrier(Location::caller()));
}
#[track_caller]
pub fn sync_warp() {
    current().wait(Event::WarpSync(Location::caller()));
}
#[track_caller]
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    let r = current().wait(Event::ShflXor { v: v.to_bits(), lane_mask, at: Location::caller() });
    f32::from_bits(r)
}

#[track_caller]
fn check_global(addr: usize, size: usize, write: bool) {
    let t = current();
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
pub fn lg2(x: f32) -> f32 {
    x.log2()
}
pub fn dynamic_shared_base() -> *mut u8 {
    current().shared_base()
}
