//! The figures of a run, as Markdown tables and as JSON.
//!
//! [`Report`] holds everything `compare` measured; [`Report::render`] prints
//! it as Markdown tables (keys/s in millions per system, with dynemb / best
//! peer, dynemb / dense, dynemb-bf16 / dense and dynemb / dense-indirect
//! for each op, each when its systems ran, all measured in the same run;
//! resize under load; checkpoints; memory), and `serde_json` writes the same
//! figures.

use crate::checkpoint::CheckpointRow;
use crate::harness::{median, quantile, CpuClock};
use crate::peers::{Op, System};
use crate::workload::Shape;
use serde::Serialize;
use std::fmt::Write as _;

/// The median throughput of one op on one system in one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// The system.
    pub system: System,
    /// The op.
    pub op: Op,
    /// Values per row.
    pub dim: usize,
    /// Keys in the table.
    pub keys: usize,
    /// Threads running the op.
    pub threads: usize,
    /// Median over the samples: keys/s (rows/s for export).
    pub per_second: f64,
    /// Every sample, in run order.
    pub samples: Vec<f64>,
}

impl Measurement {
    /// The median of `samples` for `op` on `system`.
    pub fn new(shape: &Shape, op: Op, threads: usize, system: System, samples: Vec<f64>) -> Self {
        Measurement {
            system,
            op,
            dim: shape.dim,
            keys: shape.keys,
            threads,
            per_second: median(&samples),
            samples,
        }
    }
}

/// Memory of one system after growing to a configuration's size.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// The system.
    pub system: System,
    /// Values per row.
    pub dim: usize,
    /// Keys in the table.
    pub keys: usize,
    /// The raw size of a row: an 8-byte key and `4 * dim` bytes of values.
    pub raw_bytes_per_row: f64,
    /// What the system reports holding, per key (dynemb's `memory_bytes`).
    pub reported_bytes_per_row: Option<f64>,
    /// Growth of the process's resident set from before the table was built
    /// to right after it grew, per key.
    pub rss_bytes_per_row: Option<f64>,
    /// The same growth measured later, after the steady-state ops ran (the
    /// table at rest: memory retired during growth has been reclaimed).
    pub rss_at_rest_bytes_per_row: Option<f64>,
    /// Wall time of the growth (untimed elsewhere; all threads).
    pub grow_seconds: f64,
}

impl MemoryRow {
    /// Per-row figures from totals.
    pub fn new(
        system: System,
        shape: &Shape,
        reported_bytes: Option<usize>,
        rss_delta_bytes: Option<u64>,
        rss_at_rest_delta_bytes: Option<u64>,
        grow_seconds: f64,
    ) -> Self {
        let keys = shape.keys as f64;
        MemoryRow {
            system,
            dim: shape.dim,
            keys: shape.keys,
            raw_bytes_per_row: 8.0 + 4.0 * shape.dim as f64,
            reported_bytes_per_row: reported_bytes.map(|b| b as f64 / keys),
            rss_bytes_per_row: rss_delta_bytes.map(|b| b as f64 / keys),
            rss_at_rest_bytes_per_row: rss_at_rest_delta_bytes.map(|b| b as f64 / keys),
            grow_seconds,
        }
    }
}

/// A reader's batch latency while a writer grew the table.
#[derive(Debug, Clone, Serialize)]
pub struct ResizeRow {
    /// The system.
    pub system: System,
    /// Values per row.
    pub dim: usize,
    /// Keys the writer inserted.
    pub keys: usize,
    /// Keys per batch (reader and writer).
    pub batch: usize,
    /// Reader batches timed.
    pub batches: usize,
    /// Median batch latency, µs.
    pub median_us: f64,
    /// 99th percentile batch latency, µs.
    pub p99_us: f64,
    /// Worst batch latency, µs.
    pub worst_us: f64,
    /// `worst_us / median_us`.
    pub worst_over_median: f64,
    /// How long the writer took to grow the table, s.
    pub writer_seconds: f64,
    /// CPUs other processes kept busy meanwhile, on average.
    pub other_cpus: Option<f64>,
    /// Keys the writer had inserted when the worst batch started.
    pub worst_at_keys: Option<usize>,
}

/// Fewer reader batches than this: the reader was starved, and its
/// worst / median says nothing.
pub const STARVED_BELOW_BATCHES: usize = 10;

