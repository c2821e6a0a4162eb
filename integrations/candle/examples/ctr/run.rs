//! One run of the example, from parsed flags to a trained, saved and
//! checked model ([`execute`]). Every mistake that can be found early fails
//! before training, and once training has started nothing discards what
//! was trained.
//!
//! The order makes every mistake that can be found early fail before
//! training: the checkpoint directory is opened and probed (`checkpoint`;
//! with `--resume`, the flags are compared with the checkpoint's run),
//! then the data is opened and its held-out set checked for both classes
//! (`source::check_held_out`), then the model is built or restored. Only
//! then does training start.
//!
//! Once training has started, nothing discards what was trained:
//! - a batch whose loss is not finite is skipped and counted (on its
//!   epoch's line and at the end), and training goes on;
//! - evaluation after an epoch reports a metric it cannot compute as
//!   undefined, and training goes on;
//! - with `--checkpoint`, a checkpoint is written after every epoch and
//!   every `--checkpoint-every` steps; one that fails is reported with the
//!   progress of the last one written, which stays, and training goes on
//!   (the next one tries again; a checkpoint needs room for two copies
//!   while it is written, since the last one is kept until the new one is
//!   complete);
//! - a data error (a malformed Criteo line, say) stops the run after
//!   writing a checkpoint of everything trained until then, whose progress
//!   points at the failing batch: fix the data, then `--resume`;
//! - a failed step other than a skipped one (a Redis node lost mid-write)
//!   may have applied part of the step, so it stops the run without a new
//!   checkpoint: the last one (periodic or per epoch) is what was kept,
//!   and the message says where it is; so does an `--expire` that fails
//!   part-way;
//! - the final save goes to the same checkpoint format (a finished run
//!   resumes with a larger `--epochs`), and the reload check reads it
//!   back; if it fails, the error says which checkpoint is left to
//!   `--resume` from; without `--checkpoint` it goes to a temporary
//!   directory, and nothing is kept.
//!
//! `--expire` runs at the end of each epoch, before its evaluation and
//! checkpoint, so both see the table without the expired rows.
//!
//! A resumed run ([`crate::checkpoint`] says what must match, and that
//! the dtypes may change: the restore converts the table's rows) restores
//! the table, the sparse optimizer (its step count too), the MLP's weights
//! and the counts of the run, and goes on at the first batch the
//! checkpoint had not taken (skipping the ones before it: synthetic data
//! jumps there, Criteo data is read up to it). The MLP's AdamW restarts
//! its moments: candle-nn does not expose them. With `--redis`, the Redis
//! table is not cleared: the checkpoint's table replaces its contents, so
//! rows, MLP and step count agree.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use dynemb::EmbeddingTable;
use indicatif::{ProgressBar, ProgressStyle};

use crate::auc;
use crate::checkpoint::{CheckpointDir, CheckpointError, Mode, Progress, RunConfig, RunManifest};
use crate::config::Config;
use crate::model::TableLifecycle;
use crate::source::{self, Batch, DataSource};
use crate::summary::{self, StreamSummary};
use crate::table;
use crate::train::{self, ModelConfig, Step, Trainer};

/// The errors of a run.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Opens the data a configuration asks for.
pub type OpenData<'a> = dyn FnMut(&Config) -> source::Result<Box<dyn DataSource>> + 'a;

/// What a finished run did.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// How far the run came, in all (a resumed run's earlier part
    /// included).
    pub progress: Progress,
    /// Where the model was saved and checked, with `--checkpoint`.
    pub checkpoint: Option<PathBuf>,
    /// Whether there was anything left to train.
    pub trained: bool,
}

/// Runs `config` on the data `open` gives, writing the run's report to
/// `out` (see the module docs).
pub fn execute(config: &Config, open: &mut OpenData<'_>, out: &mut dyn Write) -> Result<Report> {
    let mode = match (config.resume, config.overwrite) {
        (true, _) => Mode::Resume,
        (false, true) => Mode::Overwrite,
        (false, false) => Mode::New,
    };
    let opened = match &config.checkpoint {
        Some(path) => Some(CheckpointDir::open(path, mode)?),
        None => None,
    };
    let run_config = RunConfig::of(config);
    let (dir, resume) = match opened {
        Some(opened) => {
            for note in &opened.notes {
                writeln!(out, "{note}")?;
            }
            (Some(opened.dir), opened.resume)
        }
        None => (None, None),
    };
    let mut converted = false;
    if let Some(manifest) = &resume {
        manifest.run.check_same(&run_config)?;
        if let Some(note) = manifest.run.conversion(&run_config) {
            writeln!(out, "{note}")?;
            converted = true;
        }
    }

    let mut source = open(config)?;
    writeln!(out, "{}", source.describe())?;
    source::check_held_out(source.eval_set())?;
    if let Some(manifest) = &resume {
        if manifest.train_samples_per_epoch != source.train_samples() {
            return Err(CheckpointError::Changed {
                flag: "--data",
                saved: format!(
                    "{} training samples an epoch",
                    manifest.train_samples_per_epoch
                ),
                asked: format!("data of {}", source.train_samples()),
            }
            .into());
        }
    }
    if config.summary {
        let summary = StreamSummary::stream(source.as_mut(), config.batch, config.steps)?;
        summary.write(source.as_ref(), out)?;
    } else {
        summary::write_ceiling(source.eval_set(), out)?;
    }

    let eval = source.eval_set().samples.clone();
    let ceiling = match &source.eval_set().truth {
        Some(truth) => auc::roc_auc(truth, &eval.labels).ok(),
        None => None,
    };
    let model_config = ModelConfig {
        fields: source.fields(),
        dim: config.dim,
        shards: config.threads.max(1),
        seed: config.seed,
        max_size: config.max_size,
        lifecycle: TableLifecycle {
            capacity: config.capacity,
            min_count: config.min_count,
        },
        precision: config.precision,
    };
    let training = Training {
        config,
        eval: &eval,
        ceiling,
        dir: dir.as_ref(),
        manifest: RunManifest {
            format: crate::checkpoint::FORMAT,
            run: run_config,
            train_samples_per_epoch: source.train_samples(),
            progress: resume
                .as_ref()
                .map(|m| m.progress.clone())
                .unwrap_or_default(),
        },
        resumed: resume.is_some(),
        converted,
    };
    let resume_from = resume.as_ref().and(dir.as_ref()).map(CheckpointDir::path);
    match &config.redis {
        None => {
            let trainer = match resume_from {
                Some(path) => Trainer::load(model_config, path)?,
                None => Trainer::new(model_config)?,
            };
            training.run(trainer, source.as_mut(), out)
        }
        Some(choice) => {
            let fresh = resume_from.is_none();
            let (table, left) =
                table::open_redis(choice, config.dim, config.seed, fresh && config.overwrite)?;
            if fresh && left > 0 && !config.overwrite {
                // Nothing cleared, nothing destroyed: the rows may be a
                // live run's.
                return Err(format!(
                    "the Redis table {}:{} holds {left} rows, another run's (one still \
                     training, or one that stopped without destroying it): --overwrite \
                     clears it, --redis-prefix chooses another table, --resume with that \
                     run's --checkpoint continues it",
                    choice.prefix,
                    crate::model::TABLE_NAME
                )
                .into());
            }
            let handle = table.clone();
            let result = match resume_from {
                Some(path) => Trainer::resume(model_config, table, path).and_then(|trainer| {
                    writeln!(
                        out,
                        "restored the checkpoint's table ({} rows) into the Redis table \
                         {}:{}, replacing the {left} rows it held",
                        trainer.table().size()?,
                        choice.prefix,
                        crate::model::TABLE_NAME
                    )?;
                    Ok(trainer)
                }),
                None => {
                    if left > 0 {
                        writeln!(
                            out,
                            "cleared the {left} rows the Redis table held (--overwrite)"
                        )?;
                    }
                    Trainer::with_table(model_config, table)
                }
            }
            .and_then(|trainer| training.run(trainer, source.as_mut(), out));
            // Destroyed also when training failed; the training error wins.
            let destroyed: Result<()> = if choice.keep {
                writeln!(
                    out,
                    "kept the Redis table {}:{}",
                    choice.prefix,
                    crate::model::TABLE_NAME
                )
                .map_err(Into::into)
            } else {
                handle.destroy().map_err(Into::into)
            };
            let report = result?;
            destroyed?;
            Ok(report)
        }
    }
}

