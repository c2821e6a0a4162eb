//! Which operations run on which system, in which order.
//!
//! For one configuration (a [`Workload`]) each system runs alone, one after
//! another; its tables are dropped and the allocator's free memory returned
//! to the OS before the next system starts. Per system:
//!
//! 1. **Grow and measure.** An empty table (constant initializer) is grown to
//!    all `keys` through its resizes (untimed, all threads); the process's
//!    RSS is read before and right after, and again "at rest" after phase 2
//!    (memory a table retired while growing, such as an old index, may be
//!    reclaimed only by later operations); a batch of hits and a batch of
//!    misses are checked against the expected rows.
//! 2. **Steady-state ops**, after one untimed warm-up round at the most
//!    threads (tables that finish a resize lazily, on later accesses, are
//!    measured settled, and every page has been touched), then for each
//!    thread count `repeats` rounds, each
//!    timing every op once over the same `picks` keys (so the ops of a round
//!    see the same machine noise): lookup hit (uniform, Zipf), lookup miss
//!    (constant initializer), upsert, accumulate. Then export, on one thread
//!    (dynemb's export is one stream). The median of the rounds is reported.
//! 3. **Destructive ops**, for each thread count, `destructive_repeats`
//!    rounds, each on a fresh table with the random normal initializer: time
//!    growing it from empty to `keys` (T threads inserting disjoint shares),
//!    then lookup misses (random normal rows; after one untimed pass, so the
//!    table has settled as in phase 2), then removing every key.
//!
//! 4. **Optimizer steps** (the `apply` ops, [`crate::apply`]): for each
//!    optimizer, a fresh table with the optimizer's slots, prefilled with
//!    every key, its first steps checked, one untimed warm-up round at the
//!    most threads, then for each thread count `repeats` rounds, each timing
//!    every selected step once (uniform and Zipf picks), and one more step
//!    checked; the table is dropped before the next optimizer's is built.
//!
//! A configuration runs only the phases of its ops: phases 1 and 2 need one
//! of phase 2's ops or export, phase 3 one of its own, phase 4 an `apply`
//! op (hashbrown+RwLock runs no `apply`). The dim sweep runs phases 1 and 2
//! with lookup hit, upsert and accumulate only; the dim-16 configuration
//! runs phase 4 only.

use crate::apply::{self, Optimizer};
use crate::checkpoint::{save_and_restore, CheckpointRow};
use crate::harness::{batches, rate, release_free_memory, rss_bytes, run_split, CpuClock};
use crate::peers::{Op, Spec, Store, System};
use crate::report::{Measurement, MemoryRow, ResizeRow, SystemRun};
use crate::resize::resize_under_load;
use crate::workload::{Picks, Shape, Workload};
use dynemb::Initializer;
use std::time::Instant;

/// The constant initializer of phase 1 and 2.
pub const CONSTANT: Initializer = Initializer::Constant(0.5);

/// The random initializer of phase 3.
pub const RANDOM_NORMAL: Initializer = Initializer::RandomNormal {
    mean: 0.0,
    stddev: 0.05,
    seed: 42,
};

/// Rows per chunk of an export.
pub const EXPORT_CHUNK_ROWS: usize = 1 << 16;

/// One configuration to run: a workload shape and what to time on it.
#[derive(Debug, Clone)]
pub struct Config {
    /// Keys, dim, batch, picks.
    pub shape: Shape,
    /// The ops to time.
    pub ops: Vec<Op>,
    /// Whether to measure a reader's latency while the table grows (the
    /// main configuration).
    pub resize: bool,
    /// Whether to measure dynemb's checkpoint save and restore (the main
    /// configuration).
    pub checkpoint: bool,
}

/// Everything the `compare` binary runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The configurations, the main one first.
    pub configs: Vec<Config>,
    /// Thread counts to run every op at.
    pub threads: Vec<usize>,
    /// Rounds of the steady-state ops (phase 2).
    pub repeats: usize,
    /// Rounds of the destructive ops (phase 3).
    pub destructive_repeats: usize,
    /// The systems, in run order.
    pub systems: Vec<System>,
    /// The Redis group's workload, if it runs (see [`crate::redis`]).
    pub redis: Option<crate::redis::RedisShape>,
    /// The bounded group's workload, if it runs (see [`crate::bounded`]).
    pub bounded: Option<crate::bounded::BoundedShape>,
}

/// Every figure measured by [`run`].
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// Throughput of each (config, op, threads, system).
    pub measurements: Vec<Measurement>,
    /// Memory after growing each system to each config's size.
    pub memory: Vec<MemoryRow>,
    /// Reader latency while each system grows.
    pub resize: Vec<ResizeRow>,
    /// dynemb's checkpoint save and restore.
    pub checkpoint: Vec<CheckpointRow>,
    /// Wall time of each system's run and the CPU other processes used
    /// meanwhile.
    pub runs: Vec<SystemRun>,
}

