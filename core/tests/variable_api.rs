//! Integration tests of the public `Variable` API against its documented
//! contract (TFRA `dynamic_embedding` semantics): every operation, every
//! initializer, the bp_v2 `accum` truth table, partitioning, export and the
//! typed errors for every mistake a caller can make.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use dynemb::{Error, Initializer, Key, Partitioner, Variable, VariableBuilder};

// ---------------------------------------------------------------- helpers

fn build<K: Key>(dim: usize, shards: usize) -> Variable<K> {
    Variable::<K>::builder("test")
        .dim(dim)
        .shards(shards)
        .build()
        .expect("build")
}

/// The stored row of `key`, or `None` when it is absent (via lookup_with_exists).
fn get<K: Key>(v: &Variable<K>, key: K) -> Option<Vec<f32>> {
    let mut out = vec![f32::NAN; v.dim()];
    let mut exists = [false];
    v.lookup_with_exists(&[key], &mut out, &mut exists)
        .expect("lookup_with_exists");
    exists[0].then_some(out)
}

/// What a plain `lookup` returns for `key`.
fn read<K: Key>(v: &Variable<K>, key: K) -> Vec<f32> {
    let mut out = vec![f32::NAN; v.dim()];
    v.lookup(&[key], &mut out).expect("lookup");
    out
}

/// Export as a map from key bits to row, asserting every key appears once
/// and the buffers have consistent lengths.
fn export_map<K: Key>(v: &Variable<K>) -> HashMap<u64, Vec<f32>> {
    let (keys, values) = v.export().expect("export");
    let dim = v.dim();
    assert_eq!(values.len(), keys.len() * dim, "export values length");
    let mut map = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        let prev = map.insert(k.to_bits(), values[i * dim..(i + 1) * dim].to_vec());
        assert!(prev.is_none(), "export returned key {k:?} twice");
    }
    assert_eq!(map.len(), v.size(), "export row count vs size()");
    map
}

fn row(dim: usize, x: f32) -> Vec<f32> {
    vec![x; dim]
}

/// A row whose elements differ: x, x+1, x+2, ...
fn ramp(dim: usize, x: f32) -> Vec<f32> {
    (0..dim).map(|i| x + i as f32).collect()
}

fn assert_display_names(err: &Error, a: usize, b: usize) {
    let msg = err.to_string();
    assert!(
        msg.contains(&a.to_string()) && msg.contains(&b.to_string()),
        "error message {msg:?} should name both {a} and {b}"
    );
}

fn assert_length_mismatch<T: std::fmt::Debug>(
    r: dynemb::Result<T>,
    what: &str,
    expected: usize,
    actual: usize,
) {
    match r {
        Err(
            ref e @ Error::LengthMismatch {
                what: w,
                expected: ex,
                actual: ac,
            },
        ) => {
            assert_eq!(w, what, "LengthMismatch.what");
            assert_eq!(ex, expected, "LengthMismatch.expected for {what}");
            assert_eq!(ac, actual, "LengthMismatch.actual for {what}");
            assert_display_names(e, expected, actual);
        }
        other => panic!("expected LengthMismatch for {what}, got {other:?}"),
    }
}

// ---------------------------------------------------------------- builder

#[test]
fn builder_defaults() {
    let v = Variable::<i64>::builder("emb").build().unwrap();
    assert_eq!(v.name(), "emb");
    assert_eq!(v.dim(), 1);
    assert_eq!(v.num_shards(), 1);
    assert!(v.trainable());
    assert_eq!(v.size(), 0);
    // Default initializer is Zeros.
    assert_eq!(read(&v, 5), vec![0.0]);
    // Default partitioner is Modulo, default shard count 1.
    assert_eq!(v.shard_size(0).unwrap(), 0);
}

#[test]
fn builder_getters_and_flags() {
    let b: VariableBuilder<u64> = Variable::<u64>::builder(String::from("scope/item"))
        .dim(7)
        .shards(5)
        .partitioner(Partitioner::Modulo)
        .initializer(Initializer::Constant(2.0))
        .init_size(100)
        .trainable(false)
        .checkpoint(false);
    let v = b.build().unwrap();
    assert_eq!(v.name(), "scope/item");
    assert_eq!(v.dim(), 7);
    assert_eq!(v.num_shards(), 5);
    assert!(!v.trainable());

    let v = Variable::<u32>::builder("t")
        .trainable(true)
        .checkpoint(true)
        .build()
        .unwrap();
    assert!(v.trainable());
}

#[test]
fn builder_rejects_invalid_arguments() {
    let r = Variable::<i64>::builder("x").dim(0).build();
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "dim 0: {:?}",
        r.err()
    );
    let r = Variable::<i64>::builder("x").shards(0).build();
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "shards 0: {:?}",
        r.err()
    );
    let r = Variable::<i64>::builder("x")
        .dim(4)
        .initializer(Initializer::Values(vec![1.0, 2.0, 3.0]))
        .build();
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "Values of length 3 for dim 4: {:?}",
        r.err()
    );
    let r = Variable::<i64>::builder("x")
        .dim(2)
        .initializer(Initializer::Values(vec![1.0, 2.0, 3.0]))
        .build();
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "Values of length 3 for dim 2: {:?}",
        r.err()
    );
    let r = Variable::<i64>::builder("x")
        .dim(3)
        .initializer(Initializer::Values(vec![]))
        .build();
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "empty Values for dim 3: {:?}",
        r.err()
    );
}

// ---------------------------------------------------------------- Clone, Send, Sync

#[test]
fn variable_is_clone_send_sync() {
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<Variable<i64>>();
    assert_traits::<Variable<u64>>();
    assert_traits::<Variable<i32>>();
    assert_traits::<Variable<u32>>();
}

#[test]
fn clones_share_tables() {
    let a = build::<i64>(3, 2);
    let b = a.clone();
    b.upsert(&[1, 2], &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]).unwrap();
    assert_eq!(a.size(), 2);
    assert_eq!(get(&a, 1), Some(row(3, 1.0)));
    a.accum(&[2], &row(3, 10.0), &[true]).unwrap();
    assert_eq!(get(&b, 2), Some(row(3, 12.0)));
    a.remove(&[1]).unwrap();
    assert_eq!(get(&b, 1), None);
    assert_eq!(b.size(), 1);
    let c = b.clone();
    drop(a);
    drop(b);
    assert_eq!(get(&c, 2), Some(row(3, 12.0)));
    c.clone().clear();
    assert_eq!(c.size(), 0);
}

// ---------------------------------------------------------------- initializers

