//! Sanity figure for batched lookup: 1M uniformly random hits at dim 64
//! from a table of 8M random 64-bit keys, on 1 and 2 threads, next to a plain
//! `Vec<f32>` gather of the same rows by precomputed row index (no hashing at
//! all) with the same prefetching, measured in the same run.
//!
//! `cargo run --release -p dynemb --example lookup_throughput [-- KEYS]`
//!
//! The full benchmark suite (peers, more ops, criterion) is `dynemb-benches`.

use dynemb::raw::kernels::prefetch_span;
use dynemb::Variable;
use rand::{Rng, SeedableRng};
use std::time::Instant;

const DIM: usize = 64;
const LOOKUPS: usize = 1 << 20;
const BATCH: usize = 65_536;
const REPEATS: usize = 7;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs `work(range)` once over `LOOKUPS` split across `threads`; returns
/// keys/s.
fn keys_per_second(threads: usize, work: impl Fn(std::ops::Range<usize>) + Sync) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        let per = LOOKUPS / threads;
        for t in 0..threads {
            let work = &work;
            s.spawn(move || work(t * per..(t + 1) * per));
        }
    });
    LOOKUPS as f64 / start.elapsed().as_secs_f64()
}

fn main() -> dynemb::Result<()> {
    let keys_total: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("KEYS is a number"))
        .unwrap_or(8 << 20);
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
    let keys: Vec<u64> = (0..keys_total).map(|_| rng.random()).collect();
    let picks: Vec<usize> = (0..LOOKUPS)
        .map(|_| rng.random_range(0..keys_total))
        .collect();
    let pick_keys: Vec<u64> = picks.iter().map(|&i| keys[i]).collect();

    let emb = Variable::<u64>::builder("bench").dim(DIM).build()?;
    let fill_start = Instant::now();
    let mut row = vec![0.0f32; BATCH * DIM];
    for (b, chunk) in keys.chunks(BATCH).enumerate() {
        row[..chunk.len() * DIM].fill(b as f32);
        emb.upsert(chunk, &row[..chunk.len() * DIM])?;
    }
    println!(
        "filled {} keys at dim {DIM} in {:.1} s (through every resize from empty); {:.1} bytes/row",
        emb.size(),
        fill_start.elapsed().as_secs_f64(),
        emb.memory_bytes() as f64 / emb.size() as f64
    );
    let dense: Vec<f32> = (0..keys_total * DIM).map(|i| (i / DIM) as f32).collect();

    println!("threads  dynemb keys/s  dense gather keys/s  ratio (median of per-round ratios)");
    for threads in [1, 2] {
        let lookup = |range: std::ops::Range<usize>| {
            let mut out = vec![0.0f32; BATCH * DIM];
            for batch in pick_keys[range].chunks(BATCH) {
                emb.lookup(batch, &mut out[..batch.len() * DIM])
                    .expect("lookup");
            }
            std::hint::black_box(&out);
        };
        let gather = |range: std::ops::Range<usize>| {
            let mut out = vec![0.0f32; BATCH * DIM];
            for batch in picks[range].chunks(BATCH) {
                for (i, &row) in batch.iter().enumerate() {
                    if let Some(&ahead) = batch.get(i + 12) {
                        prefetch_span(dense[ahead * DIM..].as_ptr(), DIM * 4);
                    }
                    out[i * DIM..(i + 1) * DIM].copy_from_slice(&dense[row * DIM..(row + 1) * DIM]);
                }
            }
            std::hint::black_box(&out);
        };
        // Alternate the two so both see the same machine noise.
        let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..REPEATS {
            let a = keys_per_second(threads, lookup);
            let b = keys_per_second(threads, gather);
            ours.push(a);
            theirs.push(b);
            ratios.push(a / b);
        }
        println!(
            "{threads:>7}  {:>13.2}M  {:>18.2}M  {:.2}",
            median(ours) / 1e6,
            median(theirs) / 1e6,
            median(ratios)
        );
    }
    Ok(())
}
