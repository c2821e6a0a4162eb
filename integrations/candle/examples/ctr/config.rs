//! Command-line flags of the example.
//!
//! Decision: a small hand-written parser rather than `clap`. The example
//! has a dozen flags of three kinds (count, path, switch); a parser for
//! them is a screenful of code that anyone can read, and it keeps a large
//! dependency (and its build time) out of the crate's dev-dependencies.
//! Flags are `--name value` or `--name=value`; numbers may use `_`
//! separators (`2_500_000`); a flag given twice, an unknown flag, a missing
//! or unparsable value, or `--fields` with `--data` is an error that names
//! the flag.
//!
//! Decision: sizes are bounded here, before anything is allocated, so that
//! a mistyped value is an error naming the flag rather than an allocation
//! abort minutes into a run: `--dim` at most [`MAX_DIM`], `--batch` at most
//! [`MAX_BATCH`], `--eval-samples` at most [`MAX_EVAL`] and at most
//! [`MAX_EVAL_IDS`] held-out ids (they are held in memory), a batch's
//! embedding rows (`batch × fields × dim` values) at most
//! [`MAX_BATCH_VALUES`], `--threads` at most [`MAX_THREADS`], `--fields` at
//! most [`MAX_FIELDS`] (what a feature id can tell apart). `--max-size` must
//! hold one batch's ids (`batch × fields`): a step inserts up to that many
//! rows before the table is restricted, so a smaller table could not even
//! keep the rows the step just trained.
//!
//! Decision: `--threads` sizes candle's CPU thread pool (and the table's
//! shards). candle-core reads `RAYON_NUM_THREADS` for its matmul
//! parallelism on every call, and rayon sizes its global pool from it once,
//! at first use; `main` sets it from [`Config::threads`] before any candle
//! call. Without `--threads`, a valid `RAYON_NUM_THREADS` the user set is
//! kept, else the available cores are used ([`ThreadsFrom`] says which).
//! Measured on the shared 2-core development VM (load average 4 to 5 from
//! other builds), 500k samples: `--threads 1` trained at 42k samples/s,
//! `--threads 2` at 23k (8.5 s against 18.5 s of user time; a profile
//! shows the pool's workers spinning and cross-core TLB flushes as freed
//! buffers are unmapped, which one thread does not pay); the results were
//! bit-identical. The default stays the cores: on an idle machine the two
//! should be about even (18.5 s of work over two cores against 8.5 s on
//! one; not measured, the VM was never idle).
//!
//! Decision: the defaults fit the README's "~2 min" on that VM and stop
//! where more training stops paying. Measured there (held-out AUC; load
//! average 4 to 5):
//! - One epoch. A second pass overfits: 500k samples gave 0.673 after the
//!   first epoch and 0.636 after the second (train loss 0.53 to 0.43), the
//!   "one-epoch" behaviour of CTR models with id embeddings. Fresh samples
//!   are what helps: 2M samples gave 0.696.
//! - 2M training samples: 100 s in all with the defaults (`--threads 2`).
//! - `--dim 16`, the field width: `--dim 8` did as well here
//!   (0.6959 against 0.6954 at 2M samples), about 20% faster with 40% less
//!   table memory (361 against 595 MiB); the default keeps 16.
//! - `--batch 2048`: 8192 and 4096 were faster (31k, 26k samples/s against
//!   21k) but worse (0.688, 0.692); 1024 was 0.0006 better and 20% slower.
//! - Learning rates (`train`): sparse 0.005 to 0.02 and dense 0.001 gave
//!   the same AUC within 0.001; dense 0.003 was 0.002 worse.
//!
//! Decision: `--redis HOST:PORT[,HOST:PORT..]` trains the same model on a
//! `dynemb_redis::RedisVariable` (a single server or cluster nodes; one
//! reachable node of a cluster is enough). The table is
//! `<--redis-prefix>:ctr/embeddings` (prefix [`DEFAULT_REDIS_PREFIX`]):
//! the name is the local table's, so a checkpoint moves between the two.
//! A new run refuses that table if it holds rows (another run's, perhaps
//! still training; `--overwrite` clears them), a resumed one restores its
//! checkpoint's table into it, and either destroys it at the end unless
//! `--redis-keep`; two runs at once on one Redis need different prefixes. The flags are
//! checked here (`host:port`, no `{`/`}` in the prefix); whether the
//! servers answer is found out when the table opens.
//!
//! Decision: `--checkpoint DIR` keeps the run: a checkpoint after every
//! epoch, every `--checkpoint-every` steps, and at the end (see
//! `checkpoint` for the layout and why a crash never loses one).
//! `--resume` continues it and `--overwrite` replaces it; without either, a
//! run refuses a directory that already holds a checkpoint. The three need
//! `--checkpoint`, and `--resume` excludes `--overwrite`. Whether a resumed
//! run asks for the same run is checked against the checkpoint, not here.
//!
//! The ground truth's AUC (about 0.785) is out of reach of any model of
//! this much data: ranking by the true weights of the ids seen at least 20
//! times in 2.5M training samples (0 for the others) gives 0.744, and 0.757
//! for every id seen at all, since the held-out set is full of rare and
//! new ids whose weights no training set shows.