#[test]
fn lookup_of_missing_keys_returns_initializer_row_and_never_inserts() {
    let dim = 4;
    let cases: Vec<(Initializer, Vec<f32>)> = vec![
        (Initializer::Zeros, vec![0.0; dim]),
        (Initializer::Constant(-1.5), vec![-1.5; dim]),
        (Initializer::Constant(0.0), vec![0.0; dim]),
        (
            Initializer::Values(vec![1.0, -2.0, 3.5, 0.25]),
            vec![1.0, -2.0, 3.5, 0.25],
        ),
    ];
    for (init, expected) in cases {
        let v = Variable::<i64>::builder("init")
            .dim(dim)
            .shards(3)
            .initializer(init)
            .build()
            .unwrap();
        let keys = [0i64, -1, 7, i64::MAX, i64::MIN, 7];
        let mut out = vec![f32::NAN; keys.len() * dim];
        v.lookup(&keys, &mut out).unwrap();
        for i in 0..keys.len() {
            assert_eq!(
                &out[i * dim..(i + 1) * dim],
                &expected[..],
                "key {}",
                keys[i]
            );
        }
        assert_eq!(v.size(), 0, "lookup must not insert");

        let mut exists = vec![true; keys.len()];
        out.fill(f32::NAN);
        v.lookup_with_exists(&keys, &mut out, &mut exists).unwrap();
        assert_eq!(exists, vec![false; keys.len()]);
        for i in 0..keys.len() {
            assert_eq!(&out[i * dim..(i + 1) * dim], &expected[..]);
        }
        assert_eq!(v.size(), 0, "lookup_with_exists must not insert");

        // The training read stores exactly the initializer row.
        out.fill(f32::NAN);
        v.lookup_or_insert(&keys, &mut out).unwrap();
        assert_eq!(v.size(), 5);
        for k in keys {
            assert_eq!(get(&v, k), Some(expected.clone()), "stored row of {k}");
        }
        for i in 0..keys.len() {
            assert_eq!(&out[i * dim..(i + 1) * dim], &expected[..]);
        }
    }
}

fn random_initializers() -> Vec<(&'static str, Initializer)> {
    vec![
        (
            "RandomNormal",
            Initializer::RandomNormal {
                mean: 0.5,
                stddev: 2.0,
                seed: 42,
            },
        ),
        (
            "TruncatedNormal",
            Initializer::TruncatedNormal {
                mean: -1.0,
                stddev: 0.5,
                seed: 42,
            },
        ),
        (
            "RandomUniform",
            Initializer::RandomUniform {
                low: -0.25,
                high: 0.75,
                seed: 42,
            },
        ),
    ]
}

fn reseed(init: &Initializer, seed: u64) -> Initializer {
    match *init {
        Initializer::RandomNormal { mean, stddev, .. } => {
            Initializer::RandomNormal { mean, stddev, seed }
        }
        Initializer::TruncatedNormal { mean, stddev, .. } => {
            Initializer::TruncatedNormal { mean, stddev, seed }
        }
        Initializer::RandomUniform { low, high, .. } => {
            Initializer::RandomUniform { low, high, seed }
        }
        _ => unreachable!(),
    }
}

#[test]
fn random_initializers_are_deterministic_per_seed_and_key() {
    let dim = 8;
    for (name, init) in random_initializers() {
        let other_seed = reseed(&init, 43);
        let same_seed = reseed(&init, 42);
        let v = Variable::<i64>::builder("r")
            .dim(dim)
            .shards(2)
            .initializer(init)
            .build()
            .unwrap();
        let keys: Vec<i64> = vec![0, 1, 2, -1, i64::MAX, i64::MIN, 1000];
        let mut first = vec![0.0; keys.len() * dim];
        let mut second = vec![0.0; keys.len() * dim];
        v.lookup(&keys, &mut first).unwrap();
        v.lookup(&keys, &mut second).unwrap();
        assert_eq!(
            first, second,
            "{name}: a missing key reads the same row every time"
        );
        assert!(first.iter().all(|x| x.is_finite()), "{name}: finite");
        // Different keys read different rows; elements of a row differ.
        for i in 0..keys.len() {
            let r = &first[i * dim..(i + 1) * dim];
            assert!(
                r.iter().any(|&x| x != r[0]),
                "{name}: row of key {} is constant: {r:?}",
                keys[i]
            );
            for j in 0..i {
                assert_ne!(
                    r,
                    &first[j * dim..(j + 1) * dim],
                    "{name}: keys {} and {} read the same row",
                    keys[i],
                    keys[j]
                );
            }
        }
        // Same key, single-key batch: same row (not position dependent).
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(
                read(&v, k),
                first[i * dim..(i + 1) * dim].to_vec(),
                "{name}: key {k}"
            );
        }
        // Same seed, another variable with another shard count: same rows.
        let w = Variable::<i64>::builder("r2")
            .dim(dim)
            .shards(5)
            .initializer(same_seed)
            .build()
            .unwrap();
        let mut again = vec![0.0; keys.len() * dim];
        w.lookup(&keys, &mut again).unwrap();
        assert_eq!(first, again, "{name}: deterministic per (seed, key)");
        // Another seed: other rows.
        let x = Variable::<i64>::builder("r3")
            .dim(dim)
            .shards(2)
            .initializer(other_seed)
            .build()
            .unwrap();
        let mut other = vec![0.0; keys.len() * dim];
        x.lookup(&keys, &mut other).unwrap();
        assert_ne!(first, other, "{name}: another seed gives other rows");

        assert_eq!(v.size(), 0, "{name}: lookup never inserts");
        // lookup_or_insert stores exactly the row that lookup read.
        let mut ins = vec![0.0; keys.len() * dim];
        v.lookup_or_insert(&keys, &mut ins).unwrap();
        assert_eq!(
            ins, first,
            "{name}: lookup_or_insert returns the initializer row"
        );
        assert_eq!(v.size(), keys.len());
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(
                get(&v, k),
                Some(first[i * dim..(i + 1) * dim].to_vec()),
                "{name}: stored row of {k}"
            );
        }
        // Once stored, the row no longer depends on the initializer.
        v.upsert(&[1], &row(dim, 9.0)).unwrap();
        assert_eq!(read(&v, 1), row(dim, 9.0));
        // Removed and re-read: the initializer row again.
        v.remove(&[1]).unwrap();
        assert_eq!(
            read(&v, 1),
            first[dim..2 * dim].to_vec(),
            "{name}: after remove"
        );
    }
}

