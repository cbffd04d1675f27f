//! The backward pass: dQ, dK, dV from Q, K, V and dO. Families (`kernels/src/bwd_*.rs`):
//! - `wgmma` (Hopper: warpgroup MMA; f16, bf16, head_dim up to 256; selected on compute
//!   capability 9.0): FA2's backward from the forward's LSE and O, `prep` (each row's m_i and
//!   1 / l_i from the LSE, D~_i = dO_i . O_i), a dQ kernel (one pass over the keys; it corrects
//!   D~ exactly where a row has large softmax weights and writes the exact D_i, `bwd_wgmma`),
//!   then a dK/dV kernel. No atomics, every output element summed by one thread in a fixed
//!   order: bitwise deterministic.
//! - `mma` (mma.sync, the same dtypes elsewhere on sm_80+) and `simt` (every dtype and
//!   head_dim): a dQ kernel that recomputes the row statistics (m_i, l_i, D_i = sum P dP in
//!   f32, a pass over the keys of its own) and writes them, then a dK/dV kernel; O and LSE are
//!   validated but not read. Bitwise deterministic too.
//! - `mma_atomic` (the same dtypes and head dims, by name only): FA2's structure, a statistics
//!   kernel (each row's m_i, l_i and D_i = sum P dP in f32), then one dK/dV kernel over key
//!   tiles that also adds dQ_i += dS_ij K_j into an f32 accumulator with atomics, then dQ's
//!   conversion to T. Not bitwise deterministic (the atomics' order varies), and on the H200
//!   0.69-0.76x of `mma` (benches/RESULTS.md, 6282a3e). `BwdOptions::deterministic` rules it
//!   out.
//! - `wgmma_atomic` (Hopper, by name only): the same structure on warpgroup MMA (the dK/dV
//!   kernel writes dS^T to shared memory and adds dQ_i = dS_ij K_j, a wgmma, to the f32
//!   accumulator with `red.global.add.v2.f32`); with the forward's residual its statistics come
//!   from `prep_residual`. Not deterministic; on the H200 slower than `wgmma` (0.75-1.01x at
//!   d = 64 and 128, 4256d7d; 0.83-0.99x at 192 and 256 with the residual, 295e7aa;
//!   `registry::BWD_FAMILIES`).
//!
//! Given the forward's O residual (a forward with `FwdOptions::save_residual`), `wgmma` takes
//! D~_i = dO_i . (O_i + O_lo_i) in f32 (`prep_residual`): D~ is then f32-accurate in the rows
//! the dQ kernel's correction leaves out too.
//!
//! The backward takes the forward's output whole ([`FwdOutput`]): its O, LSE and residual,
//! and the attention it computed, so that the gradient is always that of the forward's
//! attention; q, k and v must be the tensors the forward read.

use crate::device::{FlashAttn, Launch, Tensor};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::forward::{AttnShape, Forward, FwdOutput, check_no_overlap, offset_views, validate_seqs};
use crate::options::{Attention, BwdOptions};
use crate::varlen::SeqLens;
use crate::view::{AsView, Binds, View, ViewMut, check, row_align};
use flashattn_kernels::bwd_sinks::{SINK_SMEM_BYTES, SINK_THREADS, tiles as sink_tiles};
use flashattn_kernels::params::{BwdParams, Strides, Varlen};
use flashattn_kernels::registry::{Arch, BWD_FAMILIES, BwdFamily, BwdVariant, Entry, Pass, bwd_variant, sink_variants};

/// What the backward pass returns, in the layouts of Q, K and V, and the attention sinks'
/// gradient f32 [heads_q] when the attention has sinks ([`crate::Attention::sinks`]; for
/// [`FlashAttn::backward_into`], a buffer must be there).
#[derive(Debug)]
pub struct BwdOutput<T> {
    pub dq: Tensor<T>,
    pub dk: Tensor<T>,
    pub dv: Tensor<T>,
    pub dsinks: Option<Tensor<f32>>,
}