impl ResizeRow {
    /// The summary of a reader's batch latencies `latencies_us`, batch `i`
    /// started when the writer had inserted `at_keys[i]` keys.
    pub fn new(
        system: System,
        shape: &Shape,
        latencies_us: &[f64],
        at_keys: &[usize],
        writer_seconds: f64,
        other_cpus: Option<f64>,
    ) -> Self {
        let worst = latencies_us
            .iter()
            .zip(at_keys)
            .max_by(|a, b| a.0.total_cmp(b.0));
        let worst_us = worst.map_or(f64::NAN, |(&us, _)| us);
        let median_us = median(latencies_us);
        ResizeRow {
            system,
            dim: shape.dim,
            keys: shape.keys,
            batch: shape.batch,
            batches: latencies_us.len(),
            median_us,
            p99_us: quantile(latencies_us, 0.99),
            worst_us,
            worst_over_median: worst_us / median_us,
            writer_seconds,
            other_cpus,
            worst_at_keys: worst.map(|(_, &at)| at),
        }
    }
}

/// One system's whole run on one configuration, and how busy other
/// processes kept the machine meanwhile (the noise in its figures).
#[derive(Debug, Clone, Serialize)]
pub struct SystemRun {
    /// The system.
    pub system: System,
    /// Values per row.
    pub dim: usize,
    /// Keys in the table.
    pub keys: usize,
    /// Wall time of the run, s.
    pub wall_seconds: f64,
    /// CPU-seconds other processes used meanwhile, if known.
    pub others_cpu_seconds: Option<f64>,
}

impl SystemRun {
    /// A run that took `wall`, between CPU clock readings `before` and
    /// `after`.
    pub fn new(
        system: System,
        shape: &Shape,
        wall: std::time::Duration,
        before: Option<CpuClock>,
        after: Option<CpuClock>,
    ) -> Self {
        SystemRun {
            system,
            dim: shape.dim,
            keys: shape.keys,
            wall_seconds: wall.as_secs_f64(),
            others_cpu_seconds: before.zip(after).map(|(a, b)| b.others_since(&a)),
        }
    }

    /// CPUs other processes kept busy, on average over the run.
    pub fn others_cpus(&self) -> Option<f64> {
        Some(self.others_cpu_seconds? / self.wall_seconds.max(1e-9))
    }
}

/// One configuration of the run (a table of ops per configuration).
#[derive(Debug, Clone, Serialize)]
pub struct ConfigInfo {
    /// Keys in the table.
    pub keys: usize,
    /// Values per row.
    pub dim: usize,
    /// Keys per batch.
    pub batch: usize,
    /// Keys per timed run of lookup, upsert and accumulate.
    pub picks: usize,
    /// Ops timed.
    pub ops: Vec<Op>,
}

/// The settings of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Configurations, the main one first.
    pub configs: Vec<ConfigInfo>,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Rounds of lookup, upsert, accumulate and export (the median is kept).
    pub repeats: usize,
    /// Rounds of insert, remove and lookup miss (random normal).
    pub destructive_repeats: usize,
    /// Systems, in run order.
    pub systems: Vec<System>,
    /// Whether `--quick` was given.
    pub quick: bool,
}

/// The machine the run was on.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// Available parallelism.
    pub cpus: usize,
    /// `/sys/kernel/mm/transparent_hugepage/enabled`, if readable.
    pub transparent_hugepage: Option<String>,
}

impl Environment {
    /// Reads this machine's.
    pub fn detect() -> Self {
        Environment {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            transparent_hugepage: std::fs::read_to_string(
                "/sys/kernel/mm/transparent_hugepage/enabled",
            )
            .ok()
            .map(|s| s.trim().to_owned()),
        }
    }
}

/// Everything `compare` measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What was run.
    pub settings: Settings,
    /// Where.
    pub environment: Environment,
    /// Throughputs.
    pub measurements: Vec<Measurement>,
    /// Memory per row.
    pub memory: Vec<MemoryRow>,
    /// Resize under load.
    pub resize: Vec<ResizeRow>,
    /// dynemb's checkpoint save and restore.
    pub checkpoint: Vec<CheckpointRow>,
    /// Each system's run time and the load other processes put on the
    /// machine meanwhile.
    pub runs: Vec<SystemRun>,
    /// The Redis group's figures (`--ops redis`), if it ran.
    pub redis: Option<crate::redis::RedisResults>,
    /// Why the Redis group did not complete, if it failed.
    pub redis_error: Option<String>,
    /// The bounded group's figures (`--ops bounded`), if it ran.
    pub bounded: Option<crate::bounded::BoundedResults>,
    /// Wall time of the whole run, s.
    pub wall_seconds: f64,
}

