//! Checkpoints: saving a variable to a directory and reading it back.
//!
//! # Format
//!
//! A checkpoint is a directory holding `index.json` (format version, the
//! variable's name, key type, dim and shard count, slot names, rows per file,
//! and each file's shard, row count, size and CRC-32) and data files named
//! `shard-SSSSS-PPPPP.safetensors`, each with a `keys` tensor (the key type's
//! dtype, `[rows]`) and a `values` tensor (`F32`, `[rows, dim]`). A file holds
//! at most `rows_per_file` rows (about 16 MiB), so saving and loading need
//! memory for one file at a time, never for the whole table. Python reads it
//! with `safetensors` and numpy (see the README).
//!
//! # Crash safety
//!
//! `save(dir)` writes everything into the sibling directory
//! `.<name>.dynemb-saving`, fsyncs every file and the directory, and only then
//! puts it in place: on Linux by atomically exchanging it with the old `dir`
//! (`renameat2(RENAME_EXCHANGE)`) and deleting the old one afterwards, so a
//! save killed at any moment leaves either the previous checkpoint or the new
//! one at `dir`, complete. Elsewhere the old directory is first renamed aside,
//! which leaves a short window with no checkpoint at `dir` (the previous one is
//! then at `.<name>.dynemb-previous`). A leftover staging directory from a
//! killed save is removed by the next save. One process saves to a given
//! directory at a time.
//!
//! # What a save captures
//!
//! Saving runs while other threads train. Every row written is consistent (one
//! version of its values, never a torn mix), and every key present for the
//! whole save is written exactly once. Keys inserted or removed during the
//! save may or may not be in it, and a key removed and re-inserted during the
//! save may be written twice (loading keeps the later file's row): it is not a
//! point-in-time snapshot of the whole table.
//!
//! # Restore and load
//!
//! Both first read and check the whole checkpoint (index, sizes, checksums,
//! tensor names, dtypes and shapes, key type and dim against the variable,
//! finite values) and return an error before touching the variable if
//! anything is wrong. Then `restore` clears the variable and inserts the
//! saved rows (all or nothing with respect to a bad checkpoint; other threads
//! writing meanwhile see the table being refilled), while `load` upserts them
//! into what is there. Rows go through the variable's partitioner, so a
//! checkpoint saved with any shard count loads into any other.

mod files;
mod manifest;

use crate::raw::fs::exchange_dirs;
use crate::{Error, Key, Result, Variable};
use files::KeyCodec;
use manifest::{corrupt, FileEntry, Manifest, FORMAT, MANIFEST, VERSION};
use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

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

/// `dir`'s sibling with the given role (`saving`, `previous`).
fn sibling(dir: &Path, role: &str) -> Result<PathBuf> {
    let name = dir.file_name().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "checkpoint path {} has no final directory name",
            dir.display()
        ))
    })?;
    Ok(dir.with_file_name(format!(".{}.dynemb-{role}", name.to_string_lossy())))
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
    let staging = sibling(dir, "saving")?;
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| io_error(&staging, &e))?;
    }
    fs::create_dir_all(&staging).map_err(|e| io_error(&staging, &e))?;
    let dim = variable.dim();
    let codec = KeyCodec::for_type(K::TYPE_NAME);
    let rows_per_file = files::rows_per_file(dim, codec);
    let mut entries = Vec::new();
    // Files are flushed a few behind the one being written, so the disk
    // writes back while the next is encoded (and few files are open at once).
    let mut written = VecDeque::new();
    for (shard, table) in variable.shards().iter().enumerate() {
        let end = table.end_of_rows();
        let mut next = 0;
        while next < end {
            let (keys, values, after) = table.export_range(next, rows_per_file, true);
            next = after;
            if keys.is_empty() {
                continue;
            }
            let file = format!("shard-{shard:05}-{:05}.safetensors", entries.len());
            let bytes = files::encode(codec, &keys, &values, dim);
            let path = staging.join(&file);
            written.push_back((write_file(&path, &bytes)?, path));
            if written.len() > UNSYNCED_FILES {
                let (file, path) = written.pop_front().expect("more than zero");
                sync_file(&path, &file)?;
            }
            entries.push(FileEntry {
                file,
                shard,
                rows: keys.len(),
                bytes: bytes.len() as u64,
                crc32: crc32fast::hash(&bytes),
            });
        }
    }
    let manifest = Manifest {
        format: FORMAT.to_string(),
        version: VERSION,
        name: variable.name().to_string(),
        key_type: K::TYPE_NAME.to_string(),
        dim,
        shards: variable.num_shards(),
        slots: Vec::new(),
        scores: false,
        rows_per_file,
        rows: entries.iter().map(|e| e.rows as u64).sum(),
        files: entries,
    };
    let json = serde_json::to_vec_pretty(&manifest).expect("a manifest always serializes");
    let path = staging.join(MANIFEST);
    written.push_back((write_file(&path, &json)?, path));
    for (file, path) in &written {
        sync_file(path, file)?;
    }
    sync_dir(&staging)?;
    publish(&staging, dir)
}