#[test]
fn random_initializers_have_the_right_distribution() {
    let dim = 16;
    let n = 4000usize;
    let keys: Vec<i64> = (0..n as i64).map(|k| k * 7919 - 1_000_000).collect();
    let sample = |init: Initializer| -> Vec<f32> {
        let v = Variable::<i64>::builder("d")
            .dim(dim)
            .shards(3)
            .initializer(init)
            .build()
            .unwrap();
        let mut out = vec![0.0; n * dim];
        v.lookup(&keys, &mut out).unwrap();
        assert_eq!(v.size(), 0);
        out
    };
    let stats = |xs: &[f32]| -> (f64, f64) {
        let m = xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / xs.len() as f64;
        (m, var.sqrt())
    };

    let xs = sample(Initializer::RandomNormal {
        mean: 1.0,
        stddev: 3.0,
        seed: 7,
    });
    let (m, s) = stats(&xs);
    assert!((m - 1.0).abs() < 0.1, "RandomNormal mean {m}");
    assert!((s - 3.0).abs() < 0.15, "RandomNormal stddev {s}");
    assert!(
        xs.iter().any(|&x| (x - 1.0).abs() > 6.0),
        "RandomNormal should not be truncated"
    );

    let xs = sample(Initializer::TruncatedNormal {
        mean: 1.0,
        stddev: 3.0,
        seed: 7,
    });
    assert!(
        xs.iter().all(|&x| (x - 1.0).abs() <= 6.0 + 1e-4),
        "TruncatedNormal beyond 2 stddev: {:?}",
        xs.iter().find(|&&x| (x - 1.0).abs() > 6.0 + 1e-4)
    );
    let (m, s) = stats(&xs);
    assert!((m - 1.0).abs() < 0.1, "TruncatedNormal mean {m}");
    // stddev of a normal truncated at 2 sigma is ~0.88 sigma.
    assert!(s > 2.2 && s < 2.9, "TruncatedNormal stddev {s}");

    let xs = sample(Initializer::RandomUniform {
        low: -2.0,
        high: 6.0,
        seed: 7,
    });
    assert!(
        xs.iter().all(|&x| (-2.0..=6.0).contains(&x)),
        "RandomUniform out of [low, high]"
    );
    let (m, s) = stats(&xs);
    assert!((m - 2.0).abs() < 0.1, "RandomUniform mean {m}");
    let expected_s = 8.0 / 12f64.sqrt();
    assert!((s - expected_s).abs() < 0.1, "RandomUniform stddev {s}");
    assert!(xs.iter().any(|&x| x < -1.9) && xs.iter().any(|&x| x > 5.9));
}

// ---------------------------------------------------------------- reads

#[test]
fn lookup_with_exists_reports_presence_per_key() {
    let dim = 2;
    let v = Variable::<i64>::builder("e")
        .dim(dim)
        .shards(3)
        .initializer(Initializer::Constant(-7.0))
        .build()
        .unwrap();
    v.upsert(&[1, -4, 9], &[1.0, 1.5, -4.0, -4.5, 9.0, 9.5])
        .unwrap();
    let keys = [1i64, 2, -4, 1, 3, 9, i64::MIN];
    let mut out = vec![f32::NAN; keys.len() * dim];
    let mut exists = vec![false; keys.len()];
    v.lookup_with_exists(&keys, &mut out, &mut exists).unwrap();
    assert_eq!(exists, vec![true, false, true, true, false, true, false]);
    assert_eq!(
        out,
        vec![1.0, 1.5, -7.0, -7.0, -4.0, -4.5, 1.0, 1.5, -7.0, -7.0, 9.0, 9.5, -7.0, -7.0]
    );
    // exists is overwritten, not or-ed.
    let mut exists = vec![true; 2];
    let mut out = vec![0.0; 2 * dim];
    v.lookup_with_exists(&[2, 3], &mut out, &mut exists)
        .unwrap();
    assert_eq!(exists, vec![false, false]);
    assert_eq!(v.size(), 3);
}

