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

use crate::{Error, Initializer, Key, Partitioner, RestrictPolicy, Result, Variable, MAX_DIM};
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
    /// Whether checkpoints save the table.
    pub checkpoint: bool,
    /// What each row's score means, if rows keep one (for `restrict`).
    pub restrict_policy: Option<RestrictPolicy>,
}

impl Default for TableOptions {
    /// Dim 1, one shard, [`Partitioner::Modulo`], [`Initializer::Zeros`],
    /// no size hint, trainable, checkpointed, no restrict policy.
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
        }
    }
}

impl TableOptions {
    /// Checks the options of a table called `name`, for every storage: the
    /// name is at most [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes,
    /// `dim` is in `1..=MAX_DIM`, `shards` in `1..=MAX_SHARDS`, and the
    /// initializer fits `dim` ([`Initializer::Values`] of the right length,
    /// finite parameters). An [`Error::InvalidArgument`] names the setting.
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
        self.initializer.validate(self.dim)
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

    /// Whether checkpoints save this variable (default true).
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
