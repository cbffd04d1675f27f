//! What a call computes ([`Attention`]) and how its forward and backward run
//! ([`FwdOptions`], [`BwdOptions`]).
//!
//! The attention is given to the forward only: its output ([`crate::FwdOutput`]) records it,
//! and the backward takes it from there, so a backward can never compute the gradient of
//! another attention than the forward's.

/// The attention computed: O = softmax(scale * Q K^T \[masked\]) V. Shared by a forward and
/// the backward that takes its output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attention {
    /// Causal masking, bottom-right aligned (FlashAttention >= 2.1): query row i sees key
    /// column j iff j <= i + seqlen_k - seqlen_q. Rows that see no key get O = 0, LSE = -inf.
    pub causal: bool,
    /// Scale applied to Q K^T before the softmax; `None` means 1/sqrt(head_dim) (the true
    /// head_dim, whatever the kernel pads it to). Any finite value of magnitude at most
    /// [`crate::MAX_SCALE`], of either sign; 0 is the limit scale -> 0+ (uniform weights over
    /// the visible keys).
    pub softmax_scale: Option<f32>,
    /// Sliding window (local attention); [`Window::default`] is none. The backward takes it
    /// on the `wgmma`, `mma` and `simt` families (the atomic ones refuse it,
    /// [`crate::Error::Unsupported`]).
    pub window: Window,
    /// Logit soft-capping (Gemma 2, Grok): each scaled score S = scale q . k becomes
    /// `softcap * tanh(S / softcap)` before the softmax (and the mask); `None` for none. Finite,
    /// from [`crate::MIN_SOFTCAP`] to [`crate::MAX_SOFTCAP`]. Forward on every family;
    /// backward on `mma` and `simt`, which automatic selection then takes also on Hopper (the
    /// `wgmma` and atomic backward families refuse it by name, [`crate::Error::Unsupported`]),
    /// with every other option.
    pub softcap: Option<f32>,
    /// Attention sinks (gpt-oss, [`crate::Sinks`]): a logit per query head that joins every
    /// row's softmax denominator as a key of value zero, so a row's weights sum to less than
    /// 1 (`None` for none). A row that sees no key gets O = 0 and LSE = its sink. The LSE
    /// counts the sink; the backward also returns the sinks' gradient
    /// ([`crate::BwdOutput::dsinks`]). Forward on every family; backward on every family but
    /// `wgmma` (automatic selection takes `mma` on Hopper; naming `wgmma` is
    /// [`crate::Error::Unsupported`]).
    pub sinks: Option<crate::Sinks>,
    /// ALiBi ([`crate::AlibiSlopes`], `[heads_q]` or `[batch, heads_q]`): query head h of
    /// batch entry b adds -slope |i + seqlen_k - seqlen_q - j| to the score of row i and key j,
    /// after the scale and the softcap (`None` for none). Every row gets its exact bias (not
    /// FA2's column-only shortcut under causal masking), so the LSE is that of the biased
    /// scores. Forward on every family; backward on `mma` and `simt` (automatic selection
    /// takes `mma` on Hopper; the `wgmma` and atomic families refuse it by name,
    /// [`crate::Error::Unsupported`]), with a softcap on `simt` only.
    pub alibi: Option<crate::AlibiSlopes>,
}

/// A sliding window, FlashAttention's (FA2 >= 2.3): query row i sees key column j only if
/// `i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right`; a side given as
/// `None` is unbounded. With [`Attention::causal`] the right side is 0 whatever is given
/// (the two masks' intersection). `Window { left: Some(w - 1), right: Some(0) }` is the
/// usual causal window of w keys (Mistral's `sliding_window = w`). Rows that see no key get
/// O = 0, LSE = -inf, as under causal masking. Key tiles outside every row's window are not
/// read: the cost grows with the window, not with seqlen_k.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// Keys visible before a row's diagonal (`None`: all).
    pub left: Option<u32>,
    /// Keys visible after it (`None`: all).
    pub right: Option<u32>,
}

