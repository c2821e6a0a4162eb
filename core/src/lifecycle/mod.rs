//! Row lifecycle: how rows come and go besides explicit writes and removals.
//!
//! - **Capacity** ([`VariableBuilder::capacity`](crate::VariableBuilder::capacity)):
//!   `size()` never exceeds the bound. An insert into a full variable first
//!   evicts a low-scored row (with its slot rows) and hands it to the
//!   eviction listener. Each shard holds at most its share of the bound
//!   (the bound split evenly, the first shards taking the remainder).
//! - **Eviction listener** ([`VariableBuilder::on_evict`](crate::VariableBuilder::on_evict)):
//!   receives every evicted row exactly once, as [`Evicted`] batches,
//!   before the call that evicted it returns. Rows removed by
//!   `remove`, `restrict`, `expire` or `clear` are not evictions and do not
//!   go to the listener.
//! - **Admission** ([`Admission`]): a key becomes a row only at its
//!   `min_count`-th training read. Until then training reads return the
//!   initializer's row and insert nothing, and optimizer updates and
//!   `accum`'s inserts skip the key (its gradient is dropped).
//! - **Expiry** ([`Variable::expire`](crate::Variable::expire)): removes
//!   the rows not written for a while (Timestamp policy only).
//!
//! [`LifecycleStats`] counts what these did, for progress lines.

pub(crate) mod admission;
pub(crate) mod delivery;
mod pending;

use std::fmt;
use std::sync::Arc;

/// When a key not yet in a table becomes a row: DeepRec's feature
/// admission. Only training reads (`lookup_or_insert`, once per occurrence
/// of the key in a batch) count; `lookup` never does. Explicit writes
/// (`upsert`, `restore`, `load`) bypass admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// A key becomes a row at its `min_count`-th training read (exact
    /// counts). The pending counts are bounded: by the capacity if the
    /// variable has one, else by [`DEFAULT_PENDING_BOUND`]; at the bound
    /// the lowest counts are dropped, so those keys are admitted late, or
    /// never while other keys keep the counter full (with a capacity of
    /// one row, two keys read in turn push each other out for good).
    /// An admitted key's count is dropped, so a key evicted later must be
    /// counted up to `min_count` again. Explicit writes, `remove` and
    /// `clear` leave pending counts alone.
    Exact {
        /// Training reads that admit a key (1 admits at the first read; 0
        /// is an error at build).
        min_count: u32,
    },
    /// The same, counted in a count-min sketch of `width` x `depth`
    /// saturating 16-bit counters (conservative update): fixed memory
    /// whatever the stream. It never admits a key late and rarely early
    /// (when other keys share all its counters). It ages as TinyLFU does:
    /// after [`SKETCH_AGEING_READS`] x `width` counted reads every counter
    /// is halved, so "never late" holds between two agings and keys seen
    /// long ago fade. The sketch remembers an evicted key's count, so such
    /// a key may be admitted again at once. `min_count` is at most
    /// `u16::MAX`, and at most the ageing period ([`SKETCH_AGEING_READS`]
    /// x `width`), an error at build otherwise: "never late" is a promise
    /// about a key read `min_count` times between two agings, and past the
    /// period ageing would halve a key's count before it got there unless
    /// the key made most of the reads (beyond about twice the period, not
    /// even then). Ageing happens at the end of the shard batch (the part
    /// of a call one shard runs) that completes a period. Size `width` to
    /// the distinct keys the stream brings between two agings: at depth 4,
    /// a width of 1.3 times that count admitted 0.8% of keys read once or
    /// twice early at `min_count` 3, and 2.1% of keys read once at
    /// `min_count` 2; a width of a third of it admitted 30% of the first
    /// early (see the admission tests).
    Sketch {
        /// Training reads that admit a key.
        min_count: u32,
        /// Counters per row of the sketch.
        width: usize,
        /// Rows of the sketch (independent hashes).
        depth: usize,
    },
}

/// Counted reads per sketch column between two agings of an
/// [`Admission::Sketch`].
pub const SKETCH_AGEING_READS: usize = 10;

/// Pending keys an [`Admission::Exact`] counter holds at most when the
/// variable has no capacity (per variable).
pub const DEFAULT_PENDING_BOUND: usize = 1 << 20;

