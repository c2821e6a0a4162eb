//! Training, evaluation and checkpoints of the CTR model ([`Trainer`]),
//! over a local or a Redis table. Two trainers of one configuration fed
//! the same batches compute the same model, bit for bit.
//!
//! A step: the batch's ids go through the model in training mode (the
//! embedding inserts unseen ids and records the distinct rows it read),
//! the loss is the stable binary cross-entropy, and one `backward_step`
//! applies candle-nn's `AdamW` to the MLP and dynemb-optim's sparse Adam to
//! the rows the batch read (TFRA's lazy Adam: untouched rows keep their
//! slots). If the step leaves the table above `--max-size` rows, the table
//! is restricted to [`reserved_rows`] of it (`max - max / 10`, 90% rounded
//! up), evicting the rows trained longest ago (the timestamp policy), slots
//! included. The configuration makes `--max-size` at least one batch's ids,
//! so the rows a step just trained fit.
//!
//! The table itself ([`ModelConfig::lifecycle`]) may bound its rows
//! (`--capacity`: an id's new row evicts a least recently trained one as
//! it is inserted) and admit ids late (`--min-count`: until its Nth
//! training read an id reads its initial row, gets no row and its gradient
//! is dropped); [`Trainer::expire`] removes the rows not trained for a
//! while (`--expire`). [`Trainer::counts`] counts what each did
//! ([`RowCounts`]).
//!
//! The table stores values and Adam slots in [`ModelConfig::precision`]'s
//! dtypes; the step computes in f32 on the widened rows and the table
//! rounds what the optimizer writes. A reloaded model is compared bit for
//! bit as in f32: a checkpoint holds the stored bits.
//!
//! Both initial states come from [`ModelConfig::seed`]: the table's
//! initializer is seeded per id, and the MLP's weights are drawn by
//! [`init_mlp`] (candle's own CPU generator cannot be seeded). So two
//! trainers of one configuration fed the same batches compute the same
//! model, bit for bit.
//!
//! Evaluation runs the model in inference mode, which reads and never
//! inserts: held-out ids never seen in training read their initial rows,
//! and the table's size is unchanged.
//!
//! A step whose loss is NaN or infinite is refused by the sparse step
//! before anything changes (no row, slot, step count or MLP weight), and
//! [`Trainer::step`] reports it as [`Step::Skipped`]: the caller counts it
//! and goes on. Its forward pass may have inserted the batch's unseen ids
//! at their initial rows (what a lookup of a missing id reads anyway), and
//! the `--max-size` bound is kept as after any step.
//!
//! [`Trainer::save`] writes the model's part of a checkpoint (see
//! `checkpoint` for the directory and its crash safety): the table
//! (`embeddings/`, dynemb's safetensors format, slots `m` and `v` and the
//! timestamps included), the sparse optimizer's state (`sparse_adam.json`:
//! step count and hyperparameters) and the MLP (`mlp.safetensors`).
//! candle-nn's `AdamW` keeps its moments private, so a resumed run
//! ([`Trainer::resume`]) starts the MLP's optimizer afresh; predictions
//! depend only on the saved weights. Errors name the file they concern.
//! [`check_reload`] compares a reloaded model with the trained one: table
//! size, sparse optimizer steps, the rows and Adam slots of sampled keys,
//! and held-out predictions, all bit for bit.
//!
//! The trainer is generic over its table ([`EmbeddingTable`]): a local
//! `Variable<i64>` (the default type, [`Trainer::new`]) or a Redis one
//! ([`Trainer::with_table`]). A checkpoint of either restores into
//! either; `run` reloads a Redis-trained model into a local table.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use candle_nn::{Optimizer, ParamsAdamW, VarBuilder, VarMap};
use dynemb::{EmbeddingTable, LifecycleStats, Variable};
use dynemb_candle::SparseStep;
use dynemb_optim::{ParamsAdam, SparseAdam};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{MLP_FILE, SPARSE_FILE, TABLE_DIR};
use crate::model::{
    bce_with_logits, embedding_table, ids_tensor, init_mlp, CtrModel, TableLifecycle,
    TablePrecision,
};
use crate::source::Batch;

/// The errors of training: the layer's, the table's and candle's.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Learning rate of the sparse Adam on the embeddings (0.005 to 0.02 give
/// the same held-out AUC within 0.001).
pub const SPARSE_LR: f32 = 0.01;
/// Learning rate of the MLP's AdamW (0.003 loses 0.002 of held-out AUC).
pub const DENSE_LR: f64 = 0.001;
/// Most samples per inference batch during evaluation.
const EVAL_BATCH: usize = 8192;
/// Most embedding values (`samples × fields × dim`) per inference batch.
const EVAL_VALUES: usize = 1 << 24;
/// Keys whose rows and slots [`check_reload`] compares (all of a smaller
/// table).
pub const RELOAD_KEYS: usize = 1000;
/// Rows a table exports per chunk when [`sample_keys`] passes over it.
const KEYS_PER_CHUNK: usize = 1 << 14;
/// The sparse Adam's slot columns.
const ADAM_SLOTS: [&str; 2] = ["m", "v"];