impl Window {
    /// No window: both sides unbounded.
    pub const NONE: Window = Window { left: None, right: None };

    /// A window of `left` keys before and `right` keys after the diagonal.
    pub fn new(left: Option<u32>, right: Option<u32>) -> Window {
        Window { left, right }
    }

    /// Whether neither side is bounded.
    pub fn is_none(&self) -> bool {
        self.left.is_none() && self.right.is_none()
    }
}

impl Attention {
    /// Causal attention with the default scale.
    pub fn causal() -> Attention {
        Attention { causal: true, ..Default::default() }
    }
    /// The same attention with sliding window `window`.
    pub fn with_window(self, window: Window) -> Attention {
        Attention { window, ..self }
    }
    /// Whether query row `row` sees key column `col` (of `seqlen_q` rows and `seqlen_k`
    /// keys): the causal mask and the window, as the kernels apply them.
    pub fn sees(&self, row: usize, col: usize, seqlen_q: usize, seqlen_k: usize) -> bool {
        let diag = row as i64 + seqlen_k as i64 - seqlen_q as i64;
        let (col, right) = (col as i64, if self.causal { Some(0) } else { self.window.right });
        right.is_none_or(|r| col <= diag + r as i64) && self.window.left.is_none_or(|l| col >= diag - l as i64)
    }
    /// The key columns `lo..hi` query row `row` sees (`lo == hi`: none), the range
    /// [`Attention::sees`] describes.
    pub fn visible_cols(&self, row: usize, seqlen_q: usize, seqlen_k: usize) -> (usize, usize) {
        let diag = row as i64 + seqlen_k as i64 - seqlen_q as i64;
        let right = if self.causal { Some(0) } else { self.window.right };
        let lo = self.window.left.map_or(0, |l| (diag - l as i64).clamp(0, seqlen_k as i64));
        let hi = right.map_or(seqlen_k as i64, |r| (diag + r as i64 + 1).clamp(0, seqlen_k as i64));
        (lo as usize, hi.max(lo) as usize)
    }
    /// The same attention with softcap `softcap` (see [`Attention::softcap`]).
    pub fn with_softcap(self, softcap: f32) -> Attention {
        Attention { softcap: Some(softcap), ..self }
    }
    /// The kernel entry a forward or backward of this attention takes: the variable-length one
    /// for `varlen`, else a general one (`mask::General`) for a softcap or ALiBi, a window one
    /// (`mask::Windowed`) for a sliding window alone, else the plain one.
    pub fn entry(&self, varlen: bool) -> crate::Entry {
        crate::Entry::of(!self.window.is_none(), self.softcap.is_some() || self.alibi.is_some(), varlen)
    }
    /// The same attention with ALiBi slopes `slopes` (see [`Attention::alibi`]).
    pub fn with_alibi(self, slopes: crate::AlibiSlopes) -> Attention {
        Attention { alibi: Some(slopes), ..self }
    }
    /// The ALiBi bias of query row `row` and key `col` (of `seqlen_q` rows and `seqlen_k`
    /// keys) for query head `h` of batch entry `b`: -slope |row + seqlen_k - seqlen_q - col|,
    /// 0 without ALiBi.
    pub fn alibi_bias(&self, (b, h): (usize, usize), row: usize, col: usize, seqlen_q: usize, seqlen_k: usize) -> f64 {
        match &self.alibi {
            None => 0.0,
            Some(a) => {
                let off = col as i64 - (row as i64 + seqlen_k as i64 - seqlen_q as i64);
                -(a.slope(b, h) as f64) * off.unsigned_abs() as f64
            }
        }
    }
    /// The softmax's score from a scaled score `s` (scale q . k): capped when a softcap is set.
    pub fn capped(&self, s: f64) -> f64 {
        match self.softcap {
            Some(c) => c as f64 * (s / c as f64).tanh(),
            None => s,
        }
    }
    /// The same attention with attention sinks `sinks` (see [`Attention::sinks`]).
    pub fn with_sinks(self, sinks: crate::Sinks) -> Attention {
        Attention { sinks: Some(sinks), ..self }
    }
    /// The sink logit of query head `h` as the host knows it: `None` without sinks.
    ///
    /// # Panics
    /// If the sinks were given on the device ([`crate::FlashAttn::sinks_on_device`]), whose
    /// values the host does not know (the f64 reference needs them).
    pub fn sink(&self, h: usize) -> Option<f64> {
        self.sinks.as_ref().map(|s| s.host_values().expect("the reference needs sinks given on the host (FlashAttn::sinks)")[h] as f64)
    }
    /// The same attention with softmax scale `scale`.
    pub fn with_scale(self, scale: f32) -> Attention {
        Attention { softmax_scale: Some(scale), ..self }
    }
    /// The scale in effect for `head_dim`.
    pub fn scale(&self, head_dim: usize) -> f32 {
        self.softmax_scale.unwrap_or(1.0 / (head_dim as f32).sqrt())
    }
}

