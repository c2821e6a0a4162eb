//! Checkpoint rounds: save both variables while the workers train, restore
//! each checkpoint into a second variable, check every restored row, then
//! load the main checkpoint on top of its restore.
//!
//! A round `r` (numbered from 1):
//! 1. ledger: set the marker keys to `r`, record the books' `done` as
//!    `lo[r]`, save the ledger to `<dir>/ledger`, copy `started` (`hi`);
//!    restore into a second ledger variable and check it ([`check_ledger`]):
//!    every marker reads `r` (the restore read exactly this save, every file
//!    of it), every key is a ledger key, every row is uniform, `lo[r][j] <=
//!    value <= hi[j]`, the slot is `2 * value` (update keys) or 0 (accum
//!    keys), every key present before the save (accum keys, update keys with
//!    `lo > 0`) is there and no update key never inserted (`hi == 0`) is;
//! 2. main: on every other round ("strict"), take the removal gate
//!    exclusively (no `remove` or `restrict` until the save ends) and export
//!    the main variable's keys: all present from then to the end of the save;
//!    save to `<dir>/main`; restore into a second variable of another shard
//!    count and check it ([`check_restored_main`]): every row is a valid pair
//!    (values and slot of one version, of its own key), every score is
//!    non-zero, no key twice, `size` equals the keys exported and each
//!    `shard_size` its share; on a strict round, every exported key is there;
//! 3. load the same checkpoint into the restored variable: nothing changes
//!    (same size, same order-independent checksum of keys, values, slots and
//!    scores).
//!
//! Every save, restore and load must return `Ok`. Checkpoints overwrite the
//! previous ones in place. The [`Book`] tells the
//! [`server`](crate::server) thread when a save is running and what
//! `lo` each round had.

use crate::rows::{self, row_hash};
use crate::shared::Shared;
use dynemb::{Initializer, Variable};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Rows per export chunk while checking.
const CHUNK: usize = 1 << 15;
/// Rounds whose `lo` the [`Book`] keeps.
const ROUNDS_KEPT: usize = 16;

/// [`Book::saving`]: no save is running.
pub const NOT_SAVING: u8 = 0;
/// [`Book::saving`]: the ledger is being saved.
pub const SAVING_LEDGER: u8 = 1;
/// [`Book::saving`]: the main variable is being saved.
pub const SAVING_MAIN: u8 = 2;

/// What the checkpoint thread tells others about its rounds.
#[derive(Debug, Default)]
pub struct Book {
    /// Which save is running ([`NOT_SAVING`], [`SAVING_LEDGER`],
    /// [`SAVING_MAIN`]).
    pub saving: AtomicU8,
    /// The last round started (0 before the first).
    pub round: AtomicU64,
    /// The last round whose ledger save returned.
    pub ledger_published: AtomicU64,
    /// The last round whose main save returned.
    pub main_published: AtomicU64,
    /// `lo` (the books' `done` before the ledger save) of recent rounds.
    lows: Mutex<VecDeque<(u64, Arc<Vec<u64>>)>>,
}

impl Book {
    fn record(&self, round: u64, lo: Arc<Vec<u64>>) {
        let mut lows = self.lows.lock().unwrap_or_else(PoisonError::into_inner);
        lows.push_back((round, lo));
        while lows.len() > ROUNDS_KEPT {
            lows.pop_front();
        }
    }

    /// `lo` of `round`, if it is recent.
    pub fn low_of(&self, round: u64) -> Option<Arc<Vec<u64>>> {
        let lows = self.lows.lock().unwrap_or_else(PoisonError::into_inner);
        lows.iter()
            .find(|(r, _)| *r == round)
            .map(|(_, lo)| Arc::clone(lo))
    }
}

/// The second variables the checkpoints are restored into, and the book.
#[derive(Debug)]
pub struct Restored {
    main: Variable<i64>,
    ledger: Variable<i64>,
    dir: PathBuf,
    /// The rounds' book.
    pub book: Book,
}

/// A variable like the main one (dim, policy), with `shards` shards.
pub fn main_like(shared: &Shared, name: &str, shards: usize) -> Variable<i64> {
    let options = &shared.options;
    let var = Variable::<i64>::builder(name)
        .dim(options.dim)
        .shards(shards)
        .init_size(1)
        .initializer(Initializer::Zeros)
        .restrict_policy(options.policy)
        .build();
    shared.ok(format!("building {name}"), var)
}

/// A variable like the ledger (dim, no policy), with `shards` shards.
pub fn ledger_like(shared: &Shared, name: &str, shards: usize) -> Variable<i64> {
    let var = Variable::<i64>::builder(name)
        .dim(shared.options.dim)
        .shards(shards)
        .init_size(1)
        .build();
    shared.ok(format!("building {name}"), var)
}

