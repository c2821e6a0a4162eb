//! The row lifecycle of a Redis table. `expire` removes exactly the rows
//! not written since the cutoff, with their slots and scores, under both
//! forms of the writes, on a single server and on a cluster; it agrees
//! with a local `Variable` given the same writes; a row written while it
//! runs stays; without the Timestamp policy it is refused as a local
//! variable refuses it, and a bucket being restored stops it. A capacity,
//! admission or an eviction listener is refused at open.
//!
//! Ages come from sleeping between phases of writes: the age asked of
//! `expire` is measured from an instant halfway through a 300 ms gap, so
//! the cutoff falls 150 ms from the writes on either side of the gap
//! however long the writes themselves take.

use dynemb::{
    Admission, Dtype, EmbeddingTable, Error, Initializer, RestrictPolicy, SlotId, Variable,
};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::{absent_port, module_calls, unique_name, Cluster, Form, Server};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const DIM: usize = 2;

fn open(config: RedisConfig, name: &str, policy: Option<RestrictPolicy>) -> RedisVariable<i64> {
    let builder = Variable::<i64>::builder(name)
        .dim(DIM)
        .initializer(Initializer::Constant(0.5));
    let builder = match policy {
        Some(policy) => builder.restrict_policy(policy),
        None => builder,
    };
    RedisVariable::open(builder, config).unwrap()
}

fn values(keys: &[i64]) -> Vec<f32> {
    keys.iter()
        .flat_map(|&k| (0..DIM).map(move |j| (k * 10 + j as i64) as f32))
        .collect()
}

/// Sleeps 300 ms and returns the instant halfway through: the writes
/// before the gap are at least 150 ms older than it, those after at
/// least 150 ms younger.
fn gap() -> Instant {
    std::thread::sleep(Duration::from_millis(150));
    let middle = Instant::now();
    std::thread::sleep(Duration::from_millis(150));
    middle
}

/// Which of `keys` are present.
fn present<T: EmbeddingTable<Key = i64>>(table: &T, keys: &[i64]) -> Vec<bool> {
    let mut exists = vec![false; keys.len()];
    table
        .lookup_with_exists(keys, &mut vec![0.0; keys.len() * DIM], &mut exists)
        .unwrap();
    exists
}

fn slot_rows<T: EmbeddingTable<Key = i64>>(table: &T, slot: SlotId, keys: &[i64]) -> Vec<f32> {
    let mut out = vec![0.0; keys.len() * DIM];
    table.lookup_slot(slot, keys, &mut out).unwrap();
    out
}

/// Write A, wait, write B and rewrite one key of A: `expire` removes A
/// but the rewritten key, rows, slots and scores; what remains is B and
/// that key, untouched. Then the edge ages: an hour (nothing), a span
/// longer than the clock (nothing, no round trip needed) and zero
/// (everything).
fn expire_removes_the_old_rows(config: RedisConfig, servers: &[&Server], form: Form) {
    let var = open(
        form.config(RedisConfig {
            buckets: 16,
            ..config
        }),
        &unique_name("expire"),
        Some(RestrictPolicy::Timestamp),
    );
    assert_eq!(var.uses_module(), form == Form::Module);
    let m = var.create_slot("m", 0.25).unwrap();
    let old: Vec<i64> = (0..100).collect();
    let young: Vec<i64> = (100..200).collect();
    let all: Vec<i64> = (0..200).collect();
    var.upsert(&old, &values(&old)).unwrap();
    var.update_rows(&old, &[m], |_, _, slots| slots.fill(3.0))
        .unwrap();
    let middle = gap();
    var.lookup_or_insert(&young, &mut vec![0.0; young.len() * DIM])
        .unwrap();
    var.update_rows(&[5], &[m], |_, row, slots| {
        row.fill(7.0);
        slots.fill(4.0);
    })
    .unwrap();
    let mut scores_before = vec![0; all.len()];
    var.lookup_scores(&all, &mut scores_before).unwrap();

    let module_before = module_calls(servers.iter().copied());
    assert_eq!(var.expire(middle.elapsed()).unwrap(), 99, "{form:?}");
    let module_ran = module_calls(servers.iter().copied()) > module_before;
    assert_eq!(module_ran, form == Form::Module, "expire's form");

    assert_eq!(var.size().unwrap(), 101, "{form:?}");
    let exists = present(&var, &all);
    for (&key, &there) in all.iter().zip(&exists) {
        assert_eq!(there, key == 5 || key >= 100, "{form:?}: key {key}");
    }
    let mut scores = vec![0; all.len()];
    var.lookup_scores(&all, &mut scores).unwrap();
    for (i, &key) in all.iter().enumerate() {
        let want = if exists[i] { scores_before[i] } else { 0 };
        assert_eq!(scores[i], want, "{form:?}: score of key {key}");
    }
    let mut rows = vec![0.0; 2 * DIM];
    var.lookup(&[5, 150], &mut rows).unwrap();
    assert_eq!(rows, [7.0, 7.0, 0.5, 0.5], "{form:?}: kept rows unchanged");
    // A removed key's slots went with its row: written back, it starts
    // from the slot's initial value.
    var.upsert(&[7], &values(&[7])).unwrap();
    assert_eq!(
        slot_rows(&var, m, &[7, 5]),
        [0.25, 0.25, 4.0, 4.0],
        "{form:?}"
    );

    assert_eq!(var.lifecycle_stats().expired, 99);
    let twin = var.clone();
    assert_eq!(twin.expire(Duration::from_secs(3600)).unwrap(), 0);
    assert_eq!(twin.expire(Duration::MAX).unwrap(), 0);
    assert_eq!(EmbeddingTable::expire(&twin, Duration::ZERO).unwrap(), 102);
    assert_eq!(var.size().unwrap(), 0);
    let stats = EmbeddingTable::lifecycle_stats(&var).unwrap();
    assert_eq!(
        (stats.expired, stats.evicted, stats.not_admitted_reads),
        (201, 0, 0),
        "clones share the count"
    );
    assert_eq!(var.capacity(), None);
    assert_eq!(EmbeddingTable::capacity(&var), None);
    var.destroy().unwrap();
}

