//! The device-support layer: everything a kernel needs from the GPU beyond arithmetic.
//!
//! Each operation is named by who takes part in it (ThunderKittens' convention):
//! [`thread`] (one thread alone), [`warp`] (all 32 lanes of a warp, collectively),
//! [`block`] (every thread of the block, collectively). Memory is reached through
//! [`global`] and [`Shared`], math through [`math`].
//!
//! On `nvptx64` each function is a PTX instruction or LLVM NVVM intrinsic. On the host the
//! same functions are implemented by the emulator in [`emu`], which also checks what the
//! GPU does not: barriers and warp collectives reached by only some threads, shared-memory
//! accesses outside the allocation, reads of shared memory nothing wrote, and races between
//! threads that no barrier separates.

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
use nvptx as imp;

#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
#[cfg(not(target_arch = "nvptx64"))]
use emu::ops as imp;

mod shared;
pub use shared::Shared;

/// Operations of one thread on its own identity.
pub mod thread {
    use super::imp;
    /// `threadIdx.x` (kernels here use 1-D blocks).
    #[inline(always)]
    pub fn idx() -> u32 {
        imp::thread_idx_x()
    }
    /// Starts an asynchronous 16-byte copy (`cp.async.cg`) from global `src` to elements
    /// `i..` of `dst` (both 16-byte aligned); with `valid == false` it writes 16 zero bytes
    /// and reads nothing. Complete only after [`cp_async_commit`] and [`cp_async_wait`].
    ///
    /// # Safety
    /// `src` must point to 16 readable bytes of global memory when `valid`.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn cp_async_16<T: Copy>(dst: super::Shared<T>, i: usize, src: *const T, valid: bool) {
        unsafe { imp::cp_async_16(dst.ptr_at(i), src, valid) }
    }
    /// Starts an asynchronous 4-byte copy (`cp.async.ca`) from global `src` to element `i` of
    /// `dst` (both 4-byte aligned), as [`cp_async_16`]: for single f32 values, whose latency
    /// a plain load would put on the issuing warp's path.
    ///
    /// # Safety
    /// `src` must point to 4 readable bytes of global memory.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn cp_async_4<T: Copy>(dst: super::Shared<T>, i: usize, src: *const T) {
        const { assert!(core::mem::size_of::<T>() == 4) };
        unsafe { imp::cp_async_4(dst.ptr_at(i), src) }
    }
    /// Closes the group of this thread's copies issued since the last commit.
    #[inline(always)]
    pub fn cp_async_commit() {
        imp::cp_async_commit()
    }
    /// Waits until at most `N` of this thread's committed copy groups are still in flight.
    /// Other threads see the data only after a barrier.
    #[inline(always)]
    pub fn cp_async_wait<const N: u32>() {
        imp::cp_async_wait::<N>()
    }
    /// `fence.proxy.async.shared::cta`: makes this thread's shared-memory writes (plain
    /// stores and cp.async, after its wait) visible to the async proxy (wgmma, bulk copies);
    /// a block barrier after it then orders them before other threads' wgmma.
    #[inline(always)]
    pub fn fence_proxy_async() {
        imp::fence_proxy_async()
    }
    /// `x`, unknown to the compiler: what is computed from it inside a loop stays inside the
    /// loop. LLVM hoists every loop-invariant value out of the KV loop whatever the register
    /// cost (PTX registers are unlimited); 16 hoisted cp.async addresses made ptxas spill
    /// (fwd_mma at d=128, two m-tiles). Recomputing them is one IMAD each.
    #[inline(always)]
    pub fn opaque(x: u64) -> u64 {
        imp::opaque(x)
    }
    /// Stops the whole kernel: the host sees a launch failure (device) or an error (emulator).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn trap() -> ! {
        imp::trap()
    }
}

