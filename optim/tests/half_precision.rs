//! The optimizers on half-precision tables: every configuration of the
//! TensorFlow goldens (`golden/goldens.json`, made in f32 by real
//! TensorFlow, see `golden/README.md`) replayed with values and slots
//! stored as f16 or bf16, against the f32 goldens themselves.
//!
//! The optimizers compute in f32 on the widened rows; only what is stored
//! is rounded. So after step `t` every element `g` of the values and of
//! every slot must satisfy, against TensorFlow's `e`,
//!
//! ```text
//! |g - e| <= C * t * u * max(|e|, s)
//! ```
//!
//! where `u` is the unit roundoff of the coarser of the two dtypes (2^-11
//! for f16, 2^-8 for bf16), `s` the largest `|e|` of that column (the
//! values, or one slot) over the table after step `t`, and `C = 2` when
//! rounding to nearest even: the stored initial values are rounded once
//! (by at most `u`), and each step's result once more. Stochastic rounding
//! errs by up to a whole unit in the last place, `2u`, so it gets `C = 4`.
//! Measured on these goldens, the worst element reaches 0.60 of the
//! nearest-even bound (Adam's values in bf16, step 1) and 0.46 of the
//! stochastic one (Adadelta's `accum_var` in bf16); the worst of every case
//! is printed with `--nocapture`. The floor `s` matters: an element near 0
//! (FTRL's L1 zeros, Adam's `v` of tiny gradients) carries the absolute
//! error of its column's scale. A floor of 1 instead (`4 t u max(|e|, 1)`)
//! also holds, but in bf16 it allows more than the whole value of most
//! embedding weights (about 0.1).
//!
//! The goldens' gradients are mostly near 1 and their `eps` is 1e-3, which
//! hides a caveat of f16 slots: second moments below about 3e-8 round to 0
//! (and subnormals, below 6.1e-5, keep fewer bits). With small gradients
//! Adam's `v` is then stored as 0 after every step, and its steps grow far
//! beyond `lr`; that is shown below, with bf16 slots (f32's range)
//! unaffected. Stochastic rounding is checked to be reproducible, and to
//! keep updates far below bf16's resolution that rounding to nearest even
//! drops.

use dynemb::{Dtype, Error, Rounding, Variable};
use dynemb_optim::*;
use dynemb_test_support::goldens::{self, floats, ids};
use serde_json::Value;

/// `C` of the bound (module docs) for rounding to nearest even.
const C_NEAREST: f32 = 2.0;
/// `C` of the bound for stochastic rounding (up to a whole ulp per store).
const C_STOCHASTIC: f32 = 4.0;

/// Half the distance from 1 to the next representable number.
fn unit_roundoff(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F32 => 2f32.powi(-24),
        Dtype::F16 => 2f32.powi(-11),
        Dtype::Bf16 => 2f32.powi(-8),
    }
}

/// How a run stores its rows.
#[derive(Clone, Copy, Debug)]
struct Storage {
    values: Dtype,
    slots: Dtype,
    rounding: Rounding,
}

impl Storage {
    /// Every pair of dtypes with a half-precision column; with stochastic
    /// rounding, only those with a bf16 column (the others round to
    /// nearest even anyway).
    fn all(rounding: Rounding) -> Vec<Storage> {
        let mut all = Vec::new();
        for values in Dtype::ALL {
            for slots in Dtype::ALL {
                let stochastic = matches!(rounding, Rounding::Stochastic { .. });
                let has_bf16 = values == Dtype::Bf16 || slots == Dtype::Bf16;
                if (values, slots) != (Dtype::F32, Dtype::F32) && (has_bf16 || !stochastic) {
                    all.push(Storage {
                        values,
                        slots,
                        rounding,
                    });
                }
            }
        }
        all
    }

    /// The unit roundoff of the coarser dtype.
    fn unit(self) -> f32 {
        unit_roundoff(self.values).max(unit_roundoff(self.slots))
    }

    fn variable(self, dim: usize, shards: usize) -> Variable<i64> {
        Variable::<i64>::builder("emb")
            .dim(dim)
            .shards(shards)
            .value_dtype(self.values)
            .slot_dtype(self.slots)
            .rounding(self.rounding)
            .build()
            .unwrap()
    }
}

/// The worst element of a run: its deviation over the bound, and where.
#[derive(Default)]
struct Worst {
    ratio: f32,
    at: String,
}

