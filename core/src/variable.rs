//! [`Variable`]: a sharded dynamic embedding table, TFRA's
//! `dynamic_embedding.Variable`.
//!
//! A variable owns `shards` [`Table`]s (TFRA's `devices`); a [`Partitioner`]
//! sends each key to one of them. Every operation takes a batch of keys and
//! flat row buffers (`dim` values per key). A batch is split by shard first,
//! so a bad shard from a custom partitioner fails the whole call before
//! anything changes; each shard's share is then processed under one epoch pin.
//!
//! Semantics follow TFRA:
//! - [`Variable::lookup`] never inserts; a missing key reads the
//!   initializer's row (deterministic per key for random initializers), and
//!   [`Variable::lookup_or_insert`] stores exactly that row;
//! - [`Variable::accum`] follows `bp_v2`'s truth table so concurrent workers
//!   add their updates instead of overwriting each other;
//! - inputs are checked up front: a length that does not match `keys.len() *
//!   dim`, a NaN/infinite value or delta, a bad shard from a custom
//!   partitioner or a slot of another variable, is an [`Error`] and changes
//!   nothing, output buffers included;
//! - no row ever holds a NaN or an infinity (so every save can be
//!   restored): a write whose result would not be finite (an `accum` that
//!   overflows, an `update_rows` update that leaves one) is refused per row:
//!   that row keeps its values and score, the batch's other rows are
//!   written, and the call returns [`Error::NonFinite`] naming the first
//!   refused key's position. Per row because a write locks one row at a
//!   time; refusing a whole batch would need all its rows locked at once;
//! - the other errors that can come after a batch has started writing are
//!   [`Error::CapacityExceeded`] (a shard's row ids are exhausted) and
//!   [`Error::OutOfMemory`] (a segment of rows cannot be allocated): the
//!   keys before the failing one may have been written.
//!
//! Optimizer slots (Adam's `m` and `v`, Adagrad's accumulator, ...) are
//! columns of the variable itself, not separate variables as in TFRA: a slot
//! row shares its key's row id and row lock, so one probe finds the weights
//! and every slot, [`Variable::update_rows`] updates them together
//! atomically, removing a key removes its slots, and checkpoints save them.
//! Slots are added while the variable lives ([`Variable::create_slot`]),
//! existing rows included, each starting at the slot's initial value;
//! [`Variable::create_slots`] adds several all or nothing (an optimizer's
//! `m` and `v` never arrive one without the other), checked first under
//! the lock that serializes slot creation. Names (the variable's and its
//! slots') are at most [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes.
//!
//! With a [`RestrictPolicy`], every row keeps a score (see
//! [`restrict`](crate::restrict)) and [`Variable::restrict`] removes the
//! lowest-scored rows. TFRA restricts each shard to `num_reserved / shards`
//! rows; here the selection is over the whole variable, so exactly
//! `num_reserved` rows stay however unevenly keys fall on shards (when no
//! other thread writes meanwhile).
//!
//! Decisions where TFRA is silent: keys repeated in one `accum` batch all
//! count (a key the batch itself inserted gets the later deltas added);
//! `export` is not a snapshot: a key present throughout appears exactly once,
//! keys inserted or removed meanwhile may or may not appear, and a key removed
//! and re-inserted meanwhile may appear twice. `size` is exact when no batch
//! is in flight.

use crate::checkpoint;
use crate::checks::{batch_len, check_fits, check_len, check_slot_list};
use crate::lifecycle::admission::Admitter;
use crate::lifecycle::delivery::HeldDeliveries;
use crate::lifecycle::{EvictedRows, LifecycleStats, ShardListener, DEFAULT_PENDING_BOUND};
use crate::raw::{ExportColumns, ExportedRows, Lifecycle, Positions, RowFormat, Table};
use crate::{
    Dtype, Error, Initializer, Key, Partitioner, RestrictPolicy, Result, Rounding, TableOptions,
    VariableBuilder,
};
use std::marker::PhantomData;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// Rows one step of a scan over a shard (restrict, export) reads at a time.
const SCAN_CHUNK: usize = 1 << 16;

/// A slot column of one variable, from [`Variable::create_slot`] or
/// [`Variable::slot_id`]. Using it with another variable is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotId {
    variable: u64,
    index: usize,
}

impl SlotId {
    /// The slot at `index` of the store whose
    /// [`store_id`](crate::EmbeddingStore::store_id) is `store_id`: for
    /// [`EmbeddingStore`](crate::EmbeddingStore) implementations outside
    /// this crate, which check that a slot they are given is theirs with
    /// [`SlotId::store_id`].
    pub fn new(store_id: u64, index: usize) -> SlotId {
        SlotId {
            variable: store_id,
            index,
        }
    }

    /// The id of the store the slot belongs to.
    pub fn store_id(self) -> u64 {
        self.variable
    }

    /// The slot's position among its variable's slots (creation order).
    pub fn index(self) -> usize {
        self.index
    }
}

/// A dynamic embedding table: rows of `dim` `f32`s keyed by `K`, sharded,
/// growing as keys arrive. Clones share the same tables.
#[derive(Clone)]
pub struct Variable<K: Key> {
    inner: Arc<Inner>,
    _key: PhantomData<fn() -> K>,
}

