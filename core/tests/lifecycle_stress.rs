//! Multi-threaded stress of a bounded variable, checked by exact
//! accounting: every row that ever entered the table is, at the end,
//! exactly once present, delivered to the eviction listener, removed by a
//! known `remove` or expired (counted by `expire`'s return values).
//!
//! Four writers insert distinct keys (each thread its own, by
//! `lookup_or_insert`, `upsert` and `update_rows` with a slot) and shared
//! keys (all four, by `update_rows`) into a capacity far below what they
//! write, while a remover removes keys the writers hand it, an expirer
//! expires, a reader reads and a watcher checks `size()` against the
//! capacity. The variable starts with `init_size(0)`, so its index grows
//! with the first keys, is then capped by the capacity and rebuilt at the
//! same size as evictions leave tombstones.
//!
//! How each row's fate is known:
//! - a key's *lifetimes* (inserts) are known: a distinct key's first write
//!   inserts it, and any later write is an `update_rows` whose update sees
//!   the fresh row (initializer's values, slot at its initial value) exactly
//!   when the write inserted the key (no other write leaves a row looking
//!   fresh); a shared key is only ever written by `update_rows`;
//! - keys handed to the remover are never written again, and are removed
//!   in the first half of each round, when nothing expires; so such a key
//!   is either delivered or removed, and never present at the end;
//! - expiry runs only in the second half of each round, when nothing is
//!   removed; so every lifetime of any other key that is neither present
//!   nor delivered was expired, and these add up to what `expire` returned.
//!
//! Rows encode their key (`[key, v, v + 1, ...]`, slot `[v; dim]` or the
//! slot's initial value for an upserted row), so a torn row, a row of
//! another key or a stale slot fails every read, every update and every
//! delivered or exported row. No timing assertions: each thread does a
//! fixed amount of work; the reader, watcher and expirer run until the
//! writers are done.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dynemb::{Evicted, Initializer, RestrictPolicy, SlotId, Variable};

const DIM: usize = 4;
const WRITERS: u64 = 4;
const SHARDS: usize = 2;
const CAPACITY: usize = 256;
/// Keys all writers update.
const SHARED: u64 = 48;
/// Rounds of two halves (removals, then expiry).
const ROUNDS: usize = 6;
/// Distinct keys each writer inserts per half round.
const KEYS_PER_HALF: u64 = 1024;
const BATCH: usize = 32;
/// The initializer's value and the slot's initial value: a fresh row.
const FRESH: f32 = -1.0;

/// The first distinct key of writer `t` (every key is below 2^24, exact in
/// f32, and above 0).
fn distinct_base(t: u64) -> u64 {
    1 + t * (1 << 21)
}

fn shared_key(j: u64) -> u64 {
    (1 << 23) + 1 + j
}

/// The row a write of version `v` gives `key`.
fn row(key: u64, v: u32) -> [f32; DIM] {
    let mut row = [0.0; DIM];
    row[0] = key as f32;
    for (j, x) in row.iter_mut().enumerate().skip(1) {
        *x = (v as usize + j - 1) as f32;
    }
    row
}

/// Checks that `values` is a row of `key`: fresh, or written by [`row`].
/// Returns its version (0 for a fresh row).
fn check_values(what: &str, key: u64, values: &[f32]) -> u32 {
    if values.iter().all(|&x| x == FRESH) {
        return 0;
    }
    let v = values[1];
    assert!(
        values[0] == key as f32 && v >= 1.0 && v.fract() == 0.0,
        "{what}: key {key} has a row of another key or a torn row: {values:?}"
    );
    assert_eq!(
        values,
        &row(key, v as u32)[..],
        "{what}: key {key} has a torn row"
    );
    v as u32
}

