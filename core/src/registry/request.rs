//! [`VariableRequest`] and [`Getter`]: what a custom getter receives and
//! calls. The design is on [`VariableRequest`].

use super::{AnyVariable, Reuse};
use crate::{Dtype, Initializer, Key, Partitioner, RestrictPolicy, Result, VariableBuilder};

/// A custom getter as a scope stores it.
pub(crate) type CustomGetterFn =
    dyn Fn(&Getter<'_>, VariableRequest) -> Result<AnyVariable> + Send + Sync;

/// A variable asked of a registry, as a custom getter sees it: a
/// [`VariableBuilder`] whose key type is known by name only, plus the
/// request's reuse mode and whether it is for a local variable.
///
/// Getters read it (`name`, `dim`, ...) and pass on a changed copy
/// (`with_name`, `with_dim`, ...).
///
/// # Design
///
/// TF's custom getter is `f(getter, name, *args, **kwargs)`: it may change
/// any argument, call `getter` (the next getter, ending at the real one) any
/// number of times, and return a variable. A Rust closure cannot be generic
/// over the key type, and a scope stores its getters as closures, so the
/// request is **type-erased**: it carries every builder setting, the key
/// type's name (fixed: a getter cannot change it), the reuse mode and whether
/// a local variable is asked for; the getter chain returns an
/// [`AnyVariable`]. The typed `get_variable::<K>` that started the chain
/// downcasts the result; a getter that returns a variable of another key
/// type (taken from elsewhere) makes it fail with
/// [`Error::Mismatch`](crate::Error::Mismatch).
///
/// A getter sees the request's **full** name (scopes included) and may set
/// any full name (it is validated by the real getter); it may change dim,
/// shards, partitioner, initializer, capacity hint, trainable, checkpoint,
/// restrict policy, value and slot dtypes, and reuse mode.
#[derive(Debug, Clone)]
pub struct VariableRequest {
    /// Every setting; the key type is `key_type`, not `u64` (no setting
    /// depends on it).
    builder: VariableBuilder<u64>,
    key_type: &'static str,
    reuse: Reuse,
    local: bool,
}

impl VariableRequest {
    /// A request for `builder`'s variable, typed `K`.
    pub(crate) fn new<K: Key>(builder: VariableBuilder<K>, reuse: Reuse, local: bool) -> Self {
        VariableRequest {
            builder: builder.cast(),
            key_type: K::TYPE_NAME,
            reuse,
            local,
        }
    }

    /// The builder back, typed `K` (the registry's key type for this request).
    pub(crate) fn into_builder<K: Key>(self) -> VariableBuilder<K> {
        self.builder.cast()
    }

    fn map(mut self, f: impl FnOnce(VariableBuilder<u64>) -> VariableBuilder<u64>) -> Self {
        self.builder = f(self.builder);
        self
    }

    /// The variable's full name (scopes included).
    pub fn name(&self) -> &str {
        self.builder.name()
    }

    /// The key type's name ([`Key::TYPE_NAME`]).
    pub fn key_type(&self) -> &'static str {
        self.key_type
    }

    /// The requested values per row.
    pub fn dim(&self) -> usize {
        self.builder.table_options().dim
    }

    /// Whether the variable is to be trainable.
    pub fn trainable(&self) -> bool {
        self.builder.table_options().trainable
    }

    /// Whether the variable is to be checkpointed.
    pub fn checkpoint(&self) -> bool {
        self.builder.table_options().checkpoint
    }

    /// How the values are to be stored ([`VariableBuilder::value_dtype`]).
    pub fn value_dtype(&self) -> Dtype {
        self.builder.table_options().value_dtype
    }

    /// How the optimizer slots are to be stored
    /// ([`VariableBuilder::slot_dtype`]).
    pub fn slot_dtype(&self) -> Dtype {
        self.builder.table_options().slot_dtype
    }

    /// The reuse mode the real getter will apply.
    pub fn reuse(&self) -> Reuse {
        self.reuse
    }

    /// Whether `get_local_variable` made the request (a variable created
    /// from it goes in [`Collection::Local`](crate::Collection::Local)).
    pub fn is_local(&self) -> bool {
        self.local
    }

    /// Sets the full name (no scope is added to it).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.builder.set_name(name.into());
        self
    }

    /// Sets the values per row ([`VariableBuilder::dim`]).
    pub fn with_dim(self, dim: usize) -> Self {
        self.map(|b| b.dim(dim))
    }

    /// Sets the shard count ([`VariableBuilder::shards`]).
    pub fn with_shards(self, shards: usize) -> Self {
        self.map(|b| b.shards(shards))
    }

    /// Sets the partitioner ([`VariableBuilder::partitioner`]).
    pub fn with_partitioner(self, partitioner: Partitioner) -> Self {
        self.map(|b| b.partitioner(partitioner))
    }

    /// Sets the initializer ([`VariableBuilder::initializer`]).
    pub fn with_initializer(self, initializer: Initializer) -> Self {
        self.map(|b| b.initializer(initializer))
    }

    /// Sets the capacity hint ([`VariableBuilder::init_size`]).
    pub fn with_init_size(self, rows: usize) -> Self {
        self.map(|b| b.init_size(rows))
    }

    /// Sets whether the variable is trainable ([`VariableBuilder::trainable`]).
    pub fn with_trainable(self, yes: bool) -> Self {
        self.map(|b| b.trainable(yes))
    }

    /// Sets whether the variable is checkpointed
    /// ([`VariableBuilder::checkpoint`]).
    pub fn with_checkpoint(self, yes: bool) -> Self {
        self.map(|b| b.checkpoint(yes))
    }

    /// Sets the restrict policy ([`VariableBuilder::restrict_policy`]).
    pub fn with_restrict_policy(self, policy: RestrictPolicy) -> Self {
        self.map(|b| b.restrict_policy(policy))
    }

    /// Sets how the values are stored ([`VariableBuilder::value_dtype`]):
    /// a mixed-precision getter's storage.
    pub fn with_value_dtype(self, dtype: Dtype) -> Self {
        self.map(|b| b.value_dtype(dtype))
    }

    /// Sets how the optimizer slots are stored
    /// ([`VariableBuilder::slot_dtype`]).
    pub fn with_slot_dtype(self, dtype: Dtype) -> Self {
        self.map(|b| b.slot_dtype(dtype))
    }

    /// Sets the reuse mode the real getter applies.
    pub fn with_reuse(mut self, reuse: Reuse) -> Self {
        self.reuse = reuse;
        self
    }
}

/// The getter a custom getter wraps: the enclosing scope's custom getter,
/// or the registry's real getter. It may be called any number of times.
pub struct Getter<'a> {
    next: &'a dyn Fn(VariableRequest) -> Result<AnyVariable>,
}

impl<'a> Getter<'a> {
    pub(crate) fn new(next: &'a dyn Fn(VariableRequest) -> Result<AnyVariable>) -> Self {
        Getter { next }
    }

    /// Gets or creates the variable `request` describes, through the rest of
    /// the chain.
    pub fn get(&self, request: VariableRequest) -> Result<AnyVariable> {
        (self.next)(request)
    }
}

impl std::fmt::Debug for Getter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Getter")
    }
}
