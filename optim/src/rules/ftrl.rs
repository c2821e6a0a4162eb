//! FTRL-Proximal (Keras 2's `Ftrl`, whose sparse update is TensorFlow's
//! `ResourceSparseApplyFtrl`, or `ResourceSparseApplyFtrlV2` with
//! `l2_shrinkage > 0`), with Keras' `beta` folded into the L2 strength:
//!
//! ```text
//! l2' = l2 + beta / (2 * lr)                                   (per step)
//! g' = g + 2 * l2_shrinkage * w                                (V2 only; the accumulator uses g)
//! accum_new = accum + g * g
//! linear += g' - (accum_new^(-lr_power) - accum^(-lr_power)) / lr * w    (sqrt for lr_power = -0.5)
//! quadratic = accum_new^(-lr_power) / lr + 2 * l2'
//! w = (clamp(linear, -l1, l1) - linear) / quadratic           (0 while |linear| <= l1)
//! accum = accum_new
//! ```

use crate::lanes::{update_row, Lane, LaneKernel};
use crate::optimizer::{check, Rule, Sparse};
use dynemb::Result;
use serde::{Deserialize, Serialize};

/// Hyperparameters of [`SparseFtrl`]. Defaults: Keras' `lr = 0.001`,
/// `lr_power = -0.5`, `initial_accumulator_value = 0.1`, no regularization
/// (`l1`, `l2`, `l2_shrinkage`, `beta` all 0).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsFtrl {
    /// Learning rate (> 0: FTRL divides by it).
    pub lr: f32,
    /// How the per-coordinate rate falls with the accumulator (<= 0).
    pub lr_power: f32,
    /// The value every row's accumulator starts at (> 0).
    pub initial_accumulator_value: f32,
    /// L1 regularization strength (>= 0).
    pub l1: f32,
    /// L2 regularization strength (>= 0).
    pub l2: f32,
    /// L2 shrinkage regularization strength (>= 0), on the gradient.
    pub l2_shrinkage: f32,
    /// Keras' `beta` (>= 0): adds `beta / (2 * lr)` to the L2 strength.
    pub beta: f32,
}

impl Default for ParamsFtrl {
    fn default() -> Self {
        ParamsFtrl {
            lr: 0.001,
            lr_power: -0.5,
            initial_accumulator_value: 0.1,
            l1: 0.0,
            l2: 0.0,
            l2_shrinkage: 0.0,
            beta: 0.0,
        }
    }
}

/// Sparse FTRL; slots `accumulator` (from `initial_accumulator_value`) and
/// `linear` (from 0).
pub type SparseFtrl = Sparse<ParamsFtrl>;

/// One step's FTRL kernel.
#[derive(Debug, Clone, Copy)]
pub struct FtrlStep {
    lr: f32,
    lr_power: f32,
    l1: f32,
    l2: f32,
    l2_shrinkage: f32,
}

impl FtrlStep {
    /// `accum ^ (-lr_power)`, TensorFlow's square root for -0.5.
    fn root<L: Lane>(&self, accum: L) -> L {
        if self.lr_power == -0.5 {
            accum.sqrt()
        } else {
            accum.powf(-self.lr_power)
        }
    }
}

impl LaneKernel<2> for FtrlStep {
    fn run<L: Lane>(&self, g: L, w: &mut L, [accum, linear]: &mut [L; 2]) {
        let lr = L::splat(self.lr);
        let shrunk = if self.l2_shrinkage > 0.0 {
            g + L::splat(2.0 * self.l2_shrinkage) * *w
        } else {
            g
        };
        let accum_new = *accum + g * g;
        let root_new = self.root(accum_new);
        *linear = *linear + (shrunk - (root_new - self.root(*accum)) / lr * *w);
        let quadratic = root_new / lr + L::splat(2.0 * self.l2);
        let l1 = L::splat(self.l1);
        *w = (linear.min(l1).max(-l1) - *linear) / quadratic;
        *accum = accum_new;
    }
}

impl Rule for ParamsFtrl {
    const NAME: &'static str = "SparseFtrl";
    type Step = FtrlStep;

    fn validate(&self) -> Result<()> {
        let name = Self::NAME;
        check(
            self.lr.is_finite() && self.lr > 0.0,
            name,
            format!("lr must be > 0, got {}", self.lr),
        )?;
        check(
            self.lr_power.is_finite() && self.lr_power <= 0.0,
            name,
            format!("lr_power must be <= 0, got {}", self.lr_power),
        )?;
        check(
            self.initial_accumulator_value.is_finite() && self.initial_accumulator_value > 0.0,
            name,
            format!(
                "initial_accumulator_value must be > 0, got {}",
                self.initial_accumulator_value
            ),
        )?;
        for (what, x) in [
            ("l1", self.l1),
            ("l2", self.l2),
            ("l2_shrinkage", self.l2_shrinkage),
            ("beta", self.beta),
        ] {
            check(
                x.is_finite() && x >= 0.0,
                name,
                format!("{what} must be >= 0, got {x}"),
            )?;
        }
        Ok(())
    }
    fn lr(&self) -> f32 {
        self.lr
    }
    fn set_lr(&mut self, lr: f32) {
        self.lr = lr;
    }
    fn slots(&self) -> Vec<(&'static str, f32)> {
        vec![
            ("accumulator", self.initial_accumulator_value),
            ("linear", 0.0),
        ]
    }
    fn prepare(&self, _t: u64, lr: f32) -> FtrlStep {
        FtrlStep {
            lr,
            lr_power: self.lr_power,
            l1: self.l1,
            l2: self.l2 + self.beta / (2.0 * lr),
            l2_shrinkage: self.l2_shrinkage,
        }
    }
    fn update(step: &FtrlStep, grad: &[f32], value: &mut [f32], slots: &mut [f32]) {
        update_row(step, grad, value, slots);
    }
}