use std::fmt;
use std::path::PathBuf;

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

/// The help text.
pub const USAGE: &str = "\
Trains a CTR model with dynamic embeddings (dynemb + candle).

usage: cargo run --release -p dynemb-candle --example ctr -- [flags]

data:
  --data FILE            Criteo TSV (label, I1..I13, C1..C26); synthetic data when absent
  --fields N             synthetic categorical fields (default 26; not with --data)
  --train-samples N      training samples per epoch (synthetic default 2000000;
                         Criteo default: every line but the held-out ones)
  --eval-samples N       held-out samples, after the training ones (default 200000,
                         at most 50000000 and 2^28 held-out ids)
  --seed N               seed of the synthetic data, the embeddings' and the MLP's
                         initial values (default 42): equal seeds, equal runs
  --quick                tiny run for CI: 100000 training, 10000 held-out, epochs 1
  --summary              first stream one epoch and report on the data (distinct
                         ids, new-id rates, unseen held-out ids); costs an extra
                         pass and memory for every distinct id
training:
  --dim N                embedding dimension (default 16, at most 1024)
  --batch N              samples per batch (default 2048, at most 1048576)
  --epochs N             passes over the training data (default 1)
  --steps N              stop after N batches in all, from the run's start (default:
                         no limit)
  --threads N            threads of candle's CPU pool (sets RAYON_NUM_THREADS) and
                         shards of the embedding table (default: RAYON_NUM_THREADS
                         if set, else the available cores; at most 256)
  --max-size N           most rows kept in the embedding table; beyond it the
                         least recently trained are evicted down to 90% (default:
                         no limit; at least --batch x fields)
  --checkpoint DIR       keep the run in DIR: a checkpoint after every epoch and at
                         the end (default: the model goes to a temporary directory
                         for the reload check and is not kept)
  --checkpoint-every N   also a checkpoint every N training steps (needs --checkpoint)
  --resume               continue the run whose checkpoint is in --checkpoint DIR:
                         same data and model flags; --epochs and --steps count in
                         total; --threads, --checkpoint-every, --summary and the
                         --redis flags may change
  --overwrite            start a new run even though --checkpoint DIR holds one (the
                         old checkpoint is replaced by this run's first checkpoint)
                         or the Redis table holds rows (they are cleared)
redis (the table in Redis instead of this process's memory):
  --redis HOST:PORT,..   a Redis server, or nodes of a Redis Cluster (one reachable
                         node is enough); the table is PREFIX:ctr/embeddings: a new
                         run refuses one that holds rows (--overwrite clears it),
                         --resume replaces it with the checkpoint's table; destroyed
                         at the end; the reload check restores the checkpoint into a
                         local table
  --redis-prefix PREFIX  namespace of the table's Redis keys (default ctr; no { or });
                         concurrent runs on one Redis need different prefixes
  --redis-keep           keep the Redis table after the run
  -h, --help             this text
";

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
    /// Most rows kept in the embedding table; `None`: no limit.
    pub max_size: Option<usize>,
    /// Where the run keeps its checkpoints (`--checkpoint`).
    pub checkpoint: Option<PathBuf>,
    /// Training steps between periodic checkpoints (`--checkpoint-every`).
    pub checkpoint_every: Option<u64>,
    /// Whether to continue the run checkpointed in
    /// [`Config::checkpoint`] (`--resume`).
    pub resume: bool,
    /// Whether a new run may replace the checkpoint in
    /// [`Config::checkpoint`] (`--overwrite`).
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

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Run with this configuration (boxed: it is much larger than `Help`).
    Run(Box<Config>),
    /// Print [`USAGE`].
    Help,
}

/// A command line the example cannot run with.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A flag the example does not know, or a stray argument.
    #[error("unknown argument {0:?} (see --help)")]
    Unknown(String),
    /// A flag without its value.
    #[error("{0} needs a value (see --help)")]
    MissingValue(String),
    /// A value that does not parse or is out of range.
    #[error("{flag}: expected {expected}, got {value:?}")]
    BadValue {
        /// The flag.
        flag: String,
        /// What it takes.
        expected: String,
        /// What it got.
        value: String,
    },
    /// A flag given twice.
    #[error("{0} given twice")]
    Repeated(String),
    /// Flags that do not go together (the message names them).
    #[error("{0}")]
    Conflict(String),
}

