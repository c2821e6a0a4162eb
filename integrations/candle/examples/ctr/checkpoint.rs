//! The run's checkpoint directory (`--checkpoint DIR`): what it holds, how
//! a checkpoint replaces the previous one, and whether a run may use it.
//! A crash at any moment leaves one complete checkpoint, and one run at a
//! time uses a directory.
//!
//! **Layout.** A checkpoint is a directory holding
//! - `embeddings/`: the table, in dynemb's format (rows, Adam slots `m` and
//!   `v`, timestamps), with the hidden lock files dynemb keeps beside it;
//! - `sparse_adam.json`: the sparse optimizer's state (its `step` and
//!   hyperparameters);
//! - `mlp.safetensors`: the MLP's weights;
//! - `run.json` ([`RunManifest`]): the run's configuration ([`RunConfig`])
//!   and its progress ([`Progress`]: epochs done, the next batch of the
//!   epoch, steps, skipped batches, and the rows evicted, expired and not
//!   admitted, in all and at the current epoch's start).
//!
//! candle-nn's `AdamW` keeps its moments and step count in private fields
//! (candle-nn 0.11 `optim.rs`), so they are not in a checkpoint: a resumed
//! run restarts the MLP's AdamW from zero moments (the program says so).
//! Everything else resumes exactly, but stochastic rounding
//! (`--stochastic-rounding`): its random bits follow each row's write
//! count, which a restore starts anew, so a resumed run rounds with other
//! bits than an uninterrupted one would (alike in distribution, not in
//! bits).
//!
//! **Crash safety.** A checkpoint is written whole into a staging directory
//! beside `DIR` (`.NAME.ctr-staging`), its files flushed to disk, then put
//! in place by two renames: `DIR` to `.NAME.ctr-previous`, the staging
//! directory to `DIR`; then the previous one is removed. A crash at any
//! moment leaves a complete checkpoint: at `DIR`, or, between the renames,
//! at `.NAME.ctr-previous`. Opening the directory ([`CheckpointDir::open`])
//! repairs what a crash left: a staging directory is removed (it may be
//! incomplete), a previous checkpoint with no `DIR` is renamed back to
//! `DIR`, and one beside a `DIR` is removed (it is older). A failed write
//! leaves the previous checkpoint in place. So the disk needs room for two
//! checkpoints while one is written.
//!
//! **Who may use it.** One run at a time: a run holds a lock on
//! `.NAME.ctr-lock` beside `DIR` for as long as it lives. A directory
//! holding anything but a checkpoint's entries is never used (a checkpoint
//! replaces the whole directory), nor is a path inside a checkpoint (the
//! outer checkpoint's next write would delete it; the path is refused
//! before anything, the lock included, is created there), nor a symbolic
//! link to a missing path. A directory holding a checkpoint counts
//! as another run's: a new run refuses it, `--resume` continues it and
//! `--overwrite` replaces it with this run's first checkpoint (the old one
//! is kept until then). Opening checks, before any data is read, that the
//! directory can be created and written: it creates the staging directory
//! and writes a file into it, so a path under a regular file, a read-only
//! directory or a full disk is an error naming the path, not a surprise
//! after training.
//!
//! **A resumed run is the same run.** The data and model flags (`--data`,
//! `--fields`, `--train-samples`, `--eval-samples`, `--seed`, `--dim`,
//! `--batch`, and the table's `--max-size`, `--capacity` and `--min-count`)
//! must be those of the checkpoint's run ([`RunConfig::check_same`]: an
//! error names the flag), and the data must hold the same training samples
//! an epoch. `--epochs` and `--steps` count from the run's start;
//! `--threads` (the table's shards, which a checkpoint restores into any
//! count), `--expire`, `--checkpoint-every`, `--summary` and the `--redis`
//! flags may change. The table's checkpoint keeps the admission counts of
//! ids not yet admitted and every row's last training time, so expiry
//! counts the time between a checkpoint and its resumption as age.
//!
//! **Dtypes may change.** The manifest records the dtypes the checkpoint's
//! table is stored in (`value_dtype`, `slot_dtype`; a manifest without
//! them is of an f32 table), but `--dtype`, `--slot-dtype` and
//! `--stochastic-rounding` may change on `--resume`, because dynemb's
//! checkpoints convert: a checkpoint of any dtype restores into a table of
//! any other, widened exactly or rounded to nearest even (a value that
//! does not fit the new dtype, above 65504 for f16, fails the restore
//! before anything changes). So an f32 run can go on in bf16, at half the
//! table's row memory, or a bf16 run in f32. The resumed run says when it
//! converts ([`RunConfig::conversion`]); it is then not the run an
//! uninterrupted one would have been, as a resumed MLP's AdamW is not; nor
//! is a resumed run with `--stochastic-rounding` (see above).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use dynemb::Dtype;
use serde::{Deserialize, Serialize};

use crate::config::{Config, DataChoice};
use crate::train::RowCounts;

/// The table's checkpoint directory inside a checkpoint.
pub const TABLE_DIR: &str = "embeddings";
/// The sparse optimizer's state inside a checkpoint.
pub const SPARSE_FILE: &str = "sparse_adam.json";
/// The MLP's weights inside a checkpoint.
pub const MLP_FILE: &str = "mlp.safetensors";
/// The run manifest inside a checkpoint.
pub const RUN_FILE: &str = "run.json";
/// The version of [`RunManifest`]'s format.
pub const FORMAT: u32 = 1;