impl Restored {
    /// Second variables for `shared`'s (the main one with another shard
    /// count, both with the same dim and restrict policy).
    pub fn new(shared: &Shared) -> Restored {
        Restored {
            main: main_like(shared, "soak_main_restored", shared.options.shards / 2 + 1),
            ledger: ledger_like(shared, "soak_ledger_restored", 3),
            dir: shared.options.dir.clone(),
            book: Book::default(),
        }
    }

    /// Where the main variable's checkpoint is.
    pub fn main_dir(&self) -> PathBuf {
        self.dir.join("main")
    }

    /// Where the ledger's checkpoint is.
    pub fn ledger_dir(&self) -> PathBuf {
        self.dir.join("ledger")
    }

    /// Removes the checkpoints and dynemb's files beside them (lock files,
    /// staging directories).
    pub fn remove_checkpoints(&self) {
        for dir in [self.main_dir(), self.ledger_dir()] {
            let _ = std::fs::remove_dir_all(dir);
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".main.dynemb-") || name.starts_with(".ledger.dynemb-") {
                let path = entry.path();
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
        let _ = std::fs::remove_dir(&self.dir); // only if empty
    }
}

/// Runs checkpoint rounds every `--checkpoint-every` until the stop flag is
/// set.
pub fn run(shared: &Shared, restored: &Restored) {
    let mut round = 0u64;
    loop {
        let due = Instant::now() + shared.options.checkpoint_every;
        while Instant::now() < due {
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50).min(shared.options.checkpoint_every));
        }
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        run_round(shared, restored, round.is_multiple_of(2));
        round += 1;
    }
}

/// One round (see the module docs); `strict` holds off removals during the
/// main save and checks its key set.
pub fn run_round(shared: &Shared, restored: &Restored, strict: bool) {
    let round = restored.book.round.fetch_add(1, Ordering::SeqCst) + 1;
    ledger_round(shared, restored, round);
    main_round(shared, restored, strict, round);
}

fn ledger_round(shared: &Shared, restored: &Restored, round: u64) {
    let ledger = &shared.ledger;
    let book = &restored.book;
    let dir = restored.ledger_dir();
    let markers = ledger.marker_keys();
    let marked = vec![round as f32; markers.len() * shared.options.dim];
    shared.ok(
        "ledger upsert of the markers",
        ledger.var.upsert(&markers, &marked),
    );
    let lo = Arc::new(ledger.done_now());
    book.record(round, Arc::clone(&lo));
    book.saving.store(SAVING_LEDGER, Ordering::SeqCst);
    let started = Instant::now();
    shared.ok(
        format!("ledger save to {}", dir.display()),
        ledger.var.save(&dir),
    );
    shared.stats.ledger_saves.add(started.elapsed());
    book.saving.store(NOT_SAVING, Ordering::SeqCst);
    book.ledger_published.store(round, Ordering::SeqCst);
    let hi = ledger.started_now();

    let started = Instant::now();
    shared.ok(
        format!(
            "ledger restore of {} (a save that returned Ok)",
            dir.display()
        ),
        restored.ledger.restore(&dir),
    );
    shared.stats.ledger_restores.add(started.elapsed());
    check_ledger(shared, &restored.ledger, &dir, book, Some(round), &hi);
}

