//! Views: what a call reads and writes. A view is a shape with element strides (the last
//! dimension contiguous) over memory that a [`Tensor`] or the caller owns: a cudarc
//! `CudaSlice`/`CudaView` (borrowed, no copy), a raw device pointer (`unsafe`), or on the
//! emulator a host slice. Strided views take packed QKV `[b, s, 3, h, d]`, PyTorch's
//! `[b, h, s, d]` and slices of larger buffers as they are; [`View::unbind`],
//! [`View::narrow`] and [`View::split_at`] cut one view into pieces (for a [`ViewMut`]:
//! pieces that each write their part of one memory, as `slice::split_at_mut` does).
//!
//! Views are checked when a call takes them ([`check`]), before anything is launched: shape,
//! strides, the memory they reach, alignment, the device that owns the memory, and (for
//! outputs) overlap with the call's other tensors.

use crate::device::{Backend, FlashAttn, Storage, Tensor};
use crate::error::{Error, Result};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Memory a [`View`] reads.
enum Mem<'a, T> {
    Tensor(&'a Tensor<T>),
    Cuda(&'a dyn DevicePtr<T>),
    /// Device memory by address and length in elements (the caller's contract).
    Raw(u64, usize),
    Host(&'a [T]),
    /// A [`ViewMut`]'s memory, read ([`ViewMut::into_view`]): other pieces of that view may
    /// still write it, so it stays a pointer (no `&'a` to it is made).
    Mut(MemMut<'a, T>),
}

impl<T> Clone for Mem<'_, T> {
    fn clone(&self) -> Self {
        match self {
            Mem::Tensor(t) => Mem::Tensor(t),
            Mem::Cuda(c) => Mem::Cuda(*c),
            Mem::Raw(a, n) => Mem::Raw(*a, *n),
            Mem::Host(h) => Mem::Host(h),
            Mem::Mut(m) => Mem::Mut(*m),
        }
    }
}

/// Device memory that can be read and written: `CudaSlice`, `CudaViewMut`.
trait DeviceMem<T>: DevicePtr<T> + DevicePtrMut<T> {}
impl<T, M: DevicePtr<T> + DevicePtrMut<T>> DeviceMem<T> for M {}

/// Memory a [`ViewMut`] writes: what an `&'a mut` borrowed (the view's `PhantomData` holds
/// that borrow), kept as a pointer so that the pieces of one view ([`ViewMut::unbind`],
/// [`ViewMut::narrow`], [`ViewMut::split_at`]) can each hold it. A reference to it is made
/// only while a call binds its views, and then once per call for all the pieces it takes
/// ([`Binds`]). Pointers also keep `ViewMut` covariant in `'a`, as `&'a mut` is (views
/// borrowed at different times can go into one call), and neither `Send` nor `Sync`: pieces
/// cannot be bound on two threads at once.
enum MemMut<'a, T> {
    Tensor(NonNull<Tensor<T>>),
    Cuda(NonNull<dyn DeviceMem<T> + 'a>),
    Raw(u64, usize),
    /// Host memory: its first element and its length.
    Host(NonNull<T>, usize),
}

impl<T> Clone for MemMut<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for MemMut<'_, T> {}

/// Which memory a view is in: the address of what it borrows (a [`Tensor`], a cudarc
/// buffer) or of its host memory (with the length). Views of one memory in one call are
/// bound once ([`Binds`]). Raw device pointers have none (no Rust reference is made to them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemKey {
    Tensor(usize),
    Cuda(usize),
    Host(usize, usize),
}

impl<T> Mem<'_, T> {
    fn key(&self) -> Option<MemKey> {
        match self {
            Mem::Tensor(t) => Some(MemKey::Tensor(std::ptr::from_ref(*t) as *const () as usize)),
            Mem::Cuda(c) => Some(MemKey::Cuda(std::ptr::from_ref(*c) as *const () as usize)),
            Mem::Raw(..) => None,
            Mem::Host(h) => Some(MemKey::Host(h.as_ptr() as usize, h.len())),
            Mem::Mut(m) => m.key(),
        }
    }
}

impl<T> MemMut<'_, T> {
    fn key(&self) -> Option<MemKey> {
        match self {
            MemMut::Tensor(t) => Some(MemKey::Tensor(t.as_ptr() as *const () as usize)),
            MemMut::Cuda(c) => Some(MemKey::Cuda(c.as_ptr() as *const () as usize)),
            MemMut::Raw(..) => None,
            MemMut::Host(p, n) => Some(MemKey::Host(p.as_ptr() as usize, *n)),
        }
    }
}

/// The place of a view's elements: shape, element strides, and the element offset of the
/// first one in its memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) shape: Vec<usize>,
    pub(crate) strides: Vec<usize>,
    pub(crate) offset: usize,
}

