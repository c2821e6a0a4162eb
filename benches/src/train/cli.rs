//! The `train` binary's flags.
//!
//! Defaults: 10 warm-up and 50 timed steps per run, 2 threads, every model,
//! dynemb tables in f32 (`--dtype`, `--slot-dtype`: f16 or bf16).
//! `--quick` (CI): 2 warm-up and 3 timed steps; `--steps` and `--warmup`
//! still apply on top. The workload holds one batch per step of the longest
//! run, so no run sees a batch twice.

use std::path::PathBuf;

use clap::builder::PossibleValuesParser;
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use dynemb::Dtype;

use crate::train::dynemb_model::{TableDtypes, Way};
use crate::train::head::HeadKind;
use crate::train::run::Steps;
use crate::train::ModelSpec;

/// The names `--models` knows.
const MODEL_NAMES: [&str; 3] = ["linear", "hashed", "mlp"];

/// The `train` command line as clap reads it; [`Cli::options`] turns it
/// into [`TrainOptions`].
#[derive(Debug, Parser)]
#[command(
    name = "train",
    about = "Training steps of dynemb's candle layers against the hashing trick with candle-nn",
    long_about = None
)]
pub struct Cli {
    /// 2 warm-up and 3 timed steps per run (CI).
    #[arg(long)]
    quick: bool,
    /// Timed steps per run (default 50; --quick: 3).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    steps: Option<usize>,
    /// Untimed steps before them (default 10; --quick: 2).
    #[arg(long, value_name = "W")]
    warmup: Option<usize>,
    /// Threads of candle's CPU kernels, which also run dynemb-candle's
    /// lookup_or_insert, gather and optimizer apply, and of rayon's pool
    /// (candle's matrix products).
    #[arg(long, value_name = "T", default_value_t = 2, value_parser = at_least_one)]
    threads: usize,
    /// Which models to run, in this order (default all): linear (dynemb +
    /// Linear: layer API, staged), hashed (candle-nn Embedding of 1M rows +
    /// Linear), mlp (dynemb + MLP 256-128-1: layer API, staged).
    #[arg(
        long,
        value_name = "M,..",
        value_delimiter = ',',
        hide_possible_values = true,
        value_parser = PossibleValuesParser::new(MODEL_NAMES),
    )]
    models: Option<Vec<String>>,
    /// How the dynemb tables store their embedding values: f32, f16 or bf16.
    #[arg(long, value_name = "DTYPE", default_value_t = Dtype::F32, value_parser = dtype)]
    dtype: Dtype,
    /// How the dynemb tables store their Adam slots: f32, f16 or bf16.
    #[arg(long, value_name = "DTYPE", default_value_t = Dtype::F32, value_parser = dtype)]
    slot_dtype: Dtype,
    /// Also write every figure as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Keep glibc's default malloc settings (default: re-run with
    /// GLIBC_TUNABLES that keep freed memory in the process, unless
    /// GLIBC_TUNABLES is set).
    #[arg(long)]
    glibc_malloc: bool,
    /// Run only the I-th selected model (from 0), primed, and print its run
    /// as JSON: how the binary runs each model in a process of its own.
    #[arg(long, value_name = "I")]
    run_only: Option<usize>,
}

impl Cli {
    /// The options this command line describes, or the error of a
    /// `--run-only` index past the selected models.
    pub fn options(self) -> Result<TrainOptions, clap::Error> {
        let (default_warmup, default_steps) = if self.quick { (2, 3) } else { (10, 50) };
        let names = self
            .models
            .unwrap_or_else(|| MODEL_NAMES.map(String::from).to_vec());
        let dtypes = TableDtypes {
            values: self.dtype,
            slots: self.slot_dtype,
        };
        let models: Vec<ModelSpec> = names
            .iter()
            .flat_map(|m| runs_of(m, dtypes).expect("a listed name"))
            .collect();
        if let Some(index) = self.run_only.filter(|&i| i >= models.len()) {
            return Err(Cli::command().error(
                ErrorKind::ValueValidation,
                format!(
                    "--run-only {index}: only {} models are selected",
                    models.len()
                ),
            ));
        }
        Ok(TrainOptions {
            steps: Steps {
                warmup: self.warmup.unwrap_or(default_warmup),
                timed: self.steps.unwrap_or(default_steps),
            },
            threads: self.threads,
            dtypes,
            models,
            json: self.json,
            quick: self.quick,
            glibc_malloc: self.glibc_malloc,
            run_only: self.run_only,
        })
    }
}

