//! The command line: [`Flags`] (parsed by clap) resolved into a [`Config`]
//! with every default filled in. A `Config` that resolves is within every
//! bound, so a mistyped size is an error naming its flag before anything
//! is allocated, never an allocation failure minutes into a run.
//!
//! clap checks each value (numbers may use `_` separators: `2_000_000`)
//! and the rules between flags it can state (`requires`,
//! `conflicts_with`); [`Flags::resolve`] applies the `--quick` presets,
//! the thread count's sources and the rules that need several values
//! (held-out ids, a batch's embedding values, `--max-size` and
//! `--capacity` against one batch's ids, `--capacity`, `--min-count` and
//! half-precision dtypes, which a Redis table lacks, against `--redis`,
//! and `--stochastic-rounding` against the dtypes, since it rounds bf16
//! columns only and would otherwise be ignored). Whether a resumed run asks for the same run is checked
//! against its checkpoint (`checkpoint`), and whether Redis answers when
//! the table opens (`table`).
//!
//! `RAYON_NUM_THREADS` is read through [`Environment`] rather than clap's
//! `env`, because a value rayon ignores (0, not a number) must be ignored
//! here too and tests must not depend on the process's environment.
//!
//! The defaults fit about two minutes on two cores and stop where more
//! training stops paying: one epoch (a second pass over the same samples
//! overfits), `--dim 16` and `--batch 2048` (larger batches were faster
//! but lost held-out AUC).

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{ArgGroup, CommandFactory, Parser};

use dynemb::{Dtype, Rounding};

use crate::model::TablePrecision;
use crate::source::MAX_FIELDS;

/// Synthetic fields unless `--fields` says otherwise.
pub const DEFAULT_FIELDS: usize = 26;
/// Embedding dimension unless `--dim` says otherwise.
pub const DEFAULT_DIM: usize = 16;
/// Samples per batch unless `--batch` says otherwise.
pub const DEFAULT_BATCH: usize = 2048;
/// Passes over the training data (`--quick`: [`QUICK_EPOCHS`]).
pub const DEFAULT_EPOCHS: usize = 1;
/// Synthetic training samples per epoch (`--quick`: [`QUICK_TRAIN`]).
pub const DEFAULT_TRAIN: usize = 2_000_000;
/// Held-out samples (`--quick`: [`QUICK_EVAL`]).
pub const DEFAULT_EVAL: usize = 200_000;
/// Seed of the synthetic data and of the model.
pub const DEFAULT_SEED: u64 = 42;
/// `--quick` epochs (one, as the default: a second pass overfits).
pub const QUICK_EPOCHS: usize = 1;
/// `--quick` training samples per epoch.
pub const QUICK_TRAIN: usize = 100_000;
/// `--quick` held-out samples.
pub const QUICK_EVAL: usize = 10_000;
/// Largest `--dim`.
pub const MAX_DIM: usize = 1024;
/// Largest `--batch`.
pub const MAX_BATCH: usize = 1 << 20;
/// Largest `--eval-samples`.
pub const MAX_EVAL: usize = 50_000_000;
/// Most held-out ids (`eval samples × fields`, 8 bytes each: 2 GiB).
pub const MAX_EVAL_IDS: usize = 1 << 28;
/// Most values in one batch's embedding rows (`batch × fields × dim`
/// `f32`s: 1 GiB).
pub const MAX_BATCH_VALUES: usize = 1 << 28;
/// The Redis table's prefix unless `--redis-prefix` says otherwise.
pub const DEFAULT_REDIS_PREFIX: &str = "ctr";
/// Largest `--threads`.
pub const MAX_THREADS: usize = 256;
/// The environment variable that sizes candle's (rayon's) CPU thread pool.
pub const THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// The example's flags as given on the command line.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "ctr",
    about = "Trains a CTR model with dynamic embeddings (dynemb + candle).",
    override_usage = "cargo run --release -p dynemb-candle --example ctr -- [OPTIONS]",
    allow_negative_numbers = true,
    max_term_width = 100,
    group(ArgGroup::new("replaceable").args(["checkpoint", "redis"]).multiple(true))
)]
pub struct Flags {
    /// Criteo TSV (label, I1..I13, C1..C26); synthetic data when absent
    #[arg(long, value_name = "FILE", value_parser = path, help_heading = "Data")]
    pub data: Option<PathBuf>,

