//! A demanding user's tests of the row lifecycle (capacity, eviction
//! listener, admission, LFU ageing, expiry, lifecycle stats and the
//! admission state in checkpoints), by the public API only:
//!
//! - bad settings are errors at build, never panics, and a refused
//!   `expire` changes nothing;
//! - a listener that panics, or calls back into its own variable, loses no
//!   row and leaves the variable usable; an `update_rows` whose closure
//!   panics midway still delivers what its batch evicted;
//! - four threads training, writing, removing, expiring, restricting and
//!   saving a bounded, admitting variable keep its exact invariants;
//! - a damaged admission file is an error that changes nothing;
//! - restoring past the capacity keeps about the highest-scored rows and
//!   hands exactly the rest to the listener;
//! - admission's semantics: `lookup` never counts, a key not admitted
//!   reads the initializer's row and inserts nothing, updates skip it,
//!   explicit writes bypass it, an evicted key is counted anew.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::Duration;

use dynemb::{
    Admission, Error, Evicted, Initializer, RestrictPolicy, TableOptions, Variable, VariableBuilder,
};

/// Evicted rows as a listener saw them: key -> (values, slot rows by name).
type Seen = Arc<Mutex<HashMap<u64, (Vec<f32>, Vec<(String, Vec<f32>)>)>>>;