/// Why a checkpoint directory cannot be used, read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path operated on.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The path cannot hold a checkpoint (the message says why).
    #[error("checkpoint {path}: {reason}")]
    Unusable {
        /// The checkpoint path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The directory holds another run's checkpoint.
    #[error(
        "checkpoint {path} already holds {what}: --resume continues it, \
         --overwrite replaces it with this run's"
    )]
    Taken {
        /// The checkpoint path.
        path: PathBuf,
        /// What it holds.
        what: String,
    },
    /// The directory holds a checkpoint without a run manifest (one a
    /// run of an earlier version wrote, say), which cannot be resumed.
    #[error(
        "checkpoint {path} already holds {what}, which --resume cannot continue: \
         --overwrite replaces it with this run's"
    )]
    TakenUnresumable {
        /// The checkpoint path.
        path: PathBuf,
        /// What it holds.
        what: String,
    },
    /// `--resume` without a checkpoint to resume.
    #[error("--resume: {reason}")]
    NothingToResume {
        /// Why.
        reason: String,
    },
    /// A resumed run asks for another configuration than the checkpoint's.
    #[error(
        "{flag}: the checkpoint's run used {saved}, this one asks for {asked}; a resumed \
         run keeps its data and model flags (only --epochs, --steps, --threads, \
         --expire, --dtype, --slot-dtype, --stochastic-rounding, --checkpoint-every, \
         --summary and the --redis flags may change)"
    )]
    Changed {
        /// The flag that differs.
        flag: &'static str,
        /// The checkpoint's value.
        saved: String,
        /// This run's value.
        asked: String,
    },
    /// A checkpoint file that cannot be understood.
    #[error("{path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// `Result` with [`CheckpointError`].
pub type Result<T> = std::result::Result<T, CheckpointError>;

/// An [`CheckpointError::Io`] naming `path`.
pub fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What the data and model flags of a run were (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunConfig {
    /// `synthetic`, or the Criteo file's path (made absolute).
    pub data: String,
    /// Ids per sample.
    pub fields: usize,
    /// `--train-samples` (after `--quick`); `None`: every Criteo line but
    /// the held-out ones.
    pub train_samples: Option<usize>,
    /// `--eval-samples`.
    pub eval_samples: usize,
    /// `--seed`.
    pub seed: u64,
    /// `--dim`.
    pub dim: usize,
    /// `--batch`.
    pub batch: usize,
    /// `--max-size`.
    pub max_size: Option<usize>,
    /// `--capacity` (absent from a manifest written before the flag: none).
    #[serde(default)]
    pub capacity: Option<usize>,
    /// `--min-count` (absent from a manifest written before the flag: 1).
    #[serde(default = "every_id")]
    pub min_count: u32,
    /// `--dtype`: the dtype of the checkpoint's values (absent from a
    /// manifest written before the flag: f32).
    #[serde(default)]
    pub value_dtype: Dtype,
    /// `--slot-dtype`: the dtype of the checkpoint's Adam slots (absent:
    /// f32).
    #[serde(default)]
    pub slot_dtype: Dtype,
}

/// The `--min-count` that admits every id at its first read.
fn every_id() -> u32 {
    1
}

impl RunConfig {
    /// The data and model flags of `config`.
    pub fn of(config: &Config) -> Self {
        let (data, fields, train_samples) = match &config.data {
            DataChoice::Synthetic {
                fields,
                train_samples,
            } => ("synthetic".to_string(), *fields, Some(*train_samples)),
            DataChoice::Criteo {
                path,
                train_samples,
            } => {
                let path = fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                (
                    path.display().to_string(),
                    crate::criteo::FIELDS,
                    *train_samples,
                )
            }
        };
        Self {
            data,
            fields,
            train_samples,
            eval_samples: config.eval_samples,
            seed: config.seed,
            dim: config.dim,
            batch: config.batch,
            max_size: config.max_size,
            capacity: config.capacity,
            min_count: config.min_count,
            value_dtype: config.precision.values,
            slot_dtype: config.precision.slots,
        }
    }

    /// What a resumed run asking for `asked` does to the checkpoint's
    /// table (`self`'s dtypes) as it restores it, if its dtypes differ (see
    /// the module docs): a sentence for the output.
    pub fn conversion(&self, asked: &RunConfig) -> Option<String> {
        let saved = (self.value_dtype, self.slot_dtype);
        let wanted = (asked.value_dtype, asked.slot_dtype);
        if saved == wanted {
            return None;
        }
        // Into f32 widens exactly; into a half dtype (from f32 or the
        // other half dtype) rounds.
        let rounds = |from: Dtype, to: Dtype| from != to && to != Dtype::F32;
        let rounded = rounds(self.value_dtype, asked.value_dtype)
            || rounds(self.slot_dtype, asked.slot_dtype);
        Some(format!(
            "the checkpoint's table stores values {}, slots {}; this run stores values {}, \
             slots {}: its rows are converted as they are restored ({})",
            self.value_dtype,
            self.slot_dtype,
            asked.value_dtype,
            asked.slot_dtype,
            if rounded {
                "rounded to nearest even"
            } else {
                "widened exactly"
            }
        ))
    }

    /// An error naming the first flag whose value `asked` changes from the
    /// checkpoint's run (`self`).
    pub fn check_same(&self, asked: &RunConfig) -> Result<()> {
        fn shown<T: std::fmt::Debug>(value: &Option<T>) -> String {
            match value {
                Some(value) => format!("{value:?}"),
                None => "none".to_string(),
            }
        }
        let changed = |flag, saved: String, asked: String| {
            Err(CheckpointError::Changed { flag, saved, asked })
        };
        if self.data != asked.data {
            return changed("--data", self.data.clone(), asked.data.clone());
        }
        if self.fields != asked.fields {
            return changed(
                "--fields",
                self.fields.to_string(),
                asked.fields.to_string(),
            );
        }
        if self.train_samples != asked.train_samples {
            return changed(
                "--train-samples",
                shown(&self.train_samples),
                shown(&asked.train_samples),
            );
        }
        let numbers = [
            (
                "--eval-samples",
                self.eval_samples as u64,
                asked.eval_samples as u64,
            ),
            ("--seed", self.seed, asked.seed),
            ("--dim", self.dim as u64, asked.dim as u64),
            ("--batch", self.batch as u64, asked.batch as u64),
        ];
        for (flag, saved, asked) in numbers {
            if saved != asked {
                return changed(flag, saved.to_string(), asked.to_string());
            }
        }
        if self.max_size != asked.max_size {
            return changed("--max-size", shown(&self.max_size), shown(&asked.max_size));
        }
        if self.capacity != asked.capacity {
            return changed("--capacity", shown(&self.capacity), shown(&asked.capacity));
        }
        if self.min_count != asked.min_count {
            return changed(
                "--min-count",
                self.min_count.to_string(),
                asked.min_count.to_string(),
            );
        }
        Ok(())
    }
}

/// How far a run has come.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Epochs finished (each evaluated).
    pub epochs_done: usize,
    /// Batches of the next epoch already taken (trained or skipped): the
    /// run goes on at this batch.
    pub batch: u64,
    /// Batches trained: the sparse optimizer's step count.
    pub steps: u64,
    /// Batches skipped because their loss was not finite.
    pub skipped: u64,
    /// What the table's bounds, admission and expiry did so far.
    #[serde(default)]
    pub rows: RowCounts,
    /// [`Progress::rows`] when the current epoch started (its line shows
    /// the difference).
    #[serde(default)]
    pub epoch_start: RowCounts,
    /// The current epoch's trained batches, samples and loss sum (for its
    /// mean loss when the epoch ends in a resumed run).
    pub epoch_trained: u64,
    /// See [`Progress::epoch_trained`].
    pub epoch_samples: u64,
    /// See [`Progress::epoch_trained`].
    pub epoch_loss_sum: f64,
    /// The current epoch's skipped batches.
    pub epoch_skipped: u64,
}

