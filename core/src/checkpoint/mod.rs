//! Checkpoints: saving a variable to a directory and reading it back. A
//! save killed at any moment leaves a restore the old checkpoint or the new
//! one, whole, and a restore or load checks all of it before the variable
//! changes.
//!
//! # Format
//!
//! A checkpoint is a directory holding `index.json` (format version, the
//! variable's name, key type, dim and shard count, its slot columns' names
//! and initial values, the restrict policy of its scores, rows per file, and
//! each file's shard, row count, size and CRC-32) and data files named
//! `shard-SSSSS-PPPPP.safetensors`. Each file holds, for the same rows in the
//! same order, a `keys` tensor (the key type's dtype, `[rows]`), a `values`
//! tensor (`[rows, dim]`), a `slot.<name>` tensor per slot column (`[rows,
//! dim]`) and, if the variable has a restrict policy, a `scores` tensor
//! (`U64`, `[rows]`). Values and slot rows are stored in the variable's own
//! dtypes: `F32`, or `F16`/`BF16` for a half-precision variable, whose
//! `index.json` then says so in `value_dtype` and `slot_dtype` (`"f16"`,
//! `"bf16"`; absent for `f32`, so `f32` checkpoints are as before). A file holds at most `rows_per_file`
//! rows (about 16 MiB), so saving and loading need memory for one file at a
//! time, never for the whole table. Python reads it with `safetensors` and
//! numpy (see the README).
//!
//! A variable with [`Admission`](crate::Admission) also saves its pending
//! counts, listed in `index.json` under `admission` (its `kind`, `exact` or
//! `sketch`, its `min_count`, a sketch's `width` and `depth`, and each
//! file's entries, size and CRC-32), in files named
//! `admission-PPPPP.safetensors`: exact counts as a `keys` tensor (the key
//! type's dtype, `[n]`) and a `counts` tensor (`U32`, `[n]`, each in
//! `1..min_count`), at most about 16 MiB of keys per file (none when no
//! key is pending); a sketch as one file with a `counters` tensor (`U16`,
//! `[depth, width]`) and a `reads` tensor (`U64`, `[1]`: reads counted
//! since the last ageing). Row `i`'s counter of a key is column
//! `fmix64(fmix64(k ^ PHI) + (i + 1) * PHI) * width >> 64` of that row,
//! `k` the key's 64-bit pattern (a 32-bit key sign-extended), `fmix64`
//! MurmurHash3's 64-bit finalizer, `PHI` = `0x9e3779b97f4a7c15`, all
//! wrapping `u64` arithmetic. A checkpoint without `admission` (one of a
//! variable without admission, or of a build older than admission) is
//! the same format version and reads as before; a build older than
//! admission refuses a checkpoint that has it.
//!
//! # Crash safety and concurrent saves
//!
//! `save(dir)` writes everything into a staging directory of its own beside
//! `dir` (`.<name>.dynemb-saving-<pid>-<n>-<random>`), fsyncs every file and
//! the directory, and only then puts it in place: by atomically exchanging
//! it with the old `dir` (Linux `renameat2(RENAME_EXCHANGE)`) and deleting
//! the old one afterwards, so a save killed at any moment leaves either the
//! previous checkpoint or the new one at `dir`, complete. File systems
//! without the exchange (NFS, CIFS, many FUSE ones; every OS but Linux) get
//! two renames instead; a crash between them leaves the previous checkpoint
//! at `.<name>.dynemb-previous`, where a restore finds it. A staging
//! directory left by a killed save is removed by the next save.
//!
//! Saves and restores of one directory, from threads of one process or from
//! several processes, coordinate through two lock files beside it
//! (`.<name>.dynemb-lock` and `.<name>.dynemb-queue`; see the private `lock`
//! module): saves write their files in parallel and publish one at a time
//! (the last to publish wins, and every published checkpoint is whole), a
//! restore or load holds off every publish from the moment it opens the
//! checkpoint until it has applied it, and a save waiting to publish holds
//! off new restores, so restores cannot starve it. Two restores into one
//! variable at the same time interleave their rows: serialize them.