/// The flags as given, before defaults.
#[derive(Default)]
struct Given {
    data: Option<PathBuf>,
    fields: Option<usize>,
    train_samples: Option<usize>,
    eval_samples: Option<usize>,
    seed: Option<u64>,
    quick: bool,
    summary: bool,
    dim: Option<usize>,
    batch: Option<usize>,
    epochs: Option<usize>,
    steps: Option<u64>,
    threads: Option<usize>,
    max_size: Option<usize>,
    checkpoint: Option<PathBuf>,
    checkpoint_every: Option<u64>,
    resume: bool,
    overwrite: bool,
    redis: Option<Vec<String>>,
    redis_prefix: Option<String>,
    redis_keep: bool,
}

impl Config {
    /// Parses the arguments after the program name; defaults that depend on
    /// the machine come from `env`.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        env: &Environment,
    ) -> Result<Command, ConfigError> {
        let mut given = Given::default();
        let mut seen: Vec<String> = Vec::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "-h" || arg == "--help" {
                return Ok(Command::Help);
            }
            let Some(flag) = arg.strip_prefix("--") else {
                return Err(ConfigError::Unknown(arg));
            };
            let (name, inline) = match flag.split_once('=') {
                Some((name, value)) => (name, Some(value.to_string())),
                None => (flag, None),
            };
            let name = format!("--{name}");
            if seen.contains(&name) {
                return Err(ConfigError::Repeated(name));
            }
            seen.push(name.clone());
            if SWITCHES.contains(&name.as_str()) {
                if let Some(value) = inline {
                    return Err(bad(&name, "no value", &value));
                }
                match name.as_str() {
                    "--quick" => given.quick = true,
                    "--summary" => given.summary = true,
                    "--resume" => given.resume = true,
                    "--overwrite" => given.overwrite = true,
                    _ => given.redis_keep = true,
                }
                continue;
            }
            if !is_value_flag(&name) {
                return Err(ConfigError::Unknown(arg));
            }
            let value = match inline {
                Some(value) => value,
                None => args
                    .next()
                    .ok_or_else(|| ConfigError::MissingValue(name.clone()))?,
            };
            given.set(&name, value)?;
        }
        given
            .resolve(env)
            .map(|config| Command::Run(Box::new(config)))
    }
}

/// Flags without a value.
const SWITCHES: [&str; 5] = [
    "--quick",
    "--summary",
    "--resume",
    "--overwrite",
    "--redis-keep",
];

/// Flags that take a value.
fn is_value_flag(name: &str) -> bool {
    [
        "--data",
        "--fields",
        "--train-samples",
        "--eval-samples",
        "--seed",
        "--dim",
        "--batch",
        "--epochs",
        "--steps",
        "--threads",
        "--max-size",
        "--checkpoint",
        "--checkpoint-every",
        "--redis",
        "--redis-prefix",
    ]
    .contains(&name)
}

