//! Running one model: warm-up steps, then timed steps, on the workload's
//! batches in order (batch `i` of the run is `batches[i % len]`), and the
//! load other processes put on the machine during the timed steps.
//!
//! Nothing but the step itself is timed: batches were generated before,
//! and the loss is read after the step's last lap.
//!
//! The binary runs each model in its own primed process
//! ([`crate::train::isolate`]).

use serde::{Deserialize, Serialize};

use crate::harness::CpuClock;
use crate::train::data::Workload;
use crate::train::stages::{Laps, StageSummary};
use crate::train::{ModelSpec, Result};

/// How many steps a run takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steps {
    /// Untimed steps first.
    pub warmup: usize,
    /// Timed steps.
    pub timed: usize,
}

/// One model's run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRun {
    /// The model.
    pub model: ModelSpec,
    /// Samples per step.
    pub batch: usize,
    /// The timed steps.
    pub summary: StageSummary,
    /// Samples of the timed steps / their wall time: the throughput, every
    /// step counted (a table's growth spikes included; the median step is
    /// in `summary`).
    pub samples_per_second: f64,
    /// The loss of the run's first step (warm-up or timed).
    pub first_loss: f32,
    /// The loss of the last timed step.
    pub last_loss: f32,
    /// Rows of the dynamic table after the run, if the model has one.
    pub table_rows: Option<usize>,
    /// Wall time of the timed steps, s.
    pub timed_seconds: f64,
    /// CPU-seconds other processes used during the timed steps, if known.
    pub others_cpu_seconds: Option<f64>,
    /// Minor page faults of the process per timed step, if known: fresh
    /// memory touched (new table rows, and candle's temporaries whenever
    /// the allocator hands out pages it got from the kernel anew).
    pub page_faults_per_step: Option<f64>,
}

impl ModelRun {
    /// CPUs other processes kept busy during the timed steps, on average.
    pub fn others_cpus(&self) -> Option<f64> {
        Some(self.others_cpu_seconds? / self.timed_seconds.max(1e-9))
    }
}

/// Builds `model` and runs it for `steps` on `workload`.
pub fn run(model: ModelSpec, workload: &Workload, steps: Steps) -> Result<ModelRun> {
    let mut trained = model.build()?;
    let mut batches = workload.batches.iter().cycle();
    let mut laps = Laps::default();
    let mut step = |laps: &mut Laps| {
        laps.start();
        trained.step(batches.next().expect("cycled"), laps)
    };
    let mut first_loss = None;
    for _ in 0..steps.warmup {
        first_loss.get_or_insert(step(&mut laps)?);
    }
    let mut timed = Vec::with_capacity(steps.timed);
    let mut last_loss = f32::NAN;
    let before = CpuClock::now();
    let faults_before = minor_faults();
    let started = std::time::Instant::now();
    for _ in 0..steps.timed {
        last_loss = step(&mut laps)?;
        first_loss.get_or_insert(last_loss);
        timed.push(laps.clone());
    }
    let timed_seconds = started.elapsed().as_secs_f64();
    let after = CpuClock::now();
    let faults = faults_before
        .zip(minor_faults())
        .map(|(a, b)| (b - a) as f64 / steps.timed as f64);
    let summary = StageSummary::of(&timed, model.staged()).ok_or("no timed steps")?;
    Ok(ModelRun {
        model,
        batch: workload.batch,
        samples_per_second: (workload.batch * steps.timed) as f64 / timed_seconds.max(1e-9),
        summary,
        first_loss: first_loss.unwrap_or(f32::NAN),
        last_loss,
        table_rows: trained.table_rows(),
        timed_seconds,
        others_cpu_seconds: before.zip(after).map(|(a, b)| b.others_since(&a)),
        page_faults_per_step: faults,
    })
}

/// The process's minor page faults so far (`/proc/self/stat`), or `None`
/// where that file does not exist.
fn minor_faults() -> Option<u64> {
    parse_minor_faults(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// `minflt` (field 10) of a `/proc/<pid>/stat` text.
fn parse_minor_faults(stat: &str) -> Option<u64> {
    // Fields after the command name (in parentheses, may hold spaces):
    // state is field 3, so minflt is the 8th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(7)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_faults_parse() {
        let stat = "42 (a (b) c) R 1 1 1 0 -1 4194560 1234 0 5 0 250 50 0 0 20 0 3 0";
        assert_eq!(parse_minor_faults(stat), Some(1234));
        assert_eq!(parse_minor_faults("garbage"), None);
        if cfg!(target_os = "linux") {
            assert!(minor_faults().is_some());
        }
    }
}