//! A save replaces only a checkpoint: a path that is a regular file, or a
//! directory holding anything but checkpoint files (the user's files,
//! another checkpoint nested inside) is an [`Error::InvalidArgument`] before
//! anything is written. A symlink to a checkpoint directory stays a symlink
//! to the new checkpoint (see the private `place` module).

//! # What a save captures
//!
//! Saving runs while other threads train. Every row written is consistent (one
//! version of its values, slots and score together, never a torn mix), and
//! every key present for the
//! whole save is written exactly once. Keys inserted or removed during the
//! save may or may not be in it, and a key removed and re-inserted during the
//! save may be written twice (loading keeps the later file's row): it is not a
//! point-in-time snapshot of the whole table. Admission counts are taken
//! after the rows, each stripe of exact counts (or the sketch) as it is
//! then.
//!
//! # Restore and load
//!
//! Both first read and check the whole checkpoint (index, sizes, checksums,
//! tensor names, dtypes and shapes, key type and dim against the variable,
//! finite values, every key's shard under the variable's partitioner,
//! timestamps no more than a day ahead of the local clock) and return
//! an error before touching the variable if anything is wrong. (A
//! timestamp ahead of the local clock is applied as the current time:
//! see [`clamp_to_clock`].) Then
//! `restore` clears the variable and inserts the saved rows, while `load`
//! upserts them into what is there; other threads writing meanwhile see the
//! table being refilled. The rows applied are the ones verified: the
//! checkpoint stays locked against saves from the first read to the last
//! row, and every file is checked again as it is read a second time. What
//! can still fail after the check is the disk itself (an I/O error), or
//! another program rewriting the files in place, which dynemb never does;
//! the error then says so and the variable holds part of the checkpoint.
//! Rows go through the variable's partitioner, so a checkpoint saved with
//! any shard count loads into any other; and through its dtypes, so a
//! checkpoint of any dtype loads into a variable of any other: values are
//! rounded to the variable's dtypes (to nearest even), and a value that
//! does not fit them (an `f32` checkpoint's `70000.0` into an `f16`
//! variable) is an [`Error::OutOfRange`] found by the check, before
//! anything changes. A slot's initial value is saved as it was asked for,
//! before rounding to the slot dtype, so a checkpoint of one slot dtype
//! restores into another as if the slot had been created there: a slot it
//! creates starts at that value rounded to the variable's slot dtype, and
//! it is compared with a slot the variable has after both are rounded to
//! the variable's slot dtype (an optimizer asking for its slots again,
//! before or after the restore, finds them equal).
//!
//! Checkpoint bytes are untrusted: `index.json` is read only up to 64 MiB,
//! a data file only if it is a regular file no larger than a save of these
//! rows could write (an admission file: one chunk of pending keys, or a
//! sketch the size of the variable's own), and every count is checked
//! arithmetic, so memory stays bounded and nothing panics whatever a
//! checkpoint claims.
//!
//! Slot columns of the checkpoint that the variable lacks are created (with
//! the saved initial value; an existing slot of that name with another
//! initial value is an [`Error::Mismatch`], found before anything changes
//! unless another thread creates such a slot between the check and the
//! restore); slots the variable has and the
//! checkpoint lacks start at their initial value in restored rows and keep
//! theirs in loaded ones. Scores are restored if the variable has the same
//! restrict policy as the checkpoint (another policy is an
//! [`Error::Mismatch`]); into a variable without a policy they are ignored,
//! and a checkpoint without scores scores its rows as any write does.
//!
//! Admission state is checked with the rest and applied after the rows
//! (which bypass admission). It fits a variable whose admission is of the
//! same kind (and, for a sketch, the same width and depth); another kind
//! or shape is an [`Error::Mismatch`] before anything changes. `min_count`
//! may differ: a saved exact count at or past the variable's `min_count`
//! admits its key at the next read. `restore` replaces the variable's
//! counts with the saved ones (a checkpoint without admission state
//! clears them); `load` merges them, each pending key keeping the larger
//! of its two counts and each sketch counter the larger of its two values
//! (a maximum, not a sum: loading the same checkpoint twice changes
//! nothing, and no key is admitted sooner than either side would admit
//! it), and a checkpoint without state leaves them. Exact counts past the
//! variable's pending bound drop the lowest. A variable without admission
//! ignores saved admission state (its files are not read).
//!
//! # Other stores
//!
//! [`save_rows`] and [`Reader`] write and read the same format from and
//! as plain rows ([`Rows`], described by a [`TableInfo`]), with the same
//! crash safety, locks and checks: how a store that is not a [`Variable`]
//! (the Redis backend) saves and restores, so a model moves between local
//! and remote tables through a checkpoint. They write no admission state
//! and ignore it when reading.

