//! Inserts, updates (some panicking midway), reads and removals racing on
//! tables of a few rows: the capacity holds at every observation, every
//! evicted key is delivered once and is then absent, and no permit leaks.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use dynemb::{Evicted, RestrictPolicy, Variable};

type Counts = Arc<Mutex<HashMap<u64, usize>>>;

fn build(cap: usize, policy: RestrictPolicy, decay: bool, counts: &Counts) -> Variable<u64> {
    let sink = Arc::clone(counts);
    Variable::<u64>::builder("t")
        .dim(2)
        .shards(1)
        .capacity(cap)
        .restrict_policy(policy)
        .frequency_decay(decay)
        .on_evict(move |batch: Evicted<'_, u64>| {
            let mut sink = sink.lock().unwrap();
            for (i, &k) in batch.keys().iter().enumerate() {
                // Distinct keys (>= 1<<32) carry their key in value 0.
                if (1 << 32..1 << 40).contains(&k) {
                    assert_eq!(batch.values()[i * 2], (k & 0xffff) as f32, "key {k}");
                }
                *sink.entry(k).or_default() += 1;
            }
        })
        .build()
        .unwrap()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Whether `key` is a row of `var`.
fn present(var: &Variable<u64>, key: u64) -> bool {
    dynemb_test_support::present(var, &[key])[0]
}

/// Runs 4 threads of mixed writes (shared keys, repeated keys in a batch,
/// distinct keys, removals, panicking updates) into a table of `cap` rows.
fn run(cap: usize, policy: RestrictPolicy, decay: bool, panics: bool, iters: usize) {
    let counts: Counts = Arc::default();
    let var = build(cap, policy, decay, &counts);
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (var, done, peak) = (var.clone(), Arc::clone(&done), Arc::clone(&peak));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(var.size(), Ordering::Relaxed);
                std::hint::spin_loop();
            }
        })
    };
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let var = var.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t + 1) * 0x1234_5677));
                let mut distinct = (1u64 << 32) + (t << 24);
                for _ in 0..iters {
                    let n = 1 + (rng.next() % 6) as usize;
                    let mut keys = Vec::with_capacity(n);
                    for _ in 0..n {
                        if rng.next().is_multiple_of(3) {
                            distinct += 1;
                            keys.push(distinct);
                        } else {
                            keys.push(rng.next() % 8);
                        }
                    }
                    if rng.next().is_multiple_of(4) {
                        // A repeated (shared) key in a batch; a distinct key
                        // repeated could legitimately live twice.
                        keys.push(rng.next() % 8);
                        keys.push(keys[keys.len() - 1]);
                    }
                    let values: Vec<f32> = keys
                        .iter()
                        .flat_map(|&k| [(k & 0xffff) as f32, 1.0])
                        .collect();
                    match rng.next() % 5 {
                        0 | 1 => var.upsert(&keys, &values).unwrap(),
                        2 => {
                            let mut out = vec![0.0; keys.len() * 2];
                            let shared: Vec<u64> =
                                keys.iter().copied().filter(|&k| k < 8).collect();
                            if !shared.is_empty() {
                                var.lookup_or_insert(&shared, &mut out[..shared.len() * 2])
                                    .unwrap();
                            }
                            var.upsert(&keys, &values).unwrap();
                        }
                        3 => {
                            let boom = panics && rng.next().is_multiple_of(3);
                            let at = (rng.next() % keys.len() as u64) as usize;
                            let ks = keys.clone();
                            let r = catch_unwind(AssertUnwindSafe(|| {
                                var.update_rows(&ks, &[], |i, row, _| {
                                    if boom && i == at {
                                        panic!("boom");
                                    }
                                    row[0] = (ks[i] & 0xffff) as f32;
                                    row[1] += 1.0;
                                })
                            }));
                            if let Ok(r) = r {
                                r.unwrap();
                            }
                        }
                        _ => {
                            let shared: Vec<u64> =
                                keys.iter().copied().filter(|&k| k < 8).collect();
                            var.remove(&shared).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    assert!(peak <= cap, "peak {peak} > cap {cap}");
    assert!(var.size() <= cap, "size {} > cap {cap}", var.size());
    // Distinct keys: never delivered twice, and present xor delivered.
    {
        let counts = counts.lock().unwrap();
        for (&k, &c) in counts.iter() {
            if (1 << 32..1 << 40).contains(&k) {
                assert_eq!(c, 1, "distinct key {k} delivered {c} times");
                assert!(!present(&var, k), "distinct key {k} delivered and present");
            }
        }
    }
    // No leaked permits: filling single-threaded reaches exactly `cap`.
    for k in 0..(cap as u64 + 8) {
        var.upsert(&[(1 << 60) + k], &[0.0, 0.0]).unwrap();
        let size = var.size();
        assert!(size <= cap, "size {size} > cap {cap}");
    }
    let (keys, _) = var.export().unwrap();
    assert_eq!(keys.len(), var.size(), "export agrees with size");
    assert_eq!(var.size(), cap, "a filled table holds its capacity");
}

#[test]
fn tiny_capacities_four_threads_timestamp() {
    for cap in 1..=3 {
        run(cap, RestrictPolicy::Timestamp, false, false, 2000);
    }
}

#[test]
fn tiny_capacities_four_threads_frequency_decay() {
    for cap in [1, 2, 3, 5] {
        run(cap, RestrictPolicy::Frequency, true, false, 2000);
    }
}

#[test]
fn tiny_capacities_with_panicking_updates() {
    for cap in [1, 2, 3, 7] {
        for policy in [RestrictPolicy::Timestamp, RestrictPolicy::Frequency] {
            run(cap, policy, policy == RestrictPolicy::Frequency, true, 1000);
        }
    }
}