/// The backward's kernels for this dtype and head_dim, in launch order ([`BwdFamily::passes`]), on a
/// device that runs kernels of `archs` ([`FlashAttn::archs`]): the named family's
/// (`opts.kernel`, whatever its arch: launching it where it cannot run is
/// [`Error::UnsupportedDevice`]; a non-deterministic one with `opts.deterministic` is an
/// error), or those of the first family of [`BWD_FAMILIES`] that has every pass for these
/// archs (on Hopper the wgmma kernels, else the deterministic tensor-core kernels for
/// f16 and bf16 up to head_dim 128, else SIMT).
///
/// `saved`: the forward's O residual is at hand (the families that use it then run their
/// [`BwdFamily::passes`] for it). `entry`: the forward's (a sliding window, a variable-length
/// batch: every pass at this head_dim then needs a kernel for it, [`BwdVariant::entry`]; the
/// atomic families have none: named, they are [`Error::Unsupported`]). `attention`: the
/// forward's; with a softcap, ALiBi or sinks only the families whose kernels apply them
/// ([`flashattn_kernels::registry::BwdFamilyDesc::softcap`], `alibi`, `sinks`).
pub fn select_bwd_variants(
    dtype: flashattn_kernels::dtype::DType,
    head_dim: usize,
    opts: &BwdOptions,
    archs: &[Arch],
    saved: bool,
    entry: Entry,
    attention: &Attention,
) -> Result<Vec<&'static BwdVariant>> {
    let d = head_dim as u32;
    let (softcap, alibi, sinks) = (attention.softcap.is_some(), attention.alibi.is_some(), attention.sinks.is_some());
    // A softcap or ALiBi runs the general entries whatever window the caller's entry says
    // (`Entry::of`; the Hopper backward's window entries are window-only).
    let entry = match entry {
        Entry::Plain | Entry::Window if softcap || alibi => Entry::General,
        e => e,
    };
    let get = |family: BwdFamily| family.passes(saved).iter().map(|&pass| bwd_variant(family, pass, dtype, d)).collect::<Option<Vec<_>>>();
    match opts.kernel {
        Some(name) => {
            let family = BwdFamily::from_name(name)
                .ok_or_else(|| Error::UnknownKernel { name: name.into(), available: BWD_FAMILIES.iter().map(|f| f.name).collect() })?;
            if opts.deterministic && !family.desc().deterministic {
                return Err(Error::NotDeterministic { family: name.into() });
            }
            let vs = get(family).ok_or_else(|| Error::NoVariant { family: name.into(), dtype: dtype.name(), head_dim })?;
            if !vs.iter().all(|v| v.entry(entry).is_some()) {
                let what = match entry {
                    Entry::Varlen => "a variable-length batch in the backward family",
                    Entry::General => "a softcap or ALiBi in the backward family",
                    _ => "a sliding window in the backward family",
                };
                return Err(Error::Unsupported { what, value: name.into() });
            }
            if softcap && !family.desc().softcap {
                return Err(Error::Unsupported { what: "a softcap in the backward family", value: name.into() });
            }
            if softcap && !family.desc().softcap_in(entry) {
                return Err(Error::Unsupported { what: "a softcap on a variable-length batch in the backward family", value: name.into() });
            }
            if alibi && !family.desc().alibi {
                return Err(Error::Unsupported { what: "ALiBi in the backward family", value: name.into() });
            }
            if alibi && softcap && !family.desc().alibi_softcap {
                return Err(Error::Unsupported { what: "ALiBi with a softcap in the backward family", value: name.into() });
            }
            if sinks && !family.desc().sinks {
                return Err(Error::Unsupported { what: "attention sinks in the backward family", value: name.into() });
            }
            Ok(vs)
        }
        None => BWD_FAMILIES
            .iter()
            .filter(|f| {
                f.auto
                    && (f.deterministic || !opts.deterministic)
                    && archs.contains(&f.arch)
                    && (f.softcap_in(entry) || !softcap)
                    && (f.alibi || !alibi)
                    && (f.alibi_softcap || !(alibi && softcap))
                    && (f.sinks || !sinks)
            })
            .find_map(|f| get(f.family).filter(|vs| vs.iter().all(|v| v.entry(entry).is_some())))
            .ok_or_else(|| Error::NoVariant { family: "any".into(), dtype: dtype.name(), head_dim }),
    }
}

/// What the backward reads besides its forward's record: the views the forward read (Q, K,
/// V) and wrote (O, LSE and, when saved, O's residual), and dO, O's gradient (any layout of
/// Q's shape).
#[derive(Debug)]
pub struct BwdInputs<'a, T> {
    pub q: View<'a, T>,
    pub k: View<'a, T>,
    pub v: View<'a, T>,
    pub o: View<'a, T>,
    pub lse: View<'a, f32>,
    pub o_lo: Option<View<'a, T>>,
    pub d_o: View<'a, T>,
}

