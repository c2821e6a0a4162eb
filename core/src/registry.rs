//! [`Registry`]: TensorFlow's `get_variable` / `get_local_variable` for
//! dynamic embeddings, with name scopes, reuse modes, collections and custom
//! getters.
//!
//! ```
//! use dynemb::{Collection, Error, Registry, Reuse, Variable};
//!
//! let registry = Registry::new();
//! let tower = registry.scope("tower");
//! let emb = tower.get_variable(Variable::<i64>::builder("emb").dim(8))?;
//! assert_eq!(emb.name(), "tower/emb");
//!
//! // The same name gives the same tables.
//! let again = tower.get_variable(Variable::<i64>::builder("emb").dim(8))?;
//! again.upsert(&[1], &[0.5; 8])?;
//! assert_eq!(emb.size(), 1);
//!
//! // Reuse modes, and the mismatch check.
//! let fresh = registry.scope("tower").reuse(Reuse::No);
//! assert!(matches!(
//!     fresh.get_variable(Variable::<i64>::builder("emb").dim(8)),
//!     Err(Error::AlreadyExists { .. })
//! ));
//! assert!(matches!(
//!     tower.get_variable(Variable::<u64>::builder("emb").dim(16)),
//!     Err(Error::Mismatch { .. })
//! ));
//! assert_eq!(registry.collection(Collection::Trainable), ["tower/emb"]);
//! # Ok::<(), dynemb::Error>(())
//! ```
//!
//! # Rules
//!
//! - **Names.** A variable's full name is its scopes' names and the builder's
//!   name joined by `/` (`registry.scope("tower").scope("user")` and `"emb"`
//!   give `"tower/user/emb"`). A name that is empty or has an empty component
//!   (`"a//b"`, `"/a"`, `"a/"`, which an empty scope or builder name produces)
//!   is an [`Error::InvalidArgument`].
//! - **One variable per name.** A name maps to at most one variable for the
//!   registry's lifetime (nothing is ever removed). Every handle returned for
//!   a name is a clone of that variable: same tables, same data, same size.
//! - **Reuse.** Each [`Scope`] has a [`Reuse`] mode. [`Reuse::No`]: the name
//!   must not exist ([`Error::AlreadyExists`]); [`Reuse::Yes`]: it must
//!   ([`Error::NotFound`]); [`Reuse::Auto`]: get it or create it. The top level
//!   ([`Registry::get_variable`]) is `Auto`; a child scope inherits its
//!   parent's mode when it is made, and [`Scope::reuse`] sets it. Unlike TF1,
//!   where `reuse=True` is sticky in sub-scopes, an explicit mode always
//!   applies.
//! - **Mismatch.** Getting an existing variable with another key type,
//!   another dim or another value dtype is an [`Error::Mismatch`] naming
//!   both (TF refuses to share a variable of another dtype). Other settings of a
//!   later request (shards, initializer, trainable, ...) are ignored: the
//!   existing variable wins, as in TF.
//! - **Collections.** Every variable is in [`Collection::Global`];
//!   trainable ones also in [`Collection::Trainable`]; those created by
//!   `get_local_variable` (trainable = false) also in [`Collection::Local`].
//!   [`Registry::collection`] lists names in creation order (the order in
//!   which creations completed). Membership is decided when the variable is
//!   created: `get_local_variable` of a name that exists as a global variable
//!   returns that variable unchanged, as TF does. Unlike TF, local variables
//!   are also in `Global` ("every variable of the registry"); whether a
//!   variable is checkpointed is its own `checkpoint` flag.
//! - **Custom getters.** [`Scope::custom_getter`] wraps variable creation the
//!   way TF's `custom_getter` does; see [`VariableRequest`] for the design.
//!   The getters of nested scopes compose as TF composes them: the innermost
//!   scope's getter runs first, and the [`Getter`] it receives runs its
//!   parent scope's getter, and so on out to the registry's real getter.
//!   What the first getter to run (the innermost scope's) returns is the
//!   caller's variable: only its key type is checked against the request
//!   ([`Error::Mismatch`]), since a getter may change the request (its
//!   dim, its dtypes) on purpose.
//! - **Every variable.** [`Registry::variables`] lists the variables
//!   type-erased ([`AnyVariable`]: name, key type, dim, `checkpoint` flag,
//!   typed handle by downcast), in creation order: what saving or restoring
//!   a whole model iterates.
//!
//! # Concurrency
//!
//! `Registry` is `Send + Sync`; any number of threads may call
//! `get_variable` at once. One `Mutex` guards the name map and is held only
//! around map lookups and inserts, never while a table is allocated or a
//! custom getter runs. The thread that creates a name first puts a
//! placeholder in the map, builds the variable outside the lock, and then
//! publishes it; threads asking for that name meanwhile wait for that name
//! only, then get the published variable (so exactly one variable is ever
//! built for a name). If the build fails, the placeholder is removed, the
//! error goes to the creating thread, and waiters retry as if the name had
//! never been asked for. A poisoned lock is recovered: every critical section
//! leaves the map consistent.