impl Worst {
    fn note(&mut self, got: &[f32], expected: &[f32], bound: impl Fn(f32, f32) -> f32, at: &str) {
        assert_eq!(got.len(), expected.len(), "{at}");
        let scale = expected.iter().fold(0f32, |s, e| s.max(e.abs()));
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            let ratio = (g - e).abs() / bound(*e, scale);
            // A NaN ratio is kept: a failure too.
            if ratio > self.ratio || ratio.is_nan() {
                self.ratio = ratio;
                self.at = format!("{at}, element {i}: dynemb {g}, TensorFlow {e}");
            }
        }
    }
}

/// Replays one golden case stored as `storage`; returns its worst element
/// against the bound with constant `c`.
fn track<R: Rule>(golden: &Value, case: &Value, storage: Storage, c: f32) -> Worst {
    let name = case["name"].as_str().unwrap();
    let params: R = serde_json::from_value(case["params"].clone()).expect("params");
    let opt = Sparse::new(params.clone()).unwrap();
    let dim = golden["dim"].as_u64().unwrap() as usize;
    let table = ids(&golden["ids"]);
    let initial = floats(&golden["initial_values"]);
    let var = storage.variable(dim, 2);
    var.upsert(&table, &initial).unwrap();
    let slots = params.slots();
    let u = storage.unit();
    let mut worst = Worst::default();
    let steps = golden["steps"].as_array().unwrap();
    let after = case["after_steps"].as_array().unwrap();
    for (t, (step, expected)) in (1..).zip(steps.iter().zip(after)) {
        opt.apply(&var, &ids(&step["ids"]), &floats(&step["grads"]))
            .unwrap_or_else(|e| panic!("{name} {storage:?} step {t}: {e}"));
        let bound = |e: f32, scale: f32| c * t as f32 * u * e.abs().max(scale);
        let at = format!("{name}, {storage:?}, step {t}");
        let mut rows = vec![0.0; table.len() * dim];
        var.lookup(&table, &mut rows).unwrap();
        worst.note(
            &rows,
            &floats(&expected["values"]),
            bound,
            &format!("{at}: values"),
        );
        for &(slot, _) in &slots {
            var.lookup_slot(var.slot_id(slot).unwrap(), &table, &mut rows)
                .unwrap();
            let expected = floats(&expected["slots"][slot]);
            worst.note(&rows, &expected, bound, &format!("{at}: slot {slot}"));
        }
    }
    // Id 42 is in no batch: it keeps its stored row and initial slots.
    let i = table.iter().position(|&id| id == 42).unwrap();
    let mut row = vec![0.0; dim];
    var.lookup(&[42], &mut row).unwrap();
    let stored: Vec<f32> = initial[i * dim..(i + 1) * dim]
        .iter()
        .map(|&v| storage.values.round(v))
        .collect();
    assert_eq!(row, stored, "{name} {storage:?}: id 42's row");
    for &(slot, value) in &slots {
        var.lookup_slot(var.slot_id(slot).unwrap(), &[42], &mut row)
            .unwrap();
        assert!(
            row.iter().all(|&v| v == storage.slots.round(value)),
            "{name} {storage:?}: id 42's {slot}"
        );
    }
    assert_eq!(var.size(), table.len(), "{name}: no other id was inserted");
    worst
}

/// Replays every golden case in every storage of `rounding`, printing the
/// worst element of each, and checks them against the bound.
fn track_all(rounding: Rounding, c: f32) {
    let golden = goldens::load();
    let cases = golden["cases"].as_array().unwrap();
    let mut overall = Worst::default();
    let mut runs = 0;
    for case in cases {
        for storage in Storage::all(rounding) {
            let worst = match case["optimizer"].as_str().unwrap() {
                "SparseSgd" => track::<ParamsSgd>(&golden, case, storage, c),
                "SparseMomentum" => track::<ParamsMomentum>(&golden, case, storage, c),
                "SparseAdagrad" => track::<ParamsAdagrad>(&golden, case, storage, c),
                "SparseAdam" => track::<ParamsAdam>(&golden, case, storage, c),
                "SparseAdamW" => track::<ParamsAdamW>(&golden, case, storage, c),
                "SparseAdamax" => track::<ParamsAdamax>(&golden, case, storage, c),
                "SparseAdadelta" => track::<ParamsAdadelta>(&golden, case, storage, c),
                "SparseFtrl" => track::<ParamsFtrl>(&golden, case, storage, c),
                "SparseRmsProp" => track::<ParamsRmsProp>(&golden, case, storage, c),
                other => panic!("unknown optimizer {other} in goldens.json"),
            };
            println!(
                "{:26} values {:4} slots {:4}: worst {:.2} of the bound",
                case["name"].as_str().unwrap(),
                storage.values,
                storage.slots,
                worst.ratio
            );
            assert!(
                worst.ratio <= 1.0,
                "{:.2} times the bound at {}",
                worst.ratio,
                worst.at
            );
            if worst.ratio > overall.ratio {
                overall = worst;
            }
            runs += 1;
        }
    }
    assert_eq!(runs, cases.len() * Storage::all(rounding).len());
    println!(
        "worst of all: {:.2} of the bound, at {}",
        overall.ratio, overall.at
    );
}

