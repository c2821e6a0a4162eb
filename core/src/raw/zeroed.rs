//! Large arrays that start as all-zero bytes, taken straight from the
//! allocator's zeroed pages (so a fresh index of millions of slots costs no
//! writes until it is used).

#[cfg(not(loom))]
use std::alloc::{alloc_zeroed, handle_alloc_error, Layout};

/// Types for which the all-zero bit pattern is a valid, meaningful value.
///
/// # Safety
/// Implement only for types made of integers and atomic integers.
pub(crate) unsafe trait Zeroable: Default {}

// SAFETY: atomic integers are plain integers in memory; zero is a valid
// value. (Under loom these are loom's atomics, which `boxed_slice` builds with
// `Default` instead of zeroed memory.)
unsafe impl Zeroable for [super::sync::AtomicU64; 2] {}

/// A boxed slice of `len` zero values.
#[cfg(not(loom))]
pub(crate) fn boxed_slice<T: Zeroable>(len: usize) -> Box<[T]> {
    if len == 0 || std::mem::size_of::<T>() == 0 {
        return (0..len).map(|_| T::default()).collect();
    }
    let layout = Layout::array::<T>(len).expect("array layout fits in isize");
    // SAFETY: the layout has non-zero size. The memory is zeroed, which is a
    // valid `T` (`Zeroable`), has `T`'s alignment and room for `len` values,
    // and comes from the global allocator with the same layout that `Box`
    // uses to free a `[T]` of length `len`.
    unsafe {
        let ptr = alloc_zeroed(layout).cast::<T>();
        if ptr.is_null() {
            handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len))
    }
}

/// Under loom atomics carry model state and must be constructed.
#[cfg(loom)]
pub(crate) fn boxed_slice<T: Zeroable>(len: usize) -> Box<[T]> {
    (0..len).map(|_| T::default()).collect()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn slices_start_zeroed_and_are_writable() {
        let words: Box<[[AtomicU64; 2]]> = super::boxed_slice(1000);
        assert_eq!(words.len(), 1000);
        assert!(words
            .iter()
            .all(|w| w[0].load(Ordering::Relaxed) == 0 && w[1].load(Ordering::Relaxed) == 0));
        words[999][1].store(7, Ordering::Relaxed);
        assert_eq!(words[999][1].load(Ordering::Relaxed), 7);
        let empty: Box<[[AtomicU64; 2]]> = super::boxed_slice(0);
        assert!(empty.is_empty());
    }
}
