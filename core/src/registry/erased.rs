//! [`AnyVariable`]: a [`Variable`] of any key type behind one type, which is
//! how the registry stores variables of different key types side by side and
//! what custom getters return.

use crate::checkpoint::{self, Verified};
use crate::{Dtype, Key, Result, Variable};
use std::any::Any;
use std::path::Path;
use std::sync::Arc;

/// What the registry needs of a variable without knowing its key type.
/// Implemented for every `Variable<K>`; registry-wide operations (saving or
/// restoring every variable) add their method here.
pub(crate) trait StoredVariable: Send + Sync + 'static {
    /// The `Variable<K>` itself, to downcast.
    fn as_any(&self) -> &dyn Any;
    fn name(&self) -> &str;
    fn key_type(&self) -> &'static str;
    fn dim(&self) -> usize;
    fn value_dtype(&self) -> Dtype;
    fn num_shards(&self) -> usize;
    fn trainable(&self) -> bool;
    fn checkpoint(&self) -> bool;
    fn size(&self) -> usize;
    fn save(&self, dir: &Path) -> Result<()>;
    fn verify_checkpoint(&self, dir: &Path) -> Result<Verified>;
    fn apply_checkpoint(&self, verified: &Verified, replace: bool) -> Result<()>;
}

impl<K: Key> StoredVariable for Variable<K> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn name(&self) -> &str {
        Variable::name(self)
    }
    fn key_type(&self) -> &'static str {
        K::TYPE_NAME
    }
    fn dim(&self) -> usize {
        Variable::dim(self)
    }
    fn value_dtype(&self) -> Dtype {
        Variable::value_dtype(self)
    }
    fn num_shards(&self) -> usize {
        Variable::num_shards(self)
    }
    fn trainable(&self) -> bool {
        Variable::trainable(self)
    }
    fn checkpoint(&self) -> bool {
        Variable::checkpoint(self)
    }
    fn size(&self) -> usize {
        Variable::size(self)
    }
    fn save(&self, dir: &Path) -> Result<()> {
        Variable::save(self, dir)
    }
    fn verify_checkpoint(&self, dir: &Path) -> Result<Verified> {
        checkpoint::verify(self, dir)
    }
    fn apply_checkpoint(&self, verified: &Verified, replace: bool) -> Result<()> {
        checkpoint::apply(self, verified, replace)
    }
}

/// A handle to a [`Variable`] of any key type. Clones share the same tables;
/// [`AnyVariable::downcast`] gives back the typed handle.
///
/// ```
/// use dynemb::{AnyVariable, Variable};
/// let emb = Variable::<i32>::builder("emb").dim(2).build()?;
/// let any = AnyVariable::from(emb.clone());
/// assert_eq!((any.name(), any.key_type(), any.dim()), ("emb", "i32", 2));
/// assert!(any.downcast::<i64>().is_none());
/// let typed = any.downcast::<i32>().unwrap();
/// typed.upsert(&[5], &[1.0, 2.0])?;
/// assert_eq!(emb.size(), 1);
/// # Ok::<(), dynemb::Error>(())
/// ```
#[derive(Clone)]
pub struct AnyVariable {
    inner: Arc<dyn StoredVariable>,
}

impl<K: Key> From<Variable<K>> for AnyVariable {
    fn from(variable: Variable<K>) -> Self {
        AnyVariable {
            inner: Arc::new(variable),
        }
    }
}

impl std::fmt::Debug for AnyVariable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyVariable")
            .field("name", &self.name())
            .field("key", &self.key_type())
            .field("dim", &self.dim())
            .field("shards", &self.num_shards())
            .field("size", &self.size())
            .finish()
    }
}

impl AnyVariable {
    /// The typed handle, if the variable's key type is `K`.
    pub fn downcast<K: Key>(&self) -> Option<Variable<K>> {
        self.inner.as_any().downcast_ref::<Variable<K>>().cloned()
    }

    /// The variable's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The key type's name ([`Key::TYPE_NAME`]: `"i64"`, `"u64"`, `"i32"`,
    /// `"u32"`).
    pub fn key_type(&self) -> &'static str {
        self.inner.key_type()
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.inner.dim()
    }

    /// How values are stored.
    pub fn value_dtype(&self) -> Dtype {
        self.inner.value_dtype()
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.inner.num_shards()
    }

    /// Whether optimizers train this variable.
    pub fn trainable(&self) -> bool {
        self.inner.trainable()
    }

    /// Whether the registry's checkpoints (`save_all`, `restore_all`)
    /// include this variable; its own `save` saves it either way.
    pub fn checkpoint(&self) -> bool {
        self.inner.checkpoint()
    }

    /// Number of keys over all shards.
    pub fn size(&self) -> usize {
        self.inner.size()
    }

    /// [`Variable::save`].
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.inner.save(dir.as_ref())
    }

    /// [`Variable::restore`].
    pub fn restore(&self, dir: impl AsRef<Path>) -> Result<()> {
        let verified = self.verify_checkpoint(dir.as_ref())?;
        self.apply_checkpoint(&verified, true)
    }

    /// [`Variable::load`].
    pub fn load(&self, dir: impl AsRef<Path>) -> Result<()> {
        let verified = self.verify_checkpoint(dir.as_ref())?;
        self.apply_checkpoint(&verified, false)
    }

    /// Locks the checkpoint at `dir` against saves and checks it against
    /// this variable without changing anything.
    pub(crate) fn verify_checkpoint(&self, dir: &Path) -> Result<Verified> {
        self.inner.verify_checkpoint(dir)
    }

    /// Inserts the rows of a checkpoint this variable verified.
    pub(crate) fn apply_checkpoint(&self, verified: &Verified, replace: bool) -> Result<()> {
        self.inner.apply_checkpoint(verified, replace)
    }
}
