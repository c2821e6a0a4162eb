//! Random sequences of optimizer steps (`dynemb-optim`) on a `Variable`
//! against a dense model, compared bit for bit after every step.
//!
//! The input picks an optimizer and its variant (every `Sparse*` type,
//! AMSGrad, Nesterov, centered and momentum RMSprop, FTRL with and without
//! regularization), a dim (1, 3, 8, 17), 1 to 4 shards and a list of
//! batches: keys from a small set (so batches repeat keys and steps revisit
//! rows), gradients from small values, zeros, subnormals and extreme but
//! finite ones (up to ±3e38, so rows and slots overflow).
//!
//! The model is a `HashMap` from key to value row and slot rows. Per step
//! it sums each key's gradient rows in batch order (the first occurrence's
//! row, then each later one added), reads a missing key's initial row with
//! `lookup` (which never inserts), and runs the optimizer's own row kernel
//! (`Rule::prepare` and `Rule::update`: the formulas are checked against
//! TensorFlow by the crate's tests; this target checks the driver: dedup,
//! sharding, insertion, slots, lazy rows, overflow handling). A row whose
//! update leaves a non-finite value or slot is not stored and the step
//! returns `NonFinite` naming the batch position of the first such key's
//! first occurrence; every other row is stored. After every step the
//! variable's size, every row and every slot row equal the model's exactly.

#![no_main]

use arbitrary::Arbitrary;
use dynemb::{Error, Initializer, Variable};
use dynemb_optim::*;
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

const DIMS: [usize; 4] = [1, 3, 8, 17];
const MAX_STEPS: usize = 24;
const MAX_BATCH: usize = 48;

#[derive(Debug, Arbitrary)]
enum Choice {
    Sgd,
    Momentum { nesterov: bool },
    Adagrad,
    Adam { amsgrad: bool },
    AdamW { amsgrad: bool },
    Adamax,
    Adadelta,
    Ftrl { regularized: bool, power: bool },
    RmsProp { momentum: bool, centered: bool },
}

#[derive(Debug, Arbitrary)]
enum Grad {
    Small(i8),
    Zero,
    Tiny,
    Huge(bool),
    Max(bool),
}

