//! Admission counters: how many training reads each key not yet in the
//! table has had (see [`Admission`]). One [`Admitter`] serves all shards of
//! a variable.
//!
//! - **Exact** counts live in 64 (fewer for a small bound) striped maps
//!   ([`PendingMap`]: open addressing, one lock each) that share the
//!   pending bound: a stripe takes room for new keys from a shared pool a
//!   few keys at a time (and gives back what an admitted key's entry
//!   frees past a few), so the pending keys, the room the stripes hold
//!   and the pool never add up to more than the bound (but for a restore
//!   or load, which may hold up to twice the bound until it trims the
//!   lowest counts), and any stripe may hold any part of it. Each stripe publishes where its map's
//!   entries are ([`ProbeHint`]), so a batch prefetches a key's entry a
//!   few keys before it counts the key, without the lock, and the lock's
//!   own line with it. A key's count is exact while it stays pending; it
//!   is removed when it reaches `min_count` (that read admits the key),
//!   or dropped when the bound is reached and a new key arrives: once no
//!   stripe holds unused room (as one pass over them sees it: a stripe
//!   may take room back meanwhile), one thread drops the lowest counts of
//!   all stripes (every entry at the lowest count, and the next lowest
//!   until a sixteenth of the bound is free, so making room costs a
//!   constant per key counted; at `min_count` 2 every pending count is 1,
//!   so that is every pending key), and those keys are admitted late (or
//!   never, while new keys keep the counter full). That pass reads and
//!   rebuilds every stripe's map, so the read that makes room waits for
//!   all of it (tens of milliseconds at the default bound of 2^20 keys),
//!   at most once per sixteenth of the bound of new keys.
//! - **Sketch** counts live in a count-min sketch of `depth` rows of
//!   `width` saturating 16-bit counters with conservative update, in
//!   memory allocated as the table's index is (zero pages mapped on first
//!   use, huge pages from 2 MiB: a key's counters are random lines of a
//!   large array, which then miss the TLB far less). Every
//!   counter of a key is at least the key's count of reads since the last
//!   ageing, so a key is never admitted late. Reads of one key are counted
//!   one at a time (a striped lock): two reads raising the same minimum at
//!   once would otherwise count as one. Counters shared with other keys are
//!   only ever raised by an atomic maximum, except when the sketch ages:
//!   every [`SKETCH_AGEING_READS`] x `width` counted reads, one thread
//!   halves every counter while the others keep counting. Reads are added
//!   to the period once per shard batch (at its end), so the batch that
//!   completes a period ages the sketch when it is done.
//!
//! The sketch's hash is part of the checkpoint format (see
//! [`checkpoint`](crate::checkpoint)): row `i`'s counter of key `k` (its
//! 64-bit pattern) is column `fmix64(fmix64(k ^ PHI) + (i + 1) * PHI) *
//! width >> 64` (wrapping arithmetic, `fmix64` MurmurHash3's 64-bit
//! finalizer, `PHI` = `0x9e3779b97f4a7c15`), the same on every machine
//! and build.

use super::pending::{PendingMap, ProbeHint};
use super::{Admission, SKETCH_AGEING_READS};
use crate::raw::kernels::prefetch;
use crate::raw::zeroed::{try_zeroed_slice, ZeroedSlice};
use crate::{Error, Result};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Stripes of an exact counter (and locks of a sketch).
const STRIPES: usize = 64;

/// Most room for new pending keys a stripe takes from the shared pool at
/// a time (fewer for a small bound).
const ROOM_BATCH: usize = 16;

/// Most rows a sketch may have (as the builder checks).
pub(crate) const MAX_SKETCH_DEPTH: usize = 16;

/// Most counters a sketch may have in all (as the builder checks).
pub(crate) const MAX_SKETCH_COUNTERS: usize = 1 << 32;

/// Chooses the stripe of a key: fixed seeds, distinct from the index's
/// (an exact counter's state is keyed by the keys themselves, so this hash
/// is not part of any format).
const STRIPE_HASH: ahash::RandomState = ahash::RandomState::with_seeds(
    0x6a09_e667_f3bc_c908,
    0xbb67_ae85_84ca_a73b,
    0x3c6e_f372_fe94_f82b,
    0xa54f_f53a_5f1d_36f1,
);

/// The golden ratio in 64 bits: the sketch hash's per-row step.
const PHI: u64 = 0x9e37_79b9_7f4a_7c15;

/// The 64-bit finalizer of MurmurHash3: a bijection of `u64` whose every
/// output bit depends on every input bit.
fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// `hash` scaled to `0..n` (its high bits decide; Lemire's multiply-shift).
fn scale(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}

/// The sketch hash of `key`, `fmix64(key ^ PHI)`, from which every row's
/// column follows (see [`column()`]).
fn sketch_base(key: u64) -> u64 {
    fmix64(key ^ PHI)
}

/// The column of the counter in row `row` of a sketch `width` counters
/// wide for the key whose [`sketch_base`] is `base`:
/// `fmix64(base + (row + 1) * PHI)` (wrapping) scaled to `0..width` by its
/// high bits (`hash * width >> 64`). Part of the checkpoint format.
fn column(base: u64, row: usize, width: usize) -> usize {
    let step = (row as u64).wrapping_add(1).wrapping_mul(PHI);
    scale(fmix64(base.wrapping_add(step)), width)
}

/// Locks `mutex`, going on past a panic of another holder (every state
/// under these locks is valid at every step).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The admission state of one variable, shared by its shards.
pub(crate) struct Admitter {
    admission: Admission,
    counts: Counts,
}

/// The counters of either kind.
enum Counts {
    Exact(ExactCounts),
    Sketch(SketchCounts),
}

/// Exact pending counts of at most `bound` keys, striped by key (see the
/// module docs).
struct ExactCounts {
    min_count: u32,
    bound: usize,
    /// Room a stripe takes from `free` at a time.
    room_batch: usize,
    /// Room for new pending keys that no stripe holds. The pending keys,
    /// the stripes' spare room and this never add up to more than
    /// `bound` (but during a merge, see [`ExactCounts::merge`]); they add
    /// up to it when no stripe is taking or giving room.
    free: CachePadded<AtomicUsize>,
    /// Held by the one thread that gathers room or drops counts from all
    /// stripes (it locks them one at a time, never two at once).
    making_room: Mutex<()>,
    stripes: Box<[CachePadded<StripeCell>]>,
}

/// One stripe of exact counts, and where its map keeps its entries (for
/// prefetching without the lock), in a cache line of its own: the lock's
/// line changes hands at every count, the hint's only when the map's
/// array moves.
struct StripeCell {
    stripe: Mutex<Stripe>,
    hint: CachePadded<ProbeHint>,
}

/// A locked stripe: publishes where its map's entries are when unlocked.
struct LockedStripe<'a> {
    guard: MutexGuard<'a, Stripe>,
    hint: &'a ProbeHint,
}

impl StripeCell {
    /// The stripe, locked.
    fn lock(&self) -> LockedStripe<'_> {
        LockedStripe {
            guard: lock(&self.stripe),
            hint: &self.hint,
        }
    }
}

impl std::ops::Deref for LockedStripe<'_> {
    type Target = Stripe;
    fn deref(&self) -> &Stripe {
        &self.guard
    }
}

impl std::ops::DerefMut for LockedStripe<'_> {
    fn deref_mut(&mut self) -> &mut Stripe {
        &mut self.guard
    }
}