mod admission;
mod files;
mod lock;
mod manifest;
mod place;
mod rows;

use crate::raw::fs::exchange_dirs;
use crate::raw::{ExportColumns, MAX_SLOTS};
use crate::restrict::clamp_to_clock;
use crate::{Error, Key, RestrictPolicy, Result, Variable};
use files::{FileRows, FloatDtypes, KeyCodec};
use lock::CheckpointLock;
use manifest::{corrupt, FileEntry, Manifest, SlotEntry, FORMAT, MANIFEST, VERSION};
use place::Place;
pub use rows::{save_rows, Reader, Rows, TableInfo};
use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The largest `index.json` read (a manifest lists about 100 bytes per
/// data file of up to 16 MiB: this is room for petabytes).
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// Files written but not yet flushed to disk, at most, during a save.
const UNSYNCED_FILES: usize = 8;

/// The error for a failed file-system operation on `path`.
pub(crate) fn io_error(path: &Path, error: &std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        kind: error.kind(),
        message: error.to_string(),
    }
}

/// Writes `bytes` to a new file at `path` (not yet flushed to disk).
fn write_file(path: &Path, bytes: &[u8]) -> Result<File> {
    let mut file = File::create(path).map_err(|e| io_error(path, &e))?;
    file.write_all(bytes).map_err(|e| io_error(path, &e))?;
    Ok(file)
}

/// Flushes a written file to disk.
fn sync_file(path: &Path, file: &File) -> Result<()> {
    file.sync_all().map_err(|e| io_error(path, &e))
}

/// Flushes a directory's entries (new files, renames) to disk.
fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io_error(path, &e))
}

/// Saves `variable` to `dir` (see the module docs).
pub(crate) fn save<K: Key>(variable: &Variable<K>, dir: &Path) -> Result<()> {
    save_with(dir, |staging| write_checkpoint(variable, staging))
}

/// Saves a checkpoint to `dir`: `write` fills an empty staging directory
/// (files flushed to disk), which is then published in place of `dir` as
/// the module docs say.
fn save_with(dir: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let place = Place::for_save(dir)?;
    let staging = {
        let _queue = lock::staging(&place)?;
        place.remove_abandoned_staging();
        place.create_staging()?
    };
    if let Err(e) = write(&staging.path) {
        // Best effort: a staging directory left behind is removed by the
        // next save.
        let _ = place::remove_dir(&staging.path);
        return Err(e);
    }
    let published = lock::publishing(&place).and_then(|_locks| {
        place.check_replaceable()?;
        publish(&place, &staging.path)
    });
    // After a publish `staging.path` holds the previous checkpoint; after a
    // failure, this save's files. Best effort: the next save removes what
    // is left.
    let _ = place::remove_dir(&staging.path);
    published?;
    place.sync_parent()
}

/// The data files of a checkpoint being written into a staging directory,
/// one [`FilesWriter::write`] per file, and then its manifest.
struct FilesWriter<'a> {
    staging: &'a Path,
    codec: KeyCodec,
    dtypes: FloatDtypes,
    dim: usize,
    slot_names: Vec<String>,
    entries: Vec<FileEntry>,
    /// Files written but not yet flushed: they are flushed a few behind
    /// the one being written, so the disk writes back while the next is
    /// encoded (and few files are open at once).
    written: VecDeque<(File, PathBuf)>,
}

impl<'a> FilesWriter<'a> {
    fn new(
        staging: &'a Path,
        codec: KeyCodec,
        dtypes: FloatDtypes,
        dim: usize,
        slot_names: Vec<String>,
    ) -> Self {
        FilesWriter {
            staging,
            codec,
            dtypes,
            dim,
            slot_names,
            entries: Vec::new(),
            written: VecDeque::new(),
        }
    }

