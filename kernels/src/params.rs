//! The launch parameters, defined once here and filled by the host.
//!
//! `#[repr(C)]` with fields ordered by size (u64 first), so the layout is the same on the
//! host (x86-64) and in PTX (nvptx64). A kernel takes the struct by value.

/// Element strides of a [batch, seqlen, heads, head_dim] tensor; head_dim is contiguous.
/// LSE ([batch, heads_q, seqlen_q], the sequence contiguous) uses `batch` and `head`, with
/// `row` 1. The host validates them (`flashattn::View`): offsets fit u64, and 16-bit rows
/// whose head_dim is a multiple of 8 start 16-byte aligned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strides {
    /// Between consecutive batch entries.
    pub batch: u64,
    /// Between consecutive sequence positions.
    pub row: u64,
    /// Between consecutive heads.
    pub head: u64,
}

impl Strides {
    /// Strides of a contiguous [batch, seqlen, heads, head_dim] tensor.
    pub const fn contiguous(seqlen: u64, heads: u64, head_dim: u64) -> Strides {
        Strides { batch: seqlen * heads * head_dim, row: heads * head_dim, head: head_dim }
    }
    /// Element offset of (batch b, position s, head h, column 0).
    #[inline(always)]
    pub fn offset(&self, b: u32, s: u32, h: u32) -> u64 {
        b as u64 * self.batch + s as u64 * self.row + h as u64 * self.head
    }
}

/// A variable-length batch (FA2's varlen layout): Q, O, dO, dQ packed as [total_q, heads_q,
/// head_dim], K, V, dK, dV as [total_k, heads_kv, head_dim], LSE as [heads_q, total_q], the
/// row statistics as [4][heads_q, total_q]; every batch stride 0. Sequence b holds packed rows
/// `cu_q[b]..cu_q[b + 1]` and keys `cu_k[b]..cu_k[b + 1]` (of which it uses the first
/// `used_k[b]` when given); `Problem::seqlen_q`, `seqlen_k` are the longest sequence's (the
/// grid's). The offsets live in device memory, where the host cannot check them: the kernels
/// clamp them into the packed tensors (`varlen::Seq`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Varlen {
    /// u32 [batch + 1] query offsets; 0: not a variable-length batch.
    pub cu_q: u64,
    /// u32 [batch + 1] key offsets.
    pub cu_k: u64,
    /// u32 [batch] keys used of each sequence's slot (FA2's `seqused_k`); 0: all of them.
    pub used_k: u64,
    /// Rows of the packed Q and of the packed K.
    pub total_q: u32,
    pub total_k: u32,
}

/// The attention problem, as both passes' kernels read it: sizes, scale and mask. The last
/// part of [`FwdParams`] and [`BwdParams`] (4-byte fields after their 8-byte ones: the same
/// layout as fields of their own). Per-head arrays (sinks, ALiBi slopes) are addresses in
/// the params structs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    pub batch: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub head_dim: u32,
    /// softmax_scale: the kernels multiply the scores by it (once, as naive attention does,
    /// so LSE loses no accuracy) and fold log2(e) into each exponential.
    pub scale: f32,
    /// 1 for causal masking (bottom-right aligned), 0 for none.
    pub causal: u32,
    /// Sliding window (`mask::Window`): keys more than `window_left` before or `window_right`
    /// after a row's bottom-right diagonal are hidden; [`NO_WINDOW`] for unbounded (both for
    /// no window). With a window and causal masking the host sets `window_right` to 0.
    pub window_left: u32,
    pub window_right: u32,
    /// Logit soft-capping (`softcap`): scaled scores S become softcap tanh(S / softcap)
    /// before the softmax; 0 for none. Taken by the general and variable-length entries only
    /// (`mask::General`), where the host launches it.
    pub softcap: f32,
}

/// A window side without a bound.
pub const NO_WINDOW: u32 = u32::MAX;

