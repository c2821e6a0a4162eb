//! `update_rows`, the optimizers' read-modify-write of a row and its slot
//! columns, made atomic per row **optimistically**:
//!
//! 1. one pipelined read (`HMGET` per bucket) of every distinct key's row,
//!    with its version (a missing key reads as the initializer's row, its
//!    slots at their initial values, "absent" as its version);
//! 2. the caller's update runs here, on each key's occurrences in batch
//!    order;
//! 3. one pipelined write (a module command or a Lua script per bucket,
//!    see the [crate docs](crate)) stores
//!    each new row only if the row's version is still the one read (still
//!    absent, for a missing key); every row written gets a new random
//!    version, which the write carries, so a resend of the write (after
//!    a lost reply) recognises its own rows as written, not as conflicts
//!    (the write's recorded reply, see the [crate docs](crate), covers the
//!    case where another writer changed a row in between);
//! 4. the rows that changed meanwhile are read and updated again, until
//!    none is left (at most [`MAX_ROUNDS`] rounds, then
//!    [`BackendErrorKind::Contention`]).
//!
//! A round of many keys (from `2 * 8192`) is cut into up to eight chunks,
//! pipelined: while the update runs here on chunk `k`, another thread
//! writes chunk `k - 1` back and reads chunk `k + 1`, both in the same
//! pipelines (one round trip: the chunks' keys are disjoint, so their
//! order on the servers does not matter), so the client's work overlaps
//! the servers' instead of alternating with it. The update itself always
//! runs on the calling thread, in order. A few large chunks, because each
//! costs a command per bucket on both round trips.
//! A row is still written only if unchanged since its own read, so
//! chunks change nothing about atomicity; a round that fails (a corrupt
//! row, a node down) may have written its earlier chunks, as a failed
//! batch may have written some nodes.
//!
//! So an update is applied to the row exactly as stored, once: concurrent
//! updates, accumulations and upserts of a key (from threads or
//! processes) never lose one another, and a reader never sees half an
//! update (a row is one hash field, written whole). Server-side updates
//! would need each optimizer's rule in Lua; the optimistic scheme keeps
//! one rule, in Rust, for local and remote stores, and costs two round
//! trips per batch when rows are not contended. The caller's update may
//! run more than once for a key (its result of a conflicting round is
//! dropped), which [`EmbeddingStore::update_rows`]'s contract allows.
//!
//! Each round trip of a call is a batch with a deadline of its own
//! ([`RedisConfig::batch_deadline`](crate::RedisConfig::batch_deadline)
//! from when it is sent), so a call of many rounds or chunks may last
//! longer than one deadline.
//!
//! A result holding a NaN or an infinity is not written (the occurrence is
//! skipped, a missing key is not inserted by it), as on a local variable;
//! the call then returns [`Error::NonFinite`] naming the first such
//! position.
//!
//! [`EmbeddingStore::update_rows`]: dynemb::EmbeddingStore::update_rows

use crate::batch::Grouped;
use crate::cluster::Request;
use crate::layout::{self, Row, HEADER};
use crate::reply;
use crate::scripts;
use crate::variable::RedisVariable;
use dynemb::{BackendErrorKind, Error, Key, RestrictPolicy, Result, SlotId};
use redis::Value;
use std::collections::HashMap;
use std::time::Duration;

/// Rounds of conflicts an `update_rows` call retries before giving up.
pub const MAX_ROUNDS: usize = 100;

/// Keys per chunk of a round, at least (see [`chunk_len`]).
const MIN_CHUNK: usize = 8192;

/// Most chunks a round is cut into.
const MAX_CHUNKS: usize = 8;

/// Keys per chunk for a round of `pending` keys: the whole round below
/// `2 * MIN_CHUNK` keys, else up to [`MAX_CHUNKS`] equal chunks of at
/// least [`MIN_CHUNK`]. Decision: a few large chunks, because each
/// chunk costs a command per bucket on both round trips; enough of them
/// that most of the kernel's time here overlaps the servers' work.
fn chunk_len(pending: usize) -> usize {
    let chunks = (pending / MIN_CHUNK).clamp(1, MAX_CHUNKS);
    pending.div_ceil(chunks).max(1)
}

/// One key's rows while its update runs, allocated once per call: the
/// values and slot rows as stored, and the copies an occurrence's update
/// tries (kept only if every result is finite).
struct Scratch {
    values: Vec<f32>,
    slot_rows: Vec<f32>,
    try_values: Vec<f32>,
    try_slots: Vec<f32>,
}

impl Scratch {
    fn new(dim: usize, slots: usize) -> Self {
        Scratch {
            values: vec![0.0; dim],
            slot_rows: vec![0.0; dim * slots],
            try_values: vec![0.0; dim],
            try_slots: vec![0.0; dim * slots],
        }
    }
}