/// Rows a table restricted at `max` rows keeps: `max - max / 10`, 90%
/// rounded up (all of a table of fewer than 10 rows).
pub fn reserved_rows(max: usize) -> usize {
    max - max / 10
}

/// What the model is and how it trains.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Ids per sample.
    pub fields: usize,
    /// Embedding width.
    pub dim: usize,
    /// Shards of the embedding table.
    pub shards: usize,
    /// Seed of the embedding rows' initializer and of the MLP's initial
    /// weights.
    pub seed: u64,
    /// Most rows the table keeps between steps.
    pub max_size: Option<usize>,
    /// The table's capacity and admission.
    pub lifecycle: TableLifecycle,
    /// The table's value and slot dtypes and rounding.
    pub precision: TablePrecision,
}

/// What removed rows from the table or kept ids out of it, over a run
/// or, as a difference ([`RowCounts::since`]), over an epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowCounts {
    /// Rows evicted by `--max-size` (restricted after a step).
    pub restricted: u64,
    /// Rows evicted by `--capacity` as new ones arrived.
    pub evicted: u64,
    /// Training reads of ids not yet admitted (`--min-count`): each read
    /// its initial row, and its gradient was dropped.
    pub not_admitted_reads: u64,
    /// Rows removed by `--expire`.
    pub expired: u64,
}

impl RowCounts {
    /// What happened after `start` (an earlier count of the same run).
    pub fn since(&self, start: &RowCounts) -> RowCounts {
        RowCounts {
            restricted: self.restricted.saturating_sub(start.restricted),
            evicted: self.evicted.saturating_sub(start.evicted),
            not_admitted_reads: self
                .not_admitted_reads
                .saturating_sub(start.not_admitted_reads),
            expired: self.expired.saturating_sub(start.expired),
        }
    }
}

/// The model with its optimizers, its embeddings in a table of type `T`.
pub struct Trainer<T: EmbeddingTable<Key = i64> + 'static = Variable<i64>> {
    config: ModelConfig,
    table: Arc<T>,
    mlp: VarMap,
    model: CtrModel<T>,
    sparse: SparseStep<ParamsAdam>,
    dense: candle_nn::AdamW,
    device: Device,
    /// Rows restricted away by `--max-size` since [`Trainer::set_counts`].
    restricted: u64,
    /// The counts [`Trainer::set_counts`] set (a resumed run's).
    base: RowCounts,
    /// The table's lifecycle counts when they were set.
    table_start: LifecycleStats,
}

impl Trainer {
    /// A fresh model: an empty local table and an MLP initialized from the
    /// seed.
    pub fn new(config: ModelConfig) -> Result<Self> {
        let table = Self::local_table(&config)?;
        Self::assemble(config, table, VarMap::new(), None)
    }

    /// The empty local table `config` describes.
    fn local_table(config: &ModelConfig) -> dynemb::Result<Variable<i64>> {
        embedding_table(
            config.dim,
            config.shards,
            config.seed,
            config.lifecycle,
            config.precision,
        )
    }

    /// A model from a checkpoint written by [`Trainer::save`] (of a local
    /// or a Redis table), in fresh objects (a local table, MLP and sparse
    /// optimizer state).
    pub fn load(config: ModelConfig, dir: &Path) -> Result<Self> {
        let table = Self::local_table(&config)?;
        Self::resume(config, table, dir)
    }
}

/// What [`Trainer::step`] did with a batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// Trained on it; its loss.
    Trained(f32),
    /// Refused it before changing anything: its loss was not finite.
    Skipped(f32),
}

