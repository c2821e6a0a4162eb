//! Checkpoints as rows (`checkpoint::save_rows`, `checkpoint::Reader`): the
//! format of `Variable::save`, written and read by other stores. A
//! variable's save reads back as its rows, rows saved restore into a
//! variable, and bad rows publish nothing.

use dynemb::checkpoint::{save_rows, Reader, Rows, TableInfo};
use dynemb::{Error, RestrictPolicy, Variable};
use std::collections::HashMap;

fn info(dim: usize) -> TableInfo {
    TableInfo {
        name: "emb".into(),
        dim,
        slots: vec![("m".into(), 0.0), ("v".into(), 0.5)],
        scores: Some(RestrictPolicy::Frequency),
        shards: 1,
        value_dtype: dynemb::Dtype::F32,
        slot_dtype: dynemb::Dtype::F32,
    }
}

/// `n` rows from `first`, every column a function of the key.
fn rows(first: i64, n: usize, dim: usize) -> Rows<i64> {
    let keys: Vec<i64> = (first..first + n as i64).collect();
    let col = |scale: f32| {
        keys.iter()
            .flat_map(|&k| (0..dim).map(move |j| k as f32 * scale + j as f32))
            .collect::<Vec<f32>>()
    };
    Rows {
        values: col(1.0),
        slots: vec![col(2.0), col(3.0)],
        scores: Some(keys.iter().map(|&k| k as u64 + 1).collect()),
        keys,
    }
}

#[test]
fn rows_saved_restore_into_a_variable_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    // Batches of uneven sizes, more rows than one file holds.
    let dim = 300;
    let batches = vec![
        Ok(rows(0, 7000, dim)),
        Ok(rows(7000, 1, dim)),
        Ok(rows(7001, 9000, dim)),
    ];
    save_rows(&ckpt, &info(dim), batches).unwrap();
    let files = std::fs::read_dir(&ckpt).unwrap().count();
    assert!(files > 2, "several data files and the index: {files}");

    let var = Variable::<i64>::builder("emb")
        .dim(dim)
        .shards(3)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    var.restore(&ckpt).unwrap();
    assert_eq!(var.size(), 16001);
    assert_eq!(var.slot_names(), ["m", "v"]);
    let keys = [0i64, 6999, 7000, 16000];
    let want = |scale: f32| -> Vec<f32> {
        keys.iter()
            .flat_map(|&k| (0..dim).map(move |j| k as f32 * scale + j as f32))
            .collect()
    };
    let mut out = vec![0.0; keys.len() * dim];
    var.lookup(&keys, &mut out).unwrap();
    assert_eq!(out, want(1.0));
    var.lookup_slot(var.slot_id("v").unwrap(), &keys, &mut out)
        .unwrap();
    assert_eq!(out, want(3.0));
    let mut scores = [0u64; 4];
    var.lookup_scores(&keys, &mut scores).unwrap();
    assert_eq!(scores, [1, 7000, 7001, 16001]);

    // The variable's own save reads back as the same rows.
    let again = dir.path().join("again");
    var.save(&again).unwrap();
    let reader = Reader::<i64>::open(&again, "emb", dim).unwrap();
    assert_eq!(reader.rows(), 16001);
    let read_info = reader.info();
    assert_eq!(read_info.slots, info(dim).slots);
    assert_eq!(read_info.scores, Some(RestrictPolicy::Frequency));
    assert_eq!(read_info.shards, 3);
    let mut seen: HashMap<i64, (f32, f32, u64)> = HashMap::new();
    reader
        .for_each(|batch| {
            for (i, &k) in batch.keys.iter().enumerate() {
                let score = batch.scores.as_ref().unwrap()[i];
                seen.insert(
                    k,
                    (batch.values[i * dim + 1], batch.slots[0][i * dim], score),
                );
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(seen.len(), 16001);
    assert_eq!(seen[&123], (124.0, 246.0, 124));
}

#[test]
fn a_reader_checks_key_type_and_dim() {
    let dir = tempfile::tempdir().unwrap();
    save_rows(dir.path().join("c"), &info(2), [Ok(rows(0, 3, 2))]).unwrap();
    let err = Reader::<i64>::open(dir.path().join("c"), "emb", 3).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    let err = Reader::<u32>::open(dir.path().join("c"), "emb", 2).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    let err = Reader::<i64>::open(dir.path().join("none"), "emb", 2).unwrap_err();
    assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
}

#[test]
fn bad_rows_publish_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c");
    save_rows(&ckpt, &info(2), [Ok(rows(0, 3, 2))]).unwrap();
    let mut short = rows(10, 3, 2);
    short.values.pop();
    let err = save_rows(&ckpt, &info(2), [Ok(rows(0, 3, 2)), Ok(short)]).unwrap_err();
    assert!(
        matches!(err, Error::LengthMismatch { what: "values", .. }),
        "{err}"
    );
    let mut nan = rows(10, 3, 2);
    nan.slots[1][4] = f32::NAN;
    let err = save_rows(&ckpt, &info(2), [Ok(nan)]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NonFinite {
                what: "slot rows",
                index: 4,
                ..
            }
        ),
        "{err}"
    );
    let mut unscored = rows(10, 3, 2);
    unscored.scores = None;
    assert!(save_rows(&ckpt, &info(2), [Ok(unscored)]).is_err());
    let failing = [
        Ok(rows(10, 3, 2)),
        Err(Error::InvalidArgument("source failed".into())),
    ];
    assert!(save_rows(&ckpt, &info(2), failing).is_err());
    // The first checkpoint is still there, whole.
    let reader = Reader::<i64>::open(&ckpt, "emb", 2).unwrap();
    assert_eq!(reader.rows(), 3);
}
