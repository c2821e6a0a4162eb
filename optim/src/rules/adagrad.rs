//! Adagrad (Keras 2's `Adagrad`, whose sparse update is TensorFlow's
//! `ResourceSparseApplyAdagradV2`):
//!
//! ```text
//! accum += g * g
//! w -= lr * g / (sqrt(accum) + eps)
//! ```

use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check, check_eps, check_lr, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseAdagrad`]. Defaults: Keras' `lr = 0.001`,
/// `initial_accumulator_value = 0.1`, `eps = 1e-7`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsAdagrad {
    /// Learning rate.
    pub lr: f32,
    /// The value every row's accumulator starts at (> 0).
    pub initial_accumulator_value: f32,
    /// Added to the root of the accumulator (> 0).
    pub eps: f32,
}

impl Default for ParamsAdagrad {
    fn default() -> Self {
        ParamsAdagrad {
            lr: 0.001,
            initial_accumulator_value: 0.1,
            eps: 1e-7,
        }
    }
}

/// Sparse Adagrad; slot `accumulator` (from `initial_accumulator_value`).
pub type SparseAdagrad = Sparse<ParamsAdagrad>;

/// One step's Adagrad kernel.
#[derive(Debug, Clone, Copy)]
pub struct AdagradStep {
    lr: f32,
    eps: f32,
}

impl LaneKernel<1> for AdagradStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [accum]: &mut [L; 1]) {
        *accum = *accum + g * g;
        *w = *w - L::splat(self.lr) * g / (accum.sqrt() + L::splat(self.eps));
    }
}

impl Rule for ParamsAdagrad {
    const NAME: &'static str = "SparseAdagrad";
    type Step = AdagradStep;

    fn validate(&self) -> Result<()> {
        check_lr(Self::NAME, self.lr)?;
        check(
            self.initial_accumulator_value.is_finite() && self.initial_accumulator_value > 0.0,
            Self::NAME,
            format!(
                "initial_accumulator_value must be > 0, got {}",
                self.initial_accumulator_value
            ),
        )?;
        check_eps(Self::NAME, self.eps)
    }
    fn lr(&self) -> f32 {
        self.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn slots(&self) -> Vec<(&'static str, f32)> {
        vec![("accumulator", self.initial_accumulator_value)]
    }
    fn prepare(&self, _t: u64, lr: f32) -> AdagradStep {
        AdagradStep { lr, eps: self.eps }
    }
    fn update(step: &AdagradStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        update_row(step, grad, value, slots);
    }
}
