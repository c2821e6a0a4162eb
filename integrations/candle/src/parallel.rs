//! The embedding path's store calls spread over candle's CPU threads, so
//! that the other cores do not idle during a step's two largest calls
//! (reading a batch's distinct rows with `lookup_or_insert`, and the
//! optimizer's update of them). A split call reads and updates what one
//! call would, and refuses bad input before any chunk runs.
//!
//! A batch of at least [`MIN_KEYS_PER_CHUNK`] keys per thread is cut into
//! one chunk per thread of candle's own CPU pool (see `threads.rs`) and
//! each chunk is one store call on its own thread; smaller batches, a pool
//! of one thread, or a store whose calls are not CPU work
//! ([`EmbeddingStore::cpu_bound`]: a remote store, which spreads a batch
//! itself) stay one call on the caller's thread.
//!
//! While the chunks run, the caller holds candle's pool: a store's
//! methods must not run candle ops (or wait on a thread that does) unless
//! its `cpu_bound` is false, or they would wait for the pool forever.
//!
//! Invariants that keep a split call equal to one call:
//! - reads ([`lookup`], [`lookup_or_insert`]) write disjoint parts of the
//!   output, and a key's row is its initializer's row whichever thread
//!   inserts it, so the output is the same bits;
//! - an optimizer update ([`apply`]) first checks the whole batch as one
//!   call does ([`check_step`]: lengths, every gradient finite, the slots
//!   compatible), then sums repeated keys over the whole batch (a key's row
//!   must be updated once per step), and only then splits: the chunks are
//!   [`parts`](dynemb_optim::dedup::DedupedRef::part) of the deduplicated
//!   batch, so they hold distinct keys and update disjoint rows, and each
//!   row gets exactly the update one call gives it (same sums, same order,
//!   [`Step::apply_deduped`]). A summed gradient that overflows is refused
//!   as one call refuses it: that row alone is left as it was, and the
//!   error names the key's first position in the caller's batch;
//! - reads check the output's length before any chunk runs;
//! - so bad input is an error that changes nothing, as for one call. When
//!   the store itself fails (running out of capacity, a remote store's
//!   I/O), the other chunks have still run, and the first failing chunk's
//!   error is returned: which rows were written then differs from one call,
//!   which stops at the failing key.
//!
//! Where the rows are inserted (row ids, hence export order) depends on
//! the threads' timing; their values do not.

use dynemb::{EmbeddingStore, Error};
use dynemb_optim::dedup::Dedup;
use dynemb_optim::{check_step, Rule, Step};

use crate::threads;

/// Fewest keys a thread is handed: below two chunks of this a call stays
/// on its caller's thread (a hand-off costs tens of microseconds, a key a
/// few hundred nanoseconds).
pub const MIN_KEYS_PER_CHUNK: usize = 4096;

/// Keys per chunk for a batch of `keys` keys split over `threads`
/// threads, or `None` to make one call.
fn chunk_len(keys: usize, threads: usize) -> Option<usize> {
    let chunks = threads.min(keys / MIN_KEYS_PER_CHUNK);
    (chunks >= 2).then(|| keys.div_ceil(chunks))
}

/// [`chunk_len`] for a call on `store`: `None` for a store whose calls
/// are not CPU work.
fn store_chunk_len<S: EmbeddingStore>(store: &S, keys: usize, threads: usize) -> Option<usize> {
    store
        .cpu_bound()
        .then(|| chunk_len(keys, threads))
        .flatten()
}

/// An error unless `len` values are `rows` rows of `dim`.
fn check_len(what: &'static str, len: usize, rows: usize, dim: usize) -> dynemb::Result<()> {
    let expected = rows
        .checked_mul(dim)
        .ok_or_else(|| Error::InvalidArgument(format!("{rows} rows of {dim} values overflow")))?;
    if len != expected {
        return Err(Error::LengthMismatch {
            what,
            expected,
            actual: len,
        });
    }
    Ok(())
}

/// `read(store, keys, out)` (a store read that fills `out` with the rows
/// of `keys`), split for `threads` threads: one call per chunk of keys
/// with its rows of `out`, on candle's threads; the first failing chunk's
/// error.
fn read_over<S: EmbeddingStore>(
    store: &S,
    keys: &[S::Key],
    out: &mut [f32],
    threads: usize,
    read: impl Fn(&S, &[S::Key], &mut [f32]) -> dynemb::Result<()> + Sync,
) -> dynemb::Result<()> {
    let dim = store.dim();
    let Some(chunk) = store_chunk_len(store, keys.len(), threads).filter(|_| dim > 0) else {
        return read(store, keys, out);
    };
    check_len("out", out.len(), keys.len(), dim)?;
    threads::run_chunks_mut(out, chunk * dim, |part, out| {
        let first = part * chunk;
        read(store, &keys[first..(first + chunk).min(keys.len())], out)
    })
    .into_iter()
    .collect()
}