impl Layout {
    fn contiguous(shape: &[usize]) -> Layout {
        Layout { shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0 }
    }
    /// Largest element offset reached (from the memory's start), or None on overflow.
    fn last(&self) -> Option<usize> {
        self.shape.iter().zip(&self.strides).try_fold(self.offset, |acc, (&n, &s)| acc.checked_add(n.checked_sub(1)?.checked_mul(s)?))
    }
    /// The error of sub-view `op` of dimension `dim`.
    fn sub_view_err(&self, op: &'static str, dim: usize, why: String) -> Error {
        Error::SubView { op, shape: self.shape.clone(), dim, why }
    }
    /// Checks that `dim` is a dimension of this layout (with one stride each); returns its
    /// size and stride.
    fn dim(&self, op: &'static str, dim: usize) -> Result<(usize, usize)> {
        if self.strides.len() != self.shape.len() {
            let why = format!("the view has {} strides ({:?}) for its {} dimensions", self.strides.len(), self.strides, self.shape.len());
            return Err(self.sub_view_err(op, dim, why));
        }
        if dim >= self.shape.len() {
            return Err(self.sub_view_err(op, dim, format!("the view has {} dimensions", self.shape.len())));
        }
        Ok((self.shape[dim], self.strides[dim]))
    }
    /// Elements `start..start + len` of dimension `dim` (`op` names the caller in errors).
    fn narrow(&self, op: &'static str, dim: usize, start: usize, len: usize) -> Result<Layout> {
        let (n, stride) = self.dim(op, dim)?;
        if start.checked_add(len).is_none_or(|end| end > n) {
            return Err(self.sub_view_err(op, dim, format!("start {start} + length {len} is past its size {n}")));
        }
        let offset = start.checked_mul(stride).and_then(|o| o.checked_add(self.offset));
        let offset = offset.ok_or_else(|| self.sub_view_err(op, dim, format!("the element offset of {start} overflows")))?;
        let mut shape = self.shape.clone();
        shape[dim] = len;
        Ok(Layout { shape, strides: self.strides.clone(), offset })
    }
    /// Elements `..mid` and `mid..` of dimension `dim`.
    fn split_at(&self, dim: usize, mid: usize) -> Result<(Layout, Layout)> {
        let (n, _) = self.dim("split_at", dim)?;
        if mid > n {
            return Err(self.sub_view_err("split_at", dim, format!("mid {mid} is past its size {n}")));
        }
        Ok((self.narrow("split_at", dim, 0, mid)?, self.narrow("split_at", dim, mid, n - mid)?))
    }
    /// Each of the `N` elements of dimension `dim`, without that dimension.
    fn unbind<const N: usize>(&self, dim: usize) -> Result<[Layout; N]> {
        let (n, stride) = self.dim("unbind", dim)?;
        if dim + 1 == self.shape.len() {
            let why = "it is the last dimension, the contiguous one the kernels read along; unbind an outer one".to_string();
            return Err(self.sub_view_err("unbind", dim, why));
        }
        if n != N {
            return Err(self.sub_view_err("unbind", dim, format!("its size is {n}, not the {N} pieces asked for")));
        }
        // The last piece's offset fits, so every piece's does.
        let last = N.saturating_sub(1).checked_mul(stride).and_then(|o| o.checked_add(self.offset));
        if last.is_none() {
            return Err(self.sub_view_err("unbind", dim, format!("the element offset of piece {} overflows", N - 1)));
        }
        let (mut shape, mut strides) = (self.shape.clone(), self.strides.clone());
        shape.remove(dim);
        strides.remove(dim);
        Ok(std::array::from_fn(|i| Layout { shape: shape.clone(), strides: strides.clone(), offset: self.offset + i * stride }))
    }
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// A read-only view: shape and element strides over memory a [`Tensor`] or the caller owns.
/// Cheap to make and to clone (the sub-views of one view: `qkv.clone().narrow(..)`);
/// checked when a call takes it.
pub struct View<'a, T> {
    mem: Mem<'a, T>,
    layout: Layout,
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        View { mem: self.mem.clone(), layout: self.layout.clone() }
    }
}

/// A view a call writes (an output, a gradient, the backward's workspace). [`ViewMut::unbind`],
/// [`ViewMut::narrow`] and [`ViewMut::split_at`] cut it into pieces that write disjoint
/// elements of its memory (a packed dQKV buffer as dQ, dK and dV): they can go into one
/// call, or into different calls.
pub struct ViewMut<'a, T> {
    mem: MemMut<'a, T>,
    layout: Layout,
    /// The `&'a mut` the memory is borrowed by.
    _borrow: PhantomData<&'a mut T>,
}

/// What can be read as a [`View`]: a [`Tensor`] (contiguous, its shape) or a view.
pub trait AsView<T> {
    /// The view.
    fn as_view(&self) -> View<'_, T>;
}

impl<T> AsView<T> for Tensor<T> {
    fn as_view(&self) -> View<'_, T> {
        self.view()
    }
}

impl<T> AsView<T> for View<'_, T> {
    fn as_view(&self) -> View<'_, T> {
        self.clone()
    }
}

impl<T> Tensor<T> {
    /// The tensor as a view (contiguous, its shape); [`View::strided`] re-views it.
    pub fn view(&self) -> View<'_, T> {
        View { mem: Mem::Tensor(self), layout: Layout::contiguous(self.shape()) }
    }
    /// The tensor as a view to write (contiguous, its shape).
    pub fn view_mut(&mut self) -> ViewMut<'_, T> {
        let layout = Layout::contiguous(self.shape());
        ViewMut { mem: MemMut::Tensor(NonNull::from(self)), layout, _borrow: PhantomData }
    }
}

macro_rules! layout_methods {
    () => {
        /// The same memory as `shape` with element strides `strides` (one per dimension; the
        /// last must be 1), from element `offset` of the memory on.
        pub fn strided(mut self, shape: &[usize], strides: &[usize], offset: usize) -> Self {
            self.layout = Layout { shape: shape.to_vec(), strides: strides.to_vec(), offset };
            self
        }
        /// The same memory as a contiguous (row-major) `shape` from element `offset` on.
        pub fn reshaped(self, shape: &[usize], offset: usize) -> Self {
            let strides = contiguous_strides(shape);
            self.strided(shape, &strides, offset)
        }
        /// Its shape.
        pub fn shape(&self) -> &[usize] {
            &self.layout.shape
        }
        /// Its element strides.
        pub fn strides(&self) -> &[usize] {
            &self.layout.strides
        }
        /// Element offset of its first element in its memory.
        pub fn offset(&self) -> usize {
            self.layout.offset
        }
        /// Elements `start..start + len` of dimension `dim`, as torch's and candle's `narrow`:
        /// the dimension stays, of size `len`; the same memory and strides, the offset moved on
        /// (a `[b, s, hq + 2 * hkv, d]` GQA projection narrowed on dimension 2 is its Q, K or V).
        ///
        /// [`Error::SubView`] when `dim` is not a dimension of the view, when `start + len` is
        /// past its size, or when the view has not one stride per dimension.
        pub fn narrow(self, dim: usize, start: usize, len: usize) -> Result<Self> {
            let layout = self.layout.narrow("narrow", dim, start, len)?;
            Ok(self.piece(layout))
        }
        /// Elements `..mid` and `mid..` of dimension `dim`: two views of the same memory, as
        /// `slice::split_at` (`split_at_mut` for a [`ViewMut`]: each piece writes its own part).
        ///
        /// [`Error::SubView`] when `dim` is not a dimension of the view, when `mid` is past its
        /// size, or when the view has not one stride per dimension.
        pub fn split_at(self, dim: usize, mid: usize) -> Result<(Self, Self)> {
            let (a, b) = self.layout.split_at(dim, mid)?;
            Ok((self.piece(a), self.piece(b)))
        }
        /// The `N` elements of dimension `dim`, each a view of the same memory without that
        /// dimension: `[b, s, 3, h, d]` unbound on dimension 2 is Q, K and V `[b, s, h, d]`,
        /// strides `[s * 3 * h * d, 3 * h * d, d, 1]`, offsets 0, `h * d` and `2 * h * d`.
        ///
        /// ```
        /// # fn main() -> flashattn::Result<()> {
        /// let fa = flashattn::FlashAttn::emulator();
        /// let (b, s, h, d) = (2, 16, 4, 64);
        /// let qkv = fa.full(half::bf16::ONE, &[b, s, 3, h, d])?;
        /// let mut dqkv = fa.full(half::bf16::ZERO, &[b, s, 3, h, d])?;
        /// let [q, k, v] = qkv.view().unbind::<3>(2)?;
        /// let [dq, dk, dv] = dqkv.view_mut().unbind::<3>(2)?; // one memory, three outputs
        /// assert_eq!((dq.shape(), dk.strides(), dv.offset()), (&[b, s, h, d][..], &[s * 3 * h * d, 3 * h * d, d, 1][..], 2 * h * d));
        /// # let _ = (q, k, v);
        /// # Ok(()) }
        /// ```
        ///
        /// [`Error::SubView`] when `dim` is not a dimension of the view, when it is the last
        /// one (the contiguous one, which the kernels read along), when its size is not `N`, or
        /// when the view has not one stride per dimension.
        pub fn unbind<const N: usize>(self, dim: usize) -> Result<[Self; N]> {
            let layouts = self.layout.unbind::<N>(dim)?;
            Ok(layouts.map(|l| self.piece(l)))
        }
    };
}

