//! The stages of a training step, a stopwatch that splits a step into
//! them, and the summary of many steps.
//!
//! A step runs its stages in order and calls [`Laps::lap`] at the end of
//! each: the time since the previous lap (or [`Laps::start`]) is that
//! stage's. A stage a model does not have stays at zero. [`StageSummary`]
//! keeps the median step (the throughput figure) and each stage's mean
//! time: means add up to the mean step, so the shares sum to 100%.
//!
//! Each lap also takes the CPU time the stepping thread used meanwhile
//! (`CLOCK_THREAD_CPUTIME_ID`). For a stage that runs on that thread alone
//! (the dedup, the gather) it is the stage's work without the time other
//! processes took the CPU away: the figure to compare across runs on a
//! busy machine. For stages that hand work to thread pools (candle's
//! kernels, dynemb-candle's split `lookup_or_insert` and apply) it counts
//! only this thread's share.

use std::time::{Duration, Instant};

use rustix::time::{clock_gettime, ClockId};
use serde::{Deserialize, Serialize};

use crate::harness::median;

/// One stage of a training step, in the order the tables show them (a
/// dynemb step runs the dense optimizer before the sparse apply, as
/// `SparseStep::backward_step` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The ids tensor read into keys (dynemb: `Ids::from_tensor`; the
    /// candle-nn baseline: the ids hashed into row indices, a `u32` tensor).
    IdsToKeys,
    /// The batch's distinct keys and each id's position among them.
    Dedup,
    /// `lookup_or_insert` of the distinct keys into a fresh `Var`.
    Lookup,
    /// The rows copied to the ids' positions (dynemb: `gather_rows`, straight
    /// into the head's input; the baseline: `candle_nn::Embedding::forward`'s
    /// `index_select`, then a reshape), laid out to `[batch, fields * dim]`.
    Gather,
    /// The dense part's forward (linear head or MLP).
    DenseForward,
    /// Binary cross-entropy with logits.
    Loss,
    /// `loss.backward()`: every gradient, the embedding's included.
    Backward,
    /// The distinct rows' gradient read from the `GradStore` and checked.
    GradRead,
    /// The sparse optimizer's update of the distinct keys' rows and slots.
    SparseApply,
    /// candle-nn's `AdamW` step (the baseline: over the whole table too).
    DenseOptimizer,
}

impl Stage {
    /// Every stage, in table order.
    pub const ALL: [Stage; 10] = [
        Stage::IdsToKeys,
        Stage::Dedup,
        Stage::Lookup,
        Stage::Gather,
        Stage::DenseForward,
        Stage::Loss,
        Stage::Backward,
        Stage::GradRead,
        Stage::SparseApply,
        Stage::DenseOptimizer,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Stage::IdsToKeys => "ids->keys",
            Stage::Dedup => "dedup",
            Stage::Lookup => "lookup_or_insert",
            Stage::Gather => "gather",
            Stage::DenseForward => "dense fwd",
            Stage::Loss => "loss",
            Stage::Backward => "backward",
            Stage::GradRead => "grad read",
            Stage::SparseApply => "sparse apply",
            Stage::DenseOptimizer => "dense opt",
        }
    }

    /// Whether the stage is the embedding path's own work (everything but
    /// the dense part, the loss, the backward pass and the dense
    /// optimizer). The backward pass also runs the gather's backward (the
    /// positions' gradient summed into the distinct rows'), which no stage can
    /// separate from the dense part's.
    pub fn is_embedding_path(self) -> bool {
        matches!(
            self,
            Stage::IdsToKeys
                | Stage::Dedup
                | Stage::Lookup
                | Stage::Gather
                | Stage::GradRead
                | Stage::SparseApply
        )
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The stopwatch of one step; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Laps {
    last: Instant,
    last_cpu: Duration,
    times: [Duration; Stage::ALL.len()],
    cpu: [Duration; Stage::ALL.len()],
}

impl Default for Laps {
    fn default() -> Self {
        Laps {
            last: Instant::now(),
            last_cpu: thread_cpu(),
            times: [Duration::ZERO; Stage::ALL.len()],
            cpu: [Duration::ZERO; Stage::ALL.len()],
        }
    }
}

impl Laps {
    /// Clears the laps and starts the clock.
    pub fn start(&mut self) {
        *self = Laps::default();
    }

    /// Ends `stage`: it took the time since the previous lap.
    pub fn lap(&mut self, stage: Stage) {
        let (now, cpu) = (Instant::now(), thread_cpu());
        self.times[stage.index()] += now - self.last;
        self.cpu[stage.index()] += cpu.saturating_sub(self.last_cpu);
        (self.last, self.last_cpu) = (now, cpu);
    }

    /// The whole step so far.
    pub fn total(&self) -> Duration {
        self.times.iter().sum()
    }

    /// `stage`'s time.
    pub fn of(&self, stage: Stage) -> Duration {
        self.times[stage.index()]
    }

    /// The CPU time the stepping thread used in `stage`.
    pub fn cpu_of(&self, stage: Stage) -> Duration {
        self.cpu[stage.index()]
    }
}

/// The timed steps of one model, summarized.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageSummary {
    /// Timed steps.
    pub steps: usize,
    /// Median step time, s.
    pub median_step_seconds: f64,
    /// Mean step time, s.
    pub mean_step_seconds: f64,
    /// Every stage, in [`Stage::ALL`] order; empty for steps timed only
    /// as a whole.
    pub stages: Vec<StageTime>,
}

