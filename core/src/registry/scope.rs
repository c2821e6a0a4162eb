//! [`Scope`]: a name prefix, a reuse mode and custom getters, over a
//! [`Registry`].

use super::request::CustomGetterFn;
use super::{describe, AnyVariable, Getter, Registry, Reuse, VariableRequest};
use crate::{Error, Key, Result, Variable, VariableBuilder};
use std::sync::Arc;

/// A variable scope (TF's `variable_scope`): variables got through it are
/// named `"scope/name"`, with the scope's [`Reuse`] mode and custom getters.
///
/// Scopes are cheap values made from a [`Registry`] or from a parent scope
/// and borrow the registry only; a child inherits its parent's prefix, mode
/// and custom getters as they are when it is made.
///
/// ```
/// use dynemb::{Error, Registry, Reuse, Variable};
///
/// let registry = Registry::new();
/// let user = registry.scope("tower").scope("user");
/// let emb = user.get_variable(Variable::<i64>::builder("emb").dim(4))?;
/// assert_eq!(emb.name(), "tower/user/emb");
///
/// // A child inherits Reuse::Yes; an explicit mode overrides it.
/// let reusing = registry.scope("tower").reuse(Reuse::Yes);
/// let same = reusing.scope("user").get_variable(Variable::<i64>::builder("emb").dim(4))?;
/// assert_eq!(same.name(), emb.name());
/// assert!(matches!(
///     reusing.scope("item").get_variable(Variable::<i64>::builder("emb").dim(4)),
///     Err(Error::NotFound { .. })
/// ));
/// let item = reusing.scope("item").reuse(Reuse::Auto);
/// assert!(item.get_variable(Variable::<i64>::builder("emb").dim(4)).is_ok());
/// # Ok::<(), dynemb::Error>(())
/// ```
#[derive(Clone)]
pub struct Scope<'r> {
    registry: &'r Registry,
    /// `None` at the top level.
    prefix: Option<String>,
    reuse: Reuse,
    /// The custom getters in force, outermost scope's first.
    getters: Vec<Arc<CustomGetterFn>>,
}

impl std::fmt::Debug for Scope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("name", &self.name())
            .field("reuse", &self.reuse)
            .field("custom_getters", &self.getters.len())
            .finish()
    }
}

/// Runs the innermost getter of `getters`, handing it a [`Getter`] that runs
/// the rest of the chain and ends at `real`.
fn run_chain(
    getters: &[Arc<CustomGetterFn>],
    real: &dyn Fn(VariableRequest) -> Result<AnyVariable>,
    request: VariableRequest,
) -> Result<AnyVariable> {
    match getters.split_last() {
        None => real(request),
        Some((innermost, outer)) => {
            let next = |request: VariableRequest| run_chain(outer, real, request);
            innermost(&Getter::new(&next), request)
        }
    }
}

impl<'r> Scope<'r> {
    /// The top level of `registry`.
    pub(super) fn root(registry: &'r Registry) -> Self {
        Scope {
            registry,
            prefix: None,
            reuse: Reuse::Auto,
            getters: Vec::new(),
        }
    }

    /// The scope's full name (`"tower/user"`); empty at the top level.
    pub fn name(&self) -> &str {
        self.prefix.as_deref().unwrap_or("")
    }

    /// The reuse mode of variables got through this scope.
    pub fn reuse_mode(&self) -> Reuse {
        self.reuse
    }

    /// A child scope called `name`: names become `"this/name/..."`; it
    /// inherits this scope's reuse mode and custom getters.
    pub fn scope(&self, name: &str) -> Scope<'r> {
        let prefix = match &self.prefix {
            None => name.to_owned(),
            Some(prefix) => format!("{prefix}/{name}"),
        };
        Scope {
            registry: self.registry,
            prefix: Some(prefix),
            reuse: self.reuse,
            getters: self.getters.clone(),
        }
    }

    /// Sets this scope's reuse mode (and that of the children made from it
    /// afterwards).
    pub fn reuse(mut self, reuse: Reuse) -> Self {
        self.reuse = reuse;
        self
    }

    /// Wraps variable creation in this scope (and the children made from it
    /// afterwards) with `getter`, TF's `custom_getter`.
    ///
    /// `getter(next, request)` receives the [`VariableRequest`] (full name,
    /// key type, dim, ...), may change it, and calls `next.get(request)` (the
    /// enclosing scope's custom getter, or the real getter) any number of
    /// times; what it returns is what `get_variable` returns. The getters of
    /// nested scopes compose as in TF: the innermost runs first, and its
    /// `next` runs its parent's getter. A second `custom_getter` on the same
    /// scope composes the same way: the one added last runs first.
    ///
    /// ```
    /// use dynemb::{Registry, Variable};
    ///
    /// let registry = Registry::new();
    /// let wide = registry
    ///     .scope("wide")
    ///     .custom_getter(|next, request| {
    ///         let name = format!("{}_v2", request.name());
    ///         let dim = request.dim() * 2;
    ///         next.get(request.with_name(name).with_dim(dim))
    ///     });
    /// let emb = wide.get_variable(Variable::<u64>::builder("emb").dim(8))?;
    /// assert_eq!((emb.name(), emb.dim()), ("wide/emb_v2", 16));
    /// # Ok::<(), dynemb::Error>(())
    /// ```
    pub fn custom_getter<F>(mut self, getter: F) -> Self
    where
        F: Fn(&Getter<'_>, VariableRequest) -> Result<AnyVariable> + Send + Sync + 'static,
    {
        self.getters.push(Arc::new(getter));
        self
    }

    /// Gets or creates the variable `"scope/name"` per this scope's reuse
    /// mode, through its custom getters. Errors: [`Error::AlreadyExists`]
    /// ([`Reuse::No`]), [`Error::NotFound`] ([`Reuse::Yes`]),
    /// [`Error::Mismatch`] (exists with another key type, dim or value dtype),
    /// [`Error::InvalidArgument`] (a bad name or builder setting).
    pub fn get_variable<K: Key>(&self, builder: VariableBuilder<K>) -> Result<Variable<K>> {
        self.get(builder, false)
    }

    /// [`Scope::get_variable`] for a local variable: created with
    /// `trainable = false` and put in
    /// [`Collection::Local`](crate::Collection::Local).
    pub fn get_local_variable<K: Key>(&self, builder: VariableBuilder<K>) -> Result<Variable<K>> {
        self.get(builder.trainable(false), true)
    }

    fn get<K: Key>(&self, mut builder: VariableBuilder<K>, local: bool) -> Result<Variable<K>> {
        if let Some(prefix) = &self.prefix {
            let name = format!("{prefix}/{}", builder.name());
            builder.set_name(name);
        }
        let dim = builder.table_options().dim;
        let request = VariableRequest::new(builder, self.reuse, local);
        let real = |request: VariableRequest| self.registry.get_or_create::<K>(request);
        let variable = run_chain(&self.getters, &real, request)?;
        // Only a custom getter returning a variable from elsewhere can fail.
        variable.downcast::<K>().ok_or_else(|| Error::Mismatch {
            name: variable.name().to_owned(),
            existing: describe(variable.key_type(), variable.dim(), None),
            requested: describe(K::TYPE_NAME, dim, None),
        })
    }
}