impl Drop for LockedStripe<'_> {
    fn drop(&mut self) {
        self.guard.counts.publish(self.hint);
    }
}

/// One stripe of exact counts: keys with a count in `1..min_count`, and
/// room for `spare` more taken from the shared pool.
struct Stripe {
    counts: PendingMap,
    spare: usize,
}

/// A count-min sketch of `depth` rows of `width` counters.
struct SketchCounts {
    min_count: u32,
    width: usize,
    depth: usize,
    /// Row by row: row `i` is `counters[i * width..(i + 1) * width]`.
    counters: ZeroedSlice<AtomicU16>,
    /// Reads counted since the last ageing.
    reads: AtomicU64,
    /// Reads between two agings: [`SKETCH_AGEING_READS`] x `width`.
    ageing_reads: u64,
    /// Held by the thread that is halving the counters.
    ageing: AtomicBool,
    /// Serializes the counting of one key (chosen by its sketch hash).
    locks: Box<[CachePadded<Mutex<()>>]>,
}

/// An admitter's counts, as checkpoints keep them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AdmissionState {
    /// Pending keys and their counts.
    Exact { keys: Vec<u64>, counts: Vec<u32> },
    /// The sketch's counters, row by row (`depth * width`), and the reads
    /// counted since the last ageing.
    Sketch {
        width: usize,
        depth: usize,
        counters: Vec<u16>,
        reads: u64,
    },
}

impl ExactCounts {
    /// Exact counts of at most `bound` keys in all.
    fn new(min_count: u32, bound: usize) -> ExactCounts {
        let bound = bound.max(1);
        let n = STRIPES.min(bound);
        let stripes = (0..n)
            .map(|i| {
                let share = bound / n + usize::from(i < bound % n);
                CachePadded::new(StripeCell {
                    stripe: Mutex::new(Stripe {
                        counts: PendingMap::new(share),
                        spare: 0,
                    }),
                    hint: CachePadded::new(ProbeHint::default()),
                })
            })
            .collect();
        ExactCounts {
            min_count,
            bound,
            room_batch: (bound / (4 * n)).clamp(1, ROOM_BATCH),
            free: CachePadded::new(AtomicUsize::new(bound)),
            making_room: Mutex::new(()),
            stripes,
        }
    }

    /// The index of `key`'s stripe.
    fn stripe_of(&self, key: u64) -> usize {
        scale(STRIPE_HASH.hash_one(key), self.stripes.len())
    }

    /// The stripe of `key`, locked.
    fn stripe(&self, key: u64) -> LockedStripe<'_> {
        self.stripes[self.stripe_of(key)].lock()
    }

    /// Prefetches the entry where `key`'s count is, or would go, ahead of
    /// a count.
    fn prefetch(&self, key: u64) {
        let cell = &self.stripes[self.stripe_of(key)];
        prefetch(&cell.stripe);
        cell.hint.prefetch(key);
    }

    /// Counts one read of `key`; true if it admits the key.
    fn count(&self, key: u64) -> bool {
        if self.min_count <= 1 {
            return true;
        }
        loop {
            let mut stripe = self.stripe(key);
            if stripe.spare == 0 && stripe.counts.get(key).is_none() {
                // Room is had before the insert, so the pending keys never
                // number more than the bound.
                stripe.spare = self.take_room();
                if stripe.spare == 0 {
                    drop(stripe);
                    self.make_room();
                    continue;
                }
            }
            return match stripe.counts.bump(key, self.min_count) {
                None => {
                    // Admitted: its entry's room is the stripe's again.
                    stripe.spare += 1;
                    if stripe.spare > 2 * self.room_batch {
                        let excess = stripe.spare - self.room_batch;
                        stripe.spare = self.room_batch;
                        self.free.fetch_add(excess, Ordering::Relaxed);
                    }
                    true
                }
                Some(1) => {
                    stripe.spare -= 1;
                    false
                }
                Some(_) => false,
            };
        }
    }

    /// Takes up to `room_batch` room from the pool (0 if it is empty).
    fn take_room(&self) -> usize {
        self.take_free(self.room_batch)
    }

    /// Takes up to `most` room from the pool: what it took.
    fn take_free(&self, most: usize) -> usize {
        self.free
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |free| {
                (free > 0).then(|| free - free.min(most))
            })
            .map_or(0, |free| free.min(most))
    }

    /// Makes room for a new key when its stripe has none and the pool is
    /// empty: gathers the room the other stripes hold unused, and if there
    /// is none (every key of the bound is pending), drops the lowest counts
    /// of all stripes, at least a sixteenth of the bound.
    fn make_room(&self) {
        let _alone = lock(&self.making_room);
        if self.free.load(Ordering::Relaxed) > 0 {
            return;
        }
        self.gather_spare_room();
        if self.free.load(Ordering::Relaxed) > 0 {
            return;
        }
        let dropped = self.drop_lowest((self.bound / 16).max(1), Ties::Together);
        self.free.fetch_add(dropped, Ordering::Relaxed);
    }

    /// Moves every stripe's spare room to the pool (`making_room` held).
    fn gather_spare_room(&self) {
        for cell in self.stripes.iter() {
            let spare = std::mem::take(&mut cell.lock().spare);
            self.free.fetch_add(spare, Ordering::Relaxed);
        }
    }

    /// Drops the `n` lowest counts of all stripes as they are read first
    /// (`making_room` held): with [`Ties::Together`] every entry at or
    /// below the `n`-th lowest count, with [`Ties::Split`] exactly `n`,
    /// the lowest by count and then by key (so equal counts at the edge go
    /// by key, the same way every time). Counts that rise or go meanwhile
    /// are dropped as they are then. Returns how many entries it dropped;
    /// their room is the caller's.
    fn drop_lowest(&self, n: usize, ties: Ties) -> usize {
        if n == 0 {
            return 0;
        }
        let stays: Box<dyn Fn(u64, u32) -> bool> = match ties {
            Ties::Together => {
                let mut counts: Vec<u32> = Vec::new();
                for cell in self.stripes.iter() {
                    counts.extend(cell.lock().counts.iter().map(|(_, count)| count));
                }
                let Some(edge) = nth_lowest(&mut counts, n) else {
                    return 0;
                };
                Box::new(move |_, count| count > edge)
            }
            Ties::Split => {
                let mut entries: Vec<(u32, u64)> = Vec::new();
                for cell in self.stripes.iter() {
                    let stripe = cell.lock();
                    entries.extend(stripe.counts.iter().map(|(key, count)| (count, key)));
                }
                let Some(edge) = nth_lowest(&mut entries, n) else {
                    return 0;
                };
                Box::new(move |key, count| (count, key) > edge)
            }
        };
        let mut dropped = 0;
        for cell in self.stripes.iter() {
            let mut stripe = cell.lock();
            let before = stripe.counts.len();
            stripe.counts.retain(&stays);
            dropped += before - stripe.counts.len();
        }
        dropped
    }

    /// Every pending key and its count.
    fn state(&self) -> AdmissionState {
        let (mut keys, mut counts) = (Vec::new(), Vec::new());
        for stripe in self.stripes.iter() {
            let stripe = stripe.lock();
            for (key, count) in stripe.counts.iter() {
                keys.push(key);
                counts.push(count);
            }
        }
        AdmissionState::Exact { keys, counts }
    }

    /// Raises the counts of `keys` to `counts` (counts of `min_count` or
    /// more become `min_count - 1`: the key's next read admits it; zero
    /// counts are skipped), then drops the lowest counts of all stripes
    /// past the bound: what stays are the highest counts, whatever the
    /// order of `keys` (of equal counts at the edge, those of the larger
    /// keys), so merging the same counts twice changes nothing. Until it
    /// has trimmed, the counter holds up to twice the bound: the keys
    /// pending before, and the highest `bound` of `keys`.
    fn merge(&self, keys: &[u64], counts: &[u32]) {
        if self.min_count <= 1 {
            return;
        }
        // Each key once, with its largest count; past the bound, only the
        // highest by count and then by key, which are all the trim below
        // could keep (so the counter never holds more than twice the bound).
        let mut entries: Vec<(u32, u64)> = keys
            .iter()
            .zip(counts)
            .filter(|&(_, &count)| count > 0)
            .map(|(&key, &count)| (count.min(self.min_count - 1), key))
            .collect();
        entries.sort_unstable_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
        entries.dedup_by_key(|&mut (_, key)| key);
        if entries.len() > self.bound {
            let excess = entries.len() - self.bound;
            entries.select_nth_unstable(excess);
            entries.drain(..excess);
        }
        let mut by_stripe = vec![Vec::new(); self.stripes.len()];
        for (count, key) in entries {
            by_stripe[self.stripe_of(key)].push((key, count));
        }
        let _alone = lock(&self.making_room);
        self.gather_spare_room();
        // New keys take room from the pool; those it has none for are
        // past the bound until the trim below.
        let mut past_bound = 0;
        for (stripe, entries) in self.stripes.iter().zip(by_stripe) {
            if entries.is_empty() {
                continue;
            }
            let mut stripe = stripe.lock();
            let before = stripe.counts.len();
            for (key, count) in entries {
                stripe.counts.raise(key, count);
            }
            let added = stripe.counts.len() - before;
            past_bound += added - self.take_free(added);
        }
        // Counting threads may admit keys meanwhile (their room goes to
        // their stripes) or raise the counts at the edge: room they free
        // settles the excess first, and the drops go on until it is gone.
        loop {
            self.gather_spare_room();
            past_bound -= self.take_free(past_bound);
            if past_bound == 0 {
                break;
            }
            let dropped = self.drop_lowest(past_bound, Ties::Split);
            let settled = dropped.min(past_bound);
            past_bound -= settled;
            self.free.fetch_add(dropped - settled, Ordering::Relaxed);
        }
    }

    /// Forgets every pending count.
    fn clear(&self) {
        let _alone = lock(&self.making_room);
        for cell in self.stripes.iter() {
            let mut stripe = cell.lock();
            let room = stripe.counts.len() + std::mem::take(&mut stripe.spare);
            stripe.counts.clear();
            self.free.fetch_add(room, Ordering::Relaxed);
        }
    }

    /// The pending keys, the stripes' spare room and the pool (the bound
    /// when no count is under way).
    #[cfg(test)]
    fn accounted(&self) -> usize {
        let held: usize = self
            .stripes
            .iter()
            .map(|cell| {
                let stripe = cell.lock();
                stripe.counts.len() + stripe.spare
            })
            .sum();
        held + self.free.load(Ordering::Relaxed)
    }
}

