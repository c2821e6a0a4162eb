//! The software pipeline that drives a table's batched operations: keys in
//! batch order, each one's tag group, slot and row prefetched ahead of the
//! operation. The stages ahead only read the index, and what they find
//! never changes a result, only speed.
//!
//! A random key costs three dependent cache misses: its tag group, then the
//! slot the tags point to, then its row. Taken one key at a time each miss
//! waits for the one before; in the pipeline, while the operation runs on
//! key `i`, the row of key `i + ROWS_AHEAD`, the slot of key
//! `i + SLOTS_AHEAD` and the tag group of key `i + TAGS_AHEAD` are already
//! on their way. The distances are deep because a row is five cache lines
//! and a key costs seven misses in all.
//!
//! For a lookup the stages' answer is the answer (the key's row as of a
//! moment during the batch). For a writer it is a hint: the writer's index
//! can change under a migration, so its operation probes again, this time
//! from cache.

use super::index::{hash_key, FirstGroup, Index};
use super::kernels::{prefetch, prefetch_span};
use super::table::{Table, MISSING};
use crate::Result;
use crossbeam_epoch::Guard;

/// How far ahead of the operation a key's tag group is prefetched.
const TAGS_AHEAD: usize = 36;
/// How far ahead its first group is read and candidate slots prefetched.
const SLOTS_AHEAD: usize = 24;
/// How far ahead its row id is resolved and the row prefetched.
const ROWS_AHEAD: usize = 12;
/// Keys in flight (a power of two above `TAGS_AHEAD`).
const RING: usize = 64;

/// What the pipeline knows about one key in flight.
#[derive(Clone, Copy)]
struct InFlight<'g> {
    hash: u64,
    index: &'g Index,
    first: FirstGroup,
    row: u64,
}

/// What the operation at the end of the pipeline does with a key, which
/// decides what the stages ahead fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access<'s> {
    /// Reads the row: fetch the whole row.
    Read,
    /// Writes the row and its rows of these slot columns, inserting the key
    /// if absent: fetch the whole row, those slot rows (each in a column of
    /// its own, so each another miss), a bounded table's rank of the row
    /// (in its own column too) and the slot an insert would claim.
    Write(&'s [usize]),
    /// Reads the row, inserting the key if absent (a training read, which
    /// writes no row it finds): fetch the whole row and the slot an insert
    /// would claim, and for a missing key what admission counts it with.
    ReadOrInsert,
    /// Marks the row dead: fetch its header line only.
    Remove,
}

impl Table {
    /// Runs `visit(state, i, key, hash, row)` for every key of `keys` in
    /// order, where `row` is the key's row id found by a probe of
    /// `index_of(state)` shortly before (or `MISSING`), with that row already
    /// prefetched. Stops at the first error `visit` returns.
    pub(super) fn pipelined<'g, S>(
        &self,
        keys: &[u64],
        guard: &'g Guard,
        state: &mut S,
        index_of: impl Fn(&S) -> &'g Index,
        access: Access<'_>,
        mut visit: impl FnMut(&mut S, usize, u64, u64, u64) -> Result<()>,
    ) -> Result<()> {
        let n = keys.len();
        let idle = InFlight {
            hash: 0,
            index: index_of(state),
            first: FirstGroup::new([0; 2]),
            row: MISSING,
        };
        let mut ring = [idle; RING];
        for step in 0..n + TAGS_AHEAD {
            if let Some(&key) = keys.get(step) {
                let index = index_of(state);
                let hash = hash_key(key);
                prefetch(index.tags_address(hash));
                ring[step % RING] = InFlight {
                    hash,
                    index,
                    ..idle
                };
            }
            if let Some(j) = (step + SLOTS_AHEAD)
                .checked_sub(TAGS_AHEAD)
                .filter(|&j| j < n)
            {
                let key = &mut ring[j % RING];
                key.first = key.index.find_start(
                    key.hash,
                    matches!(access, Access::Write(_) | Access::ReadOrInsert),
                );
            }
            if let Some(j) = (step + ROWS_AHEAD)
                .checked_sub(TAGS_AHEAD)
                .filter(|&j| j < n)
            {
                let key = &mut ring[j % RING];
                key.row = self
                    .find_pipelined(key.index, keys[j], key.hash, key.first, guard)
                    .unwrap_or(MISSING);
                if key.row != MISSING {
                    let (address, bytes) = self.rows.row_span(key.row);
                    match access {
                        Access::Read | Access::ReadOrInsert => prefetch_span(address, bytes),
                        Access::Write(slots) => {
                            prefetch_span(address, bytes);
                            for &slot in slots {
                                let (address, bytes) = self.rows.slot_span(slot, key.row);
                                prefetch_span(address, bytes);
                            }
                            // A bounded table's write also sets the row's
                            // eviction rank, in a column of its own.
                            prefetch(self.rows.rank_address(key.row));
                        }
                        Access::Remove => prefetch(address),
                    }
                } else if let (Access::Write(_) | Access::ReadOrInsert, Some(admitter)) =
                    (access, &self.admitter)
                {
                    // A missing key's write or training read counts or
                    // checks it for admission first.
                    admitter.prefetch(keys[j]);
                }
            }
            if let Some(j) = step.checked_sub(TAGS_AHEAD) {
                let key = ring[j % RING];
                visit(state, j, keys[j], key.hash, key.row)?;
            }
        }
        Ok(())
    }
}
