//! Parity: training on Redis gives what training a local `Variable` gives,
//! to 1e-6 (in fact bit for bit: the same kernels run on the same `f32`
//! rows, and Redis stores them as bytes).
//!
//! - The optimizer goldens' setup (`optim/tests/golden/goldens.json`, made
//!   with TensorFlow): every optimizer configuration, 10 steps of batches
//!   with repeated ids, on a local variable and on a Redis cluster; rows
//!   and every slot compared after every step, with each other and with
//!   TensorFlow's numbers.
//! - 200 steps of an embedding model's training loop (a random initializer,
//!   `lookup_or_insert` forward reads of skewed ids, gradients computed
//!   from the rows read, sparse Adam, Adagrad and FTRL), on a local
//!   variable and on a single server; every row and slot compared at the
//!   end, and the rows read at every step.
//!
//! Each runs under both forms of the writes: `dynemb-redis-module`'s
//! commands and the Lua scripts.

use dynemb::{EmbeddingStore, Initializer, Variable};
use dynemb_optim::*;
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::goldens::{self, floats, ids};
use dynemb_test_support::servers::{unique_name, Cluster, Form, Server};
use serde_json::Value;

const TOLERANCE: f32 = 1e-6;

fn assert_close(got: &[f32], expected: &[f32], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let tolerance = TOLERANCE * e.abs().max(1.0);
        assert!(
            (g - e).abs() <= tolerance,
            "{what}, element {i}: redis {g}, expected {e}"
        );
    }
}

/// The rows of `keys` and of each of `slots` in a store.
fn read<S: EmbeddingStore<Key = i64>>(store: &S, keys: &[i64], slots: &[&str]) -> Vec<Vec<f32>> {
    let dim = store.dim();
    let mut rows = vec![0.0; keys.len() * dim];
    store.lookup(keys, &mut rows).unwrap();
    let mut out = vec![rows];
    for slot in slots {
        let mut part = vec![0.0; keys.len() * dim];
        store
            .lookup_slot(store.slot_id(slot).unwrap(), keys, &mut part)
            .unwrap();
        out.push(part);
    }
    out
}

// ---------------------------------------------------------------- goldens

/// One golden case on a local variable and on Redis, step by step.
fn golden_case<R: Rule>(golden: &Value, case: &Value, config: &RedisConfig) {
    let name = case["name"].as_str().unwrap();
    let params: R = serde_json::from_value(case["params"].clone()).expect("params");
    let dim = golden["dim"].as_u64().unwrap() as usize;
    let table = ids(&golden["ids"]);
    let local = Variable::<i64>::builder("emb").dim(dim).build().unwrap();
    let remote = RedisVariable::open(
        Variable::<i64>::builder(unique_name(name)).dim(dim),
        config.clone(),
    )
    .unwrap();
    assert_eq!(remote.uses_module(), config.use_module);
    let initial = floats(&golden["initial_values"]);
    local.upsert(&table, &initial).unwrap();
    remote.upsert(&table, &initial).unwrap();
    let (opt_local, opt_remote) = (
        Sparse::new(params.clone()).unwrap(),
        Sparse::new(params.clone()).unwrap(),
    );
    let slots: Vec<&str> = params.slots().iter().map(|&(n, _)| n).collect();
    let after = case["after_steps"].as_array().unwrap();
    for (t, (step, expected)) in golden["steps"]
        .as_array()
        .unwrap()
        .iter()
        .zip(after)
        .enumerate()
    {
        let (keys, grads) = (ids(&step["ids"]), floats(&step["grads"]));
        opt_local.apply(&local, &keys, &grads).unwrap();
        opt_remote.apply(&remote, &keys, &grads).unwrap();
        let at = format!("{name} step {}", t + 1);
        let (l, r) = (read(&local, &table, &slots), read(&remote, &table, &slots));
        assert_close(&r[0], &l[0], &format!("{at}: values vs local"));
        assert_close(
            &r[0],
            &floats(&expected["values"]),
            &format!("{at}: values vs TF"),
        );
        for (j, slot) in slots.iter().enumerate() {
            assert_close(&r[j + 1], &l[j + 1], &format!("{at}: {slot} vs local"));
            assert_close(
                &r[j + 1],
                &floats(&expected["slots"][slot]),
                &format!("{at}: {slot} vs TF"),
            );
        }
    }
    assert_eq!(remote.size().unwrap(), table.len(), "{name}: no other id");
    remote.destroy().unwrap();
}

