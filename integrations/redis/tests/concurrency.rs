//! Many writers, one table: bp_v2 `accum` from 4 threads and from 2
//! processes on overlapping keys sums exactly (integer deltas), and sparse
//! Adam from 2 processes (and 4 threads) on overlapping keys loses no
//! update and tears no row: every key's `m` and `v` are exactly those of
//! as many Adam steps as all writers applied to it, the same count for
//! both (a lost update would leave one step too few, a torn row `m` and
//! `v` of different counts).
//!
//! The second process is this test binary run again (`worker`, ignored
//! unless asked for by `servers::spawn_worker`). Every test runs under
//! both forms of the writes: `dynemb-redis-module`'s commands and the Lua
//! scripts.

use dynemb::{Initializer, Variable};
use dynemb_optim::{ParamsAdam, SparseAdam, SparseOptimizer};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::{
    join_worker, module_calls, spawn_worker, worker_param, Cluster, Form, Server, WORKER_ROLE,
};

const DIM: usize = 4;
/// Keys every writer shares.
const SHARED: i64 = 200;
const ROUNDS: usize = 30;

/// The variable `name` in `form` (its name says the form, so the two
/// forms' runs use separate tables).
fn open(config: RedisConfig, name: &str, form: Form) -> RedisVariable<i64> {
    let var = RedisVariable::open(
        Variable::<i64>::builder(format!("{name}_{form:?}"))
            .dim(DIM)
            .initializer(Initializer::Zeros),
        form.config(config),
    )
    .unwrap();
    assert_eq!(var.uses_module(), form == Form::Module);
    var
}

/// The form from the worker parameters.
fn worker_form() -> Form {
    match worker_param("DYNEMB_REDIS_FORM").as_str() {
        "Module" => Form::Module,
        "Lua" => Form::Lua,
        other => panic!("unknown form {other}"),
    }
}

/// Config from the worker parameters.
fn worker_config() -> RedisConfig {
    RedisConfig::with_nodes(worker_param("DYNEMB_REDIS_NODES").split(','))
}

// ---------------------------------------------------------------- accum

/// Writer `w`'s batch in round `r`: shared keys (some twice) with integer
/// deltas, all flagged present; and one key of its own, inserted by accum.
fn accum_batch(w: usize, r: usize) -> (Vec<i64>, Vec<f32>, Vec<bool>) {
    let mut keys: Vec<i64> = (0..SHARED)
        .filter(|k| !(*k as usize + r).is_multiple_of(2 + w))
        .collect();
    keys.extend((0..SHARED).filter(|k| (*k as usize + w).is_multiple_of(17))); // repeats
    let mut deltas = Vec::new();
    for &k in &keys {
        deltas.extend([1.0 + (k % 7) as f32 + w as f32; DIM]);
    }
    let mut exists = vec![true; keys.len()];
    let own = 100_000 + (w * 1000 + r) as i64;
    keys.push(own);
    deltas.extend([(w + r) as f32; DIM]);
    exists.push(false);
    (keys, deltas, exists)
}

fn accum_writer(var: &RedisVariable<i64>, w: usize) {
    for r in 0..ROUNDS {
        let (keys, deltas, exists) = accum_batch(w, r);
        var.accum(&keys, &deltas, &exists).unwrap();
    }
}

/// Checks the sums of `writers` writers' rounds.
fn check_accum_sums(var: &RedisVariable<i64>, writers: usize) {
    let mut expected: std::collections::HashMap<i64, f32> = Default::default();
    for w in 0..writers {
        for r in 0..ROUNDS {
            let (keys, deltas, _) = accum_batch(w, r);
            for (i, k) in keys.iter().enumerate() {
                *expected.entry(*k).or_default() += deltas[i * DIM];
            }
        }
    }
    let keys: Vec<i64> = expected.keys().copied().collect();
    let mut rows = vec![0.0; keys.len() * DIM];
    var.lookup(&keys, &mut rows).unwrap();
    for (i, k) in keys.iter().enumerate() {
        assert!(
            rows[i * DIM..(i + 1) * DIM]
                .iter()
                .all(|&x| x == expected[k]),
            "key {k}: {:?}, expected {}",
            &rows[i * DIM..(i + 1) * DIM],
            expected[k]
        );
    }
    assert_eq!(var.size().unwrap(), keys.len());
}

fn prepare_shared(var: &RedisVariable<i64>) {
    let keys: Vec<i64> = (0..SHARED).collect();
    var.lookup_or_insert(&keys, &mut vec![0.0; keys.len() * DIM])
        .unwrap();
}

#[test]
fn accum_from_four_threads_sums_exactly() {
    let Some(cluster) = Cluster::start(3) else {
        return;
    };
    for form in Form::available() {
        let var = open(cluster.config(), "accum_threads", form);
        prepare_shared(&var);
        std::thread::scope(|s| {
            for w in 0..4 {
                let var = var.clone();
                s.spawn(move || accum_writer(&var, w));
            }
        });
        check_accum_sums(&var, 4);
    }
}