mod erased;
mod request;
mod scope;

pub use erased::AnyVariable;
pub use request::{Getter, VariableRequest};
pub use scope::Scope;

use crate::{Dtype, Error, Key, Result, Variable, VariableBuilder};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// What a scope does when the requested name exists or does not (TF's
/// `reuse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Reuse {
    /// Get the variable if it exists, else create it (TF's `AUTO_REUSE`;
    /// the default and the top level's mode).
    #[default]
    Auto,
    /// The variable must exist ([`Error::NotFound`] otherwise).
    Yes,
    /// The variable must not exist ([`Error::AlreadyExists`] otherwise).
    No,
}

/// A named list of a registry's variables (TF's graph collections).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collection {
    /// Every variable of the registry.
    Global,
    /// Variables created by `get_local_variable`.
    Local,
    /// Variables whose `trainable` flag is set.
    Trainable,
}

/// The variables of one model by name, with TF's `get_variable` semantics.
/// See the [module docs](crate::registry) for the rules.
pub struct Registry {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Every name asked for: created, or being created by one thread.
    by_name: HashMap<String, Arc<Slot>>,
    /// Created variables, in creation order.
    created: Vec<Entry>,
}

/// One name's variable. Its creator holds the lock while it builds, so
/// threads asking for the same name wait for it; `None` once unlocked means
/// the build failed and the slot left the map.
#[derive(Default)]
struct Slot {
    entry: Mutex<Option<Entry>>,
}

/// A created variable and how it was created.
#[derive(Clone)]
struct Entry {
    variable: AnyVariable,
    local: bool,
}

/// Removes a placeholder slot from the map unless its variable was
/// published: runs when the build fails (or unwinds).
struct Pending<'a> {
    registry: &'a Registry,
    name: &'a str,
    slot: &'a Arc<Slot>,
    published: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.published {
            let mut state = lock(&self.registry.state);
            if state
                .by_name
                .get(self.name)
                .is_some_and(|slot| Arc::ptr_eq(slot, self.slot))
            {
                state.by_name.remove(self.name);
            }
        }
    }
}

/// Locks `mutex`, recovering from poisoning (every critical section leaves
/// the data consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Rejects an empty name or one with an empty component.
fn validate_name(name: &str) -> Result<()> {
    if name.split('/').any(str::is_empty) {
        return Err(Error::InvalidArgument(format!(
            "variable name {name:?} is empty or has an empty component \
             (like \"a//b\", \"/a\" or \"a/\")"
        )));
    }
    Ok(())
}

/// `"key type i64, dim 8"` (and `", value dtype bf16"` if a dtype is
/// given), as mismatch errors describe a variable.
fn describe(key_type: &str, dim: usize, dtype: Option<Dtype>) -> String {
    match dtype {
        None => format!("key type {key_type}, dim {dim}"),
        Some(dtype) => format!("key type {key_type}, dim {dim}, value dtype {dtype}"),
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("variables", &self.collection(Collection::Global))
            .finish()
    }
}

impl Registry {
    /// An empty registry (one per model).
    pub fn new() -> Self {
        Registry {
            state: Mutex::new(State::default()),
        }
    }

