//! [`TableOptions`]: the settings every embedding table takes, whatever
//! its storage, checked in one place ([`TableOptions::check`]); and
//! [`VariableBuilder`], which carries them with a name to a local
//! [`Variable`] (`build`) or to another storage (`dynemb-redis`'s
//! `RedisVariable::open` takes the same builder), as TFRA's `kv_creator`
//! gives one `Variable` description for every backend.
//!
//! A storage that cannot honour a setting refuses it when the table is
//! built, never ignoring it silently; what each storage refuses is in its
//! docs (a local [`Variable`] takes them all).

use crate::lifecycle::{Admission, EvictListener, Evicted};
use crate::{
    Dtype, Error, Initializer, Key, Partitioner, RestrictPolicy, Result, Rounding, Variable,
    MAX_DIM, MAX_SLOTS,
};
use std::marker::PhantomData;

/// Most shards a variable may have.
pub const MAX_SHARDS: usize = 1 << 16;

/// The settings of an embedding table, whatever its storage. The builder
/// methods of [`VariableBuilder`] set them one by one; a whole set can be
/// kept and reused with [`VariableBuilder::options`].
#[derive(Debug, Clone)]
pub struct TableOptions {
    /// Values per row: 1 to [`MAX_DIM`].
    pub dim: usize,
    /// Number of shards, TFRA's `devices`: 1 to [`MAX_SHARDS`].
    pub shards: usize,
    /// How keys are spread over the shards.
    pub partitioner: Partitioner,
    /// How rows of missing keys are made.
    pub initializer: Initializer,
    /// Capacity hint in rows, split across shards (see
    /// [`VariableBuilder::init_size`]).
    pub init_size: usize,
    /// Whether optimizers train the table.
    pub trainable: bool,
    /// Whether a registry's checkpoints include the table (its own `save`
    /// saves it either way).
    pub checkpoint: bool,
    /// What each row's score means, if rows keep one (for `restrict`, and
    /// for eviction: a capacity without a policy uses
    /// [`RestrictPolicy::Timestamp`]).
    pub restrict_policy: Option<RestrictPolicy>,
    /// Most rows the table holds (see [`VariableBuilder::capacity`]).
    pub capacity: Option<usize>,
    /// When a key becomes a row (see [`VariableBuilder::admission`]).
    pub admission: Option<Admission>,
    /// Receives the rows evicted by capacity (see
    /// [`VariableBuilder::on_evict`]).
    pub on_evict: Option<EvictListener>,
    /// Whether eviction ages frequencies (see
    /// [`VariableBuilder::frequency_decay`]).
    pub frequency_decay: bool,
    /// How values are stored (see [`VariableBuilder::value_dtype`]).
    pub value_dtype: Dtype,
    /// How optimizer slots are stored (see [`VariableBuilder::slot_dtype`]).
    pub slot_dtype: Dtype,
    /// How optimizer steps round to half precision (see
    /// [`VariableBuilder::rounding`]).
    pub rounding: Rounding,
    /// Optimizer slots kept inside each row, after its values (see
    /// [`VariableBuilder::inline_slots`]).
    pub inline_slots: usize,
}

impl Default for TableOptions {
    /// Dim 1, one shard, [`Partitioner::Modulo`], [`Initializer::Zeros`],
    /// no size hint, trainable, checkpointed, no restrict policy, no
    /// capacity, admission, listener or decay, `f32` values and slots,
    /// every slot in a column of its own.
    fn default() -> Self {
        TableOptions {
            dim: 1,
            shards: 1,
            partitioner: Partitioner::Modulo,
            initializer: Initializer::Zeros,
            init_size: 0,
            trainable: true,
            checkpoint: true,
            restrict_policy: None,
            capacity: None,
            admission: None,
            on_evict: None,
            frequency_decay: false,
            value_dtype: Dtype::F32,
            slot_dtype: Dtype::F32,
            rounding: Rounding::NearestEven,
            inline_slots: 0,
        }
    }
}