    /// Writes `rows` (of shard `shard`) as the next data file.
    fn write(&mut self, shard: usize, rows: &FileRows) -> Result<()> {
        let file = format!("shard-{shard:05}-{:05}.safetensors", self.entries.len());
        let path = self.staging.join(&file);
        let bytes = files::encode(
            &path,
            self.codec,
            self.dtypes,
            rows,
            &self.slot_names,
            self.dim,
        )?;
        let (size, crc32) = self.write_named(&file, &bytes)?;
        self.entries.push(FileEntry {
            file,
            shard,
            rows: rows.keys.len(),
            bytes: size,
            crc32,
        });
        Ok(())
    }

    /// Writes `bytes` as the file `name` of the checkpoint (flushed to disk
    /// by [`finish`](Self::finish) at the latest); returns its size and
    /// CRC-32.
    fn write_named(&mut self, name: &str, bytes: &[u8]) -> Result<(u64, u32)> {
        let path = self.staging.join(name);
        self.written.push_back((write_file(&path, bytes)?, path));
        if self.written.len() > UNSYNCED_FILES {
            let (file, path) = self.written.pop_front().expect("more than zero");
            sync_file(&path, &file)?;
        }
        Ok((bytes.len() as u64, crc32fast::hash(bytes)))
    }

    /// Writes the manifest (the files' list and `header`) and flushes
    /// everything to disk.
    fn finish(mut self, header: Manifest) -> Result<()> {
        let manifest = Manifest {
            rows: self.entries.iter().map(|e| e.rows as u64).sum(),
            files: std::mem::take(&mut self.entries),
            ..header
        };
        let json = serde_json::to_vec_pretty(&manifest).expect("a manifest always serializes");
        let path = self.staging.join(MANIFEST);
        self.written.push_back((write_file(&path, &json)?, path));
        for (file, path) in &self.written {
            sync_file(path, file)?;
        }
        sync_dir(self.staging)
    }
}