/// What the backward writes: dQ (Q's shape), dK and dV (K's shape), each in a layout of its
/// own, its f32 workspace of at least [`FlashAttn::backward_workspace_len`] elements (any
/// contents; 16-byte aligned), and for an attention with sinks their gradient f32 [heads_q]
/// (left alone without).
#[derive(Debug)]
pub struct BwdBuffers<'a, T> {
    pub dq: ViewMut<'a, T>,
    pub dk: ViewMut<'a, T>,
    pub dv: ViewMut<'a, T>,
    pub workspace: ViewMut<'a, f32>,
    pub dsinks: Option<ViewMut<'a, f32>>,
}

/// Workspace layout, each part from a 16-byte boundary: the row statistics f32 [4][batch,
/// heads_q, seqlen_q] (a variable-length batch's [4][heads_q, total_q]); with sinks, their
/// gradient's f64 partial sums [heads_q, batch, `bwd_sinks::tiles(seqlen_q)`]; then (the
/// atomic families) the dQ accumulator f32 [batch, heads_q, seqlen_q, head_dim]. Lengths in
/// f32 elements: (statistics with the partials, accumulator).
fn workspace_parts(shape: &AttnShape, seqs: Option<&SeqLens>, atomic: bool, sinks: bool) -> (usize, usize) {
    let rows = shape.heads_q * seqs.map_or(shape.batch * shape.seqlen_q, |s| s.total_q());
    let stats = (4 * rows).next_multiple_of(4);
    (stats + sink_partials_len(shape, sinks), if atomic { rows * shape.head_dim } else { 0 })
}

/// f32 elements of the sinks' gradient's partial sums (`bwd_sinks`), a multiple of 4; 0
/// without sinks.
fn sink_partials_len(shape: &AttnShape, sinks: bool) -> usize {
    match sinks {
        true => (2 * shape.heads_q * shape.batch * sink_tiles(shape.seqlen_q as u32) as usize).next_multiple_of(4),
        false => 0,
    }
}

/// The statistics' strides in the workspace (`BwdParams::stats_strides`, `stats_plane`).
fn stats_layout(shape: &AttnShape, seqs: Option<&SeqLens>) -> (Strides, u64) {
    let (hq, sq) = (shape.heads_q as u64, shape.seqlen_q as u64);
    match seqs {
        None => (Strides { batch: hq * sq, row: 1, head: sq }, shape.batch as u64 * hq * sq),
        Some(s) => (Strides { batch: 0, row: 1, head: s.total_q() as u64 }, hq * s.total_q() as u64),
    }
}

