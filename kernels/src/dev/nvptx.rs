//! The device-support layer on the GPU: PTX special registers, barriers and NVVM intrinsics.

use core::arch::asm;
use core::arch::nvptx;

#[allow(improper_ctypes)]
unsafe extern "C" {
    #[link_name = "llvm.nvvm.ex2.approx.ftz.f"]
    fn nvvm_ex2(x: f32) -> f32;
    #[link_name = "llvm.nvvm.rcp.approx.ftz.f"]
    fn nvvm_rcp_approx(x: f32) -> f32;
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
/// `bar.red.or.pred`: the block barrier that also ORs a predicate over every thread.
#[inline(always)]
pub fn sync_block_any(v: bool) -> bool {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {v}, 0; bar.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}", v = in(reg32) v as u32, r = out(reg32) r, options(nostack));
    }
    r != 0
}
#[inline(always)]
pub fn sync_warp() {
    unsafe { nvvm_bar_warp_sync(0xffff_ffff) }
}
#[inline(always)]
pub fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    unsafe { nvvm_shfl_bfly(0xffff_ffff, v, lane_mask, 0x1f) }
}
/// Not `pure`: LLVM must assume it changes, so it is neither hoisted nor merged.
#[inline(always)]
pub fn opaque(x: u64) -> u64 {
    let r: u64;
    unsafe { asm!("mov.b64 {r}, {x};", r = out(reg64) r, x = in(reg64) x, options(nomem, nostack)) }
    r
}
#[inline(always)]
pub fn vote_any(v: bool) -> bool {
    let r: u32;
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {v}, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 {r}, 1, 0, q; }}", v = in(reg32) v as u32, r = out(reg32) r, options(nomem, nostack));
    }
    r != 0
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
pub fn tanh_approx(x: f32) -> f32 {
    let r: u32;
    unsafe { asm!("tanh.approx.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x.to_bits(), options(pure, nomem, nostack)) }
    f32::from_bits(r)
}
#[inline(always)]
pub fn rcp_approx(x: f32) -> f32 {
    unsafe { nvvm_rcp_approx(x) }
}
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    core::intrinsics::fmaf32(a, b, c)
}
/// 1024-byte aligned: tiles carved from it can be read with 16-byte accesses, and wgmma's
/// 128-byte swizzle, which XORs address bits 4-6 with bits 7-9, needs its 8-row atoms on
/// 1024-byte boundaries.
#[repr(C, align(1024))]
#[derive(Clone, Copy)]
struct Align1024([u8; 1024]);

#[inline(always)]
pub fn dynamic_shared_base() -> *mut u8 {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<Align1024>() as *mut u8
}

/// 32-bit shared-state-space address of a generic pointer into the dynamic shared memory:
/// the base's address (one `cvta`, the same for every call) plus the byte offset, so the
/// offset arithmetic stays 32-bit and constant offsets become instruction immediates.
/// (A `cvta` of each pointer made ptxas do every ldmatrix and cp.async address in 64 bits and
/// rebuild the generic pointer with the shared window's high word: about one IADD3, one
/// IMAD.X and two MOV per ldmatrix at 27ff2b2.) Every shared view of the kernels is carved
/// from [`dynamic_shared_base`].
#[inline(always)]
fn smem_addr<T>(p: *const T) -> u32 {
    let base = dynamic_shared_base();
    let a: u32;
    unsafe {
        asm!("{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {a}, t; }}", p = in(reg64) base, a = out(reg32) a, options(pure, nomem, nostack));
    }
    a.wrapping_add((p as usize).wrapping_sub(base as usize) as u32)
}

#[inline(always)]
pub unsafe fn shared_load_16(p: *const super::Chunk16) -> super::Chunk16 {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ld.shared.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) smem_addr(p), options(nostack, readonly));
    }
    super::Chunk16([a, b, c, d])
}
#[inline(always)]
pub unsafe fn global_red_add(p: *mut f32, v: f32) {
    unsafe { asm!("red.global.add.f32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack)) }
}
/// `red.global.add.v2.f32` (sm_90, PTX ISA 8.1).
#[inline(always)]
pub unsafe fn global_red_add_v2(p: *mut f32, v: [f32; 2]) {
    unsafe { asm!("red.global.add.v2.f32 [{p}], {{{a}, {b}}};", p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], options(nostack)) }
}
#[inline(always)]
pub unsafe fn global_store_16(p: *mut super::Chunk16, v: super::Chunk16) {
    let [a, b, c, d] = v.0;
    unsafe {
        asm!("st.global.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg64) p, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, d = in(reg32) d, options(nostack));
    }
}
#[inline(always)]
pub unsafe fn ldmatrix_x4<T>(row: *const T) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) smem_addr(row), options(nostack, readonly));
    }
    [a, b, c, d]
}