/// Progress lines on stderr, stamped with the time since the start.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
}

impl Progress {
    /// Starts the clock.
    pub fn new() -> Self {
        Progress {
            start: Instant::now(),
        }
    }

    /// Prints one progress line.
    pub fn note(&self, what: std::fmt::Arguments<'_>) {
        eprintln!("[{:>7.1}s] {what}", self.start.elapsed().as_secs_f64());
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs the whole plan.
pub fn run(plan: &Plan, progress: &Progress) -> Results {
    let mut results = Results::default();
    for config in &plan.configs {
        let s = config.shape;
        progress.note(format_args!(
            "generating {} keys at dim {} ({} picks per run)",
            s.keys, s.dim, s.picks
        ));
        let w = Workload::generate(s);
        for &system in &plan.systems {
            if !config.ops.iter().any(|&op| system.measures(op)) {
                continue;
            }
            let (clock, start) = (CpuClock::now(), Instant::now());
            run_system(plan, config, &w, system, progress, &mut results);
            let run = SystemRun::new(system, &s, start.elapsed(), clock, CpuClock::now());
            progress.note(format_args!(
                "{} dim {}: done in {:.1} s; other processes used {:.2} CPUs meanwhile",
                system.name(),
                s.dim,
                run.wall_seconds,
                run.others_cpus().unwrap_or(f64::NAN)
            ));
            results.runs.push(run);
        }
        if config.resize {
            for &system in plan.systems.iter().filter(|s| s.measures(Op::Insert)) {
                progress.note(format_args!("{}: resize under load", system.name()));
                release_free_memory();
                results.resize.push(resize_under_load(system, &w));
            }
        }
        if config.checkpoint && plan.systems.contains(&System::Dynemb) {
            for adam in [false, true] {
                let what = if adam {
                    " with Adam slots and scores"
                } else {
                    ""
                };
                progress.note(format_args!("dynemb: checkpoint save and restore{what}"));
                release_free_memory();
                results.checkpoint.push(save_and_restore(&w, adam));
            }
        }
    }
    results
}

/// Per-thread buffers, allocated and touched before any timer starts.
struct Scratch {
    out: Vec<f32>,
}

fn scratch(threads: usize, w: &Workload) -> Vec<Scratch> {
    (0..threads)
        .map(|_| Scratch {
            out: vec![1.0; w.batch() * w.dim()],
        })
        .collect()
}

fn spec(w: &Workload, initializer: Initializer) -> Spec {
    Spec {
        dim: w.dim(),
        initializer,
        batch: w.batch(),
        dense_rows: w.shape.keys,
    }
}

/// The picks an op works on.
fn picks_of(op: Op, w: &Workload) -> &Picks {
    match op {
        Op::LookupHit | Op::Upsert | Op::Accum => &w.uniform,
        Op::LookupHitZipf => &w.zipf,
        Op::LookupMissConstant | Op::LookupMissNormal => &w.misses,
        Op::Insert => &w.keys,
        Op::Remove => &w.removals,
        Op::Export => unreachable!("export has no picks"),
        op => match op.optimizer() {
            Some((_, false)) => &w.uniform,
            Some((_, true)) => &w.zipf,
            None => unreachable!("every other op is matched above"),
        },
    }
}

/// Times `op` once over all its picks on `scratch.len()` threads; keys/s.
fn time_op(store: &dyn Store, op: Op, w: &Workload, scratch: &mut [Scratch]) -> f64 {
    let picks = picks_of(op, w);
    let (batch, dim) = (w.batch(), w.dim());
    let elapsed = run_split(scratch, picks.len(), batch, |s, share| {
        for range in batches(share, batch) {
            let b = picks.batch(range);
            match op {
                Op::LookupHit
                | Op::LookupHitZipf
                | Op::LookupMissConstant
                | Op::LookupMissNormal => store.lookup(b, &mut s.out[..b.len() * dim]),
                Op::Upsert => store.upsert(b, w.values_for(b.len())),
                Op::Accum => store.accum(b, w.deltas_for(b.len())),
                Op::Insert => store.insert(b, w.values_for(b.len())),
                Op::Remove => store.remove(b),
                Op::Export => unreachable!("export is timed by time_export"),
                _ => unreachable!("optimizer steps are timed by apply::time_apply"),
            }
        }
        std::hint::black_box(&s.out);
    });
    rate(picks.len(), elapsed)
}

/// Times one export of every row; rows/s.
fn time_export(store: &dyn Store) -> f64 {
    let start = Instant::now();
    let mut checksum = 0u64;
    let rows = store.export(EXPORT_CHUNK_ROWS, &mut |keys, values| {
        checksum = checksum
            .wrapping_add(keys[0])
            .wrapping_add(values.len() as u64);
        std::hint::black_box(values);
    });
    let elapsed = start.elapsed();
    std::hint::black_box(checksum);
    assert_eq!(
        rows,
        store.len(),
        "{}: export saw every row",
        store.system().name()
    );
    rate(rows, elapsed)
}

/// Collects samples per (op, threads) and records their medians.
struct Samples<'a> {
    config: &'a Config,
    system: System,
    by_op: Vec<(Op, usize, Vec<f64>)>,
}

impl Samples<'_> {
    fn push(&mut self, op: Op, threads: usize, sample: f64) {
        match self
            .by_op
            .iter_mut()
            .find(|(o, t, _)| *o == op && *t == threads)
        {
            Some((_, _, xs)) => xs.push(sample),
            None => self.by_op.push((op, threads, vec![sample])),
        }
    }