#[test]
fn lookup_or_insert_inserts_missing_keys_only() {
    let dim = 3;
    let v = Variable::<i64>::builder("l")
        .dim(dim)
        .shards(2)
        .initializer(Initializer::Constant(0.5))
        .build()
        .unwrap();
    v.upsert(&[10, 11], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    let keys = [10i64, 12, 11, 12, 13, 10];
    let mut out = vec![f32::NAN; keys.len() * dim];
    v.lookup_or_insert(&keys, &mut out).unwrap();
    assert_eq!(
        out,
        vec![
            1.0, 2.0, 3.0, 0.5, 0.5, 0.5, 4.0, 5.0, 6.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 2.0,
            3.0
        ]
    );
    assert_eq!(v.size(), 4, "12 repeated in the batch is inserted once");
    assert_eq!(
        get(&v, 10),
        Some(vec![1.0, 2.0, 3.0]),
        "existing row unchanged"
    );
    assert_eq!(get(&v, 12), Some(row(dim, 0.5)));
    assert_eq!(get(&v, 13), Some(row(dim, 0.5)));
    // A second call changes nothing.
    v.accum(&[12], &[1.0, 1.0, 1.0], &[true]).unwrap();
    let mut out = vec![0.0; 2 * dim];
    v.lookup_or_insert(&[12, 13], &mut out).unwrap();
    assert_eq!(out, vec![1.5, 1.5, 1.5, 0.5, 0.5, 0.5]);
    assert_eq!(v.size(), 4);
}

#[test]
fn empty_batches_are_fine() {
    let v = build::<i64>(4, 3);
    v.lookup(&[], &mut []).unwrap();
    v.lookup_with_exists(&[], &mut [], &mut []).unwrap();
    v.lookup_or_insert(&[], &mut []).unwrap();
    v.upsert(&[], &[]).unwrap();
    v.accum(&[], &[], &[]).unwrap();
    v.remove(&[]).unwrap();
    assert_eq!(v.size(), 0);
    let (k, x) = v.export().unwrap();
    assert!(k.is_empty() && x.is_empty());
    let chunks: Vec<_> = v.export_chunks(4).collect::<Result<_, _>>().unwrap();
    assert!(chunks.iter().all(|(k, x)| k.is_empty() && x.is_empty()));
}

// ---------------------------------------------------------------- writes

#[test]
fn upsert_inserts_and_overwrites_and_last_duplicate_wins() {
    let dim = 2;
    let v = build::<i64>(dim, 3);
    v.upsert(&[1, 2], &[1.0, 1.0, 2.0, 2.0]).unwrap();
    assert_eq!(v.size(), 2);
    v.upsert(&[2, 3], &[20.0, 21.0, 3.0, 3.0]).unwrap();
    assert_eq!(v.size(), 3);
    assert_eq!(get(&v, 1), Some(vec![1.0, 1.0]));
    assert_eq!(get(&v, 2), Some(vec![20.0, 21.0]));
    assert_eq!(get(&v, 3), Some(vec![3.0, 3.0]));
    // Duplicates in one batch: the last one wins, for both present and absent keys.
    v.upsert(
        &[2, 4, 2, 4, 2, 4],
        &[5.0, 5.0, 6.0, 6.0, 7.0, 7.0, 8.0, 8.0, 9.0, 9.5, 10.0, 10.5],
    )
    .unwrap();
    assert_eq!(v.size(), 4);
    assert_eq!(get(&v, 2), Some(vec![9.0, 9.5]));
    assert_eq!(get(&v, 4), Some(vec![10.0, 10.5]));
    // Many duplicates of one key across shards' batches.
    let keys: Vec<i64> = (0..100).map(|i| i % 5 + 100).collect();
    let values: Vec<f32> = (0..100).flat_map(|i| [i as f32, -(i as f32)]).collect();
    v.upsert(&keys, &values).unwrap();
    for k in 100..105i64 {
        let last = (95 + (k - 100)) as f32;
        assert_eq!(get(&v, k), Some(vec![last, -last]), "key {k}");
    }
}

#[test]
fn accum_truth_table() {
    let dim = 3;
    let v = Variable::<i64>::builder("a")
        .dim(dim)
        .shards(2)
        .initializer(Initializer::Constant(100.0))
        .build()
        .unwrap();
    v.upsert(&[1, 2], &[1.0, 2.0, 3.0, 10.0, 20.0, 30.0])
        .unwrap();
    // present && exists -> add ; present && !exists -> ignored;
    // absent && !exists -> insert delta ; absent && exists -> ignored.
    v.accum(
        &[1, 2, 3, 4],
        &[
            0.5, 0.5, 0.5, // 1
            7.0, 7.0, 7.0, // 2
            -1.0, -2.0, -3.0, // 3
            9.0, 9.0, 9.0, // 4
        ],
        &[true, false, false, true],
    )
    .unwrap();
    assert_eq!(
        get(&v, 1),
        Some(vec![1.5, 2.5, 3.5]),
        "present && exists: add"
    );
    assert_eq!(
        get(&v, 2),
        Some(vec![10.0, 20.0, 30.0]),
        "present && !exists: ignored"
    );
    assert_eq!(
        get(&v, 3),
        Some(vec![-1.0, -2.0, -3.0]),
        "absent && !exists: the delta is the row (not initializer + delta)"
    );
    assert_eq!(get(&v, 4), None, "absent && exists: ignored");
    assert_eq!(v.size(), 3);
}

#[test]
fn accum_duplicates_add_every_delta() {
    let dim = 2;
    let v = build::<i64>(dim, 3);
    v.upsert(&[1], &[1.0, 2.0]).unwrap();
    // Present key, repeated with exists = true: every delta is added.
    v.accum(&[1, 1], &[1.0, 10.0, 2.0, 20.0], &[true, true])
        .unwrap();
    assert_eq!(get(&v, 1), Some(vec![4.0, 32.0]));
    // Absent key, repeated with exists = false: inserts the sum of the deltas.
    v.accum(&[5, 5], &[1.0, 10.0, 2.0, 20.0], &[false, false])
        .unwrap();
    assert_eq!(get(&v, 5), Some(vec![3.0, 30.0]));
    // Three times, interleaved with other keys, on both kinds.
    v.accum(
        &[7, 1, 7, 5, 7],
        &[1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 4.0, 4.0],
        &[false, true, false, true, false],
    )
    .unwrap();
    assert_eq!(get(&v, 7), Some(vec![7.0, 7.0]));
    assert_eq!(get(&v, 1), Some(vec![5.0, 33.0]));
    assert_eq!(get(&v, 5), Some(vec![4.0, 31.0]));
    // Present key repeated with exists = false: every occurrence ignored.
    v.accum(&[1, 1], &[9.0, 9.0, 9.0, 9.0], &[false, false])
        .unwrap();
    assert_eq!(get(&v, 1), Some(vec![5.0, 33.0]));
    // Absent key repeated with exists = true: every occurrence ignored.
    v.accum(&[8, 8], &[9.0, 9.0, 9.0, 9.0], &[true, true])
        .unwrap();
    assert_eq!(get(&v, 8), None);
    assert_eq!(v.size(), 3);
}

#[test]
fn accum_after_another_writer_removed_the_key() {
    let dim = 2;
    let v = build::<i64>(dim, 2);
    let other = v.clone();
    v.upsert(&[3], &[1.0, 1.0]).unwrap();
    let mut out = vec![0.0; dim];
    let mut exists = [false];
    v.lookup_with_exists(&[3], &mut out, &mut exists).unwrap();
    assert!(exists[0]);
    other.remove(&[3]).unwrap();
    v.accum(&[3], &[5.0, 5.0], &exists).unwrap();
    assert_eq!(get(&v, 3), None, "a key removed in between stays absent");
    assert_eq!(v.size(), 0);
}

#[test]
fn accum_after_another_writer_inserted_the_key() {
    let dim = 2;
    let v = build::<i64>(dim, 2);
    let other = v.clone();
    let mut out = vec![0.0; dim];
    let mut exists = [true];
    v.lookup_with_exists(&[3], &mut out, &mut exists).unwrap();
    assert!(!exists[0]);
    other.upsert(&[3], &[8.0, 9.0]).unwrap();
    v.accum(&[3], &[5.0, 5.0], &exists).unwrap();
    assert_eq!(
        get(&v, 3),
        Some(vec![8.0, 9.0]),
        "a key inserted in between keeps the other writer's row"
    );
    assert_eq!(v.size(), 1);
}

#[test]
fn remove_ignores_absent_keys() {
    let dim = 1;
    let v = build::<i64>(dim, 3);
    v.upsert(&[1, 2, 3, 4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    v.remove(&[2, 99, 2, -5, 4]).unwrap();
    assert_eq!(v.size(), 2);
    assert_eq!(get(&v, 1), Some(vec![1.0]));
    assert_eq!(get(&v, 2), None);
    assert_eq!(get(&v, 3), Some(vec![3.0]));
    assert_eq!(get(&v, 4), None);
    v.remove(&[2, 4, 1000]).unwrap();
    assert_eq!(v.size(), 2);
    // Re-insert after remove works and starts from the new value.
    v.upsert(&[2], &[20.0]).unwrap();
    assert_eq!(get(&v, 2), Some(vec![20.0]));
    v.remove(&[1, 2, 3]).unwrap();
    assert_eq!(v.size(), 0);
    assert!(export_map(&v).is_empty());
}

#[test]
fn clear_empties_every_shard() {
    let v = build::<i64>(2, 4);
    let keys: Vec<i64> = (-50..50).collect();
    let mut out = vec![0.0; keys.len() * 2];
    v.lookup_or_insert(&keys, &mut out).unwrap();
    assert_eq!(v.size(), 100);
    for s in 0..4 {
        assert_eq!(v.shard_size(s).unwrap(), 25);
    }
    v.clear();
    assert_eq!(v.size(), 0);
    for s in 0..4 {
        assert_eq!(v.shard_size(s).unwrap(), 0, "shard {s} after clear");
    }
    assert!(export_map(&v).is_empty());
    assert_eq!(get(&v, 3), None);
    // Usable after clear.
    v.upsert(&[3], &[1.0, 2.0]).unwrap();
    assert_eq!(get(&v, 3), Some(vec![1.0, 2.0]));
    assert_eq!(v.size(), 1);
    v.clear();
    v.clear();
    assert_eq!(v.size(), 0);
}

// ---------------------------------------------------------------- partitioning

#[test]
fn shard_sizes_with_the_default_modulo_partitioner() {
    let v = build::<i64>(1, 3);
    let keys = [0i64, 1, 2, 3, 4, -1, -2, -3, 6];
    let values = vec![0.0; keys.len()];
    v.upsert(&keys, &values).unwrap();
    // 0,3,-3,6 -> 0 ; 1,4,-2 -> 1 ; 2,-1 -> 2 (rem_euclid).
    assert_eq!(v.shard_size(0).unwrap(), 4);
    assert_eq!(v.shard_size(1).unwrap(), 3);
    assert_eq!(v.shard_size(2).unwrap(), 2);
    assert_eq!(v.size(), 9);

    let w = build::<i64>(1, 3);
    w.upsert(&[-1], &[0.0]).unwrap();
    assert_eq!(
        w.shard_size(2).unwrap(),
        1,
        "-1 with 3 shards goes to shard 2"
    );

    let e = v.shard_size(3).unwrap_err();
    assert!(
        matches!(
            e,
            Error::UnknownShard {
                shard: 3,
                shards: 3
            }
        ),
        "{e:?}"
    );
    assert_display_names(&e, 3, 3);
    let e = v.shard_size(usize::MAX).unwrap_err();
    assert!(matches!(e, Error::UnknownShard { shards: 3, .. }), "{e:?}");
}

#[test]
fn shard_sizes_with_a_custom_partitioner() {
    let p = Partitioner::Custom(Arc::new(|k: u64, _n: usize| (k % 2) as usize));
    let v = Variable::<u64>::builder("c")
        .dim(2)
        .shards(3)
        .partitioner(p)
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..101).collect();
    let mut out = vec![0.0; keys.len() * 2];
    v.lookup_or_insert(&keys, &mut out).unwrap();
    assert_eq!(v.shard_size(0).unwrap(), 51);
    assert_eq!(v.shard_size(1).unwrap(), 50);
    assert_eq!(
        v.shard_size(2).unwrap(),
        0,
        "the custom partitioner never uses shard 2"
    );
    assert_eq!(v.size(), 101);
    // Every op routes through the same partitioner.
    v.remove(&[0, 2, 4]).unwrap();
    assert_eq!(v.shard_size(0).unwrap(), 48);
    v.accum(&[1], &[1.0, 1.0], &[true]).unwrap();
    assert_eq!(get(&v, 1), Some(vec![1.0, 1.0]));
    assert_eq!(export_map(&v).len(), 98);
}

#[test]
fn custom_partitioner_sees_sign_extended_key_bits() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let s2 = Arc::clone(&seen);
    let p = Partitioner::Custom(Arc::new(move |bits: u64, n: usize| {
        s2.lock().unwrap().push(bits);
        assert_eq!(n, 4);
        (bits >> 62) as usize
    }));
    let v = Variable::<i32>::builder("bits")
        .shards(4)
        .partitioner(p)
        .build()
        .unwrap();
    v.upsert(&[-1, 5, i32::MIN], &[1.0, 2.0, 3.0]).unwrap();
    let got = seen.lock().unwrap().clone();
    for b in [u64::MAX, 5, i32::MIN as i64 as u64] {
        assert!(
            got.contains(&b),
            "partitioner should see bits {b:#x}, saw {got:x?}"
        );
    }
    assert_eq!(
        v.shard_size(3).unwrap(),
        2,
        "-1 and MIN sign-extend to the top shard"
    );
    assert_eq!(v.shard_size(0).unwrap(), 1);

    let p = Partitioner::Custom(Arc::new(|bits: u64, _n: usize| {
        usize::from(bits == 0xFFFF_FFFF)
    }));
    let v = Variable::<u32>::builder("bits")
        .shards(2)
        .partitioner(p)
        .build()
        .unwrap();
    v.upsert(&[u32::MAX, 0], &[1.0, 2.0]).unwrap();
    assert_eq!(v.shard_size(1).unwrap(), 1, "u32 is zero-extended");
    assert_eq!(v.shard_size(0).unwrap(), 1);
}

#[test]
fn custom_partitioner_out_of_range_fails_the_whole_call() {
    // Key 99 goes to shard `n` (one past the end); everything else to k % n.
    let p = Partitioner::Custom(Arc::new(
        |k: u64, n: usize| {
            if k == 99 {
                n
            } else {
                (k % n as u64) as usize
            }
        },
    ));
    let dim = 2;
    let v = Variable::<u64>::builder("bad")
        .dim(dim)
        .shards(3)
        .partitioner(p)
        .build()
        .unwrap();
    v.upsert(&[1, 2], &[1.0, 1.0, 2.0, 2.0]).unwrap();
    let before = export_map(&v);
    let check = |r: dynemb::Result<()>, op: &str| {
        match r {
            Err(
                ref e @ Error::UnknownShard {
                    shard: 3,
                    shards: 3,
                },
            ) => assert_display_names(e, 3, 3),
            other => panic!("{op}: expected UnknownShard {{ shard: 3, shards: 3 }}, got {other:?}"),
        }
        assert_eq!(
            export_map(&v),
            before,
            "{op} changed the table before failing"
        );
    };
    let keys = [3u64, 1, 99, 4];
    let mut out = vec![0.0; keys.len() * dim];
    let mut exists = vec![false; keys.len()];
    check(v.lookup(&keys, &mut out), "lookup");
    check(
        v.lookup_with_exists(&keys, &mut out, &mut exists),
        "lookup_with_exists",
    );
    check(v.lookup_or_insert(&keys, &mut out), "lookup_or_insert");
    check(v.upsert(&keys, &vec![5.0; keys.len() * dim]), "upsert");
    check(
        v.accum(
            &keys,
            &vec![5.0; keys.len() * dim],
            &[false, true, false, false],
        ),
        "accum",
    );
    check(v.remove(&[1, 2, 99]), "remove");
    check(v.remove(&[99]), "remove");
    assert_eq!(v.size(), 2);
}

#[test]
fn a_custom_partitioner_is_checked_with_one_shard_too() {
    // With one shard every key is shard 0's, but a function that says
    // otherwise fails the call that writes the key, not a later restore of
    // what the variable saved.
    let p = Partitioner::Custom(Arc::new(|k: u64, _n: usize| usize::from(k == 99) * 5));
    let v = Variable::<u64>::builder("one")
        .dim(1)
        .shards(1)
        .partitioner(p)
        .build()
        .unwrap();
    v.upsert(&[1, 2], &[1.0, 2.0]).unwrap();
    let err = v.upsert(&[3, 99], &[3.0, 4.0]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnknownShard {
                shard: 5,
                shards: 1
            }
        ),
        "{err:?}"
    );
    let mut out = [0.0; 2];
    assert!(v.lookup_or_insert(&[4, 99], &mut out).is_err());
    assert!(v.remove(&[99]).is_err());
    assert_eq!(v.size(), 2, "the failed calls changed nothing");
    let dir = tempfile::tempdir().unwrap();
    v.save(dir.path()).unwrap();
    v.restore(dir.path()).unwrap();
    assert_eq!(v.size(), 2);
}

