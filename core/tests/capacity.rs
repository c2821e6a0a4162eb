//! Integration tests of bounded variables: capacity, eviction, the
//! eviction listener and expiry.
//!
//! - `size()` never exceeds the capacity, also while four threads stream
//!   new keys and a fifth watches;
//! - eviction follows the policy's score: LRU keeps mostly the recent keys,
//!   LFU the frequent ones (single-threaded, with measured expectations);
//! - every evicted row reaches the listener exactly once, with the values
//!   and slot rows it had, and a row is either in the table or delivered;
//! - expiry removes exactly the rows not written for the given time, and
//!   does not call the listener;
//! - options are checked at build, and a capacity defaults the policy to
//!   Timestamp.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynemb::{Error, Evicted, RestrictPolicy, Variable};

/// The rows delivered to a listener, by key: (values, slot rows by name, score).
type Delivered = Arc<Mutex<HashMap<u64, (Vec<f32>, Vec<(String, Vec<f32>)>, u64)>>>;

/// A listener that records every row and fails the test on a key
/// delivered twice.
fn recorder() -> (Delivered, impl Fn(Evicted<'_, u64>) + Send + Sync + 'static) {
    let delivered: Delivered = Arc::default();
    let sink = Arc::clone(&delivered);
    let listener = move |batch: Evicted<'_, u64>| {
        let dim = batch.dim();
        let mut sink = sink.lock().unwrap();
        assert_eq!(batch.values().len(), batch.len() * dim);
        assert_eq!(batch.scores().len(), batch.len());
        for (i, &key) in batch.keys().iter().enumerate() {
            let slots = batch
                .slots()
                .map(|(name, rows)| (name.to_string(), rows[i * dim..(i + 1) * dim].to_vec()))
                .collect();
            let row = batch.values()[i * dim..(i + 1) * dim].to_vec();
            let previous = sink.insert(key, (row, slots, batch.scores()[i]));
            assert!(previous.is_none(), "key {key} delivered twice");
        }
    };
    (delivered, listener)
}

/// Whether `size` is what a full table holds: the capacity, or up to
/// `slack` rows less (an insert that evicted and then found its key
/// inserted by another thread leaves its row free).
fn full(size: usize, capacity: usize, slack: usize) -> bool {
    size <= capacity && size + slack >= capacity
}

fn row_of(key: u64, dim: usize) -> Vec<f32> {
    (0..dim).map(|j| (key * 10 + j as u64) as f32).collect()
}

#[test]
fn options_are_checked_at_build() {
    let refused = |b: dynemb::VariableBuilder<u64>| match b.build() {
        Err(Error::InvalidArgument(message)) => message,
        other => panic!("expected an error, got {other:?}"),
    };
    let message = refused(Variable::<u64>::builder("t").shards(4).capacity(3));
    assert!(message.contains("capacity 3"), "{message}");
    let message = refused(Variable::<u64>::builder("t").on_evict(|_| {}));
    assert!(message.contains("on_evict needs a capacity"), "{message}");
    let message = refused(
        Variable::<u64>::builder("t")
            .capacity(10)
            .frequency_decay(true),
    );
    assert!(message.contains("frequency_decay"), "{message}");
    let message =
        refused(Variable::<u64>::builder("t").admission(dynemb::Admission::Exact { min_count: 0 }));
    assert!(message.contains("min_count"), "{message}");
    let message = refused(
        Variable::<u64>::builder("t").admission(dynemb::Admission::Sketch {
            min_count: 2,
            width: 0,
            depth: 4,
        }),
    );
    assert!(message.contains("width"), "{message}");

    let var = Variable::<u64>::builder("t").capacity(10).build().unwrap();
    assert_eq!(var.capacity(), Some(10));
    assert_eq!(var.restrict_policy(), Some(RestrictPolicy::Timestamp));
    let var = Variable::<u64>::builder("t")
        .capacity(10)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    assert_eq!(var.restrict_policy(), Some(RestrictPolicy::Frequency));
    assert_eq!(
        Variable::<u64>::builder("t").build().unwrap().capacity(),
        None
    );
}