/// The `n`-th lowest of `values` (`n` at least 1; all of them if fewer),
/// or `None` if there are none.
fn nth_lowest<T: Ord + Copy>(values: &mut [T], n: usize) -> Option<T> {
    if values.is_empty() {
        return None;
    }
    let n = n.min(values.len());
    Some(*values.select_nth_unstable(n - 1).1)
}

/// What [`ExactCounts::drop_lowest`] does with equal counts at its edge.
#[derive(Clone, Copy)]
enum Ties {
    /// Drops them all (making room: keys of equal count go together).
    Together,
    /// Drops exactly the number asked for, equal counts by key (a restore
    /// keeps exactly the bound, and a repeated load the same keys).
    Split,
}

impl SketchCounts {
    /// An all-zero sketch; [`Error::OutOfMemory`] if it cannot be had.
    fn new(min_count: u32, width: usize, depth: usize) -> Result<SketchCounts> {
        let len = width * depth;
        let counters = try_zeroed_slice(len, 64).ok_or(Error::OutOfMemory {
            what: "admission sketch",
            bytes: len.saturating_mul(2),
        })?;
        Ok(SketchCounts {
            min_count,
            width,
            depth,
            counters,
            reads: AtomicU64::new(0),
            ageing_reads: (SKETCH_AGEING_READS as u64).saturating_mul(width as u64),
            ageing: AtomicBool::new(false),
            locks: (0..STRIPES)
                .map(|_| CachePadded::new(Mutex::new(())))
                .collect(),
        })
    }

