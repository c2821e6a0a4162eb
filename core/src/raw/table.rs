//! [`Table`]: one shard of a variable, a lock-free map from 64-bit keys to
//! rows of `dim` floats, operated on in batches.
//!
//! A table is an [`Index`] (keys to row ids; replaced by a larger one when it
//! fills, see [`index`](super::index)) over a [`RowStore`] (the rows, which
//! never move). Every batch pins the table's epoch once; index arrays and row
//! ids that are retired while a batch runs are freed only after it ends.
//!
//! Every batched operation walks its keys in one software pipeline (see
//! [`pipeline`](super::pipeline)): a key's tag group, slot and row are
//! prefetched a few keys before it is reached. Writes (`upsert`, `accum`,
//! `update_rows`, `upsert_rows`) lock one row at a time; reads take no lock.
//!
//! Growth: an insert that cannot reserve a slot closes the index, allocates
//! the next one sized for twice the live keys, and migrates it together with
//! every other writer that runs into the migration; readers keep reading the
//! old index and follow `next` for keys already moved, so they never wait.

use super::bound::{Bound, MAX_VICTIMS};
use super::epoch::Epoch;
use super::index::{hash_key, FirstGroup, Index, Insert, Remove, MIN_CAPACITY};
use super::kernels::{prefetch, prefetch_span};
use super::pipeline::Access;
use super::rows::{Ranks, RowCache, RowFormat, RowStore, Score, Unlink, MAX_ROWS, MAX_SLOTS};
use super::sync::Spin;
use crate::lifecycle::admission::Admitter;
use crate::lifecycle::{delivery, EvictedRows, ShardListener};
use crate::restrict::next_timestamp;
use crate::{Error, RestrictPolicy, Result, Rounding};
use crossbeam_epoch::{Atomic, Guard, Owned, Shared};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// Largest row width (`dim`) a table, and so a variable, accepts.
pub const MAX_DIM: usize = 1 << 20;

/// How many groups ahead a migrator prefetches its keys' new tag groups.
const MIGRATE_TAGS_AHEAD: usize = 4;
/// How many groups ahead it prefetches the slots they will claim.
const MIGRATE_SLOTS_AHEAD: usize = 2;
/// How far ahead an export scan prefetches rows.
const EXPORT_PREFETCH: u64 = 4;
/// Row ids one pin of an expiry scan covers.
const EXPIRE_CHUNK: u64 = 4096;
/// Picks of victims an insert into a full table tries before it waits for
/// the permits of batches in flight.
const EVICT_ATTEMPTS: usize = 4;
/// Row id meaning "not found".
pub(super) const MISSING: u64 = u64::MAX;

/// Where the rows of a batch's keys are in the caller's buffers.
#[derive(Clone, Copy, Debug)]
pub enum Positions<'a> {
    /// Key `i` uses row `i` (and `exists[i]`).
    Dense,
    /// Key `i` uses row `at[i]` (a shard's share of a larger batch).
    At(&'a [u32]),
}

impl Positions<'_> {
    /// The buffer row of the batch's key `i`.
    #[inline]
    pub fn of(self, i: usize) -> usize {
        match self {
            Positions::Dense => i,
            Positions::At(at) => at[i] as usize,
        }
    }

    /// Checks that every key has a position inside a buffer of `rows` rows.
    fn check(self, keys: usize, rows: usize, what: &'static str, dim: usize) -> Result<()> {
        match self {
            Positions::Dense if keys == rows => Ok(()),
            Positions::Dense => Err(Error::LengthMismatch {
                what,
                expected: keys.saturating_mul(dim),
                actual: rows.saturating_mul(dim),
            }),
            Positions::At(at) if at.len() != keys => Err(Error::LengthMismatch {
                what: "positions",
                expected: keys,
                actual: at.len(),
            }),
            Positions::At(at) => match at.iter().map(|&p| p as usize).max() {
                Some(max) if max >= rows => Err(Error::LengthMismatch {
                    what,
                    expected: (max + 1).saturating_mul(dim),
                    actual: rows.saturating_mul(dim),
                }),
                _ => Ok(()),
            },
        }
    }
}

/// Removes `key` from `index` if it still maps to `row`: what an eviction
/// or expiry decides under the row's lock.
fn unlink_key(index: &Index, key: u64, row: u64) -> Unlink {
    match index.remove_row(key, hash_key(key), row) {
        Remove::Removed(_) => Unlink::Removed,
        Remove::Absent => Unlink::Kept,
        Remove::Migrating => Unlink::Retry,
    }
}

/// Checks that a flat buffer holds whole rows of `dim` and returns how many.
fn rows_in(buffer: usize, dim: usize, what: &'static str, keys: usize) -> Result<usize> {
    if !buffer.is_multiple_of(dim) {
        return Err(Error::LengthMismatch {
            what,
            expected: keys.saturating_mul(dim),
            actual: buffer,
        });
    }
    Ok(buffer / dim)
}

/// A lock-free, growable map from `u64` keys to rows of `dim` `f32`s.
///
/// All operations take a batch of keys; row buffers are flat (`dim` values
/// per row). Safe to share between threads (`&Table` everywhere). Most users
/// want [`Variable`](crate::Variable), which shards keys over several tables.
pub struct Table {
    index: Atomic<Index>,
    pub(super) rows: RowStore,
    len: AtomicI64,
    epoch: Epoch,
    policy: Option<RestrictPolicy>,
    /// The capacity, if bounded.
    bound: Option<Bound>,
    /// Admission counts, if keys are admitted after a few training reads.
    pub(super) admitter: Option<Arc<Admitter>>,
    /// Receives evicted rows.
    listener: Option<ShardListener>,
    /// Rows evicted so far.
    evicted: AtomicU64,
    /// Training reads of keys not admitted so far.
    not_admitted: AtomicU64,
}

/// What a table does besides holding rows: a capacity (with eviction and
/// its listener) and admission.
#[derive(Clone, Default)]
pub(crate) struct Lifecycle {
    /// Most rows the table holds.
    pub(crate) capacity: Option<usize>,
    /// Whether eviction halves Frequency counts as its sweep passes.
    pub(crate) frequency_decay: bool,
    /// Admission counts (shared by a variable's shards).
    pub(crate) admitter: Option<Arc<Admitter>>,
    /// Receives evicted rows.
    pub(crate) listener: Option<ShardListener>,
}

/// What an export scan copies besides the keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportColumns {
    /// The rows' values.
    pub values: bool,
    /// Every slot column's rows.
    pub slots: bool,
    /// The rows' scores.
    pub scores: bool,
}

/// Rows copied by [`Table::export_rows`]; row `r` of each column belongs to
/// `keys[r]`, and columns not asked for are empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExportedRows {
    /// The rows' keys.
    pub keys: Vec<u64>,
    /// `dim` values per row.
    pub values: Vec<f32>,
    /// Per slot column (in slot order), `dim` values per row.
    pub slots: Vec<Vec<f32>>,
    /// One score per row.
    pub scores: Vec<u64>,
    /// The row id to continue the scan from ([`Table::end_of_rows`] when the
    /// scan is done).
    pub next: u64,
}

