//! Servers that fail: a killed cluster node, a frozen server, a server
//! that is not there, a wrong password. Every failure is a typed
//! `Error::Backend` within the configured timeouts, never a hang, and the
//! variable works again once the node is back, its data intact.

use dynemb::{BackendErrorKind, Error, Initializer, Variable};
use dynemb_optim::{ParamsAdam, SparseAdam, SparseOptimizer};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::{Cluster, Server};
use std::time::{Duration, Instant};

const DIM: usize = 8;
const CONNECT: Duration = Duration::from_millis(500);
const COMMAND: Duration = Duration::from_millis(1500);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

fn timeouts(config: RedisConfig) -> RedisConfig {
    RedisConfig {
        connect_timeout: CONNECT,
        command_timeout: COMMAND,
        buckets: 32,
        ..config
    }
}

fn backend_kind(err: &Error) -> BackendErrorKind {
    match err {
        Error::Backend { kind, .. } => *kind,
        other => panic!("expected a backend error, got {other}"),
    }
}

/// Every row and slot of `keys`.
fn snapshot(var: &RedisVariable<i64>, keys: &[i64]) -> Vec<Vec<f32>> {
    let mut rows = vec![0.0; keys.len() * DIM];
    var.lookup(keys, &mut rows).unwrap();
    let mut out = vec![rows];
    for name in var.slot_names().unwrap() {
        let mut part = vec![0.0; keys.len() * DIM];
        var.lookup_slot(var.slot_id(&name).unwrap(), keys, &mut part)
            .unwrap();
        out.push(part);
    }
    out
}

fn step(var: &RedisVariable<i64>, opt: &SparseAdam, keys: &[i64]) -> dynemb::Result<()> {
    let mut rows = vec![0.0; keys.len() * DIM];
    var.lookup_or_insert(keys, &mut rows)?;
    let grads: Vec<f32> = rows.iter().map(|x| x - 0.25).collect();
    opt.apply(var, keys, &grads)
}

#[test]
fn a_killed_node_fails_within_the_timeout_and_training_resumes_after_restart() {
    // Persistence on, so the killed node's rows survive its restart too.
    let Some(mut cluster) =
        Cluster::start_with(3, &["--appendonly", "yes", "--appendfsync", "always"])
    else {
        return;
    };
    let var = RedisVariable::open(
        Variable::<i64>::builder("emb")
            .dim(DIM)
            .initializer(Initializer::Constant(0.5)),
        timeouts(cluster.config()),
    )
    .unwrap();
    let opt = SparseAdam::new(ParamsAdam::default()).unwrap();
    let keys: Vec<i64> = (0..500).collect();
    for _ in 0..3 {
        step(&var, &opt, &keys).unwrap();
    }
    let before = snapshot(&var, &keys);

    cluster.servers[1].kill();
    for _ in 0..3 {
        let start = Instant::now();
        let err = step(&var, &opt, &keys).unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(
                backend_kind(&err),
                BackendErrorKind::Unavailable
                    | BackendErrorKind::NotServing
                    | BackendErrorKind::Timeout
            ),
            "{err}"
        );
        assert!(err.to_string().contains("redis"), "{err}");
        assert!(
            took <= COMMAND + CONNECT + SLACK,
            "failed after {took:?}: {err}"
        );
    }

    // A write batch that needs the dead node fails before sending anything
    // to the live ones.
    let err = var.upsert(&keys, &vec![9.0; keys.len() * DIM]).unwrap_err();
    assert_eq!(backend_kind(&err), BackendErrorKind::Unavailable, "{err}");

    cluster.servers[1].restart();
    cluster.wait_ok();
    // The nodes are back; the failed steps and the upsert wrote nothing.
    assert_eq!(snapshot(&var, &keys), before, "every row intact");
    for _ in 0..3 {
        step(&var, &opt, &keys).unwrap();
    }
    let after = snapshot(&var, &keys);
    assert_ne!(after[0], before[0], "training continued");
    assert!(after.iter().flatten().all(|x| x.is_finite()));
}

#[test]
fn a_frozen_server_times_out_and_works_again_when_thawed() {
    let Some(server) = Server::start() else {
        return;
    };
    let var = RedisVariable::open(
        Variable::<i64>::builder("emb").dim(DIM),
        timeouts(server.config()),
    )
    .unwrap();
    var.upsert(&[1, 2], &[3.0; 2 * DIM]).unwrap();
    server.pause();
    let start = Instant::now();
    let err = var.lookup(&[1, 2], &mut [0.0; 2 * DIM]).unwrap_err();
    let took = start.elapsed();
    server.resume();
    assert_eq!(backend_kind(&err), BackendErrorKind::Timeout, "{err}");
    assert!(
        took >= COMMAND && took <= 2 * COMMAND + SLACK,
        "timed out after {took:?}"
    );
    let mut rows = [0.0; 2 * DIM];
    var.lookup(&[1, 2], &mut rows).unwrap();
    assert_eq!(rows, [3.0; 2 * DIM]);
}