impl<T: EmbeddingTable<Key = i64> + 'static> Trainer<T> {
    /// A fresh model over `table`, which must be empty and made with the
    /// local table's settings for `config` (see `table::open_redis`), and
    /// an MLP initialized from the seed.
    pub fn with_table(config: ModelConfig, table: T) -> Result<Self> {
        Self::assemble(config, table, VarMap::new(), None)
    }

    /// The model of the checkpoint at `dir` over `table`, whose contents
    /// the checkpoint's table replaces: the table, the MLP's weights and
    /// the sparse optimizer's state (its step count included) are the
    /// checkpoint's; the MLP's AdamW starts afresh (see the module docs).
    pub fn resume(config: ModelConfig, table: T, dir: &Path) -> Result<Self> {
        let tables = dir.join(TABLE_DIR);
        table
            .restore(&tables)
            .map_err(|e| named(&tables, "cannot restore the table", e))?;
        let mut mlp = VarMap::new();
        let trainer = Self::assemble(config, table, mlp.clone(), Some(dir))?;
        let weights = dir.join(MLP_FILE);
        mlp.load(&weights)
            .map_err(|e| named(&weights, "cannot load the MLP", e))?;
        Ok(trainer)
    }

    /// Builds the model over `table` and `mlp` (whose variables the model
    /// creates and [`init_mlp`] fills from the seed; a checkpoint's values
    /// are loaded over them afterwards).
    fn assemble(
        config: ModelConfig,
        table: T,
        mlp: VarMap,
        checkpoint: Option<&Path>,
    ) -> Result<Self> {
        let device = Device::Cpu;
        let table = Arc::new(table);
        let vb = VarBuilder::from_varmap(&mlp, DType::F32, &device);
        let model = CtrModel::new(table.clone(), vb, config.fields)?;
        init_mlp(&mlp, config.seed)?;
        let sparse = SparseAdam::new(ParamsAdam {
            lr: SPARSE_LR,
            ..Default::default()
        })?;
        if let Some(dir) = checkpoint {
            let state = dir.join(SPARSE_FILE);
            sparse
                .restore_state(&state)
                .map_err(|e| named(&state, "cannot restore the sparse optimizer", e))?;
        }
        let dense = candle_nn::AdamW::new(
            mlp.all_vars(),
            ParamsAdamW {
                lr: DENSE_LR,
                ..Default::default()
            },
        )?;
        let table_start = table.lifecycle_stats()?;
        Ok(Trainer {
            config,
            table,
            mlp,
            model,
            sparse: SparseStep::new(sparse),
            dense,
            device,
            restricted: 0,
            base: RowCounts::default(),
            table_start,
        })
    }

    /// One training step on `batch`: [`Step::Trained`] with its loss, or
    /// [`Step::Skipped`] if its loss is not finite (nothing was trained;
    /// see the module docs). Any other error may come after part of the
    /// step was applied (a Redis node failing mid-write, say).
    pub fn step(&mut self, batch: &Batch) -> Result<Step> {
        let ids = ids_tensor(&batch.ids, self.config.fields, &self.device)?;
        let labels = Tensor::from_slice(&batch.labels, batch.len(), &self.device)?;
        let logits = self.model.forward(&ids, true)?;
        let loss = bce_with_logits(&logits, &labels)?;
        let step = match self
            .sparse
            .backward_step(&loss, &mut self.dense, &[&self.model.embedding])
        {
            Ok(()) => Step::Trained(loss.to_scalar::<f32>()?),
            Err(dynemb_candle::Error::NonFiniteLoss { loss }) => Step::Skipped(loss),
            Err(e) => return Err(e.into()),
        };
        if let Some(max) = self.config.max_size {
            if self.table.size()? > max {
                self.restricted += self.table.restrict(reserved_rows(max), max)? as u64;
            }
        }
        Ok(step)
    }

    /// Click probabilities for `samples`, in inference mode (nothing is
    /// inserted or recorded).
    pub fn predict(&self, samples: &Batch) -> Result<Vec<f32>> {
        let fields = self.config.fields;
        let chunk = (EVAL_VALUES / (fields * self.config.dim).max(1)).clamp(1, EVAL_BATCH);
        let mut probabilities = Vec::with_capacity(samples.len());
        for ids in samples.ids.chunks(chunk * fields) {
            let ids = ids_tensor(ids, fields, &self.device)?;
            let logits = self.model.forward(&ids, false)?;
            let p = candle_nn::ops::sigmoid(&logits)?;
            probabilities.extend(p.to_vec1::<f32>()?);
        }
        Ok(probabilities)
    }

    /// Writes the table, the sparse optimizer's state and the MLP into
    /// `dir` (created if missing; see the module docs). Errors name the
    /// file.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| named(dir, "cannot create", e))?;
        let tables = dir.join(TABLE_DIR);
        self.table
            .save(&tables)
            .map_err(|e| named(&tables, "cannot save the table", e))?;
        let state = dir.join(SPARSE_FILE);
        self.sparse
            .optimizer()
            .save_state(&state)
            .map_err(|e| named(&state, "cannot save the sparse optimizer", e))?;
        let weights = dir.join(MLP_FILE);
        self.mlp
            .save(&weights)
            .map_err(|e| named(&weights, "cannot save the MLP", e))?;
        Ok(())
    }

    /// Removes the rows not trained for `older_than` (`--expire`) and
    /// returns how many.
    pub fn expire(&self, older_than: Duration) -> Result<usize> {
        Ok(self.table.expire(older_than)?)
    }

    /// Sets what [`Trainer::counts`] counts from (a resumed run's counts).
    pub fn set_counts(&mut self, counts: RowCounts) -> Result<()> {
        self.table_start = self.table.lifecycle_stats()?;
        self.base = counts;
        self.restricted = 0;
        Ok(())
    }

    /// What removed rows or kept ids out so far: the counts set by
    /// [`Trainer::set_counts`] plus what happened since.
    pub fn counts(&self) -> Result<RowCounts> {
        let now = self.table.lifecycle_stats()?;
        let start = &self.table_start;
        Ok(RowCounts {
            restricted: self.base.restricted + self.restricted,
            evicted: self.base.evicted + now.evicted.saturating_sub(start.evicted),
            not_admitted_reads: self.base.not_admitted_reads
                + now
                    .not_admitted_reads
                    .saturating_sub(start.not_admitted_reads),
            expired: self.base.expired + now.expired.saturating_sub(start.expired),
        })
    }

    /// The embedding table.
    pub fn table(&self) -> &T {
        &self.table
    }

    /// Sparse optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.sparse.optimizer().steps()
    }

    /// What the model is.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
}

/// An error saying `what` failed at `path`, with `error`'s message; the
/// path is left out of the message when `error` names it already.
fn named(path: &Path, what: &str, error: impl std::fmt::Display) -> Box<dyn std::error::Error> {
    let message = error.to_string();
    if message.contains(&path.display().to_string()) {
        format!("{what}: {message}").into()
    } else {
        format!("{what}: {}: {message}", path.display()).into()
    }
}