/// What training needs besides the trainer and the data.
struct Training<'a> {
    config: &'a Config,
    eval: &'a Batch,
    /// The hidden model's held-out AUC, if known.
    ceiling: Option<f64>,
    /// The checkpoint directory, with `--checkpoint`.
    dir: Option<&'a CheckpointDir>,
    /// The run's manifest; its progress is the run's, updated as it goes.
    manifest: RunManifest,
    /// Whether the run resumes a checkpoint (the manifest's progress).
    resumed: bool,
    /// Whether the resumed table's rows were converted to other dtypes.
    converted: bool,
}

/// Why training stopped early.
enum Stopped {
    /// The data could not be read, or the report not written: the model
    /// is as the last step left it.
    Clean(Box<dyn std::error::Error>),
    /// A step failed, maybe after applying part of it.
    Step(Box<dyn std::error::Error>),
}

impl From<source::DataError> for Stopped {
    fn from(error: source::DataError) -> Self {
        Stopped::Clean(error.into())
    }
}

impl Training<'_> {
    /// Trains `trainer` from the manifest's progress to the configured
    /// epochs and steps, checkpointing as it goes, then saves and checks a
    /// reload.
    fn run<T: EmbeddingTable<Key = i64> + 'static>(
        mut self,
        mut trainer: Trainer<T>,
        source: &mut dyn DataSource,
        out: &mut dyn Write,
    ) -> Result<Report> {
        let config = self.config;
        let resumed = self.resumed;
        if resumed {
            let progress = &self.manifest.progress;
            if trainer.steps() != progress.steps {
                return Err(format!(
                    "checkpoint {}: {} says {} steps, but the sparse optimizer's state {} steps",
                    self.dir
                        .map_or(Path::new(""), CheckpointDir::path)
                        .display(),
                    crate::checkpoint::RUN_FILE,
                    progress.steps,
                    trainer.steps()
                )
                .into());
            }
            trainer.set_counts(progress.rows)?;
            let table = if self.converted {
                "the table and its Adam slots resume converted as said above, the sparse \
                 optimizer's step exactly"
            } else {
                "the table, its Adam slots and the sparse optimizer's step resume exactly"
            };
            writeln!(
                out,
                "resuming the run: {progress}; {table}, the MLP's AdamW restarts its moments \
                 (candle-nn does not expose them)"
            )?;
        }
        let progress = &self.manifest.progress;
        if progress.epochs_done >= config.epochs || progress.batches() >= self.step_limit() {
            writeln!(
                out,
                "nothing to train: the run has done {} of --epochs {} ({} batches{}); \
                 raise --epochs or --steps to train more",
                progress.epochs_done,
                config.epochs,
                progress.batches(),
                config
                    .steps
                    .map_or(String::new(), |steps| format!(" of --steps {steps}"))
            )?;
            return Ok(Report {
                progress: progress.clone(),
                checkpoint: self.dir.map(|d| d.path().to_path_buf()),
                trained: false,
            });
        }
        let mut saved = resumed.then(|| self.manifest.progress.clone());
        match self.train(&mut trainer, source, &mut saved, out) {
            Ok(()) => {}
            Err(Stopped::Clean(error)) => {
                let progress = &self.manifest.progress;
                let untrained = *progress == Progress::default();
                let written = match saved.as_ref() == Some(progress) || untrained {
                    true => Ok(()),
                    false => self
                        .dir
                        .map_or(Ok(()), |dir| self.checkpoint(&trainer, dir)),
                };
                let kept = match self.dir {
                    Some(_) if untrained => String::new(),
                    Some(dir) => match written {
                        Ok(()) => format!(
                            "; what was trained is in {} ({progress}): fix the cause, then \
                             --resume",
                            dir.path().display(),
                        ),
                        Err(e) => format!("; saving what was trained failed too: {e}"),
                    },
                    None => String::new(),
                };
                return Err(format!("{error}{kept}").into());
            }
            Err(Stopped::Step(error)) => {
                return Err(format!(
                    "a training step failed, perhaps after applying part of it, so no \
                     checkpoint of it is written: {error}; {}",
                    last_checkpoint(saved.as_ref(), self.dir)
                )
                .into());
            }
        }
        let progress = self.manifest.progress.clone();
        if progress.skipped > 0 {
            writeln!(
                out,
                "skipped {} batches whose loss was not finite (NaN or infinite); they \
                 trained nothing",
                progress.skipped
            )?;
        }
        let started = Instant::now();
        let temporary;
        let checked_dir: PathBuf = match self.dir {
            Some(dir) => {
                if saved.as_ref() != Some(&progress) {
                    self.checkpoint(&trainer, dir).map_err(|e| {
                        format!(
                            "the final checkpoint ({progress}) failed: {e}; {}",
                            last_checkpoint(saved.as_ref(), Some(dir))
                        )
                    })?;
                }
                dir.path().to_path_buf()
            }
            None => {
                temporary = tempfile::tempdir().map_err(|e| {
                    format!(
                        "cannot create a temporary directory in {}: {e}",
                        std::env::temp_dir().display()
                    )
                })?;
                let path = temporary.path().join("ctr");
                trainer.save(&path)?;
                path
            }
        };
        let reloaded = Trainer::load(trainer.config().clone(), &checked_dir)?;
        let check = train::check_reload(&trainer, &reloaded, self.eval)?;
        writeln!(
            out,
            "saved to {}{} and reloaded into a local table; identical: table size ({} rows), \
             sparse optimizer steps ({}), rows and Adam slots m, v of {} sampled keys, \
             predictions on {} held-out samples",
            checked_dir.display(),
            if self.dir.is_none() {
                " (temporary: --checkpoint DIR keeps the run)"
            } else {
                ""
            },
            check.rows,
            check.steps,
            check.keys,
            check.predictions
        )?;
        writeln!(out, "reload check {:.1} s", started.elapsed().as_secs_f64())?;
        Ok(Report {
            progress,
            checkpoint: self.dir.map(|d| d.path().to_path_buf()),
            trained: true,
        })
    }

    /// Batches the run may take in all (`--steps`).
    fn step_limit(&self) -> u64 {
        self.config.steps.unwrap_or(u64::MAX)
    }

    /// The epochs: batches, skipped ones counted, periodic checkpoints,
    /// an evaluation and a checkpoint after each epoch. `saved` is the
    /// progress of the last checkpoint written.
    fn train<T: EmbeddingTable<Key = i64> + 'static>(
        &mut self,
        trainer: &mut Trainer<T>,
        source: &mut dyn DataSource,
        saved: &mut Option<Progress>,
        out: &mut dyn Write,
    ) -> std::result::Result<(), Stopped> {
        let config = self.config;
        let step_error = |e: Box<dyn std::error::Error>| Stopped::Step(e);
        let batches_per_epoch = source.train_samples().div_ceil(config.batch) as u64;
        while self.manifest.progress.epochs_done < config.epochs
            && self.manifest.progress.batches() < self.step_limit()
        {
            let progress = &self.manifest.progress;
            let epoch = progress.epochs_done + 1;
            source.rewind()?;
            if progress.batch > 0 {
                let skipped = source.skip_batches(progress.batch, config.batch)?;
                if skipped < progress.batch {
                    return Err(Stopped::from(source::DataError::Invalid(format!(
                        "the checkpoint's run had taken {} batches of epoch {epoch}, the \
                         data now holds {skipped}",
                        progress.batch
                    ))));
                }
            }
            let left = self.step_limit() - progress.batches();
            let bar = progress_bar(
                batches_per_epoch.min(progress.batch.saturating_add(left)),
                progress.batch,
                epoch,
            );
            let started = Instant::now();
            let mut samples_here = 0usize;
            let mut ended = false;
            while self.manifest.progress.batches() < self.step_limit() {
                let Some(batch) = source.next_batch(config.batch)? else {
                    ended = true;
                    break;
                };
                let step = trainer.step(&batch).map_err(step_error)?;
                let rows = trainer.counts().map_err(step_error)?;
                let progress = &mut self.manifest.progress;
                progress.batch += 1;
                progress.rows = rows;
                match step {
                    Step::Trained(loss) => {
                        progress.steps += 1;
                        progress.epoch_trained += 1;
                        progress.epoch_samples += batch.len() as u64;
                        progress.epoch_loss_sum += f64::from(loss);
                        samples_here += batch.len();
                    }
                    Step::Skipped(_) => {
                        progress.skipped += 1;
                        progress.epoch_skipped += 1;
                    }
                }
                bar.set_message(format!(
                    "loss {:.4}, {:.0} samples/s{}",
                    progress.epoch_loss_sum / progress.epoch_trained.max(1) as f64,
                    samples_here as f64 / started.elapsed().as_secs_f64(),
                    skipped_note(progress.epoch_skipped)
                ));
                bar.inc(1);
                // Not at the epoch's or the run's last batch: a checkpoint
                // follows then anyway.
                let due = config
                    .checkpoint_every
                    .is_some_and(|every| progress.steps.is_multiple_of(every))
                    && matches!(step, Step::Trained(_))
                    && progress.batch < batches_per_epoch
                    && progress.batches() < self.step_limit();
                if due {
                    if let Some(dir) = self.dir {
                        bar.suspend(|| self.checkpoint_or_warn(trainer, dir, saved, out));
                    }
                }
            }
            // A pass that took every batch of the data ends the epoch,
            // even when --steps ends the run at the same batch.
            ended = ended || self.manifest.progress.batch >= batches_per_epoch;
            bar.finish_and_clear();
            let seconds = started.elapsed().as_secs_f64();
            if let (true, Some(older_than)) = (ended, config.expire) {
                trainer.expire(older_than).map_err(|e| {
                    Stopped::Step(format!("--expire after epoch {epoch}: {e}").into())
                })?;
                self.manifest.progress.rows = trainer.counts().map_err(step_error)?;
            }
            self.report_epoch(trainer, epoch, samples_here as f64 / seconds, out)
                .map_err(Stopped::Clean)?;
            if ended {
                self.manifest.progress.finish_epoch();
            }
            if let Some(dir) = self.dir {
                self.checkpoint_or_warn(trainer, dir, saved, out);
            }
        }
        Ok(())
    }

    /// Writes the epoch's line: training loss and speed, held-out metrics
    /// (undefined ones say so), the table's size and memory, what the
    /// epoch evicted (`--max-size` and `--capacity`), the reads of ids not
    /// yet admitted (with `--min-count` above 1) and the rows expired (with
    /// `--expire`), and skipped batches.
    fn report_epoch<T: EmbeddingTable<Key = i64> + 'static>(
        &self,
        trainer: &Trainer<T>,
        epoch: usize,
        speed: f64,
        out: &mut dyn Write,
    ) -> Result<()> {
        let progress = &self.manifest.progress;
        let held_out = match trainer.predict(self.eval) {
            Ok(predictions) => held_out_metrics(&predictions, &self.eval.labels, self.ceiling),
            Err(e) => format!("held-out: not evaluated ({e})"),
        };
        let memory = match trainer.table().memory_bytes() {
            Ok(bytes) => format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64),
            Err(e) => format!("? MiB ({e})"),
        };
        let place = if self.config.redis.is_some() {
            " in Redis"
        } else {
            ""
        };
        let rows = match trainer.table().size() {
            Ok(rows) => rows.to_string(),
            Err(e) => format!("? ({e})"),
        };
        let epoch_rows = progress.rows.since(&progress.epoch_start);
        let mut lifecycle = format!("{} evicted", epoch_rows.restricted + epoch_rows.evicted);
        if self.config.min_count > 1 {
            lifecycle += &format!(", {} reads not admitted", epoch_rows.not_admitted_reads);
        }
        if self.config.expire.is_some() {
            lifecycle += &format!(", {} expired", epoch_rows.expired);
        }
        writeln!(
            out,
            "epoch {epoch}: train loss {}, {speed:.0} samples/s | {held_out} | table {rows} \
             rows, {memory}{place}; this epoch {lifecycle}{}",
            match progress.epoch_trained {
                0 => "undefined (no batch trained)".to_string(),
                trained => format!("{:.4}", progress.epoch_loss_sum / trained as f64),
            },
            skipped_note(progress.epoch_skipped),
        )?;
        Ok(())
    }

    /// Writes a checkpoint of the trainer and the run's progress.
    fn checkpoint<T: EmbeddingTable<Key = i64> + 'static>(
        &self,
        trainer: &Trainer<T>,
        dir: &CheckpointDir,
    ) -> Result<()> {
        dir.publish(&self.manifest, |staging| trainer.save(staging))
    }

    /// [`Training::checkpoint`], unless the last one is of this progress
    /// already; reports it on `out` (a failed write to `out` is ignored
    /// here: the next line's write reports it). A failure is reported and
    /// training goes on.
    fn checkpoint_or_warn<T: EmbeddingTable<Key = i64> + 'static>(
        &self,
        trainer: &Trainer<T>,
        dir: &CheckpointDir,
        saved: &mut Option<Progress>,
        out: &mut dyn Write,
    ) {
        let progress = &self.manifest.progress;
        if saved.as_ref() == Some(progress) {
            return;
        }
        match self.checkpoint(trainer, dir) {
            Ok(()) => {
                *saved = Some(progress.clone());
                let _ = writeln!(out, "checkpoint {}: {progress}", dir.path().display());
            }
            Err(e) => {
                let _ = writeln!(
                    out,
                    "warning: the checkpoint at step {} failed ({e}); {}; training goes on",
                    progress.steps,
                    last_checkpoint(saved.as_ref(), Some(dir))
                );
            }
        }
    }
}

