//! [`RedisVariable`] as an [`EmbeddingStore`] (what `dynemb-optim`'s
//! optimizers and `dynemb-candle`'s layers train, unchanged) and as an
//! [`EmbeddingTable`] (what any code written for a table runs on): each
//! method is the inherent method of the same name.
//!
//! Its calls wait on the servers and spread a batch over the nodes (and
//! `update_rows` over a thread of its own) by themselves, so it is not
//! [`cpu_bound`](EmbeddingStore::cpu_bound): callers such as
//! `dynemb-candle` make one call per batch instead of splitting it over
//! their CPU threads, which would only hold those threads while they wait.

use crate::RedisVariable;
use dynemb::{
    EmbeddingStore, EmbeddingTable, Initializer, Key, LifecycleStats, RestrictPolicy, Result,
    SlotId,
};
use std::path::Path;
use std::time::Duration;

impl<K: Key> EmbeddingStore for RedisVariable<K> {
    type Key = K;

    fn name(&self) -> &str {
        RedisVariable::name(self)
    }
    fn store_id(&self) -> u64 {
        RedisVariable::store_id(self)
    }
    fn dim(&self) -> usize {
        RedisVariable::dim(self)
    }
    fn trainable(&self) -> bool {
        RedisVariable::trainable(self)
    }
    fn cpu_bound(&self) -> bool {
        false
    }
    fn lookup(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        RedisVariable::lookup(self, keys, out)
    }
    fn lookup_or_insert(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        RedisVariable::lookup_or_insert(self, keys, out)
    }
    fn create_slot(&self, name: &str, initial: f32) -> Result<SlotId> {
        RedisVariable::create_slot(self, name, initial)
    }
    fn create_slots(&self, slots: &[(&str, f32)]) -> Result<Vec<SlotId>> {
        RedisVariable::create_slots(self, slots)
    }
    fn check_create_slots(&self, slots: &[(&str, f32)]) -> Result<()> {
        RedisVariable::check_create_slots(self, slots)
    }
    fn slot_id(&self, name: &str) -> Result<SlotId> {
        RedisVariable::slot_id(self, name)
    }
    fn slot_initial(&self, slot: SlotId) -> Result<f32> {
        RedisVariable::slot_initial(self, slot)
    }
    fn lookup_slot(&self, slot: SlotId, keys: &[K], out: &mut [f32]) -> Result<()> {
        RedisVariable::lookup_slot(self, slot, keys, out)
    }
    fn update_rows<F>(&self, keys: &[K], slots: &[SlotId], update: F) -> Result<()>
    where
        F: FnMut(usize, &mut [f32], &mut [f32]),
    {
        RedisVariable::update_rows(self, keys, slots, update)
    }
}

impl<K: Key> EmbeddingTable for RedisVariable<K> {
    fn initializer(&self) -> &Initializer {
        RedisVariable::initializer(self)
    }
    fn restrict_policy(&self) -> Option<RestrictPolicy> {
        RedisVariable::restrict_policy(self)
    }
    fn checkpoint(&self) -> bool {
        RedisVariable::checkpoint(self)
    }
    fn lookup_with_exists(&self, keys: &[K], out: &mut [f32], exists: &mut [bool]) -> Result<()> {
        RedisVariable::lookup_with_exists(self, keys, out, exists)
    }
    fn upsert(&self, keys: &[K], values: &[f32]) -> Result<()> {
        RedisVariable::upsert(self, keys, values)
    }
    fn accum(&self, keys: &[K], deltas: &[f32], exists: &[bool]) -> Result<()> {
        RedisVariable::accum(self, keys, deltas, exists)
    }
    fn remove(&self, keys: &[K]) -> Result<()> {
        RedisVariable::remove(self, keys)
    }
    fn clear(&self) -> Result<()> {
        RedisVariable::clear(self)
    }
    fn size(&self) -> Result<usize> {
        RedisVariable::size(self)
    }
    fn export_chunks(
        &self,
        rows_per_chunk: usize,
    ) -> impl Iterator<Item = Result<(Vec<K>, Vec<f32>)>> + '_ {
        RedisVariable::export_chunks(self, rows_per_chunk)
    }
    fn slot_names(&self) -> Result<Vec<String>> {
        RedisVariable::slot_names(self)
    }
    fn lookup_scores(&self, keys: &[K], out: &mut [u64]) -> Result<()> {
        RedisVariable::lookup_scores(self, keys, out)
    }
    fn restrict(&self, num_reserved: usize, trigger: usize) -> Result<usize> {
        RedisVariable::restrict(self, num_reserved, trigger)
    }
    fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        RedisVariable::save(self, dir)
    }
    fn restore(&self, dir: impl AsRef<Path>) -> Result<()> {
        RedisVariable::restore(self, dir)
    }
    fn load(&self, dir: impl AsRef<Path>) -> Result<()> {
        RedisVariable::load(self, dir)
    }
    fn memory_bytes(&self) -> Result<usize> {
        RedisVariable::memory_bytes(self)
    }
    fn capacity(&self) -> Option<usize> {
        RedisVariable::capacity(self)
    }
    fn expire(&self, older_than: Duration) -> Result<usize> {
        RedisVariable::expire(self, older_than)
    }
    fn lifecycle_stats(&self) -> Result<LifecycleStats> {
        Ok(RedisVariable::lifecycle_stats(self))
    }
}
