//! Bad input to the lookup family is a clear `Error::InvalidInput`, found
//! before the store is read, and leaves the table as it was; input that
//! TensorFlow accepts (NaN or infinite weights, negative ids) is accepted,
//! except a `max_norm` for which TensorFlow turns every row into NaN or
//! zeros (not finite, or not above 0), which is refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::{Device, Tensor};

use dynemb::{EmbeddingStore, Initializer, SlotId, Variable};
use dynemb_candle::{
    embedding_lookup, embedding_lookup_sparse, embedding_lookup_sparse_with_max_norm,
    safe_embedding_lookup_sparse, Combiner, Error, Ids, SparseIds,
};

/// A variable that counts its reads and refuses to be written.
struct Counted {
    var: Variable<i64>,
    lookups: AtomicUsize,
}

impl Counted {
    fn new() -> Self {
        let var = Variable::<i64>::builder("errors")
            .dim(3)
            .initializer(Initializer::Constant(0.5))
            .build()
            .unwrap();
        var.upsert(&[1, -2, 3], &[1.0, 2.0, 2.0, -3.0, 0.0, 4.0, 0.0, 0.0, 1.0])
            .unwrap();
        Counted {
            var,
            lookups: AtomicUsize::new(0),
        }
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::Relaxed)
    }

    /// The table holds its three rows, untouched.
    fn assert_unchanged(&self) {
        assert_eq!(self.var.size(), 3);
        let mut rows = vec![0.0; 9];
        self.var.lookup(&[1, -2, 3], &mut rows).unwrap();
        assert_eq!(rows, [1.0, 2.0, 2.0, -3.0, 0.0, 4.0, 0.0, 0.0, 1.0]);
    }
}

impl EmbeddingStore for Counted {
    type Key = i64;

    fn name(&self) -> &str {
        self.var.name()
    }
    fn store_id(&self) -> u64 {
        self.var.store_id()
    }
    fn dim(&self) -> usize {
        self.var.dim()
    }
    fn trainable(&self) -> bool {
        self.var.trainable()
    }
    fn lookup(&self, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        self.var.lookup(keys, out)
    }
    fn lookup_or_insert(&self, _: &[i64], _: &mut [f32]) -> dynemb::Result<()> {
        panic!("a lookup inserted")
    }
    fn create_slot(&self, _: &str, _: f32) -> dynemb::Result<SlotId> {
        panic!("a lookup created a slot")
    }
    fn slot_id(&self, name: &str) -> dynemb::Result<SlotId> {
        self.var.slot_id(name)
    }
    fn slot_initial(&self, slot: SlotId) -> dynemb::Result<f32> {
        self.var.slot_initial(slot)
    }
    fn lookup_slot(&self, slot: SlotId, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
        self.var.lookup_slot(slot, keys, out)
    }
    fn update_rows<F>(&self, _: &[i64], _: &[SlotId], _: F) -> dynemb::Result<()>
    where
        F: FnMut(usize, &mut [f32], &mut [f32]),
    {
        panic!("a lookup updated rows")
    }
}

/// `result` is an `InvalidInput` mentioning `words`.
fn assert_invalid<T: std::fmt::Debug>(result: dynemb_candle::Result<T>, words: &str) {
    match result {
        Err(Error::InvalidInput(message)) => {
            assert!(
                message.contains(words),
                "{message:?} should mention {words:?}"
            )
        }
        other => panic!("expected InvalidInput mentioning {words:?}, got {other:?}"),
    }
}

#[test]
fn coo_indices_outside_the_dense_shape_or_miscounted() {
    let ids = [1_i64, -2];
    assert_invalid(
        SparseIds::from_coo(&[[0, 0], [2, 0]], &ids, [2, 3]),
        "index [2, 0] of entry 1 is outside dense shape [2, 3]",
    );
    assert_invalid(
        SparseIds::from_coo(&[[0, 3], [1, 0]], &ids, [2, 3]),
        "outside dense shape",
    );
    assert_invalid(
        SparseIds::from_coo(&[[0, 0]], &ids, [2, 3]),
        "2 ids of rank 2 need 4 index values, got 2",
    );
    assert_invalid(
        SparseIds::from_coo_nd(&[0, 1, 0], &ids, &[2, 2]),
        "need 4 index values",
    );
    assert_invalid(
        SparseIds::<i64>::from_coo_nd(&[], &[], &[]),
        "rank 1 or more",
    );
    assert_invalid(
        SparseIds::<i64>::from_coo_nd(&[], &[], &[usize::MAX, 3, 1]),
        "too large",
    );
    // No entries, but an output of [0, MAX, dim] has no strides.
    assert_invalid(
        SparseIds::<i64>::from_coo_nd(&[], &[], &[0, usize::MAX, 1]),
        "too large",
    );
    assert_invalid(
        SparseIds::from_coo_nd(&[0, 0, 5], &[1_i64], &[1, 1, 5]),
        "dimension 2",
    );
}

