//! Criterion benches of the table ops, for regression tracking: dynemb and
//! two peers (dashmap, papaya) at 256Ki keys, dim 64.
//!
//! `cargo bench -p dynemb-benches --bench ops`. Lookup, upsert and
//! accumulate time one batch of uniformly random stored keys per iteration;
//! insert grows an empty table to every key, remove empties a full one,
//! export copies every row out. Throughput is in keys (rows for export).
//! The `compare` binary is the full comparison; this is the quick check.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use dynemb::Initializer;
use dynemb_benches::harness::batches;
use dynemb_benches::peers::{Spec, Store, System};
use dynemb_benches::workload::{Picks, Shape, Workload};
use std::hint::black_box;
use std::time::Duration;

const KEYS: usize = 1 << 18;
const DIM: usize = 64;
const BATCH: usize = 1 << 14;
const SYSTEMS: [System; 3] = [System::Dynemb, System::DashMap, System::Papaya];

fn workload() -> Workload {
    Workload::generate(Shape {
        keys: KEYS,
        dim: DIM,
        batch: BATCH,
        picks: 1 << 18,
        zipf_s: 1.1,
        seed: 7,
    })
}

fn build(system: System) -> Box<dyn Store> {
    system.build(&Spec {
        dim: DIM,
        initializer: Initializer::Constant(0.5),
        batch: BATCH,
        dense_rows: KEYS,
    })
}

/// Runs `f` on every batch of `picks`.
fn each_batch(picks: &Picks, mut f: impl FnMut(dynemb_benches::workload::Batch<'_>)) {
    for r in batches(0..picks.len(), BATCH) {
        f(picks.batch(r));
    }
}

fn full(system: System, w: &Workload) -> Box<dyn Store> {
    let store = build(system);
    each_batch(&w.keys, |b| store.insert(b, w.values_for(b.len())));
    store
}

fn ops(c: &mut Criterion) {
    let w = workload();
    let picks = &w.uniform;
    let starts: Vec<usize> = (0..picks.len() / BATCH).map(|i| i * BATCH).collect();
    for system in SYSTEMS {
        let name = system.name();
        let store = full(system, &w);
        let mut g = c.benchmark_group(format!("ops/{name}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));

        g.throughput(Throughput::Elements(BATCH as u64));
        let mut out = vec![0.0f32; BATCH * DIM];
        let mut next = starts.iter().cycle();
        g.bench_function("lookup", |b| {
            b.iter(|| {
                let s = *next.next().unwrap();
                store.lookup(picks.batch(s..s + BATCH), &mut out);
                black_box(&out);
            })
        });
        g.bench_function("upsert", |b| {
            b.iter(|| {
                let s = *next.next().unwrap();
                store.upsert(picks.batch(s..s + BATCH), &w.values);
            })
        });
        g.bench_function("accum", |b| {
            b.iter(|| {
                let s = *next.next().unwrap();
                store.accum(picks.batch(s..s + BATCH), &w.deltas);
            })
        });

        g.throughput(Throughput::Elements(KEYS as u64));
        g.bench_function("export", |b| {
            b.iter(|| {
                store.export(1 << 16, &mut |k, v| {
                    black_box((k, v));
                })
            })
        });
        drop(store);
        g.bench_function("insert", |b| {
            b.iter_batched(
                || build(system),
                |store| {
                    each_batch(&w.keys, |b| store.insert(b, w.values_for(b.len())));
                    store
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_function("remove", |b| {
            b.iter_batched(
                || full(system, &w),
                |store| {
                    each_batch(&w.removals, |b| store.remove(b));
                    store
                },
                BatchSize::PerIteration,
            )
        });
        g.finish();
    }
}

criterion_group!(benches, ops);
criterion_main!(benches);