impl<'a, T> View<'a, T> {
    /// A contiguous `shape` over the start of the caller's cudarc memory (a `CudaSlice` or a
    /// `CudaView`), borrowed: no copy. Work on it is ordered after the memory's pending writes
    /// through cudarc's stream events (no host synchronisation).
    pub fn cuda(mem: &'a impl DevicePtr<T>, shape: &[usize]) -> View<'a, T> {
        View { mem: Mem::Cuda(mem), layout: Layout::contiguous(shape) }
    }
    /// A contiguous `shape` over host memory, for the emulator ([`FlashAttn::emulator`]):
    /// rows must be aligned as on a GPU (see [`check`]'s alignment rule).
    pub fn host(mem: &'a [T], shape: &[usize]) -> View<'a, T> {
        View { mem: Mem::Host(mem), layout: Layout::contiguous(shape) }
    }
    /// A contiguous `shape` over `len` elements of device memory at `addr`.
    ///
    /// # Safety
    /// `addr` must be an allocation of the [`FlashAttn`]'s CUDA context holding `len`
    /// initialised elements of `T`, valid and not written by other work until the call's
    /// kernels are done (they are queued on [`FlashAttn::cuda_stream`]).
    pub unsafe fn from_raw(addr: u64, len: usize, shape: &[usize]) -> View<'a, T> {
        View { mem: Mem::Raw(addr, len), layout: Layout::contiguous(shape) }
    }
    /// Another layout over the same memory.
    fn piece(&self, layout: Layout) -> View<'a, T> {
        View { mem: self.mem.clone(), layout }
    }
    layout_methods!();
}

impl<'a, T> ViewMut<'a, T> {
    /// A contiguous `shape` over the start of the caller's cudarc memory (`CudaSlice` or
    /// `CudaViewMut`), borrowed mutably: no copy.
    pub fn cuda(mem: &'a mut (impl DevicePtr<T> + DevicePtrMut<T>), shape: &[usize]) -> ViewMut<'a, T> {
        let mem: &'a mut (dyn DeviceMem<T> + 'a) = mem;
        ViewMut { mem: MemMut::Cuda(NonNull::from(mem)), layout: Layout::contiguous(shape), _borrow: PhantomData }
    }
    /// A contiguous `shape` over host memory, for the emulator.
    pub fn host(mem: &'a mut [T], shape: &[usize]) -> ViewMut<'a, T> {
        let len = mem.len();
        ViewMut { mem: MemMut::Host(NonNull::from(mem).cast(), len), layout: Layout::contiguous(shape), _borrow: PhantomData }
    }
    /// A contiguous `shape` over `len` elements of device memory at `addr`.
    ///
    /// # Safety
    /// `addr` must be an allocation of the [`FlashAttn`]'s CUDA context holding `len`
    /// elements of `T` that nothing else reads or writes until the call's kernels are done.
    pub unsafe fn from_raw(addr: u64, len: usize, shape: &[usize]) -> ViewMut<'a, T> {
        ViewMut { mem: MemMut::Raw(addr, len), layout: Layout::contiguous(shape), _borrow: PhantomData }
    }
    /// The same memory and layout, to read (e.g. the forward's O and LSE for its backward).
    /// Other pieces of the same memory may still be written: a call that reads this one and
    /// writes another checks that they share no element.
    pub fn into_view(self) -> View<'a, T> {
        View { mem: Mem::Mut(self.mem), layout: self.layout }
    }
    /// The same memory and layout read while `self` is borrowed (the KV cache's checks
    /// before its append writes it).
    pub(crate) fn reader(&self) -> View<'_, T> {
        View { mem: Mem::Mut(self.mem), layout: self.layout.clone() }
    }
    /// Another layout over the same memory. Only the methods that consume `self` make pieces,
    /// so the borrow is the pieces' alone (the elements they write are checked apart when a
    /// call takes several, [`check_no_overlap`](crate::forward::check_no_overlap)).
    fn piece(&self, layout: Layout) -> ViewMut<'a, T> {
        ViewMut { mem: self.mem, layout, _borrow: PhantomData }
    }
    /// Which memory it is in.
    pub(crate) fn key(&self) -> Option<MemKey> {
        self.mem.key()
    }
    layout_methods!();
}

impl<T> std::fmt::Debug for View<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "View<{}>{:?} strides {:?} at {}", std::any::type_name::<T>(), self.layout.shape, self.layout.strides, self.layout.offset)
    }
}

impl<T> std::fmt::Debug for ViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ViewMut<{}>{:?} strides {:?} at {}",
            std::any::type_name::<T>(),
            self.layout.shape,
            self.layout.strides,
            self.layout.offset
        )
    }
}

