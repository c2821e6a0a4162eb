//! AdamW: Adam with decoupled weight decay (Keras' `AdamW`, the optimizer of
//! Keras 2.11+, as `tf_keras.optimizers.AdamW` runs it on sparse gradients):
//!
//! ```text
//! w -= (w * weight_decay) * lr                             (decay first, by the scheduled lr)
//! c1 = 1 - beta1, c2 = 1 - beta2                           (in f64, rounded to f32, as Keras does)
//! alpha = (lr * sqrt(1 - beta2^t)) / (1 - beta1^t)
//! m += -(m * c1); m += g * c1
//! v += -(v * c2); v += (g * g) * c2
//! amsgrad: vhat = max(vhat, v), and vhat replaces v below
//! w -= (m * alpha) / (sqrt(v) + eps)
//! ```

use super::adam::{adam_slots, check_moments, power};
use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check, check_lr, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseAdamW`]. Defaults: Keras' `lr = 0.001`,
/// `beta1 = 0.9`, `beta2 = 0.999`, `eps = 1e-7`, no AMSGrad,
/// `weight_decay = 0.004`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsAdamW {
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
    /// Decoupled weight decay per unit of learning rate (>= 0).
    pub weight_decay: f32,
}

impl Default for ParamsAdamW {
    fn default() -> Self {
        ParamsAdamW {
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-7,
            amsgrad: false,
            weight_decay: 0.004,
        }
    }
}

/// Sparse AdamW; slots `m`, `v` (and `vhat` with AMSGrad), from 0.
pub type SparseAdamW = Sparse<ParamsAdamW>;

/// One step's AdamW kernel.
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    lr: f32,
    weight_decay: f32,
    alpha: f32,
    c1: f32,
    c2: f32,
    eps: f32,
    amsgrad: bool,
}

impl AdamWStep {
    /// Decay and moments, shared by both variants.
    fn decay_and_moments<L: Lane>(&self, g: L, w: &mut L, m: &mut L, v: &mut L) {
        let (c1, c2) = (L::splat(self.c1), L::splat(self.c2));
        *w = *w - (*w * L::splat(self.weight_decay)) * L::splat(self.lr);
        *m = *m + -(*m * c1);
        *m = *m + g * c1;
        *v = *v + -(*v * c2);
        *v = *v + (g * g) * c2;
    }
}

impl LaneKernel<2> for AdamWStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [m, v]: &mut [L; 2]) {
        self.decay_and_moments(g, w, m, v);
        *w = *w - (*m * L::splat(self.alpha)) / (v.sqrt() + L::splat(self.eps));
    }
}

impl LaneKernel<3> for AdamWStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [m, v, vhat]: &mut [L; 3]) {
        self.decay_and_moments(g, w, m, v);
        *vhat = vhat.max(*v);
        *w = *w - (*m * L::splat(self.alpha)) / (vhat.sqrt() + L::splat(self.eps));
    }
}

/// `1 - beta` as Keras' AdamW computes it: Python's double arithmetic on
/// the decimal hyperparameter, rounded to `f32` (so `1 - 0.8` is `0.2f32`,
/// where `1f32 - 0.8f32` is `0.19999999`). The decimal is recovered from
/// the `f32` by its shortest representation.
fn one_minus_in_f64(beta: f32) -> f32 {
    let decimal: f64 = beta.to_string().parse().expect("an f32 prints as a number");
    (1.0 - decimal) as f32
}

impl Rule for ParamsAdamW {
    const NAME: &'static str = "SparseAdamW";
    type Step = AdamWStep;

    fn validate(&self) -> Result<()> {
        check_lr(Self::NAME, self.lr)?;
        check_moments(Self::NAME, self.beta1, self.beta2, self.eps)?;
        check(
            self.weight_decay.is_finite() && self.weight_decay >= 0.0,
            Self::NAME,
            format!("weight_decay must be >= 0, got {}", self.weight_decay),
        )
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
    fn prepare(&self, t: u64, lr: f32) -> AdamWStep {
        AdamWStep {
            lr,
            weight_decay: self.weight_decay,
            alpha: (lr * (1.0 - power(self.beta2, t)).sqrt()) / (1.0 - power(self.beta1, t)),
            c1: one_minus_in_f64(self.beta1),
            c2: one_minus_in_f64(self.beta2),
            eps: self.eps,
            amsgrad: self.amsgrad,
        }
    }
    fn update(step: &AdamWStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        if step.amsgrad {
            update_row::<3, _>(step, grad, value, slots);
        } else {
            update_row::<2, _>(step, grad, value, slots);
        }
    }
}
