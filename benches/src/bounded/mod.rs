//! `compare --ops bounded`: a variable bounded by a capacity, evicting as
//! it trains, against moka and against exact LRU and LFU.
//!
//! # Training stream
//!
//! `ids` ids (default 100,000,000) drawn Zipf(1.1) over ranks
//! `1..=1e9`, each rank scrambled into a 64-bit id by a bijection
//! ([`stream`]), generated before any timer starts. Batches of `batch` ids
//! (default 4,096) go round-robin to `threads` threads (batch `b` to
//! thread `b % threads`), so the batches in flight at any moment are
//! neighbours in the stream, as in data-parallel training. Per batch:
//!
//! - **dynemb**: a `Variable<u64>` of dim `dim` (default 16), one shard,
//!   `capacity(capacity)` (default 4,000,000), restrict policy
//!   `Timestamp` (LRU by write) or `Frequency` (LFU: count of writes),
//!   constant initializer. `lookup_or_insert` of the batch, then one
//!   `SparseSgd::apply` of a fixed gradient batch (dedup, then one
//!   `update_rows` per distinct key: every id read is written, so a hit
//!   moves its row's score as training does; the insert of a new key is
//!   its first write).
//! - **moka**: `moka::sync::Cache<u64, Arc<[f32]>>` with `max_capacity`
//!   `capacity` (entries, no weigher; moka's TinyLFU admission and LRU
//!   eviction) and ahash, per id: `get`, copying the row out; on a miss,
//!   the initializer's row, `insert`ed. moka does no write-back, so it does
//!   less per id than dynemb's read and optimizer step.
//! - **exact LRU / LFU** ([`exact`]): the same batches in stream order on
//!   one thread, hit rates only (not timed).
//!
//! Figures: ids per second (every id of the stream over the wall time from
//! the first thread's start to the last one's end; the median of
//! `repeats` timed runs, each on an empty table: one run by default, a run
//! of 100M ids takes seconds to minutes), and the hit rate: the fraction of
//! ids whose read found the key, a key absent but repeated in its batch
//! counting as a hit from its second occurrence on (the first inserted
//! it). moka's hits are the `get`s that returned a row, counted in the
//! timed runs. dynemb's are counted in one more run per policy, untimed,
//! that reads each batch with `lookup_with_exists` just before its
//! `lookup_or_insert` (a read changes no score, so the run evicts by the
//! same scores as the timed ones); the same run counts inserts exactly (the table starts
//! empty and only eviction removes rows: `size()` plus
//! `lifecycle_stats().evicted`), and inserts beyond the read misses are
//! writes that found their key evicted between its batch's read and write
//! and inserted it again (reported as "writes re-inserting", a fraction of
//! ids). The timed runs' `1 - inserts / ids` is in the JSON
//! (`timed_hit_rates`). The ratios: dynemb / moka ids/s, dynemb's hit rate
//! minus moka's and minus the exact policy's of the same score
//! (percentage points). The header gives the stream's distinct ids: with
//! no eviction every id but the first of each would hit, the bound of
//! every hit rate.
//!
//! # Eviction quality
//!
//! HierarchicalKV's test ([`quality`]): capacity `C` (default 1,000,000;
//! `--quick`: 50,000),
//! `5C` distinct keys, key `k` written `r_k` times in a row (`r_k` uniform
//! in `1..=100`, seeded) by `upsert` in batches of `batch` writes, one
//! thread, once with `Frequency` and once with `Timestamp`. Then every kept
//! key is exported and the overlap `|kept ∩ ideal| / C` printed: the ideal
//! set is, for LFU, the keys whose `r_k` is at least the `C`-th largest
//! `r_k` (ties all count), for LRU the last `C` keys written.

pub mod cost;
pub mod exact;
pub mod moka;
pub mod quality;
pub mod stream;