    /// Synthetic categorical fields (default 26, at most 256; not with --data)
    #[arg(long, value_name = "N", value_parser = count(MAX_FIELDS),
          conflicts_with = "data", help_heading = "Data")]
    pub fields: Option<usize>,

    /// Training samples per epoch (synthetic default 2000000; Criteo default:
    /// every line but the held-out ones)
    #[arg(long, value_name = "N", value_parser = count(usize::MAX), help_heading = "Data")]
    pub train_samples: Option<usize>,

    /// Held-out samples, after the training ones (default 200000, at most
    /// 50000000 and 2^28 held-out ids)
    #[arg(long, value_name = "N", value_parser = count(MAX_EVAL), help_heading = "Data")]
    pub eval_samples: Option<usize>,

    /// Seed of the synthetic data and of the embeddings' and the MLP's
    /// initial values: equal seeds, equal runs
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SEED, value_parser = seed,
          help_heading = "Data")]
    pub seed: u64,

    /// Tiny run for CI: 100000 training, 10000 held-out, epochs 1 (flags
    /// given override them)
    #[arg(long, help_heading = "Data")]
    pub quick: bool,

    /// First stream one epoch and report on the data (distinct ids, new-id
    /// rates, unseen held-out ids); costs an extra pass and memory for every
    /// distinct id
    #[arg(long, help_heading = "Data")]
    pub summary: bool,

    /// Embedding dimension (at most 1024)
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DIM, value_parser = count(MAX_DIM),
          help_heading = "Training")]
    pub dim: usize,

    /// Samples per batch (at most 1048576)
    #[arg(long, value_name = "N", default_value_t = DEFAULT_BATCH,
          value_parser = count(MAX_BATCH), help_heading = "Training")]
    pub batch: usize,

    /// Passes over the training data (default 1)
    #[arg(long, value_name = "N", value_parser = count(usize::MAX), help_heading = "Training")]
    pub epochs: Option<usize>,

    /// Stop after N batches in all, from the run's start (default: no limit)
    #[arg(long, value_name = "N", value_parser = count(usize::MAX), help_heading = "Training")]
    pub steps: Option<usize>,

    /// Threads of candle's CPU pool (sets RAYON_NUM_THREADS) and shards of the
    /// embedding table (default: RAYON_NUM_THREADS if set, else the available
    /// cores; at most 256)
    #[arg(long, value_name = "N", value_parser = count(MAX_THREADS), help_heading = "Training")]
    pub threads: Option<usize>,

    /// Most rows kept in the embedding table between steps: after a step
    /// that leaves more, the least recently trained are evicted down to 90%
    /// (TFRA's restrict; default: no limit; at least --batch x fields, the
    /// rows one step inserts)
    #[arg(long, value_name = "N", value_parser = count(usize::MAX), help_heading = "Table")]
    pub max_size: Option<usize>,

    /// Most rows the embedding table ever holds: a new row in a full table
    /// evicts a least recently trained one, with its Adam slots (default: no
    /// limit; at least --batch x fields and --threads; not with --redis)
    #[arg(long, value_name = "N", value_parser = count(usize::MAX), help_heading = "Table")]
    pub capacity: Option<usize>,

    /// An id gets a row at its Nth training read (one read per batch it is
    /// in); before that it reads its initial row and its gradient is dropped
    /// (default 1: every id at its first read; not with --redis)
    #[arg(long, value_name = "N", value_parser = min_count, help_heading = "Table")]
    pub min_count: Option<u32>,

    /// At each epoch's end, remove the rows not trained for SECS seconds of
    /// wall-clock time (default: none; may change on --resume)
    #[arg(long, value_name = "SECS", value_parser = seconds, help_heading = "Table")]
    pub expire: Option<Duration>,

    /// How the table stores its embedding values: f32, f16 or bf16, rounded
    /// to nearest even as they are written (the model computes in f32; not
    /// f16 or bf16 with --redis; may change on --resume)
    #[arg(long, value_name = "DTYPE", default_value_t = Dtype::F32, value_parser = dtype,
          help_heading = "Table")]
    pub dtype: Dtype,

    /// How the table stores the Adam slots m and v: f32, f16 or bf16 (f16
    /// rounds squared gradients below about 3e-8 to zero; not f16 or bf16
    /// with --redis; may change on --resume)
    #[arg(long, value_name = "DTYPE", default_value_t = Dtype::F32, value_parser = dtype,
          help_heading = "Table")]
    pub slot_dtype: Dtype,

    /// The sparse optimizer's writes to bf16 columns round stochastically,
    /// from SEED, so small updates survive on average (default: to nearest
    /// even; needs --dtype bf16 or --slot-dtype bf16; may change on --resume)
    #[arg(long, value_name = "SEED", value_parser = seed, help_heading = "Table")]
    pub stochastic_rounding: Option<u64>,

    /// Keep the run in DIR: a checkpoint after every epoch and at the end
    /// (default: the model goes to a temporary directory for the reload check
    /// and is not kept)
    #[arg(long, value_name = "DIR", value_parser = path, help_heading = "Training")]
    pub checkpoint: Option<PathBuf>,

    /// Also a checkpoint every N training steps
    #[arg(long, value_name = "N", value_parser = count(usize::MAX),
          requires = "checkpoint", help_heading = "Training")]
    pub checkpoint_every: Option<usize>,

    /// Continue the run whose checkpoint is in --checkpoint DIR: same data and
    /// model flags; --epochs and --steps count in total; --threads, --expire,
    /// the dtypes, --checkpoint-every, --summary and the --redis flags may
    /// change
    #[arg(
        long,
        requires = "checkpoint",
        conflicts_with = "overwrite",
        help_heading = "Training"
    )]
    pub resume: bool,

    /// Start a new run even though --checkpoint DIR holds one (replaced by
    /// this run's first checkpoint) or the Redis table holds rows (cleared)
    #[arg(long, requires = "replaceable", help_heading = "Training")]
    pub overwrite: bool,

    /// A Redis server, or nodes of a Redis Cluster (one reachable node is
    /// enough), holding the table PREFIX:ctr/embeddings instead of this
    /// process's memory: a new run refuses one that holds rows, --resume
    /// replaces it with the checkpoint's table; destroyed at the end; the
    /// reload check restores the checkpoint into a local table
    #[arg(long, value_name = "HOST:PORT,..", value_parser = nodes, help_heading = "Redis")]
    pub redis: Option<Nodes>,

    /// Namespace of the table's Redis keys (default ctr; no { or });
    /// concurrent runs on one Redis need different prefixes
    #[arg(long, value_name = "PREFIX", value_parser = prefix, requires = "redis",
          help_heading = "Redis")]
    pub redis_prefix: Option<String>,

    /// Keep the Redis table after the run
    #[arg(long, requires = "redis", help_heading = "Redis")]
    pub redis_keep: bool,
}

/// The `host:port` nodes of `--redis`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nodes(pub Vec<String>);

/// Where the samples come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataChoice {
    /// The synthetic data set (`data.rs`).
    Synthetic {
        /// Categorical fields.
        fields: usize,
        /// Training samples per epoch.
        train_samples: usize,
    },
    /// A Criteo file (`criteo.rs`).
    Criteo {
        /// The file.
        path: PathBuf,
        /// Training lines per epoch; `None`: all but the held-out lines.
        train_samples: Option<usize>,
    },
}