// ---------------------------------------------------------------- argument errors

#[test]
fn wrong_buffer_lengths_are_typed_errors_and_change_nothing() {
    let dim = 3;
    let v = build::<i64>(dim, 2);
    v.upsert(&[1], &[1.0, 2.0, 3.0]).unwrap();
    let before = export_map(&v);
    let keys = [1i64, 2];

    let mut short = vec![0.0; 5];
    let mut long = vec![0.0; 7];
    assert_length_mismatch(v.lookup(&keys, &mut short), "out", 6, 5);
    assert_length_mismatch(v.lookup(&keys, &mut long), "out", 6, 7);
    let mut ok = vec![0.0; 6];
    let mut ex1 = vec![false; 1];
    let mut ex2 = vec![false; 2];
    assert_length_mismatch(
        v.lookup_with_exists(&keys, &mut short, &mut ex2),
        "out",
        6,
        5,
    );
    assert_length_mismatch(
        v.lookup_with_exists(&keys, &mut ok, &mut ex1),
        "exists",
        2,
        1,
    );
    assert_length_mismatch(v.lookup_or_insert(&keys, &mut short), "out", 6, 5);
    assert_length_mismatch(v.lookup_or_insert(&keys, &mut long), "out", 6, 7);
    assert_length_mismatch(v.upsert(&keys, &[1.0; 5]), "values", 6, 5);
    assert_length_mismatch(v.upsert(&keys, &[1.0; 9]), "values", 6, 9);
    assert_length_mismatch(v.upsert(&[], &[1.0; 3]), "values", 0, 3);
    assert_length_mismatch(v.accum(&keys, &[1.0; 4], &[true, false]), "deltas", 6, 4);
    assert_length_mismatch(
        v.accum(&keys, &[1.0; 6], &[true, false, true]),
        "exists",
        2,
        3,
    );
    assert_length_mismatch(v.accum(&keys, &[1.0; 6], &[]), "exists", 2, 0);
    assert_eq!(export_map(&v), before, "a failed call changed the table");
}

