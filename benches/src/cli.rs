//! The `compare` binary's flags, and the [`Plan`] they make.
//!
//! ```text
//! compare [--keys N] [--dim D[,D..]] [--threads T[,T..]] [--batch B] [--json FILE]
//!         [--quick] [--systems S[,S..]] [--ops O[,O..]] [--repeats R]
//! ```
//!
//! Defaults: 8Mi keys (8,388,608), dim 64 plus a dim sweep (8 and 256, for
//! lookup hit, upsert and accumulate) and dim 16 for the optimizer steps
//! (`apply`), 1 and 2 threads, batches of 65,536, 1Mi keys per timed run, 5
//! rounds (3 for the ops that rebuild the table), every system, every op.
//! `--dim` runs those dims only (every selected op at each; the first is the
//! main configuration), no sweep. `--quick`: 1Mi keys, dim 64 only, 256Ki
//! keys per timed run, 3 rounds (1 for rebuilding ops), of the optimizer
//! steps only `SparseAdam`'s unless `--ops` selects others; other flags
//! still apply on top. The sweep keeps the main configuration's bytes of rows:
//! `keys * 64 / dim` keys, at most `keys` (dim 8: `keys`, dim 256: `keys /
//! 4`); the `apply` configuration at dim 16 has `keys` keys. `--ops` selects
//! what runs (see [`USAGE`]); a configuration left with nothing to run is
//! skipped.

use crate::peers::{Op, System};
use crate::suite::{Config, Plan};
use crate::workload::Shape;
use std::path::PathBuf;

/// Usage text, printed by `--help` and after a flag error.
pub const USAGE: &str = "\
usage: compare [--keys N] [--dim D[,D..]] [--threads T[,T..]] [--batch B] [--json FILE]
               [--quick] [--systems S[,S..]] [--ops O[,O..]] [--repeats R]

  --keys N        keys in the table (default 8388608; --quick: 1048576)
  --dim D,..      values per row; only these dims, every selected op at each, the first
                  is the main one (default 64, plus a sweep of dims 8 and 256 for lookup
                  hit, upsert and accum, and dim 16 for apply)
  --threads T,..  thread counts to run every op at (default 1,2)
  --batch B       keys per batch (default 65536)
  --json FILE     also write every figure as JSON to FILE
  --quick         1048576 keys, dim 64 only, fewer keys per run and rounds, of the
                  optimizer steps only SparseAdam's unless --ops selects others (CI)
  --systems S,..  systems to run (default all): dynemb, dashmap, papaya, scc,
                  hashbrown, dense
  --ops O,..      what to run (default all): lookup (hit, uniform and zipf), miss
                  (constant and random normal init), upsert, accum, insert, remove,
                  export, resize (under load), checkpoint (dynemb's save and restore),
                  apply (optimizer steps: SparseSgd, SparseAdagrad, SparseAdam, uniform
                  and zipf), apply-sgd, apply-adagrad, apply-adam, redis (dynemb-redis on
                  a 3-master Redis Cluster the bench starts: --keys keys, default 1000000,
                  the first --dim; by default only when redis-server is installed, and
                  not with --quick)
  --repeats R     rounds of the steady-state ops and optimizer steps (default 5; --quick: 3)
  -h, --help      this text";

/// The parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// `--keys`.
    pub keys: Option<usize>,
    /// `--dim` (empty: the default dims).
    pub dims: Vec<usize>,
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
    /// The ops `--ops` selects, in report order; `None`: the default (every
    /// op; with `--quick`, of the optimizer steps only `SparseAdam`'s).
    pub ops: Option<Vec<Op>>,
    /// Whether `--ops` selects resize under load (default: yes).
    pub resize: bool,
    /// Whether `--ops` selects the checkpoint measurement (default: yes).
    pub checkpoint: bool,
    /// Whether `--ops` selects the Redis group; `None` (no `--ops`): when
    /// the Redis tools are installed and not `--quick`.
    pub redis: Option<bool>,
    /// `--repeats`.
    pub repeats: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            keys: None,
            dims: Vec::new(),
            threads: vec![1, 2],
            batch: 1 << 16,
            json: None,
            quick: false,
            systems: System::ALL.to_vec(),
            ops: None,
            resize: true,
            checkpoint: true,
            redis: None,
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
            "--dim" => o.dims = list(&value()?, |s| positive(&flag, s))?,
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
            "--ops" => {
                let selected = list(&value()?, |s| {
                    Selection::from_name(s).ok_or_else(|| {
                        format!(
                            "--ops: unknown op {s:?} (known: {})",
                            Selection::NAMES.join(", ")
                        )
                    })
                })?;
                o.ops = Some(
                    Op::ALL
                        .into_iter()
                        .filter(|op| selected.iter().any(|s| s.ops().contains(op)))
                        .collect(),
                );
                o.resize = selected.contains(&Selection::Resize);
                o.checkpoint = selected.contains(&Selection::Checkpoint);
                o.redis = Some(selected.contains(&Selection::Redis));
            }
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    if o.keys.is_some_and(|k| k >= u32::MAX as usize) {
        return Err("--keys must be below 2^32".into());
    }
    Ok(Command::Run(o))
}