impl Default for Problem {
    /// All sizes 0, no mask, no window.
    fn default() -> Self {
        Problem {
            batch: 0,
            heads_q: 0,
            heads_kv: 0,
            seqlen_q: 0,
            seqlen_k: 0,
            head_dim: 0,
            scale: 0.0,
            causal: 0,
            window_left: NO_WINDOW,
            window_right: NO_WINDOW,
            softcap: 0.0,
        }
    }
}

impl Problem {
    /// Whether a sliding window is set (the window, general and variable-length kernels).
    #[inline(always)]
    pub fn windowed(&self) -> bool {
        self.window_left != NO_WINDOW || self.window_right != NO_WINDOW
    }
}

// Four-byte fields only: after the params structs' 8-byte ones it adds no padding.
const _: () = assert!(core::mem::size_of::<Problem>() == 44 && core::mem::align_of::<Problem>() == 4);

/// Parameters of the forward kernels.
///
/// Q is [batch, seqlen_q, heads_q, head_dim], K and V are [batch, seqlen_k, heads_kv, head_dim],
/// O has a layout of its own of Q's shape, LSE is f32 [batch, heads_q, seqlen_q]; each with
/// its own strides.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FwdParams {
    /// Device addresses of the tensors.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    /// O's rounding residual (laid out like O): O_lo = T(O_f32 - O), so O + O_lo carries O to
    /// about twice T's precision (the backward's D_i = dO_i . O_i from it is f32-accurate).
    /// 0: not asked for. Written by the kernels that support it (`fwd_wgmma`); the host knows
    /// which.
    pub o_lo: u64,
    /// Attention sinks (`sinks`): f32 [heads_q] logits joined to every row's softmax
    /// denominator; 0 for none.
    pub sinks: u64,
    /// ALiBi slopes (`alibi`): f32 [heads_q] or [batch, heads_q], `alibi_batch` elements
    /// apart between batch entries (0 for [heads_q]); 0 for none. Applied by the general and
    /// variable-length entries only (`mask::General`), where the host launches them.
    pub alibi: u64,
    pub alibi_batch: u64,
    /// Split-KV (`splits` > 1, [`FwdParams::split_kv`]): the parts' f32 O (each normalised
    /// over its part's keys; `o` unused), and elements from one part to the next in
    /// `o_part` and in `lse`, which then holds the parts' LSE for the merge (`merge`) as hi
    /// f32s, then `splits` parts on their lo f32s (`epilogue::quad_store_lse_split`);
    /// `o_strides` and `lse_strides` are a part's.
    pub o_part: u64,
    pub o_split: u64,
    pub lse_split: u64,
    pub q_strides: Strides,
    pub k_strides: Strides,
    pub v_strides: Strides,
    pub o_strides: Strides,
    pub lse_strides: Strides,
    /// A variable-length batch's sequences (all 0 for one of equal lengths).
    pub varlen: Varlen,
    /// Sizes, scale and mask.
    pub pb: Problem,
    /// Parts the key tiles of each block's rows are split into (the grid's y is heads_q x
    /// splits, `block_info::BlockInfo::rows_split`); 0 or 1: no split, O and LSE the
    /// outputs. Taken by the families that split (`registry::FwdFamilyDesc::splits`).
    pub splits: u32,
    /// GQA packing ([`FwdParams::gqa_packed`]): the query heads per KV head stacked as rows
    /// of one tile; 0 or 1: none. The host sets it only where every sequence has at most one
    /// query row and nothing depends on a row's query head but its sink (`sinks::of_row`): no
    /// ALiBi; causal masking and a window's right edge are then off.
    pub gqa_pack: u32,
}

