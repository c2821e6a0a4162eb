//! The bounded variable (`--capacity N`): a third variable with a capacity
//! far below the keys written to it, an eviction listener and the
//! Timestamp policy, trained by the workers beside the main load, with
//! `expire` running against them. Its books account for every row that
//! ever entered it.
//!
//! # Keys and rows
//!
//! A key is `id << 2 | class`, and the class says how the key is written:
//!
//! - **once** (0): inserted by one `lookup_or_insert` of a new id, then
//!   only read (`lookup`): one lifetime;
//! - **handed** (1): inserted by one write of a new id (`upsert`,
//!   `update_rows` or `lookup_or_insert`) and removed by the same worker
//!   right after, never written again: one lifetime, which ends delivered
//!   (evicted before the removal) or removed;
//! - **shared** (2): a fixed set of ids all workers update (`update_rows`);
//! - **rewritable** (3): inserted by one `upsert` or `update_rows` of a new
//!   id, then updated again now and then (`update_rows`) by its worker.
//!
//! A key's later lifetimes (inserts after an eviction or expiry) are
//! counted exactly: only `update_rows` writes a key again, and its update
//! sees the fresh row (the initializer's `-1`s, the slot at its initial
//! `-1`) exactly when that write inserts the key, since every other write
//! leaves a row of its key's encoding and `lookup_or_insert` inserts only
//! "once" and "handed" keys, which are never updated.
//!
//! Element `j` of a row written with version `v` (1 to 3999) is `(key +
//! j) % 4093 + 4096 v`, exact in f32; its slot row is all `v`, or all `-1`
//! for an upserted row. A torn row (two versions), a row of another key or
//! a slot of another version fails every read, every update (under the
//! row lock), every delivered row and every audited row.
//!
//! # The books, and why they balance exactly
//!
//! `lifetimes` counts rows that entered: each new id's first write, and
//! every update that saw a fresh row. Each lifetime ends exactly once:
//! present, delivered to the listener (counted; a once or handed key at
//! most once, tracked by id), removed, or expired. Removals and expiry
//! never compete for a row: a worker holds the expiry gate shared from
//! inserting handed keys to removing them, and `expire` runs holding it
//! exclusively, so a handed key is never expired; hence the handed keys
//! not delivered are exactly the rows `remove` removed, and every other
//! lifetime that is neither present nor delivered was expired, which
//! `expire`'s return values add up. With nothing in flight (every audit,
//! and at the end):
//!
//! `lifetimes == present + delivered + (handed - delivered handed) + expired`,
//!
//! `size() == present <= capacity`, no handed key is present,
//! `lifecycle_stats()` counts the delivered and expired rows, and every
//! present row is valid. Workers check `size() <= capacity` after each of
//! their operations on it.

use crate::rows::Rng;
use crate::shared::Shared;
use dynemb::{Evicted, Initializer, RestrictPolicy, SlotId, Variable};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

/// The name of the bounded variable's slot.
const SLOT: &str = "m";
/// A fresh row's values and slot values.
const FRESH: f32 = -1.0;
/// Key classes (see the module docs).
const ONCE: u64 = 0;
const HANDED: u64 = 1;
const SHARED_KEY: u64 = 2;
const REWRITABLE: u64 = 3;
/// Keys a worker remembers to update again.
const RING: usize = 4096;
/// Rows an audit reads at a time.
const CHUNK: usize = 4096;
/// The ages `expire` cycles through: everything, then less and less.
const AGES: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_millis(10),
    Duration::from_millis(100),
    Duration::from_secs(1),
];

/// The key of `id` in `class`.
fn key_of(id: u64, class: u64) -> i64 {
    (id << 2 | class) as i64
}

fn class_of(key: i64) -> u64 {
    key as u64 & 3
}

fn id_of(key: i64) -> u64 {
    key as u64 >> 2
}

/// Element `j` of `key`'s row at version `v`.
fn element(key: i64, j: usize, v: u32) -> f32 {
    ((key as u64 + j as u64) % 4093) as f32 + 4096.0 * v as f32
}

