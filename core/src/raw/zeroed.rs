//! Large arrays that start as all-zero bytes: index arrays, row segments
//! and admission sketches.
//!
//! Small arrays come from the global allocator's zeroed memory. Arrays of
//! 2 MiB or more are mapped straight from the OS (anonymous `mmap`, which is
//! zero-filled lazily, so a fresh index of millions of slots costs no writes
//! until it is used), aligned to 2 MiB and marked `MADV_HUGEPAGE`: random
//! probes and row reads over gigabytes then miss the TLB far less often
//! (where transparent huge pages are in `madvise` or `always` mode). Other
//! platforms and Miri use the allocator for every size.

#[cfg(not(loom))]
use std::alloc::alloc_zeroed;
use std::alloc::{dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;

/// Types for which the all-zero bit pattern is a valid, meaningful value.
///
/// # Safety
/// Implement only for types made of integers and atomic integers.
pub(crate) unsafe trait Zeroable: Default {}

// SAFETY: atomic integers are plain integers in memory; zero is a valid
// value. (Under loom these are loom's atomics, which `zeroed_slice` builds
// with `Default` instead of zeroed memory.)
unsafe impl Zeroable for [super::sync::AtomicU64; 2] {}

// SAFETY: as above (rows always use std's atomics).
unsafe impl Zeroable for std::sync::atomic::AtomicU64 {}

// SAFETY: as above (admission sketches use std's atomics).
unsafe impl Zeroable for std::sync::atomic::AtomicU16 {}

/// Size from which arrays are mapped with huge pages.
#[cfg(all(unix, not(miri), not(loom)))]
const HUGE_PAGE: usize = 2 << 20;

/// Where a [`ZeroedSlice`]'s memory came from, to give it back.
enum Backing {
    /// Zero-sized: nothing was allocated.
    None,
    /// The global allocator, with this layout.
    Heap(Layout),
    /// An anonymous mapping of `bytes` bytes at `base`.
    #[cfg(all(unix, not(miri), not(loom)))]
    Mapped {
        base: *mut libc::c_void,
        bytes: usize,
    },
}

/// An owned array of `len` values that started as zero bytes.
pub(crate) struct ZeroedSlice<T> {
    ptr: NonNull<T>,
    len: usize,
    backing: Backing,
}

// SAFETY: a ZeroedSlice owns its values like a Box<[T]> does; the raw
// pointers in it are never shared outside the borrow rules of `Deref`.
unsafe impl<T: Send> Send for ZeroedSlice<T> {}
// SAFETY: as above; `&ZeroedSlice<T>` only hands out `&[T]`.
unsafe impl<T: Sync> Sync for ZeroedSlice<T> {}

impl<T> std::ops::Deref for ZeroedSlice<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points to `len` initialized (zeroed, `Zeroable`)
        // values owned by `self` and aligned for `T` (see `zeroed_slice`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> ZeroedSlice<T> {
    /// Bytes of the array the system backs with memory, at most, when
    /// writes have touched no more than `touched` distinct places of it: a
    /// mapped array (see the module docs) is backed page by page as it is
    /// first written, in pages of at most 2 MiB (a huge page; 4 KiB where
    /// huge pages are unavailable), so it counts `touched` such pages at
    /// most; an array from the allocator counts in full.
    pub(crate) fn bytes_in_use(&self, touched: usize) -> usize {
        let bytes = std::mem::size_of_val::<[T]>(self);
        #[cfg(all(unix, not(miri), not(loom)))]
        if let Backing::Mapped { .. } = self.backing {
            return bytes.min(touched.saturating_mul(HUGE_PAGE));
        }
        let _ = touched;
        bytes
    }
}