/// Everything the flags say, defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where the samples come from.
    pub data: DataChoice,
    /// Held-out samples.
    pub eval_samples: usize,
    /// Embedding dimension.
    pub dim: usize,
    /// Samples per batch.
    pub batch: usize,
    /// Passes over the training data.
    pub epochs: usize,
    /// Most batches to train on in all; `None`: no limit.
    pub steps: Option<u64>,
    /// Threads of candle's CPU pool, and shards of the table.
    pub threads: usize,
    /// Where [`Config::threads`] came from.
    pub threads_from: ThreadsFrom,
    /// Most rows kept in the embedding table between steps (`--max-size`);
    /// `None`: no limit.
    pub max_size: Option<usize>,
    /// Most rows the embedding table ever holds (`--capacity`); `None`: no
    /// limit.
    pub capacity: Option<usize>,
    /// The training read at which an id gets a row (`--min-count`); 1:
    /// every id at its first.
    pub min_count: u32,
    /// Age at which rows are removed at an epoch's end (`--expire`);
    /// `None`: never.
    pub expire: Option<Duration>,
    /// The table's value and slot dtypes and rounding (`--dtype`,
    /// `--slot-dtype`, `--stochastic-rounding`).
    pub precision: TablePrecision,
    /// Where the run keeps its checkpoints (`--checkpoint`).
    pub checkpoint: Option<PathBuf>,
    /// Training steps between periodic checkpoints (`--checkpoint-every`).
    pub checkpoint_every: Option<u64>,
    /// Whether to continue the run checkpointed in
    /// [`Config::checkpoint`] (`--resume`).
    pub resume: bool,
    /// Whether a new run may replace the checkpoint in
    /// [`Config::checkpoint`] or the Redis table's rows (`--overwrite`).
    pub overwrite: bool,
    /// Whether `--quick` set the small sizes.
    pub quick: bool,
    /// Whether to stream an epoch first and report on the data.
    pub summary: bool,
    /// Seed of the synthetic data and of the model.
    pub seed: u64,
    /// Where the table lives in Redis (`--redis`); `None`: in this
    /// process's memory.
    pub redis: Option<RedisChoice>,
}

/// The Redis table's settings (`--redis`, `--redis-prefix`, `--redis-keep`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisChoice {
    /// `host:port` of the server or of cluster nodes.
    pub nodes: Vec<String>,
    /// Namespace of the table's Redis keys.
    pub prefix: String,
    /// Whether to keep the table after the run (else it is destroyed).
    pub keep: bool,
}

/// Where [`Config::threads`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadsFrom {
    /// `--threads`.
    Flag,
    /// The user's `RAYON_NUM_THREADS`.
    Environment,
    /// The available cores.
    Cores,
}

impl fmt::Display for ThreadsFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThreadsFrom::Flag => "--threads",
            ThreadsFrom::Environment => THREADS_VAR,
            ThreadsFrom::Cores => "available cores",
        })
    }
}

/// What the defaults depend on outside the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Environment {
    /// The value of [`THREADS_VAR`], if set.
    pub rayon_threads: Option<String>,
    /// Cores available to the process.
    pub cores: usize,
}

