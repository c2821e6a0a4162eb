//! [`EmbeddingStore`]: what training needs of an embedding table, so that
//! optimizers (`dynemb-optim`) and model layers (`dynemb-candle`) are
//! written once and train any storage: a local [`Variable`] (one probe and
//! one row lock per key) or a remote backend such as Redis (one pipelined
//! round trip per node per batch).
//!
//! The contract every implementation keeps, [`Variable`]'s semantics:
//! - [`lookup`](EmbeddingStore::lookup) never inserts; a missing key reads
//!   the initializer's row, and that is the row
//!   [`lookup_or_insert`](EmbeddingStore::lookup_or_insert) and
//!   [`update_rows`](EmbeddingStore::update_rows) insert it with;
//! - a slot is a column of the store: every key has a row of it, starting
//!   at the slot's initial value, removed with the key;
//! - [`update_rows`](EmbeddingStore::update_rows) is atomic per row: the
//!   values, the chosen slots and the row's score change together, and
//!   concurrent updates of one key (from threads or processes) never lose
//!   one another;
//! - slot creation is all or nothing:
//!   [`create_slots`](EmbeddingStore::create_slots) either makes every slot
//!   asked for exist or adds none, and
//!   [`check_create_slots`](EmbeddingStore::check_create_slots) tells,
//!   changing nothing, whether it would succeed now (names, initial values,
//!   room for the new columns), so that a caller updating several stores
//!   checks them all before it changes any;
//! - bad input is an [`Error`](crate::Error) that changes nothing.

use crate::{Key, Result, SlotId, Variable};
use std::sync::atomic::{AtomicU64, Ordering};

/// Source of [`new_store_id`]'s ids.
static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(0);

/// A store id never handed out before in this process, for
/// [`EmbeddingStore::store_id`]: every [`Variable`] takes one when it is
/// built, and other store types take theirs here too, so no two tables of
/// any types alive in one process share an id (a [`SlotId`] of one is
/// never mistaken for a slot of another).
pub fn new_store_id() -> u64 {
    NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed)
}

/// An embedding table that training can read and update: rows of
/// [`dim`](EmbeddingStore::dim) `f32`s keyed by [`EmbeddingStore::Key`],
/// with slot columns for optimizer state. See the module docs for
/// the contract.
pub trait EmbeddingStore: Send + Sync {
    /// The key type.
    type Key: Key;

    /// The store's name (a variable's name), for messages and checkpoints.
    fn name(&self) -> &str;

    /// Identifies the table behind this handle, among stores of this type:
    /// every handle of one table (clones of a `Variable`, the same name
    /// fetched twice from a `Registry`) gives the same id, and two tables
    /// alive in one process never give the same one. Training merges the
    /// gradients of every layer reading one table by it, so the table
    /// takes one optimizer update per step.
    fn store_id(&self) -> u64;

    /// Values per row.
    fn dim(&self) -> usize;

    /// Whether optimizers may train it (a `Variable`'s `trainable` flag);
    /// optimizers refuse to step a store that is not.
    fn trainable(&self) -> bool;

    /// Whether a call's time is CPU work on the calling thread (a table in
    /// this process's memory, like [`Variable`]), so that a large batch
    /// gains from being split over threads, as `dynemb-candle` splits it.
    /// A store whose calls wait on I/O and spread a batch themselves (a
    /// remote store) says `false`, and callers then make one call.
    /// Default `true`.
    fn cpu_bound(&self) -> bool {
        true
    }

    /// A hint that about `additional` keys not yet in the store may be
    /// inserted soon: a store may back the rows they will take with memory
    /// now, so that the inserts do not pay for it. It never changes what
    /// the store holds, and other callers never wait long for it, so
    /// callers may run it on a low-priority thread while they compute.
    /// [`Variable`] does [`Variable::reserve_rows`]; the default does
    /// nothing.
    fn reserve_rows(&self, additional: usize) {
        let _ = additional;
    }

    /// Copies the rows of `keys` into `out` (`keys.len() * dim` values); a
    /// missing key reads the initializer's row. Never inserts.
    fn lookup(&self, keys: &[Self::Key], out: &mut [f32]) -> Result<()>;

    /// [`EmbeddingStore::lookup`], inserting missing keys with the
    /// initializer's row (the training read).
    fn lookup_or_insert(&self, keys: &[Self::Key], out: &mut [f32]) -> Result<()>;

    /// [`EmbeddingStore::lookup_or_insert`], also telling which keys have a
    /// row after the read (`keys.len()` flags): false only for a key that
    /// admission has not admitted yet (see
    /// [`Variable::lookup_or_insert_with_exists`]). The default, for a
    /// store without admission, reads and marks every key: a store that
    /// wraps one with admission must forward this method too, or layers
    /// over it train the reads that did not admit.
    fn lookup_or_insert_with_exists(
        &self,
        keys: &[Self::Key],
        out: &mut [f32],
        exists: &mut [bool],
    ) -> Result<()> {
        crate::checks::check_len("exists", keys.len(), exists.len())?;
        self.lookup_or_insert(keys, out)?;
        exists.fill(true);
        Ok(())
    }

    /// Adds the slot column `name` whose rows start at `initial`, or returns
    /// the existing one if its initial value is equal
    /// ([`Error::Mismatch`](crate::Error::Mismatch) otherwise).
    fn create_slot(&self, name: &str, initial: f32) -> Result<SlotId>;

