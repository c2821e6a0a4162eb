//! Learning-rate schedules: the learning rate of a step as a function of
//! the optimizer's step count, as Keras' `LearningRateSchedule`s compute it.
//!
//! Keras evaluates a schedule at `iterations`, the number of steps already
//! taken (0 for the first step); so does [`LearningRate::at`]. The base
//! rate is the optimizer's `lr` parameter (changed between steps with
//! `set_lr`); a schedule scales or replaces it.

use dynemb::{Error, Result};
use serde::{Deserialize, Serialize};

/// How the learning rate follows the step count.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LearningRate {
    /// The optimizer's `lr`, whatever the step.
    #[default]
    Constant,
    /// Keras' `ExponentialDecay`: `lr * decay_rate ^ (step / decay_steps)`,
    /// the exponent floored when `staircase`.
    ExponentialDecay {
        /// Steps per factor of `decay_rate`.
        decay_steps: u64,
        /// Factor per `decay_steps` steps.
        decay_rate: f32,
        /// Whether the exponent is a whole number of periods.
        staircase: bool,
    },
    /// Keras' `PiecewiseConstantDecay`: `values[0]` up to and including step
    /// `boundaries[0]`, `values[i]` after `boundaries[i - 1]` up to and
    /// including `boundaries[i]`, and the last value after the last
    /// boundary. It replaces `lr`.
    PiecewiseConstant {
        /// Increasing step counts.
        boundaries: Vec<u64>,
        /// One more value than boundaries.
        values: Vec<f32>,
    },
}

impl LearningRate {
    /// Checks the schedule's parameters.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| {
            Err(Error::InvalidArgument(format!(
                "learning-rate schedule: {why}"
            )))
        };
        match self {
            LearningRate::Constant => Ok(()),
            LearningRate::ExponentialDecay {
                decay_steps,
                decay_rate,
                ..
            } => {
                if *decay_steps == 0 {
                    return bad("decay_steps must be at least 1".into());
                }
                if !(decay_rate.is_finite() && *decay_rate > 0.0) {
                    return bad(format!(
                        "decay_rate must be positive and finite, got {decay_rate}"
                    ));
                }
                Ok(())
            }
            LearningRate::PiecewiseConstant { boundaries, values } => {
                if values.len() != boundaries.len() + 1 {
                    return bad(format!(
                        "{} boundaries need {} values, got {}",
                        boundaries.len(),
                        boundaries.len() + 1,
                        values.len()
                    ));
                }
                if boundaries.windows(2).any(|w| w[0] >= w[1]) {
                    return bad("boundaries must increase".into());
                }
                match values.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
                    Some(v) => bad(format!("values must be finite and >= 0, got {v}")),
                    None => Ok(()),
                }
            }
        }
    }

    /// The learning rate after `step` steps, for base rate `lr`.
    pub fn at(&self, lr: f32, step: u64) -> f32 {
        match self {
            LearningRate::Constant => lr,
            LearningRate::ExponentialDecay {
                decay_steps,
                decay_rate,
                staircase,
            } => {
                let mut periods = step as f32 / *decay_steps as f32;
                if *staircase {
                    periods = periods.floor();
                }
                lr * decay_rate.powf(periods)
            }
            LearningRate::PiecewiseConstant { boundaries, values } => {
                let i = boundaries.partition_point(|&b| b < step);
                values[i]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_decay_as_keras() {
        let s = LearningRate::ExponentialDecay {
            decay_steps: 10,
            decay_rate: 0.5,
            staircase: false,
        };
        assert_eq!(s.at(0.1, 0), 0.1);
        assert_eq!(s.at(0.1, 10), 0.05);
        assert!((s.at(0.1, 5) - 0.1 * 0.5f32.powf(0.5)).abs() < 1e-9);
        let stairs = LearningRate::ExponentialDecay {
            decay_steps: 10,
            decay_rate: 0.5,
            staircase: true,
        };
        assert_eq!(stairs.at(0.1, 19), 0.05);
    }

    #[test]
    fn piecewise_constant_boundaries_are_inclusive_on_the_left_segment() {
        let s = LearningRate::PiecewiseConstant {
            boundaries: vec![10, 20],
            values: vec![1.0, 0.5, 0.1],
        };
        assert_eq!(
            [0, 10, 11, 20, 21, 99].map(|t| s.at(9.0, t)),
            [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
        );
    }

    #[test]
    fn bad_schedules_are_errors() {
        for bad in [
            LearningRate::ExponentialDecay {
                decay_steps: 0,
                decay_rate: 0.5,
                staircase: false,
            },
            LearningRate::ExponentialDecay {
                decay_steps: 1,
                decay_rate: f32::NAN,
                staircase: false,
            },
            LearningRate::PiecewiseConstant {
                boundaries: vec![5, 5],
                values: vec![1.0; 3],
            },
            LearningRate::PiecewiseConstant {
                boundaries: vec![5],
                values: vec![1.0],
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