/// One key's rows of some slot columns, as `(slot, row)` pairs, held
/// without allocating (a table has at most [`MAX_SLOTS`] slots).
struct SlotRows<'a> {
    pairs: [(usize, &'a [f32]); MAX_SLOTS],
    len: usize,
}

impl<'a> SlotRows<'a> {
    /// The first [`MAX_SLOTS`] pairs of `pairs`.
    fn new(pairs: impl IntoIterator<Item = (usize, &'a [f32])>) -> Self {
        let mut rows = SlotRows {
            pairs: [(0, &[]); MAX_SLOTS],
            len: 0,
        };
        for (dst, pair) in rows.pairs.iter_mut().zip(pairs) {
            *dst = pair;
            rows.len += 1;
        }
        rows
    }

    fn as_slice(&self) -> &[(usize, &'a [f32])] {
        &self.pairs[..self.len]
    }
}

/// Per-batch state of a writing batch: the index it works in, its slot
/// reservation and row ids, and counts to publish at the end.
struct Writer<'t, 'g> {
    table: &'t Table,
    guard: &'g Guard,
    index: Shared<'g, Index>,
    budget: usize,
    cache: RowCache,
    inserted: i64,
    /// Insert permits held (a bounded table's, see [`Bound`]).
    permits: usize,
    /// Rows this batch evicted, for the listener.
    evicted: EvictedRows,
    /// Row ids this batch evicted, retired at its end.
    retired: Vec<u64>,
    /// Training reads of keys not admitted.
    not_admitted: u64,
    /// Training reads counted by the admitter, noted to it at the end.
    counted: u64,
    /// Rows picked for eviction, `(rank, row)`, and how many of them were
    /// taken; those left go back to the pool at the batch's end.
    victims: Vec<(u64, u64)>,
    next_victim: usize,
    /// Keys of the batch from the one being written on: the most inserts
    /// it may still need room for.
    keys_left: usize,
    /// Whether this batch's evictions may age LFU ranks (see [`Bound`]):
    /// all but a checkpoint's, which sets the scores it writes.
    ages: bool,
}

impl<'t, 'g> Writer<'t, 'g> {
    fn new(table: &'t Table, guard: &'g Guard) -> Self {
        Writer {
            table,
            guard,
            index: table.index.load(Ordering::Acquire, guard),
            budget: 0,
            cache: RowCache::default(),
            inserted: 0,
            permits: 0,
            evicted: EvictedRows::default(),
            retired: Vec::new(),
            not_admitted: 0,
            counted: 0,
            victims: Vec::new(),
            next_victim: 0,
            keys_left: 1,
            ages: true,
        }
    }

    fn index(&self) -> &'g Index {
        // SAFETY: `index` was loaded from the table under `guard`; indexes are
        // only freed through `defer_destroy` after being unlinked, so it
        // stays valid while `guard` is pinned.
        unsafe { self.index.deref() }
    }

    /// Finishes the migration out of the current index and moves to the
    /// table's newest index.
    fn catch_up(&mut self) {
        self.table.help_migrate(self.index, self.guard);
        self.index().unreserve(std::mem::take(&mut self.budget));
        self.index = self.table.index.load(Ordering::Acquire, self.guard);
    }

    /// Row id of `key`, inserting it if absent, in one probe. `fill(row)`
    /// writes the new row (key, values, live) while its slot is pending; it
    /// runs only if the key was absent. Returns the row id and whether this
    /// call inserted it.
    fn find_or_insert(
        &mut self,
        key: u64,
        hash: u64,
        fill: impl FnOnce(u64),
    ) -> Result<(u64, bool)> {
        if self.table.bound.is_some() && self.permits == 0 {
            // The caller's probe may be stale (an earlier occurrence of the
            // key in this batch inserted it since): look again before
            // taking a permit, which may evict a row. (A permit held
            // already is kept if the insert finds the key.)
            if let Some(existing) = self.table.find(self.index(), key, hash, self.guard) {
                return Ok((existing, false));
            }
        }
        let row = self.table.rows.take(&mut self.cache)?;
        if self.table.bound.is_some() {
            self.take_permit();
        }
        let mut fill = Some(fill);
        loop {
            let publish = || {
                if let Some(fill) = fill.take() {
                    fill(row);
                }
            };
            match self
                .index()
                .insert(key, hash, row, &mut self.budget, publish)
            {
                Insert::Inserted => {
                    self.table.rows.prefetch_upcoming(&self.cache);
                    self.inserted += 1;
                    self.permits = self.permits.saturating_sub(1);
                    return Ok((row, true));
                }
                Insert::Found(existing) => {
                    self.table.rows.put_back(&mut self.cache, row);
                    return Ok((existing, false));
                }
                Insert::Migrating => self.catch_up(),
                Insert::Full => {
                    self.table.grow(self.index, None);
                    self.catch_up();
                }
            }
        }
    }
}

impl Writer<'_, '_> {
    /// Makes sure this batch holds a permit for one more key in a bounded
    /// table: takes some if there is room, else evicts a row and takes its
    /// permit (see [`Bound`]). Victims are picked a few at a time and
    /// prefetched ahead of their evictions, so those misses overlap.
    fn take_permit(&mut self) {
        let Some(bound) = &self.table.bound else {
            return;
        };
        let spin = Spin::new();
        let mut fruitless_picks = 0;
        while self.permits == 0 {
            self.permits = bound.take();
            if self.permits > 0 {
                return;
            }
            if let Some(row) = self.next_victim() {
                if self.evict(row) {
                    self.permits = 1;
                }
                continue;
            }
            if fruitless_picks == EVICT_ATTEMPTS {
                // Every permit is held by batches in flight (or every row
                // seen is still being inserted): wait for them.
                spin.wait();
                fruitless_picks = 0;
            }
            // As many victims as the batch may still insert keys, at most
            // a few: a one-key write picks one.
            let want = self.keys_left.clamp(1, MAX_VICTIMS);
            bound.victims(&self.table.rows, self.ages, want, &mut self.victims);
            self.next_victim = 0;
            self.prefetch_victims();
            fruitless_picks += 1;
        }
    }

    /// Prefetches the first line of every picked victim, then their keys'
    /// tag groups, then the first one's index slots.
    fn prefetch_victims(&self) {
        let rows = &self.table.rows;
        for &(_, row) in &self.victims {
            prefetch(rows.row_span(row).0);
        }
        let index = self.index();
        for &(_, row) in &self.victims {
            if let Some(key) = rows.key_hint(row) {
                prefetch(index.tags_address(hash_key(key)));
            }
        }
        self.prefetch_victim_slots(0);
    }

    /// Prefetches the index slots of picked victim `i`, if any.
    fn prefetch_victim_slots(&self, i: usize) {
        if let Some(&(_, row)) = self.victims.get(i) {
            if let Some(key) = self.table.rows.key_hint(row) {
                self.index().prefetch_slots(hash_key(key));
            }
        }
    }

    /// The next picked victim whose rank is still the one it was picked
    /// with (a row written since is skipped: it is no longer among the
    /// lowest).
    fn next_victim(&mut self) -> Option<u64> {
        while let Some(&(rank, row)) = self.victims.get(self.next_victim) {
            self.next_victim += 1;
            self.prefetch_victim_slots(self.next_victim);
            if self.table.rows.rank(row) == rank {
                return Some(row);
            }
        }
        None
    }

    /// Evicts `row` if it is still live: unlinks its key from the index
    /// (only if the key still maps to this row), copies it for the
    /// listener and marks it dead, under the row's lock. False if the row
    /// died or changed hands meanwhile.
    fn evict(&mut self, row: u64) -> bool {
        let take = self.table.listener.is_some();
        loop {
            let index = self.index();
            let evicted = take.then_some(&mut self.evicted);
            let outcome = self
                .table
                .rows
                .unlink(row, evicted, |key, _| unlink_key(index, key, row));
            match outcome {
                Unlink::Removed => {
                    index.add_deleted(1);
                    self.retired.push(row);
                    return true;
                }
                Unlink::Kept => return false,
                Unlink::Retry => self.catch_up(),
            }
        }
    }

    /// Whether the batch may insert `key` without a training read
    /// (admission; always, in a table without it).
    fn admits(&self, key: u64) -> bool {
        self.table.admitter.as_ref().is_none_or(|a| a.admits(key))
    }
}

impl Drop for Writer<'_, '_> {
    /// Publishes the batch's counts and returns unused reservations,
    /// permits and rows, also when a caller's closure (an `update_rows`
    /// update) panicked midway through the batch; then the evicted rows
    /// not yet handed to the listener go to it.
    fn drop(&mut self) {
        self.index().unreserve(self.budget);
        self.table.rows.release(std::mem::take(&mut self.cache));
        let evicted = self.retired.len() as i64;
        self.table
            .len
            .fetch_add(self.inserted - evicted, Ordering::Relaxed);
        if let Some(bound) = &self.table.bound {
            bound.release(self.permits);
            bound.put_back(&self.victims[self.next_victim..]);
        }
        self.table
            .evicted
            .fetch_add(evicted as u64, Ordering::Relaxed);
        self.table
            .not_admitted
            .fetch_add(self.not_admitted, Ordering::Relaxed);
        if let Some(admitter) = &self.table.admitter {
            admitter.note_reads(self.counted);
        }
        if !self.retired.is_empty() {
            // Evicted rows return to the free pool as soon as the epoch
            // allows, so inserts reuse them instead of growing the arena.
            self.table
                .rows
                .retire(self.guard, std::mem::take(&mut self.retired));
            self.guard.flush();
        }
        if !self.evicted.is_empty() {
            // Only on a panic: a batch that ends normally hands its rows
            // to the listener itself, outside the batch's pin.
            let rows = std::mem::take(&mut self.evicted);
            let table = self.table;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| table.deliver(rows)));
        }
    }
}