#[test]
fn every_optimizer_tracks_tensorflow_in_half_precision() {
    track_all(Rounding::NearestEven, C_NEAREST);
}

#[test]
fn every_optimizer_tracks_tensorflow_with_stochastic_rounding() {
    for seed in [1, 0x5eed] {
        track_all(Rounding::Stochastic { seed }, C_STOCHASTIC);
    }
}

/// A slot's initial value that the dtype cannot hold (0.2, Adagrad's and
/// FTRL's accumulator here) is stored rounded, and the next steps still
/// find it to be the optimizer's; a really different one is a mismatch.
#[test]
fn rounded_slot_initial_values_are_the_optimizers() {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let storage = Storage {
            values: Dtype::F32,
            slots: dtype,
            rounding: Rounding::NearestEven,
        };
        let params = ParamsAdagrad {
            initial_accumulator_value: 0.2,
            ..Default::default()
        };
        let opt = SparseAdagrad::new(params).unwrap();
        let var = storage.variable(4, 1);
        for step in 0..3 {
            check_step(&params, &var, &[1], &[0.5; 4]).unwrap();
            opt.apply(&var, &[1], &[0.5; 4])
                .unwrap_or_else(|e| panic!("{dtype} step {step}: {e}"));
        }
        let slot = var.slot_id("accumulator").unwrap();
        assert_ne!(var.slot_initial(slot).unwrap(), 0.2, "{dtype}");
        assert_eq!(var.slot_initial(slot).unwrap(), dtype.round(0.2));

        let var = storage.variable(4, 1);
        var.create_slot("accumulator", 0.5).unwrap();
        for err in [
            check_step(&params, &var, &[1], &[0.5; 4]).unwrap_err(),
            opt.apply(&var, &[1], &[0.5; 4]).unwrap_err(),
        ] {
            assert!(matches!(err, Error::Mismatch { .. }), "{dtype}: {err}");
        }
    }
}

/// An accumulator's initial value that f16 stores as 0 would make Adagrad
/// and FTRL divide by zero: the first step refuses it and changes nothing.
#[test]
fn an_accumulator_start_that_rounds_to_zero_is_refused() {
    let storage = Storage {
        values: Dtype::F32,
        slots: Dtype::F16,
        rounding: Rounding::NearestEven,
    };
    let adagrad = SparseAdagrad::new(ParamsAdagrad {
        initial_accumulator_value: 1e-9,
        ..Default::default()
    })
    .unwrap();
    let ftrl = SparseFtrl::new(ParamsFtrl {
        initial_accumulator_value: 1e-9,
        ..Default::default()
    })
    .unwrap();
    let adagrad = |var: &Variable<i64>| adagrad.apply(var, &[1], &[0.5; 4]);
    let ftrl = |var: &Variable<i64>| ftrl.apply(var, &[1], &[0.5; 4]);
    let steps: [&dyn Fn(&Variable<i64>) -> _; 2] = [&adagrad, &ftrl];
    for step in steps {
        let var = storage.variable(4, 1);
        var.upsert(&[1], &[0.25; 4]).unwrap();
        let err = step(&var).unwrap_err();
        assert!(
            matches!(
                err,
                Error::OutOfRange {
                    what: "slot initial value",
                    dtype: Dtype::F16,
                    ..
                }
            ),
            "{err}"
        );
        assert!(var.slot_names().is_empty(), "no slot created");
        let mut row = [0.0; 4];
        var.lookup(&[1], &mut row).unwrap();
        assert_eq!(row, [0.25; 4], "the row is unchanged");
    }
}

