//! Plain SGD: `w -= lr * g` (Keras 2's `SGD` without momentum, whose sparse
//! update scatter-adds `-g * lr`).

use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check_lr, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseSgd`]. Default: Keras' `lr = 0.01`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsSgd {
    /// Learning rate.
    pub lr: f32,
}

impl Default for ParamsSgd {
    fn default() -> Self {
        ParamsSgd { lr: 0.01 }
    }
}

/// Sparse SGD; no slots.
pub type SparseSgd = Sparse<ParamsSgd>;

/// One step's SGD kernel.
#[derive(Debug, Clone, Copy)]
pub struct SgdStep {
    lr: f32,
}

impl LaneKernel<0> for SgdStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, _: &mut [L; 0]) {
        *w = *w + -(g * L::splat(self.lr));
    }
}

impl Rule for ParamsSgd {
    const NAME: &'static str = "SparseSgd";
    type Step = SgdStep;

    fn validate(&self) -> Result<()> {
        check_lr(Self::NAME, self.lr)
    }
    fn lr(&self) -> f32 {
        self.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn slots(&self) -> Vec<(&'static str, f32)> {
        Vec::new()
    }
    fn prepare(&self, _t: u64, lr: f32) -> SgdStep {
        SgdStep { lr }
    }
    fn update(step: &SgdStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        update_row(step, grad, value, slots);
    }
}
