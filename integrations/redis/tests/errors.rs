//! Bad input is an error that changes nothing, never a panic: wrong
//! lengths, non-finite values, slots of another store or repeated,
//! settings that cannot work. Results that would not be finite are refused
//! per row, as on a local variable.

use dynemb::{Error, Initializer, Partitioner, RestrictPolicy, SlotId, Variable};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::{absent_port, Server};
use std::sync::Arc;

fn open(server: &Server, name: &str) -> RedisVariable<i64> {
    RedisVariable::open(
        Variable::<i64>::builder(name)
            .dim(2)
            .initializer(Initializer::Constant(1.0)),
        server.config(),
    )
    .unwrap()
}

/// Every row and `m` slot of keys 1..=3, and the size.
fn state(var: &RedisVariable<i64>) -> (Vec<f32>, Vec<f32>, usize) {
    let mut rows = vec![0.0; 6];
    var.lookup(&[1, 2, 3], &mut rows).unwrap();
    let mut m = vec![0.0; 6];
    var.lookup_slot(var.slot_id("m").unwrap(), &[1, 2, 3], &mut m)
        .unwrap();
    (rows, m, var.size().unwrap())
}

#[test]
fn bad_input_is_an_error_that_changes_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let var = open(&server, "emb");
    let other = open(&server, "other");
    var.upsert(&[1, 2], &[5.0; 4]).unwrap();
    let m = var.create_slot("m", 0.0).unwrap();
    let foreign = other.create_slot("m", 0.0).unwrap();
    let before = state(&var);
    let mut out = vec![7.0; 3];
    let errors = [
        var.lookup(&[1, 2], &mut out).unwrap_err(),
        var.lookup_or_insert(&[1, 2], &mut out).unwrap_err(),
        var.lookup_with_exists(&[1, 2], &mut [0.0; 4], &mut [false; 1])
            .unwrap_err(),
        var.upsert(&[1], &[1.0; 3]).unwrap_err(),
        var.upsert(&[1, 3], &[1.0, 2.0, f32::NAN, 4.0]).unwrap_err(),
        var.accum(&[1], &[1.0; 2], &[true, true]).unwrap_err(),
        var.accum(&[1, 3], &[1.0, f32::INFINITY, 0.0, 0.0], &[true, false])
            .unwrap_err(),
        var.lookup_slot(foreign, &[1], &mut [0.0; 2]).unwrap_err(),
        var.lookup_slot(SlotId::new(var.store_id(), 5), &[1], &mut [0.0; 2])
            .unwrap_err(),
        var.update_rows(&[1], &[m, m], |_, _, _| {}).unwrap_err(),
        var.update_rows(&[1], &[foreign], |_, _, _| {}).unwrap_err(),
        var.update_rows(&[1], &[SlotId::new(var.store_id(), 99)], |_, _, _| {})
            .unwrap_err(),
        var.lookup_scores(&[1, 2], &mut [0; 1]).unwrap_err(),
        var.create_slot("", 0.0).unwrap_err(),
        var.create_slot("m", 0.5).unwrap_err(),
        var.create_slot("n", f32::NAN).unwrap_err(),
        var.restrict(1, 0).unwrap_err(),
    ];
    assert_eq!(
        out, [7.0; 3],
        "an output buffer of the wrong length is untouched"
    );
    for err in &errors {
        assert!(refused_input(err), "{err}");
    }
    assert!(matches!(
        errors[4],
        Error::NonFinite {
            what: "values",
            index: 2,
            ..
        }
    ));
    assert!(matches!(
        errors[6],
        Error::NonFinite {
            what: "deltas",
            index: 1,
            ..
        }
    ));
    assert_eq!(state(&var), before, "nothing changed");
    assert_eq!(var.slot_names().unwrap(), ["m"]);

    let mut bad_export = var.export_chunks(0);
    assert!(matches!(
        bad_export.next(),
        Some(Err(Error::InvalidArgument(_)))
    ));
    assert!(bad_export.next().is_none());
}

#[test]
fn settings_that_cannot_work_are_errors_at_open() {
    let Some(server) = Server::start() else {
        return;
    };
    let errors = [
        RedisVariable::open(Variable::<i64>::builder("e").dim(0), server.config()).unwrap_err(),
        RedisVariable::open(Variable::<i64>::builder("a{b}"), server.config()).unwrap_err(),
        // A name longer than a checkpoint may record: refused at open,
        // not at the first save.
        RedisVariable::open(
            Variable::<i64>::builder("n".repeat(dynemb::MAX_NAME_BYTES + 1)),
            server.config(),
        )
        .unwrap_err(),
        RedisVariable::open(
            Variable::<i64>::builder("e")
                .dim(3)
                .initializer(Initializer::Values(vec![1.0; 2])),
            server.config(),
        )
        .unwrap_err(),
        RedisVariable::open(
            Variable::<i64>::builder("e"),
            RedisConfig {
                buckets: 0,
                ..server.config()
            },
        )
        .unwrap_err(),
        RedisVariable::open(
            Variable::<i64>::builder("e"),
            RedisConfig::with_nodes(["no-port"]),
        )
        .unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }
}

