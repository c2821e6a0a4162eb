//! The crate's error type: bad input to a lookup or a layer, or an error
//! from the table (`dynemb`), the optimizer (`dynemb-optim`, the same type)
//! or candle.
//!
//! Every function checks its input before it changes anything: a failed call
//! leaves the tables (rows, slots, scores), the optimizer's step count, the
//! dense variables and the layers' recorded batches as they were (one
//! exception: a failed `SparseStep::backward_step` drops the batches whose
//! gradients it computed, since they live only in that call). A loss that
//! is not finite is one of those checks ([`Error::NonFiniteLoss`]).
//!
//! What no check can see first may still make a step fail part-way, once
//! it has begun: a row whose update overflows (kept as it was, the other
//! rows updated), a remote store's node dying mid-write (which of its rows
//! were written is unknown: `dynemb::Error::Backend`), another process
//! taking a store's last slot columns between the check and the creation.
//! `candle_core::Error` converts from [`Error`] (and back), so `?` works in
//! code that returns either.

/// An error from a lookup, a layer or an optimizer step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Input that cannot work: ids of an unsupported dtype, sparse indices
    /// outside their dense shape or out of order, weights of the wrong
    /// length, a gradient missing from the `GradStore`, ...
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A training step's loss is NaN or infinite: the step was refused
    /// before any table, slot, step count or dense variable changed, and
    /// the batches it recorded were dropped. A caller may skip the batch
    /// and go on.
    #[error("the loss is {loss}, not finite: the step was refused and its batches dropped")]
    NonFiniteLoss {
        /// The first value of the loss that is not finite.
        loss: f32,
    },
    /// An error from the embedding table or the sparse optimizer.
    #[error(transparent)]
    Table(#[from] dynemb::Error),
    /// An error from candle.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::InvalidInput`] with this message.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidInput(message.into())
    }
}

impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(e) => e,
            other => candle_core::Error::wrap(other),
        }
    }
}