/// A view as a launch sees it: the address of its memory's start, its length, and its layout.
/// The memory stays bound for `'s` (its stream-order record is in the call's [`Binds`]).
pub(crate) struct Bound<'s> {
    pub(crate) name: &'static str,
    /// Device (or emulator host) address of the memory's start.
    base: u64,
    /// Elements in the memory from `base`.
    len: usize,
    elem: usize,
    pub(crate) layout: Layout,
    pub(crate) writable: bool,
    _mem: PhantomData<&'s ()>,
}

/// Which memory a bound view is: compared between a forward and its backward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ViewId {
    addr: u64,
    layout: Layout,
}

impl Bound<'_> {
    /// Address of the first element.
    pub(crate) fn addr(&self) -> u64 {
        self.base + (self.layout.offset * self.elem) as u64
    }
    /// Bytes from the first element to the end of the last one (0 for none).
    pub(crate) fn span(&self) -> usize {
        match self.layout.shape.contains(&0) {
            true => 0,
            false => (self.layout.last().unwrap_or(0) - self.layout.offset + 1) * self.elem,
        }
    }
    pub(crate) fn id(&self) -> ViewId {
        ViewId { addr: self.base, layout: self.layout.clone() }
    }
    /// The kernels' element strides (batch, row, head) of a [batch, seq, heads, d] view, or
    /// of a variable-length batch's packed [total, heads, d] one (batch 0).
    pub(crate) fn strides4(&self) -> flashattn_kernels::params::Strides {
        let s = &self.layout.strides;
        match s.len() {
            3 => flashattn_kernels::params::Strides { batch: 0, row: s[0] as u64, head: s[1] as u64 },
            _ => flashattn_kernels::params::Strides { batch: s[0] as u64, row: s[1] as u64, head: s[2] as u64 },
        }
    }
    /// The kernels' strides of LSE's [batch, heads, seq] view: (batch, 1, head); of a
    /// variable-length batch's packed [heads, total_q]: (0, 1, head).
    pub(crate) fn lse_strides(&self) -> flashattn_kernels::params::Strides {
        let s = &self.layout.strides;
        match s.len() {
            2 => flashattn_kernels::params::Strides { batch: 0, row: 1, head: s[0] as u64 },
            _ => flashattn_kernels::params::Strides { batch: s[0] as u64, row: 1, head: s[1] as u64 },
        }
    }
    /// Rows `rows` of a [rows, heads, head_dim] view (head_dim contiguous) as 2-D blocks
    /// (address, pitch, width in bytes, height): one when its heads are contiguous in a row,
    /// else one per head.
    pub(crate) fn row_blocks(&self, rows: std::ops::Range<usize>) -> Vec<(u64, usize, usize, usize)> {
        let (sh, st, e) = (&self.layout.shape, &self.layout.strides, self.elem);
        let (heads, d) = (sh[1], sh[2]);
        let start = self.addr() + (rows.start * st[0] * e) as u64;
        match heads == 1 || st[1] == d {
            true => vec![(start, st[0] * e, heads * d * e, rows.len())],
            false => (0..heads).map(|h| (start + (h * st[1] * e) as u64, st[0] * e, d * e, rows.len())).collect(),
        }
    }
    pub(crate) fn region(&self) -> flashattn_kernels::dev::emu::GlobalRegion {
        flashattn_kernels::dev::emu::GlobalRegion { start: self.addr() as usize, len: self.span(), writable: self.writable }
    }
}