#[test]
fn every_optimizer_golden_trains_redis_as_a_local_variable() {
    let Some(cluster) = Cluster::start(3) else {
        return;
    };
    let golden = goldens::load();
    let cases = golden["cases"].as_array().unwrap();
    for (form, case) in Form::available()
        .into_iter()
        .flat_map(|f| cases.iter().map(move |c| (f, c)))
    {
        let config = form.config(RedisConfig {
            buckets: 16,
            ..cluster.config()
        });
        match case["optimizer"].as_str().unwrap() {
            "SparseSgd" => golden_case::<ParamsSgd>(&golden, case, &config),
            "SparseMomentum" => golden_case::<ParamsMomentum>(&golden, case, &config),
            "SparseAdagrad" => golden_case::<ParamsAdagrad>(&golden, case, &config),
            "SparseAdam" => golden_case::<ParamsAdam>(&golden, case, &config),
            "SparseAdamW" => golden_case::<ParamsAdamW>(&golden, case, &config),
            "SparseAdamax" => golden_case::<ParamsAdamax>(&golden, case, &config),
            "SparseAdadelta" => golden_case::<ParamsAdadelta>(&golden, case, &config),
            "SparseFtrl" => golden_case::<ParamsFtrl>(&golden, case, &config),
            "SparseRmsProp" => golden_case::<ParamsRmsProp>(&golden, case, &config),
            other => panic!("unknown optimizer {other} in goldens.json"),
        }
    }
    assert!(cases.len() >= 9, "every optimizer has a golden");
}

// ---------------------------------------------------------------- training loop

const DIM: usize = 16;
const STEPS: usize = 200;
const BATCH: usize = 256;

/// A deterministic skewed id stream (small ids often, large ones rarely).
fn batch(step: usize) -> Vec<i64> {
    let mut x = (step as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..BATCH)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            (u * u * u * 5000.0) as i64 - 100
        })
        .collect()
}

/// One training step: forward read (inserting), a loss's gradient from
/// the rows read (pull each row towards a target that depends on its id),
/// one optimizer step. Returns the rows read.
fn train_step<S: EmbeddingStore<Key = i64>, O: SparseOptimizer>(
    store: &S,
    opt: &O,
    keys: &[i64],
) -> Vec<f32> {
    let mut rows = vec![0.0; keys.len() * DIM];
    store.lookup_or_insert(keys, &mut rows).unwrap();
    let grads: Vec<f32> = rows
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let key = keys[i / DIM];
            let target = ((key % 11) as f32 - 5.0) * 0.1 + (i % DIM) as f32 * 0.01;
            x - target
        })
        .collect();
    opt.apply(store, keys, &grads).unwrap();
    rows
}