impl Given {
    /// Records the value of flag `name` (one of [`is_value_flag`]).
    fn set(&mut self, name: &str, value: String) -> Result<(), ConfigError> {
        match name {
            "--data" => self.data = Some(path(name, value)?),
            "--checkpoint" => self.checkpoint = Some(path(name, value)?),
            "--fields" => self.fields = Some(positive(name, &value)?),
            "--train-samples" => self.train_samples = Some(positive(name, &value)?),
            "--eval-samples" => self.eval_samples = Some(positive(name, &value)?),
            "--seed" => self.seed = Some(number(name, &value, "an integer from 0 to 2^64 - 1")?),
            "--dim" => self.dim = Some(positive(name, &value)?),
            "--batch" => self.batch = Some(positive(name, &value)?),
            "--epochs" => self.epochs = Some(positive(name, &value)?),
            "--steps" => self.steps = Some(positive(name, &value)? as u64),
            "--threads" => self.threads = Some(positive(name, &value)?),
            "--max-size" => self.max_size = Some(positive(name, &value)?),
            "--checkpoint-every" => self.checkpoint_every = Some(positive(name, &value)? as u64),
            "--redis" => self.redis = Some(nodes(name, &value)?),
            "--redis-prefix" => {
                if value.is_empty() || value.contains(['{', '}']) {
                    return Err(bad(name, "a non-empty prefix without { or }", &value));
                }
                self.redis_prefix = Some(value);
            }
            _ => return Err(ConfigError::Unknown(name.to_string())),
        }
        Ok(())
    }

    /// Fills in the defaults (`--quick` changes the sizes' defaults) and
    /// checks the bounds (see the module docs).
    fn resolve(self, env: &Environment) -> Result<Config, ConfigError> {
        let (train, eval, epochs) = if self.quick {
            (QUICK_TRAIN, QUICK_EVAL, QUICK_EPOCHS)
        } else {
            (DEFAULT_TRAIN, DEFAULT_EVAL, DEFAULT_EPOCHS)
        };
        let data = match self.data {
            Some(_) if self.fields.is_some() => {
                return Err(ConfigError::Conflict(format!(
                    "--fields sets the synthetic data's fields; Criteo data (--data) has {}",
                    crate::criteo::FIELDS
                )))
            }
            Some(path) => DataChoice::Criteo {
                path,
                train_samples: self.train_samples.or(self.quick.then_some(train)),
            },
            None => DataChoice::Synthetic {
                fields: self.fields.unwrap_or(DEFAULT_FIELDS),
                train_samples: self.train_samples.unwrap_or(train),
            },
        };
        let fields = match data {
            DataChoice::Synthetic { fields, .. } => fields,
            DataChoice::Criteo { .. } => crate::criteo::FIELDS,
        };
        at_most("--fields", fields, MAX_FIELDS, "fields")?;
        let dim = self.dim.unwrap_or(DEFAULT_DIM);
        at_most("--dim", dim, MAX_DIM, "dimensions")?;
        let batch = self.batch.unwrap_or(DEFAULT_BATCH);
        at_most("--batch", batch, MAX_BATCH, "samples")?;
        let eval_samples = self.eval_samples.unwrap_or(eval);
        at_most("--eval-samples", eval_samples, MAX_EVAL, "samples")?;
        if eval_samples.saturating_mul(fields) > MAX_EVAL_IDS {
            return Err(bad(
                "--eval-samples",
                format!(
                    "at most {MAX_EVAL_IDS} held-out ids in memory, {} samples of {fields} ids",
                    MAX_EVAL_IDS / fields
                ),
                &eval_samples.to_string(),
            ));
        }
        let batch_values = batch * fields * dim;
        if batch_values > MAX_BATCH_VALUES {
            return Err(ConfigError::Conflict(format!(
                "--batch {batch} x {fields} fields x --dim {dim} = {batch_values} embedding \
                 values a batch, more than {MAX_BATCH_VALUES} (1 GiB); lower --batch or --dim"
            )));
        }
        if let Some(max_size) = self.max_size {
            if max_size < batch * fields {
                return Err(bad(
                    "--max-size",
                    format!(
                        "at least one batch's ids (--batch {batch} x {fields} fields = {}), \
                         which a step inserts before the table is restricted",
                        batch * fields
                    ),
                    &max_size.to_string(),
                ));
            }
        }
        let (threads, threads_from) = match self.threads {
            Some(threads) => {
                at_most("--threads", threads, MAX_THREADS, "threads")?;
                (threads, ThreadsFrom::Flag)
            }
            None => match threads_in(env)? {
                Some(threads) => (threads, ThreadsFrom::Environment),
                None => (env.cores.clamp(1, MAX_THREADS), ThreadsFrom::Cores),
            },
        };
        let redis = match self.redis {
            Some(nodes) => Some(RedisChoice {
                nodes,
                prefix: self
                    .redis_prefix
                    .unwrap_or_else(|| DEFAULT_REDIS_PREFIX.to_string()),
                keep: self.redis_keep,
            }),
            None if self.redis_prefix.is_some() || self.redis_keep => {
                return Err(ConfigError::Conflict(
                    "--redis-prefix and --redis-keep need --redis".into(),
                ))
            }
            None => None,
        };
        if self.overwrite && self.checkpoint.is_none() && redis.is_none() {
            return Err(ConfigError::Conflict(
                "--overwrite needs --checkpoint DIR or --redis (what it replaces)".into(),
            ));
        }
        if self.checkpoint.is_none() {
            for (flag, given) in [
                ("--resume", self.resume),
                ("--checkpoint-every", self.checkpoint_every.is_some()),
            ] {
                if given {
                    return Err(ConfigError::Conflict(format!(
                        "{flag} needs --checkpoint DIR (where the run's checkpoints are)"
                    )));
                }
            }
        }
        if self.resume && self.overwrite {
            return Err(ConfigError::Conflict(
                "--resume continues the checkpointed run, --overwrite replaces it: give one".into(),
            ));
        }
        Ok(Config {
            checkpoint_every: self.checkpoint_every,
            resume: self.resume,
            overwrite: self.overwrite,
            redis,
            data,
            eval_samples,
            dim,
            batch,
            epochs: self.epochs.unwrap_or(epochs),
            steps: self.steps,
            threads,
            threads_from,
            max_size: self.max_size,
            checkpoint: self.checkpoint,
            quick: self.quick,
            summary: self.summary,
            seed: self.seed.unwrap_or(DEFAULT_SEED),
        })
    }
}

