//! A variable-length batch's sequences (`params::Varlen`): which packed rows and keys a
//! block's batch entry holds, and the launch parameters narrowed to that one sequence, so
//! that a kernel body runs on it as on a batch of one (its masks bottom-right aligned to the
//! sequence's own lengths). Every kernel's variable-length entry (`crate::ENTRY_VARLEN`,
//! `with_window_mask!`) and the `prep` pass take it; their grid is (tiles of the longest
//! sequence, heads, batch), and a block whose tile lies past its sequence's end returns before
//! its first load. An entry of its own: narrowed, seqlen_q and seqlen_k are no longer launch
//! constants, which cost the window entries 9 to 28 registers (ptxas, sm_90a).

use crate::dev::{block, global};
use crate::params::{BwdParams, FwdParams, Problem, Varlen};

/// One sequence of a variable-length batch: its first packed query row and key, and its
/// lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seq {
    pub q0: u32,
    pub k0: u32,
    pub sq: u32,
    pub sk: u32,
}

impl Varlen {
    /// Whether the launch is a variable-length batch.
    #[inline(always)]
    pub fn is_set(&self) -> bool {
        self.cu_q != 0
    }

    /// Sequence `b` (below the grid's batch), its offsets read from device memory and clamped
    /// whatever they hold: its rows inside the packed tensors (an end below its start is an
    /// empty sequence), its lengths at most the grid's `max_q`, `max_k` (the rows past them
    /// are neither read nor written) and the keys at most `used_k[b]`.
    ///
    /// # Safety
    /// `cu_q`, `cu_k` hold batch + 1 values and `used_k` (when set) batch, b < batch.
    #[inline(always)]
    pub unsafe fn seq(&self, b: u32, max_q: u32, max_k: u32) -> Seq {
        let ld = |at: u64, i: u32| unsafe { global::load((at as *const u32).add(i as usize)) };
        let q0 = ld(self.cu_q, b).min(self.total_q);
        let q1 = ld(self.cu_q, b + 1).clamp(q0, self.total_q);
        let k0 = ld(self.cu_k, b).min(self.total_k);
        let k1 = ld(self.cu_k, b + 1).clamp(k0, self.total_k);
        let mut sk = (k1 - k0).min(max_k);
        if self.used_k != 0 {
            sk = sk.min(ld(self.used_k, b));
        }
        Seq { q0, k0, sq: (q1 - q0).min(max_q), sk }
    }
}

/// What a block's tiles run over: query rows (the forward, the dQ and statistics passes) or
/// keys (the dK/dV passes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    QueryRows,
    Keys,
}

/// Launch parameters that can be narrowed to one sequence.
pub trait SeqParams: Copy {
    fn varlen(&self) -> &Varlen;
    fn problem(&self) -> &Problem;
    /// The same launch on sequence `s` alone: every tensor's address at the sequence's first
    /// row (elements of `T` for the attention tensors, f32 for LSE and the statistics), its
    /// lengths as seqlen_q and seqlen_k.
    fn at_seq<T>(&self, s: Seq) -> Self;
}

/// Address `a` moved `rows` rows of `row` elements of `E` on.
#[inline(always)]
fn shift<E>(a: u64, rows: u32, row: u64) -> u64 {
    a + rows as u64 * row * core::mem::size_of::<E>() as u64
}

/// The problem of one sequence.
#[inline(always)]
fn narrowed(pb: &Problem, s: Seq) -> Problem {
    Problem { seqlen_q: s.sq, seqlen_k: s.sk, ..*pb }
}

impl SeqParams for FwdParams {
    fn varlen(&self) -> &Varlen {
        &self.varlen
    }
    fn problem(&self) -> &Problem {
        &self.pb
    }
    #[inline(always)]
    fn at_seq<T>(&self, s: Seq) -> Self {
        let p = self;
        FwdParams {
            q: shift::<T>(p.q, s.q0, p.q_strides.row),
            k: shift::<T>(p.k, s.k0, p.k_strides.row),
            v: shift::<T>(p.v, s.k0, p.v_strides.row),
            o: shift::<T>(p.o, s.q0, p.o_strides.row),
            o_part: shift::<f32>(p.o_part, s.q0, p.o_strides.row),
            lse: shift::<f32>(p.lse, s.q0, p.lse_strides.row),
            o_lo: if p.o_lo == 0 { 0 } else { shift::<T>(p.o_lo, s.q0, p.o_strides.row) },
            pb: narrowed(&p.pb, s),
            ..*p
        }
    }
}

impl SeqParams for BwdParams {
    fn varlen(&self) -> &Varlen {
        &self.varlen
    }
    fn problem(&self) -> &Problem {
        &self.pb
    }
    #[inline(always)]
    fn at_seq<T>(&self, s: Seq) -> Self {
        let p = self;
        BwdParams {
            q: shift::<T>(p.q, s.q0, p.q_strides.row),
            k: shift::<T>(p.k, s.k0, p.k_strides.row),
            v: shift::<T>(p.v, s.k0, p.v_strides.row),
            o: shift::<T>(p.o, s.q0, p.o_strides.row),
            o_lo: if p.o_lo == 0 { 0 } else { shift::<T>(p.o_lo, s.q0, p.o_strides.row) },
            d_o: shift::<T>(p.d_o, s.q0, p.do_strides.row),
            lse: shift::<f32>(p.lse, s.q0, p.lse_strides.row),
            stats: shift::<f32>(p.stats, s.q0, p.stats_strides.row),
            dq: shift::<T>(p.dq, s.q0, p.dq_strides.row),
            dk: shift::<T>(p.dk, s.k0, p.dk_strides.row),
            dv: shift::<T>(p.dv, s.k0, p.dv_strides.row),
            pb: narrowed(&p.pb, s),
            ..*p
        }
    }
}

