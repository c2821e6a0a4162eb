//! Whole-table passes over a [`RedisVariable`]: streaming export (and
//! save's reading, see `checkpoint`), `restrict` and `expire`.
//!
//! # Bounded round trips, bounded memory
//!
//! A pass plans its round trips as it goes ([`Groups`]): it counts the
//! rows of a window of buckets (`HLEN`, 4096 buckets per round trip),
//! cuts the window into groups of consecutive buckets holding about as
//! many rows as asked for, and reads one group per round trip (one
//! pipeline per node); empty groups are skipped. So no round trip
//! carries more than a group, and the client holds one group's rows (and
//! one window's counts), never the table.
//!
//! A bucket is read whole and at once (one command), so a group holds at
//! least one bucket, however large: a bucket's size is what bounds a
//! round trip from below. Buckets are fixed when the variable is created
//! ([`RedisConfig::buckets`](crate::RedisConfig::buckets), which says
//! how to choose them: at least the table's expected rows divided by
//! 8,192), so that a bucket stays well below a round trip's worth of
//! rows (16,384 for save, export and `restrict`, 8,192 for restore).
//!
//! A key present throughout a pass is seen exactly once; keys written or
//! removed during the pass may or may not be (as for a local variable's
//! export). A pass refuses to start while a restore is in progress or
//! after one was interrupted, and fails if it meets a bucket being
//! restored (a restore that began after the pass started): an export
//! or save reading it, and `restrict` scanning or pruning it, which then
//! removes nothing more (the groups pruned before stay pruned).
//!
//! # `restrict`
//!
//! TFRA's `restrict` keeps the `num_reserved` highest-scored rows. Here it
//! is planned in passes over the scores alone (8 bytes per row over the
//! network; on the server the module's `DYNEMB.SCORES` reads the rows in
//! place, the `SCORES` script copies one bucket at a time into Lua), each
//! pass in groups as above:
//!
//! 1. count the rows and find the lowest and highest score;
//! 2. narrow down the threshold score: a histogram of [`BINS`] equal
//!    ranges between the bounds found so far, then the range holding the
//!    `excess`-th lowest score (`excess` = rows − `num_reserved`), until
//!    the range is one score (one pass for scores spread over fewer than
//!    65,536 values, such as frequencies; at most four for any `u64`);
//! 3. remove, per group, every row scored below the threshold, and of the
//!    rows scored exactly the threshold as many as are still needed to
//!    reach `excess` (`DYNEMB.REMOVE_BELOW` or the `REMOVE_BELOW` script,
//!    recorded writes; a second round trip for a group only when it has
//!    ties to remove).
//!
//! Ties fall in bucket order: the rows at the threshold removed are those
//! of the lowest-numbered buckets, in each bucket the first ones read.
//! The client holds the histogram (512 KiB) and one group's scores.
//! When nobody writes meanwhile, exactly `num_reserved` rows are kept, the
//! highest-scored ones, as TFRA keeps them. Where TFRA removes the keys
//! it chose from a snapshot, here a row is judged by its score when its
//! bucket is pruned: a row written during the pass that then scores
//! above the threshold stays, one still below it goes, so with concurrent
//! writers the rows kept may differ from `num_reserved` by the rows
//! written meanwhile. Decision: prune by threshold on the servers,
//! because then no key travels to the client or waits there.
//!
//! # `expire`
//!
//! Expiry by age is `restrict`'s step 3 alone, with the cutoff as the
//! threshold and no ties: one pass, a group of buckets per round trip,
//! each bucket judged and pruned by one `REMOVE_BELOW` (module command
//! or script) that removes the rows whose timestamp is below the cutoff
//! (at the cutoff stays, as on a local variable). The scores are read
//! on the server by the very command that removes, atomically per
//! bucket, so a row is judged by the score it has when it is removed: a
//! row written after `expire` began (stamped after the cutoff) is kept
//! whenever its bucket is pruned, and one written back after its bucket
//! was pruned is a new row. Nothing but three counts per bucket comes
//! back: the client holds one group's counts. Decision: no scan of the
//! scores to the client first, which would ship 8 bytes per row and add
//! a round trip per group only to skip buckets with nothing to remove.

use crate::layout::{self, Row};
use crate::reply;
use crate::scripts;
use crate::variable::{restoring_error, RedisVariable, BUCKETS_PER_ROUND_TRIP};
use dynemb::{Key, Result};
use redis::Value;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Bins of `restrict`'s score histogram.
pub(crate) const BINS: usize = 1 << 16;

