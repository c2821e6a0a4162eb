//! What a pass over the data shows before any training: sizes, positive
//! rates, how many distinct ids there are, how fast new ones arrive, how
//! many held-out ids training never saw, and for synthetic data the
//! hidden model's scores on the held-out set (the ceiling a trained model
//! can approach).
//!
//! The new-id rate of a stretch of the stream is the share of its ids that
//! had not occurred earlier in the stream: high at first while the table
//! fills, then the rate at which the vocabulary really grows.
//!
//! The report is opt-in (`--summary`) because it streams a whole extra
//! epoch and counts every distinct id in a hash map (for Criteo, some 33M
//! ids: gigabytes and minutes); a default run prints only
//! [`write_ceiling`].

use crate::auc::{log_loss, roc_auc};
use crate::source::{field_of, Batch, DataSource, EvalSet, Result};
use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

/// Stretches of the stream the new-id rate is reported for.
pub const SLICES: usize = 10;

/// Counts gathered while streaming training batches.
#[derive(Debug)]
pub struct StreamSummary {
    fields: usize,
    /// Occurrences of each id so far.
    counts: HashMap<i64, u64, ahash::RandomState>,
    samples: u64,
    positives: u64,
    /// Samples per slice (the last slice takes any excess).
    slice_len: u64,
    /// Per slice: ids seen, and ids not seen before.
    slice_ids: Vec<(u64, u64)>,
    /// Time spent producing batches (generation or reading and parsing).
    production: Duration,
}

impl StreamSummary {
    /// Empty counts for `fields` ids a sample, over a stream of about
    /// `expected_samples` samples.
    pub fn new(fields: usize, expected_samples: u64) -> Self {
        Self {
            fields,
            counts: HashMap::with_hasher(ahash::RandomState::with_seeds(1, 2, 3, 4)),
            samples: 0,
            positives: 0,
            slice_len: (expected_samples / SLICES as u64).max(1),
            slice_ids: vec![(0, 0); SLICES],
            production: Duration::ZERO,
        }
    }

    /// Streams one epoch of `source` (at most `max_batches` batches of
    /// `batch_size`), from its first sample.
    pub fn stream(
        source: &mut dyn DataSource,
        batch_size: usize,
        max_batches: Option<u64>,
    ) -> Result<Self> {
        let limit = max_batches.unwrap_or(u64::MAX);
        let expected = (source.train_samples() as u64).min(limit.saturating_mul(batch_size as u64));
        let mut summary = Self::new(source.fields(), expected);
        source.rewind()?;
        for _ in 0..limit {
            let started = Instant::now();
            let Some(batch) = source.next_batch(batch_size)? else {
                break;
            };
            summary.production += started.elapsed();
            summary.add(&batch);
        }
        Ok(summary)
    }

    /// Counts one batch.
    pub fn add(&mut self, batch: &Batch) {
        for (label, ids) in batch.samples() {
            let slice = ((self.samples / self.slice_len) as usize).min(SLICES - 1);
            let (seen, new) = &mut self.slice_ids[slice];
            for &id in ids {
                let count = self.counts.entry(id).or_insert(0);
                *new += u64::from(*count == 0);
                *count += 1;
            }
            *seen += ids.len() as u64;
            self.samples += 1;
            self.positives += u64::from(label == 1.0);
        }
    }

    /// Samples counted.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Share of positive labels.
    pub fn positive_rate(&self) -> f64 {
        self.positives as f64 / self.samples.max(1) as f64
    }

    /// Distinct ids seen.
    pub fn distinct(&self) -> usize {
        self.counts.len()
    }

    /// Per slice of the stream, the share of its ids not seen before
    /// (`None` for a slice the stream did not reach).
    pub fn new_id_rates(&self) -> Vec<Option<f64>> {
        self.slice_ids
            .iter()
            .map(|&(seen, new)| (seen > 0).then(|| new as f64 / seen as f64))
            .collect()
    }

    /// Per field: distinct ids, and the most frequent id's share of samples.
    pub fn per_field(&self) -> Vec<(u64, f64)> {
        let mut fields = vec![(0u64, 0u64); self.fields];
        for (&id, &count) in &self.counts {
            if let Some((distinct, top)) = fields.get_mut(field_of(id)) {
                *distinct += 1;
                *top = (*top).max(count);
            }
        }
        let samples = self.samples.max(1) as f64;
        fields
            .into_iter()
            .map(|(distinct, top)| (distinct, top as f64 / samples))
            .collect()
    }

