//! The `Embedding` layer against candle-nn's dense `Embedding` and a dense
//! lazy Adam: the same losses and the same trained values; `max_norm`'s
//! forward and gradient by hand; what inference reads and leaves alone;
//! bad input.

use std::sync::Arc;

use candle_core::{DType, Device, ModuleT, Tensor, Var};
use candle_nn::{Module, Optimizer, SGD};
use dynemb::{Initializer, Variable};
use dynemb_candle::{Embedding, EmbeddingConfig, Ids, Regularizer, SparseStep};
use dynemb_optim::{ParamsAdam, ParamsSgd, SparseAdam, SparseSgd};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const VOCAB: usize = 12;
const DIM: usize = 8;

/// A deterministic value in about [-0.5, 0.5] for index `i` of stream `s`.
fn value(s: usize, i: usize) -> f32 {
    ((i as f32 + 1.0) * (0.37 + s as f32 * 0.11)).sin() * 0.5
}

/// A deterministic batch of ids in `0..VOCAB` (repeats included).
fn batch_ids(step: usize, shape: &[usize]) -> Result<Tensor, candle_core::Error> {
    let n: usize = shape.iter().product();
    let ids: Vec<i64> = (0..n)
        .map(|i| ((i * 7 + step * 5 + i * i) % VOCAB) as i64)
        .collect();
    Tensor::from_vec(ids, shape, &Device::Cpu)
}

/// A table of `VOCAB` rows holding `value(0, ..)`, keyed 0..VOCAB.
fn table(name: &str, dim: usize) -> Result<(Arc<Variable<i64>>, Vec<f32>), dynemb::Error> {
    let values: Vec<f32> = (0..VOCAB * dim).map(|i| value(0, i)).collect();
    let var = Variable::builder(name).dim(dim).build()?;
    let keys: Vec<i64> = (0..VOCAB as i64).collect();
    var.upsert(&keys, &values)?;
    Ok((Arc::new(var), values))
}

fn rows_of(var: &Variable<i64>, keys: &[i64]) -> Result<Vec<f32>, dynemb::Error> {
    let mut out = vec![0.0; keys.len() * var.dim()];
    var.lookup(keys, &mut out)?;
    Ok(out)
}

fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "{what}[{i}]: {x} vs {y}");
    }
}

/// Averages an embedding output `[batch, .., DIM]` over its middle dimensions.
fn pool(emb: &Tensor) -> Result<Tensor, candle_core::Error> {
    let batch = emb.dim(0)?;
    emb.reshape((batch, (), DIM))?.mean(1)
}

/// A linear head `DIM -> 1` with fixed initial weights.
fn head() -> Result<(Var, Var), candle_core::Error> {
    let w: Vec<f32> = (0..DIM).map(|i| value(1, i)).collect();
    Ok((
        Var::from_vec(w, (1, DIM), &Device::Cpu)?,
        Var::new(&[0.1_f32], &Device::Cpu)?,
    ))
}

