//! Multi-threaded stress tests with exact invariants.
//!
//! Every table starts with `init_size(1)` and grows to tens or hundreds of
//! thousands of keys while threads work on it, so every operation runs
//! through many concurrent resizes. Values are small integers stored as f32
//! so sums are exact. No timing assertions: each test does a fixed amount of
//! work (readers run until the writers are done).
//!
//! - `concurrent_accum_sums_are_exact`: T threads add +1 to overlapping keys;
//!   every element ends at exactly the number of adds.
//! - `concurrent_accum_inserts_have_exactly_one_winner`: T threads race to
//!   insert the same absent keys with bp_v2 `exists = false`; exactly one
//!   thread's row is stored, never a mix or a sum.
//! - `readers_never_see_torn_rows_dim_64` / `_dim_17`: writers store rows whose
//!   elements are all equal; readers (lookup, lookup_or_insert, export_chunks)
//!   never see a row with unequal elements.
//! - `no_key_is_lost_through_resizes`: disjoint inserters, a remover and
//!   readers; a key is visible as soon as its insert returned, and at the end
//!   exactly the inserted-and-not-removed keys are present.
//! - `mixed_operations_keep_exact_per_thread_state`: every op in parallel on
//!   thread-owned keys (checked exactly against a per-thread model) and shared
//!   keys (checked by invariants).
//! - `concurrent_update_rows_with_a_slot_sums_are_exact`: T threads run
//!   `update_rows` (value += 1, slot += 2) on overlapping keys while the
//!   table grows, a churn thread inserts and removes a disjoint key range
//!   (reusing row ids) and readers check rows and slot rows are never torn;
//!   inside the row lock value and slot always match, a re-inserted key
//!   never sees a stale slot, and the final sums are exact.
//! - `restrict_during_concurrent_updates_removes_exactly_the_coldest`: a
//!   restrict runs while writers train the hottest keys; it removes exactly
//!   the lowest-scored groups of keys nobody writes meanwhile, keeps every
//!   hot key and loses none of their updates.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use dynemb::{Initializer, Key, RestrictPolicy, Variable};

const THREADS: usize = 4;

/// xorshift64*: a tiny deterministic generator per thread.
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
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn assert_uniform<K: Key>(what: &str, key: K, row: &[f32]) {
    assert!(
        row.iter().all(|&x| x == row[0]),
        "{what}: torn row for key {key:?}: {row:?}"
    );
}

/// Exports `var` over and over (at least once) until `done`, checking that
/// no exported row is torn.
fn export_until_done<K: Key>(var: &Variable<K>, done: &AtomicBool) {
    let dim = var.dim();
    let mut rounds = 0;
    while !done.load(Ordering::Acquire) || rounds < 1 {
        for chunk in var.export_chunks(4096) {
            let (keys, values) = chunk.unwrap();
            assert_eq!(values.len(), keys.len() * dim);
            for (j, &k) in keys.iter().enumerate() {
                assert_uniform("export_chunks", k, &values[j * dim..(j + 1) * dim]);
            }
        }
        rounds += 1;
    }
}

fn spread(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

// ---------------------------------------------------------------- (1) exact sums

#[test]
fn concurrent_accum_sums_are_exact() {
    let dim = 8;
    let n = 200_000usize;
    let batch = 256usize;
    let passes = 3usize;
    let var = Variable::<u64>::builder("sums")
        .dim(dim)
        .shards(1)
        .init_size(1)
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..n as u64).map(spread).collect();
    let ones = vec![1.0f32; 2 * batch * dim];

    std::thread::scope(|s| {
        for t in 0..THREADS {
            let var = var.clone();
            let keys = &keys;
            let ones = &ones;
            s.spawn(move || {
                let start = t * n / THREADS;
                let mut out = vec![0.0f32; 2 * batch * dim];
                let mut exists = vec![false; 2 * batch];
                for pass in 0..passes {
                    let mut pos = 0;
                    while pos < n {
                        let len = batch.min(n - pos);
                        // Each key twice in the batch: both adds must land.
                        let mut b: Vec<u64> =
                            (pos..pos + len).map(|i| keys[(start + i) % n]).collect();
                        let copy = b.clone();
                        b.extend(copy.iter().rev());
                        let m = b.len();
                        if pass == 0 {
                            var.lookup_or_insert(&b, &mut out[..m * dim]).unwrap();
                            exists[..m].fill(true);
                        } else {
                            // Every key was inserted by this thread in pass 0
                            // and nothing removes keys.
                            var.lookup_with_exists(&b, &mut out[..m * dim], &mut exists[..m])
                                .unwrap();
                            assert!(exists[..m].iter().all(|&e| e), "a key vanished");
                        }
                        var.accum(&b, &ones[..m * dim], &exists[..m]).unwrap();
                        pos += len;
                    }
                }
            });
        }
    });

    let want = (THREADS * passes * 2) as f32;
    assert_eq!(var.size(), n);
    let mut out = vec![0.0f32; n * dim];
    let mut exists = vec![false; n];
    var.lookup_with_exists(&keys, &mut out, &mut exists)
        .unwrap();
    for i in 0..n {
        assert!(exists[i], "key #{i} lost");
        let row = &out[i * dim..(i + 1) * dim];
        assert!(
            row.iter().all(|&x| x == want),
            "key #{i} ({}): {row:?}, want {want} in every element",
            keys[i]
        );
    }
    let (ek, ev) = var.export().unwrap();
    assert_eq!(ek.len(), n);
    assert!(ev.iter().all(|&x| x == want));
}

