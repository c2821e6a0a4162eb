//! Adadelta (Keras 2's `Adadelta`, whose sparse update is TensorFlow's
//! `ResourceSparseApplyAdadelta`):
//!
//! ```text
//! accum_grad = accum_grad * rho + (g * g) * (1 - rho)
//! update = (sqrt(accum_var + eps) * (1 / sqrt(accum_grad + eps))) * g    (eps inside both roots)
//! w -= update * lr
//! accum_var = accum_var * rho + (update * update) * (1 - rho)
//! ```
//!
//! TensorFlow's kernel takes the reciprocal root with an approximate SIMD
//! `rsqrt` (an estimate refined by one Newton step) on all but a row's last
//! `dim % 8` elements, so it differs from this exact rule by up to a few
//! units in the last place there.

use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check_decay, check_eps, check_lr, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseAdadelta`]. Defaults: Keras' `lr = 0.001`,
/// `rho = 0.95`, `eps = 1e-7`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsAdadelta {
    /// Learning rate.
    pub lr: f32,
    /// Decay of both accumulators, in `[0, 1)`.
    pub rho: f32,
    /// Added inside both roots (> 0).
    pub eps: f32,
}

impl Default for ParamsAdadelta {
    fn default() -> Self {
        ParamsAdadelta {
            lr: 0.001,
            rho: 0.95,
            eps: 1e-7,
        }
    }
}

/// Sparse Adadelta; slots `accum_grad`, `accum_var`, from 0.
pub type SparseAdadelta = Sparse<ParamsAdadelta>;

/// One step's Adadelta kernel.
#[derive(Debug, Clone, Copy)]
pub struct AdadeltaStep {
    lr: f32,
    rho: f32,
    eps: f32,
}

impl LaneKernel<2> for AdadeltaStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [accum_grad, accum_var]: &mut [L; 2]) {
        let (rho, keep, eps) = (
            L::splat(self.rho),
            L::splat(1.0 - self.rho),
            L::splat(self.eps),
        );
        *accum_grad = *accum_grad * rho + (g * g) * keep;
        let update = ((*accum_var + eps).sqrt() * (L::splat(1.0) / (*accum_grad + eps).sqrt())) * g;
        *w = *w - update * L::splat(self.lr);
        *accum_var = *accum_var * rho + (update * update) * keep;
    }
}

impl Rule for ParamsAdadelta {
    const NAME: &'static str = "SparseAdadelta";
    type Step = AdadeltaStep;

    fn validate(&self) -> Result<()> {
        check_lr(Self::NAME, self.lr)?;
        check_decay(Self::NAME, "rho", self.rho)?;
        check_eps(Self::NAME, self.eps)
    }
    fn lr(&self) -> f32 {
        self.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn slots(&self) -> Vec<(&'static str, f32)> {
        vec![("accum_grad", 0.0), ("accum_var", 0.0)]
    }
    fn prepare(&self, _t: u64, lr: f32) -> AdadeltaStep {
        AdadeltaStep {
            lr,
            rho: self.rho,
            eps: self.eps,
        }
    }
    fn update(step: &AdadeltaStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        update_row(step, grad, value, slots);
    }
}