/// What a run that could not write a checkpoint still has: `saved`, the
/// progress of the last checkpoint it wrote or resumed, in `dir`.
fn last_checkpoint(saved: Option<&Progress>, dir: Option<&CheckpointDir>) -> String {
    match (saved, dir) {
        (Some(progress), Some(dir)) => format!(
            "the last checkpoint is {} ({progress}): --resume continues from it",
            dir.path().display()
        ),
        (None, Some(dir)) => format!(
            "no checkpoint of this run was written to {} yet",
            dir.path().display()
        ),
        (_, None) => "no checkpoint was written (no --checkpoint)".to_string(),
    }
}

/// `, N batches skipped (loss not finite)` if `skipped` is not 0.
fn skipped_note(skipped: u64) -> String {
    if skipped == 0 {
        String::new()
    } else {
        format!(", {skipped} batches skipped (loss not finite)")
    }
}

/// The held-out part of an epoch's line: log-loss and AUC, each
/// `undefined (why)` when it cannot be computed.
fn held_out_metrics(predictions: &[f32], labels: &[f32], ceiling: Option<f64>) -> String {
    let loss = match auc::log_loss(predictions, labels) {
        Ok(loss) => format!("{loss:.4}"),
        Err(e) => format!("undefined ({e})"),
    };
    let auc = match auc::roc_auc(predictions, labels) {
        Ok(auc) => format!("{auc:.4}"),
        Err(e) => format!("undefined ({e})"),
    };
    format!(
        "held-out loss {loss}, AUC {auc}{}",
        ceiling.map_or(String::new(), |c| format!(" (hidden model {c:.4})"))
    )
}