/// The options of the command line `args` (the program name first); the
/// error prints the usage or `--help` text when exited with.
pub fn parse_from<I, T>(args: I) -> Result<TrainOptions, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args)?.options()
}

/// The parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    /// Steps of each run.
    pub steps: Steps,
    /// `--threads`.
    pub threads: usize,
    /// `--dtype` and `--slot-dtype`: how the dynemb tables store rows.
    pub dtypes: TableDtypes,
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

/// A whole number of at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| "expected a whole number >= 1".into())
}

/// A dtype: `f32`, `f16` or `bf16`.
fn dtype(s: &str) -> Result<Dtype, String> {
    s.parse().map_err(|_| "expected f32, f16 or bf16".into())
}

/// The runs a `--models` name stands for, dynemb tables storing `dtypes`.
fn runs_of(name: &str, dtypes: TableDtypes) -> Option<Vec<ModelSpec>> {
    let dynemb = |head| {
        [Way::LayerApi, Way::Staged]
            .map(|way| ModelSpec::Dynemb { head, way, dtypes })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<TrainOptions, clap::Error> {
        parse_from(std::iter::once("train").chain(args.iter().copied()))
    }

    fn options(args: &[&str]) -> TrainOptions {
        parse_strs(args).unwrap()
    }

    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
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
    fn dtypes_reach_every_dynemb_model() {
        assert_eq!(options(&[]).dtypes, TableDtypes::F32);
        let o = options(&["--dtype", "bf16", "--models", "linear,hashed"]);
        let dtypes = TableDtypes {
            values: Dtype::Bf16,
            slots: Dtype::F32,
        };
        assert_eq!(o.dtypes, dtypes);
        assert_eq!(
            o.models,
            [
                ModelSpec::Dynemb {
                    head: HeadKind::Linear,
                    way: Way::LayerApi,
                    dtypes
                },
                ModelSpec::Dynemb {
                    head: HeadKind::Linear,
                    way: Way::Staged,
                    dtypes
                },
                ModelSpec::Hashed {
                    head: HeadKind::Linear
                },
            ]
        );
        assert_eq!(o.models[0].table(), "dynemb bf16");
        assert_eq!(o.models[2].table(), "candle-nn 1M hashed");
        let o = options(&["--dtype=f16", "--slot-dtype", "bf16", "--models", "mlp"]);
        assert_eq!(o.models[1].table(), "dynemb f16, slots bf16");
        assert_eq!(options(&["--models", "mlp"]).models[0].table(), "dynemb");
        // The JSON a child prints names the dtypes and reads back.
        let json = serde_json::to_string(&o.models[0]).unwrap();
        assert!(json.contains(r#""values":"f16","slots":"bf16""#), "{json}");
        let back: ModelSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, o.models[0]);
        for (flag, value) in [("--dtype", "f64"), ("--slot-dtype", "")] {
            let e = parse_strs(&[flag, value]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ValueValidation, "{e}");
        }
    }

    #[test]
    fn errors_and_help() {
        let kind = |args: &[&str]| parse_strs(args).unwrap_err().kind();
        assert_eq!(kind(&["--help"]), ErrorKind::DisplayHelp);
        assert!(parse_strs(&["--steps", "0"]).is_err());
        assert!(parse_strs(&["--threads"]).is_err());
        assert!(parse_strs(&["--models", "dense"]).is_err());
        assert!(parse_strs(&["--fast"]).is_err());
        let e = parse_strs(&["--models", "hashed", "--run-only", "1"]).unwrap_err();
        assert!(e.to_string().contains("--run-only 1"), "{e}");
    }
}