/// Operations that involve the whole thread block.
pub mod block {
    use super::imp;
    /// `blockIdx.{x,y,z}`.
    #[inline(always)]
    pub fn idx() -> (u32, u32, u32) {
        imp::block_idx()
    }
    /// `blockDim.x`.
    #[inline(always)]
    pub fn dim() -> u32 {
        imp::block_dim_x()
    }
    /// Block-wide barrier (`bar.sync 0`): every thread of the block must reach this same
    /// call; shared-memory writes before it are visible to every thread after it.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn sync() {
        imp::sync_block()
    }
    /// [`sync`] that also returns, to every thread, whether `v` holds on any thread of the
    /// block (`bar.red.or.pred`, CUDA's `__syncthreads_or`): a block-wide vote at the cost of
    /// the barrier alone.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn sync_any(v: bool) -> bool {
        imp::sync_block_any(v)
    }
}

/// Collective operations of the 32 lanes of one warp. Every lane must take part.
pub mod warp {
    use super::imp;
    /// Lanes per warp.
    pub const SIZE: u32 = 32;
    /// `threadIdx.x % 32`.
    #[inline(always)]
    pub fn lane() -> u32 {
        imp::thread_idx_x() % SIZE
    }
    /// `threadIdx.x / 32`.
    #[inline(always)]
    pub fn id() -> u32 {
        imp::thread_idx_x() / SIZE
    }
    /// Warp barrier (`bar.warp.sync 0xffffffff`): orders shared-memory accesses among the lanes.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn sync() {
        imp::sync_warp()
    }
    /// Butterfly shuffle (`shfl.sync.bfly.b32`): returns `v` of lane `lane ^ lane_mask`.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn shfl_xor(v: f32, lane_mask: u32) -> f32 {
        imp::shfl_xor_f32(v, lane_mask)
    }
    /// `vote.sync.any.pred`: whether `v` holds on any lane of the warp, to every lane.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn any(v: bool) -> bool {
        imp::vote_any(v)
    }
    /// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: lane `8m + r` gives the 16-byte row `r`
    /// of 8x8 matrix `m` as element `i` of `s`; register `m` of lane `l` gets elements
    /// (l/4, 2(l%4)) and (l/4, 2(l%4)+1) of matrix m (an A or B fragment of mma).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn ldmatrix_x4<T: Copy>(s: super::Shared<T>, i: usize) -> [u32; 4] {
        unsafe { imp::ldmatrix_x4(s.ptr_at(i)) }
    }
    /// As [`ldmatrix_x4`], transposed: register `m` of lane `l` gets elements
    /// (2(l%4), l/4) and (2(l%4)+1, l/4) of matrix m.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn ldmatrix_x4_trans<T: Copy>(s: super::Shared<T>, i: usize) -> [u32; 4] {
        unsafe { imp::ldmatrix_x4_trans(s.ptr_at(i)) }
    }
    /// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: D = A B + C for the warp.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn mma_f16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        imp::mma_f16(a, b, c)
    }
    /// As [`mma_f16`] with bf16 inputs.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn mma_bf16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        imp::mma_bf16(a, b, c)
    }
    /// Max over each group of `W` consecutive lanes (W a power of two up to 32), returned to
    /// every lane of the group. Every lane of the warp must call it.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn allreduce_max_in<const W: u32>(mut v: f32) -> f32 {
        let mut m = W / 2;
        while m > 0 {
            v = v.max(shfl_xor(v, m));
            m /= 2;
        }
        v
    }
    /// Sum over each group of `W` consecutive lanes (butterfly order, so every lane of the
    /// group gets bitwise the same value).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn allreduce_sum_in<const W: u32>(mut v: f32) -> f32 {
        let mut m = W / 2;
        while m > 0 {
            v += shfl_xor(v, m);
            m /= 2;
        }
        v
    }
    /// Max over the 32 lanes, returned to every lane.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn allreduce_max(v: f32) -> f32 {
        allreduce_max_in::<32>(v)
    }
    /// Sum over the 32 lanes, returned to every lane.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn allreduce_sum(v: f32) -> f32 {
        allreduce_sum_in::<32>(v)
    }
}