#[test]
fn non_finite_inputs_are_rejected_and_change_nothing() {
    let dim = 2;
    let v = build::<i64>(dim, 2);
    v.upsert(&[1], &[1.0, 2.0]).unwrap();
    let before = export_map(&v);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        // upsert: valid first row, bad element at flat index 3.
        let r = v.upsert(&[1, 2], &[5.0, 5.0, 6.0, bad]);
        match r {
            Err(Error::NonFinite { what, index, value }) => {
                assert_eq!(what, "values");
                assert_eq!(index, 3, "index of the first non-finite element");
                assert!(
                    value.to_bits() == bad.to_bits() || (value.is_nan() && bad.is_nan()),
                    "value {value} vs {bad}"
                );
            }
            other => panic!("upsert with {bad}: expected NonFinite, got {other:?}"),
        }
        assert_eq!(
            export_map(&v),
            before,
            "upsert with {bad} changed the table"
        );

        // accum: a row that would be added and one that would be inserted.
        let r = v.accum(&[1, 2], &[1.0, 1.0, bad, 0.0], &[true, false]);
        match r {
            Err(Error::NonFinite { what, index, .. }) => {
                assert_eq!(what, "deltas");
                assert_eq!(index, 2, "index of the first non-finite element");
            }
            other => panic!("accum with {bad}: expected NonFinite, got {other:?}"),
        }
        assert_eq!(export_map(&v), before, "accum with {bad} changed the table");
        let r = v.accum(&[1, 2], &[bad, 1.0, 1.0, 1.0], &[true, false]);
        assert!(matches!(r, Err(Error::NonFinite { index: 0, .. })), "{r:?}");
        assert_eq!(export_map(&v), before, "accum with {bad} changed the table");
    }
    // The message says which element and which value.
    let e = v.upsert(&[1], &[0.0, f32::INFINITY]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains('1') && msg.contains("inf"), "{msg}");
}

#[test]
fn export_chunks_rejects_zero_rows_per_chunk() {
    let v = build::<i64>(2, 2);
    v.upsert(&[1, 2, 3], &[0.0; 6]).unwrap();
    let items: Vec<_> = v.export_chunks(0).take(10).collect();
    assert!(
        items
            .iter()
            .any(|r| matches!(r, Err(Error::InvalidArgument(_)))),
        "export_chunks(0) must yield InvalidArgument, got {items:?}"
    );
    assert!(
        !items
            .iter()
            .any(|r| matches!(r, Ok((k, _)) if !k.is_empty())),
        "export_chunks(0) must not yield rows: {items:?}"
    );
}

// ---------------------------------------------------------------- export

