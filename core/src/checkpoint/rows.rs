//! Checkpoints of any store, as rows: [`save_rows`] writes rows a store
//! exports, [`Reader`] reads a checkpoint back as rows. The format, crash
//! safety, locking and checks are exactly those of
//! [`Variable::save`](crate::Variable::save) and
//! [`Variable::restore`](crate::Variable::restore) (see the [module
//! docs](super)), so a table moves between a local [`Variable`] and
//! another store (such as `dynemb-redis`'s) through a checkpoint, both
//! ways.
//!
//! [`Variable`]: crate::Variable

use super::files::{self, FileRows, FloatDtypes, KeyCodec};
use super::manifest::{Manifest, SlotEntry, FORMAT, VERSION};
use super::{for_each_file, save_with, verify_with, FilesWriter, Verified};
use crate::checks::{check_fits, check_len};
use crate::{Dtype, Error, Key, RestrictPolicy, Result};
use std::marker::PhantomData;
use std::path::Path;

/// What a checkpoint says of its table, besides its rows.
#[derive(Debug, Clone, PartialEq)]
pub struct TableInfo {
    /// The table's name.
    pub name: String,
    /// Values per row.
    pub dim: usize,
    /// The slot columns (name, initial value), in the order of
    /// [`Rows::slots`].
    pub slots: Vec<(String, f32)>,
    /// The restrict policy of the rows' scores, if the rows have scores.
    pub scores: Option<RestrictPolicy>,
    /// Shards the table had (recorded for information; a checkpoint loads
    /// into any shard count).
    pub shards: usize,
    /// The dtype the values are stored in (rows saved are rounded to it).
    pub value_dtype: Dtype,
    /// The dtype the slot rows are stored in.
    pub slot_dtype: Dtype,
}

/// Some rows of a table: for row `i`, `keys[i]`, its values
/// `values[i * dim..(i + 1) * dim]`, its row of each slot column
/// (`slots[j]`, laid out like `values`, in [`TableInfo::slots`] order)
/// and, if the table has scores, `scores[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows<K> {
    /// The keys.
    pub keys: Vec<K>,
    /// `dim` values per key.
    pub values: Vec<f32>,
    /// One column per slot, `dim` values per key each.
    pub slots: Vec<Vec<f32>>,
    /// One score per key, if the table has scores.
    pub scores: Option<Vec<u64>>,
}

/// Checks `info` (names within [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES),
/// a dim of at least 1, distinct non-empty slot names, initial values that
/// may start a column of the slot dtype: [`Dtype::fits_initial`], as
/// `create_slot` and restoring demand).
fn check_info(info: &TableInfo) -> Result<()> {
    crate::check_name("variable name", &info.name)?;
    for (name, _) in &info.slots {
        crate::check_name("slot name", name)?;
    }
    if info.dim == 0 || info.dim > crate::MAX_DIM {
        return Err(Error::InvalidArgument(format!(
            "checkpoint of {:?}: dim must be in 1..={}, got {}",
            info.name,
            crate::MAX_DIM,
            info.dim
        )));
    }
    for (i, (name, initial)) in info.slots.iter().enumerate() {
        if name.is_empty() || info.slots[..i].iter().any(|(n, _)| n == name) {
            return Err(Error::InvalidArgument(format!(
                "checkpoint of {:?}: slot name {name:?} is empty or repeated",
                info.name
            )));
        }
        if !initial.is_finite() {
            return Err(Error::NonFinite {
                what: "slot initial value",
                index: i,
                value: *initial,
            });
        }
        if !info.slot_dtype.fits_initial(*initial) {
            return Err(Error::OutOfRange {
                what: "slot initial value",
                index: i,
                value: *initial,
                dtype: info.slot_dtype,
            });
        }
    }
    Ok(())
}