/// What [`check_reload`] found identical.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReloadCheck {
    /// Rows of both tables.
    pub rows: usize,
    /// Sparse optimizer steps of both.
    pub steps: u64,
    /// Keys whose rows and Adam slots were compared.
    pub keys: usize,
    /// Held-out predictions compared.
    pub predictions: usize,
}

/// Checks that `reloaded` is `trained` saved and loaded: the same table
/// size and sparse optimizer step count, bit-identical rows and Adam slots
/// (`m`, `v`) for up to [`RELOAD_KEYS`] of the trained keys (spread over
/// the table), and bit-identical predictions on `eval`. An error says what
/// differs; a model that has taken no step is an error too, since there
/// would be nothing to compare (a trained table may be empty: `--expire`
/// may have removed every row).
pub fn check_reload<
    A: EmbeddingTable<Key = i64> + 'static,
    B: EmbeddingTable<Key = i64> + 'static,
>(
    trained: &Trainer<A>,
    reloaded: &Trainer<B>,
    eval: &Batch,
) -> Result<ReloadCheck> {
    let (a, b) = (trained.table(), reloaded.table());
    let (a_rows, b_rows) = (a.size()?, b.size()?);
    if trained.steps() == 0 {
        return Err("reload check: the model has taken no step (nothing was trained)".into());
    }
    if a_rows != b_rows {
        return Err(format!(
            "reload check: the reloaded table has {b_rows} rows, the trained one {a_rows}"
        )
        .into());
    }
    if trained.steps() != reloaded.steps() {
        return Err(format!(
            "reload check: the reloaded sparse optimizer has taken {} steps, the trained one {}",
            reloaded.steps(),
            trained.steps()
        )
        .into());
    }
    let keys = sample_keys(a, RELOAD_KEYS)?;
    let dim = a.dim();
    let mut rows = [vec![0.0; keys.len() * dim], vec![0.0; keys.len() * dim]];
    let mut exists = vec![false; keys.len()];
    a.lookup(&keys, &mut rows[0])?;
    b.lookup_with_exists(&keys, &mut rows[1], &mut exists)?;
    if let Some(i) = exists.iter().position(|&e| !e) {
        return Err(format!(
            "reload check: trained key {} is missing after reload",
            keys[i]
        )
        .into());
    }
    compare("row", &keys, dim, &rows[0], &rows[1])?;
    for slot in ADAM_SLOTS {
        a.lookup_slot(a.slot_id(slot)?, &keys, &mut rows[0])?;
        b.lookup_slot(b.slot_id(slot)?, &keys, &mut rows[1])?;
        compare(
            &format!("Adam slot {slot:?}"),
            &keys,
            dim,
            &rows[0],
            &rows[1],
        )?;
    }
    let before = trained.predict(eval)?;
    let after = reloaded.predict(eval)?;
    if before.len() != after.len()
        || before
            .iter()
            .zip(&after)
            .any(|(x, y)| x.to_bits() != y.to_bits())
    {
        return Err("reload check: the reloaded model's held-out predictions differ".into());
    }
    Ok(ReloadCheck {
        rows: a_rows,
        steps: trained.steps(),
        keys: keys.len(),
        predictions: after.len(),
    })
}

/// `min(count, size)` keys of `table`, spread evenly over its export
/// order: the keys at positions `k * size / count` (every key of a table of
/// at most `count` rows).
pub fn sample_keys(table: &impl EmbeddingTable<Key = i64>, count: usize) -> Result<Vec<i64>> {
    let size = table.size()?;
    let count = count.min(size);
    let target = |k: usize| (k as u128 * size as u128 / count.max(1) as u128) as usize;
    let mut keys = Vec::with_capacity(count);
    let mut index = 0;
    for chunk in table.export_chunks(KEYS_PER_CHUNK) {
        for key in chunk?.0 {
            if keys.len() < count && index == target(keys.len()) {
                keys.push(key);
            }
            index += 1;
        }
    }
    Ok(keys)
}