impl TableOptions {
    /// Checks the options of a table called `name`, for every storage: the
    /// name is at most [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes,
    /// `dim` is in `1..=MAX_DIM`, `shards` in `1..=MAX_SHARDS`, and the
    /// initializer fits `dim` ([`Initializer::Values`] of the right length,
    /// finite parameters), a capacity holds at least one row per shard,
    /// admission's `min_count` is at least 1 (a sketch's at most
    /// `u16::MAX` and at most its ageing period, [`SKETCH_AGEING_READS`](crate::lifecycle::SKETCH_AGEING_READS)
    /// x `width`; its width and depth at least 1, depth at most 16), and
    /// the listener and decay have a capacity to act on (decay also needs
    /// [`RestrictPolicy::Frequency`]), `inline_slots` is at most
    /// [`MAX_SLOTS`] and leaves a row's numbers (values and inline slots) no
    /// larger than [`MAX_DIM`] `f32` values, and every row the initializer makes
    /// fits the value dtype ([`Initializer::max_magnitude`]). An
    /// [`Error::InvalidArgument`] names the setting.
    pub fn check(&self, name: &str) -> Result<()> {
        crate::check_name("variable name", name)?;
        if !(1..=MAX_DIM).contains(&self.dim) {
            return Err(Error::InvalidArgument(format!(
                "variable {name:?}: dim must be in 1..={MAX_DIM}, got {}",
                self.dim
            )));
        }
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(Error::InvalidArgument(format!(
                "variable {name:?}: shards must be in 1..={MAX_SHARDS}, got {}",
                self.shards
            )));
        }
        if self.inline_slots > MAX_SLOTS {
            return Err(Error::InvalidArgument(format!(
                "variable {name:?}: inline_slots must be at most {MAX_SLOTS} (the most slots \
                 a table holds), got {}",
                self.inline_slots
            )));
        }
        let row_bytes = self.dim
            * (self.value_dtype.size_bytes() + self.inline_slots * self.slot_dtype.size_bytes());
        let largest = MAX_DIM * Dtype::F32.size_bytes();
        if row_bytes > largest {
            return Err(Error::InvalidArgument(format!(
                "variable {name:?}: {} values with {} slots inline take {row_bytes} bytes a \
                 row; at most {largest} (a row of MAX_DIM f32 values)",
                self.dim, self.inline_slots
            )));
        }
        self.initializer.validate(self.dim)?;
        let largest = self.initializer.max_magnitude();
        if !self.value_dtype.fits(largest) {
            return Err(Error::InvalidArgument(format!(
                "variable {name:?}: the initializer makes values up to {largest}, \
                 which do not fit the value dtype {}",
                self.value_dtype
            )));
        }
        self.check_lifecycle(name)
    }

    /// The lifecycle part of [`TableOptions::check`].
    fn check_lifecycle(&self, name: &str) -> Result<()> {
        let refuse =
            |what: String| Err(Error::InvalidArgument(format!("variable {name:?}: {what}")));
        if let Some(capacity) = self.capacity {
            if capacity < self.shards {
                return refuse(format!(
                    "capacity {capacity} is less than one row per shard ({} shards)",
                    self.shards
                ));
            }
        }
        match self.admission {
            Some(a) if a.min_count() == 0 => {
                return refuse("admission min_count must be at least 1".into())
            }
            Some(Admission::Sketch {
                min_count,
                width,
                depth,
            }) => {
                if min_count > u32::from(u16::MAX) {
                    return refuse(format!(
                        "sketch admission counts to at most {}, min_count is {min_count}",
                        u16::MAX
                    ));
                }
                if width == 0 || !(1..=16).contains(&depth) {
                    return refuse(format!(
                        "sketch admission needs width >= 1 and depth in 1..=16, got {width} x {depth}"
                    ));
                }
                if width.checked_mul(depth).is_none_or(|n| n > 1 << 32) {
                    return refuse(format!("sketch of {width} x {depth} counters is too large"));
                }
            }
            _ => {}
        }
        if self.on_evict.is_some() && self.capacity.is_none() {
            return refuse("on_evict needs a capacity: only capacity evicts".into());
        }
        if self.frequency_decay
            && (self.capacity.is_none() || self.restrict_policy != Some(RestrictPolicy::Frequency))
        {
            return refuse(
                "frequency_decay needs a capacity and the Frequency restrict policy".into(),
            );
        }
        Ok(())
    }

    /// The restrict policy rows keep: the one given, or
    /// [`RestrictPolicy::Timestamp`] for a table with a capacity (eviction
    /// needs scores).
    pub fn effective_restrict_policy(&self) -> Option<RestrictPolicy> {
        self.restrict_policy
            .or(self.capacity.map(|_| RestrictPolicy::Timestamp))
    }
}

/// A table to build: its name and [`TableOptions`]. [`build`](Self::build)
/// makes a local [`Variable`]; another storage takes the same builder
/// (`dynemb_redis::RedisVariable::open(builder, config)`).
#[derive(Debug, Clone)]
pub struct VariableBuilder<K: Key> {
    name: String,
    options: TableOptions,
    _key: PhantomData<fn() -> K>,
}

