//! Where a checkpoint lives on disk, and the hidden names beside it that
//! saves use.
//!
//! A checkpoint at `parent/name` has these siblings, all reserved:
//! - `.name.dynemb-lock` and `.name.dynemb-queue`: the lock files (see
//!   [`super::lock`]), kept;
//! - `.name.dynemb-saving-<pid>-<n>-<random>`: one staging directory per
//!   save in flight (unique across processes, containers and hosts sharing
//!   the directory), each locked by its save for as long as it exists; one
//!   that nobody holds locked is left over from a killed save and is removed
//!   by the next save (best effort: one that cannot be removed is left);
//! - `.name.dynemb-previous`: only on file systems without an atomic
//!   directory exchange, the old checkpoint between the two renames of a
//!   publish; a restore that finds no checkpoint at `name` reads it there.
//!
//! Paths are taken as the user gives them, then made exact: an existing
//! path is resolved through symlinks (a symlink to a checkpoint directory
//! keeps pointing at it; the directory it points to is replaced), and a
//! missing one gets its parent created and resolved. A save never replaces
//! something that is not a checkpoint: a regular file, a dangling symlink,
//! the current working directory, or a directory holding anything but
//! `index.json`, `shard-*.safetensors` and `admission-*.safetensors`
//! files (another variable's checkpoint nested inside, the user's own
//! files), is an [`Error::InvalidArgument`] before anything is written.

use super::io_error;
use super::manifest::MANIFEST;
use crate::{Error, Result};
use std::collections::hash_map::RandomState;
use std::fs::{self, File};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The marker every reserved sibling name carries after its leading `.`.
const RESERVED: &str = ".dynemb-";

/// Numbers the staging directories of one process's saves.
static NEXT_STAGING: AtomicU64 = AtomicU64::new(0);

/// A checkpoint directory's exact location.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    /// The checkpoint directory itself (absolute, symlinks resolved).
    pub dir: PathBuf,
    /// Its parent directory.
    parent: PathBuf,
    /// Its final component.
    name: String,
}

/// A save's staging directory, locked for as long as this value lives.
#[derive(Debug)]
pub(crate) struct Staging {
    /// The directory.
    pub path: PathBuf,
    /// The open directory holding its lock (`None` where directories cannot
    /// be locked).
    _lock: Option<File>,
}

/// Whether `name` is a reserved sibling name (`.x.dynemb-...`).
pub(crate) fn is_reserved(name: &str) -> bool {
    name.starts_with('.') && name.contains(RESERVED)
}

/// Whether a directory entry called `name` belongs in a checkpoint.
fn is_checkpoint_file(name: &str) -> bool {
    name == MANIFEST
        || ((name.starts_with("shard-") || name.starts_with("admission-"))
            && name.ends_with(".safetensors"))
}

impl Place {
    /// The place of a checkpoint to read. A missing path is used as given.
    pub(crate) fn for_read(dir: &Path) -> Result<Place> {
        let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        Place::at(&dir)
    }

    /// The place of a checkpoint to write: refuses a path that is not a
    /// directory or holds more than a checkpoint, or whose name is
    /// reserved, and creates a missing parent.
    pub(crate) fn for_save(dir: &Path) -> Result<Place> {
        let place = match fs::canonicalize(dir) {
            Ok(resolved) => Place::at(&resolved)?,
            Err(_) => {
                let given = Place::at(dir)?;
                fs::create_dir_all(&given.parent).map_err(|e| io_error(&given.parent, &e))?;
                let parent =
                    fs::canonicalize(&given.parent).map_err(|e| io_error(&given.parent, &e))?;
                Place::at(&parent.join(&given.name))?
            }
        };
        if std::env::current_dir().is_ok_and(|cwd| cwd == place.dir) {
            return Err(Error::InvalidArgument(format!(
                "checkpoint path {} is the current working directory, which a save would replace",
                dir.display()
            )));
        }
        if is_reserved(&place.name) {
            return Err(Error::InvalidArgument(format!(
                "checkpoint path {}: names like .x{RESERVED}... are reserved for staging and lock files",
                dir.display()
            )));
        }
        place.check_replaceable()?;
        Ok(place)
    }

