//! The row arena: rows addressed by a stable row id, in chunked columns.
//!
//! A [`Column`] stores `words_per_row` `AtomicU64` words per row, one row
//! every `stride` words ([`line_stride`]: padded, when that costs at most an
//! eighth of the row, so that every row spans the fewest cache lines its size
//! allows), in segments
//! that double in size (1024 rows, 2048, 4096, ...), allocated zeroed on
//! first use (large ones on huge pages, see [`zeroed`](super::zeroed)) and
//! never moved or freed before the column: a row id found once stays valid,
//! and growing never copies a row. A directory of 24 segments addresses
//! 2^34 - 1024 rows ([`MAX_ROWS`]).
//!
//! [`RowStore`] holds the main column, where each row is a two- or three-word
//! header and the `dim` values packed by the value dtype's [`Codec`] (two
//! `f32` or four halves per word):
//!
//! - header word 0, the *state*: bit 0 = locked by a writer, bit 1 = live (the
//!   row belongs to a key in the index), bits 2.. a version counter bumped by
//!   every write;
//! - header word 1: the key the row belongs to (so rows can be exported by
//!   scanning the arena, independent of the index);
//! - header word 2, only in a store built with scores: the row's score for a
//!   restrict policy (a timestamp or a count, see [`Score`]), in the row's
//!   own lines so keeping it costs no extra cache miss;
//! - values;
//! - room for the first [`RowFormat::inline_slots`] slots, each `dim`
//!   values packed by the slot dtype's codec (none by default).
//!
//! Optimizer slots are [`SlotColumn`]s: `dim` values per row indexed by the
//! same row id, either in further columns of their own or inline in the
//! main row's room, and written under the same row lock (the main row's
//! state word guards them; a seqlock read of a row checks it around the
//! slot words too). Inline slots put an optimizer step's values, `m` and
//! `v` in one block of adjacent lines; a lookup still reads (and
//! prefetches) only the header and values. Slots can be added to a store
//! that already holds rows, so a slot stores each value XOR-encoded with
//! the bits of the slot's initial value (see [`Codec`]): zeroed memory
//! reads as the initial value, rows that existed before the slot need no
//! fill (inline room no slot has used is never written, so it is zero),
//! and a reused row is reset by zeroing its slot words. A new row resets
//! every slot the store has when the row is written, reading the slot count
//! after taking the row's lock: a slot added before the row's previous
//! owner wrote it is therefore always seen, so no stale slot value survives
//! a row's reuse.
//!
//! Row consistency is a seqlock: writers lock the state word by CAS, write the
//! row's words, and release with a new version; readers copy the words and
//! retry if the state changed or was locked. Rows are copied in and out with
//! [`bulk`](super::bulk)'s vector copies, which behave as Relaxed atomic word
//! accesses; every other access is a word atomic. So a racing read is never
//! undefined behaviour, and no reader ever returns a torn row.
//!
//! Row ids are handed out in small batches to a per-batch [`RowCache`]. Ids of
//! removed rows go back to the free pool only through the epoch (`retire`), so
//! a reader that found a row id before its key was removed never sees the
//! row reused for another key while it is pinned.

use super::codec::{mix, Codec};
use super::kernels::prefetch_span;
use super::zeroed::{try_zeroed_slice, ZeroedSlice};
use crate::lifecycle::EvictedRows;
use crate::{Dtype, Rounding};
use crossbeam_epoch::Guard;
use crossbeam_queue::SegQueue;
use crossbeam_utils::Backoff;
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
/// Header words before the values (a scored store has one more).
const HEADER_WORDS: usize = 2;
/// The header word holding the score, in a scored store.
const SCORE_WORD: usize = 2;
/// Most slot columns a table (and so a variable) holds; Adam with amsgrad
/// needs three.
pub const MAX_SLOTS: usize = 8;
/// Most bytes of rows (slot columns included) one
/// [`Table::reserve_rows`](super::Table::reserve_rows) backs with memory
/// ahead of the inserts: 1 GiB (1.3M rows of dim 64 with two slot columns).
/// A variable's `reserve` splits it over its shards.
pub const PREFAULT_MAX_BYTES: u64 = 1 << 30;
const LOCKED: u64 = 1;
const LIVE: u64 = 2;
const VERSION_STEP: u64 = 4;

/// Bytes of a cache line, which segments are aligned to.
const LINE_BYTES: usize = 64;

/// Words from one row to the next for rows of `words` words whose first
/// `prefix` words are also read on their own (a lookup reads a row's header
/// and values, not its inline slots; `prefix == words` for a column read
/// whole): the fewest that make every row, at any row id, span the fewest
/// cache lines its size allows (a row of 280 bytes could span 6 lines at
/// some offsets; rows 288 bytes apart span 5 each), and its prefix too.
/// Strides that pad a row by more than an eighth of its size are not
/// taken (rows of 48 bytes would need 64): if none within that keeps both
/// spans fewest, the prefix's is kept, else the whole row's, else the
/// stride is `words`.
pub(crate) fn line_stride(words: usize, prefix: usize) -> usize {
    let bytes = words * 8;
    // Rows start at every multiple of gcd(stride, 64) within a line, so
    // `len` bytes from a row's start span their fewest lines at every row
    // id if they do from the latest of those starts.
    let fewest_lines = |stride: usize, len: usize| {
        let step = 1 << stride.trailing_zeros().min(6);
        LINE_BYTES - step + len <= len.div_ceil(LINE_BYTES) * LINE_BYTES
    };
    let strides = (bytes..=bytes.div_ceil(LINE_BYTES) * LINE_BYTES)
        .step_by(8)
        .take_while(|stride| (stride - bytes) * 8 <= bytes);
    let whole = |stride: &usize| fewest_lines(*stride, bytes);
    let start = |stride: &usize| fewest_lines(*stride, prefix * 8);
    strides
        .clone()
        .find(|stride| whole(stride) && start(stride))
        .or_else(|| strides.clone().find(start))
        .or_else(|| strides.clone().find(whole))
        .map_or(words, |stride| stride / 8)
}

/// One column of per-row words, in doubling segments (see the module docs).
pub(crate) struct Column {
    words_per_row: usize,
    /// Words from one row's start to the next's ([`line_stride`]).
    stride: usize,
    segments: [OnceLock<ZeroedSlice<AtomicU64>>; SEGMENTS],
    /// Serializes allocating segments (one thread allocates, others wait).
    allocating: Mutex<()>,
}

impl Column {
    /// A column of rows of `words_per_row` words, read whole.
    pub(crate) fn new(words_per_row: usize) -> Column {
        Column::with_prefix(words_per_row, words_per_row)
    }

