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
use crate::forward::{FwdOutput, validate};
use crate::options::{Attention, BwdOptions};
use flashattn_kernels::dev::emu::GlobalRegion;
use flashattn_kernels::params::BwdParams;
use flashattn_kernels::registry::{Arch, BWD_FAMILIES, BwdFamily, BwdVariant, Pass, bwd_variant};

/// What the backward pass returns, in the layouts of Q, K and V.
#[derive(Debug)]
pub struct BwdOutput<T> {
    pub dq: Tensor<T>,
    pub dk: Tensor<T>,
    pub dv: Tensor<T>,
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
/// [`BwdFamily::passes`] for it).
pub fn select_bwd_variants(
    dtype: flashattn_kernels::dtype::DType,
    head_dim: usize,
    opts: &BwdOptions,
    archs: &[Arch],
    saved: bool,
) -> Result<Vec<&'static BwdVariant>> {
    let d = head_dim as u32;
    let get = |family: BwdFamily| family.passes(saved).iter().map(|&pass| bwd_variant(family, pass, dtype, d)).collect::<Option<Vec<_>>>();
    match opts.kernel {
        Some(name) => {
            let family = BwdFamily::from_name(name)
                .ok_or_else(|| Error::UnknownKernel { name: name.into(), available: BWD_FAMILIES.iter().map(|f| f.name).collect() })?;
            if opts.deterministic && !family.desc().deterministic {
                return Err(Error::NotDeterministic { family: name.into() });
            }
            get(family).ok_or_else(|| Error::NoVariant { family: name.into(), dtype: dtype.name(), head_dim })
        }
        None => BWD_FAMILIES
            .iter()
            .filter(|f| f.auto && (f.deterministic || !opts.deterministic) && archs.contains(&f.arch))
            .find_map(|f| get(f.family))
            .ok_or_else(|| Error::NoVariant { family: "any".into(), dtype: dtype.name(), head_dim }),
    }
}

