//! The device-support layer on the GPU: PTX special registers, barriers and NVVM intrinsics.

use core::arch::nvptx;

#[allow(improper_ctypes)]
unsafe extern "C" {
    #[link_name = "llvm.nvvm.ex2.approx.f"]
    fn nvvm_ex2(x: f32) -> f32;
    #[link_name = "llvm.nvvm.lg2.approx.f"]
    fn nvvm_lg2(x: f32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn nvvm_shfl_bfly(member_mask: u32, v: f32, lane_mask: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn nvvm_bar_warp_sync(member_mask: u32);
}

#[inline(always)]
pub fn thread_idx_x() -> u32 {
    unsafe { nvptx::_thread_idx_x() as u32 }
}
#[inline(always)]
pub fn block_idx() -> (u32, u32, u32) {
    unsafe { (nvptx::_block_idx_x() as u32, nvptx::_block_idx_y() as u32, nvptx::_block_idx_z() as u32) }
}
#[inline(always)]
pub fn block_dim_x() -> u32 {
    unsafe { nvptx::_block_dim_x() as u32 }
}
#[inline(always)]
pub fn trap() -> ! {
    unsafe { nvptx::trap() }
}
#[inline(always)]
pub fn sync_block() {
    unsafe { nvptx::_syncthreads() }
}
#[inline(always)]
pub fn sync_warp() {
    unsafe { nvvm_bar_warp_sync(0xffff_ffff) }
}
#[inline(always)]
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    unsafe { nvvm_shfl_bfly(0xffff_ffff, v, lane_mask, 0x1f) }
}
#[inline(always)]
pub unsafe fn global_load<T: Copy>(ptr: *const T) -> T {
    unsafe { *ptr }
}
#[inline(always)]
pub unsafe fn global_store<T: Copy>(ptr: *mut T, v: T) {
    unsafe { *ptr = v }
}
#[inline(always)]
pub unsafe fn shared_load<T: Copy>(ptr: *const T) -> T {
    unsafe { *ptr }
}
#[inline(always)]
pub unsafe fn shared_store<T: Copy>(ptr: *mut T, v: T) {
    unsafe { *ptr = v }
}
#[inline(always)]
pub fn ex2(x: f32) -> f32 {
    unsafe { nvvm_ex2(x) }
}
#[inline(always)]
pub fn lg2(x: f32) -> f32 {
    unsafe { nvvm_lg2(x) }
}
/// 16-byte aligned, so tiles carved from it can be read with 16-byte accesses.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Align16([u8; 16]);

#[inline(always)]
pub fn dynamic_shared_base() -> *mut u8 {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<Align16>() as *mut u8
}
