//! RMSprop (Keras 2's `RMSprop`). Its sparse update takes two paths with
//! different epsilon placement, and both are reproduced:
//!
//! Without momentum (Keras' own Python rule; epsilon outside the root):
//! ```text
//! rms = rms * rho + g * g * (1 - rho)
//! centered: mg = mg * rho + g * (1 - rho); denom = rms - mg * mg     (else denom = rms)
//! w -= lr * g / (sqrt(denom) + eps)
//! ```
//! With momentum > 0 (TensorFlow's `ResourceSparseApply[Centered]RMSProp`
//! kernels; epsilon inside the root):
//! ```text
//! rms = rms * rho + (g * g) * (1 - rho)
//! centered: mg = mg * rho + g * (1 - rho); denom = (rms + eps) - mg * mg   (else denom = rms + eps)
//! momentum = momentum * momentum_coef + ((1 / sqrt(denom)) * lr) * g
//! w -= momentum
//! ```
//!
//! The kernels take the reciprocal root with an approximate SIMD `rsqrt`
//! on all but a row's last `dim % 8` elements, so TensorFlow differs from
//! this exact rule by a few units in the last place there.

use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check, check_decay, check_eps, check_lr, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseRmsProp`]. Defaults: Keras' `lr = 0.001`,
/// `rho = 0.9`, `momentum = 0.0`, `eps = 1e-7`, not centered.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsRmsProp {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the moving averages, in `[0, 1)`.
    pub rho: f32,
    /// Momentum, in `[0, 1]` (slot `momentum` when > 0).
    pub momentum: f32,
    /// Added to the denominator (> 0).
    pub eps: f32,
    /// Divide by the variance rather than the second moment (slot `mg`).
    pub centered: bool,
}

impl Default for ParamsRmsProp {
    fn default() -> Self {
        ParamsRmsProp {
            lr: 0.001,
            rho: 0.9,
            momentum: 0.0,
            eps: 1e-7,
            centered: false,
        }
    }
}

/// Sparse RMSprop; slot `rms` (from 0), and `momentum` (momentum > 0) and
/// `mg` (centered), from 0, in that order.
pub type SparseRmsProp = Sparse<ParamsRmsProp>;

/// One step's RMSprop kernel.
#[derive(Debug, Clone, Copy)]
pub struct RmsPropStep {
    lr: f32,
    rho: f32,
    momentum: f32,
    eps: f32,
    centered: bool,
}

/// One slot, `rms`: the Python rule without momentum.
impl LaneKernel<1> for RmsPropStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [rms]: &mut [L; 1]) {
        self.second_moment(g, rms);
        *w = *w - L::splat(self.lr) * g / (rms.sqrt() + L::splat(self.eps));
    }
}

/// Two slots: `rms` and `momentum` (the kernel), or `rms` and `mg`
/// (centered, Python rule).
impl LaneKernel<2> for RmsPropStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [rms, other]: &mut [L; 2]) {
        if self.centered {
            self.second_moment(g, rms);
            *other = *other * L::splat(self.rho) + g * L::splat(1.0 - self.rho);
            let denom = *rms - *other * *other;
            *w = *w - L::splat(self.lr) * g / (denom.sqrt() + L::splat(self.eps));
        } else {
            self.second_moment(g, rms);
            self.momentum_step(g, w, other, *rms + L::splat(self.eps));
        }
    }
}

/// Three slots: `rms`, `momentum`, `mg` (centered kernel).
impl LaneKernel<3> for RmsPropStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [rms, mom, mg]: &mut [L; 3]) {
        self.second_moment(g, rms);
        *mg = *mg * L::splat(self.rho) + g * L::splat(1.0 - self.rho);
        self.momentum_step(g, w, mom, (*rms + L::splat(self.eps)) - *mg * *mg);
    }
}

impl RmsPropStep {
    /// `rms = rms * rho + (g * g) * (1 - rho)`, in every variant.
    fn second_moment<L: Lane>(&self, g: L, rms: &mut L) {
        *rms = *rms * L::splat(self.rho) + (g * g) * L::splat(1.0 - self.rho);
    }

    /// The kernels' momentum update with the denominator's square `denom`.
    fn momentum_step<L: Lane>(&self, g: L, w: &mut L, mom: &mut L, denom: L) {
        let step = (L::splat(1.0) / denom.sqrt()) * L::splat(self.lr);
        *mom = *mom * L::splat(self.momentum) + step * g;
        *w = *w - *mom;
    }
}

impl Rule for ParamsRmsProp {
    const NAME: &'static str = "SparseRmsProp";
    type Step = RmsPropStep;

    fn validate(&self) -> Result<()> {
        check_lr(Self::NAME, self.lr)?;
        check_decay(Self::NAME, "rho", self.rho)?;
        check(
            (0.0..=1.0).contains(&self.momentum),
            Self::NAME,
            format!("momentum must be in [0, 1], got {}", self.momentum),
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
        let mut slots = vec![("rms", 0.0)];
        if self.momentum > 0.0 {
            slots.push(("momentum", 0.0));
        }
        if self.centered {
            slots.push(("mg", 0.0));
        }
        slots
    }
    fn prepare(&self, _t: u64, lr: f32) -> RmsPropStep {
        RmsPropStep {
            lr,
            rho: self.rho,
            momentum: self.momentum,
            eps: self.eps,
            centered: self.centered,
        }
    }
    fn update(step: &RmsPropStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        match (step.momentum > 0.0, step.centered) {
            (false, false) => update_row::<1, _>(step, grad, value, slots),
            (true, true) => update_row::<3, _>(step, grad, value, slots),
            _ => update_row::<2, _>(step, grad, value, slots),
        }
    }
}