/// Rows as read: each one's bytes, or `None` if absent.
type StoredRows = Vec<Option<Vec<u8>>>;

/// The write-back of `computed` rows.
fn versioned<'a>(targets: &[Target], computed: &'a [Computed]) -> Vec<VersionedWrite<'a>> {
    computed
        .iter()
        .map(|c| VersionedWrite {
            bits: targets[c.target].bits,
            expected: c.new.expected,
            row: &c.new.row,
        })
        .collect()
}

/// One distinct key of the batch being updated.
struct Target {
    bits: u64,
    /// Its positions in the batch, in order.
    positions: Vec<usize>,
}

/// A refused update: the batch position and the non-finite value it left.
type Refusal = (usize, f32);

/// A new row computed from a stored one, to be written if unchanged.
struct NewRow {
    /// The version read (`None`: the key was absent).
    expected: Option<[u8; 8]>,
    row: Vec<u8>,
}

/// A row computed in one round, to be written if unchanged.
struct Computed {
    /// Index in the targets.
    target: usize,
    new: NewRow,
}

/// A row to write if the stored row's version is still `expected`
/// (`None`: if the key is still absent).
pub(crate) struct VersionedWrite<'a> {
    pub bits: u64,
    pub expected: Option<[u8; 8]>,
    pub row: &'a [u8],
}

