//! SGD with momentum (Keras 2's `SGD(momentum=..., nesterov=...)`, whose
//! sparse update is TensorFlow's `ResourceSparseApplyKerasMomentum`):
//!
//! ```text
//! accum = accum * momentum - g * lr
//! w += accum                                  (nesterov: w += accum * momentum - g * lr)
//! ```

use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check, check_lr, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseMomentum`]. Defaults: Keras' `lr = 0.01`,
/// `momentum = 0.0`, `nesterov = false`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsMomentum {
    /// Learning rate.
    pub lr: f32,
    /// Momentum, in `[0, 1]`.
    pub momentum: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
}

impl Default for ParamsMomentum {
    fn default() -> Self {
        ParamsMomentum {
            lr: 0.01,
            momentum: 0.0,
            nesterov: false,
        }
    }
}

/// Sparse SGD with momentum; slot `momentum` (from 0).
pub type SparseMomentum = Sparse<ParamsMomentum>;

/// One step's momentum kernel.
#[derive(Debug, Clone, Copy)]
pub struct MomentumStep {
    lr: f32,
    momentum: f32,
    nesterov: bool,
}

impl LaneKernel<1> for MomentumStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [accum]: &mut [L; 1]) {
        let (lr, momentum) = (L::splat(self.lr), L::splat(self.momentum));
        *accum = *accum * momentum - g * lr;
        *w = if self.nesterov {
            *w + (*accum * momentum - g * lr)
        } else {
            *w + *accum
        };
    }
}

impl Rule for ParamsMomentum {
    const NAME: &'static str = "SparseMomentum";
    type Step = MomentumStep;

    fn validate(&self) -> Result<()> {
        check_lr(Self::NAME, self.lr)?;
        check(
            (0.0..=1.0).contains(&self.momentum),
            Self::NAME,
            format!("momentum must be in [0, 1], got {}", self.momentum),
        )
    }
    fn lr(&self) -> f32 {
        self.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn slots(&self) -> Vec<(&'static str, f32)> {
        vec![("momentum", 0.0)]
    }
    fn prepare(&self, _t: u64, lr: f32) -> MomentumStep {
        MomentumStep {
            lr,
            momentum: self.momentum,
            nesterov: self.nesterov,
        }
    }
    fn update(step: &MomentumStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        update_row(step, grad, value, slots);
    }
}
