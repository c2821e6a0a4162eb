//! The `compare` binary's flags, and the [`Plan`] they make.
//!
//! ```text
//! compare [--keys N] [--dim D] [--threads T[,T..]] [--batch B] [--json FILE]
//!         [--quick] [--systems S[,S..]] [--repeats R]
//! ```
//!
//! Defaults: 8Mi keys (8,388,608), dim 64 plus a dim sweep (8 and 256, for
//! lookup hit, upsert and accumulate), 1 and 2 threads, batches of 65,536,
//! 1Mi keys per timed run, 5 rounds (3 for the ops that rebuild the table),
//! every system. `--dim` runs that dim only, no sweep. `--quick`: 1Mi keys,
//! dim 64 only, 256Ki keys per timed run, 3 rounds (1 for rebuilding ops);
//! other flags still apply on top. The sweep keeps the main configuration's
//! bytes of rows: `keys * 64 / dim` keys, at most `keys` (dim 8: `keys`,
//! dim 256: `keys / 4`).

use crate::suite::{Config, Plan};
use crate::systems::{Op, System};
use crate::workload::Shape;
use std::path::PathBuf;

/// Usage text, printed by `--help` and after a flag error.
pub const USAGE: &str = "\
usage: compare [--keys N] [--dim D] [--threads T[,T..]] [--batch B] [--json FILE]
               [--quick] [--systems S[,S..]] [--repeats R]

  --keys N        keys in the table (default 8388608; --quick: 1048576)
  --dim D         values per row; only this dim (default 64, plus a sweep of dims 8 and 256)
  --threads T,..  thread counts to run every op at (default 1,2)
  --batch B       keys per batch (default 65536)
  --json FILE     also write every figure as JSON to FILE
  --quick         1048576 keys, dim 64 only, fewer keys per run and rounds (CI)
  --systems S,..  systems to run (default all): dynemb, dashmap, papaya, scc,
                  hashbrown, dense
  --repeats R     rounds of the steady-state ops (default 5; --quick: 3)
  -h, --help      this text";