/// Looks figures up among measurements of one configuration.
#[derive(Debug, Clone, Copy)]
pub struct Figures<'a> {
    /// All measurements.
    pub measurements: &'a [Measurement],
    /// Values per row of the configuration.
    pub dim: usize,
    /// Keys of the configuration.
    pub keys: usize,
}

impl Figures<'_> {
    /// Median per second of `op` on `system` at `threads`.
    pub fn get(&self, system: System, op: Op, threads: usize) -> Option<f64> {
        self.measurements
            .iter()
            .find(|m| {
                m.system == system
                    && m.op == op
                    && m.threads == threads
                    && m.dim == self.dim
                    && m.keys == self.keys
            })
            .map(|m| m.per_second)
    }

    /// The fastest peer (dashmap, papaya, scc, hashbrown) at `op`.
    pub fn best_peer(&self, op: Op, threads: usize) -> Option<(System, f64)> {
        System::ALL
            .into_iter()
            .filter(|s| s.is_peer())
            .filter_map(|s| self.get(s, op, threads).map(|v| (s, v)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The best peer at `op`, and dynemb / that peer.
    pub fn vs_best_peer(&self, op: Op, threads: usize) -> Option<(System, f64)> {
        let ours = self.get(System::Dynemb, op, threads)?;
        let (peer, theirs) = self.best_peer(op, threads)?;
        Some((peer, ours / theirs))
    }

    /// dynemb / dense reference at `op`.
    pub fn vs_dense(&self, op: Op, threads: usize) -> Option<f64> {
        self.system_vs_dense(System::Dynemb, op, threads)
    }

    /// `system` / dense reference at `op`.
    pub fn system_vs_dense(&self, system: System, op: Op, threads: usize) -> Option<f64> {
        self.system_vs(system, System::Dense, op, threads)
    }

    /// `system` / `reference` at `op`.
    pub fn system_vs(
        &self,
        system: System,
        reference: System,
        op: Op,
        threads: usize,
    ) -> Option<f64> {
        Some(self.get(system, op, threads)? / self.get(reference, op, threads)?)
    }
}

impl Report {
    /// The figures of the configuration with `dim` and `keys`.
    pub fn figures(&self, dim: usize, keys: usize) -> Figures<'_> {
        Figures {
            measurements: &self.measurements,
            dim,
            keys,
        }
    }

    /// The report as Markdown.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let systems = &self.settings.systems;
        for c in &self.settings.configs {
            let _ = writeln!(
                s,
                "\n### dim {}, {} keys, batches of {}, {} keys per timed run \
                 (M keys/s, median of rounds; export: M rows/s; apply: keys of the \
                 batches, repeats counted)\n",
                c.dim, c.keys, c.batch, c.picks
            );
            s.push_str(&self.ops_table(c, systems));
        }
        if !self.resize.is_empty() {
            s.push_str("\n### resize under load (reader batch latency while a writer grows the table from empty)\n\n");
            s.push_str(&resize_table(&self.resize));
        }
        if !self.checkpoint.is_empty() {
            s.push_str(
                "\n### dynemb checkpoints (save to a new directory, restore into an empty \
                 variable; peak extra RSS of the save over the process with the table)\n\n",
            );
            s.push_str(&checkpoint_table(&self.checkpoint));
        }
        if !self.memory.is_empty() {
            s.push_str(
                "\n### memory after growing from empty (bytes per row; raw = 8 + 4 * dim; \
                 RSS grown: right after growing, at rest: after the steady-state ops)\n\n",
            );
            s.push_str(&memory_table(&self.memory));
        }
        if !self.runs.is_empty() {
            s.push_str(
                "\n### other processes during each system's run \
                 (CPUs they kept busy on average; 0 = quiet machine)\n\n",
            );
            s.push_str(&runs_table(&self.runs));
        }
        if let Some(redis) = &self.redis {
            s.push_str(&crate::redis::render(redis));
        }
        if let Some(error) = &self.redis_error {
            let _ = writeln!(s, "\n### dynemb-redis: not measured ({error})");
        }
        if let Some(bounded) = &self.bounded {
            s.push_str(&crate::bounded::render(bounded));
        }
        let _ = writeln!(
            s,
            "\n{} CPUs, transparent huge pages: {}; wall time {:.0} s",
            self.environment.cpus,
            self.environment
                .transparent_hugepage
                .as_deref()
                .unwrap_or("unknown"),
            self.wall_seconds
        );
        s
    }

    fn ops_table(&self, c: &ConfigInfo, systems: &[System]) -> String {
        let f = self.figures(c.dim, c.keys);
        let mut header = vec!["op".to_owned(), "threads".to_owned()];
        header.extend(systems.iter().map(|s| s.name().to_owned()));
        header.push("dynemb/best peer".into());
        header.push("dynemb/dense".into());
        let bf16 = systems.contains(&System::DynembBf16);
        if bf16 {
            header.push("dynemb-bf16/dense".into());
        }
        let indirect = systems.contains(&System::DenseIndirect);
        if indirect {
            header.push("dynemb/dense-indirect".into());
        }
        let mut rows = Vec::new();
        for op in Op::ALL.into_iter().filter(|op| c.ops.contains(op)) {
            let threads: &[usize] = if op == Op::Export {
                &[1]
            } else {
                &self.settings.threads
            };
            for &t in threads {
                let mut row = vec![op.name().to_owned(), t.to_string()];
                for &s in systems {
                    row.push(match f.get(s, op, t) {
                        Some(v) => format!("{:.2}", v / 1e6),
                        None if !s.measures(op) => "-".into(),
                        None => "n/a".into(),
                    });
                }
                row.push(
                    f.vs_best_peer(op, t)
                        .map_or("-".into(), |(peer, r)| format!("{r:.2}x {}", peer.name())),
                );
                row.push(ratio(f.vs_dense(op, t)));
                if bf16 {
                    row.push(ratio(f.system_vs_dense(System::DynembBf16, op, t)));
                }
                if indirect {
                    row.push(ratio(f.system_vs(
                        System::Dynemb,
                        System::DenseIndirect,
                        op,
                        t,
                    )));
                }
                rows.push(row);
            }
        }
        markdown_table(&header, &rows)
    }
}

