//! Whole-table passes over a [`RedisVariable`]: streaming export and
//! `restrict`.
//!
//! A pass first counts every bucket's rows (`HLEN`, one round trip per
//! node), then reads consecutive buckets a group at a time (`HGETALL`,
//! one round trip per node per group), a group holding about as many
//! rows as asked for (or one bucket, if a bucket holds more): memory stays
//! bounded by a group, never the table. Each bucket is read whole and at
//! once, so a key present throughout a pass is seen exactly once; keys
//! written or removed during the pass may or may not be (as for a local
//! variable's export).

use crate::layout::{self, Row};
use crate::reply;
use crate::scripts;
use crate::variable::{script_cmd, RedisVariable};
use dynemb::{Error, Key, Result};
use redis::Value;
use std::collections::VecDeque;
use std::ops::Range;

/// Rows read from a group of buckets: keys as bits, and per row its
/// values, every slot column (`slots[j]` for slot `j`, a row predating
/// the slot at its initial value) and its score.
#[derive(Debug, Default)]
pub(crate) struct Scanned {
    pub keys: Vec<u64>,
    pub values: Vec<f32>,
    pub slots: Vec<Vec<f32>>,
    pub scores: Vec<u64>,
}

/// The rows of a table, a group of buckets at a time (see the module docs).
pub(crate) struct Scan<'a, K: Key> {
    var: &'a RedisVariable<K>,
    /// Slot initial values of the columns to read (by index).
    slots: Vec<f32>,
    rows_per_group: usize,
    groups: Option<VecDeque<Range<u32>>>,
    failed: bool,
}

impl<'a, K: Key> Scan<'a, K> {
    /// A pass reading about `rows_per_group` rows per round trip, with the
    /// slot columns whose initial values are `slots`.
    pub(crate) fn new(var: &'a RedisVariable<K>, rows_per_group: usize, slots: Vec<f32>) -> Self {
        Scan {
            var,
            slots,
            rows_per_group: rows_per_group.max(1),
            groups: None,
            failed: false,
        }
    }

    /// Consecutive buckets holding about `rows_per_group` rows each.
    fn plan(&self) -> Result<VecDeque<Range<u32>>> {
        let sizes = self.var.bucket_sizes()?;
        let mut groups = VecDeque::new();
        let mut start = 0u32;
        let mut rows = 0usize;
        for (b, &n) in sizes.iter().enumerate() {
            let b = b as u32;
            if rows > 0 && rows + n > self.rows_per_group {
                groups.push_back(start..b);
                start = b;
                rows = 0;
            }
            rows += n;
        }
        if rows > 0 || start < sizes.len() as u32 {
            groups.push_back(start..sizes.len() as u32);
        }
        Ok(groups)
    }

    /// Reads the buckets of `range`.
    fn read(&self, range: Range<u32>) -> Result<Scanned> {
        let var = self.var;
        let dim = var.dim();
        let requests: Vec<_> = range
            .clone()
            .map(|b| {
                let mut cmd = redis::cmd("HGETALL");
                cmd.arg(var.bucket_key(b));
                var.bucket_request(b, &cmd)
            })
            .collect();
        let replies = var.inner.cluster.run(&requests)?;
        let mut out = Scanned {
            slots: vec![Vec::new(); self.slots.len()],
            ..Scanned::default()
        };
        let mut part = vec![0.0; dim];
        for reply in replies {
            let items = match reply {
                Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
                other => reply::array(var.store(), "HGETALL", other)?,
            };
            let mut items = items.into_iter();
            while let (Some(field), Some(row)) = (items.next(), items.next()) {
                let field = reply::bytes(var.store(), "HGETALL field", field)?;
                let bytes = reply::bytes(var.store(), "HGETALL row", row)?;
                let bits = layout::bits_of_field(&field).ok_or_else(|| {
                    reply::unexpected(var.store(), "HGETALL field", &Value::BulkString(field))
                })?;
                let row = Row::parse(&bytes, dim, var.store())?;
                out.keys.push(bits);
                row.values_into(&mut part);
                out.values.extend_from_slice(&part);
                for (j, &initial) in self.slots.iter().enumerate() {
                    row.slot_into(j, initial, &mut part);
                    out.slots[j].extend_from_slice(&part);
                }
                out.scores.push(row.score());
            }
        }
        Ok(out)
    }
}

impl<K: Key> Iterator for Scan<'_, K> {
    type Item = Result<Scanned>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.groups.is_none() {
            match self.plan() {
                Ok(groups) => self.groups = Some(groups),
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
        let range = self.groups.as_mut()?.pop_front()?;
        let read = self.read(range);
        self.failed = read.is_err();
        Some(read)
    }
}

impl<K: Key> RedisVariable<K> {
    /// Every key and its row (`dim` values per key, in the same order);
    /// order unspecified. Holds the whole table in memory:
    /// [`RedisVariable::export_chunks`] streams it.
    pub fn export(&self) -> Result<(Vec<K>, Vec<f32>)> {
        let mut keys = Vec::new();
        let mut values = Vec::new();
        for chunk in self.export_chunks(1 << 16) {
            let (k, v) = chunk?;
            keys.extend(k);
            values.extend(v);
        }
        Ok((keys, values))
    }