fn training_loop<O: SparseOptimizer>(make: impl Fn() -> O, config: &RedisConfig, what: &str) {
    let init = Initializer::TruncatedNormal {
        mean: 0.0,
        stddev: 0.05,
        seed: 7,
    };
    let local = Variable::<i64>::builder("emb")
        .dim(DIM)
        .initializer(init.clone())
        .build()
        .unwrap();
    let remote = RedisVariable::open(
        Variable::<i64>::builder(unique_name(what))
            .dim(DIM)
            .initializer(init),
        config.clone(),
    )
    .unwrap();
    let (opt_local, opt_remote) = (make(), make());
    for step in 0..STEPS {
        let keys = batch(step);
        let l = train_step(&local, &opt_local, &keys);
        let r = train_step(&remote, &opt_remote, &keys);
        assert_close(&r, &l, &format!("{what}: rows read at step {step}"));
    }
    let (mut keys, _) = local.export().unwrap();
    keys.sort_unstable();
    let (mut remote_keys, _) = remote.export().unwrap();
    remote_keys.sort_unstable();
    assert_eq!(remote_keys, keys, "{what}: the same ids were inserted");
    let slots = local.slot_names();
    let slots: Vec<&str> = slots.iter().map(String::as_str).collect();
    assert_eq!(remote.slot_names().unwrap(), slots, "{what}: slots");
    let (l, r) = (read(&local, &keys, &slots), read(&remote, &keys, &slots));
    for (j, (r, l)) in r.iter().zip(&l).enumerate() {
        assert_close(r, l, &format!("{what}: column {j} after {STEPS} steps"));
    }
    remote.destroy().unwrap();
}

#[test]
fn two_hundred_training_steps_match_a_local_variable() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        training_loops(&form.config(server.config()));
    }
}

/// [`training_loop`] with Adam, Adagrad and FTRL.
fn training_loops(config: &RedisConfig) {
    training_loop(
        || {
            SparseAdam::new(ParamsAdam {
                lr: 0.01,
                ..Default::default()
            })
            .unwrap()
        },
        config,
        "adam",
    );
    training_loop(
        || {
            SparseAdagrad::new(ParamsAdagrad {
                lr: 0.1,
                ..Default::default()
            })
            .unwrap()
        },
        config,
        "adagrad",
    );
    training_loop(
        || {
            SparseFtrl::new(ParamsFtrl {
                lr: 0.05,
                l1: 0.001,
                ..Default::default()
            })
            .unwrap()
        },
        config,
        "ftrl",
    );
}

// ---------------------------------------------------------- large batches

/// A batch of more distinct keys than one chunk of `update_rows`' pipeline
/// (its rounds are cut into chunks from 16,384 keys on, written back on
/// another thread while the next chunk's kernel runs here) trains as on a
/// local variable: Adam's rows and slots, repeated keys included.
#[test]
fn a_batch_pipelined_in_chunks_trains_as_a_local_variable() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        pipelined_in_chunks(&form.config(server.config()));
    }
}

fn pipelined_in_chunks(config: &RedisConfig) {
    let init = Initializer::RandomUniform {
        low: -0.5,
        high: 0.5,
        seed: 3,
    };
    let remote = RedisVariable::open(
        Variable::<i64>::builder(unique_name("chunks"))
            .dim(2)
            .initializer(init.clone()),
        config.clone(),
    )
    .unwrap();
    assert_eq!(remote.uses_module(), config.use_module);
    let local = Variable::<i64>::builder("chunks")
        .dim(2)
        .initializer(init)
        .build()
        .unwrap();
    let opt = || {
        SparseAdam::new(ParamsAdam {
            lr: 0.01,
            ..Default::default()
        })
        .unwrap()
    };
    let (on_remote, on_local) = (opt(), opt());
    let keys: Vec<i64> = (0..40_000).chain(0..5_000).map(|k| k * 7 - 9_000).collect();
    for step in 0..3 {
        let grads: Vec<f32> = (0..keys.len() * 2)
            .map(|i| ((i * 31 + step * 7) % 17) as f32 / 17.0 - 0.5)
            .collect();
        on_remote.apply(&remote, &keys, &grads).unwrap();
        on_local.apply(&local, &keys, &grads).unwrap();
    }
    let distinct = &keys[..40_000];
    let (got, want) = (
        read(&remote, distinct, &["m", "v"]),
        read(&local, distinct, &["m", "v"]),
    );
    for (part, (g, w)) in ["values", "m", "v"].iter().zip(got.iter().zip(&want)) {
        assert_close(g, w, part);
    }
}