/// Per-batch state of a removing batch.
struct Remover<'g> {
    index: Shared<'g, Index>,
    retired: Vec<u64>,
    deleted_here: usize,
}

impl<'g> Remover<'g> {
    fn index(&self) -> &'g Index {
        // SAFETY: `index` was loaded from the table under the batch's guard
        // (see `Writer::index`).
        unsafe { self.index.deref() }
    }
}

impl Table {
    /// An empty table for rows of `dim` values, with room for about
    /// `capacity` keys before it first grows.
    pub fn new(dim: usize, capacity: usize) -> Result<Table> {
        Table::with_restrict_policy(dim, capacity, None)
    }

    /// [`Table::new`] whose rows keep a score for `policy` (see
    /// [`restrict`](crate::restrict)), updated by every write.
    pub fn with_restrict_policy(
        dim: usize,
        capacity: usize,
        policy: Option<RestrictPolicy>,
    ) -> Result<Table> {
        Table::with_lifecycle(
            dim,
            capacity,
            policy,
            Lifecycle::default(),
            RowFormat::default(),
        )
    }

    /// [`Table::with_restrict_policy`] storing its numbers as `format` says.
    pub fn with_format(
        dim: usize,
        capacity: usize,
        policy: Option<RestrictPolicy>,
        format: RowFormat,
    ) -> Result<Table> {
        Table::with_lifecycle(dim, capacity, policy, Lifecycle::default(), format)
    }

    /// [`Table::with_restrict_policy`] with `lifecycle`'s capacity (which
    /// needs a policy: Timestamp if none is given), listener and
    /// admission, storing its numbers as `format` says.
    pub(crate) fn with_lifecycle(
        dim: usize,
        capacity: usize,
        policy: Option<RestrictPolicy>,
        lifecycle: Lifecycle,
        format: RowFormat,
    ) -> Result<Table> {
        let bound = lifecycle
            .capacity
            .map(|rows| Bound::new(rows, lifecycle.frequency_decay));
        let policy = match (&bound, policy) {
            (Some(_), None) => Some(RestrictPolicy::Timestamp),
            (_, policy) => policy,
        };
        let capacity = bound
            .as_ref()
            .map_or(capacity, |bound| capacity.min(bound.capacity()));
        let ranks = match (&bound, lifecycle.frequency_decay, policy) {
            (None, _, _) => Ranks::Off,
            (Some(_), true, Some(RestrictPolicy::Frequency)) => Ranks::DecayedCounts,
            (Some(_), _, _) => Ranks::Scores,
        };
        if !(1..=MAX_DIM).contains(&dim) {
            return Err(Error::InvalidArgument(format!(
                "dim must be in 1..={MAX_DIM}, got {dim}"
            )));
        }
        if capacity as u64 > MAX_ROWS {
            return Err(Error::CapacityExceeded { max_rows: MAX_ROWS });
        }
        let slots = capacity.saturating_add(capacity / 7).max(MIN_CAPACITY);
        let index = Index::try_with_capacity(slots).ok_or_else(|| Error::OutOfMemory {
            what: "index",
            bytes: Index::bytes_for_capacity(slots),
        })?;
        Ok(Table {
            index: Atomic::new(index),
            rows: RowStore::with_ranks(dim, policy.is_some(), ranks, format),
            len: AtomicI64::new(0),
            epoch: Epoch::new(),
            policy,
            bound,
            admitter: lifecycle.admitter,
            listener: lifecycle.listener,
            evicted: AtomicU64::new(0),
            not_admitted: AtomicU64::new(0),
        })
    }

    /// Most rows the table holds, if bounded.
    pub fn row_capacity(&self) -> Option<usize> {
        self.bound.as_ref().map(Bound::capacity)
    }

    /// Rows evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Training reads of keys not admitted so far.
    pub fn not_admitted_reads(&self) -> u64 {
        self.not_admitted.load(Ordering::Relaxed)
    }

    /// Whether evicted rows go to a listener.
    pub(crate) fn has_listener(&self) -> bool {
        self.listener.is_some()
    }

    /// Hands a batch's evicted rows to the listener (held until the
    /// variable's call has written every shard, see
    /// [`delivery`](crate::lifecycle::delivery)).
    fn deliver(&self, rows: EvictedRows) {
        if let Some(listener) = &self.listener {
            delivery::deliver(listener, rows);
        }
    }

    /// Removes the live rows whose score is below `cutoff` (with their
    /// slots; not to the listener) and returns how many. Each row's score
    /// is checked again under its lock just before its key is unlinked, so
    /// a row written meanwhile stays.
    pub fn expire(&self, cutoff: u64) -> usize {
        let mut removed = 0;
        let mut start = 0;
        while start < self.rows.high_water() {
            let guard = self.epoch.pin();
            let end = (start + EXPIRE_CHUNK).min(self.rows.high_water());
            let mut retired = Vec::new();
            for row in start..end {
                if self.rows.live_score(row).is_none_or(|s| s >= cutoff) {
                    continue;
                }
                loop {
                    let index_ptr = self.index.load(Ordering::Acquire, &guard);
                    // SAFETY: loaded under `guard` (see `Writer::index`).
                    let index = unsafe { index_ptr.deref() };
                    let outcome = self.rows.unlink(row, None, |key, score| {
                        if score >= cutoff {
                            return Unlink::Kept;
                        }
                        unlink_key(index, key, row)
                    });
                    match outcome {
                        Unlink::Removed => {
                            index.add_deleted(1);
                            retired.push(row);
                            break;
                        }
                        Unlink::Kept => break,
                        Unlink::Retry => self.help_migrate(index_ptr, &guard),
                    }
                }
            }
            removed += retired.len();
            self.forget(retired.len());
            self.rows.retire(&guard, retired);
            guard.flush();
            start = end;
        }
        removed
    }

    /// Counts `n` keys removed from the index.
    fn forget(&self, n: usize) {
        self.len.fetch_sub(n as i64, Ordering::Relaxed);
        if let Some(bound) = &self.bound {
            bound.release(n);
        }
    }

    /// The restrict policy its scores follow, if any.
    pub fn restrict_policy(&self) -> Option<RestrictPolicy> {
        self.policy
    }

