//! The server thread: a serving replica that restores the checkpoints
//! *while* the checkpoint thread saves new ones to the same directories.
//!
//! dynemb coordinates saves and restores of one directory through a lock
//! file: a restore keeps every save from publishing until it has applied the
//! files it verified, and every published checkpoint is whole. So a restore
//! started during a save reads one whole checkpoint, the previous one or
//! the new one. The server waits until a save is running, restores into
//! variables of its own, and checks:
//!
//! - ledger ([`check_ledger`]): the marker keys (one per shard, set to the
//!   round number before each save) all read the same round `r` (no mix of
//!   files from two saves), `r` is a round that was saved, and every row lies
//!   between the books' `done` before save `r` started and their `started`
//!   after this restore returned, with its slot of the same version;
//! - main ([`check_restored_main`]): every row a valid pair of its key with
//!   a non-zero score, no key twice, sizes equal to the export.
//!
//! Every restore must return `Ok` (the first round's save is published
//! before the server starts).

use crate::checkpoints::{
    self, check_ledger, check_restored_main, Restored, SAVING_LEDGER, SAVING_MAIN,
};
use crate::shared::Shared;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Waits until `saving` is `what` and a save of that kind has already been
/// published once; false if the server is stopped first.
fn wait_for_save(shared: &Shared, restored: &Restored, what: u8) -> bool {
    let book = &restored.book;
    loop {
        if shared.stop_server.load(Ordering::Relaxed) {
            return false;
        }
        let published = match what {
            SAVING_LEDGER => book.ledger_published.load(Ordering::SeqCst),
            _ => book.main_published.load(Ordering::SeqCst),
        };
        if published > 0 && book.saving.load(Ordering::SeqCst) == what {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Restores every checkpoint it can while it is being overwritten, until
/// `stop_server` is set.
pub fn run(shared: &Shared, restored: &Restored) {
    let main = checkpoints::main_like(shared, "soak_main_served", 2);
    let ledger = checkpoints::ledger_like(shared, "soak_ledger_served", 1);
    let (main_dir, ledger_dir) = (restored.main_dir(), restored.ledger_dir());
    loop {
        if !wait_for_save(shared, restored, SAVING_LEDGER) {
            return;
        }
        let started = Instant::now();
        shared.ok(
            format!(
                "server: ledger restore of {} during a save",
                ledger_dir.display()
            ),
            ledger.restore(&ledger_dir),
        );
        shared.stats.served_ledger_restores.add(started.elapsed());
        let hi = shared.ledger.started_now();
        let round = check_ledger(shared, &ledger, &ledger_dir, &restored.book, None, &hi);
        shared.stats.served_round.store(round, Ordering::Relaxed);

        if !wait_for_save(shared, restored, SAVING_MAIN) {
            return;
        }
        let started = Instant::now();
        shared.ok(
            format!(
                "server: main restore of {} during a save",
                main_dir.display()
            ),
            main.restore(&main_dir),
        );
        shared.stats.served_restores.add(started.elapsed());
        check_restored_main(shared, &main, &main_dir, "a restore during a save");
    }
}