#[test]
fn export_returns_every_row_exactly_once() {
    let dim = 5;
    let v = Variable::<i64>::builder("x")
        .dim(dim)
        .shards(3)
        .init_size(1)
        .build()
        .unwrap();
    let mut expected = HashMap::new();
    let keys: Vec<i64> = (0..3000i64).map(|i| (i - 1500) * 1_000_003).collect();
    for chunk in keys.chunks(97) {
        let values: Vec<f32> = chunk
            .iter()
            .flat_map(|&k| ramp(dim, (k % 1000) as f32))
            .collect();
        v.upsert(chunk, &values).unwrap();
        for &k in chunk {
            expected.insert(k.to_bits(), ramp(dim, (k % 1000) as f32));
        }
    }
    // Remove every third key.
    let removed: Vec<i64> = keys.iter().copied().step_by(3).collect();
    v.remove(&removed).unwrap();
    for k in &removed {
        expected.remove(&k.to_bits());
    }
    assert_eq!(v.size(), expected.len());
    assert_eq!(export_map(&v), expected);
    let sum: usize = (0..3).map(|s| v.shard_size(s).unwrap()).sum();
    assert_eq!(sum, expected.len());
}

#[test]
fn export_chunks_are_bounded_and_cover_export() {
    let dim = 3;
    let v = build::<i64>(dim, 4);
    let keys: Vec<i64> = (0..1001).map(|k| k * 3 - 700).collect();
    let values: Vec<f32> = keys.iter().flat_map(|&k| ramp(dim, k as f32)).collect();
    v.upsert(&keys, &values).unwrap();
    let full = export_map(&v);
    assert_eq!(full.len(), 1001);
    for n in [1usize, 2, 7, 64, 1000, 1001, 5000] {
        let mut union = HashMap::new();
        let mut chunks = 0;
        for item in v.export_chunks(n) {
            let (k, x) = item.unwrap();
            chunks += 1;
            assert!(
                k.len() <= n,
                "chunk of {} rows with rows_per_chunk {n}",
                k.len()
            );
            assert_eq!(x.len(), k.len() * dim);
            for (i, key) in k.iter().enumerate() {
                let prev = union.insert(key.to_bits(), x[i * dim..(i + 1) * dim].to_vec());
                assert!(
                    prev.is_none(),
                    "key {key} in two chunks (rows_per_chunk {n})"
                );
            }
        }
        assert!(chunks >= 1001usize.div_ceil(n), "{chunks} chunks for n={n}");
        assert_eq!(union, full, "union of chunks with rows_per_chunk {n}");
    }
    // Empty variable: no rows.
    let e = build::<i64>(dim, 4);
    let rows: usize = e.export_chunks(3).map(|r| r.unwrap().0.len()).sum();
    assert_eq!(rows, 0);
}

#[test]
fn memory_bytes_grows_with_rows() {
    let dim = 32;
    let v = Variable::<i64>::builder("m")
        .dim(dim)
        .shards(2)
        .init_size(1)
        .build()
        .unwrap();
    let empty = v.memory_bytes();
    let keys: Vec<i64> = (0..20_000).collect();
    let mut out = vec![0.0; keys.len() * dim];
    v.lookup_or_insert(&keys, &mut out).unwrap();
    let full = v.memory_bytes();
    assert!(
        full > empty,
        "memory_bytes {empty} -> {full} after 20000 rows"
    );
    assert!(
        full >= keys.len() * dim * 4,
        "memory_bytes {full} is less than the row data ({} bytes)",
        keys.len() * dim * 4
    );
}

// ---------------------------------------------------------------- key types

fn roundtrip_edge_keys<K: Key + std::fmt::Display>(keys: &[K]) {
    let dim = 3;
    let shards = 3;
    let v = Variable::<K>::builder("keys")
        .dim(dim)
        .shards(shards)
        .initializer(Initializer::Constant(-9.0))
        .build()
        .unwrap();
    let distinct: HashSet<u64> = keys.iter().map(|k| k.to_bits()).collect();
    assert_eq!(distinct.len(), keys.len(), "test keys must be distinct");
    // Absent: initializer, exists = false.
    for &k in keys {
        assert_eq!(get(&v, k), None, "{} {k} before insert", K::TYPE_NAME);
        assert_eq!(read(&v, k), row(dim, -9.0));
    }
    let values: Vec<f32> = (0..keys.len())
        .flat_map(|i| ramp(dim, i as f32 * 10.0))
        .collect();
    v.upsert(keys, &values).unwrap();
    assert_eq!(v.size(), keys.len());
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(
            get(&v, k),
            Some(ramp(dim, i as f32 * 10.0)),
            "{} {k}",
            K::TYPE_NAME
        );
    }
    // Default partitioner: the key's value modulo shards (rem_euclid).
    let mut per_shard = vec![0usize; shards];
    for &k in keys {
        per_shard[k.floor_mod(shards)] += 1;
    }
    for (s, &n) in per_shard.iter().enumerate() {
        assert_eq!(v.shard_size(s).unwrap(), n, "{} shard {s}", K::TYPE_NAME);
    }
    // Export gives back exactly the keys.
    let (ek, ev) = v.export().unwrap();
    let mut got: Vec<(u64, Vec<f32>)> = ek
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_bits(), ev[i * dim..(i + 1) * dim].to_vec()))
        .collect();
    got.sort_by_key(|e| e.0);
    let mut want: Vec<(u64, Vec<f32>)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_bits(), ramp(dim, i as f32 * 10.0)))
        .collect();
    want.sort_by_key(|e| e.0);
    assert_eq!(got, want, "{} export", K::TYPE_NAME);
    // accum and remove on the edge keys.
    let ones = vec![1.0; keys.len() * dim];
    v.accum(keys, &ones, &vec![true; keys.len()]).unwrap();
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(
            get(&v, k),
            Some(ramp(dim, i as f32 * 10.0 + 1.0)),
            "{} {k}",
            K::TYPE_NAME
        );
    }
    v.remove(&keys[..keys.len() / 2]).unwrap();
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(
            get(&v, k).is_some(),
            i >= keys.len() / 2,
            "{} {k} after remove",
            K::TYPE_NAME
        );
    }
    assert_eq!(v.size(), keys.len() - keys.len() / 2);
    let mut out = vec![0.0; keys.len() * dim];
    v.lookup_or_insert(keys, &mut out).unwrap();
    assert_eq!(v.size(), keys.len());
    for i in 0..keys.len() / 2 {
        assert_eq!(&out[i * dim..(i + 1) * dim], &row(dim, -9.0)[..]);
    }
}

#[test]
fn i64_edge_keys_are_ordinary_keys() {
    roundtrip_edge_keys::<i64>(&[
        0,
        1,
        -1,
        i64::MAX,
        i64::MIN,
        i64::MIN + 1,
        i64::MAX - 1,
        -3,
        3,
        42,
    ]);
    let v = build::<i64>(1, 3);
    v.upsert(&[i64::MIN], &[1.0]).unwrap();
    let expected = (i64::MIN as i128).rem_euclid(3) as usize;
    assert_eq!(
        v.shard_size(expected).unwrap(),
        1,
        "i64::MIN goes to shard {expected}"
    );
}