    /// How one batch's writes change the scores of the rows they write.
    fn batch_score(&self) -> Score {
        match self.policy {
            None => Score::Keep,
            Some(RestrictPolicy::Timestamp) => Score::Stamp(next_timestamp()),
            Some(RestrictPolicy::Frequency) => Score::Count,
        }
    }

    /// Adds a slot column (`dim` values per row, for an optimizer) whose rows
    /// all start at `initial` (rounded to the slot dtype), existing rows
    /// included; returns its index.
    /// At most [`MAX_SLOTS`](crate::MAX_SLOTS) slots.
    pub fn add_slot(&self, initial: f32) -> Result<usize> {
        if !initial.is_finite() {
            return Err(Error::NonFinite {
                what: "slot initial value",
                index: 0,
                value: initial,
            });
        }
        let dtype = self.rows.format().slots;
        if !dtype.fits(initial) {
            return Err(Error::OutOfRange {
                what: "slot initial value",
                index: 0,
                value: initial,
                dtype,
            });
        }
        self.rows.add_slot(initial).ok_or_else(|| {
            Error::InvalidArgument(format!("a table holds at most {MAX_SLOTS} slot columns"))
        })
    }

    /// Number of slot columns.
    pub fn slot_count(&self) -> usize {
        self.rows.slot_count()
    }

    /// The initial value of slot column `slot`, if it exists.
    pub fn slot_initial(&self, slot: usize) -> Option<f32> {
        self.rows.slot_initial(slot)
    }

    /// The initial value slot column `slot` was added with, before
    /// rounding to the slot dtype (what checkpoints record), if it exists.
    pub fn slot_initial_asked(&self, slot: usize) -> Option<f32> {
        self.rows.slot_initial_asked(slot)
    }

    /// Checks that every slot index names an existing slot column, once.
    fn check_slots(&self, slots: impl IntoIterator<Item = usize>) -> Result<()> {
        let count = self.slot_count();
        let mut seen = [false; MAX_SLOTS];
        for slot in slots {
            if slot >= count {
                return Err(Error::InvalidArgument(format!(
                    "slot {slot} does not exist: the table has {count} slot column(s)"
                )));
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(Error::InvalidArgument(format!(
                    "slot {slot} is given more than once"
                )));
            }
        }
        Ok(())
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.rows.dim()
    }

    /// How the rows store their numbers.
    pub fn format(&self) -> RowFormat {
        self.rows.format()
    }

    /// Number of keys (exact when no batch is in flight). In a bounded
    /// table it counts the permits batches in flight hold too, so it never
    /// exceeds the capacity.
    pub fn len(&self) -> usize {
        match &self.bound {
            Some(bound) => bound.occupied(),
            None => self.len.load(Ordering::Relaxed).max(0) as usize,
        }
    }

    /// True when the table holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots of the current index.
    pub fn capacity(&self) -> usize {
        let guard = self.epoch.pin();
        self.current(&guard).capacity()
    }

    /// Bytes of memory in use by the table (an upper bound, exact when no
    /// batch is in flight and the index is filled): the rows handed out so
    /// far (their values, headers and scores, and their rows of every slot
    /// column whose segment exists; rows of removed keys stay allocated for
    /// reuse and count), and the index arrays (with the one being migrated
    /// into), each in full once filled but, when large and lazily mapped,
    /// at most one 2 MiB page per slot reserved in it. Address space
    /// reserved ahead and never written (a capacity hint's index, the
    /// untouched tail of a row segment) does not count.
    pub fn memory_bytes(&self) -> usize {
        let guard = self.epoch.pin();
        let current = self.current(&guard);
        let next = current.next.load(Ordering::Acquire, &guard);
        // SAFETY: loaded under `guard`; see `Writer::index`.
        let next_bytes = unsafe { next.as_ref() }.map_or(0, Index::memory_bytes);
        current.memory_bytes() + next_bytes + self.rows.memory_bytes()
    }