#[test]
fn sgd_training_matches_candle_nn_embedding_for_ids_of_rank_1_2_3() -> TestResult {
    let lr = 0.1;
    for shape in [vec![6], vec![4, 3], vec![2, 3, 2]] {
        // candle-nn: a dense table, every parameter under candle-nn's SGD.
        let dense_table = Var::from_vec(table("unused", DIM)?.1, (VOCAB, DIM), &Device::Cpu)?;
        let dense_emb = candle_nn::Embedding::new(dense_table.as_tensor().clone(), DIM);
        let (w1, b1) = head()?;
        let linear1 = candle_nn::Linear::new(w1.as_tensor().clone(), Some(b1.as_tensor().clone()));
        let mut sgd1 = SGD::new(vec![dense_table.clone(), w1.clone(), b1.clone()], lr)?;

        // dynemb: the same rows in a dynamic table, SparseSgd for it.
        let (store, _) = table("emb", DIM)?;
        let emb = Embedding::new(Arc::clone(&store), EmbeddingConfig::default())?;
        let (w2, b2) = head()?;
        let linear2 = candle_nn::Linear::new(w2.as_tensor().clone(), Some(b2.as_tensor().clone()));
        let mut sgd2 = SGD::new(vec![w2.clone(), b2.clone()], lr)?;
        let sparse = SparseStep::new(SparseSgd::new(ParamsSgd { lr: lr as f32 })?);

        for step in 0..10 {
            let ids = batch_ids(step, &shape)?;
            let target = Tensor::from_vec(
                (0..shape[0])
                    .map(|i| value(2 + step, i))
                    .collect::<Vec<f32>>(),
                (shape[0], 1),
                &Device::Cpu,
            )?;
            let loss1 = candle_nn::loss::mse(
                &linear1.forward(&pool(&dense_emb.forward(&ids)?)?)?,
                &target,
            )?;
            sgd1.backward_step(&loss1)?;
            let out = emb.forward_train(&ids)?;
            assert_eq!(out.dims()[..shape.len()], shape[..]);
            let loss2 = candle_nn::loss::mse(&linear2.forward(&pool(&out)?)?, &target)?;
            sparse.backward_step(&loss2, &mut sgd2, &[&emb])?;
            let (l1, l2) = (loss1.to_scalar::<f32>()?, loss2.to_scalar::<f32>()?);
            assert!(
                l1.is_finite() && (l1 - l2).abs() <= 1e-5,
                "{shape:?} step {step}: {l1} vs {l2}"
            );
            assert_eq!(emb.recorded_batches(), 0);
        }
        let keys: Vec<i64> = (0..VOCAB as i64).collect();
        let trained = dense_table.flatten_all()?.to_vec1::<f32>()?;
        let initial = table("unused", DIM)?.1;
        assert!(trained
            .iter()
            .zip(&initial)
            .any(|(a, b)| (a - b).abs() > 1e-3));
        assert_close(&rows_of(&store, &keys)?, &trained, 1e-5, "table");
        assert_close(
            &w2.flatten_all()?.to_vec1::<f32>()?,
            &w1.flatten_all()?.to_vec1::<f32>()?,
            1e-5,
            "head",
        );
    }
    Ok(())
}

