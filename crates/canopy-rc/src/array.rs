//! `Array<T, P>`: an n-dimensional, reference-counted array whose
//! descriptor (count, length, rank, shape) and data are one allocation.
//!
//! ```text
//!  one block from canopy_alloc::alloc_with_descriptor
//!  +-----------+-----+------+-----------------+-----+--------------------+
//!  | P::Count  | len | rank | shape[0..rank]  | pad | data[0..len]: T    |
//!  +-----------+-----+------+-----------------+-----+--------------------+
//!  ^ descriptor (freeing it frees the block)         ^ data (aligned for T)
//! ```
//!
//! Invariant: `len == shape.iter().product()`, and every data element is
//! initialised while any reference exists.  The block is freed exactly once,
//! by whoever sees the count reach zero (for `Delegated`, the counting thread).

use core::fmt;
use core::marker::PhantomData;
use core::ops::Index;
use core::ptr::{self, NonNull};

use crate::policy::{Atomic, Policy, SharedPolicy};
use crate::stats;

/// The fixed part of the descriptor; `rank` words of shape follow it.
#[repr(C)]
pub(crate) struct Header<C> {
    count: C,
    len: usize,
    rank: usize,
}

/// Bad array construction input (shape and data disagree, or the shape is
/// too large to allocate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

/// A reference-counted n-dimensional array with counting policy `P`.
///
/// Moving an array passes its reference; `clone` counts one more reference
/// (it does not copy the data); dropping counts one less and frees the
/// array with the last one.  Updates ([`make_unique`](Array::make_unique),
/// [`modarray`](Array::modarray)) happen in place when the array's count is
/// 1 and on a fresh copy otherwise.
///
/// `Array<T, Local>` stays on its thread; arrays of the other policies are
/// `Send` and `Sync` when `T` is.
pub struct Array<T, P: Policy = Atomic> {
    hdr: NonNull<Header<P::Count>>,
    data: NonNull<T>,
    _own: PhantomData<(T, *const ())>,
}

// SAFETY: shared policies count correctly from any thread; the data is
// immutable while shared (updates need count 1), so `T: Send + Sync` is
// what moving or sharing the array needs.
unsafe impl<T: Send + Sync, P: SharedPolicy> Send for Array<T, P> {}
// SAFETY: as above; `&Array` only reads data and clones (counts) references.
unsafe impl<T: Send + Sync, P: SharedPolicy> Sync for Array<T, P> {}

/// Bytes of descriptor for `rank` dimensions.
#[inline(always)]
fn desc_size<C>(rank: usize) -> usize {
    core::mem::size_of::<Header<C>>() + rank * core::mem::size_of::<usize>()
}

/// Offset of the data from the descriptor (as `alloc_with_descriptor` places it).
#[inline(always)]
fn data_offset<C, T>(rank: usize) -> usize {
    let align = core::mem::align_of::<T>().max(16);
    (desc_size::<C>(rank) + align - 1) & !(align - 1)
}

/// Free an array whose count reached zero: drop the elements, free the block.
///
/// # Safety
/// `p` is the descriptor of an `Array<T, P>` with no reference left.
unsafe fn release<T, P: Policy>(p: *const u8) {
    let h = p as *mut Header<P::Count>;
    // SAFETY: the descriptor is valid until freed below; the data lies at
    // `data_offset` and holds `len` initialised elements (invariant).
    unsafe {
        let len = (*h).len;
        let rank = (*h).rank;
        if core::mem::needs_drop::<T>() {
            let data = (p as *mut u8).add(data_offset::<P::Count, T>(rank)) as *mut T;
            ptr::drop_in_place(ptr::slice_from_raw_parts_mut(data, len));
        }
        ptr::drop_in_place(h);
        if P::FREE_UNCHECKED {
            // The count reached zero once: this is the block's only free,
            // with the arguments `Array::alloc` gave alloc_with_descriptor
            // (shape and length never change afterwards).
            canopy_alloc::free_with_descriptor_unchecked(
                p as *mut u8,
                desc_size::<P::Count>(rank),
                len * core::mem::size_of::<T>(),
                core::mem::align_of::<T>(),
            );
        } else {
            canopy_alloc::free(p as *mut u8);
        }
    }
    stats::on_free();
}

