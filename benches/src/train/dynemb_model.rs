//! The dynemb models: a dynamic embedding table (`dynemb::Variable<i64>`,
//! dim [`DIM`]) read by `dynemb_candle::Embedding`, a dense head, sparse
//! Adam (`dynemb_optim::SparseAdam` through `SparseStep`) for the table and
//! candle-nn's `AdamW` for the head.
//!
//! A step runs one of two ways ([`Way`]):
//! - [`Way::LayerApi`]: what a user writes: `Embedding::forward_concat`, the
//!   head, the loss, `SparseStep::backward_step` (backward, `AdamW`, sparse
//!   step). Only the whole step is timed.
//! - [`Way::Staged`]: the same calls taken apart at the crate's public
//!   seams, so each stage is timed: `Ids::from_tensor`; `Dedup::unique`;
//!   the recorder's `read` (`lookup_or_insert_with_exists` into a fresh
//!   `Var`);
//!   `gather_rows` and `record`; the head; the loss; `backward`; the
//!   layer's `gather_grads` and `SparseGrads::check`; `AdamW::step`;
//!   `begin_step`, `SparseGrads::apply` and `discard_batches`. These are the
//!   calls `forward_train` and `SparseStep::backward_step` make, in their
//!   order, each buffer living as long as it does there (so
//!   `lookup_or_insert` and the apply are split over candle's threads as
//!   in the layer's calls: `dynemb_candle::parallel`).
//!
//! The table stores its values and its Adam slots in the dtypes of
//! [`TableDtypes`] (`--dtype`, `--slot-dtype`; f32 unless asked), rounded
//! to nearest even as they are written; the layer and the optimizer
//! compute in f32 either way. Its rows keep Adam's `m` and `v` inline,
//! after the values (`VariableBuilder::inline_slots`), as the ctr example's
//! table does.
//!
//! Ids enter the layer as the batch's `[batch, FIELDS]` tensor (read in
//! place), and `forward_concat` gathers the rows straight into the head's
//! `[batch, FIELDS * DIM]` input (no reshape node in the graph).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Module, Optimizer, VarBuilder, VarMap};
use dynemb::{Dtype, Initializer, Variable};
use dynemb_candle::{
    gather_rows, Dedup, Embedding, EmbeddingConfig, Ids, SparseGrads, SparseModule, SparseStep,
};
use dynemb_optim::{ParamsAdam, SparseAdam};
use serde::{Deserialize, Serialize};

use crate::train::data::{Batch, FIELDS};
use crate::train::head::{Head, HeadKind};
use crate::train::stages::{Laps, Stage};
use crate::train::{dense_adam, Result, TrainModel, DIM, EMBEDDING_STDDEV, SEED};

/// How a dynemb step is run; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Way {
    /// The layer's own calls, timed as a whole.
    LayerApi,
    /// The same calls one by one, each stage timed.
    Staged,
}

/// How a dynemb model's table stores its rows (`--dtype`, `--slot-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TableDtypes {
    /// The dtype of the embedding values.
    pub values: Dtype,
    /// The dtype of the Adam slots `m` and `v`.
    pub slots: Dtype,
}

impl TableDtypes {
    /// Values and slots in f32.
    pub const F32: TableDtypes = TableDtypes {
        values: Dtype::F32,
        slots: Dtype::F32,
    };
}

/// A dynemb model; see the [module docs](self).
pub struct DynembModel {
    embedding: Embedding<Variable<i64>>,
    head: Head,
    sparse: SparseStep<ParamsAdam>,
    dense: AdamW,
    dedup: Dedup,
    way: Way,
    device: Device,
}