impl Progress {
    /// Batches taken in all (trained or skipped), which `--steps` bounds.
    pub fn batches(&self) -> u64 {
        self.steps + self.skipped
    }

    /// Marks the current epoch finished.
    pub fn finish_epoch(&mut self) {
        self.epochs_done += 1;
        self.batch = 0;
        self.epoch_trained = 0;
        self.epoch_samples = 0;
        self.epoch_loss_sum = 0.0;
        self.epoch_skipped = 0;
        self.epoch_start = self.rows;
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "next epoch {} at batch {}, {} steps, {} batches skipped",
            self.epochs_done + 1,
            self.batch,
            self.steps,
            self.skipped
        )
    }
}

/// `run.json`: what a checkpoint's run is and how far it came.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunManifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The data and model flags.
    pub run: RunConfig,
    /// Training samples an epoch of the run's data holds.
    pub train_samples_per_epoch: usize,
    /// How far the run came.
    pub progress: Progress,
}

impl RunManifest {
    /// Reads the manifest of the checkpoint at `dir`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(RUN_FILE);
        let text = fs::read_to_string(&path).map_err(io_error(&path))?;
        let manifest: RunManifest =
            serde_json::from_str(&text).map_err(|e| CheckpointError::Unreadable {
                path: path.clone(),
                reason: format!("not a run manifest: {e}"),
            })?;
        if manifest.format != FORMAT {
            return Err(CheckpointError::Unreadable {
                path,
                reason: format!(
                    "format {}, this program reads format {FORMAT}",
                    manifest.format
                ),
            });
        }
        Ok(manifest)
    }

    /// Writes the manifest into the checkpoint being written at `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RUN_FILE);
        let text = serde_json::to_string_pretty(self).map_err(|e| CheckpointError::Unreadable {
            path: path.clone(),
            reason: format!("cannot encode the run manifest: {e}"),
        })?;
        let mut file = File::create(&path).map_err(io_error(&path))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(io_error(&path))
    }
}

/// What a run asks of the checkpoint directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A new run: the directory must hold no checkpoint.
    New,
    /// `--resume`: the directory must hold a checkpoint of this example.
    Resume,
    /// `--overwrite`: any checkpoint there is replaced by this run's.
    Overwrite,
}