/// Collective operations of a warpgroup: 4 consecutive warps, the first a multiple of 4
/// (128 threads), issuing Hopper's asynchronous matrix instructions (`wgmma`, sm_90a only:
/// a kernel using these lives in the sm_90a PTX module).
///
/// The pattern, as in the PTX ISA: operands written ([`fence_operands`] orders register
/// writes, [`thread::fence_proxy_async`] and a barrier order shared-memory writes), then
/// [`fence`], one or more [`mma_ss`]/[`mma_rs`], [`commit`], and [`wait`] before the
/// accumulators are read again. Shapes compiled in: N = 64 and 128 (NT = 8, 16) for [`mma_ss`],
/// [`mma_ss_mn`] and [`mma_rs`], N = 32 for [`mma_ss`], N = 192 and 256 for [`mma_rs`] with
/// B MN-major and N = 8 with B K-major; others trap (and the
/// emulator reports them). Wider products are several of these (`fwd_wgmma`'s P V at head_dim 192 and 256).
///
/// ptxas's rule, learnt the hard way: while any wgmma is in flight, no other instruction may
/// write a register that is some wgmma's accumulator (an in-place rescale, or the register
/// moves LLVM puts on a loop's back edge), or ptxas serialises every wgmma of the kernel
/// (its "info" C7515, which the ptx test rejects).
pub mod warpgroup {
    use super::{Shared, imp};
    /// Threads per warpgroup.
    pub const SIZE: u32 = 128;
    /// `threadIdx.x / 128`.
    #[inline(always)]
    pub fn id() -> u32 {
        imp::thread_idx_x() / SIZE
    }
    /// A shared-memory matrix descriptor of wgmma.
    #[derive(Clone, Copy, Debug)]
    pub struct Desc(pub u64);
    impl Desc {
        /// The descriptor of the operand `bytes` (a multiple of 16) further on in shared
        /// memory: the start-address field is address / 16 in 14 bits, which no shared-memory
        /// address (below 256 KB) overflows.
        #[inline(always)]
        pub fn advance(self, bytes: usize) -> Desc {
            Desc(self.0 + (bytes as u64 >> 4))
        }
        /// The same descriptor, opaque to the compiler (so it is rebuilt from one register
        /// where it is used instead of hoisted out of a loop as many live constants).
        #[inline(always)]
        pub fn opaque(self) -> Desc {
            Desc(super::thread::opaque(self.0))
        }
    }
    /// The descriptor of an operand at element `i` of `s` in the 128-byte-swizzle canonical
    /// layout: rows of 64 16-bit elements (128 bytes), 8-row groups of 1024 bytes whose
    /// 16-byte chunks are XOR-swizzled by row % 8, on 1024-byte-aligned atoms.
    /// K-major (A, or B not transposed): `sbo` is the byte offset between 8-row groups along
    /// M/N; `lbo` is unused (1). MN-major (B transposed): `lbo` is the byte offset between
    /// 64-element blocks along N, `sbo` between 8-row groups along K.
    #[inline(always)]
    pub fn desc_sw128<T: Copy>(s: Shared<T>, i: usize, lbo: u32, sbo: u32) -> Desc {
        let start = imp::shared_offset(s.ptr_at(i) as *const u8);
        Desc(((start as u64 >> 4) & 0x3fff) | (((lbo as u64 >> 4) & 0x3fff) << 16) | (((sbo as u64 >> 4) & 0x3fff) << 32) | (1u64 << 62))
    }
    /// `wgmma.fence.sync.aligned`: orders this warpgroup's earlier register writes of
    /// accumulators and A fragments before the wgmma that read them.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn fence() {
        imp::wgmma_fence()
    }
    /// `wgmma.commit_group.sync.aligned`: closes the group of wgmma issued since the last.
    #[inline(always)]
    pub fn commit() {
        imp::wgmma_commit()
    }
    /// `wgmma.wait_group.sync.aligned N`: waits until at most `N` groups are pending. The
    /// accumulators of completed groups are tied to the wait, so the compiler reads them
    /// only after it: pass every accumulator the waited groups write.
    #[inline(always)]
    pub fn wait<const N: u32, const NT: usize>(acc: &mut [[f32; 4]; NT]) {
        imp::wgmma_wait::<N>();
        fence_operands(acc);
    }
    /// Ties register values to this point of the program: LLVM knows nothing of wgmma's
    /// asynchrony, so without it could move reads of an accumulator above a [`wait`], or
    /// writes of an operand below a [`fence`] (no code is emitted).
    #[inline(always)]
    pub fn fence_operands<const NT: usize>(acc: &mut [[f32; 4]; NT]) {
        for x in acc.as_flattened_mut() {
            imp::pin_f32(x);
        }
    }
    /// As [`fence_operands`], for A fragments (packed 16-bit pairs).
    #[inline(always)]
    pub fn fence_fragments<const KT: usize>(a: &mut [[u32; 4]; KT]) {
        for x in a.as_flattened_mut() {
            imp::pin_u32(x);
        }
    }
    /// `wgmma.mma_async.sync.aligned.m64n{8 NT}k16.f32.{f16,bf16}` with A and B in shared
    /// memory (both K-major): acc = A B (+ acc when `accumulate`). `bf16` picks the input
    /// type (a constant after inlining). Warp w of the warpgroup
    /// gets rows 16 w..16 w + 16 of the 64; lane 4g + t holds acc[n] = rows g, g + 8 at
    /// columns 8n + 2t, 8n + 2t + 1 (the m16n8 C layout of mma.sync, n-tile by n-tile).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn mma_ss<const NT: usize>(a: Desc, b: Desc, acc: &mut [[f32; 4]; NT], accumulate: bool, bf16: bool) {
        imp::wgmma_ss::<NT, false, false>(a.0, b.0, acc, accumulate, bf16)
    }
    /// As [`mma_ss`] with A and B both MN-major (transposed: A[m][k] stored as row k of the
    /// layout, m along its 128-byte rows; B as in [`mma_rs`] with `TRANS_B`); the descriptors'
    /// `lbo` is the byte offset between 64-element blocks along M (N), `sbo` between 8-row
    /// groups along K.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn mma_ss_mn<const NT: usize>(a: Desc, b: Desc, acc: &mut [[f32; 4]; NT], accumulate: bool, bf16: bool) {
        imp::wgmma_ss::<NT, true, true>(a.0, b.0, acc, accumulate, bf16)
    }
    /// As [`mma_ss`] with A from registers (lane 4g + t of warp w: rows 16w + g, 16w + g + 8
    /// at k = 2t, 2t + 1, and + 8: the A layout of mma.sync m16n8k16) and B in shared memory,
    /// MN-major (transposed) when `TRANS_B`.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn mma_rs<const NT: usize, const TRANS_B: bool>(a: [u32; 4], b: Desc, acc: &mut [[f32; 4]; NT], accumulate: bool, bf16: bool) {
        imp::wgmma_rs::<NT, TRANS_B>(a, b.0, acc, accumulate, bf16)
    }
}

