//! Training behaviour beyond the formulas: bad input, steps over several
//! tables, schedules, saving and resuming, restrict after training, and
//! many threads applying at once.

use dynemb::{Error, Initializer, RestrictPolicy, Variable};
use dynemb_optim::*;
use std::sync::Arc;
use std::thread;

fn var<K: dynemb::Key>(name: &str, dim: usize, shards: usize) -> Variable<K> {
    Variable::<K>::builder(name)
        .dim(dim)
        .shards(shards)
        .initializer(Initializer::TruncatedNormal {
            mean: 0.0,
            stddev: 0.3,
            seed: 11,
        })
        .build()
        .unwrap()
}

/// Everything a variable holds: keys, rows and every slot's rows.
fn snapshot(v: &Variable<i64>) -> (Vec<i64>, Vec<f32>, Vec<Vec<f32>>) {
    let (mut keys, _) = v.export().unwrap();
    keys.sort_unstable();
    let mut rows = vec![0.0; keys.len() * v.dim()];
    v.lookup(&keys, &mut rows).unwrap();
    let slots = v
        .slot_names()
        .iter()
        .map(|name| {
            let mut out = vec![0.0; keys.len() * v.dim()];
            v.lookup_slot(v.slot_id(name).unwrap(), &keys, &mut out)
                .unwrap();
            out
        })
        .collect();
    (keys, rows, slots)
}

#[test]
fn bad_gradients_are_errors_that_change_nothing() {
    let v = var::<i64>("emb", 4, 2);
    let opt = SparseAdam::new(ParamsAdam::default()).unwrap();
    v.upsert(&[1], &[0.5; 4]).unwrap();
    let before = snapshot(&v);
    let err = opt.apply(&v, &[1, 2], &[0.1; 7]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LengthMismatch {
                what: "grads",
                expected: 8,
                actual: 7
            }
        ),
        "{err}"
    );
    let mut grads = vec![0.1; 8];
    grads[6] = f32::NAN;
    let err = opt.apply(&v, &[1, 2], &grads).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NonFinite {
                what: "grads",
                index: 6,
                ..
            }
        ),
        "{err}"
    );
    grads[6] = f32::INFINITY;
    assert!(opt.apply(&v, &[1, 2], &grads).is_err());
    assert_eq!(snapshot(&v), before, "no row, slot or key changed");
    assert!(v.slot_names().is_empty(), "no slot was created");
}