impl<K: Key> VariableBuilder<K> {
    /// A builder of a table called `name` with `options`.
    pub fn new(name: impl Into<String>, options: TableOptions) -> Self {
        VariableBuilder {
            name: name.into(),
            options,
            _key: PhantomData,
        }
    }

    /// Values per row (default 1; 0 or more than [`MAX_DIM`] is an error at
    /// build).
    pub fn dim(mut self, dim: usize) -> Self {
        self.options.dim = dim;
        self
    }

    /// Number of shards, TFRA's `devices` (default 1; 0 or more than
    /// [`MAX_SHARDS`] is an error at build).
    pub fn shards(mut self, shards: usize) -> Self {
        self.options.shards = shards;
        self
    }

    /// How keys are spread over shards (default [`Partitioner::Modulo`]).
    pub fn partitioner(mut self, partitioner: Partitioner) -> Self {
        self.options.partitioner = partitioner;
        self
    }

    /// How rows of missing keys are made (default [`Initializer::Zeros`]).
    pub fn initializer(mut self, initializer: Initializer) -> Self {
        self.options.initializer = initializer;
        self
    }

    /// Capacity hint in rows, split across shards: the tables do not grow
    /// before holding about this many keys. Only their indexes are sized
    /// ahead (about 20 bytes per row, as address space the system backs as
    /// keys arrive); rows are allocated as keys arrive. More rows than a
    /// shard can hold is [`Error::CapacityExceeded`] at build, an index
    /// larger than the system will map [`Error::OutOfMemory`].
    pub fn init_size(mut self, rows: usize) -> Self {
        self.options.init_size = rows;
        self
    }

    /// Whether optimizers train this variable (default true).
    pub fn trainable(mut self, yes: bool) -> Self {
        self.options.trainable = yes;
        self
    }

    /// Whether a registry's checkpoints ([`Registry::save_all`](crate::Registry::save_all),
    /// `restore_all`) include this variable (default true);
    /// [`Variable::save`](crate::Variable::save) saves it either way.
    pub fn checkpoint(mut self, yes: bool) -> Self {
        self.options.checkpoint = yes;
        self
    }

    /// Keeps a score per row for `policy`, so that [`Variable::restrict`]
    /// can remove the least recently or least often written rows (default:
    /// none, and no score is kept).
    pub fn restrict_policy(mut self, policy: RestrictPolicy) -> Self {
        self.options.restrict_policy = Some(policy);
        self
    }

    /// Bounds the variable to `rows` rows: `size()` never exceeds it,
    /// under any number of threads. An insert into a full variable evicts
    /// a low-scored row with its slots (the restrict policy's score:
    /// Timestamp is least recently written first, Frequency least often;
    /// with no policy given the variable uses
    /// [`RestrictPolicy::Timestamp`]), and hands it to the
    /// [`on_evict`](Self::on_evict) listener. No insert is refused:
    /// `upsert`, `restore` and `load` evict as training inserts do (a
    /// restore past the capacity keeps about the highest-scored rows, and
    /// what it evicts goes to the listener). The
    /// choice is approximate: the lowest-ranked of the rows a sweep has
    /// seen recently (see the crate docs' "Row lifecycle").
    /// Each shard holds at most its share (`rows / shards`, the first
    /// shards one more); fewer rows than shards is an error at build. At
    /// capacity the index no longer grows: it keeps its size and is
    /// rebuilt in place now and then to clear what evictions leave behind.
    pub fn capacity(mut self, rows: usize) -> Self {
        self.options.capacity = Some(rows);
        self
    }

    /// Admits a key only at its `min_count`-th training read (see
    /// [`Admission`]); default: every key at its first.
    pub fn admission(mut self, admission: Admission) -> Self {
        self.options.admission = Some(admission);
        self
    }

