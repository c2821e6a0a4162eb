//! `index.json`: what a checkpoint holds and how to check it.

use crate::lifecycle::admission::Admitter;
use crate::{Admission, Dtype, Error, RestrictPolicy, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Value of the `format` field.
pub(crate) const FORMAT: &str = "dynemb-checkpoint";
/// The format version this build writes and reads.
pub(crate) const VERSION: u32 = 1;
/// The manifest's file name inside a checkpoint directory.
pub(crate) const MANIFEST: &str = "index.json";

/// The checkpoint's table of contents (`index.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] when written by this build.
    pub version: u32,
    /// The saved variable's name.
    pub name: String,
    /// Key type name (`Key::TYPE_NAME`: `i64`, `u64`, `i32`, `u32`).
    pub key_type: String,
    /// Values per row.
    pub dim: usize,
    /// Shards of the saved variable (files are per shard; loading
    /// re-partitions, so this is informational).
    pub shards: usize,
    /// The slot columns saved beside the values (a `slot.<name>` tensor
    /// each, in every file).
    pub slots: Vec<SlotEntry>,
    /// The restrict policy whose scores every file holds in a `scores`
    /// tensor (`"timestamp"`, `"frequency"`), or `null`. Checkpoints
    /// written before variables had scores say `false`, read as `null`.
    #[serde(deserialize_with = "scores_field")]
    pub scores: Option<String>,
    /// The dtype of the `values` tensors (`"f16"`, `"bf16"`); absent for
    /// `f32`, as in checkpoints written before half precision.
    #[serde(default, skip_serializing_if = "is_f32")]
    pub value_dtype: Dtype,
    /// The dtype of the `slot.<name>` tensors; absent for `f32`.
    #[serde(default, skip_serializing_if = "is_f32")]
    pub slot_dtype: Dtype,
    /// Most rows one file holds.
    pub rows_per_file: usize,
    /// Rows in all files together.
    pub rows: u64,
    /// The data files, in the order they were written.
    pub files: Vec<FileEntry>,
    /// The admission state of a variable with admission, if it has it
    /// (absent from the checkpoints of other variables and of older
    /// builds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionEntry>,
}

/// The admission rule and state files of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdmissionEntry {
    /// `"exact"` or `"sketch"`.
    pub kind: String,
    /// Training reads that admit a key.
    pub min_count: u32,
    /// A sketch's counters per row (sketch only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<usize>,
    /// A sketch's rows (sketch only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<usize>,
    /// The state files: pending keys in chunks (exact; none when no key is
    /// pending), or the one file of the sketch.
    pub files: Vec<AdmissionFile>,
}

/// One admission state file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdmissionFile {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Pending keys it holds (exact), or counters (sketch).
    pub entries: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// CRC-32 (IEEE) of its bytes.
    pub crc32: u32,
}

/// The `kind` of exact admission counts.
pub(crate) const EXACT: &str = "exact";
/// The `kind` of an admission sketch.
pub(crate) const SKETCH: &str = "sketch";
/// Pending keys one exact admission file holds at most (an 8-byte key and
/// a 4-byte count each: about 16 MiB).
pub(crate) const PENDING_PER_FILE: usize = super::files::TARGET_FILE_BYTES / 12;

impl AdmissionEntry {
    /// The admission rule (checked by [`Manifest::parse`]).
    pub(crate) fn rule(&self) -> Option<Admission> {
        match (self.kind.as_str(), self.width, self.depth) {
            (EXACT, None, None) => Some(Admission::Exact {
                min_count: self.min_count,
            }),
            (SKETCH, Some(width), Some(depth)) => Some(Admission::Sketch {
                min_count: self.min_count,
                width,
                depth,
            }),
            _ => None,
        }
    }

    /// Checks the entry is a rule a variable can have, with files that fit
    /// it (`data_files` are the checkpoint's other files).
    fn check(&self, path: &Path, data_files: &[FileEntry]) -> Result<()> {
        let bad = |reason: String| Err(corrupt(path, format!("admission: {reason}")));
        let Some(rule) = self.rule() else {
            return bad(format!(
                "kind {:?} with width {:?} and depth {:?} (exact has neither, sketch both)",
                self.kind, self.width, self.depth
            ));
        };
        match Admitter::check_rule(rule) {
            Err(Error::InvalidArgument(reason)) => return bad(reason),
            Err(e) => return bad(e.to_string()),
            Ok(()) => {}
        }
        if let Admission::Sketch { width, depth, .. } = rule {
            let counters = (width * depth) as u64;
            if self.files.len() != 1 || self.files[0].entries != counters {
                return bad(format!(
                    "a sketch of {width} x {depth} counters is one file of {counters} entries"
                ));
            }
        }
        for (i, entry) in self.files.iter().enumerate() {
            let named = entry.file.starts_with("admission-")
                && entry.file.ends_with(".safetensors")
                && Path::new(&entry.file)
                    .file_name()
                    .is_some_and(|name| name == entry.file.as_str());
            if !named {
                return bad(format!(
                    "file name {:?} is not admission-*.safetensors",
                    entry.file
                ));
            }
            let repeated = self.files[..i].iter().any(|e| e.file == entry.file)
                || data_files.iter().any(|e| e.file == entry.file);
            if repeated {
                return bad(format!("file {:?} is listed twice", entry.file));
            }
            if matches!(rule, Admission::Exact { .. }) && entry.entries > PENDING_PER_FILE as u64 {
                return bad(format!(
                    "{} holds {} pending keys, more than {PENDING_PER_FILE}",
                    entry.file, entry.entries
                ));
            }
        }
        Ok(())
    }
}

