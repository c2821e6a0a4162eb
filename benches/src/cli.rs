//! The `compare` binary's flags, and the [`Plan`] they make.
//!
//! ```text
//! compare [--keys N] [--dim D[,D..]] [--threads T[,T..]] [--batch B] [--json FILE]
//!         [--quick] [--systems S[,S..]] [--ops O[,O..]] [--repeats R]
//!         [--bounded-ids N] [--bounded-capacity N] [--bounded-batch B]
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
//! what runs (see `--help`); a configuration left with nothing to run is
//! skipped. The bounded group ([`crate::bounded`]) runs with dynemb, at the
//! most `--threads`, the first `--dim` (default 16), one run unless
//! `--repeats` says otherwise; its sizes have flags of their own (defaults:
//! 100M ids into 4M rows, batches of 4,096; `--quick`: 2M ids into 100k
//! rows).

use crate::bounded::{cost, BoundedShape};
use crate::peers::{Op, System};
use crate::suite::{Config, Plan};
use crate::workload::Shape;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{CommandFactory, Parser};
use std::path::PathBuf;

/// The `compare` command line as clap reads it; [`Cli::options`] turns it
/// into [`Options`].
#[derive(Debug, Parser)]
#[command(
    name = "compare",
    about = "dynemb, its peers and the dense references on one workload, one system after another",
    long_about = None
)]
pub struct Cli {
    /// Keys in the table (default 8388608; --quick: 1048576).
    #[arg(long, value_name = "N", value_parser = keys)]
    keys: Option<usize>,
    /// Values per row: only these dims, every selected op at each, the first
    /// is the main one (default 64, plus a sweep of dims 8 and 256 for lookup
    /// hit, upsert and accum, and dim 16 for apply).
    #[arg(long = "dim", value_name = "D,..", value_delimiter = ',', value_parser = positive)]
    dims: Vec<usize>,
    /// Thread counts to run every op at.
    #[arg(long, value_name = "T,..", value_delimiter = ',', value_parser = positive, default_value = "1,2")]
    threads: Vec<usize>,
    /// Keys per batch.
    #[arg(long, value_name = "B", value_parser = positive, default_value = "65536")]
    batch: usize,
    /// Also write every figure as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// 1048576 keys, dim 64 only, fewer keys per run and rounds, of the
    /// optimizer steps only SparseAdam's unless --ops selects others (CI).
    #[arg(long)]
    quick: bool,
    /// Systems to run (default all).
    #[arg(
        long,
        value_name = "S,..",
        value_delimiter = ',',
        value_parser = PossibleValuesParser::new(SYSTEM_NAMES)
            .map(|s| System::from_name(&s).expect("a listed name")),
    )]
    systems: Vec<System>,
    /// What to run (default all): lookup (hit, uniform and zipf), miss
    /// (constant and random normal init), upsert, accum, insert, remove,
    /// export, resize (under load), checkpoint (dynemb's save and restore),
    /// apply (optimizer steps: SparseSgd, SparseAdagrad, SparseAdam, uniform
    /// and zipf), apply-sgd, apply-adagrad, apply-adam, redis (dynemb-redis on
    /// a 3-master Redis Cluster the bench starts: --keys keys, default
    /// 1000000, the first --dim; by default only when redis-server is
    /// installed, and not with --quick), bounded (a variable with a capacity
    /// on a Zipf training stream, LRU and LFU, against moka and exact LRU
    /// and LFU, its eviction quality, and bounded-cost), bounded-cost (the
    /// lifecycle features' cost below capacity: lookups and inserts with
    /// each feature on and off).
    #[arg(
        long,
        value_name = "O,..",
        value_delimiter = ',',
        hide_possible_values = true,
        value_parser = PossibleValuesParser::new(Selection::NAMES)
            .map(|s| Selection::from_name(&s).expect("a listed name")),
    )]
    ops: Option<Vec<Selection>>,
    /// Rounds of the steady-state ops and optimizer steps (default 5;
    /// --quick: 3); runs of the bounded stream per system (default 1).
    #[arg(long, value_name = "R", value_parser = positive)]
    repeats: Option<usize>,
    /// Ids in the bounded group's training stream (default 100000000;
    /// --quick: 2000000).
    #[arg(long, value_name = "N", value_parser = positive)]
    bounded_ids: Option<usize>,
    /// Rows of the bounded group's tables (default 4000000; --quick:
    /// 100000); more than --bounded-batch.
    #[arg(long, value_name = "N", value_parser = positive)]
    bounded_capacity: Option<usize>,
    /// Ids per batch of the bounded group (default 4096).
    #[arg(long, value_name = "B", value_parser = positive)]
    bounded_batch: Option<usize>,
    /// The variants bounded-cost runs (default all): off, timestamp,
    /// capacity, exact, sketch.
    #[arg(
        long,
        value_name = "V,..",
        value_delimiter = ',',
        hide_possible_values = true,
        value_parser = PossibleValuesParser::new(cost::VARIANTS),
    )]
    bounded_cost_variants: Vec<String>,
}

