//! [`EmbeddingTable`]: everything a user does with an embedding table,
//! whatever its storage, above what training needs ([`EmbeddingStore`]).
//! A local [`Variable`] and `dynemb-redis`'s `RedisVariable` implement it
//! with the same semantics, so code generic over it (a training loop, a
//! checkpointing job, a test) runs on either, as TFRA's `kv_creator` keeps
//! one `Variable` for every backend.
//!
//! Every method returns [`Result`], because a remote table can fail where a
//! local one cannot: [`Variable`]'s own `clear` and `size`, which cannot
//! fail, keep their infallible signatures as inherent methods, and its
//! implementation here wraps them in `Ok`. The semantics of each method
//! are [`Variable`]'s inherent method of the same name; a storage that
//! differs says so in its docs.
//!
//! The trait is used through generics, not `dyn` (as [`EmbeddingStore`],
//! whose `update_rows` takes a closure): `export_chunks` returns an
//! `impl Iterator` so a stream costs no allocation per chunk, and the
//! checkpoint methods take any `AsRef<Path>`. A program that picks its
//! storage at run time calls one generic function with either table, as
//! the ctr example does.

use crate::{EmbeddingStore, Initializer, Key, LifecycleStats, RestrictPolicy, Result, Variable};
use std::path::Path;
use std::time::Duration;

/// The whole table API: lookups, writes, streamed export, slots, scores,
/// restrict, checkpoints and memory use. See the module docs.
pub trait EmbeddingTable: EmbeddingStore {
    /// The initializer that makes the rows of missing keys.
    fn initializer(&self) -> &Initializer;

    /// The restrict policy the rows' scores follow, if rows keep one.
    fn restrict_policy(&self) -> Option<RestrictPolicy>;

    /// Whether a registry's checkpoints (`save_all`, `restore_all`)
    /// include this table; the table's own `save` saves it either way.
    fn checkpoint(&self) -> bool;

    /// [`EmbeddingStore::lookup`], and whether each key is present
    /// (`exists.len() == keys.len()`). Never inserts.
    fn lookup_with_exists(
        &self,
        keys: &[Self::Key],
        out: &mut [f32],
        exists: &mut [bool],
    ) -> Result<()>;

    /// Writes each key's row (`values.len() == keys.len() * dim`),
    /// inserting missing keys; a key repeated in one batch: the last one
    /// wins.
    fn upsert(&self, keys: &[Self::Key], values: &[f32]) -> Result<()>;

    /// TFRA's `bp_v2` write: a present key with `exists[i]` gets its delta
    /// added; an absent key with `!exists[i]` is inserted with its delta as
    /// its row; other keys are left alone. Each occurrence of a key
    /// repeated in one batch is decided on the row as the earlier ones left
    /// it, and a row the batch inserted takes every later delta whatever
    /// its `exists[i]`.
    fn accum(&self, keys: &[Self::Key], deltas: &[f32], exists: &[bool]) -> Result<()>;

    /// Removes the keys and their slot rows; absent keys are ignored.
    fn remove(&self, keys: &[Self::Key]) -> Result<()>;

    /// Removes every row (slots stay defined, with no rows).
    fn clear(&self) -> Result<()>;

    /// Rows in the table (exact when no write is in flight).
    fn size(&self) -> Result<usize>;

    /// Every `(key, row)`, streamed in chunks of at most `rows_per_chunk`
    /// rows, so that memory stays bounded; order unspecified. A key present
    /// throughout appears exactly once.
    fn export_chunks(
        &self,
        rows_per_chunk: usize,
    ) -> impl Iterator<Item = Result<(Vec<Self::Key>, Vec<f32>)>> + '_;

    /// Every `(key, row)` at once: the chunks of
    /// [`export_chunks`](Self::export_chunks) joined.
    fn export(&self) -> Result<(Vec<Self::Key>, Vec<f32>)> {
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for chunk in self.export_chunks(1 << 16) {
            let (k, v) = chunk?;
            keys.extend(k);
            values.extend(v);
        }
        Ok((keys, values))
    }

    /// The names of the slot columns, in creation order.
    fn slot_names(&self) -> Result<Vec<String>>;

    /// Each key's score under the restrict policy (`out.len() ==
    /// keys.len()`): 0 for a missing key, and for every key of a table
    /// without a policy.
    fn lookup_scores(&self, keys: &[Self::Key], out: &mut [u64]) -> Result<()>;

