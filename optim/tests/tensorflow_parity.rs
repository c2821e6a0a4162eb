//! Parity with TensorFlow itself: `golden/goldens.json` was made once by
//! `golden/make_goldens.py` with real TensorFlow 2.16 and tf-keras (see
//! `golden/README.md`): for every optimizer configuration, 10 steps of
//! batches with repeated ids on a 9-id table of dim 10, applied the way TFRA
//! applies them (the batch's rows gathered into a wrapper variable, Keras'
//! own optimizer applied to it, rows scattered back), with the rows and
//! every slot after each step. Here the same steps run through
//! `dynemb-optim` on a `Variable` with 1 and 3 shards and must match after
//! every step to 1e-6 (relative above 1). Id 42 is in no batch: it keeps
//! its value and reads its slots' initial values.

use dynemb::Variable;
use dynemb_optim::*;
use dynemb_test_support::goldens::{self, floats, ids};
use serde_json::Value;

const TOLERANCE: f32 = 1e-6;

fn assert_close(got: &[f32], expected: &[f32], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let tolerance = TOLERANCE * e.abs().max(1.0);
        assert!(
            (g - e).abs() <= tolerance,
            "{what}, element {i}: dynemb {g}, TensorFlow {e} (diff {})",
            (g - e).abs()
        );
    }
}

/// Runs one golden case with `shards` shards.
fn run_case<R: Rule>(golden: &Value, case: &Value, shards: usize) {
    let name = case["name"].as_str().unwrap();
    let params: R = serde_json::from_value(case["params"].clone()).expect("params");
    let opt = Sparse::new(params.clone()).unwrap();
    let dim = golden["dim"].as_u64().unwrap() as usize;
    let table = ids(&golden["ids"]);
    let var = Variable::<i64>::builder("emb")
        .dim(dim)
        .shards(shards)
        .build()
        .unwrap();
    var.upsert(&table, &floats(&golden["initial_values"]))
        .unwrap();
    let slots: Vec<(&str, f32)> = params.slots();
    let expected_slots: Vec<&str> = case["slot_initial"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut names: Vec<&str> = slots.iter().map(|&(n, _)| n).collect();
    names.sort_unstable();
    let mut expected_sorted = expected_slots.clone();
    expected_sorted.sort_unstable();
    assert_eq!(names, expected_sorted, "{name}: TensorFlow's slot names");
    for &(slot, initial) in &slots {
        assert_eq!(
            case["slot_initial"][slot].as_f64().unwrap() as f32,
            initial,
            "{name}: initial value of {slot}"
        );
    }
    let steps = golden["steps"].as_array().unwrap();
    let after = case["after_steps"].as_array().unwrap();
    assert_eq!(steps.len(), after.len());
    for (t, (step, expected)) in steps.iter().zip(after).enumerate() {
        opt.apply(&var, &ids(&step["ids"]), &floats(&step["grads"]))
            .unwrap_or_else(|e| panic!("{name} step {}: {e}", t + 1));
        let mut rows = vec![0.0; table.len() * dim];
        var.lookup(&table, &mut rows).unwrap();
        let at = format!("{name} ({shards} shards), step {}", t + 1);
        assert_close(
            &rows,
            &floats(&expected["values"]),
            &format!("{at}: values"),
        );
        for &(slot, _) in &slots {
            let mut out = vec![0.0; table.len() * dim];
            var.lookup_slot(var.slot_id(slot).unwrap(), &table, &mut out)
                .unwrap();
            assert_close(
                &out,
                &floats(&expected["slots"][slot]),
                &format!("{at}: slot {slot}"),
            );
        }
    }
    assert_eq!(var.size(), table.len(), "{name}: no other id was inserted");
}

fn run_all(filter: &str) {
    let golden = goldens::load();
    let mut ran = 0;
    for case in golden["cases"].as_array().unwrap() {
        let optimizer = case["optimizer"].as_str().unwrap();
        if optimizer != filter {
            continue;
        }
        for shards in [1, 3] {
            match optimizer {
                "SparseSgd" => run_case::<ParamsSgd>(&golden, case, shards),
                "SparseMomentum" => run_case::<ParamsMomentum>(&golden, case, shards),
                "SparseAdagrad" => run_case::<ParamsAdagrad>(&golden, case, shards),
                "SparseAdam" => run_case::<ParamsAdam>(&golden, case, shards),
                "SparseAdamW" => run_case::<ParamsAdamW>(&golden, case, shards),
                "SparseAdamax" => run_case::<ParamsAdamax>(&golden, case, shards),
                "SparseAdadelta" => run_case::<ParamsAdadelta>(&golden, case, shards),
                "SparseFtrl" => run_case::<ParamsFtrl>(&golden, case, shards),
                "SparseRmsProp" => run_case::<ParamsRmsProp>(&golden, case, shards),
                other => panic!("unknown optimizer {other} in goldens.json"),
            }
        }
        ran += 1;
    }
    assert!(ran > 0, "goldens.json has no {filter} case");
}

#[test]
fn goldens_were_made_by_tensorflow() {
    let golden = goldens::load();
    assert!(golden["tensorflow"].as_str().unwrap().starts_with("2.16"));
    let ids = ids(&golden["ids"]);
    let in_batches: Vec<i64> = golden["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| self::ids(&s["ids"]))
        .collect();
    assert!(
        ids.iter().any(|id| !in_batches.contains(id)),
        "an id no batch touches"
    );
    let repeated = golden["steps"].as_array().unwrap().iter().all(|s| {
        let ids = self::ids(&s["ids"]);
        ids.iter().enumerate().any(|(i, id)| ids[..i].contains(id))
    });
    assert!(repeated, "every batch repeats an id");
}

#[test]
fn sgd_matches_tensorflow() {
    run_all("SparseSgd");
}

#[test]
fn momentum_and_nesterov_match_tensorflow() {
    run_all("SparseMomentum");
}

#[test]
fn adagrad_matches_tensorflow() {
    run_all("SparseAdagrad");
}

#[test]
fn adam_and_amsgrad_match_tensorflow() {
    run_all("SparseAdam");
}

#[test]
fn adamw_and_amsgrad_match_tensorflow() {
    run_all("SparseAdamW");
}

#[test]
fn adamax_matches_tensorflow() {
    run_all("SparseAdamax");
}

#[test]
fn adadelta_matches_tensorflow() {
    run_all("SparseAdadelta");
}

#[test]
fn ftrl_with_and_without_regularization_matches_tensorflow() {
    run_all("SparseFtrl");
}

#[test]
fn rmsprop_every_variant_matches_tensorflow() {
    run_all("SparseRmsProp");
}
