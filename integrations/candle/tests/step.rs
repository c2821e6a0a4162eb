//! `SparseStep`: one optimizer step over every recorded batch, merged per
//! store; all-or-nothing checks; the regularizer's loss and its gradient.

use std::sync::Arc;

use candle_core::{Device, Tensor, Var};
use candle_nn::{Optimizer, SGD};
use dynemb::{Key, Variable};
use dynemb_candle::{
    Embedding, EmbeddingConfig, Regularizer, SparseGrads, SparseModule, SparseStep,
};
use dynemb_optim::{ParamsAdam, ParamsSgd, SparseAdam, SparseOptimizer, SparseSgd};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const DIM: usize = 3;

/// A gradient value exactly representable, so sums are exact in any order.
fn dyadic(i: usize) -> f32 {
    ((i % 7) as f32 - 3.0) * 0.25
}

/// A store with keys 1..=4 holding distinct rows.
fn store<K: Key + TryFrom<u8>>(name: &str) -> Result<Arc<Variable<K>>, dynemb::Error> {
    let var = Variable::<K>::builder(name).dim(DIM).build()?;
    let keys: Vec<K> = (1..=4_u8).filter_map(|k| K::try_from(k).ok()).collect();
    let values: Vec<f32> = (0..keys.len() * DIM)
        .map(|i| i as f32 * 0.1 - 0.5)
        .collect();
    var.upsert(&keys, &values)?;
    Ok(Arc::new(var))
}

fn layer<K: dynemb_candle::IdKey>(
    store: &Arc<Variable<K>>,
) -> Result<Embedding<Variable<K>>, dynemb_candle::Error> {
    Embedding::new(Arc::clone(store), EmbeddingConfig::default())
}

/// `sum(out * w)` for fixed dyadic weights starting at `offset`: the
/// gradient of position `p` is `w`'s row `p`. Returns the loss and `w`.
fn weighted(out: &Tensor, offset: usize) -> Result<(Tensor, Vec<f32>), candle_core::Error> {
    let w: Vec<f32> = (0..out.elem_count()).map(|i| dyadic(i + offset)).collect();
    let w_t = Tensor::from_slice(&w, out.shape(), out.device())?;
    Ok(((out * w_t)?.sum_all()?, w))
}

fn ids_tensor<K: Copy + Into<i64>>(ids: &[K]) -> Result<Tensor, candle_core::Error> {
    let ids: Vec<i64> = ids.iter().map(|&k| k.into()).collect();
    Tensor::new(ids.as_slice(), &Device::Cpu)
}

/// Values and every slot of `keys`, for before/after comparisons.
fn snapshot<K: Key>(var: &Variable<K>, keys: &[K]) -> Result<Vec<Vec<f32>>, dynemb::Error> {
    let mut out = vec![vec![0.0; keys.len() * DIM]];
    var.lookup(keys, &mut out[0])?;
    for name in var.slot_names() {
        let mut slot = vec![0.0; keys.len() * DIM];
        var.lookup_slot(var.slot_id(&name)?, keys, &mut slot)?;
        out.push(slot);
    }
    Ok(out)
}

#[test]
fn layers_sharing_a_store_step_as_one_apply_of_all_their_gradients() -> TestResult {
    let shared = store::<i64>("shared")?;
    let (a, b) = (layer(&shared)?, layer(&shared)?);
    let step = SparseStep::new(SparseAdam::new(ParamsAdam {
        lr: 0.1,
        ..Default::default()
    })?);
    let reference = store::<i64>("reference")?;
    let reference_opt = SparseAdam::new(ParamsAdam {
        lr: 0.1,
        ..Default::default()
    })?;
    let batches: [&[i64]; 3] = [&[1, 2, 3, 2], &[5, 1], &[2, 4, 1]];
    for _ in 0..2 {
        // Layer a is called twice (two batches), layer b once; key 5 is new.
        let (loss_a1, w_a1) = weighted(&a.forward_train(&ids_tensor(batches[0])?)?, 0)?;
        let (loss_a2, w_a2) = weighted(&a.forward_train(&ids_tensor(batches[1])?)?, 5)?;
        let (loss_b, w_b) = weighted(&b.forward_train(&ids_tensor(batches[2])?)?, 11)?;
        assert_eq!(a.recorded_batches(), 2);
        let loss = ((loss_a1 + loss_a2)? + loss_b)?;
        step.step(&loss.backward()?, &[&a, &b])?;
        assert_eq!((a.recorded_batches(), b.recorded_batches()), (0, 0));

        let keys = batches.concat();
        let grads = [w_a1, w_a2, w_b].concat();
        reference_opt.apply(&*reference, &keys, &grads)?;
    }
    assert_eq!(step.optimizer().steps(), 2);
    let keys = [1_i64, 2, 3, 4, 5];
    let (got, want) = (snapshot(&shared, &keys)?, snapshot(&reference, &keys)?);
    assert_eq!(got.len(), 3, "values, m, v");
    assert_eq!(got, want);
    Ok(())
}

