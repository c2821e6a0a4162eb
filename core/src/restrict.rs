//! Restrict policies: what a row's score means, and the clock that stamps
//! timestamps.
//!
//! A variable built with a [`RestrictPolicy`] keeps a `u64` score per row, in
//! the row's own header, and [`Variable::restrict`](crate::Variable::restrict)
//! removes the lowest-scored rows. TFRA keeps the same status in a separate
//! variable that its optimizers update; here every write of a row updates
//! it, under the row's lock:
//!
//! - [`RestrictPolicy::Timestamp`]: the time of the row's last write, in
//!   nanoseconds since the Unix epoch. One timestamp is taken per batch (per
//!   shard's share of a batch, for a sharded variable), from a process-wide
//!   clock that never goes backwards and is strictly increasing from stamp
//!   to stamp (if the wall clock stalls or steps back, the stamp advances by
//!   one nanosecond);
//! - [`RestrictPolicy::Frequency`]: how many writes the row has had (its
//!   insert counts as the first).
//!
//! "Writes" are inserts (by [`lookup_or_insert`](crate::Variable::lookup_or_insert),
//! [`upsert`](crate::Variable::upsert), [`accum`](crate::Variable::accum)),
//! upserts, accumulations that apply under `bp_v2`'s rules (a zero delta
//! included), and optimizer updates
//! ([`update_rows`](crate::Variable::update_rows)); reads ([`lookup`](crate::Variable::lookup),
//! a `lookup_or_insert` of a present key) leave the score alone, so reading
//! stays free of atomic read-modify-writes. A key repeated in one batch is
//! written (and counted) once per occurrence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// What the per-row score of a variable means, and so which rows
/// [`Variable::restrict`](crate::Variable::restrict) removes first (the lowest
/// scores). See the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RestrictPolicy {
    /// Least recently written first: the score is the time of the last write
    /// (nanoseconds since the Unix epoch).
    Timestamp,
    /// Least often written first: the score counts the writes.
    Frequency,
}

impl RestrictPolicy {
    /// The policy's name in checkpoints (`"timestamp"`, `"frequency"`).
    pub fn name(self) -> &'static str {
        match self {
            RestrictPolicy::Timestamp => "timestamp",
            RestrictPolicy::Frequency => "frequency",
        }
    }

    /// The policy called `name` (see [`RestrictPolicy::name`]).
    pub fn from_name(name: &str) -> Option<RestrictPolicy> {
        match name {
            "timestamp" => Some(RestrictPolicy::Timestamp),
            "frequency" => Some(RestrictPolicy::Frequency),
            _ => None,
        }
    }
}

/// The last timestamp handed out.
static LAST_STAMP: AtomicU64 = AtomicU64::new(0);

/// A timestamp for one batch's writes: now in nanoseconds since the Unix
/// epoch, or one more than the previous stamp if that is later. The clock
/// every [`RestrictPolicy::Timestamp`] score of the process comes from
/// (public for stores outside this crate, which stamp their rows with it).
pub fn next_timestamp() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let mut last = LAST_STAMP.load(Ordering::Relaxed);
    loop {
        let stamp = now.max(last.saturating_add(1));
        match LAST_STAMP.compare_exchange_weak(last, stamp, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return stamp,
            Err(seen) => last = seen,
        }
    }
}

/// Clamps timestamps read from a checkpoint to this process's clock: a
/// stamp later than [`next_timestamp`] (written by a machine whose clock
/// runs ahead) becomes that stamp, so the row counts as written now. The
/// clock itself never moves forward for a checkpoint: the ages `expire`
/// and eviction compare stay true for every variable of the process, at
/// the cost of the order among the rows clamped together.
pub fn clamp_to_clock(stamps: &mut [u64]) {
    let now = next_timestamp();
    for stamp in stamps.iter_mut().filter(|s| **s > now) {
        *stamp = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_strictly_increase() {
        let a = next_timestamp();
        let b = next_timestamp();
        assert!(b > a);
        assert!(a > 1_600_000_000_000_000_000, "nanoseconds since 1970");
    }

    #[test]
    fn stamps_ahead_of_the_clock_are_clamped_without_moving_it() {
        let before = next_timestamp();
        let ahead = before + 3_600_000_000_000;
        let mut stamps = [before - 1, ahead, u64::MAX];
        clamp_to_clock(&mut stamps);
        assert_eq!(stamps[0], before - 1, "a past stamp is kept");
        assert!(stamps[1] > before && stamps[1] < ahead);
        assert_eq!(stamps[1], stamps[2]);
        assert!(next_timestamp() < ahead, "the clock did not jump");
    }

    #[test]
    fn policy_names_round_trip() {
        for policy in [RestrictPolicy::Timestamp, RestrictPolicy::Frequency] {
            assert_eq!(RestrictPolicy::from_name(policy.name()), Some(policy));
        }
        assert_eq!(RestrictPolicy::from_name("lru"), None);
    }
}