    /// A column of rows of `words_per_row` words whose first `prefix` words
    /// are also read on their own (see [`line_stride`]).
    pub(crate) fn with_prefix(words_per_row: usize, prefix: usize) -> Column {
        let words_per_row = words_per_row.max(1);
        Column {
            words_per_row,
            stride: line_stride(words_per_row, prefix.clamp(1, words_per_row)),
            segments: std::array::from_fn(|_| OnceLock::new()),
            allocating: Mutex::new(()),
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

    /// Makes sure the segment holding `row` is allocated. Running out of
    /// memory aborts, as for `Vec`: the write paths that call this hold a
    /// row lock, and their segment is normally allocated already by
    /// [`Column::try_ensure`] when the row id was handed out.
    pub(crate) fn ensure(&self, row: u64) {
        if self.try_ensure(row).is_err() {
            let (segment, _) = Self::locate(row);
            let words = self.segment_words(segment).unwrap_or(usize::MAX / 8);
            let layout = std::alloc::Layout::array::<AtomicU64>(words)
                .unwrap_or(std::alloc::Layout::new::<AtomicU64>());
            std::alloc::handle_alloc_error(layout)
        }
    }

    /// Words in segment `segment`, if that fits in a `usize`.
    fn segment_words(&self, segment: usize) -> Option<usize> {
        (1usize << (segment as u32 + FIRST_SEGMENT_SHIFT)).checked_mul(self.stride)
    }

    /// Makes sure the segment holding `row` is allocated, or says how many
    /// bytes could not be had.
    pub(crate) fn try_ensure(&self, row: u64) -> Result<(), usize> {
        let (segment, _) = Self::locate(row);
        if self.segments[segment].get().is_some() {
            return Ok(());
        }
        let _allocating = self
            .allocating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.segments[segment].get().is_some() {
            return Ok(());
        }
        let words = self.segment_words(segment).ok_or(usize::MAX)?;
        let array = try_zeroed_slice(words, 64).ok_or(words.saturating_mul(8))?;
        let _ = self.segments[segment].set(array);
        Ok(())
    }

    /// Allocates the segments of `rows` and backs their words with memory
    /// now (see [`ZeroedSlice::populate`]), so that the first writes to
    /// those rows find their pages ready. Stops early, without an error, if
    /// the system refuses memory: the rows' writers then allocate, or fail,
    /// as they would have.
    fn prefault(&self, rows: std::ops::Range<u64>) {
        let mut row = rows.start;
        while row < rows.end {
            if self.try_ensure(row).is_err() {
                return;
            }
            let (segment, offset) = Self::locate(row);
            let Some(words) = self.segments[segment].get() else {
                return;
            };
            let segment_rows = words.len() / self.stride;
            let left = usize::try_from(rows.end - row).unwrap_or(usize::MAX);
            let end = segment_rows.min(offset.saturating_add(left));
            if !words.populate(offset * self.stride..end * self.stride) {
                return;
            }
            row += (end - offset) as u64;
        }
    }

    /// The words of `row`, or `None` if its segment is not allocated yet (a
    /// scan up to the high-water mark can run ahead of a fresh batch of ids).
    #[inline]
    pub(crate) fn try_row(&self, row: u64) -> Option<&[AtomicU64]> {
        let (segment, offset) = Self::locate(row);
        let words = self.segments.get(segment)?.get()?;
        let start = offset * self.stride;
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
            bytes += used as usize * self.stride * 8;
        }
        bytes
    }
}

/// How a write changes a row's score (see [`RestrictPolicy`](crate::RestrictPolicy)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Score {
    /// Leaves it as it is (a new row starts at 0).
    Keep,
    /// Sets it (a score read from a checkpoint).
    Set(u64),
    /// Sets it to this timestamp unless it holds a later one (a batch that
    /// took its stamp earlier may write after a later batch).
    Stamp(u64),
    /// Adds one (a new row starts at 1).
    Count,
}

impl Score {
    /// The score after a write, from the one before (`fresh`: a new row).
    fn after(self, old: u64, fresh: bool) -> u64 {
        match (self, fresh) {
            (Score::Keep, true) => 0,
            (Score::Keep, false) => old,
            (Score::Set(score), _) | (Score::Stamp(score), true) => score,
            (Score::Stamp(stamp), false) => old.max(stamp),
            (Score::Count, true) => 1,
            (Score::Count, false) => old.saturating_add(1),
        }
    }
}

/// Where an optimizer slot's rows are kept.
enum SlotPlace {
    /// In a column of its own (boxed: a column's directory is large).
    Column(Box<Column>),
    /// Inside the main column's rows, from word `at`: the room
    /// [`RowFormat::inline_slots`] keeps after the values.
    Inline { at: usize },
}

/// An optimizer slot: `dim` values per row, in a column of its own or
/// inline in the main row, XOR-encoded with its initial value so that zeroed
/// words read as that value (module docs).
pub(crate) struct SlotColumn {
    place: SlotPlace,
    /// Words of one row of the slot.
    words: usize,
    codec: Codec,
    /// The initial value as asked for, before rounding to the dtype.
    asked: f32,
}

impl SlotColumn {
    /// A slot of rows of `dim` values in `dtype`, in a column of its own, or
    /// inline from word `inline_at` of the main row.
    fn new(dim: usize, dtype: Dtype, initial: f32, inline_at: Option<usize>) -> SlotColumn {
        let codec = Codec::new(dtype, initial);
        let words = codec.words(dim);
        SlotColumn {
            place: match inline_at {
                Some(at) => SlotPlace::Inline { at },
                None => SlotPlace::Column(Box::new(Column::new(words))),
            },
            words,
            codec,
            asked: initial,
        }
    }

    /// The slot's own column, if it has one.
    fn column(&self) -> Option<&Column> {
        match &self.place {
            SlotPlace::Column(column) => Some(column),
            SlotPlace::Inline { .. } => None,
        }
    }

    /// The words of the slot's row `row`, whose main-column words are
    /// `main` (`None` if the slot's own segment was never allocated).
    #[inline]
    fn words<'a>(&'a self, main: &'a [AtomicU64], row: u64) -> Option<&'a [AtomicU64]> {
        match &self.place {
            SlotPlace::Inline { at } => Some(&main[*at..*at + self.words]),
            SlotPlace::Column(column) => column.try_row(row),
        }
    }

    /// Copies the slot's row into `out` (its initial value if its segment
    /// was never written).
    fn load(&self, main: &[AtomicU64], row: u64, out: &mut [f32]) {
        match self.words(main, row) {
            Some(words) => self.codec.load(words, out),
            None => out.fill(self.codec.initial()),
        }
    }

    /// Overwrites the slot's row, rounding stochastically with `noise` if
    /// given (see [`Codec::store_stochastic`]); the caller holds the row's
    /// lock.
    fn store(&self, main: &[AtomicU64], row: u64, src: &[f32], noise: Option<u64>) {
        if let Some(column) = self.column() {
            column.ensure(row);
        }
        let words = self.words(main, row).expect("the slot's row was ensured");
        match noise {
            Some(noise) => self.codec.store_stochastic(words, src, noise),
            None => self.codec.store(words, src),
        }
    }

