//! Timing of kernel launches, the same way for every variant: CUDA events around `iters`
//! back-to-back launches after `warmup` launches (wall clock on the emulator).

use crate::device::{Backend, FlashAttn, Tensor};
use crate::dtype::Dtype;
use crate::error::{Result, cuda};
use crate::options::{Attention, BwdOptions, FwdOptions};
use cudarc::driver::sys::CUevent_flags;

impl FlashAttn {
    /// Mean milliseconds per forward launch over `iters` launches, after `warmup` launches,
    /// writing into `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn time_forward<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut crate::FwdOutput<T>,
        warmup: usize,
        iters: usize,
    ) -> Result<f64> {
        self.time_calls(warmup, iters, || self.forward_into(q, k, v, attention, opts, out))
    }

    /// As [`FlashAttn::time_forward`], for a variable-length batch `seqs`
    /// ([`FlashAttn::forward_varlen_into`]).
    #[allow(clippy::too_many_arguments)]
    pub fn time_forward_varlen<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        seqs: &crate::SeqLens,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut crate::FwdOutput<T>,
        warmup: usize,
        iters: usize,
    ) -> Result<f64> {
        self.time_calls(warmup, iters, || self.forward_varlen_into(q, k, v, seqs, attention, opts, out))
    }

    /// As [`FlashAttn::time_forward`], for attention against a KV cache
    /// ([`FlashAttn::forward_kvcache_into`]: the append of `new_kv`, then the forward; `lens`
    /// is not advanced, so every call appends at the same rows).
    #[allow(clippy::too_many_arguments)]
    pub fn time_forward_kvcache<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k_cache: &mut Tensor<T>,
        v_cache: &mut Tensor<T>,
        lens: &Tensor<u32>,
        new_kv: Option<(&Tensor<T>, &Tensor<T>)>,
        attention: &Attention,
        opts: &FwdOptions,
        out: &mut crate::FwdOutput<T>,
        warmup: usize,
        iters: usize,
    ) -> Result<f64> {
        self.time_calls(warmup, iters, || {
            let cache = crate::KvCache { k: k_cache.view_mut(), v: v_cache.view_mut(), lens: lens.view() };
            self.forward_kvcache_into(q, cache, new_kv.map(|(k, v)| (k.view(), v.view())), attention, opts, out)
        })
    }

    /// Mean milliseconds per backward pass (its launches, and the allocation of its
    /// statistics workspace) from the forward's output `fwd` (with its O residual if it has
    /// one) over `iters` passes, after `warmup` passes.
    #[allow(clippy::too_many_arguments)]
    pub fn time_backward<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        fwd: &crate::FwdOutput<T>,
        d_o: &Tensor<T>,
        opts: &BwdOptions,
        grads: &mut crate::BwdOutput<T>,
        warmup: usize,
        iters: usize,
    ) -> Result<f64> {
        self.time_calls(warmup, iters, || self.backward_into(q, k, v, fwd, d_o, opts, grads))
    }

    /// Mean milliseconds per training step of attention over `iters` steps, after `warmup`: the
    /// forward with `fwd_opts` ([`FlashAttn::forward`], its outputs allocated on the stream
    /// each step) then the backward from its output with `bwd_opts` into `grads`.
    #[allow(clippy::too_many_arguments)]
    pub fn time_forward_backward<T: Dtype>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        d_o: &Tensor<T>,
        attention: &Attention,
        fwd_opts: &FwdOptions,
        bwd_opts: &BwdOptions,
        grads: &mut crate::BwdOutput<T>,
        warmup: usize,
        iters: usize,
    ) -> Result<f64> {
        self.time_calls(warmup, iters, || {
            let out = self.forward(q, k, v, attention, fwd_opts)?;
            self.backward_into(q, k, v, &out, d_o, bwd_opts, grads)
        })
    }

    /// Mean milliseconds per `call` over `iters` back-to-back calls after `warmup` calls: CUDA
    /// events on this handle's stream, wall clock on the emulator.
    fn time_calls(&self, warmup: usize, iters: usize, mut call: impl FnMut() -> Result<()>) -> Result<f64> {
        for _ in 0..warmup {
            call()?;
        }
        let iters = iters.max(1);
        match &self.backend {
            Backend::Cuda(c) => {
                let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
                let start = cuda("recording an event", c.stream.record_event(flags))?;
                for _ in 0..iters {
                    call()?;
                }
                let end = cuda("recording an event", c.stream.record_event(flags))?;
                let ms = cuda("reading event time", start.elapsed_ms(&end))?;
                Ok(ms as f64 / iters as f64)
            }
            Backend::Emulator => {
                let t = std::time::Instant::now();
                for _ in 0..iters {
                    call()?;
                }
                Ok(t.elapsed().as_secs_f64() * 1e3 / iters as f64)
            }
        }
    }
}