/// One stage's time over the timed steps.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageTime {
    /// The stage.
    pub stage: Stage,
    /// Its mean time, s.
    pub mean_seconds: f64,
    /// The stepping thread's mean CPU time in it, s (see the
    /// [module docs](self)).
    pub mean_thread_cpu_seconds: f64,
    /// Its share of the mean step, 0..=1.
    pub share: f64,
}

impl StageSummary {
    /// The summary of the steps' laps, with the stages' times if
    /// `staged` (else only the whole steps'); `None` for no steps.
    pub fn of(steps: &[Laps], staged: bool) -> Option<Self> {
        if steps.is_empty() {
            return None;
        }
        let n = steps.len() as f64;
        let totals: Vec<f64> = steps.iter().map(|l| l.total().as_secs_f64()).collect();
        let mean_step_seconds = totals.iter().sum::<f64>() / n;
        let stages = Stage::ALL
            .iter()
            .filter(|_| staged)
            .map(|&stage| {
                let mean = |f: &dyn Fn(&Laps) -> Duration| {
                    steps.iter().map(|l| f(l).as_secs_f64()).sum::<f64>() / n
                };
                let mean_seconds = mean(&|l| l.of(stage));
                StageTime {
                    stage,
                    mean_seconds,
                    mean_thread_cpu_seconds: mean(&|l| l.cpu_of(stage)),
                    share: mean_seconds / mean_step_seconds,
                }
            })
            .collect();
        Some(StageSummary {
            steps: steps.len(),
            median_step_seconds: median(&totals),
            mean_step_seconds,
            stages,
        })
    }

    /// `stage`'s share of the mean step, 0..=1, if stages were timed.
    pub fn share(&self, stage: Stage) -> Option<f64> {
        self.stages.get(stage.index()).map(|t| t.share)
    }

    /// The embedding path's share of the mean step
    /// ([`Stage::is_embedding_path`]), if stages were timed.
    pub fn embedding_path_share(&self) -> Option<f64> {
        Stage::ALL
            .iter()
            .filter(|s| s.is_embedding_path())
            .map(|&s| self.share(s))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn laps(ms: &[(Stage, u64)]) -> Laps {
        let mut l = Laps::default();
        for &(s, t) in ms {
            l.times[s.index()] += Duration::from_millis(t);
        }
        l
    }

    #[test]
    fn shares_of_means_sum_to_one() {
        let steps = [
            laps(&[(Stage::Dedup, 2), (Stage::Backward, 6), (Stage::Loss, 2)]),
            laps(&[(Stage::Dedup, 4), (Stage::Backward, 14), (Stage::Loss, 2)]),
            laps(&[(Stage::Dedup, 3), (Stage::Backward, 10), (Stage::Loss, 2)]),
        ];
        let s = StageSummary::of(&steps, true).unwrap();
        assert_eq!(s.steps, 3);
        assert!((s.median_step_seconds - 0.015).abs() < 1e-12);
        assert!((s.mean_step_seconds - 0.015).abs() < 1e-12);
        assert!((s.share(Stage::Dedup).unwrap() - 0.2).abs() < 1e-12);
        assert!((s.embedding_path_share().unwrap() - 0.2).abs() < 1e-12);
        let total: f64 = Stage::ALL.iter().filter_map(|&st| s.share(st)).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!(StageSummary::of(&[], true).is_none());
        let whole = StageSummary::of(&steps, false).unwrap();
        assert_eq!(whole.median_step_seconds, s.median_step_seconds);
        assert_eq!(whole.embedding_path_share(), None);
    }

    #[test]
    fn laps_take_wall_and_thread_cpu_time() {
        let mut laps = Laps::default();
        laps.start();
        let work: u64 = (0..2_000_000_u64).map(std::hint::black_box).sum();
        assert!(work > 0);
        laps.lap(Stage::Lookup);
        std::thread::sleep(Duration::from_millis(20));
        laps.lap(Stage::Backward);
        assert!(laps.cpu_of(Stage::Lookup) > Duration::ZERO, "work uses CPU");
        assert!(laps.of(Stage::Backward) >= Duration::from_millis(20));
        assert!(
            laps.cpu_of(Stage::Backward) < laps.of(Stage::Backward) / 2,
            "sleeping uses next to none"
        );
        assert_eq!(
            laps.total(),
            laps.of(Stage::Lookup) + laps.of(Stage::Backward)
        );
    }

    #[test]
    fn stages_are_indexed_in_order() {
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
    }
}