/// Checks a slot row: all at the initial value, or all one version.
fn check_slot(what: &str, key: u64, slot: &[f32]) {
    assert!(
        slot.iter().all(|&x| x == slot[0]) && (slot[0] == FRESH || slot[0] >= 1.0),
        "{what}: key {key} has a torn slot row {slot:?}"
    );
}

/// Checks a row and its slot row, copied together: an upserted row keeps
/// the initial slot, an updated one has its version in the slot.
fn check_row_and_slot(what: &str, key: u64, values: &[f32], slot: &[f32]) {
    let v = check_values(what, key, values);
    check_slot(what, key, slot);
    assert!(
        slot[0] == FRESH || slot[0] == v as f32,
        "{what}: key {key}'s slot {slot:?} is not its row's {values:?}"
    );
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Where the writers, the remover and the expirer meet at the end of
/// each half round: a barrier that a panic in any thread opens (the
/// others fail too instead of waiting for ever).
struct Rendezvous {
    parties: usize,
    arrived: AtomicUsize,
    failed: AtomicBool,
}

impl Rendezvous {
    /// Waits for every party's `round`-th arrival (counting from 0).
    fn wait(&self, round: usize) {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        while self.arrived.load(Ordering::Acquire) < (round + 1) * self.parties {
            self.check();
            std::thread::yield_now();
        }
    }

    /// Fails if another thread failed.
    fn check(&self) {
        assert!(
            !self.failed.load(Ordering::Relaxed),
            "another thread failed"
        );
    }
}

/// Opens the rendezvous if its thread panics.
struct FailOnPanic<'a>(&'a Rendezvous);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.store(true, Ordering::Relaxed);
        }
    }
}

/// A row the listener received.
struct Delivered {
    key: u64,
    values: Vec<f32>,
    slot: Vec<f32>,
    score: u64,
}

/// What one writer did: the lifetimes it started per key, the keys it
/// handed to the remover.
#[derive(Default)]
struct WriterLog {
    inserts: HashMap<u64, u64>,
    handed: Vec<u64>,
}

/// The keys handed to the remover, how many writers finished their half
/// round, and whether the expirer has expired in it (writers finish a
/// half of expiry only after that, so expiry always races with writes).
#[derive(Default)]
struct Handoff {
    queue: Mutex<Vec<u64>>,
    writers_done: AtomicUsize,
    expired_once: AtomicBool,
}

/// One writer thread's state.
struct Writer<'v> {
    var: &'v Variable<u64>,
    m: SlotId,
    t: u64,
    rng: Rng,
    version: u32,
    /// Its keys it may update again.
    rewritable: Vec<u64>,
    log: WriterLog,
}

