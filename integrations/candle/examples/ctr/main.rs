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
//! (the Redis table of `--redis`), `train` (the step, evaluation and
//! checkpoints, generic over `dynemb::EmbeddingTable`), `checkpoint` (the
//! checkpoint directory), `run` (one run, start to end).
//!
//! A run (`run`): size candle's CPU thread pool from `--threads`, open and
//! probe the checkpoint directory (`checkpoint`), open the data and check
//! its held-out set, describe it (for synthetic data with the ground-truth
//! model's held-out AUC, the ceiling; with `--summary`, after a full report
//! from an extra pass over the data), train `--epochs` passes with a
//! progress bar, evaluate on the held-out set after each epoch in inference
//! mode, checkpoint as it goes, then save the model, reload it into fresh
//! objects and check that the reloaded model is the trained one: table
//! size, optimizer steps, sampled rows and Adam slots, held-out
//! predictions, all bit for bit.
//!
//! With `--checkpoint DIR`, the run is kept in DIR and can be continued:
//!
//! ```sh
//! cargo run --release -p dynemb-candle --example ctr -- --checkpoint run1 --checkpoint-every 500
//! cargo run --release -p dynemb-candle --example ctr -- --checkpoint run1 --resume --epochs 2
//! ```
//!
//! The table can be kept in bounds on an endless stream of ids:
//! `--capacity N` (never more than N rows; a new row evicts a least
//! recently trained one), `--min-count N` (an id gets a row at its Nth
//! training read) and `--expire SECS` (at each epoch's end, the rows not
//! trained for SECS seconds go), beside `--max-size` (TFRA's restrict
//! after a step). Each epoch's line counts what they did in that epoch.
//!
//! ```sh
//! cargo run --release -p dynemb-candle --example ctr -- --capacity 1280000 --min-count 2
//! ```
//!
//! The table stores its values in `--dtype` (f32, f16 or bf16; default
//! f32) and its Adam slots in `--slot-dtype`, rounded to nearest even as
//! they are written, or, with `--stochastic-rounding SEED`, stochastically
//! where the optimizer writes bf16; the model computes in f32 (`model`).
//! A resumed run may change them: the checkpoint converts (`checkpoint`).
//!
//! ```sh
//! cargo run --release -p dynemb-candle --example ctr -- --dtype bf16 --slot-dtype bf16
//! ```
//!
//! With `--redis`, the table is a `RedisVariable` (see `table`): a new run
//! refuses one that holds rows unless `--overwrite` clears them, a resumed
//! run restores its checkpoint's table into it, and it is destroyed at the
//! end (also when the run fails) unless `--redis-keep`. The reload check
//! restores the checkpoint into a local table, so it also checks that a
//! model moves from Redis to local memory.
//!
//! `RAYON_NUM_THREADS` is set from the parsed flags before any candle
//! call, because rayon sizes its global pool from it at first use (the
//! example is still single-threaded then, as `std::env::set_var` needs).

mod auc;
mod checkpoint;
mod config;
mod criteo;
mod data;
mod model;
mod run;
mod source;
mod summary;
mod table;
mod train;
mod zipf;

/// The Redis test servers of `dynemb-redis`, for the Redis parity test.
#[cfg(test)]
use dynemb_test_support::servers as redis_support;

use config::{Config, DataChoice, Environment, THREADS_VAR};
use criteo::Criteo;
use data::{Synthetic, SyntheticConfig};
use source::DataSource;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ctr: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the flags (clap prints `--help` or a refusal and exits), sizes
/// candle's thread pool and runs ([`run::execute`]).
fn run() -> Result<(), Box<dyn std::error::Error>> {
    let run_started = Instant::now();
    let config = Config::try_parse_from(std::env::args_os(), &Environment::current())
        .unwrap_or_else(|error| error.exit());
    let mut out = std::io::stdout().lock();
    std::env::set_var(THREADS_VAR, config.threads.to_string());
    writeln!(out, "{config}")?;
    writeln!(
        out,
        "candle-core CPU threads: {}",
        candle_core::utils::get_num_threads()
    )?;
    run::execute(&config, &mut open_source, &mut out)?;
    writeln!(out, "total {:.1} s", run_started.elapsed().as_secs_f64())?;
    Ok(())
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