#[test]
fn concurrent_accum_inserts_have_exactly_one_winner() {
    // Fresh tables (init_size 1) each round, with small and large batches.
    for (round, batch) in [(0i64, 128usize), (1, 9), (2, 1000), (3, 1)] {
        insert_race(round, batch);
    }
}

fn insert_race(round: i64, batch: usize) {
    let dim = 5;
    let n = if batch == 1 { 20_000usize } else { 80_000 };
    let var = Variable::<i64>::builder("race")
        .dim(dim)
        .shards(2)
        .init_size(1)
        .initializer(Initializer::Constant(-1000.0))
        .build()
        .unwrap();
    let keys: Vec<i64> = (0..n as i64)
        .map(|i| {
            if i % 2 == 0 {
                -i - round
            } else {
                (i << 20) + round
            }
        })
        .collect();

    std::thread::scope(|s| {
        for t in 0..THREADS {
            let var = &var;
            let keys = &keys;
            s.spawn(move || {
                // Thread t adds 2^t per occurrence: a sum of several threads'
                // rows can never look like one thread's row.
                let delta = (1u32 << t) as f32;
                let start = t * n / THREADS;
                let deltas = vec![delta; 2 * batch * dim];
                let flags = vec![false; 2 * batch];
                let mut pos = 0;
                while pos < n {
                    let len = batch.min(n - pos);
                    let mut b: Vec<i64> = (pos..pos + len).map(|i| keys[(start + i) % n]).collect();
                    let copy = b.clone();
                    b.extend(copy);
                    let m = b.len();
                    var.accum(&b, &deltas[..m * dim], &flags[..m]).unwrap();
                    pos += len;
                }
            });
        }
    });

    assert_eq!(var.size(), n);
    let winners: Vec<f32> = (0..THREADS).map(|t| 2.0 * (1u32 << t) as f32).collect();
    let mut out = vec![0.0f32; n * dim];
    let mut exists = vec![false; n];
    var.lookup_with_exists(&keys, &mut out, &mut exists)
        .unwrap();
    for i in 0..n {
        assert!(exists[i], "key {} lost", keys[i]);
        let row = &out[i * dim..(i + 1) * dim];
        assert_uniform("insert race", keys[i], row);
        assert!(
            winners.contains(&row[0]),
            "round {round} (batch {batch}): key {}: {row:?} is not one thread's insert \
             (one of {winners:?})",
            keys[i]
        );
    }
}

// ---------------------------------------------------------------- (2) torn rows

fn torn_row_check(dim: usize) {
    let hot = 64u32;
    let grow_per_writer = 100_000u32;
    let writers = 2u32;
    let batch = 100u32;
    let var = Variable::<u32>::builder("torn")
        .dim(dim)
        .shards(1)
        .init_size(1)
        .build()
        .unwrap();
    let hot_keys: Vec<u32> = (0..hot).collect();
    var.upsert(&hot_keys, &vec![0.0; hot as usize * dim])
        .unwrap();
    let done = AtomicBool::new(false);
    let writers_left = AtomicUsize::new(writers as usize + 1);
    let grown = AtomicU64::new(0);

    std::thread::scope(|s| {
        // Upserting writers: grow the table and overwrite the hot keys.
        for w in 0..writers {
            let (var, hot_keys, done, writers_left, grown) =
                (&var, &hot_keys, &done, &writers_left, &grown);
            s.spawn(move || {
                let mut i = 0u32;
                let mut next = 0u32;
                while next < grow_per_writer {
                    let base = 1_000 + w * grow_per_writer;
                    let keys: Vec<u32> = (base + next..base + next + batch).collect();
                    let values: Vec<f32> = keys
                        .iter()
                        .flat_map(|&k| std::iter::repeat_n((k % 4096) as f32, dim))
                        .collect();
                    var.upsert(&keys, &values).unwrap();
                    next += batch;
                    grown.fetch_add(batch as u64, Ordering::Relaxed);
                    // Hot rows: every element the same, different per write.
                    let v = (w * 1_000_000 + i) as f32;
                    let values: Vec<f32> = hot_keys
                        .iter()
                        .flat_map(|&k| std::iter::repeat_n(v + k as f32, dim))
                        .collect();
                    var.upsert(hot_keys, &values).unwrap();
                    i += 1;
                }
                if writers_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    done.store(true, Ordering::Release);
                }
            });
        }
        // Accumulating writer: adds the same value to every element.
        {
            let (var, hot_keys, done, writers_left) = (&var, &hot_keys, &done, &writers_left);
            s.spawn(move || {
                let deltas = vec![1.0f32; hot_keys.len() * dim];
                let flags = vec![true; hot_keys.len()];
                for _ in 0..10_000 {
                    var.accum(hot_keys, &deltas, &flags).unwrap();
                }
                if writers_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    done.store(true, Ordering::Release);
                }
            });
        }
        // Readers.
        for r in 0..2u64 {
            let (var, done, grown) = (&var, &done, &grown);
            s.spawn(move || {
                let mut rng = Rng::new(r + 1);
                let mut out = vec![0.0f32; 32 * dim];
                let mut exists = vec![false; 32];
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) || reads < 100 {
                    let g = grown.load(Ordering::Relaxed) as usize;
                    let keys: Vec<u32> = (0..32)
                        .map(|j| {
                            if j % 2 == 0 {
                                rng.below(hot as usize) as u32
                            } else {
                                // Growing region (may or may not be present yet).
                                1_000 + rng.below(g.max(1) + 1000) as u32
                            }
                        })
                        .collect();
                    if reads % 3 == 2 {
                        var.lookup_with_exists(&keys, &mut out, &mut exists)
                            .unwrap();
                    } else {
                        var.lookup(&keys, &mut out).unwrap();
                    }
                    for (j, &k) in keys.iter().enumerate() {
                        assert_uniform("lookup", k, &out[j * dim..(j + 1) * dim]);
                    }
                    reads += 1;
                }
            });
        }
        // Exporter: rows seen by export are never torn either.
        s.spawn(|| export_until_done(&var, &done));
    });

    let total = hot as usize + (writers * grow_per_writer) as usize;
    assert_eq!(var.size(), total);
    let (keys, values) = var.export().unwrap();
    assert_eq!(keys.len(), total);
    for (j, &k) in keys.iter().enumerate() {
        let row = &values[j * dim..(j + 1) * dim];
        assert_uniform("final export", k, row);
        if k >= 1_000 {
            assert_eq!(row[0], (k % 4096) as f32, "grown key {k}");
        }
    }
}