    fn current<'g>(&self, guard: &'g Guard) -> &'g Index {
        // SAFETY: the table always has an index; it is valid while `guard`
        // is pinned (see `Writer::index`).
        unsafe { self.index.load(Ordering::Acquire, guard).deref() }
    }

    /// Row id of `key`, following the migration chain from `index`.
    #[inline]
    fn find<'g>(&self, mut index: &'g Index, key: u64, hash: u64, guard: &'g Guard) -> Option<u64> {
        loop {
            if let Some(row) = index.find(key, hash) {
                return Some(row);
            }
            let next = index.next.load(Ordering::Acquire, guard);
            // SAFETY: `next` is only freed after it has been unlinked from
            // the table and retired, which happens after `index` was retired;
            // `guard` was pinned before we read `index`, so both are alive.
            index = unsafe { next.as_ref() }?;
        }
    }

    /// [`Table::find`] whose first group's tags were loaded by
    /// [`Index::find_start`].
    #[inline]
    pub(super) fn find_pipelined<'g>(
        &self,
        index: &'g Index,
        key: u64,
        hash: u64,
        first: FirstGroup,
        guard: &'g Guard,
    ) -> Option<u64> {
        if let Some(row) = index.find_finish(key, hash, first) {
            return Some(row);
        }
        let next = index.next.load(Ordering::Acquire, guard);
        // SAFETY: as in `Table::find`.
        self.find(unsafe { next.as_ref() }?, key, hash, guard)
    }

    /// Starts a migration out of `old` (if none has started) into an index
    /// sized for twice its live keys, or into `prepared` if that is at least
    /// as large (a [`Table::reserve`]). Running out of memory for the new
    /// index aborts, as growing a `Vec` does: threads wait for it once the
    /// old index is closed.
    fn grow(&self, old: Shared<'_, Index>, prepared: Option<Index>) {
        // SAFETY: loaded under a guard the caller holds (see `Writer::index`).
        let old = unsafe { old.deref() };
        if let Some(live_bound) = old.close() {
            let mut needed = live_bound.saturating_mul(2);
            if let Some(bound) = &self.bound {
                // At capacity the index keeps its size: it is rebuilt
                // without the tombstones evictions left.
                needed = needed.min(bound.max_index_slots());
            }
            let needed = needed.max(MIN_CAPACITY);
            let next = match prepared {
                Some(next) if next.capacity() >= needed => next,
                _ => Index::with_capacity(needed),
            };
            old.next.store(Owned::new(next), Ordering::Release);
        }
    }

    /// Helps migrate `old` into its `next` until every group has moved, then
    /// makes `next` the table's index and retires `old`.
    fn help_migrate(&self, old_ptr: Shared<'_, Index>, guard: &Guard) {
        // SAFETY: loaded under `guard` (see `Writer::index`).
        let old = unsafe { old_ptr.deref() };
        let spin = Spin::new();
        let next_ptr = loop {
            let next = old.next.load(Ordering::Acquire, guard);
            if !next.is_null() {
                break next;
            }
            if !old.is_closed() {
                return;
            }
            // The thread that closed the index is allocating `next`.
            spin.wait();
        };
        // SAFETY: as in `Table::find`.
        let next = unsafe { next_ptr.deref() };
        while let Some(groups) = old.claim_migration_chunk() {
            let count = groups.len();
            let end = groups.end;
            let mut copied = 0;
            for group in groups {
                if group + MIGRATE_TAGS_AHEAD < end {
                    old.prefetch_migration(group + MIGRATE_TAGS_AHEAD, next, false);
                }
                if group + MIGRATE_SLOTS_AHEAD < end {
                    old.prefetch_migration(group + MIGRATE_SLOTS_AHEAD, next, true);
                }
                copied += old.migrate_group(group, next);
            }
            next.add_used(copied);
            old.finish_migration_chunk(count);
        }
        while !old.migration_complete() {
            spin.wait();
        }
        if self
            .index
            .compare_exchange(
                old_ptr,
                next_ptr,
                Ordering::AcqRel,
                Ordering::Acquire,
                guard,
            )
            .is_ok()
        {
            // SAFETY: `old` is no longer reachable from the table (only from
            // indexes retired before it, which readers reach only while
            // pinned); it is freed after every current pin ends.
            unsafe { guard.defer_destroy(old_ptr) };
            guard.flush();
        }
    }

    /// Makes room for `additional` more keys, so that inserting them does
    /// not resize the index again and again (one migration now instead of
    /// several as the keys arrive; it at least doubles, as growth on insert
    /// does). Other threads keep working meanwhile, but the caller migrates
    /// the index, and writers that meet the migration wait for the chunks it
    /// claimed: call it at normal priority. A hint: room for more than a
    /// table can hold (`MAX_ROWS`) is not made, and if the memory for the
    /// larger index cannot be had nothing happens (the index grows as keys
    /// arrive).
    pub fn reserve(&self, additional: usize) {
        let guard = self.epoch.pin();
        let index = self.index.load(Ordering::Acquire, &guard);
        // SAFETY: loaded under `guard` (see `Writer::index`).
        let current = unsafe { index.deref() };
        let max_rows = usize::try_from(MAX_ROWS).unwrap_or(usize::MAX);
        let most = self.bound.as_ref().map_or(max_rows, Bound::capacity);
        let needed = self
            .len()
            .saturating_add(additional)
            .min(max_rows)
            .min(most);
        if needed <= current.threshold() {
            return;
        }
        let Some(prepared) = Index::try_with_capacity(needed.saturating_add(needed / 7)) else {
            return;
        };
        self.grow(index, Some(prepared));
        self.help_migrate(index, &guard);
    }

    /// Backs the rows that `additional` new keys will take with memory now,
    /// so that their inserts do not wait for the kernel to zero fresh pages
    /// under their row locks: the fresh row ids beyond the rows the table
    /// already holds unused (removed keys' rows waiting for reuse), in the
    /// main column and every slot column, at most `max_bytes` of them (and
    /// at most [`PREFAULT_MAX_BYTES`](super::PREFAULT_MAX_BYTES)), each
    /// column to the end of the page the rows end in (a huge page, 2 MiB,
    /// is backed whole once touched: the page the next inserts would back).
    ///
    /// It takes no row and changes no value, and other threads wait for it
    /// only briefly (the kernel's locks, a page at a time, and the segment
    /// allocation lock while it maps a new row segment), so it may run on a
    /// low-priority thread while others read and write. The memory
    /// is committed as by any write: under a memory limit, backing it can
    /// fail as an allocation would. The table's memory figure counts these
    /// rows only once they are handed out.
    pub fn reserve_rows(&self, additional: usize, max_bytes: u64) {
        let handed_out = self.rows.high_water();
        let unused = handed_out.saturating_sub(self.len() as u64);
        let fresh = (additional as u64).saturating_sub(unused);
        self.rows.prefault(fresh, max_bytes);
    }

    /// Copies the rows of `keys` into `out`. Missing keys get `on_miss(i,
    /// key, row)` to fill their row instead. Never inserts.
    pub fn lookup(
        &self,
        keys: &[u64],
        positions: Positions<'_>,
        out: &mut [f32],
        mut on_miss: impl FnMut(usize, u64, &mut [f32]),
    ) -> Result<()> {
        let dim = self.dim();
        let rows = rows_in(out.len(), dim, "out", keys.len())?;
        positions.check(keys.len(), rows, "out", dim)?;
        self.read_batch(keys, |i, key, row| {
            let at = positions.of(i) * dim;
            let dst = &mut out[at..at + dim];
            match row {
                MISSING => on_miss(i, key, dst),
                row => self.rows.read(row, dst),
            }
        })
    }

    /// Runs `visit(i, key, row)` for every key of a batch under one pin,
    /// `row` being the key's row id or `MISSING`, with the probe and the row
    /// prefetched ahead (see [`pipeline`](super::pipeline)).
    fn read_batch(&self, keys: &[u64], mut visit: impl FnMut(usize, u64, u64)) -> Result<()> {
        let guard = self.epoch.pin();
        let index = self.current(&guard);
        self.pipelined(
            keys,
            &guard,
            &mut (),
            |_| index,
            Access::Read,
            |_, i, key, _, row| {
                visit(i, key, row);
                Ok(())
            },
        )
    }

    /// Copies the rows of `keys` into `out`, inserting missing keys with the
    /// row `init(key, row)` writes. A key admission has not admitted yet
    /// reads that row too, inserts nothing, and is told to
    /// `not_admitted(pos)` with its position.
    pub fn lookup_or_insert(
        &self,
        keys: &[u64],
        positions: Positions<'_>,
        out: &mut [f32],
        mut init: impl FnMut(u64, &mut [f32]),
        mut not_admitted: impl FnMut(usize),
    ) -> Result<()> {
        let dim = self.dim();
        let rows = rows_in(out.len(), dim, "out", keys.len())?;
        positions.check(keys.len(), rows, "out", dim)?;
        let score = self.batch_score();
        self.write_batch(
            keys,
            Access::ReadOrInsert,
            true,
            |writer, i, key, hash, found| {
                let at = positions.of(i) * dim;
                let dst = &mut out[at..at + dim];
                if found != MISSING {
                    self.rows.read(found, dst);
                    // The pipeline looked a few keys ago: a row evicted or
                    // removed since is not the key's row any more (its id is
                    // not reused while the batch is pinned, so a row live now
                    // was the key's when it was read).
                    if self.rows.live_score(found).is_some() {
                        return Ok(());
                    }
                }
                if let Some(admitter) = &self.admitter {
                    // The pipeline looked a few keys ago: look again before
                    // counting a read of a missing key.
                    if let Some(row) = self.find(writer.index(), key, hash, writer.guard) {
                        self.rows.read(row, dst);
                        return Ok(());
                    }
                    writer.counted += 1;
                    if !admitter.count(key) {
                        init(key, dst);
                        not_admitted(positions.of(i));
                        writer.not_admitted += 1;
                        return Ok(());
                    }
                }
                let (row, inserted) = writer.find_or_insert(key, hash, |row| {
                    init(key, dst);
                    self.rows
                        .write_new(row, key, dst, &[], score, Rounding::NearestEven);
                })?;
                if !inserted {
                    self.rows.read(row, dst);
                }
                Ok(())
            },
        )
    }

    /// Sets the rows of `keys` to `values`, inserting absent keys. A key
    /// repeated in the batch ends with its last row.
    pub fn upsert(&self, keys: &[u64], positions: Positions<'_>, values: &[f32]) -> Result<()> {
        self.upsert_rows(keys, positions, values, &[], None)
    }

    /// TFRA `bp_v2` accumulation: for key `i` with `exists[pos(i)]`, a present
    /// key gets `row += delta`, an absent one is ignored; without it, an absent
    /// key is inserted with `delta` as its row and a present one is ignored —
    /// unless this same batch inserted it, in which case the delta is added
    /// whatever its `exists` flag (every delta of a key repeated in one batch
    /// counts, however far apart the occurrences are).
    ///
    /// Every delta must be finite (the caller checks). An addition whose sum
    /// would not be finite (it overflows) is refused row by row, as
    /// [`Table::update_rows`] refuses a non-finite result: that row keeps its
    /// values and score, `refused(pos, sum)` is told its position and the
    /// first overflowing sum, and the other keys of the batch are processed.
    pub fn accum(
        &self,
        keys: &[u64],
        positions: Positions<'_>,
        deltas: &[f32],
        exists: &[bool],
        mut refused: impl FnMut(usize, f32),
    ) -> Result<()> {
        let dim = self.dim();
        let rows = rows_in(deltas.len(), dim, "deltas", keys.len())?;
        positions.check(keys.len(), rows, "deltas", dim)?;
        if exists.len() != rows {
            return Err(Error::LengthMismatch {
                what: "exists",
                expected: rows,
                actual: exists.len(),
            });
        }
        // Keys this batch inserted, with the row it inserted: only that row
        // (not one another writer re-inserted meanwhile) gets later deltas.
        let mut inserted_here = HashMap::with_hasher(ahash::RandomState::with_seeds(1, 2, 3, 4));
        let score = self.batch_score();
        self.write_batch(
            keys,
            Access::Write(&[]),
            true,
            |writer, i, key, hash, found| {
                let p = positions.of(i);
                let delta = &deltas[p * dim..(p + 1) * dim];
                let mut overflow = None;
                let mut add = |words: &[AtomicU64]| match self.rows.add_if_fits(words, delta) {
                    Ok(()) => true,
                    Err(sum) => {
                        overflow = Some(sum);
                        false
                    }
                };
                if exists[p] {
                    // Absent when the pipeline looked: ignored, unless this batch
                    // inserted it since (the pipeline looks a few keys ahead).
                    // Removed since: look again (it may be back under a new row).
                    let mut row = found;
                    if row == MISSING {
                        if let Some(&inserted) = inserted_here.get(&key) {
                            // If the row died (removed meanwhile), the delta goes with it.
                            let _ = self.rows.update(inserted, score, &mut add);
                        }
                    }
                    while row != MISSING {
                        if self.rows.update(row, score, &mut add).is_some() {
                            break;
                        }
                        row = self
                            .find(writer.index(), key, hash, writer.guard)
                            .unwrap_or(MISSING);
                    }
                } else {
                    if !writer.admits(key) {
                        // Not admitted: its insert is skipped (present, it
                        // would be ignored too, as no earlier occurrence of
                        // this batch could have inserted it).
                        return Ok(());
                    }
                    let (row, inserted) = writer.find_or_insert(key, hash, |row| {
                        self.rows
                            .write_new(row, key, delta, &[], score, Rounding::NearestEven);
                    })?;
                    if inserted {
                        inserted_here.insert(key, row);
                    } else if inserted_here.get(&key) == Some(&row) {
                        // If the row died (removed meanwhile), the delta goes with it.
                        let _ = self.rows.update(row, score, &mut add);
                    }
                }
                if let Some(sum) = overflow {
                    refused(p, sum);
                }
                Ok(())
            },
        )
    }

    /// Copies slot column `slot`'s rows of `keys` into `out` (`dim` values
    /// per key); a missing key reads the slot's initial value. Never inserts.
    pub fn lookup_slot(
        &self,
        keys: &[u64],
        positions: Positions<'_>,
        slot: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let dim = self.dim();
        let rows = rows_in(out.len(), dim, "out", keys.len())?;
        positions.check(keys.len(), rows, "out", dim)?;
        self.check_slots([slot])?;
        let initial = self.slot_initial(slot).unwrap_or_default();
        self.read_batch(keys, |i, _, row| {
            let at = positions.of(i) * dim;
            let dst = &mut out[at..at + dim];
            match row {
                MISSING => dst.fill(initial),
                row => self.rows.read_slot(row, slot, dst),
            }
        })
    }

    /// Copies the scores of `keys` into `out` (one per key; 0 for a missing
    /// key, and for every key of a table without a restrict policy).
    pub fn lookup_scores(
        &self,
        keys: &[u64],
        positions: Positions<'_>,
        out: &mut [u64],
    ) -> Result<()> {
        positions.check(keys.len(), out.len(), "out", 1)?;
        self.read_batch(keys, |i, _, row| {
            out[positions.of(i)] = match row {
                MISSING => 0,
                row => self.rows.score(row),
            };
        })
    }

    /// Read-modify-write of the rows of `keys` together with the slot
    /// columns `slots`, the optimizers' primitive: for each key, under its
    /// row's lock, `update(pos, values, slot_rows)` gets the row's values and
    /// the slots' rows (`dim` values each, in the order of `slots`, back to
    /// back); if it returns true they are written back and the score is
    /// updated, if false the row is left as it was. For a missing key
    /// `update` gets the row it would be inserted with (`init(key, row)`'s
    /// values, every slot at its initial value) and the key is inserted with
    /// the result, or not at all if it returns false. `pos` is the key's
    /// position (see [`Positions`]). A key repeated in the batch is updated
    /// once per occurrence, in order. `update` runs again for a key whose
    /// row could not be kept (another writer inserted the missing key
    /// between the run and the insert, or removed the row); only the last
    /// run's result is kept. `slots` must not repeat a slot.
    pub fn update_rows(
        &self,
        keys: &[u64],
        positions: Positions<'_>,
        slots: &[usize],
        mut init: impl FnMut(u64, &mut [f32]),
        mut update: impl FnMut(usize, &mut [f32], &mut [f32]) -> bool,
    ) -> Result<()> {
        let dim = self.dim();
        self.check_slots(slots.iter().copied())?;
        if let Positions::At(at) = positions {
            if at.len() != keys.len() {
                return Err(Error::LengthMismatch {
                    what: "positions",
                    expected: keys.len(),
                    actual: at.len(),
                });
            }
        }
        let score = self.batch_score();
        let initials: Vec<f32> = slots
            .iter()
            .map(|&slot| self.slot_initial(slot).unwrap_or_default())
            .collect();
        let mut scratch = vec![0.0; dim * (1 + slots.len())];
        self.write_batch(
            keys,
            Access::Write(slots),
            true,
            |writer, i, key, hash, found| {
                let pos = positions.of(i);
                let mut row = found;
                loop {
                    if row == MISSING {
                        // The pipeline looked a few keys ago: an earlier
                        // occurrence in this batch may have inserted it since.
                        row = self
                            .find(writer.index(), key, hash, writer.guard)
                            .unwrap_or(MISSING);
                    }
                    if row == MISSING {
                        if !writer.admits(key) {
                            // Not admitted: its update is dropped.
                            return Ok(());
                        }
                        // Absent: update the row it would be inserted with, and
                        // insert the result (nothing, if the update refuses).
                        let (values, slot_rows) = scratch.split_at_mut(dim);
                        init(key, values);
                        for (out, &initial) in slot_rows.chunks_exact_mut(dim).zip(&initials) {
                            out.fill(initial);
                        }
                        if !update(pos, values, slot_rows) {
                            return Ok(());
                        }
                        let written =
                            SlotRows::new(slots.iter().copied().zip(slot_rows.chunks_exact(dim)));
                        let written = written.as_slice();
                        let inserted;
                        (row, inserted) = writer.find_or_insert(key, hash, |new| {
                            self.rows.write_new(
                                new,
                                key,
                                values,
                                written,
                                score,
                                self.rows.format().rounding,
                            );
                        })?;
                        if inserted {
                            return Ok(());
                        }
                        // Another writer inserted it meanwhile: update its row.
                    }
                    let applied =
                        self.rows
                            .update_with_slots(row, score, slots, &mut scratch, |v, s| {
                                update(pos, v, s)
                            });
                    if applied.is_some() {
                        return Ok(());
                    }
                    // Removed since it was found: look again (or insert it again).
                    row = self
                        .find(writer.index(), key, hash, writer.guard)
                        .unwrap_or(MISSING);
                }
            },
        )
    }

    /// Sets the rows of `keys` to `values`, the given slot columns' rows to
    /// `slots` (`(slot, rows)` pairs, `rows` laid out like `values`) and, if
    /// `scores` is given, their scores (else the write scores them as any
    /// write does), inserting absent keys (their other slots start at their
    /// initial values). A checkpoint's load.
    pub fn upsert_rows(
        &self,
        keys: &[u64],
        positions: Positions<'_>,
        values: &[f32],
        slots: &[(usize, &[f32])],
        scores: Option<&[u64]>,
    ) -> Result<()> {
        let dim = self.dim();
        let rows = rows_in(values.len(), dim, "values", keys.len())?;
        positions.check(keys.len(), rows, "values", dim)?;
        self.check_slots(slots.iter().map(|&(slot, _)| slot))?;
        for &(_, slot_rows) in slots {
            if slot_rows.len() != values.len() {
                return Err(Error::LengthMismatch {
                    what: "slot rows",
                    expected: values.len(),
                    actual: slot_rows.len(),
                });
            }
        }
        if let Some(scores) = scores {
            if scores.len() != rows {
                return Err(Error::LengthMismatch {
                    what: "scores",
                    expected: rows,
                    actual: scores.len(),
                });
            }
        }
        let batch_score = self.batch_score();
        // A checkpoint's write sets the scores: its evictions do not age.
        let ages = scores.is_none();
        self.write_batch(
            keys,
            Access::Write(&[]),
            ages,
            |writer, i, key, hash, found| {
                let pos = positions.of(i);
                let at = pos * dim;
                let src = &values[at..at + dim];
                let slot_rows = SlotRows::new(
                    slots
                        .iter()
                        .map(|&(slot, rows)| (slot, &rows[at..at + dim])),
                );
                let slot_rows = slot_rows.as_slice();
                let score = scores.map_or(batch_score, |scores| Score::Set(scores[pos]));
                if found != MISSING && self.rows.overwrite(found, src, slot_rows, score) {
                    return Ok(());
                }
                loop {
                    let (row, inserted) = writer.find_or_insert(key, hash, |row| {
                        self.rows
                            .write_new(row, key, src, slot_rows, score, Rounding::NearestEven);
                    })?;
                    if inserted || self.rows.overwrite(row, src, slot_rows, score) {
                        return Ok(());
                    }
                }
            },
        )
    }

    /// Runs `op(writer, i, key, hash, found)` for every key of a batch under
    /// one pin, with the key's probe and what `access` (a write or a
    /// training read) needs of its row prefetched ahead (see
    /// [`pipeline`](super::pipeline)). `found` is the key's row as the
    /// pipeline saw it a few keys earlier (or `MISSING`): an op may use it,
    /// but must allow for the key having been removed since (a dead row
    /// refuses [`RowStore::update`](super::rows::RowStore::update)) or
    /// inserted since. `ages`: whether the batch's evictions may age LFU
    /// ranks (see [`Bound`]).
    fn write_batch(
        &self,
        keys: &[u64],
        access: Access<'_>,
        ages: bool,
        mut op: impl FnMut(&mut Writer<'_, '_>, usize, u64, u64, u64) -> Result<()>,
    ) -> Result<()> {
        debug_assert!(matches!(access, Access::Write(_) | Access::ReadOrInsert));
        let guard = self.epoch.pin();
        let mut writer = Writer::new(self, &guard);
        writer.ages = ages;
        let started_in = writer.index;
        let result = self.pipelined(
            keys,
            &guard,
            &mut writer,
            |writer| writer.index(),
            access,
            |writer, i, key, hash, found| {
                writer.keys_left = keys.len() - i;
                op(writer, i, key, hash, found)
            },
        );
        let resized = writer.index != started_in;
        let evicted = std::mem::take(&mut writer.evicted);
        drop(writer);
        drop(guard);
        if resized {
            self.epoch.reclaim();
        }
        if !evicted.is_empty() {
            self.deliver(evicted);
        }
        result
    }

    /// Removes `keys` (absent keys are ignored); returns how many were removed.
    pub fn remove(&self, keys: &[u64]) -> usize {
        let guard = self.epoch.pin();
        let mut remover = Remover {
            index: self.index.load(Ordering::Acquire, &guard),
            retired: Vec::new(),
            deleted_here: 0,
        };
        let removing = self.pipelined(
            keys,
            &guard,
            &mut remover,
            Remover::index,
            Access::Remove,
            |remover, _, key, hash, _| loop {
                match remover.index().remove(key, hash) {
                    Remove::Removed(row) => {
                        self.rows.mark_dead(row);
                        remover.retired.push(row);
                        remover.deleted_here += 1;
                        return Ok(());
                    }
                    Remove::Absent => return Ok(()),
                    Remove::Migrating => {
                        let index = remover.index();
                        index.add_deleted(std::mem::take(&mut remover.deleted_here));
                        self.help_migrate(remover.index, &guard);
                        remover.index = self.index.load(Ordering::Acquire, &guard);
                    }
                }
            },
        );
        debug_assert!(removing.is_ok(), "removing never fails");
        remover.index().add_deleted(remover.deleted_here);
        let removed = remover.retired.len();
        self.forget(removed);
        self.rows.retire(&guard, remover.retired);
        guard.flush();
        removed
    }

    /// Removes every key present when the scan reaches it (keys inserted
    /// concurrently may stay).
    pub fn clear(&self) {
        let mut start = 0;
        loop {
            let chunk = self.export_rows(start, 4096, ExportColumns::default());
            self.remove(&chunk.keys);
            if chunk.next >= self.rows.high_water() {
                break;
            }
            start = chunk.next;
        }
    }

    /// Scans row ids from `start` and copies up to `max_rows` live rows: their
    /// keys and the `columns` asked for, each row one consistent version of
    /// its values, slots and score. The scan ends at the high-water mark
    /// ([`Table::end_of_rows`]); `next` says where to continue.
    pub fn export_rows(&self, start: u64, max_rows: usize, columns: ExportColumns) -> ExportedRows {
        let dim = self.dim();
        let slot_count = if columns.slots { self.slot_count() } else { 0 };
        let _guard = self.epoch.pin();
        let end = self.rows.high_water();
        // Room for the rows there can be, up to 65,536 rows or 16 MiB of
        // values per column up front (beyond, the vectors grow as needed):
        // never a wide table's 65,536 rows of megabytes before the first.
        let capacity = max_rows
            .min(1 << 16)
            .min(usize::try_from(end.saturating_sub(start)).unwrap_or(usize::MAX));
        let column_capacity = capacity.saturating_mul(dim).min(1 << 22);
        let mut rows = ExportedRows {
            keys: Vec::with_capacity(capacity),
            values: Vec::with_capacity(if columns.values { column_capacity } else { 0 }),
            slots: (0..slot_count)
                .map(|_| Vec::with_capacity(column_capacity))
                .collect(),
            scores: Vec::with_capacity(if columns.scores { capacity } else { 0 }),
            next: start,
        };
        let mut row_buf = vec![0.0; dim];
        let mut slot_buf = vec![0.0; dim * slot_count];
        let mut row = start;
        while row < end && rows.keys.len() < max_rows {
            if row + EXPORT_PREFETCH < end {
                let ahead = row + EXPORT_PREFETCH;
                // Exported slots may be inline in the row.
                let (address, bytes) = if slot_count > 0 {
                    self.rows.block_span(ahead)
                } else {
                    self.rows.row_span(ahead)
                };
                prefetch_span(address, bytes);
            }
            if let Some((key, score)) = self.rows.read_live(row, &mut row_buf, &mut slot_buf) {
                rows.keys.push(key);
                if columns.values {
                    rows.values.extend_from_slice(&row_buf);
                }
                for (column, slot_row) in rows.slots.iter_mut().zip(slot_buf.chunks_exact(dim)) {
                    column.extend_from_slice(slot_row);
                }
                if columns.scores {
                    rows.scores.push(score);
                }
            }
            row += 1;
        }
        rows.next = row;
        rows
    }

    /// One past the largest row id in use: where an export scan ends.
    pub fn end_of_rows(&self) -> u64 {
        self.rows.high_water()
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread can reach the indexes any
        // more; retired ones are owned by the collector, the current one and
        // any migration target by us.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let mut index = self.index.load(Ordering::Relaxed, guard);
            while !index.is_null() {
                let next = index.deref().next.load(Ordering::Relaxed, guard);
                drop(index.into_owned());
                index = next;
            }
        }
        self.epoch.release_thread_handle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_rows_takes_no_row_and_changes_nothing() {
        let n: u64 = if cfg!(miri) { 80 } else { 50_000 };
        let table = Table::new(3, 0).unwrap();
        let slot = table.add_slot(0.25).unwrap();
        table
            .upsert(&[1, 2], Positions::Dense, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
            .unwrap();
        table.remove(&[2]);
        let memory = table.memory_bytes();
        let end = table.end_of_rows();
        // Room for the new keys: segments mapped (and, on Linux, backed)
        // beyond the rows in use, in the main and the slot column.
        table.reserve_rows(n as usize, u64::MAX);
        table.reserve_rows(usize::MAX, if cfg!(miri) { 1 << 14 } else { 1 << 20 });
        assert_eq!(table.len(), 1);
        assert_eq!(table.end_of_rows(), end, "no row handed out");
        assert_eq!(table.memory_bytes(), memory, "rows count once handed out");
        let keys: Vec<u64> = (10..10 + n).collect();
        let values: Vec<f32> = (0..keys.len() * 3).map(|i| i as f32).collect();
        table.upsert(&keys, Positions::Dense, &values).unwrap();
        let mut out = vec![0.0; keys.len() * 3];
        table
            .lookup(&keys, Positions::Dense, &mut out, |_, _, _| {
                unreachable!("present")
            })
            .unwrap();
        assert_eq!(out, values);
        let mut slots = vec![0.0; 6];
        table
            .lookup_slot(&[1, 10], Positions::Dense, slot, &mut slots)
            .unwrap();
        assert_eq!(slots, [0.25; 6], "slot rows read their initial value");
    }

    #[test]
    fn reserve_grows_once_so_inserts_do_not_resize() {
        let n: u64 = if cfg!(miri) { 200 } else { 10_000 };
        let table = Table::new(2, 0).unwrap();
        table
            .upsert(&[1, 2, 3], Positions::Dense, &[1.0; 6])
            .unwrap();
        table.reserve(n as usize);
        let capacity = table.capacity();
        assert!(
            capacity - capacity / 8 >= n as usize + 3,
            "capacity {capacity}"
        );
        let keys: Vec<u64> = (10..10 + n).collect();
        table
            .upsert(&keys, Positions::Dense, &vec![2.0; keys.len() * 2])
            .unwrap();
        assert_eq!(table.capacity(), capacity, "no resize after reserve");
        assert_eq!(table.len(), n as usize + 3);
        let mut out = vec![0.0; 4];
        table
            .lookup(&[2, 9 + n], Positions::Dense, &mut out, |_, _, _| {
                unreachable!("both present")
            })
            .unwrap();
        assert_eq!(out, [1.0, 1.0, 2.0, 2.0]);
        table.reserve(5);
        assert_eq!(table.capacity(), capacity, "enough room: no change");
    }

    #[test]
    #[cfg_attr(miri, ignore = "asks the allocator for hundreds of GiB")]
    fn reserving_more_than_memory_or_max_rows_is_not_an_abort() {
        let table = Table::new(2, 0).unwrap();
        table.upsert(&[1, 2], Positions::Dense, &[1.0; 4]).unwrap();
        let capacity = table.capacity();
        table.reserve(usize::MAX);
        table.reserve(usize::MAX - table.len());
        // Either the system lent the address space, or nothing happened.
        assert!(table.capacity() == capacity || table.capacity() as u64 > MAX_ROWS);
        table.upsert(&[3], Positions::Dense, &[2.0; 2]).unwrap();
        assert_eq!(table.len(), 3);
        let mut out = [0.0; 6];
        table
            .lookup(&[1, 2, 3], Positions::Dense, &mut out, |_, _, _| {
                unreachable!("present")
            })
            .unwrap();
        assert_eq!(out, [1.0, 1.0, 1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    #[cfg_attr(miri, ignore = "a 68 MiB index")]
    fn memory_bytes_counts_the_index_pages_in_use() {
        // An index sized ahead for 4Mi keys: 64 MiB of slots, 4 MiB of tags,
        // both lazily mapped.
        let table = Table::new(2, 4 << 20).unwrap();
        let reserved = Index::bytes_for_capacity(table.capacity());
        assert!(reserved >= 64 << 20);
        let empty = table.memory_bytes();
        assert_eq!(empty, 0, "nothing written yet");
        table
            .upsert(&[1, 2, 3], Positions::Dense, &[1.0; 6])
            .unwrap();
        let rows = 64 * (2 + 1) * 8;
        if cfg!(unix) {
            assert_eq!(table.memory_bytes(), 2 * 3 * (2 << 20) + rows);
        }
        // A small index (from the allocator) counts in full.
        let small = Table::new(2, 0).unwrap();
        small.upsert(&[1], Positions::Dense, &[1.0; 2]).unwrap();
        assert_eq!(
            small.memory_bytes(),
            Index::bytes_for_capacity(small.capacity()) + rows
        );
    }

    #[test]
    fn slot_and_score_ops_through_a_resize() {
        let n: u64 = if cfg!(miri) { 100 } else { 5_000 };
        let table = Table::with_restrict_policy(2, 0, Some(RestrictPolicy::Frequency)).unwrap();
        let slot = table.add_slot(0.5).unwrap();
        let keys: Vec<u64> = (0..n).collect();
        // Inserts through resizes: the update sees the initial row.
        table
            .update_rows(
                &keys,
                Positions::Dense,
                &[slot],
                |k, row| row.fill(k as f32),
                |i, row, acc| {
                    assert_eq!((row[0], acc[0]), (i as f32, 0.5));
                    acc.fill(row[0] + 1.0);
                    true
                },
            )
            .unwrap();
        // A refused update of a missing key inserts nothing.
        table
            .update_rows(
                &[n + 7],
                Positions::Dense,
                &[slot],
                |_, row| row.fill(0.0),
                |_, _, _| false,
            )
            .unwrap();
        assert_eq!(table.len(), n as usize);
        // Restore-style overwrite of half the keys, with explicit scores.
        let half = &keys[..keys.len() / 2];
        let values = vec![-1.0; half.len() * 2];
        let scores = vec![9; half.len()];
        table
            .upsert_rows(
                half,
                Positions::Dense,
                &values,
                &[(slot, &values)],
                Some(&scores),
            )
            .unwrap();
        let mut out = vec![0.0; keys.len() * 2];
        table
            .lookup_slot(&keys, Positions::Dense, slot, &mut out)
            .unwrap();
        let mut counts = vec![0; keys.len()];
        table
            .lookup_scores(&keys, Positions::Dense, &mut counts)
            .unwrap();
        for (k, (acc, count)) in out.chunks(2).zip(&counts).enumerate() {
            let restored = k < half.len();
            assert_eq!(acc[1], if restored { -1.0 } else { k as f32 + 1.0 });
            assert_eq!(*count, if restored { 9 } else { 1 });
        }
        let rows = table.export_rows(
            0,
            usize::MAX,
            ExportColumns {
                values: true,
                slots: true,
                scores: true,
            },
        );
        assert_eq!(
            (rows.keys.len(), rows.slots.len(), rows.scores.len()),
            (n as usize, 1, n as usize)
        );
        assert_eq!(rows.slots[0].len(), rows.values.len());
    }
}