use crate::apply::sgd;
use crate::harness::{median, release_free_memory, CpuClock};
use crate::report::markdown_table;
use crate::suite::{Progress, CONSTANT};
use dynemb::{RestrictPolicy, Variable};
use dynemb_optim::{SparseOptimizer, SparseSgd};
use exact::ExactPolicy;
use quality::QualityRow;
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Ranks the stream's ids are drawn from.
pub const UNIVERSE: u64 = 1_000_000_000;
/// Exponent of the stream's Zipf distribution.
pub const ZIPF_S: f64 = 1.1;
/// Seed of the stream and of the quality test's repeat counts.
const SEED: u64 = 0x0B0D_EDCA_FE00;

/// What the bounded group runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BoundedShape {
    /// Ids in the training stream.
    pub ids: usize,
    /// Rows the bounded tables hold.
    pub capacity: usize,
    /// Ids per batch (and writes per `upsert` of the quality test).
    pub batch: usize,
    /// Values per row.
    pub dim: usize,
    /// Threads running the stream.
    pub threads: usize,
    /// Timed runs of the stream per system (the median is reported).
    pub repeats: usize,
    /// Capacity of the eviction quality test (it writes 5 times as many
    /// keys).
    pub quality_capacity: usize,
    /// Whether the training stream and the eviction quality test run.
    pub stream: bool,
    /// Keys of the cost below capacity ([`cost`]); 0 skips it.
    pub cost_keys: usize,
    /// Which of [`cost::VARIANTS`] the cost below capacity runs.
    pub cost_variants: [bool; cost::VARIANTS.len()],
}

impl BoundedShape {
    /// The default shape: 100M ids into 4M rows (`quick`: 2M into 100k,
    /// quality test at 50k), dim 16, batches of 4,096, 2 threads, one run;
    /// the cost below capacity over 4M keys (`quick`: 200k), every variant.
    pub fn default_for(quick: bool) -> BoundedShape {
        BoundedShape {
            ids: if quick { 2_000_000 } else { 100_000_000 },
            capacity: if quick { 100_000 } else { 4_000_000 },
            batch: 4096,
            dim: 16,
            threads: 2,
            repeats: 1,
            quality_capacity: if quick { 50_000 } else { 1_000_000 },
            stream: true,
            cost_keys: if quick { 200_000 } else { 4_000_000 },
            cost_variants: [true; cost::VARIANTS.len()],
        }
    }
}

/// One system's runs of the training stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamRow {
    /// `dynemb`, `moka`, `exact`.
    pub system: String,
    /// Which eviction.
    pub policy: String,
    /// Median ids/s of the timed runs (`None`: not timed).
    pub per_second: Option<f64>,
    /// ids/s of every timed run.
    pub samples: Vec<f64>,
    /// Fraction of ids whose read found the key (dynemb: of the counted
    /// run; moka: median of the timed runs).
    pub hit_rate: f64,
    /// Fraction of ids whose write found the key evicted since its read
    /// and inserted it again (dynemb: of the counted run; moka, which
    /// does not write: `None`).
    pub write_reinserts: Option<f64>,
    /// Per timed run: dynemb, `1 - inserts / ids`; moka, the hit rate.
    pub timed_hit_rates: Vec<f64>,
    /// Rows evicted in the last run (moka: not counted, `None`).
    pub evicted: Option<u64>,
    /// Rows held at the end of the last run.
    pub size: u64,
    /// CPUs other processes kept busy during the timed runs, on average.
    pub other_cpus: Option<f64>,
}

/// Everything the bounded group measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoundedResults {
    /// The workload.
    pub shape: BoundedShape,
    /// Distinct ids in the stream: without eviction every id but the first
    /// of each would hit.
    pub distinct: u64,
    /// dynemb LRU, dynemb LFU, moka, exact LRU, exact LFU.
    pub stream: Vec<StreamRow>,
    /// The eviction quality test, LFU then LRU.
    pub quality: Vec<QualityRow>,
    /// The cost below capacity, by variant ([`cost::VARIANTS`]).
    pub cost: Vec<cost::CostRow>,
    /// Seconds the group took, generation included.
    pub seconds: f64,
}