#[test]
fn readers_never_see_torn_rows_dim_64() {
    torn_row_check(64);
}

#[test]
fn readers_never_see_torn_rows_dim_17() {
    torn_row_check(17);
}

// ---------------------------------------------------------------- (3) no key lost

#[test]
fn no_key_is_lost_through_resizes() {
    // Fresh tables each round; small batches interleave more often with a
    // resize in progress.
    // One round also makes room ahead from another thread meanwhile
    // (`Variable::reserve`: migrations it starts, rows it backs with memory).
    for (batch, reserving) in [(500usize, false), (61, true), (7, false)] {
        no_key_lost_round(batch, reserving);
    }
}

fn no_key_lost_round(batch: usize, reserving: bool) {
    let dim = 4;
    let inserters = 2usize;
    let per_inserter = 80_000usize;
    let removable = 40_000usize;
    let make = |name: &str| {
        Variable::<i64>::builder(name)
            .dim(dim)
            .shards(2)
            .init_size(1)
            .initializer(Initializer::RandomUniform {
                low: -8.0,
                high: 8.0,
                seed: 99,
            })
            .build()
            .unwrap()
    };
    let var = make("lost");
    // An untouched twin with the same initializer: its lookups give the row
    // lookup_or_insert must have stored.
    let twin = make("twin");
    let expected = |keys: &[i64]| {
        let mut out = vec![0.0f32; keys.len() * dim];
        twin.lookup(keys, &mut out).unwrap();
        out
    };

    // Inserter i owns [i * per_inserter, (i + 1) * per_inserter), spread out.
    let ins_key = |i: usize, j: usize| ((i * per_inserter + j) as i64) * 7 + 3;
    // Pre-populated negative keys: even ones are removed, odd ones kept.
    let pre: Vec<i64> = (1..=removable as i64).map(|k| -k).collect();
    let mut out = vec![0.0f32; pre.len() * dim];
    var.lookup_or_insert(&pre, &mut out).unwrap();
    assert_eq!(out, expected(&pre));
    let to_remove: Vec<i64> = pre.iter().copied().filter(|k| k % 2 == 0).collect();
    let kept: Vec<i64> = pre.iter().copied().filter(|k| k % 2 != 0).collect();

    let watermarks: Vec<AtomicUsize> = (0..inserters).map(|_| AtomicUsize::new(0)).collect();
    let active = AtomicUsize::new(inserters + 1);

    std::thread::scope(|s| {
        for i in 0..inserters {
            let (var, watermarks, active, expected) = (&var, &watermarks, &active, &expected);
            s.spawn(move || {
                let mut out = vec![0.0f32; batch * dim];
                let mut j = 0;
                while j < per_inserter {
                    let len = batch.min(per_inserter - j);
                    let keys: Vec<i64> = (j..j + len).map(|j| ins_key(i, j)).collect();
                    var.lookup_or_insert(&keys, &mut out[..len * dim]).unwrap();
                    assert_eq!(
                        out[..len * dim],
                        expected(&keys),
                        "inserter {i}: lookup_or_insert rows (batch {batch})"
                    );
                    j += len;
                    watermarks[i].store(j, Ordering::Release);
                }
                active.fetch_sub(1, Ordering::AcqRel);
            });
        }
        {
            let (var, to_remove, active) = (&var, &to_remove, &active);
            s.spawn(move || {
                for (n, chunk) in to_remove.chunks(batch.min(200)).enumerate() {
                    var.remove(chunk).unwrap();
                    // Removing absent keys again, and keys never inserted, is a no-op.
                    if n % 4 == 0 {
                        var.remove(chunk).unwrap();
                        var.remove(&[-(removable as i64) - 1 - n as i64, i64::MIN + n as i64])
                            .unwrap();
                    }
                }
                active.fetch_sub(1, Ordering::AcqRel);
            });
        }
        if reserving {
            let (var, active) = (&var, &active);
            s.spawn(move || {
                let mut n = 1usize;
                while active.load(Ordering::Acquire) > 0 {
                    var.reserve(n * batch);
                    n = n % 64 + 1;
                }
            });
        }
        for r in 0..2u64 {
            let (var, watermarks, active, kept, expected) =
                (&var, &watermarks, &active, &kept, &expected);
            s.spawn(move || {
                let mut rng = Rng::new(100 + r);
                let mut rounds = 0;
                while active.load(Ordering::Acquire) > 0 || rounds < 10 {
                    // Keys whose insert has returned must be visible with their row.
                    let mut keys = Vec::with_capacity(64);
                    for (i, mark) in watermarks.iter().enumerate() {
                        let w = mark.load(Ordering::Acquire);
                        if w > 0 {
                            for _ in 0..24 {
                                keys.push(ins_key(i, rng.below(w)));
                            }
                            // The newest batch, the most likely to be mid-migration.
                            keys.push(ins_key(i, w - 1));
                        }
                    }
                    // Pre-populated keys nobody removes.
                    for _ in 0..16 {
                        keys.push(kept[rng.below(kept.len())]);
                    }
                    let mut out = vec![0.0f32; keys.len() * dim];
                    let mut exists = vec![false; keys.len()];
                    var.lookup_with_exists(&keys, &mut out, &mut exists)
                        .unwrap();
                    for (j, &k) in keys.iter().enumerate() {
                        assert!(
                            exists[j],
                            "key {k} missing while the table grows (batch {batch})"
                        );
                    }
                    assert_eq!(out, expected(&keys), "rows read during growth");
                    rounds += 1;
                }
            });
        }
    });

    let inserted: Vec<i64> = (0..inserters)
        .flat_map(|i| (0..per_inserter).map(move |j| ins_key(i, j)))
        .collect();
    let check_present = |keys: &[i64], what: &str| {
        let mut out = vec![0.0f32; keys.len() * dim];
        let mut exists = vec![false; keys.len()];
        var.lookup_with_exists(keys, &mut out, &mut exists).unwrap();
        let missing: Vec<i64> = keys
            .iter()
            .zip(&exists)
            .filter(|(_, &e)| !e)
            .map(|(&k, _)| k)
            .take(10)
            .collect();
        assert!(missing.is_empty(), "{what}: keys lost, e.g. {missing:?}");
        assert_eq!(out, expected(keys), "{what}: rows");
    };
    check_present(&inserted, "inserted");
    check_present(&kept, "kept");
    let mut out = vec![0.0f32; to_remove.len() * dim];
    let mut exists = vec![false; to_remove.len()];
    var.lookup_with_exists(&to_remove, &mut out, &mut exists)
        .unwrap();
    assert!(exists.iter().all(|&e| !e), "a removed key is present");

    let total = inserted.len() + kept.len();
    assert_eq!(var.size(), total, "size()");
    assert_eq!(
        var.shard_size(0).unwrap() + var.shard_size(1).unwrap(),
        total
    );
    let (keys, _) = var.export().unwrap();
    assert_eq!(keys.len(), total, "export row count");
    let mut sorted = keys;
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), total, "export returned a key twice");
}