/// 16 bytes, 16-byte aligned: the unit of vector loads and stores (`ld/st.v4.b32`).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chunk16(pub [u32; 4]);

/// Global (device) memory, reached through raw addresses from the launch parameters.
pub mod global {
    use super::imp;
    /// Reads one element. The emulator checks the address lies in a buffer of the launch.
    ///
    /// # Safety
    /// `ptr` must point to a live, aligned `T` in global memory.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn load<T: Copy>(ptr: *const T) -> T {
        unsafe { imp::global_load(ptr) }
    }
    /// Writes one element.
    ///
    /// # Safety
    /// `ptr` must point to a live, aligned `T` in global memory that no other thread writes.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn store<T: Copy>(ptr: *mut T, v: T) {
        unsafe { imp::global_store(ptr, v) }
    }
    /// Writes 16 bytes with one `st.global.v4.b32` (a plain store of a [`super::Chunk16`]
    /// became two 8-byte generic stores).
    ///
    /// # Safety
    /// As [`store`]; `ptr` 16-byte aligned.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn store_16(ptr: *mut super::Chunk16, v: super::Chunk16) {
        unsafe { imp::global_store_16(ptr, v) }
    }
    /// Thread: `*ptr += v`, atomically, returning nothing (`red.global.add.f32`): for sums
    /// that several blocks add to. The order of additions from different threads is not
    /// fixed, so the result is not bitwise reproducible.
    ///
    /// # Safety
    /// `ptr` must point to a live, aligned f32 in global memory that only atomics touch
    /// while the kernel runs.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn red_add(ptr: *mut f32, v: f32) {
        unsafe { imp::global_red_add(ptr, v) }
    }
    /// Thread: `ptr[0] += v[0]; ptr[1] += v[1]`, atomically each, as one
    /// `red.global.add.v2.f32` (sm_90: the sm_90a module only).
    ///
    /// # Safety
    /// As [`red_add`]; `ptr` 8-byte aligned.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn red_add_v2(ptr: *mut f32, v: [f32; 2]) {
        unsafe { imp::global_red_add_v2(ptr, v) }
    }
}