/// One call's bound memories. A call binds each memory its views are in once, however many
/// of its views are in it (the pieces of one packed buffer; a view read and a view written
/// of one [`ViewMut`]'s memory): mutably when one of its outputs is in it, else shared. So a
/// call never makes two references to one `Tensor`, cudarc buffer or host slice at once,
/// and each memory's cudarc stream-order record (`SyncOnDrop`: wait on the memory's pending
/// work when bound, record this call's when dropped) is taken once and kept here until the
/// call's launches are queued. Declare it after the views it binds and keep it to the end
/// of the call.
pub(crate) struct Binds<'s> {
    /// The memories of the call's outputs, each with the output's name.
    written: Vec<(MemKey, &'static str)>,
    /// The memories bound so far: the name of the view that bound it, whether mutably, the
    /// address of its start and its elements.
    bound: Vec<(MemKey, &'static str, bool, u64, usize)>,
    orders: Vec<SyncOnDrop<'s>>,
}

impl<'s> Binds<'s> {
    /// Bindings for a call that writes `outputs` (each named, with its [`MemKey`]): given
    /// before any view is bound.
    pub(crate) fn new(outputs: &[(&'static str, Option<MemKey>)]) -> Binds<'s> {
        let written = outputs.iter().filter_map(|&(name, key)| Some((key?, name))).collect();
        Binds { written, bound: Vec::new(), orders: Vec::new() }
    }
    /// The memory `key` when bound already: (the view that bound it, mutably, base, len).
    fn find(&self, key: Option<MemKey>) -> Option<(&'static str, bool, u64, usize)> {
        let key = key?;
        self.bound.iter().find(|b| b.0 == key).map(|&(_, name, write, base, len)| (name, write, base, len))
    }
    /// The output that writes the memory `key`, if any.
    fn writer(&self, key: Option<MemKey>) -> Option<&'static str> {
        let key = key?;
        self.written.iter().find(|w| w.0 == key).map(|w| w.1)
    }
    fn add(
        &mut self,
        key: Option<MemKey>,
        name: &'static str,
        write: bool,
        (base, len, order): (u64, usize, Option<SyncOnDrop<'s>>),
    ) -> (u64, usize) {
        if let Some(key) = key {
            self.bound.push((key, name, write, base, len));
        }
        self.orders.extend(order);
        (base, len)
    }
}

impl<'a, T> MemMut<'a, T> {
    /// The memory's start address and length for a launch on `fa`, and cudarc's record, made
    /// through a reference to it for `'s`: `&mut` to write, `&` to read.
    ///
    /// # Safety
    /// No other reference to the memory may be made or used during `'s` (a call binds each
    /// memory once, [`Binds`]). The pointer comes from an `&'a mut` that the view holding it
    /// keeps (with its pieces) for `'a`, and `'a: 's`.
    unsafe fn bind<'s>(self, fa: &'s FlashAttn, name: &'static str, write: bool) -> Result<(u64, usize, Option<SyncOnDrop<'s>>)>
    where
        'a: 's,
        T: 's,
    {
        let stream = fa.stream();
        Ok(match (self, &fa.backend, stream) {
            (MemMut::Tensor(t), _, _) if write => {
                // SAFETY: the caller's contract.
                let t: &'s mut Tensor<T> = unsafe { &mut *t.as_ptr() };
                fa.check_owner(t, name)?;
                tensor_ptr_mut(t, stream)
            }
            (MemMut::Tensor(t), _, _) => {
                // SAFETY: the caller's contract.
                let t: &'s Tensor<T> = unsafe { &*t.as_ptr() };
                fa.check_owner(t, name)?;
                tensor_ptr(t, stream)
            }
            (MemMut::Cuda(m), Backend::Cuda(c), Some(st)) if write => {
                // SAFETY: the caller's contract.
                let m: &'s mut (dyn DeviceMem<T> + 'a) = unsafe { &mut *m.as_ptr() };
                if !std::sync::Arc::ptr_eq(m.stream().context(), &c.ctx) {
                    return Err(Error::WrongDevice { tensor: name });
                }
                let len = m.len();
                let (p, order) = m.device_ptr_mut(st);
                (p, len, Some(order))
            }
            (MemMut::Cuda(m), Backend::Cuda(c), Some(st)) => {
                // SAFETY: the caller's contract.
                let m: &'s (dyn DeviceMem<T> + 'a) = unsafe { &*m.as_ptr() };
                if !std::sync::Arc::ptr_eq(m.stream().context(), &c.ctx) {
                    return Err(Error::WrongDevice { tensor: name });
                }
                let (p, order) = m.device_ptr(st);
                (p, m.len(), Some(order))
            }
            (MemMut::Raw(a, n), Backend::Cuda(_), _) => (a, n, None),
            // No reference is made: the emulator reaches host memory by address.
            (MemMut::Host(p, n), Backend::Emulator, _) => (p.as_ptr() as u64, n, None),
            _ => return Err(Error::WrongDevice { tensor: name }),
        })
    }
}

impl FlashAttn {
    /// Binds a view for a launch on this device: its memory must be this device's. A memory
    /// that an output of the call writes is bound mutably, through the view when it is the
    /// first of that memory ([`Binds`]).
    pub(crate) fn bind<'s, T>(&'s self, binds: &mut Binds<'s>, name: &'static str, v: &'s View<'_, T>) -> Result<Bound<'s>> {
        let key = v.mem.key();
        let (base, len) = match binds.find(key) {
            Some((_, _, base, len)) => (base, len),
            None => {
                let writer = binds.writer(key);
                let bound = match (&v.mem, writer) {
                    // SAFETY: the memory came from an `&mut` that `v` (with the other pieces of
                    // its view) holds for longer than 's; this is the call's one binding of it.
                    (Mem::Mut(m), _) => unsafe { m.bind(self, name, writer.is_some()) }?,
                    // A memory borrowed shared that an output writes: not possible through
                    // the borrows views hold; refused rather than bound twice.
                    (_, Some(output)) => return Err(Error::Overlap { output, other: name }),
                    (Mem::Tensor(t), None) => {
                        self.check_owner(t, name)?;
                        tensor_ptr(t, self.stream())
                    }
                    (Mem::Cuda(m), None) => match (&self.backend, self.stream()) {
                        (Backend::Cuda(c), Some(st)) if std::sync::Arc::ptr_eq(m.stream().context(), &c.ctx) => {
                            let (p, order) = m.device_ptr(st);
                            (p, m.len(), Some(order))
                        }
                        _ => return Err(Error::WrongDevice { tensor: name }),
                    },
                    (Mem::Raw(a, n), None) if matches!(self.backend, Backend::Cuda(_)) => (*a, *n, None),
                    (Mem::Host(h), None) if matches!(self.backend, Backend::Emulator) => (h.as_ptr() as u64, h.len(), None),
                    _ => return Err(Error::WrongDevice { tensor: name }),
                };
                binds.add(key, name, writer.is_some(), bound)
            }
        };
        Ok(Bound { name, base, len, elem: std::mem::size_of::<T>(), layout: v.layout.clone(), writable: false, _mem: PhantomData })
    }

    /// Binds an input view and checks it ([`check`]).
    pub(crate) fn bind_input<'s, T>(
        &'s self,
        binds: &mut Binds<'s>,
        name: &'static str,
        v: &'s View<'_, T>,
        expected: &[usize],
        align: usize,
    ) -> Result<Bound<'s>> {
        let b = self.bind(binds, name, v)?;
        check(&b, expected, align, false)?;
        Ok(b)
    }

    /// Binds a view to write: its memory mutably, once per call ([`Binds`]).
    pub(crate) fn bind_mut<'s, T>(&'s self, binds: &mut Binds<'s>, name: &'static str, v: &'s mut ViewMut<'_, T>) -> Result<Bound<'s>> {
        let key = v.mem.key();
        let (base, len) = match binds.find(key) {
            Some((_, true, base, len)) => (base, len),
            // Bound shared by a view read before: the call did not name this output to
            // `Binds::new`. Refused rather than bound a second time.
            Some((other, false, ..)) => return Err(Error::Overlap { output: name, other }),
            // SAFETY: the memory came from an `&mut` that `v` (with the other pieces of its
            // view) holds for longer than 's; this is the call's one binding of it.
            None => binds.add(key, name, true, unsafe { v.mem.bind(self, name, true) }?),
        };
        Ok(Bound { name, base, len, elem: std::mem::size_of::<T>(), layout: v.layout.clone(), writable: true, _mem: PhantomData })
    }
}

fn tensor_ptr<'s, T>(t: &'s Tensor<T>, stream: Option<&'s CudaStream>) -> (u64, usize, Option<SyncOnDrop<'s>>) {
    match (&t.storage, stream) {
        (Storage::Cuda(s), Some(st)) => {
            let (p, order) = s.device_ptr(st);
            (p, s.len(), Some(order))
        }
        (Storage::Host(h), _) => (h.as_slice().as_ptr() as u64, h.as_slice().len(), None),
        (Storage::Cuda(s), None) => (0, s.len(), None),
    }
}

