//! The figures of a `train` run, as Markdown tables and as JSON.
//!
//! [`TrainReport::render`] prints: the models (median step, samples/s, the
//! ratio to the candle-nn hashed baseline with the same head, the
//! embedding path's share, the loss at the first and last step, the load
//! of other processes), the stage shares of every staged run, and the
//! settings and threads actually used.
//! `serde_json` writes the same figures.

use std::fmt::Write as _;

use serde::Serialize;

use crate::report::{markdown_table, Environment};
use crate::train::data::IdStats;
use crate::train::run::{ModelRun, Steps};
use crate::train::stages::Stage;
use crate::train::ModelSpec;

/// What was run, and the threads it ran on.
#[derive(Debug, Clone, Serialize)]
pub struct TrainSettings {
    /// `--threads`.
    pub threads: usize,
    /// Threads candle reports for its CPU kernels
    /// (`candle_core::utils::get_num_threads`).
    pub candle_threads: usize,
    /// Threads of rayon's global pool (candle's matrix products).
    pub rayon_threads: usize,
    /// glibc malloc settings from the environment (`MALLOC_*`,
    /// `GLIBC_TUNABLES`), as `NAME=value`; empty: glibc's defaults. They
    /// change how often candle's large temporaries are page-faulted in.
    pub malloc_env: Vec<String>,
    /// Samples per batch.
    pub batch: usize,
    /// Fields per sample.
    pub fields: usize,
    /// Values per embedding row.
    pub dim: usize,
    /// How the dynemb tables store their values (`--dtype`).
    pub value_dtype: String,
    /// How the dynemb tables store their Adam slots (`--slot-dtype`).
    pub slot_dtype: String,
    /// Ids per field (the modulo).
    pub vocab: i64,
    /// The ids' Zipf exponent.
    pub zipf_exponent: f64,
    /// Steps of each run.
    pub steps: Steps,
    /// Distinct batches generated (a run cycles through them).
    pub batches: usize,
    /// How the ids repeat over a run's batches.
    pub ids: IdStats,
    /// Time to generate them, s (untimed).
    pub generate_seconds: f64,
    /// Whether `--quick` was given.
    pub quick: bool,
}

/// Everything a `train` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    /// What was run.
    pub settings: TrainSettings,
    /// Where.
    pub environment: Environment,
    /// Every model's run, in run order.
    pub runs: Vec<ModelRun>,
    /// Wall time of the whole run, s.
    pub wall_seconds: f64,
}

/// `v` as a percentage with one decimal.
fn percent(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

impl TrainReport {
    /// The samples/s of the hashed baseline with `run`'s head, if it ran.
    fn baseline_of(&self, run: &ModelRun) -> Option<f64> {
        let baseline = ModelSpec::Hashed {
            head: run.model.head(),
        };
        self.runs
            .iter()
            .find(|r| r.model == baseline)
            .map(|r| r.samples_per_second)
    }

    /// The report as Markdown.
    pub fn render(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n### training steps ({} fields of ids Zipf({}) mod {} + field offset, dim {}, \
             batch {}, Adam; dynemb tables: values {}, slots {} (m and v inline); {} warm-up + \
             {} timed steps per run; samples/s: all timed samples / their wall time)\n",
            s.fields,
            s.zipf_exponent,
            s.vocab,
            s.dim,
            s.batch,
            s.value_dtype,
            s.slot_dtype,
            s.steps.warmup,
            s.steps.timed
        );
        let _ = writeln!(
            out,
            "ids per batch: {} ({:.0} distinct, {:.0} new to the run, mean of the timed batches); \
             {} distinct ids over a run\n",
            s.batch * s.fields,
            s.ids.distinct_per_batch,
            s.ids.new_per_batch,
            s.ids.distinct_total
        );
        out.push_str(&self.models_table());
        out.push_str(
            "\n### stage shares of the mean step (staged runs; in parentheses: mean ms, and the \
             stepping thread's mean CPU ms, the figure other processes do not inflate)\n\n",
        );
        out.push_str(&self.stages_table());
        out.push_str(
            "\nembedding path = ids->keys + dedup + lookup_or_insert + gather + grad read + \
             sparse apply. backward also runs the gather's backward (the positions' \
             gradient summed into the distinct rows'), not counted in the path.\n",
        );
        let _ = writeln!(
            out,
            "\nthreads: --threads {} (candle kernels, which also run dynemb-candle's \
             lookup_or_insert, gather and apply: {}; rayon pool, candle's matrix products: {}); malloc: {}; {} CPUs, transparent huge pages: {}; {} \
             batches generated in {:.1} s; wall time {:.0} s",
            s.threads,
            s.candle_threads,
            s.rayon_threads,
            if s.malloc_env.is_empty() {
                "glibc defaults".to_owned()
            } else {
                s.malloc_env.join(" ")
            },
            self.environment.cpus,
            self.environment
                .transparent_hugepage
                .as_deref()
                .unwrap_or("unknown"),
            s.batches,
            s.generate_seconds,
            self.wall_seconds
        );
        out
    }

    fn models_table(&self) -> String {
        let header = [
            "table",
            "head",
            "step",
            "median ms",
            "samples/s",
            "vs hashed",
            "embedding path",
            "loss first -> last",
            "table rows",
            "page faults/step",
            "other CPUs",
        ]
        .map(String::from);
        let rows: Vec<Vec<String>> = self
            .runs
            .iter()
            .map(|r| {
                vec![
                    r.model.table(),
                    r.model.head().describe().into(),
                    r.model.way().into(),
                    format!("{:.2}", r.summary.median_step_seconds * 1e3),
                    format!("{:.1}k", r.samples_per_second / 1e3),
                    self.baseline_of(r)
                        .map_or("-".into(), |b| format!("{:.2}x", r.samples_per_second / b)),
                    r.summary.embedding_path_share().map_or("-".into(), percent),
                    format!("{:.4} -> {:.4}", r.first_loss, r.last_loss),
                    r.table_rows.map_or("-".into(), |n| n.to_string()),
                    r.page_faults_per_step
                        .map_or("n/a".into(), |f| format!("{f:.0}")),
                    r.others_cpus().map_or("n/a".into(), |c| format!("{c:.2}")),
                ]
            })
            .collect();
        markdown_table(&header, &rows)
    }

    fn stages_table(&self) -> String {
        let mut header = vec!["table".to_owned(), "head".to_owned()];
        header.extend(Stage::ALL.iter().map(|s| s.name().to_owned()));
        header.push("embedding path".into());
        let rows: Vec<Vec<String>> = self
            .runs
            .iter()
            .filter(|r| r.model.staged())
            .map(|r| {
                let mut row = vec![r.model.table(), r.model.head().describe().into()];
                row.extend(r.summary.stages.iter().map(|t| {
                    if t.mean_seconds == 0.0 {
                        "-".into()
                    } else {
                        format!(
                            "{} ({:.2}, {:.2})",
                            percent(t.share),
                            t.mean_seconds * 1e3,
                            t.mean_thread_cpu_seconds * 1e3
                        )
                    }
                }));
                row.push(r.summary.embedding_path_share().map_or("-".into(), percent));
                row
            })
            .collect();
        markdown_table(&header, &rows)
    }
}