impl BoundedResults {
    /// The row of `system` with `policy`.
    pub fn row(&self, system: &str, policy: &str) -> Option<&StreamRow> {
        self.stream
            .iter()
            .find(|r| r.system == system && r.policy == policy)
    }
}

/// The eviction of dynemb's `policy`, as the report names it.
pub fn policy_name(policy: RestrictPolicy) -> &'static str {
    match policy {
        RestrictPolicy::Timestamp => "LRU",
        RestrictPolicy::Frequency => "LFU",
    }
}

/// moka's eviction, as the report names it.
pub const MOKA_POLICY: &str = "TinyLFU admission + LRU";

/// Runs the whole group.
///
/// # Panics
/// If `shape.capacity` is not larger than `shape.batch` (a batch's rows
/// must fit), or a table breaks its bound.
pub fn run(shape: BoundedShape, progress: &Progress) -> BoundedResults {
    let started = Instant::now();
    let (distinct, stream, quality) = if shape.stream {
        run_stream(shape, progress)
    } else {
        (0, Vec::new(), Vec::new())
    };
    let cost = if shape.cost_keys > 0 {
        progress.note(format_args!(
            "bounded: cost below capacity, {} keys, each feature on and off",
            shape.cost_keys
        ));
        cost::run(shape.cost_keys, &shape)
    } else {
        Vec::new()
    };
    BoundedResults {
        shape,
        distinct,
        stream,
        quality,
        cost,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// The training stream on every system, and the eviction quality test:
/// the stream's distinct ids, its rows, the quality rows.
fn run_stream(shape: BoundedShape, progress: &Progress) -> (u64, Vec<StreamRow>, Vec<QualityRow>) {
    assert!(
        shape.capacity > shape.batch,
        "capacity must exceed the batch"
    );
    progress.note(format_args!(
        "bounded: generating {} ids, Zipf({ZIPF_S}) over {UNIVERSE} ranks",
        shape.ids
    ));
    let ids = stream::zipf_ids(shape.ids, UNIVERSE, ZIPF_S, SEED);
    let mut rows = Vec::new();
    for policy in [RestrictPolicy::Timestamp, RestrictPolicy::Frequency] {
        let timed = repeat(shape, || run_dynemb(&ids, &shape, policy, false));
        release_free_memory();
        let counted = run_dynemb(&ids, &shape, policy, true);
        let n = shape.ids as f64;
        let hits = counted.hits.expect("a counted run counts hits");
        let inserts = counted.inserts.expect("dynemb counts inserts");
        let read_misses = shape.ids as u64 - hits;
        let row = StreamRow {
            system: "dynemb".into(),
            policy: policy_name(policy).into(),
            hit_rate: hits as f64 / n,
            write_reinserts: Some(inserts.saturating_sub(read_misses) as f64 / n),
            ..timed
        };
        progress.note(format_args!(
            "bounded: dynemb {}: {:.2} M ids/s, hit rate {:.2}%, writes re-inserting {:.2}%",
            row.policy,
            row.per_second.unwrap_or(f64::NAN) / 1e6,
            row.hit_rate * 100.0,
            row.write_reinserts.unwrap_or(f64::NAN) * 100.0
        ));
        rows.push(row);
    }
    let row = repeat(shape, || moka::run(&ids, &shape));
    progress.note(format_args!(
        "bounded: moka: {:.2} M ids/s, hit rate {:.2}%",
        row.per_second.unwrap_or(f64::NAN) / 1e6,
        row.hit_rate * 100.0
    ));
    rows.push(StreamRow {
        system: "moka".into(),
        policy: MOKA_POLICY.into(),
        ..row
    });
    release_free_memory();
    progress.note(format_args!("bounded: exact LRU and LFU (one thread each)"));
    let (lru, lfu) = std::thread::scope(|s| {
        let sim = |policy| {
            let ids = &ids;
            s.spawn(move || exact::simulate(policy, ids, shape.batch, shape.capacity))
        };
        let (lru, lfu) = (sim(ExactPolicy::Lru), sim(ExactPolicy::Lfu));
        (
            lru.join().expect("exact LRU"),
            lfu.join().expect("exact LFU"),
        )
    });
    for (name, cache) in [("LRU", lru), ("LFU", lfu)] {
        rows.push(StreamRow {
            system: "exact".into(),
            policy: name.into(),
            per_second: None,
            samples: Vec::new(),
            hit_rate: cache.hit_rate(),
            write_reinserts: Some(0.0),
            timed_hit_rates: Vec::new(),
            evicted: Some(cache.evicted()),
            size: cache.len() as u64,
            other_cpus: None,
        });
    }
    let distinct = distinct(&ids);
    drop(ids);
    release_free_memory();
    let mut quality = Vec::new();
    for policy in [RestrictPolicy::Frequency, RestrictPolicy::Timestamp] {
        progress.note(format_args!(
            "bounded: eviction quality, {}, capacity {}",
            policy_name(policy),
            shape.quality_capacity
        ));
        let q = quality::run(&shape, policy);
        progress.note(format_args!(
            "bounded: eviction quality, {}: overlap {:.2}%",
            policy_name(policy),
            q.overlap * 100.0
        ));
        quality.push(q);
        release_free_memory();
    }
    (distinct, rows, quality)
}

/// Distinct ids of `ids`.
fn distinct(ids: &[u64]) -> u64 {
    let mut seen = hashbrown::HashSet::with_hasher(crate::peers::hasher());
    for &id in ids {
        seen.insert(id);
    }
    seen.len() as u64
}

/// One run of the stream on one system.
#[derive(Debug, Clone, Copy)]
pub struct StreamRun {
    /// Wall time, s.
    pub seconds: f64,
    /// Ids whose read found the key, if the run counted them.
    pub hits: Option<u64>,
    /// Rows inserted, if the system tells.
    pub inserts: Option<u64>,
    /// Rows evicted, if the system counts them.
    pub evicted: Option<u64>,
    /// Rows held at the end.
    pub size: u64,
    /// CPU-seconds other processes used meanwhile.
    pub others_cpu_seconds: Option<f64>,
}

/// `shape.repeats` timed runs of `run` summarized (system and policy left
/// empty; the hit rate is the median of the runs' hit rates, or of `1 -
/// inserts / ids` where a run does not count hits).
fn repeat(shape: BoundedShape, mut run: impl FnMut() -> StreamRun) -> StreamRow {
    let runs: Vec<StreamRun> = (0..shape.repeats.max(1))
        .map(|_| {
            release_free_memory();
            run()
        })
        .collect();
    let ids = shape.ids as f64;
    let samples: Vec<f64> = runs.iter().map(|r| ids / r.seconds.max(1e-9)).collect();
    let hit_rates: Vec<f64> = runs
        .iter()
        .map(|r| match (r.hits, r.inserts) {
            (Some(hits), _) => hits as f64 / ids,
            (None, Some(inserts)) => 1.0 - inserts as f64 / ids,
            (None, None) => f64::NAN,
        })
        .collect();
    let last = runs.last().expect("at least one run");
    let wall: f64 = runs.iter().map(|r| r.seconds).sum();
    let others: Option<f64> = runs.iter().map(|r| r.others_cpu_seconds).sum();
    StreamRow {
        system: String::new(),
        policy: String::new(),
        per_second: Some(median(&samples)),
        samples,
        hit_rate: median(&hit_rates),
        write_reinserts: None,
        timed_hit_rates: hit_rates,
        evicted: last.evicted,
        size: last.size,
        other_cpus: others.map(|o| o / wall.max(1e-9)),
    }
}

/// The gradient rows of every optimizer step: small, so a row stays
/// finite over millions of steps.
pub(crate) fn grads(batch: usize, dim: usize) -> Vec<f32> {
    (0..batch * dim)
        .map(|j| ((j * 37) % 101) as f32 * 1e-4 - 5e-3)
        .collect()
}

/// The batches of `ids` thread `t` of `threads` runs: `t`, `t + threads`,
/// and so on.
pub(crate) fn batches_of(
    ids: &[u64],
    batch: usize,
    t: usize,
    threads: usize,
) -> impl Iterator<Item = &[u64]> {
    ids.chunks(batch).skip(t).step_by(threads.max(1))
}

/// One run of the stream on a fresh dynemb variable with `policy`. With
/// `count`, each batch is first read with `lookup_with_exists` to count
/// its hits (a key absent from the table but repeated in the batch is a
/// hit from its second occurrence on: the first inserts it); the timed
/// runs do not.
fn run_dynemb(ids: &[u64], s: &BoundedShape, policy: RestrictPolicy, count: bool) -> StreamRun {
    let var = Variable::<u64>::builder("bounded")
        .dim(s.dim)
        .capacity(s.capacity)
        .restrict_policy(policy)
        .initializer(CONSTANT)
        .build()
        .expect("valid variable settings");
    let opt = SparseSgd::new(sgd()).expect("valid hyperparameters");
    let grads = grads(s.batch, s.dim);
    let threads = s.threads.max(1);
    let hits = AtomicU64::new(0);
    let mut outs: Vec<Vec<f32>> = (0..threads).map(|_| vec![1.0; s.batch * s.dim]).collect();
    let (clock, start) = (CpuClock::now(), Instant::now());
    std::thread::scope(|scope| {
        for (t, out) in outs.iter_mut().enumerate() {
            let (var, opt, grads, hits) = (&var, &opt, &grads, &hits);
            scope.spawn(move || {
                let mut exists = vec![false; if count { s.batch } else { 0 }];
                let mut absent = hashbrown::HashSet::with_hasher(crate::peers::hasher());
                let mut mine = 0u64;
                for keys in batches_of(ids, s.batch, t, threads) {
                    let n = keys.len() * s.dim;
                    if count {
                        let exists = &mut exists[..keys.len()];
                        var.lookup_with_exists(keys, &mut out[..n], exists)
                            .expect("lookup_with_exists");
                        absent.clear();
                        for (&key, &present) in keys.iter().zip(exists.iter()) {
                            mine += u64::from(present || !absent.insert(key));
                        }
                    }
                    var.lookup_or_insert(keys, &mut out[..n])
                        .expect("lookup_or_insert");
                    opt.apply(var, keys, &grads[..n]).expect("apply");
                }
                std::hint::black_box(&out);
                hits.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    let others = clock.zip(CpuClock::now()).map(|(a, b)| b.others_since(&a));
    let size = var.size();
    assert!(
        size <= s.capacity,
        "size {size} over capacity {}",
        s.capacity
    );
    let evicted = var.lifecycle_stats().evicted;
    StreamRun {
        seconds,
        hits: count.then(|| hits.into_inner()),
        inserts: Some(size as u64 + evicted),
        evicted: Some(evicted),
        size: size as u64,
        others_cpu_seconds: others,
    }
}

/// `+1.23 pt`: a difference of two rates in percentage points.
fn points(d: f64) -> String {
    format!("{:+.2} pt", d * 100.0)
}

/// The Markdown section of the results.
pub fn render(r: &BoundedResults) -> String {
    let mut out = String::new();
    if !r.stream.is_empty() {
        render_stream(r, &mut out);
    }
    if !r.cost.is_empty() {
        out.push_str(&cost::render(&r.cost, r.shape.cost_keys, &r.shape));
    }
    let _ = writeln!(out, "\n({:.0} s in all)", r.seconds);
    out
}

/// The training stream's and the eviction quality's sections.
fn render_stream(r: &BoundedResults, out: &mut String) {
    let s = &r.shape;
    let _ = writeln!(
        out,
        "\n### bounded variable: training stream (dim {}, capacity {}, {} ids Zipf({ZIPF_S}) over \
         {UNIVERSE} ranks, batches of {}, {} threads; M ids/s, median of {} run(s); hit rate: \
         ids whose read found the key; {} distinct ids, so without eviction {:.2}%)\n",
        s.dim,
        s.capacity,
        s.ids,
        s.batch,
        s.threads,
        s.repeats,
        r.distinct,
        (1.0 - r.distinct as f64 / s.ids.max(1) as f64) * 100.0
    );
    let moka = r.row("moka", MOKA_POLICY);
    let header = [
        "system",
        "eviction",
        "M ids/s",
        "hit rate",
        "ids/s / moka",
        "hit rate - exact",
        "hit rate - moka",
        "writes re-inserting",
        "evicted",
        "other CPUs",
    ]
    .map(String::from);
    let mut rows = Vec::new();
    for row in &r.stream {
        let exact = (row.system != "exact")
            .then(|| r.row("exact", &row.policy))
            .flatten();
        let vs_moka = (row.system != "moka").then_some(moka).flatten();
        rows.push(vec![
            row.system.clone(),
            row.policy.clone(),
            row.per_second
                .map_or("-".into(), |v| format!("{:.2}", v / 1e6)),
            format!("{:.2}%", row.hit_rate * 100.0),
            row.per_second
                .zip(vs_moka.and_then(|m| m.per_second))
                .map_or("-".into(), |(a, b)| format!("{:.2}x", a / b)),
            exact.map_or("-".into(), |e| points(row.hit_rate - e.hit_rate)),
            vs_moka.map_or("-".into(), |m| points(row.hit_rate - m.hit_rate)),
            row.write_reinserts
                .map_or("-".into(), |r| format!("{:.2}%", r * 100.0)),
            row.evicted.map_or("-".into(), |e| e.to_string()),
            row.other_cpus.map_or("-".into(), |c| format!("{c:.2}")),
        ]);
    }
    out.push_str(&markdown_table(&header, &rows));
    if !r.quality.is_empty() {
        let _ = writeln!(
            out,
            "\n### bounded variable: eviction quality (capacity C, 5C keys, key k written r_k \
             times in a row, r_k uniform in 1..=100; upsert batches of {}, one thread; overlap: \
             kept keys in the ideal set / C)\n",
            s.batch
        );
        out.push_str(&quality::table(&r.quality));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_go_round_robin() {
        let ids: Vec<u64> = (0..10).collect();
        let t0: Vec<&[u64]> = batches_of(&ids, 3, 0, 2).collect();
        let t1: Vec<&[u64]> = batches_of(&ids, 3, 1, 2).collect();
        assert_eq!(t0, [&[0, 1, 2][..], &[6, 7, 8]]);
        assert_eq!(t1, [&[3, 4, 5][..], &[9]]);
    }

    #[test]
    fn a_small_group_runs_and_renders() {
        let shape = BoundedShape {
            ids: 200_000,
            capacity: 5_000,
            batch: 512,
            dim: 4,
            threads: 2,
            repeats: 1,
            quality_capacity: 2_000,
            stream: true,
            cost_keys: 2_000,
            cost_variants: [true; cost::VARIANTS.len()],
        };
        let r = run(shape, &Progress::new());
        assert_eq!(r.stream.len(), 5);
        for row in &r.stream {
            assert!(
                (0.0..1.0).contains(&row.hit_rate) && row.hit_rate > 0.2,
                "{row:?}"
            );
            assert!(row.size <= 5_000 + 100, "{row:?}");
        }
        let exact = r.row("exact", "LRU").unwrap();
        assert_eq!(exact.size, 5_000);
        let no_eviction = 1.0 - r.distinct as f64 / 200_000.0;
        assert!(r.stream.iter().all(|row| row.hit_rate <= no_eviction));
        assert_eq!(r.quality.len(), 2);
        let text = render(&r);
        assert!(text.contains("| dynemb | LRU "), "{text}");
        assert!(text.contains("| moka   | TinyLFU"), "{text}");
        assert!(text.contains("overlap"), "{text}");
        assert_eq!(r.cost.len(), cost::VARIANTS.len());
        assert!(text.contains("cost below capacity"), "{text}");
    }
}
