//! What the soak's threads share: the variables, the ledger's books, the
//! key ids handed out, the stop flag, the pause and removal locks, and the
//! counters. A violation anywhere ends the process through
//! [`Shared::violation`].

use crate::bounded::Bounded;
use crate::cli::Options;
use crate::rows::{ledger_key, main_key, LEDGER_MARKERS};
use crate::stats::Stats;
use dynemb::{Initializer, SlotId, Variable};
use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

/// Name of the main variable's optimizer slot.
pub const MAIN_SLOT: &str = "m";
/// Name of the ledger's slot.
pub const LEDGER_SLOT: &str = "acc";

/// The ledger variable and its books.
///
/// Besides the booked keys it holds [`LEDGER_MARKERS`] marker keys, which
/// the checkpoint thread sets to the round number before each save, so a
/// restore can tell which save it read.
///
/// For every ledger index `j`, `started[j]` is raised by a gradient before
/// the call that applies it and `done[j]` after that call returned. Every
/// gradient is positive and every ledger row is only ever added to, so at any
/// moment `done[j] <= row value <= started[j]`, with equality when no call is
/// in flight.
#[derive(Debug)]
pub struct Ledger {
    /// The variable (no restrict policy; nothing ever removes a key).
    pub var: Variable<i64>,
    /// Its slot (`s == 2v` for update keys, 0 for accum keys).
    pub slot: SlotId,
    /// Keys per kind: indexes `0..per_kind` are trained by `update_rows`,
    /// `per_kind..2*per_kind` by `accum`.
    pub per_kind: usize,
    /// Gradient sums announced before each call.
    pub started: Vec<AtomicU64>,
    /// Gradient sums of the calls that returned.
    pub done: Vec<AtomicU64>,
}

impl Ledger {
    /// The key of index `j`.
    pub fn key(&self, j: usize) -> i64 {
        ledger_key(j, self.per_kind)
    }

    /// Indexes with books (`started`, `done`): `0..2 * per_kind`.
    pub fn booked(&self) -> usize {
        2 * self.per_kind
    }

    /// The marker keys (see [`LEDGER_MARKERS`]).
    pub fn marker_keys(&self) -> Vec<i64> {
        (self.booked()..self.booked() + LEDGER_MARKERS)
            .map(|j| self.key(j))
            .collect()
    }

    /// Whether index `j` is trained by `update_rows` (else by `accum`).
    pub fn is_update_key(&self, j: usize) -> bool {
        j < self.per_kind
    }

    /// A copy of `done`.
    pub fn done_now(&self) -> Vec<u64> {
        self.done.iter().map(|d| d.load(Ordering::SeqCst)).collect()
    }

    /// A copy of `started`.
    pub fn started_now(&self) -> Vec<u64> {
        self.started
            .iter()
            .map(|s| s.load(Ordering::SeqCst))
            .collect()
    }
}

/// Everything the threads share.
#[derive(Debug)]
pub struct Shared {
    /// The command line.
    pub options: Options,
    /// The main variable: the training load, with a restrict policy.
    pub main: Variable<i64>,
    /// The main variable's optimizer slot.
    pub main_slot: SlotId,
    /// The ledger.
    pub ledger: Ledger,
    /// Ids handed out so far; key `main_key(id)` for each.
    pub next_id: AtomicU64,
    /// Set once the main variable first reached `--keys` keys.
    pub grown: AtomicBool,
    /// Set when the workers and the checkpoint thread should finish.
    pub stop: AtomicBool,
    /// Set when the server thread should finish (after the final
    /// checkpoint round, so that round is restored during its saves too).
    pub stop_server: AtomicBool,
    /// Workers hold it shared for each operation; an audit holds it
    /// exclusively, so it sees no operation in flight.
    pub pause: RwLock<()>,
    /// `remove` and `restrict` hold it shared (taken with `try_read`, so they
    /// never wait); a strict save holds it exclusively, so no key is removed
    /// during that save.
    pub removal_gate: RwLock<()>,
    /// Set while one worker runs `restrict`.
    pub restricting: AtomicBool,
    /// The bounded variable, with `--capacity`.
    pub bounded: Option<Bounded>,
    /// Counters.
    pub stats: Stats,
    /// When the load started.
    pub started: Instant,
}

