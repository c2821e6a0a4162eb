//! Every adapter agrees with a `HashMap` model: an adapter that returns
//! wrong rows would make the benchmark a lie.

use super::*;
use crate::workload::{Picks, Shape, Workload, NO_ROW};
use std::collections::HashMap;

const DIM: usize = 5;
const BATCH: usize = 7;

fn workload() -> Workload {
    Workload::generate(Shape {
        keys: 300,
        dim: DIM,
        batch: BATCH,
        picks: 200,
        zipf_s: 1.1,
        seed: 3,
    })
}

fn spec(initializer: Initializer) -> Spec {
    Spec {
        dim: DIM,
        initializer,
        batch: BATCH,
        dense_rows: 300,
    }
}

/// The model: key -> row, and the initializer for missing keys; rows as
/// the store keeps them, rounded to its dtype.
struct Model {
    rows: HashMap<u64, Vec<f32>>,
    init: Initializer,
    dtype: Dtype,
}

impl Model {
    /// Sets `key`'s row to `row`, rounded.
    fn set(&mut self, key: u64, row: &[f32]) {
        let mut row = row.to_vec();
        self.dtype.round_slice(&mut row);
        self.rows.insert(key, row);
    }

    fn lookup(&self, keys: &[u64]) -> Vec<f32> {
        let mut out = vec![0.0; keys.len() * DIM];
        for (i, k) in keys.iter().enumerate() {
            let dst = &mut out[i * DIM..(i + 1) * DIM];
            match self.rows.get(k) {
                Some(r) => dst.copy_from_slice(r),
                None => {
                    self.init.fill(*k, dst);
                    self.dtype.round_slice(dst);
                }
            }
        }
        out
    }
}