/// Checks a variable just restored from the ledger's checkpoint at `dir`
/// (see the module docs): its markers name the round it holds (which must be
/// `round` if given), whose `lo` bounds every row from below; `hi`, the
/// books' `started` read after the restore's save returned, from above.
/// Returns the round.
pub fn check_ledger(
    shared: &Shared,
    var: &Variable<i64>,
    dir: &Path,
    book: &Book,
    round: Option<u64>,
    hi: &[u64],
) -> u64 {
    let ledger = &shared.ledger;
    let what = format!("ledger restored from {}", dir.display());
    let dim = var.dim();
    let markers = ledger.marker_keys();
    let mut values = vec![0.0; markers.len() * dim];
    let mut exists = vec![false; markers.len()];
    shared.ok(
        "restored ledger lookup_with_exists",
        var.lookup_with_exists(&markers, &mut values, &mut exists),
    );
    let mut rounds = Vec::new();
    for (i, &key) in markers.iter().enumerate() {
        if !exists[i] {
            shared.violation(format!("{what}: marker key {key} is missing"));
        }
        let r = rows::ledger_value("marker row", key, &values[i * dim..(i + 1) * dim])
            .unwrap_or_else(|e| shared.violation(format!("{what}: {e}")));
        rounds.push(r);
    }
    let got = rounds[0];
    if rounds.iter().any(|&r| r != got) {
        shared.violation(format!(
            "{what}: the marker keys (one per shard) read rounds {rounds:?}: the restore mixed \
             files of different saves"
        ));
    }
    if let Some(want) = round {
        if got != want {
            shared.violation(format!(
                "{what}: it holds round {got}, but the save of round {want} had just returned \
                 and no other save ran"
            ));
        }
    }
    let Some(lo) = book.low_of(got) else {
        shared.violation(format!(
            "{what}: it holds round {got}, which is not one of the last {ROUNDS_KEPT} rounds \
             saved (last started: {})",
            book.round.load(Ordering::SeqCst)
        ));
    };
    let slot = shared.ok(
        "restored ledger slot_id",
        var.slot_id(crate::shared::LEDGER_SLOT),
    );
    let booked = ledger.booked();
    let mut seen = vec![false; booked];
    let mut count = 0usize;
    for chunk in var.export_chunks(CHUNK) {
        let (keys, values) = shared.ok("restored ledger export_chunks", chunk);
        let mut slots = vec![0.0; values.len()];
        shared.ok(
            "restored ledger lookup_slot",
            var.lookup_slot(slot, &keys, &mut slots),
        );
        for (i, &key) in keys.iter().enumerate() {
            count += 1;
            let Some(j) = rows::ledger_index(key, ledger.per_kind) else {
                shared.violation(format!(
                    "{what}: it holds key {key}, which is no ledger key"
                ));
            };
            if j >= booked {
                continue; // a marker, checked above
            }
            if std::mem::replace(&mut seen[j], true) {
                shared.violation(format!("{what}: export gives key {key} twice"));
            }
            let row = |buf: &[f32], part| {
                rows::ledger_value(part, key, &buf[i * dim..(i + 1) * dim])
                    .unwrap_or_else(|e| shared.violation(format!("{what}: {e}")))
            };
            let v = row(&values, "value row");
            let s = row(&slots, "slot row");
            if !(lo[j]..=hi[j]).contains(&v) {
                shared.violation(format!(
                    "{what} (round {got}): key {key} (index {j}) has value {v}, outside [{}, {}]: \
                     the sums before the save started and after it ended{}",
                    lo[j],
                    hi[j],
                    if v < lo[j] {
                        " (an update was lost)"
                    } else {
                        ""
                    }
                ));
            }
            let want_slot = if ledger.is_update_key(j) { 2 * v } else { 0 };
            if s != want_slot {
                shared.violation(format!(
                    "{what}: key {key} (index {j}) has value {v} and slot {s}, want slot \
                     {want_slot}: torn between value and slot"
                ));
            }
        }
    }
    for j in 0..booked {
        let must = !ledger.is_update_key(j) || lo[j] > 0;
        if must && !seen[j] {
            shared.violation(format!(
                "{what} (round {got}): key {} (index {j}) was present for the whole save but is \
                 missing",
                ledger.key(j)
            ));
        }
        if ledger.is_update_key(j) && hi[j] == 0 && seen[j] {
            shared.violation(format!(
                "{what}: key {} (index {j}) was never inserted but is present",
                ledger.key(j)
            ));
        }
    }
    if var.size() != count {
        shared.violation(format!(
            "{what}: size() is {} but export gave {count} keys",
            var.size()
        ));
    }
    shared
        .stats
        .restored_rows_checked
        .fetch_add(count as u64, Ordering::Relaxed);
    got
}

fn main_round(shared: &Shared, restored: &Restored, strict: bool, round: u64) {
    let book = &restored.book;
    let dir = restored.main_dir();
    let gate = strict.then(|| shared.hold_removals());
    let present = gate.as_ref().map(|_| export_keys(shared));
    book.saving.store(SAVING_MAIN, Ordering::SeqCst);
    let started = Instant::now();
    shared.ok(
        format!("main save to {}", dir.display()),
        shared.main.save(&dir),
    );
    shared.stats.saves.add(started.elapsed());
    book.saving.store(NOT_SAVING, Ordering::SeqCst);
    book.main_published.store(round, Ordering::SeqCst);
    drop(gate);
    if strict {
        shared.stats.strict_saves.fetch_add(1, Ordering::Relaxed);
    }

    let var = &restored.main;
    let started = Instant::now();
    shared.ok(
        format!(
            "main restore of {} (a save that returned Ok)",
            dir.display()
        ),
        var.restore(&dir),
    );
    shared.stats.restores.add(started.elapsed());
    let (count, checksum) = check_restored_main(shared, var, &dir, "restore");
    if let Some(present) = present {
        let mut exists = vec![false; CHUNK];
        let mut out = vec![0.0; CHUNK * var.dim()];
        for keys in present.chunks(CHUNK) {
            let (exists, out) = (
                &mut exists[..keys.len()],
                &mut out[..keys.len() * var.dim()],
            );
            shared.ok(
                "restored main lookup_with_exists",
                var.lookup_with_exists(keys, out, exists),
            );
            if let Some(i) = exists.iter().position(|&e| !e) {
                shared.violation(format!(
                    "restored main {}: key {} was present for the whole save (no removal could \
                     run during it) but is not in the checkpoint ({} of {} such keys missing)",
                    dir.display(),
                    keys[i],
                    exists.iter().filter(|&&e| !e).count(),
                    keys.len()
                ));
            }
        }
    }

    let started = Instant::now();
    shared.ok(
        format!("main load of {} into its restore", dir.display()),
        var.load(&dir),
    );
    shared.stats.loads.add(started.elapsed());
    let (count_after, checksum_after) = check_restored_main(shared, var, &dir, "load");
    if (count_after, checksum_after) != (count, checksum) {
        shared.violation(format!(
            "loading {} into the variable just restored from it changed it: {count} keys \
             (checksum {checksum:#x}) before, {count_after} (checksum {checksum_after:#x}) after",
            dir.display()
        ));
    }
}