#[test]
fn invalid_hyperparameters_are_errors_from_new() {
    let bad: Vec<(&str, Result<(), Error>)> = vec![
        (
            "negative lr",
            SparseSgd::new(ParamsSgd { lr: -0.1 }).map(drop),
        ),
        (
            "nan lr",
            SparseSgd::new(ParamsSgd { lr: f32::NAN }).map(drop),
        ),
        (
            "beta1 = 1",
            SparseAdam::new(ParamsAdam {
                beta1: 1.0,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "beta2 < 0",
            SparseAdamW::new(ParamsAdamW {
                beta2: -0.1,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "eps = 0",
            SparseAdam::new(ParamsAdam {
                eps: 0.0,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "adamax eps < 0",
            SparseAdamax::new(ParamsAdamax {
                eps: -1.0,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "lr_power > 0",
            SparseFtrl::new(ParamsFtrl {
                lr_power: 0.5,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "l1 < 0",
            SparseFtrl::new(ParamsFtrl {
                l1: -0.1,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "l2 < 0",
            SparseFtrl::new(ParamsFtrl {
                l2: -0.1,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "ftrl accum 0",
            SparseFtrl::new(ParamsFtrl {
                initial_accumulator_value: 0.0,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "adagrad accum < 0",
            SparseAdagrad::new(ParamsAdagrad {
                initial_accumulator_value: -1.0,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "adagrad eps 0",
            SparseAdagrad::new(ParamsAdagrad {
                eps: 0.0,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "rho = 1",
            SparseRmsProp::new(ParamsRmsProp {
                rho: 1.0,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "adadelta eps 0",
            SparseAdadelta::new(ParamsAdadelta {
                eps: 0.0,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "momentum > 1",
            SparseMomentum::new(ParamsMomentum {
                momentum: 1.5,
                ..Default::default()
            })
            .map(drop),
        ),
        (
            "weight decay < 0",
            SparseAdamW::new(ParamsAdamW {
                weight_decay: -0.1,
                ..Default::default()
            })
            .map(drop),
        ),
    ];
    for (what, result) in bad {
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "{what}: {result:?}"
        );
    }
    let opt = SparseSgd::new(ParamsSgd::default()).unwrap();
    assert!(opt.set_lr(-1.0).is_err());
    assert_eq!(opt.params().lr, 0.01);
}

#[test]
fn a_slot_with_another_initial_value_is_a_mismatch() {
    let v = var::<i64>("emb", 4, 1);
    v.create_slot("accumulator", 0.5).unwrap();
    let opt = SparseAdagrad::new(ParamsAdagrad::default()).unwrap();
    let err = opt.apply(&v, &[1], &[0.1; 4]).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    assert_eq!(v.size(), 0);
}

#[test]
fn one_step_over_tables_of_several_key_types_advances_the_step_once() {
    let users = var::<i64>("users", 4, 2);
    let items = var::<u32>("items", 8, 1);
    let opt = SparseAdam::new(ParamsAdam {
        lr: 0.1,
        ..Default::default()
    })
    .unwrap();
    let step = opt.begin_step().unwrap();
    assert_eq!((step.t(), opt.steps()), (1, 1));
    step.apply(&users, &[-1, 5], &[0.2; 8]).unwrap();
    step.apply(&items, &[7], &[0.2; 8]).unwrap();
    assert_eq!(opt.steps(), 1);
    // Both tables got t = 1: the same bias correction, so the same first
    // move (lr * sign(g) for Adam's first step, up to eps).
    let (mut u, mut i) = (vec![0.0; 4], vec![0.0; 8]);
    users.lookup(&[5], &mut u).unwrap();
    items.lookup(&[7], &mut i).unwrap();
    let (mut u0, mut i0) = (vec![0.0; 4], vec![0.0; 8]);
    var::<i64>("users", 4, 2).lookup(&[5], &mut u0).unwrap();
    var::<u32>("items", 8, 1).lookup(&[7], &mut i0).unwrap();
    assert!((u0[0] - u[0] - 0.1).abs() < 1e-5 && (i0[0] - i[0] - 0.1).abs() < 1e-5);
    opt.apply(&users, &[5], &[0.2; 4]).unwrap();
    assert_eq!(opt.steps(), 2);
}

#[test]
fn learning_rate_changes_between_steps_and_follows_schedules() {
    let v = var::<i64>("emb", 1, 1);
    v.upsert(&[1], &[0.0]).unwrap();
    let opt = SparseSgd::new(ParamsSgd { lr: 1.0 }).unwrap();
    opt.apply(&v, &[1], &[1.0]).unwrap(); // -1
    opt.set_lr(0.5).unwrap();
    opt.apply(&v, &[1], &[1.0]).unwrap(); // -1.5
    opt.set_learning_rate(LearningRate::PiecewiseConstant {
        boundaries: vec![2, 3],
        values: vec![9.0, 0.25, 0.125],
    })
    .unwrap();
    assert_eq!(opt.current_lr(), 9.0, "steps taken: 2 <= boundary 2");
    opt.apply(&v, &[1], &[1.0]).unwrap(); // -10.5
    opt.apply(&v, &[1], &[1.0]).unwrap(); // -10.75 (3 steps taken)
    opt.apply(&v, &[1], &[1.0]).unwrap(); // -10.875
    let mut out = [0.0];
    v.lookup(&[1], &mut out).unwrap();
    assert_eq!(out[0], -10.875);
    assert!(opt
        .set_learning_rate(LearningRate::ExponentialDecay {
            decay_steps: 0,
            decay_rate: 0.5,
            staircase: false
        })
        .is_err());
}

/// Trains `steps` Adam steps on `v` from a deterministic stream starting at
/// step `from`.
fn train(opt: &SparseAdam, v: &Variable<i64>, from: u64, steps: u64) {
    for s in from..from + steps {
        let keys: Vec<i64> = (0..64)
            .map(|i| ((i * 7 + s * 13) % 97) as i64 - 20)
            .collect();
        let grads: Vec<f32> = (0..keys.len() * v.dim())
            .map(|i| ((i as u64 * 31 + s * 17) % 23) as f32 / 11.0 - 1.0)
            .collect();
        opt.apply(v, &keys, &grads).unwrap();
    }
}

#[test]
fn saving_and_resuming_is_bit_identical_to_training_straight_through() {
    let dir = tempfile::tempdir().unwrap();
    let params = ParamsAdam {
        lr: 0.05,
        amsgrad: true,
        ..Default::default()
    };
    let schedule = LearningRate::ExponentialDecay {
        decay_steps: 4,
        decay_rate: 0.7,
        staircase: false,
    };
    let straight = var::<i64>("emb", 12, 2);
    let opt = SparseAdam::new(params).unwrap();
    opt.set_learning_rate(schedule.clone()).unwrap();
    train(&opt, &straight, 0, 20);

    let first = var::<i64>("emb", 12, 2);
    let opt1 = SparseAdam::new(params).unwrap();
    opt1.set_learning_rate(schedule).unwrap();
    train(&opt1, &first, 0, 10);
    first.save(dir.path().join("emb")).unwrap();
    opt1.save_state(dir.path().join("adam.json")).unwrap();

    // Fresh objects, default settings: the state brings them back.
    let resumed = var::<i64>("emb", 12, 3);
    resumed.restore(dir.path().join("emb")).unwrap();
    let opt2 = SparseAdam::new(ParamsAdam::default()).unwrap();
    opt2.restore_state(dir.path().join("adam.json")).unwrap();
    assert_eq!((opt2.steps(), opt2.params()), (10, params));
    train(&opt2, &resumed, 10, 10);
    assert_eq!(snapshot(&resumed), snapshot(&straight));

    // Another optimizer's state is refused and changes nothing.
    let sgd = SparseSgd::new(ParamsSgd::default()).unwrap();
    let err = sgd.restore_state(dir.path().join("adam.json")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the optimizer state holds SparseAdam's state; SparseSgd was asked to restore it"
    );
    assert!(
        matches!(&err, Error::WrongOptimizer { holds, requested }
            if holds == "SparseAdam" && requested == "SparseSgd"),
        "{err}"
    );
    assert_eq!(sgd.steps(), 0);
    assert!(opt2.restore_state_json("{ not json").is_err());
    let bad = opt2.state_json().replace("\"lr\": 0.05", "\"lr\": -1.0");
    assert!(opt2.restore_state_json(&bad).is_err());
    assert_eq!(opt2.steps(), 20);
}

#[test]
fn restrict_after_training_removes_rows_with_their_slots() {
    let v = Variable::<i64>::builder("emb")
        .dim(4)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let opt = SparseAdagrad::new(ParamsAdagrad {
        lr: 0.1,
        ..Default::default()
    })
    .unwrap();
    // Key k is trained k times.
    for round in 0..10 {
        let keys: Vec<i64> = (round..10).collect();
        opt.apply(&v, &keys, &vec![1.0; keys.len() * 4]).unwrap();
    }
    let removed = v.restrict(3, 5).unwrap();
    assert_eq!((removed, v.size()), (7, 3));
    let (mut keys, _) = v.export().unwrap();
    keys.sort_unstable();
    assert_eq!(keys, [7, 8, 9], "the most trained stay");
    // A removed key comes back with a fresh accumulator.
    let acc = v.slot_id("accumulator").unwrap();
    opt.apply(&v, &[0], &[1.0; 4]).unwrap();
    let mut out = [0.0; 4];
    v.lookup_slot(acc, &[0], &mut out).unwrap();
    assert_eq!(out, [1.1; 4]);
    v.lookup_slot(acc, &[9], &mut out).unwrap();
    assert!((out[0] - 10.1).abs() < 1e-5);
}

#[test]
fn four_threads_of_sgd_on_overlapping_keys_lose_no_update() {
    let v = Arc::new(var::<i64>("emb", 8, 3));
    v.upsert(&(0..100).collect::<Vec<_>>(), &vec![0.0; 800])
        .unwrap();
    let opt = Arc::new(SparseSgd::new(ParamsSgd { lr: 1.0 }).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (v, opt) = (Arc::clone(&v), Arc::clone(&opt));
            thread::spawn(move || {
                for s in 0..500 {
                    // Overlapping keys with repeats; every gradient -1, so
                    // each occurrence adds exactly 1.
                    let keys: Vec<i64> = (0..50).map(|i| (i * 3 + s + t) % 100).collect();
                    opt.apply(&*v, &keys, &vec![-1.0; keys.len() * 8]).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut expected = vec![0.0_f32; 100];
    for t in 0..4 {
        for s in 0..500 {
            for i in 0..50 {
                expected[((i * 3 + s + t) % 100) as usize] += 1.0;
            }
        }
    }
    let mut rows = vec![0.0; 800];
    v.lookup(&(0..100).collect::<Vec<_>>(), &mut rows).unwrap();
    for k in 0..100 {
        assert!(
            rows[k * 8..(k + 1) * 8].iter().all(|&x| x == expected[k]),
            "key {k}"
        );
    }
    assert_eq!(opt.steps(), 2000);
}

#[test]
fn four_threads_of_adam_leave_no_torn_row() {
    // Every gradient of a step is the same in every column, so every row's
    // columns and every slot's columns must stay equal to one another: a
    // torn update would make them differ.
    let v = Arc::new(
        Variable::<i64>::builder("emb")
            .dim(24)
            .shards(2)
            .build()
            .unwrap(),
    );
    let opt = Arc::new(
        SparseAdam::new(ParamsAdam {
            lr: 0.01,
            ..Default::default()
        })
        .unwrap(),
    );
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (v, opt) = (Arc::clone(&v), Arc::clone(&opt));
            thread::spawn(move || {
                let mut rows = vec![0.0; 40 * 24];
                for s in 0..300 {
                    let keys: Vec<i64> = (0..40).map(|i| (i * 5 + s * 3 + t) % 60).collect();
                    let g = ((s + t) % 7) as f32 - 3.0;
                    opt.apply(&*v, &keys, &vec![g; keys.len() * 24]).unwrap();
                    v.lookup(&keys, &mut rows).unwrap();
                    for row in rows.chunks(24) {
                        assert!(row.iter().all(|&x| x == row[0]), "torn row {row:?}");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let (keys, values) = v.export().unwrap();
    assert_eq!(keys.len(), 60);
    for name in ["m", "v"] {
        let mut out = vec![0.0; values.len()];
        v.lookup_slot(v.slot_id(name).unwrap(), &keys, &mut out)
            .unwrap();
        for row in out.chunks(24) {
            assert!(row.iter().all(|&x| x == row[0]), "torn {name} row");
        }
    }
    // v is a decayed sum of squares: never negative, and 0 only if untouched.
    let mut second = vec![0.0; values.len()];
    v.lookup_slot(v.slot_id("v").unwrap(), &keys, &mut second)
        .unwrap();
    assert!(second.iter().all(|&x| x >= 0.0));
}

#[test]
fn a_step_that_would_overflow_a_row_leaves_it_and_names_its_batch_position() {
    let v = var::<i64>("emb", 3, 2);
    v.upsert(&[1, 5], &[3e38, 3e38, 3e38, 0.0, 0.0, 0.0])
        .unwrap();
    let opt = SparseSgd::new(ParamsSgd { lr: 1.0 }).unwrap();
    // Key 1 (first at position 1) would become 6e38: infinity in f32.
    let keys = [5_i64, 1, 1, 9];
    let grads = [
        -1.0, -1.0, -1.0, -3e38, -3e38, -3e38, 0.0, 0.0, 0.0, -2.0, -2.0, -2.0,
    ];
    let err = opt.apply(&v, &keys, &grads).unwrap_err();
    assert!(matches!(err, Error::NonFinite { index: 1, .. }), "{err}");
    let mut rows = vec![0.0; 9];
    v.lookup(&[1, 5, 9], &mut rows).unwrap();
    assert_eq!(&rows[..3], &[3e38; 3], "the overflowing row is not stored");
    assert_eq!(&rows[3..6], &[1.0; 3], "other rows are");
    let mut init = vec![0.0; 3];
    var::<i64>("emb", 3, 2).lookup(&[9], &mut init).unwrap();
    assert_eq!(
        &rows[6..],
        &init.iter().map(|x| x + 2.0).collect::<Vec<_>>()[..]
    );
}

#[test]
fn a_refused_batch_takes_no_step_and_creates_no_slot() {
    let v = var::<i64>("emb", 1, 1);
    let opt = SparseAdam::new(ParamsAdam {
        lr: 0.1,
        ..Default::default()
    })
    .unwrap();
    assert!(opt.apply(&v, &[1], &[0.1, 0.1]).is_err());
    assert!(opt.apply(&v, &[1], &[f32::INFINITY]).is_err());
    v.create_slot("v", 0.5).unwrap();
    let err = opt.apply(&v, &[1], &[1.0]).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    assert_eq!(opt.steps(), 0, "no step was taken");
    assert_eq!(
        v.slot_names(),
        ["v"],
        "m was not created before the mismatch"
    );
}

#[test]
fn variables_that_are_not_trainable_are_refused() {
    let v = Variable::<i64>::builder("frozen")
        .dim(2)
        .trainable(false)
        .build()
        .unwrap();
    v.upsert(&[1], &[1.0, 1.0]).unwrap();
    let opt = SparseSgd::new(ParamsSgd { lr: 1.0 }).unwrap();
    let err = opt.apply(&v, &[1], &[1.0, 1.0]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let mut row = [0.0; 2];
    v.lookup(&[1], &mut row).unwrap();
    assert_eq!(row, [1.0, 1.0]);
    assert_eq!(opt.steps(), 0);
}

#[test]
fn a_schedule_reaching_a_rate_the_rule_refuses_stops_before_the_step() {
    let v = var::<i64>("emb", 2, 1);
    let opt = SparseFtrl::new(ParamsFtrl {
        lr: 0.1,
        ..Default::default()
    })
    .unwrap();
    opt.set_learning_rate(LearningRate::PiecewiseConstant {
        boundaries: vec![1],
        values: vec![0.1, 0.0],
    })
    .unwrap();
    opt.apply(&v, &[1], &[0.5, 0.5]).unwrap();
    opt.apply(&v, &[1], &[0.5, 0.5]).unwrap();
    let err = opt.apply(&v, &[1], &[0.5, 0.5]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(opt.steps(), 2);
}

#[test]
fn hostile_state_is_refused() {
    let opt = SparseAdam::new(ParamsAdam::default()).unwrap();
    let huge = opt
        .state_json()
        .replace("\"step\": 0", &format!("\"step\": {}", u64::MAX));
    assert!(opt.restore_state_json(&huge).is_err());
    opt.set_learning_rate(LearningRate::ExponentialDecay {
        decay_steps: 10,
        decay_rate: 0.5,
        staircase: false,
    })
    .unwrap();
    let typo = opt.state_json().replace(
        "\"staircase\": false",
        "\"staircase\": false, \"stair_case\": true",
    );
    assert_ne!(typo, opt.state_json());
    assert!(opt.restore_state_json(&typo).is_err());
    assert_eq!(opt.steps(), 0);
}