impl FlashAttn {
    /// Gradients of the attention `fwd` computed: given Q, K, V (the tensors the forward
    /// read), the forward's output and dO (O's gradient), returns dQ, dK, dV. With GQA, dK and
    /// dV of a KV head sum over the query heads that share it. With the forward's O residual
    /// ([`crate::FwdOptions::save_residual`]), D~ comes from the unrounded O (on Hopper).
    pub fn backward<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        fwd: &FwdOutput<T>,
        d_o: &Tensor<T>,
        opts: &BwdOptions,
    ) -> Result<BwdOutput<T>> {
        let attention = fwd.attention().ok_or(Error::NoForward)?;
        let shape = validate(q.shape(), k.shape(), v.shape(), &attention)?;
        let mut out =
            BwdOutput { dq: self.alloc(&shape.q_shape())?, dk: self.alloc(&shape.kv_shape())?, dv: self.alloc(&shape.kv_shape())? };
        self.backward_into(q, k, v, fwd, d_o, opts, &mut out)?;
        Ok(out)
    }

    /// As [`FlashAttn::backward`], writing into existing gradient buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_into<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        fwd: &FwdOutput<T>,
        d_o: &Tensor<T>,
        opts: &BwdOptions,
        grads: &mut BwdOutput<T>,
    ) -> Result<()> {
        let record = fwd.record().ok_or(Error::NoForward)?;
        let stream = self.stream();
        for ((name, t), id) in [("q", q), ("k", k), ("v", v)].into_iter().zip(record.inputs) {
            if t.identity(stream) != id {
                return Err(Error::NotForwardInput { tensor: name });
            }
        }
        self.backward_impl(q, k, v, fwd.o(), fwd.o_lo(), d_o, fwd.lse(), grads, &record.attention, opts)
    }

    /// The backward, with the forward's O residual when there is one.
    #[allow(clippy::too_many_arguments)]
    fn backward_impl<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        o: &Tensor<T>,
        o_lo: Option<&Tensor<T>>,
        d_o: &Tensor<T>,
        lse: &Tensor<f32>,
        grads: &mut BwdOutput<T>,
        attention: &Attention,
        opts: &BwdOptions,
    ) -> Result<()> {
        let shape = validate(q.shape(), k.shape(), v.shape(), attention)?;
        let (qs, kvs, ls) = (shape.q_shape(), shape.kv_shape(), shape.lse_shape());
        for (name, got, expected) in [
            ("o", o.shape(), &qs[..]),
            ("o_lo", o_lo.map_or(&qs[..], |t| t.shape()), &qs[..]),
            ("d_o", d_o.shape(), &qs[..]),
            ("lse", lse.shape(), &ls[..]),
            ("dq", grads.dq.shape(), &qs[..]),
            ("dk", grads.dk.shape(), &kvs[..]),
            ("dv", grads.dv.shape(), &kvs[..]),
        ] {
            if got != expected {
                return Err(Error::OutputShape { tensor: name, expected: expected.to_vec(), got: got.to_vec() });
            }
        }
        if let Some(t) = o_lo {
            self.check_owner_id(t.owner(), "o_lo")?;
        }
        for (name, owner) in
            [("q", q.owner()), ("k", k.owner()), ("v", v.owner()), ("o", o.owner()), ("d_o", d_o.owner()), ("lse", lse.owner())]
        {
            self.check_owner_id(owner, name)?;
        }
        for (name, owner) in [("dq", grads.dq.owner()), ("dk", grads.dk.owner()), ("dv", grads.dv.owner())] {
            self.check_owner_id(owner, name)?;
        }
        let archs = self.archs();
        let passes = select_bwd_variants(T::DTYPE, shape.head_dim, opts, &archs, o_lo.is_some())?;
        if let Some(v) = passes.iter().find(|v| !archs.contains(&v.arch())) {
            return Err(Error::UnsupportedDevice { kernel: v.name, needs: v.arch(), device: self.device_name() });
        }
        let mut stats = self.alloc::<f32>(&[4, ls[0], ls[1], ls[2]])?;
        // The atomic path's dQ accumulator, zeroed on the stream; none otherwise.
        let atomic = passes.iter().any(|v| v.pass == Pass::Dkdvq);
        let mut dq_accum = if atomic { Some(self.zeros::<f32>(&[ls[0], ls[1], ls[2], shape.head_dim])?) } else { None };
        let stream = self.stream();
        let d = shape.head_dim as u32;
        let params = BwdParams {
            q: q.addr(stream),
            k: k.addr(stream),
            v: v.addr(stream),
            o: o.addr(stream),
            o_lo: o_lo.map_or(0, |t| t.addr(stream)),
            d_o: d_o.addr(stream),
            lse: lse.addr(stream),
            stats: stats.addr_mut(stream),
            dq: grads.dq.addr_mut(stream),
            dk: grads.dk.addr_mut(stream),
            dv: grads.dv.addr_mut(stream),
            dq_accum: dq_accum.as_mut().map_or(0, |t| t.addr_mut(stream)),
            q_strides: shape.q_strides(),
            k_strides: shape.kv_strides(),
            pb: shape.problem(attention),
        };
        let regions = [
            GlobalRegion { start: params.q as usize, len: q.bytes(), writable: false },
            GlobalRegion { start: params.k as usize, len: k.bytes(), writable: false },
            GlobalRegion { start: params.v as usize, len: v.bytes(), writable: false },
            GlobalRegion { start: params.o as usize, len: o.bytes(), writable: false },
            GlobalRegion { start: params.o_lo as usize, len: o_lo.map_or(0, |t| t.bytes()), writable: false },
            GlobalRegion { start: params.d_o as usize, len: d_o.bytes(), writable: false },
            GlobalRegion { start: params.lse as usize, len: lse.bytes(), writable: false },
            GlobalRegion { start: params.stats as usize, len: stats.bytes(), writable: true },
            GlobalRegion { start: params.dq as usize, len: grads.dq.bytes(), writable: true },
            GlobalRegion { start: params.dk as usize, len: grads.dk.bytes(), writable: true },
            GlobalRegion { start: params.dv as usize, len: grads.dv.bytes(), writable: true },
            GlobalRegion { start: params.dq_accum as usize, len: dq_accum.as_ref().map_or(0, |t| t.bytes()), writable: true },
        ];
        // Query-side passes over query tiles of each query head; dK/dV over key tiles of each
        // KV head.
        let (sq, sk) = (shape.seqlen_q as u32, shape.seqlen_k as u32);
        let (hq, hkv, b) = (shape.heads_q as u32, shape.heads_kv as u32, shape.batch as u32);
        let launches = passes
            .iter()
            .map(|v| {
                let l = v.launch(d).ok_or_else(|| Error::NoVariant {
                    family: v.family.name().into(),
                    dtype: T::DTYPE.name(),
                    head_dim: shape.head_dim,
                })?;
                let grid = if v.pass.over_keys() { (sk.div_ceil(l.rows), hkv, b) } else { (sq.div_ceil(l.rows), hq, b) };
                Ok(Launch { name: v.name, arch: v.arch(), grid, threads: l.threads, smem: l.smem_bytes as usize, emulate: v.emulate })
            })
            .collect::<Result<Vec<Launch<BwdParams>>>>()?;
        // SAFETY: parameters validated against the buffers above. The workspaces are dropped
        // after the launches are queued; cudarc frees them in stream order, after them.
        unsafe { self.launch("launching a backward kernel", &launches, params, &regions) }
    }
}