/// Checks `values` is a row of `key`; its version, 0 for a fresh row.
fn check_values(key: i64, values: &[f32]) -> Result<u32, String> {
    if values.iter().all(|&x| x == FRESH) {
        return Ok(0);
    }
    let v = (values[0] / 4096.0).floor();
    if !(1.0..4000.0).contains(&v) {
        return Err(format!("key {key}: not a row of the soak: {values:?}"));
    }
    let v = v as u32;
    for (j, &x) in values.iter().enumerate() {
        if x != element(key, j, v) {
            return Err(format!(
                "key {key}: torn row or a row of another key (version {v} expects {} at {j}): \
                 {values:?}",
                element(key, j, v)
            ));
        }
    }
    Ok(v)
}

/// Checks a slot row: uniform, fresh or a version.
fn check_slot(key: i64, slot: &[f32]) -> Result<(), String> {
    let s = slot[0];
    if slot.iter().any(|&x| x != s) || !(s == FRESH || (s >= 1.0 && s.fract() == 0.0)) {
        return Err(format!("key {key}: torn slot row {slot:?}"));
    }
    Ok(())
}

/// Checks a row and its slot read together (under the row's lock, or with
/// nothing in flight): an upserted row keeps the fresh slot, an updated
/// one has its version there.
fn check_pair(key: i64, values: &[f32], slot: &[f32]) -> Result<u32, String> {
    let v = check_values(key, values)?;
    check_slot(key, slot)?;
    if slot[0] != FRESH && slot[0] != v as f32 {
        return Err(format!(
            "key {key}: slot {slot:?} is not of its row {values:?}"
        ));
    }
    Ok(v)
}

/// Ends the run on a violation found where no [`Shared`] is at hand (the
/// listener runs inside a worker's call).
fn listener_violation(message: String) -> ! {
    eprintln!("\nsoak: INVARIANT VIOLATION: bounded listener: {message}");
    std::process::exit(1)
}

/// What entered and left the bounded variable.
#[derive(Debug, Default)]
struct Books {
    /// Rows that entered.
    lifetimes: AtomicU64,
    /// Handed keys written (each then removed).
    handed: AtomicU64,
    /// Rows delivered to the listener.
    delivered: AtomicU64,
    /// Of which handed keys.
    delivered_handed: AtomicU64,
    /// Rows `expire` removed.
    expired: AtomicU64,
    /// Ids of once and handed keys delivered (each at most once).
    delivered_ids: Mutex<Vec<u64>>,
}

impl Books {
    /// Records the rows of one listener call, checking each.
    fn deliver(&self, batch: Evicted<'_, i64>) {
        let dim = batch.dim();
        let Some(slot) = batch.slot(SLOT) else {
            listener_violation("a batch without the slot's rows".into());
        };
        if batch.scores().len() != batch.len() {
            listener_violation(format!(
                "{} scores for {} rows",
                batch.scores().len(),
                batch.len()
            ));
        }
        let mut handed = 0;
        for (i, &key) in batch.keys().iter().enumerate() {
            let rows = i * dim..(i + 1) * dim;
            if let Err(e) = check_pair(key, &batch.values()[rows.clone()], &slot[rows]) {
                listener_violation(e);
            }
            if batch.scores()[i] == 0 {
                listener_violation(format!("key {key} delivered without a timestamp"));
            }
            let class = class_of(key);
            if class == HANDED {
                handed += 1;
            }
            if class == ONCE || class == HANDED {
                let id = id_of(key);
                let mut ids = self
                    .delivered_ids
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let word = (id / 64) as usize;
                if ids.len() <= word {
                    ids.resize(word + 1, 0);
                }
                if ids[word] >> (id % 64) & 1 == 1 {
                    listener_violation(format!("key {key} (one lifetime) delivered twice"));
                }
                ids[word] |= 1 << (id % 64);
            }
        }
        self.delivered
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.delivered_handed.fetch_add(handed, Ordering::Relaxed);
    }
}

