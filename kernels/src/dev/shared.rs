//! A typed view of a block's shared memory. All shared-memory traffic of a kernel goes
//! through it, so the emulator can check every access (bounds, initialisation, races).

use super::imp;

/// `len` elements of `T` in the block's shared memory. Copying the view does not copy memory.
#[derive(Clone, Copy)]
pub struct Shared<T: Copy> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy> Shared<T> {
    /// # Safety
    /// `ptr..ptr+len` must lie in the block's shared memory.
    #[inline(always)]
    pub unsafe fn from_raw(ptr: *mut T, len: usize) -> Self {
        Shared { ptr, len }
    }
    /// Number of elements in the view.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the view is empty.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The view of elements `start..start+len` of this one.
    #[inline(always)]
    pub fn slice(&self, start: usize, len: usize) -> Shared<T> {
        Shared { ptr: self.ptr.wrapping_add(start), len }
    }
    /// The view of the `len * size_of::<T>()` bytes after this one, as `U` (for carving one
    /// allocation into several arrays).
    #[inline(always)]
    pub fn after<U: Copy>(&self, len: usize) -> Shared<U> {
        Shared { ptr: self.ptr.wrapping_add(self.len) as *mut U, len }
    }
    /// The same bytes viewed as `U` (sizes in whole `U`s; alignment is the caller's).
    #[inline(always)]
    pub fn cast<U: Copy>(&self) -> Shared<U> {
        Shared { ptr: self.ptr as *mut U, len: self.len * size_of::<T>() / size_of::<U>() }
    }
    /// Address of element `i` (for the matrix and async-copy instructions in [`super`]).
    #[inline(always)]
    pub(crate) fn ptr_at(&self, i: usize) -> *mut T {
        self.ptr.wrapping_add(i)
    }
    /// Reads element `i`. On the GPU `i` is not checked (the kernel's tiling keeps it in
    /// range); the emulator checks it against the block's allocation.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn ld(&self, i: usize) -> T {
        unsafe { imp::shared_load(self.ptr.wrapping_add(i)) }
    }
    /// Reads 16 bytes at element `i` (16-byte aligned) with one `ld.shared.v4.b32`.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn ld_16(&self, i: usize) -> super::Chunk16 {
        unsafe { imp::shared_load_16(self.ptr.wrapping_add(i) as *const super::Chunk16) }
    }
    /// Writes element `i`.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn st(&self, i: usize, v: T) {
        unsafe { imp::shared_store(self.ptr.wrapping_add(i), v) }
    }
}
