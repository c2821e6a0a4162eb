//! The synthetic CTR data set: Zipf-distributed ids whose vocabulary drifts
//! over time, labelled by a hidden model so that there is something real to
//! learn and a known ceiling.
//!
//! **Time.** Samples are numbered along one timeline: training samples
//! `0..train`, then the held-out set `train..train + eval`, the most recent
//! slice, as in real CTR data. `τ = index / (train + eval)` is the relative
//! time; the drift below is defined on it, so a small (`--quick`) data set
//! is a miniature of the default one.
//!
//! **Determinism.** Sample `i` is a pure function of `(seed, i)` (its own
//! PCG stream, seeded by hashing both), so the same seed gives the same
//! data, every epoch replays the same samples, and the held-out set is
//! generated without generating the training set first.
//!
//! **Ids.** Field `f` of `F` has a stable catalog of `V_f` ids, geometric
//! from [`MIN_CATALOG`] (field 0) to [`MAX_CATALOG`] (field `F - 1`), drawn
//! Zipf([`ZIPF_EXPONENT`]) by rank (raw value = rank, so raw 0 is the most
//! popular), see [`crate::zipf`]. Raw values are salted by field with
//! [`feature_id`].
//!
//! **New ids over time.** At time `τ` a share `q(τ)` of each field's draws,
//! rising linearly from [`FRESH_START`] to [`FRESH_END`], goes to *fresh*
//! ids instead of the catalog. Fresh ids are born one after another, raw
//! values `V_f, V_f + 1, ...`; by time `τ`, `B_f(τ) = GROWTH · V_f ·
//! Q(τ) / Q(1)` have been born, where `Q` integrates `q`, so births keep
//! pace with the fresh share and a field's vocabulary grows by [`GROWTH`]
//! of its catalog over the timeline. A fresh draw picks an id born a
//! little earlier: age `~ Exp(mean FRESH_LIFETIME)` of the timeline, id
//! `V_f + floor(B_f(max(0, τ - age)))`. So ids appear that were never seen
//! before, are popular for a while, and fade; small fields get few new
//! ids that are drawn many times, large fields many that are drawn once or
//! twice. The held-out set meets ids that training never saw.
//!
//! **Labels.** A hidden model gives each sample the logit
//! `f(x) = b + Σ_f a_f w(id_f) + Σ_(g,h) c ⟨u(id_g), u(id_h)⟩ / 2`:
//! - `w(id)` is a normal-ish weight (mean 0, variance 1: the sum of the
//!   four 16-bit lanes of a keyed 64-bit hash of the id, standardized),
//!   so no table of millions of weights is stored;
//! - `a_f` are per-field importances (uniform in 0.3..1, from the seed),
//!   scaled so that the linear part has standard deviation [`LINEAR_STD`];
//! - `⟨u, u⟩` are dot products of 4-dim latent vectors (each component
//!   uniform with variance 1, from the lanes of another keyed hash) for
//!   [`PAIRS`] field pairs chosen from the seed, scaled so that the pair
//!   part has standard deviation [`PAIR_STD`];
//! - the bias `b` is solved (by bisection, on [`CALIBRATION_SAMPLES`]
//!   samples spread over the timeline) so that the expected positive rate
//!   is [`TARGET_POSITIVE_RATE`], since with a fixed bias the few most
//!   popular ids of each field would move the positive rate with the seed
//!   (18% to 29% over eight seeds).
//!
//! The label is `Bernoulli(sigmoid(f(x) + ε))`, `ε ~ N(0, NOISE_STD²)`: the
//! noise stands for context no feature shows. Since `E[label | x]` rises
//! with `f(x)`, ranking by `f(x)` is the best any model of the features can
//! do: its AUC on the held-out set is the ceiling. The held-out `truth` is
//! `sigmoid(f(x) / sqrt(1 + π NOISE_STD² / 8))`, the probit approximation
//! of `E[sigmoid(f + ε)]`, so its log-loss is (nearly) the floor too.
//!
//! **Speed.** Generation runs far ahead of training (the `streamed` line
//! of `--summary` times batch production alone), so batches are generated on demand rather
//! than held in memory (the default 2M samples of 26 ids would take
//! 416 MB).

