//! Integration tests of admission through checkpoints, by the public API:
//!
//! - pending counts survive a save and a restore into a fresh variable,
//!   exact and sketch: a key read twice before the save is admitted at its
//!   third read, after the restore, and not before;
//! - `load` merges counts (the larger of two), `restore` of a checkpoint
//!   without admission state clears them;
//! - a sketch of another shape, or admission of another kind, is an
//!   [`Error::Mismatch`] that changes nothing;
//! - a variable without admission restores a checkpoint with admission
//!   state (and ignores it);
//! - exact counts share the pending bound: keys pending below it are all
//!   admitted on time, however small the bound.

use dynemb::{Admission, Error, Variable};
use std::path::Path;

const DIM: usize = 2;
const EXACT: Admission = Admission::Exact { min_count: 3 };
const SKETCH: Admission = Admission::Sketch {
    min_count: 3,
    width: 1 << 12,
    depth: 4,
};

fn variable(admission: Admission) -> Variable<u64> {
    Variable::<u64>::builder("t")
        .dim(DIM)
        .admission(admission)
        .build()
        .unwrap()
}

/// One training read of `key`; true if the key is a row afterwards.
fn read(var: &Variable<u64>, key: u64) -> bool {
    let mut out = [0.0; DIM];
    var.lookup_or_insert(&[key], &mut out).unwrap();
    let mut exists = [false];
    var.lookup_with_exists(&[key], &mut out, &mut exists)
        .unwrap();
    exists[0]
}

/// The reads of `key` it takes to admit it, at most `limit`.
fn reads_to_admit(var: &Variable<u64>, key: u64, limit: usize) -> Option<usize> {
    (1..=limit).find(|_| read(var, key))
}

/// A variable under `admission` with key 1 read twice, key 2 once, key 3
/// admitted (three reads), saved to `dir`.
fn saved(admission: Admission, dir: &Path) {
    let var = variable(admission);
    assert!(!read(&var, 1));
    assert!(!read(&var, 1));
    assert!(!read(&var, 2));
    assert_eq!(reads_to_admit(&var, 3, 3), Some(3));
    assert_eq!(var.size(), 1);
    var.save(dir).unwrap();
}

#[test]
fn pending_exact_counts_survive_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    saved(EXACT, &ckpt);
    let var = variable(EXACT);
    var.restore(&ckpt).unwrap();
    assert_eq!(var.size(), 1);
    assert_eq!(reads_to_admit(&var, 1, 3), Some(1), "its third read");
    assert_eq!(reads_to_admit(&var, 2, 3), Some(2), "its third read");
    assert_eq!(reads_to_admit(&var, 4, 3), Some(3), "a new key");
    // Without the checkpoint the counts start from zero.
    let fresh = variable(EXACT);
    assert_eq!(reads_to_admit(&fresh, 1, 3), Some(3));
}

#[test]
fn a_pending_sketch_survives_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    saved(SKETCH, &ckpt);
    let var = variable(SKETCH);
    var.restore(&ckpt).unwrap();
    assert_eq!(var.size(), 1);
    assert_eq!(reads_to_admit(&var, 1, 3), Some(1), "its third read");
    assert_eq!(reads_to_admit(&var, 2, 3), Some(2), "its third read");
    let fresh = variable(SKETCH);
    assert_eq!(reads_to_admit(&fresh, 1, 3), Some(3));
}

#[test]
fn load_merges_counts_and_restore_without_state_clears_them() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    saved(EXACT, &ckpt);
    let var = variable(EXACT);
    assert!(!read(&var, 2));
    assert!(!read(&var, 2));
    assert!(!read(&var, 5));
    var.load(&ckpt).unwrap();
    // Key 1 has the checkpoint's 2, key 2 its own 2 (larger than the
    // checkpoint's 1), key 5 its own 1.
    assert_eq!(reads_to_admit(&var, 1, 3), Some(1));
    assert_eq!(reads_to_admit(&var, 2, 3), Some(1));
    assert_eq!(reads_to_admit(&var, 5, 3), Some(2));

    let plain_dir = dir.path().join("plain");
    let plain = Variable::<u64>::builder("t").dim(DIM).build().unwrap();
    plain.upsert(&[9], &[1.0, 2.0]).unwrap();
    plain.save(&plain_dir).unwrap();
    let var = variable(EXACT);
    assert!(!read(&var, 1));
    assert!(!read(&var, 1));
    var.load(&plain_dir).unwrap();
    assert!(read(&var, 1), "load without state keeps the counts");
    assert!(!read(&var, 2));
    assert!(!read(&var, 2));
    var.restore(&plain_dir).unwrap();
    assert_eq!(var.size(), 1);
    assert_eq!(
        reads_to_admit(&var, 2, 3),
        Some(3),
        "restore without state clears the counts"
    );
}