impl FwdParams {
    /// The launch as the forward kernels run it (FA2's and FA3's GQA packing for decode):
    /// with `gqa_pack` = g > 1, the g query heads of each KV head are one head of g query rows,
    /// row i of packed head j being the one row of query head j g + i, so that a block reads
    /// each K and V tile once for all g of them. Q's, O's and LSE's row stride becomes their
    /// head stride and their head stride g heads; seqlen_q (0 or 1) is g times itself, heads_q
    /// heads_kv. A variable-length batch is narrowed to its sequence first (`varlen`).
    ///
    /// The one query row sits at the last key (bottom-right), so a window's right edge hides
    /// no key and its left edge only the keys before sk - 1 - left: those are dropped (K and V
    /// start after them, `T` their element). The left edge then hides nothing from any packed
    /// row (row r of g at key sk' - g + r reaches back to key r + 1 - g <= 0 or further; kept
    /// as the launch has it: a value computed here took ptxas to 255 registers and 120 bytes
    /// of spills in four d = 128 window entries); the host turns causal masking and the
    /// right edge off.
    #[inline(always)]
    pub fn gqa_packed<T>(&self) -> FwdParams {
        let g = self.gqa_pack;
        if g <= 1 {
            return *self;
        }
        let pack = |s: Strides| Strides { batch: s.batch, row: s.head, head: s.head * g as u64 };
        let (sk, left) = (self.pb.seqlen_k, self.pb.window_left);
        let drop = if left != NO_WINDOW && sk > left + 1 { sk - 1 - left } else { 0 };
        let after = |a: u64, rows: u64| a + drop as u64 * rows * core::mem::size_of::<T>() as u64;
        FwdParams {
            q_strides: pack(self.q_strides),
            o_strides: pack(self.o_strides),
            lse_strides: pack(self.lse_strides),
            k: after(self.k, self.k_strides.row),
            v: after(self.v, self.v_strides.row),
            pb: Problem { seqlen_q: self.pb.seqlen_q * g, heads_q: self.pb.heads_kv, seqlen_k: sk - drop, ..self.pb },
            ..*self
        }
    }

    /// Whether the keys are split: `o` and `lse` are the parts (f32) for the merge.
    #[inline(always)]
    pub fn split_kv(&self) -> bool {
        self.splits > 1
    }
    /// Element index in LSE of row 0 of (batch b, query head h).
    #[inline(always)]
    pub fn lse_row(&self, b: u32, h: u32) -> u64 {
        self.lse_strides.offset(b, 0, h)
    }
}

/// Parameters of the backward kernels.
///
/// Q, O, dO, dQ have Q's shape, K, V, dK, dV K's, each with strides of its own; LSE is f32
/// [batch, heads_q, seqlen_q]; `stats` is the workspace f32 [4][batch, heads_q, seqlen_q] of each row's
/// softmax max m_i, 1 / l_i and D_i (written by the dQ kernel, or by the `prep` pass from the
/// forward's LSE and O residual, and read by the dK/dV kernel of the same family). The tensor-core kernels use the first three; the SIMT kernels keep D_i as
/// D_i - c_i in the third and the pivot c_i in the fourth (see `bwd_simt`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwdParams {
    /// Device addresses of the tensors.
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    /// The forward's O residual (see [`FwdParams::o_lo`]); read by the `prep` pass only.
    pub o_lo: u64,
    pub d_o: u64,
    pub lse: u64,
    pub stats: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// The atomic path's f32 dQ accumulator [batch, heads_q, seqlen_q, head_dim] (contiguous,
    /// zeroed before the launch; unscaled); 0 for the deterministic kernels. The atomic
    /// families serve head dims that are multiples of 8 only (`registry::BwdFamilyDesc::aligned_only`),
    /// so its rows are 8-byte aligned for the paired adds.
    pub dq_accum: u64,
    /// The forward's attention sinks (`FwdParams::sinks`), 0 for none; then (`bwd_sinks`)
    /// their gradient, f32 [heads_q], and its workspace of f64 partial sums [heads_q, batch,
    /// query tiles of `bwd_sinks::SINK_ROWS`].
    pub sinks: u64,
    pub dsinks: u64,
    pub sink_partials: u64,
    /// The forward's ALiBi slopes and their batch stride (`FwdParams::alibi`).
    pub alibi: u64,
    pub alibi_batch: u64,
    pub q_strides: Strides,
    pub k_strides: Strides,
    pub v_strides: Strides,
    pub o_strides: Strides,
    pub do_strides: Strides,
    pub dq_strides: Strides,
    pub dk_strides: Strides,
    pub dv_strides: Strides,
    pub lse_strides: Strides,
    /// Element strides of each statistic's [batch, heads_q, seqlen_q] in `stats` (`row` 1,
    /// and taken as 1), and `stats_plane` elements from one statistic to the next.
    pub stats_strides: Strides,
    pub stats_plane: u64,
    /// A variable-length batch's sequences, the forward's (all 0 for one of equal lengths).
    pub varlen: Varlen,
    /// Sizes, scale and mask (the forward's).
    pub pb: Problem,
}

