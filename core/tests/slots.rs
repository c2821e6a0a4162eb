//! Integration tests of optimizer slot columns on `Variable`:
//! `create_slot` / `slot_id` / `slot_names` / `slot_initial` /
//! `lookup_slot` / `update_rows`.
//!
//! - creation rules: idempotent for the same initial value, every error
//!   variant (`Mismatch`, `InvalidArgument` for an empty name, a full
//!   variable or a foreign `SlotId`, `NonFinite` for a NaN initial value,
//!   `UnknownSlot`, `LengthMismatch`);
//! - initial values are read for missing keys and for rows that existed
//!   before the slot, and `lookup_slot` never inserts;
//! - `update_rows` inserts missing keys with exactly the initializer's row,
//!   updates a repeated key once per occurrence, refuses a non-finite result
//!   row by row, and hands slot rows in the requested order;
//! - removal resets a key's slots, also when its row id is reused;
//! - an Adagrad step written with `update_rows` is bit-exact with the same
//!   arithmetic on a dense model.

use std::collections::{HashMap, HashSet};

use dynemb::raw::{ExportColumns, Positions, Table};
use dynemb::{Error, Initializer, Key, RestrictPolicy, SlotId, Variable, MAX_SLOTS};
use dynemb_test_support::present;

// ---------------------------------------------------------------- helpers

fn var<K: Key>(dim: usize, shards: usize, init: Initializer) -> Variable<K> {
    Variable::<K>::builder("slots")
        .dim(dim)
        .shards(shards)
        .init_size(1)
        .initializer(init)
        .build()
        .expect("build")
}

/// What `lookup` returns for `keys` (never inserts).
fn rows<K: Key>(v: &Variable<K>, keys: &[K]) -> Vec<f32> {
    let mut out = vec![f32::NAN; keys.len() * v.dim()];
    v.lookup(keys, &mut out).expect("lookup");
    out
}

/// What `lookup_slot` returns for `keys` (never inserts).
fn slot_rows<K: Key>(v: &Variable<K>, slot: SlotId, keys: &[K]) -> Vec<f32> {
    let mut out = vec![f32::NAN; keys.len() * v.dim()];
    v.lookup_slot(slot, keys, &mut out).expect("lookup_slot");
    out
}

fn scores<K: Key>(v: &Variable<K>, keys: &[K]) -> Vec<u64> {
    let mut out = vec![u64::MAX; keys.len()];
    v.lookup_scores(keys, &mut out).expect("lookup_scores");
    out
}

fn rep(n: usize, x: f32) -> Vec<f32> {
    vec![x; n]
}

// ---------------------------------------------------------------- creation

/// `create_slot` returns the same id for the same name and initial value,
/// `Mismatch` for another initial value, and names/ids/initials agree.
#[test]
fn create_slot_is_idempotent_and_a_different_initial_is_a_mismatch() {
    let v = var::<i64>(3, 1, Initializer::Zeros);
    assert!(v.slot_names().is_empty());
    let m = v.create_slot("m", 0.0).unwrap();
    let acc = v.create_slot("accumulator", 0.1).unwrap();
    assert_eq!((m.index(), acc.index()), (0, 1));
    assert_eq!(
        v.create_slot("m", 0.0).unwrap(),
        m,
        "same initial: same slot"
    );
    assert_eq!(v.create_slot("accumulator", 0.1).unwrap(), acc);
    match v.create_slot("accumulator", 0.2) {
        Err(Error::Mismatch {
            name,
            existing,
            requested,
        }) => {
            assert!(name.contains("accumulator"), "{name}");
            assert!(existing.contains("0.1"), "{existing}");
            assert!(requested.contains("0.2"), "{requested}");
        }
        other => panic!("expected Mismatch, got {other:?}"),
    }
    assert!(matches!(
        v.create_slot("m", 1.0),
        Err(Error::Mismatch { .. })
    ));
    assert_eq!(v.slot_names(), ["m", "accumulator"]);
    assert_eq!(v.slot_id("m").unwrap(), m);
    assert_eq!(v.slot_id("accumulator").unwrap(), acc);
    assert_eq!(v.slot_initial(m).unwrap(), 0.0);
    assert_eq!(v.slot_initial(acc).unwrap(), 0.1);
    // A clone shares the slots (and its ids are valid on the original).
    let c = v.clone();
    assert_eq!(c.slot_id("m").unwrap(), m);
    let v2 = c.create_slot("v", 0.5).unwrap();
    assert_eq!(v.slot_names(), ["m", "accumulator", "v"]);
    assert_eq!(slot_rows(&v, v2, &[1]), [0.5; 3]);
}