#[test]
fn u64_edge_keys_are_ordinary_keys() {
    roundtrip_edge_keys::<u64>(&[0, 1, u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1, 42]);
    // u64::MAX is not -1: it is floor-modded as an unsigned value.
    let v = build::<u64>(1, 5);
    v.upsert(&[u64::MAX], &[1.0]).unwrap();
    assert_eq!(v.shard_size((u64::MAX % 5) as usize).unwrap(), 1);
}

#[test]
fn i32_edge_keys_are_ordinary_keys() {
    roundtrip_edge_keys::<i32>(&[0, 1, -1, i32::MAX, i32::MIN, i32::MIN + 1, -3, 3]);
}

#[test]
fn u32_edge_keys_are_ordinary_keys() {
    roundtrip_edge_keys::<u32>(&[0, 1, u32::MAX, u32::MAX - 1, 1 << 31, 3, 42]);
}

#[test]
fn signed_and_unsigned_keys_with_the_same_bits_are_different_variables() {
    // i32 -1 and u32 u32::MAX are different keys (sign vs zero extension);
    // within one variable each is its own key.
    let a = build::<i32>(1, 1);
    a.upsert(&[-1, i32::MAX], &[1.0, 2.0]).unwrap();
    assert_eq!(a.size(), 2);
    let (k, _) = a.export().unwrap();
    let mut k = k;
    k.sort();
    assert_eq!(k, vec![-1, i32::MAX]);
    let b = build::<u32>(1, 1);
    b.upsert(&[u32::MAX, 0x7FFF_FFFF], &[1.0, 2.0]).unwrap();
    let (k, _) = b.export().unwrap();
    let mut k = k;
    k.sort();
    assert_eq!(k, vec![0x7FFF_FFFF, u32::MAX]);
}

// ---------------------------------------------------------------- growth

#[test]
fn init_size_hint_holds_its_rows_and_the_table_grows_beyond_it() {
    for shards in [1usize, 4] {
        let dim = 4;
        let n = 1000usize;
        let v = Variable::<i64>::builder("hint")
            .dim(dim)
            .shards(shards)
            .init_size(n)
            .build()
            .unwrap();
        let keys: Vec<i64> = (0..n as i64).map(|k| k * 37 - 5000).collect();
        let values: Vec<f32> = keys.iter().flat_map(|&k| row(dim, k as f32)).collect();
        v.upsert(&keys, &values).unwrap();
        assert_eq!(v.size(), n);
        for &k in &keys {
            assert_eq!(get(&v, k), Some(row(dim, k as f32)));
        }
        // Beyond the hint.
        let more: Vec<i64> = (n as i64..5 * n as i64).collect();
        let mut out = vec![0.0; more.len() * dim];
        v.lookup_or_insert(&more, &mut out).unwrap();
        let overlap = more.iter().filter(|k| keys.contains(k)).count();
        assert_eq!(v.size(), n + more.len() - overlap);
        for &k in &keys {
            assert_eq!(get(&v, k), Some(row(dim, k as f32)), "key {k} after growth");
        }
    }
}

#[test]
fn single_threaded_growth_from_one_row_keeps_every_row() {
    let dim = 9;
    let v = Variable::<u64>::builder("grow")
        .dim(dim)
        .shards(2)
        .init_size(1)
        .build()
        .unwrap();
    let n = 60_000u64;
    let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for start in (0..n).step_by(1000) {
        let keys: Vec<u64> = (start..start + 1000).map(key).collect();
        let values: Vec<f32> = (start..start + 1000)
            .flat_map(|i| row(dim, (i % 100_000) as f32))
            .collect();
        v.upsert(&keys, &values).unwrap();
        assert_eq!(v.size() as u64, start + 1000);
    }
    let keys: Vec<u64> = (0..n).map(key).collect();
    let mut out = vec![0.0; keys.len() * dim];
    let mut exists = vec![false; keys.len()];
    v.lookup_with_exists(&keys, &mut out, &mut exists).unwrap();
    for i in 0..n as usize {
        assert!(exists[i], "key #{i} lost");
        assert_eq!(
            &out[i * dim..(i + 1) * dim],
            &row(dim, i as f32)[..],
            "key #{i}"
        );
    }
    // Remove half, the rest is intact.
    let odd: Vec<u64> = (0..n).filter(|i| i % 2 == 1).map(key).collect();
    v.remove(&odd).unwrap();
    assert_eq!(v.size() as u64, n / 2);
    v.lookup_with_exists(&keys, &mut out, &mut exists).unwrap();
    for i in 0..n as usize {
        assert_eq!(exists[i], i % 2 == 0, "key #{i}");
        if i % 2 == 0 {
            assert_eq!(&out[i * dim..(i + 1) * dim], &row(dim, i as f32)[..]);
        }
    }
    // Re-insert the removed half (exercises reuse of freed rows).
    let values: Vec<f32> = (0..n)
        .filter(|i| i % 2 == 1)
        .flat_map(|i| row(dim, -(i as f32)))
        .collect();
    v.upsert(&odd, &values).unwrap();
    assert_eq!(v.size() as u64, n);
    v.lookup_with_exists(&keys, &mut out, &mut exists).unwrap();
    for i in 0..n as usize {
        assert!(exists[i]);
        let want = if i % 2 == 0 { i as f32 } else { -(i as f32) };
        assert_eq!(
            &out[i * dim..(i + 1) * dim],
            &row(dim, want)[..],
            "key #{i}"
        );
    }
}

#[test]
fn absurd_sizes_are_errors_not_panics_or_aborts() {
    let huge_init = Variable::<u64>::builder("huge")
        .init_size(usize::MAX)
        .build();
    assert!(
        matches!(huge_init, Err(Error::CapacityExceeded { .. })),
        "{huge_init:?}"
    );
    let too_big = Variable::<u64>::builder("big").init_size(1 << 40).build();
    assert!(too_big.is_err(), "{too_big:?}");
    let wide = Variable::<u64>::builder("wide").dim(1 << 62).build();
    match wide {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains(&(1usize << 62).to_string())),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let many = Variable::<u64>::builder("many").shards(1 << 40).build();
    assert!(matches!(many, Err(Error::InvalidArgument(_))), "{many:?}");
    let widest = Variable::<u64>::builder("widest")
        .dim(dynemb::raw::MAX_DIM)
        .build();
    assert!(widest.is_ok());
}