impl<T> ZeroedSlice<T> {
    /// Backs elements `range` (clamped to the array) with memory now, as
    /// the first write to each of their pages would, without changing a
    /// value: on Linux, for a mapped array, `madvise(MADV_POPULATE_WRITE)`
    /// (the kernel zeroes the pages here instead of in the writer that
    /// touches them first). Elsewhere, and for arrays from the allocator
    /// (small, or backed on allocation), nothing. Returns false only if the
    /// system refused (out of memory, or a kernel older than 5.14).
    pub(crate) fn populate(&self, range: std::ops::Range<usize>) -> bool {
        let end = range.end.min(self.len);
        if range.start >= end {
            return true;
        }
        #[cfg(all(target_os = "linux", not(miri), not(loom)))]
        if let Backing::Mapped { .. } = self.backing {
            // SAFETY: sysconf only reads a system constant.
            let page = match usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }) {
                Ok(page) if page.is_power_of_two() => page,
                _ => return false,
            };
            let size = std::mem::size_of::<T>();
            let first = (self.ptr.as_ptr() as usize + range.start * size) & !(page - 1);
            let last = (self.ptr.as_ptr() as usize + end * size).next_multiple_of(page);
            // SAFETY: `first..last` lies inside the mapping. `map_huge` maps
            // `base .. base + bytes + 2 MiB` and places the array at `base +
            // skew`, a 2 MiB boundary, where `skew` is a multiple of the page
            // size (`base` is page-aligned) below 2 MiB, so at most 2 MiB
            // minus a page. Rounding the start down to a page stays at or
            // after the array's start; the end rounded up to a page is at
            // most `skew + bytes + page - 1 < bytes + 2 MiB` past `base`.
            // MADV_POPULATE_WRITE only faults pages in: it never changes
            // their contents, so concurrent atomic accesses to the values
            // are unaffected.
            return unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_POPULATE_WRITE,
                )
            } == 0;
        }
        true
    }
}

impl<T> Drop for ZeroedSlice<T> {
    fn drop(&mut self) {
        // The element types (atomics) need no drop of their own.
        match self.backing {
            Backing::None => {}
            // SAFETY: allocated in `zeroed_slice` with this layout.
            Backing::Heap(layout) => unsafe { dealloc(self.ptr.as_ptr().cast(), layout) },
            #[cfg(all(unix, not(miri), not(loom)))]
            // SAFETY: mapped in `map_huge` with this base and length, and no
            // reference into it outlives `self`.
            Backing::Mapped { base, bytes } => unsafe {
                libc::munmap(base, bytes);
            },
        }
    }
}

/// Zeroed `AtomicU64` words allocated exactly as the row arena's segments
/// are (huge-page mapped from 2 MiB up): for code outside the table that
/// must see the same memory behaviour, such as the benchmarks' dense
/// reference.
pub struct ZeroedWords(ZeroedSlice<std::sync::atomic::AtomicU64>);

impl std::ops::Deref for ZeroedWords {
    type Target = [std::sync::atomic::AtomicU64];

    #[inline]
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// `len` zeroed words, cache-line aligned, on huge pages when large (see the
/// module docs). Running out of memory aborts, as for `Vec`.
pub fn zeroed_words(len: usize) -> ZeroedWords {
    ZeroedWords(zeroed_slice(len, 64))
}

/// Gives the global allocator's free memory back to the operating system
/// (glibc `malloc_trim`; a no-op elsewhere), so that the process's resident
/// size counts live memory only. For measurements, such as the benchmarks'
/// memory per row; the table itself never needs it.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
    // SAFETY: `malloc_trim` has no preconditions: it only returns pages the
    // allocator holds free, and never touches live allocations.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// An array of `len` zero values, aligned to at least `align` bytes (a
/// power of two). Running out of memory aborts, as for `Vec`.
pub(crate) fn zeroed_slice<T: Zeroable>(len: usize, align: usize) -> ZeroedSlice<T> {
    try_zeroed_slice(len, align).unwrap_or_else(|| {
        let layout = Layout::array::<T>(len).unwrap_or(Layout::new::<T>());
        handle_alloc_error(layout)
    })
}

/// [`zeroed_slice`], or `None` if the size overflows or memory runs out.
#[cfg(loom)]
pub(crate) fn try_zeroed_slice<T: Zeroable>(len: usize, align: usize) -> Option<ZeroedSlice<T>> {
    // Loom atomics carry model state: construct them in a heap array, owned
    // by the ZeroedSlice like any other.
    let _ = align;
    let boxed: Box<[T]> = (0..len).map(|_| T::default()).collect();
    let len = boxed.len();
    let layout = Layout::array::<T>(len).expect("array layout fits in isize");
    let ptr = NonNull::new(Box::into_raw(boxed).cast::<T>())?;
    Some(ZeroedSlice {
        ptr,
        len,
        backing: if layout.size() == 0 {
            Backing::None
        } else {
            Backing::Heap(layout)
        },
    })
}

/// [`zeroed_slice`], or `None` if the size overflows or memory runs out.
#[cfg(not(loom))]
pub(crate) fn try_zeroed_slice<T: Zeroable>(len: usize, align: usize) -> Option<ZeroedSlice<T>> {
    let layout = Layout::array::<T>(len)
        .and_then(|l| l.align_to(align))
        .ok()?;
    if layout.size() == 0 {
        return Some(ZeroedSlice {
            ptr: NonNull::dangling(),
            len,
            backing: Backing::None,
        });
    }
    #[cfg(all(unix, not(miri), not(loom)))]
    if layout.size() >= HUGE_PAGE && layout.align() <= HUGE_PAGE {
        if let Some((ptr, backing)) = map_huge(layout.size()) {
            return Some(ZeroedSlice {
                ptr: ptr.cast(),
                len,
                backing,
            });
        }
    }
    // SAFETY: the layout has non-zero size. Zeroed memory is a valid `T`
    // (`Zeroable`), aligned and sized by `layout`.
    let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }.cast::<T>())?;
    Some(ZeroedSlice {
        ptr,
        len,
        backing: Backing::Heap(layout),
    })
}