impl Environment {
    /// This process's environment.
    pub fn current() -> Self {
        Self {
            rayon_threads: std::env::var(THREADS_VAR).ok(),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

impl Config {
    /// Parses a command line (program name first) and resolves it against
    /// `env`. `--help` and every refusal are the `Err` (see
    /// [`clap::Error::exit`]).
    pub fn try_parse_from<I, T>(args: I, env: &Environment) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        Flags::try_parse_from(args)?.resolve(env)
    }
}

impl Flags {
    /// Fills in the defaults (`--quick` changes the sizes' defaults), picks
    /// the thread count and checks the bounds that involve several flags.
    pub fn resolve(self, env: &Environment) -> Result<Config, clap::Error> {
        let (train, eval, epochs) = if self.quick {
            (QUICK_TRAIN, QUICK_EVAL, QUICK_EPOCHS)
        } else {
            (DEFAULT_TRAIN, DEFAULT_EVAL, DEFAULT_EPOCHS)
        };
        let (data, fields) = match self.data {
            Some(path) => (
                DataChoice::Criteo {
                    path,
                    train_samples: self.train_samples.or(self.quick.then_some(train)),
                },
                crate::criteo::FIELDS,
            ),
            None => {
                let fields = self.fields.unwrap_or(DEFAULT_FIELDS);
                let train_samples = self.train_samples.unwrap_or(train);
                (
                    DataChoice::Synthetic {
                        fields,
                        train_samples,
                    },
                    fields,
                )
            }
        };
        let (dim, batch) = (self.dim, self.batch);
        let eval_samples = self.eval_samples.unwrap_or(eval);
        if eval_samples.saturating_mul(fields) > MAX_EVAL_IDS {
            return Err(invalid(
                "--eval-samples",
                eval_samples,
                format!(
                    "at most {MAX_EVAL_IDS} held-out ids in memory, {} samples of {fields} ids",
                    MAX_EVAL_IDS / fields
                ),
            ));
        }
        let batch_values = batch * fields * dim;
        if batch_values > MAX_BATCH_VALUES {
            return Err(Flags::command().error(
                ErrorKind::ArgumentConflict,
                format!(
                    "--batch {batch} x {fields} fields x --dim {dim} = {batch_values} embedding \
                     values a batch, more than {MAX_BATCH_VALUES} (1 GiB); lower --batch or --dim"
                ),
            ));
        }
        if let Some(max_size) = self.max_size.filter(|&max| max < batch * fields) {
            return Err(invalid(
                "--max-size",
                max_size,
                format!(
                    "at least one batch's ids (--batch {batch} x {fields} fields = {}), \
                     which a step inserts before the table is restricted",
                    batch * fields
                ),
            ));
        }
        let (threads, threads_from) = match self.threads {
            Some(threads) => (threads, ThreadsFrom::Flag),
            None => match threads_in(env)? {
                Some(threads) => (threads, ThreadsFrom::Environment),
                None => (env.cores.clamp(1, MAX_THREADS), ThreadsFrom::Cores),
            },
        };
        if let Some(capacity) = self.capacity {
            if capacity < batch * fields {
                return Err(invalid(
                    "--capacity",
                    capacity,
                    format!(
                        "at least one batch's ids (--batch {batch} x {fields} fields = {}), \
                         which a step reads and then trains",
                        batch * fields
                    ),
                ));
            }
            if capacity < threads {
                return Err(invalid(
                    "--capacity",
                    capacity,
                    format!("at least one row per shard of the table ({threads} threads)"),
                ));
            }
        }
        let min_count = self.min_count.unwrap_or(1);
        let precision = TablePrecision {
            values: self.dtype,
            slots: self.slot_dtype,
            rounding: self
                .stochastic_rounding
                .map_or(Rounding::NearestEven, |seed| Rounding::Stochastic { seed }),
        };
        if self.stochastic_rounding.is_some() && !precision.has_bf16_column() {
            return Err(Flags::command().error(
                ErrorKind::ArgumentConflict,
                format!(
                    "--stochastic-rounding rounds bf16 columns only, and --dtype {} \
                     --slot-dtype {} store none: add --dtype bf16 or --slot-dtype bf16",
                    self.dtype, self.slot_dtype
                ),
            ));
        }
        if self.redis.is_some() {
            let refused = [
                (
                    self.capacity.is_some(),
                    "--capacity".to_string(),
                    "evict rows as they arrive; --max-size bounds it after each step".to_string(),
                ),
                (
                    min_count > 1,
                    "--min-count".to_string(),
                    "admit ids late; --max-size bounds it after each step".to_string(),
                ),
                (
                    self.dtype != Dtype::F32,
                    format!("--dtype {}", self.dtype),
                    format!("store {} (it stores f32)", self.dtype),
                ),
                (
                    self.slot_dtype != Dtype::F32,
                    format!("--slot-dtype {}", self.slot_dtype),
                    format!("store {} (it stores f32)", self.slot_dtype),
                ),
            ];
            if let Some((_, flag, why)) = refused.into_iter().find(|(given, ..)| *given) {
                return Err(Flags::command().error(
                    ErrorKind::ArgumentConflict,
                    format!("{flag} cannot be used with --redis: a Redis table cannot {why}"),
                ));
            }
        }
        let redis = self.redis.map(|Nodes(nodes)| RedisChoice {
            nodes,
            prefix: self
                .redis_prefix
                .unwrap_or_else(|| DEFAULT_REDIS_PREFIX.to_string()),
            keep: self.redis_keep,
        });
        Ok(Config {
            data,
            eval_samples,
            dim,
            batch,
            epochs: self.epochs.unwrap_or(epochs),
            steps: self.steps.map(|n| n as u64),
            threads,
            threads_from,
            max_size: self.max_size,
            capacity: self.capacity,
            min_count,
            expire: self.expire,
            precision,
            checkpoint: self.checkpoint,
            checkpoint_every: self.checkpoint_every.map(|n| n as u64),
            resume: self.resume,
            overwrite: self.overwrite,
            quick: self.quick,
            summary: self.summary,
            seed: self.seed,
            redis,
        })
    }
}

/// The thread count [`THREADS_VAR`] in `env` asks for: `None` if unset or
/// not a whole number of at least 1 (rayon and candle ignore such values);
/// an error above [`MAX_THREADS`].
fn threads_in(env: &Environment) -> Result<Option<usize>, clap::Error> {
    match env.rayon_threads.as_deref().map(str::parse::<usize>) {
        Some(Ok(threads)) if threads > MAX_THREADS => Err(invalid(
            THREADS_VAR,
            threads,
            format!("at most {MAX_THREADS} threads"),
        )),
        Some(Ok(threads)) if threads > 0 => Ok(Some(threads)),
        _ => Ok(None),
    }
}

/// A refusal of `value` of `flag` in clap's words.
fn invalid(flag: &str, value: impl fmt::Display, expected: String) -> clap::Error {
    Flags::command().error(
        ErrorKind::ValueValidation,
        format!("invalid value '{value}' for '{flag}': {expected}"),
    )
}

/// A parser of whole numbers from 1 to `max`, `_` separators allowed.
fn count(max: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |value| {
        let expected = || format!("expected a whole number from 1 to {max}");
        match digits(value).and_then(|digits| digits.parse().ok()) {
            Some(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(expected()),
        }
    }
}

/// A `--min-count`: a whole number from 1 to `u32::MAX`, `_` separators
/// allowed.
fn min_count(value: &str) -> Result<u32, String> {
    match digits(value).and_then(|digits| digits.parse().ok()) {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "expected a whole number from 1 to {} (1: every id at its first read)",
            u32::MAX
        )),
    }
}

/// A duration in seconds: a finite number above 0 (`90`, `0.5`, `1e3`),
/// `_` separators allowed, that a [`Duration`] holds.
fn seconds(value: &str) -> Result<Duration, String> {
    let number: String = value.chars().filter(|&c| c != '_').collect();
    let seconds = number
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0)
        .ok_or("expected a number of seconds above 0, such as 90 or 0.5")?;
    Duration::try_from_secs_f64(seconds)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            format!("{value} seconds is not a duration (at least 1 ns, at most about 1.8e19 s)")
        })
}

/// A dtype: `f32`, `f16` or `bf16` (and the other names
/// [`Dtype`]'s `FromStr` knows: `float32`, `float16`, `half`, `bfloat16`).
fn dtype(value: &str) -> Result<Dtype, String> {
    value
        .parse()
        .map_err(|_| "expected f32, f16 or bf16".to_string())
}

/// A seed: a whole number from 0 to `u64::MAX`, `_` separators allowed.
fn seed(value: &str) -> Result<u64, String> {
    digits(value)
        .and_then(|digits| digits.parse().ok())
        .ok_or_else(|| "expected an integer from 0 to 2^64 - 1".into())
}

/// `value` without `_` separators, if what is left is one or more digits.
fn digits(value: &str) -> Option<String> {
    let digits: String = value.chars().filter(|&c| c != '_').collect();
    (!digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())).then_some(digits)
}

/// A non-empty path.
fn path(value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err("expected a path".into());
    }
    Ok(PathBuf::from(value))
}

/// A comma-separated list of `host:port` nodes (at least one; the port a
/// number from 1 to 65535).
fn nodes(value: &str) -> Result<Nodes, String> {
    value
        .split(',')
        .map(|node| {
            let node = node.trim();
            match node.rsplit_once(':') {
                Some((host, port))
                    if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) =>
                {
                    Ok(node.to_string())
                }
                _ => Err("expected HOST:PORT[,HOST:PORT..]".to_string()),
            }
        })
        .collect::<Result<_, _>>()
        .map(Nodes)
}