/// A listener that records every evicted row and counts a key delivered
/// twice in `twice`.
fn recorder() -> (
    Seen,
    Arc<AtomicUsize>,
    impl Fn(Evicted<'_, u64>) + Send + Sync + 'static,
) {
    let seen: Seen = Arc::default();
    let twice = Arc::new(AtomicUsize::new(0));
    let (sink, dup) = (Arc::clone(&seen), Arc::clone(&twice));
    let listener = move |batch: Evicted<'_, u64>| {
        let dim = batch.dim();
        assert_eq!(batch.values().len(), batch.len() * dim);
        let mut sink = sink.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &key) in batch.keys().iter().enumerate() {
            let slots = batch
                .slots()
                .map(|(n, rows)| (n.to_string(), rows[i * dim..(i + 1) * dim].to_vec()))
                .collect();
            let row = batch.values()[i * dim..(i + 1) * dim].to_vec();
            if sink.insert(key, (row, slots)).is_some() {
                dup.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    (seen, twice, listener)
}

/// Whether `key` is a row of `var`.
fn present(var: &Variable<u64>, key: u64) -> bool {
    dynemb_test_support::present(var, &[key])[0]
}

/// One training read of `key`.
fn train_read(var: &Variable<u64>, key: u64) -> Vec<f32> {
    let mut out = vec![0.0; var.dim()];
    var.lookup_or_insert(&[key], &mut out).unwrap();
    out
}

/// Builds `b`, which must be refused with an `InvalidArgument` (and not
/// panic); returns the message.
fn refused(what: &str, b: VariableBuilder<u64>) -> String {
    match catch_unwind(AssertUnwindSafe(|| b.build())) {
        Ok(Err(Error::InvalidArgument(message))) => message,
        Ok(Err(other)) => panic!("{what}: expected InvalidArgument, got {other}"),
        Ok(Ok(_)) => panic!("{what}: built"),
        Err(_) => panic!("{what}: build panicked"),
    }
}

#[test]
fn bad_lifecycle_settings_are_errors_never_panics() {
    let b = || Variable::<u64>::builder("t").dim(2);
    let sketch = |min_count, width, depth| Admission::Sketch {
        min_count,
        width,
        depth,
    };
    let cases: Vec<(&str, VariableBuilder<u64>, &str)> = vec![
        ("capacity 0", b().capacity(0), "capacity 0"),
        (
            "capacity below shards",
            b().shards(8).capacity(7),
            "capacity 7",
        ),
        (
            "exact min_count 0",
            b().admission(Admission::Exact { min_count: 0 }),
            "min_count",
        ),
        (
            "sketch min_count 0",
            b().admission(sketch(0, 16, 4)),
            "min_count",
        ),
        (
            "sketch min_count past u16",
            b().admission(sketch(65_536, 16, 4)),
            "min_count",
        ),
        (
            "sketch min_count past its ageing period",
            b().admission(sketch(250, 10, 4)),
            "widen the sketch",
        ),
        ("sketch width 0", b().admission(sketch(2, 0, 4)), "width"),
        ("sketch depth 0", b().admission(sketch(2, 16, 0)), "depth"),
        ("sketch depth 17", b().admission(sketch(2, 16, 17)), "depth"),
        (
            "sketch width usize::MAX",
            b().admission(sketch(2, usize::MAX, 2)),
            "too large",
        ),
        (
            "sketch past 2^32 counters",
            b().admission(sketch(2, (1 << 32) + 1, 1)),
            "too large",
        ),
        (
            "decay without capacity",
            b().restrict_policy(RestrictPolicy::Frequency)
                .frequency_decay(true),
            "frequency_decay",
        ),
        (
            "decay with Timestamp",
            b().capacity(10).frequency_decay(true),
            "frequency_decay",
        ),
        (
            "on_evict without capacity",
            b().on_evict(|_: Evicted<'_, u64>| {}),
            "on_evict",
        ),
        (
            "options struct with capacity 0",
            b().options(TableOptions {
                capacity: Some(0),
                ..TableOptions::default()
            }),
            "capacity 0",
        ),
    ];
    for (what, builder, needle) in cases {
        let message = refused(what, builder);
        assert!(message.contains(needle), "{what}: {message}");
    }
    // The capacity check runs whatever the order of the builder calls.
    let message = refused("capacity then shards", b().capacity(3).shards(4));
    assert!(message.contains("capacity 3"), "{message}");
}

#[test]
fn an_absurd_capacity_behaves_as_unbounded() {
    for shards in [1, 7] {
        let (seen, _, listener) = recorder();
        let var = Variable::<u64>::builder("t")
            .dim(2)
            .shards(shards)
            .capacity(usize::MAX)
            .admission(Admission::Exact { min_count: 2 })
            .on_evict(listener)
            .build()
            .unwrap();
        assert_eq!(var.capacity(), Some(usize::MAX));
        let keys: Vec<u64> = (0..5000).collect();
        let mut out = vec![0.0; keys.len() * 2];
        var.lookup_or_insert(&keys, &mut out).unwrap();
        assert_eq!(var.size(), 0, "one read admits nothing");
        var.lookup_or_insert(&keys, &mut out).unwrap();
        assert_eq!(var.size(), keys.len());
        var.upsert(&keys, &vec![1.0; keys.len() * 2]).unwrap();
        assert_eq!(var.size(), keys.len());
        assert!(seen.lock().unwrap().is_empty());
        assert_eq!(var.lifecycle_stats().evicted, 0);
        assert_eq!(var.lifecycle_stats().not_admitted_reads, 5000);
    }
}

#[test]
fn expire_edge_durations_and_refusals() {
    // Without the Timestamp policy: an error that changes nothing.
    for b in [
        Variable::<u64>::builder("t"),
        Variable::<u64>::builder("t").restrict_policy(RestrictPolicy::Frequency),
        Variable::<u64>::builder("t")
            .capacity(10)
            .restrict_policy(RestrictPolicy::Frequency),
    ] {
        let var = b.build().unwrap();
        var.upsert(&[1, 2], &[1.0, 2.0]).unwrap();
        for age in [Duration::ZERO, Duration::from_secs(1), Duration::MAX] {
            let err = var.expire(age).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        }
        assert_eq!(var.size(), 2);
        assert_eq!(var.lifecycle_stats().expired, 0);
    }

    // Timestamp only because of the capacity.
    let (seen, _, listener) = recorder();
    let var = Variable::<u64>::builder("t")
        .capacity(100)
        .shards(3)
        .on_evict(listener)
        .build()
        .unwrap();
    assert_eq!(var.restrict_policy(), Some(RestrictPolicy::Timestamp));
    let keys: Vec<u64> = (0..100).collect();
    var.upsert(&keys, &vec![3.0; 100]).unwrap();
    assert_eq!(var.expire(Duration::MAX).unwrap(), 0, "nothing is that old");
    assert_eq!(var.expire(Duration::from_secs(3600)).unwrap(), 0);
    assert_eq!(var.size(), 100);
    // Zero: every row was written at least 0 ns ago, so everything goes,
    // not to the listener.
    assert_eq!(var.expire(Duration::ZERO).unwrap(), 100);
    assert_eq!(var.size(), 0);
    assert_eq!(var.lifecycle_stats().expired, 100);
    assert!(seen.lock().unwrap().is_empty());
    // The expired rows' room is free again: the next 100 keys evict nothing.
    let keys: Vec<u64> = (999..1099).collect();
    var.upsert(&keys, &vec![4.0; 100]).unwrap();
    assert_eq!(var.size(), 100);
    assert_eq!(var.lifecycle_stats().evicted, 0);
}

#[test]
fn a_panicking_listener_propagates_and_loses_no_row() {
    let capacity = 50;
    let (seen, twice, record) = recorder();
    let explode = Arc::new(AtomicBool::new(false));
    let fuse = Arc::clone(&explode);
    let var = Variable::<u64>::builder("t")
        .dim(2)
        .shards(2)
        .capacity(capacity)
        .on_evict(move |batch: Evicted<'_, u64>| {
            record(batch);
            if fuse.swap(false, Ordering::Relaxed) {
                panic!("listener failed");
            }
        })
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..capacity as u64).collect();
    let rows: Vec<f32> = keys.iter().flat_map(|&k| [k as f32, 1.0]).collect();
    var.upsert(&keys, &rows).unwrap();
    explode.store(true, Ordering::Relaxed);
    // Single-shard keys (even) so that the whole batch is one shard's.
    let new: Vec<u64> = (1000..1020).map(|k| k * 2).collect();
    let new_rows: Vec<f32> = new.iter().flat_map(|&k| [k as f32, 2.0]).collect();
    let result = catch_unwind(AssertUnwindSafe(|| var.upsert(&new, &new_rows)));
    assert!(result.is_err(), "the listener's panic reaches the caller");
    // The batch was written and what it evicted was delivered (to the
    // listener that panicked) and counted.
    for &k in &new {
        assert!(present(&var, k), "key {k} written before the listener ran");
    }
    assert!(var.size() <= capacity);
    let stats = var.lifecycle_stats();
    assert_eq!(stats.evicted as usize, seen.lock().unwrap().len());
    assert_eq!(stats.evicted, 20);
    // Still usable, and every later eviction is delivered.
    let more: Vec<u64> = (5000..5100).collect();
    var.upsert(&more, &vec![7.0; 200]).unwrap();
    assert_eq!(var.size(), capacity);
    let (exported, _) = var.export().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(twice.load(Ordering::Relaxed), 0);
    assert_eq!(var.lifecycle_stats().evicted as usize, seen.len());
    let all: HashSet<u64> = keys.iter().chain(&new).chain(&more).copied().collect();
    let exported: HashSet<u64> = exported.into_iter().collect();
    for k in all {
        assert_ne!(exported.contains(&k), seen.contains_key(&k), "key {k}");
    }
}

/// A call that writes several shards hands their evictions to the
/// listener once every shard is written: the listener sees all of the
/// call's rows, and one that panics cannot keep later shards unwritten.
#[test]
fn a_listener_runs_after_every_shard_of_the_call_is_written() {
    let capacity = 4;
    let call: Arc<Mutex<Vec<u64>>> = Arc::default();
    let missing: Arc<Mutex<Vec<u64>>> = Arc::default();
    let delivered = Arc::new(AtomicUsize::new(0));
    let explode = Arc::new(AtomicBool::new(false));
    let var = Arc::new(std::sync::OnceLock::<Variable<u64>>::new());
    let listener = {
        let (call, missing, delivered, explode, var) = (
            Arc::clone(&call),
            Arc::clone(&missing),
            Arc::clone(&delivered),
            Arc::clone(&explode),
            Arc::clone(&var),
        );
        move |batch: Evicted<'_, u64>| {
            delivered.fetch_add(batch.keys().len(), Ordering::Relaxed);
            let var = var.get().expect("built before any write");
            let keys = call.lock().unwrap().clone();
            let there = dynemb_test_support::present(var, &keys);
            missing
                .lock()
                .unwrap()
                .extend(keys.iter().zip(there).filter(|(_, p)| !p).map(|(k, _)| *k));
            if explode.load(Ordering::Relaxed) {
                panic!("listener failed");
            }
        }
    };
    var.set(
        Variable::<u64>::builder("t")
            .dim(2)
            .shards(2)
            .capacity(capacity)
            .on_evict(listener)
            .build()
            .unwrap(),
    )
    .ok()
    .unwrap();
    let var = var.get().unwrap();
    let write = |keys: &[u64]| {
        *call.lock().unwrap() = keys.to_vec();
        let rows: Vec<f32> = keys.iter().flat_map(|&k| [k as f32, 1.0]).collect();
        var.upsert(keys, &rows)
    };
    write(&[0, 1, 2, 3]).unwrap();
    // Keys of both shards, each shard evicting.
    write(&[10, 11, 12, 13]).unwrap();
    assert_eq!(delivered.load(Ordering::Relaxed), 4);
    assert!(missing.lock().unwrap().is_empty(), "{missing:?}");
    explode.store(true, Ordering::Relaxed);
    let result = catch_unwind(AssertUnwindSafe(|| write(&[20, 21, 22, 23])));
    assert!(result.is_err(), "the listener's panic reaches the caller");
    assert!(missing.lock().unwrap().is_empty(), "{missing:?}");
    assert_eq!(
        dynemb_test_support::present(var, &[20, 21, 22, 23]),
        [true; 4],
        "every shard written"
    );
    assert_eq!(
        delivered.load(Ordering::Relaxed),
        8,
        "both shards' evictions"
    );
    assert_eq!(var.lifecycle_stats().evicted, 8);
    assert_eq!(var.size(), capacity);
}