impl BwdParams {
    /// Element index in LSE of row 0 of (batch b, query head h).
    #[inline(always)]
    pub fn lse_row(&self, b: u32, h: u32) -> u64 {
        self.lse_strides.offset(b, 0, h)
    }
    /// Index in `stats` of row `r` of (batch b, query head h) of statistic `k` (0: m_i in the
    /// log2 domain, 1: 1 / l_i, 2: D_i; 3: the SIMT kernels' pivot c_i).
    #[inline(always)]
    pub fn stat_at(&self, k: usize, b: u32, h: u32, r: u32) -> usize {
        let st = &self.stats_strides;
        (k as u64 * self.stats_plane + b as u64 * st.batch + h as u64 * st.head) as usize + r as usize
    }
    /// [`BwdParams::stat_at`] for a batch of equal lengths, from the problem's sizes (the
    /// same index: the host lays the statistics out contiguously): for the kernels without a
    /// variable-length entry (`bwd_mma`), where it takes fewer registers (with the strides,
    /// the d = 128 dQ kernel spilled 60 / 100 bytes on sm_90).
    #[inline(always)]
    pub fn stat_at_equal_lengths(&self, k: usize, b: u32, h: u32, r: u32) -> usize {
        let pb = &self.pb;
        let n = pb.batch as usize * pb.heads_q as usize * pb.seqlen_q as usize;
        k * n + (b as usize * pb.heads_q as usize + h as usize) * pb.seqlen_q as usize + r as usize
    }
}

/// A KV cache's append (`kvcache`): new K and V [batch, new, heads_kv, head_dim] into the
/// caches [batch, capacity, heads_kv, head_dim] at each sequence's `lens[b]` (u32 [batch]);
/// the keys each holds after it into `used` (u32 [batch]), and the variable-length offsets the
/// forward then takes into `cu_q`, `cu_k` (u32 [batch + 1]: sequence b's query rows from
/// `b * seqlen_q`, its slot from `b * slot`, the last `capacity` rows long).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendParams {
    pub k_new: u64,
    pub v_new: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub lens: u64,
    pub used: u64,
    pub cu_q: u64,
    pub cu_k: u64,
    pub k_new_strides: Strides,
    pub v_new_strides: Strides,
    pub k_cache_strides: Strides,
    pub v_cache_strides: Strides,
    /// Keys of each sequence's slot.
    pub capacity: u32,
    /// New keys of each sequence (0: `used` and the offsets only).
    pub new: u32,
    pub head_dim: u32,
    pub batch: u32,
    /// Query rows of each sequence.
    pub seqlen_q: u32,
    /// Rows from one slot to the next.
    pub slot: u32,
}

