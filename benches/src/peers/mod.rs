//! The systems under test: one module per system, each owning its adapter
//! for the table ops ([`Store`]) and, where it runs them, for the optimizer
//! steps ([`crate::apply::Trainer`]).
//!
//! Every system stores rows of `dim` `f32` keyed by `u64` (`dynemb-bf16`
//! stores them rounded to bf16, half the bytes; the API is `f32` still),
//! takes the same batches ([`Batch`]) and is used the way its documentation
//! recommends:
//!
//! | system | table ops | optimizer steps |
//! |---|---|---|
//! | [`dynemb`] | `Variable<u64>`, the public batched API | `dynemb-optim`'s `apply` on the variable |
//! | `dynemb-bf16` | the same, values and slots stored as bf16 | the same |
//! | [`dashmap`] | `DashMap<u64, Box<[f32]>>`, per key | `get_mut` and the kernel in place |
//! | [`papaya`] | `papaya::HashMap<u64, Box<[f32]>>`, per key, one pin per batch | `Mutex<Box<[f32]>>` values, the kernel under the row's lock |
//! | [`scc`] | `scc::HashMap<u64, Box<[f32]>>`, its sync API, per key | `update_sync` running the kernel |
//! | [`hashbrown`] | `RwLock<hashbrown::HashMap<u64, Box<[f32]>>>`, one lock per batch | none |
//! | [`dense`] | rows in one huge-page array by precomputed row index | one such array per column |
//! | [`dense_indirect`] | the same rows, each found by first reading its index from a scrambled array | none (lookups only) |
//!
//! Every hash map uses ahash with fixed seeds ([`hasher`], the hash dynemb
//! uses internally), so no peer pays for a slower hasher. The peers store
//! `Box<[f32]>` rows: the row width is a runtime value, so an inline
//! `[f32; DIM]` is not available to them.
//!
//! Semantics shared by every adapter (checked against a `HashMap` model in
//! the tests): `lookup` copies present rows and writes the initializer's row
//! for missing keys through [`Initializer::fill`], so the work per missing
//! key is the same everywhere; `upsert` inserts or overwrites; `accum` adds
//! the delta to present rows and ignores absent keys (dynemb's `accum` with
//! every `exists` true); `insert` is given keys that are absent.

pub mod dashmap;
pub mod dense;
pub mod dense_indirect;
pub mod dynemb;
pub mod hashbrown;
pub mod papaya;
pub mod scc;

use crate::apply::{adagrad, adam, sgd, Optimizer, Stepped, Trainer};
use crate::workload::Batch;
use ::dynemb::{Dtype, Initializer};
use dynemb_optim::Rule;
use serde::Serialize;

/// A table of rows under test, driven one batch at a time.
///
/// Row buffers are flat: `keys.len() * dim` values, row `i` at
/// `[i * dim, (i + 1) * dim)`. Calls may come from several threads at once.
pub trait Store: Sync {
    /// Which system this is.
    fn system(&self) -> System;