/// The thread count [`THREADS_VAR`] in `env` asks for: `None` if unset,
/// or not a whole number of at least 1 (rayon and candle ignore such
/// values, and so does the example); an error above [`MAX_THREADS`].
fn threads_in(env: &Environment) -> Result<Option<usize>, ConfigError> {
    match env.rayon_threads.as_deref().map(str::parse::<usize>) {
        Some(Ok(threads)) if threads > MAX_THREADS => Err(bad(
            THREADS_VAR,
            format!("at most {MAX_THREADS} threads"),
            &threads.to_string(),
        )),
        Some(Ok(threads)) if threads > 0 => Ok(Some(threads)),
        _ => Ok(None),
    }
}

/// An error naming `flag` if `value` is above `max` (`what` it counts).
fn at_most(flag: &str, value: usize, max: usize, what: &str) -> Result<(), ConfigError> {
    if value > max {
        return Err(bad(
            flag,
            format!("at most {max} {what}"),
            &value.to_string(),
        ));
    }
    Ok(())
}

/// A [`ConfigError::BadValue`].
fn bad(flag: &str, expected: impl Into<String>, value: &str) -> ConfigError {
    ConfigError::BadValue {
        flag: flag.to_string(),
        expected: expected.into(),
        value: value.to_string(),
    }
}

/// An unsigned number, `_` separators allowed.
fn number<T: std::str::FromStr>(
    flag: &str,
    value: &str,
    expected: &'static str,
) -> Result<T, ConfigError> {
    let digits: String = value.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad(flag, expected, value));
    }
    digits.parse().map_err(|_| bad(flag, expected, value))
}

/// A number of at least 1.
fn positive(flag: &str, value: &str) -> Result<usize, ConfigError> {
    const EXPECTED: &str = "a whole number of at least 1";
    match number(flag, value, EXPECTED)? {
        0 => Err(bad(flag, EXPECTED, value)),
        n => Ok(n),
    }
}

/// A comma-separated list of `host:port` nodes (at least one; the port a
/// number from 1 to 65535).
fn nodes(flag: &str, value: &str) -> Result<Vec<String>, ConfigError> {
    const EXPECTED: &str = "HOST:PORT[,HOST:PORT..]";
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
                _ => Err(bad(flag, EXPECTED, value)),
            }
        })
        .collect()
}