#[test]
fn expire_removes_exactly_the_rows_not_written_since_the_cutoff_on_a_single_server() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        expire_removes_the_old_rows(server.config(), &[&server], form);
    }
}

#[test]
fn expire_removes_exactly_the_rows_not_written_since_the_cutoff_on_a_cluster() {
    let Some(cluster) = Cluster::start(3) else {
        return;
    };
    let servers: Vec<&Server> = cluster.servers.iter().collect();
    for form in Form::available() {
        expire_removes_the_old_rows(cluster.config(), &servers, form);
    }
}

/// Phase `phase` of the writes both tables get: every kind of write
/// (upsert, accum that adds or inserts, accum that is ignored, training
/// reads of present and absent keys, optimizer updates of present and
/// absent keys, removal), rewriting some keys of the phases before.
fn write_phase<T: EmbeddingTable<Key = i64>>(table: &T, slot: SlotId, phase: usize) {
    match phase {
        0 => {
            let keys: Vec<i64> = (0..60).collect();
            table.upsert(&keys, &values(&keys)).unwrap();
            let trained: Vec<i64> = (20..40).collect();
            table
                .update_rows(&trained, &[slot], |i, row, slots| {
                    row[0] += 1.0;
                    slots.fill(i as f32);
                })
                .unwrap();
            let added: Vec<i64> = (0..10).collect();
            table
                .accum(&added, &vec![1.0; added.len() * DIM], &[true; 10])
                .unwrap();
        }
        1 => {
            let keys: Vec<i64> = (50..80).collect();
            table.upsert(&keys, &values(&keys)).unwrap();
            let keys = [0, 1, 2, 3, 4, 90, 91, 92, 10, 11];
            let exists = [
                true, true, true, true, true, false, false, false, false, false,
            ];
            // 0..5 add, 90..93 are inserted, 10 and 11 are ignored
            // (present, flagged absent): not rewritten.
            table
                .accum(&keys, &vec![2.0; keys.len() * DIM], &exists)
                .unwrap();
            let read: Vec<i64> = (25..35).chain(100..105).collect();
            table
                .lookup_or_insert(&read, &mut vec![0.0; read.len() * DIM])
                .unwrap();
            table
                .update_rows(&[36, 37, 200], &[slot], |_, row, slots| {
                    row[1] -= 1.0;
                    slots[0] += 5.0;
                })
                .unwrap();
            table.remove(&[38, 51]).unwrap();
        }
        _ => {
            table.upsert(&[1, 61, 300], &values(&[1, 61, 300])).unwrap();
            table
                .update_rows(&[22, 101], &[slot], |_, row, _| row[0] *= 2.0)
                .unwrap();
        }
    }
}

/// Every row, sorted by key, with its slot row: what the two tables must
/// agree on.
fn state<T: EmbeddingTable<Key = i64>>(table: &T, slot: SlotId) -> (Vec<i64>, Vec<f32>, Vec<f32>) {
    let (keys, values) = table.export().unwrap();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| keys[i]);
    let sorted: Vec<i64> = order.iter().map(|&i| keys[i]).collect();
    let rows = order
        .iter()
        .flat_map(|&i| values[i * DIM..(i + 1) * DIM].iter().copied())
        .collect();
    let slots = slot_rows(table, slot, &sorted);
    (sorted, rows, slots)
}

