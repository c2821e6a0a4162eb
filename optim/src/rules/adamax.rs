//! Adamax (Keras 2's `Adamax`, its sparse update rule):
//!
//! ```text
//! lr_t = lr / (1 - beta1^t)
//! m = m * beta1 + g * (1 - beta1)
//! v = max(v * beta2, |g|)
//! w -= lr_t * (m / (v + eps))
//! ```

use super::adam::{check_moments, power};
use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check_lr, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseAdamax`]. Defaults: Keras' `lr = 0.001`,
/// `beta1 = 0.9`, `beta2 = 0.999`, `eps = 1e-7`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsAdamax {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment, in `[0, 1)`.
    pub beta1: f32,
    /// Decay of the infinity norm, in `[0, 1)`.
    pub beta2: f32,
    /// Added to the norm (> 0).
    pub eps: f32,
}

impl Default for ParamsAdamax {
    fn default() -> Self {
        ParamsAdamax {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-7,
        }
    }
}

/// Sparse Adamax; slots `m`, `v`, from 0.
pub type SparseAdamax = Sparse<ParamsAdamax>;

/// One step's Adamax kernel.
#[derive(Debug, Clone, Copy)]
pub struct AdamaxStep {
    lr_t: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
}

impl LaneKernel<2> for AdamaxStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [m, v]: &mut [L; 2]) {
        *m = *m * L::splat(self.beta1) + g * L::splat(1.0 - self.beta1);
        *v = (*v * L::splat(self.beta2)).max(g.abs());
        *w = *w - L::splat(self.lr_t) * (*m / (*v + L::splat(self.eps)));
    }
}

impl Rule for ParamsAdamax {
    const NAME: &'static str = "SparseAdamax";
    type Step = AdamaxStep;

    fn validate(&self) -> Result<()> {
        check_lr(Self::NAME, self.lr)?;
        check_moments(Self::NAME, self.beta1, self.beta2, self.eps)
    }
    fn lr(&self) -> f32 {
        self.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn slots(&self) -> Vec<(&'static str, f32)> {
        vec![("m", 0.0), ("v", 0.0)]
    }
    fn prepare(&self, t: u64, lr: f32) -> AdamaxStep {
        AdamaxStep {
            lr_t: lr / (1.0 - power(self.beta1, t)),
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
        }
    }
    fn update(step: &AdamaxStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        update_row(step, grad, value, slots);
    }
}