/// The `scores` field: a policy name, `null`, or the `false` of
/// checkpoints written before scores existed.
fn scores_field<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scores {
        Policy(Option<String>),
        Legacy(bool),
    }
    match Scores::deserialize(deserializer)? {
        Scores::Policy(policy) => Ok(policy),
        Scores::Legacy(false) => Ok(None),
        Scores::Legacy(true) => Err(serde::de::Error::custom(
            "scores: true names no restrict policy",
        )),
    }
}

/// One slot column of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SlotEntry {
    /// The slot's name (its tensor is `slot.<name>`).
    pub name: String,
    /// The value its rows start at, as it was asked for (before rounding
    /// to the slot dtype).
    pub initial: f32,
}

/// One safetensors file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileEntry {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// The shard its rows came from.
    pub shard: usize,
    /// Rows it holds.
    pub rows: usize,
    /// Its size in bytes.
    pub bytes: u64,
    /// CRC-32 (IEEE) of its bytes.
    pub crc32: u32,
}

/// Whether a dtype field is left out of `index.json` (`f32`, the dtype of
/// checkpoints written before half precision).
fn is_f32(dtype: &Dtype) -> bool {
    *dtype == Dtype::F32
}

/// The error for a checkpoint that cannot be used as it is.
pub(crate) fn corrupt(path: &Path, reason: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

impl Manifest {
    /// Parses `index.json` bytes and checks the manifest is complete and
    /// self-consistent (not yet against a variable).
    pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Manifest> {
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| corrupt(path, format!("unreadable index.json: {e}")))?;
        if manifest.format != FORMAT {
            return Err(corrupt(
                path,
                format!("format is {:?}, not {FORMAT:?}", manifest.format),
            ));
        }
        if manifest.version != VERSION {
            return Err(corrupt(
                path,
                format!(
                    "format version {} (this build reads version {VERSION})",
                    manifest.version
                ),
            ));
        }
        if manifest.dim == 0 || manifest.dim > crate::MAX_DIM {
            return Err(corrupt(
                path,
                format!(
                    "dim {} is outside 1..={} (no table has it)",
                    manifest.dim,
                    crate::MAX_DIM
                ),
            ));
        }
        for (i, slot) in manifest.slots.iter().enumerate() {
            if let Err(e) = crate::check_name("slot name", &slot.name) {
                return Err(corrupt(path, e.to_string()));
            }
            if slot.name.is_empty() || manifest.slots[..i].iter().any(|s| s.name == slot.name) {
                return Err(corrupt(
                    path,
                    format!("slot name {:?} is empty or repeated", slot.name),
                ));
            }
            if !slot.initial.is_finite() {
                return Err(corrupt(
                    path,
                    format!("slot {:?} has a non-finite initial value", slot.name),
                ));
            }
        }
        if let Some(scores) = &manifest.scores {
            if RestrictPolicy::from_name(scores).is_none() {
                return Err(corrupt(
                    path,
                    format!("scores of unknown restrict policy {scores:?}"),
                ));
            }
        }
        let total = manifest
            .files
            .iter()
            .try_fold(0_u64, |sum, f| sum.checked_add(f.rows as u64));
        if total != Some(manifest.rows) {
            return Err(corrupt(
                path,
                format!(
                    "files hold {} rows, index says {}",
                    total.map_or("too many".to_string(), |t| t.to_string()),
                    manifest.rows
                ),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for entry in &manifest.files {
            if !names.insert(entry.file.as_str()) {
                return Err(corrupt(
                    path,
                    format!("file {:?} is listed twice", entry.file),
                ));
            }
            let plain = Path::new(&entry.file)
                .file_name()
                .is_some_and(|name| name == entry.file.as_str());
            if !plain {
                return Err(corrupt(
                    path,
                    format!("file name {:?} is not a plain file name", entry.file),
                ));
            }
            if entry.rows > manifest.rows_per_file {
                return Err(corrupt(
                    path,
                    format!(
                        "{} holds {} rows, more than rows_per_file {}",
                        entry.file, entry.rows, manifest.rows_per_file
                    ),
                ));
            }
        }
        if let Some(admission) = &manifest.admission {
            admission.check(path, &manifest.files)?;
        }
        Ok(manifest)
    }

    /// The restrict policy of the saved scores, if any (checked by `parse`).
    pub(crate) fn policy(&self) -> Option<RestrictPolicy> {
        self.scores.as_deref().and_then(RestrictPolicy::from_name)
    }

    /// Checks that rows of this checkpoint fit a variable with these
    /// properties.
    pub(crate) fn check_fits(
        &self,
        path: &Path,
        variable: &str,
        key_type: &str,
        dim: usize,
    ) -> Result<()> {
        if self.key_type == key_type && self.dim == dim {
            return Ok(());
        }
        Err(Error::Mismatch {
            name: variable.to_string(),
            existing: format!(
                "checkpoint {} with key type {}, dim {}",
                path.display(),
                self.key_type,
                self.dim
            ),
            requested: format!("variable with key type {key_type}, dim {dim}"),
        })
    }
}