    /// Of `batch`'s ids, the share never seen in the stream: overall, per
    /// field, and the share of samples with at least one.
    pub fn unseen(&self, batch: &Batch) -> Unseen {
        let mut per_field = vec![0u64; self.fields];
        let mut samples_with_unseen = 0u64;
        for (_, ids) in batch.samples() {
            let mut any = false;
            for (field, id) in ids.iter().enumerate() {
                if !self.counts.contains_key(id) {
                    if let Some(count) = per_field.get_mut(field) {
                        *count += 1;
                    }
                    any = true;
                }
            }
            samples_with_unseen += u64::from(any);
        }
        let samples = batch.len().max(1) as f64;
        Unseen {
            ids: per_field.iter().sum::<u64>() as f64 / (samples * self.fields as f64),
            per_field: per_field.iter().map(|&n| n as f64 / samples).collect(),
            samples: samples_with_unseen as f64 / samples,
        }
    }

    /// Writes the report for `source` (whose training stream this summary
    /// counted) to `out`.
    pub fn write(&self, source: &dyn DataSource, out: &mut dyn Write) -> std::io::Result<()> {
        let eval = source.eval_set();
        let seconds = self.production.as_secs_f64();
        writeln!(
            out,
            "streamed {} training samples of {} in {seconds:.2} s of batch production \
             ({:.2}M samples/s)",
            self.samples(),
            source.train_samples(),
            self.samples() as f64 / seconds.max(1e-9) / 1e6
        )?;
        writeln!(
            out,
            "ids: {} a sample (one per field), {} distinct",
            source.fields(),
            self.distinct()
        )?;
        let held_out_rate = eval
            .samples
            .labels
            .iter()
            .map(|&l| f64::from(l))
            .sum::<f64>()
            / eval.samples.len().max(1) as f64;
        writeln!(
            out,
            "positive rate: training {:.2}%, held-out {:.2}%",
            100.0 * self.positive_rate(),
            100.0 * held_out_rate
        )?;
        let rates: Vec<String> = self
            .new_id_rates()
            .iter()
            .map(|rate| rate.map_or("-".into(), |r| format!("{:.1}%", 100.0 * r)))
            .collect();
        writeln!(
            out,
            "new-id rate per tenth of the stream: {}",
            rates.join(" ")
        )?;
        let unseen = self.unseen(&eval.samples);
        writeln!(
            out,
            "held-out: {} samples; {:.2}% of their ids unseen in training, \
             {:.1}% of samples have one",
            eval.samples.len(),
            100.0 * unseen.ids,
            100.0 * unseen.samples
        )?;
        self.write_metrics(source, out)?;
        writeln!(
            out,
            "{:<16} {:>10} {:>8} {:>10}",
            "field", "distinct", "top id", "unseen"
        )?;
        for (field, ((distinct, top), unseen)) in
            self.per_field().iter().zip(&unseen.per_field).enumerate()
        {
            writeln!(
                out,
                "{:<16} {:>10} {:>7.2}% {:>9.2}%",
                source.field_name(field),
                distinct,
                100.0 * top,
                100.0 * unseen
            )?;
        }
        Ok(())
    }

    /// The held-out scores of predicting the training positive rate (what
    /// a model must beat) and, for synthetic data, of the hidden model.
    fn write_metrics(&self, source: &dyn DataSource, out: &mut dyn Write) -> std::io::Result<()> {
        let eval = source.eval_set();
        let labels = &eval.samples.labels;
        let base = vec![self.positive_rate() as f32; labels.len()];
        match log_loss(&base, labels) {
            Ok(loss) => writeln!(
                out,
                "held-out log-loss of the training positive rate: {loss:.4}"
            )?,
            Err(e) => writeln!(
                out,
                "held-out log-loss of the training positive rate: undefined ({e})"
            )?,
        }
        write_ceiling(eval, out)
    }
}