/// Checks one batch of `rows` against `info`: every length, values that
/// fit the dtypes.
fn check_rows<K>(info: &TableInfo, rows: &Rows<K>) -> Result<()> {
    let n = rows.keys.len();
    let expected = n.checked_mul(info.dim).ok_or_else(|| {
        Error::InvalidArgument(format!("{n} rows of {} values are too many", info.dim))
    })?;
    check_len("values", expected, rows.values.len())?;
    check_len("slots", info.slots.len(), rows.slots.len())?;
    for slot in &rows.slots {
        check_len("slot rows", expected, slot.len())?;
    }
    match (&rows.scores, info.scores) {
        (Some(scores), Some(_)) => check_len("scores", n, scores.len())?,
        (None, None) => {}
        (Some(_), None) => {
            return Err(Error::InvalidArgument(
                "rows have scores but the table has no restrict policy".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(Error::InvalidArgument(
                "the table has a restrict policy but the rows have no scores".into(),
            ))
        }
    }
    check_fits("values", &rows.values, info.value_dtype)?;
    for slot in &rows.slots {
        check_fits("slot rows", slot, info.slot_dtype)?;
    }
    Ok(())
}

/// Saves the rows `rows` yields as a checkpoint of the table `info`
/// describes at `dir`, in the format of
/// [`Variable::save`](crate::Variable::save) (files of bounded size, one
/// shard's worth: `shard-00000-*`), replacing a checkpoint there only
/// once the new one is complete on disk. `rows` may yield batches of any
/// size; they are streamed to files, so memory holds about one file's rows.
/// A key must appear once (a reader keeps the later row of a repeated key).
///
/// A batch of the wrong shape ([`Error::LengthMismatch`],
/// [`Error::InvalidArgument`]), a non-finite value ([`Error::NonFinite`]),
/// one that does not fit the info's dtypes ([`Error::OutOfRange`]; the
/// rest are rounded to them) or an error `rows` yields stops the save: nothing is published and the
/// previous checkpoint stays.
pub fn save_rows<K: Key, I>(dir: impl AsRef<Path>, info: &TableInfo, rows: I) -> Result<()>
where
    I: IntoIterator<Item = Result<Rows<K>>>,
{
    check_info(info)?;
    save_with(dir.as_ref(), |staging| {
        let codec = KeyCodec::for_type(K::TYPE_NAME);
        let slot_names: Vec<String> = info.slots.iter().map(|(n, _)| n.clone()).collect();
        let scored = info.scores.is_some();
        let dtypes = FloatDtypes {
            values: info.value_dtype,
            slots: info.slot_dtype,
        };
        let rows_per_file = files::rows_per_file(info.dim, dtypes, codec, slot_names.len(), scored);
        let mut writer = FilesWriter::new(staging, codec, dtypes, info.dim, slot_names.clone());
        let mut pending = FileRows {
            slots: vec![Vec::new(); slot_names.len()],
            scores: scored.then(Vec::new),
            ..FileRows::default()
        };
        let dim = info.dim;
        for batch in rows {
            let batch = batch?;
            check_rows(info, &batch)?;
            let mut at = 0;
            while at < batch.keys.len() {
                let take = (rows_per_file - pending.keys.len()).min(batch.keys.len() - at);
                let range = at..at + take;
                let values = at * dim..(at + take) * dim;
                pending
                    .keys
                    .extend(batch.keys[range.clone()].iter().map(|k| k.to_bits()));
                pending
                    .values
                    .extend_from_slice(&batch.values[values.clone()]);
                for (column, rows) in pending.slots.iter_mut().zip(&batch.slots) {
                    column.extend_from_slice(&rows[values.clone()]);
                }
                if let (Some(scores), Some(from)) = (&mut pending.scores, &batch.scores) {
                    scores.extend_from_slice(&from[range]);
                }
                at += take;
                if pending.keys.len() == rows_per_file {
                    writer.write(0, &pending)?;
                    pending.keys.clear();
                    pending.values.clear();
                    pending.slots.iter_mut().for_each(Vec::clear);
                    if let Some(scores) = &mut pending.scores {
                        scores.clear();
                    }
                }
            }
        }
        if !pending.keys.is_empty() {
            writer.write(0, &pending)?;
        }
        writer.finish(Manifest {
            format: FORMAT.to_string(),
            version: VERSION,
            name: info.name.clone(),
            key_type: K::TYPE_NAME.to_string(),
            dim,
            shards: info.shards.max(1),
            slots: info
                .slots
                .iter()
                .map(|(name, initial)| SlotEntry {
                    name: name.clone(),
                    initial: *initial,
                })
                .collect(),
            scores: info.scores.map(|p| p.name().to_string()),
            value_dtype: info.value_dtype,
            slot_dtype: info.slot_dtype,
            rows_per_file,
            rows: 0,
            files: Vec::new(),
            admission: None,
        })
    })
}

/// A checkpoint opened for reading as rows: checked whole when opened, and
/// locked against saves to its directory until dropped (as a
/// [`Variable::restore`](crate::Variable::restore) is), so the rows read
/// are the rows checked.
#[derive(Debug)]
pub struct Reader<K: Key> {
    verified: Verified,
    _key: PhantomData<fn() -> K>,
}

impl<K: Key> Reader<K> {
    /// Opens the checkpoint at `dir` for a table called `name` (used in
    /// errors) with keys `K` and rows of `dim` values, and checks all of it
    /// (index, every file's size, checksum, tensors, dtypes, shapes, finite
    /// values, timestamps at most a day ahead of the clock) without
    /// returning a row:
    /// a checkpoint of another key type or dim is an [`Error::Mismatch`],
    /// a damaged one an [`Error::Checkpoint`].
    pub fn open(dir: impl AsRef<Path>, name: &str, dim: usize) -> Result<Reader<K>> {
        let verified = verify_with::<K>(dir.as_ref(), name, dim, |_, _| Ok(()), |_| Ok(()))?;
        Ok(Reader {
            verified,
            _key: PhantomData,
        })
    }

    /// What the checkpoint says of its table.
    pub fn info(&self) -> TableInfo {
        let manifest = &self.verified.manifest;
        TableInfo {
            name: manifest.name.clone(),
            dim: manifest.dim,
            slots: manifest
                .slots
                .iter()
                .map(|s| (s.name.clone(), s.initial))
                .collect(),
            scores: manifest.policy(),
            shards: manifest.shards,
            value_dtype: manifest.value_dtype,
            slot_dtype: manifest.slot_dtype,
        }
    }

    /// Rows in the checkpoint.
    pub fn rows(&self) -> u64 {
        self.verified.manifest.rows
    }

    /// Calls `visit` with the rows of each data file in turn (read and
    /// checked again as they are read; a file that changed since
    /// [`Reader::open`] is an error). The scores are as stored: a table
    /// applying them clamps timestamps ahead of its clock
    /// ([`clamp_to_clock`](crate::restrict::clamp_to_clock)), as restore
    /// and load do.
    pub fn for_each(&self, mut visit: impl FnMut(Rows<K>) -> Result<()>) -> Result<()> {
        let (dir, manifest) = (&self.verified.dir, &self.verified.manifest);
        let codec = KeyCodec::for_type(K::TYPE_NAME);
        for_each_file(dir, manifest, codec, |rows| {
            visit(Rows {
                keys: rows.keys.into_iter().map(K::from_bits).collect(),
                values: rows.values,
                slots: rows.slots,
                scores: rows.scores,
            })
        })
    }
}