/// The keys of the main variable now (checking every exported row's
/// values).
fn export_keys(shared: &Shared) -> Vec<i64> {
    let dim = shared.options.dim;
    let mut all = Vec::with_capacity(shared.main.size() + CHUNK);
    for chunk in shared.main.export_chunks(CHUNK) {
        let (keys, values) = shared.ok("main export_chunks", chunk);
        for (i, &key) in keys.iter().enumerate() {
            if let Err(e) = rows::check_value(key, &values[i * dim..(i + 1) * dim]) {
                shared.violation(format!("main export_chunks: {e}"));
            }
        }
        all.extend(keys);
    }
    all
}

/// Checks every row of a main variable restored (or loaded) from `dir`
/// (see the module docs); returns its key count and checksum.
pub fn check_restored_main(
    shared: &Shared,
    var: &Variable<i64>,
    dir: &Path,
    after: &str,
) -> (usize, u64) {
    let slot = shared.ok(
        "restored main slot_id",
        var.slot_id(crate::shared::MAIN_SLOT),
    );
    let dim = var.dim();
    let shards = var.num_shards();
    let mut per_shard = vec![0usize; shards];
    let mut all = Vec::with_capacity(var.size() + CHUNK);
    let mut checksum = 0u64;
    for chunk in var.export_chunks(CHUNK) {
        let (keys, values) = shared.ok("restored main export_chunks", chunk);
        let mut slots = vec![0.0; values.len()];
        let mut scores = vec![0u64; keys.len()];
        shared.ok(
            "restored main lookup_slot",
            var.lookup_slot(slot, &keys, &mut slots),
        );
        shared.ok(
            "restored main lookup_scores",
            var.lookup_scores(&keys, &mut scores),
        );
        for (i, &key) in keys.iter().enumerate() {
            let (v, s) = (
                &values[i * dim..(i + 1) * dim],
                &slots[i * dim..(i + 1) * dim],
            );
            if let Err(e) = rows::check_pair(key, v, s) {
                shared.violation(format!(
                    "restored main {} (after {after}): {e}",
                    dir.display()
                ));
            }
            if scores[i] == 0 {
                shared.violation(format!(
                    "restored main {} (after {after}): key {key} has score 0 under {:?}",
                    dir.display(),
                    shared.options.policy
                ));
            }
            checksum = checksum.wrapping_add(row_hash(key, v[0], s[0], scores[i]));
            let shard = shared.ok(
                "partitioner shard_of",
                var.partitioner().shard_of(key, shards),
            );
            per_shard[shard] += 1;
        }
        all.extend(keys);
    }
    check_unique_and_sizes(
        shared,
        var,
        &format!("restored main {} (after {after})", dir.display()),
        all,
        &per_shard,
    );
    shared
        .stats
        .restored_rows_checked
        .fetch_add(per_shard.iter().sum::<usize>() as u64, Ordering::Relaxed);
    (per_shard.iter().sum(), checksum)
}

/// Checks that `keys` (a whole export of `var`, no writer running) has no
/// key twice, that `size()` is its length and every `shard_size` its
/// share.
pub fn check_unique_and_sizes(
    shared: &Shared,
    var: &Variable<i64>,
    what: &str,
    mut keys: Vec<i64>,
    per_shard: &[usize],
) {
    keys.sort_unstable();
    if let Some(pair) = keys.windows(2).find(|w| w[0] == w[1]) {
        shared.violation(format!("{what}: export gives key {} twice", pair[0]));
    }
    if var.size() != keys.len() {
        shared.violation(format!(
            "{what}: size() is {} but export gave {} keys",
            var.size(),
            keys.len()
        ));
    }
    for (shard, &n) in per_shard.iter().enumerate() {
        let size = shared.ok("shard_size", var.shard_size(shard));
        if size != n {
            shared.violation(format!(
                "{what}: shard_size({shard}) is {size} but export gave {n} keys of that shard"
            ));
        }
    }
}