/// What one name of `--ops` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Selection {
    /// Some ops.
    Ops(&'static [Op]),
    /// Resize under load.
    Resize,
    /// dynemb's checkpoint save and restore.
    Checkpoint,
    /// The Redis group.
    Redis,
}

impl Selection {
    /// The names `--ops` knows, in usage order.
    const NAMES: [&'static str; 14] = [
        "lookup",
        "miss",
        "upsert",
        "accum",
        "insert",
        "remove",
        "export",
        "resize",
        "checkpoint",
        "apply",
        "apply-sgd",
        "apply-adagrad",
        "apply-adam",
        "redis",
    ];

    /// The selection called `name`.
    fn from_name(name: &str) -> Option<Selection> {
        Some(match name {
            "lookup" => Selection::Ops(&[Op::LookupHit, Op::LookupHitZipf]),
            "miss" => Selection::Ops(&[Op::LookupMissConstant, Op::LookupMissNormal]),
            "upsert" => Selection::Ops(&[Op::Upsert]),
            "accum" => Selection::Ops(&[Op::Accum]),
            "insert" => Selection::Ops(&[Op::Insert]),
            "remove" => Selection::Ops(&[Op::Remove]),
            "export" => Selection::Ops(&[Op::Export]),
            "resize" => Selection::Resize,
            "checkpoint" => Selection::Checkpoint,
            "redis" => Selection::Redis,
            "apply" => Selection::Ops(&Op::APPLY),
            "apply-sgd" => Selection::Ops(&[Op::ApplySgd, Op::ApplySgdZipf]),
            "apply-adagrad" => Selection::Ops(&[Op::ApplyAdagrad, Op::ApplyAdagradZipf]),
            "apply-adam" => Selection::Ops(&[Op::ApplyAdam, Op::ApplyAdamZipf]),
            _ => return None,
        })
    }

    /// The ops it selects.
    fn ops(self) -> &'static [Op] {
        match self {
            Selection::Ops(ops) => ops,
            Selection::Resize | Selection::Checkpoint | Selection::Redis => &[],
        }
    }
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

/// The other dims of the optimizer steps (`apply` only), with `keys` keys.
pub const APPLY_DIMS: [usize; 1] = [16];

impl Options {
    /// The plan these options describe (the Redis group by default if
    /// [`crate::redis::available`]).
    pub fn plan(&self) -> Plan {
        self.plan_with(crate::redis::available())
    }