#[test]
fn inserts_into_a_full_variable_evict_and_every_eviction_is_delivered_once() {
    let dim = 3;
    let capacity = 1000;
    let (delivered, listener) = recorder();
    let var = Variable::<u64>::builder("t")
        .dim(dim)
        .shards(2)
        .capacity(capacity)
        .on_evict(listener)
        .build()
        .unwrap();
    let m = var.create_slot("m", 0.5).unwrap();
    let keys: Vec<u64> = (0..10_000).collect();
    for chunk in keys.chunks(100) {
        // Each key is written once (inserted by the update), with a slot
        // value of its own, as an optimizer would.
        var.update_rows(chunk, &[m], |i, row, slot| {
            row.copy_from_slice(&row_of(chunk[i], dim));
            slot.fill(chunk[i] as f32);
        })
        .unwrap();
        assert!(var.size() <= capacity);
    }
    let size = var.size();
    assert_eq!(size, capacity);
    let stats = var.lifecycle_stats();
    assert_eq!(stats.evicted as usize, keys.len() - size);
    let delivered = delivered.lock().unwrap();
    assert_eq!(delivered.len(), keys.len() - size);
    let (present, _) = var.export().unwrap();
    let present: HashSet<u64> = present.into_iter().collect();
    for &key in &keys {
        let gone = delivered.get(&key);
        assert_ne!(
            present.contains(&key),
            gone.is_some(),
            "key {key}: in the table xor delivered"
        );
        if let Some((values, slots, score)) = gone {
            assert_eq!(values, &row_of(key, dim), "key {key}'s values");
            assert_eq!(slots, &vec![("m".to_string(), vec![key as f32; dim])]);
            assert!(*score > 0, "a timestamp");
        }
    }
}

#[test]
fn lru_keeps_mostly_the_recently_written_keys() {
    let capacity = 10_000;
    let var = Variable::<u64>::builder("t")
        .capacity(capacity)
        .restrict_policy(RestrictPolicy::Timestamp)
        .build()
        .unwrap();
    let n = 50_000u64;
    for chunk in (0..n).collect::<Vec<_>>().chunks(256) {
        var.upsert(chunk, &vec![1.0; chunk.len()]).unwrap();
    }
    let (kept, _) = var.export().unwrap();
    assert_eq!(kept.len(), capacity);
    let recent = kept.iter().filter(|&&k| k >= n - capacity as u64).count();
    let share = recent as f64 / kept.len() as f64;
    // 0.99 here: the sweep's pool of the lowest-ranked rows seen is nearly
    // the table's oldest.
    assert!(share > 0.97, "share of the most recent keys kept: {share}");
}

#[test]
fn lfu_keeps_mostly_the_frequent_keys() {
    // HierarchicalKV's test: 5x capacity keys, each written a random number
    // of times in a row; what stays should be the top-capacity set.
    let capacity = 4000;
    let var = Variable::<u64>::builder("t")
        .capacity(capacity)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut counts = Vec::new();
    for key in 0..5 * capacity as u64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let writes = 1 + state % 100;
        counts.push(writes);
        for _ in 0..writes {
            var.upsert(&[key], &[0.0]).unwrap();
        }
    }
    let mut sorted = counts.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let threshold = sorted[capacity - 1];
    let (kept, _) = var.export().unwrap();
    assert_eq!(kept.len(), capacity);
    let ideal = kept
        .iter()
        .filter(|&&k| counts[k as usize] >= threshold)
        .count();
    let overlap = ideal as f64 / kept.len() as f64;
    // 0.99 here (HierarchicalKV demands 0.995 of its bucket eviction).
    assert!(
        overlap >= 0.97,
        "overlap with the top-capacity set: {overlap}"
    );
}

