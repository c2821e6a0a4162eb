//! Counters of the soak: operations by kind, checkpoint rounds, restricts,
//! sizes and memory, and the inferred index resizes; the progress line and
//! the final summary.
//!
//! Index resizes are not visible through `Variable`'s public API (it has
//! `size`, `shard_size` and `memory_bytes`, but no capacity), so they are
//! inferred: a shard's index doubles about once each time its size doubles,
//! so the sampler counts every time a shard's size reaches a power of two it
//! has not reached before. Resizes after churn (an index rebuilt to clear
//! tombstones at the same size) are not counted.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Kinds of operation the soak counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `lookup_or_insert` on the main variable.
    LookupOrInsert,
    /// `lookup` on the main variable.
    Lookup,
    /// `lookup_slot` on the main variable.
    LookupSlot,
    /// `lookup_with_exists` on the main variable (before an `accum`).
    LookupWithExists,
    /// `update_rows` with the slot on the main variable.
    UpdateRows,
    /// `accum` on the main variable.
    Accum,
    /// `remove` on the main variable.
    Remove,
    /// `update_rows` on the ledger.
    LedgerUpdate,
    /// `accum` on the ledger.
    LedgerAccum,
    /// `lookup` and `lookup_slot` of ledger keys.
    LedgerRead,
}

impl Op {
    /// Every kind, in report order.
    pub const ALL: [Op; 10] = [
        Op::LookupOrInsert,
        Op::Lookup,
        Op::LookupSlot,
        Op::LookupWithExists,
        Op::UpdateRows,
        Op::Accum,
        Op::Remove,
        Op::LedgerUpdate,
        Op::LedgerAccum,
        Op::LedgerRead,
    ];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Op::LookupOrInsert => "lookup_or_insert",
            Op::Lookup => "lookup",
            Op::LookupSlot => "lookup_slot",
            Op::LookupWithExists => "lookup_with_exists",
            Op::UpdateRows => "update_rows (slot)",
            Op::Accum => "accum",
            Op::Remove => "remove",
            Op::LedgerUpdate => "ledger update_rows",
            Op::LedgerAccum => "ledger accum",
            Op::LedgerRead => "ledger lookup+slot",
        }
    }
}

/// Seconds spent and times done of one kind of checkpoint step.
#[derive(Debug, Default)]
pub struct Timed {
    /// Times done.
    pub count: AtomicU64,
    /// Total time, in microseconds.
    pub micros: AtomicU64,
    /// Longest time, in microseconds.
    pub max_micros: AtomicU64,
}

impl Timed {
    /// Counts one step that took `elapsed`.
    pub fn add(&self, elapsed: Duration) {
        let micros = elapsed.as_micros() as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.micros.fetch_add(micros, Ordering::Relaxed);
        self.max_micros.fetch_max(micros, Ordering::Relaxed);
    }

    fn describe(&self) -> String {
        let count = self.count.load(Ordering::Relaxed);
        let micros = self.micros.load(Ordering::Relaxed);
        let mean = micros.checked_div(count).unwrap_or(0);
        format!(
            "{count} (mean {:.2} s, max {:.2} s)",
            mean as f64 / 1e6,
            self.max_micros.load(Ordering::Relaxed) as f64 / 1e6
        )
    }
}

/// Every counter of a run.
#[derive(Debug)]
pub struct Stats {
    calls: [AtomicU64; Op::ALL.len()],
    keys: [AtomicU64; Op::ALL.len()],
    /// Saves of the main variable (each followed by a restore and a load).
    pub saves: Timed,
    /// Saves of the ledger variable.
    pub ledger_saves: Timed,
    /// Saves during which no key could be removed (their key sets are
    /// checked).
    pub strict_saves: AtomicU64,
    /// Restores of the main variable's checkpoint into the second variable.
    pub restores: Timed,
    /// Restores of the ledger's checkpoint.
    pub ledger_restores: Timed,
    /// Loads of the main variable's checkpoint into the second variable.
    pub loads: Timed,
    /// Server restores of the main checkpoint, each started during a save.
    pub served_restores: Timed,
    /// Server restores of the ledger's checkpoint, each started during a
    /// save.
    pub served_ledger_restores: Timed,
    /// The round the server's last ledger restore held.
    pub served_round: AtomicU64,
    /// Rows checked in restored checkpoints.
    pub restored_rows_checked: AtomicU64,
    /// `restrict` calls that ran (the size was above the trigger).
    pub restricts: Timed,
    /// Rows `restrict` removed.
    pub restrict_removed: AtomicU64,
    /// Audits (whole-table checks while the workers were paused).
    pub audits: Timed,
    /// Largest size of the main variable seen.
    pub max_size: AtomicUsize,
    /// Largest `memory_bytes` of the main variable seen.
    pub max_memory: AtomicUsize,
    /// Largest RSS of the process seen.
    pub max_rss: AtomicU64,
    /// Inferred index resizes (see the module docs).
    pub inferred_resizes: AtomicU64,
    /// Per shard of the main variable: the largest `floor(log2(size))` seen.
    shard_levels: Vec<AtomicU64>,
}

/// A copy of the operation counters at one moment, for rates.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpTotals {
    /// Calls per kind.
    pub calls: [u64; Op::ALL.len()],
    /// Keys per kind.
    pub keys: [u64; Op::ALL.len()],
}