/// A block whose data is not (all) initialised yet; freed without dropping
/// elements if dropped (a panic while filling leaks the elements written so
/// far, never double-drops).
pub(crate) struct Uninit<T, P: Policy> {
    hdr: NonNull<Header<P::Count>>,
    data: NonNull<T>,
}

impl<T, P: Policy> Uninit<T, P> {
    pub(crate) fn data(&self) -> *mut T {
        self.data.as_ptr()
    }

    /// # Safety
    /// Every element has been written.
    pub(crate) unsafe fn assume_init(self) -> Array<T, P> {
        let a = Array {
            hdr: self.hdr,
            data: self.data,
            _own: PhantomData,
        };
        core::mem::forget(self);
        a
    }
}

impl<T, P: Policy> Drop for Uninit<T, P> {
    fn drop(&mut self) {
        // SAFETY: the block came from alloc_with_descriptor and was never
        // published; its count is in place and is dropped with it.
        unsafe {
            ptr::drop_in_place(self.hdr.as_ptr());
            canopy_alloc::free(self.hdr.as_ptr() as *mut u8);
        }
        stats::on_free();
    }
}

/// The number of elements of `shape`, or an error naming the shape.
#[inline]
pub(crate) fn shape_len(shape: &[usize]) -> Result<usize, ShapeError> {
    match shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(n) => Ok(n),
        None => Err(shape_error(shape, "has too many elements")),
    }
}

/// The error for `shape` (out of line: the allocation paths stay small
/// enough to inline).
#[cold]
#[inline(never)]
fn shape_error(shape: &[usize], what: &str) -> ShapeError {
    ShapeError(format!("array shape {shape:?} {what}"))
}

/// Out of memory for an array block of `bytes`: the standard handler.
#[cold]
#[inline(never)]
fn array_alloc_failed(bytes: usize) -> ! {
    std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(bytes, 16).expect("layout of an array block"))
}

impl<T, P: Policy> Array<T, P> {
    const _ALIGN_OK: () = assert!(core::mem::align_of::<Header<P::Count>>() <= 16);

    /// Allocate descriptor and data for `shape` in one block.
    ///
    /// Inlined, with its error paths out of line: called through a
    /// generator object (a `dyn` expression compiled apart from the
    /// with-loop), an out-of-line `alloc` returned its `Result` through the
    /// stack, and the caller's wide load of it waited for the two narrower
    /// stores that wrote it (a store-forwarding stall): the SAC kernel's
    /// generator form spent a fifth of its expression's time there.
    #[inline]
    pub(crate) fn alloc(shape: &[usize]) -> Result<Uninit<T, P>, ShapeError> {
        #[allow(clippy::let_unit_value)]
        let _ = Self::_ALIGN_OK;
        let len = shape_len(shape)?;
        let Some(data_size) = len.checked_mul(core::mem::size_of::<T>()).filter(|&b| b <= isize::MAX as usize / 2) else {
            return Err(shape_error(shape, "is too large to allocate"));
        };
        let rank = shape.len();
        let dsize = desc_size::<P::Count>(rank);
        let Some((d, data)) =
            canopy_alloc::alloc_with_descriptor(dsize, data_size, core::mem::align_of::<T>())
        else {
            array_alloc_failed(dsize + data_size);
        };
        debug_assert_eq!(data as usize - d as usize, data_offset::<P::Count, T>(rank));
        let h = d as *mut Header<P::Count>;
        // SAFETY: d is a fresh block of at least dsize bytes, 16-aligned
        // (enough for the header, checked above); the shape words follow the
        // header inside the descriptor.
        unsafe {
            h.write(Header {
                count: P::new_count(release::<T, P>),
                len,
                rank,
            });
            let s = (h as *mut u8).add(core::mem::size_of::<Header<P::Count>>()) as *mut usize;
            ptr::copy_nonoverlapping(shape.as_ptr(), s, rank);
        }
        stats::on_alloc(dsize + data_size);
        // SAFETY: both pointers are non-null (a successful allocation).
        Ok(unsafe {
            Uninit {
                hdr: NonNull::new_unchecked(h),
                data: NonNull::new_unchecked(data as *mut T),
            }
        })
    }

