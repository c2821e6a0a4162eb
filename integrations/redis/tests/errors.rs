//! Bad input is an error that changes nothing, never a panic: wrong
//! lengths, non-finite values, slots of another store or repeated,
//! settings that cannot work. Results that would not be finite are refused
//! per row, as on a local variable.

mod support;

use dynemb::{Error, Initializer, SlotId};
use dynemb_redis::{RedisConfig, RedisVariable};
use support::Server;

fn open(server: &Server, name: &str) -> RedisVariable<i64> {
    RedisVariable::<i64>::builder(name)
        .dim(2)
        .initializer(Initializer::Constant(1.0))
        .config(server.config())
        .build()
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
    let server = Server::start();
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
        assert!(
            matches!(
                err,
                Error::LengthMismatch { .. }
                    | Error::NonFinite { .. }
                    | Error::InvalidArgument(_)
                    | Error::Mismatch { .. }
            ),
            "{err}"
        );
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
    let server = Server::start();
    let errors = [
        RedisVariable::<i64>::builder("e")
            .dim(0)
            .config(server.config())
            .build()
            .unwrap_err(),
        RedisVariable::<i64>::builder("a{b}")
            .config(server.config())
            .build()
            .unwrap_err(),
        RedisVariable::<i64>::builder("e")
            .dim(3)
            .initializer(Initializer::Values(vec![1.0; 2]))
            .config(server.config())
            .build()
            .unwrap_err(),
        RedisVariable::<i64>::builder("e")
            .config(RedisConfig {
                buckets: 0,
                ..server.config()
            })
            .build()
            .unwrap_err(),
        RedisVariable::<i64>::builder("e")
            .config(RedisConfig::with_nodes(["no-port"]))
            .build()
            .unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    }
}

#[test]
fn results_that_are_not_finite_are_refused_per_row() {
    let server = Server::start();
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