/// A Redis key prefix: not empty, and no `{` or `}` (they would change
/// which cluster slot the table's keys hash to).
fn prefix(value: &str) -> Result<String, String> {
    if value.is_empty() || value.contains(['{', '}']) {
        return Err("expected a non-empty prefix without { or }".into());
    }
    Ok(value.to_string())
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.data {
            DataChoice::Synthetic {
                fields,
                train_samples,
            } => write!(
                f,
                "data: synthetic, {fields} fields, {train_samples} training samples"
            )?,
            DataChoice::Criteo {
                path,
                train_samples,
            } => {
                write!(f, "data: Criteo {}, ", path.display())?;
                match train_samples {
                    Some(n) => write!(f, "{n} training samples")?,
                    None => write!(f, "all training lines")?,
                }
            }
        }
        let or_none = |value: Option<String>| value.unwrap_or_else(|| "none".into());
        write!(
            f,
            ", {} held out, seed {}{}{}\ntraining: dim {}, batch {}, epochs {}, steps {}, \
             checkpoint {}{}{}{}\nthreads: {} (from {}): candle's CPU pool \
             ({THREADS_VAR}) and the table's shards\ntable: ",
            self.eval_samples,
            self.seed,
            if self.quick { " (quick)" } else { "" },
            if self.summary { ", summary" } else { "" },
            self.dim,
            self.batch,
            self.epochs,
            or_none(self.steps.map(|s| s.to_string())),
            or_none(self.checkpoint.as_ref().map(|p| p.display().to_string())),
            self.checkpoint_every
                .map_or(String::new(), |n| format!(" and every {n} steps")),
            if self.resume { ", resuming" } else { "" },
            if self.overwrite { ", overwriting" } else { "" },
            self.threads,
            self.threads_from,
        )?;
        match &self.redis {
            Some(redis) => write!(
                f,
                "Redis {}, {}:ctr/embeddings, {} at the end",
                redis.nodes.join(","),
                redis.prefix,
                if redis.keep { "kept" } else { "destroyed" }
            )?,
            None => f.write_str("in memory")?,
        }
        write!(
            f,
            ", max size {}, capacity {}, min count {}, expire {}, {}",
            or_none(self.max_size.map(|s| s.to_string())),
            or_none(self.capacity.map(|s| s.to_string())),
            self.min_count,
            or_none(self.expire.map(|d| format!("after {} s", d.as_secs_f64()))),
            self.precision,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine with 4 cores and no `RAYON_NUM_THREADS`.
    fn machine() -> Environment {
        Environment {
            rayon_threads: None,
            cores: 4,
        }
    }

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        parse_in(args, &machine())
    }

    fn parse_in(args: &[&str], env: &Environment) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("ctr").chain(args.iter().copied()), env)
    }

    fn config(args: &[&str]) -> Config {
        parse(args).unwrap_or_else(|error| panic!("{args:?} gave {error}"))
    }

    /// Asserts that `args` are refused with an error of `kind` whose
    /// message names every one of `named`, and returns the message.
    fn refused_as(args: &[&str], kind: ErrorKind, named: &[&str]) -> String {
        match parse(args) {
            Ok(config) => panic!("{args:?} gave {config:?}"),
            Err(error) => {
                let message = error.to_string();
                assert_eq!(error.kind(), kind, "{args:?}: {message}");
                for name in named {
                    assert!(message.contains(name), "{args:?}: {message} lacks {name}");
                }
                message
            }
        }
    }

    /// Asserts that `args` are refused for the value `value` of `flag`,
    /// and returns the message.
    fn refused(args: &[&str], flag: &str, value: &str) -> String {
        refused_as(
            args,
            ErrorKind::ValueValidation,
            &[&format!("'{flag}"), &format!("'{value}'")],
        )
    }

    /// The long help text, its words separated by single spaces.
    fn help() -> String {
        let help = Flags::command().render_long_help().to_string();
        help.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn defaults() {
        let c = config(&[]);
        assert_eq!(
            c.data,
            DataChoice::Synthetic {
                fields: DEFAULT_FIELDS,
                train_samples: DEFAULT_TRAIN
            }
        );
        assert_eq!(
            (c.eval_samples, c.epochs, c.batch, c.dim),
            (DEFAULT_EVAL, DEFAULT_EPOCHS, DEFAULT_BATCH, DEFAULT_DIM)
        );
        assert_eq!(
            (c.steps, c.max_size, c.checkpoint.as_ref()),
            (None, None, None)
        );
        assert_eq!((c.threads, c.threads_from), (4, ThreadsFrom::Cores));
        assert_eq!(c.seed, DEFAULT_SEED);
        assert!(!c.quick && !c.summary);
    }

    #[test]
    fn redis_flags() {
        assert_eq!(config(&[]).redis, None);
        let c = config(&["--redis", "127.0.0.1:7000,redis-b:7001"]);
        assert_eq!(
            c.redis,
            Some(RedisChoice {
                nodes: vec!["127.0.0.1:7000".into(), "redis-b:7001".into()],
                prefix: DEFAULT_REDIS_PREFIX.into(),
                keep: false,
            })
        );
        assert!(c.to_string().contains(
            "table: Redis 127.0.0.1:7000,redis-b:7001, ctr:ctr/embeddings, destroyed at the end"
        ));
        let c = config(&[
            "--redis=[::1]:6379",
            "--redis-prefix",
            "exp_3",
            "--redis-keep",
        ]);
        assert_eq!(
            c.redis,
            Some(RedisChoice {
                nodes: vec!["[::1]:6379".into()],
                prefix: "exp_3".into(),
                keep: true,
            })
        );
        assert!(c.to_string().contains("exp_3:ctr/embeddings, kept"));
        for nodes in ["localhost", "h:0", "h:70000", ":6379", "a:1,", "a:x"] {
            refused(&["--redis", nodes], "--redis", nodes);
        }
        refused(
            &["--redis", "h:1", "--redis-prefix", "a{b}"],
            "--redis-prefix",
            "a{b}",
        );
        refused_as(
            &["--redis-keep=yes"],
            ErrorKind::TooManyValues,
            &["--redis-keep", "yes"],
        );
        for alone in [&["--redis-keep"][..], &["--redis-prefix", "p"]] {
            refused_as(alone, ErrorKind::MissingRequiredArgument, &["--redis"]);
        }
        refused_as(
            &["--redis", "h:1", "--redis", "h:2"],
            ErrorKind::ArgumentConflict,
            &["--redis"],
        );
        let help = help();
        for flag in ["--redis <HOST:PORT,..>", "--redis-prefix", "--redis-keep"] {
            assert!(help.contains(flag), "{flag}");
        }
    }

    #[test]
    fn checkpoint_flags() {
        let c = config(&[]);
        assert_eq!(
            (c.checkpoint_every, c.resume, c.overwrite),
            (None, false, false)
        );
        let c = config(&[
            "--checkpoint",
            "run",
            "--checkpoint-every=1_000",
            "--resume",
        ]);
        assert_eq!(
            (
                c.checkpoint.as_deref(),
                c.checkpoint_every,
                c.resume,
                c.overwrite
            ),
            (Some(std::path::Path::new("run")), Some(1000), true, false)
        );
        let shown = c.to_string();
        assert!(
            shown.contains("checkpoint run and every 1000 steps, resuming"),
            "{shown}"
        );
        let c = config(&["--overwrite", "--checkpoint", "run"]);
        assert!(c.overwrite && !c.resume);
        assert!(c.to_string().contains("checkpoint run, overwriting"));
        let c = config(&["--overwrite", "--redis", "127.0.0.1:7000"]);
        assert!(c.overwrite && c.checkpoint.is_none());
        for alone in [&["--resume"][..], &["--checkpoint-every", "10"]] {
            refused_as(alone, ErrorKind::MissingRequiredArgument, &["--checkpoint"]);
        }
        refused_as(
            &["--overwrite"],
            ErrorKind::MissingRequiredArgument,
            &["--checkpoint", "--redis"],
        );
        refused_as(
            &["--checkpoint", "run", "--resume", "--overwrite"],
            ErrorKind::ArgumentConflict,
            &["--resume", "--overwrite"],
        );
        refused(
            &["--checkpoint", "d", "--checkpoint-every", "0"],
            "--checkpoint-every",
            "0",
        );
        refused_as(
            &["--resume=yes"],
            ErrorKind::TooManyValues,
            &["--resume", "yes"],
        );
        refused_as(
            &["--checkpoint", "d", "--overwrite", "--overwrite"],
            ErrorKind::ArgumentConflict,
            &["--overwrite"],
        );
        let help = help();
        for flag in ["--checkpoint-every <N>", "--resume", "--overwrite"] {
            assert!(help.contains(flag), "{flag}");
        }
    }

    #[test]
    fn summary_is_opt_in() {
        assert!(config(&["--summary"]).summary);
        assert!(config(&["--quick", "--summary"]).summary);
        assert!(!config(&["--quick"]).summary);
        refused_as(
            &["--summary=yes"],
            ErrorKind::TooManyValues,
            &["--summary", "yes"],
        );
    }

    #[test]
    fn help_states_the_defaults_and_bounds() {
        let help = help();
        for text in [
            format!("default {DEFAULT_FIELDS}, at most {MAX_FIELDS}"),
            format!("synthetic default {DEFAULT_TRAIN}"),
            format!("default {DEFAULT_EVAL}, at most {MAX_EVAL}"),
            format!("[default: {DEFAULT_SEED}]"),
            format!("{QUICK_TRAIN} training, {QUICK_EVAL} held-out, epochs {QUICK_EPOCHS}"),
            format!("at most {MAX_DIM})"),
            format!("[default: {DEFAULT_DIM}]"),
            format!("at most {MAX_BATCH})"),
            format!("[default: {DEFAULT_BATCH}]"),
            format!("default {DEFAULT_EPOCHS})"),
            format!("at most {MAX_THREADS})"),
            format!("default {DEFAULT_REDIS_PREFIX};"),
        ] {
            assert!(help.contains(&text), "the help lacks {text:?}:\n{help}");
        }
        assert_eq!(MAX_EVAL_IDS, 1 << 28, "the help says 2^28");
    }

    #[test]
    fn threads_come_from_the_flag_then_the_environment_then_the_cores() {
        let with = |value: &str| Environment {
            rayon_threads: Some(value.into()),
            cores: 4,
        };
        let threads = |args: &[&str], env: &Environment| match parse_in(args, env) {
            Ok(c) => (c.threads, c.threads_from),
            Err(error) => panic!("{args:?} gave {error}"),
        };
        assert_eq!(
            threads(&["--threads", "3"], &machine()),
            (3, ThreadsFrom::Flag)
        );
        assert_eq!(
            threads(&["--threads", "3"], &with("2")),
            (3, ThreadsFrom::Flag)
        );
        assert_eq!(threads(&[], &with("2")), (2, ThreadsFrom::Environment));
        // Values rayon and candle ignore are ignored.
        for ignored in ["0", "", "two", " 2"] {
            assert_eq!(threads(&[], &with(ignored)), (4, ThreadsFrom::Cores));
        }
        let env = Environment {
            rayon_threads: None,
            cores: 1000,
        };
        assert_eq!(threads(&[], &env), (MAX_THREADS, ThreadsFrom::Cores));
        let error = parse_in(&[], &with("1000")).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ValueValidation);
        assert!(error.to_string().contains(THREADS_VAR), "{error}");
        assert_eq!(
            threads(&["--threads", "1"], &with("1000")),
            (1, ThreadsFrom::Flag)
        );
        refused(&["--threads", "257"], "--threads", "257");
        let shown = config(&["--threads", "3"]).to_string();
        assert!(
            shown.contains("threads: 3 (from --threads): candle's CPU pool (RAYON_NUM_THREADS)"),
            "{shown}"
        );
    }

    #[test]
    fn sizes_that_would_not_fit_in_memory_are_refused() {
        assert_eq!(config(&["--dim", "1024"]).dim, MAX_DIM);
        refused(&["--dim", "1025"], "--dim", "1025");
        refused(&["--dim", "1000000"], "--dim", "1000000");
        assert_eq!(
            config(&["--batch", "1048576", "--dim", "8"]).batch,
            MAX_BATCH
        );
        refused(&["--batch", "1048577"], "--batch", "1048577");
        assert_eq!(
            config(&["--eval-samples", "10_000_000"]).eval_samples,
            10_000_000
        );
        refused(
            &["--eval-samples", "50000001"],
            "--eval-samples",
            "50000001",
        );
        refused(
            &["--eval-samples", "1000000000000"],
            "--eval-samples",
            "1000000000000",
        );
        // 20M samples of 26 ids are more ids than MAX_EVAL_IDS.
        let message = refused(
            &["--eval-samples", "20000000"],
            "--eval-samples",
            "20000000",
        );
        assert!(message.contains("of 26 ids"), "{message}");
        refused(&["--fields", "257"], "--fields", "257");
        // Each within its bound, but a batch's rows would take 4 GiB.
        refused_as(
            &["--batch", "65536", "--dim", "1024", "--fields", "16"],
            ErrorKind::ArgumentConflict,
            &["--batch 65536", "--dim 1024"],
        );
    }

    #[test]
    fn max_size_must_hold_one_batch() {
        let c = config(&["--batch", "100", "--fields", "4", "--max-size", "400"]);
        assert_eq!(c.max_size, Some(400));
        let message = refused(
            &["--batch", "100", "--fields", "4", "--max-size", "399"],
            "--max-size",
            "399",
        );
        assert!(message.contains("= 400"), "{message}");
        // The default batch of 26 ids.
        refused(&["--max-size", "9"], "--max-size", "9");
        // Criteo's 39 fields.
        refused(
            &["--data", "t.txt", "--batch", "10", "--max-size", "389"],
            "--max-size",
            "389",
        );
        assert_eq!(
            config(&["--data", "t.txt", "--batch", "10", "--max-size", "390"]).max_size,
            Some(390)
        );
    }

    #[test]
    fn table_lifecycle_flags() {
        let c = config(&[]);
        assert_eq!((c.capacity, c.min_count, c.expire), (None, 1, None));
        let shown = c.to_string();
        assert!(
            shown.contains(
                "\ntable: in memory, max size none, capacity none, min count 1, expire none"
            ),
            "{shown}"
        );
        let c = config(&[
            "--capacity",
            "100_000",
            "--min-count=3",
            "--expire",
            "90",
            "--max-size",
            "200000",
        ]);
        assert_eq!(
            (c.capacity, c.min_count, c.expire, c.max_size),
            (
                Some(100_000),
                3,
                Some(Duration::from_secs(90)),
                Some(200_000)
            )
        );
        let shown = c.to_string();
        assert!(
            shown.contains(
                "table: in memory, max size 200000, capacity 100000, min count 3, \
                 expire after 90 s"
            ),
            "{shown}"
        );
        assert_eq!(
            config(&["--expire", "0.25"]).expire,
            Some(Duration::from_millis(250))
        );
        assert_eq!(config(&["--min-count", "1"]).min_count, 1);
        for (flag, value) in [
            ("--capacity", "0"),
            ("--capacity", "-5"),
            ("--capacity", "many"),
            ("--min-count", "0"),
            ("--min-count", "1.5"),
            ("--min-count", "4294967296"),
            ("--expire", "0"),
            ("--expire", "-1"),
            ("--expire", "nan"),
            ("--expire", "inf"),
            ("--expire", "1e300"),
            ("--expire", "soon"),
            ("--expire", ""),
        ] {
            refused(&[flag, value], flag, value);
        }
        let message = refused(&["--expire", "0"], "--expire", "0");
        assert!(message.contains("seconds above 0"), "{message}");
        let message = refused(&["--expire", "1e30"], "--expire", "1e30");
        assert!(message.contains("is not a duration"), "{message}");
    }

    #[test]
    fn dtype_flags() {
        let c = config(&[]);
        assert_eq!(c.precision, TablePrecision::F32);
        let shown = c.to_string();
        assert!(
            shown.ends_with("expire none, values f32, slots f32"),
            "{shown}"
        );
        let c = config(&["--dtype", "bf16"]);
        assert_eq!(
            c.precision,
            TablePrecision {
                values: Dtype::Bf16,
                slots: Dtype::F32,
                rounding: Rounding::NearestEven,
            }
        );
        let c = config(&[
            "--dtype=f16",
            "--slot-dtype",
            "bf16",
            "--stochastic-rounding",
            "1_000",
        ]);
        assert_eq!(
            c.precision,
            TablePrecision {
                values: Dtype::F16,
                slots: Dtype::Bf16,
                rounding: Rounding::Stochastic { seed: 1000 },
            }
        );
        let shown = c.to_string();
        assert!(
            shown.contains("values f16, slots bf16, stochastic rounding (seed 1000)"),
            "{shown}"
        );
        assert_eq!(
            config(&["--dtype", "BFloat16"]).precision.values,
            Dtype::Bf16
        );
        for (flag, value) in [
            ("--dtype", "f64"),
            ("--dtype", ""),
            ("--slot-dtype", "int8"),
            ("--stochastic-rounding", "-1"),
            ("--stochastic-rounding", "x"),
        ] {
            refused(&[flag, value], flag, value);
        }
        // Stochastic rounding with no bf16 column would do nothing.
        for args in [
            &["--stochastic-rounding", "1"][..],
            &["--dtype", "f16", "--stochastic-rounding", "1"],
        ] {
            refused_as(
                args,
                ErrorKind::ArgumentConflict,
                &["--stochastic-rounding", "bf16 columns only"],
            );
        }
        // A Redis table stores f32.
        for (args, flag) in [
            (&["--dtype", "bf16"][..], "--dtype bf16"),
            (&["--slot-dtype", "f16"], "--slot-dtype f16"),
        ] {
            let mut args = args.to_vec();
            args.extend(["--redis", "127.0.0.1:7000"]);
            refused_as(&args, ErrorKind::ArgumentConflict, &[flag, "--redis"]);
        }
        let c = config(&["--dtype", "f32", "--redis", "127.0.0.1:7000"]);
        assert_eq!(c.precision, TablePrecision::F32);
        let help = help();
        for text in [
            "--dtype <DTYPE>",
            "--slot-dtype <DTYPE>",
            "--stochastic-rounding <SEED>",
        ] {
            assert!(help.contains(text), "the help lacks {text:?}");
        }
    }

    #[test]
    fn capacity_must_hold_one_batch_and_a_row_per_shard() {
        let c = config(&["--batch", "100", "--fields", "4", "--capacity", "400"]);
        assert_eq!(c.capacity, Some(400));
        let message = refused(
            &["--batch", "100", "--fields", "4", "--capacity", "399"],
            "--capacity",
            "399",
        );
        assert!(message.contains("= 400"), "{message}");
        let message = refused(
            &[
                "--batch",
                "1",
                "--fields",
                "2",
                "--threads",
                "8",
                "--capacity",
                "4",
            ],
            "--capacity",
            "4",
        );
        assert!(message.contains("one row per shard"), "{message}");
    }

    #[test]
    fn redis_refuses_capacity_and_admission() {
        for (args, flag) in [
            (&["--capacity", "100000"][..], "--capacity"),
            (&["--min-count", "2"], "--min-count"),
        ] {
            let mut args = args.to_vec();
            args.extend(["--redis", "127.0.0.1:7000"]);
            let message = refused_as(&args, ErrorKind::ArgumentConflict, &[flag, "--redis"]);
            assert!(message.contains("a Redis table cannot"), "{message}");
        }
        // 1 asks for nothing a Redis table lacks; it expires rows.
        let c = config(&[
            "--min-count",
            "1",
            "--expire",
            "60",
            "--redis",
            "127.0.0.1:7000",
        ]);
        assert_eq!((c.min_count, c.expire), (1, Some(Duration::from_secs(60))));
        assert!(c.to_string().contains(
            "destroyed at the end, max size none, capacity none, min count 1, expire after 60 s"
        ));
    }

    #[test]
    fn quick_sets_small_sizes_that_flags_override() {
        let c = config(&["--quick"]);
        assert_eq!(
            c.data,
            DataChoice::Synthetic {
                fields: 26,
                train_samples: QUICK_TRAIN
            }
        );
        assert_eq!((c.eval_samples, c.epochs), (QUICK_EVAL, QUICK_EPOCHS));
        assert!(c.quick && c.to_string().contains("(quick)"));
        let c = config(&["--eval-samples", "500", "--quick", "--epochs=4"]);
        assert_eq!((c.eval_samples, c.epochs), (500, 4));
    }

    #[test]
    fn every_flag_in_both_forms() {
        let c = config(&[
            "--fields=8",
            "--train-samples",
            "1_000",
            "--eval-samples=20",
            "--seed",
            "7",
            "--dim",
            "32",
            "--batch=64",
            "--epochs",
            "5",
            "--steps",
            "9",
            "--threads=3",
            "--max-size",
            "100000",
            "--summary",
            "--checkpoint",
            "/tmp/ckpt",
        ]);
        assert_eq!(
            c.data,
            DataChoice::Synthetic {
                fields: 8,
                train_samples: 1000
            }
        );
        assert_eq!(
            (c.eval_samples, c.seed, c.dim, c.batch, c.epochs),
            (20, 7, 32, 64, 5)
        );
        assert_eq!(
            (c.steps, c.threads, c.max_size, c.summary),
            (Some(9), 3, Some(100_000), true)
        );
        assert_eq!(c.checkpoint, Some(PathBuf::from("/tmp/ckpt")));
        let shown = c.to_string();
        assert!(
            shown.contains("8 fields") && shown.contains("max size 100000"),
            "{shown}"
        );
    }

    #[test]
    fn criteo_data() {
        let c = config(&["--data", "train.txt"]);
        assert_eq!(
            c.data,
            DataChoice::Criteo {
                path: "train.txt".into(),
                train_samples: None
            }
        );
        let c = config(&["--data", "train.txt", "--quick"]);
        assert_eq!(
            c.data,
            DataChoice::Criteo {
                path: "train.txt".into(),
                train_samples: Some(QUICK_TRAIN)
            }
        );
        refused_as(
            &["--data", "t.txt", "--fields", "3"],
            ErrorKind::ArgumentConflict,
            &["--fields", "--data"],
        );
    }

    #[test]
    fn help_is_asked_for_anywhere() {
        for args in [&["--batch", "4", "--help"][..], &["-h"]] {
            assert_eq!(
                parse(args).unwrap_err().kind(),
                ErrorKind::DisplayHelp,
                "{args:?}"
            );
        }
        assert!(help().contains("--train-samples <N>"));
        Flags::command().debug_assert();
    }

    #[test]
    fn bad_command_lines_name_the_flag() {
        refused_as(&["--bogus"], ErrorKind::UnknownArgument, &["--bogus"]);
        refused_as(&["stray"], ErrorKind::UnknownArgument, &["stray"]);
        refused_as(&["--batch"], ErrorKind::InvalidValue, &["--batch"]);
        refused_as(
            &["--seed", "1", "--seed=2"],
            ErrorKind::ArgumentConflict,
            &["--seed"],
        );
        for (flag, value) in [
            ("--batch", "0"),
            ("--dim", "abc"),
            ("--epochs", "1.5"),
            ("--steps", ""),
            ("--seed", "99999999999999999999999"),
            ("--fields", "257"),
            ("--data", ""),
        ] {
            refused(&[flag, value], flag, value);
        }
        refused(&["--batch", "-4"], "--batch", "-4");
        refused_as(
            &["--quick=yes"],
            ErrorKind::TooManyValues,
            &["--quick", "yes"],
        );
    }
}
