//! The `train` binary's training benchmark: dynemb's candle layers against
//! the hashing trick on TFRA's usual CPU demo workload.
//!
//! ```text
//! cargo run --release -p dynemb-benches --bin train -- [--quick] [--steps N]
//!     [--warmup W] [--threads T] [--models M[,M..]] [--dtype D] [--slot-dtype D]
//!     [--json FILE] [--glibc-malloc]
//! ```
//!
//! The workload ([`data`]): 26 fields of ids Zipf(1.2) modulo 1M plus a
//! per-field offset, a synthetic click label, batches of 4096 samples, all
//! generated before any timing. Embeddings have dim [`DIM`]; every
//! optimizer is Adam (Keras' defaults, learning rate 0.001). The models
//! ([`ModelSpec`]):
//! - **dynemb, linear**: `dynemb_candle::Embedding` over a
//!   `Variable<i64>`, one `candle_nn::Linear(26 * 16 -> 1)`, BCE with
//!   logits; `SparseAdam` through `SparseStep` for the table, candle-nn's
//!   `AdamW` (weight decay 0: Adam) for the linear layer;
//! - **candle-nn hashed, linear**: the same head with a
//!   `candle_nn::Embedding` of 1M rows, ids hashed into it, candle-nn's
//!   `AdamW` over every parameter ([`hashed_model`]);
//! - **dynemb, MLP**: the dynemb table with the CTR tower 256-128-1.
//!
//! The dynemb tables store their values and Adam slots as f32 unless
//! `--dtype` and `--slot-dtype` say f16 or bf16 ([`dynemb_model::TableDtypes`]);
//! the hashed model stays f32.
//!
//! Each dynemb model runs two ways, each time from an empty table on the
//! same batches: through the layer's API (the samples/s figures) and taken
//! apart at its public seams (the stage shares); see [`dynemb_model`]. Every run is
//! in a process of its own, after an untimed priming run ([`isolate`]).
//! Each run does warm-up steps, then timed steps; samples/s is every timed
//! sample over the timed steps' wall time (growth spikes count), the
//! median step is shown beside it, and the stage shares are shares of the
//! mean step ([`stages`]).
//!
//! Threads: `--threads T` sets `RAYON_NUM_THREADS` and
//! `CANDLE_NUM_THREADS` before candle or rayon start, so candle's matrix
//! products (rayon) and element-wise kernels (candle's own pool) use T
//! threads. dynemb-candle splits its two big store calls
//! (`lookup_or_insert` and the optimizer's apply) and its gather (forward
//! and backward) over candle's own pool (`dynemb_candle::threads`); the
//! dedup runs on the training loop's thread.
//!
//! Allocator: the binary runs with glibc tunables that keep freed memory in
//! the process ([`malloc`]; `--glibc-malloc` keeps glibc's defaults).
//!
//! Modules: [`data`] (the workload), [`head`] (the dense part),
//! [`dynemb_model`] and [`hashed_model`] (the models), [`stages`] (step
//! stages and their timing), [`run`] (running a model), [`report`]
//! (tables and JSON), [`malloc`] (the
//! allocator's settings), [`isolate`] (a process per run), [`cli`]
//! (flags).

pub mod cli;
pub mod data;
pub mod dynemb_model;
pub mod hashed_model;
pub mod head;
pub mod isolate;
pub mod malloc;
pub mod report;
pub mod run;
pub mod stages;

use candle_nn::ParamsAdamW;
use dynemb::Dtype;
use serde::{Deserialize, Serialize};

use data::Batch;
use dynemb_model::{DynembModel, TableDtypes, Way};
use hashed_model::HashedModel;
use head::HeadKind;
use stages::Laps;

/// Values per embedding row.
pub const DIM: usize = 16;
/// Samples per batch.
pub const BATCH: usize = 4096;
/// Standard deviation of the embeddings' initial values (Keras'
/// `RandomNormal` default), in both tables.
pub const EMBEDDING_STDDEV: f32 = 0.05;
/// Seed of the workload and the dynemb initializer.
pub const SEED: u64 = 0x5eed_2024;

/// Errors of a run: candle's, dynemb's, dynemb-candle's.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A model the benchmark trains.
pub trait TrainModel {
    /// One training step on `batch`, calling `laps.lap` at the end of each
    /// stage; returns the batch's loss.
    fn step(&mut self, batch: &Batch, laps: &mut Laps) -> Result<f32>;

    /// Rows in a dynamic table, if the model has one.
    fn table_rows(&self) -> Option<usize> {
        None
    }
}

/// candle-nn's `AdamW` as every dense part uses it: Keras' Adam defaults,
/// no weight decay (so it is Adam, as the sparse side).
pub fn dense_adam() -> ParamsAdamW {
    ParamsAdamW {
        lr: 0.001,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-7,
        weight_decay: 0.0,
    }
}

/// One model of the benchmark and how its step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "table")]
pub enum ModelSpec {
    /// A dynemb table, stepped `way`.
    Dynemb {
        /// The dense part.
        head: HeadKind,
        /// Layer API or staged.
        way: Way,
        /// How the table stores its rows.
        dtypes: TableDtypes,
    },
    /// The hashing trick: a `candle_nn::Embedding` of 1M rows.
    Hashed {
        /// The dense part.
        head: HeadKind,
    },
}

impl ModelSpec {
    /// The model, with an empty (dynemb) or freshly initialized (hashed)
    /// table.
    pub fn build(self) -> Result<Box<dyn TrainModel>> {
        Ok(match self {
            ModelSpec::Dynemb { head, way, dtypes } => {
                Box::new(DynembModel::new(head, way, dtypes)?)
            }
            ModelSpec::Hashed { head } => Box::new(HashedModel::new(head)?),
        })
    }

    /// The model's dense part.
    pub fn head(self) -> HeadKind {
        match self {
            ModelSpec::Dynemb { head, .. } | ModelSpec::Hashed { head } => head,
        }
    }

    /// The table, in tables: `dynemb`, with its dtypes unless both are
    /// f32 (`dynemb bf16` for bf16 values, `dynemb bf16, slots bf16`).
    pub fn table(self) -> String {
        match self {
            ModelSpec::Dynemb { dtypes, .. } if dtypes == TableDtypes::F32 => "dynemb".into(),
            ModelSpec::Dynemb { dtypes, .. } if dtypes.slots == Dtype::F32 => {
                format!("dynemb {}", dtypes.values)
            }
            ModelSpec::Dynemb { dtypes, .. } => {
                format!("dynemb {}, slots {}", dtypes.values, dtypes.slots)
            }
            ModelSpec::Hashed { .. } => "candle-nn 1M hashed".into(),
        }
    }

    /// How the step runs, in tables.
    pub fn way(self) -> &'static str {
        match self {
            ModelSpec::Dynemb {
                way: Way::LayerApi, ..
            } => "layer API",
            ModelSpec::Dynemb {
                way: Way::Staged, ..
            } => "staged",
            ModelSpec::Hashed { .. } => "staged",
        }
    }

    /// Whether each stage of a step is timed (else only the whole step).
    pub fn staged(self) -> bool {
        !matches!(
            self,
            ModelSpec::Dynemb {
                way: Way::LayerApi,
                ..
            }
        )
    }
}