    /// Stores the rows of keys that are not present yet.
    fn insert(&self, batch: Batch<'_>, values: &[f32]);

    /// Copies the rows of `batch` into `out`; a missing key gets the
    /// initializer's row.
    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]);

    /// Sets the rows of `batch` to `values`, inserting absent keys.
    fn upsert(&self, batch: Batch<'_>, values: &[f32]);

    /// Adds `deltas` to the rows of present keys; absent keys are ignored.
    fn accum(&self, batch: Batch<'_>, deltas: &[f32]);

    /// Removes the keys of `batch`; absent keys are ignored.
    fn remove(&self, batch: Batch<'_>);

    /// Copies every key and row out in chunks of at most `chunk_rows` rows
    /// and hands each chunk (keys, rows) to `sink`. Returns the rows seen.
    fn export(&self, chunk_rows: usize, sink: &mut dyn FnMut(&[u64], &[f32])) -> usize;

    /// Number of keys stored.
    fn len(&self) -> usize;

    /// True when no key is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the system reports holding, if it reports any.
    fn memory_bytes(&self) -> Option<usize> {
        None
    }

    /// How the system stores values: what it reads back is what was written
    /// rounded to this.
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
}

/// The operations a benchmark times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Lookup of stored keys, uniformly picked.
    LookupHit,
    /// Lookup of stored keys, Zipf-picked.
    LookupHitZipf,
    /// Lookup of absent keys, constant initializer.
    LookupMissConstant,
    /// Lookup of absent keys, random normal initializer.
    LookupMissNormal,
    /// Overwrite of stored keys' rows.
    Upsert,
    /// `row += delta` on stored keys.
    Accum,
    /// Growing an empty table to `keys` rows, through its resizes.
    Insert,
    /// Removing every stored key.
    Remove,
    /// Copying every key and row out.
    Export,
    /// One `SparseSgd` step per batch, uniform picks ([`crate::apply`]).
    ApplySgd,
    /// One `SparseSgd` step per batch, Zipf picks.
    ApplySgdZipf,
    /// One `SparseAdagrad` step per batch, uniform picks.
    ApplyAdagrad,
    /// One `SparseAdagrad` step per batch, Zipf picks.
    ApplyAdagradZipf,
    /// One `SparseAdam` step per batch, uniform picks.
    ApplyAdam,
    /// One `SparseAdam` step per batch, Zipf picks.
    ApplyAdamZipf,
}

impl Op {
    /// Every op, in report order.
    pub const ALL: [Op; 15] = [
        Op::LookupHit,
        Op::LookupHitZipf,
        Op::LookupMissConstant,
        Op::LookupMissNormal,
        Op::Upsert,
        Op::Accum,
        Op::Insert,
        Op::Remove,
        Op::Export,
        Op::ApplySgd,
        Op::ApplySgdZipf,
        Op::ApplyAdagrad,
        Op::ApplyAdagradZipf,
        Op::ApplyAdam,
        Op::ApplyAdamZipf,
    ];

    /// The optimizer steps ([`crate::apply`]), in report order.
    pub const APPLY: [Op; 6] = [
        Op::ApplySgd,
        Op::ApplySgdZipf,
        Op::ApplyAdagrad,
        Op::ApplyAdagradZipf,
        Op::ApplyAdam,
        Op::ApplyAdamZipf,
    ];

    /// The step of `optimizer` on uniform picks, or on Zipf picks if `zipf`.
    pub fn apply(optimizer: Optimizer, zipf: bool) -> Op {
        match (optimizer, zipf) {
            (Optimizer::Sgd, false) => Op::ApplySgd,
            (Optimizer::Sgd, true) => Op::ApplySgdZipf,
            (Optimizer::Adagrad, false) => Op::ApplyAdagrad,
            (Optimizer::Adagrad, true) => Op::ApplyAdagradZipf,
            (Optimizer::Adam, false) => Op::ApplyAdam,
            (Optimizer::Adam, true) => Op::ApplyAdamZipf,
        }
    }

    /// For an optimizer step: its optimizer, and whether its picks are
    /// Zipf's (else uniform). `None` for the other ops.
    pub fn optimizer(self) -> Option<(Optimizer, bool)> {
        Optimizer::ALL
            .into_iter()
            .flat_map(|o| [(o, false), (o, true)])
            .find(|&(o, zipf)| Op::apply(o, zipf) == self)
    }

    /// True for the optimizer steps, which run on [`crate::apply::Trainer`]s
    /// rather than on [`Store`]s.
    pub fn is_apply(self) -> bool {
        self.optimizer().is_some()
    }

    /// Name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::LookupHit => "lookup hit (uniform)",
            Op::LookupHitZipf => "lookup hit (zipf 1.1)",
            Op::LookupMissConstant => "lookup miss (constant init)",
            Op::LookupMissNormal => "lookup miss (random normal init)",
            Op::Upsert => "upsert existing",
            Op::Accum => "accum (row += delta)",
            Op::Insert => "insert new (grow from empty)",
            Op::Remove => "remove",
            Op::Export => "export (rows/s)",
            Op::ApplySgd => "apply SparseSgd (uniform)",
            Op::ApplySgdZipf => "apply SparseSgd (zipf 1.1)",
            Op::ApplyAdagrad => "apply SparseAdagrad (uniform)",
            Op::ApplyAdagradZipf => "apply SparseAdagrad (zipf 1.1)",
            Op::ApplyAdam => "apply SparseAdam (uniform)",
            Op::ApplyAdamZipf => "apply SparseAdam (zipf 1.1)",
        }
    }
}