/// Every creation and naming error has its documented variant, and a failed
/// creation adds no slot.
#[test]
fn slot_creation_errors_are_typed() {
    let v = var::<u64>(2, 2, Initializer::Zeros);
    assert!(matches!(
        v.create_slot("", 0.0),
        Err(Error::InvalidArgument(_))
    ));
    match v.slot_id("nope") {
        Err(Error::UnknownSlot { variable, slot }) => {
            assert_eq!(variable, "slots");
            assert_eq!(slot, "nope");
        }
        other => panic!("expected UnknownSlot, got {other:?}"),
    }
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert!(
            matches!(v.create_slot("bad", bad), Err(Error::NonFinite { .. })),
            "initial {bad}"
        );
    }
    assert!(v.slot_names().is_empty(), "failed creations add nothing");
    assert!(matches!(v.slot_id("bad"), Err(Error::UnknownSlot { .. })));

    // At most MAX_SLOTS slots; the existing ones stay usable.
    let ids: Vec<SlotId> = (0..MAX_SLOTS)
        .map(|i| v.create_slot(&format!("s{i}"), i as f32).unwrap())
        .collect();
    assert_eq!(MAX_SLOTS, 8);
    assert!(matches!(
        v.create_slot("one_too_many", 0.0),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(v.slot_names().len(), MAX_SLOTS);
    assert!(matches!(
        v.slot_id("one_too_many"),
        Err(Error::UnknownSlot { .. })
    ));
    assert_eq!(
        v.create_slot("s3", 3.0).unwrap(),
        ids[3],
        "existing: still Ok"
    );
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(id.index(), i);
        assert_eq!(v.slot_initial(id).unwrap(), i as f32);
        assert_eq!(slot_rows(&v, id, &[5, 6]), [i as f32; 4]);
    }
    // update_rows with all eight slots at once.
    v.update_rows(&[5], &ids, |_, values, slots| {
        assert_eq!(slots.len(), MAX_SLOTS * 2);
        values.fill(1.0);
        for (j, row) in slots.chunks_exact_mut(2).enumerate() {
            assert_eq!(row, [j as f32; 2]);
            row.fill(10.0 + j as f32);
        }
    })
    .unwrap();
    for (j, &id) in ids.iter().enumerate() {
        assert_eq!(
            slot_rows(&v, id, &[5, 6]),
            [10.0 + j as f32, 10.0 + j as f32, j as f32, j as f32]
        );
    }
}