#[test]
fn bad_offsets() {
    let ids = [1_i64, -2, 3];
    assert_invalid(SparseIds::from_offsets(&ids, &[]), "at least [0]");
    assert_invalid(SparseIds::from_offsets(&ids, &[1, 3]), "start at 0");
    assert_invalid(
        SparseIds::from_offsets(&ids, &[0, 2, 1, 3]),
        "offsets[2] = 1 < offsets[1] = 2",
    );
    assert_invalid(SparseIds::from_offsets(&ids, &[0, 2, 4]), "ids.len() = 3");
    // PyTorch's form without the final offset is refused, not guessed at.
    assert_invalid(SparseIds::from_offsets(&ids, &[0, 1, 2]), "got 2");
}

#[test]
fn unsorted_rows_are_an_error_for_the_plain_function_only() {
    let store = Counted::new();
    let sp = SparseIds::from_coo(&[[1, 0], [0, 0], [1, 1]], &[1_i64, -2, 3], [2, 2]).unwrap();
    for weights in [None, Some(&[1.0_f32, 2.0, 3.0][..])] {
        assert_invalid(
            embedding_lookup_sparse(&store, &sp, weights, Combiner::Sum),
            "segment ids are not increasing: entry 1 is in row 0 after row 1",
        );
    }
    assert_eq!(store.lookups(), 0, "checked before reading the store");
    let t = safe_embedding_lookup_sparse(&store, &sp, None, Combiner::Sum, None).unwrap();
    assert_eq!(
        t.to_vec2::<f32>().unwrap(),
        [[-3.0, 0.0, 4.0], [1.0, 2.0, 3.0]]
    );
    assert_eq!(store.lookups(), 1);
    store.assert_unchanged();
}

#[test]
fn weights_of_the_wrong_length() {
    let store = Counted::new();
    let sp = SparseIds::from_offsets(&[1_i64, -2, 3], &[0, 2, 3]).unwrap();
    for weights in [&[1.0_f32, 2.0][..], &[1.0, 2.0, 3.0, 4.0], &[]] {
        for combiner in [Combiner::Sum, Combiner::Mean, Combiner::Sqrtn] {
            let words = format!("3 sparse ids need 3 weights, got {}", weights.len());
            assert_invalid(
                embedding_lookup_sparse(&store, &sp, Some(weights), combiner),
                &words,
            );
            assert_invalid(
                safe_embedding_lookup_sparse(&store, &sp, Some(weights), combiner, Some(1)),
                &words,
            );
        }
    }
    assert_eq!(store.lookups(), 0);
    store.assert_unchanged();
}

#[test]
fn ids_whose_shape_does_not_hold_them() {
    assert_invalid(Ids::new(vec![1_i64, 2, 3], &[2, 2]), "holds 4 ids, got 3");
    assert_invalid("average".parse::<Combiner>(), "\"average\"");
}

#[test]
fn what_tensorflow_accepts_is_accepted() {
    let store = Counted::new();
    let sp = SparseIds::from_offsets(&[1_i64, -2, 3, 1], &[0, 2, 4]).unwrap();
    // NaN and infinite weights are used as given (sum) ...
    let weights = [f32::NAN, 1.0, f32::INFINITY, 1.0];
    let t = embedding_lookup_sparse(&store, &sp, Some(&weights), Combiner::Sum).unwrap();
    let rows = t.to_vec2::<f32>().unwrap();
    assert!(rows[0].iter().all(|x| x.is_nan()));
    assert!(rows[1][0].is_nan(), "0 * inf is NaN");
    assert_eq!(rows[1][2], f32::INFINITY);
    // ... or dropped by the safe function's `w > 0` for mean.
    let t =
        safe_embedding_lookup_sparse(&store, &sp, Some(&weights), Combiner::Mean, None).unwrap();
    assert_eq!(t.to_vec2::<f32>().unwrap()[0], [-3.0, 0.0, 4.0]);
    assert_eq!(store.lookups(), 2);
    store.assert_unchanged();
}