fn agrees_with_a_local_variable(config: RedisConfig, form: Form) {
    let name = unique_name("expire_parity");
    let remote = open(
        form.config(RedisConfig {
            buckets: 8,
            ..config
        }),
        &name,
        Some(RestrictPolicy::Timestamp),
    );
    let local = Variable::<i64>::builder(&name)
        .dim(DIM)
        .initializer(Initializer::Constant(0.5))
        .restrict_policy(RestrictPolicy::Timestamp)
        .build()
        .unwrap();
    let (remote_slot, local_slot) = (
        remote.create_slot("m", 0.25).unwrap(),
        local.create_slot("m", 0.25).unwrap(),
    );
    let mut middles = Vec::new();
    for phase in 0..3 {
        if phase > 0 {
            middles.push(gap());
        }
        write_phase(&local, local_slot, phase);
        write_phase(&remote, remote_slot, phase);
    }
    assert_eq!(
        state(&remote, remote_slot),
        state(&local, local_slot),
        "{form:?}: the same writes"
    );
    for (step, middle) in middles.iter().enumerate() {
        let older_than = middle.elapsed();
        let want = local.expire(older_than).unwrap();
        assert!(want > 0, "step {step} expires something");
        assert_eq!(
            remote.expire(older_than).unwrap(),
            want,
            "{form:?}: step {step}"
        );
        assert_eq!(
            state(&remote, remote_slot),
            state(&local, local_slot),
            "{form:?}: after step {step}"
        );
        assert_eq!(
            remote.lifecycle_stats().expired,
            local.lifecycle_stats().expired
        );
    }
    remote.destroy().unwrap();
}

#[test]
fn expire_agrees_with_a_local_variable_on_the_same_writes() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        agrees_with_a_local_variable(server.config(), form);
    }
    let Some(cluster) = Cluster::start(3) else {
        return;
    };
    for form in Form::available() {
        agrees_with_a_local_variable(cluster.config(), form);
    }
}

/// A writer rewrites keys of an old table while `expire` prunes it, in
/// several round trips: every key written after `expire` started is
/// there afterwards (kept, or written back after its bucket was pruned),
/// and every other key is gone.
#[test]
fn rows_written_while_expire_runs_are_kept() {
    const ROWS: i64 = 40_000;
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        let config = form.config(RedisConfig {
            buckets: 8,
            ..server.config()
        });
        let var = open(
            config,
            &unique_name("expire_race"),
            Some(RestrictPolicy::Timestamp),
        );
        let keys: Vec<i64> = (0..ROWS).collect();
        for batch in keys.chunks(10_000) {
            var.upsert(batch, &values(batch)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(600));
        let (started, finished) = (AtomicBool::new(false), AtomicBool::new(false));
        let written = Mutex::new(HashSet::new());
        let removed = std::thread::scope(|s| {
            s.spawn(|| {
                while !started.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                // Keys spread over every bucket, a batch per round trip,
                // until `expire` is done.
                for round in 0..ROWS / 500 {
                    let batch: Vec<i64> = (0..500).map(|i| i * (ROWS / 500) + round).collect();
                    var.upsert(&batch, &values(&batch)).unwrap();
                    written.lock().unwrap().extend(batch);
                    if finished.load(Ordering::Acquire) {
                        break;
                    }
                }
            });
            started.store(true, Ordering::Release);
            let removed = var.expire(Duration::from_millis(300)).unwrap();
            finished.store(true, Ordering::Release);
            removed
        });
        let written = written.into_inner().unwrap();
        let exists = present(&var, &keys);
        for (&key, &there) in keys.iter().zip(&exists) {
            assert_eq!(there, written.contains(&key), "{form:?}: key {key}");
        }
        assert_eq!(var.size().unwrap(), written.len(), "{form:?}");
        let rows = ROWS as usize;
        assert!(
            (rows - written.len()..=rows).contains(&removed),
            "{form:?}: {removed} removed, {} written meanwhile",
            written.len()
        );
        var.destroy().unwrap();
    }
}

