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
//! checksums, slot initial values against the variable's, slot room,
//! restrict policy, and for `load` that no restore is in progress) and
//! change nothing if anything is wrong; then the checkpoint's slots the
//! variable lacks are created, all or nothing
//! ([`RedisVariable::create_slots`]); then `restore` replaces the
//! variable's rows with the saved ones, `load` writes them over what is
//! there (a present row keeps the slot columns the checkpoint lacks).
//! Rows are written with versioned writes (see [`crate::update`]), so a
//! concurrent writer's row is never half overwritten. Scores are restored
//! when the checkpoint's restrict policy is the variable's; otherwise the
//! rows are scored as any write is. Both stream the checkpoint, a file's
//! rows at a time: save reads about 16,384 rows per round trip,
//! restore and load write 8,192.
//!
//! # A restore is recoverable
//!
//! A restore cannot be one atomic switch here without doubling the
//! table's memory on the servers and making every handle look the table's
//! generation up on every batch; so it is made visible instead, and
//! repeatable:
//!
//! 1. the metadata's `restoring` field is set to the checkpoint's path;
//! 2. every bucket is emptied and marked, in one recorded script per
//!    bucket (`MARK_RESTORING`: the field [`layout::RESTORING_FIELD`]);
//! 3. the checkpoint's rows are written;
//! 4. every bucket's marker is removed, then the metadata's field.
//!
//! What any handle sees meanwhile: a read of a marked bucket (`lookup`,
//! `lookup_or_insert`, `lookup_scores`, a slot lookup, `update_rows`,
//! an export or save reaching it, a `restrict` scanning or pruning it,
//! which then removes nothing there) is an [`Error::Backend`]
//! ([`BackendErrorKind::NotServing`]) naming the checkpoint, and the
//! whole-table operations (`size`, `restrict`, `export_chunks`, `save`,
//! `load`) refuse to start while the metadata's field is there. Since
//! rows are written only once every bucket is marked, and markers are
//! removed only once every row is written, a read that succeeds sees
//! only the old rows (before its buckets were marked) or only the new
//! ones (after they were unmarked), never a mix of the two (a pass of
//! many round trips, such as a save, that a whole restore runs between
//! two of sees it as it sees any concurrent writes). Writes that
//! do not read first (`upsert`, `accum`, `remove`) are not refused: one
//! that lands after its bucket was emptied stays in the restored table.
//! Nor is the insert of a key that a `lookup_or_insert` or an
//! `update_rows` (an optimizer step) read as absent before its bucket was
//! marked: a key the checkpoint lacks is then in the restored table with
//! that write's row (the initializer's row, updated once). A key the
//! checkpoint holds gets the checkpoint's row, and an update of a row
//! read before the marking is refused as a conflict and read again. A
//! trainer that must not add a row to a restored table pauses while
//! another handle restores.
//!
//! A restore that stops part-way (the process killed, a node down) leaves
//! the variable marked; running the restore again, from the start,
//! finishes it exactly (every bucket is emptied again and every row
//! written again), and so does a restore of another checkpoint. `clear`
//! (and `destroy`) end it too, leaving the variable empty. One restore of
//! a variable at a time: two running at once may leave rows of both.

use crate::cluster::Request;
use crate::layout::{self, Row, HEADER};
use crate::reply;
use crate::scripts;
use crate::update::{VersionedWrite, MAX_ROUNDS};
use crate::variable::bucket_windows;
use crate::RedisVariable;
use dynemb::checkpoint::{save_rows, Reader, Rows, TableInfo};
use dynemb::{BackendErrorKind, Dtype, Error, Key, RestrictPolicy, Result};
use std::collections::HashMap;
use std::path::Path;

/// Rows read per round trip while saving.
const ROWS_PER_BATCH: usize = 1 << 14;

