//! Every "checked before anything changes" promise of this crate, each
//! proved by making its last check fail and asserting that nothing
//! changed: rows, slots (none created, none orphaned), scores, the step
//! count, the optimizer's state.
//!
//! - `SparseOptimizer::apply`: trainable, lengths, finite gradients, the
//!   slots' initial values, room for missing slots, then (last) that the
//!   next step can begin;
//! - `check_step`: the same input checks, then (last) room for the slots;
//! - `Step::apply` inside a begun step: the input, then (last) slot
//!   creation, all or nothing;
//! - `Sparse::begin_step` and `check_next_step`: the schedule's rate and
//!   the step count;
//! - `Sparse::restore_state_json`: the optimizer, the JSON, the
//!   hyperparameters, the schedule, then (last) the step count;
//! - `Sparse::set_lr` and `set_learning_rate`: validated before stored.

use dynemb::{Error, RestrictPolicy, Variable, MAX_SLOTS};
use dynemb_optim::*;

const DIM: usize = 2;

fn var(name: &str) -> Variable<i64> {
    let v = Variable::<i64>::builder(name)
        .dim(DIM)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    v.upsert(&[1, 2, 3], &[0.5, -0.5, 1.0, 2.0, -3.0, 0.25])
        .unwrap();
    v
}

/// A variable holding `count` slots that no optimizer here uses.
fn with_slots(name: &str, count: usize) -> Variable<i64> {
    let v = var(name);
    for i in 0..count {
        v.create_slot(&format!("other{i}"), i as f32).unwrap();
    }
    v
}

/// Everything a variable holds: slot names, keys, rows, every slot's rows
/// and the scores.
type Snapshot = (Vec<String>, Vec<i64>, Vec<f32>, Vec<Vec<f32>>, Vec<u64>);

fn snapshot(v: &Variable<i64>) -> Snapshot {
    let (mut keys, _) = v.export().unwrap();
    keys.sort_unstable();
    let mut rows = vec![0.0; keys.len() * DIM];
    v.lookup(&keys, &mut rows).unwrap();
    let slots = v
        .slot_names()
        .iter()
        .map(|name| {
            let mut out = vec![0.0; keys.len() * DIM];
            v.lookup_slot(v.slot_id(name).unwrap(), &keys, &mut out)
                .unwrap();
            out
        })
        .collect();
    let mut scores = vec![0; keys.len()];
    v.lookup_scores(&keys, &mut scores).unwrap();
    (v.slot_names(), keys, rows, slots, scores)
}

const KEYS: [i64; 3] = [1, 4, 1];
const GRADS: [f32; 6] = [0.1, -0.2, 0.3, 0.4, -0.5, 0.6];

fn adam() -> SparseAdam {
    SparseAdam::new(ParamsAdam::default()).unwrap()
}

fn assert_room_error(err: &Error) {
    let message = err.to_string();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && message.contains("would make 9"),
        "{message}"
    );
}

#[test]
fn apply_without_room_for_the_slots_changes_nothing() {
    // Adam needs `m` and `v`; 7 of 8 columns are taken.
    let v = with_slots("seven", MAX_SLOTS - 1);
    let before = snapshot(&v);
    let opt = adam();
    let err = opt.apply(&v, &KEYS, &GRADS).unwrap_err();
    assert_room_error(&err);
    assert_eq!(snapshot(&v), before, "no row, slot or score changed");
    assert!(v.slot_id("m").is_err(), "no orphan slot");
    assert_eq!(opt.steps(), 0);
    // One slot fits: Adagrad trains the same table.
    let adagrad = SparseAdagrad::new(ParamsAdagrad::default()).unwrap();
    adagrad.apply(&v, &KEYS, &GRADS).unwrap();
    assert_eq!(v.slot_names().len(), MAX_SLOTS);
    assert_eq!(adagrad.steps(), 1);
}

#[test]
fn check_step_without_room_changes_nothing() {
    let v = with_slots("check", MAX_SLOTS - 1);
    let before = snapshot(&v);
    let err = check_step(&ParamsAdam::default(), &v, &KEYS, &GRADS).unwrap_err();
    assert_room_error(&err);
    assert_eq!(snapshot(&v), before);
    // With its slots already there, a full table passes.
    let full = with_slots("full", MAX_SLOTS - 2);
    adam().apply(&full, &KEYS, &GRADS).unwrap();
    check_step(&ParamsAdam::default(), &full, &KEYS, &GRADS).unwrap();
}

#[test]
fn a_step_over_two_tables_checks_both_before_it_begins() {
    let first = var("first");
    let second = with_slots("second", MAX_SLOTS - 1);
    let (first_before, second_before) = (snapshot(&first), snapshot(&second));
    let opt = adam();
    let params = opt.params();
    let checked = check_step(&params, &first, &KEYS, &GRADS)
        .and_then(|()| check_step(&params, &second, &KEYS, &GRADS));
    assert_room_error(&checked.unwrap_err());
    assert_eq!(opt.steps(), 0);
    assert_eq!(snapshot(&first), first_before);
    assert_eq!(snapshot(&second), second_before);
}