impl OpTotals {
    /// Keys over every kind.
    pub fn all_keys(&self) -> u64 {
        self.keys.iter().sum()
    }
}

impl Stats {
    /// Zeroed counters for a main variable of `shards` shards.
    pub fn new(shards: usize) -> Self {
        Stats {
            calls: Default::default(),
            keys: Default::default(),
            saves: Timed::default(),
            ledger_saves: Timed::default(),
            strict_saves: AtomicU64::new(0),
            restores: Timed::default(),
            ledger_restores: Timed::default(),
            loads: Timed::default(),
            served_restores: Timed::default(),
            served_ledger_restores: Timed::default(),
            served_round: AtomicU64::new(0),
            restored_rows_checked: AtomicU64::new(0),
            restricts: Timed::default(),
            restrict_removed: AtomicU64::new(0),
            audits: Timed::default(),
            max_size: AtomicUsize::new(0),
            max_memory: AtomicUsize::new(0),
            max_rss: AtomicU64::new(0),
            inferred_resizes: AtomicU64::new(0),
            shard_levels: (0..shards).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts one call of `op` on `keys` keys.
    pub fn count(&self, op: Op, keys: usize) {
        let i = op as usize;
        self.calls[i].fetch_add(1, Ordering::Relaxed);
        self.keys[i].fetch_add(keys as u64, Ordering::Relaxed);
    }

    /// The operation counters now.
    pub fn totals(&self) -> OpTotals {
        let mut totals = OpTotals::default();
        for i in 0..Op::ALL.len() {
            totals.calls[i] = self.calls[i].load(Ordering::Relaxed);
            totals.keys[i] = self.keys[i].load(Ordering::Relaxed);
        }
        totals
    }

    /// Records a sample of the main variable's shard sizes and memory (and
    /// the process's RSS), counting inferred resizes.
    pub fn sample(&self, shard_sizes: &[usize], memory: usize, rss: Option<u64>) {
        let size: usize = shard_sizes.iter().sum();
        self.max_size.fetch_max(size, Ordering::Relaxed);
        self.max_memory.fetch_max(memory, Ordering::Relaxed);
        if let Some(rss) = rss {
            self.max_rss.fetch_max(rss, Ordering::Relaxed);
        }
        for (level, &n) in self.shard_levels.iter().zip(shard_sizes) {
            if n == 0 {
                continue;
            }
            let now = u64::from(n.ilog2());
            let before = level.fetch_max(now, Ordering::Relaxed);
            if now > before {
                self.inferred_resizes
                    .fetch_add(now - before, Ordering::Relaxed);
            }
        }
    }

    /// The final summary's text.
    pub fn summary(&self, elapsed: Duration, violations: u64) -> String {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let totals = self.totals();
        let mut out = String::new();
        let _ = writeln!(out, "duration: {:.1} s", secs);
        let _ = writeln!(
            out,
            "{:<22} {:>12} {:>15} {:>12}",
            "operation", "calls", "keys", "keys/s"
        );
        for op in Op::ALL {
            let i = op as usize;
            let _ = writeln!(
                out,
                "{:<22} {:>12} {:>15} {:>12.0}",
                op.name(),
                totals.calls[i],
                totals.keys[i],
                totals.keys[i] as f64 / secs
            );
        }
        let _ = writeln!(
            out,
            "{:<22} {:>12} {:>15} {:>12.0}",
            "all",
            totals.calls.iter().sum::<u64>(),
            totals.all_keys(),
            totals.all_keys() as f64 / secs
        );
        let _ = writeln!(
            out,
            "index resizes (inferred: a shard's size reaching a new power of two; the public \
             API shows no capacity): {}",
            self.inferred_resizes.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "saves (main): {}", self.saves.describe());
        let _ = writeln!(
            out,
            "  of which strict (no removal during the save, key set checked): {}",
            self.strict_saves.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "saves (ledger): {}", self.ledger_saves.describe());
        let _ = writeln!(out, "restores (main): {}", self.restores.describe());
        let _ = writeln!(
            out,
            "restores (ledger): {}",
            self.ledger_restores.describe()
        );
        let _ = writeln!(out, "loads (main): {}", self.loads.describe());
        let _ = writeln!(
            out,
            "restores started during a save of the same directory: main {}, ledger {} (the \
             last held round {})",
            self.served_restores.describe(),
            self.served_ledger_restores.describe(),
            self.served_round.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "restored rows checked: {}",
            self.restored_rows_checked.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "restricts: {}", self.restricts.describe());
        let _ = writeln!(
            out,
            "rows removed by restrict: {}; keys passed to remove: {} (Variable::remove does not \
             say how many were present)",
            self.restrict_removed.load(Ordering::Relaxed),
            totals.keys[Op::Remove as usize]
        );
        let _ = writeln!(out, "audits (workers paused): {}", self.audits.describe());
        let _ = writeln!(
            out,
            "max size (main): {}",
            self.max_size.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "max memory_bytes (main): {:.1} MiB; max RSS: {:.1} MiB",
            self.max_memory.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
            self.max_rss.load(Ordering::Relaxed) as f64 / (1 << 20) as f64
        );
        let _ = write!(out, "invariant violations: {violations}");
        out
    }
}