/// A checkpoint directory a run holds (see the module docs).
#[derive(Debug)]
pub struct CheckpointDir {
    /// The checkpoint's path (absolute).
    dir: PathBuf,
    /// Its parent.
    parent: PathBuf,
    /// Its final component.
    name: String,
    /// The lock file, locked while this value lives.
    _lock: File,
}

/// What [`CheckpointDir::open`] found and did.
#[derive(Debug)]
pub struct Opened {
    /// The directory.
    pub dir: CheckpointDir,
    /// The checkpoint to resume (with [`Mode::Resume`]).
    pub resume: Option<RunManifest>,
    /// What it repaired or will replace, one sentence each, for the output.
    pub notes: Vec<String>,
}

/// Whether `name` (an entry of a checkpoint directory) belongs there.
fn is_checkpoint_entry(name: &str) -> bool {
    [TABLE_DIR, SPARSE_FILE, MLP_FILE, RUN_FILE].contains(&name)
        || name.starts_with(&format!(".{TABLE_DIR}.dynemb-"))
        || name.starts_with(&format!(".{SPARSE_FILE}.saving-"))
}

impl CheckpointDir {
    /// Opens the checkpoint path `path` for a run in `mode`: resolves it,
    /// takes its lock, repairs what a crash left, checks that a checkpoint
    /// can be written there, and applies the rules of the module docs.
    /// Every error names `path` (and the file concerned, if another).
    pub fn open(path: &Path, mode: Mode) -> Result<Opened> {
        let unusable = |reason| CheckpointError::Unusable {
            path: path.to_path_buf(),
            reason,
        };
        Self::open_at(path, mode).map_err(|error| match error {
            CheckpointError::Io { path: file, source } if file == path => {
                unusable(source.to_string())
            }
            CheckpointError::Io { path: file, source } if !file.starts_with(path) => {
                unusable(format!("{}: {source}", file.display()))
            }
            other => other,
        })
    }