/// TensorFlow's lazy Adam on a dense table: only rows in the batch update
/// their value, `m` and `v` (see `dynemb_optim::rules::adam`).
struct LazyAdam {
    params: ParamsAdam,
    t: u64,
    value: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl LazyAdam {
    fn step(&mut self, rows: &[usize], grad: &[f32], dim: usize) {
        self.t += 1;
        let p = self.params;
        let t = self.t as f32;
        let lr_t = p.lr * (1.0 - p.beta2.powf(t)).sqrt() / (1.0 - p.beta1.powf(t));
        for &r in rows {
            let span = r * dim..(r + 1) * dim;
            let rows = self.m[span.clone()]
                .iter_mut()
                .zip(&mut self.v[span.clone()])
                .zip(&mut self.value[span.clone()]);
            for (((m, v), w), &g) in rows.zip(&grad[span]) {
                *m = *m * p.beta1 + g * (1.0 - p.beta1);
                *v = *v * p.beta2 + g * g * (1.0 - p.beta2);
                *w -= lr_t * *m / (v.sqrt() + p.eps);
            }
        }
    }
}

#[test]
fn sparse_adam_through_the_layer_matches_a_dense_lazy_adam_for_ids_of_rank_1_2_3() -> TestResult {
    for shape in [&[10][..], &[2, 5], &[2, 1, 5]] {
        check_adam(shape)?;
    }
    Ok(())
}

/// 10 steps of sparse Adam through the layer on ids of `shape`, against a
/// lazy dense Adam on a dense table fed candle's gradient of the same loss.
fn check_adam(shape: &[usize]) -> TestResult {
    let dim = 4;
    let params = ParamsAdam {
        lr: 0.05,
        ..Default::default()
    };
    let (store, initial) = table(&format!("adam{shape:?}"), dim)?;
    let emb = Embedding::new(Arc::clone(&store), EmbeddingConfig::default())?;
    let sparse = SparseStep::new(SparseAdam::new(params)?);
    let mut dense = LazyAdam {
        params,
        t: 0,
        value: initial,
        m: vec![0.0; VOCAB * dim],
        v: vec![0.0; VOCAB * dim],
    };
    let mut out_shape = shape.to_vec();
    out_shape.push(dim);
    for step in 0..10 {
        // Few distinct ids, many repeats; some rows skip some steps.
        let ids: Vec<i64> = (0..10).map(|i| ((i * i + step) % 5) as i64).collect();
        let target: Vec<f32> = (0..ids.len() * dim).map(|i| value(step, i)).collect();
        let target = Tensor::from_vec(target, out_shape.as_slice(), &Device::Cpu)?;
        let flat_ids = Tensor::new(ids.as_slice(), &Device::Cpu)?;
        let ids_t = flat_ids.reshape(shape)?;

        // The dense side: gradient of the same loss on the dense table.
        let table = Var::from_slice(&dense.value, (VOCAB, dim), &Device::Cpu)?;
        let rows = table.embedding(&flat_ids)?.reshape(out_shape.as_slice())?;
        let loss = candle_nn::loss::mse(&rows, &target)?;
        let grad = loss
            .backward()?
            .get(&table)
            .ok_or("no grad")?
            .flatten_all()?;
        let mut rows: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
        rows.sort_unstable();
        rows.dedup();
        dense.step(&rows, &grad.to_vec1::<f32>()?, dim);

        let out = emb.forward_train(&ids_t)?;
        assert_eq!(out.dims(), out_shape.as_slice());
        let loss = candle_nn::loss::mse(&out, &target)?;
        sparse.step(&loss.backward()?, &[&emb])?;
    }
    let keys: Vec<i64> = (0..VOCAB as i64).collect();
    assert_close(&rows_of(&store, &keys)?, &dense.value, 1e-5, "values");
    for (name, expected) in [("m", &dense.m), ("v", &dense.v)] {
        let mut slot = vec![0.0; VOCAB * dim];
        store.lookup_slot(store.slot_id(name)?, &keys, &mut slot)?;
        assert_close(&slot, expected, 1e-5, name);
    }
    assert_eq!(sparse.optimizer().steps(), 10);
    Ok(())
}

/// The clip of a row to norm `c` in f64: `x * c / max(|x|, c)`.
fn clip(x: &[f32], c: f64) -> Vec<f64> {
    let norm = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
    x.iter().map(|&v| f64::from(v) * c / norm.max(c)).collect()
}

#[test]
fn max_norm_forward_and_gradient_by_hand() -> TestResult {
    let c = 1.0_f32;
    let rows: [[f32; 3]; 3] = [[3.0, 4.0, 0.0], [0.2, -0.1, 0.3], [-2.0, 1.0, 2.0]];
    let var = Variable::<i64>::builder("clip").dim(3).build()?;
    var.upsert(&[0, 1, 2], rows.as_flattened())?;
    let store = Arc::new(var);
    let config = EmbeddingConfig {
        max_norm: Some(c),
        ..Default::default()
    };
    let emb = Embedding::new(Arc::clone(&store), config)?;
    // Key 9 is missing: a zero row (the default initializer).
    let ids = [2_i64, 0, 1, 9, 2];
    let ids_t = Tensor::new(&ids, &Device::Cpu)?;
    let inference = emb.forward_inference(&ids_t)?;
    // `forward(ids, train)` and candle's `forward_t` are the same two modes.
    assert_eq!(
        emb.forward(&ids_t, false)?.to_vec2::<f32>()?,
        inference.to_vec2::<f32>()?
    );
    assert_eq!(
        candle_nn::ModuleT::forward_t(&emb, &ids_t, false)?.to_vec2::<f32>()?,
        inference.to_vec2::<f32>()?
    );
    assert_eq!(emb.recorded_batches(), 0, "inference records nothing");
    let out = emb.forward(&ids_t, true)?;
    assert_eq!(emb.recorded_batches(), 1);
    assert_eq!(out.to_vec2::<f32>()?, inference.to_vec2::<f32>()?);
    let out_rows = out.to_vec2::<f32>()?;
    for (p, &id) in ids.iter().enumerate() {
        let x = if id == 9 { [0.0; 3] } else { rows[id as usize] };
        let expected: Vec<f32> = clip(&x, f64::from(c)).iter().map(|&v| v as f32).collect();
        assert_close(&out_rows[p], &expected, 1e-6, "clipped row");
    }

    // loss = sum(out * w): the gradient of a row is the sum over its
    // positions p of J(x)^T w_p, J^T w = c/|x| (w - (x.w) x / |x|^2) when
    // |x| > c, and w when |x| < c (or x = 0). SGD with lr 1: x -= grad.
    let w: Vec<f32> = (0..ids.len() * 3).map(|i| value(3, i)).collect();
    let w_t = Tensor::from_slice(&w, (ids.len(), 3), &Device::Cpu)?;
    let loss = (out * &w_t)?.sum_all()?;
    let sgd = SparseStep::new(SparseSgd::new(ParamsSgd { lr: 1.0 })?);
    sgd.step(&loss.backward()?, &[&emb])?;
    for id in [0_i64, 1, 2, 9] {
        let x: Vec<f64> = if id == 9 {
            vec![0.0; 3]
        } else {
            rows[id as usize].iter().map(|&v| f64::from(v)).collect()
        };
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut grad = [0.0_f64; 3];
        for (p, _) in ids.iter().enumerate().filter(|(_, &k)| k == id) {
            let wp: Vec<f64> = w[p * 3..p * 3 + 3].iter().map(|&v| f64::from(v)).collect();
            let xw: f64 = x.iter().zip(&wp).map(|(a, b)| a * b).sum();
            for j in 0..3 {
                grad[j] += if norm > f64::from(c) {
                    f64::from(c) / norm * (wp[j] - xw * x[j] / (norm * norm))
                } else {
                    wp[j]
                };
            }
        }
        let expected: Vec<f32> = (0..3).map(|j| (x[j] - grad[j]) as f32).collect();
        assert_close(&rows_of(&store, &[id])?, &expected, 1e-5, "trained row");
    }
    Ok(())
}

#[test]
fn inference_inserts_and_records_nothing_and_missing_ids_read_the_initializer() -> TestResult {
    let init = Initializer::RandomNormal {
        mean: 0.0,
        stddev: 0.5,
        seed: 7,
    };
    let var = Variable::<i64>::builder("init")
        .dim(DIM)
        .initializer(init)
        .build()?;
    var.upsert(&[1], &[1.0; DIM])?;
    let store = Arc::new(var);
    let emb = Embedding::new(Arc::clone(&store), EmbeddingConfig::default())?;
    let ids = Tensor::new(&[[1_i64, 40], [41, 40]], &Device::Cpu)?;

    let inference = emb.forward_inference(&ids)?;
    assert_eq!(inference.dims(), [2, 2, DIM]);
    assert_eq!(store.size(), 1);
    assert_eq!(emb.recorded_batches(), 0);
    let via_module = emb.forward_t(&ids, false)?;
    assert_eq!(via_module.to_vec3::<f32>()?, inference.to_vec3::<f32>()?);
    assert_eq!(store.size(), 1);
    assert_eq!(emb.recorded_batches(), 0);

    let expected = rows_of(&store, &[1, 40, 41, 40])?;
    let rows = inference.flatten_all()?.to_vec1::<f32>()?;
    assert_eq!(rows, expected);
    assert!(
        rows[DIM..2 * DIM].iter().any(|&v| v != 0.0),
        "initializer row"
    );

    let training = emb.forward_t(&ids, true)?;
    assert_eq!(training.to_vec3::<f32>()?, inference.to_vec3::<f32>()?);
    assert_eq!(store.size(), 3);
    assert_eq!(emb.recorded_batches(), 1);
    assert_eq!(rows_of(&store, &[1, 40, 41, 40])?, expected);
    emb.discard_batches();
    assert_eq!(emb.recorded_batches(), 0);
    Ok(())
}

#[test]
fn slices_scalars_and_empty_batches() -> TestResult {
    let (store, values) = table("shapes", DIM)?;
    let emb = Embedding::new(store, EmbeddingConfig::default())?;
    let ids = Ids::new(vec![3_i64, 4, 3, 5], &[2, 2])?;
    let out = emb.forward_ids(&ids, true)?;
    assert_eq!(out.dims(), [2, 2, DIM]);
    assert_eq!(
        out.flatten_all()?.to_vec1::<f32>()?[..DIM],
        values[3 * DIM..4 * DIM]
    );
    assert_eq!(emb.recorded_batches(), 1);
    assert_eq!(emb.recorder().recorded()[0].keys().as_slice(), [3, 4, 5]);

    let scalar = emb.forward_inference(&Tensor::new(2_u32, &Device::Cpu)?)?;
    assert_eq!(scalar.dims(), [DIM]);
    assert_eq!(scalar.to_vec1::<f32>()?, values[2 * DIM..3 * DIM]);

    let empty = emb.forward_train(&Tensor::zeros((4, 0), DType::I64, &Device::Cpu)?)?;
    assert_eq!(empty.dims(), [4, 0, DIM]);
    assert_eq!(emb.recorded_batches(), 1, "an empty batch is not recorded");
    Ok(())
}

#[test]
fn a_frozen_store_is_read_without_inserting_or_recording() -> TestResult {
    let var = Variable::<i64>::builder("frozen")
        .dim(2)
        .trainable(false)
        .build()?;
    let store = Arc::new(var);
    let emb = Embedding::new(Arc::clone(&store), EmbeddingConfig::default())?;
    let out = emb.forward_train(&Tensor::new(&[5_i64, 6], &Device::Cpu)?)?;
    assert_eq!(out.to_vec2::<f32>()?, [[0.0, 0.0], [0.0, 0.0]]);
    assert_eq!(store.size(), 0);
    assert_eq!(emb.recorded_batches(), 0);
    Ok(())
}

#[test]
fn bad_input_is_an_error_not_a_panic() -> TestResult {
    let (store, _) = table("bad", DIM)?;
    let emb = Embedding::new(Arc::clone(&store), EmbeddingConfig::default())?;
    let floats = Tensor::new(&[1.0_f32, 2.0], &Device::Cpu)?;
    assert!(emb.forward_train(&floats).is_err());
    assert!(emb.forward_inference(&floats).is_err());
    assert!(emb.forward_t(&floats, true).is_err());
    let negative = Tensor::new(&[-1_i64], &Device::Cpu)?;
    let u32_store = Arc::new(Variable::<u32>::builder("u32").dim(2).build()?);
    let u32_emb = Embedding::new(u32_store, EmbeddingConfig::default())?;
    assert!(u32_emb.forward_train(&negative).is_err());
    assert!(Ids::new(vec![1_i64, 2, 3], &[2, 2]).is_err());
    assert_eq!(emb.recorded_batches(), 0);
    assert_eq!(store.size(), VOCAB);

    // Not a normal positive number: a subnormal bound would make the
    // gradient of a short row infinite.
    for max_norm in [
        0.0,
        -1.0,
        f32::NAN,
        f32::INFINITY,
        1e-45,
        f32::MIN_POSITIVE / 2.0,
    ] {
        let config = EmbeddingConfig {
            max_norm: Some(max_norm),
            ..Default::default()
        };
        assert!(Embedding::new(Arc::clone(&store), config).is_err());
    }
    for regularizer in [Regularizer::l1(-0.1), Regularizer::l2(f32::NAN)] {
        let config = EmbeddingConfig {
            regularizer: Some(regularizer),
            ..Default::default()
        };
        assert!(Embedding::new(Arc::clone(&store), config).is_err());
    }
    Ok(())
}

#[test]
fn layers_can_be_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Embedding<Variable<i64>>>();
    send_sync::<SparseStep<ParamsAdam>>();
}

