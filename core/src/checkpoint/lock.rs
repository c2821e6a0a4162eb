//! Who may touch a checkpoint directory when: advisory locks on two files
//! beside it (see [`super::place`]), `.name.dynemb-lock` (the *checkpoint
//! lock*) and `.name.dynemb-queue` (the *queue lock*).
//!
//! - A restore or load holds the checkpoint lock shared from the moment it
//!   opens the checkpoint until it has applied the last row, so the bytes it
//!   applies are the bytes it verified: no save can swap the directory in
//!   between. It passes through the queue lock (shared, for an instant)
//!   before taking it.
//! - A save takes the queue lock exclusively, briefly, to remove abandoned
//!   staging directories and create its own (restores hold nothing that
//!   delays this), writes its files holding no lock, then takes the queue
//!   lock exclusively again and, holding it, the checkpoint lock exclusively
//!   to swap its directory into place. While it waits for the restores in
//!   progress, new ones queue behind it: a stream of overlapping restores
//!   cannot starve a save. Saves run alongside restores and each other;
//!   only their publishing is serialized (the last to publish wins, and
//!   every published checkpoint is whole).
//!
//! The locks are `flock`-style (`File::lock`): they exclude other threads
//! of this process as well as other processes, and die with their holder,
//! so a killed process never leaves a checkpoint locked. Waits interrupted
//! by a signal are resumed. The lock files are opened without following
//! symlinks, and a restore opens them read-only (a shared lock needs no
//! write access: a server reading through a read-only mount, or as another
//! user, still excludes the trainer's saves). A restore goes ahead unlocked
//! only where no lock file exists and none can be created (a read-only
//! checkpoint that no save has ever written through dynemb's locks), or
//! where the file system does not support locks; a lock file that exists
//! but cannot be locked is an error.

use super::io_error;
use super::place::Place;
use crate::Result;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A held lock; released when dropped.
#[derive(Debug)]
pub(crate) struct CheckpointLock {
    _file: Option<File>,
}

/// How a lock is taken.
#[derive(Clone, Copy)]
enum Mode {
    Shared,
    Exclusive,
}

/// Opens the lock file at `path`, creating it if `create`, never through a
/// symlink.
fn open(path: &Path, create: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(create)
        .create(create)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Locks `file` in `mode`, resuming a wait a signal interrupted. `Ok(false)`
/// where the file system has no locks.
fn lock(file: &File, mode: Mode) -> std::io::Result<bool> {
    loop {
        let result = match mode {
            Mode::Shared => file.lock_shared(),
            Mode::Exclusive => file.lock(),
        };
        match result {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::Unsupported => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

/// Takes the lock file `role` of `place` in `mode`, creating the file.
fn take(place: &Place, role: &str, mode: Mode) -> Result<CheckpointLock> {
    let path = place.sibling(role);
    let file = open(&path, true).map_err(|e| io_error(&path, &e))?;
    let locked = lock(&file, mode).map_err(|e| io_error(&path, &e))?;
    Ok(CheckpointLock {
        _file: locked.then_some(file),
    })
}

/// Takes the lock file `role` of `place` shared, for reading: read-only if
/// it exists, created if it does not and can be; `None` if it neither
/// exists nor can be created.
fn take_for_reading(place: &Place, role: &str) -> Result<Option<CheckpointLock>> {
    let path = place.sibling(role);
    let file = match open(&path, false) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => match open(&path, true) {
            Ok(file) => file,
            Err(_) => return Ok(None),
        },
        Err(e) => return Err(io_error(&path, &e)),
    };
    let locked = lock(&file, Mode::Shared).map_err(|e| io_error(&path, &e))?;
    Ok(Some(CheckpointLock {
        _file: locked.then_some(file),
    }))
}

/// For a save's first step: the queue lock, exclusively (abandoned staging
/// directories are removed and new ones created under it).
pub(crate) fn staging(place: &Place) -> Result<CheckpointLock> {
    take(place, "queue", Mode::Exclusive)
}

/// For a save's publish: the queue lock and then the checkpoint lock,
/// exclusively, both held until dropped.
pub(crate) fn publishing(place: &Place) -> Result<(CheckpointLock, CheckpointLock)> {
    let queue = take(place, "queue", Mode::Exclusive)?;
    let checkpoint = take(place, "lock", Mode::Exclusive)?;
    Ok((queue, checkpoint))
}

/// For a restore or load: the checkpoint lock, shared, taken after queueing
/// behind any save waiting to publish; `None` where no lock file exists or
/// can be made.
pub(crate) fn reading(place: &Place) -> Result<Option<CheckpointLock>> {
    let queued = take_for_reading(place, "queue")?;
    let lock = take_for_reading(place, "lock")?;
    drop(queued);
    Ok(lock)
}
