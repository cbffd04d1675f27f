//! Attention sinks (gpt-oss): one learned logit s_h per query head joins every row's softmax
//! denominator as a key whose value is zero (the kernels' side: `flashattn_kernels::sinks`):
//!
//! P_ij = exp(S_ij - LSE_i), LSE_i = log(exp(s_h) + sum_j exp(S_ij)), O_i = sum_j P_ij V_j.
//!
//! A row that sees no key gets O = 0 and LSE = s_h. The backward also returns
//! ds_h = -sum_i exp(s_h - LSE_i) D_i over the head's rows (D_i = dO_i . O_i).

use crate::device::{FlashAttn, Tensor};
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;
use std::sync::Arc;

/// The sink logits of an attention, f32 [heads_q], on the device (made by
/// [`FlashAttn::sinks`] or [`FlashAttn::sinks_on_device`]; set in
/// [`crate::Attention::sinks`]). A cheap handle: the forward's record keeps one, so its
/// backward uses the very values the forward did.
#[derive(Clone)]
pub struct Sinks(Arc<Inner>);

struct Inner {
    values: Tensor<f32>,
    /// The values as checked on the host (`None`: given on the device).
    host: Option<Vec<f32>>,
}

impl PartialEq for Sinks {
    /// The same upload.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sinks").field("heads", &self.heads()).field("values", &self.0.host).finish()
    }
}

impl Sinks {
    /// Query heads it has a logit for.
    pub fn heads(&self) -> usize {
        self.0.values.len()
    }
    /// The logits, where they were given on the host ([`FlashAttn::sinks`]).
    pub fn host_values(&self) -> Option<&[f32]> {
        self.0.host.as_deref()
    }
    /// The device tensor f32 [heads_q].
    pub fn tensor(&self) -> &Tensor<f32> {
        &self.0.values
    }
}

impl FlashAttn {
    /// Attention sinks from the host: one logit per query head, each finite or -inf (no sink
    /// for that head), checked and copied to the device.
    pub fn sinks(&self, logits: &[f32]) -> Result<Sinks> {
        if logits.is_empty() {
            return Err(Error::EmptyDimension { tensor: "sinks", shape: vec![0] });
        }
        if let Some(h) = logits.iter().position(|s| s.is_nan() || *s == f32::INFINITY) {
            return Err(Error::InvalidSink { head: h, value: logits[h] });
        }
        let values = self.upload_plain(logits, &[logits.len()])?;
        Ok(Sinks(Arc::new(Inner { values, host: Some(logits.to_vec()) })))
    }

    /// Attention sinks already on the device (a model's parameter; clone it to keep using it):
    /// a cudarc buffer of this instance's context of one logit per query head, used in the
    /// order of its stream. The host cannot read them: a NaN makes its head's outputs NaN,
    /// +inf gives its rows O = 0 (and gradients of no use).
    pub fn sinks_on_device(&self, logits: CudaSlice<f32>) -> Result<Sinks> {
        let n = logits.len();
        if n == 0 {
            return Err(Error::EmptyDimension { tensor: "sinks", shape: vec![0] });
        }
        let values = self.tensor_from_cuda_plain(logits, &[n]).map_err(|_| Error::WrongDevice { tensor: "sinks" })?;
        Ok(Sinks(Arc::new(Inner { values, host: None })))
    }
}