impl Grad {
    fn value(&self) -> f32 {
        match *self {
            Grad::Small(x) => f32::from(x) / 16.0,
            Grad::Zero => 0.0,
            Grad::Tiny => 1e-40,
            Grad::Huge(negative) => {
                if negative {
                    -1e30
                } else {
                    1e30
                }
            }
            Grad::Max(negative) => {
                if negative {
                    -3e38
                } else {
                    3e38
                }
            }
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    choice: Choice,
    dim: u8,
    shards: u8,
    steps: Vec<(Vec<(u8, Grad)>, bool)>,
}

/// The model's state of one key: value row and slot rows back to back.
type Rows = (Vec<f32>, Vec<f32>);

fn run<R: Rule>(params: R, input: &Input) {
    let dim = DIMS[input.dim as usize % DIMS.len()];
    let shards = 1 + input.shards as usize % 4;
    let var = Variable::<i64>::builder("emb")
        .dim(dim)
        .shards(shards)
        .initializer(Initializer::RandomUniform {
            low: -1.0,
            high: 1.0,
            seed: 5,
        })
        .build()
        .unwrap();
    let opt = Sparse::new(params.clone()).unwrap();
    let slots = params.slots();
    let mut model: HashMap<i64, Rows> = HashMap::new();
    for (batch, schedule) in input.steps.iter().take(MAX_STEPS) {
        let batch = &batch[..batch.len().min(MAX_BATCH)];
        let keys: Vec<i64> = batch.iter().map(|(k, _)| i64::from(*k % 24) - 8).collect();
        let grads: Vec<f32> = batch
            .iter()
            .flat_map(|(_, g)| std::iter::repeat_n(g.value(), dim))
            .enumerate()
            .map(|(i, g)| {
                if g.abs() < 1.0 {
                    g * (1.0 + (i % 3) as f32)
                } else {
                    g
                }
            })
            .collect();
        if *schedule {
            opt.set_lr(opt.params().lr() * 0.5).unwrap();
        }
        // The model's step, with the same t and learning rate.
        let consts = opt.params().prepare(opt.steps() + 1, opt.current_lr());
        let mut order: Vec<(i64, usize, Vec<f32>)> = Vec::new();
        for (i, (k, g)) in keys.iter().zip(grads.chunks(dim)).enumerate() {
            match order.iter_mut().find(|(key, _, _)| key == k) {
                Some((_, _, sum)) => sum.iter_mut().zip(g).for_each(|(s, g)| *s += g),
                None => order.push((*k, i, g.to_vec())),
            }
        }
        let mut expected_error = None;
        for (key, first, g) in &order {
            let (mut value, mut slot_rows) = match model.get(key) {
                Some(rows) => rows.clone(),
                None => {
                    let mut row = vec![0.0; dim];
                    var.lookup(&[*key], &mut row).unwrap();
                    let s = slots
                        .iter()
                        .flat_map(|&(_, init)| vec![init; dim])
                        .collect();
                    (row, s)
                }
            };
            R::update(&consts, g, &mut value, &mut slot_rows);
            if value.iter().chain(&slot_rows).all(|x| x.is_finite()) {
                model.insert(*key, (value, slot_rows));
            } else if expected_error.is_none() {
                expected_error = Some(*first);
            }
        }
        match (opt.apply(&var, &keys, &grads), expected_error) {
            (Ok(()), None) => {}
            (Err(Error::NonFinite { index, .. }), Some(first)) => assert_eq!(index, first),
            (got, expected) => {
                panic!("step returned {got:?}, model expected an overflow at {expected:?}")
            }
        }
        compare(&var, &model, &slots, dim);
    }
}

fn compare(var: &Variable<i64>, model: &HashMap<i64, Rows>, slots: &[(&str, f32)], dim: usize) {
    assert_eq!(var.size(), model.len());
    let keys: Vec<i64> = model.keys().copied().collect();
    let mut rows = vec![0.0; keys.len() * dim];
    var.lookup(&keys, &mut rows).unwrap();
    for (i, k) in keys.iter().enumerate() {
        let got = &rows[i * dim..(i + 1) * dim];
        assert!(
            bits_eq(got, &model[k].0),
            "key {k}: {got:?} vs {:?}",
            model[k].0
        );
    }
    for (s, (name, _)) in slots.iter().enumerate() {
        let mut out = vec![0.0; keys.len() * dim];
        var.lookup_slot(var.slot_id(name).unwrap(), &keys, &mut out)
            .unwrap();
        for (i, k) in keys.iter().enumerate() {
            let expected = &model[k].1[s * dim..(s + 1) * dim];
            assert!(
                bits_eq(&out[i * dim..(i + 1) * dim], expected),
                "key {k} slot {name}"
            );
        }
    }
}

fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fuzz_target!(|input: Input| {
    match input.choice {
        Choice::Sgd => run(ParamsSgd { lr: 0.5 }, &input),
        Choice::Momentum { nesterov } => run(
            ParamsMomentum {
                lr: 0.1,
                momentum: 0.9,
                nesterov,
            },
            &input,
        ),
        Choice::Adagrad => run(
            ParamsAdagrad {
                lr: 0.1,
                ..Default::default()
            },
            &input,
        ),
        Choice::Adam { amsgrad } => run(
            ParamsAdam {
                lr: 0.1,
                amsgrad,
                ..Default::default()
            },
            &input,
        ),
        Choice::AdamW { amsgrad } => run(
            ParamsAdamW {
                lr: 0.1,
                amsgrad,
                weight_decay: 0.1,
                ..Default::default()
            },
            &input,
        ),
        Choice::Adamax => run(
            ParamsAdamax {
                lr: 0.1,
                ..Default::default()
            },
            &input,
        ),
        Choice::Adadelta => run(
            ParamsAdadelta {
                lr: 1.0,
                ..Default::default()
            },
            &input,
        ),
        Choice::Ftrl { regularized, power } => run(
            ParamsFtrl {
                lr: 0.1,
                lr_power: if power { -0.7 } else { -0.5 },
                l1: if regularized { 0.01 } else { 0.0 },
                l2: if regularized { 0.1 } else { 0.0 },
                l2_shrinkage: if regularized { 0.05 } else { 0.0 },
                beta: if regularized { 0.2 } else { 0.0 },
                ..Default::default()
            },
            &input,
        ),
        Choice::RmsProp { momentum, centered } => run(
            ParamsRmsProp {
                lr: 0.05,
                momentum: if momentum { 0.5 } else { 0.0 },
                centered,
                ..Default::default()
            },
            &input,
        ),
    }
});