    /// The counters of the key whose sketch hash is `base`, one per row.
    fn cells(&self, base: u64) -> impl Iterator<Item = &AtomicU16> + '_ {
        (0..self.depth)
            .map(move |row| &self.counters[row * self.width + column(base, row, self.width)])
    }

    /// Prefetches the key's counters and the lock that counts it, ahead
    /// of a count or an estimate.
    fn prefetch(&self, key: u64) {
        let base = sketch_base(key);
        prefetch(&self.locks[scale(base.rotate_left(32), STRIPES)]);
        for cell in self.cells(base) {
            prefetch(cell);
        }
    }

    /// The key's estimated count: the least of its counters.
    fn estimate(&self, key: u64) -> u32 {
        self.cells(sketch_base(key))
            .map(|c| u32::from(c.load(Ordering::Relaxed)))
            .min()
            .unwrap_or(0)
    }

    /// Counts one read of `key` (conservative update: the key's counters
    /// at its minimum `m` rise to `m + 1`, the others stay); true if its
    /// estimate then reaches `min_count`.
    fn count(&self, key: u64) -> bool {
        if self.min_count <= 1 {
            return true;
        }
        let base = sketch_base(key);
        let estimate = {
            let _one_read_at_a_time = lock(&self.locks[scale(base.rotate_left(32), STRIPES)]);
            let mut seen = [(0_usize, 0_u16); MAX_SKETCH_DEPTH];
            let seen = &mut seen[..self.depth];
            for (row, cell) in seen.iter_mut().enumerate() {
                let at = row * self.width + column(base, row, self.width);
                *cell = (at, self.counters[at].load(Ordering::Relaxed));
            }
            let least = seen.iter().map(|&(_, value)| value).min().unwrap_or(0);
            let raised = least.saturating_add(1);
            // Only the counters at the minimum rise, so the others need
            // no read-modify-write: a counter at or above `raised` stays
            // there (other keys' counts only raise it) unless the sketch
            // ages meanwhile.
            for &(at, value) in seen.iter() {
                if value < raised {
                    self.counters[at].fetch_max(raised, Ordering::Relaxed);
                }
            }
            raised
        };
        u32::from(estimate) >= self.min_count
    }

    /// Notes `n` counted reads (a shard batch's, once it has counted them);
    /// the batch that completes an ageing period halves every counter, once
    /// per period completed (at most sixteen times, which empties them; the
    /// reads past the last period are kept), unless another thread is
    /// already at it.
    fn note_reads(&self, n: u64) {
        if n == 0 || self.min_count <= 1 {
            return;
        }
        let reads = self.reads.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        if reads < self.ageing_reads
            || self
                .ageing
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let period = self.ageing_reads;
        let periods = self.reads.load(Ordering::Relaxed) / period;
        // Sixteen halvings empty every 16-bit counter.
        for _ in 0..periods.min(16) {
            self.halve();
        }
        let _ = self
            .reads
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                Some(r.saturating_sub(periods * period))
            });
        self.ageing.store(false, Ordering::Release);
    }

    /// Halves every counter. A counter a concurrent count raises keeps its
    /// raised value; one that count found above the key's minimum (and so
    /// left alone) may be halved, as if the read came before the ageing.
    fn halve(&self) {
        for cell in self.counters.iter() {
            let value = cell.load(Ordering::Relaxed);
            if value > 0 {
                let _ =
                    cell.compare_exchange(value, value / 2, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
    }

    /// The counters and the reads since the last ageing.
    fn state(&self) -> AdmissionState {
        AdmissionState::Sketch {
            width: self.width,
            depth: self.depth,
            counters: self
                .counters
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            reads: self.reads.load(Ordering::Relaxed),
        }
    }

    /// Checks that a saved sketch has this one's shape.
    fn check_shape(&self, width: usize, depth: usize, counters: usize) -> Result<()> {
        if (width, depth) != (self.width, self.depth) {
            return Err(Error::InvalidArgument(format!(
                "admission sketch of {width} x {depth} counters does not fit a sketch of {} x {}",
                self.width, self.depth
            )));
        }
        if counters != self.counters.len() {
            return Err(Error::LengthMismatch {
                what: "admission sketch counters",
                expected: self.counters.len(),
                actual: counters,
            });
        }
        Ok(())
    }

    /// Sets every counter to `counters`' (or to the larger of the two if
    /// `keep_larger`), and the reads since the last ageing likewise
    /// (at most one ageing period).
    fn put(&self, counters: &[u16], reads: u64, keep_larger: bool) {
        for (cell, &value) in self.counters.iter().zip(counters) {
            if keep_larger {
                cell.fetch_max(value, Ordering::Relaxed);
            } else {
                cell.store(value, Ordering::Relaxed);
            }
        }
        let reads = reads.min(self.ageing_reads);
        if keep_larger {
            self.reads.fetch_max(reads, Ordering::Relaxed);
        } else {
            self.reads.store(reads, Ordering::Relaxed);
        }
    }
}

impl Admitter {
    /// Counters for `admission`; exact counts hold at most `pending_bound`
    /// keys (at least one). An [`Error::InvalidArgument`] for a rule the
    /// builder refuses too, [`Error::OutOfMemory`] if the sketch cannot be
    /// allocated.
    pub(crate) fn new(admission: Admission, pending_bound: usize) -> Result<Admitter> {
        Admitter::check_rule(admission)?;
        let counts = match admission {
            Admission::Exact { min_count } => {
                Counts::Exact(ExactCounts::new(min_count, pending_bound))
            }
            Admission::Sketch {
                min_count,
                width,
                depth,
            } => Counts::Sketch(SketchCounts::new(min_count, width, depth)?),
        };
        Ok(Admitter { admission, counts })
    }

    /// Checks that `admission` is a rule counters can follow (as the
    /// builder does): `min_count` at least 1 (a sketch's at most
    /// `u16::MAX` and at most its ageing period, [`SKETCH_AGEING_READS`] x
    /// `width`), a sketch at least 1 wide, 1 to [`MAX_SKETCH_DEPTH`]
    /// deep and of at most [`MAX_SKETCH_COUNTERS`] counters.
    pub(crate) fn check_rule(admission: Admission) -> Result<()> {
        let refuse = |what: String| Err(Error::InvalidArgument(what));
        if admission.min_count() == 0 {
            return refuse("admission min_count must be at least 1".into());
        }
        if let Admission::Sketch {
            min_count,
            width,
            depth,
        } = admission
        {
            if min_count > u32::from(u16::MAX) {
                return refuse(format!(
                    "sketch admission counts to at most {}, min_count is {min_count}",
                    u16::MAX
                ));
            }
            if width == 0 || !(1..=MAX_SKETCH_DEPTH).contains(&depth) {
                return refuse(format!(
                    "sketch admission needs width >= 1 and depth in 1..={MAX_SKETCH_DEPTH}, got {width} x {depth}"
                ));
            }
            if width
                .checked_mul(depth)
                .is_none_or(|n| n > MAX_SKETCH_COUNTERS)
            {
                return refuse(format!("sketch of {width} x {depth} counters is too large"));
            }
            let period = (SKETCH_AGEING_READS as u64).saturating_mul(width as u64);
            if u64::from(min_count) > period {
                return refuse(format!(
                    "sketch admission min_count {min_count} is more than the {period} counted \
                     reads between two agings of a sketch {width} wide ({SKETCH_AGEING_READS} x \
                     width): the sketch would halve a key's count before it could reach \
                     min_count unless the key made most of the reads; widen the sketch"
                ));
            }
        }
        Ok(())
    }

    /// The admission rule.
    pub(crate) fn admission(&self) -> Admission {
        self.admission
    }

    /// Counts one training read of `key`, which is not in the table; true
    /// if this read admits it. The caller notes the reads it counted with
    /// [`Admitter::note_reads`] once it is done (a sketch ages by them).
    pub(crate) fn count(&self, key: u64) -> bool {
        match &self.counts {
            Counts::Exact(exact) => exact.count(key),
            Counts::Sketch(sketch) => sketch.count(key),
        }
    }

    /// Notes that a shard batch counted `n` reads: a sketch halves its
    /// counters when an ageing period completes. Noted once per batch
    /// rather than per read, so that threads counting at once do not
    /// contend on one counter for every read; a sketch therefore ages at
    /// the end of the batch that completes a period.
    pub(crate) fn note_reads(&self, n: u64) {
        if let Counts::Sketch(sketch) = &self.counts {
            sketch.note_reads(n);
        }
    }

    /// Starts bringing what counting `key` reads into cache (a sketch's
    /// counters, or the entry of the key's exact count, and the lock that
    /// counts it): a batch that writes calls it a few keys before it
    /// reaches a missing key, which it may count or check.
    pub(crate) fn prefetch(&self, key: u64) {
        match &self.counts {
            Counts::Exact(exact) if exact.min_count > 1 => exact.prefetch(key),
            Counts::Sketch(sketch) if sketch.min_count > 1 => sketch.prefetch(key),
            _ => {}
        }
    }

    /// Whether an update may insert `key`, which is not in the table,
    /// without counting a read. Exact counts admit no missing key (unless
    /// every key is admitted at its first read): an admitted key's count
    /// was dropped when it was admitted. A sketch admits a key whose
    /// estimate has reached `min_count`.
    pub(crate) fn admits(&self, key: u64) -> bool {
        match &self.counts {
            Counts::Exact(exact) => exact.min_count <= 1,
            Counts::Sketch(sketch) => {
                sketch.min_count <= 1 || sketch.estimate(key) >= sketch.min_count
            }
        }
    }

    /// The counts, for a checkpoint: every pending key (exact; collected
    /// stripe by stripe while others count) or every counter (sketch).
    pub(crate) fn state(&self) -> AdmissionState {
        match &self.counts {
            Counts::Exact(exact) => exact.state(),
            Counts::Sketch(sketch) => sketch.state(),
        }
    }

    /// Replaces the counts with `state`, checked first (nothing changes
    /// if it does not fit): an exact state into exact counts (keys and
    /// counts of equal length; counts of `min_count` or more become
    /// `min_count - 1`, zero counts are skipped, the lowest are dropped
    /// past the bound, a repeated key keeps its largest count), a sketch
    /// of the same width and depth into a sketch.
    pub(crate) fn set_state(&self, state: AdmissionState) -> Result<()> {
        self.check_state(&state)?;
        self.clear();
        self.put(&state, false);
        Ok(())
    }

    /// Adds `state` to the counts, checked first like
    /// [`set_state`](Self::set_state): each key keeps the larger of its two
    /// counts (exact), each counter the larger of its two values (sketch).
    pub(crate) fn merge_state(&self, state: &AdmissionState) -> Result<()> {
        self.check_state(state)?;
        self.put(state, true);
        Ok(())
    }

    /// Forgets every count: no key is pending.
    pub(crate) fn clear(&self) {
        match &self.counts {
            Counts::Exact(exact) => exact.clear(),
            Counts::Sketch(sketch) => {
                for cell in sketch.counters.iter() {
                    cell.store(0, Ordering::Relaxed);
                }
                sketch.reads.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Checks that `state` fits these counters.
    fn check_state(&self, state: &AdmissionState) -> Result<()> {
        match (&self.counts, state) {
            (Counts::Exact(_), AdmissionState::Exact { keys, counts }) => {
                if keys.len() != counts.len() {
                    return Err(Error::LengthMismatch {
                        what: "admission counts",
                        expected: keys.len(),
                        actual: counts.len(),
                    });
                }
                Ok(())
            }
            (
                Counts::Sketch(sketch),
                AdmissionState::Sketch {
                    width,
                    depth,
                    counters,
                    ..
                },
            ) => sketch.check_shape(*width, *depth, counters.len()),
            (Counts::Exact(_), AdmissionState::Sketch { .. }) => Err(Error::InvalidArgument(
                "an admission sketch does not fit exact admission counts".into(),
            )),
            (Counts::Sketch(_), AdmissionState::Exact { .. }) => Err(Error::InvalidArgument(
                "exact admission counts do not fit an admission sketch".into(),
            )),
        }
    }

    /// Writes a checked `state` into the counts (merging if `keep_larger`).
    fn put(&self, state: &AdmissionState, keep_larger: bool) {
        match (&self.counts, state) {
            (Counts::Exact(exact), AdmissionState::Exact { keys, counts }) => {
                exact.merge(keys, counts);
            }
            (
                Counts::Sketch(sketch),
                AdmissionState::Sketch {
                    counters, reads, ..
                },
            ) => sketch.put(counters, *reads, keep_larger),
            _ => {}
        }
    }

    /// Estimated count of `key` (exact: its pending count).
    #[cfg(test)]
    fn estimate(&self, key: u64) -> u32 {
        match &self.counts {
            Counts::Exact(exact) => exact.stripe(key).counts.get(key).unwrap_or(0),
            Counts::Sketch(sketch) => sketch.estimate(key),
        }
    }
}

impl fmt::Debug for Admitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Admitter");
        d.field("admission", &self.admission);
        match &self.counts {
            Counts::Exact(exact) => {
                let pending: usize = exact.stripes.iter().map(|s| s.lock().counts.len()).sum();
                d.field("pending", &pending);
            }
            Counts::Sketch(sketch) => {
                d.field("reads", &sketch.reads.load(Ordering::Relaxed));
            }
        }
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_pcg::Pcg64Mcg;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// One training read, counted and noted, as a call of one key does.
    trait ReadOne {
        fn read(&self, key: u64) -> bool;
    }

    impl ReadOne for Admitter {
        fn read(&self, key: u64) -> bool {
            let admitted = self.count(key);
            self.note_reads(1);
            admitted
        }
    }

    /// Columns of key 42 in rows 0 to 3 of a sketch 2^16 wide.
    const PINNED_COLUMNS: [usize; 4] = [64346, 50964, 30340, 13325];

    fn exact(min_count: u32, bound: usize) -> Admitter {
        Admitter::new(Admission::Exact { min_count }, bound).unwrap()
    }

    fn sketch(min_count: u32, width: usize, depth: usize) -> Admitter {
        Admitter::new(
            Admission::Sketch {
                min_count,
                width,
                depth,
            },
            0,
        )
        .unwrap()
    }

    fn pending(admitter: &Admitter) -> usize {
        match admitter.state() {
            AdmissionState::Exact { keys, .. } => keys.len(),
            AdmissionState::Sketch { .. } => unreachable!("exact counts"),
        }
    }

    #[test]
    fn exact_admits_at_exactly_the_min_count() {
        let a = exact(3, 1000);
        assert!(!a.read(7));
        assert!(!a.read(8));
        assert!(!a.read(7));
        assert_eq!(a.estimate(8), 1, "other keys' counts are their own");
        assert!(a.read(7), "the third read admits");
        assert_eq!(a.estimate(7), 0, "an admitted key's count is dropped");
        assert!(!a.admits(7) && !a.admits(8));
        assert!(!a.read(8));
        assert!(a.read(8));
        // A key evicted later counts from zero again.
        assert!(!a.read(7));
        assert_eq!(pending(&a), 1);
    }

    #[test]
    fn exact_min_count_one_admits_at_once_and_stores_nothing() {
        let a = exact(1, 10);
        for key in 0..100 {
            assert!(a.admits(key));
            assert!(a.read(key));
        }
        assert_eq!(pending(&a), 0);
    }

    fn exact_counts(admitter: &Admitter) -> &ExactCounts {
        let Counts::Exact(exact) = &admitter.counts else {
            unreachable!("exact counts")
        };
        exact
    }

    #[test]
    fn a_full_counter_drops_its_lowest_counts() {
        let a = exact(10, 2);
        let keys = [3, 1 << 40, 17, 99, u64::MAX];
        for _ in 0..3 {
            a.read(keys[0]);
        }
        a.read(keys[1]);
        a.read(keys[2]); // full: drops keys[1] (the lowest count)
        assert_eq!(
            [
                a.estimate(keys[0]),
                a.estimate(keys[1]),
                a.estimate(keys[2])
            ],
            [3, 0, 1]
        );
        a.read(keys[3]); // drops keys[2]
        a.read(keys[3]);
        a.read(keys[4]); // drops keys[3], whose 2 is the lowest count
        assert_eq!(
            [
                a.estimate(keys[0]),
                a.estimate(keys[3]),
                a.estimate(keys[4])
            ],
            [3, 0, 1],
            "the highest count stays"
        );

        // Every entry at the lowest count goes together.
        let a = exact(10, 4);
        a.read(keys[0]);
        a.read(keys[0]);
        for &k in &keys[1..4] {
            a.read(k);
        }
        a.read(keys[4]);
        assert_eq!(a.estimate(keys[0]), 2);
        assert!(keys[1..4].iter().all(|&k| a.estimate(k) == 0));
        assert_eq!(a.estimate(keys[4]), 1);
    }

    #[test]
    fn keys_below_the_bound_are_never_dropped_whatever_their_stripes() {
        // Two keys pending at a time against a bound of two: every pair
        // is admitted at its second reads, wherever its keys' stripes are.
        let a = exact(2, 2);
        for pair in 0..500_u64 {
            let keys = [2 * pair, 2 * pair + 1];
            assert!(keys.iter().all(|&k| !a.read(k)));
            assert!(keys.iter().all(|&k| a.read(k)), "pair {pair}");
        }
        // 63 keys pending of a bound of 64 (one stripe each, 64 stripes),
        // then 63 others: every key is admitted at its second read.
        let a = exact(2, 64);
        for round in 0..20_u64 {
            let keys: Vec<u64> = (0..63).map(|i| round * 1000 + i).collect();
            assert!(keys.iter().all(|&k| !a.read(k)));
            assert_eq!(pending(&a), 63);
            assert!(keys.iter().all(|&k| a.read(k)), "round {round}");
            assert_eq!(exact_counts(&a).accounted(), 64);
        }
        // Nine tenths of a large bound pending at once.
        let a = exact(3, 6400);
        let keys: Vec<u64> = (0..5760).map(|k| k * 7919).collect();
        for _ in 0..2 {
            assert!(keys.iter().all(|&k| !a.read(k)));
        }
        assert_eq!(pending(&a), keys.len());
        assert!(keys.iter().all(|&k| a.read(k)));
        assert_eq!(pending(&a), 0);
        assert_eq!(exact_counts(&a).accounted(), 6400);
    }

    #[test]
    fn exact_counts_never_hold_more_than_the_bound() {
        for bound in [1, 5, 63, 64, 65, 1000] {
            let a = exact(4, bound);
            let mut rng = Pcg64Mcg::seed_from_u64(bound as u64);
            for i in 0..20_000 {
                a.read(rng.random_range(0..5_000));
                if i % 1000 == 0 {
                    assert!(pending(&a) <= bound, "bound {bound}");
                }
            }
            assert!(pending(&a) <= bound, "bound {bound}");
            assert_eq!(exact_counts(&a).accounted(), bound.max(1));
        }
    }

    #[test]
    fn four_threads_share_the_bound_exactly() {
        for bound in [3, 64, 1000] {
            let a = exact(3, bound);
            std::thread::scope(|scope| {
                for t in 0..4_u64 {
                    let a = &a;
                    scope.spawn(move || {
                        let mut rng = Pcg64Mcg::seed_from_u64(t);
                        for _ in 0..20_000 {
                            a.read(rng.random_range(0..3 * bound as u64));
                        }
                    });
                }
            });
            assert!(pending(&a) <= bound, "bound {bound}");
            assert_eq!(exact_counts(&a).accounted(), bound, "bound {bound}");
        }
    }

    #[test]
    fn restores_racing_counts_keep_the_bound_exactly() {
        // Three threads count while the main thread merges, replaces and
        // clears the counts: the pending keys, the spare room and the pool
        // add up to the bound at the end, and never hold more keys.
        for (bound, keys) in [(2_usize, 6_u64), (64, 200), (500, 1500)] {
            for round in 0..20_u64 {
                let a = exact(2, bound);
                let stop = std::sync::atomic::AtomicBool::new(false);
                let state = AdmissionState::Exact {
                    keys: (0..keys).collect(),
                    counts: vec![1; keys as usize],
                };
                std::thread::scope(|scope| {
                    for t in 0..3_u64 {
                        let (a, stop) = (&a, &stop);
                        scope.spawn(move || {
                            let mut rng = Pcg64Mcg::seed_from_u64(round * 8 + t);
                            while !stop.load(Ordering::Relaxed) {
                                a.read(rng.random_range(0..keys));
                            }
                        });
                    }
                    for i in 0..30 {
                        match i % 5 {
                            0 => a.clear(),
                            1 => a.set_state(state.clone()).unwrap(),
                            _ => a.merge_state(&state).unwrap(),
                        }
                    }
                    stop.store(true, Ordering::Relaxed);
                });
                assert_eq!(exact_counts(&a).accounted(), bound, "bound {bound}");
                assert!(pending(&a) <= bound, "bound {bound}");
            }
        }
    }

    #[test]
    fn pending_counts_take_at_most_40_bytes_a_key_of_the_bound() {
        // Random keys read once, four times the bound of them: the counter
        // stays at its bound, its stripes' shares of it uneven.
        let bound = 1 << 16;
        let a = exact(2, bound);
        let mut rng = Pcg64Mcg::seed_from_u64(5);
        let mut most = 0.0_f64;
        for _ in 0..4 {
            for _ in 0..bound {
                a.read(rng.random());
            }
            let slots: usize = exact_counts(&a)
                .stripes
                .iter()
                .map(|cell| cell.lock().counts.slots())
                .sum();
            most = most.max((slots * 16) as f64 / bound as f64);
        }
        println!("pending counts at their bound: at most {most:.1} bytes a key of the bound");
        assert!(most <= 40.0, "{most} bytes a key");
    }

    #[test]
    fn exact_state_round_trips_and_is_checked() {
        let a = exact(5, 1000);
        for (key, reads) in [(1, 1), (2, 4), (3, 2)] {
            for _ in 0..reads {
                a.read(key);
            }
        }
        let state = a.state();
        let b = exact(5, 1000);
        b.set_state(state.clone()).unwrap();
        assert_eq!([b.estimate(1), b.estimate(2), b.estimate(3)], [1, 4, 2]);
        assert!(b.read(2), "the fifth read admits, as before the restore");

        // Counts at or past min_count admit at the next read; zero counts
        // are skipped; a repeated key keeps its largest count.
        b.set_state(AdmissionState::Exact {
            keys: vec![10, 11, 12, 12],
            counts: vec![0, 9, 1, 3],
        })
        .unwrap();
        assert_eq!(pending(&b), 2);
        assert_eq!([b.estimate(11), b.estimate(12)], [4, 3]);

        // Bad states change nothing.
        let before = b.state();
        let err = b
            .set_state(AdmissionState::Exact {
                keys: vec![1],
                counts: vec![],
            })
            .unwrap_err();
        assert!(matches!(err, Error::LengthMismatch { .. }), "{err}");
        let err = b
            .set_state(AdmissionState::Sketch {
                width: 1,
                depth: 1,
                counters: vec![0],
                reads: 0,
            })
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert_eq!(b.state(), before);

        // Merging keeps the larger count per key.
        b.merge_state(&AdmissionState::Exact {
            keys: vec![11, 12, 13],
            counts: vec![1, 4, 2],
        })
        .unwrap();
        assert_eq!([b.estimate(11), b.estimate(12), b.estimate(13)], [4, 4, 2]);
    }

    #[test]
    fn a_restored_state_past_the_bound_keeps_the_highest_counts() {
        let a = exact(100, 3);
        let keys: Vec<u64> = (0..10).map(|k| k * 0x9e37_79b9).collect();
        let counts: Vec<u32> = vec![5, 1, 9, 2, 9, 3, 1, 7, 4, 2];
        a.set_state(AdmissionState::Exact {
            keys: keys.clone(),
            counts,
        })
        .unwrap();
        let AdmissionState::Exact { keys: mut kept, .. } = a.state() else {
            unreachable!()
        };
        kept.sort_unstable();
        assert_eq!(kept, [keys[2], keys[4], keys[7]]);
        // Equal counts at the edge: exactly the bound is kept.
        let a = exact(100, 3);
        a.set_state(AdmissionState::Exact {
            keys: keys.clone(),
            counts: vec![1; 10],
        })
        .unwrap();
        assert_eq!(pending(&a), 3);
        assert_eq!(exact_counts(&a).accounted(), 3);
        // Those of the larger keys, so that merging the same counts again
        // changes nothing.
        let kept = |a: &Admitter| {
            let AdmissionState::Exact { mut keys, .. } = a.state() else {
                unreachable!()
            };
            keys.sort_unstable();
            keys
        };
        let mut largest = keys.clone();
        largest.sort_unstable();
        assert_eq!(kept(&a), largest[7..]);
        let tied = AdmissionState::Exact {
            keys: keys.clone(),
            counts: vec![1; 10],
        };
        a.merge_state(&tied).unwrap();
        assert_eq!(kept(&a), largest[7..]);

        // Ten high counts among ninety low ones, into bounds from 10 to
        // 100: the high counts all stay, and the bound is kept exactly.
        let keys: Vec<u64> = (0..100).collect();
        let counts: Vec<u32> = (0..100).map(|k| if k % 10 == 3 { 8 } else { 1 }).collect();
        for bound in [10, 20, 64, 100] {
            let a = exact(9, bound);
            a.read(1_000_000); // a pending key and spare room beforehand
            a.set_state(AdmissionState::Exact {
                keys: keys.clone(),
                counts: counts.clone(),
            })
            .unwrap();
            let AdmissionState::Exact { counts: kept, .. } = a.state() else {
                unreachable!()
            };
            assert_eq!(kept.len(), bound, "bound {bound}");
            assert_eq!(
                kept.iter().filter(|&&c| c == 8).count(),
                10,
                "bound {bound}"
            );
            assert_eq!(exact_counts(&a).accounted(), bound);
        }
        // A merge past the bound keeps the highest of both.
        let a = exact(9, 4);
        for (key, reads) in [(1, 5), (2, 1), (3, 1)] {
            for _ in 0..reads {
                a.read(key);
            }
        }
        a.merge_state(&AdmissionState::Exact {
            keys: vec![10, 11, 12],
            counts: vec![7, 6, 1],
        })
        .unwrap();
        let AdmissionState::Exact { keys: mut kept, .. } = a.state() else {
            unreachable!()
        };
        kept.sort_unstable();
        assert_eq!(kept.len(), 4);
        assert!([1, 10, 11].iter().all(|k| kept.contains(k)), "{kept:?}");
        assert_eq!(exact_counts(&a).accounted(), 4);
    }

    /// Reads keys with random true counts in a random order (a key stops
    /// being read once admitted, as it is then in the table); returns, per
    /// key, its true count and the read that admitted it (if any).
    fn replay(a: &Admitter, counts: &[u32], seed: u64) -> Vec<Option<u32>> {
        let mut reads: Vec<u64> = counts
            .iter()
            .enumerate()
            .flat_map(|(key, &n)| std::iter::repeat_n(key as u64, n as usize))
            .collect();
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        for i in (1..reads.len()).rev() {
            reads.swap(i, rng.random_range(0..=i));
        }
        let mut seen = vec![0_u32; counts.len()];
        let mut admitted = vec![None; counts.len()];
        for key in reads {
            let k = key as usize;
            if admitted[k].is_some() {
                continue;
            }
            seen[k] += 1;
            if a.read(key) {
                admitted[k] = Some(seen[k]);
            }
        }
        admitted
    }

    #[test]
    fn a_sketch_never_admits_late() {
        // Small and crowded, so keys share counters; no ageing (fewer
        // reads than SKETCH_AGEING_READS x width).
        let (min_count, width) = (5, 1 << 12);
        let a = sketch(min_count, width, 4);
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let counts: Vec<u32> = (0..3_000).map(|_| rng.random_range(1..=10)).collect();
        assert!(counts.iter().sum::<u32>() < (SKETCH_AGEING_READS * width) as u32);
        let admitted = replay(&a, &counts, 2);
        for (key, (&count, admitted)) in counts.iter().zip(&admitted).enumerate() {
            if count >= min_count {
                let at = admitted.unwrap_or_else(|| panic!("key {key} read {count} times"));
                assert!(at <= min_count, "key {key} admitted at read {at}");
            }
        }
    }

    /// Early admissions of a sketch of 2^18 x 4 counters counting 200,000
    /// keys read once or twice each (so none should be admitted with
    /// `min_count` 3): about 0.8% are. The rate grows with the reads per
    /// counter: the same keys in 2^16 x 4 counters admit about 30% early,
    /// in 2^20 x 4 about 0.01%.
    #[test]
    fn a_sketch_rarely_admits_early() {
        // 200,000 keys into a sketch 2^18 wide (1.3 times the keys), 4
        // deep: keys read once or twice against a min_count of 3, and
        // keys read once against a min_count of 2; then a sketch a quarter
        // as wide (a third of the keys), which admits far more early.
        for (min_count, most_reads, width, rates) in [
            (3, 2, 1 << 18, 0.0..0.015),
            (2, 1, 1 << 18, 0.0..0.03),
            (3, 2, 1 << 16, 0.2..0.4),
        ] {
            let a = sketch(min_count, width, 4);
            let mut rng = Pcg64Mcg::seed_from_u64(3);
            let counts: Vec<u32> = (0..200_000)
                .map(|_| rng.random_range(1..=most_reads))
                .collect();
            let admitted = replay(&a, &counts, 4);
            let early = admitted.iter().filter(|adm| adm.is_some()).count();
            let rate = early as f64 / counts.len() as f64;
            println!(
                "width {width}, min_count {min_count}: early admissions: {early} of {} \
                 keys read fewer times ({:.3}%)",
                counts.len(),
                rate * 100.0
            );
            assert!(rates.contains(&rate), "early admission rate {rate}");
        }
    }

    #[test]
    fn sketch_counters_saturate() {
        let max = u32::from(u16::MAX);
        let a = sketch(max, 1 << 13, 2);
        for read in 1..max {
            assert!(!a.read(9), "read {read}");
        }
        assert!(a.read(9), "admitted at its u16::MAX-th read");
        for _ in 0..100 {
            assert!(a.read(9));
        }
        assert_eq!(a.estimate(9), max, "saturated, not wrapped");
        assert!(a.admits(9));
    }

    /// Conservative update: a read raises the key's counters at its
    /// minimum by one and leaves the others as they are.
    #[test]
    fn a_read_raises_only_the_counters_at_the_minimum() {
        let (width, depth) = (1 << 10, 4);
        let a = sketch(100, width, depth);
        let key = 77;
        let at: Vec<usize> = (0..depth)
            .map(|row| row * width + column(sketch_base(key), row, width))
            .collect();
        let mut counters = vec![0; width * depth];
        for (&at, value) in at.iter().zip([5, 2, 7, 2]) {
            counters[at] = value;
        }
        a.set_state(AdmissionState::Sketch {
            width,
            depth,
            counters,
            reads: 0,
        })
        .unwrap();
        assert!(!a.read(key));
        let AdmissionState::Sketch { counters, .. } = a.state() else {
            unreachable!("a sketch")
        };
        let after: Vec<u16> = at.iter().map(|&at| counters[at]).collect();
        assert_eq!(after, [5, 3, 7, 3]);
        assert_eq!(
            counters.iter().map(|&c| u32::from(c)).sum::<u32>(),
            5 + 3 + 7 + 3
        );
    }

    #[test]
    fn a_sketch_min_count_beyond_its_ageing_period_is_refused() {
        let rule = |min_count, width| Admission::Sketch {
            min_count,
            width,
            depth: 4,
        };
        let period = SKETCH_AGEING_READS as u32 * 25;
        assert!(Admitter::check_rule(rule(period, 25)).is_ok());
        let err = Admitter::check_rule(rule(period + 1, 25)).unwrap_err();
        assert!(err.to_string().contains("widen the sketch"), "{err}");
        assert!(Admitter::new(rule(250, 10), 0).is_err());
    }

    #[test]
    fn a_call_of_several_periods_halves_once_per_period() {
        let width = 16;
        let period = (SKETCH_AGEING_READS * width) as u64;
        let a = sketch(2, width, 2);
        for _ in 0..3 {
            a.count(5);
        }
        assert_eq!(a.estimate(5), 3, "not aged before the call notes its reads");
        a.note_reads(2 * period + 7);
        assert_eq!(a.estimate(5), 0, "3 halved twice");
        let AdmissionState::Sketch { reads, .. } = a.state() else {
            unreachable!()
        };
        assert_eq!(reads, 7, "the reads past the two periods");
        // Past sixteen periods every counter is 0 already; only the
        // remainder is carried, so the next read does not age again.
        a.note_reads(40 * period);
        a.read(5);
        a.read(5);
        assert_eq!(a.estimate(5), 2, "counted after the long call");
        let AdmissionState::Sketch { reads, .. } = a.state() else {
            unreachable!()
        };
        assert_eq!(reads, 9);
    }

    #[test]
    fn the_sketch_halves_after_its_ageing_period() {
        let width = 16;
        let period = (SKETCH_AGEING_READS * width) as u32;
        let a = sketch(period, width, 2);
        for _ in 0..period - 1 {
            a.read(5);
        }
        assert_eq!(a.estimate(5), period - 1);
        a.read(5);
        assert_eq!(
            a.estimate(5),
            period / 2,
            "halved at the period's last read"
        );
        let AdmissionState::Sketch {
            reads, counters, ..
        } = a.state()
        else {
            unreachable!()
        };
        assert_eq!(reads, 0);
        assert_eq!(counters.iter().filter(|&&c| c > 0).count(), 2);
    }

    #[test]
    fn sketch_admits_only_keys_that_reached_min_count() {
        let a = sketch(2, 1 << 10, 3);
        assert!(!a.admits(1));
        assert!(!a.read(1));
        assert!(!a.admits(1));
        assert!(a.read(1));
        assert!(a.admits(1), "the sketch remembers the key");
        let one = sketch(1, 4, 1);
        assert!(one.read(3) && one.admits(4));
        assert!(matches!(
            one.state(),
            AdmissionState::Sketch { reads: 0, .. }
        ));
    }

    #[test]
    fn sketch_state_round_trips_merges_and_is_checked() {
        let a = sketch(4, 64, 2);
        for key in 0..20 {
            for _ in 0..key % 4 {
                a.read(key);
            }
        }
        let state = a.state();
        let b = sketch(4, 64, 2);
        b.set_state(state.clone()).unwrap();
        assert_eq!(b.state(), state);
        for key in 0..20 {
            assert_eq!(b.estimate(key), a.estimate(key));
        }
        // Another shape or kind changes nothing.
        for bad in [
            AdmissionState::Sketch {
                width: 32,
                depth: 4,
                counters: vec![1; 128],
                reads: 0,
            },
            AdmissionState::Sketch {
                width: 64,
                depth: 2,
                counters: vec![1; 127],
                reads: 0,
            },
            AdmissionState::Exact {
                keys: vec![],
                counts: vec![],
            },
        ] {
            assert!(b.set_state(bad.clone()).is_err());
            assert!(b.merge_state(&bad).is_err());
            assert_eq!(b.state(), state);
        }
        // Reads past a period are cut to one period.
        let AdmissionState::Sketch { counters, .. } = &state else {
            unreachable!()
        };
        b.set_state(AdmissionState::Sketch {
            width: 64,
            depth: 2,
            counters: counters.clone(),
            reads: u64::MAX,
        })
        .unwrap();
        let AdmissionState::Sketch { reads, .. } = b.state() else {
            unreachable!()
        };
        assert_eq!(reads, (SKETCH_AGEING_READS * 64) as u64);
        // Merging keeps the larger counter.
        let c = sketch(4, 64, 2);
        c.set_state(AdmissionState::Sketch {
            width: 64,
            depth: 2,
            counters: (0..128).map(|i| (i % 3) as u16).collect(),
            reads: 7,
        })
        .unwrap();
        c.merge_state(&state).unwrap();
        let AdmissionState::Sketch {
            counters: merged,
            reads,
            ..
        } = c.state()
        else {
            unreachable!()
        };
        let expected: Vec<u16> = counters
            .iter()
            .enumerate()
            .map(|(i, &v)| v.max((i % 3) as u16))
            .collect();
        assert_eq!(merged, expected);
        assert_eq!(reads, 7.max(a_reads(&state)));
    }

    fn a_reads(state: &AdmissionState) -> u64 {
        match state {
            AdmissionState::Sketch { reads, .. } => *reads,
            AdmissionState::Exact { .. } => 0,
        }
    }

    /// The sketch hash is part of the checkpoint format: these columns
    /// must never change.
    #[test]
    fn the_sketch_hash_is_pinned() {
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        let columns: Vec<usize> = (0..4)
            .map(|row| column(sketch_base(42), row, 1 << 16))
            .collect();
        assert_eq!(columns, PINNED_COLUMNS);
    }

    #[test]
    fn bad_rules_are_errors() {
        for rule in [
            Admission::Exact { min_count: 0 },
            Admission::Sketch {
                min_count: 0,
                width: 4,
                depth: 2,
            },
            Admission::Sketch {
                min_count: 70_000,
                width: 4,
                depth: 2,
            },
            Admission::Sketch {
                min_count: 2,
                width: 0,
                depth: 2,
            },
            Admission::Sketch {
                min_count: 2,
                width: 4,
                depth: 17,
            },
            Admission::Sketch {
                min_count: 2,
                width: usize::MAX,
                depth: 2,
            },
        ] {
            let err = Admitter::new(rule, 10).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{rule:?}: {err}");
        }
        assert_eq!(
            format!("{:?}", exact(2, 4)),
            "Admitter { admission: Exact { min_count: 2 }, pending: 0 }"
        );
    }

    /// Reads of one key from four threads at once: `n` reads in all admit
    /// it by the `n`-th, exact counts at exactly the `n`-th.
    #[test]
    fn concurrent_reads_are_never_lost() {
        const KEYS: u64 = 200;
        const PER_THREAD: u32 = 500;
        let n = 4 * PER_THREAD;
        // No ageing: fewer reads in all than SKETCH_AGEING_READS x width.
        for admitter in [exact(n, 1 << 20), sketch(n, 1 << 16, 4)] {
            let a = Arc::new(admitter);
            let start = Arc::new(std::sync::Barrier::new(4));
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let a = Arc::clone(&a);
                    let start = Arc::clone(&start);
                    std::thread::spawn(move || {
                        start.wait();
                        let mut admitted = HashMap::new();
                        for round in 0..PER_THREAD {
                            for i in 0..KEYS {
                                let key = (i + u64::from(round) * 7 + t) % KEYS;
                                if a.read(key) {
                                    *admitted.entry(key).or_insert(0_u32) += 1;
                                }
                            }
                        }
                        admitted
                    })
                })
                .collect();
            let mut admitted = HashMap::new();
            for t in threads {
                for (key, times) in t.join().unwrap() {
                    *admitted.entry(key).or_insert(0) += times;
                }
            }
            for key in 0..KEYS {
                let times = admitted.get(&key).copied().unwrap_or(0);
                match a.admission() {
                    Admission::Exact { .. } => assert_eq!(times, 1, "key {key}"),
                    Admission::Sketch { .. } => assert!(times >= 1, "key {key}"),
                }
            }
        }
    }
}