/// The parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// `--keys`.
    pub keys: Option<usize>,
    /// `--dim`.
    pub dim: Option<usize>,
    /// `--threads`.
    pub threads: Vec<usize>,
    /// `--batch`.
    pub batch: usize,
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--quick`.
    pub quick: bool,
    /// `--systems`.
    pub systems: Vec<System>,
    /// `--repeats`.
    pub repeats: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            keys: None,
            dim: None,
            threads: vec![1, 2],
            batch: 1 << 16,
            json: None,
            quick: false,
            systems: System::ALL.to_vec(),
            repeats: None,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Run the benchmark.
    Run(Options),
    /// Print the usage text.
    Help,
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut o = Options::default();
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--quick" => o.quick = true,
            "--keys" => o.keys = Some(positive(&flag, &value()?)?),
            "--dim" => o.dim = Some(positive(&flag, &value()?)?),
            "--batch" => o.batch = positive(&flag, &value()?)?,
            "--repeats" => o.repeats = Some(positive(&flag, &value()?)?),
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--threads" => {
                o.threads = list(&value()?, |s| positive(&flag, s))?;
            }
            "--systems" => {
                o.systems = list(&value()?, |s| {
                    System::from_name(s).ok_or_else(|| {
                        format!(
                            "--systems: unknown system {s:?} (known: dynemb, dashmap, papaya, \
                             scc, hashbrown, dense)"
                        )
                    })
                })?;
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    if o.keys.is_some_and(|k| k >= u32::MAX as usize) {
        return Err("--keys must be below 2^32".into());
    }
    Ok(Command::Run(o))
}

fn positive(flag: &str, s: &str) -> Result<usize, String> {
    match s.replace('_', "").parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag}: expected a positive integer, got {s:?}")),
    }
}

/// A comma-separated list, without duplicates, in the order given.
fn list<T: PartialEq>(s: &str, item: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v = item(part)?;
        if !out.contains(&v) {
            out.push(v);
        }
    }
    if out.is_empty() {
        return Err(format!("expected a comma-separated list, got {s:?}"));
    }
    Ok(out)
}

/// Seed of every workload.
const SEED: u64 = 0x00D1_CE5E_ED00;

/// The dim of the main configuration when `--dim` is not given.
pub const DEFAULT_DIM: usize = 64;

/// The dims of the sweep (lookup hit, upsert, accumulate only).
pub const SWEEP_DIMS: [usize; 2] = [8, 256];

impl Options {
    /// The plan these options describe.
    pub fn plan(&self) -> Plan {
        let keys = self
            .keys
            .unwrap_or(if self.quick { 1 << 20 } else { 8 << 20 });
        let dim = self.dim.unwrap_or(DEFAULT_DIM);
        let picks = if self.quick { 1 << 18 } else { 1 << 20 };
        let shape = |keys, dim| Shape {
            keys,
            dim,
            batch: self.batch,
            picks,
            zipf_s: 1.1,
            seed: SEED,
        };
        let mut configs = vec![Config {
            shape: shape(keys, dim),
            ops: Op::ALL.to_vec(),
            resize: true,
        }];
        if self.dim.is_none() && !self.quick {
            for d in SWEEP_DIMS {
                configs.push(Config {
                    shape: shape((keys * DEFAULT_DIM / d).clamp(1, keys), d),
                    ops: vec![Op::LookupHit, Op::Upsert, Op::Accum],
                    resize: false,
                });
            }
        }
        let repeats = self.repeats.unwrap_or(if self.quick { 3 } else { 5 });
        Plan {
            configs,
            threads: self.threads.clone(),
            repeats,
            destructive_repeats: if self.quick { 1 } else { repeats.min(3) },
            systems: self.systems.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, String> {
        match parse(args.iter().map(|s| s.to_string()))? {
            Command::Run(o) => Ok(o),
            Command::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults() {
        let o = run(&[]).unwrap();
        assert_eq!(o, Options::default());
        let p = o.plan();
        assert_eq!(p.configs.len(), 3);
        assert_eq!(p.configs[0].shape.keys, 8 << 20);
        assert_eq!(p.configs[0].shape.dim, 64);
        assert_eq!(p.configs[0].ops, Op::ALL);
        assert_eq!(p.configs[1].shape.dim, 8);
        assert_eq!(p.configs[1].shape.keys, 8 << 20);
        assert_eq!(p.configs[2].shape.dim, 256);
        assert_eq!(p.configs[2].shape.keys, 2 << 20);
        assert_eq!(p.threads, [1, 2]);
        assert_eq!((p.repeats, p.destructive_repeats), (5, 3));
        assert_eq!(p.systems, System::ALL);
    }

    #[test]
    fn every_flag() {
        let o = run(&[
            "--keys",
            "4_000_000",
            "--dim",
            "32",
            "--threads",
            "2,1,2",
            "--batch",
            "1024",
            "--json",
            "out.json",
            "--systems",
            "dynemb,hashbrown",
            "--repeats",
            "2",
        ])
        .unwrap();
        assert_eq!(o.keys, Some(4_000_000));
        assert_eq!(o.threads, [2, 1]);
        assert_eq!(o.systems, [System::Dynemb, System::HashbrownRwLock]);
        assert_eq!(o.json, Some(PathBuf::from("out.json")));
        let p = o.plan();
        assert_eq!(p.configs.len(), 1, "--dim: no sweep");
        assert_eq!(p.configs[0].shape.dim, 32);
        assert_eq!(p.configs[0].shape.batch, 1024);
        assert_eq!((p.repeats, p.destructive_repeats), (2, 2));
    }

    #[test]
    fn quick() {
        let p = run(&["--quick"]).unwrap().plan();
        assert_eq!(p.configs.len(), 1);
        assert_eq!(p.configs[0].shape.keys, 1 << 20);
        assert_eq!(p.configs[0].shape.dim, 64);
        assert_eq!((p.repeats, p.destructive_repeats), (3, 1));
        assert!(p.configs[0].resize);
    }

    #[test]
    fn errors_are_clear() {
        assert_eq!(run(&["--bogus"]).unwrap_err(), "unknown flag \"--bogus\"");
        assert_eq!(run(&["--keys"]).unwrap_err(), "--keys needs a value");
        assert!(run(&["--keys", "0"])
            .unwrap_err()
            .contains("positive integer"));
        assert!(run(&["--dim", "x"]).unwrap_err().contains("\"x\""));
        assert!(run(&["--systems", "redis"])
            .unwrap_err()
            .contains("unknown system"));
        assert!(run(&["--threads", ","]).unwrap_err().contains("list"));
        assert_eq!(run(&["--help"]).unwrap_err(), "help");
    }
}