    /// `dir` split into parent and name, as given.
    fn at(dir: &Path) -> Result<Place> {
        let no_name = || {
            Error::InvalidArgument(format!(
                "checkpoint path {} has no final directory name",
                dir.display()
            ))
        };
        let name = dir
            .file_name()
            .ok_or_else(no_name)?
            .to_str()
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "checkpoint path {} is not valid UTF-8",
                    dir.display()
                ))
            })?
            .to_string();
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Place {
            dir: dir.to_path_buf(),
            parent,
            name,
        })
    }

    /// Checks that a save may replace what is at the checkpoint path:
    /// nothing, or a directory holding only checkpoint files.
    pub(crate) fn check_replaceable(&self) -> Result<()> {
        let refuse = |what: String| {
            Err(Error::InvalidArgument(format!(
                "checkpoint path {} {what}; a save replaces only a checkpoint directory",
                self.dir.display()
            )))
        };
        let meta = match fs::symlink_metadata(&self.dir) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(&self.dir, &e)),
        };
        if !meta.is_dir() {
            return refuse("exists and is not a directory (or is a dangling symlink)".to_string());
        }
        let entries = fs::read_dir(&self.dir).map_err(|e| io_error(&self.dir, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_error(&self.dir, &e))?;
            let name = entry.file_name();
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            match name.to_str() {
                Some(name) if is_file && is_checkpoint_file(name) => {}
                _ => {
                    return refuse(format!(
                        "holds {:?}, which is not part of a checkpoint",
                        name
                    ))
                }
            }
        }
        Ok(())
    }

    /// The sibling called `.name.dynemb-<role>`.
    pub(crate) fn sibling(&self, role: &str) -> PathBuf {
        self.parent.join(format!(".{}{RESERVED}{role}", self.name))
    }

    /// Creates and locks a new staging directory for one save.
    pub(crate) fn create_staging(&self) -> Result<Staging> {
        let n = NEXT_STAGING.fetch_add(1, Ordering::Relaxed);
        // The pid is unique only within a pid namespace: a random part keeps
        // containers and hosts sharing the directory apart.
        let random = RandomState::new().hash_one((n, std::time::SystemTime::now()));
        let path = self.sibling(&format!("saving-{}-{n}-{random:016x}", std::process::id()));
        fs::create_dir(&path).map_err(|e| io_error(&path, &e))?;
        let lock = File::open(&path).ok().filter(|dir| dir.try_lock().is_ok());
        Ok(Staging { path, _lock: lock })
    }

    /// Removes the staging directories that no save holds: left over from
    /// saves that were killed or failed to clean up. Best effort: one that
    /// cannot be removed is left for a later save.
    pub(crate) fn remove_abandoned_staging(&self) {
        let prefix = format!(".{}{RESERVED}saving-", self.name);
        let Ok(entries) = fs::read_dir(&self.parent) else {
            return;
        };
        for entry in entries.flatten() {
            let is_staging = entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.starts_with(&prefix));
            if !is_staging || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            let abandoned = File::open(&path).is_ok_and(|dir| dir.try_lock().is_ok());
            if abandoned {
                let _ = fs::remove_dir_all(&path);
            }
        }
    }

    /// Flushes the parent's entries (the publish's renames) to disk.
    pub(crate) fn sync_parent(&self) -> Result<()> {
        super::sync_dir(&self.parent)
    }
}

/// Removes a directory tree; one already gone is fine.
pub(crate) fn remove_dir(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error(path, &e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_are_the_hidden_dynemb_siblings() {
        assert!(is_reserved(".ckpt.dynemb-lock"));
        assert!(is_reserved(".ckpt.dynemb-saving-12-3"));
        assert!(!is_reserved("ckpt.dynemb-lock"));
        assert!(!is_reserved(".ckpt"));
    }

    #[test]
    fn only_index_and_shard_files_belong_in_a_checkpoint() {
        assert!(is_checkpoint_file("index.json"));
        assert!(is_checkpoint_file("shard-00000-00001.safetensors"));
        assert!(is_checkpoint_file("admission-00000.safetensors"));
        assert!(!is_checkpoint_file("notes.txt"));
        assert!(!is_checkpoint_file("b"));
    }
}