    /// Sets the slot's row back to the initial value; the caller holds the
    /// row's lock.
    fn reset(&self, main: &[AtomicU64], row: u64) {
        if let Some(words) = self.words(main, row) {
            for word in words {
                word.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// The random bits a write to a locked row rounds with, if it rounds
/// stochastically: from the seed, the row's key and its state word, which
/// holds the version the write replaces, so every write of the row draws new
/// bits.
fn noise(words: &[AtomicU64], rounding: Rounding) -> Option<u64> {
    match rounding {
        Rounding::Stochastic { seed } => {
            let state = words[0].load(Ordering::Relaxed);
            let key = words[1].load(Ordering::Relaxed);
            Some(mix(seed ^ key) ^ state)
        }
        Rounding::NearestEven => None,
    }
}

/// The random bits of slot column `slot`, from a write's `noise`.
fn column_noise(noise: Option<u64>, slot: usize) -> Option<u64> {
    noise.map(|noise| mix(noise ^ ((1 + slot as u64) << 56)))
}

/// Releases a row lock when dropped, with the state the holder set: the
/// state as it was when nothing was written, or a new version. Should the
/// holder panic midway, it is a new version, so that a reader that copied
/// the row meanwhile retries.
struct RowLock<'a> {
    state: &'a AtomicU64,
    release_to: u64,
}

impl Drop for RowLock<'_> {
    fn drop(&mut self) {
        self.state.store(self.release_to, Ordering::Release);
    }
}

/// What [`RowStore::unlink`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unlink {
    /// The row was removed (and dead).
    Removed,
    /// The row stays (dead already, or not to be removed).
    Kept,
    /// The index is migrating: help it, and try again.
    Retry,
}

/// Row ids taken by one batch and not yet used.
#[derive(Default)]
pub(crate) struct RowCache {
    ids: Vec<u64>,
}

/// How a table stores its rows' numbers: the dtypes of its values and of
/// its slot columns, and how optimizer steps round to them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowFormat {
    /// The values' dtype.
    pub values: Dtype,
    /// Every slot column's dtype.
    pub slots: Dtype,
    /// How [`Table::update_rows`](super::Table::update_rows) rounds.
    pub rounding: Rounding,
    /// Slot columns (the first ones added, at most [`MAX_SLOTS`]) kept
    /// inside each row after its values, so that an optimizer step reads
    /// and writes one block per key; the rest get columns of their own.
    pub inline_slots: usize,
}

/// Rows of one table: the main column, the slot columns, the high-water mark
/// and the free pool.
pub(crate) struct RowStore {
    dim: usize,
    format: RowFormat,
    /// How the main column stores values.
    values: Codec,
    /// Whether rows carry a score word.
    scored: bool,
    /// Header words before a row's values.
    values_at: usize,
    /// Words of the header and the values, before any inline slot.
    values_end: usize,
    /// Words of one slot's row (inline room is this per inline slot).
    slot_words: usize,
    main: Column,
    /// Slot columns `0..slot_count`, added in order, never removed.
    slots: [OnceLock<SlotColumn>; MAX_SLOTS],
    slot_count: AtomicUsize,
    /// Serializes adding slots.
    adding_slot: Mutex<()>,
    /// Rows `0..high_water` have been handed out at least once.
    high_water: AtomicU64,
    /// Row ids free for reuse, in batches.
    free: Arc<SegQueue<Vec<u64>>>,
    /// Each row's eviction rank, if the table evicts (see [`Ranks`]).
    ranks: Option<Column>,
    /// How ranks follow writes.
    rank_rule: Ranks,
}

/// How a table that evicts ranks its rows, in a column of one word per row
/// beside the rows (so that an eviction sweep reads eight ranks per cache
/// line without touching a row). A rank of 0 means "not a candidate" (no
/// live row); a live row's rank is 1 more than what it is compared by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ranks {
    /// No eviction: no rank column.
    Off,
    /// The rank follows the row's score (a timestamp, or a count of
    /// writes).
    Scores,
    /// A count of writes that an ageing sweep halves as it passes (LFU
    /// ageing, see [`Bound`](super::bound::Bound));
    /// the row's score stays the plain count.
    DecayedCounts,
}

impl RowStore {
    /// An empty store for rows of `dim` values, with a score word per row
    /// when `scored`.
    #[cfg(test)]
    pub(crate) fn new(dim: usize, scored: bool) -> RowStore {
        Self::with_ranks(dim, scored, Ranks::Off, RowFormat::default())
    }

    /// [`RowStore::new`] that keeps an eviction rank per row by `rule` and
    /// stores numbers as `format` says.
    pub(crate) fn with_ranks(dim: usize, scored: bool, rule: Ranks, format: RowFormat) -> RowStore {
        let values_at = HEADER_WORDS + usize::from(scored);
        let values = Codec::new(format.values, 0.0);
        let values_end = values_at + values.words(dim);
        let slot_words = Codec::new(format.slots, 0.0).words(dim);
        let inline_words = format.inline_slots.min(MAX_SLOTS) * slot_words;
        RowStore {
            ranks: (rule != Ranks::Off).then(|| Column::new(1)),
            rank_rule: rule,
            dim,
            format,
            values,
            scored,
            values_at,
            values_end,
            slot_words,
            main: Column::with_prefix(values_end + inline_words, values_end),
            slots: std::array::from_fn(|_| OnceLock::new()),
            slot_count: AtomicUsize::new(0),
            adding_slot: Mutex::new(()),
            high_water: AtomicU64::new(0),
            free: Arc::new(SegQueue::new()),
        }
    }

    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    /// How the rows store their numbers.
    pub(crate) fn format(&self) -> RowFormat {
        self.format
    }

    /// `row += x` on a row's values (from [`RowStore::update`]) if every sum
    /// fits the value dtype; else the row is unchanged and the first sum
    /// that does not is returned.
    #[inline]
    pub(crate) fn add_if_fits(&self, values: &[AtomicU64], x: &[f32]) -> Result<(), f32> {
        self.values.add_if_fits(values, x)
    }

    /// One past the largest row id ever handed out.
    pub(crate) fn high_water(&self) -> u64 {
        self.high_water.load(Ordering::Acquire).min(MAX_ROWS)
    }

    /// Number of slot columns.
    pub(crate) fn slot_count(&self) -> usize {
        self.slot_count.load(Ordering::Acquire)
    }

    /// Slot column `slot` (`slot < slot_count()`).
    fn slot(&self, slot: usize) -> &SlotColumn {
        self.slots[slot]
            .get()
            .expect("slot columns below slot_count are set")
    }

    /// The initial value of slot column `slot`, if it exists.
    pub(crate) fn slot_initial(&self, slot: usize) -> Option<f32> {
        (slot < self.slot_count()).then(|| self.slot(slot).codec.initial())
    }

    /// The initial value slot column `slot` was added with, before rounding
    /// to the slot dtype, if it exists.
    pub(crate) fn slot_initial_asked(&self, slot: usize) -> Option<f32> {
        (slot < self.slot_count()).then(|| self.slot(slot).asked)
    }