#[test]
fn a_max_norm_that_would_turn_rows_into_nan_is_refused_before_the_store_is_read() {
    let store = Counted::new();
    let sp = SparseIds::from_offsets(&[1_i64, -2, 3, 1], &[0, 2, 4]).unwrap();
    // TensorFlow: a NaN bound gives NaN rows, an infinite one x * inf / inf
    // = NaN, one <= 0 zeroes every row and the second clip (TRAIN mode)
    // divides 0 by max(0, 0).
    for max_norm in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, -1.0] {
        let words = "max_norm must be finite and above 0";
        assert_invalid(embedding_lookup(&store, &[1_i64, 7], Some(max_norm)), words);
        assert_invalid(
            embedding_lookup_sparse_with_max_norm(
                &store,
                &sp,
                None,
                Combiner::Mean,
                Some(max_norm),
            ),
            words,
        );
        assert_invalid(
            dynemb_candle::safe_embedding_lookup_sparse_with_max_norm(
                &store,
                &sp,
                None,
                Combiner::Sqrtn,
                Some(1),
                Some(max_norm),
            ),
            words,
        );
    }
    assert_eq!(store.lookups(), 0);
    store.assert_unchanged();
}

#[test]
fn extreme_max_norms_never_turn_finite_rows_into_inf_or_nan() {
    let var = Variable::<i64>::builder("extreme").dim(4).build().unwrap();
    var.upsert(
        &[1, 2, 3],
        &[
            3.0, 4.0, 0.0, 0.0, // f32::MAX turned it into [inf, inf, 0, 0]
            1e20, -1e20, 1e20, -1e20, // 1e30 turned it into NaN
            3e38, -3e38, 1.0, 0.0, // its squares overflow
        ],
    )
    .unwrap();
    let sp = SparseIds::from_offsets(&[1_i64, 2, 3, 1], &[0, 2, 4]).unwrap();
    for max_norm in [f32::MAX, 1e30, 2.0, 1e-45, f32::MIN_POSITIVE] {
        let outputs = [
            embedding_lookup(&var, &[1_i64, 2, 3], Some(max_norm)).unwrap(),
            embedding_lookup_sparse_with_max_norm(&var, &sp, None, Combiner::Mean, Some(max_norm))
                .unwrap(),
        ];
        for t in outputs {
            let values = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert!(
                values.iter().all(|x| x.is_finite()),
                "{max_norm}: {values:?}"
            );
        }
    }
    let t = embedding_lookup(&var, &[1_i64, 2], Some(f32::MAX)).unwrap();
    assert_eq!(t.to_vec2::<f32>().unwrap()[0], [3.0, 4.0, 0.0, 0.0]);
    let t = embedding_lookup(&var, &[2_i64], Some(1e30)).unwrap();
    assert_eq!(t.to_vec2::<f32>().unwrap()[0], [1e20, -1e20, 1e20, -1e20]);
}

#[test]
fn outputs_larger_than_memory_are_errors_in_every_entry_point() {
    use dynemb_candle::{Embedding, EmbeddingBag, EmbeddingBagConfig, EmbeddingConfig};
    // 2^17 distinct ids of 2^20 values: 512 GiB of rows.
    let var = Arc::new(
        Variable::<i64>::builder("huge")
            .dim(dynemb::MAX_DIM)
            .build()
            .unwrap(),
    );
    let ids: Vec<i64> = (0..1 << 17).collect();
    let tensor = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap();
    let emb = Embedding::new(var.clone(), EmbeddingConfig::default()).unwrap();
    assert!(emb.forward_inference(&tensor).is_err());
    assert!(emb.forward_train(&tensor).is_err());
    let bag = EmbeddingBag::new(var.clone(), EmbeddingBagConfig::default()).unwrap();
    let offsets: Vec<usize> = (0..=ids.len()).collect();
    let sp = SparseIds::from_offsets(&ids, &offsets).unwrap();
    assert!(bag.forward_train(&sp, None).is_err());
    assert!(bag.forward_inference(&sp, None).is_err());
    assert!(embedding_lookup(&*var, ids.as_slice(), None).is_err());
    assert_eq!(var.size(), 0);
    assert_eq!(emb.recorded_batches() + bag.recorded_batches(), 0);
    // Shapes without ids whose output has no strides.
    assert!(Ids::<i64>::new(vec![], &[0, usize::MAX]).is_err());
}