impl Shared {
    /// Builds the variables (the ledger's accum keys inserted, so their
    /// `accum`s with `exists = true` always apply).
    pub fn new(options: Options) -> Shared {
        let build_failed = |what: &str, e: dynemb::Error| -> ! {
            eprintln!("soak: building the {what} failed: {e}");
            std::process::exit(1)
        };
        let main = Variable::<i64>::builder("soak_main")
            .dim(options.dim)
            .shards(options.shards)
            .init_size(1)
            .initializer(Initializer::Zeros)
            .restrict_policy(options.policy)
            .build()
            .unwrap_or_else(|e| build_failed("main variable", e));
        let main_slot = main
            .create_slot(MAIN_SLOT, 0.0)
            .unwrap_or_else(|e| build_failed("main slot", e));
        let per_kind = options.ledger_keys;
        let var = Variable::<i64>::builder("soak_ledger")
            .dim(options.dim)
            .shards(options.shards.clamp(1, 4))
            .init_size(1)
            .initializer(Initializer::Zeros)
            .build()
            .unwrap_or_else(|e| build_failed("ledger", e));
        let slot = var
            .create_slot(LEDGER_SLOT, 0.0)
            .unwrap_or_else(|e| build_failed("ledger slot", e));
        let accum_keys: Vec<i64> = (per_kind..2 * per_kind)
            .map(|j| ledger_key(j, per_kind))
            .collect();
        let mut rows = vec![0.0; accum_keys.len() * options.dim];
        var.lookup_or_insert(&accum_keys, &mut rows)
            .unwrap_or_else(|e| build_failed("ledger's accum keys", e));
        let ledger = Ledger {
            var,
            slot,
            per_kind,
            started: (0..2 * per_kind).map(|_| AtomicU64::new(0)).collect(),
            done: (0..2 * per_kind).map(|_| AtomicU64::new(0)).collect(),
        };
        let bounded = options.capacity.map(|capacity| {
            Bounded::new(capacity, options.dim, options.shards)
                .unwrap_or_else(|e| build_failed("bounded variable", e))
        });
        let stats = Stats::new(options.shards);
        Shared {
            options,
            main,
            main_slot,
            ledger,
            next_id: AtomicU64::new(0),
            grown: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stop_server: AtomicBool::new(false),
            pause: RwLock::new(()),
            removal_gate: RwLock::new(()),
            restricting: AtomicBool::new(false),
            bounded,
            stats,
            started: Instant::now(),
        }
    }

    /// Reports an invariant violation (with the counters so far) and ends
    /// the process with exit code 1.
    pub fn violation(&self, message: impl Display) -> ! {
        let elapsed = self.started.elapsed();
        eprintln!(
            "\nsoak: INVARIANT VIOLATION after {:.1} s: {message}",
            elapsed.as_secs_f64()
        );
        eprintln!("{}", self.stats.summary(elapsed, 1));
        std::process::exit(1)
    }

    /// Unwraps a dynemb result, reporting an error as a violation (nothing
    /// the soak calls may fail).
    pub fn ok<T>(&self, what: impl Display, result: dynemb::Result<T>) -> T {
        result.unwrap_or_else(|e| self.violation(format!("{what} returned an error: {e}")))
    }

    /// A worker's permission to run one operation (waits while an audit
    /// runs).
    pub fn running(&self) -> RwLockReadGuard<'_, ()> {
        self.pause.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `remove` and `restrict` off until the guard is dropped.
    pub fn hold_removals(&self) -> RwLockWriteGuard<'_, ()> {
        self.removal_gate
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Pauses every worker until the guard is dropped.
    pub fn pause_workers(&self) -> RwLockWriteGuard<'_, ()> {
        self.pause.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The ids the workers may pick existing keys from: the latest
    /// `--keys` ids handed out.
    pub fn window(&self) -> (u64, u64) {
        let end = self.next_id.load(Ordering::Relaxed);
        let span = end.min(self.options.keys as u64);
        (end - span, end)
    }

    /// Hands out `n` new ids and returns the first.
    pub fn new_ids(&self, n: usize) -> u64 {
        self.next_id.fetch_add(n as u64, Ordering::Relaxed)
    }

    /// The main variable's key of `id`.
    pub fn main_key(&self, id: u64) -> i64 {
        main_key(id)
    }

    /// The main variable's size above which workers `restrict` it.
    pub fn restrict_trigger(&self) -> usize {
        self.options.keys + self.options.keys / 10
    }

    /// How many rows a `restrict` keeps.
    pub fn restrict_reserve(&self) -> usize {
        self.options.keys - self.options.keys / 10
    }
}