/// The bounded variable and its books.
#[derive(Debug)]
pub struct Bounded {
    /// The variable.
    pub var: Variable<i64>,
    slot: SlotId,
    capacity: usize,
    /// Ids of the shared keys: `0..shared_ids`.
    shared_ids: u64,
    books: Arc<Books>,
    /// Held shared from inserting handed keys to removing them, and
    /// exclusively by `expire`.
    expiry_gate: RwLock<()>,
    /// Ids handed out (after the shared ones).
    next_id: AtomicU64,
    /// Calls of `expire` so far.
    expire_calls: AtomicUsize,
    /// Keys passed to each kind of call, for the summary.
    pub keys_written: AtomicU64,
    /// Keys read.
    pub keys_read: AtomicU64,
}

impl Bounded {
    /// The bounded variable of `capacity` rows, `dim` and `shards` as the
    /// main one's.
    pub fn new(capacity: usize, dim: usize, shards: usize) -> dynemb::Result<Bounded> {
        let books = Arc::new(Books::default());
        let sink = Arc::clone(&books);
        let var = Variable::<i64>::builder("soak_bounded")
            .dim(dim)
            .shards(shards)
            .init_size(0)
            .initializer(Initializer::Constant(FRESH))
            .restrict_policy(RestrictPolicy::Timestamp)
            .capacity(capacity)
            .on_evict(move |batch| sink.deliver(batch))
            .build()?;
        let slot = var.create_slot(SLOT, FRESH)?;
        let shared_ids = (capacity as u64 / 2).clamp(1, 4096);
        Ok(Bounded {
            var,
            slot,
            capacity,
            shared_ids,
            books,
            expiry_gate: RwLock::new(()),
            next_id: AtomicU64::new(shared_ids),
            expire_calls: AtomicUsize::new(0),
            keys_written: AtomicU64::new(0),
            keys_read: AtomicU64::new(0),
        })
    }

    /// Runs one `expire`, with the next age of [`AGES`].
    pub fn expire(&self, shared: &Shared) {
        let call = self.expire_calls.fetch_add(1, Ordering::Relaxed);
        let _exclusive = self
            .expiry_gate
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let removed = shared.ok("bounded expire", self.var.expire(AGES[call % AGES.len()]));
        self.books
            .expired
            .fetch_add(removed as u64, Ordering::Relaxed);
    }

    /// Checks the books against the variable, with nothing in flight: see
    /// the module docs.
    pub fn audit(&self, shared: &Shared) {
        let var = &self.var;
        let dim = var.dim();
        let mut present = 0u64;
        for chunk in var.export_chunks(CHUNK) {
            let (keys, values) = shared.ok("bounded export_chunks", chunk);
            let mut slots = vec![0.0; values.len()];
            shared.ok(
                "bounded lookup_slot",
                var.lookup_slot(self.slot, &keys, &mut slots),
            );
            for (i, &key) in keys.iter().enumerate() {
                let rows = i * dim..(i + 1) * dim;
                if let Err(e) = check_pair(key, &values[rows.clone()], &slots[rows]) {
                    shared.violation(format!("audit: bounded {e}"));
                }
                if class_of(key) == HANDED {
                    shared.violation(format!(
                        "audit: bounded key {key} present after its removal"
                    ));
                }
            }
            present += keys.len() as u64;
        }
        let size = var.size();
        if size as u64 != present || size > self.capacity {
            shared.violation(format!(
                "audit: bounded size() {size}, {present} rows exported, capacity {}",
                self.capacity
            ));
        }
        let books = &self.books;
        let lifetimes = books.lifetimes.load(Ordering::SeqCst);
        let delivered = books.delivered.load(Ordering::SeqCst);
        let handed = books.handed.load(Ordering::SeqCst);
        let delivered_handed = books.delivered_handed.load(Ordering::SeqCst);
        let expired = books.expired.load(Ordering::SeqCst);
        let removed = handed - delivered_handed;
        if lifetimes != present + delivered + removed + expired {
            shared.violation(format!(
                "audit: bounded books do not balance: {lifetimes} rows entered, {present} \
                 present + {delivered} delivered + {removed} removed + {expired} expired"
            ));
        }
        let stats = var.lifecycle_stats();
        if stats.evicted != delivered || stats.expired != expired {
            shared.violation(format!(
                "audit: bounded lifecycle_stats {stats:?}, but {delivered} rows delivered and \
                 {expired} expired"
            ));
        }
    }