    /// [`CheckpointDir::open`], its errors as they come.
    fn open_at(path: &Path, mode: Mode) -> Result<Opened> {
        let unusable = |reason: String| CheckpointError::Unusable {
            path: path.to_path_buf(),
            reason,
        };
        let dir = match fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() || meta.file_type().is_symlink() => {
                let resolved = match fs::canonicalize(path) {
                    Ok(resolved) => resolved,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        let target = fs::read_link(path).unwrap_or_default();
                        return Err(unusable(format!(
                            "is a symbolic link to {}, which does not exist (a checkpoint \
                             directory is created, a link is not followed into nothing)",
                            target.display()
                        )));
                    }
                    Err(e) => return Err(io_error(path)(e)),
                };
                if !resolved.is_dir() {
                    return Err(unusable("exists and is not a directory".into()));
                }
                if let Some(parent) = resolved.parent() {
                    refuse_inside_checkpoint(parent).map_err(unusable)?;
                }
                resolved
            }
            Ok(_) => return Err(unusable("exists and is not a directory".into())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let name = path
                    .file_name()
                    .ok_or_else(|| unusable("has no final directory name".into()))?;
                let parent = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                // Before anything is created: its nearest existing ancestor.
                if let Some(existing) = parent
                    .ancestors()
                    .find(|a| a.as_os_str().is_empty() || fs::symlink_metadata(a).is_ok())
                {
                    let existing = if existing.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        existing
                    };
                    if let Ok(existing) = fs::canonicalize(existing) {
                        refuse_inside_checkpoint(&existing).map_err(unusable)?;
                    }
                }
                fs::create_dir_all(&parent).map_err(io_error(&parent))?;
                fs::canonicalize(&parent)
                    .map_err(io_error(&parent))?
                    .join(name)
            }
            Err(e) => return Err(io_error(path)(e)),
        };
        let (Some(parent), Some(name)) = (dir.parent().map(Path::to_path_buf), dir.file_name())
        else {
            return Err(unusable("is a root directory".into()));
        };
        let name = name
            .to_str()
            .ok_or_else(|| unusable("is not valid UTF-8".into()))?
            .to_string();
        if std::env::current_dir().is_ok_and(|cwd| cwd == dir) {
            return Err(unusable(
                "is the current working directory, which a checkpoint would replace".into(),
            ));
        }
        let lock_path = parent.join(format!(".{name}.ctr-lock"));
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        if let Err(e) = lock.try_lock() {
            return Err(match e {
                fs::TryLockError::WouldBlock => unusable(format!(
                    "another run holds its lock {}",
                    lock_path.display()
                )),
                fs::TryLockError::Error(e) => io_error(&lock_path)(e),
            });
        }
        let dir = CheckpointDir {
            dir,
            parent,
            name,
            _lock: lock,
        };
        let mut notes = dir.repair()?;
        dir.probe()?;
        let found = dir.inspect()?;
        let resume = match (mode, found) {
            (Mode::Resume, Found::Run(manifest)) => Some(*manifest),
            (Mode::Resume, Found::Nothing) => {
                return Err(CheckpointError::NothingToResume {
                    reason: format!("no checkpoint at {}", dir.dir.display()),
                })
            }
            (Mode::Resume, Found::Other(what)) => {
                return Err(CheckpointError::NothingToResume {
                    reason: format!(
                        "{} holds {what}, which has no {RUN_FILE} to resume from",
                        dir.dir.display()
                    ),
                })
            }
            (Mode::New, Found::Run(manifest)) => {
                return Err(CheckpointError::Taken {
                    path: dir.dir.clone(),
                    what: format!("a run ({})", manifest.progress),
                })
            }
            (Mode::New, Found::Other(what)) => {
                return Err(CheckpointError::TakenUnresumable {
                    path: dir.dir.clone(),
                    what,
                })
            }
            (Mode::Overwrite, Found::Run(_) | Found::Other(_)) => {
                notes.push(format!(
                    "--overwrite: the checkpoint in {} is replaced by this run's first checkpoint",
                    dir.dir.display()
                ));
                None
            }
            (Mode::New | Mode::Overwrite, Found::Nothing) => None,
        };
        Ok(Opened { dir, resume, notes })
    }

    /// The checkpoint's path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The sibling `.NAME.ctr-<role>`.
    fn sibling(&self, role: &str) -> PathBuf {
        self.parent.join(format!(".{}.ctr-{role}", self.name))
    }

    /// Repairs what a crashed write left (see the module docs); returns
    /// what it did.
    fn repair(&self) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        let staging = self.sibling("staging");
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(io_error(&staging))?;
            notes.push(format!(
                "removed {}, an unfinished checkpoint",
                staging.display()
            ));
        }
        let previous = self.sibling("previous");
        if previous.is_dir() {
            if self.dir.exists() {
                fs::remove_dir_all(&previous).map_err(io_error(&previous))?;
            } else {
                fs::rename(&previous, &self.dir).map_err(io_error(&previous))?;
                sync_dir(&self.parent)?;
                notes.push(format!(
                    "recovered the checkpoint {} from {}, where an interrupted write left it",
                    self.dir.display(),
                    previous.display()
                ));
            }
        }
        Ok(notes)
    }

    /// Checks that a checkpoint can be written: creates the staging
    /// directory, writes and flushes a file in it, and removes both.
    fn probe(&self) -> Result<()> {
        let staging = self.sibling("staging");
        fs::create_dir(&staging).map_err(io_error(&staging))?;
        let probe = staging.join("probe");
        let written = File::create(&probe)
            .and_then(|mut file| {
                file.write_all(b"a checkpoint can be written here\n")?;
                file.sync_all()
            })
            .map_err(io_error(&probe));
        let removed = fs::remove_dir_all(&staging).map_err(io_error(&staging));
        written.and(removed)
    }

    /// What the directory holds now.
    fn inspect(&self) -> Result<Found> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Nothing),
            Err(e) => return Err(io_error(&self.dir)(e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_error(&self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_checkpoint_entry(&name) {
                return Err(CheckpointError::Unusable {
                    path: self.dir.clone(),
                    reason: format!(
                        "holds {name:?}, which is not part of a checkpoint (a checkpoint \
                         replaces the whole directory): choose a new or empty directory"
                    ),
                });
            }
            names.push(name);
        }
        if names.is_empty() {
            Ok(Found::Nothing)
        } else if names.iter().any(|n| n == RUN_FILE) {
            Ok(Found::Run(Box::new(RunManifest::read(&self.dir)?)))
        } else {
            Ok(Found::Other(format!(
                "a checkpoint without {RUN_FILE} ({})",
                names.join(", ")
            )))
        }
    }

    /// Writes a checkpoint: `write` fills a fresh staging directory (the
    /// table, the optimizer state, the MLP), `manifest` is added, every
    /// file is flushed, and the result replaces the checkpoint at the path
    /// (see the module docs). On an error the previous checkpoint stays.
    pub fn publish(
        &self,
        manifest: &RunManifest,
        write: impl FnOnce(&Path) -> std::result::Result<(), Box<dyn std::error::Error>>,
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let staging = self.sibling("staging");
        if staging.exists() {
            fs::remove_dir_all(&staging).map_err(io_error(&staging))?;
        }
        fs::create_dir(&staging).map_err(io_error(&staging))?;
        let written = write(&staging)
            .and_then(|()| Ok(manifest.write(&staging)?))
            .and_then(|()| Ok(sync_files(&staging)?));
        if let Err(e) = written {
            let _ = fs::remove_dir_all(&staging);
            return Err(e);
        }
        Ok(self.swap(&staging)?)
    }

    /// Puts the complete checkpoint at `staging` in place.
    fn swap(&self, staging: &Path) -> Result<()> {
        let previous = self.sibling("previous");
        if previous.exists() {
            fs::remove_dir_all(&previous).map_err(io_error(&previous))?;
        }
        let had_one = self.dir.exists();
        if had_one {
            fs::rename(&self.dir, &previous).map_err(io_error(&self.dir))?;
        }
        if let Err(e) = fs::rename(staging, &self.dir) {
            if had_one {
                let _ = fs::rename(&previous, &self.dir);
            }
            return Err(io_error(&self.dir)(e));
        }
        sync_dir(&self.parent)?;
        if had_one {
            // Best effort: one left behind is removed by the next opening.
            let _ = fs::remove_dir_all(&previous);
        }
        Ok(())
    }
}

