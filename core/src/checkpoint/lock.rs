//! Who may touch a checkpoint directory when: an advisory lock per
//! checkpoint, held on its sibling lock file `.name.dynemb-lock` (see
//! [`super::place`]).
//!
//! - A restore or load holds it shared from the moment it opens the
//!   checkpoint until it has applied the last row, so the bytes it applies
//!   are the bytes it verified: no save can swap the directory in between.
//! - A save holds it exclusively twice, briefly: to remove abandoned staging
//!   directories and create its own, and to swap its finished directory into
//!   place. It writes its files without it, so saves run alongside restores
//!   and each other and only their publishing is serialized (the last to
//!   publish wins; every published checkpoint is complete).
//!
//! The lock is `flock`-style (`File::lock`): it excludes other threads of
//! this process as well as other processes, and dies with its holder, so a
//! killed process never leaves a checkpoint locked. Where the lock file
//! cannot be created for reading (a read-only checkpoint: nothing can save
//! there either) or the file system does not support locks, a restore goes
//! ahead unlocked.

use super::io_error;
use super::place::Place;
use crate::Result;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;

/// A held checkpoint lock; released when dropped.
#[derive(Debug)]
pub(crate) struct CheckpointLock {
    _file: Option<File>,
}

/// Opens (creating) the lock file of `place`.
fn open(place: &Place) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(place.sibling("lock"))
}

/// Takes `place`'s lock exclusively, waiting for holders to finish.
pub(crate) fn exclusive(place: &Place) -> Result<CheckpointLock> {
    let path = place.sibling("lock");
    let file = open(place).map_err(|e| io_error(&path, &e))?;
    match file.lock() {
        Ok(()) => Ok(CheckpointLock { _file: Some(file) }),
        Err(e) if e.kind() == ErrorKind::Unsupported => Ok(CheckpointLock { _file: None }),
        Err(e) => Err(io_error(&path, &e)),
    }
}

/// Takes `place`'s lock shared, waiting for an exclusive holder to finish;
/// goes ahead unlocked where the lock file cannot be created or locked.
pub(crate) fn shared(place: &Place) -> CheckpointLock {
    let file = open(place).ok().filter(|file| file.lock_shared().is_ok());
    CheckpointLock { _file: file }
}
