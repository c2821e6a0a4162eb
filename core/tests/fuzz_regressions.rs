//! Regression tests of what the fuzz targets (`fuzz/`, cargo-fuzz) found,
//! each minimized to the smallest sequence that shows it. They run on the
//! stable toolchain with `cargo test`; the fuzz targets themselves need
//! nightly (see `fuzz/README.md`).
//!
//! Every test names the target that found it.

use dynemb::{Error, Variable};

/// The row of `key` (dim 1), or `None`.
fn get(v: &Variable<i64>, key: i64) -> Option<f32> {
    let mut out = [0.0];
    let mut exists = [false];
    v.lookup_with_exists(&[key], &mut out, &mut exists).unwrap();
    exists[0].then_some(out[0])
}

/// Found by `variable_ops` (minimized: `accum` of `[k, k]` with exists
/// flags `[false, true]` on an absent `k`).
///
/// `Variable::accum` documents that "a key the batch itself inserted gets
/// the later deltas added". An absent key whose first occurrence (exists =
/// false) inserts it and whose later occurrence says exists = true gets the
/// later delta added only when the two occurrences are at least 25 keys
/// apart in the batch: nearer, the table's pipeline looked the key up
/// before the first occurrence inserted it, and the exists = true branch of
/// `Table::accum` takes that stale "missing" as final and drops the delta.
/// The result of a batch must not depend on how far apart its keys are.
#[test]
fn accum_adds_to_a_key_the_same_batch_inserted_whatever_the_distance() {
    for gap in [0usize, 1, 5, 11, 12, 13, 23, 24, 25, 30, 40, 70] {
        for shards in [1, 2] {
            let v = Variable::<i64>::builder("accum")
                .shards(shards)
                .build()
                .unwrap();
            // Key 4 twice, `gap` other absent keys (exists = true: ignored)
            // between; the other keys are even so that with 2 shards they
            // share key 4's shard.
            let mut keys = vec![4i64];
            let mut exists = vec![false];
            for j in 0..gap {
                keys.push(1000 + 2 * j as i64);
                exists.push(true);
            }
            keys.push(4);
            exists.push(true);
            let mut deltas = vec![0.0; keys.len()];
            deltas[0] = 1.0;
            deltas[gap + 1] = 2.0;
            v.accum(&keys, &deltas, &exists).unwrap();
            assert_eq!(
                get(&v, 4),
                Some(3.0),
                "{shards} shard(s), {gap} keys between the insert and the add"
            );
            assert_eq!(
                v.size(),
                1,
                "the keys flagged present but absent stay absent"
            );
        }
    }
}

/// Found by `variable_ops` (minimized: `update_rows(&[], &[m, m], ..)` on a
/// variable of 2 shards).
///
/// `update_rows` documents that a repeated slot is an
/// `Error::InvalidArgument`, and it is with one shard; with two or more
/// shards an empty batch returns `Ok(())`, because the check is made by
/// each shard's table only for a non-empty share of the batch. Whether a
/// call is refused must not depend on the shard count.
#[test]
fn update_rows_refuses_a_repeated_slot_even_for_an_empty_batch() {
    for shards in 1..=3 {
        let v = Variable::<i64>::builder("slots")
            .shards(shards)
            .build()
            .unwrap();
        let m = v.create_slot("m", 0.0).unwrap();
        for keys in [&[][..], &[1i64][..], &[1, 2, 3][..]] {
            let r = v.update_rows(keys, &[m, m], |_, _, _| {
                panic!("update ran with a repeated slot")
            });
            assert!(
                matches!(r, Err(Error::InvalidArgument(_))),
                "{shards} shard(s), {} key(s): {r:?}",
                keys.len()
            );
        }
        assert_eq!(v.size(), 0);
    }
}