/// Whether the directory `dir` holds a checkpoint (a run manifest, or a
/// table with an optimizer state).
fn holds_checkpoint(dir: &Path) -> bool {
    dir.join(RUN_FILE).is_file()
        || (dir.join(TABLE_DIR).is_dir() && dir.join(SPARSE_FILE).is_file())
}

/// An error (the reason) if the directory `dir` (absolute, resolved) or one
/// of its ancestors holds a checkpoint: a checkpoint inside another would
/// make that one unusable, and its next checkpoint would delete this one.
/// Checked before the lock or anything else is created.
fn refuse_inside_checkpoint(dir: &Path) -> std::result::Result<(), String> {
    match dir.ancestors().find(|a| holds_checkpoint(a)) {
        Some(outer) => Err(format!(
            "is inside the checkpoint {}, which each of its run's checkpoints replaces \
             whole: choose a directory outside it",
            outer.display()
        )),
        None => Ok(()),
    }
}

/// What a checkpoint directory holds.
#[derive(Debug)]
enum Found {
    /// Nothing (missing or empty).
    Nothing,
    /// A checkpoint of this example.
    Run(Box<RunManifest>),
    /// Checkpoint entries without a run manifest (the description).
    Other(String),
}

/// Flushes a directory's entries to disk.
fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(io_error(path))
}

