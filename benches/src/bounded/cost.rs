//! What the lifecycle features cost below capacity: the same lookups and
//! inserts on a variable with each feature on and with it off.
//!
//! `keys` distinct keys (default 4,000,000; `--quick`: 200,000), scrambled
//! indices ([`super::stream::scramble`]), dim `dim`, batches of `batch`
//! round-robin to `threads` threads, constant initializer. One round per
//! variant builds an empty variable sized for every key (`init_size` and
//! `reserve` before the timer, so the inserts time the insert path, not
//! the index's growth or the system's first touch of the rows' pages) and
//! times, over every key:
//!
//! 1. **first read**: `lookup_or_insert` of each key once. Without
//!    admission it inserts every key; with `min_count` 2 it is the read that
//!    counts a key still pending (the initializer's row, nothing inserted).
//! 2. **insert**: `lookup_or_insert` of each key again, so every variant
//!    ends with every key a row. Without admission these are hits; with
//!    admission this is the read that admits and inserts. The insert the
//!    target compares is the off variant's first read against the
//!    admission variants' second.
//!
//! The two reads go a chunk of [`CHUNK`] keys at a time (first read of
//! the chunk, then its second), each figure the sum over the chunks, so
//! the keys pending at once stay below the exact counts' default bound
//! ([`dynemb::lifecycle::DEFAULT_PENDING_BOUND`]), as in a stream whose keys come back
//! soon.
//! 3. **lookup hit**: `lookup` of every key (never counted by admission),
//!    [`HIT_PASSES`] times.
//! 4. **training read hit**: `lookup_or_insert` of every key, all present,
//!    [`HIT_PASSES`] times.
//!
//! Variants: `off` (no restrict policy, no lifecycle feature); `timestamp`
//! (the Timestamp policy a capacity implies, nothing else); `capacity`
//! (capacity twice the keys, never reached, a listener counting rows);
//! `exact` and `sketch` (admission with `min_count` 2: exact counts, and a
//! count-min sketch of `2 * keys` counters by 4 rows). Rounds go variant
//! after variant, `repeats` times (at least 5), each round starting one
//! variant later, and each figure is the best round's: what the machine
//! does besides only slows a round, and the figures compare code paths
//! that differ by a few percent. The variants without admission run all
//! their rounds first: after a round of an admission variant, later rounds
//! of every variant in the process ran slower, their hits at times at half
//! speed (the machine's state, not the code: `timestamp` alone inserted as
//! fast as `off`, and 0.57x to 0.88x of its first round after `exact`).
//! Ratios compare a variant with `off`, and `capacity` also with
//! `timestamp`, the same variable but for the bound.

use super::BoundedShape;
use crate::harness::release_free_memory;
use crate::report::markdown_table;
use crate::suite::CONSTANT;
use dynemb::{Admission, RestrictPolicy, Variable, VariableBuilder};
use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Keys read twice in a row before the next ones.
pub const CHUNK: usize = 1 << 18;
/// Passes over every key of each hit figure (a pass alone is short).
pub const HIT_PASSES: usize = 4;

/// The variants, in report order.
pub const VARIANTS: [&str; 5] = ["off", "timestamp", "capacity", "exact", "sketch"];

/// One variant's figures, M keys/s (the best of the rounds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostRow {
    /// One of [`VARIANTS`].
    pub variant: String,
    /// The insert: the off, timestamp and capacity variants' first read,
    /// the admission variants' second.
    pub insert: f64,
    /// The admission variants' first read, counting pending keys (`None`
    /// for the others: their first read is the insert).
    pub pending_read: Option<f64>,
    /// `lookup` of present keys.
    pub lookup_hit: f64,
    /// `lookup_or_insert` of present keys.
    pub training_hit: f64,
    /// Rows at the end of the last round (every key).
    pub size: usize,
    /// Every round's M keys/s: first read, second read, lookup hit,
    /// training read hit.
    pub rounds: Vec<[f64; 4]>,
}

