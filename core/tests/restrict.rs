//! Integration tests of restrict policies: per-row scores
//! (`lookup_scores`) and `Variable::restrict`.
//!
//! - Frequency scores count every kind of write (inserts, upserts, applied
//!   accumulations, `update_rows`), once per occurrence of a repeated key;
//!   Timestamp scores are one stamp per batch, strictly increasing;
//! - reads never change a score;
//! - `restrict` keeps exactly `num_reserved` rows, the highest scored, over
//!   the whole variable (not per shard), honours `trigger`, handles ties at
//!   the boundary and `num_reserved >= size`, and removes the slots of the
//!   rows it removes;
//! - a variable without a policy refuses `restrict` and scores 0.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use dynemb::{Error, Initializer, Key, Partitioner, RestrictPolicy, Variable};
use dynemb_test_support::present;

// ---------------------------------------------------------------- helpers

fn var<K: Key>(dim: usize, shards: usize, policy: RestrictPolicy) -> Variable<K> {
    Variable::<K>::builder("restrict")
        .dim(dim)
        .shards(shards)
        .init_size(1)
        .restrict_policy(policy)
        .build()
        .expect("build")
}

fn scores<K: Key>(v: &Variable<K>, keys: &[K]) -> Vec<u64> {
    let mut out = vec![u64::MAX; keys.len()];
    v.lookup_scores(keys, &mut out).expect("lookup_scores");
    out
}

fn score<K: Key>(v: &Variable<K>, key: K) -> u64 {
    scores(v, &[key])[0]
}

/// The variable's keys, sorted.
fn key_set<K: Key + Ord>(v: &Variable<K>) -> Vec<K> {
    let (mut keys, _) = v.export().expect("export");
    keys.sort_unstable();
    keys
}

