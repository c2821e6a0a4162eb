//! The row arena: rows addressed by a stable row id, in chunked columns.
//!
//! A [`Column`] stores `words_per_row` `AtomicU64` words per row in segments
//! that double in size (1024 rows, 2048, 4096, ...), allocated zeroed on
//! first use (large ones on huge pages, see [`zeroed`](super::zeroed)) and
//! never moved or freed before the column: a row id found once stays valid,
//! and growing never copies a row. A directory of 24 segments addresses
//! 2^34 rows.
//!
//! [`RowStore`] holds the main column, where each row is a two-word header and
//! the `dim` values packed two `f32` per word (see [`kernels`](super::kernels)):
//!
//! - header word 0, the *state*: bit 0 = locked by a writer, bit 1 = live (the
//!   row belongs to a key in the index), bits 2.. a version counter bumped by
//!   every write;
//! - header word 1: the key the row belongs to (so rows can be exported by
//!   scanning the arena, independent of the index);
//! - values.
//!
//! Further columns (optimizer slots, scores) are additional [`Column`]s indexed
//! by the same row id and written under the same row lock.
//!
//! Row consistency is a seqlock: writers lock the state word by CAS, write with
//! Relaxed atomic stores, and release with a new version; readers copy with
//! Relaxed atomic loads and retry if the state changed or was locked. All
//! accesses are atomic, so a racing read is never undefined behaviour, and no
//! reader ever returns a torn row.
//!
//! Row ids are handed out in small batches to a per-batch [`RowCache`]. Ids of
//! removed rows go back to the free pool only through the epoch (`retire`), so
//! a reader that found a row id before its key was removed never sees the
//! row reused for another key while it is pinned.

use super::kernels::{load_row, prefetch_span, store_row, words_for_dim};
use super::zeroed::{zeroed_slice, ZeroedSlice};
use crossbeam_epoch::Guard;
use crossbeam_queue::SegQueue;
use crossbeam_utils::Backoff;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Rows in the first segment (a power of two).
const FIRST_SEGMENT_SHIFT: u32 = 10;
/// Segments in a column's directory.
const SEGMENTS: usize = 24;
/// Most rows one store can address.
pub(crate) const MAX_ROWS: u64 =
    (1 << (FIRST_SEGMENT_SHIFT as u64 + SEGMENTS as u64 - 1)) * 2 - (1 << FIRST_SEGMENT_SHIFT);
/// Row ids a cache takes from the fresh range at a time (at most one segment).
const FRESH_BATCH: u64 = 64;

/// How many takes ahead a new row is prefetched.
const TAKE_PREFETCH: usize = 4;
/// Header words before the values.
const HEADER_WORDS: usize = 2;
const LOCKED: u64 = 1;
const LIVE: u64 = 2;
const VERSION_STEP: u64 = 4;

/// One column of per-row words, in doubling segments (see the module docs).
pub(crate) struct Column {
    words_per_row: usize,
    segments: [OnceLock<ZeroedSlice<AtomicU64>>; SEGMENTS],
}