use crate::source::{
    check_batch_size, feature_id, Batch, DataError, DataSource, EvalSet, Result, MAX_FIELDS,
};
use crate::zipf::{unit_f64, ZipfSampler};
use rand::{Rng, RngCore, SeedableRng};
use rand_distr::{Exp1, StandardNormal};
use rand_pcg::Pcg64Mcg;

/// Catalog size of field 0.
pub const MIN_CATALOG: u64 = 300;
/// Catalog size of the last field.
pub const MAX_CATALOG: u64 = 3_000_000;
/// Zipf exponent of catalog draws.
pub const ZIPF_EXPONENT: f64 = 1.1;
/// Share of each field's draws that go to fresh ids at `τ = 0`.
pub const FRESH_START: f64 = 0.02;
/// Share of each field's draws that go to fresh ids at `τ = 1`.
pub const FRESH_END: f64 = 0.15;
/// Fresh ids born over the timeline, as a fraction of the field's catalog.
pub const GROWTH: f64 = 0.1;
/// Mean age of a fresh id when drawn, as a fraction of the timeline.
pub const FRESH_LIFETIME: f64 = 0.01;
/// Field pairs whose latent vectors interact (fewer if there are fewer
/// pairs of fields).
pub const PAIRS: usize = 4;
/// Standard deviation of the linear part of the hidden logit.
pub const LINEAR_STD: f64 = 1.2;
/// Standard deviation of the pair part of the hidden logit.
pub const PAIR_STD: f64 = 0.8;
/// Standard deviation of the logit noise no feature explains.
pub const NOISE_STD: f64 = 0.8;
/// The positive rate the hidden model's bias is solved for.
pub const TARGET_POSITIVE_RATE: f64 = 0.25;
/// Samples (spread over the timeline) the bias is solved on.
const CALIBRATION_SAMPLES: usize = 10_000;

/// What to generate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntheticConfig {
    /// Categorical fields (1 to 256).
    pub fields: usize,
    /// Training samples per epoch.
    pub train_samples: usize,
    /// Held-out samples, after the training ones.
    pub eval_samples: usize,
    /// Seed of everything: ids, labels, the hidden model.
    pub seed: u64,
}

/// The generator: catalogs, drift and the hidden model (see the module
/// docs). Cheap to query for any sample index.
#[derive(Clone, Debug)]
pub struct Generator {
    catalogs: Vec<ZipfSampler>,
    /// `a_f`: the scale of each field's id weight in the hidden logit.
    field_scales: Vec<f64>,
    /// Interacting field pairs.
    pairs: Vec<(usize, usize)>,
    /// `c`: the scale of each pair's dot product.
    pair_scale: f64,
    /// `b`: the bias, solved for [`TARGET_POSITIVE_RATE`].
    bias: f64,
    /// Samples on the timeline (training and held-out).
    timeline: usize,
    /// Keys of the per-sample streams and of the two id hashes.
    sample_key: u64,
    weight_key: u64,
    latent_key: u64,
}