/// A non-empty path.
fn path(flag: &str, value: String) -> Result<PathBuf, ConfigError> {
    if value.is_empty() {
        return Err(bad(flag, "a path", &value));
    }
    Ok(PathBuf::from(value))
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
             max size {}, checkpoint {}{}{}{}\nthreads: {} (from {}): candle's CPU pool \
             ({THREADS_VAR}) and the table's shards",
            self.eval_samples,
            self.seed,
            if self.quick { " (quick)" } else { "" },
            if self.summary { ", summary" } else { "" },
            self.dim,
            self.batch,
            self.epochs,
            or_none(self.steps.map(|s| s.to_string())),
            or_none(self.max_size.map(|s| s.to_string())),
            or_none(self.checkpoint.as_ref().map(|p| p.display().to_string())),
            self.checkpoint_every
                .map_or(String::new(), |n| format!(" and every {n} steps")),
            if self.resume { ", resuming" } else { "" },
            if self.overwrite { ", overwriting" } else { "" },
            self.threads,
            self.threads_from,
        )?;
        if let Some(redis) = &self.redis {
            write!(
                f,
                "\ntable: Redis {}, {}:ctr/embeddings, {} at the end",
                redis.nodes.join(","),
                redis.prefix,
                if redis.keep { "kept" } else { "destroyed" }
            )?;
        }
        Ok(())
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

    fn parse(args: &[&str]) -> Result<Command, ConfigError> {
        parse_in(args, &machine())
    }

    fn parse_in(args: &[&str], env: &Environment) -> Result<Command, ConfigError> {
        Config::parse(args.iter().map(|a| a.to_string()), env)
    }

    /// Asserts that `args` are refused with a [`ConfigError::BadValue`] of
    /// `flag` showing `value`, and returns the message.
    fn refused(args: &[&str], flag: &str, value: &str) -> String {
        match parse(args) {
            Err(error @ ConfigError::BadValue { .. }) => {
                let ConfigError::BadValue {
                    flag: named,
                    value: shown,
                    ..
                } = &error
                else {
                    unreachable!()
                };
                assert_eq!((named.as_str(), shown.as_str()), (flag, value), "{args:?}");
                let message = error.to_string();
                assert!(
                    message.starts_with(&format!("{flag}: expected")),
                    "{message}"
                );
                message
            }
            other => panic!("{args:?} gave {other:?}"),
        }
    }

    fn config(args: &[&str]) -> Config {
        match parse(args) {
            Ok(Command::Run(config)) => *config,
            other => panic!("{args:?} gave {other:?}"),
        }
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
        refused(&["--redis-keep=yes"], "--redis-keep", "yes");
        for alone in [&["--redis-keep"][..], &["--redis-prefix", "p"]] {
            assert!(
                matches!(parse(alone), Err(ConfigError::Conflict(_))),
                "{alone:?}"
            );
        }
        assert_eq!(
            parse(&["--redis", "h:1", "--redis", "h:2"]),
            Err(ConfigError::Repeated("--redis".into()))
        );
        for flag in ["--redis HOST:PORT", "--redis-prefix", "--redis-keep"] {
            assert!(USAGE.contains(flag), "{flag}");
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
        for alone in [
            &["--resume"][..],
            &["--overwrite"],
            &["--checkpoint-every", "10"],
        ] {
            match parse(alone) {
                Err(ConfigError::Conflict(message)) => {
                    assert!(
                        message.starts_with(alone[0]) && message.contains("--checkpoint DIR"),
                        "{message}"
                    )
                }
                other => panic!("{alone:?} gave {other:?}"),
            }
        }
        match parse(&["--checkpoint", "run", "--resume", "--overwrite"]) {
            Err(ConfigError::Conflict(message)) => {
                assert!(message.contains("--resume") && message.contains("--overwrite"))
            }
            other => panic!("{other:?}"),
        }
        refused(
            &["--checkpoint", "d", "--checkpoint-every", "0"],
            "--checkpoint-every",
            "0",
        );
        refused(&["--resume=yes"], "--resume", "yes");
        assert_eq!(
            parse(&["--checkpoint", "d", "--overwrite", "--overwrite"]),
            Err(ConfigError::Repeated("--overwrite".into()))
        );
        for flag in ["--checkpoint-every N", "--resume", "--overwrite"] {
            assert!(USAGE.contains(flag), "{flag}");
        }
    }

    #[test]
    fn summary_is_opt_in() {
        assert!(config(&["--summary"]).summary);
        assert!(config(&["--quick", "--summary"]).summary);
        assert!(!config(&["--quick"]).summary);
        refused(&["--summary=yes"], "--summary", "yes");
        assert!(USAGE.contains("--summary"));
    }

    #[test]
    fn usage_states_the_defaults_and_bounds() {
        for text in [
            format!("default {DEFAULT_FIELDS}"),
            format!("synthetic default {DEFAULT_TRAIN}"),
            format!("default {DEFAULT_EVAL}"),
            format!("at most {MAX_EVAL}"),
            format!("default {DEFAULT_SEED}"),
            format!("{QUICK_TRAIN} training, {QUICK_EVAL} held-out, epochs {QUICK_EPOCHS}"),
            format!("default {DEFAULT_DIM}, at most {MAX_DIM}"),
            format!("default {DEFAULT_BATCH}, at most {MAX_BATCH}"),
            format!("default {DEFAULT_EPOCHS})"),
            format!("at most {MAX_THREADS})"),
        ] {
            assert!(USAGE.contains(&text), "USAGE lacks {text:?}");
        }
    }

    #[test]
    fn threads_come_from_the_flag_then_the_environment_then_the_cores() {
        let with = |value: &str| Environment {
            rayon_threads: Some(value.into()),
            cores: 4,
        };
        let threads = |args: &[&str], env: &Environment| match parse_in(args, env) {
            Ok(Command::Run(c)) => (c.threads, c.threads_from),
            other => panic!("{args:?} gave {other:?}"),
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
        assert!(matches!(
            parse_in(&[], &with("1000")),
            Err(ConfigError::BadValue { flag, .. }) if flag == THREADS_VAR
        ));
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
        match parse(&["--batch", "65536", "--dim", "1024", "--fields", "16"]) {
            Err(ConfigError::Conflict(message)) => {
                assert!(message.contains("--batch 65536") && message.contains("--dim 1024"))
            }
            other => panic!("{other:?}"),
        }
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
        assert!(matches!(
            parse(&["--data", "t.txt", "--fields", "3"]),
            Err(ConfigError::Conflict(_))
        ));
    }

    #[test]
    fn help() {
        assert_eq!(parse(&["--batch", "4", "--help"]), Ok(Command::Help));
        assert_eq!(parse(&["-h"]), Ok(Command::Help));
        assert!(USAGE.contains("--train-samples"));
    }

    #[test]
    fn bad_command_lines_name_the_flag() {
        assert_eq!(
            parse(&["--bogus"]),
            Err(ConfigError::Unknown("--bogus".into()))
        );
        assert_eq!(parse(&["stray"]), Err(ConfigError::Unknown("stray".into())));
        assert_eq!(
            parse(&["--batch"]),
            Err(ConfigError::MissingValue("--batch".into()))
        );
        assert_eq!(
            parse(&["--seed", "1", "--seed=2"]),
            Err(ConfigError::Repeated("--seed".into()))
        );
        for (flag, value) in [
            ("--batch", "0"),
            ("--batch", "-4"),
            ("--dim", "abc"),
            ("--epochs", "1.5"),
            ("--steps", ""),
            ("--seed", "99999999999999999999999"),
            ("--fields", "257"),
            ("--data", ""),
        ] {
            match parse(&[flag, value]) {
                Err(ConfigError::BadValue {
                    flag: named,
                    value: shown,
                    ..
                }) => {
                    assert_eq!(named, flag);
                    assert_eq!(shown, value);
                }
                other => panic!("{flag} {value:?} gave {other:?}"),
            }
        }
        assert!(matches!(
            parse(&["--quick=yes"]),
            Err(ConfigError::BadValue { .. })
        ));
        let message = parse(&["--batch", "x"]).unwrap_err().to_string();
        assert!(message.starts_with("--batch: expected"), "{message}");
    }
}