/// How the forward pass runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FwdOptions {
    /// Forward kernel family by name ([`crate::FWD_FAMILIES`]: `"wgmma"`, `"mma"`, `"simt"`, ...);
    /// `None` picks the best one that applies.
    pub kernel: Option<&'static str>,
    /// Opt-in: also return O's rounding residual ([`crate::FwdOutput::o_lo`], one more
    /// tensor of O's size) where the kernel writes it (the Hopper kernels). The backward then
    /// takes D~_i = dO_i . (O_i + O_lo_i) in f32 instead of dO_i . O_i: f32-accurate also in
    /// the rows that the Hopper dQ kernel's exact correction leaves out (rows without a
    /// softmax weight above 1/8, `bwd_wgmma`), where the default carries FA2's error. The same
    /// kernels otherwise, about the same speed.
    pub save_residual: bool,
    /// Split-KV (flash-decoding): each block of query rows takes its key tiles in this many
    /// parts, each part a block of its own, and a merge kernel combines the parts' f32
    /// outputs by their LSE ([`crate::FlashAttn::merge_partials`]). For few query rows
    /// against many keys (decoding, small batches), where one block per row tile and head
    /// leaves most of the GPU idle. `None`: the automatic choice ([`crate::auto_splits`]: no
    /// split when the unsplit launch fills the GPU; none in
    /// [`crate::FlashAttn::forward_into_views`], which allocates nothing); `Some(1)`: no split.
    /// Taken by the families that split ([`crate::kernels::registry::FwdFamilyDesc::splits`]:
    /// the Hopper ones), without `save_residual`; the parts ([splits] x O's size in f32, and
    /// LSE's) are allocated for each call. In a variable-length batch whose device-side
    /// offsets leave packed rows outside every sequence, a split forward writes those rows as
    /// rows without keys (O = 0, LSE = -inf), where an unsplit one leaves them as they were.
    pub splits: Option<u32>,
    /// Opt-out of GQA packing: the query heads that share a KV head run as heads of their
    /// own, each block reading its KV head's keys and values again. By default the Hopper
    /// families compute them as the rows of one tile where each sequence has one query row
    /// (decode) and no ALiBi is set (`kernels::params::FwdParams::gqa_packed`). For
    /// comparison; the results agree within the dtype's tolerance, not bitwise.
    pub no_gqa_packing: bool,
}

/// How the backward pass runs (the attention is the forward's).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwdOptions {
    /// Backward kernel family by name ([`crate::BWD_FAMILIES`]: `"wgmma"`, `"mma"`, `"simt"`,
    /// `"mma_atomic"`, `"wgmma_atomic"`); `None` picks the best one that applies.
    pub kernel: Option<&'static str>,
    /// Bitwise identical gradients from identical inputs on every run. Every automatically
    /// selected backward is; `mma_atomic` and `wgmma_atomic` (by name) add dQ with f32 atomics
    /// in a run-dependent order, and naming one of them with this set is an error.
    pub deterministic: bool,
}