/// A call made inside another (from an `update_rows` closure of a
/// two-shard variable) delivers its own evictions before it returns, even
/// on a variable of one shard.
#[test]
fn a_nested_call_delivers_its_evictions_before_it_returns() {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    let inner = Variable::<u64>::builder("inner")
        .capacity(1)
        .on_evict(move |batch: Evicted<'_, u64>| {
            counter.fetch_add(batch.keys().len(), Ordering::Relaxed);
        })
        .build()
        .unwrap();
    inner.upsert(&[1], &[1.0]).unwrap();
    let outer = Variable::<u64>::builder("outer")
        .shards(2)
        .capacity(2)
        .on_evict(|_: Evicted<'_, u64>| {})
        .build()
        .unwrap();
    let mut seen_inside = Vec::new();
    outer
        .update_rows(&[10, 11], &[], |i, row, _| {
            row[0] = i as f32;
            inner.upsert(&[100 + i as u64], &[2.0]).unwrap();
            seen_inside.push(seen.load(Ordering::Relaxed));
        })
        .unwrap();
    assert_eq!(
        seen_inside,
        [1, 2],
        "each inner upsert delivered before returning"
    );
}

#[test]
fn a_listener_may_read_and_write_its_own_variable() {
    let capacity = 64;
    let slot_of = |k: u64| -(k as f32);
    let handle: Arc<Mutex<Option<Variable<u64>>>> = Arc::default();
    let me = Arc::clone(&handle);
    let depth = Arc::new(AtomicUsize::new(0));
    let problems: Arc<Mutex<Vec<String>>> = Arc::default();
    let report = Arc::clone(&problems);
    let delivered = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&delivered);
    let var = Variable::<u64>::builder("t")
        .dim(2)
        .capacity(capacity)
        .admission(Admission::Exact { min_count: 1 })
        .on_evict(move |batch: Evicted<'_, u64>| {
            count.fetch_add(batch.len(), Ordering::Relaxed);
            let var = me.lock().unwrap().clone().expect("set before any write");
            let nested = depth.fetch_add(1, Ordering::Relaxed);
            let mut out = vec![0.0; batch.len() * 2];
            let mut exists = vec![true; batch.len()];
            var.lookup_with_exists(batch.keys(), &mut out, &mut exists)
                .unwrap();
            let mut problems = report.lock().unwrap();
            if exists.iter().any(|&e| e) {
                problems.push(format!("an evicted key is present: {:?}", batch.keys()));
            }
            if var.size() > capacity {
                problems.push(format!("size {} in the listener", var.size()));
            }
            let m = batch.slot("m").map(<[f32]>::to_vec);
            for (i, &k) in batch.keys().iter().enumerate() {
                let trained = k == 1_500_000 && batch.values()[i * 2] == 0.0;
                if batch.values()[i * 2] != k as f32 && !trained {
                    problems.push(format!("key {k} evicted with {:?}", batch.values()));
                }
                // 0: evicted between its upsert and its slot's update.
                if m.as_ref()
                    .is_none_or(|m| m[i * 2] != slot_of(k) && m[i * 2] != 0.0)
                {
                    problems.push(format!("key {k}'s slot row: {m:?}"));
                }
            }
            drop(problems);
            if nested == 0 {
                // A write that evicts from within the listener: the
                // listener runs again (nested once), then returns.
                let spill: Vec<u64> = batch.keys().iter().map(|k| k + 1_000_000).collect();
                let rows: Vec<f32> = spill.iter().flat_map(|&k| [k as f32, 0.0]).collect();
                var.upsert(&spill, &rows).unwrap();
                let m = var.slot_id("m").unwrap();
                var.update_rows(&spill, &[m], |i, _, s| s.fill(slot_of(spill[i])))
                    .unwrap();
                train_read(&var, 1_500_000);
            }
            depth.fetch_sub(1, Ordering::Relaxed);
        })
        .build()
        .unwrap();
    *handle.lock().unwrap() = Some(var.clone());
    let m = var.create_slot("m", 0.0).unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let worker = var.clone();
    let thread = std::thread::spawn(move || {
        for chunk in (0..2000u64).collect::<Vec<_>>().chunks(10) {
            let rows: Vec<f32> = chunk.iter().flat_map(|&k| [k as f32, 1.0]).collect();
            worker.upsert(chunk, &rows).unwrap();
            worker
                .update_rows(chunk, &[m], |i, _, s| s.fill(slot_of(chunk[i])))
                .unwrap();
        }
        done_tx.send(()).unwrap();
    });
    // A deadlock guard only (a hang fails instead of blocking the suite).
    done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a listener calling back into its variable deadlocked");
    thread.join().unwrap();
    *handle.lock().unwrap() = None;
    let problems = problems.lock().unwrap();
    assert!(
        problems.is_empty(),
        "{:?}",
        &problems[..problems.len().min(5)]
    );
    assert!(var.size() <= capacity);
    assert_eq!(
        var.lifecycle_stats().evicted as usize,
        delivered.load(Ordering::Relaxed)
    );
}

