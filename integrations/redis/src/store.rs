//! [`RedisVariable`] as an [`EmbeddingStore`]: what `dynemb-optim`'s
//! optimizers and `dynemb-candle`'s layers train, unchanged.
//!
//! Its calls wait on the servers and spread a batch over the nodes (and
//! `update_rows` over a thread of its own) by themselves, so it is not
//! [`cpu_bound`](EmbeddingStore::cpu_bound): callers such as
//! `dynemb-candle` make one call per batch instead of splitting it over
//! their CPU threads, which would only hold those threads while they wait.

use crate::RedisVariable;
use dynemb::{EmbeddingStore, Key, Result, SlotId};

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