/// Without the Timestamp policy `expire` is the error a local variable
/// gives, word for word, and nothing changes.
#[test]
fn expire_without_the_timestamp_policy_is_refused_as_on_a_local_variable() {
    let Some(server) = Server::start() else {
        return;
    };
    for policy in [None, Some(RestrictPolicy::Frequency)] {
        let name = unique_name("expire_refused");
        let var = open(server.config(), &name, policy);
        var.upsert(&[1, 2], &values(&[1, 2])).unwrap();
        let builder = Variable::<i64>::builder(&name).dim(DIM);
        let local = match policy {
            Some(policy) => builder.restrict_policy(policy),
            None => builder,
        }
        .build()
        .unwrap();
        let want = local.expire(Duration::ZERO).unwrap_err();
        let got = var.expire(Duration::ZERO).unwrap_err();
        assert!(matches!(got, Error::InvalidArgument(_)), "{got}");
        assert_eq!(got.to_string(), want.to_string());
        assert!(got.to_string().contains("Timestamp"), "{got}");
        assert_eq!(var.size().unwrap(), 2, "nothing removed");
        assert_eq!(var.lifecycle_stats().expired, 0);
        var.destroy().unwrap();
    }
}

/// A bucket a restore has marked (the state a restore that started after
/// `expire` checked the metadata leaves): pruning it is an error naming
/// the checkpoint, and nothing in it is removed.
#[test]
fn expire_stops_at_a_bucket_being_restored() {
    let Some(server) = Server::start() else {
        return;
    };
    for form in Form::available() {
        let name = unique_name("expire_marked");
        let config = form.config(RedisConfig {
            buckets: 4,
            ..server.config()
        });
        let var = open(config, &name, Some(RestrictPolicy::Timestamp));
        let keys: Vec<i64> = (0..200).collect();
        var.upsert(&keys, &values(&keys)).unwrap();
        let marked = format!("dynemb:{name}:{{3}}");
        let mut conn = server.connection();
        let rows_before: u64 = redis::cmd("HLEN").arg(&marked).query(&mut conn).unwrap();
        let _: () = redis::cmd("HSET")
            .arg(&marked)
            .arg("restoring")
            .arg("/checkpoints/new")
            .query(&mut conn)
            .unwrap();
        let err = var.expire(Duration::ZERO).unwrap_err();
        assert!(
            matches!(&err, Error::Backend { message, .. } if message.contains("/checkpoints/new")),
            "{form:?}: {err}"
        );
        let rows_after: u64 = redis::cmd("HLEN").arg(&marked).query(&mut conn).unwrap();
        assert_eq!(rows_after, rows_before + 1, "{form:?}: nothing removed");
    }
}

/// A capacity, admission and an eviction listener are refused before any
/// server is asked (the config names a port nothing listens on): a
/// capacity and admission each with an error naming it and what bounds a
/// Redis table instead; a listener alone is refused by every table's
/// checks (it needs a capacity), and with a capacity by the capacity.
#[test]
fn capacity_admission_and_eviction_listener_are_refused_at_open() {
    let nowhere = RedisConfig::with_nodes([format!("127.0.0.1:{}", absent_port())]);
    let refused = |builder: dynemb::VariableBuilder<i64>| match RedisVariable::open(
        builder.dim(DIM),
        nowhere.clone(),
    )
    .unwrap_err()
    {
        Error::InvalidArgument(message) => message,
        other => panic!("not refused as invalid: {other}"),
    };
    let capacity = refused(Variable::builder("c").capacity(1000));
    assert!(capacity.contains("a capacity"), "{capacity}");
    let admission = refused(Variable::builder("a").admission(Admission::Exact { min_count: 2 }));
    assert!(admission.contains("admission"), "{admission}");
    let listener = refused(Variable::builder("l").on_evict(|_| {}));
    assert!(listener.contains("on_evict"), "{listener}");
    let both = refused(Variable::builder("b").capacity(1000).on_evict(|_| {}));
    assert!(both.contains("a capacity"), "{both}");
    for message in [capacity, admission, both] {
        assert!(message.contains("expire or restrict"), "{message}");
    }
}

/// Half-precision values or slots are refused before any server is asked:
/// a Redis table stores f32 (its scripts add in f32, so they could not
/// round as a local half-precision table does).
#[test]
fn half_precision_dtypes_are_refused_at_open() {
    let nowhere = RedisConfig::with_nodes([format!("127.0.0.1:{}", absent_port())]);
    for (builder, column, dtype) in [
        (
            Variable::builder("v").value_dtype(Dtype::Bf16),
            "value",
            "bf16",
        ),
        (
            Variable::builder("v").value_dtype(Dtype::F16),
            "value",
            "f16",
        ),
        (
            Variable::builder("s").slot_dtype(Dtype::Bf16),
            "slot",
            "bf16",
        ),
    ] {
        match RedisVariable::<i64>::open(builder.dim(DIM), nowhere.clone()).unwrap_err() {
            Error::InvalidArgument(message) => assert!(
                message.contains(&format!("{column} dtype cannot be {dtype}"))
                    && message.contains("stores f32"),
                "{message}"
            ),
            other => panic!("not refused as invalid: {other}"),
        }
    }
}