/// The names `--systems` knows.
const SYSTEM_NAMES: [&str; 8] = [
    "dynemb",
    "dynemb-bf16",
    "dashmap",
    "papaya",
    "scc",
    "hashbrown",
    "dense",
    "dense-indirect",
];

impl Cli {
    /// The options this command line describes: lists without repeats,
    /// `--ops` names resolved to ops.
    pub fn options(self) -> Options {
        let mut o = Options {
            keys: self.keys,
            dims: dedup(self.dims),
            threads: dedup(self.threads),
            batch: self.batch,
            json: self.json,
            quick: self.quick,
            repeats: self.repeats,
            bounded_ids: self.bounded_ids,
            bounded_capacity: self.bounded_capacity,
            bounded_batch: self.bounded_batch,
            bounded_cost_variants: dedup(self.bounded_cost_variants),
            ..Options::default()
        };
        if !self.systems.is_empty() {
            o.systems = dedup(self.systems);
        }
        if let Some(selected) = self.ops {
            o.ops = Some(
                Op::ALL
                    .into_iter()
                    .filter(|op| selected.iter().any(|s| s.ops().contains(op)))
                    .collect(),
            );
            o.resize = selected.contains(&Selection::Resize);
            o.checkpoint = selected.contains(&Selection::Checkpoint);
            o.redis = Some(selected.contains(&Selection::Redis));
            o.bounded = selected.contains(&Selection::Bounded);
            o.bounded_cost = o.bounded || selected.contains(&Selection::BoundedCost);
        }
        o
    }
}

/// The options of the command line `args` (the program name first); the
/// error prints the usage or `--help` text when exited with.
pub fn parse_from<I, T>(args: I) -> Result<Options, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let options = Cli::try_parse_from(args).map(Cli::options)?;
    if let Some(b) = options.bounded_shape() {
        if b.capacity <= b.batch {
            return Err(Cli::command().error(
                clap::error::ErrorKind::ValueValidation,
                format!(
                    "--bounded-capacity ({}) must exceed --bounded-batch ({})",
                    b.capacity, b.batch
                ),
            ));
        }
    }
    Ok(options)
}

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
    /// Whether `--ops` selects the bounded group's stream and eviction
    /// quality (default: yes).
    pub bounded: bool,
    /// Whether `--ops` selects the bounded group's cost below capacity
    /// (default: yes; `bounded` selects it too).
    pub bounded_cost: bool,
    /// `--bounded-ids`.
    pub bounded_ids: Option<usize>,
    /// `--bounded-capacity`.
    pub bounded_capacity: Option<usize>,
    /// `--bounded-batch`.
    pub bounded_batch: Option<usize>,
    /// `--bounded-cost-variants` (empty: every variant).
    pub bounded_cost_variants: Vec<String>,
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
            bounded: true,
            bounded_cost: true,
            bounded_ids: None,
            bounded_capacity: None,
            bounded_batch: None,
            bounded_cost_variants: Vec::new(),
        }
    }
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
    /// The bounded group.
    Bounded,
    /// The bounded group's cost below capacity only.
    BoundedCost,
}

impl Selection {
    /// The names `--ops` knows, in usage order.
    const NAMES: [&'static str; 16] = [
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
        "bounded",
        "bounded-cost",
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
            "bounded" => Selection::Bounded,
            "bounded-cost" => Selection::BoundedCost,
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
            Selection::Resize
            | Selection::Checkpoint
            | Selection::Redis
            | Selection::Bounded
            | Selection::BoundedCost => &[],
        }
    }
}

/// A positive integer; `_` may separate digits (`4_000_000`).
fn positive(s: &str) -> Result<usize, String> {
    match s.trim().replace('_', "").parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a positive integer".into()),
    }
}

/// A key count: a positive integer below 2^32.
fn keys(s: &str) -> Result<usize, String> {
    let n = positive(s)?;
    if n >= u32::MAX as usize {
        return Err("must be below 2^32".into());
    }
    Ok(n)
}