    /// One line of totals, for progress and the summary.
    pub fn describe(&self) -> String {
        let books = &self.books;
        let handed = books.handed.load(Ordering::Relaxed);
        format!(
            "bounded: capacity {}, size {}, {} rows entered, {} evicted (delivered), {} removed, \
             {} expired by {} calls",
            self.capacity,
            self.var.size(),
            books.lifetimes.load(Ordering::Relaxed),
            books.delivered.load(Ordering::Relaxed),
            handed - books.delivered_handed.load(Ordering::Relaxed).min(handed),
            books.expired.load(Ordering::Relaxed),
            self.expire_calls.load(Ordering::Relaxed),
        )
    }
}

/// A worker's state for the bounded variable.
pub struct Worker<'a> {
    shared: &'a Shared,
    bounded: &'a Bounded,
    version: u32,
    /// Its rewritable keys, to update again.
    ring: Vec<i64>,
    next_in_ring: usize,
}

impl<'a> Worker<'a> {
    /// A worker of `shared`'s bounded variable.
    pub fn new(shared: &'a Shared, bounded: &'a Bounded) -> Self {
        Worker {
            shared,
            bounded,
            version: 0,
            ring: Vec::new(),
            next_in_ring: 0,
        }
    }

    fn next_version(&mut self) -> u32 {
        self.version = self.version % 3999 + 1;
        self.version
    }

    /// `n` keys of new ids in `class`.
    fn new_keys(&self, n: usize, class: u64) -> Vec<i64> {
        let first = self.bounded.next_id.fetch_add(n as u64, Ordering::Relaxed);
        (first..first + n as u64)
            .map(|id| key_of(id, class))
            .collect()
    }