    /// Adds a slot column whose rows start at `initial` rounded to the slot
    /// dtype (every existing row included); returns its index, or `None` if
    /// the store has [`MAX_SLOTS`] already.
    pub(crate) fn add_slot(&self, initial: f32) -> Option<usize> {
        let _adding = self
            .adding_slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let index = self.slot_count.load(Ordering::Relaxed);
        if index == MAX_SLOTS {
            return None;
        }
        let inline_at =
            (index < self.format.inline_slots).then(|| self.values_end + index * self.slot_words);
        if self.slots[index]
            .set(SlotColumn::new(
                self.dim,
                self.format.slots,
                initial,
                inline_at,
            ))
            .is_err()
        {
            unreachable!("slot {index} is set once, under the adding lock");
        }
        self.slot_count.store(index + 1, Ordering::Release);
        Some(index)
    }

    /// Bytes of the rows handed out so far, slot columns included (see
    /// [`Column::memory_bytes`]).
    pub(crate) fn memory_bytes(&self) -> usize {
        let rows = self.high_water();
        (0..self.slot_count())
            .filter_map(|slot| self.slot(slot).column())
            .map(|column| column.memory_bytes(rows))
            .sum::<usize>()
            + self.main.memory_bytes(rows)
            + self
                .ranks
                .as_ref()
                .map_or(0, |ranks| ranks.memory_bytes(rows))
    }

    /// Backs the next `rows` fresh row ids (from the high-water mark on)
    /// with memory now, in the main column and every slot column: see
    /// [`Table::reserve_rows`](super::table::Table::reserve_rows).
    /// At most `max_bytes` (and at most [`PREFAULT_MAX_BYTES`]) are backed.
    pub(crate) fn prefault(&self, rows: u64, max_bytes: u64) {
        let slot_columns = || {
            (0..self.slot_count())
                .filter_map(|slot| self.slot(slot).column())
                .chain(self.ranks.as_ref())
        };
        let row_bytes: usize = std::iter::once(&self.main)
            .chain(slot_columns())
            .map(|column| column.stride * 8)
            .sum();
        let rows = rows.min(max_bytes.min(PREFAULT_MAX_BYTES) / row_bytes as u64);
        let start = self.high_water();
        let end = start.saturating_add(rows).min(MAX_ROWS);
        for column in std::iter::once(&self.main).chain(slot_columns()) {
            column.prefault(start..end);
        }
    }

    /// The key `row` holds, read without its lock: a hint (for
    /// prefetching), which a concurrent write may make stale. `None` if the
    /// row's segment is not allocated.
    #[inline]
    pub(crate) fn key_hint(&self, row: u64) -> Option<u64> {
        self.main
            .try_row(row)
            .map(|words| words[1].load(Ordering::Relaxed))
    }

    /// Address and size of a row's header and values (not its inline
    /// slots), for prefetching.
    #[inline]
    pub(crate) fn row_span(&self, row: u64) -> (*const AtomicU64, usize) {
        (self.main.row_address(row), self.values_end * 8)
    }

    /// Address and size of a row of slot `slot`, in its column or inline,
    /// for prefetching (null if the slot or its segment does not exist).
    #[inline]
    pub(crate) fn slot_span(&self, slot: usize, row: u64) -> (*const AtomicU64, usize) {
        let bytes = |column: &SlotColumn| column.words * 8;
        match self.slots.get(slot).and_then(OnceLock::get) {
            Some(column) => match &column.place {
                SlotPlace::Column(own) => (own.row_address(row), bytes(column)),
                SlotPlace::Inline { at } => match self.main.try_row(row) {
                    Some(words) => (words[*at..].as_ptr(), bytes(column)),
                    None => (std::ptr::null(), 0),
                },
            },
            None => (std::ptr::null(), 0),
        }
    }

    /// Address and size of a row with the inline slots it has (its header,
    /// values and the room of the inline slots added so far), for
    /// prefetching a row that is written or read whole.
    #[inline]
    pub(crate) fn block_span(&self, row: u64) -> (*const AtomicU64, usize) {
        let inline = self.slot_count().min(self.format.inline_slots);
        (
            self.main.row_address(row),
            (self.values_end + inline * self.slot_words) * 8,
        )
    }