impl<K: Key> RedisVariable<K> {
    /// The optimizers' primitive: runs `update(i, values, slot_rows)` on
    /// each key's row and its rows of `slots`, atomically per row (see the
    /// [module docs](self)), inserting a missing key with the initializer's
    /// row and the slots' initial values. A key repeated in `keys` is
    /// updated once per occurrence. `slots` must not repeat a slot
    /// ([`Error::InvalidArgument`]). `update` should depend only on its
    /// arguments: it may run again for a row that another writer changed
    /// meanwhile.
    pub fn update_rows(
        &self,
        keys: &[K],
        slots: &[SlotId],
        mut update: impl FnMut(usize, &mut [f32], &mut [f32]),
    ) -> Result<()> {
        dynemb::checks::check_slot_list(self.store_id(), self.name(), slots)?;
        let top = slots.iter().map(|s| s.index()).max();
        let initials: Vec<f32> = match top {
            Some(top) => self.slots_through(top)?[..=top]
                .iter()
                .map(|&(_, v)| v)
                .collect(),
            None => Vec::new(),
        };
        let mut index_of: HashMap<u64, usize> = HashMap::new();
        let mut targets: Vec<Target> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let bits = k.to_bits();
            let t = *index_of.entry(bits).or_insert_with(|| {
                targets.push(Target {
                    bits,
                    positions: Vec::new(),
                });
                targets.len() - 1
            });
            targets[t].positions.push(i);
        }
        let mut pending: Vec<usize> = (0..targets.len()).collect();
        let mut scratch = Scratch::new(self.dim(), slots.len());
        let mut refused: Option<Refusal> = None;
        for round in 0..MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            if round > 1 {
                // Half to one and a half times the round's pause, at random,
                // so writers that collided do not retry in lockstep.
                let base = 200 * round.min(20) as u64;
                let jitter = u64::from_le_bytes(layout::new_version()) % base;
                std::thread::sleep(Duration::from_micros(base / 2 + jitter));
            }
            // Chunks of the pending keys, pipelined: while the kernel runs
            // on one chunk here, another thread writes the previous chunk
            // back and reads the next one.
            let chunks: Vec<&[usize]> = pending.chunks(chunk_len(pending.len())).collect();
            let mut rows = self
                .write_and_fetch(&targets, &[], Some(chunks[0]))?
                .1
                .expect("a chunk was read");
            let mut to_write: Vec<Computed> = Vec::new();
            let mut conflicts: Vec<usize> = Vec::new();
            let mut round_refused = HashMap::new();
            for (k, chunk) in chunks.iter().enumerate() {
                let next = chunks.get(k + 1).copied();
                let writing = std::mem::take(&mut to_write);
                let targets = &targets;
                let io = || self.write_and_fetch(targets, &writing, next);
                let mut compute = || {
                    let mut computed = Vec::with_capacity(chunk.len());
                    chunk.iter().zip(&rows).try_for_each(|(&t, stored)| {
                        let (row, refusal) = self.compute(
                            &targets[t],
                            stored.as_deref(),
                            slots,
                            &initials,
                            &mut scratch,
                            &mut update,
                        )?;
                        if let Some(refusal) = refusal {
                            round_refused.insert(t, refusal);
                        }
                        if let Some(new) = row {
                            computed.push(Computed { target: t, new });
                        }
                        Ok::<(), Error>(())
                    })?;
                    Ok::<_, Error>(computed)
                };
                // A round of one chunk has no I/O to overlap: no thread.
                let (computed, io) = if writing.is_empty() && next.is_none() {
                    (compute(), Ok((Vec::new(), None)))
                } else {
                    std::thread::scope(|scope| {
                        let io = scope.spawn(io);
                        let computed = compute();
                        let io = io
                            .join()
                            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                        (computed, io)
                    })
                };
                let (written, next_rows) = io?;
                conflicts.extend(written);
                to_write = computed?;
                if let Some(next_rows) = next_rows {
                    rows = next_rows;
                }
            }
            conflicts.extend(self.write_and_fetch(&targets, &to_write, None)?.0);
            for (t, refusal) in round_refused {
                if !conflicts.contains(&t) && refused.is_none_or(|(first, _)| refusal.0 < first) {
                    refused = Some(refusal);
                }
            }
            pending = conflicts;
        }
        if !pending.is_empty() {
            return Err(Error::Backend {
                store: self.store().to_string(),
                kind: BackendErrorKind::Contention,
                message: format!(
                    "update_rows: {} row(s) still changed by other writers after {MAX_ROUNDS} rounds",
                    pending.len()
                ),
            });
        }
        match refused {
            None => Ok(()),
            Some((index, value)) => Err(Error::NonFinite {
                what: "update_rows result",
                index,
                value,
            }),
        }
    }

    /// Runs the update of one key on its stored row (`None`: absent).
    /// Returns the row to write with the version it expects (`None` if
    /// every occurrence was refused) and the first refused occurrence.
    fn compute(
        &self,
        target: &Target,
        stored: Option<&[u8]>,
        slots: &[SlotId],
        initials: &[f32],
        scratch: &mut Scratch,
        update: &mut impl FnMut(usize, &mut [f32], &mut [f32]),
    ) -> Result<(Option<NewRow>, Option<Refusal>)> {
        let dim = self.dim();
        let row = stored
            .map(|b| Row::parse(b, dim, self.store()))
            .transpose()?;
        let Scratch {
            values,
            slot_rows,
            try_values,
            try_slots,
        } = scratch;
        match &row {
            Some(row) => row.values_into(values),
            None => self.initializer().fill(target.bits, values),
        }
        for (j, slot) in slots.iter().enumerate() {
            let part = &mut slot_rows[j * dim..(j + 1) * dim];
            match &row {
                Some(row) => row.slot_into(slot.index(), initials[slot.index()], part),
                None => part.fill(initials[slot.index()]),
            }
        }
        let mut applied = 0u64;
        let mut refused = None;
        try_values.copy_from_slice(values);
        try_slots.copy_from_slice(slot_rows);
        for &position in &target.positions {
            update(position, try_values, try_slots);
            let bad = try_values
                .iter()
                .chain(try_slots.iter())
                .find(|v| !v.is_finite())
                .copied();
            match bad {
                None => {
                    values.copy_from_slice(try_values);
                    slot_rows.copy_from_slice(try_slots);
                    applied += 1;
                }
                Some(value) => {
                    refused.get_or_insert((position, value));
                    try_values.copy_from_slice(values);
                    try_slots.copy_from_slice(slot_rows);
                }
            }
        }
        if applied == 0 {
            return Ok((None, refused));
        }
        let score = match self.restrict_policy() {
            None => 0,
            Some(RestrictPolicy::Frequency) => row.map_or(0, |r| r.score()).saturating_add(applied),
            Some(RestrictPolicy::Timestamp) => dynemb::restrict::next_timestamp(),
        };
        // `initials` holds the initial value of every column up to the
        // highest of `slots`.
        let columns = row.map_or(0, |r| r.slot_columns()).max(initials.len());
        let mut bytes = Vec::with_capacity(HEADER + 4 * dim * (1 + columns));
        bytes.extend_from_slice(&layout::new_version());
        bytes.extend_from_slice(&score.to_le_bytes());
        layout::f32_bytes(values, &mut bytes);
        for column in 0..columns {
            if let Some(j) = slots.iter().position(|s| s.index() == column) {
                layout::f32_bytes(&slot_rows[j * dim..(j + 1) * dim], &mut bytes);
            } else if let Some(old) = row.and_then(|r| r.slot_bytes(column)) {
                bytes.extend_from_slice(old);
            } else {
                let initial = match initials.get(column) {
                    Some(&initial) => initial,
                    None => self.slot_initial(SlotId::new(self.store_id(), column))?,
                };
                layout::f32_fill_bytes(initial, dim, &mut bytes);
            }
        }
        let new = NewRow {
            expected: row.map(|r| r.version()),
            row: bytes,
        };
        Ok((Some(new), refused))
    }

    /// Writes `writing` back (see [`RedisVariable::write_if_unchanged`])
    /// and reads the stored rows of `targets[next]` (if any; `None` for an
    /// absent row, in order), in one round trip: both go in the same
    /// pipelines (they touch different keys: chunks of a round are
    /// disjoint), so the servers go from one to the other without waiting
    /// for this client. Returns the targets whose rows changed meanwhile
    /// (not written) and the rows read.
    fn write_and_fetch(
        &self,
        targets: &[Target],
        writing: &[Computed],
        next: Option<&[usize]>,
    ) -> Result<(Vec<usize>, Option<StoredRows>)> {
        let writes = versioned(targets, writing);
        let (write_grouped, mut requests) = self.write_requests(&writes)?;
        let write_count = requests.len();
        let read = match next {
            Some(chunk) => {
                let bits: Vec<u64> = chunk.iter().map(|&t| targets[t].bits).collect();
                let grouped = Grouped::new(&bits, self.buckets())?;
                requests.extend(self.fetch_requests(&bits, &grouped));
                Some((bits, grouped))
            }
            None => None,
        };
        if requests.is_empty() {
            return Ok((Vec::new(), None));
        }
        let mut replies = self.inner.cluster.run(&requests)?;
        let read_replies = replies.split_off(write_count);
        let conflicts = self
            .conflicts(&write_grouped, replies)?
            .into_iter()
            .map(|i| writing[i].target)
            .collect();
        let rows = read
            .map(|(bits, grouped)| self.fetched_rows(&bits, &grouped, read_replies))
            .transpose()?;
        Ok((conflicts, rows))
    }

    /// Writes each row of `writes` whose stored version is still the
    /// expected one, one script per bucket, one round trip per node;
    /// returns the indexes in `writes` of the rows that changed meanwhile
    /// (not written).
    pub(crate) fn write_if_unchanged(&self, writes: &[VersionedWrite<'_>]) -> Result<Vec<usize>> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let (grouped, requests) = self.write_requests(writes)?;
        let replies = self.inner.cluster.run(&requests)?;
        self.conflicts(&grouped, replies)
    }

    /// [`Self::write_if_unchanged`]'s requests, one per bucket, and the
    /// grouping they follow.
    fn write_requests(&self, writes: &[VersionedWrite<'_>]) -> Result<(Grouped, Vec<Request>)> {
        let bits: Vec<u64> = writes.iter().map(|w| w.bits).collect();
        let grouped = Grouped::new(&bits, self.buckets())?;
        let id = layout::new_version();
        let mut requests = Vec::with_capacity(grouped.len());
        for (bucket, positions) in grouped.iter() {
            let bytes: usize = positions
                .iter()
                .map(|&p| 16 + writes[p as usize].row.len())
                .sum();
            let mut cmd = self.write_cmd_with_capacity(
                &scripts::WRITE_IF_UNCHANGED,
                bucket,
                id,
                3 * positions.len(),
                bytes,
            );
            for &p in positions {
                let write = &writes[p as usize];
                cmd.arg(&layout::field(write.bits)[..])
                    .arg(write.expected.as_ref().map_or(&[][..], |v| &v[..]))
                    .arg(write.row);
            }
            requests.push(self.bucket_request(bucket, &cmd));
        }
        Ok((grouped, requests))
    }

    /// The indexes in the writes of the rows that changed meanwhile, from
    /// the replies to [`Self::write_requests`].
    fn conflicts(&self, grouped: &Grouped, replies: Vec<Value>) -> Result<Vec<usize>> {
        let mut conflicts = Vec::new();
        for ((_, positions), reply) in grouped.iter().zip(replies) {
            for item in reply::array(self.store(), "versioned write", reply)? {
                let at = reply::int(self.store(), "versioned write", item)?;
                let p = usize::try_from(at)
                    .ok()
                    .and_then(|a| positions.get(a))
                    .ok_or_else(|| {
                        reply::unexpected(self.store(), "versioned write", &Value::Int(at))
                    })?;
                conflicts.push(*p as usize);
            }
        }
        Ok(conflicts)
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_len;

    #[test]
    fn rounds_are_cut_into_a_few_large_chunks() {
        assert_eq!(chunk_len(1), 1);
        assert_eq!(
            chunk_len(16_383),
            16_383,
            "one chunk below twice the minimum"
        );
        assert_eq!(chunk_len(16_384), 8_192);
        assert_eq!(chunk_len(65_536), 8_192);
        assert_eq!(chunk_len(1_000_001), 125_001, "at most eight");
    }
}
