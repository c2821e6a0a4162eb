//! The one error type of the crate.
//!
//! Every mistake a caller can make (a buffer of the wrong length, a zero
//! dimension, a partitioner that names a shard that does not exist, a
//! non-finite value) is reported as a typed [`Error`] whose message names the
//! expected and the actual sizes. The registry's errors name the variable
//! and, for a [`Error::Mismatch`], what exists and what was requested.
//! Nothing in the public API panics on user input.
//!
//! A store that lives in another process (the Redis backend,
//! `dynemb-redis`) fails in ways a local table cannot: a server that is
//! down, slow or answers something unexpected. Those are
//! [`Error::Backend`], whose [`BackendErrorKind`] tells a caller whether
//! retrying later may help.

/// Result alias used by every fallible function of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when using dynemb.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A buffer's length does not match what the keys and `dim` require.
    #[error("{what}: expected length {expected}, got {actual}")]
    LengthMismatch {
        /// Which argument was wrong (`"out"`, `"values"`, `"exists"`, ...).
        what: &'static str,
        /// The length that was required.
        expected: usize,
        /// The length that was given.
        actual: usize,
    },
    /// A shard index outside `0..shards`, given by the caller or returned by a
    /// custom partitioner.
    #[error("unknown shard {shard}: the variable has {shards} shard(s)")]
    UnknownShard {
        /// The shard that was asked for.
        shard: usize,
        /// How many shards the variable has.
        shards: usize,
    },
    /// A builder setting that cannot work (zero dim, zero shards, an
    /// initializer row of the wrong length, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An input value is NaN or infinite where only finite numbers are allowed.
    #[error("{what}: element {index} is not finite ({value})")]
    NonFinite {
        /// Which argument held the value (`"values"`, `"deltas"`).
        what: &'static str,
        /// Position of the first offending element.
        index: usize,
        /// The offending value.
        value: f32,
    },
    /// A finite value that does not fit the dtype it would be stored in
    /// (`70000.0` in an f16 column; see [`Dtype::fits`](crate::Dtype::fits)).
    #[error("{what}: element {index} ({value}) does not fit {dtype}")]
    OutOfRange {
        /// Which argument or result held the value (`"values"`, `"accum result"`).
        what: &'static str,
        /// Position of the first offending element (or key, for a result
        /// refused per row).
        index: usize,
        /// The offending value.
        value: f32,
        /// The dtype it does not fit.
        dtype: crate::Dtype,
    },
    /// The table cannot grow any further (more rows than a shard can address).
    #[error("capacity exceeded: a shard holds at most {max_rows} rows")]
    CapacityExceeded {
        /// The most rows one shard can address.
        max_rows: u64,
    },
    /// Memory for the table could not be had: an index or a segment of rows
    /// larger than the system will provide (a capacity hint or a row width
    /// too large for this machine).
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// What was being allocated (`"index"`, `"rows"`).
        what: &'static str,
        /// How many bytes were asked for (`usize::MAX` if the size overflows).
        bytes: usize,
    },
    /// A variable of this name exists where a new one was required
    /// ([`Reuse::No`](crate::Reuse::No)).
    #[error("variable {name} already exists")]
    AlreadyExists {
        /// The variable's full (scoped) name.
        name: String,
    },
    /// No variable of this name exists where an existing one was required
    /// ([`Reuse::Yes`](crate::Reuse::Yes)).
    #[error("variable {name} does not exist")]
    NotFound {
        /// The variable's full (scoped) name.
        name: String,
    },
    /// A variable of this name exists with another key type or dim than the
    /// one requested.
    #[error("variable {name} exists with {existing}; requested {requested}")]
    Mismatch {
        /// The variable's full (scoped) name.
        name: String,
        /// What exists, e.g. `"key type i64, dim 8"`.
        existing: String,
        /// What was requested, e.g. `"key type u64, dim 16"`.
        requested: String,
    },
    /// A saved optimizer state belongs to another optimizer than the one
    /// asked to restore it (`dynemb-optim`'s state files).
    #[error("the optimizer state holds {holds}'s state; {requested} was asked to restore it")]
    WrongOptimizer {
        /// The optimizer whose state it is (`"SparseAdam"`).
        holds: String,
        /// The optimizer that was asked to restore it (`"SparseAdagrad"`).
        requested: String,
    },
    /// A file-system operation on a checkpoint failed.
    #[error("i/o error on {path}: {message}")]
    Io {
        /// The file or directory involved.
        path: String,
        /// The kind of failure.
        kind: std::io::ErrorKind,
        /// The operating system's description.
        message: String,
    },
    /// A checkpoint is missing, truncated, corrupt or of an unknown format.
    #[error("bad checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint directory or file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A slot column that the variable does not have.
    #[error("variable {variable} has no slot {slot}")]
    UnknownSlot {
        /// The variable's name.
        variable: String,
        /// The slot that was asked for.
        slot: String,
    },
    /// A remote store (a server, a cluster node) failed to carry out an
    /// operation: see [`BackendErrorKind`]. A batch that fails this way may
    /// have been applied on some of the store's nodes and not on others;
    /// each row is written whole or not at all.
    ///
    /// A store may resend a request whose reply was lost, if that is safe:
    /// `dynemb-redis` does, within its batch deadline, because each of its
    /// writes carries an id and runs at most once on the server. So a call
    /// that returns `Ok` was applied once. When it still fails (the node
    /// stayed silent or unreachable), the outcome of a write (`accum`,
    /// `upsert`, `remove`, an optimizer step) on the failing node is
    /// **unknown**: it may have been applied, once. Reads are safe to
    /// retry; a caller's own retry of a write that adds (`accum`, an
    /// optimizer step) is a new write and may make its rows take it
    /// twice, so check the rows (or restore a checkpoint) first.
    #[error("{store}: {kind}: {message}")]
    Backend {
        /// The store and, where known, the node (`"redis 127.0.0.1:7001"`).
        store: String,
        /// What kind of failure it was.
        kind: BackendErrorKind,
        /// The backend's own description.
        message: String,
    },
}

/// What went wrong in an [`Error::Backend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The node could not be reached or the connection broke (refused,
    /// reset, closed), also after the store's own resends. A read retried
    /// once it is back may succeed; a write may have been applied (see
    /// [`Error::Backend`]).
    Unavailable,
    /// The node did not answer within the configured timeout, also after
    /// the store's own resends; a write may still have been applied (see
    /// [`Error::Backend`]).
    Timeout,
    /// The node is up but refuses to serve for now (a cluster without full
    /// coverage, a server loading its data, a failover under way).
    /// Retrying later may succeed.
    NotServing,
    /// The node answered with an error (a script error, out of memory,
    /// wrong password) or with something the client cannot understand.
    Server,
    /// The stored data is not what this client wrote or expects (a row of
    /// the wrong size, metadata of another format).
    Corrupt,
    /// Optimistic row updates kept conflicting with other writers and gave
    /// up after their retry budget.
    Contention,
}

impl std::fmt::Display for BackendErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendErrorKind::Unavailable => "unavailable",
            BackendErrorKind::Timeout => "timed out",
            BackendErrorKind::NotServing => "not serving",
            BackendErrorKind::Server => "server error",
            BackendErrorKind::Corrupt => "corrupt data",
            BackendErrorKind::Contention => "too much contention",
        })
    }
}