impl Generator {
    /// A generator of `fields` fields over a timeline of `timeline` samples.
    pub fn new(fields: usize, timeline: usize, seed: u64) -> Result<Self> {
        if fields == 0 || fields > MAX_FIELDS {
            return Err(DataError::Invalid(format!(
                "synthetic data needs 1 to {MAX_FIELDS} fields, got {fields}"
            )));
        }
        if timeline == 0 {
            return Err(DataError::Invalid(
                "synthetic data needs at least one sample".into(),
            ));
        }
        let catalogs = (0..fields)
            .map(|f| {
                let size = catalog_size(f, fields);
                ZipfSampler::new(size, ZIPF_EXPONENT)
                    .ok_or_else(|| DataError::Invalid(format!("no Zipf sampler over {size} ids")))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut rng = Pcg64Mcg::seed_from_u64(mix64(seed ^ 0x6d6f_6465_6c00_0000));
        let importances: Vec<f64> = (0..fields).map(|_| rng.random_range(0.3..1.0)).collect();
        let norm = importances.iter().map(|z| z * z).sum::<f64>().sqrt();
        let field_scales = importances.iter().map(|z| LINEAR_STD * z / norm).collect();
        let pairs = choose_pairs(fields, &mut rng);
        let pair_scale = if pairs.is_empty() {
            0.0
        } else {
            PAIR_STD / (pairs.len() as f64).sqrt()
        };
        let mut generator = Self {
            catalogs,
            field_scales,
            pairs,
            pair_scale,
            bias: 0.0,
            timeline,
            sample_key: mix64(seed ^ 0x7361_6d70_6c65_0000),
            weight_key: mix64(seed ^ 0x7765_6967_6874_0000),
            latent_key: mix64(seed ^ 0x6c61_7465_6e74_0000),
        };
        generator.bias = generator.solve_bias();
        Ok(generator)
    }

    /// The bias that makes the mean click probability of the calibration
    /// samples [`TARGET_POSITIVE_RATE`].
    fn solve_bias(&self) -> f64 {
        let mut ids = Vec::with_capacity(self.fields());
        let logits: Vec<f64> = (0..CALIBRATION_SAMPLES)
            .map(|j| {
                let index = (j as f64 / CALIBRATION_SAMPLES as f64 * self.timeline as f64) as usize;
                ids.clear();
                self.draw_ids(index, &mut self.sample_rng(index), &mut ids);
                self.feature_logit(&ids)
            })
            .collect();
        let rate = |bias: f64| {
            logits
                .iter()
                .map(|l| sigmoid((l + bias) / noise_calibration()))
                .sum::<f64>()
                / logits.len() as f64
        };
        let (mut low, mut high) = (-30.0, 30.0);
        for _ in 0..60 {
            let middle = (low + high) / 2.0;
            if rate(middle) < TARGET_POSITIVE_RATE {
                low = middle;
            } else {
                high = middle;
            }
        }
        (low + high) / 2.0
    }

    /// Ids per sample.
    fn fields(&self) -> usize {
        self.catalogs.len()
    }

    /// Size of field `field`'s stable catalog (`None` past the last field).
    pub fn catalog_size(&self, field: usize) -> Option<u64> {
        self.catalogs.get(field).map(ZipfSampler::len)
    }

    /// The field pairs of the hidden model's interactions.
    pub fn pairs(&self) -> &[(usize, usize)] {
        &self.pairs
    }

    /// Appends sample `index` to `batch` (which must have this generator's
    /// field count) and returns its ground-truth click probability.
    pub fn push_sample(&self, index: usize, batch: &mut Batch) -> f32 {
        let mut rng = self.sample_rng(index);
        let start = batch.ids.len();
        self.draw_ids(index, &mut rng, &mut batch.ids);
        let logit = self.bias + self.feature_logit(&batch.ids[start..]);
        let noise: f64 = rng.sample(StandardNormal);
        let clicked = unit_f64(rng.next_u64()) < sigmoid(logit + NOISE_STD * noise);
        batch.labels.push(if clicked { 1.0 } else { 0.0 });
        sigmoid(logit / noise_calibration()) as f32
    }

    /// Appends sample `index`'s ids, one per field, drawn from `rng`.
    fn draw_ids(&self, index: usize, rng: &mut Pcg64Mcg, ids: &mut Vec<i64>) {
        let tau = index as f64 / self.timeline as f64;
        let fresh_share = FRESH_START + (FRESH_END - FRESH_START) * tau;
        let fresh_threshold = (fresh_share * (u64::MAX as f64)) as u64;
        for (field, catalog) in self.catalogs.iter().enumerate() {
            let raw = if rng.next_u64() < fresh_threshold {
                catalog.len() + self.fresh_birth(catalog.len(), tau, rng)
            } else {
                catalog.sample(rng)
            };
            ids.push(feature_id(field, raw));
        }
    }

    /// The hidden logit of one sample's ids, without bias or noise.
    fn feature_logit(&self, ids: &[i64]) -> f64 {
        let linear: f64 = ids
            .iter()
            .zip(&self.field_scales)
            .map(|(&id, scale)| scale * normalish(mix64(id as u64 ^ self.weight_key)))
            .sum();
        let pairs: f64 = self
            .pairs
            .iter()
            .filter_map(|&(g, h)| Some((*ids.get(g)?, *ids.get(h)?)))
            .map(|(a, b)| {
                latent_dot(
                    mix64(a as u64 ^ self.latent_key),
                    mix64(b as u64 ^ self.latent_key),
                )
            })
            .sum();
        linear + self.pair_scale * pairs / 2.0
    }

    /// The raw offset (from the catalog's end) of a fresh id drawn at `tau`.
    fn fresh_birth(&self, catalog: u64, tau: f64, rng: &mut Pcg64Mcg) -> u64 {
        let age: f64 = FRESH_LIFETIME * rng.sample::<f64, _>(Exp1);
        let born_by = |t: f64| {
            let integral = FRESH_START * t + (FRESH_END - FRESH_START) * t * t / 2.0;
            GROWTH * catalog as f64 * integral / ((FRESH_START + FRESH_END) / 2.0)
        };
        born_by((tau - age).max(0.0)) as u64
    }

    /// Sample `index`'s own random stream.
    fn sample_rng(&self, index: usize) -> Pcg64Mcg {
        let high = mix64(self.sample_key ^ index as u64);
        let low = mix64(high ^ self.sample_key.rotate_left(32));
        Pcg64Mcg::new((u128::from(high) << 64) | u128::from(low))
    }
}

/// Catalog size of field `field` of `fields`: geometric from
/// [`MIN_CATALOG`] to [`MAX_CATALOG`].
fn catalog_size(field: usize, fields: usize) -> u64 {
    if fields == 1 {
        return MIN_CATALOG;
    }
    let ratio = MAX_CATALOG as f64 / MIN_CATALOG as f64;
    let position = field as f64 / (fields - 1) as f64;
    (MIN_CATALOG as f64 * ratio.powf(position)).round() as u64
}

/// Up to [`PAIRS`] distinct unordered pairs of distinct fields.
fn choose_pairs(fields: usize, rng: &mut Pcg64Mcg) -> Vec<(usize, usize)> {
    let wanted = PAIRS.min(fields * (fields - 1) / 2);
    let mut pairs = Vec::with_capacity(wanted);
    while pairs.len() < wanted {
        let g = rng.random_range(0..fields);
        let h = rng.random_range(0..fields);
        let pair = (g.min(h), g.max(h));
        if g != h && !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    pairs
}

/// `sqrt(1 + π NOISE_STD² / 8)`: `E[sigmoid(f + ε)] ≈ sigmoid(f /
/// noise_calibration())` for `ε ~ N(0, NOISE_STD²)` (the probit
/// approximation).
fn noise_calibration() -> f64 {
    (1.0 + std::f64::consts::PI * NOISE_STD * NOISE_STD / 8.0).sqrt()
}

/// The splitmix64 finalizer: a fixed 64-bit bijection that mixes every
/// input bit into every output bit.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A value with mean 0 and variance 1, close to normal (Irwin-Hall of 4),
/// from the four 16-bit lanes of a hash.
fn normalish(hash: u64) -> f64 {
    let sum: u64 = (0..4).map(|lane| (hash >> (16 * lane)) & 0xffff).sum();
    (sum as f64 / 65535.0 - 2.0) * 3f64.sqrt()
}

/// The dot product of two 4-dim latent vectors, one per hash, each
/// component uniform with mean 0 and variance 1 (so the product has
/// variance 4).
fn latent_dot(a: u64, b: u64) -> f64 {
    let component = |hash: u64, lane: u32| ((hash >> (16 * lane)) & 0xffff) as f64 / 65535.0 - 0.5;
    let dot: f64 = (0..4)
        .map(|lane| component(a, lane) * component(b, lane))
        .sum();
    dot * 12.0
}

/// The logistic function.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The synthetic [`DataSource`]: streams training samples on demand; the
/// held-out set is generated once, in memory, with its ground truth.
#[derive(Clone, Debug)]
pub struct Synthetic {
    config: SyntheticConfig,
    generator: Generator,
    /// Index of the next training sample.
    next: usize,
    eval: EvalSet,
}

impl Synthetic {
    /// The data set for `config`.
    pub fn new(config: &SyntheticConfig) -> Result<Self> {
        if config.train_samples == 0 || config.eval_samples == 0 {
            return Err(DataError::Invalid(
                "synthetic data needs at least one training and one held-out sample".into(),
            ));
        }
        let timeline = config
            .train_samples
            .checked_add(config.eval_samples)
            .ok_or_else(|| DataError::Invalid("too many samples".into()))?;
        let generator = Generator::new(config.fields, timeline, config.seed)?;
        let mut samples = Batch::with_capacity(config.fields, config.eval_samples);
        let truth = (config.train_samples..timeline)
            .map(|index| generator.push_sample(index, &mut samples))
            .collect();
        Ok(Self {
            config: config.clone(),
            generator,
            next: 0,
            eval: EvalSet {
                samples,
                truth: Some(truth),
            },
        })
    }
}

impl DataSource for Synthetic {
    fn describe(&self) -> String {
        let pairs: Vec<String> = self
            .generator
            .pairs()
            .iter()
            .map(|(g, h)| format!("f{g}*f{h}"))
            .collect();
        format!(
            "synthetic: {} fields (catalogs {MIN_CATALOG}..{} ids, Zipf {ZIPF_EXPONENT}; \
             fresh ids {:.0}% -> {:.0}% of draws), {} training + {} held-out samples, seed {}; \
             hidden model: linear std {LINEAR_STD}, pairs [{}] std {PAIR_STD}, \
             noise std {NOISE_STD}",
            self.config.fields,
            self.generator
                .catalog_size(self.config.fields - 1)
                .unwrap_or(MIN_CATALOG),
            FRESH_START * 100.0,
            FRESH_END * 100.0,
            self.config.train_samples,
            self.config.eval_samples,
            self.config.seed,
            pairs.join(" "),
        )
    }

    fn fields(&self) -> usize {
        self.config.fields
    }

    fn field_name(&self, field: usize) -> String {
        match self.generator.catalog_size(field) {
            Some(size) => format!("f{field} ({size})"),
            None => format!("f{field}"),
        }
    }

    fn train_samples(&self) -> usize {
        self.config.train_samples
    }

    fn rewind(&mut self) -> Result<()> {
        self.next = 0;
        Ok(())
    }

    fn next_batch(&mut self, batch_size: usize) -> Result<Option<Batch>> {
        check_batch_size(batch_size)?;
        let end = self
            .config
            .train_samples
            .min(self.next.saturating_add(batch_size));
        if self.next >= end {
            return Ok(None);
        }
        let mut batch = Batch::with_capacity(self.config.fields, end - self.next);
        for index in self.next..end {
            self.generator.push_sample(index, &mut batch);
        }
        self.next = end;
        Ok(Some(batch))
    }

    fn eval_set(&self) -> &EvalSet {
        &self.eval
    }

    /// Moves past the samples without generating them (each sample is a
    /// function of its index).
    fn skip_batches(&mut self, batches: u64, batch_size: usize) -> Result<u64> {
        check_batch_size(batch_size)?;
        let left = self.config.train_samples.saturating_sub(self.next);
        let skipped = batches.min(left.div_ceil(batch_size) as u64);
        let samples = usize::try_from(skipped)
            .unwrap_or(usize::MAX)
            .saturating_mul(batch_size);
        self.next = self
            .config
            .train_samples
            .min(self.next.saturating_add(samples));
        Ok(skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auc::roc_auc;
    use crate::source::field_of;
    use std::collections::{HashMap, HashSet};

    fn source(fields: usize, train: usize, eval: usize, seed: u64) -> Synthetic {
        Synthetic::new(&SyntheticConfig {
            fields,
            train_samples: train,
            eval_samples: eval,
            seed,
        })
        .unwrap()
    }

    fn all_training(source: &mut Synthetic) -> Batch {
        let mut all = Batch::with_capacity(source.fields(), source.train_samples());
        source.rewind().unwrap();
        while let Some(batch) = source.next_batch(1000).unwrap() {
            all.labels.extend(batch.labels);
            all.ids.extend(batch.ids);
        }
        all
    }

    #[test]
    fn same_seed_same_data_and_epochs_replay() {
        let mut a = source(26, 5_000, 1_000, 7);
        let mut b = source(26, 5_000, 1_000, 7);
        let first = all_training(&mut a);
        assert_eq!(first.len(), 5_000);
        assert_eq!(first, all_training(&mut b));
        assert_eq!(
            first,
            all_training(&mut a),
            "a second epoch replays the first"
        );
        assert_eq!(a.eval_set().samples, b.eval_set().samples);
        assert_eq!(a.eval_set().truth, b.eval_set().truth);
    }

    #[test]
    fn batch_size_does_not_change_the_data() {
        let mut a = source(5, 1_000, 10, 3);
        let whole = a.next_batch(1_000).unwrap().unwrap();
        assert!(a.next_batch(1).unwrap().is_none(), "the epoch is over");
        let mut b = source(5, 1_000, 10, 3);
        let mut pieces = Batch::with_capacity(5, 1_000);
        while let Some(batch) = b.next_batch(333).unwrap() {
            assert!(batch.len() <= 333);
            pieces.labels.extend(batch.labels);
            pieces.ids.extend(batch.ids);
        }
        assert_eq!(whole, pieces);
        assert!(b.next_batch(0).is_err());
    }

    /// Skipping batches lands where reading them would, without reading.
    #[test]
    fn skipping_batches_lands_where_reading_does() {
        for (skip, batch) in [(0, 7), (3, 7), (14, 7), (15, 7), (100, 7), (2, 100)] {
            let mut read = source(3, 100, 10, 9);
            let mut skipped = source(3, 100, 10, 9);
            let mut read_count = 0;
            while read_count < skip && read.next_batch(batch).unwrap().is_some() {
                read_count += 1;
            }
            assert_eq!(
                skipped.skip_batches(skip, batch).unwrap(),
                read_count,
                "{skip} of {batch}"
            );
            assert_eq!(
                skipped.next_batch(batch).unwrap(),
                read.next_batch(batch).unwrap(),
                "{skip} of {batch}"
            );
        }
    }

    #[test]
    fn different_seeds_differ() {
        let a = all_training(&mut source(26, 2_000, 100, 1));
        let b = all_training(&mut source(26, 2_000, 100, 2));
        let same = a.ids.iter().zip(&b.ids).filter(|(x, y)| x == y).count();
        // Popular ids coincide by chance; most positions must differ.
        assert!(
            same < a.ids.len() / 2,
            "{same} of {} ids equal",
            a.ids.len()
        );
        assert_ne!(a.labels, b.labels);
    }

    #[test]
    fn ids_are_salted_by_field_and_follow_zipf() {
        let mut data = source(26, 50_000, 100, 11);
        let all = all_training(&mut data);
        let mut counts: Vec<HashMap<i64, u64>> = vec![HashMap::new(); 26];
        for (_, ids) in all.samples() {
            for (field, &id) in ids.iter().enumerate() {
                assert_eq!(field_of(id), field);
                *counts[field].entry(id).or_default() += 1;
            }
        }
        // Field 0's catalog has 300 ids: its top id holds about 20% of the
        // mass under Zipf(1.1) (less the fresh share), far above 1/300.
        let top = |field: usize| *counts[field].values().max().unwrap() as f64 / 50_000.0;
        assert!(
            (0.14..0.26).contains(&top(0)),
            "top share of field 0: {}",
            top(0)
        );
        // The largest field (3M ids) still has a top id near 12%.
        assert!(
            (0.08..0.16).contains(&top(25)),
            "top share of field 25: {}",
            top(25)
        );
        // And its long tail: most of its distinct ids are seen once or twice.
        let rare = counts[25].values().filter(|&&c| c <= 2).count();
        assert!(rare * 2 > counts[25].len());
    }

    /// Share of each window's id occurrences whose id never occurs in the
    /// first window. Constant after the first window for a stationary
    /// distribution; rising when fresh ids take a growing share.
    fn unseen_in_first_window(all: &Batch, windows: usize) -> Vec<f64> {
        let window = all.len() / windows;
        let first: HashSet<i64> = all.ids[..window * all.fields].iter().copied().collect();
        (1..windows)
            .map(|w| {
                let ids = &all.ids[w * window * all.fields..(w + 1) * window * all.fields];
                ids.iter().filter(|id| !first.contains(id)).count() as f64 / ids.len() as f64
            })
            .collect()
    }

    #[test]
    fn new_ids_appear_over_time() {
        let mut data = source(26, 200_000, 100, 5);
        let all = all_training(&mut data);
        let unseen = unseen_in_first_window(&all, 5);
        assert!(
            unseen.windows(2).all(|pair| pair[1] > pair[0]),
            "unseen share should rise: {unseen:?}"
        );
        // The fresh share grows by about 8 points from the second window to
        // the last (6% to 14%); the measured share follows (17% to 24%).
        assert!(unseen[3] > unseen[0] + 0.04, "{unseen:?}");
        // Fresh ids have raw values past their field's catalog.
        let catalog0 = data.generator.catalog_size(0).unwrap();
        let fresh0 = all
            .samples()
            .filter(|(_, ids)| (ids[0] as u64 & crate::source::MAX_RAW) >= catalog0)
            .count();
        assert!(
            (2_000..30_000).contains(&fresh0),
            "{fresh0} fresh ids in field 0"
        );
    }

    #[test]
    fn held_out_set_follows_training_in_time() {
        let mut data = source(26, 100_000, 20_000, 9);
        let train: HashSet<i64> = all_training(&mut data).ids.into_iter().collect();
        let eval = &data.eval_set().samples;
        let unseen =
            eval.ids.iter().filter(|id| !train.contains(id)).count() as f64 / eval.ids.len() as f64;
        assert!(
            (0.05..0.4).contains(&unseen),
            "held-out ids unseen in training: {unseen}"
        );
    }

    #[test]
    fn positive_rate_and_ground_truth_auc_in_range() {
        for (fields, seed) in [(26, 1), (26, 2), (8, 3)] {
            let data = source(fields, 1_000, 50_000, seed);
            let eval = data.eval_set();
            let rate = eval.samples.labels.iter().sum::<f32>() / eval.samples.len() as f32;
            assert!((0.22..0.28).contains(&rate), "positive rate {rate}");
            let truth = eval.truth.as_ref().unwrap();
            let mean_truth = truth.iter().sum::<f32>() / truth.len() as f32;
            assert!(
                (mean_truth - rate).abs() < 0.03,
                "truth is calibrated: {mean_truth} vs {rate}"
            );
            let auc = roc_auc(truth, &eval.samples.labels).unwrap();
            assert!(
                (0.74..0.86).contains(&auc),
                "ground-truth AUC {auc} (fields {fields}, seed {seed})"
            );
        }
    }

    #[test]
    fn catalogs_span_hundreds_to_millions() {
        let generator = Generator::new(26, 10, 0).unwrap();
        assert_eq!(generator.catalog_size(0), Some(MIN_CATALOG));
        assert_eq!(generator.catalog_size(25), Some(MAX_CATALOG));
        assert!((1..26).all(|f| generator.catalog_size(f) > generator.catalog_size(f - 1)));
        assert_eq!(generator.pairs().len(), PAIRS);
        assert!(Generator::new(0, 10, 0).is_err());
        assert!(Generator::new(MAX_FIELDS + 1, 10, 0).is_err());
        assert_eq!(Generator::new(1, 10, 0).unwrap().pairs().len(), 0);
    }

    #[test]
    fn hashed_weights_are_standardized() {
        let values: Vec<f64> = (0..100_000u64).map(|i| normalish(mix64(i))).collect();
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "mean {mean}, var {var}"
        );
        let dots: Vec<f64> = (0..100_000u64)
            .map(|i| latent_dot(mix64(i), mix64(!i)))
            .collect();
        let var = dots.iter().map(|v| v * v).sum::<f64>() / dots.len() as f64;
        assert!((var - 4.0).abs() < 0.15, "latent dot variance {var}");
    }
}