#[test]
fn a_panic_midway_through_update_rows_delivers_its_evictions() {
    let capacity = 20;
    let (seen, twice, listener) = recorder();
    let var = Variable::<u64>::builder("t")
        .dim(2)
        .capacity(capacity)
        .on_evict(listener)
        .build()
        .unwrap();
    let m = var.create_slot("m", 0.0).unwrap();
    let keys: Vec<u64> = (0..capacity as u64).collect();
    var.update_rows(&keys, &[m], |i, v, s| {
        v.fill(keys[i] as f32);
        s.fill(1.0);
    })
    .unwrap();
    let new: Vec<u64> = (100..110).collect();
    let result = catch_unwind(AssertUnwindSafe(|| {
        var.update_rows(&new, &[m], |i, v, s| {
            if i == 5 {
                panic!("update failed");
            }
            v.fill(new[i] as f32);
            s.fill(2.0);
        })
    }));
    assert!(result.is_err());
    // Keys 100..105 were inserted, evicting five rows; 105.. were not.
    for (i, &k) in new.iter().enumerate() {
        assert_eq!(present(&var, k), i < 5, "key {k}");
    }
    assert_eq!(var.size(), capacity);
    let stats = var.lifecycle_stats();
    assert_eq!(stats.evicted, 5);
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 5, "the evicted rows reached the listener");
        for (k, (values, slots)) in seen.iter() {
            assert_eq!(values, &vec![*k as f32; 2]);
            assert_eq!(slots, &vec![("m".to_string(), vec![1.0; 2])]);
        }
    }
    // The table is not poisoned: the panicking key can be written now.
    var.update_rows(&new[5..], &[m], |_, v, _| v.fill(9.0))
        .unwrap();
    assert_eq!(var.size(), capacity);
    assert_eq!(var.lifecycle_stats().evicted, 10);
    assert_eq!(seen.lock().unwrap().len(), 10);
    assert_eq!(twice.load(Ordering::Relaxed), 0);
}

