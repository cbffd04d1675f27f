//! Views: what a call reads and writes. A view is a shape with element strides (the last
//! dimension contiguous) over memory that a [`Tensor`] or the caller owns: a cudarc
//! `CudaSlice`/`CudaView` (borrowed, no copy), a raw device pointer (`unsafe`), or on the
//! emulator a host slice. Strided views take packed QKV `[b, s, 3, h, d]`, PyTorch's
//! `[b, h, s, d]` and slices of larger buffers as they are.
//!
//! Views are checked when a call takes them ([`check`]), before anything is launched: shape,
//! strides, the memory they reach, alignment, the device that owns the memory, and (for
//! outputs) overlap with the call's other tensors.

use crate::device::{Backend, FlashAttn, Storage, Tensor};
use crate::error::{Error, Result};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

/// Memory a [`View`] reads.
enum Mem<'a, T> {
    Tensor(&'a Tensor<T>),
    Cuda(&'a dyn DevicePtr<T>),
    /// Device memory by address and length in elements (the caller's contract).
    Raw(u64, usize),
    Host(&'a [T]),
}

/// Device memory that can be read and written: `CudaSlice`, `CudaViewMut`.
trait DeviceMem<T>: DevicePtr<T> + DevicePtrMut<T> {}
impl<T, M: DevicePtr<T> + DevicePtrMut<T>> DeviceMem<T> for M {}

/// Memory a [`ViewMut`] writes. The cudarc case is a pointer from an `&'a mut` (so that
/// `ViewMut` is covariant in `'a`, as `&'a mut` is, and views borrowed at different times can
/// go into one call).
enum MemMut<'a, T> {
    Tensor(&'a mut Tensor<T>),
    Cuda(std::ptr::NonNull<dyn DeviceMem<T> + 'a>, std::marker::PhantomData<&'a mut ()>),
    Raw(u64, usize),
    Host(&'a mut [T]),
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
/// Cheap to make; checked when a call takes it.
pub struct View<'a, T> {
    mem: Mem<'a, T>,
    layout: Layout,
}

/// A view a call writes (an output, a gradient, the backward's workspace).
pub struct ViewMut<'a, T> {
    mem: MemMut<'a, T>,
    layout: Layout,
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
        let mem = match &self.mem {
            Mem::Tensor(t) => Mem::Tensor(*t),
            Mem::Cuda(c) => Mem::Cuda(*c),
            Mem::Raw(a, n) => Mem::Raw(*a, *n),
            Mem::Host(h) => Mem::Host(h),
        };
        View { mem, layout: self.layout.clone() }
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
        ViewMut { mem: MemMut::Tensor(self), layout }
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
    layout_methods!();
}

impl<'a, T> ViewMut<'a, T> {
    /// A contiguous `shape` over the start of the caller's cudarc memory (`CudaSlice` or
    /// `CudaViewMut`), borrowed mutably: no copy.
    pub fn cuda(mem: &'a mut (impl DevicePtr<T> + DevicePtrMut<T>), shape: &[usize]) -> ViewMut<'a, T> {
        let mem: &'a mut (dyn DeviceMem<T> + 'a) = mem;
        ViewMut { mem: MemMut::Cuda(std::ptr::NonNull::from(mem), std::marker::PhantomData), layout: Layout::contiguous(shape) }
    }
    /// A contiguous `shape` over host memory, for the emulator.
    pub fn host(mem: &'a mut [T], shape: &[usize]) -> ViewMut<'a, T> {
        ViewMut { mem: MemMut::Host(mem), layout: Layout::contiguous(shape) }
    }
    /// A contiguous `shape` over `len` elements of device memory at `addr`.
    ///
    /// # Safety
    /// `addr` must be an allocation of the [`FlashAttn`]'s CUDA context holding `len`
    /// elements of `T` that nothing else reads or writes until the call's kernels are done.
    pub unsafe fn from_raw(addr: u64, len: usize, shape: &[usize]) -> ViewMut<'a, T> {
        ViewMut { mem: MemMut::Raw(addr, len), layout: Layout::contiguous(shape) }
    }
    /// The same memory and layout, to read (e.g. the forward's O and LSE for its backward).
    pub fn into_view(self) -> View<'a, T> {
        let mem = match self.mem {
            MemMut::Tensor(t) => Mem::Tensor(t),
            // SAFETY: the pointer came from an `&'a mut` this view holds exclusively.
            MemMut::Cuda(c, _) => Mem::Cuda(unsafe { c.as_ref() }),
            MemMut::Raw(a, n) => Mem::Raw(a, n),
            MemMut::Host(h) => Mem::Host(h),
        };
        View { mem, layout: self.layout }
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

/// A view as a launch sees it: the address of its first element, the bytes it spans from
/// there, its layout, and cudarc's stream-order record (kept until the launch is queued).
pub(crate) struct Bound<'s> {
    pub(crate) name: &'static str,
    /// Device (or emulator host) address of the memory's start.
    base: u64,
    /// Elements in the memory from `base`.
    len: usize,
    elem: usize,
    pub(crate) layout: Layout,
    pub(crate) writable: bool,
    _order: Option<SyncOnDrop<'s>>,
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
    /// The kernels' element strides (batch, row, head) of a [batch, seq, heads, d] view.
    pub(crate) fn strides4(&self) -> flashattn_kernels::params::Strides {
        let s = &self.layout.strides;
        flashattn_kernels::params::Strides { batch: s[0] as u64, row: s[1] as u64, head: s[2] as u64 }
    }
    /// The kernels' strides of LSE's [batch, heads, seq] view: (batch, 1, head).
    pub(crate) fn lse_strides(&self) -> flashattn_kernels::params::Strides {
        let s = &self.layout.strides;
        flashattn_kernels::params::Strides { batch: s[0] as u64, row: 1, head: s[1] as u64 }
    }
    pub(crate) fn region(&self) -> flashattn_kernels::dev::emu::GlobalRegion {
        flashattn_kernels::dev::emu::GlobalRegion { start: self.addr() as usize, len: self.span(), writable: self.writable }
    }
}

impl FlashAttn {
    /// Binds a view for a launch on this device: its memory must be this device's.
    pub(crate) fn bind<'s, T>(&'s self, name: &'static str, v: &'s View<'_, T>) -> Result<Bound<'s>> {
        let stream = self.stream();
        let (base, len, order) = match (&v.mem, &self.backend, stream) {
            (Mem::Tensor(t), _, _) => {
                self.check_owner(t, name)?;
                tensor_ptr(t, stream)
            }
            (Mem::Cuda(m), Backend::Cuda(c), Some(st)) => {
                if !std::sync::Arc::ptr_eq(m.stream().context(), &c.ctx) {
                    return Err(Error::WrongDevice { tensor: name });
                }
                let (p, order) = m.device_ptr(st);
                (p, m.len(), Some(order))
            }
            (Mem::Raw(a, n), Backend::Cuda(_), _) => (*a, *n, None),
            (Mem::Host(h), Backend::Emulator, _) => (h.as_ptr() as u64, h.len(), None),
            _ => return Err(Error::WrongDevice { tensor: name }),
        };
        Ok(Bound { name, base, len, elem: std::mem::size_of::<T>(), layout: v.layout.clone(), writable: false, _order: order })
    }

    /// Binds an input view and checks it ([`check`]).
    pub(crate) fn bind_input<'s, T>(
        &'s self,
        name: &'static str,
        v: &'s View<'_, T>,
        expected: &[usize],
        align: usize,
    ) -> Result<Bound<'s>> {
        let b = self.bind(name, v)?;
        check(&b, expected, align, false)?;
        Ok(b)
    }

    /// Binds a view to write.
    pub(crate) fn bind_mut<'s, T>(&'s self, name: &'static str, v: &'s mut ViewMut<'_, T>) -> Result<Bound<'s>> {
        let stream = self.stream();
        let layout = v.layout.clone();
        let (base, len, order) = match (&mut v.mem, &self.backend, stream) {
            (MemMut::Tensor(t), _, _) => {
                self.check_owner(t, name)?;
                tensor_ptr_mut(t, stream)
            }
            (MemMut::Cuda(m, _), Backend::Cuda(c), Some(st)) => {
                // SAFETY: the pointer came from an `&'a mut` this view holds exclusively, and
                // `v` is borrowed mutably for 's.
                let m: &'s mut (dyn DeviceMem<T> + '_) = unsafe { m.as_mut() };
                if !std::sync::Arc::ptr_eq(m.stream().context(), &c.ctx) {
                    return Err(Error::WrongDevice { tensor: name });
                }
                let len = m.len();
                let (p, order) = m.device_ptr_mut(st);
                (p, len, Some(order))
            }
            (MemMut::Raw(a, n), Backend::Cuda(_), _) => (*a, *n, None),
            (MemMut::Host(h), Backend::Emulator, _) => (h.as_mut_ptr() as u64, h.len(), None),
            _ => return Err(Error::WrongDevice { tensor: name }),
        };
        Ok(Bound { name, base, len, elem: std::mem::size_of::<T>(), layout, writable: true, _order: order })
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
/// with the same strides and shape (the packed QKV case: one buffer, interleaved heads) are
/// compared exactly when their strides nest (each at least the extent of the ones below it);
/// any other overlap of spans counts as sharing.
pub(crate) fn overlap(a: &Bound<'_>, b: &Bound<'_>) -> bool {
    let (sa, sb) = (a.span(), b.span());
    if sa == 0 || sb == 0 {
        return false;
    }
    let (a0, b0) = (a.addr(), b.addr());
    if a0 + sa as u64 <= b0 || b0 + sb as u64 <= a0 {
        return false;
    }
    if a.elem != b.elem || a.layout.shape != b.layout.shape || a.layout.strides != b.layout.strides {
        return true;
    }
    let diff = a0.abs_diff(b0);
    if !diff.is_multiple_of(a.elem as u64) {
        return true;
    }
    // Dimensions by decreasing stride; nested when each stride covers the extent below it.
    let mut dims: Vec<(usize, usize)> =
        a.layout.shape.iter().copied().zip(a.layout.strides.iter().copied()).filter(|&(n, _)| n > 1).collect();
    dims.sort_by_key(|&(_, s)| std::cmp::Reverse(s));
    let nested = dims.windows(2).all(|w| w[0].1 >= w[1].1 * w[1].0);
    if !nested {
        return true;
    }
    // An element of both: diff = sum of c_k s_k with |c_k| < n_k. With nested strides the
    // lower dimensions reach less than s_k either way, so c_k is one of two values per level.
    fn reach(rest: i128, dims: &[(usize, usize)]) -> bool {
        let Some((&(n, s), below)) = dims.split_first() else { return rest == 0 };
        let c0 = rest.div_euclid(s as i128);
        [c0, c0 + 1].into_iter().any(|c| c.unsigned_abs() < n as u128 && reach(rest - c * s as i128, below))
    }
    reach((diff / a.elem as u64) as i128, &dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(base: u64, shape: &[usize], strides: &[usize], offset: usize) -> Bound<'static> {
        let layout = Layout { shape: shape.to_vec(), strides: strides.to_vec(), offset };
        Bound { name: "t", base, len: usize::MAX / 4, elem: 2, layout, writable: true, _order: None }
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
}