    /// An array of `shape` whose element at linear (row-major) index `i` is
    /// `f(i)`, filled in order on the calling thread.
    ///
    /// # Panics
    /// If the shape's element count overflows.
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(usize) -> T) -> Self {
        let u = Self::alloc(shape).unwrap_or_else(|e| panic!("{e}"));
        let len = shape_len(shape).expect("checked by alloc");
        let mut written = 0;
        while written < len {
            // SAFETY: written < len, inside the data; each slot written once.
            unsafe { u.data().add(written).write(f(written)) };
            written += 1;
        }
        // SAFETY: all len elements written.
        unsafe { u.assume_init() }
    }

    /// An array of `shape` holding `data` in row-major order.
    pub fn try_from_vec(shape: &[usize], data: Vec<T>) -> Result<Self, ShapeError> {
        let len = shape_len(shape)?;
        if data.len() != len {
            return Err(ShapeError(format!(
                "shape {shape:?} has {len} elements but {} values were given",
                data.len()
            )));
        }
        let u = Self::alloc(shape)?;
        let mut data = core::mem::ManuallyDrop::new(data);
        // SAFETY: len elements move from the vector into the fresh data; the
        // vector's buffer is then freed without dropping them.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), u.data(), len);
            data.set_len(0);
            core::mem::ManuallyDrop::drop(&mut data);
            Ok(u.assume_init())
        }
    }

    /// [`try_from_vec`](Array::try_from_vec) that panics on a shape mismatch.
    pub fn from_vec(shape: &[usize], data: Vec<T>) -> Self {
        Self::try_from_vec(shape, data).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A rank-0 array (a boxed scalar with a count).
    pub fn scalar(v: T) -> Self {
        let mut v = Some(v);
        Self::from_fn(&[], |_| v.take().expect("one element"))
    }

    #[inline(always)]
    fn header(&self) -> &Header<P::Count> {
        // SAFETY: the header is valid while this reference exists.
        unsafe { self.hdr.as_ref() }
    }

    /// The shape (one extent per dimension; empty for a scalar).
    #[inline]
    pub fn shape(&self) -> &[usize] {
        let h = self.header();
        // SAFETY: `rank` shape words follow the header (written at allocation).
        unsafe {
            core::slice::from_raw_parts(
                (self.hdr.as_ptr() as *const u8).add(core::mem::size_of::<Header<P::Count>>())
                    as *const usize,
                h.rank,
            )
        }
    }

    /// The number of dimensions.
    #[inline]
    pub fn rank(&self) -> usize {
        self.header().rank
    }

    /// The number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.header().len
    }

    /// Whether the array has no elements.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements in row-major order.
    #[inline]
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: len initialised elements at data (invariant).
        unsafe { core::slice::from_raw_parts(self.data.as_ptr(), self.len()) }
    }

    /// The linear (row-major) index of `iv`, or None when out of range.
    pub fn offset_of(&self, iv: &[usize]) -> Option<usize> {
        let shape = self.shape();
        if iv.len() != shape.len() {
            return None;
        }
        let mut off = 0usize;
        for (&i, &d) in iv.iter().zip(shape) {
            if i >= d {
                return None;
            }
            off = off * d + i;
        }
        Some(off)
    }

    /// The element at index vector `iv`, or None when out of range.
    pub fn get(&self, iv: &[usize]) -> Option<&T> {
        self.offset_of(iv).map(|o| &self.as_slice()[o])
    }

    /// The count as this thread can know it: at least the number of live
    /// references (for `Delegated`, waits for this thread's earlier count
    /// operations; may over-report, never under-reports).
    pub fn getrc(&self) -> usize {
        // SAFETY: we hold a reference.
        unsafe { P::getrc(&self.header().count) }
    }

    /// Whether this is the only reference (then updates happen in place).
    #[inline]
    pub fn is_unique(&self) -> bool {
        self.getrc() == 1
    }

    /// Whether two arrays are the same object.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.hdr == b.hdr
    }

    /// Address of the descriptor (for tests and traces).
    pub fn addr(&self) -> usize {
        self.hdr.as_ptr() as usize
    }

    pub(crate) fn data_ptr(&self) -> *mut T {
        self.data.as_ptr()
    }
}

