//! What the training loop reads: [`Batch`]es of labelled samples from a
//! [`DataSource`], in time order, and a held-out [`EvalSet`].
//!
//! Invariants:
//! - A sample is one label (0.0 or 1.0) and exactly one feature id per
//!   field. A [`Batch`] stores ids row-major, `[len, fields]`:
//!   `ids[i * fields + f]` is sample `i`'s id for field `f`.
//! - Ids are salted by field so that one embedding table can hold every
//!   field without collisions: [`feature_id`] puts the field index in the
//!   top 8 bits and the field's raw value in the low 56 (`field << 56 |
//!   raw`). It is a bijection for `field < 256` and `raw < 2^56` (Criteo's
//!   values are at most 32 bits, the synthetic ones far below 2^56), so two
//!   fields never share an id, and an id in a checkpoint says its field
//!   (`id >> 56`). Fields from 128 on give negative `i64` ids, which are
//!   legal keys.
//! - A source streams its training samples in order, the same ones every
//!   epoch ([`DataSource::rewind`] starts the next); the evaluation set
//!   comes after them in time and is held in memory.

use std::path::PathBuf;

/// Bits of a feature id that hold the field's raw value.
pub const RAW_BITS: u32 = 56;
/// Largest raw value a field can hold.
pub const MAX_RAW: u64 = (1 << RAW_BITS) - 1;
/// Most fields a feature id can tell apart.
pub const MAX_FIELDS: usize = 1 << (64 - RAW_BITS);

/// The id of raw value `raw` of field `field` (see the module docs).
/// `field` must be below [`MAX_FIELDS`] and `raw` at most [`MAX_RAW`];
/// callers guarantee both (sources check their field counts up front).
#[inline]
pub fn feature_id(field: usize, raw: u64) -> i64 {
    debug_assert!(field < MAX_FIELDS && raw <= MAX_RAW);
    (((field as u64) << RAW_BITS) | (raw & MAX_RAW)) as i64
}

/// The field a [`feature_id`] belongs to.
#[inline]
pub fn field_of(id: i64) -> usize {
    (id as u64 >> RAW_BITS) as usize
}

/// Labelled samples, one id per field each (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Click labels, 0.0 or 1.0, one per sample.
    pub labels: Vec<f32>,
    /// Feature ids, row-major `[labels.len(), fields]`.
    pub ids: Vec<i64>,
    /// Ids per sample.
    pub fields: usize,
}

impl Batch {
    /// An empty batch with room for `samples` samples.
    pub fn with_capacity(fields: usize, samples: usize) -> Self {
        Self {
            labels: Vec::with_capacity(samples),
            ids: Vec::with_capacity(samples * fields),
            fields,
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Each sample's label and ids, in order.
    pub fn samples(&self) -> impl Iterator<Item = (f32, &[i64])> + '_ {
        self.labels
            .iter()
            .copied()
            .zip(self.ids.chunks_exact(self.fields.max(1)))
    }
}

/// The held-out samples: the most recent time slice, after all training
/// samples.
#[derive(Clone, Debug)]
pub struct EvalSet {
    /// The samples.
    pub samples: Batch,
    /// For synthetic data, each sample's click probability given its
    /// features under the hidden model: the best score any model of these
    /// features can give, so its AUC is the ceiling. `None` for real data.
    pub truth: Option<Vec<f32>>,
}

/// A stream of training batches and a held-out set.
pub trait DataSource {
    /// One line saying what the data is.
    fn describe(&self) -> String;

    /// Ids per sample.
    fn fields(&self) -> usize;

    /// A short name for field `field`, for reports.
    fn field_name(&self, field: usize) -> String;

    /// Training samples in one epoch.
    fn train_samples(&self) -> usize;

    /// Starts the next epoch at the first training sample.
    fn rewind(&mut self) -> Result<()>;

    /// The next `batch_size` training samples in order (fewer at the end of
    /// the epoch), or `None` once the epoch is over.
    fn next_batch(&mut self, batch_size: usize) -> Result<Option<Batch>>;