    /// The plan these options describe, `redis_installed` saying whether
    /// the default includes the Redis group.
    pub fn plan_with(&self, redis_installed: bool) -> Plan {
        let keys = self
            .keys
            .unwrap_or(if self.quick { 1 << 20 } else { 8 << 20 });
        let picks = if self.quick { 1 << 18 } else { 1 << 20 };
        let shape = |keys, dim| Shape {
            keys,
            dim,
            batch: self.batch,
            picks,
            zipf_s: 1.1,
            seed: SEED,
        };
        let chosen = self.ops.clone().unwrap_or_else(|| {
            let quick_skips = [
                Op::ApplySgd,
                Op::ApplySgdZipf,
                Op::ApplyAdagrad,
                Op::ApplyAdagradZipf,
            ];
            Op::ALL
                .into_iter()
                .filter(|op| !(self.quick && quick_skips.contains(op)))
                .collect()
        });
        let selected = |ops: &[Op]| -> Vec<Op> {
            ops.iter()
                .copied()
                .filter(|op| chosen.contains(op))
                .collect()
        };
        let config = |keys, dim, ops: &[Op], main: bool| Config {
            shape: shape(keys, dim),
            ops: selected(ops),
            resize: main && self.resize,
            checkpoint: main && self.checkpoint,
        };
        let mut configs = Vec::new();
        if self.dims.is_empty() {
            configs.push(config(keys, DEFAULT_DIM, &Op::ALL, true));
            if !self.quick {
                for d in SWEEP_DIMS {
                    let sweep = [Op::LookupHit, Op::Upsert, Op::Accum];
                    let sweep_keys = (keys * DEFAULT_DIM / d).clamp(1, keys);
                    configs.push(config(sweep_keys, d, &sweep, false));
                }
                for d in APPLY_DIMS {
                    configs.push(config(keys, d, &Op::APPLY, false));
                }
            }
        } else {
            for (i, &d) in self.dims.iter().enumerate() {
                configs.push(config(keys, d, &Op::ALL, i == 0));
            }
        }
        configs.retain(|c| !c.ops.is_empty() || c.resize || c.checkpoint);
        let repeats = self.repeats.unwrap_or(if self.quick { 3 } else { 5 });
        Plan {
            configs,
            threads: self.threads.clone(),
            repeats,
            destructive_repeats: if self.quick { 1 } else { repeats.min(3) },
            systems: self.systems.clone(),
            redis: self
                .redis
                .unwrap_or(redis_installed && !self.quick)
                .then(|| {
                    let keys = self.keys.unwrap_or(crate::redis::DEFAULT_KEYS);
                    crate::redis::RedisShape {
                        keys,
                        dim: self.dims.first().copied().unwrap_or(DEFAULT_DIM),
                        batch: self.batch,
                        sample: crate::redis::PER_KEY_SAMPLE.min(keys),
                    }
                }),
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
        assert_eq!(p.configs.len(), 4);
        assert_eq!(p.configs[0].shape.keys, 8 << 20);
        assert_eq!(p.configs[0].shape.dim, 64);
        assert_eq!(p.configs[0].ops, Op::ALL);
        assert_eq!(p.configs[1].shape.dim, 8);
        assert_eq!(p.configs[1].shape.keys, 8 << 20);
        assert_eq!(p.configs[2].shape.dim, 256);
        assert_eq!(p.configs[2].shape.keys, 2 << 20);
        assert_eq!(p.configs[3].shape.dim, 16);
        assert_eq!(p.configs[3].shape.keys, 8 << 20);
        assert_eq!(p.configs[3].ops, Op::APPLY);
        assert!(p.configs[0].resize && p.configs[0].checkpoint);
        assert!(!p.configs[3].resize && !p.configs[3].checkpoint);
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
        assert_eq!(o.dims, [32]);
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
        let apply: Vec<Op> = p.configs[0]
            .ops
            .iter()
            .copied()
            .filter(|op| op.is_apply())
            .collect();
        assert_eq!(
            apply,
            [Op::ApplyAdam, Op::ApplyAdamZipf],
            "quick: Adam only"
        );
        assert_eq!(p.configs[0].ops.len(), 11);
        let p = run(&["--quick", "--ops", "apply"]).unwrap().plan();
        assert_eq!(p.configs[0].ops, Op::APPLY, "unless --ops says otherwise");
    }

    #[test]
    fn ops_select_what_runs() {
        let o = run(&["--ops", "apply,accum"]).unwrap();
        let mut want = vec![Op::Accum];
        want.extend(Op::APPLY);
        assert_eq!(o.ops, Some(want.clone()));
        assert!(!o.resize && !o.checkpoint);
        let p = o.plan();
        let dims: Vec<usize> = p.configs.iter().map(|c| c.shape.dim).collect();
        assert_eq!(dims, [64, 8, 256, 16]);
        assert_eq!(p.configs[0].ops, want);
        assert_eq!(p.configs[1].ops, [Op::Accum], "the sweep keeps accum");
        assert_eq!(p.configs[3].ops, Op::APPLY);
        assert!(!p.configs[0].resize && !p.configs[0].checkpoint);

        let p = run(&["--ops", "apply-adam", "--dim", "64,16"])
            .unwrap()
            .plan();
        assert_eq!(p.configs.len(), 2);
        for (c, dim) in p.configs.iter().zip([64, 16]) {
            assert_eq!(c.shape.dim, dim);
            assert_eq!(c.ops, [Op::ApplyAdam, Op::ApplyAdamZipf]);
        }

        let p = run(&["--ops", "lookup,resize"]).unwrap().plan();
        let dims: Vec<usize> = p.configs.iter().map(|c| c.shape.dim).collect();
        assert_eq!(dims, [64, 8, 256], "nothing to run at dim 16");
        assert!(p.configs[0].resize && !p.configs[0].checkpoint);
        assert_eq!(p.configs[0].ops, [Op::LookupHit, Op::LookupHitZipf]);

        let p = run(&["--ops", "checkpoint", "--quick"]).unwrap().plan();
        assert_eq!(p.configs.len(), 1);
        assert!(p.configs[0].ops.is_empty() && p.configs[0].checkpoint);
    }

    #[test]
    fn redis_runs_when_selected_or_by_default_when_installed() {
        use crate::redis::RedisShape;
        let none = |args: &[&str], installed| run(args).unwrap().plan_with(installed).redis;
        assert_eq!(none(&[], false), None, "not installed");
        assert_eq!(none(&["--quick"], true), None, "quick skips it");
        assert_eq!(none(&["--ops", "lookup"], true), None, "not selected");
        assert_eq!(
            none(&[], true),
            Some(RedisShape {
                keys: 1_000_000,
                dim: 64,
                batch: 65_536,
                sample: 20_000
            })
        );
        let o = run(&[
            "--ops", "redis", "--quick", "--keys", "5000", "--batch", "512",
        ])
        .unwrap();
        assert!(!o.resize && !o.checkpoint);
        let p = o.plan_with(false);
        assert!(p.configs.is_empty(), "only the Redis group");
        assert_eq!(
            p.redis,
            Some(RedisShape {
                keys: 5000,
                dim: 64,
                batch: 512,
                sample: 5000
            })
        );
        let p = run(&["--ops", "redis,accum", "--dim", "16"])
            .unwrap()
            .plan_with(true);
        assert_eq!(p.redis.map(|r| r.dim), Some(16));
        assert_eq!(p.configs[0].ops, [Op::Accum]);
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
        assert!(run(&["--ops", "lookup,train"])
            .unwrap_err()
            .contains("unknown op \"train\""));
        assert_eq!(run(&["--help"]).unwrap_err(), "help");
    }
}
