//! Resize under load: how long a reader's batch takes while another thread
//! grows the table from empty to full size.
//!
//! A writer thread inserts every key of the workload, batch by batch, into
//! an empty table (so it passes through every resize) and publishes how many
//! it has inserted. Meanwhile a reader thread looks up batches of the same
//! size, half of them keys already inserted and half keys not inserted yet
//! (misses, which read the initializer's row), and times each batch. The
//! reader's keys are drawn before its timer starts.
//!
//! Reported: the median, 99th percentile and worst batch latency, worst /
//! median, and how many keys the writer had inserted when the worst batch
//! started (which resize it fell in). A table whose resize stops readers (a
//! lock held over a rehash) shows it in the worst batch; a reader that
//! completes only a few batches was starved by the writer.
//!
//! The reader and the writer take both CPUs of a 2-core machine: any other
//! process running meanwhile preempts one of them, so the row also says how
//! busy other processes kept the machine.

use crate::harness::{batches, CpuClock};
use crate::peers::{Spec, System};
use crate::report::ResizeRow;
use crate::suite::CONSTANT;
use crate::workload::{Batch, Workload, NO_ROW};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// Runs the reader and the writer on `system`; returns the reader's batch
/// latencies summarized.
pub fn resize_under_load(system: System, w: &Workload) -> ResizeRow {
    let (n, batch, dim) = (w.shape.keys, w.batch(), w.dim());
    let store = system.build(&Spec {
        dim,
        initializer: CONSTANT,
        batch,
        dense_rows: n,
    });
    let store = store.as_ref();
    let inserted = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let mut latencies_us = Vec::new();
    // Keys inserted when each reader batch started.
    let mut latency_at = Vec::new();
    let mut writer_seconds = 0.0;
    let clock = CpuClock::now();

    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let start = Instant::now();
            for range in batches(0..n, batch) {
                let (end, len) = (range.end, range.len());
                store.insert(w.keys.batch(range), w.values_for(len));
                inserted.store(end, Ordering::Release);
            }
            done.store(true, Ordering::Release);
            start.elapsed().as_secs_f64()
        });

        let mut rng = Pcg64Mcg::seed_from_u64(w.shape.seed ^ 0x5EED);
        let mut keys = vec![0u64; batch];
        let mut rows = vec![0u32; batch];
        let mut out = vec![1.0f32; batch * dim];
        while !done.load(Ordering::Acquire) {
            let have = inserted.load(Ordering::Acquire);
            for (i, (key, row)) in keys.iter_mut().zip(&mut rows).enumerate() {
                let present = (i % 2 == 0 && have > 0) || have == n;
                let at = if present {
                    rng.random_range(0..have)
                } else {
                    rng.random_range(have..n)
                };
                *key = w.keys.keys[at];
                *row = if present { at as u32 } else { NO_ROW };
            }
            latency_at.push(have);
            let start = Instant::now();
            store.lookup(
                Batch {
                    keys: &keys,
                    rows: &rows,
                },
                &mut out,
            );
            latencies_us.push(start.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(&out);
        }
        writer_seconds = writer.join().expect("writer thread");
    });

    let others = clock
        .zip(CpuClock::now())
        .map(|(a, b)| b.others_since(&a) / writer_seconds.max(1e-9));
    ResizeRow::new(
        system,
        &w.shape,
        &latencies_us,
        &latency_at,
        writer_seconds,
        others,
    )
}