/// What a Redis table cannot honour is refused at open, before any
/// server is asked (the config names a port nothing listens on): more
/// than one shard and a custom partitioner, each with an error that says
/// why; an empty name, and one with a colon or braces. A capacity hint is
/// accepted (it reaches the servers, whose absence is then the error).
#[test]
fn settings_a_redis_table_cannot_honour_are_refused_before_connecting() {
    let nowhere = RedisConfig::with_nodes([format!("127.0.0.1:{}", absent_port())]);
    let refused =
        |builder: dynemb::VariableBuilder<i64>| match RedisVariable::open(builder, nowhere.clone())
            .unwrap_err()
        {
            Error::InvalidArgument(message) => message,
            other => panic!("not refused as invalid: {other}"),
        };
    let shards = refused(Variable::builder("e").dim(2).shards(2));
    assert!(
        shards.contains("shards = 2") && shards.contains("RedisConfig::buckets"),
        "{shards}"
    );
    let custom = refused(
        Variable::builder("e")
            .partitioner(Partitioner::Custom(Arc::new(|bits, n| bits as usize % n))),
    );
    assert!(custom.contains("custom partitioner"), "{custom}");
    let empty = refused(Variable::builder(""));
    assert!(empty.contains("must not be empty"), "{empty}");
    // Prefix "ctr" with name "v1:emb" would share the keys of prefix
    // "ctr:v1" with name "emb"; braces would move the hash tag.
    for name in ["v1:emb", "a{b}"] {
        let message = refused(Variable::builder(name));
        assert!(
            message.contains("must not be empty or contain"),
            "{message}"
        );
    }
    // The checks every table's settings get, not duplicated here.
    let dim = refused(Variable::builder("e").dim(dynemb::MAX_DIM + 1));
    assert!(dim.contains("dim"), "{dim}");
    let hint =
        RedisVariable::open(Variable::<i64>::builder("e").init_size(1 << 20), nowhere).unwrap_err();
    assert!(matches!(hint, Error::Backend { .. }), "{hint}");
}

#[test]
fn results_that_are_not_finite_are_refused_per_row() {
    let Some(server) = Server::start() else {
        return;
    };
    let var = open(&server, "emb");
    var.upsert(&[1, 2], &[3e38, 1.0, 1.0, 1.0]).unwrap();
    let err = var
        .accum(
            &[2, 1, 3],
            &[1.0, 1.0, 3e38, 0.0, 2.0, 2.0],
            &[true, true, false],
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::NonFinite { what: "accum result", index: 1, value } if value == f32::INFINITY),
        "{err}"
    );
    let mut rows = vec![0.0; 6];
    var.lookup(&[1, 2, 3], &mut rows).unwrap();
    assert_eq!(
        rows,
        [3e38, 1.0, 2.0, 2.0, 2.0, 2.0],
        "row 1 kept, the others written"
    );

    let m = var.create_slot("m", 0.0).unwrap();
    let err = var
        .update_rows(&[2, 4, 5], &[m], |i, values, slots| {
            values[0] = if i == 1 { f32::NAN } else { 9.0 };
            slots[0] = 1.0;
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NonFinite {
                what: "update_rows result",
                index: 1,
                ..
            }
        ),
        "{err}"
    );
    let mut exists = [false; 3];
    var.lookup_with_exists(&[2, 4, 5], &mut [0.0; 6], &mut exists)
        .unwrap();
    assert_eq!(
        exists,
        [true, false, true],
        "the refused new key is not inserted"
    );
}

/// The bucket of a key's bits among `buckets` (the storage format's hash,
/// SplitMix64's finalizer, see `layout.rs`).
fn bucket_of(bits: u64, buckets: u32) -> u32 {
    let mut z = bits;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % u64::from(buckets)) as u32
}

/// Everything a caller can see of `var` for `keys`: rows, each slot's
/// rows, scores, the slot list and the size.
type Seen = (Vec<f32>, Vec<Vec<f32>>, Vec<u64>, Vec<String>, usize);

fn seen(var: &RedisVariable<i64>, keys: &[i64]) -> Seen {
    let dim = var.dim();
    let mut rows = vec![0.0; keys.len() * dim];
    var.lookup(keys, &mut rows).unwrap();
    let names = var.slot_names().unwrap();
    let slots = names
        .iter()
        .map(|name| {
            let mut out = vec![0.0; keys.len() * dim];
            var.lookup_slot(var.slot_id(name).unwrap(), keys, &mut out)
                .unwrap();
            out
        })
        .collect();
    let mut scores = vec![0; keys.len()];
    var.lookup_scores(keys, &mut scores).unwrap();
    (rows, slots, scores, names, var.size().unwrap())
}