/// A `SlotId` of another variable is `InvalidArgument` everywhere, even when
/// it has the same index and name, and nothing is inserted.
#[test]
fn slot_id_of_another_variable_is_rejected() {
    let a = var::<i64>(2, 1, Initializer::Zeros);
    let b = var::<i64>(2, 1, Initializer::Zeros);
    let sa = a.create_slot("m", 0.0).unwrap();
    let sb = b.create_slot("m", 0.0).unwrap();
    assert_eq!(sa.index(), sb.index());
    assert_ne!(sa, sb);
    let mut out = [0.0; 2];
    assert!(matches!(
        a.lookup_slot(sb, &[1], &mut out),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(a.slot_initial(sb), Err(Error::InvalidArgument(_))));
    let mut called = false;
    assert!(matches!(
        a.update_rows(&[1, 2], &[sa, sb], |_, _, _| called = true),
        Err(Error::InvalidArgument(_))
    ));
    assert!(!called, "update closure not called");
    assert_eq!(a.size(), 0, "nothing inserted");
    // Its own id works; a clone of `a` accepts it too.
    a.clone()
        .update_rows(&[1], &[sa], |_, v, s| {
            v.fill(1.0);
            s.fill(2.0);
        })
        .unwrap();
    assert_eq!(slot_rows(&a, sa, &[1]), [2.0; 2]);
    assert_eq!(slot_rows(&b, sb, &[1]), [0.0; 2], "b untouched");
    assert_eq!(b.size(), 0);
}

/// Buffers of the wrong length are `LengthMismatch` naming the expected and
/// actual lengths, and change nothing.
#[test]
fn slot_and_score_length_mismatches_are_typed_errors() {
    let v = Variable::<i64>::builder("len")
        .dim(4)
        .shards(2)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let s = v.create_slot("m", 0.0).unwrap();
    let mut out = vec![0.0; 7];
    assert_eq!(
        v.lookup_slot(s, &[1, 2], &mut out),
        Err(Error::LengthMismatch {
            what: "out",
            expected: 8,
            actual: 7
        })
    );
    let mut out = vec![0.0; 9];
    assert_eq!(
        v.lookup_slot(s, &[1, 2], &mut out),
        Err(Error::LengthMismatch {
            what: "out",
            expected: 8,
            actual: 9
        })
    );
    let mut sc = vec![0u64; 3];
    assert_eq!(
        v.lookup_scores(&[1, 2], &mut sc),
        Err(Error::LengthMismatch {
            what: "out",
            expected: 2,
            actual: 3
        })
    );
    let mut sc = vec![0u64; 0];
    assert_eq!(
        v.lookup_scores(&[1], &mut sc),
        Err(Error::LengthMismatch {
            what: "out",
            expected: 1,
            actual: 0
        })
    );
    assert_eq!(v.size(), 0);
    // Empty batches are fine.
    v.lookup_slot(s, &[], &mut []).unwrap();
    v.lookup_scores(&[], &mut []).unwrap();
    v.update_rows(&[], &[s], |_, _, _| unreachable!()).unwrap();
}

// ---------------------------------------------------------------- initial values

/// Missing keys and rows that existed before a slot was created read the
/// slot's initial value (0.0, 0.1, a negative one); `lookup_slot` never
/// inserts; a slot created later does not disturb older slots.
#[test]
fn slots_read_their_initial_value_for_missing_keys_and_older_rows() {
    for shards in [1, 3] {
        let dim = 5;
        let v = var::<i64>(dim, shards, Initializer::Constant(7.0));
        let old: Vec<i64> = (-20..20).collect();
        v.upsert(&old, &rep(old.len() * dim, 1.0)).unwrap();
        let zero = v.create_slot("m", 0.0).unwrap();
        let tenth = v.create_slot("acc", 0.1).unwrap();
        let missing: Vec<i64> = (1000..1010).chain([i64::MIN, i64::MAX]).collect();
        for keys in [&old, &missing] {
            assert_eq!(slot_rows(&v, zero, keys), rep(keys.len() * dim, 0.0));
            assert_eq!(slot_rows(&v, tenth, keys), rep(keys.len() * dim, 0.1));
        }
        assert_eq!(v.size(), old.len(), "lookup_slot never inserts");
        assert!(present(&v, &missing).iter().all(|&p| !p));

        // Write `acc` of some rows, then add a third slot: it reads its own
        // initial value everywhere and `acc` keeps what was written.
        v.update_rows(&old[..10], &[tenth], |i, _, s| s.fill(i as f32))
            .unwrap();
        let neg = v.create_slot("neg", -2.5).unwrap();
        assert_eq!(neg.index(), 2);
        let all: Vec<i64> = old.iter().chain(&missing).copied().collect();
        assert_eq!(slot_rows(&v, neg, &all), rep(all.len() * dim, -2.5));
        let want: Vec<f32> = (0..old.len())
            .flat_map(|i| rep(dim, if i < 10 { i as f32 } else { 0.1 }))
            .collect();
        assert_eq!(slot_rows(&v, tenth, &old), want);
        assert_eq!(slot_rows(&v, zero, &old), rep(old.len() * dim, 0.0));

        // Rows inserted after the slots (every insert path) read the initials.
        let fresh = [5000i64, 5001, 5002, 5003];
        let mut out = vec![0.0; dim];
        v.lookup_or_insert(&fresh[..1], &mut out).unwrap();
        assert_eq!(out, [7.0; 5]);
        v.upsert(&fresh[1..2], &[3.0; 5]).unwrap();
        v.accum(&fresh[2..3], &[4.0; 5], &[false]).unwrap();
        v.update_rows(&fresh[3..], &[], |_, values, slots| {
            assert!(slots.is_empty());
            assert_eq!(values, [7.0; 5]);
        })
        .unwrap();
        assert_eq!(present(&v, &fresh), [true; 4]);
        for (slot, initial) in [(zero, 0.0), (tenth, 0.1), (neg, -2.5)] {
            assert_eq!(slot_rows(&v, slot, &fresh), rep(4 * dim, initial));
        }
        // Writes that do not name a slot leave it alone.
        v.upsert(&old[..10], &rep(10 * dim, 9.0)).unwrap();
        v.accum(&old[..10], &rep(10 * dim, 1.0), &[true; 10])
            .unwrap();
        assert_eq!(slot_rows(&v, tenth, &old[..10]), want[..10 * dim]);
        assert_eq!(rows(&v, &old[..10]), rep(10 * dim, 10.0));
    }
}

// ---------------------------------------------------------------- update_rows

/// `update_rows` inserts a missing key with exactly the row `lookup` would
/// have returned (every initializer, sharded or not) and its slots at their
/// initial values; the row then holds what the closure left.
#[test]
fn update_rows_inserts_missing_keys_with_the_initializers_row() {
    let dim = 6;
    let inits = [
        Initializer::Zeros,
        Initializer::Constant(0.25),
        Initializer::Values((0..dim).map(|c| c as f32 - 2.5).collect()),
        Initializer::RandomNormal {
            mean: 0.5,
            stddev: 2.0,
            seed: 42,
        },
        Initializer::TruncatedNormal {
            mean: 0.0,
            stddev: 1.0,
            seed: 7,
        },
        Initializer::RandomUniform {
            low: -1.0,
            high: 1.0,
            seed: 3,
        },
    ];
    let keys: Vec<u64> = (0..50u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .chain([u64::MAX, 1 << 63])
        .collect();
    for init in inits {
        for shards in [1, 3] {
            let v = var::<u64>(dim, shards, init.clone());
            let m = v.create_slot("m", 0.0).unwrap();
            let acc = v.create_slot("acc", 0.1).unwrap();
            let expected = rows(&v, &keys);
            assert_eq!(v.size(), 0);
            let mut seen = vec![false; keys.len()];
            v.update_rows(&keys, &[m, acc], |i, values, slots| {
                assert!(!seen[i], "position {i} twice");
                seen[i] = true;
                assert_eq!(
                    values,
                    &expected[i * dim..(i + 1) * dim],
                    "{init:?}: key #{i} starts at the initializer's row"
                );
                assert_eq!(&slots[..dim], rep(dim, 0.0), "m starts at 0.0");
                assert_eq!(&slots[dim..], rep(dim, 0.1), "acc starts at 0.1");
                for (j, x) in values.iter_mut().enumerate() {
                    *x += (i * 100 + j) as f32;
                }
                slots[..dim].fill(i as f32);
                slots[dim..].fill(-(i as f32));
            })
            .unwrap();
            assert!(seen.iter().all(|&s| s), "every position updated");
            assert_eq!(v.size(), keys.len());
            let want: Vec<f32> = (0..keys.len())
                .flat_map(|i| (0..dim).map(move |j| (i, j)))
                .map(|(i, j)| expected[i * dim + j] + (i * 100 + j) as f32)
                .collect();
            assert_eq!(rows(&v, &keys), want);
            let want_m: Vec<f32> = (0..keys.len()).flat_map(|i| rep(dim, i as f32)).collect();
            let want_acc: Vec<f32> = (0..keys.len())
                .flat_map(|i| rep(dim, -(i as f32)))
                .collect();
            assert_eq!(slot_rows(&v, m, &keys), want_m);
            assert_eq!(slot_rows(&v, acc, &keys), want_acc);
        }
    }
}

/// The closure's slot rows come back to back in the order the slots are
/// listed, slots not listed are left alone, and an empty slot list gives an
/// empty slot buffer.
#[test]
fn update_rows_hands_slot_rows_in_the_requested_order() {
    let dim = 3;
    let v = var::<i32>(dim, 2, Initializer::Zeros);
    let a = v.create_slot("a", 1.0).unwrap();
    let b = v.create_slot("b", 2.0).unwrap();
    let c = v.create_slot("c", 3.0).unwrap();
    let keys = [4, -5, 6];
    v.update_rows(&keys, &[c, a], |_, _, slots| {
        assert_eq!(slots.len(), 2 * dim);
        assert_eq!(&slots[..dim], [3.0; 3], "c first");
        assert_eq!(&slots[dim..], [1.0; 3], "then a");
        slots[..dim].fill(30.0);
        slots[dim..].fill(10.0);
    })
    .unwrap();
    assert_eq!(slot_rows(&v, a, &keys), [10.0; 9]);
    assert_eq!(slot_rows(&v, b, &keys), [2.0; 9], "b not listed: untouched");
    assert_eq!(slot_rows(&v, c, &keys), [30.0; 9]);
    v.update_rows(&keys, &[b], |_, values, slots| {
        assert_eq!(slots, [2.0; 3]);
        values.fill(1.0);
        slots.fill(20.0);
    })
    .unwrap();
    v.update_rows(&keys, &[], |_, values, slots| {
        assert!(slots.is_empty());
        assert_eq!(values, [1.0; 3]);
        values[1] = 5.0;
    })
    .unwrap();
    assert_eq!(rows(&v, &keys), [1.0, 5.0, 1.0].repeat(3));
    assert_eq!(slot_rows(&v, a, &keys), [10.0; 9]);
    assert_eq!(slot_rows(&v, b, &keys), [20.0; 9]);
    assert_eq!(slot_rows(&v, c, &keys), [30.0; 9]);
}

/// A key repeated in one batch is updated once per occurrence, in batch
/// order, each update seeing the previous one's result; a missing repeated
/// key is inserted once.
#[test]
fn update_rows_updates_a_repeated_key_once_per_occurrence_in_order() {
    for shards in [1, 3] {
        let v = var::<i64>(2, shards, Initializer::Constant(0.5));
        let s = v.create_slot("s", 0.0).unwrap();
        let keys = [7i64, 7, 7, 8, 7, -1];
        let mut positions = Vec::new();
        v.update_rows(&keys, &[s], |i, values, slots| {
            positions.push(i);
            for x in values.iter_mut() {
                *x += 1.0;
            }
            for x in slots.iter_mut() {
                *x = *x * 10.0 + (i + 1) as f32;
            }
        })
        .unwrap();
        positions.sort_unstable();
        assert_eq!(positions, [0, 1, 2, 3, 4, 5]);
        assert_eq!(v.size(), 3, "7 inserted once");
        assert_eq!(rows(&v, &[7, 8, -1]), [4.5, 4.5, 1.5, 1.5, 1.5, 1.5]);
        assert_eq!(
            slot_rows(&v, s, &[7, 8, -1]),
            [1235.0, 1235.0, 4.0, 4.0, 6.0, 6.0],
            "occurrences 0, 1, 2, 4 of key 7 in order"
        );
    }
}

/// A non-finite result (NaN or infinity, in the values or in a slot) leaves
/// that row exactly as it was (values, slots, score), the other rows are
/// written, and the error names the first such key's position in the whole
/// batch, also when a later shard holds it.
#[test]
fn non_finite_update_leaves_the_row_unchanged_and_writes_the_others() {
    let dim = 3;
    for shards in [1, 2] {
        let v = Variable::<i64>::builder("nf")
            .dim(dim)
            .shards(shards)
            .restrict_policy(RestrictPolicy::Frequency)
            .build()
            .unwrap();
        let s = v.create_slot("s", 0.1).unwrap();
        let t = v.create_slot("t", 0.0).unwrap();
        // 21 is in shard 1 and 40 in shard 0 when sharded: shard 0 is
        // processed first, but the error must still name position 1.
        let keys = [10i64, 21, 30, 40, 51];
        v.upsert(&keys, &(0..15).map(|x| x as f32).collect::<Vec<_>>())
            .unwrap();
        v.update_rows(&keys, &[s, t], |i, _, slots| slots.fill(i as f32))
            .unwrap();
        let before_rows = rows(&v, &keys);
        let before_s = slot_rows(&v, s, &keys);
        let before_t = slot_rows(&v, t, &keys);
        assert_eq!(scores(&v, &keys), [2; 5]);

        let result = v.update_rows(&keys, &[s, t], |i, values, slots| {
            for x in values.iter_mut() {
                *x += 100.0;
            }
            for x in slots.iter_mut() {
                *x += 1.0;
            }
            match i {
                1 => values[2] = f32::NAN,
                3 => slots[dim + 1] = f32::INFINITY,
                4 => slots[0] = f32::NEG_INFINITY,
                _ => {}
            }
        });
        match result {
            Err(Error::NonFinite { what, index, value }) => {
                assert_eq!(what, "update_rows result");
                assert_eq!(index, 1, "shards {shards}: first bad position");
                assert!(value.is_nan(), "{value}");
            }
            other => panic!("expected NonFinite, got {other:?}"),
        }
        let after_rows = rows(&v, &keys);
        let after_s = slot_rows(&v, s, &keys);
        let after_t = slot_rows(&v, t, &keys);
        for (i, &k) in keys.iter().enumerate() {
            let r = i * dim..(i + 1) * dim;
            if [1, 3, 4].contains(&i) {
                assert_eq!(after_rows[r.clone()], before_rows[r.clone()], "key {k}");
                assert_eq!(after_s[r.clone()], before_s[r.clone()], "key {k} slot s");
                assert_eq!(after_t[r.clone()], before_t[r], "key {k} slot t");
            } else {
                let want: Vec<f32> = before_rows[r.clone()].iter().map(|x| x + 100.0).collect();
                assert_eq!(after_rows[r.clone()], want, "key {k}");
                assert_eq!(after_s[r.clone()], rep(dim, i as f32 + 1.0), "key {k}");
                assert_eq!(after_t[r], rep(dim, i as f32 + 1.0), "key {k}");
            }
        }
        assert_eq!(
            scores(&v, &keys),
            [3, 2, 3, 2, 2],
            "refused rows not scored"
        );

        // The error of a later bad row alone names its own position.
        let result = v.update_rows(&keys, &[], |i, values, _| {
            if i == 4 {
                values[0] = f32::NAN;
            }
        });
        assert!(
            matches!(result, Err(Error::NonFinite { index: 4, .. })),
            "{result:?}"
        );
        assert_eq!(rows(&v, &keys), after_rows);

        // A missing key whose update is refused is not inserted, and reads
        // as it did before: the initializer's row and the slots' initial
        // values.
        let size = v.size();
        let result = v.update_rows(&[999, 10], &[s], |i, values, slots| {
            if i == 0 {
                assert_eq!(slots, [0.1; 3], "a missing key starts at the initial value");
                values[0] = f32::NAN;
            }
        });
        assert!(
            matches!(result, Err(Error::NonFinite { index: 0, .. })),
            "{result:?}"
        );
        assert_eq!(rows(&v, &[999]), [0.0; 3]);
        assert_eq!(slot_rows(&v, s, &[999]), [0.1; 3]);
        assert_eq!(slot_rows(&v, t, &[999]), [0.0; 3]);
        assert_eq!(v.size(), size, "the refused missing key was not inserted");
        let mut exists = [true];
        v.lookup_with_exists(&[999], &mut [0.0; 3], &mut exists)
            .unwrap();
        assert_eq!(exists, [false]);
    }
}

/// A removed key's slots are gone: read before reinsertion, and after it by
/// every insert path, they are the initial values again, through hundreds of
/// remove/reinsert cycles (so removed row ids are reused; memory stays
/// bounded, which shows the reuse).
#[test]
fn removed_then_reinserted_keys_read_slot_initials_again() {
    let dim = 4;
    let n = 20i64;
    let cycles = 400usize;
    for shards in [1, 3] {
        let v = var::<i64>(dim, shards, Initializer::Constant(-3.0));
        let a = v.create_slot("a", 0.1).unwrap();
        let b = v.create_slot("b", 0.0).unwrap();
        let keys: Vec<i64> = (0..n).map(|k| k * 5 - 40).collect();
        let mut memory_after_warmup = 0;
        for cycle in 0..cycles {
            let x = cycle as f32 + 1.0;
            // Reinsert through a rotating insert path.
            match cycle % 5 {
                0 => {
                    let mut out = vec![0.0; keys.len() * dim];
                    v.lookup_or_insert(&keys, &mut out).unwrap();
                    assert_eq!(out, rep(keys.len() * dim, -3.0));
                }
                1 => v.upsert(&keys, &rep(keys.len() * dim, -3.0)).unwrap(),
                2 => v
                    .accum(
                        &keys,
                        &rep(keys.len() * dim, -3.0),
                        &vec![false; keys.len()],
                    )
                    .unwrap(),
                3 => v.update_rows(&keys, &[], |_, _, _| {}).unwrap(),
                _ => v
                    .update_rows(&keys, &[b, a], |i, values, slots| {
                        assert_eq!(values, [-3.0; 4], "cycle {cycle} key #{i}");
                        assert_eq!(&slots[..dim], [0.0; 4], "cycle {cycle} key #{i}: stale b");
                        assert_eq!(&slots[dim..], [0.1; 4], "cycle {cycle} key #{i}: stale a");
                    })
                    .unwrap(),
            }
            assert_eq!(v.size(), keys.len());
            assert_eq!(
                slot_rows(&v, a, &keys),
                rep(keys.len() * dim, 0.1),
                "cycle {cycle}: a after reinsert"
            );
            assert_eq!(
                slot_rows(&v, b, &keys),
                rep(keys.len() * dim, 0.0),
                "cycle {cycle}: b after reinsert"
            );
            // Give every key non-initial slots, then remove them all.
            v.update_rows(&keys, &[a, b], |_, values, slots| {
                values.fill(x);
                slots[..dim].fill(x);
                slots[dim..].fill(-x);
            })
            .unwrap();
            assert_eq!(slot_rows(&v, a, &keys), rep(keys.len() * dim, x));
            assert_eq!(slot_rows(&v, b, &keys), rep(keys.len() * dim, -x));
            v.remove(&keys).unwrap();
            assert_eq!(v.size(), 0);
            assert_eq!(slot_rows(&v, a, &keys), rep(keys.len() * dim, 0.1));
            assert_eq!(slot_rows(&v, b, &keys), rep(keys.len() * dim, 0.0));
            assert_eq!(rows(&v, &keys), rep(keys.len() * dim, -3.0));
            if cycle == 10 {
                memory_after_warmup = v.memory_bytes();
            }
        }
        // Without reuse the arena would hold cycles * n rows of 2 header +
        // 2 value words plus 2 + 2 slot words.
        let no_reuse_rows_bytes = cycles * n as usize * (4 + 4) * 8;
        let end = v.memory_bytes();
        assert!(
            end <= memory_after_warmup * 2 && end < no_reuse_rows_bytes / 4,
            "shards {shards}: memory {end} after {cycles} cycles (after warm-up: \
             {memory_after_warmup}); row ids are not reused"
        );
    }
}

/// The same on one raw `Table`, where the arena's high-water mark proves
/// that removed row ids are reused, and the reused rows read every slot's
/// initial value (lookup_slot and an export scan of the slot columns).
#[test]
fn reused_row_ids_of_a_table_read_slot_initials() {
    let dim = 3;
    let table = Table::new(dim, 0).unwrap();
    let a = table.add_slot(0.1).unwrap();
    let b = table.add_slot(-1.0).unwrap();
    let keys: Vec<u64> = (1..=16).collect();
    let mut reused = false;
    for cycle in 0..500u64 {
        let x = cycle as f32 + 2.0;
        table
            .upsert(&keys, Positions::Dense, &rep(keys.len() * dim, x))
            .unwrap();
        let exported = table.export_rows(
            0,
            usize::MAX,
            ExportColumns {
                values: true,
                slots: true,
                scores: false,
            },
        );
        assert_eq!(exported.keys.len(), keys.len());
        assert_eq!(exported.values, rep(keys.len() * dim, x));
        assert_eq!(
            exported.slots[a],
            rep(keys.len() * dim, 0.1),
            "cycle {cycle}"
        );
        assert_eq!(
            exported.slots[b],
            rep(keys.len() * dim, -1.0),
            "cycle {cycle}"
        );
        let mut out = vec![0.0; keys.len() * dim];
        table
            .lookup_slot(&keys, Positions::Dense, b, &mut out)
            .unwrap();
        assert_eq!(out, rep(keys.len() * dim, -1.0), "cycle {cycle}");
        table
            .update_rows(
                &keys,
                Positions::Dense,
                &[a, b],
                |_, _| unreachable!("present"),
                |_, _, slots| {
                    slots.fill(x);
                    true
                },
            )
            .unwrap();
        table
            .lookup_slot(&keys, Positions::Dense, a, &mut out)
            .unwrap();
        assert_eq!(out, rep(keys.len() * dim, x));
        assert_eq!(table.remove(&keys), keys.len());
        if cycle > 50 && table.end_of_rows() <= 2 * 64 {
            reused = true;
        }
    }
    assert!(
        reused && table.end_of_rows() < 500 * keys.len() as u64 / 4,
        "row ids were not reused: high-water mark {}",
        table.end_of_rows()
    );
}

/// Slots on a sharded variable: each key's slot follows it to its shard,
/// removing one shard's keys resets only theirs, and re-inserting them
/// starts them over.
#[test]
fn sharded_variable_slots_follow_their_keys() {
    let dim = 2;
    let v = var::<i64>(dim, 3, Initializer::Zeros);
    let s = v.create_slot("s", 0.5).unwrap();
    let keys: Vec<i64> = (-30..30).collect();
    v.update_rows(&keys, &[s], |i, values, slots| {
        values.fill(keys[i] as f32);
        slots.fill(keys[i] as f32 * 2.0);
    })
    .unwrap();
    for shard in 0..3 {
        assert_eq!(v.shard_size(shard).unwrap(), 20);
    }
    let want: Vec<f32> = keys
        .iter()
        .flat_map(|&k| rep(dim, k as f32 * 2.0))
        .collect();
    assert_eq!(slot_rows(&v, s, &keys), want);
    // Shuffled order and duplicates read the same rows.
    let mixed: Vec<i64> = keys.iter().rev().chain(&keys[..5]).copied().collect();
    let want_mixed: Vec<f32> = mixed
        .iter()
        .flat_map(|&k| rep(dim, k as f32 * 2.0))
        .collect();
    assert_eq!(slot_rows(&v, s, &mixed), want_mixed);

    let shard0: Vec<i64> = keys
        .iter()
        .copied()
        .filter(|k| k.rem_euclid(3) == 0)
        .collect();
    v.remove(&shard0).unwrap();
    assert_eq!(v.shard_size(0).unwrap(), 0);
    assert_eq!(v.size(), 40);
    let want: Vec<f32> = keys
        .iter()
        .flat_map(|&k| {
            rep(
                dim,
                if k.rem_euclid(3) == 0 {
                    0.5
                } else {
                    k as f32 * 2.0
                },
            )
        })
        .collect();
    assert_eq!(slot_rows(&v, s, &keys), want);
    v.update_rows(&keys, &[s], |_, values, slots| {
        for x in values.iter_mut() {
            *x += 1.0;
        }
        for x in slots.iter_mut() {
            *x += 1.0;
        }
    })
    .unwrap();
    let want: Vec<f32> = keys
        .iter()
        .flat_map(|&k| {
            rep(
                dim,
                if k.rem_euclid(3) == 0 {
                    1.5
                } else {
                    k as f32 * 2.0 + 1.0
                },
            )
        })
        .collect();
    assert_eq!(slot_rows(&v, s, &keys), want);
    let want: Vec<f32> = keys
        .iter()
        .flat_map(|&k| {
            rep(
                dim,
                if k.rem_euclid(3) == 0 {
                    1.0
                } else {
                    k as f32 + 1.0
                },
            )
        })
        .collect();
    assert_eq!(rows(&v, &keys), want);
    for shard in 0..3 {
        assert_eq!(v.shard_size(shard).unwrap(), 20);
    }
    // Export agrees with the lookups.
    let (ek, ev) = v.export().unwrap();
    let exported: HashMap<i64, Vec<f32>> = ek
        .iter()
        .enumerate()
        .map(|(i, &k)| (k, ev[i * dim..(i + 1) * dim].to_vec()))
        .collect();
    assert_eq!(exported.len(), 60);
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(exported[&k], want[i * dim..(i + 1) * dim]);
    }
}

/// Creating or reading a slot allocates nothing; writing it grows
/// `memory_bytes` by at least one slot row per key.
#[test]
fn memory_bytes_grows_when_a_slot_is_written() {
    let dim = 8;
    let n = 1000u64;
    let v = var::<u64>(dim, 1, Initializer::Zeros);
    let keys: Vec<u64> = (0..n).collect();
    v.upsert(&keys, &rep(keys.len() * dim, 1.0)).unwrap();
    let base = v.memory_bytes();
    let s = v.create_slot("s", 0.1).unwrap();
    assert_eq!(v.memory_bytes(), base, "an unwritten slot holds no memory");
    assert_eq!(slot_rows(&v, s, &keys), rep(keys.len() * dim, 0.1));
    v.update_rows(&keys, &[], |_, values, _| values.fill(2.0))
        .unwrap();
    assert_eq!(v.memory_bytes(), base, "writing values only");
    v.update_rows(&keys, &[s], |_, _, slots| slots.fill(3.0))
        .unwrap();
    let written = v.memory_bytes();
    assert!(
        written >= base + n as usize * dim * 4,
        "memory {written} after writing a slot of {n} rows of {dim} floats (before: {base})"
    );
    // A second slot written: more again.
    let t = v.create_slot("t", 0.0).unwrap();
    v.update_rows(&keys[..1], &[t], |_, _, slots| slots.fill(1.0))
        .unwrap();
    assert!(v.memory_bytes() > written);
}

// ---------------------------------------------------------------- optimizer

/// Adagrad written with `update_rows` (accumulator slot at 0.1) is
/// bit-for-bit the same as the same arithmetic, in the same order, on a
/// dense `Vec` model initialized with the variable's own rows.
#[test]
fn adagrad_through_update_rows_matches_a_dense_reference() {
    let dim = 5;
    let vocab = 12usize;
    let lr = 0.05f32;
    let initial_acc = 0.1f32;
    let init = Initializer::RandomNormal {
        mean: 0.0,
        stddev: 0.3,
        seed: 2024,
    };
    let v = var::<i64>(dim, 2, init.clone());
    let acc = v.create_slot("accumulator", initial_acc).unwrap();
    let key_of = |j: usize| j as i64 * 1_000_003 - 5_000_000;
    let all: Vec<i64> = (0..vocab).map(key_of).collect();
    // Dense reference: rows start as what the variable would initialize.
    let start = rows(&v, &all);
    let mut w: Vec<Vec<f32>> = (0..vocab)
        .map(|j| start[j * dim..(j + 1) * dim].to_vec())
        .collect();
    let mut a: Vec<Vec<f32>> = vec![vec![initial_acc; dim]; vocab];
    let grad =
        |step: usize, j: usize, c: usize| ((step * 7 + j * 3 + c * 5) % 11) as f32 * 0.1 - 0.5;
    let mut touched = HashSet::new();
    for step in 0..8 {
        // Each step a different subset of the vocabulary (unique keys).
        let ids: Vec<usize> = (0..vocab).filter(|j| (j + step) % 3 != 0).collect();
        let keys: Vec<i64> = ids.iter().map(|&j| key_of(j)).collect();
        v.update_rows(&keys, &[acc], |i, values, slots| {
            let j = ids[i];
            for c in 0..dim {
                let g = grad(step, j, c);
                slots[c] += g * g;
                values[c] -= lr * g / slots[c].sqrt();
            }
        })
        .unwrap();
        for &j in &ids {
            touched.insert(j);
            for c in 0..dim {
                let g = grad(step, j, c);
                a[j][c] += g * g;
                w[j][c] -= lr * g / a[j][c].sqrt();
            }
        }
        let got = rows(&v, &all);
        let got_acc = slot_rows(&v, acc, &all);
        for j in 0..vocab {
            assert_eq!(
                got[j * dim..(j + 1) * dim],
                w[j],
                "step {step}: weights of #{j}"
            );
            assert_eq!(
                got_acc[j * dim..(j + 1) * dim],
                a[j],
                "step {step}: acc of #{j}"
            );
        }
    }
    assert_eq!(v.size(), touched.len());
    // Rows moved away from their initial values.
    assert_ne!(rows(&v, &all), start);
}

/// A slot given twice is refused before anything is written, for missing
/// and present keys alike (and more than `MAX_SLOTS` slots cannot panic).
#[test]
fn repeated_slots_are_refused() {
    let v = var::<i64>(2, 2, Initializer::Zeros);
    let m = v.create_slot("m", 0.0).unwrap();
    v.upsert(&[1], &[1.0; 2]).unwrap();
    for slots in [vec![m, m], vec![m; dynemb::MAX_SLOTS + 1]] {
        let err = v
            .update_rows(&[1, 2], &slots, |_, _, _| panic!("never called"))
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidArgument(msg) if msg.contains("more than once")),
            "{err}"
        );
    }
    assert_eq!(v.size(), 1, "nothing inserted");
}