/// Most rows, about, one round trip of `export_chunks` reads.
pub(crate) const EXPORT_ROWS_PER_GROUP: usize = 1 << 14;

/// Rows whose scores one round trip of `restrict` reads or prunes, about.
const RESTRICT_ROWS_PER_GROUP: usize = 1 << 14;

/// Rows one round trip of `expire` judges, about.
const EXPIRE_ROWS_PER_GROUP: usize = RESTRICT_ROWS_PER_GROUP;

/// The groups of a pass (see the module docs): consecutive buckets of
/// about `rows_per_group` rows each, planned a window of buckets at a
/// time, empty groups skipped.
pub(crate) struct Groups<'a, K: Key> {
    var: &'a RedisVariable<K>,
    rows_per_group: usize,
    /// The first bucket of the next window to count.
    next: u32,
    planned: VecDeque<Range<u32>>,
    failed: bool,
}

impl<'a, K: Key> Groups<'a, K> {
    pub(crate) fn new(var: &'a RedisVariable<K>, rows_per_group: usize) -> Self {
        Groups {
            var,
            rows_per_group: rows_per_group.max(1),
            next: 0,
            planned: VecDeque::new(),
            failed: false,
        }
    }

    /// Counts the next window's rows and plans its groups.
    fn plan_window(&mut self) -> Result<()> {
        let end = self
            .var
            .buckets()
            .min(self.next.saturating_add(BUCKETS_PER_ROUND_TRIP));
        let window = self.next..end;
        self.next = end;
        let sizes = self.var.bucket_sizes(window.clone())?;
        let mut start = window.start;
        let mut rows = 0usize;
        for (b, &n) in window.clone().zip(&sizes) {
            if rows > 0 && rows + n > self.rows_per_group {
                self.planned.push_back(start..b);
                start = b;
                rows = 0;
            }
            if rows == 0 && n == 0 {
                start = b + 1; // an empty bucket opens no group
                continue;
            }
            rows += n;
        }
        if rows > 0 {
            self.planned.push_back(start..window.end);
        }
        Ok(())
    }
}

impl<K: Key> Iterator for Groups<'_, K> {
    type Item = Result<Range<u32>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.failed {
                return None;
            }
            if let Some(group) = self.planned.pop_front() {
                return Some(Ok(group));
            }
            if self.next >= self.var.buckets() {
                return None;
            }
            if let Err(e) = self.plan_window() {
                self.failed = true;
                return Some(Err(e));
            }
        }
    }
}

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
    groups: Groups<'a, K>,
    started: bool,
    failed: bool,
}

impl<'a, K: Key> Scan<'a, K> {
    /// A pass reading about `rows_per_group` rows per round trip, with the
    /// slot columns whose initial values are `slots`.
    pub(crate) fn new(var: &'a RedisVariable<K>, rows_per_group: usize, slots: Vec<f32>) -> Self {
        Scan {
            var,
            slots,
            groups: Groups::new(var, rows_per_group),
            started: false,
            failed: false,
        }
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
                if field == layout::RESTORING_FIELD {
                    return Err(restoring_error(var.store(), &bytes));
                }
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
        if !self.started {
            self.started = true;
            if let Err(e) = self.var.check_not_restoring() {
                self.failed = true;
                return Some(Err(e));
            }
        }
        let read = match self.groups.next()? {
            Ok(range) => self.read(range),
            Err(e) => Err(e),
        };
        self.failed = read.is_err();
        Some(read)
    }
}

impl<K: Key> RedisVariable<K> {
    /// Every key and its row (`dim` values per key, in the same order);
    /// order unspecified. Holds the whole table in memory:
    /// [`RedisVariable::export_chunks`] streams it.
    pub fn export(&self) -> Result<(Vec<K>, Vec<f32>)> {
        dynemb::EmbeddingTable::export(self)
    }