impl Writer<'_> {
    /// `update_rows` of `keys` (values and slot to a new version); returns
    /// the keys whose last update saw a fresh row (it inserted them).
    fn update(&mut self, keys: &[u64]) -> Vec<u64> {
        let mut fresh = vec![false; keys.len()];
        self.version += 1;
        let v = self.version;
        self.var
            .update_rows(keys, &[self.m], |pos, values, slot| {
                let key = keys[pos];
                check_row_and_slot("update_rows", key, values, slot);
                fresh[pos] = values.iter().all(|&x| x == FRESH) && slot.iter().all(|&x| x == FRESH);
                values.copy_from_slice(&row(key, v));
                slot.fill(v as f32);
            })
            .unwrap();
        keys.iter()
            .zip(fresh)
            .filter(|&(_, fresh)| fresh)
            .map(|(&key, _)| key)
            .collect()
    }

    /// Counts a lifetime of each of `keys`.
    fn inserted(&mut self, keys: &[u64]) {
        for &key in keys {
            *self.log.inserts.entry(key).or_default() += 1;
        }
    }

    /// Half round `half` (even: removals, odd: expiry): the writer's next
    /// distinct keys by batches of each kind of write, shared keys by
    /// `update_rows`, and updates of its own earlier keys.
    fn half(&mut self, half: usize, handoff: &Handoff, rendezvous: &Rendezvous) {
        let first = distinct_base(self.t) + half as u64 * KEYS_PER_HALF;
        let keys: Vec<u64> = (first..first + KEYS_PER_HALF).collect();
        for (b, chunk) in keys.chunks(BATCH).enumerate() {
            // First writes: each inserts every key of the chunk once.
            match b % 3 {
                0 => {
                    let mut out = vec![0.0; chunk.len() * DIM];
                    self.var.lookup_or_insert(chunk, &mut out).unwrap();
                    for (key, values) in chunk.iter().zip(out.chunks(DIM)) {
                        check_values("lookup_or_insert", *key, values);
                    }
                }
                1 => {
                    self.version += 1;
                    let v = self.version;
                    let values: Vec<f32> = chunk.iter().flat_map(|&k| row(k, v)).collect();
                    self.var.upsert(chunk, &values).unwrap();
                }
                _ => {
                    let fresh = self.update(chunk);
                    assert_eq!(
                        fresh, chunk,
                        "the first update of a new key sees a fresh row"
                    );
                }
            }
            self.inserted(chunk);
            if half.is_multiple_of(2) && b % 4 == 1 {
                // Handed to the remover, never written again.
                handoff
                    .queue
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend_from_slice(chunk);
                self.log.handed.extend_from_slice(chunk);
            } else if !b.is_multiple_of(3) {
                // Keys a training read inserted stay fresh-looking: never
                // updated again, so that a fresh row always means an insert.
                self.rewritable.extend_from_slice(chunk);
            }
            let shared: Vec<u64> = (0..BATCH / 2)
                .map(|_| shared_key(self.rng.below(SHARED)))
                .collect();
            let fresh = self.update(&shared);
            self.inserted(&fresh);
            if b.is_multiple_of(2) && !self.rewritable.is_empty() {
                let n = self.rewritable.len() as u64;
                let again: Vec<u64> = (0..BATCH / 2)
                    .map(|_| self.rewritable[self.rng.below(n) as usize])
                    .collect();
                let fresh = self.update(&again);
                self.inserted(&fresh);
            }
        }
        if !half.is_multiple_of(2) {
            while !handoff.expired_once.load(Ordering::Acquire) {
                rendezvous.check();
                std::thread::yield_now();
            }
        }
        handoff.writers_done.fetch_add(1, Ordering::AcqRel);
    }
}

