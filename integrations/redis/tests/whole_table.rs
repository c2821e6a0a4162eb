//! Whole-table operations on a table larger than one round trip's
//! deadline: `size`, `export_chunks`, `save`, `restore`, `restrict` and
//! `clear` stream it in bounded round trips (each well inside the
//! deadline) where one batch over the whole table times out, under both
//! forms of the writes. `restrict` keeps exactly the `num_reserved`
//! highest-scored rows, ties falling in bucket order.

use dynemb::{BackendErrorKind, Error, Initializer, RestrictPolicy, Variable};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::{module_calls, unique_name, Form, Server};
use std::collections::HashSet;
use std::time::Duration;

/// Rows of the large table.
const ROWS: i64 = 500_000;

const DIM: usize = 4;

/// The command timeout of the handle that runs the whole-table
/// operations: a batch of every row takes several times its deadline.
const TIGHT: Duration = Duration::from_millis(200);

fn open(config: RedisConfig, name: &str) -> RedisVariable<i64> {
    RedisVariable::open(
        Variable::<i64>::builder(name)
            .dim(DIM)
            .initializer(Initializer::Zeros)
            .restrict_policy(RestrictPolicy::Frequency),
        config,
    )
    .unwrap()
}

fn values(keys: &[i64]) -> Vec<f32> {
    keys.iter()
        .flat_map(|&k| (0..DIM).map(move |j| (k * 10 + j as i64) as f32))
        .collect()
}

/// Upserts `keys` in batches (each a frequency score of one more).
fn upsert_all(var: &RedisVariable<i64>, keys: impl Iterator<Item = i64>) {
    let keys: Vec<i64> = keys.collect();
    for batch in keys.chunks(50_000) {
        var.upsert(batch, &values(batch)).unwrap();
    }
}

fn is_timeout(err: &Error) -> bool {
    matches!(
        err,
        Error::Backend {
            kind: BackendErrorKind::Timeout,
            ..
        }
    )
}

#[test]
fn whole_table_operations_stream_a_table_larger_than_a_round_trip_with_the_module() {
    whole_table_operations(Form::Module);
}

#[test]
fn whole_table_operations_stream_a_table_larger_than_a_round_trip_with_the_scripts() {
    whole_table_operations(Form::Lua);
}

fn whole_table_operations(form: Form) {
    let Some(server) = Server::start() else {
        return;
    };
    if !form.is_available() {
        return;
    }
    let name = unique_name("big");
    let config = form.config(RedisConfig {
        buckets: 512,
        ..server.config()
    });
    let roomy = open(config.clone(), &name);
    assert_eq!(roomy.uses_module(), form == Form::Module);
    // Every key scores 1, the lower half 2.
    upsert_all(&roomy, 0..ROWS);
    upsert_all(&roomy, 0..ROWS / 2);
    let tight = open(
        RedisConfig {
            command_timeout: TIGHT,
            ..config
        },
        &name,
    );
    let calls_before = module_calls([&server]);

    // One batch over the whole table does not fit in a deadline (each key
    // twice, so that it does not on a fast machine either).
    let all: Vec<i64> = (0..ROWS).chain(0..ROWS).collect();
    let err = tight
        .lookup(&all, &mut vec![0.0; all.len() * DIM])
        .unwrap_err();
    assert!(is_timeout(&err), "{err}");

    assert_eq!(tight.size().unwrap(), ROWS as usize);
    let mut seen = HashSet::new();
    for chunk in tight.export_chunks(20_000) {
        let (keys, rows) = chunk.unwrap();
        assert!(keys.len() <= 20_000);
        assert_eq!(rows, values(&keys));
        for k in keys {
            assert!(seen.insert(k), "key {k} exported twice");
        }
    }
    assert_eq!(seen.len(), ROWS as usize);
    drop(seen);

    let dir = tempfile::tempdir().unwrap();
    tight.save(dir.path().join("c")).unwrap();
    roomy.upsert(&[-1], &[0.5; DIM]).unwrap();
    tight.restore(dir.path().join("c")).unwrap();
    assert_eq!(tight.size().unwrap(), ROWS as usize, "-1 is gone");

    // Keep the upper half's last 1000 ties and the whole lower half.
    let reserved = (ROWS / 2 + 1000) as usize;
    let removed = tight.restrict(reserved, 0).unwrap();
    assert_eq!(removed, ROWS as usize - reserved);
    assert_eq!(tight.size().unwrap(), reserved);
    let lower: Vec<i64> = (0..ROWS / 2).collect();
    let mut exists = vec![false; lower.len()];
    roomy
        .lookup_with_exists(&lower, &mut vec![0.0; lower.len() * DIM], &mut exists)
        .unwrap();
    assert!(exists.iter().all(|&e| e), "every higher-scored row stays");
    let mut scores = vec![0; lower.len()];
    roomy.lookup_scores(&lower, &mut scores).unwrap();
    assert!(scores.iter().all(|&s| s == 2), "restored scores");

    tight.clear().unwrap();
    assert_eq!(tight.size().unwrap(), 0);
    let module_ran = module_calls([&server]) > calls_before;
    assert_eq!(module_ran, form == Form::Module, "restrict's form");
}