    /// Streams every key and row in chunks of at most `rows_per_chunk`
    /// rows, each from one round trip of about `rows_per_chunk` rows, or
    /// 16,384 if fewer (a larger bucket is read whole;
    /// see the module docs, also for what a pass sees while others
    /// write). A `rows_per_chunk` of 0 is an [`Error::InvalidArgument`].
    pub fn export_chunks(
        &self,
        rows_per_chunk: usize,
    ) -> impl Iterator<Item = Result<(Vec<K>, Vec<f32>)>> + '_ {
        let dim = self.dim();
        let mut refused = dynemb::checks::check_rows_per_chunk(rows_per_chunk).err();
        let mut scan = refused
            .is_none()
            .then(|| Scan::new(self, rows_per_chunk.min(EXPORT_ROWS_PER_GROUP), Vec::new()));
        let mut failed = false;
        let mut buffered: VecDeque<(Vec<K>, Vec<f32>)> = VecDeque::new();
        std::iter::from_fn(move || {
            if failed {
                return None;
            }
            let Some(scan) = scan.as_mut() else {
                failed = true;
                return refused.take().map(Err);
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
    /// removed. A variable without a restrict policy is an
    /// [`Error::InvalidArgument`], and one being restored (see
    /// [`RedisVariable::restore`]) an [`Error::Backend`]: both before
    /// anything changes.
    ///
    /// It runs in passes over the rows' scores, in round trips of a
    /// bounded number of rows, and removes on the servers what scores
    /// below the threshold it finds; rows tied at the threshold are
    /// removed in bucket order (see the `scan` module's docs for the
    /// passes, the ties, and what concurrent writers change). The counts
    /// are exact when nobody writes meanwhile. A failure part-way (a node
    /// down) may leave some groups pruned and others not.
    pub fn restrict(&self, num_reserved: usize, trigger: usize) -> Result<usize> {
        dynemb::checks::check_restrict_policy(self.name(), self.restrict_policy())?;
        let size = self.size()?;
        if size <= trigger || size <= num_reserved {
            return Ok(0);
        }
        let plan = plan_restrict(num_reserved as u64, |seen| self.score_pass(seen))?;
        match plan {
            None => Ok(0),
            Some(plan) => self.prune(plan.threshold, plan.ties),
        }
    }

    /// Removes the rows (with their slots and scores) not written for
    /// `older_than` and returns how many (Monolith's and TorchRec's
    /// expiry by age, as [`Variable::expire`](dynemb::Variable::expire)).
    /// A row is old when its [`RestrictPolicy::Timestamp`](dynemb::RestrictPolicy::Timestamp) score is below
    /// `now - older_than`, `now` taken from this process's clock
    /// ([`dynemb::restrict::next_timestamp`]) when the call starts; rows
    /// stamped by processes whose clocks run behind or ahead are judged
    /// by their stamps. A row written while it runs is kept (each bucket
    /// is judged and pruned at once on its server, see the `scan`
    /// module's docs).
    ///
    /// A variable without the Timestamp policy is an
    /// [`Error::InvalidArgument`], and one being restored (see
    /// [`RedisVariable::restore`]) an [`Error::Backend`]: both before
    /// anything changes. It runs in one pass, a group of about 16,384
    /// rows per round trip; the client's memory does not grow with the
    /// table. A failure part-way (a node down, a restore starting) may
    /// leave some groups expired and others not; running it again
    /// finishes the work. The rows removed are counted in
    /// [`RedisVariable::lifecycle_stats`], group by group.
    pub fn expire(&self, older_than: Duration) -> Result<usize> {
        // The cutoff first: `now` is when the call starts.
        let cutoff =
            dynemb::checks::expiry_cutoff(self.name(), self.restrict_policy(), older_than)?;
        self.check_not_restoring()?;
        if cutoff == 0 {
            return Ok(0); // no score is below 0
        }
        let mut removed = 0u64;
        for group in Groups::new(self, EXPIRE_ROWS_PER_GROUP) {
            let gone: u64 = self
                .remove_below(group?.map(|b| (b, 0)), cutoff)?
                .iter()
                .map(|&(below, _, _)| below)
                .sum();
            removed += gone;
            self.inner.expired.fetch_add(gone, Ordering::Relaxed);
        }
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }

    /// Calls `seen` on the score of every row, a group of buckets per
    /// round trip (the module's `DYNEMB.SCORES`, or the `SCORES` script).
    fn score_pass(&self, seen: &mut dyn FnMut(u64)) -> Result<()> {
        for group in Groups::new(self, RESTRICT_ROWS_PER_GROUP) {
            let requests: Vec<_> = group?
                .map(|b| self.bucket_request(b, &self.read_cmd(&scripts::SCORES, b)))
                .collect();
            for reply in self.inner.cluster.run(&requests)? {
                let scores = reply::bytes(self.store(), "scores", self.not_restoring(reply)?)?;
                if scores.len() % 8 != 0 {
                    return Err(reply::unexpected(
                        self.store(),
                        "scores",
                        &Value::BulkString(scores),
                    ));
                }
                for score in scores.chunks_exact(8) {
                    seen(u64::from_le_bytes(score.try_into().expect("8 bytes")));
                }
            }
        }
        Ok(())
    }

    /// Removes every row scored below `threshold` and up to `ties` rows
    /// scored `threshold`, in bucket order; returns how many it removed.
    fn prune(&self, threshold: u64, ties: u64) -> Result<usize> {
        let mut removed = 0u64;
        let mut quota = ties;
        for group in Groups::new(self, RESTRICT_ROWS_PER_GROUP) {
            let group = group?;
            let counts = self.remove_below(group.clone().map(|b| (b, 0)), threshold)?;
            let mut ties_at = Vec::new();
            for (b, (gone, _, left)) in group.zip(counts) {
                removed += gone;
                if left > 0 && quota > 0 {
                    let take = left.min(quota);
                    quota -= take;
                    ties_at.push((b, take));
                }
            }
            if !ties_at.is_empty() {
                for (gone, ties_gone, _) in self.remove_below(ties_at.into_iter(), threshold)? {
                    removed += gone + ties_gone;
                }
            }
        }
        Ok(usize::try_from(removed).unwrap_or(usize::MAX))
    }

    /// `reply`, unless it is the error of a bucket being restored
    /// ([`scripts::RESTORING_ERROR`]): then the error any read of such a
    /// bucket gets.
    fn not_restoring(&self, reply: Value) -> Result<Value> {
        match &reply {
            Value::ServerError(e) if e.code() == scripts::RESTORING_ERROR => {
                let details = e.details().unwrap_or("");
                // A script's error carries " script: <sha>, on ..." after
                // the checkpoint.
                let checkpoint = details.split(" script: ").next().unwrap_or(details);
                Err(restoring_error(self.store(), checkpoint.as_bytes()))
            }
            _ => Ok(reply),
        }
    }

    /// One round trip of `REMOVE_BELOW` on each `(bucket, tie quota)`:
    /// per bucket, `(removed below, ties removed, ties left)`.
    fn remove_below(
        &self,
        buckets: impl Iterator<Item = (u32, u64)>,
        threshold: u64,
    ) -> Result<Vec<(u64, u64, u64)>> {
        let id = layout::new_version();
        let requests: Vec<_> = buckets
            .map(|(b, quota)| {
                let mut cmd = self.write_cmd(&scripts::REMOVE_BELOW, b, id);
                cmd.arg(&threshold.to_le_bytes()[..]).arg(quota);
                self.bucket_request(b, &cmd)
            })
            .collect();
        self.inner
            .cluster
            .run(&requests)?
            .into_iter()
            .map(|reply| {
                let items =
                    reply::array(self.store(), "restrict remove", self.not_restoring(reply)?)?;
                let counts = items
                    .into_iter()
                    .map(|item| {
                        let n = reply::int(self.store(), "restrict remove", item)?;
                        u64::try_from(n).map_err(|_| {
                            reply::unexpected(self.store(), "restrict remove", &Value::Int(n))
                        })
                    })
                    .collect::<Result<Vec<u64>>>()?;
                match counts[..] {
                    [below, ties, left] => Ok((below, ties, left)),
                    _ => Err(reply::unexpected(
                        self.store(),
                        "restrict remove",
                        &Value::Int(counts.len() as i64),
                    )),
                }
            })
            .collect()
    }
}

/// What `restrict` removes: every row scored below `threshold`, and
/// `ties` rows scored `threshold`.
#[derive(Debug, PartialEq)]
pub(crate) struct RestrictPlan {
    pub threshold: u64,
    pub ties: u64,
}

/// `restrict`'s passes 1 and 2 (see the module docs) over the scores that
/// `pass` shows (each call of `pass` calls its argument on every row's
/// score): what to remove to keep `reserved` rows, or `None` if there
/// are no more rows than that.
pub(crate) fn plan_restrict(
    reserved: u64,
    mut pass: impl FnMut(&mut dyn FnMut(u64)) -> Result<()>,
) -> Result<Option<RestrictPlan>> {
    // 1. Count, lowest and highest score.
    let (mut rows, mut lo, mut hi) = (0u64, u64::MAX, 0u64);
    pass(&mut |score| {
        rows += 1;
        lo = lo.min(score);
        hi = hi.max(score);
    })?;
    if rows <= reserved {
        return Ok(None);
    }
    let excess = rows - reserved;
    // 2. Narrow [lo, hi] down to the threshold; `below` rows score under
    // `lo`, fewer than `excess`.
    let mut below = 0u64;
    let mut histogram = vec![0u64; BINS];
    while lo < hi {
        let width = (hi - lo) / BINS as u64 + 1;
        histogram.fill(0);
        pass(&mut |score| {
            if (lo..=hi).contains(&score) {
                histogram[((score - lo) / width) as usize] += 1;
            }
        })?;
        let (bin, under) = threshold_bin(&histogram, excess - below);
        below += under;
        lo += bin as u64 * width;
        hi = hi.min(lo.saturating_add(width - 1));
    }
    Ok(Some(RestrictPlan {
        threshold: lo,
        ties: excess - below,
    }))
}

/// The bin of `histogram` holding the `needed`-th lowest score (1-based),
/// and how many scores lie in the bins before it. If the histogram holds
/// fewer (rows removed since they were counted), its last non-empty bin.
pub(crate) fn threshold_bin(histogram: &[u64], needed: u64) -> (usize, u64) {
    let mut under = 0u64;
    let mut last = (0, 0);
    for (bin, &count) in histogram.iter().enumerate() {
        if count == 0 {
            continue;
        }
        if under + count >= needed {
            return (bin, under);
        }
        last = (bin, under);
        under += count;
    }
    last
}

#[cfg(test)]
mod tests {
    use super::{plan_restrict, threshold_bin, RestrictPlan};
    use proptest::prelude::*;

    /// The plan that sorting all scores gives.
    fn sorted_plan(scores: &[u64], reserved: u64) -> Option<RestrictPlan> {
        let excess = (scores.len() as u64)
            .checked_sub(reserved)
            .filter(|&e| e > 0)?;
        let mut sorted = scores.to_vec();
        sorted.sort_unstable();
        let threshold = sorted[excess as usize - 1];
        let below = sorted.iter().filter(|&&s| s < threshold).count() as u64;
        Some(RestrictPlan {
            threshold,
            ties: excess - below,
        })
    }

    fn plan(scores: &[u64], reserved: u64) -> Option<RestrictPlan> {
        plan_restrict(reserved, |seen| {
            scores.iter().for_each(|&s| seen(s));
            Ok(())
        })
        .unwrap()
    }

    proptest! {
        #[test]
        fn the_plan_is_the_sorted_threshold(
            scores in prop::collection::vec(
                prop_oneof![0u64..4, any::<u64>(), (u64::MAX - 3)..=u64::MAX, 1_700_000_000_000u64..1_700_000_100_000],
                0..300,
            ),
            reserved in 0u64..320,
        ) {
            prop_assert_eq!(plan(&scores, reserved), sorted_plan(&scores, reserved));
        }
    }

    #[test]
    fn wide_scores_take_several_passes_and_ties_are_counted() {
        let scores = [u64::MAX, 0, 7, 7, 7, 1 << 40, u64::MAX - 1];
        let mut passes = 0;
        let got = plan_restrict(2, |seen| {
            passes += 1;
            scores.iter().for_each(|&s| seen(s));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, sorted_plan(&scores, 2));
        assert!(passes > 2, "{passes}");
        assert_eq!(
            plan(&[3, 3, 3], 1),
            Some(RestrictPlan {
                threshold: 3,
                ties: 2
            })
        );
        assert_eq!(plan(&[3, 3, 3], 3), None);
    }

    #[test]
    fn the_threshold_bin_holds_the_needed_score() {
        let h = [0, 3, 0, 2, 5];
        assert_eq!(threshold_bin(&h, 1), (1, 0));
        assert_eq!(threshold_bin(&h, 3), (1, 0));
        assert_eq!(threshold_bin(&h, 4), (3, 3));
        assert_eq!(threshold_bin(&h, 6), (4, 5));
        assert_eq!(threshold_bin(&h, 10), (4, 5));
        assert_eq!(threshold_bin(&h, 11), (4, 5), "fewer than needed");
        assert_eq!(threshold_bin(&[0, 0], 1), (0, 0));
    }
}