#[test]
fn stores_of_different_key_types_take_one_step() -> TestResult {
    let (wide, narrow) = (store::<i64>("i64")?, store::<u32>("u32")?);
    let (a, b) = (layer(&wide)?, layer(&narrow)?);
    let params = ParamsAdam {
        lr: 0.1,
        ..Default::default()
    };
    let step = SparseStep::new(SparseAdam::new(params)?);
    let (loss_a, w_a) = weighted(&a.forward_train(&ids_tensor(&[1_i64, 3])?)?, 0)?;
    let (loss_b, w_b) = weighted(&b.forward_train(&ids_tensor(&[2_u32, 2, 4])?)?, 3)?;
    step.step(&(loss_a + loss_b)?.backward()?, &[&a, &b])?;
    assert_eq!(step.optimizer().steps(), 1);

    // Each store got step t = 1, as a fresh optimizer's one apply gives.
    let (ref_wide, ref_narrow) = (store::<i64>("i64")?, store::<u32>("u32")?);
    SparseAdam::new(params)?.apply(&*ref_wide, &[1, 3], &w_a)?;
    SparseAdam::new(params)?.apply(&*ref_narrow, &[2, 2, 4], &w_b)?;
    assert_eq!(snapshot(&wide, &[1, 3])?, snapshot(&ref_wide, &[1, 3])?);
    assert_eq!(snapshot(&narrow, &[2, 4])?, snapshot(&ref_narrow, &[2, 4])?);
    assert_ne!(
        snapshot(&wide, &[1])?[0],
        snapshot(&*store::<i64>("x")?, &[1])?[0]
    );
    Ok(())
}

#[test]
fn a_missing_gradient_is_an_error_that_changes_nothing() -> TestResult {
    let (first, second) = (store::<i64>("first")?, store::<u32>("second")?);
    let (a, b) = (layer(&first)?, layer(&second)?);
    let step = SparseStep::new(SparseAdam::new(ParamsAdam::default())?);
    // One good step first, so the stores have slots to compare.
    let (la, _) = weighted(&a.forward_train(&ids_tensor(&[1_i64, 2])?)?, 0)?;
    let (lb, _) = weighted(&b.forward_train(&ids_tensor(&[3_u32])?)?, 0)?;
    step.step(&(la + lb)?.backward()?, &[&a, &b])?;
    let before = (snapshot(&first, &[1, 2, 3])?, snapshot(&second, &[1, 3])?);

    // Layer b's output never reaches the loss.
    let (la, _) = weighted(&a.forward_train(&ids_tensor(&[1_i64, 3])?)?, 1)?;
    b.forward_train(&ids_tensor(&[1_u32])?)?;
    let err = step
        .step(&la.backward()?, &[&a, &b])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no gradient") && err.contains("second"),
        "{err}"
    );
    // A GradStore of another loss has none of them.
    let other = Var::new(&[1.0_f32], &Device::Cpu)?;
    assert!(step.step(&other.sum_all()?.backward()?, &[&a]).is_err());

    assert_eq!(step.optimizer().steps(), 1);
    assert_eq!(
        (snapshot(&first, &[1, 2, 3])?, snapshot(&second, &[1, 3])?),
        before
    );
    assert_eq!((a.recorded_batches(), b.recorded_batches()), (1, 1));
    a.discard_batches();
    b.discard_batches();
    assert_eq!((a.recorded_batches(), b.recorded_batches()), (0, 0));
    Ok(())
}