/// Value a writer stores in column 0 of `key`'s row: the key itself;
/// column 1 counts updates. The initializer's row is [-1, 0].
const INIT: [f32; 2] = [-1.0, 0.0];

#[test]
fn four_threads_on_a_bounded_admitting_variable_keep_every_invariant() {
    let capacity = 300;
    let dim = 2;
    let (seen_rows, _, record) = recorder();
    let delivered = Arc::new(AtomicUsize::new(0));
    let bad: Arc<Mutex<Vec<String>>> = Arc::default();
    let (count, bad_rows) = (Arc::clone(&delivered), Arc::clone(&bad));
    let var = Variable::<u64>::builder("t")
        .dim(dim)
        .shards(3)
        .capacity(capacity)
        .initializer(Initializer::Values(INIT.to_vec()))
        .admission(Admission::Sketch {
            min_count: 2,
            width: 1 << 10,
            depth: 4,
        })
        .on_evict(move |batch: Evicted<'_, u64>| {
            count.fetch_add(batch.len(), Ordering::Relaxed);
            for (i, &k) in batch.keys().iter().enumerate() {
                let v = &batch.values()[i * 2..i * 2 + 2];
                if v[0] != k as f32 && v[0] != INIT[0] {
                    bad_rows.lock().unwrap().push(format!("evicted {k}: {v:?}"));
                }
            }
            record(batch);
        })
        .build()
        .unwrap();
    let m = var.create_slot("m", 0.0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (var, stop, max_seen) = (var.clone(), Arc::clone(&stop), Arc::clone(&max_seen));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                max_seen.fetch_max(var.size(), Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    };
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (var, start, dir) = (var.clone(), Arc::clone(&start), dir.path().join("ckpt"));
            std::thread::spawn(move || {
                start.wait();
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                let mut next = move || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state
                };
                for round in 0..400 {
                    let keys: Vec<u64> = (0..16).map(|_| next() % 1000).collect();
                    match (next() % 10, t) {
                        (0..=3, _) => {
                            let mut out = vec![0.0; keys.len() * 2];
                            var.lookup_or_insert(&keys, &mut out).unwrap();
                            for (i, &k) in keys.iter().enumerate() {
                                let v = &out[i * 2..i * 2 + 2];
                                assert!(v[0] == k as f32 || v[0] == INIT[0], "{k}: {v:?}");
                            }
                        }
                        (4..=5, _) => var
                            .update_rows(&keys, &[m], |i, v, s| {
                                v[0] = keys[i] as f32;
                                v[1] += 1.0;
                                s[0] = keys[i] as f32;
                            })
                            .unwrap(),
                        (6, _) => {
                            let rows: Vec<f32> =
                                keys.iter().flat_map(|&k| [k as f32, 100.0]).collect();
                            var.upsert(&keys, &rows).unwrap();
                        }
                        (7, _) => var.remove(&keys[..4]).unwrap(),
                        (8, 0) if round % 50 == 0 => {
                            var.save(&dir).unwrap();
                        }
                        (8, 1) => {
                            var.restrict(capacity / 2, capacity - 10).unwrap();
                        }
                        (8, 2) => {
                            var.expire(Duration::from_secs(3600)).unwrap();
                        }
                        _ => {
                            let mut out = vec![0.0; keys.len() * 2];
                            var.lookup(&keys, &mut out).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    assert!(max_seen.load(Ordering::Relaxed) <= capacity);
    let bad = bad.lock().unwrap();
    assert!(bad.is_empty(), "{:?}", &bad[..bad.len().min(5)]);
    let (keys, values) = var.export().unwrap();
    assert_eq!(keys.len(), var.size());
    assert!(keys.len() <= capacity);
    assert_eq!(keys.iter().collect::<HashSet<_>>().len(), keys.len());
    let mut slot = vec![0.0; keys.len() * 2];
    var.lookup_slot(m, &keys, &mut slot).unwrap();
    for (i, &k) in keys.iter().enumerate() {
        let v = &values[i * 2..i * 2 + 2];
        assert!(v[0] == k as f32 || v[0] == INIT[0], "{k}: {v:?}");
        assert!(slot[i * 2] == k as f32 || slot[i * 2] == 0.0, "{k}'s slot");
    }
    assert_eq!(
        var.lifecycle_stats().evicted as usize,
        delivered.load(Ordering::Relaxed)
    );
    assert!(!seen_rows.lock().unwrap().is_empty());
    // The last save restores whole into a fresh variable of the same kind.
    if dir.path().join("ckpt").exists() {
        let copy = Variable::<u64>::builder("t")
            .dim(dim)
            .capacity(capacity)
            .initializer(Initializer::Values(INIT.to_vec()))
            .admission(Admission::Sketch {
                min_count: 2,
                width: 1 << 10,
                depth: 4,
            })
            .build()
            .unwrap();
        copy.restore(dir.path().join("ckpt")).unwrap();
        assert!(copy.size() <= capacity);
    }
}

/// A bounded, admitting variable with keys 0..50 as rows and key 7_000
/// read once (pending), saved to `dir`.
fn saved_bounded(dir: &std::path::Path) -> Variable<u64> {
    let var = Variable::<u64>::builder("t")
        .dim(2)
        .capacity(10_000)
        .admission(Admission::Exact { min_count: 2 })
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..50).collect();
    var.upsert(&keys, &vec![5.0; 100]).unwrap();
    train_read(&var, 7_000);
    var.save(dir).unwrap();
    var
}

/// A way to damage a checkpoint, by name.
type Damage<'a> = (&'a str, Box<dyn Fn() + 'a>);

#[test]
fn a_damaged_admission_file_is_an_error_that_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    saved_bounded(&ckpt);
    let file = ckpt.join("admission-00000.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let index = std::fs::read_to_string(ckpt.join("index.json")).unwrap();
    assert!(index.contains("admission"), "{index}");

    // A variable with its own rows and a pending key 9_000.
    let target = || {
        let var = Variable::<u64>::builder("t")
            .dim(2)
            .capacity(10_000)
            .admission(Admission::Exact { min_count: 2 })
            .build()
            .unwrap();
        var.upsert(&[500, 501], &[1.0; 4]).unwrap();
        train_read(&var, 9_000);
        var
    };
    let unchanged = |var: &Variable<u64>, what: &str| {
        assert_eq!(var.size(), 2, "{what}");
        assert!(present(var, 500) && !present(var, 0), "{what}");
        // 9_000 is still pending (admitted at its second read), 7_000 was
        // not loaded (one read does not admit it).
        train_read(var, 7_000);
        assert!(!present(var, 7_000), "{what}: 7000's count was loaded");
        train_read(var, 9_000);
        assert!(present(var, 9_000), "{what}: 9000's count was lost");
    };
    let damages: Vec<Damage<'_>> = vec![
        (
            "truncated",
            Box::new(|| std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap()),
        ),
        (
            "a flipped byte",
            Box::new(|| {
                let mut b = bytes.clone();
                let last = b.len() - 1;
                b[last] ^= 0x40;
                std::fs::write(&file, b).unwrap();
            }),
        ),
        ("missing", Box::new(|| std::fs::remove_file(&file).unwrap())),
        (
            "index kind changed",
            Box::new(|| {
                std::fs::write(&file, &bytes).unwrap();
                let damaged = index.replacen("\"exact\"", "\"sketch\"", 1);
                assert_ne!(damaged, index);
                std::fs::write(ckpt.join("index.json"), damaged).unwrap();
            }),
        ),
    ];
    for (what, damage) in damages {
        damage();
        for replace in [true, false] {
            let var = target();
            let result = if replace {
                var.restore(&ckpt)
            } else {
                var.load(&ckpt)
            };
            assert!(result.is_err(), "{what} (restore {replace}) was accepted");
            unchanged(&var, what);
        }
        std::fs::write(&file, &bytes).unwrap();
        std::fs::write(ckpt.join("index.json"), &index).unwrap();
    }
    // Undamaged, it restores.
    let var = target();
    var.restore(&ckpt).unwrap();
    assert_eq!(var.size(), 50);
    train_read(&var, 7_000);
    assert!(
        present(&var, 7_000),
        "the saved count admits at the next read"
    );
}

/// A checkpoint of 4000 rows under the Frequency policy whose counts
/// (1 to 40) are spread over the file order: key `k` was written
/// `writes(k)` times.
fn frequency_checkpoint(dir: &std::path::Path) -> (Vec<u64>, fn(u64) -> u64) {
    fn writes(k: u64) -> u64 {
        1 + (k * 7919 % 4000) / 100
    }
    let source = Variable::<u64>::builder("t")
        .dim(2)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..4000).collect();
    for round in 0..=40 {
        let chosen: Vec<u64> = keys
            .iter()
            .copied()
            .filter(|&k| writes(k) > round)
            .collect();
        let values: Vec<f32> = chosen.iter().flat_map(|&k| [k as f32, 0.0]).collect();
        source.upsert(&chosen, &values).unwrap();
    }
    source.save(dir).unwrap();
    (keys, writes)
}

/// How many of `kept` score at least the `capacity`-th highest score of
/// `keys` (ties at the edge make several top sets ideal).
fn top_scored(keys: &[u64], kept: &[u64], writes: fn(u64) -> u64, capacity: usize) -> usize {
    let mut scores: Vec<u64> = keys.iter().map(|&k| writes(k)).collect();
    scores.sort_unstable_by(|a, b| b.cmp(a));
    let edge = scores[capacity - 1];
    kept.iter().filter(|&&k| writes(k) >= edge).count()
}

#[test]
fn restoring_past_the_capacity_keeps_the_highest_scores_and_delivers_the_rest() {
    let capacity = 500;
    let dir = tempfile::tempdir().unwrap();
    let (keys, writes) = frequency_checkpoint(dir.path());

    let (seen, twice, listener) = recorder();
    let var = Variable::<u64>::builder("t")
        .dim(2)
        .shards(2)
        .capacity(capacity)
        .restrict_policy(RestrictPolicy::Frequency)
        .on_evict(listener)
        .build()
        .unwrap();
    var.upsert(&[1_000_000], &[1.0, 1.0]).unwrap();
    var.restore(dir.path()).unwrap();
    assert_eq!(var.size(), capacity);
    assert!(!present(&var, 1_000_000), "restore clears first");
    let seen = seen.lock().unwrap();
    assert_eq!(twice.load(Ordering::Relaxed), 0);
    assert_eq!(seen.len(), keys.len() - capacity, "the rest were delivered");
    assert!(
        !seen.contains_key(&1_000_000),
        "cleared rows are no evictions"
    );
    let (kept, values) = var.export().unwrap();
    for (i, &k) in kept.iter().enumerate() {
        assert_eq!(values[i * 2], k as f32);
        assert!(!seen.contains_key(&k));
        let mut score = [0];
        var.lookup_scores(&[k], &mut score).unwrap();
        assert_eq!(score[0], writes(k), "the saved count is restored");
    }
    // "About the highest-scored rows": the rows restored last stay whatever
    // their score until the sweep comes round (measured: 414 of 500).
    let good = top_scored(&keys, &kept, writes, capacity);
    assert!(good * 100 >= capacity * 80, "{good} of {capacity}");
}

#[test]
fn restoring_past_the_capacity_with_frequency_decay_keeps_the_highest_scores() {
    let capacity = 500;
    let dir = tempfile::tempdir().unwrap();
    let (keys, writes) = frequency_checkpoint(dir.path());
    let var = Variable::<u64>::builder("t")
        .dim(2)
        .capacity(capacity)
        .restrict_policy(RestrictPolicy::Frequency)
        .frequency_decay(true)
        .build()
        .unwrap();
    var.restore(dir.path()).unwrap();
    let (kept, _) = var.export().unwrap();
    // A restore sets the scores it writes and does not age them, so decay
    // keeps the same rows as no decay.
    let good = top_scored(&keys, &kept, writes, capacity);
    assert!(good * 100 >= capacity * 80, "{good} of {capacity}");
}

#[test]
fn frequency_decay_keeps_keys_frequent_now() {
    let capacity = 20_000;
    let hot: Vec<u64> = (0..capacity as u64 / 10).collect();
    let mut kept = Vec::new();
    for decay in [false, true] {
        let var = Variable::<u64>::builder("t")
            .capacity(capacity)
            .restrict_policy(RestrictPolicy::Frequency)
            .frequency_decay(decay)
            .build()
            .unwrap();
        let mut next = 1u64 << 40;
        for _ in 0..100 {
            // The hot keys are written three times a round, every round;
            // then a tenth of the capacity of keys seen once arrives.
            for _ in 0..3 {
                var.upsert(&hot, &vec![0.0; hot.len()]).unwrap();
            }
            let cold: Vec<u64> = (next..next + hot.len() as u64).collect();
            next += hot.len() as u64;
            var.upsert(&cold, &vec![0.0; cold.len()]).unwrap();
        }
        kept.push(hot.iter().filter(|&&k| present(&var, k)).count());
    }
    // Counts halve once per about `capacity` evictions, every ten rounds
    // here: the hot keys gain 30 writes in between and stay.
    assert_eq!(kept[0], hot.len(), "without decay");
    assert!(kept[1] * 100 >= hot.len() * 99, "with decay: {kept:?}");
}

#[test]
fn frequency_decay_lets_keys_frequent_now_replace_keys_frequent_long_ago() {
    let capacity = 4_000;
    let old: Vec<u64> = (0..capacity as u64).collect();
    let now: Vec<u64> = (1 << 40..(1 << 40) + capacity as u64 / 2).collect();
    let mut kept_old = Vec::new();
    let mut kept_now = Vec::new();
    for decay in [false, true] {
        let var = Variable::<u64>::builder("t")
            .capacity(capacity)
            .restrict_policy(RestrictPolicy::Frequency)
            .frequency_decay(decay)
            .build()
            .unwrap();
        let write = |keys: &[u64]| {
            var.update_rows(keys, &[], |_, row, _| row[0] += 1.0)
                .unwrap()
        };
        // Long ago: the old keys fill the table, 30 writes each.
        for _ in 0..30 {
            write(&old);
        }
        // Now: the same half-capacity of keys written 4 times a round,
        // then a quarter capacity of keys seen once, for 100 rounds.
        let mut next = 1u64 << 50;
        for _ in 0..100 {
            for _ in 0..4 {
                write(&now);
            }
            let once: Vec<u64> = (next..next + capacity as u64 / 4).collect();
            next += once.len() as u64;
            write(&once);
        }
        kept_old.push(old.iter().filter(|&&k| present(&var, k)).count());
        kept_now.push(now.iter().filter(|&&k| present(&var, k)).count());
    }
    // Without decay most old keys stay (their 30 writes outrank the keys
    // written now for good) and some keys written now lose their rows to
    // keys seen once; with it no old key stays and every key written now
    // does.
    eprintln!("old keys kept {kept_old:?}, keys written now kept {kept_now:?}");
    assert!(kept_old[1] * 4 < kept_old[0], "old: {kept_old:?}");
    assert!(kept_now[0] < now.len(), "now: {kept_now:?}");
    assert_eq!(kept_now[1], now.len(), "now: {kept_now:?}");
}

#[test]
fn admission_semantics() {
    let init = Initializer::RandomNormal {
        mean: 0.0,
        stddev: 1.0,
        seed: 7,
    };
    let var = Variable::<u64>::builder("t")
        .dim(3)
        .initializer(init)
        .capacity(10)
        .admission(Admission::Exact { min_count: 3 })
        .build()
        .unwrap();
    assert_eq!(var.restrict_policy(), Some(RestrictPolicy::Timestamp));
    let mut expected = vec![0.0; 3];
    var.lookup(&[5], &mut expected).unwrap();
    // `lookup` never counts.
    for _ in 0..10 {
        let mut out = vec![0.0; 3];
        var.lookup(&[5], &mut out).unwrap();
        let mut exists = [true];
        var.lookup_with_exists(&[5], &mut out, &mut exists).unwrap();
    }
    // Training reads before min_count: the initializer's row, nothing
    // stored, counted in the stats.
    assert_eq!(train_read(&var, 5), expected);
    assert_eq!(train_read(&var, 5), expected);
    assert_eq!(var.size(), 0);
    assert_eq!(var.lifecycle_stats().not_admitted_reads, 2);
    // Updates and accum inserts skip a pending key: the closure never runs.
    let mut calls = 0;
    var.update_rows(&[5, 5], &[], |_, _, _| calls += 1).unwrap();
    assert_eq!(calls, 0);
    var.accum(&[5], &[1.0; 3], &[false]).unwrap();
    assert_eq!(var.size(), 0);
    // The third read admits it, with the initializer's row.
    assert_eq!(train_read(&var, 5), expected);
    assert_eq!(var.size(), 1);
    var.update_rows(&[5], &[], |_, v, _| v[0] = 42.0).unwrap();
    assert_eq!(train_read(&var, 5)[0], 42.0);

    // A key repeated in one batch counts once per occurrence.
    let mut six = vec![0.0; 3];
    var.lookup(&[6], &mut six).unwrap();
    let mut out = vec![0.0; 9];
    var.lookup_or_insert(&[6, 6, 6], &mut out).unwrap();
    assert!(present(&var, 6));
    assert_eq!(&out[6..], &six[..]);
    assert_eq!(&out[..3], &six[..]);

    // `upsert` bypasses admission and is never refused at capacity.
    for k in 100..130 {
        var.upsert(&[k], &[1.0; 3]).unwrap();
        assert!(present(&var, k), "upserted key {k}");
        assert!(var.size() <= 10);
    }
    assert_eq!(var.size(), 10);
    assert!(!present(&var, 5), "5 was evicted");
    // An evicted key is counted from zero again (exact counts).
    assert_eq!(train_read(&var, 5), expected);
    assert_eq!(train_read(&var, 5), expected);
    assert!(!present(&var, 5));
    train_read(&var, 5);
    assert!(present(&var, 5), "5 admitted again at its third read");
}

#[test]
fn a_sketch_remembers_an_evicted_key_and_exact_counts_are_bounded() {
    let var = Variable::<u64>::builder("t")
        .capacity(1)
        .admission(Admission::Sketch {
            min_count: 2,
            width: 1024,
            depth: 4,
        })
        .build()
        .unwrap();
    train_read(&var, 1);
    train_read(&var, 1);
    assert!(present(&var, 1));
    train_read(&var, 2);
    train_read(&var, 2);
    assert!(present(&var, 2) && !present(&var, 1), "2 evicted 1");
    // The sketch still holds 1's count: an update may insert it at once.
    var.update_rows(&[1], &[], |_, v, _| v[0] = 3.0).unwrap();
    assert!(present(&var, 1));

    // Exact counts of a capacity-1 variable hold one pending key: two keys
    // read in turn push each other out.
    let var = Variable::<u64>::builder("t")
        .capacity(1)
        .admission(Admission::Exact { min_count: 2 })
        .build()
        .unwrap();
    for _ in 0..100 {
        train_read(&var, 1);
        train_read(&var, 2);
    }
    assert_eq!(
        var.size(),
        0,
        "neither key is ever admitted while the other is read between"
    );
}

#[test]
fn frequency_decay_leaves_the_user_visible_counts_alone() {
    let var = Variable::<u64>::builder("t")
        .capacity(64)
        .restrict_policy(RestrictPolicy::Frequency)
        .frequency_decay(true)
        .build()
        .unwrap();
    for _ in 0..10 {
        var.upsert(&[1], &[1.0]).unwrap();
    }
    // Many sweeps past key 1.
    for k in 1000..3000u64 {
        var.upsert(&[k], &[0.0]).unwrap();
        if !present(&var, 1) {
            break;
        }
        let mut score = [0];
        var.lookup_scores(&[1], &mut score).unwrap();
        assert_eq!(score[0], 10, "the plain count of writes");
    }
    assert!(var.size() <= 64);
}
