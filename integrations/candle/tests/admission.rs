//! An `Embedding` layer over a table that admits ids late
//! (`Admission::Exact { min_count: 3 }`) trains only admitted ids, with
//! the layer and `SparseStep` as they are: an id read fewer than 3 times
//! in training gets no row and reads the initializer's row, its gradient
//! dropped; an id read 3 times or more has a row from its third read on,
//! trained exactly as on a table without admission by the steps from then.
//!
//! The layer reads each distinct id of a batch once, so a read here is a
//! batch holding the id; every batch below holds an id at most once. Reads
//! of one step can straddle an id's admission (a layer called twice
//! before a step, or two layers sharing the table): only the gradient of
//! the reads from the admitting one on is applied.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use dynemb::{Admission, Initializer, Variable};
use dynemb_candle::{Embedding, EmbeddingConfig, SparseStep};
use dynemb_optim::{ParamsAdam, SparseAdam, SparseOptimizer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const DIM: usize = 4;
const MIN_COUNT: u32 = 3;

/// The batches: ids 1 and 2 are in all four (admitted at the third), id 3
/// in two, ids 4 to 9 in one each.
const BATCHES: [[i64; 4]; 4] = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6, 7], [1, 8, 9, 2]];
/// Ids read at least [`MIN_COUNT`] times.
const ADMITTED: [i64; 2] = [1, 2];
/// Ids read fewer times.
const NOT_ADMITTED: [i64; 7] = [3, 4, 5, 6, 7, 8, 9];

/// The rows' initializer: random normal, a distinct row per id.
fn initializer() -> Initializer {
    Initializer::RandomNormal {
        mean: 0.0,
        stddev: 0.1,
        seed: 7,
    }
}

/// A table of [`DIM`]-wide rows from [`initializer`], admitting at
/// [`MIN_COUNT`] reads if `admitting`.
fn table(name: &str, admitting: bool) -> Result<Arc<Variable<i64>>, dynemb::Error> {
    let mut builder = Variable::<i64>::builder(name)
        .dim(DIM)
        .initializer(initializer());
    if admitting {
        builder = builder.admission(Admission::Exact {
            min_count: MIN_COUNT,
        });
    }
    Ok(Arc::new(builder.build()?))
}

fn adam() -> Result<SparseAdam, dynemb::Error> {
    SparseAdam::new(ParamsAdam {
        lr: 0.05,
        ..Default::default()
    })
}

/// The rows of `keys` in `table` (the initializer's row for a missing key).
fn rows(table: &Variable<i64>, keys: &[i64]) -> Result<Vec<f32>, dynemb::Error> {
    let mut out = vec![0.0; keys.len() * DIM];
    table.lookup(keys, &mut out)?;
    Ok(out)
}

/// Whether `table` holds a row for `key`.
fn holds(table: &Variable<i64>, key: i64) -> Result<bool, dynemb::Error> {
    let mut exists = [false];
    table.lookup_with_exists(&[key], &mut [0.0; DIM], &mut exists)?;
    Ok(exists[0])
}

/// The weight of output value `i` of step `step`: nonzero, exact in f32.
fn weight(step: usize, i: usize) -> f32 {
    ((step * 5 + i) % 7) as f32 * 0.25 - 0.875
}

#[test]
fn only_admitted_ids_get_rows_and_train() -> TestResult {
    let admitting = table("admitting", true)?;
    // The initializer's rows, read from a table that is never written.
    let untouched = table("untouched", false)?;
    let layer = Embedding::new(Arc::clone(&admitting), EmbeddingConfig::default())?;
    let step = SparseStep::new(adam()?);
    // The same steps on a table without admission, given only the
    // gradients of the ids the admitting table holds at each step.
    let reference = table("reference", false)?;
    let reference_adam = adam()?;

    let mut reads = std::collections::HashMap::<i64, u32>::new();
    let mut not_admitted_reads = 0u64;
    for (s, batch) in BATCHES.iter().enumerate() {
        let ids = Tensor::new(batch.as_slice(), &Device::Cpu)?;
        let out = layer.forward(&ids, true)?;
        let values: Vec<f32> = out.flatten_all()?.to_vec1()?;
        let weights: Vec<f32> = (0..values.len()).map(|i| weight(s, i)).collect();
        let w = Tensor::from_slice(&weights, out.shape(), out.device())?;
        let loss = (out * w)?.sum_all()?;

        let (mut keys, mut grads) = (Vec::new(), Vec::new());
        for (p, &id) in batch.iter().enumerate() {
            let count = reads.entry(id).or_default();
            *count += 1;
            let row = &values[p * DIM..(p + 1) * DIM];
            if *count < MIN_COUNT {
                not_admitted_reads += 1;
                // Not admitted: the initializer's row, and no row made.
                assert_eq!(row, rows(&untouched, &[id])?, "step {s}: id {id}");
                assert!(!holds(&admitting, id)?, "step {s}: id {id} has a row");
            } else {
                keys.push(id);
                grads.extend_from_slice(&weights[p * DIM..(p + 1) * DIM]);
                assert!(holds(&admitting, id)?, "step {s}: id {id} has no row");
            }
        }
        step.step(&loss.backward()?, &[&layer])?;
        reference_adam.apply(&*reference, &keys, &grads)?;
    }
    assert_eq!(step.optimizer().steps(), BATCHES.len() as u64);
    assert_eq!(reference_adam.steps(), BATCHES.len() as u64);

    // Ids read fewer than 3 times: no row, the initializer's values.
    let mut exists = vec![true; NOT_ADMITTED.len()];
    let mut values = vec![0.0; NOT_ADMITTED.len() * DIM];
    admitting.lookup_with_exists(&NOT_ADMITTED, &mut values, &mut exists)?;
    assert!(exists.iter().all(|&e| !e), "{exists:?}");
    assert_eq!(values, rows(&untouched, &NOT_ADMITTED)?);

    // Ids read 3 times or more: rows, moved away from the initializer's
    // by the steps from their third read on, as on the reference table.
    assert_eq!(admitting.size(), ADMITTED.len());
    let trained = rows(&admitting, &ADMITTED)?;
    let initial = rows(&untouched, &ADMITTED)?;
    for (i, (t, u)) in trained.iter().zip(&initial).enumerate() {
        assert!((t - u).abs() > 1e-3, "value {i}: {t} is still {u}");
    }
    assert_eq!(trained, rows(&reference, &ADMITTED)?);
    let m = admitting.slot_id("m")?;
    let mut slot = vec![0.0; ADMITTED.len() * DIM];
    admitting.lookup_slot(m, &ADMITTED, &mut slot)?;
    assert!(slot.iter().all(|&v| v != 0.0), "{slot:?}");

    assert_eq!(
        admitting.lifecycle_stats().not_admitted_reads,
        not_admitted_reads
    );
    assert_eq!(not_admitted_reads, 12);
    Ok(())
}