#[inline(always)]
pub unsafe fn ldmatrix_x4_trans<T>(row: *const T) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) smem_addr(row), options(nostack, readonly));
    }
    [a, b, c, d]
}

macro_rules! mma_m16n8k16 {
    ($name:ident, $ty:literal) => {
        #[inline(always)]
        pub fn $name(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
            let (d0, d1, d2, d3): (f32, f32, f32, f32);
            unsafe {
                asm!(concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};"),
                    d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    b0 = in(reg32) b[0], b1 = in(reg32) b[1],
                    c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
                    options(nostack));
            }
            [d0, d1, d2, d3]
        }
    };
}
mma_m16n8k16!(mma_f16, "f16");
mma_m16n8k16!(mma_bf16, "bf16");

#[inline(always)]
pub unsafe fn cp_async_16<T>(dst: *mut T, src: *const T, valid: bool) {
    let n: u32 = if valid { 16 } else { 0 };
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};", d = in(reg32) smem_addr(dst), s = in(reg64) src, n = in(reg32) n, options(nostack));
    }
}
#[inline(always)]
pub unsafe fn cp_async_4<T>(dst: *mut T, src: *const T) {
    unsafe {
        asm!("cp.async.ca.shared.global [{d}], [{s}], 4;", d = in(reg32) smem_addr(dst), s = in(reg64) src, options(nostack));
    }
}
#[inline(always)]
pub fn cp_async_commit() {
    unsafe { asm!("cp.async.commit_group;", options(nostack)) }
}
#[inline(always)]
pub fn cp_async_wait<const N: u32>() {
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) }
}
/// Two f32 to a packed f16x2 (lo in the low half), round to nearest even.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    unsafe {
        asm!("cvt.rn.f16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo, options(pure, nomem, nostack))
    }
    r
}
/// An f16 (its bits) widened to f32, exactly.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let r: f32;
    unsafe { asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) h, options(pure, nomem, nostack)) }
    r
}
/// An f32 rounded to f16 (its bits), to nearest even.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let r: u16;
    unsafe { asm!("cvt.rn.f16.f32 {r}, {x};", r = out(reg16) r, x = in(reg32) x, options(pure, nomem, nostack)) }
    r
}
/// Two f32 to a packed bf16x2 (lo in the low half), round to nearest even.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo, options(pure, nomem, nostack))
    }
    r
}

/// Shared-state-space address of a pointer into the dynamic shared memory (for wgmma
/// descriptors).
#[inline(always)]
pub fn shared_offset(p: *const u8) -> u32 {
    smem_addr(p)
}
#[inline(always)]
pub fn fence_proxy_async() {
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}
#[inline(always)]
pub fn wgmma_fence() {
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) }
}
#[inline(always)]
pub fn wgmma_commit() {
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) }
}
#[inline(always)]
pub fn wgmma_wait<const N: u32>() {
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) }
}
/// An empty asm with the value as input and output: emits nothing, orders the value
/// against the (volatile) wgmma fence and wait around it.
#[inline(always)]
pub fn pin_f32(x: &mut f32) {
    unsafe { asm!("// pin {0}", inout(reg32) * x, options(nostack, nomem)) }
}
#[inline(always)]
pub fn pin_u32(x: &mut u32) {
    unsafe { asm!("// pin {0}", inout(reg32) * x, options(nostack, nomem)) }
}