struct Inner {
    id: u64,
    name: String,
    dim: usize,
    shards: Vec<Table>,
    partitioner: Partitioner,
    initializer: Initializer,
    trainable: bool,
    checkpoint: bool,
    /// Slot names, in slot index order (every shard has these columns);
    /// shared with the shards' eviction listeners.
    slots: Arc<RwLock<Vec<String>>>,
    /// Most rows over all shards, if bounded.
    capacity: Option<usize>,
    /// Admission counts, shared by the shards.
    admitter: Option<Arc<Admitter>>,
    /// Rows removed by `expire`.
    expired: AtomicU64,
}

impl<K: Key> std::fmt::Debug for Variable<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variable")
            .field("name", &self.inner.name)
            .field("key", &K::TYPE_NAME)
            .field("dim", &self.inner.dim)
            .field("shards", &self.inner.shards.len())
            .field("size", &self.size())
            .finish()
    }
}

/// A batch's keys as bits, split by shard.
enum Split {
    /// One shard: every key, in batch order.
    One(Vec<u64>),
    /// Per shard: its keys and their positions in the batch.
    Many(Vec<(Vec<u64>, Vec<u32>)>),
}

/// The first row of a batch (by position in `keys`) that a write refused
/// because its result was not finite or did not fit its dtype: how
/// [`Variable::update_rows`] and [`Variable::accum`] report their per-row
/// refusals, whatever shard order the rows were written in.
#[derive(Default)]
struct Refused(Option<(usize, f32, Dtype)>);

impl Refused {
    /// Records the refusal of the key at `position` with `value`, which is
    /// not finite or does not fit `dtype`.
    fn note(&mut self, position: usize, value: f32, dtype: Dtype) {
        if self.0.is_none_or(|(first, _, _)| position < first) {
            self.0 = Some((position, value, dtype));
        }
    }

    /// `Ok` if nothing was refused, else [`Error::NonFinite`] or
    /// [`Error::OutOfRange`] naming the first refused key's position.
    fn into_result(self, what: &'static str) -> Result<()> {
        match self.0 {
            None => Ok(()),
            Some((index, value, _)) if !value.is_finite() => {
                Err(Error::NonFinite { what, index, value })
            }
            Some((index, value, dtype)) => Err(Error::OutOfRange {
                what,
                index,
                value,
                dtype,
            }),
        }
    }
}

/// The first value of `values` that does not fit `dtype` (not finite, or
/// out of its range), if any.
fn first_unfit(values: &[f32], dtype: Dtype) -> Option<f32> {
    dtype.first_unfit(values).map(|i| values[i])
}

impl<K: Key> Variable<K> {
    /// The id of the table behind this handle (shared by its clones,
    /// unique in the process): [`EmbeddingStore::store_id`](crate::EmbeddingStore::store_id).
    pub(crate) fn table_id(&self) -> u64 {
        self.inner.id
    }

    /// Creates the tables of a variable called `name` with `options`, which
    /// [`TableOptions::check`] has accepted.
    pub(crate) fn from_options(name: String, options: TableOptions) -> Result<Variable<K>> {
        let shard_count = options.shards;
        let per_shard = options.init_size.div_ceil(shard_count);
        let policy = options.effective_restrict_policy();
        let slots = Arc::new(RwLock::new(Vec::<String>::new()));
        let admitter = match options.admission {
            Some(admission) => {
                let bound = options.capacity.unwrap_or(DEFAULT_PENDING_BOUND);
                Some(Arc::new(Admitter::new(admission, bound)?))
            }
            None => None,
        };
        let listener = options.on_evict.map(|listener| {
            let slots = Arc::clone(&slots);
            Arc::new(move |rows: &EvictedRows| {
                let names = slots.read().unwrap_or_else(PoisonError::into_inner).clone();
                (listener.call)(rows, &names);
            }) as ShardListener
        });
        let shards = (0..shard_count)
            .map(|shard| {
                let capacity = options
                    .capacity
                    .map(|rows| rows / shard_count + usize::from(shard < rows % shard_count));
                let lifecycle = Lifecycle {
                    capacity,
                    frequency_decay: options.frequency_decay,
                    admitter: admitter.clone(),
                    listener: listener.clone(),
                };
                let format = RowFormat {
                    values: options.value_dtype,
                    slots: options.slot_dtype,
                    rounding: options.rounding,
                    inline_slots: options.inline_slots,
                };
                Table::with_lifecycle(options.dim, per_shard, policy, lifecycle, format)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Variable {
            inner: Arc::new(Inner {
                id: crate::new_store_id(),
                slots,
                capacity: options.capacity,
                admitter,
                expired: AtomicU64::new(0),
                name,
                dim: options.dim,
                shards,
                partitioner: options.partitioner,
                initializer: options.initializer,
                trainable: options.trainable,
                checkpoint: options.checkpoint,
            }),
            _key: PhantomData,
        })
    }

    /// Starts building a variable called `name`, with
    /// [`TableOptions::default`].
    pub fn builder(name: impl Into<String>) -> VariableBuilder<K> {
        VariableBuilder::new(name.into(), TableOptions::default())
    }

    /// The variable's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.inner.dim
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.inner.shards.len()
    }

    /// Whether optimizers train this variable.
    pub fn trainable(&self) -> bool {
        self.inner.trainable
    }

    /// Whether a registry's checkpoints ([`Registry::save_all`](crate::Registry::save_all),
    /// `restore_all`) include this variable; [`Variable::save`] saves it
    /// either way.
    pub fn checkpoint(&self) -> bool {
        self.inner.checkpoint
    }

