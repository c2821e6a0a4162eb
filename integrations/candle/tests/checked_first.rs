//! Every "checked before anything changes" promise of `SparseStep`,
//! proved by making its last check fail and asserting that nothing
//! changed: the tables' rows, slots (none created, none orphaned) and
//! scores, the sparse optimizer's step count, the dense variables; and
//! what happens to the recorded batches (kept by `step`, dropped by
//! `backward_step`, whose gradients die with the call).
//!
//! - `SparseStep::step`: the gradients gathered, every store checked
//!   (trainable, finite, slots compatible, room for missing slots), then
//!   (last) the step begun;
//! - `SparseStep::backward_step`: the loss finite, the gradients, every
//!   store, then (last) the next step's learning rate, all before the
//!   dense optimizer's step;
//! - `parallel::apply`: the whole batch checked as one call (last: room
//!   for the slots) before any chunk runs.

use std::sync::Arc;

use candle_core::{Device, Tensor, Var};
use candle_nn::{Optimizer, SGD};
use dynemb::{RestrictPolicy, Variable, MAX_SLOTS};
use dynemb_candle::{Embedding, EmbeddingConfig, Error, SparseStep};
use dynemb_optim::{LearningRate, ParamsAdam, ParamsFtrl, SparseAdam, SparseFtrl};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const DIM: usize = 3;

/// A table with keys 1..=4, scored, with `slots` slot columns of its own.
fn table(name: &str, slots: usize) -> Result<Arc<Variable<i64>>, dynemb::Error> {
    let var = Variable::<i64>::builder(name)
        .dim(DIM)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()?;
    let values: Vec<f32> = (0..4 * DIM).map(|i| i as f32 * 0.1 - 0.5).collect();
    var.upsert(&[1, 2, 3, 4], &values)?;
    for i in 0..slots {
        var.create_slot(&format!("other{i}"), i as f32)?;
    }
    Ok(Arc::new(var))
}

/// Everything a table holds: slot names, keys, rows, slot rows, scores.
type Snapshot = (Vec<String>, Vec<i64>, Vec<f32>, Vec<Vec<f32>>, Vec<u64>);

fn snapshot(v: &Variable<i64>) -> Result<Snapshot, dynemb::Error> {
    let (mut keys, _) = v.export()?;
    keys.sort_unstable();
    let mut rows = vec![0.0; keys.len() * DIM];
    v.lookup(&keys, &mut rows)?;
    let mut slots = Vec::new();
    for name in v.slot_names() {
        let mut out = vec![0.0; keys.len() * DIM];
        v.lookup_slot(v.slot_id(&name)?, &keys, &mut out)?;
        slots.push(out);
    }
    let mut scores = vec![0; keys.len()];
    v.lookup_scores(&keys, &mut scores)?;
    Ok((v.slot_names(), keys, rows, slots, scores))
}

fn layer(store: &Arc<Variable<i64>>) -> Result<Embedding<Variable<i64>>, Error> {
    Embedding::new(Arc::clone(store), EmbeddingConfig::default())
}

fn ids(ids: &[i64]) -> Result<Tensor, candle_core::Error> {
    Tensor::new(ids, &Device::Cpu)
}

fn adam() -> Result<SparseStep<ParamsAdam>, dynemb::Error> {
    Ok(SparseStep::new(SparseAdam::new(ParamsAdam {
        lr: 0.1,
        ..Default::default()
    })?))
}

fn assert_room_error(err: &Error) {
    let message = err.to_string();
    assert!(
        matches!(err, Error::Table(dynemb::Error::InvalidArgument(_)))
            && message.contains("would make 9"),
        "{message}"
    );
}

/// Two layers over two tables; the second holds 7 of its 8 slot columns,
/// so Adam's `m` and `v` do not fit.
struct TwoTables {
    first: Arc<Variable<i64>>,
    second: Arc<Variable<i64>>,
    a: Embedding<Variable<i64>>,
    b: Embedding<Variable<i64>>,
}