/// The merge of partial results by their LSE (`merge`): parts O_s [splits, batch, seqlen,
/// heads, head_dim] and LSE_s [splits, batch, heads, seqlen] (f32), into O (the output dtype,
/// [batch, seqlen, heads, head_dim]) and LSE (f32, [batch, heads, seqlen]). LSE strides as
/// [`Strides`] says for LSE (`row` 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeParams {
    pub o_parts: u64,
    pub lse_parts: u64,
    /// The parts' LSE lo f32s (0: none; LSE_s = hi + lo in f64 where hi is finite), as
    /// split-KV's forward writes them, with `lse_parts`' layout.
    pub lse_parts_lo: u64,
    pub o: u64,
    pub lse: u64,
    /// Elements from one part to the next, in `o_parts` and in `lse_parts`.
    pub o_parts_split: u64,
    pub lse_parts_split: u64,
    pub o_parts_strides: Strides,
    pub lse_parts_strides: Strides,
    pub o_strides: Strides,
    pub lse_strides: Strides,
    pub splits: u32,
    pub batch: u32,
    pub seqlen: u32,
    pub heads: u32,
    pub head_dim: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packed, row i of head j of a batch entry is the original's one row of query head
    /// j g + i, in Q, O and LSE, for dense layouts and a variable-length batch's.
    #[test]
    fn gqa_packed_rows_are_the_query_heads() {
        let (batch, heads_q, heads_kv, d) = (3u32, 12u32, 3u32, 40u64);
        let g = heads_q / heads_kv;
        let layouts = [
            // Dense [b, 1, h, d] (LSE [b, h, 1]), then one with a padded row and head stride.
            (Strides::contiguous(1, heads_q as u64, d), Strides { batch: heads_q as u64, row: 1, head: 1 }),
            (Strides { batch: 7 * heads_q as u64 * d, row: 2 * heads_q as u64 * d, head: 2 * d }, Strides { batch: 30, row: 1, head: 2 }),
            // Variable-length [total, h, d] (LSE [h, total]); batch stride 0.
            (Strides { batch: 0, row: heads_q as u64 * d, head: d }, Strides { batch: 0, row: 1, head: 1000 }),
        ];
        for (qs, ls) in layouts {
            let p = FwdParams {
                q_strides: qs,
                o_strides: qs,
                lse_strides: ls,
                pb: Problem { batch, heads_q, heads_kv, seqlen_q: 1, seqlen_k: 9, head_dim: d as u32, ..Problem::default() },
                gqa_pack: g,
                ..FwdParams::default()
            };
            let n = p.gqa_packed::<u16>();
            assert_eq!((n.pb.seqlen_q, n.pb.heads_q, n.pb.heads_kv, n.pb.seqlen_k), (g, heads_kv, heads_kv, 9));
            for b in 0..batch {
                for j in 0..heads_kv {
                    for i in 0..g {
                        let h = j * g + i;
                        assert_eq!(n.q_strides.offset(b, i, j), qs.offset(b, 0, h));
                        assert_eq!(n.o_strides.offset(b, i, j), qs.offset(b, 0, h));
                        assert_eq!(n.lse_strides.offset(b, i, j), ls.offset(b, 0, h));
                    }
                }
            }
        }
        // Off: the launch as it is.
        let p = FwdParams { gqa_pack: 1, q_strides: Strides::contiguous(1, 4, 8), ..FwdParams::default() };
        assert_eq!(p.gqa_packed::<u16>(), p);
    }

    /// Packed, a window leaves the row (at key sk - 1) keys sk - 1 - left.. only: K and V
    /// start there, and the window hides none of those from any packed row; a window wider
    /// than the keys drops none.
    #[test]
    fn gqa_packed_window_drops_the_keys_before_it() {
        let (k, v, sk) = (1u64 << 20, 1u64 << 30, 100u32);
        let (ks, vs) = (Strides::contiguous(sk as u64, 2, 64), Strides { batch: 1 << 16, row: 256, head: 64 });
        for (left, drop) in [(0, 99), (9, 90), (98, 1), (99, 0), (500, 0), (NO_WINDOW, 0)] {
            let p = FwdParams {
                k,
                v,
                k_strides: ks,
                v_strides: vs,
                pb: Problem { heads_q: 8, heads_kv: 2, seqlen_q: 1, seqlen_k: sk, window_left: left, ..Problem::default() },
                gqa_pack: 4,
                ..FwdParams::default()
            };
            let n = p.gqa_packed::<u16>();
            assert_eq!(n.pb.seqlen_k, sk - drop, "left {left}");
            assert_eq!((n.k, n.v), (k + 2 * drop as u64 * ks.row, v + 2 * drop as u64 * vs.row), "left {left}");
            let window = crate::mask::Window::<crate::mask::Windowed>::new(&n.pb);
            for r in 0..4 {
                for col in 0..n.pb.seqlen_k {
                    assert!(!window.hides(r, col, n.pb.seqlen_q, n.pb.seqlen_k), "left {left}: row {r} key {col}");
                }
            }
        }
    }
}
