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
        let distinct = self.distinct_slots(slots)?;
        let cached = self.cached_slots();
        let find = |name: &str, slots: &[(String, f32)]| {
            slots
                .iter()
                .position(|(n, _)| n == name)
                .map(|i| (i, slots[i].1))
        };
        let mut indexes = Vec::with_capacity(distinct.len());
        for &(name, initial) in &distinct {
            match find(name, &cached) {
                Some((index, existing)) => {
                    indexes.push(self.same_initial(name, index, existing, initial)?.index())
                }
                None => break,
            }
        }
        if indexes.len() < distinct.len() {
            indexes = self.run_create_slots(&distinct)?;
        }
        let ids = slots
            .iter()
            .map(|&(name, _)| {
                let at = distinct.iter().position(|&(n, _)| n == name);
                SlotId::new(
                    self.inner.id,
                    indexes[at.expect("every name is among the distinct")],
                )
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
        let distinct = self.distinct_slots(slots)?;
        let mut known = self.cached_slots();
        if distinct
            .iter()
            .any(|(name, _)| !known.iter().any(|(n, _)| n == name))
        {
            known = self.refresh_slots()?;
        }
        let mut new = Vec::new();
        for &(name, initial) in &distinct {
            match known.iter().position(|(n, _)| n == name) {
                Some(index) => {
                    self.same_initial(name, index, known[index].1, initial)?;
                }
                None => new.push(name),
            }
        }
        self.check_room(known.len(), &new)
    }

    /// `slots` checked (names, finite initial values) with each name once:
    /// an [`Error::Mismatch`] if a name comes with two initial values.
    fn distinct_slots<'a>(&self, slots: &[(&'a str, f32)]) -> Result<Vec<(&'a str, f32)>> {
        let mut distinct: Vec<(&'a str, f32)> = Vec::with_capacity(slots.len());
        for (i, &(name, initial)) in slots.iter().enumerate() {
            if name.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "variable {:?}: a slot name must not be empty",
                    self.name()
                )));
            }
            dynemb::check_name("slot name", name)?;
            if !initial.is_finite() {
                return Err(Error::NonFinite {
                    what: "initial",
                    index: i,
                    value: initial,
                });
            }
            match distinct.iter().find(|(n, _)| *n == name) {
                Some(&(_, earlier)) => {
                    self.same_initial(name, 0, earlier, initial)?;
                }
                None => distinct.push((name, initial)),
            }
        }
        Ok(distinct)
    }

    /// An error unless `new` slots fit beside `existing` ones.
    fn check_room(&self, existing: usize, new: &[&str]) -> Result<()> {
        if existing + new.len() <= dynemb::MAX_SLOTS {
            Ok(())
        } else {
            Err(self.room_error(existing, new))
        }
    }

    /// The error for `new` slots that do not fit beside `existing` ones.
    fn room_error(&self, existing: usize, new: &[&str]) -> Error {
        Error::InvalidArgument(format!(
            "variable {:?} has {existing} slot column(s); adding {new:?} would make {}, more than the {} a variable may have",
            self.name(),
            existing + new.len(),
            dynemb::MAX_SLOTS
        ))
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
                Err(self.room_error(usize::try_from(count).unwrap_or(usize::MAX), &new))
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
                    (Some(&(name, initial)), Some(existing)) => {
                        self.same_initial(name, 0, existing, initial)?;
                        Err(unexpected(vec![]))
                    }
                    _ => Err(unexpected(vec![])),
                }
            }
            _ => Err(unexpected(items)),
        }
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