    /// The initializer of missing keys.
    pub fn initializer(&self) -> &Initializer {
        &self.inner.initializer
    }

    /// The partitioner of keys over shards.
    pub fn partitioner(&self) -> &Partitioner {
        &self.inner.partitioner
    }

    /// How values are stored (see [`VariableBuilder::value_dtype`]).
    pub fn value_dtype(&self) -> Dtype {
        self.inner.shards[0].format().values
    }

    /// How optimizer slots are stored (see [`VariableBuilder::slot_dtype`]).
    pub fn slot_dtype(&self) -> Dtype {
        self.inner.shards[0].format().slots
    }

    /// How optimizer steps round to half precision (see
    /// [`VariableBuilder::rounding`]).
    pub fn rounding(&self) -> Rounding {
        self.inner.shards[0].format().rounding
    }

    /// How many optimizer slots rows keep beside their values (see
    /// [`VariableBuilder::inline_slots`]).
    pub fn inline_slots(&self) -> usize {
        self.inner.shards[0].format().inline_slots
    }

    /// Writes the row a missing key reads into `row`: the initializer's,
    /// rounded to the value dtype (the row training inserts).
    fn initial_row(&self, key: u64, row: &mut [f32]) {
        self.inner.initializer.fill(key, row);
        self.value_dtype().round_slice(row);
    }

    /// The restrict policy its rows' scores follow, if any.
    pub fn restrict_policy(&self) -> Option<RestrictPolicy> {
        self.inner.shards[0].restrict_policy()
    }