/// With a constant gradient much larger than `eps`, Adam moves a weight by
/// about `lr` per step. With a gradient of 1e-4, `v` is `(1 - beta2^t)
/// g^2`, 1e-11 after one step and 1e-9 after 100: f16 slots store it as 0,
/// so each step sees only its own `(1 - beta2) g^2`, and after the bias
/// correction Adam's step grows toward `lr / sqrt(1 - beta2)`, 32 times
/// `lr`. bf16 slots keep `v`.
#[test]
fn f16_slots_underflow_adams_second_moment_bf16_slots_do_not() {
    let params = ParamsAdam::default();
    let last_step = |slots: Dtype| {
        let storage = Storage {
            values: Dtype::F32,
            slots,
            rounding: Rounding::NearestEven,
        };
        let var = storage.variable(8, 1);
        let opt = SparseAdam::new(params).unwrap();
        let mut w = [[0.0; 8]; 2];
        for step in 0..100 {
            w[0] = w[1];
            opt.apply(&var, &[3], &[1e-4; 8]).unwrap();
            var.lookup(&[3], &mut w[1]).unwrap();
            assert!(
                w[1][0] < w[0][0],
                "{slots} step {step}: the weight goes down"
            );
        }
        let mut v = [0.0; 8];
        var.lookup_slot(var.slot_id("v").unwrap(), &[3], &mut v)
            .unwrap();
        (w[0][0] - w[1][0], v[0])
    };
    for slots in [Dtype::F32, Dtype::Bf16] {
        let (step, v) = last_step(slots);
        // bf16 rounds 100 small additions: a few percent.
        let expected_v = (1.0 - 0.999f64.powi(100)) * 1e-8;
        assert!(
            (f64::from(v) - expected_v).abs() < 0.1 * expected_v,
            "{slots}: v = {v} is kept"
        );
        assert!(
            (step - params.lr).abs() < 0.1 * params.lr,
            "{slots}: the 100th step moved by {step}, lr is {}",
            params.lr
        );
    }
    let (step, v) = last_step(Dtype::F16);
    assert_eq!(v, 0.0, "f16: v underflows");
    // sqrt(1 - 0.999^100) / sqrt(1 - 0.999) = 9.8
    assert!(
        step > 9.0 * params.lr,
        "f16: the 100th step moved by {step}, lr is {}",
        params.lr
    );
}

/// Trains with bf16 values and slots, stochastic rounding: the values and
/// every slot after a few Adam steps.
fn stochastic_adam(seed: u64) -> Vec<u32> {
    let storage = Storage {
        values: Dtype::Bf16,
        slots: Dtype::Bf16,
        rounding: Rounding::Stochastic { seed },
    };
    let dim = 16;
    let var = storage.variable(dim, 3);
    let keys: Vec<i64> = (0..20).collect();
    let opt = SparseAdam::new(ParamsAdam {
        lr: 0.01,
        ..Default::default()
    })
    .unwrap();
    for step in 0..5 {
        let grads: Vec<f32> = (0..keys.len() * dim)
            .map(|i| ((i * 7 + step * 13) % 23) as f32 / 23.0 - 0.4)
            .collect();
        opt.apply(&var, &keys, &grads).unwrap();
    }
    let mut bits = Vec::new();
    let mut rows = vec![0.0; keys.len() * dim];
    var.lookup(&keys, &mut rows).unwrap();
    bits.extend(rows.iter().map(|v| v.to_bits()));
    for slot in ["m", "v"] {
        var.lookup_slot(var.slot_id(slot).unwrap(), &keys, &mut rows)
            .unwrap();
        bits.extend(rows.iter().map(|v| v.to_bits()));
    }
    bits
}

#[test]
fn stochastic_rounding_is_reproducible() {
    let first = stochastic_adam(42);
    assert_eq!(first, stochastic_adam(42), "the same seed, the same bits");
    let other = stochastic_adam(43);
    let differ = first.iter().zip(&other).filter(|(a, b)| a != b).count();
    assert!(differ > 0, "another seed rounds otherwise");
}