/// One wgmma.mma_async with the accumulator registers `$i` (positional operands {0}..,
/// the template's list built from them): `ss` (A by descriptor) or `rs` (A in four
/// registers), bf16 inputs when `$bf` (a constant after inlining) and f16 otherwise. The
/// scale-d predicate comes from `sd` (0: acc = A B); `$tb` is imm-trans-b (and, `ss` only,
/// `$ta` imm-trans-a).
macro_rules! wgmma_asm {
    ($form:ident, $bf:ident, $n:literal, $acc:ident, $list:tt, $($rest:tt)*) => {
        if $bf { wgmma_asm!(@$form "bf16", $n, $acc, $list, $($rest)*) } else { wgmma_asm!(@$form "f16", $n, $acc, $list, $($rest)*) }
    };
    (@ss $ty:literal, $n:literal, $acc:ident, [$i0:literal $(, $i:literal)*], $a:ident, $b:ident, $sd:ident, $ta:literal, $tb:literal) => {{
        let acc = unsafe { &mut *($acc.as_mut_ptr() as *mut [f32; $n / 2]) };
        unsafe {
            asm!(concat!("{{ .reg .pred p; setp.ne.b32 p, {sd}, 0; wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " {{{", $i0, "}", $(", {", $i, "}",)* "}}, {a}, {b}, p, 1, 1, ", $ta, ", ", $tb, "; }}"),
                inout(reg32) acc[$i0], $(inout(reg32) acc[$i],)*
                a = in(reg64) $a, b = in(reg64) $b, sd = in(reg32) $sd, options(nostack));
        }
    }};
    (@rs $ty:literal, $n:literal, $acc:ident, [$i0:literal $(, $i:literal)*], $a:ident, $b:ident, $sd:ident, $tb:literal) => {{
        let acc = unsafe { &mut *($acc.as_mut_ptr() as *mut [f32; $n / 2]) };
        unsafe {
            asm!(concat!("{{ .reg .pred p; setp.ne.b32 p, {sd}, 0; wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " {{{", $i0, "}", $(", {", $i, "}",)* "}}, {{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, ", $tb, "; }}"),
                inout(reg32) acc[$i0], $(inout(reg32) acc[$i],)*
                a0 = in(reg32) $a[0], a1 = in(reg32) $a[1], a2 = in(reg32) $a[2], a3 = in(reg32) $a[3],
                b = in(reg64) $b, sd = in(reg32) $sd, options(nostack));
        }
    }};
}

/// A and B by descriptor: (TA, TB) = (false, false) both K-major, (true, true) both
/// MN-major. NT n-tiles of 8: the accumulator shapes compiled in.
#[inline(always)]
pub fn wgmma_ss<const NT: usize, const TA: bool, const TB: bool>(a: u64, b: u64, acc: &mut [[f32; 4]; NT], accumulate: bool, bf16: bool) {
    let sd = accumulate as u32;
    let acc = acc.as_flattened_mut();
    match (NT, TA, TB) {
        (4, false, false) => wgmma_asm!(ss, bf16, 32, acc, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], a, b, sd, "0", "0"),
        (8, false, false) => wgmma_asm!(
            ss,
            bf16,
            64,
            acc,
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
            a,
            b,
            sd,
            "0",
            "0"
        ),
        (8, true, true) => wgmma_asm!(
            ss,
            bf16,
            64,
            acc,
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
            a,
            b,
            sd,
            "1",
            "1"
        ),
        (16, false, false) => wgmma_asm!(
            ss,
            bf16,
            128,
            acc,
            [
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
            ],
            a,
            b,
            sd,
            "0",
            "0"
        ),
        (16, true, true) => wgmma_asm!(
            ss,
            bf16,
            128,
            acc,
            [
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
            ],
            a,
            b,
            sd,
            "1",
            "1"
        ),
        _ => trap(),
    }
}

/// A from registers, B by descriptor.
#[inline(always)]
pub fn wgmma_rs<const NT: usize, const TRANS_B: bool>(a: [u32; 4], b: u64, acc: &mut [[f32; 4]; NT], accumulate: bool, bf16: bool) {
    let sd = accumulate as u32;
    let acc = acc.as_flattened_mut();
    match (NT, TRANS_B) {
        (1, false) => wgmma_asm!(rs, bf16, 8, acc, [0, 1, 2, 3], a, b, sd, "0"),
        (8, false) => wgmma_asm!(
            rs,
            bf16,
            64,
            acc,
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
            a,
            b,
            sd,
            "0"
        ),
        (8, true) => wgmma_asm!(
            rs,
            bf16,
            64,
            acc,
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31],
            a,
            b,
            sd,
            "1"
        ),
        (16, false) => wgmma_asm!(
            rs,
            bf16,
            128,
            acc,
            [
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
            ],
            a,
            b,
            sd,
            "0"
        ),
        (16, true) => wgmma_asm!(
            rs,
            bf16,
            128,
            acc,
            [
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
            ],
            a,
            b,
            sd,
            "1"
        ),
        (24, true) => wgmma_asm!(
            rs,
            bf16,
            192,
            acc,
            [
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
                64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94,
                95
            ],
            a,
            b,
            sd,
            "1"
        ),
        (32, true) => wgmma_asm!(
            rs,
            bf16,
            256,
            acc,
            [
                0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
                64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94,
                95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119,
                120, 121, 122, 123, 124, 125, 126, 127
            ],
            a,
            b,
            sd,
            "1"
        ),
        _ => trap(),
    }
}