    fn split(&self, keys: &[K]) -> Result<Split> {
        let shards = self.inner.shards.len();
        if shards == 1 {
            // Every key is shard 0's, but a custom function is still asked,
            // so that a shard it gets wrong fails here, as it would with more
            // shards (and as a restore of what was written would).
            if let Partitioner::Custom(_) = &self.inner.partitioner {
                for &key in keys {
                    self.inner.partitioner.shard_of(key, 1)?;
                }
            }
            return Ok(Split::One(keys.iter().map(|k| k.to_bits()).collect()));
        }
        if keys.len() > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "a sharded batch holds at most {} keys, got {}",
                u32::MAX,
                keys.len()
            )));
        }
        let mut parts: Vec<(Vec<u64>, Vec<u32>)> = (0..shards)
            .map(|_| {
                let guess = keys.len() / shards + 16;
                (Vec::with_capacity(guess), Vec::with_capacity(guess))
            })
            .collect();
        for (i, &key) in keys.iter().enumerate() {
            let shard = self.inner.partitioner.shard_of(key, shards)?;
            parts[shard].0.push(key.to_bits());
            parts[shard].1.push(i as u32);
        }
        Ok(Split::Many(parts))
    }

    /// Runs `op(table, keys, positions)` on every shard's share of a batch.
    fn each_shard(
        &self,
        keys: &[K],
        op: impl FnMut(&Table, &[u64], Positions<'_>) -> Result<()>,
    ) -> Result<()> {
        self.each_share(self.split(keys)?, op)
    }

    /// [`Variable::each_shard`] of a batch already split (so that a caller
    /// can fail on a bad shard before it writes anything).
    fn each_share(
        &self,
        split: Split,
        mut op: impl FnMut(&Table, &[u64], Positions<'_>) -> Result<()>,
    ) -> Result<()> {
        // Evicted rows reach the listener once every shard is written (every
        // shard has the variable's listener, or none).
        let held = self.inner.shards[0]
            .has_listener()
            .then(HeldDeliveries::begin);
        let result = match split {
            Split::One(bits) => op(&self.inner.shards[0], &bits, Positions::Dense),
            Split::Many(parts) => self
                .inner
                .shards
                .iter()
                .zip(&parts)
                .filter(|(_, (bits, _))| !bits.is_empty())
                .try_for_each(|(table, (bits, at))| op(table, bits, Positions::At(at))),
        };
        if let Some(held) = held {
            held.finish();
        }
        result
    }

    /// Copies the rows of `keys` into `out` (`keys.len() * dim` values).
    /// Missing keys get the initializer's row (rounded to the value dtype).
    /// Never inserts.
    pub fn lookup(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        check_len("out", batch_len(keys.len(), self.dim())?, out.len())?;
        self.each_shard(keys, |table, bits, at| {
            table.lookup(bits, at, out, |_, key, row| self.initial_row(key, row))
        })
    }

    /// [`Variable::lookup`], also telling which keys were present.
    pub fn lookup_with_exists(
        &self,
        keys: &[K],
        out: &mut [f32],
        exists: &mut [bool],
    ) -> Result<()> {
        self.read_with_exists(keys, out, exists, |table, bits, at, out, absent| {
            table.lookup(bits, at, out, |i, key, row| {
                absent(at.of(i));
                self.initial_row(key, row);
            })
        })
    }

    /// A read of `keys` into `out` that flags in `exists` the positions it
    /// reports absent: checks both lengths, sets every flag, then runs
    /// `read` on each shard's keys with a callback that clears one.
    fn read_with_exists(
        &self,
        keys: &[K],
        out: &mut [f32],
        exists: &mut [bool],
        mut read: impl FnMut(
            &Table,
            &[u64],
            Positions<'_>,
            &mut [f32],
            &mut dyn FnMut(usize),
        ) -> Result<()>,
    ) -> Result<()> {
        check_len("out", batch_len(keys.len(), self.dim())?, out.len())?;
        check_len("exists", keys.len(), exists.len())?;
        let split = self.split(keys)?;
        exists.fill(true);
        self.each_share(split, |table, bits, at| {
            read(table, bits, at, out, &mut |pos| exists[pos] = false)
        })
    }

    /// Training read: copies the rows of `keys` into `out`, inserting missing
    /// keys with the initializer's row (rounded to the value dtype).
    pub fn lookup_or_insert(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        check_len("out", batch_len(keys.len(), self.dim())?, out.len())?;
        self.each_shard(keys, |table, bits, at| {
            table.lookup_or_insert(bits, at, out, |key, row| self.initial_row(key, row), |_| {})
        })
    }

    /// [`Variable::lookup_or_insert`], also telling which keys the read
    /// found or inserted: `exists[i]` is false only for a key that
    /// [admission](VariableBuilder::admission) has not admitted yet (its
    /// read returned the initializer's row and inserted nothing). In a
    /// variable at its [capacity](VariableBuilder::capacity), an insert
    /// later in the same call may evict a key reported true (a batch of
    /// more new keys than the capacity cannot keep them all). A layer
    /// drops the gradient of such a read, as an optimizer step on the
    /// table drops the key's update, so a key admitted by a later read of
    /// the same step is trained by that read's gradient alone.
    pub fn lookup_or_insert_with_exists(
        &self,
        keys: &[K],
        out: &mut [f32],
        exists: &mut [bool],
    ) -> Result<()> {
        self.read_with_exists(keys, out, exists, |table, bits, at, out, absent| {
            table.lookup_or_insert(bits, at, out, |key, row| self.initial_row(key, row), absent)
        })
    }

    /// Sets the rows of `keys` to `values` (`keys.len() * dim`), inserting
    /// absent keys. A key repeated in one batch: the last one wins. Values
    /// are stored rounded to the value dtype; one that does not fit it is
    /// an [`Error::OutOfRange`] before anything changes.
    pub fn upsert(&self, keys: &[K], values: &[f32]) -> Result<()> {
        check_len("values", batch_len(keys.len(), self.dim())?, values.len())?;
        check_fits("values", values, self.value_dtype())?;
        self.each_shard(keys, |table, bits, at| table.upsert(bits, at, values))
    }

    /// TFRA `bp_v2` accumulation. For each key: present and `exists[i]` →
    /// `row += delta`; absent and not `exists[i]` → insert `delta` as the row;
    /// otherwise ignored (the key was removed, or inserted by another writer,
    /// since the caller looked it up). Each occurrence of a key repeated in
    /// one batch follows the table by its own `exists[i]`, except that a
    /// key the batch itself inserted gets the deltas of its later
    /// occurrences added, whatever their `exists[i]`: present with `[true,
    /// false]` adds the first delta only; absent with `[false, false]`
    /// inserts the first and adds the second.
    ///
    /// A NaN or infinite delta is an [`Error::NonFinite`] (`what:
    /// "deltas"`) before anything changes. A sum that overflows to infinity
    /// (finite deltas, `3e38 + 3e38`) is refused per row, exactly as
    /// [`Variable::update_rows`] refuses a non-finite result: that row is not
    /// written (it keeps its values and its score; a key the batch itself
    /// inserted keeps the row it was inserted with), the other rows of the
    /// batch are written, and the call returns [`Error::NonFinite`] (`what:
    /// "accum result"`) whose `index` is the first such key's position in
    /// `keys` and whose `value` is the overflowed sum. Per row, not per
    /// batch: refusing the whole batch would need every row of the batch
    /// locked at once (or undo records), where a write locks one row at a
    /// time; so a failed call may have applied the other keys' deltas. A
    /// repeated key's deltas apply one occurrence at a time, so the refused
    /// occurrence leaves the row as the earlier ones made it.
    ///
    /// With a half-precision value dtype, a delta must fit it too (it may
    /// become a row): [`Error::OutOfRange`] (`what: "deltas"`) before
    /// anything changes; and a sum that leaves its range is refused per row
    /// as an overflow is, with [`Error::OutOfRange`] (`what: "accum
    /// result"`).
    pub fn accum(&self, keys: &[K], deltas: &[f32], exists: &[bool]) -> Result<()> {
        check_len("deltas", batch_len(keys.len(), self.dim())?, deltas.len())?;
        check_len("exists", keys.len(), exists.len())?;
        let dtype = self.value_dtype();
        check_fits("deltas", deltas, dtype)?;
        let mut refused = Refused::default();
        self.each_shard(keys, |table, bits, at| {
            table.accum(bits, at, deltas, exists, |pos, sum| {
                refused.note(pos, sum, dtype)
            })
        })?;
        refused.into_result("accum result")
    }

    /// Removes `keys`; absent keys are ignored.
    pub fn remove(&self, keys: &[K]) -> Result<()> {
        self.each_shard(keys, |table, bits, _| {
            table.remove(bits);
            Ok(())
        })
    }

    /// Removes every key.
    pub fn clear(&self) {
        for table in &self.inner.shards {
            table.clear();
        }
    }

    /// Makes room for about `additional` more keys (spread evenly over the
    /// shards), like `HashMap::reserve`: each shard's index grows now, once,
    /// if it must (instead of doubling again and again as the keys arrive),
    /// and the rows the new keys will take are backed with memory now
    /// ([`Variable::reserve_rows`]). A hint that returns no error and never
    /// changes what the variable holds: an index larger than memory allows
    /// is not made (the index grows as keys arrive, and if even the doubled
    /// index cannot be had the process aborts, as growth on insert does).
    /// Other threads keep reading and writing meanwhile. Growing an index
    /// migrates it on the calling thread, and writers meeting the migration
    /// wait for it: call it at normal priority.
    pub fn reserve(&self, additional: usize) {
        let per_shard = additional.div_ceil(self.num_shards());
        for table in &self.inner.shards {
            table.reserve(per_shard);
        }
        self.reserve_rows(additional);
    }

    /// Backs the rows that about `additional` new keys will take with
    /// memory now (on Linux 5.14 or later; elsewhere it does nothing), so
    /// that inserting them does not wait for the kernel to zero fresh pages
    /// under a row lock: the fresh rows beyond those the variable holds
    /// unused (removed keys' rows waiting for reuse), with their slot rows,
    /// 1 GiB of rows a call at most (split over the shards). Each column of
    /// each shard is backed to the end of the page those rows end in: with
    /// huge pages, up to 2 MiB more per column and shard, the page the next
    /// inserts there would back anyway (so a call for one row of a wide
    /// variable with many shards and slots can back a few MiB per shard).
    ///
    /// It takes no row and changes no value, and other callers wait for it
    /// only briefly (the kernel's locks, a page at a time, and the mapping
    /// of a new row segment), so a trainer can run it on a low-priority
    /// thread while its model computes, as
    /// `dynemb-candle`'s layers do after each training read
    /// ([`EmbeddingStore::reserve_rows`](crate::EmbeddingStore::reserve_rows)).
    /// The memory is committed as by a write: under a memory limit it can
    /// fail as any allocation would. [`Variable::memory_bytes`] counts these
    /// rows once they are handed out.
    pub fn reserve_rows(&self, additional: usize) {
        let shards = self.num_shards();
        let per_shard = additional.div_ceil(shards);
        let max_bytes = crate::raw::PREFAULT_MAX_BYTES / shards as u64;
        for table in &self.inner.shards {
            table.reserve_rows(per_shard, max_bytes);
        }
    }

    /// Number of keys over all shards.
    pub fn size(&self) -> usize {
        self.inner.shards.iter().map(Table::len).sum()
    }

    /// Number of keys in one shard.
    pub fn shard_size(&self, shard: usize) -> Result<usize> {
        let shards = self.num_shards();
        self.inner
            .shards
            .get(shard)
            .map(Table::len)
            .ok_or(Error::UnknownShard { shard, shards })
    }

    /// Every key and its row (`dim` values per key, in the same order); order
    /// unspecified.
    pub fn export(&self) -> Result<(Vec<K>, Vec<f32>)> {
        crate::EmbeddingTable::export(self)
    }

    /// Streams every key and row in chunks of at most `rows_per_chunk` rows,
    /// so exporting needs memory for one chunk only.
    pub fn export_chunks(
        &self,
        rows_per_chunk: usize,
    ) -> impl Iterator<Item = Result<(Vec<K>, Vec<f32>)>> + '_ {
        let mut shard = 0;
        let mut next_row = 0;
        let mut failed = false;
        std::iter::from_fn(move || {
            if failed {
                return None;
            }
            if let Err(error) = crate::checks::check_rows_per_chunk(rows_per_chunk) {
                failed = true;
                return Some(Err(error));
            }
            while let Some(table) = self.inner.shards.get(shard) {
                let values = ExportColumns {
                    values: true,
                    ..ExportColumns::default()
                };
                let rows = table.export_rows(next_row, rows_per_chunk, values);
                next_row = rows.next;
                if next_row >= table.end_of_rows() {
                    shard += 1;
                    next_row = 0;
                }
                if !rows.keys.is_empty() {
                    let keys = rows.keys.into_iter().map(K::from_bits).collect();
                    return Some(Ok((keys, rows.values)));
                }
            }
            None
        })
    }

    /// Adds the slot column `name` (an optimizer's per-row state, `dim`
    /// values per row) whose rows all start at `initial`, the rows already
    /// present included; or returns the existing slot of that name if it has
    /// an equal initial value once both are rounded to the slot dtype (`0.0`
    /// equals `-0.0`; [`Error::Mismatch`] otherwise; an initial value that
    /// does not fit the slot dtype, or is not 0 but rounds to 0 in it, is an
    /// [`Error::OutOfRange`]). At most [`MAX_SLOTS`](crate::MAX_SLOTS) slots per
    /// variable; a name is not empty and at most
    /// [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes long. An error
    /// creates nothing. [`Variable::create_slots`] creates several at once.
    pub fn create_slot(&self, name: &str, initial: f32) -> Result<SlotId> {
        let mut ids = self.create_slots(&[(name, initial)])?;
        Ok(ids.pop().expect("one slot asked for, one returned"))
    }

    /// Creates the slot columns `slots` (name, initial value), as
    /// [`Variable::create_slot`] creates each, all or nothing: every name,
    /// initial value and the room for the new columns are checked first,
    /// under the lock that serializes slot creation, so either every slot
    /// exists afterwards (their ids returned in the order asked) or the call
    /// is an error and no slot was added. A name given twice must have one
    /// initial value.
    pub fn create_slots(&self, slots: &[(&str, f32)]) -> Result<Vec<SlotId>> {
        let mut names = self
            .inner
            .slots
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let planned = self.plan_slots(&names, slots)?;
        let mut ids = Vec::with_capacity(slots.len());
        for (&(name, initial), plan) in slots.iter().zip(planned) {
            let index = match plan {
                Some(index) => index,
                // Created earlier in this call (a name given twice).
                None if names.iter().any(|n| n == name) => {
                    names.iter().position(|n| n == name).expect("just found")
                }
                None => {
                    let mut index = None;
                    for table in &self.inner.shards {
                        // Cannot fail: the initial value and the room were
                        // checked under this lock.
                        let added = table.add_slot(initial)?;
                        debug_assert!(index.is_none_or(|i| i == added), "shards add slots in step");
                        index = Some(added);
                    }
                    names.push(name.to_string());
                    index.expect("a variable has at least one shard")
                }
            };
            ids.push(self.slot_at(index));
        }
        Ok(ids)
    }

    /// Checks, changing nothing, that [`Variable::create_slots`] would
    /// succeed now with `slots`: the names, the initial values of the
    /// existing ones, and the room for the new ones. (Another thread may
    /// create slots between this check and the creation.)
    pub fn check_create_slots(&self, slots: &[(&str, f32)]) -> Result<()> {
        let names = self
            .inner
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        self.plan_slots(&names, slots).map(|_| ())
    }

    /// [`checks::plan_slots`](crate::checks::plan_slots) against this
    /// variable's slot columns `names`.
    /// The initial values are rounded to the slot dtype first (one that does
    /// not [fit it as an initial value](Dtype::fits_initial) is an
    /// [`Error::OutOfRange`]).
    fn plan_slots(&self, names: &[String], slots: &[(&str, f32)]) -> Result<Vec<Option<usize>>> {
        let dtype = self.slot_dtype();
        let initials: Vec<f32> = slots.iter().map(|&(_, initial)| initial).collect();
        if let Some(index) = initials
            .iter()
            .position(|&v| v.is_finite() && !dtype.fits_initial(v))
        {
            return Err(Error::OutOfRange {
                what: "slot initial value",
                index,
                value: initials[index],
                dtype,
            });
        }
        let slots: Vec<(&str, f32)> = slots
            .iter()
            .map(|&(name, initial)| (name, dtype.round(initial)))
            .collect();
        let existing: Vec<(&str, f32)> = names
            .iter()
            .enumerate()
            .map(|(index, name)| {
                let initial = self.inner.shards[0].slot_initial(index).unwrap_or_default();
                (name.as_str(), initial)
            })
            .collect();
        crate::checks::plan_slots(self.name(), &existing, &slots)
    }

    fn slot_at(&self, index: usize) -> SlotId {
        SlotId {
            variable: self.inner.id,
            index,
        }
    }

    /// The slot column called `name` ([`Error::UnknownSlot`] if there is
    /// none).
    pub fn slot_id(&self, name: &str) -> Result<SlotId> {
        let slots = self
            .inner
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        match slots.iter().position(|s| s == name) {
            Some(index) => Ok(self.slot_at(index)),
            None => Err(Error::UnknownSlot {
                variable: self.name().to_string(),
                slot: name.to_string(),
            }),
        }
    }

    /// The slot columns' names, in creation order (a slot's index).
    pub fn slot_names(&self) -> Vec<String> {
        self.inner
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The value every row of `slot` starts at.
    pub fn slot_initial(&self, slot: SlotId) -> Result<f32> {
        self.check_slot(slot)?;
        self.inner.shards[0]
            .slot_initial(slot.index)
            .ok_or_else(|| self.no_slot(slot))
    }

    /// The initial value `slot` was created with, before rounding to the
    /// slot dtype: what a checkpoint records, so that restoring it into
    /// another slot dtype starts the slot where the same request would.
    pub(crate) fn slot_initial_asked(&self, slot: SlotId) -> Result<f32> {
        self.check_slot(slot)?;
        self.inner.shards[0]
            .slot_initial_asked(slot.index)
            .ok_or_else(|| self.no_slot(slot))
    }

    /// Checks that `slot` is a column of this variable.
    fn check_slot(&self, slot: SlotId) -> Result<()> {
        crate::checks::check_slot(self.inner.id, self.name(), slot)?;
        let slots = self
            .inner
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if slot.index < slots.len() {
            Ok(())
        } else {
            Err(self.no_slot(slot))
        }
    }

    /// The error of a slot id of this variable whose column does not exist.
    fn no_slot(&self, slot: SlotId) -> Error {
        Error::InvalidArgument(format!(
            "variable {:?} has no slot {}",
            self.name(),
            slot.index
        ))
    }

    /// Copies `slot`'s rows of `keys` into `out` (`keys.len() * dim`
    /// values); a missing key reads the slot's initial value. Never inserts.
    pub fn lookup_slot(&self, slot: SlotId, keys: &[K], out: &mut [f32]) -> Result<()> {
        self.check_slot(slot)?;
        check_len("out", batch_len(keys.len(), self.dim())?, out.len())?;
        self.each_shard(keys, |table, bits, at| {
            table.lookup_slot(bits, at, slot.index, out)
        })
    }

    /// Copies the scores of `keys` into `out` (one per key): the restrict
    /// policy's timestamp or count, 0 for a missing key or a variable
    /// without a policy.
    pub fn lookup_scores(&self, keys: &[K], out: &mut [u64]) -> Result<()> {
        check_len("out", keys.len(), out.len())?;
        self.each_shard(keys, |table, bits, at| table.lookup_scores(bits, at, out))
    }

    /// The optimizers' primitive: a read-modify-write of each key's row and
    /// `slots` under the row's lock, so that concurrent updates of one key
    /// serialize and readers never see a half-applied step.
    ///
    /// For each key, `update(i, values, slot_rows)` gets the key's position
    /// `i` in `keys`, its row (`dim` values) and its rows of `slots` (`dim`
    /// values each, back to back in the order of `slots`); what it leaves in
    /// them is written back and the row's score is updated. A missing key
    /// gets the row it is inserted with: the initializer's row and every
    /// slot at its initial value (the same row [`Variable::lookup`] reads).
    /// A key repeated in `keys` is updated once per occurrence (optimizers
    /// sum duplicate gradients first). `update` should depend only on its
    /// arguments: it runs again when the row it was given could not be
    /// kept (a missing key that another thread inserted at the same moment,
    /// a row another thread removed); the last run's result is the one
    /// stored. It runs under the row's lock, so it must not call this
    /// variable, directly or through the eviction listener of a variable it
    /// writes (that would wait for the lock it holds), and should be short.
    /// `slots` must not repeat a slot ([`Error::InvalidArgument`]).
    ///
    /// If `update` leaves a NaN or infinite number in a row, or a value that
    /// does not fit its column's dtype (the value dtype, or the slot dtype
    /// for slot rows), that row is not written (it keeps its previous
    /// values; a missing key is not inserted) and the other rows are. The
    /// call then returns an error whose `index` is the first refused key's
    /// position in `keys`: [`Error::NonFinite`] if that key's row holds a
    /// NaN or an infinity, else [`Error::OutOfRange`]. What is written is
    /// rounded to the dtypes, as [`VariableBuilder::rounding`] says.
    pub fn update_rows(
        &self,
        keys: &[K],
        slots: &[SlotId],
        mut update: impl FnMut(usize, &mut [f32], &mut [f32]),
    ) -> Result<()> {
        check_slot_list(self.inner.id, self.name(), slots)?;
        for &slot in slots {
            self.check_slot(slot)?;
        }
        let slot_indexes: Vec<usize> = slots.iter().map(|s| s.index).collect();
        let (value_dtype, slot_dtype) = (self.value_dtype(), self.slot_dtype());
        let mut refused = Refused::default();
        self.each_shard(keys, |table, bits, at| {
            table.update_rows(
                bits,
                at,
                &slot_indexes,
                |key, row| self.initial_row(key, row),
                |i, values, slot_rows| {
                    update(i, values, slot_rows);
                    let bad = first_unfit(values, value_dtype)
                        .map(|v| (v, value_dtype))
                        .or_else(|| first_unfit(slot_rows, slot_dtype).map(|v| (v, slot_dtype)))
                        .map(|(v, dtype)| {
                            // A row with a NaN or an infinity is refused
                            // as `NonFinite`, whatever else it holds.
                            let mut row = values.iter().chain(&*slot_rows).copied();
                            (row.find(|v| !v.is_finite()).unwrap_or(v), dtype)
                        });
                    if let Some((value, dtype)) = bad {
                        refused.note(i, value, dtype);
                    }
                    bad.is_none()
                },
            )
        })?;
        refused.into_result("update_rows result")
    }

    /// TFRA's `restrict`: if the variable holds more than `trigger` rows,
    /// keeps the `num_reserved` rows with the highest scores (per its
    /// [`RestrictPolicy`]: the most recently or most often written) and
    /// removes the others with their slots. Returns how many rows it
    /// removed. Rows with equal scores at the boundary are kept or removed
    /// arbitrarily. A variable without a restrict policy is an
    /// [`Error::InvalidArgument`].
    ///
    /// It scans every shard twice (once for the scores, once to remove) and
    /// holds one `u64` per row meanwhile. Run it between training steps:
    /// the counts above are exact when no other thread writes meanwhile.
    /// While others write, it still removes at most `size() -
    /// num_reserved` rows (as counted by its first scan), chosen by their
    /// scores when it reaches them, and never a row whose score was above
    /// the selection threshold then.
    pub fn restrict(&self, num_reserved: usize, trigger: usize) -> Result<usize> {
        crate::checks::check_restrict_policy(self.name(), self.restrict_policy())?;
        if self.size() <= trigger {
            return Ok(0);
        }
        let scored = ExportColumns {
            scores: true,
            ..ExportColumns::default()
        };
        let mut scores = Vec::with_capacity(self.size());
        self.scan(scored, |_, rows| scores.extend_from_slice(&rows.scores));
        let Some(excess) = scores.len().checked_sub(num_reserved).filter(|&e| e > 0) else {
            return Ok(0);
        };
        let (_, &mut threshold, _) = scores.select_nth_unstable(excess - 1);
        let below = scores.iter().filter(|&&s| s < threshold).count();
        let mut ties = excess - below;
        drop(scores);
        // Never more than `excess` victims, even if writers add low-scored
        // rows between the two scans.
        let mut budget = excess;
        let mut removed = 0;
        self.scan(scored, |table, rows| {
            let victims: Vec<u64> = rows
                .keys
                .iter()
                .zip(&rows.scores)
                .filter(|&(_, &score)| {
                    let tie = score == threshold && ties > 0;
                    let victim = budget > 0 && (score < threshold || tie);
                    ties -= usize::from(tie && victim);
                    budget -= usize::from(victim);
                    victim
                })
                .map(|(&key, _)| key)
                .collect();
            removed += table.remove(&victims);
        });
        Ok(removed)
    }

    /// Runs `visit(shard, rows)` on every shard's rows, a chunk at a time.
    fn scan(&self, columns: ExportColumns, mut visit: impl FnMut(&Table, &ExportedRows)) {
        for table in &self.inner.shards {
            let mut next = 0;
            while next < table.end_of_rows() {
                let rows = table.export_rows(next, SCAN_CHUNK, columns);
                next = rows.next;
                visit(table, &rows);
            }
        }
    }

    /// Sets the rows of `keys` to `values`, the slot columns `slots` (`(slot
    /// index, rows)`) to their rows and, if given, the scores: a
    /// checkpoint's load.
    pub(crate) fn upsert_rows(
        &self,
        keys: &[K],
        values: &[f32],
        slots: &[(usize, &[f32])],
        scores: Option<&[u64]>,
    ) -> Result<()> {
        check_len("values", batch_len(keys.len(), self.dim())?, values.len())?;
        self.each_shard(keys, |table, bits, at| {
            table.upsert_rows(bits, at, values, slots, scores)
        })
    }

    /// Bytes of memory in use by the variable's tables: the rows handed out
    /// (values, row headers, scores and slot rows; the rows of removed keys
    /// stay allocated for reuse and count) and the indexes, counted as the
    /// memory the system backs them with, not the address space reserved
    /// ahead. So a variable built with a large
    /// [`init_size`](VariableBuilder::init_size) that holds few keys reports
    /// what those keys occupy: at most one 2 MiB page per key in each of its
    /// index's two arrays (their pages are backed as keys are written into
    /// them), plus their rows. An upper bound of the resident memory, exact
    /// for rows. Not counted: the variable's own small structures and a
    /// retired index not yet freed.
    pub fn memory_bytes(&self) -> usize {
        self.inner.shards.iter().map(Table::memory_bytes).sum()
    }

    /// Saves every row to the checkpoint directory `dir` (safetensors files
    /// plus `index.json`), replacing a checkpoint already there only once
    /// the new one is complete on disk. Runs while other threads train; see
    /// [`checkpoint`](crate::checkpoint) for the format, crash safety and
    /// what a save captures.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        checkpoint::save(self, dir.as_ref())
    }

    /// Replaces the variable's contents with the checkpoint at `dir`. The
    /// whole checkpoint is checked first (checksums, key type, dim, shapes,
    /// finite values that fit the variable's dtypes); if anything is wrong
    /// the variable is left as it was. (An eviction listener that panics
    /// stops a restore part-way: rows evicted while a checkpoint file is
    /// written reach it after that file, see
    /// [`VariableBuilder::on_evict`].)
    /// The checkpoint may come from a variable with another shard count.
    pub fn restore(&self, dir: impl AsRef<Path>) -> Result<()> {
        checkpoint::read_into(self, dir.as_ref(), true)
    }

    /// Upserts the rows of the checkpoint at `dir` into the variable (keys
    /// not in the checkpoint keep their rows). Checked first like
    /// [`Variable::restore`].
    pub fn load(&self, dir: impl AsRef<Path>) -> Result<()> {
        checkpoint::read_into(self, dir.as_ref(), false)
    }

    /// The most rows the variable holds, if it was built with a
    /// [`capacity`](VariableBuilder::capacity).
    pub fn capacity(&self) -> Option<usize> {
        self.inner.capacity
    }

    /// Removes the rows (with their slots) not written for `older_than`
    /// (Monolith's and TorchRec's expiry by age) and returns how many. A
    /// row is old when its [`RestrictPolicy::Timestamp`] score is older
    /// than `now - older_than`; a row written while the scan runs is kept
    /// (each row's age is checked again under its lock just before it is
    /// removed). A variable without the Timestamp policy is an
    /// [`Error::InvalidArgument`]. Expired rows do not go to the eviction
    /// listener. It scans every shard once, a chunk at a time.
    pub fn expire(&self, older_than: Duration) -> Result<usize> {
        let cutoff = crate::checks::expiry_cutoff(self.name(), self.restrict_policy(), older_than)?;
        let removed: usize = self.inner.shards.iter().map(|t| t.expire(cutoff)).sum();
        self.inner
            .expired
            .fetch_add(removed as u64, Ordering::Relaxed);
        Ok(removed)
    }

    /// What capacity, admission and expiry did since the variable was
    /// built.
    pub fn lifecycle_stats(&self) -> LifecycleStats {
        let mut stats = LifecycleStats {
            expired: self.inner.expired.load(Ordering::Relaxed),
            ..LifecycleStats::default()
        };
        for table in &self.inner.shards {
            stats.evicted += table.evicted();
            stats.not_admitted_reads += table.not_admitted_reads();
        }
        stats
    }

    /// The admission counts, for checkpoints.
    pub(crate) fn admitter(&self) -> Option<&Admitter> {
        self.inner.admitter.as_deref()
    }

    /// The variable's shards, for the checkpoint writer.
    pub(crate) fn shards(&self) -> &[Table] {
        &self.inner.shards
    }
}
