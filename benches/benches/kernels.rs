//! Criterion benches of the row kernels and the group probe, each next to a
//! plain scalar version.
//!
//! `cargo bench -p dynemb-benches --bench kernels`:
//! - `copy`: `load_row` / `store_row` (rows of `AtomicU64` words, Relaxed)
//!   against `copy_from_slice` on plain `f32` rows;
//! - `axpy`: `axpy_row` (on a row) and `axpy` (on a slice) against a scalar
//!   `for` loop on plain rows;
//! - `probe`: `raw::probe::match_simd` against `match_scalar` over 4096
//!   random 16-slot groups.
//!
//! Rows are dim 64 (one 256-byte row: four cache lines), 4096 of them (1
//! MiB, cache-resident): the kernels' cost, not memory latency.

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use dynemb::raw::kernels::{axpy, axpy_row, load_row, store_row, words_for_dim};
use dynemb::raw::probe::{full_tag, match_scalar, match_simd};
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

const DIM: usize = 64;
const ROWS: usize = 4096;
const GROUPS: usize = 4096;

fn config<'c>(c: &'c mut Criterion, name: &str) -> BenchmarkGroup<'c, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g
}

fn atomic_rows() -> Vec<AtomicU64> {
    (0..ROWS * words_for_dim(DIM))
        .map(|i| AtomicU64::new((i as u64 % 1000) * 0x3F80_0000_0000_0000 / 1000))
        .collect()
}

fn plain_rows() -> Vec<f32> {
    (0..ROWS * DIM).map(|i| (i % 97) as f32 * 0.01).collect()
}

fn copy(c: &mut Criterion) {
    let words = words_for_dim(DIM);
    let rows = atomic_rows();
    let plain = plain_rows();
    let mut out = vec![0.0f32; DIM];
    let mut g = config(c, "copy");
    g.throughput(Throughput::Elements(ROWS as u64));
    g.bench_function("load_row", |b| {
        b.iter(|| {
            for r in rows.chunks_exact(words) {
                load_row(r, &mut out);
                black_box(&out);
            }
        })
    });
    g.bench_function("copy_from_slice (plain f32)", |b| {
        b.iter(|| {
            for r in plain.chunks_exact(DIM) {
                out.copy_from_slice(r);
                black_box(&out);
            }
        })
    });
    let src: Vec<f32> = (0..DIM).map(|i| i as f32).collect();
    g.bench_function("store_row", |b| {
        b.iter(|| {
            for r in rows.chunks_exact(words) {
                store_row(r, black_box(&src));
            }
        })
    });
    let mut plain = plain;
    g.bench_function("copy_from_slice into plain rows", |b| {
        b.iter(|| {
            for r in plain.chunks_exact_mut(DIM) {
                r.copy_from_slice(black_box(&src));
            }
            black_box(&plain);
        })
    });
    g.finish();
}

fn axpy_bench(c: &mut Criterion) {
    let words = words_for_dim(DIM);
    let rows = atomic_rows();
    let mut plain = plain_rows();
    let delta: Vec<f32> = (0..DIM).map(|i| (i % 7) as f32 * 1e-3).collect();
    let mut g = config(c, "axpy");
    g.throughput(Throughput::Elements(ROWS as u64));
    g.bench_function("axpy_row", |b| {
        b.iter(|| {
            for r in rows.chunks_exact(words) {
                axpy_row(r, 1.0, black_box(&delta));
            }
        })
    });
    g.bench_function("axpy (slice)", |b| {
        b.iter(|| {
            for r in plain.chunks_exact_mut(DIM) {
                axpy(r, 1.0, black_box(&delta));
            }
            black_box(&plain);
        })
    });
    g.bench_function("scalar loop (plain f32)", |b| {
        b.iter(|| {
            for r in plain.chunks_exact_mut(DIM) {
                for (x, d) in r.iter_mut().zip(black_box(&delta)) {
                    *x += d;
                }
            }
            black_box(&plain);
        })
    });
    g.finish();
}

fn probe(c: &mut Criterion) {
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(5);
    // Groups as the index holds them: mostly full slots with random hash
    // bits, some empty (tag 0).
    let groups: Vec<[u64; 2]> = (0..GROUPS)
        .map(|_| {
            let mut g = [0u64; 2];
            for slot in 0..16 {
                if rng.random_range(0..8) != 0 {
                    let tag = full_tag(rng.random::<u8>());
                    g[slot / 8] |= u64::from(tag) << (8 * (slot % 8));
                }
            }
            g
        })
        .collect();
    let hashes: Vec<u8> = (0..GROUPS).map(|_| rng.random::<u8>() & 0x3f).collect();
    let mut g = config(c, "probe");
    g.throughput(Throughput::Elements(GROUPS as u64));
    g.bench_function("match_simd", |b| {
        b.iter(|| {
            let mut acc = 0u32;
            for (group, &h) in groups.iter().zip(&hashes) {
                acc = acc.wrapping_add(u32::from(match_simd(black_box(*group), h)));
            }
            acc
        })
    });
    g.bench_function("match_scalar", |b| {
        b.iter(|| {
            let mut acc = 0u32;
            for (group, &h) in groups.iter().zip(&hashes) {
                acc = acc.wrapping_add(u32::from(match_scalar(black_box(*group), h)));
            }
            acc
        })
    });
    g.finish();
}

criterion_group!(benches, copy, axpy_bench, probe);
criterion_main!(benches);