/// Inference reads do not count towards admission: an id read only in
/// inference mode, however often, never gets a row.
#[test]
fn inference_reads_do_not_admit() -> TestResult {
    let admitting = table("admitting", true)?;
    let layer = Embedding::new(Arc::clone(&admitting), EmbeddingConfig::default())?;
    let ids = Tensor::new(&[11_i64, 12], &Device::Cpu)?;
    for _ in 0..2 * MIN_COUNT {
        layer.forward(&ids, false)?;
    }
    assert_eq!(admitting.size(), 0);
    assert_eq!(admitting.lifecycle_stats().not_admitted_reads, 0);
    for _ in 0..MIN_COUNT {
        layer.forward(&ids, true)?;
    }
    layer.discard_batches();
    assert_eq!(admitting.size(), 2);
    Ok(())
}

/// Two layers over one table, and one layer called twice, before one
/// step: the first read of id 7 is not admitted (min count 2), the second
/// admits it, and only the second read's gradient trains the row, with
/// SGD and with Adam's slots, as on a table that admitted at the second
/// read with only that read's gradient.
#[test]
fn a_read_before_admission_in_the_same_step_trains_nothing() -> TestResult {
    use dynemb_optim::{ParamsSgd, SparseSgd};
    let admitting_table = |name: &str| -> Result<Arc<Variable<i64>>, dynemb::Error> {
        Ok(Arc::new(
            Variable::<i64>::builder(name)
                .dim(2)
                .initializer(Initializer::Constant(0.0))
                .admission(Admission::Exact { min_count: 2 })
                .build()?,
        ))
    };
    let row_of = |table: &Variable<i64>| -> Result<[f32; 2], dynemb::Error> {
        let mut out = [0.0; 2];
        table.lookup(&[7], &mut out)?;
        Ok(out)
    };
    let ids = Tensor::new(&[7_i64], &Device::Cpu)?;
    for shared in [false, true] {
        let sgd_table = admitting_table("sgd")?;
        let first = Embedding::new(Arc::clone(&sgd_table), EmbeddingConfig::default())?;
        let second = Embedding::new(Arc::clone(&sgd_table), EmbeddingConfig::default())?;
        let a = first.forward(&ids, true)?;
        let b = if shared { &second } else { &first }.forward(&ids, true)?;
        let loss = ((a.sum_all()? * 3.0)? + b.sum_all()?)?;
        SparseStep::new(SparseSgd::new(ParamsSgd { lr: 1.0 })?)
            .step(&loss.backward()?, &[&first, &second])?;
        assert_eq!(row_of(&sgd_table)?, [-1.0, -1.0], "shared {shared}");
    }

    let adam_table = admitting_table("adam")?;
    let layer = Embedding::new(Arc::clone(&adam_table), EmbeddingConfig::default())?;
    let a = layer.forward(&ids, true)?;
    let b = layer.forward(&ids, true)?;
    let loss = ((a.sum_all()? * 3.0)? + b.sum_all()?)?;
    SparseStep::new(adam()?).step(&loss.backward()?, &[&layer])?;
    let plain = Arc::new(
        Variable::<i64>::builder("plain")
            .dim(2)
            .initializer(Initializer::Constant(0.0))
            .build()?,
    );
    adam()?.apply(&*plain, &[7], &[1.0, 1.0])?;
    assert_eq!(row_of(&adam_table)?, row_of(&plain)?);
    for slot in ["m", "v"] {
        let (mut got, mut want) = ([0.0; 2], [0.0; 2]);
        adam_table.lookup_slot(adam_table.slot_id(slot)?, &[7], &mut got)?;
        plain.lookup_slot(plain.slot_id(slot)?, &[7], &mut want)?;
        assert_eq!(got, want, "slot {slot}");
    }
    Ok(())
}