#[test]
fn capacity_holds_while_four_threads_stream_new_keys() {
    let capacity = 20_000;
    let (delivered, listener) = recorder();
    let var = Variable::<u64>::builder("t")
        .dim(2)
        .shards(2)
        .capacity(capacity)
        .on_evict(listener)
        .build()
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (var, done, peak) = (var.clone(), Arc::clone(&done), Arc::clone(&peak));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(var.size(), Ordering::Relaxed);
            }
        })
    };
    let per_thread = 50_000u64;
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let var = var.clone();
            std::thread::spawn(move || {
                let keys: Vec<u64> = (t * per_thread..(t + 1) * per_thread).collect();
                for (i, chunk) in keys.chunks(64).enumerate() {
                    if i % 2 == 0 {
                        let values: Vec<f32> = chunk.iter().flat_map(|&k| row_of(k, 2)).collect();
                        var.upsert(chunk, &values).unwrap();
                    } else {
                        let mut out = vec![1.0; chunk.len() * 2];
                        var.lookup_or_insert(chunk, &mut out).unwrap();
                        assert!(
                            out.iter().all(|&v| v == 0.0),
                            "new keys read the initializer's row"
                        );
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    assert!(
        peak.load(Ordering::Relaxed) <= capacity,
        "peak size {}",
        peak.load(Ordering::Relaxed)
    );
    let size = var.size();
    assert!(full(size, capacity, 64), "size {size}");
    let (present, values) = var.export().unwrap();
    assert_eq!(present.len(), size);
    let delivered = delivered.lock().unwrap();
    assert_eq!(delivered.len() + size, 4 * per_thread as usize);
    // Keys of even chunks were upserted with their row, of odd chunks
    // inserted by a training read with the initializer's (zeros).
    let expected = |key: u64| {
        if (key % per_thread / 64).is_multiple_of(2) {
            row_of(key, 2)
        } else {
            vec![0.0; 2]
        }
    };
    for (i, key) in present.iter().enumerate() {
        assert!(
            !delivered.contains_key(key),
            "key {key} both present and evicted"
        );
        assert_eq!(values[i * 2..i * 2 + 2], expected(*key)[..]);
    }
    for (key, (values, _, _)) in delivered.iter() {
        assert_eq!(values, &expected(*key), "key {key} delivered with its row");
    }
}

#[test]
fn expiry_removes_exactly_the_rows_not_written_for_that_long() {
    let (delivered, listener) = recorder();
    let var = Variable::<u64>::builder("t")
        .dim(2)
        .capacity(1000)
        .on_evict(listener)
        .build()
        .unwrap();
    let m = var.create_slot("m", 0.0).unwrap();
    let old: Vec<u64> = (0..100).collect();
    let young: Vec<u64> = (100..200).collect();
    var.upsert(&old, &vec![1.0; 200]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    var.upsert(&young, &vec![2.0; 200]).unwrap();
    // Rewriting an old key makes it young.
    var.update_rows(&[5], &[m], |_, row, _| row.fill(3.0))
        .unwrap();
    assert_eq!(var.expire(Duration::from_millis(150)).unwrap(), 99);
    assert_eq!(var.size(), 101);
    let mut exists = vec![false; 200];
    let mut out = vec![0.0; 400];
    let all: Vec<u64> = (0..200).collect();
    var.lookup_with_exists(&all, &mut out, &mut exists).unwrap();
    for (key, present) in exists.iter().enumerate() {
        assert_eq!(*present, key == 5 || key >= 100, "key {key}");
    }
    assert_eq!(var.lifecycle_stats().expired, 99);
    assert!(
        delivered.lock().unwrap().is_empty(),
        "expiry is not eviction"
    );
    assert_eq!(var.expire(Duration::from_secs(3600)).unwrap(), 0);

    let counted = Variable::<u64>::builder("f")
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    assert!(matches!(
        counted.expire(Duration::from_secs(1)),
        Err(Error::InvalidArgument(_))
    ));
    let plain = Variable::<u64>::builder("p").build().unwrap();
    assert!(matches!(
        plain.expire(Duration::ZERO),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn removals_free_room_and_restore_past_capacity_keeps_capacity() {
    let var = Variable::<u64>::builder("t").capacity(100).build().unwrap();
    let keys: Vec<u64> = (0..100).collect();
    var.upsert(&keys, &vec![1.0; 100]).unwrap();
    var.remove(&keys[..50]).unwrap();
    assert_eq!(var.size(), 50);
    var.upsert(&(1000..1050).collect::<Vec<_>>(), &[2.0; 50])
        .unwrap();
    assert_eq!(var.size(), 100);
    assert_eq!(
        var.lifecycle_stats().evicted,
        0,
        "room was made by the removal"
    );

    let dir = tempfile::tempdir().unwrap();
    let big = Variable::<u64>::builder("t")
        .capacity(1000)
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..1000).collect();
    for chunk in keys.chunks(10) {
        big.upsert(chunk, &[1.0; 10]).unwrap();
    }
    big.save(dir.path()).unwrap();
    var.restore(dir.path()).unwrap();
    assert_eq!(var.size(), 100);
    let (kept, _) = var.export().unwrap();
    let recent = kept.iter().filter(|&&k| k >= 900).count();
    assert!(
        recent >= 80,
        "restore keeps mostly the highest-scored: {recent}"
    );
}