/// `1.23x`, or `-` for no figure.
fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}x"))
}

fn checkpoint_table(rows: &[CheckpointRow]) -> String {
    let header = [
        "dim",
        "columns",
        "rows",
        "MB",
        "save M rows/s",
        "save MB/s",
        "restore M rows/s",
        "restore MB/s",
        "save peak extra RSS",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.dim.to_string(),
                match (r.slots, r.scores) {
                    (0, false) => "values".to_string(),
                    (slots, scores) => format!(
                        "values + {slots} slots{}",
                        if scores { " + scores" } else { "" }
                    ),
                },
                r.rows.to_string(),
                format!("{:.0}", r.bytes as f64 / 1e6),
                format!("{:.2}", r.save_rows_per_second() / 1e6),
                format!("{:.0}", r.save_mb_per_second()),
                format!("{:.2}", r.restore_rows_per_second() / 1e6),
                format!("{:.0}", r.restore_mb_per_second()),
                match (r.save_peak_extra_rss, r.save_extra_fraction()) {
                    (Some(bytes), Some(f)) => {
                        format!("{:.0} MB ({:.1}%)", bytes as f64 / 1e6, f * 100.0)
                    }
                    _ => "n/a".into(),
                },
            ]
        })
        .collect();
    markdown_table(&header, &rows)
}

fn resize_table(rows: &[ResizeRow]) -> String {
    let header = [
        "system",
        "dim",
        "keys",
        "batches",
        "median µs",
        "p99 µs",
        "worst µs",
        "worst/median",
        "worst at keys",
        "writer s",
        "other CPUs",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.system.name().into(),
                r.dim.to_string(),
                r.keys.to_string(),
                r.batches.to_string(),
                format!("{:.0}", r.median_us),
                format!("{:.0}", r.p99_us),
                format!("{:.0}", r.worst_us),
                if r.batches < STARVED_BELOW_BATCHES {
                    "n/a (starved)".into()
                } else {
                    format!("{:.1}x", r.worst_over_median)
                },
                r.worst_at_keys.map_or("-".into(), |k| k.to_string()),
                format!("{:.2}", r.writer_seconds),
                r.other_cpus.map_or("n/a".into(), |c| format!("{c:.2}")),
            ]
        })
        .collect();
    markdown_table(&header, &rows)
}

fn runs_table(runs: &[SystemRun]) -> String {
    let header = ["system", "dim", "keys", "wall s", "other CPUs"].map(String::from);
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.system.name().into(),
                r.dim.to_string(),
                r.keys.to_string(),
                format!("{:.1}", r.wall_seconds),
                r.others_cpus().map_or("n/a".into(), |c| format!("{c:.2}")),
            ]
        })
        .collect();
    markdown_table(&header, &rows)
}

