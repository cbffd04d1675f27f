//! The atomic backward families' last kernel (`mma_atomic`, `wgmma_atomic`): the f32 dQ
//! accumulator their dK/dV/dQ kernel added into, scaled and rounded into dQ.

use crate::dev::{block, global, thread};
use crate::dtype::MmaElement;
use crate::params::BwdParams;

/// Rows per block of [`dq_convert`].
pub const CONVERT_ROWS: usize = 64;

/// The atomic backward's last kernel: dQ = scale * dq_accum, rounded to T, into dQ's layout.
/// One block per (64 query rows, query head, batch); thread x converts column pairs x + 128 i.
///
/// # Safety
/// `p` valid (host-checked), `p.dq_accum` written by the dK/dV/dQ kernel, 128 threads.
#[inline(always)]
pub unsafe fn dq_convert<T: MmaElement>(p: &BwdParams) {
    let (blk, h, b) = block::idx();
    let (sq, d) = (p.pb.seqlen_q, p.pb.head_dim);
    let r0 = blk * CONVERT_ROWS as u32;
    let rows = (sq - r0.min(sq)).min(CONVERT_ROWS as u32);
    let src = ((b as u64 * p.pb.heads_q as u64 + h as u64) * sq as u64 + r0 as u64) * d as u64;
    let pairs = rows * d / 2;
    let mut i = thread::idx();
    while i < pairs {
        let (r, c) = ((2 * i) / d, (2 * i) % d);
        unsafe {
            let x: [f32; 2] = global::load((p.dq_accum as *const f32).add((src + 2 * i as u64) as usize) as *const [f32; 2]);
            let dst = (p.dq as *mut T).add((p.dq_strides.offset(b, r0 + r, h) + c as u64) as usize);
            global::store(dst as *mut u32, T::pack2(x[0] * p.pb.scale, x[1] * p.pb.scale));
        }
        i += block::dim();
    }
}
