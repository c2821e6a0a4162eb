//! Adam (Keras 2's `Adam`, its sparse update rule), with AMSGrad:
//!
//! ```text
//! lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)          (per step, in f32)
//! m = m * beta1 + g * (1 - beta1)
//! v = v * beta2 + (g * g) * (1 - beta2)
//! w -= lr_t * m / (sqrt(v) + eps)                        (eps outside the root: "epsilon hat")
//! amsgrad: vhat = max(vhat, v); w -= lr_t * m / (sqrt(vhat) + eps)
//! ```

use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check_decay, check_eps, check_lr, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseAdam`]. Defaults: Keras' `lr = 0.001`,
/// `beta1 = 0.9`, `beta2 = 0.999`, `eps = 1e-7`, no AMSGrad.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsAdam {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment, in `[0, 1)`.
    pub beta1: f32,
    /// Decay of the second moment, in `[0, 1)`.
    pub beta2: f32,
    /// Added to the root of the second moment (> 0).
    pub eps: f32,
    /// AMSGrad: divide by the largest second moment seen (slot `vhat`).
    pub amsgrad: bool,
}

impl Default for ParamsAdam {
    fn default() -> Self {
        ParamsAdam {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-7,
            amsgrad: false,
        }
    }
}

/// Sparse Adam; slots `m`, `v` (and `vhat` with AMSGrad), from 0.
pub type SparseAdam = Sparse<ParamsAdam>;

/// Checks `beta1`, `beta2` (in `[0, 1)`) and `eps` (> 0), shared by the
/// Adam family.
pub(crate) fn check_moments(optimizer: &str, beta1: f32, beta2: f32, eps: f32) -> Result<()> {
    check_decay(optimizer, "beta1", beta1)?;
    check_decay(optimizer, "beta2", beta2)?;
    check_eps(optimizer, eps)
}

/// The Adam family's slots: `m`, `v`, and `vhat` with AMSGrad, from 0.
pub(crate) fn adam_slots(amsgrad: bool) -> Vec<(&'static str, f32)> {
    let mut slots = vec![("m", 0.0), ("v", 0.0)];
    if amsgrad {
        slots.push(("vhat", 0.0));
    }
    slots
}

/// `beta ^ t` in `f32`, as TensorFlow computes the bias corrections.
pub(crate) fn power(beta: f32, t: u64) -> f32 {
    beta.powf(t as f32)
}

/// One step's Adam kernel.
#[derive(Debug, Clone, Copy)]
pub struct AdamStep {
    lr_t: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    amsgrad: bool,
}

impl AdamStep {
    /// The moments' update, shared by both variants.
    fn moments<L: Lane>(&self, g: L, m: &mut L, v: &mut L) {
        *m = *m * L::splat(self.beta1) + g * L::splat(1.0 - self.beta1);
        *v = *v * L::splat(self.beta2) + (g * g) * L::splat(1.0 - self.beta2);
    }
}

impl LaneKernel<2> for AdamStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [m, v]: &mut [L; 2]) {
        self.moments(g, m, v);
        *w = *w - L::splat(self.lr_t) * *m / (v.sqrt() + L::splat(self.eps));
    }
}

impl LaneKernel<3> for AdamStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [m, v, vhat]: &mut [L; 3]) {
        self.moments(g, m, v);
        *vhat = vhat.max(*v);
        *w = *w - L::splat(self.lr_t) * *m / (vhat.sqrt() + L::splat(self.eps));
    }
}

impl Rule for ParamsAdam {
    const NAME: &'static str = "SparseAdam";
    type Step = AdamStep;

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
        adam_slots(self.amsgrad)
    }
    fn prepare(&self, t: u64, lr: f32) -> AdamStep {
        let correction = (1.0 - power(self.beta2, t)).sqrt() / (1.0 - power(self.beta1, t));
        AdamStep {
            lr_t: lr * correction,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            amsgrad: self.amsgrad,
        }
    }
    fn update(step: &AdamStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        if step.amsgrad {
            update_row::<3, _>(step, grad, value, slots);
        } else {
            update_row::<2, _>(step, grad, value, slots);
        }
    }
}