/// Maps `bytes` zero bytes aligned to 2 MiB and asks for huge pages.
#[cfg(all(unix, not(miri), not(loom)))]
fn map_huge(bytes: usize) -> Option<(NonNull<u8>, Backing)> {
    let mapped = bytes.checked_add(HUGE_PAGE)?;
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing: it aliases nothing. Checked for failure below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let skew = (HUGE_PAGE - base as usize % HUGE_PAGE) % HUGE_PAGE;
    let start = base.cast::<u8>().wrapping_add(skew);
    // SAFETY: `start..start + bytes` lies inside the mapping (skew < 2 MiB
    // and the mapping has 2 MiB to spare). madvise only advises; a failure
    // (huge pages unavailable) leaves ordinary pages, which is fine.
    unsafe { libc::madvise(start.cast(), bytes, libc::MADV_HUGEPAGE) };
    Some((
        NonNull::new(start)?,
        Backing::Mapped {
            base,
            bytes: mapped,
        },
    ))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{release_free_heap, zeroed_words};
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn public_words_start_zeroed() {
        let words = zeroed_words(3 << 18);
        assert_eq!(words.len(), 3 << 18);
        assert_eq!(words.as_ptr().addr() % 64, 0);
        assert!(words
            .iter()
            .step_by(4099)
            .all(|w| w.load(Ordering::Relaxed) == 0));
        release_free_heap();
    }

    #[test]
    fn populating_a_range_keeps_every_value() {
        // Large enough to be mapped (several 2 MiB pages), but for Miri.
        let len = if cfg!(miri) { 4096 } else { 3 << 19 };
        let words = super::zeroed_slice::<AtomicU64>(len, 64);
        for (i, w) in words.iter().enumerate().step_by(511) {
            w.store(i as u64 + 1, Ordering::Relaxed);
        }
        // Ranges that start and end mid-page, past the end, and empty.
        // (That the pages get backed is `tests/reserve_memory.rs`'s check.)
        for range in [10..700_000, 0..words.len(), 1_000_000..usize::MAX, 5..5] {
            words.populate(range);
        }
        for (i, w) in words.iter().enumerate() {
            let want = if i % 511 == 0 { i as u64 + 1 } else { 0 };
            assert_eq!(w.load(Ordering::Relaxed), want, "word {i}");
        }
    }

    #[test]
    fn slices_start_zeroed_and_are_writable() {
        // Small (heap) and large (mapped) sizes.
        for len in [0, 1, 1000, (4 << 20) / 16 + 3] {
            let words = super::zeroed_slice::<[AtomicU64; 2]>(len, 64);
            assert_eq!(words.len(), len);
            assert!(super::try_zeroed_slice::<[AtomicU64; 2]>(usize::MAX / 8, 64).is_none());
            if len > 0 {
                assert_eq!(words.as_ptr() as usize % 64, 0);
            }
            assert!(words
                .iter()
                .all(|w| w[0].load(Ordering::Relaxed) == 0 && w[1].load(Ordering::Relaxed) == 0));
            if let Some(last) = words.last() {
                last[1].store(7, Ordering::Relaxed);
                assert_eq!(last[1].load(Ordering::Relaxed), 7);
            }
        }
    }
}
