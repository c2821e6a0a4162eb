//! The `train` binary's flags.
//!
//! Defaults: 10 warm-up and 50 timed steps per run, 2 threads, every model.
//! `--quick` (CI): 2 warm-up and 3 timed steps; `--steps` and `--warmup`
//! still apply on top. The workload holds one batch per step of the longest
//! run, so no run sees a batch twice.

use std::path::PathBuf;

use crate::train::dynemb_model::Way;
use crate::train::head::HeadKind;
use crate::train::run::Steps;
use crate::train::ModelSpec;

/// Usage text, printed by `--help` and after a flag error.
pub const USAGE: &str = "\
usage: train [--quick] [--steps N] [--warmup W] [--threads T] [--models M[,M..]] [--json FILE]
             [--glibc-malloc] [--run-only INDEX]

  --quick         2 warm-up and 3 timed steps per run (CI)
  --steps N       timed steps per run (default 50; --quick: 3)
  --warmup W      untimed steps before them (default 10; --quick: 2)
  --threads T     threads of candle's CPU kernels (default 2), which also run
                  dynemb-candle's lookup_or_insert, gather and optimizer apply, and of
                  rayon's pool (candle's matrix products)
  --models M,..   which models to run, in this order (default all): linear (dynemb +
                  Linear: layer API, staged), hashed (candle-nn Embedding of 1M rows +
                  Linear), mlp (dynemb + MLP 256-128-1: layer API, staged)
  --json FILE     also write every figure as JSON to FILE
  --glibc-malloc  keep glibc's default malloc settings (default: re-run with GLIBC_TUNABLES
                  that keep freed memory in the process, unless GLIBC_TUNABLES is set)
  --run-only I    run only the I-th selected model (from 0), primed, and print its run as
                  JSON: how the binary runs each model in a process of its own
  -h, --help      this text";

/// The parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    /// Steps of each run.
    pub steps: Steps,
    /// `--threads`.
    pub threads: usize,
    /// The runs, in order.
    pub models: Vec<ModelSpec>,
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--quick`.
    pub quick: bool,
    /// `--glibc-malloc`.
    pub glibc_malloc: bool,
    /// `--run-only`: the index of the one model to run here.
    pub run_only: Option<usize>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum TrainCommand {
    /// Run the benchmark.
    Run(TrainOptions),
    /// Print the usage text.
    Help,
}

/// The runs a `--models` name stands for.
fn runs_of(name: &str) -> Option<Vec<ModelSpec>> {
    let dynemb = |head| {
        [Way::LayerApi, Way::Staged]
            .map(|way| ModelSpec::Dynemb { head, way })
            .to_vec()
    };
    match name {
        "linear" => Some(dynemb(HeadKind::Linear)),
        "hashed" => Some(vec![ModelSpec::Hashed {
            head: HeadKind::Linear,
        }]),
        "mlp" => Some(dynemb(HeadKind::Mlp)),
        _ => None,
    }
}

/// A count of at least `min`.
fn count(flag: &str, s: &str, min: usize) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|&n| n >= min)
        .ok_or_else(|| format!("{flag}: expected a whole number >= {min}, got {s:?}"))
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<TrainCommand, String> {
    let mut args = args.into_iter();
    let (mut steps, mut warmup, mut threads) = (None, None, 2);
    let mut models = None;
    let (mut json, mut quick, mut glibc_malloc, mut run_only) = (None, false, false, None);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(TrainCommand::Help),
            "--quick" => quick = true,
            "--glibc-malloc" => glibc_malloc = true,
            "--run-only" => run_only = Some(count(&flag, &value()?, 0)?),
            "--steps" => steps = Some(count(&flag, &value()?, 1)?),
            "--warmup" => warmup = Some(count(&flag, &value()?, 0)?),
            "--threads" => threads = count(&flag, &value()?, 1)?,
            "--json" => json = Some(PathBuf::from(value()?)),
            "--models" => {
                let mut runs = Vec::new();
                for name in value()?.split(',').map(str::trim) {
                    runs.extend(runs_of(name).ok_or_else(|| {
                        format!("--models: unknown model {name:?} (known: linear, hashed, mlp)")
                    })?);
                }
                models = Some(runs);
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    let (default_warmup, default_steps) = if quick { (2, 3) } else { (10, 50) };
    let models: Vec<ModelSpec> = models.unwrap_or_else(|| {
        ["linear", "hashed", "mlp"]
            .into_iter()
            .flat_map(|m| runs_of(m).expect("known"))
            .collect()
    });
    if let Some(index) = run_only.filter(|&i| i >= models.len()) {
        return Err(format!(
            "--run-only {index}: only {} models are selected",
            models.len()
        ));
    }
    Ok(TrainCommand::Run(TrainOptions {
        steps: Steps {
            warmup: warmup.unwrap_or(default_warmup),
            timed: steps.unwrap_or(default_steps),
        },
        threads,
        models,
        json,
        quick,
        glibc_malloc,
        run_only,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<TrainCommand, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    fn options(args: &[&str]) -> TrainOptions {
        match parse_strs(args).unwrap() {
            TrainCommand::Run(o) => o,
            TrainCommand::Help => panic!("help"),
        }
    }

    #[test]
    fn defaults_quick_and_overrides() {
        let o = options(&[]);
        assert_eq!((o.steps.warmup, o.steps.timed, o.threads), (10, 50, 2));
        assert_eq!(o.models.len(), 5, "linear x2, hashed, mlp x2");
        let o = options(&["--quick", "--steps", "7", "--threads", "1"]);
        assert_eq!((o.steps.warmup, o.steps.timed, o.threads), (2, 7, 1));
        assert!(!o.glibc_malloc);
        let o = options(&[
            "--models",
            "hashed,mlp",
            "--json",
            "x.json",
            "--glibc-malloc",
        ]);
        assert!(o.glibc_malloc);
        assert_eq!(options(&["--run-only", "2"]).run_only, Some(2));
        assert_eq!(o.models.len(), 3);
        assert_eq!(
            o.models[0],
            ModelSpec::Hashed {
                head: HeadKind::Linear
            }
        );
        assert_eq!(o.json, Some(PathBuf::from("x.json")));
    }

    #[test]
    fn errors_and_help() {
        assert_eq!(parse_strs(&["--help"]), Ok(TrainCommand::Help));
        assert!(parse_strs(&["--steps", "0"]).is_err());
        assert!(parse_strs(&["--threads"]).is_err());
        assert!(parse_strs(&["--models", "dense"]).is_err());
        assert!(parse_strs(&["--fast"]).is_err());
        assert!(parse_strs(&["--models", "hashed", "--run-only", "1"]).is_err());
    }
}