fn tensor_ptr_mut<'s, T>(t: &'s mut Tensor<T>, stream: Option<&'s CudaStream>) -> (u64, usize, Option<SyncOnDrop<'s>>) {
    match (&mut t.storage, stream) {
        (Storage::Cuda(s), Some(st)) => {
            let len = s.len();
            let (p, order) = s.device_ptr_mut(st);
            (p, len, Some(order))
        }
        (Storage::Host(h), _) => {
            let len = h.as_slice().len();
            (h.as_mut_ptr() as u64, len, None)
        }
        (Storage::Cuda(s), None) => (0, s.len(), None),
    }
}

/// Checks a bound view against the shape the call needs (`expected`; its rank too) and the
/// kernels' rules: the last stride 1; every element inside the memory (offsets without
/// overflow); row and head strides below 2^32; rows aligned as a contiguous tensor's would be
/// (`align` bytes: 16 when a 16-bit row of head_dim is a multiple of 16 bytes, else the
/// largest power of two dividing the row's bytes) at the first element and at every stride of
/// a dimension longer than 1.
pub(crate) fn check(b: &Bound<'_>, expected: &[usize], align: usize, output: bool) -> Result<()> {
    let l = &b.layout;
    if l.shape != expected {
        return Err(match output {
            true => Error::OutputShape { tensor: b.name, expected: expected.to_vec(), got: l.shape.clone() },
            false => Error::InputShape { tensor: b.name, expected: expected.to_vec(), got: l.shape.clone() },
        });
    }
    let layout_err = |why: String| Error::Layout { tensor: b.name, shape: l.shape.clone(), strides: l.strides.clone(), why };
    if l.strides.len() != l.shape.len() {
        return Err(layout_err(format!("{} strides for {} dimensions", l.strides.len(), l.shape.len())));
    }
    if l.strides.last() != Some(&1) {
        return Err(layout_err("the last dimension must be contiguous (stride 1)".into()));
    }
    if l.shape.len() >= 3 {
        for (i, &s) in l.strides[..l.shape.len() - 1].iter().enumerate().skip(1) {
            if s > u32::MAX as usize {
                return Err(layout_err(format!("stride {s} of dimension {i} is above 2^32 - 1")));
            }
        }
    }
    let last = l.last().ok_or_else(|| layout_err("element offsets overflow".into()))?;
    let bytes = last.checked_add(1).and_then(|n| n.checked_mul(b.elem)).filter(|&n| n <= isize::MAX as usize);
    if bytes.is_none() || last >= b.len {
        return Err(Error::OutOfBounds { tensor: b.name, needed: last.saturating_add(1), len: b.len });
    }
    let addr = b.addr();
    if !addr.is_multiple_of(align as u64) {
        return Err(Error::Misaligned { tensor: b.name, what: "address of the first element", value: addr as usize, align });
    }
    let outer = l.shape.len().saturating_sub(1);
    for (i, (&n, &s)) in l.shape.iter().zip(&l.strides).take(outer).enumerate() {
        if n > 1 && !(s * b.elem).is_multiple_of(align) {
            let what = match (outer, i) {
                (3, 0) | (2, 0) => "batch stride (bytes)",
                (3, 1) => "sequence stride (bytes)",
                _ => "head stride (bytes)",
            };
            return Err(Error::Misaligned { tensor: b.name, what, value: s * b.elem, align });
        }
    }
    Ok(())
}

/// The alignment rows of `head_dim` elements of `elem` bytes have in a contiguous tensor, as
/// the kernels' vector loads assume: the largest power of two dividing the row's bytes, at most 16.
pub(crate) fn row_align(head_dim: usize, elem: usize) -> usize {
    let bytes = head_dim * elem;
    (1usize << bytes.trailing_zeros()).min(16)
}