#[test]
fn forward_concat_is_forward_flattened_in_values_and_training() -> TestResult {
    for shape in [vec![6], vec![4, 3], vec![2, 3, 2]] {
        let (flat_store, _) = table("flat", DIM)?;
        let (concat_store, _) = table("concat", DIM)?;
        let flat = Embedding::new(Arc::clone(&flat_store), EmbeddingConfig::default())?;
        let concat = Embedding::new(Arc::clone(&concat_store), EmbeddingConfig::default())?;
        let sgd = || SparseSgd::new(ParamsSgd { lr: 0.3 });
        let (flat_step, concat_step) = (SparseStep::new(sgd()?), SparseStep::new(sgd()?));
        let width = shape[1..].iter().product::<usize>() * DIM;
        let weights: Vec<f32> = (0..shape[0] * width).map(|i| value(3, i)).collect();
        let weights = Tensor::from_vec(weights, (shape[0], width), &Device::Cpu)?;
        let mut unused = SGD::new(vec![], 0.1)?;
        for step in 0..3 {
            let ids = batch_ids(step, &shape)?;
            let a = flat.forward(&ids, true)?.flatten_from(1)?;
            let b = concat.forward_concat(&ids, true)?;
            assert_eq!(b.dims(), [shape[0], width], "{shape:?}");
            assert_eq!(
                a.flatten_all()?.to_vec1::<f32>()?,
                b.flatten_all()?.to_vec1::<f32>()?
            );
            let (la, lb) = ((a * &weights)?.sum_all()?, (b * &weights)?.sum_all()?);
            assert_eq!(la.to_scalar::<f32>()?, lb.to_scalar::<f32>()?);
            flat_step.backward_step(&la, &mut unused, &[&flat])?;
            concat_step.backward_step(&lb, &mut unused, &[&concat])?;
        }
        let keys: Vec<i64> = (0..VOCAB as i64).collect();
        assert_eq!(rows_of(&flat_store, &keys)?, rows_of(&concat_store, &keys)?);
        let ids = batch_ids(9, &shape)?;
        assert_eq!(
            flat.forward(&ids, false)?
                .flatten_from(1)?
                .to_vec2::<f32>()?,
            concat.forward_concat(&ids, false)?.to_vec2::<f32>()?
        );
    }
    let (store, _) = table("scalar", DIM)?;
    let emb = Embedding::new(store, EmbeddingConfig::default())?;
    let scalar = Tensor::new(3_i64, &Device::Cpu)?;
    assert!(emb.forward_concat(&scalar, false).is_err());
    let empty = Tensor::zeros((0, 5), DType::I64, &Device::Cpu)?;
    assert_eq!(emb.forward_concat(&empty, true)?.dims(), [0, 5 * DIM]);
    Ok(())
}