/// `items` without repeats, in the order given.
fn dedup<T: PartialEq>(items: Vec<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len());
    for v in items {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
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
    /// The bounded group's workload, if it runs: selected (by default it
    /// is) and dynemb among the systems.
    pub fn bounded_shape(&self) -> Option<BoundedShape> {
        if !((self.bounded || self.bounded_cost) && self.systems.contains(&System::Dynemb)) {
            return None;
        }
        let default = BoundedShape::default_for(self.quick);
        Some(BoundedShape {
            ids: self.bounded_ids.unwrap_or(default.ids),
            capacity: self.bounded_capacity.unwrap_or(default.capacity),
            batch: self.bounded_batch.unwrap_or(default.batch),
            dim: self.dims.first().copied().unwrap_or(default.dim),
            threads: self
                .threads
                .iter()
                .copied()
                .max()
                .unwrap_or(default.threads),
            repeats: self.repeats.unwrap_or(default.repeats),
            quality_capacity: default.quality_capacity,
            stream: self.bounded,
            cost_keys: if self.bounded_cost {
                default.cost_keys
            } else {
                0
            },
            cost_variants: cost::VARIANTS.map(|v| {
                self.bounded_cost_variants.is_empty()
                    || self.bounded_cost_variants.iter().any(|s| s == v)
            }),
        })
    }

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
            bounded: self.bounded_shape(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::error::ErrorKind;

    fn run(args: &[&str]) -> Result<Options, String> {
        Cli::try_parse_from(std::iter::once("compare").chain(args.iter().copied()))
            .map(Cli::options)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn clap_definition_is_valid() {
        Cli::command().debug_assert();
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
    fn bounded_group_shape() {
        let p = run(&[]).unwrap().plan_with(false);
        assert_eq!(p.bounded, Some(BoundedShape::default_for(false)));
        let b = p.bounded.unwrap();
        assert_eq!((b.ids, b.capacity, b.batch), (100_000_000, 4_000_000, 4096));
        assert_eq!((b.dim, b.threads, b.repeats), (16, 2, 1));
        let b = run(&["--quick"]).unwrap().plan_with(false).bounded.unwrap();
        assert_eq!(
            (b.ids, b.capacity, b.quality_capacity),
            (2_000_000, 100_000, 50_000)
        );
        let o = run(&[
            "--ops",
            "bounded",
            "--bounded-ids",
            "1_000",
            "--bounded-capacity",
            "500",
            "--bounded-batch",
            "100",
            "--threads",
            "1",
            "--dim",
            "8",
            "--repeats",
            "3",
        ])
        .unwrap();
        let p = o.plan_with(true);
        assert!(
            p.configs.is_empty() && p.redis.is_none(),
            "only the bounded group"
        );
        let b = p.bounded.unwrap();
        assert_eq!((b.ids, b.capacity, b.batch), (1000, 500, 100));
        assert_eq!((b.dim, b.threads, b.repeats), (8, 1, 3));
        assert!(
            b.stream && b.cost_keys == 4_000_000,
            "bounded selects both parts"
        );
        let b = run(&["--ops", "bounded-cost"])
            .unwrap()
            .plan()
            .bounded
            .unwrap();
        assert!(!b.stream && b.cost_keys == 4_000_000, "only the cost");
        assert_eq!(b.cost_variants, [true; 5], "every variant by default");
        let b = run(&[
            "--ops",
            "bounded-cost",
            "--bounded-cost-variants",
            "timestamp,off",
        ])
        .unwrap()
        .plan()
        .bounded
        .unwrap();
        assert_eq!(b.cost_variants, [true, true, false, false, false]);
        assert!(run(&["--bounded-cost-variants", "lru"]).is_err());
        assert_eq!(run(&["--ops", "lookup"]).unwrap().plan().bounded, None);
        let no_dynemb = run(&["--systems", "dashmap"]).unwrap().plan();
        assert_eq!(no_dynemb.bounded, None, "the group needs dynemb");
        let e = parse_from([
            "compare",
            "--bounded-capacity",
            "100",
            "--bounded-batch",
            "100",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--bounded-capacity") && e.contains("must exceed"),
            "{e}"
        );
        assert!(parse_from(["compare", "--ops", "bounded", "--quick"]).is_ok());
    }

    #[test]
    fn errors_are_clear() {
        let err = |args: &[&str]| run(args).unwrap_err();
        assert!(err(&["--bogus"]).contains("'--bogus'"));
        assert!(err(&["--keys"]).contains("'--keys <N>'"));
        let e = err(&["--keys", "0"]);
        assert!(
            e.contains("--keys") && e.contains("positive integer"),
            "{e}"
        );
        assert!(err(&["--keys", "4294967295"]).contains("below 2^32"));
        let e = err(&["--dim", "x"]);
        assert!(e.contains("--dim") && e.contains("'x'"), "{e}");
        let e = err(&["--systems", "redis"]);
        assert!(e.contains("--systems") && e.contains("'redis'"), "{e}");
        assert!(err(&["--threads", ","]).contains("--threads"));
        let e = err(&["--ops", "lookup,train"]);
        assert!(e.contains("--ops") && e.contains("'train'"), "{e}");
        let help = Cli::try_parse_from(["compare", "--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
    }
}
