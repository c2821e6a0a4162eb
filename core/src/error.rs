//! The one error type of the crate.
//!
//! Every mistake a caller can make (a buffer of the wrong length, a zero
//! dimension, a partitioner that names a shard that does not exist, a
//! non-finite value) is reported as a typed [`Error`] whose message names the
//! expected and the actual sizes. The registry's errors name the variable
//! and, for a [`Error::Mismatch`], what exists and what was requested.
//! Nothing in the public API panics on user input.

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
}