/// SGD adding 1e-4 per step to weights at 1.0, where bf16's values are
/// 2^-7 (0.0078) apart: rounding to nearest even drops every update, so
/// the weights never move; stochastic rounding rounds up with probability
/// 1e-4 / 2^-7 and follows the f32 trajectory on average.
#[test]
fn stochastic_rounding_keeps_updates_that_nearest_even_drops() {
    let dim = 64;
    let keys = [1_i64, 2, 3, 4];
    let steps = 2000;
    let run = |values: Dtype, rounding: Rounding| {
        let storage = Storage {
            values,
            slots: Dtype::F32,
            rounding,
        };
        let var = storage.variable(dim, 1);
        var.upsert(&keys, &vec![1.0; keys.len() * dim]).unwrap();
        let opt = SparseSgd::new(ParamsSgd { lr: 0.01 }).unwrap();
        let grads = vec![-0.01; keys.len() * dim];
        for _ in 0..steps {
            opt.apply(&var, &keys, &grads).unwrap();
        }
        let mut rows = vec![0.0; keys.len() * dim];
        var.lookup(&keys, &mut rows).unwrap();
        rows
    };
    let exact = run(Dtype::F32, Rounding::NearestEven);
    let nearest = run(Dtype::Bf16, Rounding::NearestEven);
    let stochastic = run(Dtype::Bf16, Rounding::Stochastic { seed: 9 });
    // f32 moves by steps * 1e-4 = 0.2.
    assert!(exact.iter().all(|&w| (w - 1.2).abs() < 1e-3), "{exact:?}");
    assert!(nearest.iter().all(|&w| w == 1.0), "nearest even stalls");
    let n = exact.len() as f32;
    let mean_error = |rows: &[f32]| rows.iter().zip(&exact).map(|(w, e)| w - e).sum::<f32>() / n;
    let mean_abs_error = |rows: &[f32]| {
        rows.iter()
            .zip(&exact)
            .map(|(w, e)| (w - e).abs())
            .sum::<f32>()
            / n
    };
    let (bias, spread) = (mean_error(&stochastic), mean_abs_error(&stochastic));
    println!(
        "after {steps} steps: nearest even off by {:.4}; stochastic by {bias:.4} on average, \
         {spread:.4} per element",
        mean_abs_error(&nearest)
    );
    // Each element's error is a sum of 2000 roundings up or down, of
    // standard deviation about 0.04; their mean over 256 elements about
    // 0.003.
    assert!(bias.abs() < 0.02, "stochastic rounding is unbiased: {bias}");
    assert!(
        spread < 0.25 * mean_abs_error(&nearest),
        "stochastic rounding tracks f32: {spread} per element"
    );
}

/// A step whose result does not fit the half dtype refuses that row, with
/// an `OutOfRange` naming its key's first position in the caller's batch
/// (through `apply` and through a part of a deduplicated batch), and
/// updates the others.
#[test]
fn a_result_out_of_a_half_range_names_its_batch_position() {
    let variable = Variable::<i64>::builder("out_of_range")
        .dim(2)
        .value_dtype(Dtype::F16)
        .slot_dtype(Dtype::F16)
        .build()
        .expect("build");
    variable
        .upsert(&[5, 7], &[1.0, 1.0, 60000.0, 1.0])
        .expect("upsert");
    let sgd = SparseSgd::new(ParamsSgd { lr: 1.0 }).expect("sgd");
    // Key 7 is first at position 2; its value would become 66000.
    let err = sgd
        .apply(
            &variable,
            &[5, 5, 7, 7],
            &[0.5, 0.5, 0.5, 0.5, -3000.0, 0.0, -3000.0, 0.0],
        )
        .expect_err("66000 does not fit f16");
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                what: "optimizer step result",
                index: 2,
                value: 66000.0,
                dtype: Dtype::F16
            }
        ),
        "{err:?}"
    );
    let mut rows = [0.0; 4];
    variable.lookup(&[5, 7], &mut rows).expect("lookup");
    assert_eq!(rows, [0.0, 0.0, 60000.0, 1.0], "key 5 stepped, key 7 kept");

    let keys: Vec<i64> = (0..100).collect();
    let mut values = vec![1.0; 200];
    values[160] = 60000.0;
    variable.upsert(&keys, &values).expect("upsert");
    let mut grads = vec![0.0; 200];
    grads[160] = -6000.0;
    let mut dedup = dynemb_optim::dedup::Dedup::new();
    let batch = dedup.run(&keys, &grads, 2).expect("dedup");
    let err = sgd
        .begin_step()
        .expect("step")
        .apply_deduped(&variable, &batch.part(50..100, 2))
        .expect_err("66000 does not fit f16");
    assert!(
        matches!(err, Error::OutOfRange { index: 80, .. }),
        "{err:?}"
    );
}