    /// A row id for a new key (from the cache, refilled from the free pool or
    /// the fresh range). Past [`MAX_ROWS`] it is
    /// [`Error::CapacityExceeded`](crate::Error::CapacityExceeded); if the
    /// segment of a fresh range cannot be allocated (the main column's, or
    /// that of a slot column the store has), it is
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) and the range is
    /// given back if no other thread took a range since (else its ids are
    /// never used).
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
            // Fresh ranges never straddle a segment (segments start at
            // multiples of 1024, ranges at multiples of FRESH_BATCH), so the
            // first row's segment is the range's.
            let slot_columns = (0..self.slot_count())
                .filter_map(|slot| self.slot(slot).column())
                .chain(self.ranks.as_ref());
            for column in std::iter::once(&self.main).chain(slot_columns) {
                if let Err(bytes) = column.try_ensure(start) {
                    let _ = self.high_water.compare_exchange(
                        start + FRESH_BATCH,
                        start,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                    return Err(crate::Error::OutOfMemory {
                        what: "rows",
                        bytes,
                    });
                }
            }
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
            // A new row's inline slots are written (reset) too, and so are
            // its rows in slot columns of their own and, in a bounded
            // table, its rank.
            let (address, bytes) = self.block_span(id);
            prefetch_span(address, bytes);
            for slot in self.format.inline_slots..self.slot_count() {
                let (address, bytes) = self.slot_span(slot, id);
                prefetch_span(address, bytes);
            }
            let rank = self.rank_address(id);
            if !rank.is_null() {
                prefetch_span(rank, 8);
            }
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

    /// Locks `row` and runs `body` on its words if it is live (or always,
    /// when `live` is `Some`: a new row's fill, a removal). `body` returns
    /// whether it wrote; if so the row's score becomes `score`'s, its
    /// version is bumped and its live bit set to `live` (if given). If it did
    /// not write, the row is released unchanged. Returns `None` for a dead
    /// row when `live` is `None`. Bodies run only kernels that do not panic,
    /// and user code (`update_with_slots`) before their first write; a panic
    /// anyway releases the row with a new version (see [`RowLock`]).
    #[inline]
    fn locked(
        &self,
        row: u64,
        live: Option<bool>,
        score: Score,
        body: impl FnOnce(&[AtomicU64]) -> bool,
    ) -> Option<bool> {
        let words = self.main.row(row);
        let state = &words[0];
        let before = Self::lock(state);
        let mut lock = RowLock {
            state,
            release_to: before,
        };
        if live.is_none() && before & LIVE == 0 {
            return None;
        }
        lock.release_to = (before & !LOCKED) + VERSION_STEP;
        if !body(words) {
            lock.release_to = before;
            return Some(false);
        }
        if self.scored {
            let word = &words[SCORE_WORD];
            let fresh = live == Some(true);
            let after = score.after(word.load(Ordering::Relaxed), fresh);
            word.store(after, Ordering::Relaxed);
            if let Some(ranks) = &self.ranks {
                let rank = &ranks.row(row)[0];
                let value = match live {
                    Some(false) => 0,
                    // A rank that follows the score needs no load.
                    _ if self.rank_rule == Ranks::Scores => after.saturating_add(1),
                    _ => self.rank_after(rank.load(Ordering::Relaxed), score, after, fresh),
                };
                rank.store(value, Ordering::Relaxed);
            }
        }
        let live_bit = match live {
            Some(true) => LIVE,
            Some(false) => 0,
            None => before & LIVE,
        };
        lock.release_to = ((before & !(LIVE | LOCKED)) + VERSION_STEP) | live_bit;
        Some(true)
    }

    /// Fills a row fresh from the cache with its key, values and `slots`
    /// (`(slot, row)` pairs; every other slot is reset to its initial value),
    /// rounded as `rounding` says (an optimizer step's insert rounds as the
    /// store's [`RowFormat::rounding`]; every other write to nearest even),
    /// and marks it live: called while the key's slot is pending, just before
    /// the key is published, so only an export scan can see the row before
    /// that.
    pub(crate) fn write_new(
        &self,
        row: u64,
        key: u64,
        values: &[f32],
        slots: &[(usize, &[f32])],
        score: Score,
        rounding: Rounding,
    ) {
        self.locked(row, Some(true), score, |words| {
            words[1].store(key, Ordering::Relaxed);
            let noise = noise(words, rounding);
            self.store_values(&words[self.values_at..self.values_end], values, noise);
            // Read under the row's lock: see the module docs.
            for slot in 0..self.slot_count() {
                match slots.iter().find(|(s, _)| *s == slot) {
                    Some((_, src)) => {
                        self.slot(slot)
                            .store(words, row, src, column_noise(noise, slot))
                    }
                    None => self.slot(slot).reset(words, row),
                }
            }
            true
        });
    }

    /// Stores a row's values, rounding stochastically with `noise` if given.
    fn store_values(&self, values: &[AtomicU64], src: &[f32], noise: Option<u64>) {
        match noise {
            Some(noise) => self.values.store_stochastic(values, src, mix(noise)),
            None => self.values.store(values, src),
        }
    }

    /// Marks a removed key's row as dead.
    pub(crate) fn mark_dead(&self, row: u64) {
        self.locked(row, Some(false), Score::Keep, |_| true);
    }

    /// Read-modify-write of a live row's values under its lock:
    /// `update(values)` returns whether it wrote them, and if it did the
    /// row's score is set. If it did not (an accumulation whose result would
    /// not be finite), it must have written nothing: the row is released
    /// unchanged, score and version included. Returns `None` if the row is
    /// dead: its key was removed after the caller found the row (the caller
    /// then looks the key up again; while it is pinned the dead row cannot be
    /// reused for another key); else whether it was written.
    #[must_use]
    #[inline]
    pub(crate) fn update(
        &self,
        row: u64,
        score: Score,
        update: impl FnOnce(&[AtomicU64]) -> bool,
    ) -> Option<bool> {
        self.locked(row, None, score, |words| {
            update(&words[self.values_at..self.values_end])
        })
    }

    /// Overwrites a live row's values and the given slots (`(slot, row)`
    /// pairs) and sets its score; false if the row is dead (as
    /// [`RowStore::update`]).
    #[must_use]
    pub(crate) fn overwrite(
        &self,
        row: u64,
        values: &[f32],
        slots: &[(usize, &[f32])],
        score: Score,
    ) -> bool {
        self.locked(row, None, score, |words| {
            self.values
                .store(&words[self.values_at..self.values_end], values);
            for &(slot, src) in slots {
                self.slot(slot).store(words, row, src, None);
            }
            true
        })
        .is_some()
    }

    /// Read-modify-write of a live row and some of its slots under its
    /// lock: copies the values into `scratch[..dim]` and slot `slots[j]`
    /// into `scratch[(j + 1) * dim..]`, runs `update(values, slot_rows)` and,
    /// if it returns true, writes them back and sets the score. Returns
    /// `None` if the row is dead, else whether it was written. If `update`
    /// panics the row is released unchanged.
    pub(crate) fn update_with_slots(
        &self,
        row: u64,
        score: Score,
        slots: &[usize],
        scratch: &mut [f32],
        update: impl FnOnce(&mut [f32], &mut [f32]) -> bool,
    ) -> Option<bool> {
        let dim = self.dim;
        self.locked(row, None, score, |words| {
            let (values, slot_rows) = scratch.split_at_mut(dim);
            let at = &words[self.values_at..self.values_end];
            self.values.load(at, values);
            for (&slot, out) in slots.iter().zip(slot_rows.chunks_exact_mut(dim)) {
                self.slot(slot).load(words, row, out);
            }
            if !update(values, slot_rows) {
                return false;
            }
            let noise = noise(words, self.format.rounding);
            self.store_values(at, values, noise);
            for (&slot, src) in slots.iter().zip(slot_rows.chunks_exact(dim)) {
                self.slot(slot)
                    .store(words, row, src, column_noise(noise, slot));
            }
            true
        })
    }

    /// Seqlock read of one row: copies its values into `out`, the first
    /// `slot_out.len() / dim` slots into `slot_out`, and returns the state,
    /// key and score they belong to. Never returns a torn row.
    #[inline]
    fn read_consistent(
        &self,
        row: u64,
        words: &[AtomicU64],
        out: &mut [f32],
        slot_out: &mut [f32],
    ) -> (u64, u64, u64) {
        let state = &words[0];
        let backoff = Backoff::new();
        loop {
            let before = state.load(Ordering::Acquire);
            if before & LOCKED != 0 {
                backoff.snooze();
                continue;
            }
            self.values
                .load(&words[self.values_at..self.values_end], out);
            for (slot, slot_row) in slot_out.chunks_exact_mut(self.dim.max(1)).enumerate() {
                self.slot(slot).load(words, row, slot_row);
            }
            let key = words[1].load(Ordering::Relaxed);
            let score = if self.scored {
                words[SCORE_WORD].load(Ordering::Relaxed)
            } else {
                0
            };
            fence(Ordering::Acquire);
            if state.load(Ordering::Relaxed) == before {
                return (before, key, score);
            }
        }
    }

    /// Copies the row's values into `out` (`out.len() == dim`).
    #[inline]
    pub(crate) fn read(&self, row: u64, out: &mut [f32]) {
        self.read_consistent(row, self.main.row(row), out, &mut []);
    }

    /// If the row is live, copies its values into `out` and its first
    /// `slot_out.len() / dim` slots into `slot_out` (one consistent version
    /// of all of them), and returns its key and score. Any id below the
    /// high-water mark may be asked (unallocated: `None`).
    pub(crate) fn read_live(
        &self,
        row: u64,
        out: &mut [f32],
        slot_out: &mut [f32],
    ) -> Option<(u64, u64)> {
        let words = self.main.try_row(row)?;
        let (state, key, score) = self.read_consistent(row, words, out, slot_out);
        (state & LIVE != 0).then_some((key, score))
    }

    /// Copies slot `slot`'s row into `out` (a consistent version of it).
    pub(crate) fn read_slot(&self, row: u64, slot: usize, out: &mut [f32]) {
        let words = self.main.row(row);
        let state = &words[0];
        let column = self.slot(slot);
        let backoff = Backoff::new();
        loop {
            let before = state.load(Ordering::Acquire);
            if before & LOCKED != 0 {
                backoff.snooze();
                continue;
            }
            column.load(words, row, out);
            fence(Ordering::Acquire);
            if state.load(Ordering::Relaxed) == before {
                return;
            }
        }
    }

    /// A written row's new rank, from its rank before, the write's score
    /// rule and the score it left (see [`Ranks`]).
    fn rank_after(&self, old: u64, rule: Score, score: u64, fresh: bool) -> u64 {
        match (self.rank_rule, rule) {
            (Ranks::DecayedCounts, Score::Count) if !fresh => old.max(1).saturating_add(1),
            _ => score.saturating_add(1),
        }
    }

    /// The eviction rank of `row` (0: not a candidate, or no rank column).
    /// A hint read without the row's lock.
    #[inline]
    pub(crate) fn rank(&self, row: u64) -> u64 {
        self.ranks
            .as_ref()
            .and_then(|ranks| ranks.try_row(row))
            .map_or(0, |words| words[0].load(Ordering::Relaxed))
    }

    /// Address of the rank of `row`, for prefetching (null without a rank
    /// column).
    #[inline]
    pub(crate) fn rank_address(&self, row: u64) -> *const AtomicU64 {
        self.ranks
            .as_ref()
            .map_or(std::ptr::null(), |ranks| ranks.row_address(row))
    }

    /// Halves the decayed count of a live row as the sweep passes it (a
    /// race with a write loses one of the two, which a hint may).
    pub(crate) fn age_rank(&self, row: u64, seen: u64) {
        if self.rank_rule != Ranks::DecayedCounts || seen <= 1 {
            return;
        }
        if let Some(words) = self.ranks.as_ref().and_then(|ranks| ranks.try_row(row)) {
            let halved = (seen / 2).max(1);
            let _ = words[0].compare_exchange(seen, halved, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Under the row's lock: if the row is live, asks `decide(key, score)`
    /// whether it goes (the caller unlinks the key from the index there);
    /// on [`Unlink::Removed`] copies the row (values, every slot, score)
    /// into `take` if given and marks it dead, all before the lock is
    /// released, so no write can land after the copy. Otherwise the row is
    /// released unchanged.
    pub(crate) fn unlink(
        &self,
        row: u64,
        take: Option<&mut EvictedRows>,
        decide: impl FnOnce(u64, u64) -> Unlink,
    ) -> Unlink {
        let Some(words) = self.main.try_row(row) else {
            return Unlink::Kept;
        };
        let state = &words[0];
        let before = Self::lock(state);
        let mut lock = RowLock {
            state,
            release_to: before,
        };
        if before & LIVE == 0 {
            return Unlink::Kept;
        }
        let key = words[1].load(Ordering::Relaxed);
        let score = if self.scored {
            words[SCORE_WORD].load(Ordering::Relaxed)
        } else {
            0
        };
        let decision = decide(key, score);
        if decision != Unlink::Removed {
            return decision;
        }
        if let Some(take) = take {
            self.copy_out(row, words, key, score, take);
        }
        if let Some(ranks) = &self.ranks {
            ranks.row(row)[0].store(0, Ordering::Relaxed);
        }
        lock.release_to = (before & !(LIVE | LOCKED)) + VERSION_STEP;
        Unlink::Removed
    }

    /// Appends a locked row's key, values, slots and score to `take`.
    fn copy_out(
        &self,
        row: u64,
        words: &[AtomicU64],
        key: u64,
        score: u64,
        take: &mut EvictedRows,
    ) {
        let dim = self.dim;
        let rows_before = take.keys.len();
        take.keys.push(key);
        let at = take.values.len();
        take.values.resize(at + dim, 0.0);
        self.values.load(
            &words[self.values_at..self.values_end],
            &mut take.values[at..],
        );
        if self.scored {
            take.scores.push(score);
        }
        let count = self.slot_count();
        while take.slots.len() < count {
            // A slot added since this batch's first eviction: its earlier
            // rows held the slot's initial value.
            let initial = self.slot(take.slots.len()).codec.initial();
            take.slots.push(vec![initial; rows_before * dim]);
        }
        for (slot, column) in take.slots.iter_mut().enumerate().take(count) {
            let at = column.len();
            column.resize(at + dim, 0.0);
            self.slot(slot).load(words, row, &mut column[at..]);
        }
    }

    /// The score of `row` if it is live (a hint, read without its lock;
    /// `None` for a dead or unallocated row).
    pub(crate) fn live_score(&self, row: u64) -> Option<u64> {
        let words = self.main.try_row(row)?;
        if words[0].load(Ordering::Relaxed) & LIVE == 0 {
            return None;
        }
        Some(if self.scored {
            words[SCORE_WORD].load(Ordering::Relaxed)
        } else {
            0
        })
    }

    /// The row's score (0 in a store without scores).
    pub(crate) fn score(&self, row: u64) -> u64 {
        if self.scored {
            self.main.row(row)[SCORE_WORD].load(Ordering::Relaxed)
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::kernels::{axpy_row, store_row};

    #[test]
    fn strides_keep_rows_in_their_fewest_lines() {
        // Dim 64: f32 with and without a score, bf16 with and without.
        assert_eq!(line_stride(34, 34), 34);
        assert_eq!(line_stride(35, 35), 36);
        assert_eq!(line_stride(18, 18), 18);
        assert_eq!(line_stride(19, 19), 20);
        // Padding 48 bytes to 64 costs a third: not done.
        assert_eq!(line_stride(6, 6), 6);
        assert_eq!(line_stride(1, 1), 1);
        assert_eq!(line_stride(32, 32), 32);
        for words in 1..300 {
            let stride = line_stride(words, words);
            let bytes = words * 8;
            assert!(stride >= words && (stride - words) * 8 <= words, "{words}");
            let fewest = bytes.div_ceil(64);
            let span = |row: usize| (row * stride * 8 % 64 + bytes).div_ceil(64);
            let minimal = (0..64).all(|row| span(row) == fewest);
            let padding_would_cost = (bytes..=fewest * 64).step_by(8).all(|s| {
                (s - bytes) * 8 > bytes
                    || (0..64).any(|row| (row * s % 64 + bytes).div_ceil(64) > fewest)
            });
            assert!(
                minimal || (stride == words && padding_would_cost),
                "{words}"
            );
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "arithmetic only, and long under Miri")]
    fn strides_keep_a_lookups_prefix_in_its_fewest_lines() {
        // Lines spanned by `len` bytes at the start of row `row`.
        let span =
            |stride: usize, row: usize, len: usize| (row * stride * 8 % 64 + len).div_ceil(64);
        let fewest = |stride: usize, len: usize| {
            (0..64).all(|row| span(stride, row, len) == len.div_ceil(64))
        };
        for words in 1..260 {
            for prefix in 1..=words {
                let stride = line_stride(words, prefix);
                let (bytes, prefix_bytes) = (words * 8, prefix * 8);
                let within = |s: usize| s >= words && (s - words) * 8 <= words;
                assert!(stride == words || within(stride), "{words} {prefix}");
                let candidates = (words..=bytes.div_ceil(64) * 8).filter(|&s| within(s));
                let both = |s: usize| fewest(s, bytes) && fewest(s, prefix_bytes);
                if candidates.clone().any(both) {
                    assert!(both(stride), "{words} {prefix}: {stride}");
                } else if candidates.clone().any(|s| fewest(s, prefix_bytes)) {
                    assert!(fewest(stride, prefix_bytes), "{words} {prefix}: {stride}");
                }
            }
        }
        // Dim 64 f32 with a score and Adam's slots inline: the values' five
        // lines and the whole row's thirteen, at every row id.
        let (prefix, words) = (3 + 32, 3 + 32 + 64);
        assert!(fewest(line_stride(words, prefix), words * 8));
        assert!(fewest(line_stride(words, prefix), prefix * 8));
    }

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
        let store = RowStore::new(3, false);
        let mut cache = RowCache::default();
        let ids: Vec<u64> = (0..3000).map(|_| store.take(&mut cache).unwrap()).collect();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "row ids are unique");
        for &id in &ids {
            store.write_new(
                id,
                id * 10,
                &[id as f32, 1.0, -(id as f32)],
                &[],
                Score::Keep,
                Rounding::NearestEven,
            );
        }
        let mut out = [0.0; 3];
        for &id in &ids {
            assert_eq!(store.read_live(id, &mut out, &mut []), Some((id * 10, 0)));
            assert_eq!(out, [id as f32, 1.0, -(id as f32)]);
        }
        let add = |words: &[AtomicU64]| {
            axpy_row(words, 2.0, &[1.0, 1.0, 1.0]);
            true
        };
        assert_eq!(store.update(ids[5], Score::Keep, add), Some(true));
        store.read(ids[5], &mut out);
        assert_eq!(out, [ids[5] as f32 + 2.0, 3.0, -(ids[5] as f32) + 2.0]);
        store.mark_dead(ids[5]);
        assert_eq!(store.read_live(ids[5], &mut out, &mut []), None);
        let nine = |words: &[AtomicU64]| {
            store_row(words, &[9.0; 3]);
            true
        };
        assert_eq!(
            store.update(ids[5], Score::Keep, nine),
            None,
            "a dead row is not written"
        );
        store.read(ids[5], &mut out);
        assert_eq!(out, [ids[5] as f32 + 2.0, 3.0, -(ids[5] as f32) + 2.0]);
        assert!(store.memory_bytes() >= 3000 * (2 + 2) * 8);
        store.release(cache);
    }

    #[test]
    #[cfg_attr(miri, ignore = "asks the allocator for 2^62 bytes")]
    fn a_segment_that_cannot_be_allocated_is_an_error_not_an_abort() {
        // Rows of 2^30 values: segment 20 (2^30 rows) would be 2^62 bytes,
        // more than any address space.
        let store = RowStore::new(1 << 30, false);
        let start = (1u64 << 30) - (1 << FIRST_SEGMENT_SHIFT);
        assert_eq!(Column::locate(start), (20, 0));
        store.high_water.store(start, Ordering::Relaxed);
        let mut cache = RowCache::default();
        match store.take(&mut cache) {
            Err(crate::Error::OutOfMemory {
                what: "rows",
                bytes,
            }) => {
                assert_eq!(bytes, (1 << 30) * ((1 << 29) + 2) * 8)
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(store.high_water(), start, "the range is given back");
        assert!(cache.ids.is_empty());
        // A slot column's segment is allocated with the main column's.
        let store = RowStore::new(2, false);
        store.add_slot(0.5).unwrap();
        let row = store.take(&mut cache).unwrap();
        assert!(store.slot(0).column().unwrap().try_row(row).is_some());
        store.release(cache);
    }

    #[test]
    fn put_back_and_release_recycle_unpublished_ids() {
        let store = RowStore::new(1, false);
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
        let store = RowStore::new(1, false);
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
        let store = RowStore::new(33, false);
        let mut cache = RowCache::default();
        let row = store.take(&mut cache).unwrap();
        store.write_new(row, 1, &[0.0; 33], &[], Score::Keep, Rounding::NearestEven);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..if cfg!(miri) { 50 } else { 2000 } {
                    let fill = |w: &[AtomicU64]| {
                        store_row(w, &[i as f32; 33]);
                        true
                    };
                    assert_eq!(store.update(row, Score::Keep, fill), Some(true));
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

    #[test]
    fn slots_start_at_their_initial_value_and_are_reset_on_reuse() {
        // Both slots in columns, the first inline, both inline.
        for inline_slots in 0..=2 {
            slots_start_and_reset(inline_slots);
        }
    }

    fn slots_start_and_reset(inline_slots: usize) {
        let format = RowFormat {
            inline_slots,
            ..RowFormat::default()
        };
        let store = RowStore::with_ranks(3, false, Ranks::Off, format);
        let mut cache = RowCache::default();
        let old = store.take(&mut cache).unwrap();
        store.write_new(old, 1, &[1.0; 3], &[], Score::Keep, Rounding::NearestEven);
        // Added after the row exists: the row reads the initial value.
        let m = store.add_slot(0.0).unwrap();
        let acc = store.add_slot(0.1).unwrap();
        assert_eq!((m, acc, store.slot_count()), (0, 1, 2));
        let mut scratch = [0.0; 9];
        let wrote = store.update_with_slots(old, Score::Keep, &[acc, m], &mut scratch, |v, s| {
            assert_eq!(v, [1.0; 3]);
            assert_eq!(s, [0.1, 0.1, 0.1, 0.0, 0.0, 0.0]);
            v.fill(2.0);
            s[..3].fill(0.5);
            s[3..].fill(-1.0);
            true
        });
        assert_eq!(wrote, Some(true));
        let (mut out, mut slot_out) = ([0.0; 3], [0.0; 6]);
        assert_eq!(store.read_live(old, &mut out, &mut slot_out), Some((1, 0)));
        assert_eq!(
            (out, slot_out),
            ([2.0; 3], [-1.0, -1.0, -1.0, 0.5, 0.5, 0.5])
        );
        // A refused update leaves the row as it was.
        let refused = store.update_with_slots(old, Score::Keep, &[m], &mut scratch[..6], |v, s| {
            v.fill(f32::NAN);
            s.fill(f32::NAN);
            false
        });
        assert_eq!(refused, Some(false));
        store.read_slot(old, m, &mut out);
        assert_eq!(out, [-1.0; 3]);
        // The row is removed and its id reused: every slot is reset.
        store.mark_dead(old);
        assert_eq!(
            store.update_with_slots(old, Score::Keep, &[m], &mut scratch[..6], |_, _| true),
            None
        );
        store.write_new(
            old,
            2,
            &[3.0; 3],
            &[(acc, &[7.0; 3])],
            Score::Keep,
            Rounding::NearestEven,
        );
        assert_eq!(store.read_live(old, &mut out, &mut slot_out), Some((2, 0)));
        assert_eq!(slot_out, [0.0, 0.0, 0.0, 7.0, 7.0, 7.0]);
        assert!(store.overwrite(old, &[4.0; 3], &[(m, &[8.0; 3])], Score::Keep));
        store.read_slot(old, m, &mut out);
        assert_eq!(out, [8.0; 3]);
        // Two header words, then two words of values and of each slot.
        let (main_words, slot_words) = (2 + 2 + 2 * inline_slots, 2);
        assert_eq!(
            store.memory_bytes(),
            FRESH_BATCH as usize * (main_words + (2 - inline_slots) * slot_words) * 8,
            "rows handed out, in the main column and the slots' own columns"
        );
        for _ in 2..MAX_SLOTS {
            assert!(store.add_slot(0.0).is_some());
        }
        assert_eq!(store.add_slot(0.0), None, "at most MAX_SLOTS slots");
        store.release(cache);
    }

    #[test]
    fn scores_follow_each_write() {
        let store = RowStore::new(2, true);
        let mut cache = RowCache::default();
        let row = store.take(&mut cache).unwrap();
        store.write_new(
            row,
            5,
            &[1.0, 2.0],
            &[],
            Score::Count,
            Rounding::NearestEven,
        );
        assert_eq!(store.score(row), 1);
        assert_eq!(store.update(row, Score::Count, |_| true), Some(true));
        assert!(store.overwrite(row, &[3.0, 4.0], &[], Score::Count));
        assert_eq!(store.score(row), 3);
        assert_eq!(store.update(row, Score::Keep, |_| true), Some(true));
        assert_eq!(store.score(row), 3);
        assert_eq!(store.update(row, Score::Stamp(50), |_| true), Some(true));
        assert_eq!(store.score(row), 50);
        assert_eq!(store.update(row, Score::Stamp(40), |_| true), Some(true));
        assert_eq!(store.score(row), 50, "an earlier stamp never moves it back");
        assert_eq!(store.update(row, Score::Set(99), |_| true), Some(true));
        assert_eq!(
            store.update(row, Score::Set(7), |_| false),
            Some(false),
            "a refused update keeps the score"
        );
        let mut out = [0.0; 2];
        assert_eq!(store.read_live(row, &mut out, &mut []), Some((5, 99)));
        assert_eq!(out, [3.0, 4.0], "the score word does not shift the values");
        store.mark_dead(row);
        store.write_new(row, 6, &[0.0; 2], &[], Score::Keep, Rounding::NearestEven);
        assert_eq!(store.score(row), 0, "a new row starts over");
        assert_eq!(RowStore::new(2, false).score(0), 0);
        store.release(cache);
    }

    #[test]
    fn a_panicking_update_leaves_the_row_unlocked_and_unchanged() {
        let store = RowStore::new(2, false);
        let slot = store.add_slot(0.0).unwrap();
        let mut cache = RowCache::default();
        let row = store.take(&mut cache).unwrap();
        store.write_new(row, 5, &[1.0, 2.0], &[], Score::Keep, Rounding::NearestEven);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut scratch = [0.0; 4];
            store.update_with_slots(row, Score::Keep, &[slot], &mut scratch, |v, _| {
                v.fill(9.0);
                panic!("the update fails");
            })
        }));
        assert!(panicked.is_err());
        let mut out = [0.0; 2];
        store.read(row, &mut out);
        assert_eq!(out, [1.0, 2.0]);
        let three = |w: &[AtomicU64]| {
            store_row(w, &[3.0, 3.0]);
            true
        };
        assert_eq!(store.update(row, Score::Keep, three), Some(true));
        store.release(cache);
    }

    #[test]
    fn readers_see_values_slots_and_score_of_one_version() {
        // Every dtype, and a dim that takes two chunks of halves and ends in
        // a part word; the slot is XOR-encoded (initial value 0.25). Miri,
        // which runs the word loops, takes one dtype.
        let cases: &[(Dtype, usize)] = if cfg!(miri) {
            &[(Dtype::Bf16, 67)]
        } else {
            &[
                (Dtype::F32, 5),
                (Dtype::F32, 67),
                (Dtype::F16, 5),
                (Dtype::F16, 67),
                (Dtype::Bf16, 5),
                (Dtype::Bf16, 67),
            ]
        };
        for &(dtype, dim) in cases {
            // The slot in a column of its own, and inline.
            for inline_slots in [0, 1] {
                let format = RowFormat {
                    values: dtype,
                    slots: dtype,
                    rounding: Rounding::NearestEven,
                    inline_slots,
                };
                one_version_under_writes(RowStore::with_ranks(dim, true, Ranks::Off, format));
            }
        }
    }

    /// A writer sets the values to `i % 256` and the slot to its negation
    /// (exact in every dtype) with score `i`, while a reader checks that
    /// each read is one such version.
    fn one_version_under_writes(store: RowStore) {
        let dim = store.dim;
        let slot = store.add_slot(0.25).unwrap();
        let mut cache = RowCache::default();
        let row = store.take(&mut cache).unwrap();
        store.write_new(
            row,
            1,
            &vec![0.0; dim],
            &[(slot, &vec![0.0; dim])],
            Score::Set(0),
            Rounding::NearestEven,
        );
        let steps = if cfg!(miri) { 20 } else { 2000 };
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut scratch = vec![0.0; 2 * dim];
                for i in 1..=steps {
                    let step = Score::Set(i);
                    let wrote =
                        store.update_with_slots(row, step, &[slot], &mut scratch, |v, m| {
                            v.fill((i % 256) as f32);
                            m.fill(-((i % 256) as f32));
                            true
                        });
                    assert_eq!(wrote, Some(true));
                }
            });
            s.spawn(|| {
                let (mut values, mut slots) = (vec![0.0; dim], vec![0.0; dim]);
                for _ in 0..steps {
                    let (_, score) = store.read_live(row, &mut values, &mut slots).unwrap();
                    let i = (score % 256) as f32;
                    assert!(values.iter().all(|&v| v == i), "{values:?} at {score}");
                    assert!(slots.iter().all(|&m| m == -i), "{slots:?} at {score}");
                }
            });
        });
        store.release(cache);
    }
}
