//! An audit of the core crate's public functions for panics, aborts and
//! partial effects on user input ("never lose data"): a failed call changes
//! nothing the caller can see, output buffers included, unless its docs say
//! otherwise (the per-row refusals of `accum` and `update_rows`); no value a
//! variable stores is non-finite, so every save can be restored; absurd
//! sizes are errors, not aborts; `memory_bytes` counts memory in use.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use dynemb::{
    Collection, Error, Initializer, Key, Partitioner, Registry, RestrictPolicy, Reuse, Variable,
    MAX_SHARDS, MAX_SLOTS,
};

// ---------------------------------------------------------------- helpers

/// Every key and row, by key bits.
fn rows<K: Key>(v: &Variable<K>) -> HashMap<u64, Vec<u32>> {
    let (keys, values) = v.export().expect("export");
    let dim = v.dim();
    keys.iter()
        .zip(values.chunks(dim))
        .map(|(k, row)| (k.to_bits(), row.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

fn scores<K: Key>(v: &Variable<K>, keys: &[K]) -> Vec<u64> {
    let mut out = vec![0; keys.len()];
    v.lookup_scores(keys, &mut out).expect("lookup_scores");
    out
}

/// Sends key 99 to shard `shards` (which does not exist), other keys to
/// `key % shards`.
fn bad_partitioner() -> Partitioner {
    Partitioner::Custom(Arc::new(|bits: u64, n: usize| {
        if bits == 99 {
            n
        } else {
            (bits % n as u64) as usize
        }
    }))
}

const SENTINEL: f32 = -12345.0;

fn non_finite(r: dynemb::Result<()>) -> (&'static str, usize, f32) {
    match r {
        Err(Error::NonFinite { what, index, value }) => (what, index, value),
        other => panic!("expected NonFinite, got {other:?}"),
    }
}

// ---------------------------------------------------------------- accum overflow

/// `3e38 + 3e38` is not stored (a save would write `inf` and a restore
/// refuse the checkpoint): the overflowing row is refused, alone.
#[test]
fn accum_overflow_is_refused_per_row_keeping_values_and_score() {
    let dim = 4;
    let v = Variable::<i64>::builder("overflow")
        .dim(dim)
        .shards(2)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let big = [3e38, 1.0, 2.0, 3.0];
    v.upsert(&[1, 2], &[big, [1.0; 4]].concat()).unwrap();
    let before = rows(&v);
    assert_eq!(scores(&v, &[1, 2]), [1, 1]);

    // Key 2 (shard 0) is added to, key 1 (shard 1) overflows, key 3 is
    // inserted, key 5 overflows too but comes later.
    v.upsert(&[5], &[f32::MAX; 4]).unwrap();
    let keys = [2i64, 1, 3, 5];
    let deltas = [[1.0; 4], [3e38, 0.0, 0.0, 0.0], [7.0; 4], [f32::MAX; 4]].concat();
    let r = v.accum(&keys, &deltas, &[true, true, false, true]);
    assert_eq!(non_finite(r), ("accum result", 1, f32::INFINITY));
    let after = rows(&v);
    assert_eq!(
        after[&1], before[&1],
        "the overflowing row keeps its values"
    );
    assert_eq!(
        after[&5],
        [f32::MAX.to_bits(); 4],
        "the later overflowing row too"
    );
    assert_eq!(after[&2], [2.0f32.to_bits(); 4], "other rows are written");
    assert_eq!(after[&3], [7.0f32.to_bits(); 4], "other rows are inserted");
    assert_eq!(
        scores(&v, &[2, 1, 3, 5]),
        [2, 1, 1, 1],
        "a refused row keeps its score"
    );
    assert!(rows(&v)
        .values()
        .flatten()
        .all(|&b| f32::from_bits(b).is_finite()));

    // Negative overflow, alone in its batch.
    v.upsert(&[6], &[-3e38; 4]).unwrap();
    let r = v.accum(&[6], &[-3e38; 4], &[true]);
    assert_eq!(non_finite(r), ("accum result", 0, f32::NEG_INFINITY));
    assert_eq!(rows(&v)[&6], [(-3e38f32).to_bits(); 4]);
}

/// A key the batch inserts and then adds to: the overflowing addition is
/// refused, the inserted row stays.
#[test]
fn accum_overflow_of_a_row_the_batch_inserted() {
    let v = Variable::<u64>::builder("inserted").dim(2).build().unwrap();
    let r = v.accum(&[4, 4, 8], &[3e38, 1.0, 3e38, 1.0, 1.0, 1.0], &[false; 3]);
    assert_eq!(non_finite(r), ("accum result", 1, f32::INFINITY));
    assert_eq!(rows(&v)[&4], [(3e38f32).to_bits(), 1.0f32.to_bits()]);
    assert_eq!(rows(&v)[&8], [1.0f32.to_bits(); 2]);
    assert_eq!(v.size(), 2);
}

/// The error names the first overflowing key of the batch, whichever shard
/// is written first.
#[test]
fn accum_overflow_names_the_first_position_over_all_shards() {
    let v = Variable::<u64>::builder("first").shards(3).build().unwrap();
    // Key 2 (last shard) at position 0 and key 0 (first shard) at 2.
    v.upsert(&[0, 1, 2], &[3e38, 1.0, 3e38]).unwrap();
    let r = v.accum(&[2, 1, 0], &[3e38, 1.0, 3e38], &[true; 3]);
    assert_eq!(non_finite(r), ("accum result", 0, f32::INFINITY));
    assert_eq!(rows(&v)[&1], [2.0f32.to_bits()]);
}

/// What a variable holds after overflowing accumulations saves and
/// restores.
#[test]
fn a_variable_after_accum_overflow_saves_and_restores() {
    let dir = tempfile::tempdir().unwrap();
    let v = Variable::<i64>::builder("saved").dim(2).build().unwrap();
    v.upsert(&[1, 2], &[3e38, 0.0, 1.0, 1.0]).unwrap();
    assert!(v
        .accum(&[1, 2], &[3e38, 0.0, 1.0, 1.0], &[true; 2])
        .is_err());
    v.save(dir.path().join("ckpt")).unwrap();
    let restored = Variable::<i64>::builder("saved").dim(2).build().unwrap();
    restored.restore(dir.path().join("ckpt")).unwrap();
    assert_eq!(rows(&restored), rows(&v));
}

// ---------------------------------------------------------------- initializers

#[test]
fn initializers_whose_values_would_overflow_are_rejected_at_build() {
    let build = |init: Initializer| Variable::<u64>::builder("init").initializer(init).build();
    for bad in [
        Initializer::RandomNormal {
            mean: f32::MAX,
            stddev: f32::MAX,
            seed: 0,
        },
        Initializer::RandomNormal {
            mean: 3e38,
            stddev: 1e37,
            seed: 0,
        },
        Initializer::RandomNormal {
            mean: 0.0,
            stddev: 3e37,
            seed: 0,
        },
        Initializer::TruncatedNormal {
            mean: 3e38,
            stddev: 3e37,
            seed: 0,
        },
        Initializer::TruncatedNormal {
            mean: -3e38,
            stddev: 1e38,
            seed: 0,
        },
    ] {
        let r = build(bad.clone());
        assert!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "{bad:?}: {r:?}"
        );
    }
    // Values in mean ± 2·stddev fit, and so does uniform over ±3e38
    // (`high - low` overflows in f32, not in the f64 fill computes in).
    for good in [
        Initializer::TruncatedNormal {
            mean: 0.0,
            stddev: 1.5e38,
            seed: 0,
        },
        Initializer::RandomUniform {
            low: -3e38,
            high: 3e38,
            seed: 0,
        },
    ] {
        let v = build(good.clone()).unwrap();
        let keys: Vec<u64> = (0..4096).collect();
        let mut out = vec![0.0; keys.len()];
        v.lookup_or_insert(&keys, &mut out).unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "{good:?}");
    }
}

// ---------------------------------------------------------------- output buffers

/// A custom partitioner naming a shard that does not exist fails every call
/// before anything is written: the table and every output buffer.
#[test]
fn a_bad_shard_fails_before_any_output_is_written() {
    let dim = 2;
    let v = Variable::<u64>::builder("bad")
        .dim(dim)
        .shards(3)
        .partitioner(bad_partitioner())
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let slot = v.create_slot("m", 0.5).unwrap();
    v.upsert(&[1, 2], &[1.0; 4]).unwrap();
    let before = rows(&v);
    let keys = [1u64, 2, 99, 4];
    let unknown = Err(Error::UnknownShard {
        shard: 3,
        shards: 3,
    });

    let mut out = vec![SENTINEL; keys.len() * dim];
    let mut exists = vec![false; keys.len()];
    assert_eq!(v.lookup(&keys, &mut out), unknown);
    assert!(out.iter().all(|&x| x == SENTINEL), "lookup wrote {out:?}");
    assert_eq!(v.lookup_with_exists(&keys, &mut out, &mut exists), unknown);
    assert!(
        out.iter().all(|&x| x == SENTINEL),
        "lookup_with_exists wrote {out:?}"
    );
    assert_eq!(exists, [false; 4], "lookup_with_exists wrote exists");
    assert_eq!(v.lookup_or_insert(&keys, &mut out), unknown);
    assert!(
        out.iter().all(|&x| x == SENTINEL),
        "lookup_or_insert wrote {out:?}"
    );
    assert_eq!(v.lookup_slot(slot, &keys, &mut out), unknown);
    assert!(
        out.iter().all(|&x| x == SENTINEL),
        "lookup_slot wrote {out:?}"
    );
    let mut counts = vec![7u64; keys.len()];
    assert_eq!(v.lookup_scores(&keys, &mut counts), unknown);
    assert_eq!(counts, [7; 4], "lookup_scores wrote");
    let mut called = false;
    assert_eq!(
        v.update_rows(&keys, &[slot], |_, _, _| called = true),
        unknown
    );
    assert!(!called, "update_rows ran its closure");
    assert_eq!(v.upsert(&keys, &[3.0; 8]), unknown);
    assert_eq!(
        v.accum(&keys, &[3.0; 8], &[true, true, false, false]),
        unknown
    );
    assert_eq!(v.remove(&keys), unknown);
    assert_eq!(rows(&v), before);
    assert_eq!(scores(&v, &[1, 2]), [1, 1]);
}

/// Wrong lengths: nothing written either.
#[test]
fn length_errors_write_no_output() {
    let v = Variable::<u64>::builder("len")
        .dim(2)
        .shards(2)
        .build()
        .unwrap();
    let slot = v.create_slot("m", 0.0).unwrap();
    v.upsert(&[1], &[1.0; 2]).unwrap();
    let mut out = vec![SENTINEL; 4];
    let mut exists = vec![false; 3];
    assert!(v
        .lookup_with_exists(&[1, 2], &mut out, &mut exists)
        .is_err());
    assert_eq!(exists, [false; 3]);
    assert!(out.iter().all(|&x| x == SENTINEL));
    let mut exists = vec![false; 2];
    assert!(v
        .lookup_with_exists(&[1, 2], &mut out[..3], &mut exists)
        .is_err());
    assert_eq!(exists, [false; 2]);
    assert!(v.lookup(&[1, 2], &mut out[..3]).is_err());
    assert!(v.lookup_or_insert(&[1, 2], &mut out[..3]).is_err());
    assert!(v.lookup_slot(slot, &[1, 2], &mut out[..3]).is_err());
    assert!(out.iter().all(|&x| x == SENTINEL));
    let mut counts = vec![7u64; 3];
    assert!(v.lookup_scores(&[1, 2], &mut counts).is_err());
    assert_eq!(counts, [7; 3]);
    assert_eq!(v.size(), 1);
}

// ---------------------------------------------------------------- slots

#[test]
fn a_slot_of_another_variable_is_an_error_that_changes_nothing() {
    let a = Variable::<u64>::builder("a").dim(2).build().unwrap();
    let b = Variable::<u64>::builder("b").dim(2).build().unwrap();
    let a_slot = a.create_slot("m", 1.0).unwrap();
    b.create_slot("m", 2.0).unwrap();
    b.upsert(&[1], &[1.0; 2]).unwrap();
    let before = rows(&b);
    let mut out = vec![SENTINEL; 2];
    assert!(matches!(
        b.lookup_slot(a_slot, &[1], &mut out),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(out, [SENTINEL; 2]);
    assert!(matches!(
        b.slot_initial(a_slot),
        Err(Error::InvalidArgument(_))
    ));
    let mut called = false;
    let r = b.update_rows(&[1, 5], &[a_slot], |_, _, _| called = true);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert!(!called);
    assert_eq!(rows(&b), before);
    // A clone shares the tables, and so the slots.
    let clone = a.clone();
    assert_eq!(clone.slot_initial(a_slot), Ok(1.0));
}

/// A `SlotId` made by hand with this variable's id but an index past
/// `MAX_SLOTS`, or of a column that does not exist, is refused (not an
/// out-of-bounds panic, not a silent default).
#[test]
fn a_slot_index_past_max_slots_or_without_a_column_is_an_error() {
    use dynemb::{EmbeddingStore, SlotId, MAX_SLOTS};
    let v = Variable::<u64>::builder("far").dim(2).build().unwrap();
    v.upsert(&[1], &[1.0; 2]).unwrap();
    let before = rows(&v);
    let far = SlotId::new(v.store_id(), MAX_SLOTS + 5);
    let mut called = false;
    let r = v.update_rows(&[1], &[far], |_, _, _| called = true);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert!(!called);
    assert_eq!(rows(&v), before);
    // An index below MAX_SLOTS with no column behind it: the same, for
    // every call that takes a slot.
    let missing = SlotId::new(v.store_id(), 3);
    let r = v.update_rows(&[1], &[missing], |_, _, _| called = true);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert!(matches!(
        v.slot_initial(missing),
        Err(Error::InvalidArgument(_))
    ));
    let mut out = [SENTINEL; 2];
    let r = v.lookup_slot(missing, &[1], &mut out);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert_eq!(out, [SENTINEL; 2]);
    assert!(!called);
    assert_eq!(rows(&v), before);
}

#[test]
fn a_repeated_slot_in_update_rows_changes_nothing() {
    let v = Variable::<u64>::builder("repeat")
        .dim(2)
        .shards(4)
        .build()
        .unwrap();
    let m = v.create_slot("m", 0.0).unwrap();
    v.upsert(&[1, 2, 3], &[1.0; 6]).unwrap();
    let before = rows(&v);
    let mut called = false;
    let r = v.update_rows(&[1, 2, 3, 4], &[m, m], |_, _, _| called = true);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert!(!called);
    assert_eq!(rows(&v), before);
}

#[test]
fn create_slot_past_max_slots_and_bad_slots_change_nothing() {
    let v = Variable::<u64>::builder("slots").shards(3).build().unwrap();
    v.upsert(&[1, 2, 3], &[1.0; 3]).unwrap();
    assert!(matches!(
        v.create_slot("", 0.0),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        v.create_slot("nan", f32::NAN),
        Err(Error::NonFinite { .. })
    ));
    assert!(v.slot_names().is_empty(), "a refused slot was added");
    let names: Vec<String> = (0..MAX_SLOTS).map(|i| format!("s{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        assert_eq!(v.create_slot(name, i as f32).unwrap().index(), i);
    }
    let r = v.create_slot("one_too_many", 0.0);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert_eq!(v.slot_names(), names);
    assert!(matches!(
        v.slot_id("one_too_many"),
        Err(Error::UnknownSlot { .. })
    ));
    // An existing name still answers, with its own initial value only.
    assert_eq!(v.create_slot("s3", 3.0).unwrap().index(), 3);
    assert!(matches!(
        v.create_slot("s3", 4.0),
        Err(Error::Mismatch { .. })
    ));
    // Every slot works on every shard.
    let all: Vec<_> = names.iter().map(|n| v.slot_id(n).unwrap()).collect();
    v.update_rows(&[1, 2, 3, 4], &all, |_, _, slots| slots.fill(9.0))
        .unwrap();
    let mut out = vec![0.0; 4];
    v.lookup_slot(all[MAX_SLOTS - 1], &[1, 2, 3, 4], &mut out)
        .unwrap();
    assert_eq!(out, [9.0; 4]);
}

// ---------------------------------------------------------------- sizes

#[test]
fn absurd_builder_settings_are_errors_not_panics_or_aborts() {
    let b = || Variable::<u64>::builder("absurd");
    let cases = [
        ("shards(0)", b().shards(0).build()),
        ("shards(MAX_SHARDS + 1)", b().shards(MAX_SHARDS + 1).build()),
        ("shards(usize::MAX)", b().shards(usize::MAX).build()),
        ("dim(0)", b().dim(0).build()),
        ("dim(1 << 40)", b().dim(1 << 40).build()),
        ("dim(MAX_DIM + 1)", b().dim(dynemb::MAX_DIM + 1).build()),
        ("dim(usize::MAX)", b().dim(usize::MAX).build()),
        ("init_size(usize::MAX)", b().init_size(usize::MAX).build()),
        (
            "init_size(usize::MAX) over 2 shards",
            b().init_size(usize::MAX).shards(2).build(),
        ),
        ("init_size(1 << 40)", b().init_size(1 << 40).build()),
        (
            "Values of another length",
            b().dim(3)
                .initializer(Initializer::Values(vec![1.0; 2]))
                .build(),
        ),
    ];
    for (what, r) in cases {
        assert!(r.is_err(), "{what}: {r:?}");
    }
}

/// A capacity hint too large for this machine's memory is an error or a
/// working variable (if the system lends the address space), never an
/// abort.
#[test]
fn a_huge_capacity_hint_is_an_error_or_works() {
    for rows in [1usize << 34, (1 << 34) - 1024, 1 << 33] {
        match Variable::<u64>::builder("hint").init_size(rows).build() {
            Ok(v) => {
                v.upsert(&[1], &[1.0]).unwrap();
                assert_eq!(v.size(), 1);
            }
            Err(e) => assert!(
                matches!(
                    e,
                    Error::CapacityExceeded { .. } | Error::OutOfMemory { .. }
                ),
                "{rows}: {e:?}"
            ),
        }
    }
}

#[test]
fn the_widest_rows_work() {
    let dim = dynemb::MAX_DIM;
    let v = Variable::<u64>::builder("widest").dim(dim).build().unwrap();
    let row: Vec<f32> = (0..dim).map(|i| i as f32).collect();
    v.upsert(&[7], &row).unwrap();
    let mut out = vec![0.0; dim];
    v.lookup(&[7], &mut out).unwrap();
    assert_eq!(out, row);
    // Export chunks are sized by the rows there are, not by 65,536 rows of
    // 4 MiB each up front.
    let (keys, values) = v.export().unwrap();
    assert_eq!((keys, values), (vec![7], row.clone()));
    let slot = v.create_slot("m", 0.0).unwrap();
    v.update_rows(&[7, 8], &[slot], |_, row, m| {
        m.copy_from_slice(row);
        row.fill(1.0);
    })
    .unwrap();
    v.lookup_slot(slot, &[7], &mut out).unwrap();
    assert_eq!(out, row);
    assert_eq!(v.export_chunks(1).count(), 2);
}

// ---------------------------------------------------------------- partitioner, key

#[test]
fn zero_shards_is_an_error_not_a_division_by_zero() {
    let r = catch_unwind(|| Partitioner::Modulo.shard_of(5i64, 0));
    assert!(matches!(r, Ok(Err(_))), "Modulo: {r:?}");
    let custom = Partitioner::Custom(Arc::new(|bits: u64, n: usize| bits as usize % n));
    let r = catch_unwind(AssertUnwindSafe(|| custom.shard_of(5u64, 0)));
    assert!(matches!(r, Ok(Err(_))), "Custom: {r:?}");
    for n in [0, 1, 7] {
        assert!(
            catch_unwind(|| (-3i64).floor_mod(n)).is_ok(),
            "i64 floor_mod({n})"
        );
        assert!(
            catch_unwind(|| 3u32.floor_mod(n)).is_ok(),
            "u32 floor_mod({n})"
        );
    }
    assert_eq!(Partitioner::Modulo.shard_of(-1i64, 3), Ok(2));
}

// ---------------------------------------------------------------- other calls

#[test]
fn other_argument_errors_change_nothing() {
    let v = Variable::<u64>::builder("other")
        .dim(2)
        .shards(2)
        .build()
        .unwrap();
    v.upsert(&[1, 2, 3], &[1.0; 6]).unwrap();
    let before = rows(&v);
    let mut chunks = v.export_chunks(0);
    assert!(matches!(
        chunks.next(),
        Some(Err(Error::InvalidArgument(_)))
    ));
    assert!(chunks.next().is_none());
    assert_eq!(
        v.shard_size(2),
        Err(Error::UnknownShard {
            shard: 2,
            shards: 2
        })
    );
    assert!(matches!(v.restrict(0, 0), Err(Error::InvalidArgument(_))));
    let mut called = false;
    let r = v.update_rows(&[1, 4], &[], |i, row, _| {
        called = true;
        row[0] = if i == 0 { f32::NAN } else { 5.0 };
    });
    assert!(called);
    assert_eq!(non_finite(r).1, 0);
    assert_eq!(rows(&v)[&1], before[&1], "a refused update writes nothing");
    assert_eq!(v.size(), 4, "the other key is inserted");
    assert_eq!(RestrictPolicy::from_name(""), None);
}

// ---------------------------------------------------------------- registry

#[test]
fn registry_failures_leave_no_trace() {
    let registry = Registry::new();
    // A bad builder: an error, and the name stays free.
    let bad = registry.get_variable(Variable::<u64>::builder("emb").dim(0));
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    assert!(!registry.contains("emb"));
    assert!(registry.collection(Collection::Global).is_empty());
    // Bad names.
    for name in ["", "a//b", "/a", "a/"] {
        let r = registry.get_variable(Variable::<u64>::builder(name));
        assert!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "{name:?}: {r:?}"
        );
    }
    assert!(matches!(
        registry
            .scope("")
            .get_variable(Variable::<u64>::builder("x")),
        Err(Error::InvalidArgument(_))
    ));
    // A custom getter that panics: the name is free again afterwards.
    let panicky = registry
        .scope("s")
        .custom_getter(|_, _| panic!("the custom getter fails"));
    let r = catch_unwind(AssertUnwindSafe(|| {
        panicky.get_variable(Variable::<u64>::builder("emb"))
    }));
    assert!(r.is_err());
    let v = registry
        .scope("s")
        .reuse(Reuse::No)
        .get_variable(Variable::<u64>::builder("emb").dim(3))
        .unwrap();
    assert_eq!(v.dim(), 3);
    assert!(registry
        .get_variable(Variable::<u64>::builder("emb"))
        .is_ok());
    assert_eq!(registry.collection(Collection::Global), ["s/emb", "emb"]);
    // Mismatch and NotFound.
    assert!(matches!(
        registry
            .scope("s")
            .get_variable(Variable::<i64>::builder("emb").dim(3)),
        Err(Error::Mismatch { .. })
    ));
    assert!(matches!(
        registry
            .scope("t")
            .reuse(Reuse::Yes)
            .get_variable(Variable::<u64>::builder("emb")),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(registry.collection(Collection::Global), ["s/emb", "emb"]);
}

// ---------------------------------------------------------------- memory_bytes

/// A capacity hint reserves address space for the index; `memory_bytes`
/// counts the memory in use, not that.
#[test]
fn memory_bytes_counts_memory_in_use_not_address_space_reserved() {
    let dim = 8;
    let hinted = Variable::<u64>::builder("hinted")
        .dim(dim)
        .init_size(1 << 24)
        .build()
        .unwrap();
    let keys: Vec<u64> = (0..10).collect();
    hinted.upsert(&keys, &vec![1.0; keys.len() * dim]).unwrap();
    let reserved_rows_worth = (1usize << 24) * (8 + 4 * dim);
    let used = hinted.memory_bytes();
    // Ten keys: at most one 2 MiB page per key in each index array, plus
    // the rows handed out.
    assert!(
        used <= 2 * 10 * (2 << 20) + (1 << 20),
        "{used} bytes for 10 keys ({reserved_rows_worth} would be 16Mi rows' worth)"
    );
    // Growing to many keys counts their rows and index.
    let n = 200_000u64;
    let keys: Vec<u64> = (0..n).collect();
    hinted.upsert(&keys, &vec![1.0; keys.len() * dim]).unwrap();
    let grown = hinted.memory_bytes();
    assert!(grown >= n as usize * (8 + 4 * dim), "{grown}");
    assert!(grown > used);
    // Without a hint, a small variable reports its rows and its small index.
    let plain = Variable::<u64>::builder("plain").dim(dim).build().unwrap();
    plain.upsert(&keys[..10], &vec![1.0; 10 * dim]).unwrap();
    assert!(plain.memory_bytes() < 1 << 20, "{}", plain.memory_bytes());
}