impl DynembModel {
    /// A model with an empty table storing `dtypes` and a fresh head of
    /// `kind`, stepped `way`.
    pub fn new(kind: HeadKind, way: Way, dtypes: TableDtypes) -> Result<Self> {
        let device = Device::Cpu;
        let table = Variable::<i64>::builder("embedding")
            .dim(DIM)
            .initializer(Initializer::RandomNormal {
                mean: 0.0,
                stddev: EMBEDDING_STDDEV,
                seed: SEED,
            })
            .value_dtype(dtypes.values)
            .slot_dtype(dtypes.slots)
            // Adam's m and v.
            .inline_slots(2)
            .build()?;
        let embedding = Embedding::new(Arc::new(table), EmbeddingConfig::default())?;
        let vars = VarMap::new();
        let head = Head::new(
            kind,
            FIELDS * DIM,
            VarBuilder::from_varmap(&vars, DType::F32, &device),
        )?;
        let dense = AdamW::new(vars.all_vars(), dense_adam())?;
        Ok(DynembModel {
            embedding,
            head,
            sparse: SparseStep::new(SparseAdam::new(ParamsAdam::default())?),
            dense,
            dedup: Dedup::new(),
            way,
            device,
        })
    }

    /// The layer's calls; see [`Way::LayerApi`]. The laps mark the ends of
    /// the calls (the runner keeps only the whole step).
    fn step_layer_api(&mut self, batch: &Batch, laps: &mut Laps) -> Result<f32> {
        let x = self.embedding.forward_concat(&batch.ids, true)?;
        laps.lap(Stage::Gather);
        let logits = self.head.forward(&x)?;
        laps.lap(Stage::DenseForward);
        let loss = candle_nn::loss::binary_cross_entropy_with_logit(&logits, &batch.labels)?;
        laps.lap(Stage::Loss);
        self.sparse
            .backward_step(&loss, &mut self.dense, &[&self.embedding])?;
        laps.lap(Stage::SparseApply);
        Ok(loss.to_scalar::<f32>()?)
    }

    /// The embedding's training forward one stage at a time: the rows of
    /// the batch's ids, `[samples, FIELDS * DIM]`, recorded for the step.
    fn forward_staged(&mut self, batch: &Batch, laps: &mut Laps) -> Result<Tensor> {
        let samples = batch.ids.dim(0)?;
        let ids = Ids::<i64>::from_tensor(&batch.ids)?;
        laps.lap(Stage::IdsToKeys);
        let (keys, inverse) = self.dedup.unique(ids.keys())?.into_parts();
        laps.lap(Stage::Dedup);
        let recorder = self.embedding.recorder();
        let rows = recorder.read(&keys, &self.device)?;
        laps.lap(Stage::Lookup);
        let x = gather_rows(rows.as_tensor(), inverse, (samples, FIELDS * DIM))?;
        recorder.record(keys, rows)?;
        laps.lap(Stage::Gather);
        Ok(x)
    }

    /// The layer's calls one stage at a time; see [`Way::Staged`].
    fn step_staged(&mut self, batch: &Batch, laps: &mut Laps) -> Result<f32> {
        let x = self.forward_staged(batch, laps)?;
        let logits = self.head.forward(&x)?;
        laps.lap(Stage::DenseForward);
        let loss = candle_nn::loss::binary_cross_entropy_with_logit(&logits, &batch.labels)?;
        laps.lap(Stage::Loss);
        let grads = loss.backward()?;
        laps.lap(Stage::Backward);
        let optimizer = self.sparse.optimizer();
        let mut sparse = SparseGrads::new();
        SparseModule::<ParamsAdam>::gather_grads(&self.embedding, &grads, &mut sparse)?;
        sparse.check(&optimizer.params())?;
        laps.lap(Stage::GradRead);
        self.dense.step(&grads)?;
        laps.lap(Stage::DenseOptimizer);
        let step = optimizer.begin_step()?;
        let applied = sparse.apply(&step);
        self.embedding.discard_batches();
        applied?;
        laps.lap(Stage::SparseApply);
        Ok(loss.to_scalar::<f32>()?)
    }
}

impl TrainModel for DynembModel {
    fn step(&mut self, batch: &Batch, laps: &mut Laps) -> Result<f32> {
        match self.way {
            Way::LayerApi => self.step_layer_api(batch, laps),
            Way::Staged => self.step_staged(batch, laps),
        }
    }

    fn table_rows(&self) -> Option<usize> {
        Some(self.embedding.store().size())
    }
}