    /// Creates the slot columns `slots` (name, initial value) as
    /// [`create_slot`](EmbeddingStore::create_slot) creates each, all or
    /// nothing: either every one exists afterwards (its id returned in the
    /// order asked) or the call is an error and no slot was added.
    ///
    /// The default checks with
    /// [`check_create_slots`](EmbeddingStore::check_create_slots), then
    /// creates them one by one: all or nothing as far as that check sees
    /// (not against a concurrent creator). [`Variable`] and the crate's
    /// backends create them under one lock or in one server-side script;
    /// a store that wraps another should forward this method and
    /// `check_create_slots` to it.
    fn create_slots(&self, slots: &[(&str, f32)]) -> Result<Vec<SlotId>> {
        self.check_create_slots(slots)?;
        slots
            .iter()
            .map(|&(name, initial)| self.create_slot(name, initial))
            .collect()
    }

    /// Checks, changing nothing, that
    /// [`create_slots`](EmbeddingStore::create_slots) would succeed now with
    /// `slots`: names that are not empty and at most
    /// [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES) bytes, an existing slot's
    /// initial value equal to the one asked for (a [`Variable`] compares
    /// them rounded to its slot dtype;
    /// [`Error::Mismatch`](crate::Error::Mismatch)), finite new initial
    /// values that fit the slot dtype, and room for the new columns
    /// ([`MAX_SLOTS`](crate::MAX_SLOTS) per store). Another handle may
    /// create slots between this check and the creation.
    ///
    /// The default checks what [`slot_id`](EmbeddingStore::slot_id) and
    /// [`slot_initial`](EmbeddingStore::slot_initial) can tell (not the
    /// room, which it cannot see); [`Variable`] and the crate's backends
    /// check everything.
    fn check_create_slots(&self, slots: &[(&str, f32)]) -> Result<()> {
        for (i, &(name, initial)) in slots.iter().enumerate() {
            if name.is_empty() {
                return Err(crate::Error::InvalidArgument(format!(
                    "variable {:?}: a slot name must not be empty",
                    self.name()
                )));
            }
            crate::check_name("slot name", name)?;
            match self.slot_id(name) {
                Ok(id) => {
                    let existing = self.slot_initial(id)?;
                    if existing != initial {
                        return Err(crate::Error::Mismatch {
                            name: format!("{}/{name}", self.name()),
                            existing: format!("slot with initial value {existing}"),
                            requested: format!("initial value {initial}"),
                        });
                    }
                }
                Err(crate::Error::UnknownSlot { .. }) if initial.is_finite() => {}
                Err(crate::Error::UnknownSlot { .. }) => {
                    return Err(crate::Error::NonFinite {
                        what: "slot initial value",
                        index: i,
                        value: initial,
                    })
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The slot column called `name`
    /// ([`Error::UnknownSlot`](crate::Error::UnknownSlot) if none).
    fn slot_id(&self, name: &str) -> Result<SlotId>;

    /// The value every row of `slot` starts at.
    fn slot_initial(&self, slot: SlotId) -> Result<f32>;

    /// Copies `slot`'s rows of `keys` into `out`; a missing key reads the
    /// slot's initial value. Never inserts.
    fn lookup_slot(&self, slot: SlotId, keys: &[Self::Key], out: &mut [f32]) -> Result<()>;

    /// Runs `update(i, values, slot_rows)` on each key's row and its rows
    /// of `slots` (back to back, in the order of `slots`), atomically per
    /// row, inserting a missing key with the initializer's row and initial
    /// slot values; see [`Variable::update_rows`] for the full contract
    /// (reruns, non-finite results).
    fn update_rows<F>(&self, keys: &[Self::Key], slots: &[SlotId], update: F) -> Result<()>
    where
        F: FnMut(usize, &mut [f32], &mut [f32]);
}

impl<K: Key> EmbeddingStore for Variable<K> {
    type Key = K;

    fn name(&self) -> &str {
        Variable::name(self)
    }
    fn store_id(&self) -> u64 {
        self.table_id()
    }
    fn dim(&self) -> usize {
        Variable::dim(self)
    }
    fn trainable(&self) -> bool {
        Variable::trainable(self)
    }
    fn slot_initial(&self, slot: SlotId) -> Result<f32> {
        Variable::slot_initial(self, slot)
    }
    fn lookup(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        Variable::lookup(self, keys, out)
    }
    fn lookup_or_insert(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        Variable::lookup_or_insert(self, keys, out)
    }
    fn lookup_or_insert_with_exists(
        &self,
        keys: &[K],
        out: &mut [f32],
        exists: &mut [bool],
    ) -> Result<()> {
        Variable::lookup_or_insert_with_exists(self, keys, out, exists)
    }
    fn reserve_rows(&self, additional: usize) {
        Variable::reserve_rows(self, additional)
    }
    fn create_slot(&self, name: &str, initial: f32) -> Result<SlotId> {
        Variable::create_slot(self, name, initial)
    }
    fn create_slots(&self, slots: &[(&str, f32)]) -> Result<Vec<SlotId>> {
        Variable::create_slots(self, slots)
    }
    fn check_create_slots(&self, slots: &[(&str, f32)]) -> Result<()> {
        Variable::check_create_slots(self, slots)
    }
    fn slot_id(&self, name: &str) -> Result<SlotId> {
        Variable::slot_id(self, name)
    }
    fn lookup_slot(&self, slot: SlotId, keys: &[K], out: &mut [f32]) -> Result<()> {
        Variable::lookup_slot(self, slot, keys, out)
    }
    fn update_rows<F>(&self, keys: &[K], slots: &[SlotId], update: F) -> Result<()>
    where
        F: FnMut(usize, &mut [f32], &mut [f32]),
    {
        Variable::update_rows(self, keys, slots, update)
    }
}