/// [`EmbeddingStore::lookup`], split over candle's threads (see the
/// [module docs](self)): copies the rows of `keys` into `out`, inserting
/// nothing.
pub fn lookup<S: EmbeddingStore>(
    store: &S,
    keys: &[S::Key],
    out: &mut [f32],
) -> dynemb::Result<()> {
    read_over(store, keys, out, threads::count(), S::lookup)
}

/// [`EmbeddingStore::lookup_or_insert`], split over candle's threads (see
/// the [module docs](self)): copies the rows of `keys` into `out`,
/// inserting missing keys with the initializer's row.
pub fn lookup_or_insert<S: EmbeddingStore>(
    store: &S,
    keys: &[S::Key],
    out: &mut [f32],
) -> dynemb::Result<()> {
    read_over(store, keys, out, threads::count(), S::lookup_or_insert)
}

/// [`EmbeddingStore::lookup_or_insert_with_exists`], split over candle's
/// threads (see the [module docs](self)): [`lookup_or_insert`], also
/// setting `exists[i]` to whether `keys[i]` has a row after the read. For
/// distinct keys (what the layers read) the flags are what one call would
/// set; a key repeated across chunks is counted by admission in whichever
/// order the threads reach it.
pub fn lookup_or_insert_with_exists<S: EmbeddingStore>(
    store: &S,
    keys: &[S::Key],
    out: &mut [f32],
    exists: &mut [bool],
) -> dynemb::Result<()> {
    let dim = store.dim();
    let chunk = store_chunk_len(store, keys.len(), threads::count()).filter(|_| dim > 0);
    let (Some(chunk), true) = (chunk, exists.len() == keys.len()) else {
        return store.lookup_or_insert_with_exists(keys, out, exists);
    };
    check_len("out", out.len(), keys.len(), dim)?;
    let parts = threads::run_chunks_mut(out, chunk * dim, |part, out| {
        let keys = &keys[part * chunk..((part + 1) * chunk).min(keys.len())];
        let mut exists = vec![true; keys.len()];
        store
            .lookup_or_insert_with_exists(keys, out, &mut exists)
            .map(|()| exists)
    });
    for (part, flags) in parts.into_iter().enumerate() {
        let flags = flags?;
        exists[part * chunk..part * chunk + flags.len()].copy_from_slice(&flags);
    }
    Ok(())
}

/// [`Step::apply`], split over candle's threads (see the
/// [module docs](self)): one optimizer step on the rows of `keys` with
/// their gradient rows `grads` (`keys.len() * dim` values; a key repeated
/// takes its summed gradient, once).
pub fn apply<S: EmbeddingStore, R: Rule>(
    step: &Step<R>,
    store: &S,
    keys: &[S::Key],
    grads: &[f32],
) -> dynemb::Result<()> {
    apply_over(step, store, keys, grads, threads::count())
}