#[test]
fn restrict_keeps_exactly_the_highest_scored_rows_and_refuses_a_corrupt_table_under_both_forms() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        let config = form.config(RedisConfig {
            buckets: 8,
            ..server.config()
        });
        let var = open(config, &unique_name("small"));
        // 25 keys each scoring 1, 2, 3 and 4.
        let keys: Vec<i64> = (0..100).collect();
        for round in 0..4 {
            let batch: Vec<i64> = keys.iter().copied().filter(|k| k % 4 >= round).collect();
            var.upsert(&batch, &values(&batch)).unwrap();
        }
        assert_eq!(var.restrict(30, 100).unwrap(), 0, "not above the trigger");
        assert_eq!(var.restrict(30, 99).unwrap(), 70);
        let mut scores = vec![0; keys.len()];
        var.lookup_scores(&keys, &mut scores).unwrap();
        let mut exists = vec![false; keys.len()];
        var.lookup_with_exists(&keys, &mut vec![0.0; keys.len() * DIM], &mut exists)
            .unwrap();
        let kept: Vec<u64> = (0..keys.len())
            .filter(|&i| exists[i])
            .map(|i| scores[i])
            .collect();
        assert_eq!(kept.len(), 30, "{form:?}");
        assert_eq!(kept.iter().filter(|&&s| s == 4).count(), 25, "{form:?}");
        assert_eq!(kept.iter().filter(|&&s| s == 3).count(), 5, "{form:?}");
        assert_eq!(
            var.restrict(30, 0).unwrap(),
            0,
            "nothing above num_reserved"
        );

        // A corrupt row anywhere: an error before anything is removed.
        let mut conn = server.connection();
        let _: () = redis::cmd("HSET")
            .arg(format!("dynemb:{}:{{7}}", var.name()))
            .arg(&12345i64.to_le_bytes()[..])
            .arg(b"short")
            .query(&mut conn)
            .unwrap();
        let err = var.restrict(1, 0).unwrap_err();
        assert!(matches!(err, Error::Backend { .. }), "{form:?}: {err}");
        assert_eq!(var.size().unwrap(), 31, "{form:?}: nothing removed");
    }
}

#[test]
fn more_buckets_than_one_round_trip_counts_are_passed_a_window_at_a_time() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        // 4096 buckets per round trip: three windows, the last partial.
        let var = open(
            form.config(RedisConfig {
                buckets: 9000,
                ..server.config()
            }),
            &unique_name("wide"),
        );
        let keys: Vec<i64> = (0..20_000).collect();
        upsert_all(&var, keys.iter().copied());
        upsert_all(&var, 0..10_000);
        assert_eq!(var.size().unwrap(), keys.len());
        let mut exported: Vec<i64> = var
            .export_chunks(3000)
            .flat_map(|chunk| chunk.unwrap().0)
            .collect();
        exported.sort();
        assert_eq!(exported, keys, "{form:?}");
        let dir = tempfile::tempdir().unwrap();
        var.save(dir.path().join("c")).unwrap();
        var.clear().unwrap();
        assert_eq!(var.size().unwrap(), 0);
        var.restore(dir.path().join("c")).unwrap();
        assert_eq!(var.size().unwrap(), keys.len());
        assert_eq!(var.restrict(10_000, 0).unwrap(), 10_000);
        let mut exists = vec![false; 10_000];
        var.lookup_with_exists(&keys[..10_000], &mut vec![0.0; 10_000 * DIM], &mut exists)
            .unwrap();
        assert!(
            exists.iter().all(|&e| e),
            "{form:?}: the higher-scored half stays"
        );
        var.clear().unwrap();
        assert_eq!(var.size().unwrap(), 0);
    }
}
