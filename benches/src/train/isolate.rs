//! Every model runs in a process of its own: the `train` binary starts
//! itself once per model with `--run-only INDEX`, and that child runs the
//! model twice on the same batches, first untimed (priming), then the run
//! it reports, printed as JSON on stdout for the parent to collect.
//!
//! A process's first run of a model is slower than its later runs, and runs
//! sharing a process change one another's figures, so each model gets a
//! fresh process primed once: every model is measured in the same position,
//! the first run after priming.

use std::ffi::OsString;
use std::process::{Command, Stdio};

use crate::train::data::Workload;
use crate::train::run::{self, ModelRun, Steps};
use crate::train::{ModelSpec, Result};

/// The flag that makes the binary run one model as a child.
pub const RUN_ONLY: &str = "--run-only";

/// Runs the model at `index` of the selection `args` (the binary's own
/// arguments) make, in a child process; returns its run. The child's
/// progress goes to this process's stderr.
pub fn run_in_child(args: &[OsString], index: usize) -> Result<ModelRun> {
    let output = Command::new(std::env::current_exe()?)
        .args(args)
        .arg(RUN_ONLY)
        .arg(index.to_string())
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        return Err(format!("the run of model {index} failed ({})", output.status).into());
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// The child's part: primes the process with an untimed run of `model`,
/// runs it again and prints that run as JSON on stdout.
pub fn run_here(model: ModelSpec, workload: &Workload, steps: Steps) -> Result<()> {
    run::run(model, workload, steps)?;
    let measured = run::run(model, workload, steps)?;
    println!("{}", serde_json::to_string(&measured)?);
    Ok(())
}