/// Block: the launch as its body runs it: `p` itself without a variable-length batch; else
/// narrowed to the sequence of the block's batch entry, or `None` when the block's tile (of
/// `rows` rows along `over`) starts past that sequence's end (the block has nothing to do).
///
/// # Safety
/// `p` valid (host-checked): with a variable-length batch, its offsets as [`Varlen::seq`]
/// needs them and the grid's z its batch.
#[inline(always)]
pub unsafe fn resolve<T, P: SeqParams>(p: &P, over: Over, rows: u32) -> Option<P> {
    let pb = p.problem();
    // Without a variable-length batch (`prep`, shared by every launch), the whole launch as
    // one sequence at row 0.
    let s = match p.varlen().is_set() {
        true => unsafe { p.varlen().seq(block::idx().2, pb.seqlen_q, pb.seqlen_k) },
        false => Seq { q0: 0, k0: 0, sq: pb.seqlen_q, sk: pb.seqlen_k },
    };
    let len = match over {
        Over::QueryRows => s.sq,
        Over::Keys => s.sk,
    };
    if block::idx().0 as u64 * rows as u64 >= len as u64 {
        return None;
    }
    Some(p.at_seq::<T>(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::emu::{self, GlobalRegion, LaunchConfig};
    use crate::params::Strides;

    /// `f` run by one emulated warp that may read `bufs`.
    fn in_launch(bufs: &[&[u32]], f: &(dyn Fn() + Sync)) {
        let regions: std::vec::Vec<GlobalRegion> =
            bufs.iter().map(|b| GlobalRegion { start: b.as_ptr() as usize, len: 4 * b.len(), writable: false }).collect();
        let cfg = LaunchConfig { grid: (1, 1, 1), block_threads: 32, dynamic_shared_bytes: 0 };
        emu::launch("varlen test", &cfg, &regions, f).unwrap();
    }

    /// Whatever the offsets hold, a sequence's rows lie inside the packed tensors and its
    /// lengths within the grid's maxima.
    #[test]
    fn sequences_stay_inside_the_packed_tensors() {
        let vals = [0u32, 1, 3, 7, 8, 9, 100, u32::MAX];
        for &a in &vals {
            for &b in &vals {
                for &c in &vals {
                    for &used in &[0u32, 2, u32::MAX] {
                        let cu = [a, b, c];
                        let used_k = [used, used];
                        let v = Varlen {
                            cu_q: cu.as_ptr() as u64,
                            cu_k: cu.as_ptr() as u64,
                            used_k: used_k.as_ptr() as u64,
                            total_q: 8,
                            total_k: 9,
                        };
                        in_launch(&[&cu, &used_k], &|| {
                            for bi in 0..2 {
                                let s = unsafe { v.seq(bi, 5, 6) };
                                assert!(s.q0 as u64 + s.sq as u64 <= 8 && s.sq <= 5, "{cu:?} {s:?}");
                                assert!(s.k0 as u64 + s.sk as u64 <= 9 && s.sk <= 6 && s.sk <= used, "{cu:?} {s:?}");
                            }
                        });
                    }
                }
            }
        }
        // Good offsets come through as they are.
        let cu = [0u32, 3, 8];
        let v = Varlen { cu_q: cu.as_ptr() as u64, cu_k: cu.as_ptr() as u64, used_k: 0, total_q: 8, total_k: 8 };
        in_launch(&[&cu], &|| assert_eq!(unsafe { v.seq(1, 5, 5) }, Seq { q0: 3, k0: 3, sq: 5, sk: 5 }));
    }

    /// Narrowed to a sequence, every tensor starts at the sequence's first row.
    #[test]
    fn narrowed_params_start_at_the_sequence() {
        let st = Strides { batch: 0, row: 48, head: 16 };
        let p = FwdParams {
            q: 1000,
            k: 2000,
            v: 3000,
            o: 4000,
            lse: 5000,
            o_lo: 0,
            q_strides: st,
            k_strides: st,
            v_strides: st,
            o_strides: st,
            lse_strides: Strides { batch: 0, row: 1, head: 100 },
            ..FwdParams::default()
        };
        let n = p.at_seq::<u16>(Seq { q0: 2, k0: 3, sq: 4, sk: 5 });
        assert_eq!((n.q, n.k, n.v, n.o, n.lse, n.o_lo), (1000 + 2 * 96, 2000 + 3 * 96, 3000 + 3 * 96, 4000 + 2 * 96, 5000 + 8, 0));
        assert_eq!((n.pb.seqlen_q, n.pb.seqlen_k), (4, 5));
    }
}