/// The builder of `variant` for `keys` keys.
fn builder(variant: &str, keys: usize, evicted: &Arc<AtomicU64>) -> VariableBuilder<u64> {
    let b = Variable::<u64>::builder("cost").initializer(CONSTANT);
    match variant {
        "off" => b,
        "timestamp" => b.restrict_policy(RestrictPolicy::Timestamp),
        "capacity" => {
            let evicted = Arc::clone(evicted);
            b.capacity(2 * keys).on_evict(move |rows| {
                evicted.fetch_add(rows.len() as u64, Ordering::Relaxed);
            })
        }
        "exact" => b.admission(Admission::Exact { min_count: 2 }),
        "sketch" => b.admission(Admission::Sketch {
            min_count: 2,
            width: 2 * keys,
            depth: 4,
        }),
        other => unreachable!("no variant {other}"),
    }
}

/// Seconds `threads` threads take to run `op` on every batch of `keys`,
/// batches round-robin.
fn timed(keys: &[u64], s: &BoundedShape, op: &(dyn Fn(&[u64], &mut [f32]) + Sync)) -> f64 {
    let threads = s.threads.max(1);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                let mut out = vec![0f32; s.batch * s.dim];
                for batch in super::batches_of(keys, s.batch, t, threads) {
                    op(batch, &mut out[..batch.len() * s.dim]);
                }
                std::hint::black_box(&out);
            });
        }
    });
    start.elapsed().as_secs_f64()
}

/// One round of `variant`: M keys/s of first read, second read, lookup hit
/// and training read hit, and the rows held at the end.
fn round(variant: &str, keys: &[u64], s: &BoundedShape) -> ([f64; 4], usize) {
    let evicted = Arc::new(AtomicU64::new(0));
    let var = builder(variant, keys.len(), &evicted)
        .dim(s.dim)
        .init_size(keys.len())
        .build()
        .expect("valid variable settings");
    var.reserve(keys.len());
    let read = |batch: &[u64], out: &mut [f32]| {
        var.lookup_or_insert(batch, out).expect("lookup_or_insert");
    };
    let lookup = |batch: &[u64], out: &mut [f32]| {
        var.lookup(batch, out).expect("lookup");
    };
    let (mut first, mut second) = (0.0, 0.0);
    for chunk in keys.chunks(CHUNK) {
        first += timed(chunk, s, &read);
        second += timed(chunk, s, &read);
    }
    let hits = |op: &(dyn Fn(&[u64], &mut [f32]) + Sync)| {
        (0..HIT_PASSES).map(|_| timed(keys, s, op)).sum::<f64>() / HIT_PASSES as f64
    };
    let seconds = [first, second, hits(&lookup), hits(&read)];
    let size = var.size();
    assert_eq!(size, keys.len(), "{variant}: every key is a row");
    assert_eq!(evicted.load(Ordering::Relaxed), 0, "{variant}: no eviction");
    (seconds.map(|t| keys.len() as f64 / t.max(1e-9) / 1e6), size)
}

/// Rounds per variant: `s.repeats`, at least 5.
fn rounds(s: &BoundedShape) -> usize {
    s.repeats.max(5)
}

/// Whether `variant` counts reads for admission.
fn admits(variant: &str) -> bool {
    matches!(variant, "exact" | "sketch")
}

/// Runs every variant `s.cost_variants` selects [`rounds`] times over
/// `keys` keys: every round of the variants without admission, then every
/// round of those with it (see the module docs), round `r` of a group
/// starting with its selected variant `r` (mod their number), so no
/// variant always runs first.
pub fn run(keys: usize, s: &BoundedShape) -> Vec<CostRow> {
    let ids: Vec<u64> = (0..keys as u64).map(super::stream::scramble).collect();
    let mut samples: Vec<Vec<[f64; 4]>> = vec![Vec::new(); VARIANTS.len()];
    let mut sizes = vec![0; VARIANTS.len()];
    for with_admission in [false, true] {
        let group: Vec<usize> = (0..VARIANTS.len())
            .filter(|&v| s.cost_variants[v] && admits(VARIANTS[v]) == with_admission)
            .collect();
        for r in 0..rounds(s) {
            for i in 0..group.len() {
                let v = group[(i + r) % group.len()];
                release_free_memory();
                let (figures, size) = round(VARIANTS[v], &ids, s);
                samples[v].push(figures);
                sizes[v] = size;
            }
        }
    }
    VARIANTS
        .iter()
        .zip(samples)
        .zip(sizes)
        .zip(s.cost_variants)
        .filter(|(_, selected)| *selected)
        .map(|(((variant, rounds), size), _)| {
            let best = |i: usize| rounds.iter().map(|r| r[i]).fold(0.0, f64::max);
            let admits = admits(variant);
            CostRow {
                variant: (*variant).into(),
                insert: if admits { best(1) } else { best(0) },
                pending_read: admits.then(|| best(0)),
                lookup_hit: best(2),
                training_hit: best(3),
                size,
                rounds,
            }
        })
        .collect()
}