#[test]
fn bounded_variable_accounts_for_every_row_under_concurrent_writes_removals_and_expiry() {
    let delivered: Arc<Mutex<Vec<Delivered>>> = Arc::default();
    let sink = Arc::clone(&delivered);
    let var = Variable::<u64>::builder("lifecycle_stress")
        .dim(DIM)
        .shards(SHARDS)
        .init_size(0)
        .initializer(Initializer::Constant(FRESH))
        .restrict_policy(RestrictPolicy::Timestamp)
        .capacity(CAPACITY)
        .on_evict(move |batch: Evicted<'_, u64>| {
            let slot = batch.slot("m").expect("the slot's rows");
            let mut sink = sink.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, &key) in batch.keys().iter().enumerate() {
                sink.push(Delivered {
                    key,
                    values: batch.values()[i * DIM..(i + 1) * DIM].to_vec(),
                    slot: slot[i * DIM..(i + 1) * DIM].to_vec(),
                    score: batch.scores()[i],
                });
            }
        })
        .build()
        .unwrap();
    let m = var.create_slot("m", FRESH).unwrap();

    let done = AtomicBool::new(false);
    let expired_total = AtomicUsize::new(0);
    let removed_calls = AtomicUsize::new(0);
    let peak = AtomicUsize::new(0);
    // Writers, remover and expirer meet at the end of every half round.
    let rendezvous = Rendezvous {
        parties: WRITERS as usize + 2,
        arrived: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
    };
    let handoffs: Vec<Handoff> = (0..ROUNDS * 2).map(|_| Handoff::default()).collect();

    let logs: Vec<WriterLog> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|t| {
                let (var, rendezvous, handoffs) = (&var, &rendezvous, &handoffs);
                s.spawn(move || {
                    let _fail = FailOnPanic(rendezvous);
                    let mut writer = Writer {
                        var,
                        m,
                        t,
                        rng: Rng::new(t + 1),
                        version: 0,
                        rewritable: Vec::new(),
                        log: WriterLog::default(),
                    };
                    for (half, handoff) in handoffs.iter().enumerate() {
                        writer.half(half, handoff, rendezvous);
                        rendezvous.wait(half);
                    }
                    writer.log
                })
            })
            .collect();
        // The remover: in the first half of each round, removes every key
        // handed to it (by batches, as they come).
        s.spawn(|| {
            let _fail = FailOnPanic(&rendezvous);
            for (half, handoff) in handoffs.iter().enumerate() {
                if half.is_multiple_of(2) {
                    loop {
                        rendezvous.check();
                        let finished =
                            handoff.writers_done.load(Ordering::Acquire) == WRITERS as usize;
                        let keys = std::mem::take(
                            &mut *handoff.queue.lock().unwrap_or_else(PoisonError::into_inner),
                        );
                        if !keys.is_empty() {
                            var.remove(&keys).unwrap();
                            removed_calls.fetch_add(1, Ordering::Relaxed);
                        } else if finished {
                            break;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }
                rendezvous.wait(half);
            }
        });
        // The expirer: in the second half of each round, expires with
        // ages from everything to nothing.
        s.spawn(|| {
            let ages = [
                Duration::ZERO,
                Duration::from_micros(20),
                Duration::from_millis(1),
                Duration::from_secs(3600),
            ];
            let _fail = FailOnPanic(&rendezvous);
            let mut calls = 0;
            for (half, handoff) in handoffs.iter().enumerate() {
                if !half.is_multiple_of(2) {
                    // The writers wait for this half's first call, which
                    // expires everything, so every half expires rows
                    // while they write.
                    let mut first = true;
                    while handoff.writers_done.load(Ordering::Acquire) < WRITERS as usize {
                        rendezvous.check();
                        let age = if first {
                            Duration::ZERO
                        } else {
                            calls += 1;
                            ages[calls % ages.len()]
                        };
                        expired_total.fetch_add(var.expire(age).unwrap(), Ordering::Relaxed);
                        if first {
                            handoff.expired_once.store(true, Ordering::Release);
                            first = false;
                        }
                        std::thread::yield_now();
                    }
                }
                rendezvous.wait(half);
            }
        });
        // The reader: rows of any key, never torn.
        s.spawn(|| {
            let mut rng = Rng::new(99);
            let mut out = vec![0.0; BATCH * DIM];
            let mut slots = vec![0.0; BATCH * DIM];
            let _fail = FailOnPanic(&rendezvous);
            while !done.load(Ordering::Relaxed) && !rendezvous.failed.load(Ordering::Relaxed) {
                let keys: Vec<u64> = (0..BATCH)
                    .map(|i| {
                        if i % 4 == 0 {
                            shared_key(rng.below(SHARED))
                        } else {
                            let t = rng.below(WRITERS);
                            distinct_base(t) + rng.below(KEYS_PER_HALF * ROUNDS as u64 * 2)
                        }
                    })
                    .collect();
                var.lookup(&keys, &mut out).unwrap();
                var.lookup_slot(m, &keys, &mut slots).unwrap();
                for (i, &key) in keys.iter().enumerate() {
                    check_values("lookup", key, &out[i * DIM..(i + 1) * DIM]);
                    check_slot("lookup_slot", key, &slots[i * DIM..(i + 1) * DIM]);
                }
            }
        });
        // The watcher: the capacity holds at every moment.
        s.spawn(|| {
            let _fail = FailOnPanic(&rendezvous);
            while !done.load(Ordering::Relaxed) && !rendezvous.failed.load(Ordering::Relaxed) {
                let size = var.size();
                peak.fetch_max(size, Ordering::Relaxed);
                assert!(size <= CAPACITY, "size {size} > capacity {CAPACITY}");
                for shard in 0..SHARDS {
                    let share = CAPACITY / SHARDS;
                    let held = var.shard_size(shard).unwrap();
                    assert!(held <= share, "shard {shard} holds {held} > {share}");
                }
            }
        });
        let logs = writers.into_iter().map(|w| w.join().unwrap()).collect();
        done.store(true, Ordering::Relaxed);
        logs
    });

    // Every lifetime of every key, and where it ended.
    let mut inserts: HashMap<u64, u64> = HashMap::new();
    let mut handed: HashSet<u64> = HashSet::new();
    for log in &logs {
        for (&key, &n) in &log.inserts {
            *inserts.entry(key).or_default() += n;
        }
        handed.extend(log.handed.iter().copied());
    }
    let delivered = delivered.lock().unwrap_or_else(PoisonError::into_inner);
    let mut deliveries: HashMap<u64, u64> = HashMap::new();
    for d in delivered.iter() {
        check_row_and_slot("a delivered row", d.key, &d.values, &d.slot);
        assert!(d.score > 0, "a delivered row's timestamp");
        *deliveries.entry(d.key).or_default() += 1;
    }
    let (present, values) = var.export().unwrap();
    let mut slots = vec![0.0; present.len() * DIM];
    var.lookup_slot(m, &present, &mut slots).unwrap();
    let mut present_set = HashSet::new();
    for (i, &key) in present.iter().enumerate() {
        let rows = i * DIM..(i + 1) * DIM;
        check_row_and_slot("an exported row", key, &values[rows.clone()], &slots[rows]);
        assert!(present_set.insert(key), "key {key} exported twice");
    }
    assert_eq!(var.size(), present.len(), "size() at rest");
    assert!(present.len() <= CAPACITY);
    assert!(peak.load(Ordering::Relaxed) <= CAPACITY);

    let mut expired = 0;
    let mut removed = 0;
    for (&key, &lifetimes) in &inserts {
        let gone = deliveries.get(&key).copied().unwrap_or(0);
        let here = u64::from(present_set.contains(&key));
        if handed.contains(&key) {
            assert_eq!(lifetimes, 1, "key {key}: written once before its removal");
            assert_eq!(here, 0, "key {key}: present after its removal");
            assert!(gone <= 1, "key {key}: delivered {gone} times");
            removed += 1 - gone;
        } else {
            assert!(
                gone + here <= lifetimes,
                "key {key}: {lifetimes} lifetime(s), but delivered {gone} time(s) and present {here}"
            );
            expired += lifetimes - gone - here;
        }
    }
    for key in deliveries.keys().chain(&present) {
        assert!(inserts.contains_key(key), "key {key} was never written");
    }
    let stats = var.lifecycle_stats();
    assert_eq!(
        stats.evicted,
        delivered.len() as u64,
        "every eviction is delivered"
    );
    assert_eq!(
        expired,
        expired_total.load(Ordering::Relaxed) as u64,
        "the lifetimes that ended neither present, delivered nor removed are the expired rows"
    );
    assert_eq!(stats.expired, expired);
    let lifetimes: u64 = inserts.values().sum();
    assert_eq!(
        lifetimes,
        present.len() as u64 + delivered.len() as u64 + removed + expired,
        "every lifetime ends exactly once"
    );
    // The load did what it is for.
    assert!(delivered.len() as u64 > lifetimes / 2, "mostly evictions");
    assert!(
        removed > 0 && expired > 0,
        "removed {removed}, expired {expired}"
    );
    assert!(removed_calls.load(Ordering::Relaxed) > 0);
}
