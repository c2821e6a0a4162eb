#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod dedup;
pub mod lanes;
pub mod optimizer;
pub mod rules;
pub mod schedule;

pub use optimizer::{check_step, Rule, Sparse, SparseOptimizer, Step};
pub use rules::adadelta::{ParamsAdadelta, SparseAdadelta};
pub use rules::adagrad::{ParamsAdagrad, SparseAdagrad};
pub use rules::adam::{ParamsAdam, SparseAdam};
pub use rules::adamax::{ParamsAdamax, SparseAdamax};
pub use rules::adamw::{ParamsAdamW, SparseAdamW};
pub use rules::ftrl::{ParamsFtrl, SparseFtrl};
pub use rules::momentum::{ParamsMomentum, SparseMomentum};
pub use rules::rmsprop::{ParamsRmsProp, SparseRmsProp};
pub use rules::sgd::{ParamsSgd, SparseSgd};
pub use schedule::LearningRate;