// ---------------------------------------------------------------- (4) mixed ops

#[test]
fn mixed_operations_keep_exact_per_thread_state() {
    let dim = 8;
    let shared_n = 256i64;
    let shared_base = -1_000_000i64;
    let iterations = 2_500usize;
    let frontier_step = 20usize;
    let var = Variable::<i64>::builder("mixed")
        .dim(dim)
        .shards(3)
        .init_size(1)
        .build()
        .unwrap();
    let shared_accums = AtomicU64::new(0);
    // Thread t owns keys k with k % THREADS == t (k >= 0).
    let own_key = |t: usize, j: usize| (j * THREADS + t) as i64;
    let is_shared = |k: i64| (shared_base..shared_base + shared_n).contains(&k);

    let models: Vec<HashMap<i64, Vec<f32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let var = var.clone();
                let shared_accums = &shared_accums;
                s.spawn(move || {
                    let mut rng = Rng::new(7 + t as u64);
                    let mut model: HashMap<i64, Vec<f32>> = HashMap::new();
                    let mut frontier = 0usize;
                    let check_own =
                        |model: &HashMap<i64, Vec<f32>>, what: &str, keys: &[i64], out: &[f32]| {
                            for (j, &k) in keys.iter().enumerate() {
                                let row = &out[j * dim..(j + 1) * dim];
                                if is_shared(k) {
                                    assert_uniform(what, k, row);
                                    assert!(
                                        row[0] >= 0.0 && row[0].fract() == 0.0,
                                        "{what}: shared {k}: {row:?}"
                                    );
                                } else {
                                    let want = model.get(&k).map_or(&[0.0f32; 8][..], |r| &r[..]);
                                    assert_eq!(row, want, "{what}: thread {t} own key {k}");
                                }
                            }
                        };
                    for it in 0..iterations {
                        // Grow: new own keys every iteration.
                        let fresh: Vec<i64> = (frontier..frontier + frontier_step)
                            .map(|j| own_key(t, j))
                            .collect();
                        frontier += frontier_step;
                        let mut out = vec![0.0f32; fresh.len() * dim];
                        var.lookup_or_insert(&fresh, &mut out).unwrap();
                        for &k in &fresh {
                            model.insert(k, vec![0.0; dim]);
                        }
                        check_own(&model, "lookup_or_insert fresh", &fresh, &out);

                        // A batch of old own keys (hits and removed ones),
                        // shared keys and duplicates.
                        let mut keys: Vec<i64> =
                            (0..24).map(|_| own_key(t, rng.below(frontier))).collect();
                        for _ in 0..8 {
                            keys.push(shared_base + rng.below(shared_n as usize) as i64);
                        }
                        let dup = keys[rng.below(keys.len())];
                        keys.push(dup);
                        let m = keys.len();
                        let mut out = vec![0.0f32; m * dim];
                        let mut exists = vec![false; m];
                        match it % 5 {
                            0 => {
                                var.lookup_or_insert(&keys, &mut out).unwrap();
                                for &k in &keys {
                                    if !is_shared(k) {
                                        model.entry(k).or_insert_with(|| vec![0.0; dim]);
                                    }
                                }
                                check_own(&model, "lookup_or_insert", &keys, &out);
                            }
                            1 | 2 => {
                                var.lookup_with_exists(&keys, &mut out, &mut exists)
                                    .unwrap();
                                check_own(&model, "lookup_with_exists", &keys, &out);
                                for (j, &k) in keys.iter().enumerate() {
                                    if !is_shared(k) {
                                        assert_eq!(
                                            exists[j],
                                            model.contains_key(&k),
                                            "exists of own key {k}"
                                        );
                                    }
                                }
                                // Own keys: varying integer deltas; shared: +1.
                                let deltas: Vec<f32> = keys
                                    .iter()
                                    .flat_map(|&k| {
                                        let d = if is_shared(k) {
                                            1.0
                                        } else {
                                            (rng.below(9) as f32) - 4.0
                                        };
                                        std::iter::repeat_n(d, dim)
                                    })
                                    .collect();
                                var.accum(&keys, &deltas, &exists).unwrap();
                                let shared_count = keys.iter().filter(|&&k| is_shared(k)).count();
                                shared_accums.fetch_add(shared_count as u64, Ordering::Relaxed);
                                // Flags of own keys are exact, so the model is too.
                                let before: Vec<bool> =
                                    keys.iter().map(|k| model.contains_key(k)).collect();
                                for (j, &k) in keys.iter().enumerate() {
                                    if is_shared(k) {
                                        continue;
                                    }
                                    let d = &deltas[j * dim..(j + 1) * dim];
                                    if before[j] && exists[j] {
                                        let row = model.get_mut(&k).unwrap();
                                        for (x, y) in row.iter_mut().zip(d) {
                                            *x += y;
                                        }
                                    } else if !before[j] && !exists[j] {
                                        let row = model.entry(k).or_insert_with(|| vec![0.0; dim]);
                                        for (x, y) in row.iter_mut().zip(d) {
                                            *x += y;
                                        }
                                    }
                                }
                            }
                            3 => {
                                // Upsert own keys only (last duplicate wins).
                                let own: Vec<i64> =
                                    keys.iter().copied().filter(|&k| !is_shared(k)).collect();
                                let values: Vec<f32> = (0..own.len())
                                    .flat_map(|_| {
                                        let v = rng.below(100) as f32;
                                        std::iter::repeat_n(v, dim)
                                    })
                                    .collect();
                                var.upsert(&own, &values).unwrap();
                                for (j, &k) in own.iter().enumerate() {
                                    model.insert(k, values[j * dim..(j + 1) * dim].to_vec());
                                }
                            }
                            _ => {
                                // Remove some own and shared keys, then read them back.
                                let victims: Vec<i64> = keys.iter().copied().step_by(3).collect();
                                var.remove(&victims).unwrap();
                                for k in &victims {
                                    model.remove(k);
                                }
                                var.lookup(&keys, &mut out).unwrap();
                                check_own(&model, "lookup after remove", &keys, &out);
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    // Final consistency.
    let total_shared_adds = shared_accums.load(Ordering::Relaxed) as f32;
    let (keys, values) = var.export().unwrap();
    let mut exported: HashMap<i64, Vec<f32>> = HashMap::new();
    for (j, &k) in keys.iter().enumerate() {
        let prev = exported.insert(k, values[j * dim..(j + 1) * dim].to_vec());
        assert!(prev.is_none(), "export returned {k} twice");
    }
    let mut shared_present = 0usize;
    for (&k, row) in &exported {
        if is_shared(k) {
            shared_present += 1;
            assert_uniform("final shared row", k, row);
            assert!(
                row[0] >= 0.0 && row[0].fract() == 0.0 && row[0] <= total_shared_adds,
                "shared key {k}: {row:?} (total adds {total_shared_adds})"
            );
        } else {
            assert!(k >= 0, "unexpected key {k}");
            let t = k as usize % THREADS;
            assert_eq!(
                models[t].get(&k),
                Some(row),
                "key {k} of thread {t}: exported row vs model"
            );
        }
    }
    let own_total: usize = models.iter().map(|m| m.len()).sum();
    for (t, model) in models.iter().enumerate() {
        for (k, row) in model {
            assert_eq!(
                exported.get(k),
                Some(row),
                "thread {t} key {k} missing or wrong in export"
            );
        }
    }
    assert_eq!(var.size(), own_total + shared_present, "size()");
    assert_eq!(keys.len(), own_total + shared_present);
    let shard_sum: usize = (0..3).map(|s| var.shard_size(s).unwrap()).sum();
    assert_eq!(shard_sum, var.size());
    for s in 0..3 {
        let want = exported
            .keys()
            .filter(|k| k.rem_euclid(3) as usize == s)
            .count();
        assert_eq!(var.shard_size(s).unwrap(), want, "shard {s}");
    }
}

// ---------------------------------------------------------------- (5) update_rows + slots

#[test]
fn concurrent_update_rows_with_a_slot_sums_are_exact() {
    // Odd dim: the last packed word is half used, in the row and the slot.
    let dim = 9;
    let n = 60_000usize;
    let batch = 128usize;
    let passes = 2usize;
    let churn_n = 3_000i64;
    let churn_rounds = 12;
    let init = 3.0f32;
    let slot_init = 0.5f32;
    let var = Variable::<i64>::builder("update_rows")
        .dim(dim)
        .shards(2)
        .init_size(1)
        .initializer(Initializer::Constant(init))
        .build()
        .unwrap();
    let slot = var.create_slot("acc", slot_init).unwrap();
    // Stable keys are positive, churn keys negative: disjoint.
    let keys: Vec<i64> = (0..n as i64).map(|i| i * 7 + 1).collect();
    let churn: Vec<i64> = (1..=churn_n).map(|j| -j).collect();
    let updates_per_key = (THREADS * passes * 2) as f32;
    let done = AtomicBool::new(false);
    let writers_left = AtomicUsize::new(THREADS + 1);
    // Under the row lock, a row's value and slot were updated together:
    // value - init == (slot - slot_init) / 2, every element alike.
    let check_locked = |what: &str, key: i64, values: &[f32], slots: &[f32]| {
        assert_uniform(what, key, values);
        assert_uniform(what, key, slots);
        assert_eq!(
            values[0] - init,
            (slots[0] - slot_init) / 2.0,
            "{what}: key {key}: value {} and slot {} out of step",
            values[0],
            slots[0]
        );
    };

    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (var, keys, done, writers_left, check_locked) =
                (&var, &keys, &done, &writers_left, &check_locked);
            s.spawn(move || {
                let start = t * n / THREADS;
                for _ in 0..passes {
                    let mut pos = 0;
                    while pos < n {
                        let len = batch.min(n - pos);
                        // Each key twice in the batch: both updates must land.
                        let mut b: Vec<i64> =
                            (pos..pos + len).map(|i| keys[(start + i) % n]).collect();
                        let copy = b.clone();
                        b.extend(copy.iter().rev());
                        var.update_rows(&b, &[slot], |i, values, slots| {
                            check_locked("update_rows", b[i], values, slots);
                            for x in values.iter_mut() {
                                *x += 1.0;
                            }
                            for x in slots.iter_mut() {
                                *x += 2.0;
                            }
                        })
                        .unwrap();
                        pos += len;
                    }
                }
                if writers_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    done.store(true, Ordering::Release);
                }
            });
        }
        // Churn: every life of a churn key is one update_rows (which inserts
        // it, so it must see the initial row and slot, never a stale one
        // from a reused row id) and one remove.
        {
            let (var, churn, done, writers_left) = (&var, &churn, &done, &writers_left);
            s.spawn(move || {
                for _ in 0..churn_rounds {
                    for chunk in churn.chunks(97) {
                        var.update_rows(chunk, &[slot], |i, values, slots| {
                            assert!(
                                values.iter().all(|&x| x == init)
                                    && slots.iter().all(|&x| x == slot_init),
                                "churn key {} re-inserted with a stale row {values:?} / \
                                 slot {slots:?}",
                                chunk[i]
                            );
                            for x in values.iter_mut() {
                                *x += 1.0;
                            }
                            for x in slots.iter_mut() {
                                *x += 2.0;
                            }
                        })
                        .unwrap();
                    }
                    for chunk in churn.chunks(61) {
                        var.remove(chunk).unwrap();
                    }
                }
                if writers_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    done.store(true, Ordering::Release);
                }
            });
        }
        // Readers: lookup and lookup_slot of stable and churn keys.
        for r in 0..2u64 {
            let (var, keys, churn, done) = (&var, &keys, &churn, &done);
            s.spawn(move || {
                let mut rng = Rng::new(500 + r);
                let mut out = vec![0.0f32; 32 * dim];
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) || reads < 100 {
                    let b: Vec<i64> = (0..32)
                        .map(|j| {
                            if j % 4 == 0 {
                                churn[rng.below(churn.len())]
                            } else {
                                keys[rng.below(keys.len())]
                            }
                        })
                        .collect();
                    var.lookup(&b, &mut out).unwrap();
                    for (j, &k) in b.iter().enumerate() {
                        let row = &out[j * dim..(j + 1) * dim];
                        assert_uniform("lookup", k, row);
                        let updates = row[0] - init;
                        if k < 0 {
                            assert!(updates == 0.0 || updates == 1.0, "churn {k}: {row:?}");
                        } else {
                            assert!(
                                updates.fract() == 0.0
                                    && (0.0..=updates_per_key).contains(&updates),
                                "key {k}: {row:?}"
                            );
                        }
                    }
                    var.lookup_slot(slot, &b, &mut out).unwrap();
                    for (j, &k) in b.iter().enumerate() {
                        let row = &out[j * dim..(j + 1) * dim];
                        assert_uniform("lookup_slot", k, row);
                        let twice = row[0] - slot_init;
                        if k < 0 {
                            assert!(twice == 0.0 || twice == 2.0, "churn {k} slot: {row:?}");
                        } else {
                            assert!(
                                twice % 2.0 == 0.0
                                    && (0.0..=2.0 * updates_per_key).contains(&twice),
                                "key {k} slot: {row:?}"
                            );
                        }
                    }
                    reads += 1;
                }
            });
        }
        // Exporter.
        s.spawn(|| export_until_done(&var, &done));
    });

    assert_eq!(
        var.size(),
        n,
        "every churn key removed, every stable key present"
    );
    let want_value = init + updates_per_key;
    let want_slot = slot_init + 2.0 * updates_per_key;
    let mut out = vec![0.0f32; n * dim];
    let mut exists = vec![false; n];
    var.lookup_with_exists(&keys, &mut out, &mut exists)
        .unwrap();
    for i in 0..n {
        assert!(exists[i], "key {} lost", keys[i]);
        let row = &out[i * dim..(i + 1) * dim];
        assert!(
            row.iter().all(|&x| x == want_value),
            "key {}: {row:?}, want {want_value}",
            keys[i]
        );
    }
    var.lookup_slot(slot, &keys, &mut out).unwrap();
    for i in 0..n {
        let row = &out[i * dim..(i + 1) * dim];
        assert!(
            row.iter().all(|&x| x == want_slot),
            "key {} slot: {row:?}, want {want_slot}",
            keys[i]
        );
    }
    let mut out = vec![0.0f32; churn.len() * dim];
    let mut exists = vec![false; churn.len()];
    var.lookup_with_exists(&churn, &mut out, &mut exists)
        .unwrap();
    assert!(exists.iter().all(|&e| !e), "a churn key survived");
    var.lookup_slot(slot, &churn, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == slot_init));
    let (ek, ev) = var.export().unwrap();
    assert_eq!(ek.len(), n);
    assert!(ev.iter().all(|&x| x == want_value));
}