#[test]
fn refused_gradients_and_slots_change_nothing() -> TestResult {
    let var = store::<i64>("checked")?;
    let emb = layer(&var)?;
    let step = SparseStep::new(SparseAdam::new(ParamsAdam::default())?);
    let before = snapshot(&var, &[1, 2])?;

    let (loss, _) = weighted(&emb.forward_train(&ids_tensor(&[1_i64, 2])?)?, 0)?;
    let rows = emb.recorded_vars().pop().ok_or("no batch")?;
    let mut grads = loss.backward()?;
    // A gradient of the wrong shape, then a non-finite one.
    grads.insert(
        &rows,
        Tensor::zeros((3, DIM), candle_core::DType::F32, &Device::Cpu)?,
    );
    assert!(step.step(&grads, &[&emb]).is_err());
    grads.insert(
        &rows,
        Tensor::new(&[[0.0_f32, f32::NAN, 0.0], [0.0; 3]], &Device::Cpu)?,
    );
    assert!(step.step(&grads, &[&emb]).is_err());
    // A slot the optimizer keeps, with another initial value.
    var.create_slot("m", 1.0)?;
    let grads = loss.backward()?;
    assert!(step.step(&grads, &[&emb]).is_err());

    assert_eq!(step.optimizer().steps(), 0);
    assert_eq!(snapshot(&var, &[1, 2])?[0], before[0]);
    assert!(var.slot_id("v").is_err(), "no slot created");
    assert_eq!(emb.recorded_batches(), 1);

    let mut gathered = SparseGrads::<ParamsAdam>::new();
    let bad = Tensor::zeros((1, DIM + 1), candle_core::DType::F32, &Device::Cpu)?;
    let rows = candle_core::Var::zeros((1, DIM), candle_core::DType::F32, &Device::Cpu)?;
    assert!(gathered
        .push(&var, Arc::new(vec![1_i64]), &rows, bad)
        .is_err());
    assert!(!gathered.holds(&rows));
    assert!(gathered.is_empty());
    Ok(())
}

#[test]
fn a_module_listed_twice_is_stepped_once() -> TestResult {
    let var = store::<i64>("twice")?;
    let emb = layer(&var)?;
    let step = SparseStep::new(SparseSgd::new(ParamsSgd { lr: 1.0 })?);
    let before = snapshot(&var, &[1])?[0].clone();
    let (loss, w) = weighted(&emb.forward_train(&ids_tensor(&[1_i64])?)?, 0)?;
    let module: &dyn SparseModule<ParamsSgd> = &emb;
    step.step(&loss.backward()?, &[module, module])?;
    let expected: Vec<f32> = before.iter().zip(&w).map(|(x, g)| x - g).collect();
    assert_eq!(snapshot(&var, &[1])?[0], expected);
    Ok(())
}

#[test]
fn a_refused_backward_step_drops_its_dead_batches_and_training_goes_on() -> TestResult {
    let var = store::<i64>("recovers")?;
    let emb = layer(&var)?;
    let step = SparseStep::new(SparseSgd::new(ParamsSgd { lr: 0.5 })?);
    let scale = Var::new(&[2.0_f32], &Device::Cpu)?;
    let mut sgd = SGD::new(vec![scale.clone()], 0.5)?;
    let before = snapshot(&var, &[1, 2])?[0].clone();

    // A bad batch: its loss is NaN, so are its gradients.
    let out = emb.forward_train(&ids_tensor(&[1_i64])?)?;
    let nan = Tensor::new(&[f32::NAN], &Device::Cpu)?;
    let loss = out.broadcast_mul(&scale)?.broadcast_mul(&nan)?.sum_all()?;
    let err = step
        .backward_step(&loss, &mut sgd, &[&emb])
        .unwrap_err()
        .to_string();
    assert!(err.contains("not finite"), "{err}");
    assert_eq!(
        scale.to_vec1::<f32>()?,
        [2.0],
        "the dense step was not taken"
    );
    assert_eq!(snapshot(&var, &[1, 2])?[0], before, "no row moved");
    assert_eq!(step.optimizer().steps(), 0);
    assert_eq!(emb.recorded_batches(), 0, "its gradients are gone: dropped");

    // The next batch trains as usual.
    let out = emb.forward_train(&ids_tensor(&[2_i64])?)?;
    let loss = out.broadcast_mul(&scale)?.sum_all()?;
    step.backward_step(&loss, &mut sgd, &[&emb])?;
    assert_eq!(step.optimizer().steps(), 1);
    assert_eq!(emb.recorded_batches(), 0);
    let after = snapshot(&var, &[2])?[0].clone();
    let expected: Vec<f32> = before[DIM..].iter().map(|x| x - 0.5 * 2.0).collect();
    assert_eq!(after, expected);
    Ok(())
}