impl TwoTables {
    fn new() -> Result<Self, Box<dyn std::error::Error>> {
        let first = table("first", 0)?;
        let second = table("second", MAX_SLOTS - 1)?;
        let (a, b) = (layer(&first)?, layer(&second)?);
        Ok(TwoTables {
            first,
            second,
            a,
            b,
        })
    }

    fn snapshot(&self) -> Result<(Snapshot, Snapshot), dynemb::Error> {
        Ok((snapshot(&self.first)?, snapshot(&self.second)?))
    }

    /// A loss over both layers (and the dense `scale`).
    fn loss(&self, scale: &Var) -> Result<Tensor, Box<dyn std::error::Error>> {
        let a = self.a.forward_train(&ids(&[1, 2, 5])?)?;
        let b = self.b.forward_train(&ids(&[3, 6])?)?;
        Ok((a.sum_all()? + b.sum_all()?)?
            .broadcast_mul(scale)?
            .sum_all()?)
    }
}

#[test]
fn step_over_two_tables_refused_for_slot_room_changes_nothing() -> TestResult {
    let t = TwoTables::new()?;
    let step = adam()?;
    let scale = Var::new(&[2.0_f32], &Device::Cpu)?;
    // The training forward inserts the new keys; the step changes nothing.
    let loss = t.loss(&scale)?;
    let before = t.snapshot()?;
    let err = step.step(&loss.backward()?, &[&t.a, &t.b]).unwrap_err();
    assert_room_error(&err);
    assert_eq!(t.snapshot()?, before, "no row, slot or score changed");
    assert_eq!(step.optimizer().steps(), 0);
    assert_eq!(
        (t.a.recorded_batches(), t.b.recorded_batches()),
        (1, 1),
        "a step that fails its checks keeps the batches"
    );
    Ok(())
}

#[test]
fn backward_step_over_two_tables_refused_for_slot_room_changes_nothing() -> TestResult {
    let t = TwoTables::new()?;
    let step = adam()?;
    let scale = Var::new(&[2.0_f32], &Device::Cpu)?;
    let mut sgd = SGD::new(vec![scale.clone()], 0.5)?;
    let loss = t.loss(&scale)?;
    let before = t.snapshot()?;
    let err = step
        .backward_step(&loss, &mut sgd, &[&t.a, &t.b])
        .unwrap_err();
    assert_room_error(&err);
    assert_eq!(t.snapshot()?, before, "no row, slot or score changed");
    assert!(t.first.slot_id("m").is_err() && t.second.slot_id("m").is_err());
    assert_eq!(step.optimizer().steps(), 0);
    assert_eq!(scale.to_vec1::<f32>()?, [2.0], "no dense step");
    assert_eq!((t.a.recorded_batches(), t.b.recorded_batches()), (0, 0));

    // Without the second table the first trains, from this state.
    let out = t.a.forward_train(&ids(&[1])?)?;
    step.backward_step(&out.sum_all()?, &mut sgd, &[&t.a])?;
    assert_eq!(step.optimizer().steps(), 1);
    assert_ne!(snapshot(&t.first)?, before.0);
    Ok(())
}

/// A loss whose NaN or infinity stays on the dense side: every embedding
/// gradient is finite.
fn dense_side_loss(
    emb: &Embedding<Variable<i64>>,
    scale: &Var,
    other: &Var,
    bad: f32,
) -> Result<Tensor, Box<dyn std::error::Error>> {
    let out = emb.forward_train(&ids(&[1, 2, 7])?)?;
    let sparse = out.sum_all()?.broadcast_mul(scale)?.sum_all()?;
    let dense = other.broadcast_mul(&Tensor::new(&[bad], &Device::Cpu)?)?;
    Ok((sparse + dense.sqr()?.sum_all()?)?)
}