/// Math the kernels need in a fast hardware form.
pub mod math {
    use super::imp;
    /// 2^x (`ex2.approx.ftz.f32`: one MUFU.EX2; results below 2^-126 flush to 0, which no
    /// softmax weight notices next to the row max's 1; without .ftz ptxas wraps each in a
    /// range check and two multiplies. Exact `exp2` in the emulator). `ex2(-inf) == 0`.
    #[inline(always)]
    pub fn ex2(x: f32) -> f32 {
        imp::ex2(x)
    }
    /// An f16, given by its bits, widened to f32 (exact; `cvt.f32.f16`).
    #[inline(always)]
    pub fn f16_to_f32(h: u16) -> f32 {
        imp::f16_to_f32(h)
    }
    /// An f32 rounded to f16, to nearest even; its bits (`cvt.rn.f16.f32`).
    #[inline(always)]
    pub fn f32_to_f16(x: f32) -> u16 {
        imp::f32_to_f16(x)
    }
    /// Two f32 rounded to f16 and packed (lo in the low half): an mma operand register.
    #[inline(always)]
    pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
        imp::pack_f16x2(lo, hi)
    }
    /// Two f32 rounded to bf16 and packed (lo in the low half).
    #[inline(always)]
    pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
        imp::pack_bf16x2(lo, hi)
    }
    /// a * b + c with one rounding (`fma.rn.f32`; LLVM does not contract a separate multiply
    /// and add on its own here, and ptxas does not fuse `mul.rn`/`add.rn`).
    #[inline(always)]
    pub fn fma(a: f32, b: f32, c: f32) -> f32 {
        imp::fma(a, b, c)
    }
    /// 1/x, correctly rounded.
    #[inline(always)]
    pub fn rcp(x: f32) -> f32 {
        1.0 / x
    }
    /// tanh(x) within 2^-16 of its magnitude (`tanh.approx.f32`: one MUFU.TANH, sm_75 and
    /// later; 2^-16.46 the largest error over every f32 argument on an H100, measured in
    /// `benches/RESULTS.md`). The emulator cuts every result to 16 significand bits, toward
    /// zero: the bound's worst case.
    #[inline(always)]
    pub fn tanh_approx(x: f32) -> f32 {
        imp::tanh_approx(x)
    }
    /// 1/x to within an ulp (`rcp.approx.ftz.f32`: one MUFU.RCP, where the correctly rounded
    /// division is a sequence with a slow path ptxas calls as a subroutine; subnormal inputs
    /// and results flush to 0. Exact in the emulator).
    #[inline(always)]
    pub fn rcp_approx(x: f32) -> f32 {
        imp::rcp_approx(x)
    }
}

/// The launch-sized (dynamic) shared memory of the block, `len` elements of `T` at its start.
///
/// # Safety
/// The launch must have given the block at least `len * size_of::<T>()` bytes of dynamic
/// shared memory; `T` must need no more than 16-byte alignment.
#[inline(always)]
pub unsafe fn dynamic_shared<T: Copy>(len: usize) -> Shared<T> {
    unsafe { Shared::from_raw(imp::dynamic_shared_base() as *mut T, len) }
}
