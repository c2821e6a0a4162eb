//! The optimizers: one module each, holding its `Params*` type (Keras 2
//! defaults), its row kernel (written once over [`Lane`](crate::lanes::Lane)
//! for SIMD and scalar lanes) and its `Sparse*` type. Each module's docs
//! give the update rule, in the order and with the epsilon placement
//! TensorFlow computes it.
//!
//! # Checked against TensorFlow
//!
//! `tests/tensorflow_parity.rs` replays goldens made with TensorFlow 2.16
//! and tf-keras (`tests/golden/`): every configuration matches to 1e-6
//! after each of 10 steps, rows and slots. Adagrad, Adam, AdamW (AMSGrad
//! or not), Adamax, momentum (Nesterov or not), FTRL with `lr_power` -0.5
//! or 0, and RMSprop without momentum match bit for bit. The rest differ
//! in the last bits, where TensorFlow itself is approximate or orders
//! differently:
//! - Adadelta and RMSprop with momentum: TensorFlow's kernels use an
//!   approximate SIMD reciprocal square root; dynemb computes it exactly;
//! - FTRL with another `lr_power`: TensorFlow's vectorized `pow` is
//!   approximate; dynemb calls `powf`;
//! - SGD: Keras scatter-adds each occurrence of a repeated id in turn, where
//!   dynemb (like every other Keras optimizer) sums the occurrences first
//!   and updates once.

pub mod adadelta;
pub mod adagrad;
pub mod adam;
pub mod adamax;
pub mod adamw;
pub mod ftrl;
pub mod momentum;
pub mod rmsprop;
pub mod sgd;