#[test]
fn backward_step_checks_the_sparse_side_before_the_dense_step() -> TestResult {
    let var = store::<i64>("dense")?;
    let emb = layer(&var)?;
    let step = SparseStep::new(SparseSgd::new(ParamsSgd { lr: 0.5 })?);
    let scale = Var::new(&[2.0_f32], &Device::Cpu)?;
    let mut sgd = SGD::new(vec![scale.clone()], 0.5)?;

    // A recorded batch the loss does not use: nothing moves.
    emb.forward_train(&ids_tensor(&[4_i64])?)?;
    let unrelated = scale.sum_all()?;
    assert!(step.backward_step(&unrelated, &mut sgd, &[&emb]).is_err());
    assert_eq!(scale.to_vec1::<f32>()?, [2.0]);
    emb.discard_batches();

    let out = emb.forward_train(&ids_tensor(&[1_i64])?)?;
    let loss = out.broadcast_mul(&scale)?.sum_all()?;
    let before = snapshot(&var, &[1])?[0].clone();
    step.backward_step(&loss, &mut sgd, &[&emb])?;
    // d/dscale = sum(row 1); d/drow = scale.
    let expected_scale = 2.0 - 0.5 * before.iter().sum::<f32>();
    assert!((scale.to_vec1::<f32>()?[0] - expected_scale).abs() < 1e-6);
    let expected: Vec<f32> = before.iter().map(|x| x - 0.5 * 2.0).collect();
    assert_eq!(snapshot(&var, &[1])?[0], expected);
    Ok(())
}

#[test]
fn regularizer_loss_counts_each_distinct_row_once_per_batch_and_trains_it() -> TestResult {
    let var = Variable::<i64>::builder("reg").dim(DIM).build()?;
    var.upsert(&[1, 2], &[1.0, -2.0, 0.0, 0.5, 0.0, -0.25])?;
    let var = Arc::new(var);
    let (l1, l2, lr) = (0.5_f32, 0.25_f32, 0.5_f32);
    let config = EmbeddingConfig {
        regularizer: Some(Regularizer::l1_l2(l1, l2)),
        ..Default::default()
    };
    let emb = Embedding::new(Arc::clone(&var), config)?;
    assert_eq!(emb.regularization_loss()?.to_scalar::<f32>()?, 0.0);

    emb.forward_train(&ids_tensor(&[1_i64, 1, 2, 1])?)?;
    let rows = [1.0_f32, -2.0, 0.0, 0.5, 0.0, -0.25];
    let per_batch = l1 * rows.iter().map(|w| w.abs()).sum::<f32>()
        + l2 * rows.iter().map(|w| w * w).sum::<f32>();
    let loss = emb.regularization_loss()?;
    assert_eq!(loss.to_scalar::<f32>()?, per_batch);

    let step = SparseStep::new(SparseSgd::new(ParamsSgd { lr })?);
    step.step(&loss.backward()?, &[&emb])?;
    // w -= lr * (l1 * sign(w) + 2 * l2 * w), with sign(0) = 0.
    let expected: Vec<f32> = rows
        .iter()
        .map(|&w| {
            let sign = if w == 0.0 { 0.0 } else { w.signum() };
            w - lr * (l1 * sign + 2.0 * l2 * w)
        })
        .collect();
    assert_eq!(snapshot(&var, &[1, 2])?[0], expected);

    // A missing key's row (zeros) costs nothing.
    emb.forward_train(&ids_tensor(&[3_i64])?)?;
    assert_eq!(emb.regularization_loss()?.to_scalar::<f32>()?, 0.0);
    emb.discard_batches();
    // Two calls before a step: each batch's term counts.
    emb.forward_train(&ids_tensor(&[1_i64])?)?;
    emb.forward_train(&ids_tensor(&[1_i64, 1])?)?;
    let once = l1 * expected[..DIM].iter().map(|w| w.abs()).sum::<f32>()
        + l2 * expected[..DIM].iter().map(|w| w * w).sum::<f32>();
    let twice = emb.regularization_loss()?.to_scalar::<f32>()?;
    assert!((twice - 2.0 * once).abs() < 1e-6, "{twice} vs 2 * {once}");
    Ok(())
}