// ---------------------------------------------------------------- (6) restrict vs writers

#[test]
fn restrict_during_concurrent_updates_removes_exactly_the_coldest() {
    for policy in [RestrictPolicy::Frequency, RestrictPolicy::Timestamp] {
        restrict_race(policy);
    }
}

/// Cold keys in `groups` groups, group g written g + 1 times, groups in
/// order: under both policies every score of group g is below every score
/// of group g + 1 (Frequency: g + 1 writes; Timestamp: later batches). Hot
/// keys are written more often and last, and only hot keys are written
/// while `restrict` runs; their scores only grow. So the rows to remove are
/// exactly groups 0..removed_groups, whatever the interleaving.
fn restrict_race(policy: RestrictPolicy) {
    let dim = 4;
    let groups = 20usize;
    let group_size = 500usize;
    let hot_n = 1_000usize;
    let pre_writes = groups + 5;
    let kept_groups = 8usize;
    let writer_batches = 100usize;
    let var = Variable::<i64>::builder("restrict_race")
        .dim(dim)
        .shards(3)
        .init_size(1)
        .restrict_policy(policy)
        .build()
        .unwrap();
    let slot = var.create_slot("acc", 0.0).unwrap();
    let cold_key = |g: usize, j: usize| (g * group_size + j) as i64;
    let hot: Vec<i64> = (0..hot_n as i64).map(|j| -1 - j).collect();
    for g in 0..groups {
        let keys: Vec<i64> = (0..group_size).map(|j| cold_key(g, j)).collect();
        for _ in 0..=g {
            var.upsert(&keys, &vec![g as f32; group_size * dim])
                .unwrap();
        }
    }
    let bump = |_: usize, values: &mut [f32], slots: &mut [f32]| {
        assert_uniform("hot row", 0, values);
        assert_eq!(slots[0], 2.0 * values[0], "hot slot out of step");
        for x in values.iter_mut() {
            *x += 1.0;
        }
        for x in slots.iter_mut() {
            *x += 2.0;
        }
    };
    for _ in 0..pre_writes {
        var.update_rows(&hot, &[slot], bump).unwrap();
    }
    let total = groups * group_size + hot_n;
    assert_eq!(var.size(), total);
    let num_reserved = hot_n + kept_groups * group_size;
    let removed_groups = groups - kept_groups;

    let progress = AtomicUsize::new(0);
    let restricted = AtomicBool::new(false);
    let writers = 3usize;
    let writers_left = AtomicUsize::new(writers);
    let hot_updates: Vec<AtomicU64> = (0..hot_n).map(|_| AtomicU64::new(0)).collect();
    let removed = std::thread::scope(|s| {
        for w in 0..writers {
            let (var, hot, progress, hot_updates, restricted, writers_left) = (
                &var,
                &hot,
                &progress,
                &hot_updates,
                &restricted,
                &writers_left,
            );
            s.spawn(move || {
                let mut rng = Rng::new(900 + w as u64);
                // Keep writing until the restrict has finished, so that it
                // always runs between writes.
                let mut batches = 0;
                while batches < writer_batches || !restricted.load(Ordering::Acquire) {
                    batches += 1;
                    let idx: Vec<usize> = (0..64).map(|_| rng.below(hot_n)).collect();
                    let keys: Vec<i64> = idx.iter().map(|&j| hot[j]).collect();
                    var.update_rows(&keys, &[slot], bump).unwrap();
                    for &j in &idx {
                        hot_updates[j].fetch_add(1, Ordering::Relaxed);
                    }
                    progress.fetch_add(1, Ordering::Release);
                }
                writers_left.fetch_sub(1, Ordering::AcqRel);
            });
        }
        // Readers of the hot slots (never torn).
        {
            let (var, hot, writers_left) = (&var, &hot, &writers_left);
            s.spawn(move || {
                let mut out = vec![0.0f32; 16 * dim];
                let mut rng = Rng::new(77);
                let mut reads = 0;
                while writers_left.load(Ordering::Acquire) > 0 || reads < 100 {
                    let keys: Vec<i64> = (0..16).map(|_| hot[rng.below(hot_n)]).collect();
                    var.lookup_slot(slot, &keys, &mut out).unwrap();
                    for (j, &k) in keys.iter().enumerate() {
                        assert_uniform("hot slot", k, &out[j * dim..(j + 1) * dim]);
                    }
                    reads += 1;
                }
            });
        }
        let restricter = {
            let (var, progress, restricted) = (&var, &progress, &restricted);
            s.spawn(move || {
                // Start once the writers are under way (no timing involved:
                // the result must be the same whenever it runs).
                while progress.load(Ordering::Acquire) < writers {
                    std::thread::yield_now();
                }
                let removed = var.restrict(num_reserved, 0).unwrap();
                restricted.store(true, Ordering::Release);
                removed
            })
        };
        restricter.join().unwrap()
    });

    assert_eq!(
        removed,
        removed_groups * group_size,
        "{policy:?}: rows removed"
    );
    assert_eq!(var.size(), num_reserved, "{policy:?}: size after restrict");
    let (keys, _) = var.export().unwrap();
    let got: std::collections::HashSet<i64> = keys.into_iter().collect();
    assert_eq!(got.len(), num_reserved);
    for g in 0..groups {
        for j in 0..group_size {
            let k = cold_key(g, j);
            assert_eq!(
                got.contains(&k),
                g >= removed_groups,
                "{policy:?}: cold key {k} of group {g}"
            );
        }
    }
    // Every hot key kept, with every update.
    let mut out = vec![0.0f32; hot_n * dim];
    let mut slots = vec![0.0f32; hot_n * dim];
    var.lookup(&hot, &mut out).unwrap();
    var.lookup_slot(slot, &hot, &mut slots).unwrap();
    for (j, &k) in hot.iter().enumerate() {
        assert!(got.contains(&k), "{policy:?}: hot key {k} removed");
        let want = (pre_writes as u64 + hot_updates[j].load(Ordering::Relaxed)) as f32;
        assert!(
            out[j * dim..(j + 1) * dim].iter().all(|&x| x == want),
            "{policy:?}: hot key {k}: {:?}, want {want}",
            &out[j * dim..(j + 1) * dim]
        );
        assert!(slots[j * dim..(j + 1) * dim]
            .iter()
            .all(|&x| x == 2.0 * want));
    }
    // Removed keys' slots are gone.
    let gone: Vec<i64> = (0..group_size).map(|j| cold_key(0, j)).collect();
    let mut out = vec![1.0f32; gone.len() * dim];
    var.lookup_slot(slot, &gone, &mut out).unwrap();
    assert!(out.iter().all(|&x| x == 0.0));
}