/// An error naming the first key whose `what` (`dim` values a key) differs
/// bitwise between `a` and `b`.
fn compare(what: &str, keys: &[i64], dim: usize, a: &[f32], b: &[f32]) -> Result<()> {
    let differs =
        |(x, y): (&[f32], &[f32])| x.iter().zip(y).any(|(x, y)| x.to_bits() != y.to_bits());
    match a.chunks(dim).zip(b.chunks(dim)).position(differs) {
        Some(i) => Err(format!(
            "reload check: the {what} of key {} differs after reload",
            keys[i]
        )
        .into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auc::roc_auc;
    use crate::data::{Synthetic, SyntheticConfig};
    use crate::source::DataSource;
    use dynemb::{Dtype, Rounding};

    fn config(max_size: Option<usize>) -> ModelConfig {
        ModelConfig {
            fields: 8,
            dim: 8,
            shards: 2,
            seed: 7,
            max_size,
            lifecycle: TableLifecycle::NONE,
            precision: TablePrecision::F32,
        }
    }

    fn data() -> Synthetic {
        Synthetic::new(&SyntheticConfig {
            fields: 8,
            train_samples: 40_000,
            eval_samples: 4_000,
            seed: 3,
        })
        .unwrap()
    }

    #[test]
    fn training_learns_and_a_reloaded_model_predicts_identically() {
        let mut source = data();
        let mut trainer = Trainer::new(config(None)).unwrap();
        let eval = source.eval_set().samples.clone();
        let before = roc_auc(&trainer.predict(&eval).unwrap(), &eval.labels).unwrap();
        let size_before_eval = trainer.table().size();
        let mut first_losses = Vec::new();
        let mut last_losses = Vec::new();
        for epoch in 0..2 {
            source.rewind().unwrap();
            while let Some(batch) = source.next_batch(1024).unwrap() {
                let Step::Trained(loss) = trainer.step(&batch).unwrap() else {
                    panic!("a batch was skipped");
                };
                assert!(loss.is_finite());
                if epoch == 0 && first_losses.len() < 5 {
                    first_losses.push(loss);
                }
                last_losses.push(loss);
            }
        }
        assert_eq!(size_before_eval, 0, "evaluation inserted rows");
        let size = trainer.table().size();
        let predictions = trainer.predict(&eval).unwrap();
        assert_eq!(trainer.table().size(), size, "evaluation inserted rows");
        let after = roc_auc(&predictions, &eval.labels).unwrap();
        assert!(
            after > before + 0.05 && after > 0.65,
            "AUC {before} -> {after}"
        );
        let first = first_losses.iter().sum::<f32>() / first_losses.len() as f32;
        let tail = &last_losses[last_losses.len() - 5..];
        let last = tail.iter().sum::<f32>() / 5.0;
        assert!(last < first, "loss {first} -> {last}");

        let dir = tempfile::tempdir().unwrap();
        trainer.save(dir.path()).unwrap();
        let reloaded = Trainer::load(config(None), dir.path()).unwrap();
        let check = check_reload(&trainer, &reloaded, &eval).unwrap();
        assert_eq!(
            check,
            ReloadCheck {
                rows: size,
                steps: trainer.steps(),
                keys: RELOAD_KEYS,
                predictions: eval.len(),
            }
        );
        assert_eq!(trainer.steps(), 2 * 40_000_u64.div_ceil(1024));
        let again = reloaded.predict(&eval).unwrap();
        assert!(
            predictions
                .iter()
                .zip(&again)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "reloaded predictions differ"
        );
    }

    /// A trainer of `config` after `batches` batches of `batch_size` of
    /// [`data`].
    fn trained(config: ModelConfig, batches: usize, batch_size: usize) -> Trainer {
        let mut source = data();
        let mut trainer = Trainer::new(config).unwrap();
        source.rewind().unwrap();
        for _ in 0..batches {
            let batch = source.next_batch(batch_size).unwrap().unwrap();
            trainer.step(&batch).unwrap();
        }
        trainer
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// The MLP's variables, by name, as bits.
    fn mlp_bits(trainer: &Trainer) -> Vec<(String, Vec<u32>)> {
        let mut vars: Vec<(String, Vec<u32>)> = trainer
            .mlp
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(name, var)| {
                let values: Vec<f32> = var.flatten_all().unwrap().to_vec1().unwrap();
                (name.clone(), bits(&values))
            })
            .collect();
        vars.sort();
        vars
    }

    #[test]
    fn one_seed_gives_bit_identical_training() {
        let eval = data().eval_set().samples.clone();
        let predict = |trainer: &Trainer| bits(&trainer.predict(&eval).unwrap());
        let a = trained(config(None), 5, 512);
        let b = trained(config(None), 5, 512);
        assert_eq!(a.steps(), 5);
        assert_eq!(mlp_bits(&a), mlp_bits(&b), "MLPs differ");
        assert_eq!(predict(&a), predict(&b), "predictions differ");
        let other = trained(
            ModelConfig {
                seed: 8,
                ..config(None)
            },
            5,
            512,
        );
        let (x, y) = (predict(&a), predict(&other));
        let same = x.iter().zip(&y).filter(|(x, y)| x == y).count();
        assert!(
            same < x.len() / 100,
            "{same} of {} predictions equal",
            x.len()
        );
        let mlps = mlp_bits(&a).into_iter().zip(mlp_bits(&other));
        for ((name, x), (_, y)) in mlps {
            assert_ne!(x, y, "{name} ignores the seed");
        }
    }

    #[test]
    fn a_checkpoint_overwrites_the_seeded_mlp() {
        let trainer = trained(config(None), 3, 512);
        let dir = tempfile::tempdir().unwrap();
        trainer.save(dir.path()).unwrap();
        let other_seed = ModelConfig {
            seed: 99,
            ..config(None)
        };
        let fresh = Trainer::new(other_seed.clone()).unwrap();
        assert_ne!(mlp_bits(&fresh), mlp_bits(&trainer));
        let reloaded = Trainer::load(other_seed, dir.path()).unwrap();
        assert_eq!(mlp_bits(&reloaded), mlp_bits(&trainer));
    }

    /// A batch whose loss is NaN is skipped: no row, slot, step count or
    /// MLP weight changes, and the next batch trains.
    #[test]
    fn a_non_finite_loss_is_skipped_and_changes_nothing() {
        let mut trainer = trained(config(None), 3, 256);
        let keys = sample_keys(trainer.table(), RELOAD_KEYS).unwrap();
        let state = |trainer: &Trainer| {
            let table = trainer.table();
            let mut rows = vec![0.0; keys.len() * 8];
            table.lookup(&keys, &mut rows).unwrap();
            let mut all = bits(&rows);
            for slot in ADAM_SLOTS {
                table
                    .lookup_slot(table.slot_id(slot).unwrap(), &keys, &mut rows)
                    .unwrap();
                all.extend(bits(&rows));
            }
            (all, mlp_bits(trainer), trainer.steps())
        };
        let before = state(&trainer);
        let mut source = data();
        let mut batch = source.next_batch(256).unwrap().unwrap();
        batch.labels[5] = f32::NAN;
        match trainer.step(&batch).unwrap() {
            Step::Skipped(loss) => assert!(loss.is_nan()),
            other => panic!("{other:?}"),
        }
        assert!(
            before == state(&trainer),
            "a skipped batch changed the model"
        );
        let batch = source.next_batch(256).unwrap().unwrap();
        assert!(matches!(trainer.step(&batch).unwrap(), Step::Trained(_)));
        assert_eq!(trainer.steps(), 4);
    }

    #[test]
    fn load_errors_name_the_file() {
        let trainer = trained(config(None), 2, 256);
        let dir = tempfile::tempdir().unwrap();
        trainer.save(dir.path()).unwrap();
        for file in [MLP_FILE, SPARSE_FILE] {
            let copy = tempfile::tempdir().unwrap();
            trainer.save(copy.path()).unwrap();
            std::fs::remove_file(copy.path().join(file)).unwrap();
            let message = Trainer::load(config(None), copy.path())
                .err()
                .unwrap()
                .to_string();
            let path = copy.path().join(file).display().to_string();
            assert!(message.contains(&path), "{message}");
        }
        let message = Trainer::load(config(None), &dir.path().join("absent"))
            .err()
            .unwrap()
            .to_string();
        assert!(message.contains("absent"), "{message}");
    }

    /// [`config`] storing values and slots as `values` and `slots`,
    /// rounded `rounding`.
    fn with_precision(values: Dtype, slots: Dtype, rounding: Rounding) -> ModelConfig {
        ModelConfig {
            precision: TablePrecision {
                values,
                slots,
                rounding,
            },
            ..config(None)
        }
    }

    /// Every stored value of `keys` in `table`'s rows and Adam slots.
    fn stored(table: &Variable<i64>, keys: &[i64]) -> Vec<f32> {
        let mut rows = vec![0.0; keys.len() * table.dim()];
        table.lookup(keys, &mut rows).unwrap();
        let mut all = rows.clone();
        for slot in ADAM_SLOTS {
            table
                .lookup_slot(table.slot_id(slot).unwrap(), keys, &mut rows)
                .unwrap();
            all.extend_from_slice(&rows);
        }
        all
    }

    /// With bf16 values and slots the model learns (its loss falls and its
    /// held-out AUC rises as in f32), every value it stores is a bf16 one,
    /// its rows take less memory than f32 rows, and it reloads bit for bit.
    #[test]
    fn a_bf16_table_trains_and_stores_bf16_values() {
        let bf16 = with_precision(Dtype::Bf16, Dtype::Bf16, Rounding::NearestEven);
        let mut trainer = Trainer::new(bf16.clone()).unwrap();
        assert_eq!(
            (trainer.table().value_dtype(), trainer.table().slot_dtype()),
            (Dtype::Bf16, Dtype::Bf16)
        );
        let mut source = data();
        let eval = source.eval_set().samples.clone();
        let before = roc_auc(&trainer.predict(&eval).unwrap(), &eval.labels).unwrap();
        let mut losses = Vec::new();
        while let Some(batch) = source.next_batch(1024).unwrap() {
            let Step::Trained(loss) = trainer.step(&batch).unwrap() else {
                panic!("a batch was skipped");
            };
            losses.push(loss);
        }
        let mean = |losses: &[f32]| losses.iter().sum::<f32>() / losses.len() as f32;
        let (first, last) = (mean(&losses[..5]), mean(&losses[losses.len() - 5..]));
        assert!(last < first, "loss {first} -> {last}");
        let after = roc_auc(&trainer.predict(&eval).unwrap(), &eval.labels).unwrap();
        assert!(
            after > before + 0.05 && after > 0.65,
            "AUC {before} -> {after}"
        );

        let table = trainer.table();
        let keys = sample_keys(table, table.size()).unwrap();
        assert_eq!(keys.len(), table.size());
        let values = stored(table, &keys);
        assert!(values.iter().any(|&v| v != 0.0));
        for v in values {
            assert_eq!(
                Dtype::Bf16.round(v).to_bits(),
                v.to_bits(),
                "{v} is not bf16"
            );
        }

        let f32_run = trained(config(None), losses.len(), 1024);
        assert_eq!(f32_run.table().size(), table.size());
        let (half, full) = (table.memory_bytes(), f32_run.table().memory_bytes());
        assert!(half < full, "bf16 table {half} bytes, f32 table {full}");

        let dir = tempfile::tempdir().unwrap();
        trainer.save(dir.path()).unwrap();
        let reloaded = Trainer::load(bf16, dir.path()).unwrap();
        let check = check_reload(&trainer, &reloaded, &eval).unwrap();
        assert_eq!(check.rows, table.size());
    }

    /// Stochastic rounding of bf16 values: one seed gives bit-identical
    /// runs, every stored value is still a bf16 one, and the rows differ
    /// from nearest-even rounding's.
    #[test]
    fn stochastic_rounding_is_seeded_and_differs_from_nearest_even() {
        let stochastic = with_precision(Dtype::Bf16, Dtype::F32, Rounding::Stochastic { seed: 9 });
        let nearest = with_precision(Dtype::Bf16, Dtype::F32, Rounding::NearestEven);
        let a = trained(stochastic.clone(), 5, 512);
        let b = trained(stochastic, 5, 512);
        let c = trained(nearest, 5, 512);
        assert_eq!(a.table().rounding(), Rounding::Stochastic { seed: 9 });
        let keys = sample_keys(a.table(), RELOAD_KEYS).unwrap();
        let rows = |trainer: &Trainer| {
            let mut rows = vec![0.0; keys.len() * 8];
            trainer.table().lookup(&keys, &mut rows).unwrap();
            rows
        };
        let (x, y, z) = (rows(&a), rows(&b), rows(&c));
        assert_eq!(bits(&x), bits(&y), "one seed, other rows");
        assert!(x.iter().all(|&v| Dtype::Bf16.round(v) == v));
        let differ = x.iter().zip(&z).filter(|(x, z)| x != z).count();
        assert!(differ > 0, "stochastic rounding stored nearest-even rows");
    }

    #[test]
    fn reserved_rows_keep_ninety_percent_rounded_up() {
        for (max, kept) in [(1, 1), (9, 9), (10, 9), (19, 18), (100, 90), (5_000, 4_500)] {
            assert_eq!(reserved_rows(max), kept, "max {max}");
        }
    }

    #[test]
    fn max_size_keeps_the_table_bounded() {
        let mut source = data();
        let mut trainer = Trainer::new(config(Some(5_000))).unwrap();
        source.rewind().unwrap();
        while let Some(batch) = source.next_batch(1024).unwrap() {
            let evicted = trainer.counts().unwrap().restricted;
            trainer.step(&batch).unwrap();
            assert!(trainer.table().size() <= 5_000);
            if trainer.counts().unwrap().restricted > evicted {
                assert_eq!(trainer.table().size(), 4_500);
            }
        }
        assert!(trainer.counts().unwrap().restricted > 0);
    }

    /// [`config`] with `lifecycle`.
    fn with_lifecycle(capacity: Option<usize>, min_count: u32) -> ModelConfig {
        ModelConfig {
            lifecycle: TableLifecycle {
                capacity,
                min_count,
            },
            ..config(None)
        }
    }

    #[test]
    fn a_capacity_bounds_the_table_at_every_step_and_counts_evictions() {
        let mut source = data();
        let mut trainer = Trainer::new(with_lifecycle(Some(3_000), 1)).unwrap();
        assert_eq!(trainer.table().capacity(), Some(3_000));
        while let Some(batch) = source.next_batch(256).unwrap() {
            trainer.step(&batch).unwrap();
            assert!(trainer.table().size() <= 3_000);
        }
        let counts = trainer.counts().unwrap();
        assert!(counts.evicted > 0, "{counts:?}");
        assert_eq!(counts.evicted, trainer.table().lifecycle_stats().evicted);
        assert_eq!((counts.restricted, counts.expired), (0, 0));

        // A reload into a table of the same capacity is the same model.
        let dir = tempfile::tempdir().unwrap();
        trainer.save(dir.path()).unwrap();
        let reloaded = Trainer::load(trainer.config().clone(), dir.path()).unwrap();
        let eval = data().eval_set().samples.clone();
        let check = check_reload(&trainer, &reloaded, &eval).unwrap();
        assert_eq!(check.rows, trainer.table().size());
    }

    /// With a min count of 2, every id's first training read is not
    /// admitted (the data has fewer distinct ids than the pending counts
    /// hold), so those reads number the ids a table without admission
    /// holds, and only ids read twice have rows.
    #[test]
    fn a_min_count_keeps_ids_read_once_out_of_the_table() {
        let plain = trained(config(None), 20, 256);
        let mut admitting = Trainer::new(with_lifecycle(None, 2)).unwrap();
        let mut source = data();
        for _ in 0..20 {
            let batch = source.next_batch(256).unwrap().unwrap();
            admitting.step(&batch).unwrap();
        }
        let (all, admitted) = (plain.table().size(), admitting.table().size());
        assert!(0 < admitted && admitted < all, "{admitted} of {all} ids");
        let counts = admitting.counts().unwrap();
        assert_eq!(counts.not_admitted_reads, all as u64, "{counts:?}");
        assert_eq!((counts.evicted, counts.restricted), (0, 0));

        let dir = tempfile::tempdir().unwrap();
        admitting.save(dir.path()).unwrap();
        let reloaded = Trainer::load(admitting.config().clone(), dir.path()).unwrap();
        let eval = data().eval_set().samples.clone();
        check_reload(&admitting, &reloaded, &eval).unwrap();
    }

    /// `expire` removes the rows not trained for the given time and counts
    /// them; an age no row has reaches none. (Rows trained just before
    /// may go too if the machine is slow: only the sums are exact.)
    #[test]
    fn expire_removes_the_rows_not_trained_for_a_while() {
        let mut trainer = trained(config(None), 3, 256);
        assert_eq!(trainer.expire(Duration::from_secs(3600)).unwrap(), 0);
        let before = trainer.table().size();
        std::thread::sleep(Duration::from_millis(50));
        let mut source = data();
        for _ in 0..3 {
            source.next_batch(256).unwrap();
        }
        trainer
            .step(&source.next_batch(256).unwrap().unwrap())
            .unwrap();
        let grown = trainer.table().size();
        assert!(grown > before);
        let removed = trainer.expire(Duration::from_millis(25)).unwrap();
        assert!(removed > 0);
        assert_eq!(trainer.table().size(), grown - removed);
        assert_eq!(trainer.counts().unwrap().expired, removed as u64);

        // Counts set on resume go on from there.
        let mut resumed = trained(config(None), 1, 256);
        let earlier = RowCounts {
            restricted: 1,
            evicted: 2,
            not_admitted_reads: 3,
            expired: 4,
        };
        resumed.set_counts(earlier).unwrap();
        assert_eq!(resumed.counts().unwrap(), earlier);
        std::thread::sleep(Duration::from_millis(5));
        let gone = resumed.expire(Duration::from_millis(1)).unwrap() as u64;
        assert!(gone > 0);
        assert_eq!(resumed.counts().unwrap().since(&earlier).expired, gone);
    }

    #[test]
    fn small_max_sizes_keep_their_reserved_rows() {
        // One batch's ids (8 fields, `batch` samples) fit in `max`, the
        // smallest table the configuration allows.
        for (max, batch) in [(9, 1), (19, 2), (16, 2)] {
            let mut source = data();
            let mut trainer = Trainer::new(config(Some(max))).unwrap();
            source.rewind().unwrap();
            let mut restricts = 0;
            for _ in 0..20 {
                let batch = source.next_batch(batch).unwrap().unwrap();
                let evicted = trainer.counts().unwrap().restricted;
                trainer.step(&batch).unwrap();
                let size = trainer.table().size();
                assert!(size <= max, "max {max}: {size} rows");
                if trainer.counts().unwrap().restricted > evicted {
                    restricts += 1;
                    assert_eq!(size, reserved_rows(max), "max {max}");
                }
            }
            assert!(restricts > 0, "max {max}: never restricted");
        }
    }

    #[test]
    fn the_reload_check_refuses_an_untrained_model_and_finds_differences() {
        let eval = data().eval_set().samples.clone();
        let untrained = Trainer::new(config(None)).unwrap();
        let message = check_reload(&untrained, &Trainer::new(config(None)).unwrap(), &eval)
            .unwrap_err()
            .to_string();
        assert!(message.contains("no step"), "{message}");

        let trainer = trained(config(None), 3, 256);
        let dir = tempfile::tempdir().unwrap();
        trainer.save(dir.path()).unwrap();
        let load = || Trainer::load(config(None), dir.path()).unwrap();
        let check = check_reload(&trainer, &load(), &eval).unwrap();
        assert_eq!(check.keys, RELOAD_KEYS);

        // One more step: more rows or steps.
        let mut stepped = load();
        let mut source = data();
        source.next_batch(256).unwrap();
        stepped
            .step(&source.next_batch(256).unwrap().unwrap())
            .unwrap();
        let message = check_reload(&trainer, &stepped, &eval)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("rows") || message.contains("steps"),
            "{message}"
        );

        // A second moment changed, rows and predictions untouched.
        let tampered = load();
        let keys = sample_keys(trainer.table(), RELOAD_KEYS).unwrap();
        let v = tampered.table().slot_id("v").unwrap();
        tampered
            .table()
            .update_rows(&keys[7..8], &[v], |_, _, slot| slot[0] *= 2.0)
            .unwrap();
        let message = check_reload(&trainer, &tampered, &eval)
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            format!(
                "reload check: the Adam slot \"v\" of key {} differs after reload",
                keys[7]
            )
        );

        // A row changed.
        let tampered = load();
        tampered
            .table()
            .update_rows(&keys[3..4], &[], |_, row, _| row[0] += 1.0)
            .unwrap();
        let message = check_reload(&trainer, &tampered, &eval)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains(&format!("the row of key {}", keys[3])),
            "{message}"
        );
    }

    #[test]
    fn sampled_keys_are_distinct_table_keys() {
        let trainer = trained(config(None), 2, 64);
        let size = trainer.table().size();
        assert!(size > 100);
        let all = sample_keys(trainer.table(), size + 5).unwrap();
        assert_eq!(all.len(), size);
        let some = sample_keys(trainer.table(), 100).unwrap();
        assert_eq!(some.len(), 100);
        let mut distinct = some.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), some.len());
        let mut exists = vec![false; some.len()];
        let mut rows = vec![0.0; some.len() * 8];
        trainer
            .table()
            .lookup_with_exists(&some, &mut rows, &mut exists)
            .unwrap();
        assert!(exists.iter().all(|&e| e));
    }
}