    fn record(self, results: &mut Results) {
        for (op, threads, samples) in self.by_op {
            results.measurements.push(Measurement::new(
                &self.config.shape,
                op,
                threads,
                self.system,
                samples,
            ));
        }
    }
}

/// Runs every phase of `config` that has ops on `system`, one after
/// another, and records the medians.
fn run_system(
    plan: &Plan,
    config: &Config,
    w: &Workload,
    system: System,
    progress: &Progress,
    results: &mut Results,
) {
    let mut samples = Samples {
        config,
        system,
        by_op: Vec::new(),
    };
    let table_ops = [
        Op::LookupHit,
        Op::LookupHitZipf,
        Op::LookupMissConstant,
        Op::Upsert,
        Op::Accum,
        Op::Export,
    ];
    if table_ops.iter().any(|op| config.ops.contains(op)) {
        run_tables(plan, config, w, system, progress, &mut samples, results);
    }
    run_destructive(plan, config, w, system, progress, &mut samples);
    if config
        .ops
        .iter()
        .any(|op| op.is_apply() && system.measures(*op))
    {
        run_apply(plan, config, w, system, progress, &mut samples);
    }
    samples.record(results);
    release_free_memory();
}

/// Phases 1 and 2: grow a table, measure its memory, time the steady-state
/// ops and export.
fn run_tables(
    plan: &Plan,
    config: &Config,
    w: &Workload,
    system: System,
    progress: &Progress,
    samples: &mut Samples<'_>,
    results: &mut Results,
) {
    let name = system.name();
    let dim = w.dim();
    let max_threads = plan.threads.iter().copied().max().unwrap_or(1);

    // Phase 1: grow to full size, measure memory, check rows.
    // Allocated before the first RSS reading and dropped after the last.
    let mut grow_scratch = scratch(max_threads, w);
    release_free_memory();
    let rss_before = rss_bytes();
    let store = system.build(&spec(w, CONSTANT));
    let start = Instant::now();
    time_op(store.as_ref(), Op::Insert, w, &mut grow_scratch);
    let grow_seconds = start.elapsed().as_secs_f64();
    let rss_grown = rss_bytes();
    progress.note(format_args!(
        "{name} dim {dim}: grew to {} keys in {grow_seconds:.1} s",
        w.shape.keys
    ));
    verify(store.as_ref(), w, &CONSTANT);

    // Phase 2: steady-state ops, each round timing every op once.
    let steady = [
        Op::LookupHit,
        Op::LookupHitZipf,
        Op::LookupMissConstant,
        Op::Upsert,
        Op::Accum,
    ];
    let steady: Vec<Op> = steady
        .into_iter()
        .filter(|op| config.ops.contains(op))
        .collect();
    for &op in &steady {
        if system.measures(op) {
            time_op(store.as_ref(), op, w, &mut grow_scratch);
        }
    }
    for &threads in &plan.threads {
        let mut scratch = scratch(threads, w);
        for _ in 0..plan.repeats {
            for &op in &steady {
                if system.measures(op) {
                    samples.push(op, threads, time_op(store.as_ref(), op, w, &mut scratch));
                }
            }
        }
    }
    if config.ops.contains(&Op::Export) && system.measures(Op::Export) {
        for _ in 0..plan.repeats {
            samples.push(Op::Export, 1, time_export(store.as_ref()));
        }
    }
    progress.note(format_args!("{name} dim {dim}: steady-state ops done"));
    release_free_memory();
    let rss_at_rest = rss_bytes();
    let growth = |after: Option<u64>| rss_before.zip(after).map(|(a, b)| b.saturating_sub(a));
    results.memory.push(MemoryRow::new(
        system,
        &config.shape,
        store.memory_bytes(),
        growth(rss_grown),
        growth(rss_at_rest),
        grow_seconds,
    ));
    drop((store, grow_scratch));
}