#[test]
fn step_apply_creates_slots_all_or_nothing() {
    // A caller that did not check first: the step has begun, but the
    // full table gets no orphan slot and no row changes.
    let v = with_slots("begun", MAX_SLOTS - 1);
    let before = snapshot(&v);
    let opt = adam();
    let step = opt.begin_step().unwrap();
    assert_room_error(&step.apply(&v, &KEYS, &GRADS).unwrap_err());
    assert_eq!(snapshot(&v), before);
}

#[test]
fn apply_whose_next_step_cannot_begin_changes_nothing() {
    // FTRL refuses a rate of 0; the schedule gives it from the second step.
    let ftrl = SparseFtrl::new(ParamsFtrl {
        lr: 0.1,
        ..Default::default()
    })
    .unwrap();
    ftrl.set_learning_rate(LearningRate::PiecewiseConstant {
        boundaries: vec![0],
        values: vec![0.1, 0.0],
    })
    .unwrap();
    let trained = var("trained");
    ftrl.apply(&trained, &KEYS, &GRADS).unwrap();
    assert_eq!(ftrl.steps(), 1);
    // Every other check passes on a fresh table: the step's own is last.
    let fresh = var("fresh");
    let before = (snapshot(&fresh), snapshot(&trained));
    check_step(&ftrl.params(), &fresh, &KEYS, &GRADS).unwrap();
    let err = ftrl.apply(&fresh, &KEYS, &GRADS).unwrap_err();
    assert!(err.to_string().contains("schedule gives 0"), "{err}");
    assert!(fresh.slot_names().is_empty(), "no slot created");
    assert_eq!((snapshot(&fresh), snapshot(&trained)), before);
    assert_eq!(ftrl.steps(), 1);
    assert!(ftrl.check_next_step().is_err());
    assert!(ftrl.begin_step().is_err());
    assert_eq!(ftrl.steps(), 1, "a refused begin_step takes no step");
}

#[test]
fn each_earlier_check_of_apply_changes_nothing() {
    let opt = adam();
    let v = var("earlier");
    let frozen = Variable::<i64>::builder("frozen")
        .dim(DIM)
        .trainable(false)
        .build()
        .unwrap();
    v.create_slot("v", 0.5).unwrap();
    let before = snapshot(&v);
    let frozen_before = snapshot(&frozen);
    let mut nan = GRADS;
    nan[5] = f32::NAN;
    let errors = [
        opt.apply(&frozen, &KEYS, &GRADS).unwrap_err(),
        opt.apply(&v, &KEYS, &GRADS[..4]).unwrap_err(),
        opt.apply(&v, &KEYS, &nan).unwrap_err(),
        // `v` exists with another initial value than Adam's.
        opt.apply(&v, &KEYS, &GRADS).unwrap_err(),
    ];
    assert!(matches!(errors[3], Error::Mismatch { .. }), "{}", errors[3]);
    assert_eq!(snapshot(&v), before, "{errors:?}");
    assert_eq!(snapshot(&frozen), frozen_before);
    assert!(
        v.slot_id("m").is_err(),
        "no slot created beside the mismatch"
    );
    assert_eq!(opt.steps(), 0);
}

#[test]
fn restore_state_checks_the_whole_state_first() {
    let opt = adam();
    opt.set_learning_rate(LearningRate::ExponentialDecay {
        decay_steps: 3,
        decay_rate: 0.5,
        staircase: true,
    })
    .unwrap();
    opt.apply(&var("state"), &KEYS, &GRADS).unwrap();
    let state = opt.state_json();
    let mut json: serde_json::Value = serde_json::from_str(&state).unwrap();
    // Every field readable and valid but the last one checked: the step.
    json["params"]["lr"] = 0.5.into();
    json["step"] = (1_u64 << 62).into();
    let err = opt.restore_state_json(&json.to_string()).unwrap_err();
    assert!(err.to_string().contains("step"), "{err}");
    assert_eq!(opt.state_json(), state, "nothing restored");
    // Another optimizer's state says which optimizer it holds.
    let adagrad = SparseAdagrad::new(ParamsAdagrad::default()).unwrap();
    let before = adagrad.state_json();
    assert_eq!(
        adagrad.restore_state_json(&state).unwrap_err(),
        Error::WrongOptimizer {
            holds: "SparseAdam".into(),
            requested: "SparseAdagrad".into()
        }
    );
    assert_eq!(adagrad.state_json(), before);
}

#[test]
fn set_lr_and_schedules_are_checked_before_they_are_stored() {
    let opt = adam();
    let before = opt.state_json();
    assert!(opt.set_lr(-1.0).is_err());
    assert!(opt
        .set_learning_rate(LearningRate::ExponentialDecay {
            decay_steps: 0,
            decay_rate: 0.5,
            staircase: false,
        })
        .is_err());
    assert_eq!(opt.state_json(), before);
}

#[test]
fn a_file_that_is_no_optimizer_state_is_not_called_another_optimizers() {
    let opt = adam();
    let before = opt.state_json();
    // A checkpoint's index, a number, an object whose `optimizer` is not a
    // name: not states at all, so not a `WrongOptimizer`.
    for json in [
        r#"{"format": 1, "name": "emb", "dim": 8, "shards": []}"#,
        "42",
        r#"{"optimizer": 5, "params": {}, "step": 0}"#,
    ] {
        let err = opt.restore_state_json(json).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("not an optimizer state")),
            "{json}: {err:?}"
        );
        assert_eq!(opt.state_json(), before, "nothing restored");
    }
}