#[test]
fn a_non_finite_loss_on_the_dense_side_changes_nothing_and_training_goes_on() -> TestResult {
    for bad in [f32::NAN, f32::INFINITY, 1e30] {
        let var = table("dense_nan", 0)?;
        let emb = layer(&var)?;
        let step = adam()?;
        let scale = Var::new(&[2.0_f32], &Device::Cpu)?;
        let other = Var::new(&[3.0_f32], &Device::Cpu)?;
        let mut sgd = SGD::new(vec![scale.clone(), other.clone()], 0.5)?;
        let loss = dense_side_loss(&emb, &scale, &other, bad)?;
        let before = snapshot(&var)?;
        // The embedding's gradient is finite: only the loss tells.
        let grads = loss.backward()?;
        let rows = emb.recorded_vars().pop().ok_or("a batch")?;
        let grad = grads.get(&rows).ok_or("a gradient")?;
        let grad = grad.flatten_all()?.to_vec1::<f32>()?;
        assert!(grad.iter().all(|g| g.is_finite()), "{grad:?}");

        let err = step.backward_step(&loss, &mut sgd, &[&emb]).unwrap_err();
        assert!(
            matches!(err, Error::NonFiniteLoss { loss } if !loss.is_finite()),
            "{bad}: {err}"
        );
        assert_eq!(snapshot(&var)?, before, "{bad}: no row, slot or score");
        assert_eq!(step.optimizer().steps(), 0);
        assert_eq!(scale.to_vec1::<f32>()?, [2.0], "{bad}: no dense step");
        assert_eq!(other.to_vec1::<f32>()?, [3.0]);
        assert_eq!(emb.recorded_batches(), 0, "{bad}: the batch is dropped");

        // The next batch trains: rows, slots, step count and dense vars.
        let loss = dense_side_loss(&emb, &scale, &other, 1.0)?;
        step.backward_step(&loss, &mut sgd, &[&emb])?;
        assert_eq!(step.optimizer().steps(), 1);
        assert_eq!(var.slot_names(), ["m", "v"]);
        assert_ne!(snapshot(&var)?.2, before.2);
        assert_ne!(scale.to_vec1::<f32>()?, [2.0]);
        assert_eq!(emb.recorded_batches(), 0);
    }
    Ok(())
}

#[test]
fn step_whose_next_step_cannot_begin_changes_nothing_and_keeps_the_batches() -> TestResult {
    // FTRL refuses a rate of 0; the schedule gives it from the second step.
    let ftrl = SparseFtrl::new(ParamsFtrl {
        lr: 0.1,
        ..Default::default()
    })?;
    ftrl.set_learning_rate(LearningRate::PiecewiseConstant {
        boundaries: vec![0],
        values: vec![0.1, 0.0],
    })?;
    let step = SparseStep::new(ftrl);
    let trained = table("trained", 0)?;
    let a = layer(&trained)?;
    step.step(&a.forward_train(&ids(&[1])?)?.sum_all()?.backward()?, &[&a])?;
    assert_eq!(step.optimizer().steps(), 1);

    // Every store check passes on a fresh table; beginning the step fails.
    let fresh = table("fresh", 0)?;
    let b = layer(&fresh)?;
    let loss =
        (a.forward_train(&ids(&[1, 9])?)?.sum_all()? + b.forward_train(&ids(&[2])?)?.sum_all()?)?;
    let before = (snapshot(&trained)?, snapshot(&fresh)?);
    let err = step.step(&loss.backward()?, &[&a, &b]).unwrap_err();
    assert!(err.to_string().contains("schedule gives 0"), "{err}");
    assert_eq!((snapshot(&trained)?, snapshot(&fresh)?), before);
    assert!(fresh.slot_names().is_empty(), "no slot created");
    assert_eq!(step.optimizer().steps(), 1);
    assert_eq!((a.recorded_batches(), b.recorded_batches()), (1, 1));
    Ok(())
}

#[test]
fn parallel_apply_checks_the_whole_batch_before_any_chunk_runs() -> TestResult {
    let var = table("parallel", MAX_SLOTS - 1)?;
    let keys: Vec<i64> = (0..50_000).collect();
    let grads = vec![0.5_f32; keys.len() * DIM];
    let opt = SparseAdam::new(ParamsAdam::default())?;
    let before = snapshot(&var)?;
    let step = opt.begin_step()?;
    let err = dynemb_candle::parallel::apply(&step, &*var, &keys, &grads).unwrap_err();
    assert_room_error(&Error::Table(err));
    assert_eq!(snapshot(&var)?, before);
    Ok(())
}