#[test]
fn layers_over_clones_of_one_variable_take_one_update_of_the_summed_gradient() -> TestResult {
    // What a TFRA user gets from fetching one name twice from a Registry:
    // two handles (clones) of one table, each in its own Arc.
    let shared = store::<i64>("cloned")?;
    let other_handle = Arc::new((*shared).clone());
    let (a, b) = (layer(&shared)?, layer(&other_handle)?);
    let reference = store::<i64>("cloned_reference")?;
    let adam = || {
        SparseAdam::new(ParamsAdam {
            lr: 0.1,
            ..Default::default()
        })
    };
    let (step, reference_opt) = (SparseStep::new(adam()?), adam()?);
    let (loss_a, w_a) = weighted(&a.forward_train(&ids_tensor(&[1_i64, 2])?)?, 0)?;
    let (loss_b, w_b) = weighted(&b.forward_train(&ids_tensor(&[2_i64, 3])?)?, 4)?;
    step.step(&(loss_a + loss_b)?.backward()?, &[&a, &b])?;
    reference_opt.apply(&*reference, &[1, 2, 2, 3], &[w_a, w_b].concat())?;
    let keys = [1_i64, 2, 3];
    assert_eq!(snapshot(&shared, &keys)?, snapshot(&reference, &keys)?);
    Ok(())
}

#[test]
fn backward_step_refuses_a_bad_next_learning_rate_before_the_dense_step() -> TestResult {
    let var = store::<i64>("schedule")?;
    let emb = layer(&var)?;
    let adam = SparseAdam::new(ParamsAdam::default())?;
    // The rate at step 3 (0.001 * MAX^2) overflows to infinity, which Adam
    // refuses.
    adam.set_learning_rate(dynemb_optim::LearningRate::ExponentialDecay {
        decay_steps: 1,
        decay_rate: f32::MAX,
        staircase: true,
    })?;
    let step = SparseStep::new(adam);
    let scale = Var::new(&[2.0_f32], &Device::Cpu)?;
    let mut sgd = SGD::new(vec![scale.clone()], 0.5)?;
    let forward = || -> Result<Tensor, Box<dyn std::error::Error>> {
        let out = emb.forward_train(&ids_tensor(&[1_i64])?)?;
        Ok(out.broadcast_mul(&scale)?.sum_all()?)
    };
    for _ in 0..2 {
        step.backward_step(&forward()?, &mut sgd, &[&emb])?;
    }
    let (scale_before, rows_before) = (scale.to_vec1::<f32>()?, snapshot(&var, &[1])?);
    let err = step
        .backward_step(&forward()?, &mut sgd, &[&emb])
        .unwrap_err();
    assert!(err.to_string().contains("step 3"), "{err}");
    assert_eq!(scale.to_vec1::<f32>()?, scale_before, "dense step taken");
    assert_eq!(snapshot(&var, &[1])?, rows_before);
    assert_eq!(step.optimizer().steps(), 2);
    assert_eq!(
        emb.recorded_batches(),
        0,
        "the refused batch's gradients are gone with the call: dropped"
    );
    Ok(())
}

#[test]
fn a_batch_recorded_after_the_gathering_survives_the_step() -> TestResult {
    let var = store::<i64>("late")?;
    let emb = layer(&var)?;
    let (loss, _) = weighted(&emb.forward_train(&ids_tensor(&[1_i64, 2])?)?, 0)?;
    let mut gathered = SparseGrads::<ParamsSgd>::new();
    SparseModule::<ParamsSgd>::gather_grads(&emb, &loss.backward()?, &mut gathered)?;
    // Another thread's forward lands between the gathering and the step's end.
    emb.forward_train(&ids_tensor(&[3_i64])?)?;
    SparseModule::<ParamsSgd>::discard_gathered(&emb, &gathered);
    assert_eq!(emb.recorded_batches(), 1);
    assert!(!gathered.holds(&emb.recorded_vars()[0]));
    Ok(())
}