/// A progress bar over one epoch's batches, from `done`, with the loss and
/// speed as its message (drawn only on a terminal).
fn progress_bar(batches: u64, done: u64, epoch: usize) -> ProgressBar {
    let bar = ProgressBar::new(batches);
    if let Ok(style) =
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} batches, {msg} ({eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(epoch.to_string());
    bar.set_position(done);
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Environment;
    use crate::data::{Synthetic, SyntheticConfig};
    use crate::model::TablePrecision;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Flags of a tiny synthetic run (10 batches an epoch); `args` add
    /// to them or replace them.
    fn synthetic(args: &[&str]) -> Config {
        let base = [
            ("--fields", "4"),
            ("--train-samples", "1000"),
            ("--eval-samples", "400"),
            ("--dim", "4"),
            ("--batch", "100"),
            ("--seed", "3"),
        ];
        let mut all: Vec<&str> = Vec::new();
        for (flag, value) in base {
            if !args.iter().any(|a| a.split('=').next() == Some(flag)) {
                all.extend([flag, value]);
            }
        }
        all.extend(args);
        parse(&all)
    }

    fn parse(args: &[&str]) -> Config {
        let env = Environment {
            rayon_threads: None,
            cores: 1,
        };
        Config::try_parse_from(std::iter::once("ctr").chain(args.iter().copied()), &env)
            .unwrap_or_else(|error| panic!("{args:?} gave {error}"))
    }

    /// A data source that records the batches training reads, and can
    /// poison some (a NaN label) or fail at one.
    struct Recorded {
        inner: Box<dyn DataSource>,
        read: Rc<RefCell<Vec<Batch>>>,
        /// `next_batch` calls (of this source) whose batch gets a NaN label.
        poison: Vec<usize>,
        /// The `next_batch` call (of this source) that fails.
        fail_at: Option<usize>,
        calls: usize,
    }

    impl DataSource for Recorded {
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn fields(&self) -> usize {
            self.inner.fields()
        }
        fn field_name(&self, field: usize) -> String {
            self.inner.field_name(field)
        }
        fn train_samples(&self) -> usize {
            self.inner.train_samples()
        }
        fn rewind(&mut self) -> source::Result<()> {
            self.inner.rewind()
        }
        fn next_batch(&mut self, batch_size: usize) -> source::Result<Option<Batch>> {
            let call = self.calls;
            self.calls += 1;
            if self.fail_at == Some(call) {
                return Err(source::DataError::Invalid("the disk is on fire".into()));
            }
            let mut batch = self.inner.next_batch(batch_size)?;
            if let Some(batch) = &mut batch {
                self.read.borrow_mut().push(batch.clone());
                if self.poison.contains(&call) {
                    batch.labels[0] = f32::NAN;
                }
            }
            Ok(batch)
        }
        fn eval_set(&self) -> &source::EvalSet {
            self.inner.eval_set()
        }
        fn skip_batches(&mut self, batches: u64, batch_size: usize) -> source::Result<u64> {
            self.inner.skip_batches(batches, batch_size)
        }
    }

    /// What a run read and wrote, and whether it opened the data.
    struct Outcome {
        result: Result<Report>,
        read: Vec<Batch>,
        opened: bool,
        output: String,
    }

    /// Runs `config` on its data, recorded, with `poison` and `fail_at`
    /// (see [`Recorded`]).
    fn go(config: &Config, poison: &[usize], fail_at: Option<usize>) -> Outcome {
        let read = Rc::new(RefCell::new(Vec::new()));
        let mut opened = false;
        let mut output = Vec::new();
        let result = {
            let mut open = |config: &Config| -> source::Result<Box<dyn DataSource>> {
                opened = true;
                let inner = crate::open_source(config)?;
                Ok(Box::new(Recorded {
                    inner,
                    read: read.clone(),
                    poison: poison.to_vec(),
                    fail_at,
                    calls: 0,
                }))
            };
            execute(config, &mut open, &mut output)
        };
        let read = read.borrow().clone();
        Outcome {
            result,
            read,
            opened,
            output: String::from_utf8(output).unwrap(),
        }
    }

    fn ok(outcome: &Outcome) -> &Report {
        match &outcome.result {
            Ok(report) => report,
            Err(e) => panic!("{e}\n{}", outcome.output),
        }
    }

    fn err(outcome: &Outcome) -> String {
        match &outcome.result {
            Ok(report) => panic!("succeeded: {report:?}\n{}", outcome.output),
            Err(e) => e.to_string(),
        }
    }

    fn manifest(dir: &Path) -> RunManifest {
        RunManifest::read(dir).unwrap()
    }

    /// The trainer of [`synthetic`]'s model after `batches` batches read
    /// straight from the data, in one process.
    fn trained_directly(batches: usize) -> (Trainer, Batch) {
        let mut source = Synthetic::new(&SyntheticConfig {
            fields: 4,
            train_samples: 1000,
            eval_samples: 400,
            seed: 3,
        })
        .unwrap();
        let mut trainer = Trainer::new(ModelConfig {
            fields: 4,
            dim: 4,
            shards: 1,
            seed: 3,
            max_size: None,
            lifecycle: TableLifecycle::NONE,
            precision: TablePrecision::F32,
        })
        .unwrap();
        let mut taken = 0;
        while taken < batches {
            source.rewind().unwrap();
            while taken < batches {
                let Some(batch) = source.next_batch(100).unwrap() else {
                    break;
                };
                trainer.step(&batch).unwrap();
                taken += 1;
            }
        }
        (trainer, source.eval_set().samples.clone())
    }

    /// A run stopped part-way (by `--steps`, after periodic checkpoints)
    /// and resumed is the same run: the checkpoint holds the model one
    /// uninterrupted process trains on the same batches (table size, rows,
    /// Adam slots, steps, predictions), and the resumed run reads exactly
    /// the batches the uninterrupted run reads after them. `--epochs` and
    /// `--steps` count in total, and a finished run resumes with more
    /// epochs. A crash between the renames of a checkpoint is repaired.
    #[test]
    fn a_resumed_run_is_the_same_run() {
        let root = tempfile::tempdir().unwrap();
        let reference_dir = root.path().join("reference");
        let dir = root.path().join("ckpt");
        let (reference_path, path) = (
            reference_dir.display().to_string(),
            dir.display().to_string(),
        );
        let reference = go(
            &synthetic(&["--epochs", "2", "--checkpoint", &reference_path]),
            &[],
            None,
        );
        assert_eq!(ok(&reference).progress.steps, 20);
        assert_eq!(reference.read.len(), 20);

        let first = go(
            &synthetic(&[
                "--epochs",
                "2",
                "--steps",
                "13",
                "--checkpoint-every",
                "5",
                "--checkpoint",
                &path,
            ]),
            &[],
            None,
        );
        let report = ok(&first);
        assert_eq!(first.read, reference.read[..13]);
        let progress = &report.progress;
        assert_eq!(
            (progress.epochs_done, progress.batch, progress.steps),
            (1, 3, 13)
        );
        assert_eq!(manifest(&dir).progress, *progress);
        let (direct, eval) = trained_directly(13);
        let loaded = Trainer::load(direct.config().clone(), &dir).unwrap();
        let check = train::check_reload(&direct, &loaded, &eval).unwrap();
        assert_eq!(check.steps, 13);

        // A crash between the two renames of a later checkpoint.
        std::fs::rename(&dir, root.path().join(".ckpt.ctr-previous")).unwrap();
        std::fs::create_dir(root.path().join(".ckpt.ctr-staging")).unwrap();

        let resumed = go(
            &synthetic(&["--epochs", "2", "--checkpoint", &path, "--resume"]),
            &[],
            None,
        );
        let report = ok(&resumed);
        assert!(resumed.output.contains("recovered"), "{}", resumed.output);
        assert!(resumed.output.contains("AdamW restarts its moments"));
        assert_eq!(
            resumed.read,
            reference.read[13..],
            "the data did not resume"
        );
        assert_eq!(
            (report.progress.epochs_done, report.progress.steps),
            (2, 20)
        );
        let rows = |dir: &Path| {
            Trainer::load(direct.config().clone(), dir)
                .unwrap()
                .table()
                .size()
        };
        assert_eq!(rows(&dir), rows(&reference_dir));

        // Done: nothing to train unless --epochs grows.
        let again = go(
            &synthetic(&["--epochs", "2", "--checkpoint", &path, "--resume"]),
            &[],
            None,
        );
        assert!(!ok(&again).trained);
        assert!(again.output.contains("nothing to train"));
        let more = go(
            &synthetic(&["--epochs", "3", "--checkpoint", &path, "--resume"]),
            &[],
            None,
        );
        assert_eq!(ok(&more).progress.steps, 30);
        assert_eq!(more.read, reference.read[..10]);
    }

    /// A resumed run with another data or model flag is refused naming
    /// it, before the data is opened; --threads, --epochs may change.
    #[test]
    fn a_resumed_run_with_changed_flags_is_refused_naming_the_flag() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt").display().to_string();
        ok(&go(
            &synthetic(&["--steps", "4", "--checkpoint", &path]),
            &[],
            None,
        ));
        for (flag, value) in [
            ("--batch", "50"),
            ("--seed", "4"),
            ("--dim", "8"),
            ("--eval-samples", "300"),
            ("--train-samples", "900"),
            ("--max-size", "10000"),
            ("--capacity", "10000"),
            ("--min-count", "2"),
            ("--fields", "5"),
        ] {
            let outcome = go(
                &synthetic(&[flag, value, "--checkpoint", &path, "--resume"]),
                &[],
                None,
            );
            let message = err(&outcome);
            assert!(message.starts_with(&format!("{flag}: ")), "{message}");
            assert!(!outcome.opened, "{flag}: the data was opened");
        }
        let outcome = go(
            &synthetic(&[
                "--threads",
                "2",
                "--expire",
                "3600",
                "--steps",
                "6",
                "--checkpoint",
                &path,
                "--resume",
            ]),
            &[],
            None,
        );
        assert_eq!(ok(&outcome).progress.steps, 6);
    }

    /// A resumed run may store other dtypes: the checkpoint's table is
    /// converted as it is restored, the output says so, and the manifest
    /// it writes records the new dtypes.
    #[test]
    fn a_resumed_run_may_change_the_dtypes() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt").display().to_string();
        let first = go(
            &synthetic(&["--steps", "4", "--checkpoint", &path]),
            &[],
            None,
        );
        ok(&first);
        let dir = root.path().join("ckpt");
        assert_eq!(
            (
                manifest(&dir).run.value_dtype,
                manifest(&dir).run.slot_dtype
            ),
            (dynemb::Dtype::F32, dynemb::Dtype::F32)
        );
        let resumed = go(
            &synthetic(&[
                "--dtype",
                "bf16",
                "--slot-dtype",
                "bf16",
                "--steps",
                "7",
                "--checkpoint",
                &path,
                "--resume",
            ]),
            &[],
            None,
        );
        assert_eq!(ok(&resumed).progress.steps, 7);
        assert!(
            resumed.output.contains(
                "the checkpoint's table stores values f32, slots f32; this run stores \
                 values bf16, slots bf16: its rows are converted as they are restored \
                 (rounded to nearest even)"
            ),
            "{}",
            resumed.output
        );
        let run = manifest(&dir).run;
        assert_eq!(
            (run.value_dtype, run.slot_dtype),
            (dynemb::Dtype::Bf16, dynemb::Dtype::Bf16)
        );
        // And back to f32, widening.
        let back = go(
            &synthetic(&["--steps", "9", "--checkpoint", &path, "--resume"]),
            &[],
            None,
        );
        assert_eq!(ok(&back).progress.steps, 9);
        assert!(back.output.contains("(widened exactly)"), "{}", back.output);
    }

    /// The epoch lines of `outcome`.
    fn epoch_lines(outcome: &Outcome) -> Vec<&str> {
        outcome
            .output
            .lines()
            .filter(|l| l.starts_with("epoch "))
            .collect()
    }

    /// The number before `what` in `line` (`"12 evicted"`).
    fn count_before(line: &str, what: &str) -> u64 {
        let before = line
            .split(what)
            .next()
            .and_then(|head| head.split_whitespace().last());
        before
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count of {what:?} in {line}"))
    }

    /// The table's rows on an epoch line.
    fn table_rows(line: &str) -> usize {
        let rows = line
            .split("| table ")
            .nth(1)
            .and_then(|t| t.split(' ').next());
        rows.and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no table rows in {line}"))
    }

    /// Each epoch's line counts what that epoch evicted, did not admit and
    /// expired (the last two only with their flags); the counts go on
    /// across a resumed epoch.
    #[test]
    fn epoch_lines_count_the_epochs_evictions_admissions_and_expiries() {
        let plain = go(&synthetic(&["--epochs", "2"]), &[], None);
        ok(&plain);
        for line in epoch_lines(&plain) {
            assert!(line.contains("; this epoch 0 evicted"), "{line}");
            assert!(!line.contains("admitted") && !line.contains("expired"));
        }
        let plain_rows = table_rows(epoch_lines(&plain)[1]);

        // One batch holds 400 ids.
        let bounded = go(
            &synthetic(&["--epochs", "2", "--capacity", "500"]),
            &[],
            None,
        );
        ok(&bounded);
        let lines = epoch_lines(&bounded);
        assert_eq!(lines.len(), 2);
        for line in &lines {
            assert!(table_rows(line) <= 500, "{line}");
            assert!(count_before(line, " evicted") > 0, "{line}");
        }

        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt").display().to_string();
        let admitting = |extra: &[&str]| {
            let mut args = vec![
                "--epochs",
                "2",
                "--min-count",
                "2",
                "--expire",
                "3600",
                "--checkpoint",
                &path,
            ];
            args.extend(extra);
            synthetic(&args)
        };
        let whole = go(&admitting(&[]), &[], None);
        ok(&whole);
        let lines = epoch_lines(&whole);
        let first = count_before(lines[0], " reads not admitted");
        let second = count_before(lines[1], " reads not admitted");
        // The first epoch reads every id once or more and admits those it
        // reads twice; the second pass reads each again, admitting the rest.
        assert!(first > 0 && second == 0, "{lines:?}");
        assert!(table_rows(lines[0]) < plain_rows, "{lines:?}");
        assert_eq!(table_rows(lines[1]), plain_rows, "{lines:?}");
        for line in &lines {
            assert!(line.ends_with(", 0 expired"), "{line}");
        }
        let run_total = manifest(&root.path().join("ckpt")).progress.rows;
        assert_eq!(run_total.not_admitted_reads, first + second);

        // Stopped in the first epoch and resumed: the same counts.
        let overwrite = go(&admitting(&["--overwrite", "--steps", "4"]), &[], None);
        ok(&overwrite);
        let resumed = go(&admitting(&["--resume"]), &[], None);
        ok(&resumed);
        let resumed_lines = epoch_lines(&resumed);
        assert_eq!(
            count_before(resumed_lines[0], " reads not admitted"),
            first,
            "{resumed_lines:?}"
        );
        assert_eq!(
            count_before(resumed_lines[1], " reads not admitted"),
            second
        );
    }

    /// A directory holding a checkpoint is refused to a new run, before
    /// the data is opened and without touching it; --overwrite replaces
    /// it.
    #[test]
    fn another_runs_checkpoint_is_replaced_only_with_overwrite() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ckpt");
        let path = dir.display().to_string();
        ok(&go(
            &synthetic(&["--steps", "3", "--checkpoint", &path]),
            &[],
            None,
        ));
        let before = std::fs::read(dir.join(crate::checkpoint::RUN_FILE)).unwrap();
        let refused = go(&synthetic(&["--checkpoint", &path]), &[], None);
        let message = err(&refused);
        assert!(
            message.contains("--resume") && message.contains("--overwrite"),
            "{message}"
        );
        assert!(!refused.opened);
        assert_eq!(
            std::fs::read(dir.join(crate::checkpoint::RUN_FILE)).unwrap(),
            before
        );
        let replaced = go(
            &synthetic(&[
                "--seed",
                "9",
                "--steps",
                "2",
                "--checkpoint",
                &path,
                "--overwrite",
            ]),
            &[],
            None,
        );
        assert_eq!(ok(&replaced).progress.steps, 2);
        assert_eq!(manifest(&dir).run.seed, 9);
    }

    /// A checkpoint path under a regular file fails before the data is
    /// opened, naming the path.
    #[test]
    fn a_bad_checkpoint_path_fails_before_training_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("file");
        std::fs::write(&file, "not a directory").unwrap();
        for path in [file.join("ckpt"), file.clone()] {
            let shown = path.display().to_string();
            let outcome = go(&synthetic(&["--checkpoint", &shown]), &[], None);
            let message = err(&outcome);
            assert!(message.contains(&shown), "{message}");
            assert!(!outcome.opened && outcome.read.is_empty());
        }
    }

    /// A held-out set of one class is an error naming --eval-samples when
    /// the data is opened, before any training.
    #[test]
    fn a_one_class_held_out_set_fails_before_training() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ckpt");
        let path = dir.display().to_string();
        let outcome = go(
            &synthetic(&["--eval-samples", "1", "--checkpoint", &path]),
            &[],
            None,
        );
        let message = err(&outcome);
        assert!(message.contains("--eval-samples 1"), "{message}");
        assert!(outcome.read.is_empty() && !dir.exists());
    }

    /// Batches whose loss is not finite are skipped, counted on the
    /// epoch's line and at the end, and the run finishes and saves.
    #[test]
    fn non_finite_losses_are_skipped_and_counted() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ckpt");
        let path = dir.display().to_string();
        let outcome = go(
            &synthetic(&["--epochs", "2", "--checkpoint", &path]),
            &[2, 13],
            None,
        );
        let progress = &ok(&outcome).progress;
        assert_eq!((progress.steps, progress.skipped), (18, 2));
        let lines: Vec<&str> = outcome
            .output
            .lines()
            .filter(|l| l.starts_with("epoch "))
            .collect();
        assert_eq!(lines.len(), 2, "{}", outcome.output);
        for line in lines {
            assert!(
                line.ends_with(", 1 batches skipped (loss not finite)"),
                "{line}"
            );
        }
        assert!(outcome
            .output
            .contains("skipped 2 batches whose loss was not finite"));
        assert_eq!(manifest(&dir).progress.skipped, 2);
        let loaded = Trainer::load(trained_directly(1).0.config().clone(), &dir).unwrap();
        assert_eq!(loaded.steps(), 18);
    }

    /// A data error mid-run keeps what was trained: a checkpoint at the
    /// failing batch, from which a resumed run goes on.
    #[test]
    fn a_data_error_keeps_what_was_trained() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ckpt");
        let path = dir.display().to_string();
        let config = synthetic(&["--checkpoint", &path]);
        let failed = go(&config, &[], Some(7));
        let message = err(&failed);
        assert!(
            message.contains("the disk is on fire")
                && message.contains(&path)
                && message.contains("--resume"),
            "{message}"
        );
        let progress = manifest(&dir).progress;
        assert_eq!((progress.batch, progress.steps), (7, 7));
        let resumed = go(&synthetic(&["--checkpoint", &path, "--resume"]), &[], None);
        assert_eq!(ok(&resumed).progress.steps, 10);
        let reference = go(&synthetic(&[]), &[], None);
        assert_eq!(resumed.read, reference.read[7..]);
    }

    /// Every checkpoint of a run failing (no room for one): each warning
    /// and the final error say which checkpoint is left to resume from (a
    /// resumed one's), or that none of this run's was written.
    #[test]
    fn failed_checkpoints_name_the_one_left_to_resume() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ckpt");
        let path = dir.display().to_string();
        ok(&go(
            &synthetic(&["--checkpoint", &path, "--steps", "3"]),
            &[],
            None,
        ));
        // A regular file where the staging directory goes: every write fails.
        let blocker = root.path().join(".ckpt.ctr-staging");
        let run = |config: &Config| {
            let mut output = Vec::new();
            let mut open = |config: &Config| -> source::Result<Box<dyn DataSource>> {
                std::fs::write(&blocker, "in the way").unwrap();
                crate::open_source(config)
            };
            let result = execute(config, &mut open, &mut output);
            std::fs::remove_file(&blocker).unwrap();
            (
                result.map_err(|e| e.to_string()),
                String::from_utf8(output).unwrap(),
            )
        };
        let (result, output) = run(&synthetic(&[
            "--checkpoint",
            &path,
            "--resume",
            "--steps",
            "6",
            "--checkpoint-every",
            "2",
        ]));
        let kept = format!(
            "the last checkpoint is {path} (next epoch 1 at batch 3, 3 steps, 0 batches \
             skipped): --resume continues from it"
        );
        let message = result.unwrap_err();
        assert!(
            message.starts_with("the final checkpoint (next epoch 1 at batch 6, 6 steps")
                && message.ends_with(&kept),
            "{message}"
        );
        let warning = output
            .lines()
            .find(|line| line.starts_with("warning: the checkpoint at step 4 failed"))
            .unwrap_or_else(|| panic!("{output}"));
        assert!(
            warning.ends_with(&format!("; {kept}; training goes on")),
            "{warning}"
        );
        assert_eq!(manifest(&dir).progress.steps, 3);

        let fresh = root.path().join("fresh");
        let blocker_fresh = root.path().join(".fresh.ctr-staging");
        let mut output = Vec::new();
        let mut open = |config: &Config| -> source::Result<Box<dyn DataSource>> {
            std::fs::write(&blocker_fresh, "in the way").unwrap();
            crate::open_source(config)
        };
        let fresh_path = fresh.display().to_string();
        let message = execute(
            &synthetic(&["--checkpoint", &fresh_path, "--steps", "2"]),
            &mut open,
            &mut output,
        )
        .unwrap_err()
        .to_string();
        assert!(
            message.ends_with(&format!(
                "no checkpoint of this run was written to {} yet",
                std::fs::canonicalize(root.path())
                    .unwrap()
                    .join("fresh")
                    .display()
            )),
            "{message}"
        );
    }

    /// Criteo data resumes at the next unseen line.
    #[test]
    fn criteo_data_resumes_at_the_next_batch() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("train.txt");
        let mut text = String::new();
        for i in 0..60u32 {
            let label = u32::from(i % 3 == 0);
            let ints: Vec<String> = (0..13).map(|f| ((i * 7 + f) % 11).to_string()).collect();
            let cats: Vec<String> = (0..26)
                .map(|f| format!("{:x}", (i * 31 + f) % 97))
                .collect();
            text.push_str(&format!(
                "{label}\t{}\t{}\n",
                ints.join("\t"),
                cats.join("\t")
            ));
        }
        std::fs::write(&data, text).unwrap();
        let data = data.display().to_string();
        let path = root.path().join("ckpt").display().to_string();
        let flags = |extra: &[&str]| {
            let mut args = vec![
                "--data",
                &data,
                "--eval-samples",
                "20",
                "--batch",
                "8",
                "--dim",
                "4",
            ];
            args.extend(extra);
            parse(&args)
        };
        let reference = go(&flags(&[]), &[], None);
        assert_eq!(ok(&reference).progress.steps, 5);
        let first = go(&flags(&["--steps", "2", "--checkpoint", &path]), &[], None);
        assert_eq!(first.read, reference.read[..2]);
        let resumed = go(&flags(&["--checkpoint", &path, "--resume"]), &[], None);
        assert_eq!(ok(&resumed).progress.steps, 5);
        assert_eq!(resumed.read, reference.read[2..]);
    }

    /// With `--redis`, a resumed run replaces the Redis table's rows
    /// (trained after the checkpoint, say) with the checkpoint's table, so
    /// table, MLP and step count are those of the checkpoint, and goes on
    /// from there.
    #[test]
    fn a_resumed_redis_run_restores_its_checkpoint_into_the_redis_table() {
        let Some(server) = crate::redis_support::Server::start() else {
            return;
        };
        let addr = server.addr();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ckpt");
        let path = dir.display().to_string();
        let redis = |extra: &[&str]| {
            let mut args = vec![
                "--redis",
                &addr,
                "--redis-prefix",
                "ctr_resume",
                "--redis-keep",
                "--checkpoint",
                &path,
            ];
            args.extend(extra);
            synthetic(&args)
        };
        ok(&go(&redis(&["--steps", "4"]), &[], None));
        let checkpoint = Trainer::load(trained_directly(1).0.config().clone(), &dir).unwrap();
        let rows = checkpoint.table().size();
        let choice = crate::config::RedisChoice {
            nodes: vec![addr.clone()],
            prefix: "ctr_resume".into(),
            keep: true,
        };
        let open = || table::open_redis(&choice, 4, 3, false).unwrap();
        let (table, left) = open();
        assert_eq!(left, rows);
        // A row trained after the checkpoint, by a run that then stopped.
        let late = i64::MAX - 7;
        table.upsert(&[late], &[1.0; 4]).unwrap();

        let resumed = go(&redis(&["--steps", "4", "--resume"]), &[], None);
        assert!(!ok(&resumed).trained);
        assert!(
            resumed.output.contains(&format!(
                "restored the checkpoint's table ({rows} rows) into the Redis table \
                 ctr_resume:ctr/embeddings, replacing the {} rows it held",
                rows + 1
            )),
            "{}",
            resumed.output
        );
        let (table, left) = open();
        assert_eq!(left, rows);
        let mut exists = [true];
        table
            .lookup_with_exists(&[late], &mut [0.0; 4], &mut exists)
            .unwrap();
        assert!(!exists[0], "the late row survived the restore");

        let more = go(&redis(&["--steps", "7", "--resume"]), &[], None);
        assert_eq!(ok(&more).progress.steps, 7);
        let reference = go(&synthetic(&[]), &[], None);
        assert_eq!(more.read, reference.read[4..7]);
        table.destroy().unwrap();
    }

    /// A new run refuses a Redis table that holds rows (another run's,
    /// perhaps still training) before it trains, and neither clears nor
    /// destroys it; with `--overwrite` it clears them and trains.
    #[test]
    fn a_new_redis_run_refuses_a_table_that_holds_rows() {
        let Some(server) = crate::redis_support::Server::start() else {
            return;
        };
        let addr = server.addr();
        let choice = crate::config::RedisChoice {
            nodes: vec![addr.clone()],
            prefix: "ctr_taken".into(),
            keep: true,
        };
        let (table, left) = table::open_redis(&choice, 4, 3, false).unwrap();
        assert_eq!(left, 0);
        // Ids the synthetic data never draws.
        let theirs = [i64::MAX - 1, i64::MAX - 2];
        table.upsert(&theirs, &[1.0; 8]).unwrap();
        let redis = |extra: &[&str]| {
            let mut args = vec![
                "--redis",
                &addr,
                "--redis-prefix",
                "ctr_taken",
                "--steps",
                "2",
            ];
            args.extend(extra);
            synthetic(&args)
        };

        let refused = go(&redis(&[]), &[], None);
        let Err(error) = &refused.result else {
            panic!("a table that holds rows was not refused")
        };
        let message = error.to_string();
        assert!(
            message.contains("holds 2 rows") && message.contains("--overwrite"),
            "{message}"
        );
        assert!(refused.read.is_empty(), "trained before refusing");
        assert_eq!(
            table.size().unwrap(),
            2,
            "the other run's rows were touched"
        );

        let overwritten = go(
            &redis(&["--overwrite", "--redis-keep", "--expire", "3600"]),
            &[],
            None,
        );
        assert_eq!(ok(&overwritten).progress.steps, 2);
        let lines = epoch_lines(&overwritten);
        assert!(
            lines.len() == 1 && lines[0].ends_with("; this epoch 0 evicted, 0 expired"),
            "{lines:?}"
        );
        assert!(
            overwritten.output.contains("cleared the 2 rows"),
            "{}",
            overwritten.output
        );
        let mut exists = [true; 2];
        table
            .lookup_with_exists(&theirs, &mut [0.0; 8], &mut exists)
            .unwrap();
        assert!(table.size().unwrap() > 0 && exists == [false, false]);
        table.destroy().unwrap();
    }

    #[test]
    fn undefined_metrics_are_reported_not_fatal() {
        let shown = held_out_metrics(&[0.2, 0.7], &[0.0, 0.0], None);
        assert!(shown.contains("AUC undefined ("), "{shown}");
        let shown = held_out_metrics(&[0.2, f32::NAN], &[0.0, 1.0], Some(0.8));
        assert!(shown.contains("AUC undefined (") && shown.ends_with("(hidden model 0.8000)"));
        let shown = held_out_metrics(&[0.2, 0.7], &[0.0, 1.0], None);
        assert_eq!(shown, "held-out loss 0.2899, AUC 1.0000");
    }
}