/// Writes every row of `variable` and the manifest into the empty
/// directory `staging`, flushed to disk.
fn write_checkpoint<K: Key>(variable: &Variable<K>, staging: &Path) -> Result<()> {
    let dim = variable.dim();
    let codec = KeyCodec::for_type(K::TYPE_NAME);
    // Slots added while saving are left out of this checkpoint.
    let slot_names = variable.slot_names();
    let slots = slot_names
        .iter()
        .map(|name| {
            let initial = variable.slot_initial_asked(variable.slot_id(name)?)?;
            Ok(SlotEntry {
                name: name.clone(),
                initial,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let policy = variable.restrict_policy();
    let dtypes = FloatDtypes {
        values: variable.value_dtype(),
        slots: variable.slot_dtype(),
    };
    let rows_per_file = files::rows_per_file(dim, dtypes, codec, slots.len(), policy.is_some());
    let columns = ExportColumns {
        values: true,
        slots: !slots.is_empty(),
        scores: policy.is_some(),
    };
    let mut writer = FilesWriter::new(staging, codec, dtypes, dim, slot_names.clone());
    for (shard, table) in variable.shards().iter().enumerate() {
        let end = table.end_of_rows();
        let mut next = 0;
        while next < end {
            let mut rows = table.export_rows(next, rows_per_file, columns);
            next = rows.next;
            if rows.keys.is_empty() {
                continue;
            }
            rows.slots.truncate(slot_names.len());
            let rows = FileRows {
                keys: rows.keys,
                values: rows.values,
                slots: rows.slots,
                scores: policy.map(|_| rows.scores),
            };
            writer.write(shard, &rows)?;
        }
    }
    let admission = match variable.admitter() {
        Some(admitter) => Some(admission::write(&mut writer, admitter, codec)?),
        None => None,
    };
    writer.finish(Manifest {
        format: FORMAT.to_string(),
        version: VERSION,
        name: variable.name().to_string(),
        key_type: K::TYPE_NAME.to_string(),
        dim,
        shards: variable.num_shards(),
        slots,
        scores: policy.map(|p| p.name().to_string()),
        value_dtype: dtypes.values,
        slot_dtype: dtypes.slots,
        rows_per_file,
        rows: 0,
        files: Vec::new(),
        admission,
    })
}

/// Puts the finished `staging` directory at the checkpoint's place; the
/// previous checkpoint, if any, ends up at `staging`. Runs under the
/// publishing locks.
///
/// The swap is one atomic exchange where the file system has it. Where it
/// does not (`EINVAL`, `ENOSYS`, `EOPNOTSUPP`: NFS, CIFS, many FUSE file
/// systems, and everything but Linux), the old directory is renamed to
/// `.name.dynemb-previous`, the new one into place, and the old one to
/// `staging`; a crash between the first two renames leaves no directory at
/// `name`, and a restore then reads `.name.dynemb-previous`. Any other
/// failure of the exchange is an error that moved nothing.
fn publish(place: &Place, staging: &Path) -> Result<()> {
    let dir = &place.dir;
    if !dir.exists() {
        return fs::rename(staging, dir).map_err(|e| io_error(dir, &e));
    }
    match exchange_dirs(staging, dir) {
        Ok(()) => return Ok(()),
        Err(e) if !exchange_unsupported(&e) => return Err(io_error(dir, &e)),
        Err(_) => {}
    }
    let previous = place.sibling("previous");
    // A checkpoint is at `dir`, so a `previous` left by a crash is older.
    place::remove_dir(&previous)?;
    fs::rename(dir, &previous).map_err(|e| io_error(dir, &e))?;
    if let Err(e) = fs::rename(staging, dir) {
        let _ = fs::rename(&previous, dir);
        return Err(io_error(dir, &e));
    }
    // Left at `previous` if this fails: harmless once `dir` exists.
    let _ = fs::rename(&previous, staging);
    Ok(())
}

/// Whether an exchange failed because the file system cannot exchange.
fn exchange_unsupported(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::Unsupported
        || matches!(
            error.raw_os_error(),
            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
        )
}

/// Reads `index.json` from `dir` and checks that it holds a table of keys
/// `K` and rows of `dim` values (`name` is the reader's, for errors).
fn read_manifest<K: Key>(dir: &Path, name: &str, dim: usize) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    let bytes = match files::read_bounded(&path, MAX_MANIFEST_BYTES) {
        Err(Error::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        }) => return Err(corrupt(dir, "no checkpoint here (index.json is missing)")),
        read => read?,
    };
    let manifest = Manifest::parse(&path, &bytes)?;
    manifest.check_fits(dir, name, K::TYPE_NAME, dim)?;
    Ok(manifest)
}

/// Checks that the checkpoint's slot columns and scores fit `variable`: a
/// slot it shares has the same initial value, there is room for the slots
/// it lacks, and saved scores follow the variable's restrict policy (if it
/// has one).
fn check_columns_fit<K: Key>(
    variable: &Variable<K>,
    dir: &Path,
    manifest: &Manifest,
) -> Result<()> {
    let mismatch = |existing: String, requested: String| Error::Mismatch {
        name: variable.name().to_string(),
        existing,
        requested,
    };
    let mut new_slots = 0;
    let slot_dtype = variable.slot_dtype();
    for slot in &manifest.slots {
        if !slot_dtype.fits_initial(slot.initial) {
            return Err(Error::OutOfRange {
                what: "checkpoint slot initial value",
                index: 0,
                value: slot.initial,
                dtype: slot_dtype,
            });
        }
        match variable.slot_id(&slot.name) {
            Ok(id) => {
                let initial = variable.slot_initial(id)?;
                if initial != slot_dtype.round(slot.initial) {
                    return Err(mismatch(
                        format!("slot {} with initial value {initial}", slot.name),
                        format!(
                            "checkpoint {} with initial value {}",
                            dir.display(),
                            slot.initial
                        ),
                    ));
                }
            }
            Err(_) => new_slots += 1,
        }
    }
    let total = variable.slot_names().len() + new_slots;
    if total > MAX_SLOTS {
        return Err(Error::InvalidArgument(format!(
            "variable {:?} would have {total} slot columns with those of checkpoint {}; at most {MAX_SLOTS}",
            variable.name(),
            dir.display()
        )));
    }
    match (manifest.policy(), variable.restrict_policy()) {
        (Some(saved), Some(own)) if saved != own => Err(mismatch(
            format!("restrict policy {}", own.name()),
            format!("checkpoint {} with {} scores", dir.display(), saved.name()),
        )),
        _ => Ok(()),
    }
}

/// Calls `rows(file_rows)` for every data file, each read and verified.
fn for_each_file(
    dir: &Path,
    manifest: &Manifest,
    codec: KeyCodec,
    mut rows: impl FnMut(FileRows) -> Result<()>,
) -> Result<()> {
    let slot_names: Vec<String> = manifest.slots.iter().map(|s| s.name.clone()).collect();
    let max_bytes = files::max_file_bytes(
        manifest.dim,
        codec,
        slot_names.len(),
        manifest.scores.is_some(),
    );
    let dtypes = FloatDtypes {
        values: manifest.value_dtype,
        slots: manifest.slot_dtype,
    };
    for entry in &manifest.files {
        rows(files::read_verified(
            dir,
            entry,
            codec,
            dtypes,
            manifest.dim,
            &slot_names,
            manifest.scores.is_some(),
            max_bytes,
        )?)?;
    }
    Ok(())
}

/// A checkpoint opened for restoring or loading: its manifest, checked
/// with every file against the variable, and the shared lock that keeps a
/// save from replacing those files until the rows are applied.
#[derive(Debug)]
pub(crate) struct Verified {
    dir: PathBuf,
    manifest: Manifest,
    _lock: Option<CheckpointLock>,
}

/// Checks that no two manifest entries are the same file (hard links):
/// each file's rows are real bytes on disk, so what a restore reserves and
/// reads is bounded by the checkpoint's size.
fn check_distinct_files(dir: &Path, manifest: &Manifest) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashMap::new();
    for entry in &manifest.files {
        let path = dir.join(&entry.file);
        let meta = fs::metadata(&path).map_err(|e| io_error(&path, &e))?;
        if let Some(other) = seen.insert((meta.dev(), meta.ino()), &entry.file) {
            return Err(corrupt(
                &path,
                format!("is the same file as {other} (a hard link)"),
            ));
        }
    }
    Ok(())
}

/// Timestamps further ahead of the local clock than this are refused: a
/// score that far ahead is corrupt, or written by a clock too wrong to
/// trust. Those within it are applied as the current time
/// ([`clamp_to_clock`]).
const MAX_CLOCK_AHEAD_NS: u64 = 24 * 3600 * 1_000_000_000;

/// Locks the checkpoint at `dir` against saves and reads and checks all of
/// it against `variable` (manifest, every file's size, checksum, tensors and
/// values, every key's shard under the variable's partitioner, timestamps
/// at most a day ahead of the clock) without changing anything.
pub(crate) fn verify<K: Key>(variable: &Variable<K>, dir: &Path) -> Result<Verified> {
    verify_with::<K>(
        dir,
        variable.name(),
        variable.dim(),
        |dir, manifest| {
            check_columns_fit(variable, dir, manifest)?;
            admission::check_fits(variable.name(), variable.admitter(), dir, manifest)
        },
        |rows| {
            crate::checks::check_fits("checkpoint values", &rows.values, variable.value_dtype())?;
            for slot in &rows.slots {
                crate::checks::check_fits("checkpoint slot rows", slot, variable.slot_dtype())?;
            }
            let shards = variable.num_shards();
            for &bits in &rows.keys {
                variable
                    .partitioner()
                    .shard_of(K::from_bits(bits), shards)?;
            }
            Ok(())
        },
    )
    .and_then(|verified| {
        admission::verify(
            &verified.dir,
            &verified.manifest,
            variable.admitter(),
            KeyCodec::for_type(K::TYPE_NAME),
        )?;
        Ok(verified)
    })
}

/// Locks the checkpoint at `dir` against saves and reads and checks all of
/// it for a table called `name` with keys `K` and rows of `dim` values:
/// the manifest (and `check_manifest`), every file's size, checksum,
/// tensors and values (and `check_rows`), timestamps not ahead of the
/// clock. Changes nothing.
fn verify_with<K: Key>(
    dir: &Path,
    name: &str,
    dim: usize,
    check_manifest: impl FnOnce(&Path, &Manifest) -> Result<()>,
    mut check_rows: impl FnMut(&FileRows) -> Result<()>,
) -> Result<Verified> {
    let place = Place::for_read(dir)?;
    let previous = place.sibling("previous");
    // No lock file is made beside a path that holds no checkpoint.
    let lock = if place.dir.is_dir() || previous.is_dir() {
        lock::reading(&place)?
    } else {
        None
    };
    // A publish without an atomic exchange that crashed half-way left the
    // last checkpoint at `previous` (see `publish`).
    let dir = if !place.dir.exists() && previous.is_dir() {
        previous
    } else {
        place.dir.clone()
    };
    let manifest = read_manifest::<K>(&dir, name, dim)?;
    check_manifest(&dir, &manifest)?;
    check_distinct_files(&dir, &manifest)?;
    let codec = KeyCodec::for_type(K::TYPE_NAME);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let latest = now.saturating_add(MAX_CLOCK_AHEAD_NS);
    let timestamps = manifest.policy() == Some(RestrictPolicy::Timestamp);
    for_each_file(&dir, &manifest, codec, |rows| {
        check_rows(&rows)?;
        match rows.scores.as_deref() {
            Some(scores) if timestamps => match scores.iter().position(|&s| s > latest) {
                Some(i) => Err(corrupt(
                    &dir,
                    format!("timestamp score {} of key {:?} is more than a day ahead of this machine's clock", scores[i], K::from_bits(rows.keys[i])),
                )),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    })?;
    Ok(Verified {
        dir,
        manifest,
        _lock: lock,
    })
}

/// Inserts the rows of the `verified` checkpoint into `variable`, clearing
/// it first when `replace`. The files are read again (the lock keeps
/// dynemb's saves from replacing them) and checked again as they are read.
pub(crate) fn apply<K: Key>(
    variable: &Variable<K>,
    verified: &Verified,
    replace: bool,
) -> Result<()> {
    let (dir, manifest) = (&verified.dir, &verified.manifest);
    let slot_ids = manifest
        .slots
        .iter()
        .map(|slot| variable.create_slot(&slot.name, slot.initial))
        .collect::<Result<Vec<_>>>()?;
    let restore_scores =
        manifest.policy().is_some() && manifest.policy() == variable.restrict_policy();
    if replace {
        variable.clear();
    }
    // Room for the rows up front (spread evenly: a guess under a custom
    // partitioner, which growth corrects).
    let per_shard = usize::try_from(manifest.rows).unwrap_or(usize::MAX) / variable.num_shards();
    for table in variable.shards() {
        table.reserve(per_shard);
    }
    let codec = KeyCodec::for_type(K::TYPE_NAME);
    for_each_file(dir, manifest, codec, |mut rows| {
        if let (Some(RestrictPolicy::Timestamp), true, Some(scores)) = (
            variable.restrict_policy(),
            restore_scores,
            rows.scores.as_deref_mut(),
        ) {
            clamp_to_clock(scores);
        }
        let keys: Vec<K> = rows.keys.into_iter().map(K::from_bits).collect();
        let slots: Vec<(usize, &[f32])> = slot_ids
            .iter()
            .zip(&rows.slots)
            .map(|(id, rows)| (id.index(), rows.as_slice()))
            .collect();
        let scores = rows.scores.as_deref().filter(|_| restore_scores);
        variable.upsert_rows(&keys, &rows.values, &slots, scores)
    })?;
    admission::apply(
        dir,
        manifest,
        variable.admitter(),
        KeyCodec::for_type(K::TYPE_NAME),
        replace,
    )
}

/// `restore` (`replace`) or `load` of the checkpoint at `dir`: verified
/// whole, then applied under the same lock.
pub(crate) fn read_into<K: Key>(variable: &Variable<K>, dir: &Path, replace: bool) -> Result<()> {
    let verified = verify(variable, dir)?;
    apply(variable, &verified, replace)
}