/// The systems under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum System {
    /// dynemb's `Variable<u64>`.
    #[serde(rename = "dynemb")]
    Dynemb,
    /// dynemb's `Variable<u64>` storing values and slots as bf16.
    #[serde(rename = "dynemb-bf16")]
    DynembBf16,
    /// `dashmap::DashMap`.
    #[serde(rename = "dashmap")]
    DashMap,
    /// `papaya::HashMap`.
    #[serde(rename = "papaya")]
    Papaya,
    /// `scc::HashMap`.
    #[serde(rename = "scc")]
    Scc,
    /// `hashbrown::HashMap` behind a `std::sync::RwLock`.
    #[serde(rename = "hashbrown+RwLock")]
    HashbrownRwLock,
    /// The dense reference: no hashing at all.
    #[serde(rename = "dense")]
    Dense,
    /// The dense reference behind one random read of the row's index.
    #[serde(rename = "dense-indirect")]
    DenseIndirect,
}

impl System {
    /// Every system, in report order.
    pub const ALL: [System; 8] = [
        System::Dynemb,
        System::DynembBf16,
        System::DashMap,
        System::Papaya,
        System::Scc,
        System::HashbrownRwLock,
        System::Dense,
        System::DenseIndirect,
    ];

    /// Name in tables, JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            System::Dynemb => "dynemb",
            System::DynembBf16 => "dynemb-bf16",
            System::DashMap => "dashmap",
            System::Papaya => "papaya",
            System::Scc => "scc",
            System::HashbrownRwLock => "hashbrown+RwLock",
            System::Dense => "dense",
            System::DenseIndirect => "dense-indirect",
        }
    }

    /// The system called `name` (also accepts `hashbrown`).
    pub fn from_name(name: &str) -> Option<System> {
        match name {
            "hashbrown" => Some(System::HashbrownRwLock),
            _ => System::ALL.into_iter().find(|s| s.name() == name),
        }
    }

    /// True for the hash maps dynemb is compared with (not dynemb, not the
    /// dense references).
    pub fn is_peer(self) -> bool {
        !matches!(
            self,
            System::Dynemb | System::DynembBf16 | System::Dense | System::DenseIndirect
        )
    }

    /// Whether this system runs `op` at all: the dense reference has no
    /// insert, remove or export (it neither grows nor has keys);
    /// hashbrown+RwLock runs no optimizer step; the indirect dense reference
    /// runs only lookups of stored keys. The report prints "-" for the
    /// missing figures.
    pub fn measures(self, op: Op) -> bool {
        match self {
            System::Dense => !matches!(op, Op::Insert | Op::Remove | Op::Export),
            System::DenseIndirect => matches!(op, Op::LookupHit | Op::LookupHitZipf),
            System::HashbrownRwLock => !op.is_apply(),
            _ => true,
        }
    }

    /// An empty table of this system for `spec`.
    pub fn build(self, spec: &Spec) -> Box<dyn Store> {
        match self {
            System::Dynemb => Box::new(dynemb::Dynemb::new(spec, Dtype::F32)),
            System::DynembBf16 => Box::new(dynemb::Dynemb::new(spec, Dtype::Bf16)),
            System::DashMap => Box::new(dashmap::DashMapPeer::new(spec)),
            System::Papaya => Box::new(papaya::Papaya::<Box<[f32]>>::new(spec)),
            System::Scc => Box::new(scc::SccPeer::new(spec)),
            System::HashbrownRwLock => Box::new(hashbrown::HashbrownPeer::new(spec)),
            System::Dense => Box::new(dense::Dense::new(spec, &[])),
            System::DenseIndirect => Box::new(dense_indirect::DenseIndirect::new(spec)),
        }
    }

    /// An empty table of this system for `spec` trained by `optimizer`
    /// (`None` for hashbrown+RwLock and the indirect dense reference, which
    /// run no optimizer step).
    pub fn trainer(self, optimizer: Optimizer, spec: &Spec) -> Option<Box<dyn Trainer>> {
        match optimizer {
            Optimizer::Sgd => self.trainer_with(optimizer, sgd(), spec),
            Optimizer::Adagrad => self.trainer_with(optimizer, adagrad(), spec),
            Optimizer::Adam => self.trainer_with(optimizer, adam(), spec),
        }
    }

    /// [`System::trainer`] for the rule `R` with `params`.
    fn trainer_with<R: Rule>(
        self,
        optimizer: Optimizer,
        params: R,
        spec: &Spec,
    ) -> Option<Box<dyn Trainer>> {
        Some(match self {
            System::Dynemb => Box::new(dynemb::DynembTrainer::new(
                optimizer,
                params,
                spec,
                Dtype::F32,
            )),
            System::DynembBf16 => Box::new(dynemb::DynembTrainer::new(
                optimizer,
                params,
                spec,
                Dtype::Bf16,
            )),
            System::Dense => Box::new(Stepped::<dense::Dense, R>::new(optimizer, params, spec)),
            System::DashMap => Box::new(Stepped::<dashmap::DashMapPeer, R>::new(
                optimizer, params, spec,
            )),
            System::Papaya => Box::new(Stepped::<papaya::Papaya<papaya::LockedRow>, R>::new(
                optimizer, params, spec,
            )),
            System::Scc => Box::new(Stepped::<scc::SccPeer, R>::new(optimizer, params, spec)),
            System::HashbrownRwLock | System::DenseIndirect => return None,
        })
    }
}