#[test]
fn extreme_max_norms_train_with_finite_rows_and_gradients() -> TestResult {
    // TensorFlow's clip gives [inf, inf, 0] for f32::MAX on [3, 4, 0], NaN
    // for 1e30 on rows of +-1e20, and infinities for squares that overflow.
    let cases: [([f32; 3], f32); 4] = [
        ([3.0, 4.0, 0.0], f32::MAX),
        ([1e20, -1e20, 1e20], 1e30),
        ([3e38, -3e38, 1.0], f32::MAX),
        ([3e19, -4e19, 0.0], 2.0),
    ];
    for (row, c) in cases {
        let var = Variable::<i64>::builder("extreme").dim(3).build()?;
        var.upsert(&[1], &row)?;
        let store = Arc::new(var);
        let config = EmbeddingConfig {
            max_norm: Some(c),
            ..Default::default()
        };
        let emb = Embedding::new(Arc::clone(&store), config)?;
        let out = emb.forward_train(&Tensor::new(&[1_i64, 1], &Device::Cpu)?)?;
        let values = out.flatten_all()?.to_vec1::<f32>()?;
        assert!(
            values.iter().all(|x| x.is_finite()),
            "{row:?} at {c}: {values:?}"
        );
        let w = Tensor::new(&[[0.5_f32, -1.0, 0.25], [1.0, 1.0, 1.0]], &Device::Cpu)?;
        let loss = (out * w)?.sum_all()?;
        let grads = loss.backward()?;
        let rows = emb.recorded_vars().pop().ok_or("a batch")?;
        let grad = grads.get(&rows).ok_or("a gradient")?;
        let grad = grad.flatten_all()?.to_vec1::<f32>()?;
        assert!(
            grad.iter().all(|g| g.is_finite()),
            "{row:?} at {c}: {grad:?}"
        );
        SparseStep::new(SparseSgd::new(ParamsSgd { lr: 1e-3 })?).step(&grads, &[&emb])?;
        let mut after = [0.0_f32; 3];
        store.lookup(&[1], &mut after)?;
        assert!(after.iter().all(|x| x.is_finite()), "{after:?}");
    }
    Ok(())
}