/// Runs `f` over `picks` in batches of `BATCH`.
fn batches(picks: &Picks, mut f: impl FnMut(Batch<'_>)) {
    for start in (0..picks.len()).step_by(BATCH) {
        f(picks.batch(start..(start + BATCH).min(picks.len())));
    }
}

/// Distinct values per batch, so a row copied from the wrong key shows.
fn values(seed: usize, keys: usize) -> Vec<f32> {
    (0..keys * DIM)
        .map(|j| ((seed * 31 + j) % 101) as f32 - 50.0)
        .collect()
}

fn lookup(store: &dyn Store, batch: Batch<'_>) -> Vec<f32> {
    let mut out = vec![f32::NAN; batch.len() * DIM];
    store.lookup(batch, &mut out);
    out
}

fn check_lookups(store: &dyn Store, model: &Model, picks: &Picks, what: &str) {
    batches(picks, |b| {
        assert_eq!(
            lookup(store, b),
            model.lookup(b.keys),
            "{} {what}",
            store.system().name()
        );
    });
}

fn exercise(system: System, init: Initializer) {
    let w = workload();
    let store = system.build(&spec(init.clone()));
    let store = store.as_ref();
    let dense = matches!(system, System::Dense | System::DenseIndirect);
    let mut model = Model {
        rows: HashMap::new(),
        init,
        dtype: store.dtype(),
    };

    // Insert the first 250 keys, batch by batch (the dense reference has a
    // row for every key: give it all 300).
    let inserted = if dense { 300 } else { 250 };
    let first = Picks {
        keys: w.keys.keys[..inserted].to_vec(),
        rows: w.keys.rows[..inserted].to_vec(),
    };
    let mut n = 0;
    batches(&first, |b| {
        let v = values(n, b.len());
        store.insert(b, &v);
        for (i, &k) in b.keys.iter().enumerate() {
            model.set(k, &v[i * DIM..(i + 1) * DIM]);
        }
        n += 1;
    });
    if !dense {
        assert_eq!(store.len(), 250, "{}", system.name());
    }
    check_lookups(store, &model, &w.uniform, "uniform hits");
    check_lookups(store, &model, &w.zipf, "zipf hits");
    check_lookups(store, &model, &w.misses, "misses");

    // Upsert overwrites present keys (and, for the tables, inserts absent
    // ones: the last 50 keys).
    let upserts = if dense {
        w.uniform.clone()
    } else {
        Picks {
            keys: [&w.uniform.keys[..100], &w.keys.keys[250..]].concat(),
            rows: [&w.uniform.rows[..100], &w.keys.rows[250..]].concat(),
        }
    };
    batches(&upserts, |b| {
        // Uniform picks repeat keys: apply per batch, last one wins.
        let v = values(n, b.len());
        store.upsert(b, &v);
        for (i, &k) in b.keys.iter().enumerate() {
            model.set(k, &v[i * DIM..(i + 1) * DIM]);
        }
        n += 1;
    });
    check_lookups(store, &model, &w.keys, "after upsert");

    // Accumulate: present keys add (repeats add twice), absent keys are
    // ignored (tables only: the dense reference has a row for every key).
    let mut accumulated = w.zipf.clone();
    if !dense {
        accumulated.keys.extend(&w.misses.keys[..20]);
        accumulated.rows.extend(&w.misses.rows[..20]);
    }
    batches(&accumulated, |b| {
        let d = values(n, b.len());
        store.accum(b, &d);
        let dtype = model.dtype;
        for (i, &k) in b.keys.iter().enumerate() {
            if let Some(r) = model.rows.get_mut(&k) {
                for (x, y) in r.iter_mut().zip(&d[i * DIM..(i + 1) * DIM]) {
                    *x = dtype.round(*x + y);
                }
            }
        }
        n += 1;
    });
    check_lookups(store, &model, &w.keys, "after accum");
    check_lookups(store, &model, &w.misses, "misses after accum");
    if dense {
        return;
    }
    assert_eq!(store.len(), 300);

    // Remove a shuffled half, plus some absent keys.
    let half = Picks {
        keys: [&w.removals.keys[..150], &w.misses.keys[..10]].concat(),
        rows: [&w.removals.rows[..150], &vec![NO_ROW; 10][..]].concat(),
    };
    batches(&half, |b| {
        store.remove(b);
        for k in b.keys {
            model.rows.remove(k);
        }
    });
    assert_eq!(store.len(), 150, "{}", system.name());
    check_lookups(store, &model, &w.keys, "after remove");

    // Export: every remaining key once, with its row, in chunks.
    let mut seen: HashMap<u64, Vec<f32>> = HashMap::new();
    let mut chunks = 0;
    let rows = store.export(16, &mut |keys, vals| {
        assert!(keys.len() <= 16 && vals.len() == keys.len() * DIM);
        chunks += 1;
        for (i, &k) in keys.iter().enumerate() {
            let old = seen.insert(k, vals[i * DIM..(i + 1) * DIM].to_vec());
            assert!(old.is_none(), "key {k} exported twice");
        }
    });
    assert_eq!(rows, 150);
    assert!(chunks >= 150 / 16);
    assert_eq!(seen, model.rows, "{} export", system.name());
}

#[test]
fn every_store_agrees_with_the_model() {
    for system in System::ALL {
        exercise(system, Initializer::Constant(0.25));
        exercise(
            system,
            Initializer::RandomNormal {
                mean: 0.0,
                stddev: 0.5,
                seed: 11,
            },
        );
    }
}

#[test]
fn concurrent_batches_do_not_tear_rows() {
    // Two threads upsert whole rows of one value while a third reads: every
    // row read must be uniform (all elements from one write).
    let w = workload();
    for system in System::ALL {
        let store = system.build(&spec(Initializer::Zeros));
        let store = store.as_ref();
        let keys = &w.keys;
        batches(keys, |b| store.insert(b, &vec![0.0; b.len() * DIM]));
        std::thread::scope(|s| {
            for t in 0..2 {
                s.spawn(move || {
                    for round in 0..50 {
                        let v = vec![(t * 1000 + round) as f32; 300 * DIM];
                        store.upsert(keys.batch(0..300), &v);
                    }
                });
            }
            s.spawn(move || {
                for _ in 0..50 {
                    let out = lookup(store, keys.batch(0..300));
                    if !matches!(system, System::Dense | System::DenseIndirect) {
                        for r in out.chunks(DIM) {
                            assert!(r.iter().all(|&x| x == r[0]), "{} torn {r:?}", system.name());
                        }
                    }
                }
            });
        });
    }
}

#[test]
fn names_round_trip() {
    for s in System::ALL {
        assert_eq!(System::from_name(s.name()), Some(s));
    }
    assert_eq!(
        System::from_name("hashbrown"),
        Some(System::HashbrownRwLock)
    );
    assert_eq!(System::from_name("nope"), None);
    assert_eq!(
        System::ALL.iter().filter(|s| s.is_peer()).count(),
        4,
        "four peers"
    );
}

/// The indirect dense reference's pipeline, over batches longer than its
/// distances (so its ring of keys in flight wraps) with missing keys among
/// the stored ones, reads what the dense reference reads.
#[test]
fn dense_indirect_reads_what_dense_reads() {
    let w = workload();
    let init = Initializer::Constant(0.5);
    let dense = System::Dense.build(&spec(init.clone()));
    let indirect = System::DenseIndirect.build(&spec(init));
    let all = w.keys.batch(0..w.keys.len());
    let v = values(1, all.len());
    dense.insert(all, &v);
    indirect.insert(all, &v);
    let mixed = Picks {
        keys: w
            .uniform
            .keys
            .iter()
            .zip(&w.misses.keys)
            .flat_map(|(&a, &b)| [a, a, b])
            .collect(),
        rows: w
            .uniform
            .rows
            .iter()
            .zip(&w.misses.rows)
            .flat_map(|(&a, &b)| [a, a, b])
            .collect(),
    };
    assert!(mixed.len() > 100 && mixed.rows.contains(&NO_ROW));
    for len in [1, 13, 25, 100, mixed.len()] {
        let b = mixed.batch(0..len);
        assert_eq!(
            lookup(indirect.as_ref(), b),
            lookup(dense.as_ref(), b),
            "{len} keys"
        );
    }
}
