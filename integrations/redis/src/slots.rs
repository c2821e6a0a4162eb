//! Slot columns of a [`RedisVariable`]: optimizer state stored in each row
//! beside its values (see [`crate::layout`]), defined in the variable's
//! metadata (see [`crate::meta`]).
//!
//! A handle caches the slot list; a name or index it does not know sends it
//! to the metadata again (another process may have created the slot), so
//! every process sees every slot by the same index.

use crate::cluster::Request;
use crate::meta;
use crate::reply;
use crate::scripts;
use crate::variable::{batch_len, check_len, script_cmd, RedisVariable};
use dynemb::{Error, Key, Result, SlotId};
use std::sync::PoisonError;

impl<K: Key> RedisVariable<K> {
    /// Reads the slot list from the metadata into the cache.
    fn refresh_slots(&self) -> Result<Vec<(String, f32)>> {
        let key = &self.inner.meta_key;
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&key[..]);
        let reply = self
            .inner
            .cluster
            .run(&[Request::new(key, &cmd)])?
            .pop()
            .expect("one reply");
        let slots = meta::slots_in(self.name(), self.store(), reply)?;
        let mut cached = self
            .inner
            .slots
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if slots.len() >= cached.len() {
            *cached = slots.clone();
        }
        Ok(cached.clone())
    }

    /// The slot list as the metadata has it now.
    pub(crate) fn slots_now(&self) -> Result<Vec<(String, f32)>> {
        self.refresh_slots()
    }

    /// The cached slot list.
    fn cached_slots(&self) -> Vec<(String, f32)> {
        self.inner
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The slot list, read again from the metadata if `index` is beyond
    /// the cached one.
    pub(crate) fn slots_through(&self, index: usize) -> Result<Vec<(String, f32)>> {
        let cached = self.cached_slots();
        if index < cached.len() {
            return Ok(cached);
        }
        let fresh = self.refresh_slots()?;
        if index < fresh.len() {
            Ok(fresh)
        } else {
            Err(Error::InvalidArgument(format!(
                "variable {:?} has no slot {index}",
                self.name()
            )))
        }
    }

    /// Adds the slot column `name` (an optimizer's per-row state, `dim`
    /// values per row) whose rows all start at `initial`, or returns the
    /// existing slot of that name if its initial value is equal (`0.0`
    /// equals `-0.0`; [`Error::Mismatch`] otherwise). At most
    /// [`MAX_SLOTS`](dynemb::MAX_SLOTS) slots. Existing rows are not
    /// rewritten: they read `initial` until written.
    pub fn create_slot(&self, name: &str, initial: f32) -> Result<SlotId> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "variable {:?}: a slot name must not be empty",
                self.name()
            )));
        }
        if !initial.is_finite() {
            return Err(Error::NonFinite {
                what: "initial",
                index: 0,
                value: initial,
            });
        }
        if let Some((index, existing)) = self
            .cached_slots()
            .iter()
            .enumerate()
            .find(|(_, (n, _))| n == name)
            .map(|(i, (_, v))| (i, *v))
        {
            return self.same_initial(name, index, existing, initial);
        }
        let key = &self.inner.meta_key;
        let mut cmd = script_cmd(&scripts::CREATE_SLOT, key);
        cmd.arg(name)
            .arg(initial.to_bits().to_string())
            .arg(dynemb::MAX_SLOTS);
        let reply = self
            .inner
            .cluster
            .run(&[Request::new(key, &cmd)])?
            .pop()
            .expect("one reply");
        let items = reply::array(self.store(), "create_slot", reply)?;
        let [index, bits] = <[redis::Value; 2]>::try_from(items).map_err(|items| {
            reply::unexpected(self.store(), "create_slot", &redis::Value::Array(items))
        })?;
        let index = reply::int(self.store(), "create_slot", index)?;
        let Ok(index) = usize::try_from(index) else {
            return Err(Error::InvalidArgument(format!(
                "variable {:?} has {} slots already, the most it can have",
                self.name(),
                dynemb::MAX_SLOTS
            )));
        };
        let bits = reply::bytes(self.store(), "create_slot", bits)?;
        let existing = std::str::from_utf8(&bits)
            .ok()
            .and_then(|b| b.parse::<u32>().ok())
            .map(f32::from_bits)
            .ok_or_else(|| {
                reply::unexpected(self.store(), "create_slot", &redis::Value::BulkString(bits))
            })?;
        self.slots_through(index)?;
        self.same_initial(name, index, existing, initial)
    }

    /// The slot at `index` if its initial value `existing` equals the
    /// requested `initial`.
    fn same_initial(
        &self,
        name: &str,
        index: usize,
        existing: f32,
        initial: f32,
    ) -> Result<SlotId> {
        if existing != initial {
            return Err(Error::Mismatch {
                name: format!("{}/{name}", self.name()),
                existing: format!("slot with initial value {existing}"),
                requested: format!("initial value {initial}"),
            });
        }
        Ok(SlotId::new(self.inner.id, index))
    }

    /// The slot column called `name` ([`Error::UnknownSlot`] if there is
    /// none, in the metadata either).
    pub fn slot_id(&self, name: &str) -> Result<SlotId> {
        let find = |slots: &[(String, f32)]| slots.iter().position(|(n, _)| n == name);
        let index = match find(&self.cached_slots()) {
            Some(index) => Some(index),
            None => find(&self.refresh_slots()?),
        };
        match index {
            Some(index) => Ok(SlotId::new(self.inner.id, index)),
            None => Err(Error::UnknownSlot {
                variable: self.name().to_string(),
                slot: name.to_string(),
            }),
        }
    }

    /// The slot columns' names, in index order, as the metadata has them
    /// now.
    pub fn slot_names(&self) -> Result<Vec<String>> {
        Ok(self
            .refresh_slots()?
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    /// The value every row of `slot` starts at.
    pub fn slot_initial(&self, slot: SlotId) -> Result<f32> {
        self.check_slot(slot)?;
        Ok(self.slots_through(slot.index())?[slot.index()].1)
    }

    /// Copies `slot`'s rows of `keys` into `out` (`keys.len() * dim`
    /// values); a missing key, or a row written before the slot existed,
    /// reads the slot's initial value. Never inserts.
    pub fn lookup_slot(&self, slot: SlotId, keys: &[K], out: &mut [f32]) -> Result<()> {
        let initial = self.slot_initial(slot)?;
        let dim = self.dim();
        check_len("out", batch_len(keys.len(), dim)?, out.len())?;
        let (bits, grouped) = self.group(keys)?;
        let rows = self.fetch(&bits, &grouped)?;
        let parsed = self.parse_rows(&rows)?;
        for (i, row) in parsed.iter().enumerate() {
            let part = &mut out[i * dim..(i + 1) * dim];
            match row {
                Some(row) => row.slot_into(slot.index(), initial, part),
                None => part.fill(initial),
            }
        }
        Ok(())
    }
}