impl Admission {
    /// Training reads that admit a key.
    pub fn min_count(self) -> u32 {
        match self {
            Admission::Exact { min_count } | Admission::Sketch { min_count, .. } => min_count,
        }
    }
}

/// A batch of rows evicted by capacity, as the eviction listener receives
/// them: row `i` of every column belongs to `keys()[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Evicted<'a, K> {
    pub(crate) keys: &'a [K],
    pub(crate) dim: usize,
    pub(crate) values: &'a [f32],
    pub(crate) scores: &'a [u64],
    pub(crate) slot_names: &'a [String],
    pub(crate) slots: &'a [Vec<f32>],
}

impl<'a, K> Evicted<'a, K> {
    /// The evicted keys.
    pub fn keys(&self) -> &'a [K] {
        self.keys
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Their rows: `keys().len() * dim()` values.
    pub fn values(&self) -> &'a [f32] {
        self.values
    }

    /// Their scores under the restrict policy (one per key). Empty for a
    /// variable without a restrict policy.
    pub fn scores(&self) -> &'a [u64] {
        self.scores
    }

    /// The variable's slot columns, in creation order: the names of
    /// [`slot`](Self::slot)'s columns.
    pub fn slot_names(&self) -> &'a [String] {
        self.slot_names
    }

    /// The evicted rows of the slot called `name` (`keys().len() * dim()`
    /// values), if the variable has it.
    pub fn slot(&self, name: &str) -> Option<&'a [f32]> {
        let slots = self.slots;
        let at = self.slot_names.iter().position(|n| n == name)?;
        slots.get(at).map(Vec::as_slice)
    }

    /// Every slot's rows, by name, in creation order.
    pub fn slots(&self) -> impl Iterator<Item = (&'a str, &'a [f32])> + 'a {
        let slots = self.slots;
        self.slot_names
            .iter()
            .map(String::as_str)
            .zip(slots.iter().map(Vec::as_slice))
    }

    /// Number of evicted rows.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when the batch holds no row.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Rows evicted from one shard, keyed by bits: what a table hands the
/// variable's listener.
#[derive(Debug, Default)]
pub(crate) struct EvictedRows {
    pub(crate) keys: Vec<u64>,
    pub(crate) values: Vec<f32>,
    pub(crate) scores: Vec<u64>,
    pub(crate) slots: Vec<Vec<f32>>,
}

impl EvictedRows {
    /// True when no row was evicted.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The eviction listener of a table, independent of its key type: called
/// with one shard's evicted rows (keys as bits) and the slot names.
pub(crate) type RowsListener = dyn Fn(&EvictedRows, &[String]) + Send + Sync;

/// What a shard calls with the rows one batch evicted (the variable adds
/// the slot names and the key type).
pub(crate) type ShardListener = Arc<dyn Fn(&EvictedRows) + Send + Sync>;

/// An eviction listener, as [`TableOptions::on_evict`](crate::TableOptions::on_evict)
/// keeps it (made by [`VariableBuilder::on_evict`](crate::VariableBuilder::on_evict)).
#[derive(Clone)]
pub struct EvictListener {
    pub(crate) call: Arc<RowsListener>,
}

impl EvictListener {
    /// A listener for a variable keyed by `K`.
    pub fn new<K: crate::Key>(f: impl Fn(Evicted<'_, K>) + Send + Sync + 'static) -> Self {
        let call = move |rows: &EvictedRows, slot_names: &[String]| {
            let keys: Vec<K> = rows.keys.iter().map(|&bits| K::from_bits(bits)).collect();
            let dim = rows.values.len() / keys.len().max(1);
            f(Evicted {
                keys: &keys,
                dim,
                values: &rows.values,
                scores: &rows.scores,
                slot_names: &slot_names[..rows.slots.len().min(slot_names.len())],
                slots: &rows.slots,
            });
        };
        EvictListener {
            call: Arc::new(call),
        }
    }
}

impl fmt::Debug for EvictListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EvictListener")
    }
}

/// What the lifecycle features did since a variable was built ([`Variable::lifecycle_stats`](crate::Variable::lifecycle_stats));
/// counts only grow, so a progress line shows the difference of two.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LifecycleStats {
    /// Rows evicted by capacity.
    pub evicted: u64,
    /// Training reads of keys not yet admitted (answered with the
    /// initializer's row, nothing inserted).
    pub not_admitted_reads: u64,
    /// Rows removed by `expire`.
    pub expired: u64,
}