/// Phase 3: insert, lookup miss (random normal) and remove on fresh tables.
fn run_destructive(
    plan: &Plan,
    config: &Config,
    w: &Workload,
    system: System,
    progress: &Progress,
    samples: &mut Samples<'_>,
) {
    let name = system.name();
    let dim = w.dim();
    let destructive = [Op::Insert, Op::LookupMissNormal, Op::Remove];
    if destructive
        .iter()
        .any(|&op| config.ops.contains(&op) && system.measures(op))
    {
        for &threads in &plan.threads {
            let mut scratch = scratch(threads, w);
            for _ in 0..plan.destructive_repeats {
                release_free_memory();
                let store = system.build(&spec(w, RANDOM_NORMAL));
                for op in destructive {
                    if config.ops.contains(&op) && system.measures(op) {
                        if op == Op::LookupMissNormal {
                            // Untimed first pass: the table settles after
                            // its growth, as in phase 2.
                            time_op(store.as_ref(), op, w, &mut scratch);
                        }
                        samples.push(op, threads, time_op(store.as_ref(), op, w, &mut scratch));
                    }
                }
                if system.measures(Op::Remove) && config.ops.contains(&Op::Remove) {
                    assert_eq!(store.len(), 0, "{name}: remove left keys behind");
                }
            }
        }
        progress.note(format_args!(
            "{name} dim {dim}: insert / miss / remove done"
        ));
    }
}

/// Phase 4: the optimizer steps, one fresh table per optimizer.
fn run_apply(
    plan: &Plan,
    config: &Config,
    w: &Workload,
    system: System,
    progress: &Progress,
    samples: &mut Samples<'_>,
) {
    let name = system.name();
    let dim = w.dim();
    let max_threads = plan.threads.iter().copied().max().unwrap_or(1);
    for optimizer in Optimizer::ALL {
        let ops: Vec<Op> = [false, true]
            .into_iter()
            .map(|zipf| Op::apply(optimizer, zipf))
            .filter(|op| config.ops.contains(op))
            .collect();
        if ops.is_empty() {
            continue;
        }
        release_free_memory();
        let rss_before = rss_bytes();
        let Some(trainer) = system.trainer(optimizer, &spec(w, CONSTANT)) else {
            return;
        };
        let trainer = trainer.as_ref();
        let start = Instant::now();
        apply::prefill(trainer, w, max_threads);
        let prefill_seconds = start.elapsed().as_secs_f64();
        apply::check_first_steps(trainer, w);
        for &op in &ops {
            apply::time_apply(trainer, picks_of(op, w), w, max_threads);
        }
        let rss = rss_before
            .zip(rss_bytes())
            .map_or(f64::NAN, |(a, b)| b.saturating_sub(a) as f64 / 1e9);
        progress.note(format_args!(
            "{name} dim {dim} {}: prefilled in {prefill_seconds:.1} s, first steps checked, \
             warmed up; the table holds {rss:.2} GB of RSS",
            optimizer.name()
        ));
        for &threads in &plan.threads {
            for _ in 0..plan.repeats {
                for &op in &ops {
                    let rate = apply::time_apply(trainer, picks_of(op, w), w, threads);
                    samples.push(op, threads, rate);
                }
            }
        }
        apply::check_next_step(trainer, w);
        progress.note(format_args!(
            "{name} dim {dim} {}: steps timed and checked",
            optimizer.name()
        ));
    }
}

/// Checks a freshly grown table: a batch of hits reads the rows that were
/// inserted, a batch of misses reads the initializer's rows (both rounded to
/// the store's dtype).
///
/// # Panics
/// On any wrong value: an adapter returning wrong rows would make every
/// figure a lie.
fn verify(store: &dyn Store, w: &Workload, init: &Initializer) {
    let (batch, dim) = (w.batch(), w.dim());
    let dtype = store.dtype();
    let mut out = vec![0.0; batch * dim];
    let n = batch.min(w.uniform.len());
    store.lookup(w.uniform.batch(0..n), &mut out[..n * dim]);
    for (i, &r) in w.uniform.rows[..n].iter().enumerate() {
        // Key `r` was inserted as row `r % batch` of the value batch.
        let mut want = w.values[(r as usize % batch) * dim..][..dim].to_vec();
        dtype.round_slice(&mut want);
        assert_eq!(
            &out[i * dim..(i + 1) * dim],
            &want[..],
            "{}: hit row",
            store.system().name()
        );
    }
    let n = batch.min(w.misses.len());
    store.lookup(w.misses.batch(0..n), &mut out[..n * dim]);
    let mut want = vec![0.0; dim];
    for (i, &key) in w.misses.keys[..n].iter().enumerate() {
        init.fill(key, &mut want);
        dtype.round_slice(&mut want);
        assert_eq!(
            &out[i * dim..(i + 1) * dim],
            &want[..],
            "{}: miss row",
            store.system().name()
        );
    }
}