    /// If [`size`](Self::size) is above `trigger`, keeps the `num_reserved`
    /// highest-scored rows and removes the others with their slots; returns
    /// how many it removed. An error without a restrict policy.
    fn restrict(&self, num_reserved: usize, trigger: usize) -> Result<usize>;

    /// Writes the table (rows, slots, scores) as a checkpoint directory.
    fn save(&self, dir: impl AsRef<Path>) -> Result<()>;

    /// Replaces the table's contents with the checkpoint in `dir`.
    fn restore(&self, dir: impl AsRef<Path>) -> Result<()>;

    /// Writes the checkpoint's rows into the table (an upsert of each),
    /// keeping the rows it does not hold.
    fn load(&self, dir: impl AsRef<Path>) -> Result<()>;

    /// Bytes the table's rows, slots, scores and index take in the memory
    /// of whatever holds them (this process, or the servers).
    fn memory_bytes(&self) -> Result<usize>;

    /// The most rows the table holds, if it is bounded (see
    /// [`VariableBuilder::capacity`](crate::VariableBuilder::capacity)). A
    /// storage that cannot bound itself refuses a capacity when it is
    /// built.
    fn capacity(&self) -> Option<usize>;

    /// Removes the rows (with their slots) not written for `older_than`
    /// and returns how many; an error without
    /// [`RestrictPolicy::Timestamp`] (see [`Variable::expire`]).
    fn expire(&self, older_than: Duration) -> Result<usize>;

    /// What capacity, admission and expiry did so far (all zero for a
    /// table without them).
    fn lifecycle_stats(&self) -> Result<LifecycleStats>;
}

impl<K: Key> EmbeddingTable for Variable<K> {
    fn initializer(&self) -> &Initializer {
        Variable::initializer(self)
    }
    fn restrict_policy(&self) -> Option<RestrictPolicy> {
        Variable::restrict_policy(self)
    }
    fn checkpoint(&self) -> bool {
        Variable::checkpoint(self)
    }
    fn lookup_with_exists(&self, keys: &[K], out: &mut [f32], exists: &mut [bool]) -> Result<()> {
        Variable::lookup_with_exists(self, keys, out, exists)
    }
    fn upsert(&self, keys: &[K], values: &[f32]) -> Result<()> {
        Variable::upsert(self, keys, values)
    }
    fn accum(&self, keys: &[K], deltas: &[f32], exists: &[bool]) -> Result<()> {
        Variable::accum(self, keys, deltas, exists)
    }
    fn remove(&self, keys: &[K]) -> Result<()> {
        Variable::remove(self, keys)
    }
    fn clear(&self) -> Result<()> {
        Variable::clear(self);
        Ok(())
    }
    fn size(&self) -> Result<usize> {
        Ok(Variable::size(self))
    }
    fn export_chunks(
        &self,
        rows_per_chunk: usize,
    ) -> impl Iterator<Item = Result<(Vec<K>, Vec<f32>)>> + '_ {
        Variable::export_chunks(self, rows_per_chunk)
    }
    fn slot_names(&self) -> Result<Vec<String>> {
        Ok(Variable::slot_names(self))
    }
    fn lookup_scores(&self, keys: &[K], out: &mut [u64]) -> Result<()> {
        Variable::lookup_scores(self, keys, out)
    }
    fn restrict(&self, num_reserved: usize, trigger: usize) -> Result<usize> {
        Variable::restrict(self, num_reserved, trigger)
    }
    fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        Variable::save(self, dir)
    }
    fn restore(&self, dir: impl AsRef<Path>) -> Result<()> {
        Variable::restore(self, dir)
    }
    fn load(&self, dir: impl AsRef<Path>) -> Result<()> {
        Variable::load(self, dir)
    }
    fn memory_bytes(&self) -> Result<usize> {
        Ok(Variable::memory_bytes(self))
    }
    fn capacity(&self) -> Option<usize> {
        Variable::capacity(self)
    }
    fn expire(&self, older_than: Duration) -> Result<usize> {
        Variable::expire(self, older_than)
    }
    fn lifecycle_stats(&self) -> Result<LifecycleStats> {
        Ok(Variable::lifecycle_stats(self))
    }
}