/// What a table is built for.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Values per row.
    pub dim: usize,
    /// Row of missing keys.
    pub initializer: Initializer,
    /// Most keys a batch will hold.
    pub batch: usize,
    /// Rows the dense reference reserves (the workload's key count). Hash
    /// tables ignore it: they start empty and grow.
    pub dense_rows: usize,
}

/// The hasher every peer uses: ahash with fixed seeds, as dynemb's index.
pub(crate) fn hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(
        0x243F_6A88_85A3_08D3,
        0x1319_8A2E_0370_7344,
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
    )
}

/// Row `i` of a flat row buffer.
#[inline]
pub(crate) fn row(buf: &[f32], dim: usize, i: usize) -> &[f32] {
    &buf[i * dim..(i + 1) * dim]
}

/// Row `i` of a flat row buffer, mutably.
#[inline]
pub(crate) fn row_mut(buf: &mut [f32], dim: usize, i: usize) -> &mut [f32] {
    &mut buf[i * dim..(i + 1) * dim]
}

/// Export helper for the per-key peers: gathers `(key, row)` pairs into
/// chunks of `chunk_rows` and hands each full chunk to `sink`.
pub(crate) struct Chunker<'s> {
    dim: usize,
    chunk_rows: usize,
    keys: Vec<u64>,
    values: Vec<f32>,
    rows: usize,
    sink: &'s mut dyn FnMut(&[u64], &[f32]),
}

impl<'s> Chunker<'s> {
    /// A chunker for rows of `dim` values.
    pub(crate) fn new(
        dim: usize,
        chunk_rows: usize,
        sink: &'s mut dyn FnMut(&[u64], &[f32]),
    ) -> Self {
        let chunk_rows = chunk_rows.max(1);
        Chunker {
            dim,
            chunk_rows,
            keys: Vec::with_capacity(chunk_rows),
            values: Vec::with_capacity(chunk_rows * dim),
            rows: 0,
            sink,
        }
    }

    /// Adds one row.
    #[inline]
    pub(crate) fn push(&mut self, key: u64, row: &[f32]) {
        debug_assert_eq!(row.len(), self.dim);
        self.keys.push(key);
        self.values.extend_from_slice(row);
        if self.keys.len() == self.chunk_rows {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.keys.is_empty() {
            (self.sink)(&self.keys, &self.values);
            self.rows += self.keys.len();
            self.keys.clear();
            self.values.clear();
        }
    }

    /// Hands over the last partial chunk; returns the rows seen.
    pub(crate) fn finish(mut self) -> usize {
        self.flush();
        self.rows
    }
}

#[cfg(test)]
mod tests;