/// An update that panics midway through a batch leaves the variable
/// consistent: the rows written before it stay, the panicking row is
/// unchanged and unlocked, and `size` counts exactly the keys present.
#[test]
fn a_panicking_update_leaves_a_consistent_variable() {
    let v = var::<i64>(2, 1, Initializer::Constant(1.0));
    let m = v.create_slot("m", 0.0).unwrap();
    v.upsert(&[3], &[5.0; 2]).unwrap();
    let keys: Vec<i64> = (0..10).collect();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        v.update_rows(&keys, &[m], |i, row, slot| {
            if i == 5 {
                panic!("the update fails");
            }
            row.fill(2.0);
            slot.fill(3.0);
        })
    }));
    assert!(outcome.is_err());
    let (exported, _) = v.export().unwrap();
    assert_eq!(v.size(), exported.len(), "size counts the keys present");
    let mut exists = vec![false; 10];
    let mut out = vec![0.0; 20];
    v.lookup_with_exists(&keys, &mut out, &mut exists).unwrap();
    // Keys 0..5 (3 included) were updated; 5 panicked while missing, so it
    // was never inserted; the rest were not reached.
    assert_eq!(v.size(), 5);
    for k in 0..10 {
        assert_eq!(exists[k], k < 5, "key {k}");
        assert_eq!(out[2 * k], if k < 5 { 2.0 } else { 1.0 }, "key {k}");
    }
    // The variable still works, row 3 included.
    v.update_rows(&[3, 7], &[m], |_, row, _| row.fill(9.0))
        .unwrap();
    v.lookup(&[3, 7], &mut out[..4]).unwrap();
    assert_eq!(out[..4], [9.0; 4]);
    assert_eq!(v.size(), exported.len() + 1);
}