/// Flushes the regular files directly in `dir`, and `dir` itself (the
/// table's directory flushes its own files when it is saved).
fn sync_files(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        if path.is_file() {
            File::open(&path)
                .and_then(|file| file.sync_all())
                .map_err(io_error(&path))?;
        }
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(steps: u64) -> RunManifest {
        RunManifest {
            format: FORMAT,
            run: RunConfig {
                data: "synthetic".into(),
                fields: 4,
                train_samples: Some(100),
                eval_samples: 10,
                seed: 1,
                dim: 4,
                batch: 10,
                max_size: None,
                capacity: None,
                min_count: 1,
                value_dtype: Dtype::F32,
                slot_dtype: Dtype::F32,
            },
            train_samples_per_epoch: 100,
            progress: Progress {
                steps,
                ..Progress::default()
            },
        }
    }

    /// Publishes a checkpoint of `steps` steps with one marker file.
    fn publish(dir: &CheckpointDir, steps: u64) {
        dir.publish(&manifest(steps), |staging| {
            fs::write(staging.join(MLP_FILE), steps.to_string())?;
            Ok(())
        })
        .unwrap();
    }

    fn steps_at(path: &Path) -> u64 {
        RunManifest::read(path).unwrap().progress.steps
    }

    #[test]
    fn a_path_under_a_regular_file_is_refused_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("file");
        fs::write(&file, "x").unwrap();
        for path in [file.join("ckpt"), file.join("a/b"), file.clone()] {
            let message = CheckpointDir::open(&path, Mode::New)
                .unwrap_err()
                .to_string();
            assert!(
                message.contains(&file.display().to_string()),
                "{path:?}: {message}"
            );
        }
    }

    /// A directory even root cannot write in (sysfs refuses new files).
    #[test]
    fn an_unwritable_directory_is_refused_naming_the_path() {
        let sys = Path::new("/sys");
        if !sys.is_dir() {
            return;
        }
        let path = sys.join("ctr-checkpoint");
        let message = CheckpointDir::open(&path, Mode::New)
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with(&format!("checkpoint {}: ", path.display())),
            "{message}"
        );
    }

    #[test]
    fn a_dangling_symbolic_link_is_refused_naming_its_target() {
        let root = tempfile::tempdir().unwrap();
        let link = root.path().join("link");
        std::os::unix::fs::symlink(root.path().join("nowhere"), &link).unwrap();
        for mode in [Mode::New, Mode::Resume, Mode::Overwrite] {
            let message = CheckpointDir::open(&link, mode).unwrap_err().to_string();
            assert!(
                message.starts_with(&format!(
                    "checkpoint {}: is a symbolic link to ",
                    link.display()
                )) && message.contains("nowhere, which does not exist"),
                "{message}"
            );
        }
    }

    #[test]
    fn a_new_directory_is_created_and_probed() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("a/b/ckpt");
        let opened = CheckpointDir::open(&path, Mode::New).unwrap();
        assert!(opened.resume.is_none() && opened.notes.is_empty());
        assert!(path.parent().unwrap().is_dir() && !path.exists());
        // Nothing but the lock beside it.
        let left: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec![".ckpt.ctr-lock".to_string()]);
        publish(&opened.dir, 3);
        assert_eq!(steps_at(&path), 3);
        publish(&opened.dir, 4);
        assert_eq!(steps_at(&path), 4);
        assert_eq!(fs::read_to_string(path.join(MLP_FILE)).unwrap(), "4");
    }

    #[test]
    fn one_run_at_a_time() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt");
        let held = CheckpointDir::open(&path, Mode::New).unwrap();
        let message = CheckpointDir::open(&path, Mode::New)
            .unwrap_err()
            .to_string();
        assert!(message.contains("another run"), "{message}");
        drop(held);
        CheckpointDir::open(&path, Mode::New).unwrap();
    }

    #[test]
    fn an_existing_checkpoint_is_refused_unless_resumed_or_overwritten() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt");
        publish(&CheckpointDir::open(&path, Mode::New).unwrap().dir, 5);
        let before = fs::read(path.join(RUN_FILE)).unwrap();
        let message = CheckpointDir::open(&path, Mode::New)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("--resume") && message.contains("--overwrite"),
            "{message}"
        );
        assert_eq!(fs::read(path.join(RUN_FILE)).unwrap(), before);
        let resumed = CheckpointDir::open(&path, Mode::Resume).unwrap();
        assert_eq!(resumed.resume.unwrap().progress.steps, 5);
        drop(resumed.dir);
        let overwritten = CheckpointDir::open(&path, Mode::Overwrite).unwrap();
        assert!(overwritten.resume.is_none());
        assert_eq!(overwritten.notes.len(), 1);
        // Kept until this run's first checkpoint replaces it.
        assert_eq!(steps_at(&path), 5);
        publish(&overwritten.dir, 1);
        assert_eq!(steps_at(&path), 1);
    }

    #[test]
    fn checkpoints_without_a_manifest_and_foreign_files() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt");
        fs::create_dir_all(path.join(TABLE_DIR)).unwrap();
        fs::write(path.join(SPARSE_FILE), "{}").unwrap();
        let message = CheckpointDir::open(&path, Mode::New)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("without run.json")
                && message.ends_with(
                    "which --resume cannot continue: --overwrite replaces it with this run's"
                ),
            "{message}"
        );
        let message = CheckpointDir::open(&path, Mode::Resume)
            .unwrap_err()
            .to_string();
        assert!(message.starts_with("--resume:"), "{message}");
        CheckpointDir::open(&path, Mode::Overwrite).unwrap();
        fs::write(path.join("notes.txt"), "mine").unwrap();
        for mode in [Mode::New, Mode::Resume, Mode::Overwrite] {
            let message = CheckpointDir::open(&path, mode).unwrap_err().to_string();
            assert!(message.contains("\"notes.txt\""), "{message}");
        }
        // An empty directory is as good as none.
        let empty = root.path().join("empty");
        fs::create_dir(&empty).unwrap();
        CheckpointDir::open(&empty, Mode::New).unwrap();
        let message = CheckpointDir::open(&empty, Mode::Resume)
            .unwrap_err()
            .to_string();
        assert!(message.contains("no checkpoint at"), "{message}");
    }

    /// Every state a crash can leave: a half-written staging directory; the
    /// old checkpoint renamed aside with no new one in place; both the new
    /// one and the old one aside. Opening repairs each and resumes the
    /// complete checkpoint.
    #[test]
    fn what_a_crash_leaves_is_repaired() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt");
        publish(&CheckpointDir::open(&path, Mode::New).unwrap().dir, 7);
        let staging = root.path().join(".ckpt.ctr-staging");
        let previous = root.path().join(".ckpt.ctr-previous");

        // Crashed while writing: the staging directory is incomplete.
        fs::create_dir(&staging).unwrap();
        fs::write(staging.join(MLP_FILE), "half").unwrap();
        let opened = CheckpointDir::open(&path, Mode::Resume).unwrap();
        assert_eq!(opened.resume.unwrap().progress.steps, 7);
        assert!(!staging.exists());
        drop(opened.dir);

        // Crashed between the renames.
        fs::rename(&path, &previous).unwrap();
        fs::create_dir(&staging).unwrap();
        let opened = CheckpointDir::open(&path, Mode::Resume).unwrap();
        assert_eq!(opened.resume.unwrap().progress.steps, 7);
        assert!(opened.notes.iter().any(|n| n.contains("recovered")));
        assert!(!previous.exists() && !staging.exists());
        drop(opened.dir);

        // Crashed before the old one was removed.
        fs::create_dir(&previous).unwrap();
        fs::write(previous.join(RUN_FILE), "old").unwrap();
        let opened = CheckpointDir::open(&path, Mode::Resume).unwrap();
        assert_eq!(opened.resume.unwrap().progress.steps, 7);
        assert!(!previous.exists());
        // A new run refuses the recovered checkpoint like any other.
        drop(opened.dir);
        fs::rename(&path, &previous).unwrap();
        assert!(CheckpointDir::open(&path, Mode::New).is_err());
    }

    #[test]
    fn a_failed_write_keeps_the_previous_checkpoint() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt");
        let opened = CheckpointDir::open(&path, Mode::New).unwrap();
        publish(&opened.dir, 2);
        let error = opened
            .dir
            .publish(&manifest(3), |_| Err("the table is gone".into()))
            .unwrap_err();
        assert_eq!(error.to_string(), "the table is gone");
        assert_eq!(steps_at(&path), 2);
        assert!(!root.path().join(".ckpt.ctr-staging").exists());
    }

    /// A path inside a checkpoint (existing or not, however deep) is
    /// refused in every mode, and the checkpoint is left as it was: no
    /// lock file, no directory, nothing that would stop it resuming.
    #[test]
    fn a_path_inside_a_checkpoint_is_refused_and_leaves_it_untouched() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("ckpt");
        publish(&CheckpointDir::open(&path, Mode::New).unwrap().dir, 3);
        let listing = |dir: &Path| {
            let mut names: Vec<_> = fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        };
        let before = listing(&path);
        for inner in [
            path.join("sub"),
            path.join("a/b"),
            path.join(TABLE_DIR),
            path.join("x/../y"),
        ] {
            for mode in [Mode::New, Mode::Resume, Mode::Overwrite] {
                let message = CheckpointDir::open(&inner, mode).unwrap_err().to_string();
                assert!(
                    message.contains(&format!("inside the checkpoint {}", path.display())),
                    "{inner:?}: {message}"
                );
            }
        }
        assert_eq!(listing(&path), before);
        let opened = CheckpointDir::open(&path, Mode::Resume).unwrap();
        assert_eq!(opened.resume.unwrap().progress.steps, 3);
    }

    #[test]
    fn a_changed_flag_is_named() {
        let saved = manifest(0).run;
        saved.check_same(&saved).unwrap();
        type Change = fn(&mut RunConfig);
        let cases: [(&str, Change); 10] = [
            ("--data", |c| c.data = "/data/train.txt".into()),
            ("--fields", |c| c.fields = 5),
            ("--train-samples", |c| c.train_samples = Some(200)),
            ("--eval-samples", |c| c.eval_samples = 11),
            ("--seed", |c| c.seed = 2),
            ("--dim", |c| c.dim = 8),
            ("--batch", |c| c.batch = 20),
            ("--max-size", |c| c.max_size = Some(1000)),
            ("--capacity", |c| c.capacity = Some(1000)),
            ("--min-count", |c| c.min_count = 2),
        ];
        for (flag, change) in cases {
            let mut asked = saved.clone();
            change(&mut asked);
            let message = saved.check_same(&asked).unwrap_err().to_string();
            assert!(message.starts_with(&format!("{flag}: ")), "{message}");
            assert!(message.contains("--dtype, --slot-dtype"), "{message}");
        }
    }

    /// Other dtypes are not refused (the checkpoint converts); the
    /// conversion is described, rounding or widening.
    #[test]
    fn other_dtypes_resume_and_say_how_they_convert() {
        let saved = manifest(0).run;
        assert_eq!(saved.conversion(&saved), None);
        let with = |values, slots| RunConfig {
            value_dtype: values,
            slot_dtype: slots,
            ..saved.clone()
        };
        for (from, to, how) in [
            (
                with(Dtype::F32, Dtype::F32),
                with(Dtype::Bf16, Dtype::F32),
                "rounded",
            ),
            (
                with(Dtype::Bf16, Dtype::Bf16),
                with(Dtype::F32, Dtype::F32),
                "widened",
            ),
            (
                with(Dtype::Bf16, Dtype::F32),
                with(Dtype::F16, Dtype::F32),
                "rounded",
            ),
            (
                with(Dtype::F16, Dtype::F32),
                with(Dtype::F32, Dtype::Bf16),
                "rounded",
            ),
        ] {
            from.check_same(&to).unwrap();
            let note = from.conversion(&to).unwrap();
            let expected = format!(
                "stores values {}, slots {}; this run stores values {}, slots {}",
                from.value_dtype, from.slot_dtype, to.value_dtype, to.slot_dtype
            );
            assert!(note.contains(&expected), "{note}");
            assert!(note.contains(how), "{note}");
        }
    }

    #[test]
    fn the_manifest_round_trips() {
        let root = tempfile::tempdir().unwrap();
        let mut m = manifest(9);
        m.progress.epoch_loss_sum = 0.1 + 0.2;
        m.progress.rows.evicted = 5;
        m.progress.epoch_start.not_admitted_reads = 7;
        m.run.capacity = Some(100);
        m.run.value_dtype = Dtype::Bf16;
        m.run.slot_dtype = Dtype::F16;
        m.write(root.path()).unwrap();
        let text = fs::read_to_string(root.path().join(RUN_FILE)).unwrap();
        assert!(text.contains(r#""value_dtype": "bf16""#), "{text}");
        assert_eq!(RunManifest::read(root.path()).unwrap(), m);
        let bad = text.replace(r#""slot_dtype": "f16""#, r#""slot_dtype": "f64""#);
        fs::write(root.path().join(RUN_FILE), bad).unwrap();
        let message = RunManifest::read(root.path()).unwrap_err().to_string();
        assert!(message.contains("f64"), "{message}");
        fs::write(root.path().join(RUN_FILE), "{").unwrap();
        let message = RunManifest::read(root.path()).unwrap_err().to_string();
        assert!(message.contains(RUN_FILE), "{message}");
    }

    /// A manifest written before the table's lifecycle and dtype flags
    /// reads as a run without them: no bounds, admission at the first read,
    /// f32 values and slots.
    #[test]
    fn a_manifest_without_the_lifecycle_fields_reads_as_without_them() {
        let root = tempfile::tempdir().unwrap();
        let m = manifest(4);
        let mut json: serde_json::Value = serde_json::to_value(&m).unwrap();
        for (object, field) in [
            ("run", "capacity"),
            ("run", "min_count"),
            ("run", "value_dtype"),
            ("run", "slot_dtype"),
            ("progress", "rows"),
            ("progress", "epoch_start"),
        ] {
            let removed = json[object].as_object_mut().unwrap().remove(field);
            assert!(removed.is_some(), "{object}.{field}");
        }
        fs::write(root.path().join(RUN_FILE), json.to_string()).unwrap();
        assert_eq!(RunManifest::read(root.path()).unwrap(), m);
    }
}
