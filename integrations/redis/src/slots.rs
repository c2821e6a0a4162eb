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
    /// [`MAX_SLOTS`](dynemb::MAX_SLOTS) slots; a name is not empty and at
    /// most [`MAX_NAME_BYTES`](dynemb::MAX_NAME_BYTES) bytes long. Existing
    /// rows are not rewritten: they read `initial` until written.
    pub fn create_slot(&self, name: &str, initial: f32) -> Result<SlotId> {
        let mut ids = self.create_slots(&[(name, initial)])?;
        Ok(ids.pop().expect("one slot asked for, one returned"))
    }

    /// Creates the slot columns `slots` (name, initial value), as
    /// [`RedisVariable::create_slot`] creates each, all or nothing: one
    /// script on the metadata's node checks every existing slot's initial
    /// value and the room for the new ones, then adds them all, so either
    /// every slot exists afterwards (ids in the order asked) or none was
    /// added, whatever other processes create meanwhile. The script is safe
    /// to run twice (a resend finds the slots it added and returns them).
    pub fn create_slots(&self, slots: &[(&str, f32)]) -> Result<Vec<SlotId>> {
        let cached = self.cached_slots();
        let planned = dynemb::checks::plan_slots(self.name(), &pairs(&cached), slots)?;
        // The slots this handle does not know, each once, for the script
        // (which also finds those another process created meanwhile).
        let mut new: Vec<(&str, f32)> = Vec::new();
        for (&(name, initial), plan) in slots.iter().zip(&planned) {
            if plan.is_none() && !new.iter().any(|&(n, _)| n == name) {
                new.push((name, initial));
            }
        }
        let created = if new.is_empty() {
            Vec::new()
        } else {
            self.run_create_slots(&new)?
        };
        let ids = slots
            .iter()
            .zip(planned)
            .map(|(&(name, _), plan)| {
                let index = plan.unwrap_or_else(|| {
                    let at = new.iter().position(|&(n, _)| n == name);
                    created[at.expect("every slot to create is listed")]
                });
                SlotId::new(self.inner.id, index)
            })
            .collect();
        Ok(ids)
    }

    /// Checks, changing nothing, that [`RedisVariable::create_slots`] would
    /// succeed now with `slots`: the names, the initial values, and (if
    /// any slot is missing) the room, against the metadata as it is now
    /// (one round trip; none when every slot is known already). Another
    /// process may create slots between this check and the creation.
    pub fn check_create_slots(&self, slots: &[(&str, f32)]) -> Result<()> {
        let mut known = self.cached_slots();
        if slots
            .iter()
            .any(|(name, _)| !known.iter().any(|(n, _)| n == name))
        {
            known = self.refresh_slots()?;
        }
        dynemb::checks::plan_slots(self.name(), &pairs(&known), slots).map(drop)
    }

    /// Runs [`scripts::CREATE_SLOTS`] for `distinct` (names given once,
    /// checked): the index of each.
    fn run_create_slots(&self, distinct: &[(&str, f32)]) -> Result<Vec<usize>> {
        let key = &self.inner.meta_key;
        let mut cmd = script_cmd(&scripts::CREATE_SLOTS, key);
        cmd.arg(dynemb::MAX_SLOTS);
        for &(name, initial) in distinct {
            // `0.0` equals `-0.0`: either stored zero matches.
            let alternative = if initial == 0.0 { -initial } else { initial };
            cmd.arg(name)
                .arg(initial.to_bits().to_string())
                .arg(alternative.to_bits().to_string());
        }
        let reply = self
            .inner
            .cluster
            .run(&[Request::new(key, &cmd)])?
            .pop()
            .expect("one reply");
        let unexpected = |items: Vec<redis::Value>| {
            reply::unexpected(self.store(), "create_slots", &redis::Value::Array(items))
        };
        let items = reply::array(self.store(), "create_slots", reply)?;
        let status = match items.first() {
            Some(redis::Value::BulkString(status)) => status.clone(),
            Some(redis::Value::SimpleString(status)) => status.clone().into_bytes(),
            _ => return Err(unexpected(items)),
        };
        match &status[..] {
            b"ok" if items.len() == distinct.len() + 1 => {
                let mut indexes = Vec::with_capacity(distinct.len());
                for item in items.into_iter().skip(1) {
                    let index = reply::int(self.store(), "create_slots", item)?;
                    let index = usize::try_from(index)
                        .ok()
                        .filter(|&i| i < dynemb::MAX_SLOTS)
                        .ok_or_else(|| {
                            reply::unexpected(
                                self.store(),
                                "create_slots",
                                &redis::Value::Int(index),
                            )
                        })?;
                    indexes.push(index);
                }
                if let Some(&last) = indexes.iter().max() {
                    self.slots_through(last)?;
                }
                Ok(indexes)
            }
            b"full" if items.len() == 2 => {
                let [_, count] = <[redis::Value; 2]>::try_from(items).map_err(unexpected)?;
                let count = reply::int(self.store(), "create_slots", count)?;
                let known = self.refresh_slots()?;
                let new: Vec<&str> = distinct
                    .iter()
                    .map(|&(n, _)| n)
                    .filter(|name| !known.iter().any(|(n, _)| n == name))
                    .collect();
                Err(dynemb::checks::slot_room_error(
                    self.name(),
                    usize::try_from(count).unwrap_or(usize::MAX),
                    &new,
                ))
            }
            b"mismatch" if items.len() == 3 => {
                let [_, at, bits] = <[redis::Value; 3]>::try_from(items).map_err(unexpected)?;
                let at = reply::int(self.store(), "create_slots", at)?;
                let bits = reply::bytes(self.store(), "create_slots", bits)?;
                let existing = std::str::from_utf8(&bits)
                    .ok()
                    .and_then(|b| b.parse::<u32>().ok())
                    .map(f32::from_bits);
                match (
                    usize::try_from(at).ok().and_then(|at| distinct.get(at)),
                    existing,
                ) {
                    (Some(&(name, initial)), Some(existing)) if existing != initial => Err(
                        dynemb::checks::slot_mismatch(self.name(), name, existing, initial),
                    ),
                    _ => Err(unexpected(vec![])),
                }
            }
            _ => Err(unexpected(items)),
        }
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

/// Slot columns as [`dynemb::checks::plan_slots`] takes them.
fn pairs(slots: &[(String, f32)]) -> Vec<(&str, f32)> {
    slots.iter().map(|(n, v)| (n.as_str(), *v)).collect()
}