/// Writes the held-out AUC and log-loss of the ground truth (the ceiling a
/// trained model can approach) if `eval` has one (synthetic data); nothing
/// otherwise.
pub fn write_ceiling(eval: &EvalSet, out: &mut dyn Write) -> std::io::Result<()> {
    let Some(truth) = &eval.truth else {
        return Ok(());
    };
    let labels = &eval.samples.labels;
    match (roc_auc(truth, labels), log_loss(truth, labels)) {
        (Ok(auc), Ok(loss)) => writeln!(
            out,
            "ground truth on the held-out set: AUC {auc:.4}, log-loss {loss:.4} (the hidden \
             model, a ceiling no model of this data reaches: it knows the weights of the \
             rare and new held-out ids that training never shows; see --summary)"
        ),
        (Err(e), _) | (_, Err(e)) => {
            writeln!(out, "ground truth on the held-out set: undefined ({e})")
        }
    }
}

/// How much of a batch training never saw ([`StreamSummary::unseen`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Unseen {
    /// Share of all ids.
    pub ids: f64,
    /// Per field, share of samples whose id is unseen.
    pub per_field: Vec<f64>,
    /// Share of samples with at least one unseen id.
    pub samples: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Synthetic, SyntheticConfig};

    #[test]
    fn counts_new_ids_positives_and_unseen() {
        // 20 samples of 2 fields over 10 slices of 2 samples each.
        let mut summary = StreamSummary::new(2, 20);
        let ids: Vec<i64> = (0..20).flat_map(|i| [i % 2, 100 + i]).collect();
        let labels: Vec<f32> = (0..20)
            .map(|i| if i % 4 == 0 { 1.0 } else { 0.0 })
            .collect();
        summary.add(&Batch {
            labels,
            ids,
            fields: 2,
        });
        assert_eq!(summary.samples(), 20);
        assert_eq!(summary.positive_rate(), 0.25);
        assert_eq!(summary.distinct(), 22);
        let rates = summary.new_id_rates();
        // Slice 0: ids 0, 100, 1, 101 all new; later slices: 2 of 4 new.
        assert_eq!(rates[0], Some(1.0));
        assert!(rates[1..].iter().all(|&r| r == Some(0.5)), "{rates:?}");
        let eval = Batch {
            labels: vec![0.0, 1.0],
            ids: vec![0, 100, 7, 500],
            fields: 2,
        };
        let unseen = summary.unseen(&eval);
        assert_eq!(unseen.per_field, vec![0.5, 0.5]);
        assert_eq!(unseen.ids, 0.5);
        assert_eq!(unseen.samples, 0.5);
    }

    #[test]
    fn streams_an_epoch_and_writes_the_report() {
        let mut source = Synthetic::new(&SyntheticConfig {
            fields: 3,
            train_samples: 2_000,
            eval_samples: 1_000,
            seed: 1,
        })
        .unwrap();
        let capped = StreamSummary::stream(&mut source, 256, Some(2)).unwrap();
        assert_eq!(capped.samples(), 512);
        let summary = StreamSummary::stream(&mut source, 256, None).unwrap();
        assert_eq!(summary.samples(), 2_000);
        let mut out = Vec::new();
        summary.write(&source, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("streamed 2000 training samples of 2000"),
            "{text}"
        );
        assert!(
            text.contains("ground truth on the held-out set: AUC 0."),
            "{text}"
        );
        for field in ["f0 (300) ", "f1 (30000) ", "f2 (3000000) "] {
            assert_eq!(
                text.lines().filter(|l| l.starts_with(field)).count(),
                1,
                "{text}"
            );
        }
    }

    #[test]
    fn the_ceiling_alone_is_written_for_data_with_a_ground_truth() {
        let source = Synthetic::new(&SyntheticConfig {
            fields: 3,
            train_samples: 100,
            eval_samples: 1_000,
            seed: 1,
        })
        .unwrap();
        let mut out = Vec::new();
        write_ceiling(source.eval_set(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.starts_with("ground truth on the held-out set: AUC 0."),
            "{text}"
        );
        let mut no_truth = source.eval_set().clone();
        no_truth.truth = None;
        let mut out = Vec::new();
        write_ceiling(&no_truth, &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn slices_the_stream_did_not_reach_are_none() {
        let mut summary = StreamSummary::new(1, 100);
        summary.add(&Batch {
            labels: vec![0.0; 25],
            ids: (0..25).collect(),
            fields: 1,
        });
        let rates = summary.new_id_rates();
        assert_eq!(rates[..3], [Some(1.0), Some(1.0), Some(1.0)]);
        assert!(rates[3..].iter().all(Option::is_none));
    }
}
