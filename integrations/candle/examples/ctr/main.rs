//! The end-to-end CTR example: a click-through-rate model whose sparse
//! features live in dynemb dynamic embedding tables, trained with candle.
//!
//! ```sh
//! cargo run --release -p dynemb-candle --example ctr            # synthetic data, ~2 minutes
//! cargo run --release -p dynemb-candle --example ctr -- --quick # tiny, for CI
//! cargo run --release -p dynemb-candle --example ctr -- --data train.txt   # Criteo
//! cargo run --release -p dynemb-candle --example ctr -- --redis 127.0.0.1:7000  # table in Redis
//! cargo run --release -p dynemb-candle --example ctr -- --help
//! ```
//!
//! Modules: `config` (flags), `source` (the batch format and the
//! `DataSource` trait), `data` (the synthetic data set), `criteo` (the
//! Criteo reader), `zipf` (the synthetic ids' sampler), `auc` (metrics),
//! `summary` (the data report), `model` (embeddings and MLP), `table`
//! (the local or Redis table the trainer is generic over), `train`
//! (the step, evaluation and checkpoints).
//!
//! A run: size candle's CPU thread pool from `--threads`, describe the data
//! (for synthetic data with the ground-truth model's held-out AUC, the
//! ceiling; with `--summary`, after a full report from an extra pass over
//! the data), train `--epochs` passes with a progress bar, evaluate on the
//! held-out set after each epoch in inference mode, then save the model,
//! reload it into fresh objects and check that the reloaded model is the
//! trained one: table size, optimizer steps, sampled rows and Adam slots,
//! held-out predictions, all bit for bit.
//!
//! With `--redis`, the table is a `RedisVariable` (see `table`): cleared
//! at the start, destroyed at the end unless `--redis-keep` (also when the
//! run fails), and the reload check restores the checkpoint into a local
//! table, so it also checks that a model moves from Redis to local memory.
//!
//! Decision: `RAYON_NUM_THREADS` is set first thing, from the parsed
//! flags (parsing calls nothing of candle's): candle-core reads it for its
//! matmul parallelism and rayon sizes its global pool from it at first
//! use, so a later change would not reach the pool. The example is
//! single-threaded at that point, which `std::env::set_var` needs.

mod auc;
mod config;
mod criteo;
mod data;
mod model;
mod source;
mod summary;
mod table;
mod train;
mod zipf;

/// The Redis test servers of `dynemb-redis`, for the Redis parity test.
#[cfg(test)]
#[path = "../../../redis/tests/support/mod.rs"]
mod redis_support;

use config::{Command, Config, DataChoice, Environment, THREADS_VAR, USAGE};
use criteo::Criteo;
use data::{Synthetic, SyntheticConfig};
use indicatif::{ProgressBar, ProgressStyle};
use source::DataSource;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use summary::StreamSummary;
use table::CtrTable;
use train::{ModelConfig, Trainer};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ctr: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the flags, sizes candle's thread pool, opens the data, describes
/// it, trains, evaluates and checks a reload.
fn run() -> Result<(), Box<dyn std::error::Error>> {
    let run_started = Instant::now();
    let mut out = std::io::stdout().lock();
    let config = match Config::parse(std::env::args().skip(1), &Environment::current())? {
        Command::Help => {
            write!(out, "{USAGE}")?;
            return Ok(());
        }
        Command::Run(config) => *config,
    };
    std::env::set_var(THREADS_VAR, config.threads.to_string());
    writeln!(out, "{config}")?;
    writeln!(
        out,
        "candle-core CPU threads: {}",
        candle_core::utils::get_num_threads()
    )?;
    let mut source = open_source(&config)?;
    writeln!(out, "{}", source.describe())?;
    if config.summary {
        let summary = StreamSummary::stream(source.as_mut(), config.batch, config.steps)?;
        summary.write(source.as_ref(), &mut out)?;
    } else {
        summary::write_ceiling(source.eval_set(), &mut out)?;
    }

    let eval = source.eval_set().samples.clone();
    let ceiling = match &source.eval_set().truth {
        Some(truth) => Some(auc::roc_auc(truth, &eval.labels)?),
        None => None,
    };
    let model_config = ModelConfig {
        fields: source.fields(),
        dim: config.dim,
        shards: config.threads.max(1),
        seed: config.seed,
        max_size: config.max_size,
    };
    let run = Run {
        config: &config,
        eval: &eval,
        ceiling,
    };
    match &config.redis {
        None => run.train(Trainer::new(model_config)?, source.as_mut(), &mut out)?,
        Some(choice) => {
            let (table, left) = table::open_redis(choice, config.dim, config.seed)?;
            if left > 0 {
                writeln!(
                    out,
                    "cleared {left} rows an earlier run left in the Redis table"
                )?;
            }
            let handle = table.clone();
            let result = Trainer::with_table(model_config, table)
                .and_then(|trainer| run.train(trainer, source.as_mut(), &mut out));
            // Destroyed also when training failed; the training error wins.
            let destroyed: Result<(), Box<dyn std::error::Error>> = if choice.keep {
                writeln!(
                    out,
                    "kept the Redis table {}:{}",
                    choice.prefix,
                    model::TABLE_NAME
                )
                .map_err(Into::into)
            } else {
                handle.destroy().map_err(Into::into)
            };
            result?;
            destroyed?;
        }
    }
    writeln!(out, "total {:.1} s", run_started.elapsed().as_secs_f64())?;
    Ok(())
}

