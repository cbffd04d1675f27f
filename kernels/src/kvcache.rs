//! A KV cache's append (`FlashAttn::forward_kvcache`): the new keys and values of each
//! sequence written into its cache slot in place, at the keys it already holds; the keys it
//! holds after them (what the forward then attends to, as `seqused_k`) and the forward's
//! variable-length offsets, so that a decode step copies nothing from the host.
//!
//! The lengths live on the device, so the host cannot check them: new key i of sequence b goes
//! to row `len[b] + i` of its slot only while that row is below the capacity (the keys past
//! it are dropped, nothing outside the slot is written), and the keys it holds after the
//! append are `min(len[b] + new, capacity)`. Nothing else of the cache is touched.
//! One block per (new key, head, sequence); its threads copy the row's columns.

use crate::dev::{block, global, thread};
use crate::dtype::Element;
use crate::params::AppendParams;

/// Threads per block.
pub const APPEND_THREADS: u32 = 128;

/// The append of one block's row (see the module doc).
///
/// # Safety
/// `p` valid (host-checked: every view inside its memory), `APPEND_THREADS` threads, grid
/// (max(new, 1), heads_kv, batch).
#[inline(always)]
pub unsafe fn append<T: Element>(p: &AppendParams) {
    let (i, h, b) = block::idx();
    let t = thread::idx();
    // The keys sequence b holds before the append.
    let len = unsafe { global::load((p.lens as *const u32).add(b as usize)) };
    // The keys it holds after it, at most the capacity (u64: len + new may pass u32).
    let held = (len as u64 + p.new as u64).min(p.capacity as u64) as u32;
    if i == 0 && h == 0 && t == 0 {
        // The forward's batch: sequence b's rows, its slot and the keys it holds (the host
        // checked that every offset fits u32).
        let at = |a: u64, i: u32| (a as *mut u32).wrapping_add(i as usize);
        unsafe {
            global::store(at(p.used, b), held);
            global::store(at(p.cu_q, b), b * p.seqlen_q);
            global::store(at(p.cu_k, b), b * p.slot);
            if b + 1 == p.batch {
                global::store(at(p.cu_q, p.batch), p.batch * p.seqlen_q);
                global::store(at(p.cu_k, p.batch), b * p.slot + p.capacity);
            }
        }
    }
    // Row len + i of the slot, when it is below the capacity (len + i < held).
    if i >= p.new || len as u64 + i as u64 >= held as u64 {
        return;
    }
    let row = len + i;
    let mut c = t;
    while c < p.head_dim {
        let col = c as u64;
        unsafe {
            let k = global::load((p.k_new as *const T).add((p.k_new_strides.offset(b, i, h) + col) as usize));
            global::store((p.k_cache as *mut T).add((p.k_cache_strides.offset(b, row, h) + col) as usize), k);
            let v = global::load((p.v_new as *const T).add((p.v_new_strides.offset(b, i, h) + col) as usize));
            global::store((p.v_cache as *mut T).add((p.v_cache_strides.offset(b, row, h) + col) as usize), v);
        }
        c += block::dim();
    }
}