#[test]
fn accum_from_two_processes_sums_exactly() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        let before = module_calls([&server]);
        let var = open(server.config(), "accum_processes", form);
        prepare_shared(&var);
        let workers: Vec<_> = (0..2)
            .map(|w| {
                spawn_worker(&[
                    (WORKER_ROLE, "accum".into()),
                    ("DYNEMB_REDIS_NODES", server.addr()),
                    ("DYNEMB_REDIS_NAME", "accum_processes".into()),
                    ("DYNEMB_REDIS_FORM", format!("{form:?}")),
                    ("DYNEMB_REDIS_INDEX", w.to_string()),
                ])
            })
            .collect();
        workers.into_iter().for_each(join_worker);
        check_accum_sums(&var, 2);
        let calls = module_calls([&server]) - before;
        assert_eq!(
            calls > 0,
            form == Form::Module,
            "{form:?}: {calls} module calls"
        );
    }
}

// ---------------------------------------------------------------- Adam

const BETA1: f32 = 0.9;
const BETA2: f32 = 0.999;

/// Writer `w`'s keys in step `s` (gradient 1 for every element).
fn adam_keys(w: usize, s: usize) -> Vec<i64> {
    (0..SHARED)
        .filter(|k| !(*k as usize + s * (w + 1)).is_multiple_of(3))
        .collect()
}

fn adam_writer(var: &RedisVariable<i64>, w: usize) {
    let opt = SparseAdam::new(ParamsAdam {
        lr: 0.01,
        ..ParamsAdam::default()
    })
    .unwrap();
    for s in 0..ROUNDS {
        let keys = adam_keys(w, s);
        var.lookup_or_insert(&keys, &mut vec![0.0; keys.len() * DIM])
            .unwrap();
        opt.apply(var, &keys, &vec![1.0; keys.len() * DIM]).unwrap();
    }
}

/// `(m, v)` after `n` Adam steps of gradient 1 from zero, as the kernel
/// computes them in `f32`.
fn moments_after(n: usize) -> (f32, f32) {
    let (mut m, mut v) = (0.0f32, 0.0f32);
    for _ in 0..n {
        m = m * BETA1 + 1.0 * (1.0 - BETA1);
        v = v * BETA2 + (1.0 * 1.0) * (1.0 - BETA2);
    }
    (m, v)
}

fn check_adam(var: &RedisVariable<i64>, writers: usize) {
    let keys: Vec<i64> = (0..SHARED).collect();
    let m_slot = var.slot_id("m").unwrap();
    let v_slot = var.slot_id("v").unwrap();
    let mut m = vec![0.0; keys.len() * DIM];
    let mut v = vec![0.0; keys.len() * DIM];
    var.lookup_slot(m_slot, &keys, &mut m).unwrap();
    var.lookup_slot(v_slot, &keys, &mut v).unwrap();
    let mut values = vec![0.0; keys.len() * DIM];
    var.lookup(&keys, &mut values).unwrap();
    for &k in &keys {
        let count = (0..writers)
            .flat_map(|w| (0..ROUNDS).map(move |s| adam_keys(w, s)))
            .filter(|batch| batch.contains(&k))
            .count();
        let (em, ev) = moments_after(count);
        let at = k as usize * DIM;
        for j in 0..DIM {
            assert!(
                (m[at + j] - em).abs() <= 1e-6 && (v[at + j] - ev).abs() <= 1e-7,
                "key {k}: m {} v {} after {count} updates should be m {em} v {ev}",
                m[at + j],
                v[at + j]
            );
            assert!(
                values[at + j].is_finite() && values[at + j] < 0.0,
                "key {k} trained"
            );
        }
    }
}

#[test]
fn adam_from_four_threads_loses_no_update() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        let before = module_calls([&server]);
        let var = open(server.config(), "adam_threads", form);
        std::thread::scope(|s| {
            for w in 0..4 {
                let var = var.clone();
                s.spawn(move || adam_writer(&var, w));
            }
        });
        check_adam(&var, 4);
        let calls = module_calls([&server]) - before;
        assert_eq!(
            calls > 0,
            form == Form::Module,
            "{form:?}: {calls} module calls"
        );
    }
}

#[test]
fn adam_from_two_processes_loses_no_update_and_tears_no_row() {
    let Some(cluster) = Cluster::start(3) else {
        return;
    };
    let addrs: Vec<String> = cluster.servers.iter().map(|s| s.addr()).collect();
    for form in Form::available() {
        let var = open(cluster.config(), "adam_processes", form);
        let workers: Vec<_> = (0..2)
            .map(|w| {
                spawn_worker(&[
                    (WORKER_ROLE, "adam".into()),
                    ("DYNEMB_REDIS_NODES", addrs.join(",")),
                    ("DYNEMB_REDIS_NAME", "adam_processes".into()),
                    ("DYNEMB_REDIS_FORM", format!("{form:?}")),
                    ("DYNEMB_REDIS_INDEX", w.to_string()),
                ])
            })
            .collect();
        workers.into_iter().for_each(join_worker);
        check_adam(&var, 2);
    }
}

/// A second process's part of the tests above (run by `spawn_worker`).
#[test]
#[ignore = "run by the multi-process tests in a child process"]
fn worker() {
    let var = open(
        worker_config(),
        &worker_param("DYNEMB_REDIS_NAME"),
        worker_form(),
    );
    let w: usize = worker_param("DYNEMB_REDIS_INDEX").parse().unwrap();
    match worker_param(WORKER_ROLE).as_str() {
        "accum" => accum_writer(&var, w),
        "adam" => adam_writer(&var, w),
        other => panic!("unknown worker role {other}"),
    }
}