    /// The process-wide registry, created empty on first use (TF's default
    /// graph). Every call returns the same registry.
    ///
    /// ```
    /// use dynemb::Registry;
    /// assert!(std::ptr::eq(Registry::global(), Registry::global()));
    /// ```
    pub fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(Registry::new)
    }

    /// The top level: no prefix, [`Reuse::Auto`], no custom getter.
    fn root(&self) -> Scope<'_> {
        Scope::root(self)
    }

    /// A scope called `name` (names become `"name/..."`), in
    /// [`Reuse::Auto`] mode.
    pub fn scope(&self, name: &str) -> Scope<'_> {
        self.root().scope(name)
    }

    /// Gets the variable named by the builder, or creates it from the
    /// builder ([`Reuse::Auto`]). An existing variable with another key
    /// type, dim or value dtype is an [`Error::Mismatch`].
    ///
    /// ```
    /// use dynemb::{Registry, Variable};
    /// let registry = Registry::new();
    /// let a = registry.get_variable(Variable::<u64>::builder("item").dim(4))?;
    /// let b = registry.get_variable(Variable::<u64>::builder("item").dim(4))?;
    /// a.upsert(&[3], &[1.0; 4])?;
    /// assert_eq!(b.size(), 1);
    /// # Ok::<(), dynemb::Error>(())
    /// ```
    pub fn get_variable<K: Key>(&self, builder: VariableBuilder<K>) -> Result<Variable<K>> {
        self.root().get_variable(builder)
    }

    /// [`Registry::get_variable`] for a local variable: created with
    /// `trainable = false` and put in [`Collection::Local`].
    pub fn get_local_variable<K: Key>(&self, builder: VariableBuilder<K>) -> Result<Variable<K>> {
        self.root().get_local_variable(builder)
    }

    /// The names of the variables in `collection`, in creation order.
    pub fn collection(&self, collection: Collection) -> Vec<String> {
        lock(&self.state)
            .created
            .iter()
            .filter(|entry| match collection {
                Collection::Global => true,
                Collection::Local => entry.local,
                Collection::Trainable => entry.variable.trainable(),
            })
            .map(|entry| entry.variable.name().to_owned())
            .collect()
    }

    /// Every variable of the registry, type-erased, in creation order (for
    /// saving or restoring them all: each tells its key type, dim and
    /// `checkpoint` flag).
    pub fn variables(&self) -> Vec<AnyVariable> {
        lock(&self.state)
            .created
            .iter()
            .map(|entry| entry.variable.clone())
            .collect()
    }

    /// Saves every variable whose `checkpoint` flag is set into
    /// `dir/<name>` (a scoped name makes nested directories:
    /// `dir/tower/user/emb`), each with [`Variable::save`]. Each variable's
    /// checkpoint is replaced atomically; the set as a whole is not (a crash
    /// part-way leaves some variables at the new save and the rest at the
    /// previous one). Variables with `checkpoint(false)` are skipped.
    ///
    /// One checkpoint directory cannot hold another, so a set of names in
    /// which one is a directory of another (`a` and `a/b`) is an
    /// [`Error::InvalidArgument`] before anything is written, as is a name
    /// with a component starting with `.` (such names are reserved for the
    /// staging and lock files beside each checkpoint).
    pub fn save_all(&self, dir: impl AsRef<Path>) -> Result<()> {
        let saved = self.checkpointed()?;
        for variable in &saved {
            variable.save(checkpoint_dir(dir.as_ref(), variable.name()))?;
        }
        Ok(())
    }

    /// Restores every variable whose `checkpoint` flag is set from
    /// `dir/<name>`, as saved by [`Registry::save_all`]. Every checkpoint is
    /// checked first (present, intact, matching key type and dim) and locked
    /// against saves until all are applied; if any is not usable, nothing is
    /// changed. Variables with `checkpoint(false)` keep their contents;
    /// checkpoints of names the registry does not have are ignored. It holds
    /// one open file per variable until it is done, so a registry of more
    /// variables than the process may open files (`ulimit -n`) gets an
    /// [`Error::Io`] before anything changes.
    pub fn restore_all(&self, dir: impl AsRef<Path>) -> Result<()> {
        let mut saved = self.checkpointed()?;
        // Every restore_all locks checkpoints in one order (by name), so two
        // of them and the saves they wait for never wait on each other in a
        // cycle.
        saved.sort_by(|a, b| a.name().cmp(b.name()));
        let verified = saved
            .iter()
            .map(|variable| {
                variable.verify_checkpoint(&checkpoint_dir(dir.as_ref(), variable.name()))
            })
            .collect::<Result<Vec<_>>>()?;
        for (variable, verified) in saved.iter().zip(&verified) {
            variable.apply_checkpoint(verified, true)?;
        }
        Ok(())
    }

    /// The variables `save_all` and `restore_all` cover, once their names
    /// are checked to make checkpoint directories that do not overlap.
    fn checkpointed(&self) -> Result<Vec<AnyVariable>> {
        let saved: Vec<AnyVariable> = self
            .variables()
            .into_iter()
            .filter(AnyVariable::checkpoint)
            .collect();
        let mut names: Vec<&str> = saved.iter().map(AnyVariable::name).collect();
        if let Some(name) = names
            .iter()
            .find(|name| name.split('/').any(|part| part.starts_with('.')))
        {
            return Err(Error::InvalidArgument(format!(
                "variable name {name:?} cannot be a checkpoint directory: components starting \
                 with '.' are reserved for checkpoint staging and lock files"
            )));
        }
        names.sort_unstable();
        // The names starting with `outer` follow it in sorted order.
        for (i, outer) in names.iter().enumerate() {
            let nested = names[i + 1..]
                .iter()
                .take_while(|name| name.starts_with(outer))
                .find(|name| name.as_bytes().get(outer.len()) == Some(&b'/'));
            if let Some(inner) = nested {
                return Err(Error::InvalidArgument(format!(
                    "variables {outer:?} and {inner:?} cannot both be checkpointed under one \
                     directory: {outer:?}'s checkpoint directory would hold {inner:?}'s"
                )));
            }
        }
        Ok(saved)
    }

    /// Whether a variable called `name` (full name) has been created.
    pub fn contains(&self, name: &str) -> bool {
        lock(&self.state)
            .created
            .iter()
            .any(|entry| entry.variable.name() == name)
    }

    /// The real getter, at the end of every custom getter chain: applies the
    /// request's reuse mode to its name, creating the variable when needed.
    fn get_or_create<K: Key>(&self, request: VariableRequest) -> Result<AnyVariable> {
        let reuse = request.reuse();
        let local = request.is_local();
        let builder = request.into_builder::<K>();
        let name = builder.name().to_owned();
        validate_name(&name)?;
        loop {
            let mut state = lock(&self.state);
            if let Some(slot) = state.by_name.get(&name).map(Arc::clone) {
                drop(state);
                // Waits while another thread builds this name.
                let guard = lock(&slot.entry);
                let Some(entry) = guard.as_ref() else {
                    continue; // that build failed: ask again
                };
                if reuse == Reuse::No {
                    return Err(Error::AlreadyExists { name });
                }
                let existing = &entry.variable;
                let (dim, dtype) = (
                    builder.table_options().dim,
                    builder.table_options().value_dtype,
                );
                if existing.key_type() != K::TYPE_NAME
                    || existing.dim() != dim
                    || existing.value_dtype() != dtype
                {
                    // Dtypes are named when they differ.
                    let shown = |d: Dtype| (existing.value_dtype() != dtype).then_some(d);
                    return Err(Error::Mismatch {
                        name,
                        existing: describe(
                            existing.key_type(),
                            existing.dim(),
                            shown(existing.value_dtype()),
                        ),
                        requested: describe(K::TYPE_NAME, dim, shown(dtype)),
                    });
                }
                return Ok(existing.clone());
            }
            if reuse == Reuse::Yes {
                return Err(Error::NotFound { name });
            }
            let slot = Arc::new(Slot::default());
            let mut guard = lock(&slot.entry);
            state.by_name.insert(name.clone(), Arc::clone(&slot));
            drop(state);
            // Declared after `guard`, so dropped before it: on failure the
            // slot leaves the map before waiters see `None`.
            let mut pending = Pending {
                registry: self,
                name: &name,
                slot: &slot,
                published: false,
            };
            let entry = Entry {
                variable: AnyVariable::from(builder.build()?),
                local,
            };
            *guard = Some(entry.clone());
            lock(&self.state).created.push(entry.clone());
            pending.published = true;
            return Ok(entry.variable);
        }
    }
}

/// Where [`Registry::save_all`] puts a variable's checkpoint: `root/<name>`.
/// Names are checked by [`Registry::checkpointed`] and by `validate_name`
/// (no empty component), and a `..` component starts with `.`, so the
/// result stays inside `root`.
fn checkpoint_dir(root: &Path, name: &str) -> PathBuf {
    root.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_need_non_empty_components() {
        assert!(validate_name("a").is_ok());
        assert!(validate_name("a/b/c").is_ok());
        for bad in ["", "/", "a//b", "/a", "a/", "a/b/"] {
            assert!(
                matches!(validate_name(bad), Err(Error::InvalidArgument(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn registry_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Registry>();
        check::<Scope<'static>>();
        check::<AnyVariable>();
        check::<VariableRequest>();
    }
}