fn memory_table(rows: &[MemoryRow]) -> String {
    let header = [
        "system",
        "dim",
        "keys",
        "raw",
        "reported",
        "reported/raw",
        "RSS grown",
        "RSS grown/raw",
        "RSS at rest",
        "RSS at rest/raw",
        "grow s",
    ]
    .map(String::from);
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".into(), f);
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let raw = r.raw_bytes_per_row;
            vec![
                r.system.name().into(),
                r.dim.to_string(),
                r.keys.to_string(),
                format!("{raw:.0}"),
                opt(r.reported_bytes_per_row, &|v| format!("{v:.1}")),
                opt(r.reported_bytes_per_row, &|v| format!("{:.2}x", v / raw)),
                opt(r.rss_bytes_per_row, &|v| format!("{v:.1}")),
                opt(r.rss_bytes_per_row, &|v| format!("{:.2}x", v / raw)),
                opt(r.rss_at_rest_bytes_per_row, &|v| format!("{v:.1}")),
                opt(r.rss_at_rest_bytes_per_row, &|v| format!("{:.2}x", v / raw)),
                format!("{:.2}", r.grow_seconds),
            ]
        })
        .collect();
    markdown_table(&header, &rows)
}

/// A Markdown table with columns padded to their widest cell (text left,
/// everything else right-aligned).
pub fn markdown_table(header: &[String], rows: &[Vec<String>]) -> String {
    let width = |c: usize| {
        rows.iter()
            .filter_map(|r| r.get(c))
            .chain(std::iter::once(&header[c]))
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let numeric = |c: usize| {
        rows.iter().all(|r| {
            r.get(c).is_none_or(|s| {
                s.starts_with(|ch: char| ch.is_ascii_digit() || ch == '-' || ch == 'n')
            })
        })
    };
    let line = |cells: &[String]| {
        let mut l = String::from("|");
        for (c, w) in widths.iter().enumerate() {
            let cell = cells.get(c).map_or("", String::as_str);
            let pad = w - cell.chars().count();
            if c > 0 && numeric(c) {
                let _ = write!(l, " {}{cell} |", " ".repeat(pad));
            } else {
                let _ = write!(l, " {cell}{} |", " ".repeat(pad));
            }
        }
        l.push('\n');
        l
    };
    let mut s = line(header);
    s.push('|');
    for (c, w) in widths.iter().enumerate() {
        let dashes = "-".repeat(*w);
        if c > 0 && numeric(c) {
            let _ = write!(s, "-{dashes}:|");
        } else {
            let _ = write!(s, "-{dashes}-|");
        }
    }
    s.push('\n');
    for r in rows {
        s.push_str(&line(r));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            keys: 1000,
            dim: 8,
            batch: 100,
            picks: 500,
            zipf_s: 1.1,
            seed: 1,
        }
    }

    fn m(system: System, op: Op, threads: usize, v: f64) -> Measurement {
        Measurement::new(&shape(), op, threads, system, vec![v, v * 2.0, v / 2.0])
    }

    fn report() -> Report {
        let measurements = vec![
            m(System::Dynemb, Op::LookupHit, 1, 8e6),
            m(System::DashMap, Op::LookupHit, 1, 2e6),
            m(System::Papaya, Op::LookupHit, 1, 4e6),
            m(System::Dense, Op::LookupHit, 1, 16e6),
            m(System::Dynemb, Op::Insert, 1, 3e6),
            m(System::DashMap, Op::Insert, 1, 1e6),
        ];
        Report {
            settings: Settings {
                configs: vec![ConfigInfo {
                    keys: 1000,
                    dim: 8,
                    batch: 100,
                    picks: 500,
                    ops: vec![Op::LookupHit, Op::Insert],
                }],
                threads: vec![1],
                repeats: 3,
                destructive_repeats: 1,
                systems: vec![
                    System::Dynemb,
                    System::DashMap,
                    System::Papaya,
                    System::Dense,
                ],
                quick: true,
            },
            environment: Environment {
                cpus: 2,
                transparent_hugepage: None,
            },
            measurements,
            memory: vec![MemoryRow::new(
                System::Dynemb,
                &shape(),
                Some(48_000),
                Some(50_000),
                Some(49_000),
                0.5,
            )],
            resize: vec![ResizeRow::new(
                System::Dynemb,
                &shape(),
                &[10.0, 30.0, 20.0],
                &[0, 500, 700],
                1.0,
                Some(0.0),
            )],
            checkpoint: vec![CheckpointRow {
                dim: 64,
                slots: 2,
                scores: true,
                rows: 1000,
                bytes: 2_000_000,
                save_seconds: 0.5,
                restore_seconds: 0.25,
                rss_before_save: Some(100_000_000),
                save_peak_extra_rss: Some(5_000_000),
            }],
            runs: vec![SystemRun {
                system: System::Dynemb,
                dim: 8,
                keys: 1000,
                wall_seconds: 2.0,
                others_cpu_seconds: Some(1.0),
            }],
            redis: None,
            redis_error: None,
            bounded: None,
            wall_seconds: 3.0,
        }
    }

    #[test]
    fn medians_and_ratios() {
        let r = report();
        let f = r.figures(8, 1000);
        assert_eq!(f.get(System::Dynemb, Op::LookupHit, 1), Some(8e6));
        assert_eq!(f.best_peer(Op::LookupHit, 1), Some((System::Papaya, 4e6)));
        assert_eq!(
            f.vs_best_peer(Op::LookupHit, 1),
            Some((System::Papaya, 2.0))
        );
        assert_eq!(f.vs_dense(Op::LookupHit, 1), Some(0.5));
        assert_eq!(f.vs_dense(Op::Insert, 1), None);
        assert_eq!(f.get(System::Dynemb, Op::LookupHit, 2), None);
        let mem = &r.memory[0];
        assert_eq!(mem.raw_bytes_per_row, 40.0);
        assert_eq!(mem.reported_bytes_per_row, Some(48.0));
        assert_eq!(r.resize[0].worst_over_median, 1.5);
        assert_eq!(r.resize[0].worst_at_keys, Some(500));
        assert_eq!(r.resize[0].p99_us, 30.0);
    }

    #[test]
    fn render_shows_every_figure() {
        let text = report().render();
        let lookup = text
            .lines()
            .find(|l| l.starts_with("| lookup hit (uniform)"))
            .expect("lookup row");
        let cells: Vec<&str> = lookup.split('|').map(str::trim).collect();
        assert_eq!(
            cells[1..9],
            [
                "lookup hit (uniform)",
                "1",
                "8.00",
                "2.00",
                "4.00",
                "16.00",
                "2.00x papaya",
                "0.50x"
            ]
        );
        let insert = text.lines().find(|l| l.starts_with("| insert")).unwrap();
        let cells: Vec<&str> = insert.split('|').map(str::trim).collect();
        assert_eq!(
            cells[3..9],
            ["3.00", "1.00", "n/a", "-", "3.00x dashmap", "-"]
        );
        assert!(text.contains("n/a (starved)"), "3 reader batches: {text}");
        let checkpoint = text.lines().find(|l| l.contains("5 MB (5.0%)")).unwrap();
        let cells: Vec<&str> = checkpoint.split('|').map(str::trim).collect();
        assert_eq!(
            cells[1..10],
            [
                "64",
                "values + 2 slots + scores",
                "1000",
                "2",
                "0.00",
                "4",
                "0.00",
                "8",
                "5 MB (5.0%)"
            ],
            "{checkpoint}"
        );
        assert!(text.contains("1.20x"), "memory reported/raw: {text}");
        assert!(
            text.contains("| dynemb |   8 | 1000 |    2.0 |       0.50 |"),
            "{text}"
        );
        // Every line of a table has the same width.
        let table: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with("| op ")
                    || l.starts_with("| lookup hit (")
                    || l.starts_with("| insert")
            })
            .collect();
        assert_eq!(table.len(), 3);
        assert!(table
            .windows(2)
            .all(|w| w[0].chars().count() == w[1].chars().count()));
    }

    #[test]
    fn json_has_the_same_figures() {
        let json = serde_json::to_value(report()).unwrap();
        let first = &json["measurements"][0];
        assert_eq!(first["system"], "dynemb");
        assert_eq!(first["op"], "lookup_hit");
        assert_eq!(first["per_second"], 8e6);
        assert_eq!(json["memory"][0]["reported_bytes_per_row"], 48.0);
        assert_eq!(json["settings"]["systems"][3], "dense");
    }

    #[test]
    fn markdown_table_aligns() {
        let t = markdown_table(
            &["a".into(), "num".into()],
            &[
                vec!["xyz".into(), "1.5".into()],
                vec!["q".into(), "10.25".into()],
            ],
        );
        assert_eq!(
            t,
            "| a   |   num |\n|-----|------:|\n| xyz |   1.5 |\n| q   | 10.25 |\n"
        );
    }
}