    /// Streams every key and row in chunks of at most `rows_per_chunk`
    /// rows, reading about that many rows per round trip (see the module
    /// docs for what a pass sees while others write).
    pub fn export_chunks(
        &self,
        rows_per_chunk: usize,
    ) -> impl Iterator<Item = Result<(Vec<K>, Vec<f32>)>> + '_ {
        let dim = self.dim();
        let mut scan = (rows_per_chunk > 0).then(|| Scan::new(self, rows_per_chunk, Vec::new()));
        let mut failed = false;
        let mut buffered: VecDeque<(Vec<K>, Vec<f32>)> = VecDeque::new();
        std::iter::from_fn(move || {
            if failed {
                return None;
            }
            let Some(scan) = scan.as_mut() else {
                failed = true;
                return Some(Err(Error::InvalidArgument(
                    "rows_per_chunk must be at least 1".into(),
                )));
            };
            loop {
                if let Some(chunk) = buffered.pop_front() {
                    return Some(Ok(chunk));
                }
                match scan.next()? {
                    Err(e) => {
                        failed = true;
                        return Some(Err(e));
                    }
                    Ok(rows) => {
                        for (keys, values) in rows
                            .keys
                            .chunks(rows_per_chunk)
                            .zip(rows.values.chunks(rows_per_chunk * dim))
                        {
                            buffered.push_back((
                                keys.iter().map(|&b| K::from_bits(b)).collect(),
                                values.to_vec(),
                            ));
                        }
                    }
                }
            }
        })
    }

    /// A pass over every row with every slot column and the scores,
    /// about `rows_per_group` rows per round trip (for checkpoints).
    pub(crate) fn scan_all(&self, rows_per_group: usize, slot_initials: Vec<f32>) -> Scan<'_, K> {
        Scan::new(self, rows_per_group, slot_initials)
    }

    /// TFRA's `restrict`: if the variable holds more than `trigger` rows,
    /// keeps the `num_reserved` rows with the highest scores (per its
    /// restrict policy: the most recently or most often written) and
    /// removes the others with their slots. Returns how many rows it
    /// removed. Rows with equal scores at the boundary are kept or removed
    /// arbitrarily. A variable without a restrict policy is an
    /// [`Error::InvalidArgument`].
    ///
    /// It reads every row's version and score (a script per bucket, 24
    /// bytes per row over the network, one round trip per node), chooses,
    /// then removes each chosen row only if its version is still the one
    /// read (a script per bucket): a row written meanwhile by another
    /// process is kept. The counts are exact when nobody writes meanwhile.
    pub fn restrict(&self, num_reserved: usize, trigger: usize) -> Result<usize> {
        if self.restrict_policy().is_none() {
            return Err(Error::InvalidArgument(format!(
                "variable {:?} has no restrict policy (set one with RedisVariableBuilder::restrict_policy)",
                self.name()
            )));
        }
        if self.size()? <= trigger {
            return Ok(0);
        }
        // (bucket, field bits, version, score) of every row.
        let requests: Vec<_> = (0..self.buckets())
            .map(|b| self.bucket_request(b, &script_cmd(&scripts::HEADERS, self.bucket_key(b))))
            .collect();
        let replies = self.inner.cluster.run(&requests)?;
        let mut rows: Vec<(u32, u64, [u8; 8], u64)> = Vec::new();
        for (bucket, reply) in (0..self.buckets()).zip(replies) {
            let mut items = reply::array(self.store(), "restrict scan", reply)?.into_iter();
            while let (Some(field), Some(header)) = (items.next(), items.next()) {
                let field = reply::bytes(self.store(), "restrict scan", field)?;
                let header = reply::bytes(self.store(), "restrict scan", header)?;
                let (Some(bits), Ok(header)) = (
                    layout::bits_of_field(&field),
                    <[u8; 16]>::try_from(&header[..]),
                ) else {
                    return Err(reply::unexpected(
                        self.store(),
                        "restrict scan",
                        &Value::BulkString(header),
                    ));
                };
                let version = header[..8].try_into().expect("8 bytes");
                let score = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
                rows.push((bucket, bits, version, score));
            }
        }
        let Some(excess) = rows.len().checked_sub(num_reserved).filter(|&e| e > 0) else {
            return Ok(0);
        };
        let mut scores: Vec<u64> = rows.iter().map(|r| r.3).collect();
        let (_, &mut threshold, _) = scores.select_nth_unstable(excess - 1);
        let below = scores.iter().filter(|&&s| s < threshold).count();
        let mut ties = excess - below;
        drop(scores);
        let mut victims: Vec<Vec<(u64, [u8; 8])>> = vec![Vec::new(); self.buckets() as usize];
        for &(bucket, bits, version, score) in &rows {
            let tie = score == threshold && ties > 0;
            if score < threshold || tie {
                ties -= usize::from(tie);
                victims[bucket as usize].push((bits, version));
            }
        }
        let id = layout::new_version();
        let mut requests = Vec::new();
        for (bucket, rows) in victims.iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let bucket = bucket as u32;
            let mut cmd = self.write_cmd(&scripts::REMOVE_IF_UNCHANGED, bucket, id);
            for (bits, version) in rows {
                cmd.arg(&layout::field(*bits)[..]).arg(&version[..]);
            }
            requests.push(self.bucket_request(bucket, &cmd));
        }
        let mut removed = 0;
        for reply in self.inner.cluster.run(&requests)? {
            removed += reply::int(self.store(), "restrict remove", reply)? as usize;
        }
        Ok(removed)
    }
}