impl FlashAttn {
    /// Gradients of the attention `fwd` computed: given Q, K, V (the tensors the forward
    /// read), the forward's output and dO (O's gradient), returns dQ, dK, dV. With GQA, dK and
    /// dV of a KV head sum over the query heads that share it. With the forward's O residual
    /// ([`crate::FwdOptions::save_residual`]), D~ comes from the unrounded O (on Hopper).
    pub fn backward<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        fwd: &FwdOutput<T>,
        d_o: &impl AsView<T>,
        opts: &BwdOptions,
    ) -> Result<BwdOutput<T>> {
        let record = fwd.record().ok_or(Error::NoForward)?;
        let (qs, kvs, _) = record.shape.shapes(record.seqs.as_ref());
        let dsinks = match record.attention.sinks.is_some() {
            true => Some(self.alloc(&[record.shape.heads_q])?),
            false => None,
        };
        let mut out = BwdOutput { dq: self.alloc(&qs)?, dk: self.alloc(&kvs)?, dv: self.alloc(&kvs)?, dsinks };
        self.backward_into(q, k, v, fwd, d_o, opts, &mut out)?;
        Ok(out)
    }

    /// As [`FlashAttn::backward`], writing into existing gradient buffers (the workspace is
    /// allocated for the call: [`FlashAttn::backward_into_views`] takes the caller's).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_into<T: Dtype>(
        &self,
        q: &impl AsView<T>,
        k: &impl AsView<T>,
        v: &impl AsView<T>,
        fwd: &FwdOutput<T>,
        d_o: &impl AsView<T>,
        opts: &BwdOptions,
        grads: &mut BwdOutput<T>,
    ) -> Result<()> {
        let record = fwd.record().ok_or(Error::NoForward)?;
        let inputs = BwdInputs {
            q: q.as_view(),
            k: k.as_view(),
            v: v.as_view(),
            o: fwd.o().view(),
            lse: fwd.lse().view(),
            o_lo: fwd.o_lo().map(|t| t.view()),
            d_o: d_o.as_view(),
        };
        let n = self.backward_workspace_len::<T>(record, opts)?;
        let mut workspace = self.alloc::<f32>(&[n])?;
        let BwdOutput { dq, dk, dv, dsinks } = grads;
        let mut bufs = BwdBuffers {
            dq: dq.view_mut(),
            dk: dk.view_mut(),
            dv: dv.view_mut(),
            workspace: workspace.view_mut(),
            dsinks: dsinks.as_mut().map(|t| t.view_mut()),
        };
        self.backward_into_views(record, &inputs, &mut bufs, opts)
        // The workspace is freed in stream order, after the launches.
    }

    /// Elements of the f32 workspace [`FlashAttn::backward_into_views`] needs for the
    /// backward of `fwd` with `opts` on this device.
    pub fn backward_workspace_len<T: Dtype>(&self, fwd: &Forward, opts: &BwdOptions) -> Result<usize> {
        let entry = fwd.attention.entry(fwd.seqs.is_some());
        let passes = select_bwd_variants(T::DTYPE, fwd.shape.head_dim, opts, &self.archs(), fwd.residual, entry, &fwd.attention)?;
        let atomic = passes.iter().any(|v| v.pass == Pass::Dkdvq);
        let (stats, accum) = workspace_parts(&fwd.shape, fwd.seqs.as_ref(), atomic, fwd.attention.sinks.is_some());
        Ok(stats + accum)
    }

    /// The backward on views: the gradients of the forward `fwd` into `out`, from the views
    /// that forward read and wrote (checked against its record) and dO. Allocates nothing;
    /// queues its kernels (and a memset of the workspace for the atomic families) on the
    /// device's stream.
    pub fn backward_into_views<T: Dtype>(
        &self,
        fwd: &Forward,
        inputs: &BwdInputs<'_, T>,
        out: &mut BwdBuffers<'_, T>,
        opts: &BwdOptions,
    ) -> Result<()> {
        let attention = &fwd.attention;
        let seqs = fwd.seqs.as_ref();
        let shape = validate_seqs(inputs.q.shape(), inputs.k.shape(), inputs.v.shape(), seqs, attention)?;
        if shape != fwd.shape {
            return Err(Error::NotForwardInput { tensor: "q" });
        }
        // The keys past each sequence's seqused_k: dK = dV = 0, written here (the kernels see
        // only the used keys); the host must know where they are.
        let unused_keys = match seqs.map(|s| s.unused_keys()) {
            Some(None) => {
                let what = "the backward of a batch with seqused_k on the device (its unused keys' dK and dV need the offsets on the host)";
                return Err(Error::Unsupported { what, value: "seqlens_on_device".into() });
            }
            Some(Some(r)) => r,
            None => Vec::new(),
        };
        let (qs, kvs, ls) = shape.shapes(seqs);
        let offset_views = seqs.map(offset_views);
        let sink_view = attention.sinks.as_ref().map(|s| s.tensor().view());
        let alibi_view = attention.alibi.as_ref().map(|a| a.tensor().view());
        let align = row_align(shape.head_dim, std::mem::size_of::<T>());
        let BwdInputs { q, k, v, o, lse, o_lo, d_o } = inputs;
        let BwdBuffers { dq, dk, dv, workspace, dsinks } = out;
        let dsinks = match (&sink_view, dsinks) {
            (Some(_), None) => return Err(Error::MissingOutput { tensor: "dsinks", why: "the attention has sinks" }),
            (Some(_), Some(d)) => Some(d),
            (None, _) => None,
        };
        // Each memory bound once for the call (dQ, dK and dV may be pieces of one packed
        // buffer), mutably where an output writes it; the binds (cudarc's stream-order
        // records) are kept until the launches are queued.
        let mut binds = Binds::new(&[
            ("dq", dq.key()),
            ("dk", dk.key()),
            ("dv", dv.key()),
            ("workspace", workspace.key()),
            ("dsinks", dsinks.as_ref().and_then(|t| t.key())),
        ]);
        macro_rules! bind {
            ($name:literal, $view:expr, $shape:expr, $align:expr) => {
                self.bind_input(&mut binds, $name, $view, $shape, $align)?
            };
        }
        let (bq, bk, bv) = (bind!("q", q, &qs, align), bind!("k", k, &kvs, align), bind!("v", v, &kvs, align));
        for (b, id) in [&bq, &bk, &bv].into_iter().zip(&fwd.inputs) {
            if b.id() != *id {
                return Err(Error::NotForwardInput { tensor: b.name });
            }
        }
        let (bo, blse) = (bind!("o", o, &qs, align), bind!("lse", lse, &ls, 4));
        let bo_lo = match o_lo {
            Some(t) => Some(bind!("o_lo", t, &qs, align)),
            None => None,
        };
        for (b, id) in [Some(&bo), Some(&blse), bo_lo.as_ref()].into_iter().zip(&fwd.outputs) {
            if let Some(b) = b
                && Some(b.id()) != *id
            {
                return Err(Error::NotForwardOutput { tensor: b.name });
            }
        }
        let bdo = bind!("d_o", d_o, &qs, align);
        let archs = self.archs();
        let entry = attention.entry(seqs.is_some());
        let passes = select_bwd_variants(T::DTYPE, shape.head_dim, opts, &archs, bo_lo.is_some(), entry, attention)?;
        if let Some(v) = passes.iter().find(|v| !archs.contains(&v.arch())) {
            return Err(Error::UnsupportedDevice { kernel: v.name, needs: v.arch(), device: self.device_name() });
        }
        let atomic = passes.iter().any(|v| v.pass == Pass::Dkdvq);
        let (n_stats, n_accum) = workspace_parts(&shape, seqs, atomic, sink_view.is_some());
        let bdq = self.bind_mut(&mut binds, "dq", dq)?;
        let (bdk, bdv) = (self.bind_mut(&mut binds, "dk", dk)?, self.bind_mut(&mut binds, "dv", dv)?);
        check(&bdq, &qs, align, true)?;
        check(&bdk, &kvs, align, true)?;
        check(&bdv, &kvs, align, true)?;
        let bws = self.bind_mut(&mut binds, "workspace", workspace)?;
        if bws.layout.shape.len() != 1 || bws.layout.shape[0] < n_stats + n_accum {
            return Err(Error::Workspace { needed: n_stats + n_accum, got: bws.layout.shape.clone() });
        }
        check(&bws, &bws.layout.shape.clone(), 16, true)?;
        let bsinks = match &sink_view {
            Some(v) => Some(bind!("sinks", v, &[shape.heads_q], 4)),
            None => None,
        };
        let balibi = match (&alibi_view, &attention.alibi) {
            (Some(v), Some(a)) => Some(bind!("alibi_slopes", v, a.tensor().shape(), 4)),
            _ => None,
        };
        let bdsinks = match dsinks {
            Some(t) => {
                let b = self.bind_mut(&mut binds, "dsinks", t)?;
                check(&b, &[shape.heads_q], 4, true)?;
                Some(b)
            }
            None => None,
        };
        check_no_overlap(
            &[&bdq, &bdk, &bdv, &bws].into_iter().chain(bdsinks.as_ref()).collect::<Vec<_>>(),
            &[&bq, &bk, &bv, &bo, &blse, &bdo]
                .into_iter()
                .chain(bo_lo.as_ref())
                .chain(bsinks.as_ref())
                .chain(balibi.as_ref())
                .collect::<Vec<_>>(),
        )?;
        let offsets = match (&offset_views, seqs) {
            (Some(views), Some(seqs)) => Some(self.bind_offsets(&mut binds, views, seqs)?),
            _ => None,
        };
        let (stats_strides, stats_plane) = stats_layout(&shape, seqs);

        let d = shape.head_dim as u32;
        let stats = bws.addr();
        let dq_accum = if atomic { stats + 4 * n_stats as u64 } else { 0 };
        // The sinks' partial sums, after the four statistics planes (`workspace_parts`).
        let sink_partials = if sink_view.is_some() { stats + 4 * (n_stats - sink_partials_len(&shape, true)) as u64 } else { 0 };
        let params = BwdParams {
            q: bq.addr(),
            k: bk.addr(),
            v: bv.addr(),
            o: bo.addr(),
            o_lo: bo_lo.as_ref().map_or(0, |b| b.addr()),
            d_o: bdo.addr(),
            lse: blse.addr(),
            stats,
            dq: bdq.addr(),
            dk: bdk.addr(),
            dv: bdv.addr(),
            dq_accum,
            sinks: bsinks.as_ref().map_or(0, |b| b.addr()),
            dsinks: bdsinks.as_ref().map_or(0, |b| b.addr()),
            sink_partials,
            alibi: balibi.as_ref().map_or(0, |b| b.addr()),
            alibi_batch: attention.alibi.as_ref().map_or(0, |a| a.batch_stride()),
            q_strides: bq.strides4(),
            k_strides: bk.strides4(),
            v_strides: bv.strides4(),
            o_strides: bo.strides4(),
            do_strides: bdo.strides4(),
            dq_strides: bdq.strides4(),
            dk_strides: bdk.strides4(),
            dv_strides: bdv.strides4(),
            lse_strides: blse.lse_strides(),
            stats_strides,
            stats_plane,
            varlen: offsets.as_ref().map_or(Varlen::default(), |o| o.params),
            pb: shape.problem(attention, seqs.is_some()),
        };
        let regions: Vec<_> = [&bq, &bk, &bv, &bo, &bdo, &blse, &bdq, &bdk, &bdv, &bws]
            .into_iter()
            .chain(bo_lo.as_ref())
            .chain(bsinks.as_ref())
            .chain(bdsinks.as_ref())
            .chain(balibi.as_ref())
            .chain(offsets.iter().flat_map(|o| o.bound.iter()))
            .map(|b| b.region())
            .collect();
        // Query-side passes over query tiles of each query head; dK/dV over key tiles of each
        // KV head.
        let (sq, sk) = (shape.seqlen_q as u32, shape.seqlen_k as u32);
        let (hq, hkv, b) = (shape.heads_q as u32, shape.heads_kv as u32, shape.batch as u32);
        let launches = passes
            .iter()
            .map(|v| {
                let l = v.launch_entry(d, entry).ok_or_else(|| Error::NoVariant {
                    family: v.family.name().into(),
                    dtype: T::DTYPE.name(),
                    head_dim: shape.head_dim,
                })?;
                let grid = if v.pass.over_keys() { (sk.div_ceil(l.rows), hkv, b) } else { (sq.div_ceil(l.rows), hq, b) };
                // The selection took only variants with an entry for this launch.
                let (name, emulate) = v.entry(entry).ok_or(Error::Unsupported {
                    what: "a sliding window or a variable-length batch in the backward family",
                    value: v.family.name().into(),
                })?;
                Ok(Launch { name, arch: v.arch(), grid, threads: l.threads, smem: l.smem_bytes as usize, emulate })
            })
            .collect::<Result<Vec<Launch<BwdParams>>>>()?;
        // With sinks, their gradient after the family's passes (`bwd_sinks`).
        let mut launches = launches;
        if sink_view.is_some() {
            let [partials, sum] = sink_variants(passes[0].family);
            let smem = SINK_SMEM_BYTES as usize;
            launches.push(Launch {
                name: partials.name,
                arch: Arch::Sm80,
                grid: (sink_tiles(sq), hq, b),
                threads: SINK_THREADS,
                smem,
                emulate: partials.emulate,
            });
            launches.push(Launch { name: sum.name, arch: Arch::Sm80, grid: (1, hq, 1), threads: 32, smem, emulate: sum.emulate });
        }
        if atomic {
            // The atomic path's dQ accumulator starts at zero.
            self.memset_zero(dq_accum, 4 * n_accum)?;
        }
        for (rows, b) in unused_keys.iter().flat_map(|r| [(r, &bdk), (r, &bdv)]) {
            for (addr, pitch, width, height) in b.row_blocks(rows.clone()) {
                self.memset_zero_2d(addr, pitch, width, height)?;
            }
        }
        // SAFETY: every view was checked above against the memory it is in, and the workspace
        // holds the statistics and the accumulator.
        unsafe { self.launch("launching a backward kernel", &launches, params, &regions) }
    }
}
