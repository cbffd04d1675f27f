//! The attention sinks' gradient (`sinks`): ds_h = -sum_i exp(s_h - LSE_i) D_i over the query
//! rows i of head h in every batch entry (every sequence of a variable-length batch), with
//! LSE_i the forward's (it counts the sink) and D_i = sum_j P_ij dP_ij as the family's
//! statistics pass left it in the workspace (f32-accurate: `bwd_mma`, `bwd_simt` and the
//! atomic families recompute it from S and dP, `prep_residual` takes it from O + O_lo; FA2's
//! dO . O from O rounded to T would carry a unit roundoff of T). Two launches after the
//! family's own, in a fixed summation order (bitwise deterministic):
//! 1. [`partials`]: one block per ([`SINK_ROWS`] query rows, head, batch entry), one thread
//!    per row: the block's rows summed in f64 into `sink_partials` [heads_q, batch, query
//!    tiles];
//! 2. [`sum`]: one warp per head: the head's partials in f64, rounded once into `dsinks`.

use crate::dev::{self, Shared, block, global, thread, warp};
use crate::params::BwdParams;
use crate::sinks;
use crate::varlen::{self, Over};
use core::f32::consts::LOG2_E;

/// Query rows per block of [`partials`].
pub const SINK_ROWS: u32 = 64;
/// Threads per block of [`partials`]: one per row.
pub const SINK_THREADS: u32 = SINK_ROWS;
/// Shared memory of [`partials`] (one f64 per thread) and of [`sum`] (one per lane).
pub const SINK_SMEM_BYTES: u32 = 8 * SINK_ROWS;

/// The number of query tiles of [`SINK_ROWS`] rows in a launch of `seqlen_q` rows: the
/// partials per (head, batch entry).
#[inline(always)]
pub const fn tiles(seqlen_q: u32) -> u32 {
    seqlen_q.div_ceil(SINK_ROWS)
}

/// Block: the sum over its rows of -exp(s_h - LSE_i) D_i, in f64, to its slot of
/// `sink_partials` (0 for a tile past its sequence's end, and for a head whose sink is -inf).
/// PIVOT: the statistics hold D_i - c_i and c_i (`bwd_simt`), else D_i.
///
/// # Safety
/// `p` valid (host-checked) with `sinks`, `sink_partials` set, after the family's statistics
/// pass; grid (`tiles(seqlen_q)`, heads_q, batch), [`SINK_THREADS`] threads,
/// [`SINK_SMEM_BYTES`] of shared memory.
#[inline(always)]
pub unsafe fn partials<const PIVOT: bool>(p: &BwdParams) {
    let (blk, h, b) = block::idx();
    let slot = ((h as u64 * p.pb.batch as u64 + b as u64) * tiles(p.pb.seqlen_q) as u64 + blk as u64) as usize;
    let (tid, w, lane) = (thread::idx(), warp::id(), warp::lane());
    let sums: Shared<f64> = unsafe { dev::dynamic_shared(32) };
    // Thread: its row's term (a tile past a variable-length sequence's end sums nothing).
    let mut acc = 0f64;
    if let Some(q) = unsafe { varlen::resolve::<u16, _>(p, Over::QueryRows, SINK_ROWS) } {
        let sink = unsafe { sinks::of_head(q.sinks, h) };
        let r = blk * SINK_ROWS + tid;
        if r < q.pb.seqlen_q && sink != f32::NEG_INFINITY {
            let st = |k: usize| unsafe { global::load((q.stats as *const f32).add(q.stat_at(k, b, h, r))) };
            let dd = if PIVOT { st(2) + st(3) } else { st(2) };
            let lse = unsafe { global::load((q.lse as *const f32).add((q.lse_row(b, h) + r as u64) as usize)) };
            // -P_sink D_i, P_sink = exp(s_h - LSE_i).
            acc = -(dev::math::ex2((sink - lse) * LOG2_E) as f64) * dd as f64;
        }
    }
    // Block: each warp's terms in lane order, then the warps' sums in warp order.
    let warps = block::dim() / 32;
    sums.st(tid as usize, acc);
    block::sync();
    let mut s = 0f64;
    if lane == 0 {
        for l in 0..32 {
            s += sums.ld((32 * w + l) as usize);
        }
    }
    // Every term read before the warps' sums overwrite them.
    block::sync();
    if lane == 0 {
        sums.st(w as usize, s);
    }
    block::sync();
    if tid == 0 {
        let mut total = 0f64;
        for i in 0..warps as usize {
            total += sums.ld(i);
        }
        unsafe { global::store((p.sink_partials as *mut f64).add(slot), total) };
    }
}

/// Warp (one per head): ds_h, the head's partials summed lane-strided, then the lanes in
/// order, rounded once to f32.
///
/// # Safety
/// `p` valid, after [`partials`] on the same launch parameters; grid (1, heads_q, 1), 32
/// threads, [`SINK_SMEM_BYTES`] of shared memory.
#[inline(always)]
pub unsafe fn sum(p: &BwdParams) {
    let h = block::idx().1;
    let lane = warp::lane();
    let n = p.pb.batch as usize * tiles(p.pb.seqlen_q) as usize;
    let first = h as usize * n;
    let sums: Shared<f64> = unsafe { dev::dynamic_shared(32) };
    let mut acc = 0f64;
    let mut i = lane as usize;
    while i < n {
        acc += unsafe { global::load((p.sink_partials as *const f64).add(first + i)) };
        i += 32;
    }
    sums.st(lane as usize, acc);
    warp::sync();
    if lane == 0 {
        let mut total = 0f64;
        for l in 0..32 {
            total += sums.ld(l);
        }
        unsafe { global::store((p.dsinks as *mut f32).add(h as usize), total as f32) };
    }
}