/// Every "checked before anything changes" promise of `RedisVariable`,
/// each made to fail on its last check: the call is an error and nothing
/// a caller can see changed (rows, slot rows, scores, slots, size; an
/// output buffer is untouched).
#[test]
fn each_checked_first_promise_fails_on_its_last_check_and_changes_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let var = RedisVariable::open(
        Variable::<i64>::builder("emb")
            .dim(2)
            .restrict_policy(RestrictPolicy::Frequency),
        server.config(),
    )
    .unwrap();
    let keys = [1, 2, 3, 4];
    var.upsert(&[1, 2], &[5.0; 4]).unwrap();
    var.upsert(&[2], &[6.0; 2]).unwrap();
    let m = var.create_slot("m", 0.25).unwrap();
    var.update_rows(&[1], &[m], |_, _, slot| slot.fill(9.0))
        .unwrap();
    // A checkpoint with Timestamp scores and a slot the variable lacks.
    let local = Variable::<i64>::builder("emb")
        .dim(2)
        .restrict_policy(RestrictPolicy::Timestamp)
        .build()
        .unwrap();
    local.upsert(&[3], &[1.0; 2]).unwrap();
    local.create_slot("v", 0.0).unwrap();
    local.save(dir.path().join("timestamps")).unwrap();
    let before = seen(&var, &keys);

    let mut out = [7.0f32; 4];
    let mut exists = [true; 2];
    let failures: Vec<(&str, Error)> = vec![
        // lookup_with_exists: `exists` fits, `out` (checked last) does not.
        (
            "lookup_with_exists",
            var.lookup_with_exists(&[1, 2], &mut out[..3], &mut exists)
                .unwrap_err(),
        ),
        // upsert: lengths fit, a value (checked last) is not finite.
        (
            "upsert",
            var.upsert(&[1, 3], &[1.0, 2.0, 3.0, f32::NAN]).unwrap_err(),
        ),
        // accum: lengths fit, a delta (checked last) is not finite.
        (
            "accum",
            var.accum(&[4, 1], &[1.0, 1.0, f32::NEG_INFINITY, 0.0], &[false, true])
                .unwrap_err(),
        ),
        // update_rows: both slots are this table's and exist; the second
        // repeats the first (the last check).
        (
            "update_rows",
            var.update_rows(&[1, 4], &[m, m], |_, v, _| v.fill(0.0))
                .unwrap_err(),
        ),
        // create_slot: a good name and value; the slot exists with another
        // initial value (the last check).
        ("create_slot", var.create_slot("m", 0.5).unwrap_err()),
        // restore and load: the checkpoint is whole and its slot fits; its
        // scores are of another policy (the last check).
        (
            "restore",
            var.restore(dir.path().join("timestamps")).unwrap_err(),
        ),
        ("load", var.load(dir.path().join("timestamps")).unwrap_err()),
        // restrict: the policy is there, a stored row is corrupt (found by
        // the score passes, before anything is removed); see
        // whole_table.rs. A bad chunk size for export_chunks:
        (
            "export_chunks",
            var.export_chunks(0).next().unwrap().unwrap_err(),
        ),
    ];
    for (what, err) in &failures {
        assert!(refused_input(err), "{what}: {err}");
        assert_eq!(seen(&var, &keys), before, "{what} changed nothing");
    }
    assert_eq!(out, [7.0; 4], "an output buffer is untouched");
    assert_eq!(exists, [true; 2]);

    // The slot room, checked just before the policy: a variable with
    // every slot taken and a checkpoint bringing one more.
    for i in 1..dynemb::MAX_SLOTS {
        var.create_slot(&format!("s{i}"), 0.0).unwrap();
    }
    let full = seen(&var, &keys);
    let same_policy = Variable::<i64>::builder("emb")
        .dim(2)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    same_policy.upsert(&[3], &[1.0; 2]).unwrap();
    same_policy.create_slot("v", 0.0).unwrap();
    same_policy.save(dir.path().join("one_slot_more")).unwrap();
    for replace in [true, false] {
        let err = if replace {
            var.restore(dir.path().join("one_slot_more"))
        } else {
            var.load(dir.path().join("one_slot_more"))
        }
        .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert_eq!(seen(&var, &keys), full, "nothing changed");
    }
    let err = var.create_slot("one more", 0.0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(seen(&var, &keys), full, "nothing changed");

    // A corrupt stored row: a lookup_or_insert that meets it inserts
    // nothing (every row read is decoded before anything is written).
    let mut conn = server.connection();
    let _: () = redis::cmd("HSET")
        .arg(format!("dynemb:emb:{{{}}}", bucket_of(100, 256)))
        .arg(&100i64.to_le_bytes()[..])
        .arg(b"short")
        .query(&mut conn)
        .unwrap();
    let size = var.size().unwrap();
    let mut rows = [7.0f32; 4];
    let err = var.lookup_or_insert(&[100, 5], &mut rows).unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    assert_eq!(rows, [7.0; 4], "untouched");
    assert_eq!(var.size().unwrap(), size, "nothing inserted");
}

/// Whether `err` is one of the errors that refuse a call's input.
fn refused_input(err: &Error) -> bool {
    matches!(
        err,
        Error::LengthMismatch { .. }
            | Error::NonFinite { .. }
            | Error::InvalidArgument(_)
            | Error::Mismatch { .. }
    )
}