impl<T: Clone, P: Policy> Array<T, P> {
    /// An array of `shape` with every element `v`.
    pub fn filled(shape: &[usize], v: T) -> Self {
        Self::from_fn(shape, |_| v.clone())
    }

    /// Mutable access to the elements: in place if this is the only
    /// reference, otherwise after replacing `self` by a fresh copy.
    pub fn make_unique(&mut self) -> &mut [T] {
        let bytes = self.len() * core::mem::size_of::<T>();
        if self.is_unique() {
            stats::on_reuse(bytes);
        } else {
            stats::on_copy(bytes);
            let src = self.as_slice();
            let copy = Self::from_fn(self.shape(), |i| src[i].clone());
            *self = copy;
        }
        // SAFETY: count 1: no other reference can read while we write.
        unsafe { core::slice::from_raw_parts_mut(self.data.as_ptr(), self.len()) }
    }

    /// A copy of this array (count 1), whatever this array's count.
    pub fn deep_copy(&self) -> Self {
        let src = self.as_slice();
        Self::from_fn(self.shape(), |i| src[i].clone())
    }
}

impl<T, P: Policy> Clone for Array<T, P> {
    /// One more reference to the same array (no data is copied).
    #[inline]
    fn clone(&self) -> Self {
        // SAFETY: we hold a reference.
        unsafe { P::inc(&self.header().count) };
        Array {
            hdr: self.hdr,
            data: self.data,
            _own: PhantomData,
        }
    }
}

impl<T, P: Policy> Drop for Array<T, P> {
    #[inline]
    fn drop(&mut self) {
        let c = &self.header().count as *const P::Count;
        // SAFETY: we give up our reference; on `true` we held the last one.
        unsafe {
            if P::dec(c) {
                release::<T, P>(self.hdr.as_ptr() as *const u8);
            }
        }
    }
}

impl<T, P: Policy> Index<&[usize]> for Array<T, P> {
    type Output = T;
    /// # Panics
    /// If `iv` has the wrong length or is out of range.
    fn index(&self, iv: &[usize]) -> &T {
        match self.get(iv) {
            Some(v) => v,
            None => panic!(
                "index {iv:?} out of range for array of shape {:?}",
                self.shape()
            ),
        }
    }
}

impl<T, P: Policy, const N: usize> Index<[usize; N]> for Array<T, P> {
    type Output = T;
    /// # Panics
    /// If `iv` has the wrong length or is out of range.
    fn index(&self, iv: [usize; N]) -> &T {
        &self[&iv[..]]
    }
}

impl<T: fmt::Debug, P: Policy> fmt::Debug for Array<T, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Array")
            .field("policy", &P::NAME)
            .field("shape", &self.shape())
            .field("data", &self.as_slice())
            .finish()
    }
}

impl<T: PartialEq, P: Policy> PartialEq for Array<T, P> {
    fn eq(&self, o: &Self) -> bool {
        self.shape() == o.shape() && self.as_slice() == o.as_slice()
    }
}
