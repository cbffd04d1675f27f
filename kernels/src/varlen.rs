//! A variable-length batch's sequences (`params::Varlen`): which packed rows and keys a
//! block's batch entry holds, and the launch parameters narrowed to that one sequence, so
//! that a kernel body runs on it as on a batch of one (its masks bottom-right aligned to the
//! sequence's own lengths). Every kernel's variable-length entry (`crate::ENTRY_VARLEN`,
//! `with_window_mask!`) and the `prep` pass take it; their grid is (tiles of the longest
//! sequence, heads, batch), and a block whose tile lies past its sequence's end returns before
//! its first load. An entry of its own: narrowed, seqlen_q and seqlen_k are no longer launch
//! constants (a register each, not a constant-bank operand), which costs the Hopper forward
//! 16 registers at head_dim 64 and 11 at 128 (ptxas, sm_90a). The sequence's first rows live
//! as two row indices (`Strides::first`), not as shifted addresses: those cost 22 and 13.

use crate::dev::{block, global};
use crate::params::{BwdParams, FwdParams, Problem, Strides, Varlen};

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
    /// The same launch on sequence `s` alone: every tensor's position 0 at the sequence's
    /// first row (`Strides::first`; the addresses stay the launch's, so that a kernel keeps
    /// two row indices live, not a shifted address per tensor), its lengths as seqlen_q and
    /// seqlen_k.
    fn at_seq(&self, s: Seq) -> Self;
}

/// A tensor's strides with position 0 at packed row `row` (the host's `first` is 0).
#[inline(always)]
fn from_row(st: Strides, row: u32) -> Strides {
    Strides { first: row as u64, ..st }
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
    fn at_seq(&self, s: Seq) -> Self {
        let p = self;
        FwdParams {
            q_strides: from_row(p.q_strides, s.q0),
            k_strides: from_row(p.k_strides, s.k0),
            v_strides: from_row(p.v_strides, s.k0),
            o_strides: from_row(p.o_strides, s.q0),
            lse_strides: from_row(p.lse_strides, s.q0),
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
    fn at_seq(&self, s: Seq) -> Self {
        let p = self;
        BwdParams {
            q_strides: from_row(p.q_strides, s.q0),
            k_strides: from_row(p.k_strides, s.k0),
            v_strides: from_row(p.v_strides, s.k0),
            o_strides: from_row(p.o_strides, s.q0),
            do_strides: from_row(p.do_strides, s.q0),
            lse_strides: from_row(p.lse_strides, s.q0),
            stats_strides: from_row(p.stats_strides, s.q0),
            dq_strides: from_row(p.dq_strides, s.q0),
            dk_strides: from_row(p.dk_strides, s.k0),
            dv_strides: from_row(p.dv_strides, s.k0),
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
pub unsafe fn resolve<P: SeqParams>(p: &P, over: Over, rows: u32) -> Option<P> {
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
    Some(p.at_seq(s))
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

    /// Narrowed to a sequence, position 0 of every tensor is the sequence's first row (of Q's
    /// side or K's), the addresses unchanged.
    #[test]
    fn narrowed_params_start_at_the_sequence() {
        let st = Strides { batch: 0, row: 48, head: 16, first: 0 };
        let p = BwdParams {
            q: 1000,
            dk: 2000,
            q_strides: st,
            k_strides: st,
            v_strides: st,
            o_strides: st,
            do_strides: st,
            dq_strides: st,
            dk_strides: st,
            dv_strides: st,
            lse_strides: Strides { batch: 0, row: 1, head: 100, first: 0 },
            stats_strides: Strides { batch: 0, row: 1, head: 100, first: 0 },
            stats_plane: 1000,
            ..BwdParams::default()
        };
        let n = p.at_seq(Seq { q0: 2, k0: 3, sq: 4, sk: 5 });
        assert_eq!((n.q, n.dk), (1000, 2000));
        for (s, row) in [
            (n.q_strides, 2),
            (n.o_strides, 2),
            (n.do_strides, 2),
            (n.dq_strides, 2),
            (n.k_strides, 3),
            (n.v_strides, 3),
            (n.dk_strides, 3),
            (n.dv_strides, 3),
        ] {
            assert_eq!(s.offset(1, 1, 1), (row + 1) * 48 + 16);
        }
        assert_eq!(n.lse_row(0, 1), 100 + 2);
        assert_eq!(n.stat_at(2, 0, 1, 1), 2000 + 100 + 2 + 1);
        let f = FwdParams { o_strides: st, lse_strides: Strides { batch: 0, row: 1, head: 100, first: 0 }, ..FwdParams::default() };
        let n = f.at_seq(Seq { q0: 2, k0: 3, sq: 4, sk: 5 });
        assert_eq!((n.o_strides.offset(0, 0, 0), n.lse_row(0, 0), n.q_strides.offset(0, 0, 0)), (2 * 48, 2, 0));
        assert_eq!((n.pb.seqlen_q, n.pb.seqlen_k), (4, 5));
    }
}