#[test]
fn an_absent_server_is_an_error_at_open_within_the_connect_timeout() {
    // Not a port that a test running meanwhile may start its server on.
    let port = dynemb_test_support::servers::absent_port();
    for node in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let start = Instant::now();
        let err = RedisVariable::open(
            Variable::<i64>::builder("emb"),
            timeouts(RedisConfig::with_nodes([node.clone()])),
        )
        .unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(
                backend_kind(&err),
                BackendErrorKind::Unavailable | BackendErrorKind::Timeout
            ),
            "{node}: {err}"
        );
        assert!(took <= CONNECT + SLACK, "{node}: failed after {took:?}");
    }
}

#[test]
fn a_password_is_required_and_used() {
    let Some(server) = Server::start_with(&["--requirepass", "s3cret"]) else {
        return;
    };
    let err = RedisVariable::open(Variable::<i64>::builder("emb"), timeouts(server.config()))
        .unwrap_err();
    assert_eq!(backend_kind(&err), BackendErrorKind::Server, "{err}");
    let var = RedisVariable::open(
        Variable::<i64>::builder("emb"),
        RedisConfig {
            password: Some("s3cret".into()),
            ..timeouts(server.config())
        },
    )
    .unwrap();
    var.upsert(&[1], &[2.0]).unwrap();
    assert_eq!(var.size().unwrap(), 1);
}

#[test]
fn another_dim_or_key_type_is_a_mismatch_at_open() {
    let Some(server) = Server::start() else {
        return;
    };
    RedisVariable::open(Variable::<i64>::builder("emb").dim(4), server.config()).unwrap();
    for err in [
        RedisVariable::open(Variable::<i64>::builder("emb").dim(5), server.config()).unwrap_err(),
        RedisVariable::open(Variable::<u32>::builder("emb").dim(4), server.config()).unwrap_err(),
        RedisVariable::open(
            Variable::<i64>::builder("emb")
                .dim(4)
                .initializer(Initializer::Constant(1.0)),
            server.config(),
        )
        .unwrap_err(),
    ] {
        assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    }
    // Another prefix is another model: no conflict.
    RedisVariable::open(
        Variable::<i64>::builder("emb").dim(5),
        RedisConfig {
            prefix: "model_v2".into(),
            ..server.config()
        },
    )
    .unwrap();
}

/// Bytes `server` has received from its clients.
fn net_input(server: &Server) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_input_bytes:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A call of one batch counts its whole time against its deadline: one
/// whose deadline passes while its commands are built here sends nothing.
#[test]
fn a_call_whose_deadline_passes_while_it_is_built_sends_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let config = RedisConfig {
        buckets: 4096,
        ..server.config()
    };
    let roomy =
        RedisVariable::open(Variable::<i64>::builder("emb").dim(32), config.clone()).unwrap();
    // A 50 ms command timeout: opening may miss it on a loaded machine, so
    // it is tried until it succeeds.
    let tight = (0..200)
        .find_map(|_| {
            RedisVariable::open(
                Variable::<i64>::builder("emb").dim(32),
                RedisConfig {
                    command_timeout: Duration::from_millis(50),
                    ..config.clone()
                },
            )
            .ok()
        })
        .expect("a handle with a 50 ms command timeout opens");
    // Building this batch here takes longer than its 100 ms deadline
    // (sending it and running it would take longer still).
    let keys: Vec<i64> = (0..400_000).collect();
    let deltas = vec![1.0; keys.len() * 32];
    let received = net_input(&server);
    let err = tight
        .accum(&keys, &deltas, &vec![false; keys.len()])
        .unwrap_err();
    assert_eq!(backend_kind(&err), BackendErrorKind::Timeout, "{err}");
    assert!(err.to_string().contains("deadline"), "{err}");
    let err = tight.upsert(&keys, &deltas).unwrap_err();
    assert_eq!(backend_kind(&err), BackendErrorKind::Timeout, "{err}");
    // Only the two `INFO`s reached the server: nothing of the batches.
    assert!(net_input(&server) - received < 1000, "nothing was sent");
    assert_eq!(roomy.size().unwrap(), 0);
    // A small batch fits in its deadline.
    let small = (0..200)
        .find_map(|_| tight.accum(&[1], &[1.0; 32], &[false]).ok())
        .is_some();
    assert!(small);
    assert_eq!(roomy.size().unwrap(), 1);
}