    fn entered(&self, n: usize) {
        self.bounded
            .books
            .lifetimes
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `update_rows` of `keys` to a new version; returns how many it
    /// inserted (its update saw a fresh row).
    fn update(&mut self, keys: &[i64]) -> usize {
        let v = self.next_version();
        let mut fresh = vec![false; keys.len()];
        let mut error = None;
        let result =
            self.bounded
                .var
                .update_rows(keys, &[self.bounded.slot], |pos, values, slot| {
                    let key = keys[pos];
                    match check_pair(key, values, slot) {
                        Ok(seen) => fresh[pos] = seen == 0 && slot[0] == FRESH,
                        Err(e) => error = Some(e),
                    }
                    for (j, x) in values.iter_mut().enumerate() {
                        *x = element(key, j, v);
                    }
                    slot.fill(v as f32);
                });
        if let Some(e) = error {
            self.shared
                .violation(format!("bounded update_rows (under the row lock): {e}"));
        }
        self.shared.ok("bounded update_rows", result);
        self.written(keys.len());
        fresh.iter().filter(|&&f| f).count()
    }

    fn upsert(&mut self, keys: &[i64]) {
        let v = self.next_version();
        let dim = self.bounded.var.dim();
        let values: Vec<f32> = keys
            .iter()
            .flat_map(|&key| (0..dim).map(move |j| element(key, j, v)))
            .collect();
        self.shared
            .ok("bounded upsert", self.bounded.var.upsert(keys, &values));
        self.written(keys.len());
    }

    /// `lookup_or_insert` of new keys: each reads the fresh row.
    fn insert_by_read(&mut self, keys: &[i64]) {
        let mut out = vec![0.0; keys.len() * self.bounded.var.dim()];
        self.shared.ok(
            "bounded lookup_or_insert",
            self.bounded.var.lookup_or_insert(keys, &mut out),
        );
        if out.iter().any(|&x| x != FRESH) {
            self.shared.violation(format!(
                "bounded lookup_or_insert of new keys {keys:?} read {out:?}"
            ));
        }
        self.written(keys.len());
    }

    fn written(&self, n: usize) {
        self.bounded
            .keys_written
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// One operation on the bounded variable, of `batch` keys at most.
    pub fn step(&mut self, rng: &mut Rng, batch: usize) {
        let n = (batch / 4).max(1);
        match rng.below(6) {
            0 => {
                let keys = self.new_keys(n, ONCE);
                self.insert_by_read(&keys);
                self.entered(n);
            }
            1 => {
                let keys = self.new_keys(n, REWRITABLE);
                if rng.chance(0.5) {
                    self.upsert(&keys);
                } else if self.update(&keys) != n {
                    self.shared
                        .violation("bounded: the first update of new keys saw a row");
                }
                self.entered(n);
                for key in keys {
                    if self.ring.len() < RING {
                        self.ring.push(key);
                    } else {
                        self.ring[self.next_in_ring] = key;
                        self.next_in_ring = (self.next_in_ring + 1) % RING;
                    }
                }
            }
            2 => {
                // Inserted and removed with expiry held off in between.
                let _gate = self
                    .bounded
                    .expiry_gate
                    .read()
                    .unwrap_or_else(PoisonError::into_inner);
                let keys = self.new_keys(n, HANDED);
                match rng.below(3) {
                    0 => self.insert_by_read(&keys),
                    1 => self.upsert(&keys),
                    _ => {
                        if self.update(&keys) != n {
                            self.shared
                                .violation("bounded: the first update of new keys saw a row");
                        }
                    }
                }
                self.entered(n);
                self.bounded
                    .books
                    .handed
                    .fetch_add(n as u64, Ordering::Relaxed);
                self.shared
                    .ok("bounded remove", self.bounded.var.remove(&keys));
            }
            3 => {
                let keys: Vec<i64> = (0..n)
                    .map(|_| key_of(rng.below(self.bounded.shared_ids), SHARED_KEY))
                    .collect();
                let inserted = self.update(&keys);
                self.entered(inserted);
            }
            4 if !self.ring.is_empty() => {
                let keys: Vec<i64> = (0..n)
                    .map(|_| self.ring[rng.below(self.ring.len() as u64) as usize])
                    .collect();
                let inserted = self.update(&keys);
                self.entered(inserted);
            }
            _ => self.read(rng, n),
        }
        let size = self.bounded.var.size();
        if size > self.bounded.capacity {
            self.shared.violation(format!(
                "bounded size() {size} above its capacity {}",
                self.bounded.capacity
            ));
        }
    }

    /// `lookup` and `lookup_slot` of recent and shared keys of any class:
    /// never a torn row.
    fn read(&mut self, rng: &mut Rng, n: usize) {
        let end = self.bounded.next_id.load(Ordering::Relaxed);
        let keys: Vec<i64> = (0..n)
            .map(|_| {
                if rng.chance(0.25) {
                    key_of(rng.below(self.bounded.shared_ids), SHARED_KEY)
                } else {
                    let back = rng.below(4 * self.bounded.capacity as u64 + 1);
                    let id = end.saturating_sub(1 + back).max(self.bounded.shared_ids);
                    key_of(id, rng.below(4))
                }
            })
            .collect();
        let dim = self.bounded.var.dim();
        let mut out = vec![0.0; keys.len() * dim];
        let mut slots = vec![0.0; keys.len() * dim];
        self.shared
            .ok("bounded lookup", self.bounded.var.lookup(&keys, &mut out));
        self.shared.ok(
            "bounded lookup_slot",
            self.bounded
                .var
                .lookup_slot(self.bounded.slot, &keys, &mut slots),
        );
        for (i, &key) in keys.iter().enumerate() {
            let rows = i * dim..(i + 1) * dim;
            if let Err(e) = check_values(key, &out[rows.clone()]) {
                self.shared.violation(format!("bounded lookup: {e}"));
            }
            if let Err(e) = check_slot(key, &slots[rows]) {
                self.shared.violation(format!("bounded lookup_slot: {e}"));
            }
        }
        self.bounded
            .keys_read
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
    }
}
