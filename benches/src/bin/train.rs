//! `train`: training steps of dynemb's candle layers against the hashing
//! trick with candle-nn, on TFRA's usual CPU demo workload.
//!
//! ```text
//! cargo run --release -p dynemb-benches --bin train -- [--quick] [--steps N]
//!     [--warmup W] [--threads T] [--models M[,M..]] [--dtype D] [--slot-dtype D]
//!     [--json FILE] [--glibc-malloc]
//! ```
//!
//! Progress goes to stderr; the report (Markdown tables) to stdout. See
//! `dynemb_benches::train` for what is measured and how.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Instant;

use dynemb_benches::report::Environment;
use dynemb_benches::train::cli::{self, TrainOptions};
use dynemb_benches::train::data::{IdStats, Workload, FIELDS, VOCAB, ZIPF_EXPONENT};
use dynemb_benches::train::malloc::{self, malloc_env};
use dynemb_benches::train::report::{TrainReport, TrainSettings};
use dynemb_benches::train::{isolate, Result, BATCH, DIM, SEED};

fn main() -> ExitCode {
    let options = cli::parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    if !options.glibc_malloc {
        if let Err(e) = malloc::reexec_with_tunables(std::env::args_os().skip(1)) {
            eprintln!("train: cannot re-run with GLIBC_TUNABLES: {e}");
            return ExitCode::FAILURE;
        }
    }
    // Before candle or rayon read them (their pools start on first use);
    // no other thread exists yet.
    let threads = options.threads.to_string();
    std::env::set_var("RAYON_NUM_THREADS", &threads);
    std::env::set_var("CANDLE_NUM_THREADS", &threads);
    match run_all(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Generates the workload, runs every model, prints the report and writes
/// the JSON.
fn run_all(options: &TrainOptions) -> Result<()> {
    let started = Instant::now();
    let batches = options.steps.warmup + options.steps.timed;
    if options.run_only.is_none() {
        eprintln!("train: generating {batches} batches of {BATCH} samples");
    }
    let workload = Workload::generate(BATCH, batches, SEED)?;
    let generate_seconds = started.elapsed().as_secs_f64();
    if let Some(index) = options.run_only {
        return isolate::run_here(options.models[index], &workload, options.steps);
    }
    let ids = IdStats::of(&workload.batches, options.steps.warmup)?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut runs = Vec::with_capacity(options.models.len());
    for (index, model) in options.models.iter().enumerate() {
        eprintln!(
            "train: {} + {} ({}), in its own process",
            model.table(),
            model.head().describe(),
            model.way()
        );
        runs.push(isolate::run_in_child(&args, index)?);
    }
    let report = TrainReport {
        settings: TrainSettings {
            threads: options.threads,
            candle_threads: candle_core::utils::get_num_threads(),
            rayon_threads: rayon::current_num_threads(),
            malloc_env: malloc_env(),
            batch: BATCH,
            fields: FIELDS,
            dim: DIM,
            value_dtype: options.dtypes.values.to_string(),
            slot_dtype: options.dtypes.slots.to_string(),
            vocab: VOCAB,
            zipf_exponent: ZIPF_EXPONENT,
            steps: options.steps,
            batches,
            ids,
            generate_seconds,
            quick: options.quick,
        },
        environment: Environment::detect(),
        runs,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    println!("{}", report.render());
    if let Some(path) = &options.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("train: wrote {}", path.display());
    }
    Ok(())
}