/// Export as key -> row.
fn export_map<K: Key>(v: &Variable<K>) -> HashMap<u64, Vec<f32>> {
    let (keys, values) = v.export().expect("export");
    let dim = v.dim();
    keys.iter()
        .enumerate()
        .map(|(i, k)| (k.to_bits(), values[i * dim..(i + 1) * dim].to_vec()))
        .collect()
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Writes `key` `n` times (as separate upserts).
fn write_times<K: Key>(v: &Variable<K>, key: K, n: usize) {
    for _ in 0..n {
        v.upsert(&[key], &vec![1.0; v.dim()]).unwrap();
    }
}

// ---------------------------------------------------------------- scores

/// Frequency: an insert by any path counts 1, upserts, applied accums and
/// `update_rows` add 1 per occurrence; ignored accums, refused updates and
/// reads add nothing; `update_rows` inserting a key counts one write; a
/// removed key scores 0 and starts over when re-inserted.
#[test]
fn frequency_scores_count_every_kind_of_write() {
    for shards in [1, 2] {
        let v = var::<i64>(2, shards, RestrictPolicy::Frequency);
        let s = v.create_slot("s", 0.0).unwrap();
        let mut out = [0.0; 8];
        assert_eq!(scores(&v, &[1, 2, 3]), [0, 0, 0], "missing keys score 0");

        // lookup_or_insert: an insert counts, a hit is a read.
        v.lookup_or_insert(&[1], &mut out[..2]).unwrap();
        assert_eq!(score(&v, 1), 1);
        v.lookup_or_insert(&[1, 1], &mut out[..4]).unwrap();
        assert_eq!(score(&v, 1), 1, "lookup_or_insert of a present key");
        v.lookup_or_insert(&[2, 2], &mut out[..4]).unwrap();
        assert_eq!(score(&v, 2), 1, "a repeated missing key is inserted once");

        // upsert: every occurrence is a write.
        v.upsert(&[1], &[1.0, 1.0]).unwrap();
        assert_eq!(score(&v, 1), 2);
        v.upsert(&[3], &[1.0, 1.0]).unwrap();
        assert_eq!(score(&v, 3), 1, "upsert insert");
        v.upsert(&[3, 3, 3], &[1.0; 6]).unwrap();
        assert_eq!(score(&v, 3), 4);
        v.upsert(&[4, 4], &[1.0; 4]).unwrap();
        assert_eq!(score(&v, 4), 2, "insert + overwrite in one batch");

        // accum (bp_v2): applied writes count, ignored ones do not.
        v.accum(&[1], &[1.0, 1.0], &[true]).unwrap();
        assert_eq!(score(&v, 1), 3, "present && exists: added");
        v.accum(&[1], &[1.0, 1.0], &[false]).unwrap();
        assert_eq!(score(&v, 1), 3, "present && !exists: ignored");
        v.accum(&[5], &[1.0, 1.0], &[true]).unwrap();
        assert_eq!(score(&v, 5), 0, "absent && exists: ignored, not inserted");
        assert_eq!(present(&v, &[5]), [false]);
        v.accum(&[5], &[1.0, 1.0], &[false]).unwrap();
        assert_eq!(score(&v, 5), 1, "absent && !exists: inserted");
        v.accum(&[6, 6, 6], &[1.0; 6], &[false; 3]).unwrap();
        assert_eq!(score(&v, 6), 3, "inserted, then both later deltas added");
        v.accum(&[1, 1], &[1.0; 4], &[true, true]).unwrap();
        assert_eq!(score(&v, 1), 5);

        // update_rows: an insert is one write, then one per occurrence.
        v.update_rows(&[7], &[s], |_, _, _| {}).unwrap();
        assert_eq!(score(&v, 7), 1, "update_rows insert counts once");
        v.update_rows(&[7, 7, 7], &[s], |_, _, _| {}).unwrap();
        assert_eq!(score(&v, 7), 4);
        v.update_rows(&[8, 8], &[], |_, _, _| {}).unwrap();
        assert_eq!(score(&v, 8), 2);
        v.update_rows(&[1], &[], |_, _, _| {}).unwrap();
        assert_eq!(score(&v, 1), 6);
        // A refused (non-finite) update does not count.
        assert!(v
            .update_rows(&[1, 7], &[s], |i, _, slots| {
                if i == 0 {
                    slots[0] = f32::NAN;
                }
            })
            .is_err());
        assert_eq!(scores(&v, &[1, 7]), [6, 5]);

        // Removal forgets the score; re-insertion starts over.
        v.remove(&[1, 7]).unwrap();
        assert_eq!(scores(&v, &[1, 7]), [0, 0]);
        v.update_rows(&[1], &[s], |_, _, _| {}).unwrap();
        v.upsert(&[7], &[0.0; 2]).unwrap();
        assert_eq!(scores(&v, &[1, 7]), [1, 1]);
        assert_eq!(scores(&v, &[2, 3, 4, 5, 6, 8]), [1, 4, 2, 1, 3, 2]);
    }
}

/// Timestamp: nanoseconds since the Unix epoch; every key of one
/// single-shard batch gets the same stamp, a later batch a strictly larger
/// one, and only written keys move.
#[test]
fn timestamp_scores_are_one_increasing_stamp_per_batch() {
    let v = var::<u64>(3, 1, RestrictPolicy::Timestamp);
    let s = v.create_slot("s", 0.0).unwrap();
    let before = now_ns();
    v.upsert(&[1, 2, 3, 4], &[0.0; 12]).unwrap();
    let first = scores(&v, &[1, 2, 3, 4]);
    assert!(first.iter().all(|&t| t == first[0]), "one stamp: {first:?}");
    let t0 = first[0];
    assert!(
        t0 >= before,
        "stamp {t0} is not in ns since the epoch ({before})"
    );
    assert!(
        t0 < before + 3_600_000_000_000,
        "stamp {t0} is far ahead of {before}"
    );

    let mut last = t0;
    let mut out = [0.0; 6];
    // Each kind of write, one batch each: only its keys move, strictly up.
    type Write = Box<dyn Fn(&Variable<u64>)>;
    let writes: Vec<(&str, Vec<u64>, Write)> = vec![
        (
            "upsert",
            vec![1],
            Box::new(|v| v.upsert(&[1], &[1.0; 3]).unwrap()),
        ),
        (
            "accum",
            vec![2],
            Box::new(|v| v.accum(&[2], &[1.0; 3], &[true]).unwrap()),
        ),
        (
            "update_rows",
            vec![3, 4],
            Box::new(move |v| v.update_rows(&[3, 4, 3], &[s], |_, _, _| {}).unwrap()),
        ),
        (
            "lookup_or_insert insert",
            vec![5, 6],
            Box::new(|v| {
                let mut out = [0.0; 9];
                v.lookup_or_insert(&[5, 1, 6], &mut out).unwrap();
            }),
        ),
        (
            "accum insert",
            vec![7],
            Box::new(|v| v.accum(&[7], &[1.0; 3], &[false]).unwrap()),
        ),
        (
            "update_rows insert",
            vec![8],
            Box::new(|v| v.update_rows(&[8], &[], |_, _, _| {}).unwrap()),
        ),
        (
            "upsert again",
            vec![1],
            Box::new(|v| v.upsert(&[1], &[2.0; 3]).unwrap()),
        ),
    ];
    let all: Vec<u64> = (1..=8).collect();
    for (what, written, write) in writes {
        let old = scores(&v, &all);
        write(&v);
        let new = scores(&v, &all);
        let stamp = new[written[0] as usize - 1];
        assert!(stamp > last, "{what}: {stamp} not after {last}");
        for (j, &k) in all.iter().enumerate() {
            if written.contains(&k) {
                assert_eq!(new[j], stamp, "{what}: key {k} has the batch's stamp");
            } else {
                assert_eq!(new[j], old[j], "{what}: key {k} was not written");
            }
        }
        last = stamp;
    }
    // Ignored accums and reads do not move anything.
    let old = scores(&v, &all);
    v.accum(&[1], &[1.0; 3], &[false]).unwrap();
    v.accum(&[100], &[1.0; 3], &[true]).unwrap();
    v.lookup(&[1, 2], &mut out).unwrap();
    v.lookup_or_insert(&[3, 4], &mut out).unwrap();
    assert_eq!(scores(&v, &all), old);
    assert_eq!(score(&v, 100), 0);
}

/// Sharded Timestamp scores: every stamp of a batch is later than every
/// stamp of the batches before it, whichever shard its keys fall in.
#[test]
fn timestamp_scores_of_sharded_batches_are_ordered() {
    let v = var::<i64>(1, 4, RestrictPolicy::Timestamp);
    let mut previous_max = 0;
    for batch in 0..20i64 {
        let keys: Vec<i64> = (0..8).map(|j| batch * 8 + j).collect();
        v.upsert(&keys, &[1.0; 8]).unwrap();
        let got = scores(&v, &keys);
        let min = *got.iter().min().unwrap();
        assert!(
            min > previous_max,
            "batch {batch}: {got:?} not after {previous_max}"
        );
        previous_max = *got.iter().max().unwrap();
    }
}

/// No read changes a score (both policies): lookup, lookup_with_exists,
/// lookup_or_insert of present keys, lookup_slot, lookup_scores, export,
/// export_chunks, a restrict that does not trigger, and clones' reads.
#[test]
fn reads_never_change_scores() {
    for policy in [RestrictPolicy::Frequency, RestrictPolicy::Timestamp] {
        for shards in [1, 3] {
            let v = var::<i64>(4, shards, policy);
            let s = v.create_slot("s", 0.1).unwrap();
            let keys: Vec<i64> = (-10..10).collect();
            for round in 0..3 {
                let some: Vec<i64> = keys.iter().copied().filter(|k| k % 3 != round).collect();
                v.upsert(&some, &vec![1.0; some.len() * 4]).unwrap();
            }
            let before = scores(&v, &keys);
            let missing = [1000i64, -1000];
            let c = v.clone();
            let mut out = vec![0.0; keys.len() * 4];
            let mut exists = vec![false; keys.len()];
            for _ in 0..3 {
                v.lookup(&keys, &mut out).unwrap();
                c.lookup_with_exists(&keys, &mut out, &mut exists).unwrap();
                v.lookup_or_insert(&keys, &mut out).unwrap();
                v.lookup_slot(s, &keys, &mut out).unwrap();
                let _ = scores(&v, &keys);
                let _ = v.export().unwrap();
                for chunk in v.export_chunks(7) {
                    chunk.unwrap();
                }
                assert_eq!(v.restrict(0, usize::MAX).unwrap(), 0);
                v.lookup(&missing, &mut out[..8]).unwrap();
                v.lookup_slot(s, &missing, &mut out[..8]).unwrap();
            }
            assert_eq!(scores(&v, &keys), before, "{policy:?}, {shards} shards");
            assert_eq!(scores(&v, &missing), [0, 0]);
            assert_eq!(v.size(), keys.len());
        }
    }
}

// ---------------------------------------------------------------- restrict

/// Frequency: keys written 1..=n times; restrict keeps exactly the
/// `num_reserved` most written, returns how many it removed, and leaves the
/// kept rows' values and scores untouched.
#[test]
fn restrict_by_frequency_keeps_exactly_the_most_written() {
    for shards in [1, 3] {
        let v = var::<u32>(2, shards, RestrictPolicy::Frequency);
        let n = 30u32;
        for k in 0..n {
            // key k: k + 1 writes, and a value naming it.
            write_times(&v, k, k as usize);
            v.upsert(&[k], &[k as f32, -(k as f32)]).unwrap();
        }
        let keys: Vec<u32> = (0..n).collect();
        assert_eq!(scores(&v, &keys), (1..=n as u64).collect::<Vec<_>>());
        assert_eq!(v.restrict(12, 0).unwrap(), 18);
        assert_eq!(v.size(), 12);
        assert_eq!(key_set(&v), (18..n).collect::<Vec<_>>());
        let kept = export_map(&v);
        for k in 18..n {
            assert_eq!(kept[&k.to_bits()], [k as f32, -(k as f32)]);
            assert_eq!(score(&v, k), k as u64 + 1);
        }
        for k in 0..18 {
            assert_eq!(score(&v, k), 0, "removed key {k}");
        }
        // Again, smaller: the next lowest go.
        assert_eq!(v.restrict(5, 0).unwrap(), 7);
        assert_eq!(key_set(&v), (25..n).collect::<Vec<_>>());
        // Writing a low key makes it count again.
        write_times(&v, 0, 40);
        assert_eq!(v.restrict(3, 0).unwrap(), 3);
        assert_eq!(key_set(&v), [0, 28, 29]);
    }
}

/// Timestamp: keys written in separate batches; restrict removes the oldest
/// batches, and rewriting an old key saves it.
#[test]
fn restrict_by_timestamp_removes_the_least_recently_written() {
    for shards in [1, 2] {
        let v = var::<i64>(3, shards, RestrictPolicy::Timestamp);
        let s = v.create_slot("s", 0.0).unwrap();
        for batch in 0..10i64 {
            let keys = [batch * 3, batch * 3 + 1, batch * 3 + 2];
            v.upsert(&keys, &[batch as f32; 9]).unwrap();
        }
        // Key 0 (the oldest) is trained again: now the newest.
        v.update_rows(&[0], &[s], |_, values, _| values.fill(100.0))
            .unwrap();
        assert_eq!(v.restrict(10, 5).unwrap(), 20);
        let mut want: Vec<i64> = (21..30).collect();
        want.insert(0, 0);
        assert_eq!(key_set(&v), want);
        let kept = export_map(&v);
        assert_eq!(kept[&0i64.to_bits()], [100.0; 3]);
        assert_eq!(kept[&29i64.to_bits()], [9.0; 3]);
    }
}

/// `trigger`: with `size() <= trigger` nothing happens (0 returned, rows,
/// values and scores unchanged); one more row and it restricts.
#[test]
fn restrict_only_runs_when_size_exceeds_the_trigger() {
    let v = var::<i64>(2, 2, RestrictPolicy::Frequency);
    let keys: Vec<i64> = (0..10).collect();
    for (j, &k) in keys.iter().enumerate() {
        write_times(&v, k, j + 1);
    }
    let rows = export_map(&v);
    let before = scores(&v, &keys);
    for trigger in [10, 11, 1000, usize::MAX] {
        assert_eq!(v.restrict(3, trigger).unwrap(), 0, "trigger {trigger}");
        assert_eq!(v.size(), 10);
        assert_eq!(export_map(&v), rows);
        assert_eq!(scores(&v, &keys), before);
    }
    assert_eq!(v.restrict(3, 9).unwrap(), 7);
    assert_eq!(key_set(&v), [7, 8, 9]);
    // trigger below num_reserved: restricts to num_reserved all the same.
    write_times(&v, 100, 1);
    assert_eq!(v.restrict(3, 0).unwrap(), 1);
    assert_eq!(key_set(&v), [7, 8, 9]);
}

/// `num_reserved >= size()` removes nothing, `0` removes everything, an
/// empty variable is fine.
#[test]
fn restrict_with_num_reserved_at_least_size_removes_nothing() {
    let v = var::<u64>(1, 3, RestrictPolicy::Frequency);
    assert_eq!(v.restrict(0, 0).unwrap(), 0, "empty variable");
    let keys: Vec<u64> = (0..10).collect();
    v.upsert(&keys, &[1.0; 10]).unwrap();
    assert_eq!(v.restrict(10, 0).unwrap(), 0);
    assert_eq!(v.restrict(11, 0).unwrap(), 0);
    assert_eq!(v.restrict(usize::MAX, 0).unwrap(), 0);
    assert_eq!(v.size(), 10);
    assert_eq!(v.restrict(0, 0).unwrap(), 10);
    assert_eq!(v.size(), 0);
    assert!(present(&v, &keys).iter().all(|&p| !p));
    // Usable afterwards.
    v.upsert(&keys[..2], &[1.0; 2]).unwrap();
    assert_eq!(scores(&v, &keys[..2]), [1, 1]);
}

/// Ties at the boundary: exactly `num_reserved` rows stay; everything scored
/// above the boundary stays, everything below goes.
#[test]
fn restrict_with_ties_at_the_boundary_keeps_the_exact_count() {
    for shards in [1, 3] {
        // All tied (one batch, Frequency 1).
        let v = var::<i64>(2, shards, RestrictPolicy::Frequency);
        let keys: Vec<i64> = (0..10).collect();
        v.upsert(&keys, &[1.0; 20]).unwrap();
        assert_eq!(v.restrict(4, 0).unwrap(), 6);
        assert_eq!(v.size(), 4);

        // Scores 1 x3, 2 x4, 3 x3: keep 5 = the three 3s and two of the 2s.
        let v = var::<i64>(2, shards, RestrictPolicy::Frequency);
        let plan = [1, 1, 1, 2, 2, 2, 2, 3, 3, 3];
        for (k, &n) in plan.iter().enumerate() {
            write_times(&v, k as i64, n);
        }
        assert_eq!(v.restrict(5, 0).unwrap(), 5);
        let kept = key_set(&v);
        assert_eq!(kept.len(), 5);
        assert!(kept.contains(&7) && kept.contains(&8) && kept.contains(&9));
        assert_eq!(kept.iter().filter(|&&k| (3..7).contains(&k)).count(), 2);
        assert!(
            kept.iter().all(|&k| k >= 3),
            "a score-1 row survived: {kept:?}"
        );

        // Timestamp ties: one single-shard batch shares one stamp.
        let v = var::<i64>(2, 1, RestrictPolicy::Timestamp);
        v.upsert(&keys, &[1.0; 20]).unwrap();
        v.upsert(&[100, 101], &[1.0; 4]).unwrap();
        assert_eq!(v.restrict(7, 0).unwrap(), 5);
        let kept = key_set(&v);
        assert_eq!(kept.len(), 7);
        assert!(kept.contains(&100) && kept.contains(&101));
    }
}

/// Restrict is global: with every hot key in shard 0 of 4 (custom
/// partitioner), exactly the top `num_reserved` rows stay, not
/// `num_reserved / 4` per shard.
#[test]
fn restrict_is_global_across_shards() {
    // Keys >= 1000 go to shard 0, others to shards 1..=3.
    let partition = |bits: u64, n: usize| {
        if bits as i64 >= 1000 {
            0
        } else {
            1 + bits as usize % (n - 1)
        }
    };
    let v = Variable::<i64>::builder("global")
        .dim(2)
        .shards(4)
        .init_size(1)
        .partitioner(Partitioner::Custom(Arc::new(partition)))
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let hot: Vec<i64> = (1000..1008).collect();
    for (j, &k) in hot.iter().enumerate() {
        write_times(&v, k, 10 + j);
    }
    // 30 cold keys: 1 or 2 writes, except keys 4, 5, 6: 4, 7 and 5 writes.
    let cold: Vec<i64> = (0..30).collect();
    for &k in &cold {
        write_times(&v, k, 1 + (k as usize % 2));
    }
    write_times(&v, 4, 3);
    write_times(&v, 5, 5);
    write_times(&v, 6, 4);
    assert_eq!(v.shard_size(0).unwrap(), 8);
    assert_eq!(v.size(), 38);

    // Top 11: the 8 hot keys (shard 0) and cold 4 (4 writes), 5 (7), 6 (5).
    assert_eq!(v.restrict(11, 0).unwrap(), 27);
    let mut want: Vec<i64> = vec![4, 5, 6];
    want.extend(&hot);
    assert_eq!(key_set(&v), want);
    assert_eq!(
        v.shard_size(0).unwrap(),
        8,
        "all hot rows kept in one shard"
    );
    // Top 8: only shard 0 keeps rows.
    assert_eq!(v.restrict(8, 0).unwrap(), 3);
    assert_eq!(key_set(&v), hot);
    for shard in 1..4 {
        assert_eq!(v.shard_size(shard).unwrap(), 0);
    }
    // Top 3 of the hot ones.
    assert_eq!(v.restrict(3, 0).unwrap(), 5);
    assert_eq!(key_set(&v), [1005, 1006, 1007]);
}

/// Rows removed by restrict lose their slots: they read the initial values,
/// and re-inserting them (update_rows) starts from the initial values; kept
/// rows keep theirs.
#[test]
fn restrict_removes_the_slots_of_removed_rows() {
    for shards in [1, 2] {
        let dim = 3;
        let v = var::<i64>(dim, shards, RestrictPolicy::Frequency);
        let acc = v.create_slot("acc", 0.1).unwrap();
        let m = v.create_slot("m", 0.0).unwrap();
        let keys: Vec<i64> = (0..12).collect();
        for (j, &k) in keys.iter().enumerate() {
            for _ in 0..=j {
                v.update_rows(&[k], &[acc, m], |_, values, slots| {
                    for x in values.iter_mut() {
                        *x += 1.0;
                    }
                    slots[..dim].fill(k as f32 + 10.0);
                    slots[dim..].fill(-(k as f32));
                })
                .unwrap();
            }
        }
        assert_eq!(v.restrict(4, 0).unwrap(), 8);
        assert_eq!(key_set(&v), [8, 9, 10, 11]);
        let mut out = vec![0.0; keys.len() * dim];
        v.lookup_slot(acc, &keys, &mut out).unwrap();
        for (j, &k) in keys.iter().enumerate() {
            let want = if k >= 8 { k as f32 + 10.0 } else { 0.1 };
            assert_eq!(out[j * dim..(j + 1) * dim], [want; 3], "acc of {k}");
        }
        v.update_rows(&keys, &[acc, m], |i, values, slots| {
            let k = keys[i];
            if k < 8 {
                assert_eq!(values, [0.0; 3], "{k}: initializer row");
                assert_eq!(&slots[..dim], [0.1; 3], "{k}: stale acc");
                assert_eq!(&slots[dim..], [0.0; 3], "{k}: stale m");
            } else {
                assert_eq!(values, [k as f32 + 1.0; 3]);
                assert_eq!(&slots[dim..], [-(k as f32); 3]);
            }
        })
        .unwrap();
        assert_eq!(
            scores(&v, &keys[..8]),
            [1; 8],
            "re-inserted rows start over"
        );
        assert_eq!(scores(&v, &keys[8..]), [10, 11, 12, 13]);
    }
}

/// Without a policy: `restrict` is `InvalidArgument` (even when it would
/// not trigger), every score is 0 and nothing is removed.
#[test]
fn restrict_without_a_policy_is_an_error() {
    let v = Variable::<i64>::builder("plain")
        .dim(2)
        .shards(2)
        .initializer(Initializer::Constant(1.0))
        .build()
        .unwrap();
    assert_eq!(v.restrict_policy(), None);
    v.upsert(&[1, 2, 3], &[1.0; 6]).unwrap();
    v.upsert(&[1], &[2.0; 2]).unwrap();
    for (reserved, trigger) in [(1, 0), (0, usize::MAX), (10, 10)] {
        assert!(
            matches!(
                v.restrict(reserved, trigger),
                Err(Error::InvalidArgument(_))
            ),
            "restrict({reserved}, {trigger})"
        );
    }
    assert_eq!(v.size(), 3);
    assert_eq!(scores(&v, &[1, 2, 3, 4]), [0; 4]);
    for policy in [RestrictPolicy::Frequency, RestrictPolicy::Timestamp] {
        assert_eq!(var::<u32>(1, 1, policy).restrict_policy(), Some(policy));
    }
    let kept: HashSet<i64> = key_set(&v).into_iter().collect();
    assert_eq!(kept, HashSet::from([1, 2, 3]));
}

/// A checkpoint written by a machine whose clock runs two hours ahead (it
/// is accepted: within a day) is applied as written now. It moves no clock:
/// expiry in this variable and in another one still measures true ages, and
/// the saved row keeps its value and stays the newest until written again.
#[test]
fn stamps_ahead_of_the_clock_are_restored_as_now_and_keep_expiry_true() {
    use dynemb::checkpoint::{save_rows, Rows, TableInfo};
    use dynemb::Dtype;
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("tempdir");
    let now = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos(),
    )
    .expect("fits");
    let ahead = now + 2 * 3_600_000_000_000;
    let info = TableInfo {
        name: "ahead".into(),
        dim: 1,
        slots: vec![],
        scores: Some(RestrictPolicy::Timestamp),
        shards: 1,
        value_dtype: Dtype::F32,
        slot_dtype: Dtype::F32,
    };
    let rows = Rows {
        keys: vec![1],
        values: vec![0.5],
        slots: vec![],
        scores: Some(vec![ahead]),
    };
    save_rows::<u64, _>(dir.path(), &info, [Ok(rows)]).expect("save");

    let other = var::<u64>(1, 1, RestrictPolicy::Timestamp);
    other.upsert(&[42], &[1.0]).expect("upsert");
    for restore in [false, true] {
        let v = var::<u64>(1, 2, RestrictPolicy::Timestamp);
        if restore {
            v.restore(dir.path()).expect("restore");
        } else {
            v.load(dir.path()).expect("load");
        }
        let mut restored = [0];
        v.lookup_scores(&[1], &mut restored).expect("scores");
        assert!(
            restored[0] < ahead,
            "stamp {restored:?} kept from the future"
        );
        v.upsert(&[7], &[1.0]).expect("upsert");
        assert_eq!(v.expire(Duration::from_secs(3600)).expect("expire"), 0);
        assert_eq!(other.expire(Duration::from_secs(3600)).expect("expire"), 0);
        std::thread::sleep(Duration::from_millis(400));
        v.upsert(&[8], &[1.0]).expect("upsert");
        assert_eq!(
            v.expire(Duration::from_millis(250)).expect("expire"),
            2,
            "the saved row and key 7 are older than 250 ms, key 8 is not"
        );
        assert_eq!(present(&v, &[1, 7, 8]), vec![false, false, true]);
    }
}