    /// Receives every row that leaves by capacity eviction, exactly once,
    /// in batches, before the call that evicted it returns: keys, values,
    /// each slot's rows and scores ([`Evicted`]). It runs on the thread of
    /// that call, after the call's rows are written in every shard (a call
    /// over several shards holds each shard's evicted rows until its last
    /// shard is written; a `restore` or `load` delivers after each
    /// checkpoint file it writes, so a listener's panic stops it part-way).
    /// It may read and write other tables (a slower tier) and this one, but
    /// a write that evicts from within it calls it again. Rows removed
    /// otherwise (`remove`, `restrict`, `expire`, `clear`, and the clearing
    /// a `restore` starts with) do not come here. A panic in it propagates
    /// to the call that evicted (its rows stay evicted), once every batch of
    /// evicted rows the call held has been delivered. Needs a
    /// [`capacity`](Self::capacity).
    pub fn on_evict(mut self, f: impl Fn(Evicted<'_, K>) + Send + Sync + 'static) -> Self {
        self.options.on_evict = Some(EvictListener::new(f));
        self
    }

    /// LFU ageing, so keys frequent long ago do not stay forever: with
    /// [`RestrictPolicy::Frequency`] and a capacity, eviction compares
    /// counts that the eviction sweep halves once per about as many
    /// evictions as a shard holds rows (as TinyLFU halves its counters once
    /// per ten times its size of reads); a checkpoint's restore or load
    /// that restores the counts (its policy is the variable's) does not age
    /// them. The scores a user sees
    /// (`lookup_scores`, `restrict`, checkpoints, [`Evicted::scores`]) stay
    /// the count of writes. Default off: eviction compares the plain
    /// counts.
    pub fn frequency_decay(mut self, yes: bool) -> Self {
        self.options.frequency_decay = yes;
        self
    }

    /// Stores values as `dtype` (default [`Dtype::F32`], TFRA's
    /// `value_dtype`). The API stays `f32`: values are rounded to nearest
    /// even when written and widened when read, and the row a missing key
    /// reads is the initializer's rounded the same way (the row training
    /// inserts). A value that does not fit the dtype is an
    /// [`Error::OutOfRange`] that writes nothing (see [`Dtype`]).
    pub fn value_dtype(mut self, dtype: Dtype) -> Self {
        self.options.value_dtype = dtype;
        self
    }

    /// Stores optimizer slots (Adam's `m` and `v`, ...) as `dtype`
    /// (default [`Dtype::F32`]), independently of the values: a slot's
    /// initial value is rounded to it, and an update that leaves a slot
    /// value out of its range is refused for that row. In f16, values
    /// below about `3e-8` round to zero (and those below `6e-5` keep fewer
    /// bits, as subnormals): Adam's `v` (squared gradients) can vanish
    /// there, so bf16, with `f32`'s range, suits slots better.
    pub fn slot_dtype(mut self, dtype: Dtype) -> Self {
        self.options.slot_dtype = dtype;
        self
    }

    /// How optimizer steps round what they write to bf16 columns (default
    /// [`Rounding::NearestEven`]; see [`Rounding::Stochastic`]).
    pub fn rounding(mut self, rounding: Rounding) -> Self {
        self.options.rounding = rounding;
        self
    }

    /// Keeps the first `slots` optimizer slots (in the order they are
    /// created: Adam's `m` and `v`, an Adagrad accumulator, ...) inside each
    /// row, right after its values, instead of in columns of their own
    /// (default 0). An optimizer step then reads and writes one block of
    /// adjacent cache lines per key (values, `m`, `v`) rather than a place
    /// in each of three columns. Room for a slot is kept in every row from
    /// the start, so room no optimizer fills is memory spent for nothing;
    /// slots past `slots` get columns of their own as usual. Lookups read
    /// only the header and values either way. A row is padded (by at most
    /// an eighth of its bytes) so that it spans its fewest cache lines at
    /// every row id, and so do its header and values where that padding
    /// allows; at some dims it does not, and a lookup's values straddle
    /// one more line than without inline slots (with Adam's two `f32`
    /// slots: dims 11, 12, 25 and 26, or 1, 2, 9, 10, 25 and 26 with a
    /// restrict policy's score; never at dims 16, 32, 64, 128 or 256). At
    /// most [`MAX_SLOTS`], and the values with their inline slots may take
    /// no more bytes than [`MAX_DIM`] `f32` values.
    pub fn inline_slots(mut self, slots: usize) -> Self {
        self.options.inline_slots = slots;
        self
    }

    /// Replaces every setting with `options` (the name stays).
    pub fn options(mut self, options: TableOptions) -> Self {
        self.options = options;
        self
    }

    /// The variable's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings so far.
    pub fn table_options(&self) -> &TableOptions {
        &self.options
    }

    /// The name and the settings, for a storage that builds its own table
    /// from them (it checks them with [`TableOptions::check`]).
    pub fn into_parts(self) -> (String, TableOptions) {
        (self.name, self.options)
    }

    /// Checks the settings ([`TableOptions::check`]) and creates the
    /// variable's tables.
    pub fn build(self) -> Result<Variable<K>> {
        self.options.check(&self.name)?;
        Variable::from_options(self.name, self.options)
    }

    /// Renames the variable to build (the registry prefixes scope names).
    pub(crate) fn set_name(&mut self, name: String) {
        self.name = name;
    }

    /// The same settings for another key type (no setting depends on it).
    pub(crate) fn cast<K2: Key>(self) -> VariableBuilder<K2> {
        VariableBuilder::new(self.name, self.options)
    }
}