/// [`apply`] split for `threads` threads.
fn apply_over<S: EmbeddingStore, R: Rule>(
    step: &Step<R>,
    store: &S,
    keys: &[S::Key],
    grads: &[f32],
    threads: usize,
) -> dynemb::Result<()> {
    let dim = store.dim();
    if dim == 0 || store_chunk_len(store, keys.len(), threads).is_none() {
        return step.apply(store, keys, grads);
    }
    check_step(step.params(), store, keys, grads)?;
    Dedup::with_thread_local(|scratch| {
        let batch = scratch.run(keys, grads, dim)?;
        let distinct = batch.keys.len();
        let Some(chunk) = chunk_len(distinct, threads) else {
            return step.apply_deduped(store, &batch);
        };
        threads::run(distinct.div_ceil(chunk), |c| {
            let part = batch.part(c * chunk..((c + 1) * chunk).min(distinct), dim);
            step.apply_deduped(store, &part)
        })
        .into_iter()
        .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynemb::{Initializer, Variable};
    use dynemb_optim::{ParamsAdam, ParamsSgd, SparseAdam, SparseOptimizer, SparseSgd};

    fn table(name: &str) -> Variable<i64> {
        Variable::builder(name)
            .dim(4)
            .initializer(Initializer::RandomNormal {
                mean: 0.0,
                stddev: 1.0,
                seed: 3,
            })
            .build()
            .unwrap()
    }

    fn rows(var: &Variable<i64>, keys: &[i64]) -> Vec<f32> {
        let mut out = vec![0.0; keys.len() * var.dim()];
        var.lookup(keys, &mut out).unwrap();
        out
    }

    #[test]
    fn small_batches_and_single_threads_make_one_call() {
        assert_eq!(chunk_len(MIN_KEYS_PER_CHUNK * 2 - 1, 8), None);
        assert_eq!(chunk_len(1 << 20, 1), None);
        assert_eq!(
            chunk_len(3 * MIN_KEYS_PER_CHUNK, 3),
            Some(MIN_KEYS_PER_CHUNK)
        );
        assert_eq!(
            chunk_len(2 * MIN_KEYS_PER_CHUNK + 1, 3),
            Some(MIN_KEYS_PER_CHUNK + 1)
        );
    }

    /// A local variable that says its calls are not CPU work, counting
    /// the calls it gets.
    struct Remote {
        var: Variable<i64>,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl Remote {
        fn count(&self) {
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    impl EmbeddingStore for Remote {
        type Key = i64;
        fn name(&self) -> &str {
            self.var.name()
        }
        fn store_id(&self) -> u64 {
            EmbeddingStore::store_id(&self.var)
        }
        fn dim(&self) -> usize {
            self.var.dim()
        }
        fn trainable(&self) -> bool {
            true
        }
        fn cpu_bound(&self) -> bool {
            false
        }
        fn lookup(&self, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
            self.count();
            self.var.lookup(keys, out)
        }
        fn lookup_or_insert(&self, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
            self.count();
            self.var.lookup_or_insert(keys, out)
        }
        fn create_slot(&self, name: &str, initial: f32) -> dynemb::Result<dynemb::SlotId> {
            self.var.create_slot(name, initial)
        }
        fn slot_id(&self, name: &str) -> dynemb::Result<dynemb::SlotId> {
            self.var.slot_id(name)
        }
        fn slot_initial(&self, slot: dynemb::SlotId) -> dynemb::Result<f32> {
            self.var.slot_initial(slot)
        }
        fn lookup_slot(
            &self,
            slot: dynemb::SlotId,
            keys: &[i64],
            out: &mut [f32],
        ) -> dynemb::Result<()> {
            self.var.lookup_slot(slot, keys, out)
        }
        fn update_rows<F>(
            &self,
            keys: &[i64],
            slots: &[dynemb::SlotId],
            update: F,
        ) -> dynemb::Result<()>
        where
            F: FnMut(usize, &mut [f32], &mut [f32]),
        {
            self.count();
            self.var.update_rows(keys, slots, update)
        }
    }

    #[test]
    fn stores_that_are_not_cpu_bound_get_one_call() {
        let remote = Remote {
            var: table("remote"),
            calls: Default::default(),
        };
        let keys: Vec<i64> = (0..20_000).collect();
        let mut out = vec![0.0; keys.len() * 4];
        read_over(&remote, &keys, &mut out, 3, Remote::lookup).unwrap();
        read_over(&remote, &keys, &mut out, 3, Remote::lookup_or_insert).unwrap();
        let opt = SparseSgd::new(ParamsSgd { lr: 0.1 }).unwrap();
        let step = opt.begin_step().unwrap();
        apply_over(&step, &remote, &keys, &out, 3).unwrap();
        assert_eq!(remote.calls.load(std::sync::atomic::Ordering::Relaxed), 3);
        assert_eq!(remote.var.size(), keys.len());
    }

    #[test]
    fn split_reads_equal_one_call() {
        let keys: Vec<i64> = (0..20_011).map(|k| k * 7 - 3000).collect();
        let (split, whole) = (table("split"), table("whole"));
        let mut got = vec![0.0; keys.len() * 4];
        read_over(&split, &keys, &mut got, 3, Variable::lookup).unwrap();
        assert_eq!(split.size(), 0, "lookup inserts nothing");
        read_over(&split, &keys, &mut got, 3, Variable::lookup_or_insert).unwrap();
        let mut want = vec![0.0; keys.len() * 4];
        whole.lookup_or_insert(&keys, &mut want).unwrap();
        assert_eq!(got, want);
        assert_eq!(split.size(), keys.len());
        let mut short = vec![0.0; keys.len() * 4 - 1];
        let err = read_over(&split, &keys, &mut short, 3, Variable::lookup_or_insert);
        assert!(matches!(
            err,
            Err(Error::LengthMismatch { what: "out", .. })
        ));
    }

    #[test]
    fn split_update_equals_one_call_with_repeats_summed() {
        // Every key three times, spread over the batch, so a naive split
        // would update a row in several chunks.
        let distinct: Vec<i64> = (0..9_001).map(|k| k * 13 - 5000).collect();
        let keys: Vec<i64> = (0..3).flat_map(|_| distinct.iter().copied()).collect();
        let grads: Vec<f32> = (0..keys.len() * 4).map(|i| (i % 17) as f32 - 8.0).collect();
        let (split, whole) = (table("split"), table("whole"));
        let params = ParamsAdam {
            lr: 0.1,
            ..Default::default()
        };
        let (a, b) = (
            SparseAdam::new(params).unwrap(),
            SparseAdam::new(params).unwrap(),
        );
        for _ in 0..2 {
            let step = a.begin_step().unwrap();
            apply_over(&step, &split, &keys, &grads, 3).unwrap();
            b.apply(&whole, &keys, &grads).unwrap();
        }
        assert_eq!(rows(&split, &distinct), rows(&whole, &distinct));
        for name in ["m", "v"] {
            let slot = |var: &Variable<i64>| {
                let mut out = vec![0.0; distinct.len() * 4];
                var.lookup_slot(var.slot_id(name).unwrap(), &distinct, &mut out)
                    .unwrap();
                out
            };
            assert_eq!(slot(&split), slot(&whole), "slot {name}");
        }
    }

    #[test]
    fn an_overflowing_row_is_named_as_one_call_names_it() {
        // Key 15000 (in the second chunk) twice; its update overflows.
        let mut keys: Vec<i64> = (0..20_000).collect();
        keys.push(15_000);
        let mut grads = vec![0.0_f32; keys.len() * 4];
        grads[15_000 * 4] = 1e9;
        let params = ParamsSgd { lr: 1e30 };
        let (split, whole) = (table("split"), table("whole"));
        let a = SparseSgd::new(params).unwrap();
        let step = a.begin_step().unwrap();
        let got = apply_over(&step, &split, &keys, &grads, 2);
        let want = SparseSgd::new(params).unwrap().apply(&whole, &keys, &grads);
        assert!(
            matches!(want, Err(Error::NonFinite { index: 15_000, .. })),
            "{want:?}"
        );
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
    }

    #[test]
    fn repeats_whose_sum_overflows_are_refused_as_one_call_refuses_them() {
        // Key 9999 at positions 9999 and 20000: finite gradients whose sum
        // is infinite. One call leaves that row and updates the others.
        let mut keys: Vec<i64> = (0..20_000).collect();
        keys.push(9_999);
        let mut grads = vec![1.0_f32; keys.len() * 4];
        grads[9_999 * 4] = 3e38;
        grads[20_000 * 4] = 3e38;
        let params = ParamsSgd { lr: 0.5 };
        let (split, whole) = (table("split"), table("whole"));
        let step = SparseSgd::new(params).unwrap().begin_step().unwrap();
        let got = apply_over(&step, &split, &keys, &grads, 2);
        let want = SparseSgd::new(params).unwrap().apply(&whole, &keys, &grads);
        assert!(
            matches!(want, Err(Error::NonFinite { index: 9_999, .. })),
            "{want:?}"
        );
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
        let distinct: Vec<i64> = (0..20_000).collect();
        assert_eq!(rows(&split, &distinct), rows(&whole, &distinct));
        assert_eq!(split.size(), whole.size());
    }

    #[test]
    fn a_bad_gradient_anywhere_changes_nothing() {
        let keys: Vec<i64> = (0..20_000).collect();
        let mut grads = vec![1.0_f32; keys.len() * 4];
        grads[19_999 * 4 + 2] = f32::NAN;
        let var = table("bad");
        let opt = SparseAdam::new(ParamsAdam::default()).unwrap();
        let step = opt.begin_step().unwrap();
        let err = apply_over(&step, &var, &keys, &grads, 2);
        assert!(
            matches!(err, Err(Error::NonFinite { index, .. }) if index == 19_999 * 4 + 2),
            "{err:?}"
        );
        assert_eq!(var.size(), 0);
        let err = apply_over(&step, &var, &keys, &grads[1..], 2);
        assert!(matches!(err, Err(Error::LengthMismatch { .. })), "{err:?}");
        assert_eq!(var.size(), 0);
    }
}