    /// The held-out set.
    fn eval_set(&self) -> &EvalSet;

    /// Skips the next `batches` batches of `batch_size` samples (fewer if
    /// the epoch ends first), as if read; returns how many it skipped. The
    /// default reads them.
    fn skip_batches(&mut self, batches: u64, batch_size: usize) -> Result<u64> {
        let mut skipped = 0;
        while skipped < batches && self.next_batch(batch_size)?.is_some() {
            skipped += 1;
        }
        Ok(skipped)
    }
}

/// Checks that the held-out set has clicks and non-clicks, without which
/// its AUC is undefined: an error naming `--eval-samples` otherwise, found
/// when the data is opened rather than after an epoch of training.
pub fn check_held_out(eval: &EvalSet) -> Result<()> {
    let labels = &eval.samples.labels;
    let positives = labels.iter().filter(|&&label| label == 1.0).count();
    if positives == 0 || positives == labels.len() {
        return Err(DataError::OneClass {
            samples: labels.len(),
            positives,
        });
    }
    Ok(())
}

/// Why data could not be read or generated.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A line of a data file is not in the expected format.
    #[error("{path}:{line}: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The file holds too few lines for the held-out set and any training.
    #[error(
        "{path}: {lines} lines, but the held-out set alone needs {eval} \
         (and training at least one more)"
    )]
    TooSmall {
        /// The file.
        path: PathBuf,
        /// Lines found.
        lines: u64,
        /// Held-out lines asked for.
        eval: usize,
    },
    /// The held-out set has only clicks or only non-clicks.
    #[error(
        "the held-out set (--eval-samples {samples}) has {positives} clicks and {} \
         non-clicks; its AUC needs both: raise --eval-samples",
        samples - positives
    )]
    OneClass {
        /// Held-out samples.
        samples: usize,
        /// Clicks among them.
        positives: usize,
    },
    /// A parameter no source can work with (zero batch size, too many
    /// fields, ...).
    #[error("invalid data parameter: {0}")]
    Invalid(String),
}

/// `Result` with [`DataError`].
pub type Result<T> = std::result::Result<T, DataError>;

/// The error for a zero batch size, shared by the sources.
pub fn check_batch_size(batch_size: usize) -> Result<()> {
    if batch_size == 0 {
        return Err(DataError::Invalid("batch size must be at least 1".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_ids_keep_fields_apart_and_round_trip() {
        let a = feature_id(0, 7);
        let b = feature_id(1, 7);
        assert_ne!(a, b);
        assert_eq!(field_of(a), 0);
        assert_eq!(field_of(b), 1);
        assert_eq!(feature_id(3, MAX_RAW) as u64 & MAX_RAW, MAX_RAW);
        assert_eq!(field_of(feature_id(3, MAX_RAW)), 3);
        let last = feature_id(MAX_FIELDS - 1, 0);
        assert!(last < 0);
        assert_eq!(field_of(last), MAX_FIELDS - 1);
    }

    #[test]
    fn a_held_out_set_of_one_class_is_refused_naming_the_flag() {
        let eval = |labels: Vec<f32>| EvalSet {
            samples: Batch {
                ids: vec![0; labels.len()],
                labels,
                fields: 1,
            },
            truth: None,
        };
        check_held_out(&eval(vec![0.0, 1.0, 0.0])).unwrap();
        for labels in [vec![0.0; 3], vec![1.0; 2]] {
            let message = check_held_out(&eval(labels)).unwrap_err().to_string();
            assert!(message.contains("--eval-samples"), "{message}");
        }
    }

    #[test]
    fn batch_rows() {
        let batch = Batch {
            labels: vec![1.0, 0.0, 1.0],
            ids: vec![1, 2, 3, 4, 5, 6],
            fields: 2,
        };
        let rows: Vec<_> = batch.samples().collect();
        assert_eq!(
            rows,
            vec![(1.0, &[1, 2][..]), (0.0, &[3, 4][..]), (1.0, &[5, 6][..])]
        );
    }
}