impl Column {
    pub(crate) fn new(words_per_row: usize) -> Column {
        Column {
            words_per_row: words_per_row.max(1),
            segments: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Segment and offset of a row id.
    #[inline]
    fn locate(row: u64) -> (usize, usize) {
        let x = row + (1 << FIRST_SEGMENT_SHIFT);
        let segment = (63 - x.leading_zeros() - FIRST_SEGMENT_SHIFT) as usize;
        let offset = x - (1 << (segment as u32 + FIRST_SEGMENT_SHIFT));
        (segment, offset as usize)
    }

    /// Makes sure the segment holding `row` is allocated.
    pub(crate) fn ensure(&self, row: u64) {
        let (segment, _) = Self::locate(row);
        self.segments[segment].get_or_init(|| {
            let rows = 1usize << (segment as u32 + FIRST_SEGMENT_SHIFT);
            zeroed_slice(rows * self.words_per_row, 64)
        });
    }

    /// The words of `row`, or `None` if its segment is not allocated yet (a
    /// scan up to the high-water mark can run ahead of a fresh batch of ids).
    #[inline]
    pub(crate) fn try_row(&self, row: u64) -> Option<&[AtomicU64]> {
        let (segment, offset) = Self::locate(row);
        let words = self.segments.get(segment)?.get()?;
        let start = offset * self.words_per_row;
        words.get(start..start + self.words_per_row)
    }

    /// The words of `row`, whose segment must have been allocated by
    /// [`Column::ensure`] (row ids are only handed out after that).
    #[inline]
    pub(crate) fn row(&self, row: u64) -> &[AtomicU64] {
        self.try_row(row)
            .unwrap_or_else(|| panic!("row {row} is outside the allocated arena"))
    }

    /// Address of a row, for prefetching (null if its segment is missing).
    #[inline]
    pub(crate) fn row_address(&self, row: u64) -> *const AtomicU64 {
        self.try_row(row)
            .map_or(std::ptr::null(), <[AtomicU64]>::as_ptr)
    }

    /// Bytes of the rows `0..rows_in_use` (segments are mapped lazily: the
    /// untouched tail of the newest segment is address space, not memory).
    pub(crate) fn memory_bytes(&self, rows_in_use: u64) -> usize {
        let mut bytes = 0;
        for (segment, words) in self.segments.iter().enumerate() {
            if words.get().is_none() {
                continue;
            }
            let first =
                (1u64 << (segment as u32 + FIRST_SEGMENT_SHIFT)) - (1 << FIRST_SEGMENT_SHIFT);
            let rows = 1u64 << (segment as u32 + FIRST_SEGMENT_SHIFT);
            let used = rows_in_use.saturating_sub(first).min(rows);
            bytes += used as usize * self.words_per_row * 8;
        }
        bytes
    }
}

/// Row ids taken by one batch and not yet used.
#[derive(Default)]
pub(crate) struct RowCache {
    ids: Vec<u64>,
}

/// Rows of one table: the main column, the high-water mark and the free pool.
pub(crate) struct RowStore {
    dim: usize,
    main: Column,
    /// Rows `0..high_water` have been handed out at least once.
    high_water: AtomicU64,
    /// Row ids free for reuse, in batches.
    free: Arc<SegQueue<Vec<u64>>>,
}

impl RowStore {
    pub(crate) fn new(dim: usize) -> RowStore {
        RowStore {
            dim,
            main: Column::new(HEADER_WORDS + words_for_dim(dim)),
            high_water: AtomicU64::new(0),
            free: Arc::new(SegQueue::new()),
        }
    }

    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    /// One past the largest row id ever handed out.
    pub(crate) fn high_water(&self) -> u64 {
        self.high_water.load(Ordering::Acquire).min(MAX_ROWS)
    }

    /// Bytes of the rows handed out so far (see [`Column::memory_bytes`]).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.main.memory_bytes(self.high_water())
    }

    /// Address and size of a row, for prefetching.
    #[inline]
    pub(crate) fn row_span(&self, row: u64) -> (*const AtomicU64, usize) {
        (self.main.row_address(row), self.main.words_per_row * 8)
    }

    /// A row id for a new key (from the cache, refilled from the free pool or
    /// the fresh range).
    pub(crate) fn take(&self, cache: &mut RowCache) -> crate::Result<u64> {
        if let Some(id) = cache.ids.pop() {
            return Ok(id);
        }
        if let Some(ids) = self.free.pop() {
            cache.ids = ids;
        } else {
            let start = self.high_water.fetch_add(FRESH_BATCH, Ordering::AcqRel);
            if start + FRESH_BATCH > MAX_ROWS {
                return Err(crate::Error::CapacityExceeded { max_rows: MAX_ROWS });
            }
            self.main.ensure(start);
            self.main.ensure(start + FRESH_BATCH - 1);
            cache.ids.extend((start..start + FRESH_BATCH).rev());
        }
        cache
            .ids
            .pop()
            .ok_or(crate::Error::CapacityExceeded { max_rows: MAX_ROWS })
    }

    /// Prefetches the row a few inserts ahead: a new row is written at once
    /// (and its slot published with an atomic read-modify-write that waits for
    /// those stores), so its lines should already be on their way. Called
    /// after an insert used a row, not on every take: a write to an existing
    /// key takes a row and puts it back, and should not fetch rows it never
    /// writes.
    #[inline]
    pub(crate) fn prefetch_upcoming(&self, cache: &RowCache) {
        if let Some(&id) = cache
            .ids
            .len()
            .checked_sub(TAKE_PREFETCH)
            .and_then(|i| cache.ids.get(i))
        {
            let (address, bytes) = self.row_span(id);
            prefetch_span(address, bytes);
        }
    }

    /// Returns a row id taken but never published.
    pub(crate) fn put_back(&self, cache: &mut RowCache, row: u64) {
        cache.ids.push(row);
    }

    /// Returns a batch's unused ids to the pool (they were never published,
    /// so they can be reused at once).
    pub(crate) fn release(&self, cache: RowCache) {
        if !cache.ids.is_empty() {
            self.free.push(cache.ids);
        }
    }

    /// Frees the ids of removed rows once every thread pinned now has unpinned.
    pub(crate) fn retire(&self, guard: &Guard, rows: Vec<u64>) {
        if rows.is_empty() {
            return;
        }
        let free = Arc::clone(&self.free);
        guard.defer(move || free.push(rows));
    }

    /// Locks a row for writing; returns the state before locking.
    fn lock(state: &AtomicU64) -> u64 {
        let backoff = Backoff::new();
        loop {
            let current = state.load(Ordering::Relaxed);
            if current & LOCKED == 0
                && state
                    .compare_exchange_weak(
                        current,
                        current | LOCKED,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                // Keep the data stores that follow from becoming visible
                // before the lock bit (seqlock writer protocol).
                fence(Ordering::Release);
                return current;
            }
            backoff.snooze();
        }
    }

    /// Runs `write` on the row's words under its lock; `live` says what the
    /// live bit is afterwards (`None`: unchanged).
    fn write(&self, row: u64, live: Option<bool>, write: impl FnOnce(&AtomicU64, &[AtomicU64])) {
        let words = self.main.row(row);
        let state = &words[0];
        let before = Self::lock(state);
        write(&words[1], &words[HEADER_WORDS..]);
        let live_bit = match live {
            Some(true) => LIVE,
            Some(false) => 0,
            None => before & LIVE,
        };
        let after = ((before & !(LIVE | LOCKED)) + VERSION_STEP) | live_bit;
        state.store(after, Ordering::Release);
    }

    /// Fills a row fresh from the cache with its key and values and marks it
    /// live: called while the key's slot is pending, just before the key is
    /// published, so only an export scan can see the row before that.
    pub(crate) fn write_new(&self, row: u64, key: u64, values: &[f32]) {
        self.write(row, Some(true), |key_word, words| {
            key_word.store(key, Ordering::Relaxed);
            store_row(words, values);
        });
    }

    /// Marks a removed key's row as dead.
    pub(crate) fn mark_dead(&self, row: u64) {
        self.write(row, Some(false), |_, _| {});
    }

    /// Updates a live row's values under its lock. Returns false, changing
    /// nothing, if the row is dead: its key was removed after the caller
    /// found the row (the caller then looks the key up again; while it is
    /// pinned the dead row cannot be reused for another key).
    #[must_use]
    pub(crate) fn update(&self, row: u64, update: impl FnOnce(&[AtomicU64])) -> bool {
        let words = self.main.row(row);
        let state = &words[0];
        let before = Self::lock(state);
        if before & LIVE == 0 {
            state.store(before, Ordering::Release);
            return false;
        }
        update(&words[HEADER_WORDS..]);
        state.store(before + VERSION_STEP, Ordering::Release);
        true
    }

    /// Seqlock read of one row's words: copies the values into `out` and
    /// returns the state and key they belong to. Never returns a torn row.
    #[inline]
    fn read_consistent(words: &[AtomicU64], out: &mut [f32]) -> (u64, u64) {
        let (state, key_word, values) = (&words[0], &words[1], &words[HEADER_WORDS..]);
        let backoff = Backoff::new();
        loop {
            let before = state.load(Ordering::Acquire);
            if before & LOCKED != 0 {
                backoff.snooze();
                continue;
            }
            load_row(values, out);
            let key = key_word.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if state.load(Ordering::Relaxed) == before {
                return (before, key);
            }
        }
    }

    /// Copies the row's values into `out` (`out.len() == dim`).
    #[inline]
    pub(crate) fn read(&self, row: u64, out: &mut [f32]) {
        Self::read_consistent(self.main.row(row), out);
    }

    /// If the row is live, copies its values into `out` and returns its key.
    /// Any id below the high-water mark may be asked (unallocated: `None`).
    pub(crate) fn read_live(&self, row: u64, out: &mut [f32]) -> Option<u64> {
        let words = self.main.try_row(row)?;
        let (state, key) = Self::read_consistent(words, out);
        (state & LIVE != 0).then_some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::kernels::axpy_row;

    #[test]
    fn locate_maps_ids_to_doubling_segments() {
        assert_eq!(Column::locate(0), (0, 0));
        assert_eq!(Column::locate(1023), (0, 1023));
        assert_eq!(Column::locate(1024), (1, 0));
        assert_eq!(Column::locate(2047), (1, 1023));
        assert_eq!(Column::locate(3071), (1, 2047));
        assert_eq!(Column::locate(3072), (2, 0));
        assert_eq!(Column::locate(MAX_ROWS - 1).0, SEGMENTS - 1);
    }

    #[test]
    fn rows_are_stable_across_segment_growth() {
        let store = RowStore::new(3);
        let mut cache = RowCache::default();
        let ids: Vec<u64> = (0..3000).map(|_| store.take(&mut cache).unwrap()).collect();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "row ids are unique");
        for &id in &ids {
            store.write_new(id, id * 10, &[id as f32, 1.0, -(id as f32)]);
        }
        let mut out = [0.0; 3];
        for &id in &ids {
            assert_eq!(store.read_live(id, &mut out), Some(id * 10));
            assert_eq!(out, [id as f32, 1.0, -(id as f32)]);
        }
        assert!(store.update(ids[5], |words| axpy_row(words, 2.0, &[1.0, 1.0, 1.0])));
        store.read(ids[5], &mut out);
        assert_eq!(out, [ids[5] as f32 + 2.0, 3.0, -(ids[5] as f32) + 2.0]);
        store.mark_dead(ids[5]);
        assert_eq!(store.read_live(ids[5], &mut out), None);
        assert!(
            !store.update(ids[5], |words| store_row(words, &[9.0; 3])),
            "a dead row is not written"
        );
        store.read(ids[5], &mut out);
        assert_eq!(out, [ids[5] as f32 + 2.0, 3.0, -(ids[5] as f32) + 2.0]);
        assert!(store.memory_bytes() >= 3000 * (2 + 2) * 8);
        store.release(cache);
    }

    #[test]
    fn put_back_and_release_recycle_unpublished_ids() {
        let store = RowStore::new(1);
        let mut cache = RowCache::default();
        let a = store.take(&mut cache).unwrap();
        store.put_back(&mut cache, a);
        assert_eq!(store.take(&mut cache).unwrap(), a);
        store.release(cache);
        let mut other = RowCache::default();
        let b = store.take(&mut other).unwrap();
        assert_ne!(
            a, b,
            "the released batch holds the remaining fresh ids, not a"
        );
        assert_eq!(store.high_water(), FRESH_BATCH);
    }

    #[test]
    fn retired_ids_return_after_the_epoch() {
        let store = RowStore::new(1);
        let collector = crossbeam_epoch::Collector::new();
        let handle = collector.register();
        {
            let guard = handle.pin();
            store.retire(&guard, vec![7, 8]);
        }
        for _ in 0..4 {
            handle.pin().flush();
        }
        let mut cache = RowCache::default();
        let mut got = [
            store.take(&mut cache).unwrap(),
            store.take(&mut cache).unwrap(),
        ];
        got.sort_unstable();
        assert_eq!(got, [7, 8]);
    }

    #[test]
    fn concurrent_readers_never_see_torn_rows() {
        let store = RowStore::new(33);
        let mut cache = RowCache::default();
        let row = store.take(&mut cache).unwrap();
        store.write_new(row, 1, &[0.0; 33]);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..if cfg!(miri) { 50 } else { 2000 } {
                    assert!(store.update(row, |w| store_row(w, &[i as f32; 33])));
                }
            });
            s.spawn(|| {
                let mut out = [0.0; 33];
                for _ in 0..if cfg!(miri) { 50 } else { 2000 } {
                    store.read(row, &mut out);
                    assert!(out.iter().all(|&v| v == out[0]), "torn row {out:?}");
                }
            });
        });
    }
}
