//! The optimizers: one module each, holding its `Params*` type (Keras 2
//! defaults), its row kernel (written once over [`Lane`](crate::lanes::Lane)
//! for SIMD and scalar lanes) and its `Sparse*` type. Each module's docs
//! give the update rule, in the order and with the epsilon placement
//! TensorFlow computes it.

pub mod adadelta;
pub mod adagrad;
pub mod adam;
pub mod adamax;
pub mod adamw;
pub mod ftrl;
pub mod momentum;
pub mod rmsprop;
pub mod sgd;