/// `a / b` as `0.98x`.
fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}x", a / b)
}

/// The Markdown section of the figures.
pub fn render(rows: &[CostRow], keys: usize, s: &BoundedShape) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### bounded variable: cost below capacity ({keys} keys, dim {}, batches of {}, {} \
         threads; M keys/s, best of {} rounds; capacity: twice the keys, a listener; exact, \
         sketch: admission at the second read, whose insert is compared)\n",
        s.dim,
        s.batch,
        s.threads,
        rounds(s)
    );
    let header = [
        "variant",
        "insert",
        "/ off",
        "lookup hit",
        "/ off",
        "training read hit",
        "/ off",
        "pending read",
    ]
    .map(String::from);
    let off = rows.iter().find(|r| r.variant == "off");
    let vs = |f: fn(&CostRow) -> f64, r: &CostRow| off.map_or("-".into(), |o| ratio(f(r), f(o)));
    let mut table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.variant.clone(),
                format!("{:.2}", r.insert),
                vs(|r| r.insert, r),
                format!("{:.2}", r.lookup_hit),
                vs(|r| r.lookup_hit, r),
                format!("{:.2}", r.training_hit),
                vs(|r| r.training_hit, r),
                r.pending_read.map_or("-".into(), |p| format!("{p:.2}")),
            ]
        })
        .collect();
    let timestamp = rows.iter().find(|r| r.variant == "timestamp");
    if let (Some(cap), Some(ts)) = (rows.iter().find(|r| r.variant == "capacity"), timestamp) {
        table.push(vec![
            "capacity / timestamp".into(),
            ratio(cap.insert, ts.insert),
            "-".into(),
            ratio(cap.lookup_hit, ts.lookup_hit),
            "-".into(),
            ratio(cap.training_hit, ts.training_hit),
            "-".into(),
            "-".into(),
        ]);
    }
    out.push_str(&markdown_table(&header, &table));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_runs_and_holds_every_key() {
        let shape = BoundedShape {
            ids: 0,
            capacity: 0,
            batch: 256,
            dim: 4,
            threads: 2,
            repeats: 1,
            quality_capacity: 0,
            stream: false,
            cost_keys: 3_000,
            cost_variants: [true; VARIANTS.len()],
        };
        let rows = run(3_000, &shape);
        assert_eq!(rows.len(), VARIANTS.len());
        for r in &rows {
            assert_eq!(r.size, 3_000, "{r:?}");
            assert!(r.insert > 0.0 && r.lookup_hit > 0.0 && r.training_hit > 0.0);
            assert_eq!(
                r.pending_read.is_some(),
                r.variant == "exact" || r.variant == "sketch"
            );
        }
        let text = render(&rows, 3_000, &shape);
        assert!(text.contains("| capacity / timestamp"), "{text}");
    }

    #[test]
    fn only_the_selected_variants_run() {
        let mut shape = BoundedShape::default_for(true);
        shape.cost_keys = 2_000;
        shape.batch = 256;
        shape.cost_variants = [false, true, false, false, true];
        let rows = run(2_000, &shape);
        let ran: Vec<&str> = rows.iter().map(|r| r.variant.as_str()).collect();
        assert_eq!(ran, ["timestamp", "sketch"]);
        // No `off` to compare with: the ratios say so.
        let text = render(&rows, 2_000, &shape);
        assert!(text.contains("| timestamp |"), "{text}");
        assert!(!text.contains("| off"), "{text}");
    }
}