/// Rows written per round trip while restoring or loading (a write costs
/// the servers more than a read).
const ROWS_PER_WRITE: usize = 1 << 13;

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
            value_dtype: Dtype::F32,
            slot_dtype: Dtype::F32,
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
    /// a local variable or a Redis one); checked whole first. While it
    /// runs, and if it stops part-way, reads of the variable are errors
    /// (see the `checkpoint` module docs); running it again finishes it.
    pub fn restore(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.read_checkpoint(dir.as_ref(), true)
    }

    /// Writes the rows of the checkpoint at `dir` over the variable's
    /// (keys not in the checkpoint keep theirs); checked whole first, and
    /// refused while a restore is in progress or after one was
    /// interrupted. A failure part-way leaves some rows loaded.
    pub fn load(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.read_checkpoint(dir.as_ref(), false)
    }

    fn read_checkpoint(&self, dir: &Path, replace: bool) -> Result<()> {
        let reader = Reader::<K>::open(dir, self.name(), self.dim())?;
        if !replace {
            self.check_not_restoring()?;
        }
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
        // All or nothing: the checkpoint's missing slots are created
        // together or none is (another process may have created slots
        // since the checks above).
        let wanted: Vec<(&str, f32)> = info
            .slots
            .iter()
            .map(|(name, initial)| (name.as_str(), *initial))
            .collect();
        let columns: Vec<usize> = self
            .create_slots(&wanted)?
            .iter()
            .map(|id| id.index())
            .collect();
        let initials: Vec<f32> = self.slots_now()?.iter().map(|&(_, v)| v).collect();
        let restore_scores = info.scores.is_some() && info.scores == self.restrict_policy();
        let label = dir.display().to_string();
        if replace {
            self.mark_restoring(&label)?;
        }
        let stamps = restore_scores && self.restrict_policy() == Some(RestrictPolicy::Timestamp);
        reader.for_each(|mut rows| {
            // As a local restore: a stamp ahead of this clock counts as now.
            if let (true, Some(scores)) = (stamps, rows.scores.as_deref_mut()) {
                dynemb::restrict::clamp_to_clock(scores);
            }
            let n = rows.keys.len();
            let mut at = 0;
            while at < n {
                let end = (at + ROWS_PER_WRITE).min(n);
                self.put_rows(&rows, at..end, &columns, &initials, restore_scores, replace)?;
                at = end;
            }
            Ok(())
        })?;
        if replace {
            self.unmark_restoring()?;
        }
        Ok(())
    }

    /// A restore's steps 1 and 2 (see the module docs): the metadata says
    /// a restore of `checkpoint` is in progress, and every bucket is
    /// emptied and marked.
    fn mark_restoring(&self, checkpoint: &str) -> Result<()> {
        self.set_restoring(Some(checkpoint.as_bytes()))?;
        for window in bucket_windows(self.buckets()) {
            let id = layout::new_version();
            let requests: Vec<Request> = window
                .map(|b| {
                    let mut cmd = self.write_cmd(&scripts::MARK_RESTORING, b, id);
                    cmd.arg(checkpoint);
                    self.bucket_request(b, &cmd)
                })
                .collect();
            for reply in self.inner.cluster.run(&requests)? {
                reply::int(self.store(), "restore", reply)?;
            }
        }
        Ok(())
    }

    /// A restore's step 4: every bucket's marker removed (`HDEL`, which may
    /// run twice), then the metadata's field.
    fn unmark_restoring(&self) -> Result<()> {
        for window in bucket_windows(self.buckets()) {
            let requests: Vec<Request> = window
                .map(|b| {
                    let mut cmd = redis::cmd("HDEL");
                    cmd.arg(self.bucket_key(b)).arg(layout::RESTORING_FIELD);
                    self.bucket_request(b, &cmd)
                })
                .collect();
            for reply in self.inner.cluster.run(&requests)? {
                reply::int(self.store(), "restore", reply)?;
            }
        }
        self.set_restoring(None)
    }

    /// Writes rows `range` of a checkpoint's `rows`: values, the
    /// checkpoint's slot columns at indexes `columns`, the other columns
    /// kept (a present row) or at their initial values, the score restored
    /// or scored as a write. A key repeated in the range: the last row
    /// wins. Versioned writes, retried for rows changed meanwhile.
    /// `restoring`: the buckets are marked by this restore, and read.
    fn put_rows(
        &self,
        rows: &Rows<K>,
        range: std::ops::Range<usize>,
        columns: &[usize],
        initials: &[f32],
        restore_scores: bool,
        restoring: bool,
    ) -> Result<()> {
        let dim = self.dim();
        let mut last: HashMap<u64, usize> = HashMap::new();
        for i in range {
            last.insert(rows.keys[i].to_bits(), i);
        }
        let mut pending: Vec<(u64, usize)> = last.into_iter().collect();
        let mut blind = restoring;
        for _ in 0..MAX_ROUNDS {
            if pending.is_empty() {
                return Ok(());
            }
            let bits: Vec<u64> = pending.iter().map(|p| p.0).collect();
            let grouped = crate::batch::Grouped::new(&bits, self.buckets())?;
            // A restore's buckets were emptied: its first round expects
            // every row absent, and only rows written meanwhile by others
            // (conflicts) are read.
            let stored = if std::mem::take(&mut blind) {
                vec![None; bits.len()]
            } else {
                let replies = self
                    .inner
                    .cluster
                    .run(&self.fetch_requests(&bits, &grouped))?;
                self.fetched_rows_with(&bits, &grouped, replies, restoring)?
            };
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
                        old.map_or(0, |r| r.score()).saturating_add(1)
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
