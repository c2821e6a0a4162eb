//! Checkpoints of a [`RedisVariable`], in the format of a local
//! [`Variable`](dynemb::Variable)'s (safetensors files and `index.json`,
//! through [`dynemb::checkpoint::save_rows`] and
//! [`dynemb::checkpoint::Reader`]), so a model moves from local tables to
//! Redis and back.
//!
//! Saving streams the table a group of buckets at a time (see
//! `scan`): memory for about one file's rows. Like a local save it is not
//! a point-in-time snapshot while others write: every row saved is one
//! consistent version of its values, slots and score, and a key present
//! throughout is saved once.
//!
//! Restoring and loading check the whole checkpoint first (key type, dim,
//! checksums, slot initial values against the variable's, restrict
//! policy) and change nothing if anything is wrong; then `restore` clears
//! the variable and writes the saved rows, `load` writes them over what
//! is there (a present row keeps the slot columns the checkpoint lacks).
//! Rows are written with versioned writes (see [`crate::update`]), so a
//! concurrent writer's row is never half overwritten. Scores are restored
//! when the checkpoint's restrict policy is the variable's; otherwise the
//! rows are scored as any write is.

use crate::layout::{self, Row, HEADER};
use crate::update::{VersionedWrite, MAX_ROUNDS};
use crate::RedisVariable;
use dynemb::checkpoint::{save_rows, Reader, Rows, TableInfo};
use dynemb::{BackendErrorKind, Error, Key, RestrictPolicy, Result};
use std::collections::HashMap;
use std::path::Path;

/// Rows read or written per round trip while checkpointing.
const ROWS_PER_BATCH: usize = 1 << 14;