/// What training needs besides the trainer and the data.
struct Run<'a> {
    config: &'a Config,
    eval: &'a source::Batch,
    /// The hidden model's held-out AUC, if known.
    ceiling: Option<f64>,
}

impl Run<'_> {
    /// Trains `trainer` for the configured epochs, evaluating after each,
    /// then checks a reload.
    fn train<T: CtrTable>(
        &self,
        mut trainer: Trainer<T>,
        source: &mut dyn DataSource,
        out: &mut impl Write,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (config, eval, ceiling) = (self.config, self.eval, self.ceiling);
        let batches_per_epoch = source.train_samples().div_ceil(config.batch) as u64;
        let mut steps_left = config.steps.unwrap_or(u64::MAX);
        for epoch in 1..=config.epochs {
            if steps_left == 0 {
                break;
            }
            source.rewind()?;
            let bar = progress_bar(batches_per_epoch.min(steps_left), epoch);
            let started = Instant::now();
            let (mut samples, mut loss_sum, mut batches) = (0usize, 0.0f64, 0usize);
            while steps_left > 0 {
                let Some(batch) = source.next_batch(config.batch)? else {
                    break;
                };
                let loss = trainer.step(&batch)?;
                steps_left -= 1;
                samples += batch.len();
                loss_sum += f64::from(loss);
                batches += 1;
                bar.set_message(format!(
                    "loss {:.4}, {:.0} samples/s",
                    loss_sum / batches as f64,
                    samples as f64 / started.elapsed().as_secs_f64()
                ));
                bar.inc(1);
            }
            bar.finish_and_clear();
            let seconds = started.elapsed().as_secs_f64();
            let predictions = trainer.predict(eval)?;
            let memory = match trainer.table().memory_bytes() {
                Some(bytes) => format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64),
                None => "in Redis".to_string(),
            };
            writeln!(
            out,
            "epoch {epoch}: train loss {:.4}, {:.0} samples/s | held-out loss {:.4}, AUC {:.4}{} | \
             table {} rows, {memory}, {} evicted",
            loss_sum / batches.max(1) as f64,
            samples as f64 / seconds,
            auc::log_loss(&predictions, &eval.labels)?,
            auc::roc_auc(&predictions, &eval.labels)?,
            ceiling.map_or(String::new(), |c| format!(" (hidden model {c:.4})")),
            trainer.table().rows()?,
            trainer.evicted(),
        )?;
        }
        let started = Instant::now();
        check_reload(&trainer, eval, config.checkpoint.as_deref(), out)?;
        writeln!(out, "reload check {:.1} s", started.elapsed().as_secs_f64())?;
        Ok(())
    }
}

/// The data source the configuration asks for.
fn open_source(config: &Config) -> source::Result<Box<dyn DataSource>> {
    Ok(match &config.data {
        DataChoice::Synthetic {
            fields,
            train_samples,
        } => Box::new(Synthetic::new(&SyntheticConfig {
            fields: *fields,
            train_samples: *train_samples,
            eval_samples: config.eval_samples,
            seed: config.seed,
        })?),
        DataChoice::Criteo {
            path,
            train_samples,
        } => Box::new(Criteo::open(path, *train_samples, config.eval_samples)?),
    })
}

/// A progress bar over one epoch's batches, with the loss and speed as its
/// message (drawn only on a terminal).
fn progress_bar(batches: u64, epoch: usize) -> ProgressBar {
    let bar = ProgressBar::new(batches);
    if let Ok(style) =
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} batches, {msg} ({eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(epoch.to_string());
    bar
}

/// Saves the model to `checkpoint` (a temporary directory if none was
/// given), reloads it into fresh objects and checks them against the
/// trained ones ([`train::check_reload`]); an error if anything differs.
fn check_reload<T: CtrTable>(
    trainer: &Trainer<T>,
    eval: &source::Batch,
    checkpoint: Option<&std::path::Path>,
    out: &mut impl Write,
) -> Result<(), Box<dyn std::error::Error>> {
    let temporary;
    let dir: PathBuf = match checkpoint {
        Some(dir) => dir.to_path_buf(),
        None => {
            temporary = tempfile::tempdir()?;
            temporary.path().join("ctr")
        }
    };
    trainer.save(&dir)?;
    let reloaded = Trainer::load(trainer.config().clone(), &dir)?;
    let check = train::check_reload(trainer, &reloaded, eval)?;
    writeln!(
        out,
        "saved to {} and reloaded into a local table; identical: table size ({} rows), sparse optimizer steps ({}), \
         rows and Adam slots m, v of {} sampled keys, predictions on {} held-out samples",
        dir.display(),
        check.rows,
        check.steps,
        check.keys,
        check.predictions
    )?;
    Ok(())
}