/// Whether two bound views share an element. Views whose spans are apart never do; views
/// with the same strides (the packed QKV case: one buffer, interleaved heads; their shapes
/// may differ, as GQA's Q and K heads do) are compared exactly when their strides nest (each
/// at least the extent of the ones below it); any other overlap of spans counts as sharing.
pub(crate) fn overlap(a: &Bound<'_>, b: &Bound<'_>) -> bool {
    let (sa, sb) = (a.span(), b.span());
    if sa == 0 || sb == 0 {
        return false;
    }
    let (a0, b0) = (a.addr(), b.addr());
    if a0 + sa as u64 <= b0 || b0 + sb as u64 <= a0 {
        return false;
    }
    let (la, lb) = (&a.layout, &b.layout);
    if a.elem != b.elem || la.strides != lb.strides || la.shape.len() != lb.shape.len() || la.strides.len() != la.shape.len() {
        return true;
    }
    let diff = a0 as i128 - b0 as i128;
    if diff % a.elem as i128 != 0 {
        return true;
    }
    // Dimensions (size in a, size in b, stride) by decreasing stride; nested when each stride
    // covers the extent below it in either view. A stride of 0 repeats elements: sharing.
    let mut dims: Vec<(usize, usize, usize)> =
        la.shape.iter().zip(&lb.shape).zip(&la.strides).map(|((&na, &nb), &s)| (na, nb, s)).filter(|&(na, nb, _)| na.max(nb) > 1).collect();
    dims.sort_by_key(|&(_, _, s)| std::cmp::Reverse(s));
    let nested = dims.windows(2).all(|w| w[0].2 >= w[1].2 * w[1].0.max(w[1].1)) && dims.iter().all(|d| d.2 > 0);
    if !nested {
        return true;
    }
    // An element of both: a0 + sum i_k s_k = b0 + sum j_k s_k, i.e. (a0 - b0) / elem =
    // sum c_k s_k with c_k = j_k - i_k in [1 - na_k, nb_k - 1]. With nested strides the lower
    // dimensions reach less than s_k either way, so c_k is one of two values per level.
    fn reach(rest: i128, dims: &[(usize, usize, usize)]) -> bool {
        let Some((&(na, nb, s), below)) = dims.split_first() else { return rest == 0 };
        let c0 = rest.div_euclid(s as i128);
        [c0, c0 + 1].into_iter().any(|c| c > -(na as i128) && c < nb as i128 && reach(rest - c * s as i128, below))
    }
    reach(diff / a.elem as i128, &dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(base: u64, shape: &[usize], strides: &[usize], offset: usize) -> Bound<'static> {
        let layout = Layout { shape: shape.to_vec(), strides: strides.to_vec(), offset };
        Bound { name: "t", base, len: usize::MAX / 4, elem: 2, layout, writable: true, _mem: PhantomData }
    }

    #[test]
    fn packed_heads_do_not_overlap() {
        // [b, s, 3, h, d] = [2, 5, 3, 4, 8]: Q, K, V views 32 elements apart.
        let (s, h, d) = (5, 4, 8);
        let st = [s * 3 * h * d, 3 * h * d, d, 1];
        let v = |i: usize| bound(4096, &[2, s, h, d], &st, i * h * d);
        assert!(!overlap(&v(0), &v(1)) && !overlap(&v(1), &v(2)) && !overlap(&v(0), &v(2)));
        assert!(overlap(&v(1), &v(1)));
        // Shifted by one head: shares elements.
        assert!(overlap(&v(0), &bound(4096, &[2, s, h, d], &st, d)));
        // Shifted by one element: shares elements (column 1 of one is column 0 of the other).
        assert!(overlap(&v(0), &bound(4096, &[2, s, h, d], &st, 1)));
    }

    #[test]
    fn disjoint_spans_and_other_layouts() {
        let a = bound(0, &[1, 4, 2, 8], &[64, 16, 8, 1], 0);
        assert!(!overlap(&a, &bound(128, &[1, 4, 2, 8], &[64, 16, 8, 1], 0)));
        assert!(overlap(&a, &bound(126, &[1, 4, 2, 8], &[64, 16, 8, 1], 0)));
        // Interleaved with other strides: counted as sharing (not decided exactly).
        assert!(overlap(&a, &bound(16, &[1, 2, 2, 8], &[64, 32, 8, 1], 0)));
        // Empty views share nothing.
        assert!(!overlap(&a, &bound(0, &[1, 0, 2, 8], &[64, 16, 8, 1], 0)));
    }

    #[test]
    fn strides_are_checked() {
        let ok = bound(0, &[2, 3, 4, 8], &[96, 32, 8, 1], 0);
        assert!(check(&ok, &[2, 3, 4, 8], 16, false).is_ok());
        // [b, h, s, d] memory: also fine.
        assert!(check(&bound(0, &[2, 3, 4, 8], &[96, 8, 24, 1], 0), &[2, 3, 4, 8], 16, false).is_ok());
        let e = check(&bound(0, &[2, 3, 4, 8], &[96, 32, 8, 2], 0), &[2, 3, 4, 8], 16, false).unwrap_err();
        assert!(matches!(e, Error::Layout { .. }), "{e}");
        let e = check(&bound(2, &[2, 3, 4, 8], &[96, 32, 8, 1], 0), &[2, 3, 4, 8], 16, false).unwrap_err();
        assert!(matches!(e, Error::Misaligned { value: 2, align: 16, .. }), "{e}");
        let huge = bound(0, &[2, 3, 4, 8], &[usize::MAX / 2, 32, 8, 1], 0);
        assert!(matches!(check(&huge, &[2, 3, 4, 8], 16, false), Err(Error::OutOfBounds { .. })));
        let wide = bound(0, &[2, 3, 4, 8], &[96, 1 << 33, 8, 1], 0);
        assert!(matches!(check(&wide, &[2, 3, 4, 8], 16, false), Err(Error::Layout { .. })));
        let mut short = bound(0, &[2, 3, 4, 8], &[96, 32, 8, 1], 0);
        short.len = 191;
        assert!(matches!(check(&short, &[2, 3, 4, 8], 16, false), Err(Error::OutOfBounds { needed: 192, len: 191, .. })));
    }
    #[test]
    fn packed_gqa_heads_do_not_overlap() {
        // [b, s, hq + 2 hkv, d] = [2, 5, 4 + 2 * 2, 8]: Q (4 heads), K and V (2 each).
        let (s, hq, hkv, d) = (5, 4, 2, 8);
        let st = [s * (hq + 2 * hkv) * d, (hq + 2 * hkv) * d, d, 1];
        let q = bound(4096, &[2, s, hq, d], &st, 0);
        let k = bound(4096, &[2, s, hkv, d], &st, hq * d);
        let v = bound(4096, &[2, s, hkv, d], &st, (hq + hkv) * d);
        for (a, b) in [(&q, &k), (&k, &q), (&q, &v), (&v, &q), (&k, &v), (&v, &k)] {
            assert!(!overlap(a, b));
        }
        // Q one head wider reaches K's first head, from either side.
        let wide = bound(4096, &[2, s, hq + 1, d], &st, 0);
        assert!(overlap(&wide, &k) && overlap(&k, &wide));
        // K shifted back by one head shares Q's last.
        assert!(overlap(&q, &bound(4096, &[2, s, hkv, d], &st, (hq - 1) * d)));
    }

    #[test]
    fn zero_strides_overlap_without_panicking() {
        let a = bound(0, &[2, 3, 4, 8], &[0, 32, 8, 1], 0);
        assert!(overlap(&a, &bound(0, &[2, 3, 4, 8], &[0, 32, 8, 1], 0)));
        assert!(overlap(&a, &bound(64, &[2, 3, 4, 8], &[0, 32, 8, 1], 0)));
    }

    #[test]
    fn sub_view_layouts() {
        let (b, s, h, d) = (2, 5, 4, 8);
        let mut buf = vec![0u16; b * s * 3 * h * d];
        let packed = ViewMut::host(&mut buf, &[b, s, 3, h, d]);
        let [q, k, v] = packed.unbind::<3>(2).unwrap();
        for (i, p) in [&q, &k, &v].into_iter().enumerate() {
            assert_eq!((p.shape(), p.strides(), p.offset()), (&[b, s, h, d][..], &[s * 3 * h * d, 3 * h * d, d, 1][..], i * h * d));
        }
        // narrow keeps the dimension; split_at is two narrows; offsets add up.
        let n = q.narrow(1, 2, 3).unwrap();
        assert_eq!((n.shape(), n.strides(), n.offset()), (&[b, 3, h, d][..], &[s * 3 * h * d, 3 * h * d, d, 1][..], 2 * 3 * h * d));
        let (lo, hi) = n.split_at(2, 1).unwrap();
        assert_eq!((lo.shape(), lo.offset()), (&[b, 3, 1, d][..], 2 * 3 * h * d));
        assert_eq!((hi.shape(), hi.offset()), (&[b, 3, h - 1, d][..], 2 * 3 * h * d + d));
        // Empty pieces at either end.
        let (none, all) = hi.split_at(0, 0).unwrap();
        assert_eq!((none.shape()[0], all.shape()[0], all.offset()), (0, b, 2 * 3 * h * d + d));
        // The same on a read-only view; unbinding an outer dimension of rank 2.
        let data = vec![0u16; 12];
        let [r0, r1, r2] = View::host(&data, &[3, 4]).unbind::<3>(0).unwrap();
        assert_eq!((r0.shape(), r1.offset(), r2.offset(), r2.strides()), (&[4][..], 4, 8, &[1][..]));
        let g = View::host(&data, &[3, 4]).narrow(1, 1, 2).unwrap();
        assert_eq!((g.shape(), g.strides(), g.offset()), (&[3, 2][..], &[4, 1][..], 1));
    }

    #[test]
    fn sub_view_errors() {
        let data = vec![0u16; 2 * 3 * 4];
        let v = || View::host(&data, &[2, 3, 4]);
        let sub = |e: Error| match e {
            Error::SubView { op, shape, dim, why } => (op, shape, dim, why),
            e => panic!("not a SubView error: {e}"),
        };
        let (op, shape, dim, why) = sub(v().narrow(3, 0, 1).unwrap_err());
        assert_eq!((op, shape, dim), ("narrow", vec![2, 3, 4], 3));
        assert!(why.contains("3 dimensions"), "{why}");
        let (op, _, dim, why) = sub(v().narrow(1, 2, 2).unwrap_err());
        assert!(op == "narrow" && dim == 1 && why.contains("start 2 + length 2") && why.contains("size 3"), "{why}");
        let (_, _, _, why) = sub(v().narrow(1, usize::MAX, 2).unwrap_err());
        assert!(why.contains("past its size 3"), "{why}");
        let (op, _, dim, why) = sub(v().split_at(0, 3).unwrap_err());
        assert!(op == "split_at" && dim == 0 && why.contains("mid 3") && why.contains("size 2"), "{why}");
        let (op, _, dim, _) = sub(v().split_at(5, 0).unwrap_err());
        assert_eq!((op, dim), ("split_at", 5));
        let (op, _, dim, why) = sub(v().unbind::<2>(1).unwrap_err());
        assert!(op == "unbind" && dim == 1 && why.contains("size is 3, not the 2"), "{why}");
        let (_, _, dim, why) = sub(v().unbind::<4>(2).unwrap_err());
        assert!(dim == 2 && why.contains("last dimension"), "{why}");
        let (_, _, dim, _) = sub(v().unbind::<2>(3).unwrap_err());
        assert_eq!(dim, 3);
        // A view whose strides do not match its shape (strided() takes anything).
        let (_, _, _, why) = sub(v().strided(&[2, 3, 4], &[12, 1], 0).narrow(0, 0, 1).unwrap_err());
        assert!(why.contains("2 strides"), "{why}");
        // Offsets that overflow.
        let huge = v().strided(&[2, 3, 4], &[1 << (usize::BITS - 1), 4, 1], 1 << (usize::BITS - 1));
        let (_, _, _, why) = sub(huge.narrow(0, 1, 1).unwrap_err());
        assert!(why.contains("offset of 1 overflows"), "{why}");
        let far = View::host(&data, &[3, 4]).strided(&[3, 4], &[1 << (usize::BITS - 1), 1], 0);
        let (_, _, _, why) = sub(far.unbind::<3>(0).unwrap_err());
        assert!(why.contains("piece 2 overflows"), "{why}");
        // The message names the values.
        let e = View::host(&data, &[2, 3, 4]).unbind::<3>(0).unwrap_err().to_string();
        assert!(e.contains("unbind") && e.contains("[2, 3, 4]") && e.contains("dimension 0") && e.contains("size is 2, not the 3"), "{e}");
    }

    /// Pieces of one memory in one call are bound once: mutably when one of them is written,
    /// through whichever piece comes first (a piece read included).
    #[test]
    fn pieces_of_one_memory_are_bound_once() {
        let fa = FlashAttn::emulator();
        let mut dqkv = fa.full(half::f16::ZERO, &[2, 5, 3, 4, 8]).unwrap();
        let mut other = fa.full(half::f16::ZERO, &[8]).unwrap();
        let [dq, mut dk, mut dv] = dqkv.view_mut().unbind::<3>(2).unwrap();
        let read = dq.into_view();
        let mut out = other.view_mut();
        let mut binds = Binds::new(&[("dk", dk.key()), ("dv", dv.key()), ("out", out.key())]);
        let r = fa.bind(&mut binds, "dq", &read).unwrap();
        let k = fa.bind_mut(&mut binds, "dk", &mut dk).unwrap();
        let v = fa.bind_mut(&mut binds, "dv", &mut dv).unwrap();
        let o = fa.bind_mut(&mut binds, "out", &mut out).unwrap();
        assert_eq!(binds.bound.len(), 2, "one binding per memory");
        assert!(binds.bound[0].2, "bound mutably, as dK and dV write it");
        assert_eq!((r.base, k.base), (v.base, v.base));
        assert_ne!(o.base, v.base);
        assert_eq!((r.addr(), k.addr(), v.addr()), (r.base, r.base + 2 * 32, r.base + 4 * 32));
        assert!(!overlap(&r, &k) && !overlap(&k, &v) && !overlap(&r, &v));
        // Host memory, and a memory only read: bound once, shared.
        let mut host = vec![0u16; 64];
        let (a, b) = ViewMut::host(&mut host, &[64]).split_at(0, 32).unwrap();
        let (a, b) = (a.into_view(), b.into_view());
        let mut binds = Binds::new(&[]);
        let (ba, bb) = (fa.bind(&mut binds, "a", &a).unwrap(), fa.bind(&mut binds, "b", &b).unwrap());
        assert_eq!((binds.bound.len(), binds.bound[0].2), (1, false));
        assert_eq!(bb.addr(), ba.addr() + 64);
    }
}