impl<K: Key> RedisVariable<K> {
    /// Saves every row, with its slots and (with a restrict policy) score,
    /// to the checkpoint directory `dir`, replacing a checkpoint already
    /// there only once the new one is complete on disk.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let slots = self.slots_now()?;
        let info = TableInfo {
            name: self.name().to_string(),
            dim: self.dim(),
            scores: self.restrict_policy(),
            shards: 1,
            slots,
        };
        let initials: Vec<f32> = info.slots.iter().map(|&(_, v)| v).collect();
        let scored = self.restrict_policy().is_some();
        let rows = self.scan_all(ROWS_PER_BATCH, initials).map(|batch| {
            batch.map(|b| Rows {
                keys: b.keys.into_iter().map(K::from_bits).collect(),
                values: b.values,
                slots: b.slots,
                scores: scored.then_some(b.scores),
            })
        });
        save_rows(dir, &info, rows)
    }

    /// Replaces the variable's contents with the checkpoint at `dir` (from
    /// a local variable or a Redis one); checked whole first.
    pub fn restore(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.read_checkpoint(dir.as_ref(), true)
    }

    /// Writes the rows of the checkpoint at `dir` over the variable's
    /// (keys not in the checkpoint keep theirs); checked whole first.
    pub fn load(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.read_checkpoint(dir.as_ref(), false)
    }

    fn read_checkpoint(&self, dir: &Path, replace: bool) -> Result<()> {
        let reader = Reader::<K>::open(dir, self.name(), self.dim())?;
        let info = reader.info();
        let existing = self.slots_now()?;
        let mismatch = |existing: String, requested: String| Error::Mismatch {
            name: self.name().to_string(),
            existing,
            requested,
        };
        let mut new_slots = 0;
        for (name, initial) in &info.slots {
            match existing.iter().find(|(n, _)| n == name) {
                Some((_, own)) if own != initial => {
                    return Err(mismatch(
                        format!("slot {name} with initial value {own}"),
                        format!("checkpoint {} with initial value {initial}", dir.display()),
                    ))
                }
                Some(_) => {}
                None => new_slots += 1,
            }
        }
        if existing.len() + new_slots > dynemb::MAX_SLOTS {
            return Err(Error::InvalidArgument(format!(
                "variable {:?} would have {} slot columns with those of checkpoint {}; at most {}",
                self.name(),
                existing.len() + new_slots,
                dir.display(),
                dynemb::MAX_SLOTS
            )));
        }
        if let (Some(saved), Some(own)) = (info.scores, self.restrict_policy()) {
            if saved != own {
                return Err(mismatch(
                    format!("restrict policy {}", own.name()),
                    format!("checkpoint {} with {} scores", dir.display(), saved.name()),
                ));
            }
        }
        let columns = info
            .slots
            .iter()
            .map(|(name, initial)| self.create_slot(name, *initial).map(|id| id.index()))
            .collect::<Result<Vec<usize>>>()?;
        let initials: Vec<f32> = self.slots_now()?.iter().map(|&(_, v)| v).collect();
        let restore_scores = info.scores.is_some() && info.scores == self.restrict_policy();
        if replace {
            self.clear()?;
        }
        reader.for_each(|rows| {
            let n = rows.keys.len();
            let mut at = 0;
            while at < n {
                let end = (at + ROWS_PER_BATCH).min(n);
                self.put_rows(&rows, at..end, &columns, &initials, restore_scores)?;
                at = end;
            }
            Ok(())
        })
    }

    /// Writes rows `range` of a checkpoint's `rows`: values, the
    /// checkpoint's slot columns at indexes `columns`, the other columns
    /// kept (a present row) or at their initial values, the score restored
    /// or scored as a write. A key repeated in the range: the last row
    /// wins. Versioned writes, retried for rows changed meanwhile.
    fn put_rows(
        &self,
        rows: &Rows<K>,
        range: std::ops::Range<usize>,
        columns: &[usize],
        initials: &[f32],
        restore_scores: bool,
    ) -> Result<()> {
        let dim = self.dim();
        let mut last: HashMap<u64, usize> = HashMap::new();
        for i in range {
            last.insert(rows.keys[i].to_bits(), i);
        }
        let mut pending: Vec<(u64, usize)> = last.into_iter().collect();
        for _ in 0..MAX_ROUNDS {
            if pending.is_empty() {
                return Ok(());
            }
            let bits: Vec<u64> = pending.iter().map(|p| p.0).collect();
            let grouped = crate::batch::Grouped::new(&bits, self.buckets())?;
            let stored = self.fetch(&bits, &grouped)?;
            let stamp = dynemb::restrict::next_timestamp();
            let mut built = Vec::with_capacity(pending.len());
            for (&(bits, i), old) in pending.iter().zip(&stored) {
                let old = old
                    .as_deref()
                    .map(|b| Row::parse(b, dim, self.store()))
                    .transpose()?;
                let score = match (restore_scores, self.restrict_policy()) {
                    (true, _) => rows.scores.as_ref().map_or(0, |s| s[i]),
                    (false, None) => 0,
                    (false, Some(RestrictPolicy::Frequency)) => {
                        old.map_or(0, |r| r.score()).wrapping_add(1)
                    }
                    (false, Some(RestrictPolicy::Timestamp)) => stamp,
                };
                let width = old
                    .map_or(0, |r| r.slot_columns())
                    .max(columns.iter().map(|c| c + 1).max().unwrap_or(0));
                let mut row = Vec::with_capacity(HEADER + 4 * dim * (1 + width));
                row.extend_from_slice(&layout::new_version());
                row.extend_from_slice(&score.to_le_bytes());
                layout::f32_bytes(&rows.values[i * dim..(i + 1) * dim], &mut row);
                // Every column the stored row has is kept, also one another
                // process created after this load read the slot list.
                for column in 0..width {
                    if let Some(j) = columns.iter().position(|&c| c == column) {
                        layout::f32_bytes(&rows.slots[j][i * dim..(i + 1) * dim], &mut row);
                    } else if let Some(kept) = old.and_then(|r| r.slot_bytes(column)) {
                        row.extend_from_slice(kept);
                    } else {
                        let initial =
                            initials
                                .get(column)
                                .copied()
                                .ok_or_else(|| Error::Backend {
                                    store: self.store().to_string(),
                                    kind: BackendErrorKind::Corrupt,
                                    message: format!(
                                        "slot column {column} is not in the slot list"
                                    ),
                                })?;
                        layout::f32_fill_bytes(initial, dim, &mut row);
                    }
                }
                built.push((bits, old.map(|r| r.version()), row));
            }
            let writes: Vec<VersionedWrite<'_>> = built
                .iter()
                .map(|(bits, expected, row)| VersionedWrite {
                    bits: *bits,
                    expected: *expected,
                    row,
                })
                .collect();
            let conflicts = self.write_if_unchanged(&writes)?;
            pending = conflicts.into_iter().map(|c| pending[c]).collect();
        }
        Err(Error::Backend {
            store: self.store().to_string(),
            kind: BackendErrorKind::Contention,
            message: format!(
                "checkpoint rows: {} row(s) still changed by other writers after {MAX_ROUNDS} rounds",
                pending.len()
            ),
        })
    }
}