#[test]
fn another_sketch_shape_or_kind_is_a_mismatch_that_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    saved(SKETCH, &ckpt);
    let others = [
        Admission::Sketch {
            min_count: 3,
            width: 1 << 11,
            depth: 4,
        },
        Admission::Sketch {
            min_count: 3,
            width: 1 << 12,
            depth: 3,
        },
        EXACT,
    ];
    for admission in others {
        let var = variable(admission);
        var.upsert(&[7], &[7.0, 7.0]).unwrap();
        assert!(!read(&var, 8));
        assert!(!read(&var, 8));
        for result in [var.restore(&ckpt), var.load(&ckpt)] {
            let err = result.unwrap_err();
            assert!(
                matches!(err, Error::Mismatch { .. }),
                "{admission:?}: {err}"
            );
            let text = err.to_string();
            assert!(text.contains("sketch"), "{text}");
        }
        assert_eq!(var.size(), 1);
        let (keys, values) = var.export().unwrap();
        assert_eq!((keys, values), (vec![7], vec![7.0, 7.0]));
        assert!(read(&var, 8), "its pending count is unchanged");
    }
}

#[test]
fn a_variable_without_admission_ignores_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    saved(EXACT, &ckpt);
    let var = Variable::<u64>::builder("t").dim(DIM).build().unwrap();
    var.restore(&ckpt).unwrap();
    assert_eq!(var.size(), 1);
    assert!(read(&var, 1), "every key is admitted at its first read");
}

/// `lookup_or_insert_with_exists` tells which keys of the read have a row
/// afterwards: false exactly for the reads that did not admit, over
/// shards and repeated keys; it reads what `lookup_or_insert` reads, and
/// bad lengths count nothing.
#[test]
fn a_training_read_tells_which_keys_it_left_without_a_row() {
    for admission in [EXACT, SKETCH] {
        let var = Variable::<u64>::builder("t")
            .dim(DIM)
            .shards(3)
            .admission(admission)
            .build()
            .unwrap();
        let mut out = [0.0; 4 * DIM];
        let mut exists = [true; 4];
        assert!(matches!(
            var.lookup_or_insert_with_exists(&[1, 2, 3, 4], &mut out, &mut exists[..3]),
            Err(Error::LengthMismatch { .. })
        ));
        assert_eq!(var.lifecycle_stats().not_admitted_reads, 0);
        var.lookup_or_insert_with_exists(&[1, 2, 1, 5], &mut out, &mut exists)
            .unwrap();
        assert_eq!(exists, [false, false, false, false]);
        // Key 1's third read admits it; key 2 is at its second.
        var.lookup_or_insert_with_exists(&[2, 1, 1, 6], &mut out, &mut exists)
            .unwrap();
        assert_eq!(exists, [false, true, true, false]);
        let mut plain = [0.0; 4 * DIM];
        var.lookup(&[2, 1, 1, 6], &mut plain).unwrap();
        assert_eq!(out, plain);
        assert_eq!(var.size(), 1);
    }
    let open = Variable::<u64>::builder("o").dim(DIM).build().unwrap();
    let mut exists = [false; 2];
    open.lookup_or_insert_with_exists(&[8, 9], &mut [0.0; 2 * DIM], &mut exists)
        .unwrap();
    assert_eq!(exists, [true, true]);
    assert_eq!(open.size(), 2);
}

/// Exact counts share the pending bound (the capacity) across the
/// counter's stripes: as long as fewer keys are pending than the bound,
/// every key is admitted at exactly its `min_count`-th read, however few
/// the bound and wherever the keys fall.
#[test]
fn keys_pending_below_the_bound_are_admitted_on_time() {
    for (capacity, keys) in [
        (2_usize, 2_u64),
        (64, 32),
        (64, 63),
        (1000, 900),
        (6400, 6000),
    ] {
        let var = Variable::<u64>::builder("t")
            .dim(DIM)
            .capacity(capacity)
            .admission(Admission::Exact { min_count: 2 })
            .build()
            .unwrap();
        for round in 0..3_u64 {
            let batch: Vec<u64> = (0..keys)
                .map(|k| (round << 40) ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let mut out = vec![0.0; batch.len() * DIM];
            let mut exists = vec![false; batch.len()];
            var.lookup_or_insert_with_exists(&batch, &mut out, &mut exists)
                .unwrap();
            assert!(
                exists.iter().all(|&e| !e),
                "capacity {capacity}: first reads"
            );
            var.lookup_or_insert_with_exists(&batch, &mut out, &mut exists)
                .unwrap();
            let admitted = exists.iter().filter(|&&e| e).count();
            assert_eq!(
                admitted, keys as usize,
                "capacity {capacity}, {keys} keys pending, round {round}"
            );
            var.clear();
        }
    }
}