/// Puts the finished `staging` directory at `dir`, replacing what was there.
fn publish(staging: &Path, dir: &Path) -> Result<()> {
    if !dir.exists() {
        fs::rename(staging, dir).map_err(|e| io_error(dir, &e))?;
    } else if exchange_dirs(staging, dir).is_ok() {
        // `staging` now holds the previous checkpoint.
        fs::remove_dir_all(staging).map_err(|e| io_error(staging, &e))?;
    } else {
        let previous = sibling(dir, "previous")?;
        if previous.exists() {
            fs::remove_dir_all(&previous).map_err(|e| io_error(&previous, &e))?;
        }
        fs::rename(dir, &previous).map_err(|e| io_error(dir, &e))?;
        fs::rename(staging, dir).map_err(|e| io_error(dir, &e))?;
        fs::remove_dir_all(&previous).map_err(|e| io_error(&previous, &e))?;
    }
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => sync_dir(Path::new(".")),
    }
}

/// Reads `index.json` from `dir` and checks that it fits `variable`.
fn read_manifest<K: Key>(variable: &Variable<K>, dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(corrupt(dir, "no checkpoint here (index.json is missing)"))
        }
        Err(e) => return Err(io_error(&path, &e)),
    };
    let manifest = Manifest::parse(&path, &bytes)?;
    manifest.check_fits(dir, variable.name(), K::TYPE_NAME, variable.dim())?;
    Ok(manifest)
}

/// Calls `rows(keys, values)` for every data file, each read and verified.
fn for_each_file(
    dir: &Path,
    manifest: &Manifest,
    codec: KeyCodec,
    mut rows: impl FnMut(Vec<u64>, Vec<f32>) -> Result<()>,
) -> Result<()> {
    for entry in &manifest.files {
        let (keys, values) = files::read_verified(dir, entry, codec, manifest.dim)?;
        rows(keys, values)?;
    }
    Ok(())
}

/// Reads and checks the whole checkpoint at `dir` against `variable`
/// (manifest, every file's size, checksum, tensors and values) without
/// changing anything.
pub(crate) fn verify<K: Key>(variable: &Variable<K>, dir: &Path) -> Result<()> {
    let manifest = read_manifest(variable, dir)?;
    for_each_file(dir, &manifest, KeyCodec::for_type(K::TYPE_NAME), |_, _| {
        Ok(())
    })
}

/// Inserts the rows of the checkpoint at `dir` into `variable`, clearing it
/// first when `replace`. Every file is checked again as it is read; callers
/// run [`verify`] first so that a bad checkpoint changes nothing.
pub(crate) fn apply<K: Key>(variable: &Variable<K>, dir: &Path, replace: bool) -> Result<()> {
    let manifest = read_manifest(variable, dir)?;
    if replace {
        variable.clear();
    }
    // Room for the rows up front (spread evenly: a guess under a custom
    // partitioner, which growth corrects).
    let per_shard = manifest.rows as usize / variable.num_shards().max(1);
    for table in variable.shards() {
        table.reserve(per_shard);
    }
    for_each_file(
        dir,
        &manifest,
        KeyCodec::for_type(K::TYPE_NAME),
        |bits, values| {
            let keys: Vec<K> = bits.into_iter().map(K::from_bits).collect();
            variable.upsert(&keys, &values)
        },
    )
}
