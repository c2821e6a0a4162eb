//! Every optimizer against a dense reference written here from the
//! textbook formula (one scalar per element, per key, per step), on 1 and 3
//! shards, with repeated keys in every batch and keys never touched; and a
//! batch with repeated keys against the same batch with their gradients
//! summed.

use dynemb::{Initializer, Variable};
use dynemb_optim::*;
use std::collections::HashMap;

const DIM: usize = 10;
const KEYS: i64 = 40;

/// An element's update: (t, lr, g, w, slots).
type Textbook = fn(u64, f32, f32, &mut f32, &mut [f32]);

/// Deterministic batches: 24 occurrences from keys 0..30 (so 30..40 are
/// never touched), many repeated, with varied gradients.
fn batches(steps: usize) -> Vec<(Vec<i64>, Vec<f32>)> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..steps)
        .map(|_| {
            let keys: Vec<i64> = (0..24).map(|_| (next() % 30) as i64 - 5).collect();
            let grads = (0..keys.len() * DIM)
                .map(|_| ((next() % 4001) as f32 - 2000.0) / 1000.0)
                .collect();
            (keys, grads)
        })
        .collect()
}

fn variable(shards: usize) -> Variable<i64> {
    Variable::<i64>::builder("emb")
        .dim(DIM)
        .shards(shards)
        .initializer(Initializer::RandomNormal {
            mean: 0.0,
            stddev: 0.5,
            seed: 3,
        })
        .build()
        .unwrap()
}

fn all_keys() -> Vec<i64> {
    (-5..KEYS - 5).collect()
}

/// Trains `opt` 10 steps on a fresh variable with `shards` shards, and the
/// textbook rule on a dense copy; compares every row and slot.
fn check<R: Rule>(params: R, textbook: Textbook, shards: usize) {
    let opt = Sparse::new(params.clone()).unwrap();
    let var = variable(shards);
    let keys = all_keys();
    let mut rows = vec![0.0; keys.len() * DIM];
    var.lookup(&keys, &mut rows).unwrap();
    let slots = params.slots();
    let mut dense: HashMap<i64, (Vec<f32>, Vec<f32>)> = keys
        .iter()
        .zip(rows.chunks(DIM))
        .map(|(&k, row)| {
            let s = slots
                .iter()
                .flat_map(|&(_, init)| vec![init; DIM])
                .collect();
            (k, (row.to_vec(), s))
        })
        .collect();
    for (step, (batch, grads)) in batches(10).into_iter().enumerate() {
        let t = step as u64 + 1;
        let lr = opt.current_lr();
        opt.apply(&var, &batch, &grads).unwrap();
        let mut summed: Vec<(i64, Vec<f32>)> = Vec::new();
        for (k, g) in batch.iter().zip(grads.chunks(DIM)) {
            match summed.iter_mut().find(|(key, _)| key == k) {
                Some((_, sum)) => sum.iter_mut().zip(g).for_each(|(s, g)| *s += g),
                None => summed.push((*k, g.to_vec())),
            }
        }
        for (k, g) in summed {
            let (w, s) = dense.get_mut(&k).unwrap();
            for j in 0..DIM {
                let mut elem: Vec<f32> = (0..slots.len()).map(|i| s[i * DIM + j]).collect();
                textbook(t, lr, g[j], &mut w[j], &mut elem);
                for (i, x) in elem.into_iter().enumerate() {
                    s[i * DIM + j] = x;
                }
            }
        }
    }
    let name = R::NAME;
    var.lookup(&keys, &mut rows).unwrap();
    for (i, k) in keys.iter().enumerate() {
        close(
            &rows[i * DIM..(i + 1) * DIM],
            &dense[k].0,
            &format!("{name} w[{k}]"),
        );
    }
    for (i, (slot, _)) in slots.iter().enumerate() {
        let id = var.slot_id(slot).unwrap();
        let mut out = vec![0.0; keys.len() * DIM];
        var.lookup_slot(id, &keys, &mut out).unwrap();
        for (r, k) in keys.iter().enumerate() {
            let expected = &dense[k].1[i * DIM..(i + 1) * DIM];
            close(
                &out[r * DIM..(r + 1) * DIM],
                expected,
                &format!("{name} {slot}[{k}]"),
            );
        }
    }
    assert_eq!(
        var.size(),
        30,
        "{name}: only the batches' keys were inserted"
    );
}

fn close(got: &[f32], expected: &[f32], what: &str) {
    for (j, (g, e)) in got.iter().zip(expected).enumerate() {
        let tolerance = 1e-6 * (1.0 + e.abs());
        assert!(
            (g - e).abs() <= tolerance,
            "{what} col {j}: got {g}, expected {e}"
        );
    }
}

fn both_shardings<R: Rule>(params: R, textbook: Textbook) {
    check(params.clone(), textbook, 1);
    check(params, textbook, 3);
}

#[test]
fn sgd() {
    both_shardings(ParamsSgd { lr: 0.1 }, |_, lr, g, w, _| *w -= lr * g);
}

#[test]
fn momentum_and_nesterov() {
    let p = ParamsMomentum {
        lr: 0.05,
        momentum: 0.9,
        nesterov: false,
    };
    both_shardings(p, |_, lr, g, w, s| {
        s[0] = 0.9 * s[0] - lr * g;
        *w += s[0];
    });
    both_shardings(
        ParamsMomentum {
            nesterov: true,
            ..p
        },
        |_, lr, g, w, s| {
            s[0] = 0.9 * s[0] - lr * g;
            *w += 0.9 * s[0] - lr * g;
        },
    );
}

#[test]
fn adagrad() {
    let p = ParamsAdagrad {
        lr: 0.1,
        initial_accumulator_value: 0.2,
        eps: 1e-7,
    };
    both_shardings(p, |_, lr, g, w, s| {
        s[0] += g * g;
        *w -= lr * g / (s[0].sqrt() + 1e-7);
    });
}

fn adam_textbook(t: u64, lr: f32, g: f32, w: &mut f32, s: &mut [f32]) {
    let (b1, b2, eps) = (0.8_f32, 0.95_f32, 1e-3_f32);
    s[0] = b1 * s[0] + (1.0 - b1) * g;
    s[1] = b2 * s[1] + (1.0 - b2) * g * g;
    let lr_t = lr * (1.0 - b2.powi(t as i32)).sqrt() / (1.0 - b1.powi(t as i32));
    let denom = if s.len() == 3 {
        s[2] = s[2].max(s[1]);
        s[2]
    } else {
        s[1]
    };
    *w -= lr_t * s[0] / (denom.sqrt() + eps);
}

#[test]
fn adam_and_amsgrad() {
    let p = ParamsAdam {
        lr: 0.1,
        beta1: 0.8,
        beta2: 0.95,
        eps: 1e-3,
        amsgrad: false,
    };
    both_shardings(p, adam_textbook);
    both_shardings(ParamsAdam { amsgrad: true, ..p }, adam_textbook);
}

fn adamw_textbook(t: u64, lr: f32, g: f32, w: &mut f32, s: &mut [f32]) {
    *w -= 0.1 * lr * *w;
    adam_textbook(t, lr, g, w, s);
}

#[test]
fn adamw_and_amsgrad() {
    let p = ParamsAdamW {
        lr: 0.1,
        beta1: 0.8,
        beta2: 0.95,
        eps: 1e-3,
        amsgrad: false,
        weight_decay: 0.1,
    };
    both_shardings(p, adamw_textbook);
    both_shardings(ParamsAdamW { amsgrad: true, ..p }, adamw_textbook);
}

#[test]
fn adamax() {
    let p = ParamsAdamax {
        lr: 0.1,
        beta1: 0.8,
        beta2: 0.95,
        eps: 1e-3,
    };
    both_shardings(p, |t, lr, g, w, s| {
        s[0] = 0.8 * s[0] + 0.2 * g;
        s[1] = (0.95 * s[1]).max(g.abs());
        *w -= lr / (1.0 - 0.8_f32.powi(t as i32)) * s[0] / (s[1] + 1e-3);
    });
}

#[test]
fn adadelta() {
    let p = ParamsAdadelta {
        lr: 1.0,
        rho: 0.9,
        eps: 1e-3,
    };
    both_shardings(p, |_, lr, g, w, s| {
        s[0] = 0.9 * s[0] + 0.1 * g * g;
        let update = ((s[1] + 1e-3) / (s[0] + 1e-3)).sqrt() * g;
        s[1] = 0.9 * s[1] + 0.1 * update * update;
        *w -= lr * update;
    });
}

/// FTRL-Proximal (McMahan et al.), with l2_shrinkage on the gradient and
/// Keras' beta in the L2 strength.
fn ftrl_textbook(
    lr_power: f32,
    l1: f32,
    l2: f32,
    shrinkage: f32,
    beta: f32,
) -> impl Fn(f32, f32, &mut f32, &mut [f32]) {
    move |lr, g, w, s| {
        let l2 = l2 + beta / (2.0 * lr);
        let g_shrunk = g + 2.0 * shrinkage * *w;
        let n_new = s[0] + g * g;
        let sigma = (n_new.powf(-lr_power) - s[0].powf(-lr_power)) / lr;
        s[1] += g_shrunk - sigma * *w;
        s[0] = n_new;
        *w = if s[1].abs() > l1 {
            -(s[1] - s[1].signum() * l1) / (n_new.powf(-lr_power) / lr + 2.0 * l2)
        } else {
            0.0
        };
    }
}

#[test]
fn ftrl_with_and_without_regularization() {
    let base = ParamsFtrl {
        lr: 0.2,
        initial_accumulator_value: 0.1,
        ..Default::default()
    };
    both_shardings(base, |_, lr, g, w, s| {
        ftrl_textbook(-0.5, 0.0, 0.0, 0.0, 0.0)(lr, g, w, s)
    });
    both_shardings(
        ParamsFtrl {
            l1: 0.05,
            l2: 0.1,
            ..base
        },
        |_, lr, g, w, s| ftrl_textbook(-0.5, 0.05, 0.1, 0.0, 0.0)(lr, g, w, s),
    );
    both_shardings(
        ParamsFtrl {
            l1: 0.05,
            l2: 0.1,
            l2_shrinkage: 0.02,
            beta: 0.3,
            ..base
        },
        |_, lr, g, w, s| ftrl_textbook(-0.5, 0.05, 0.1, 0.02, 0.3)(lr, g, w, s),
    );
    both_shardings(
        ParamsFtrl {
            lr_power: -0.7,
            l1: 0.05,
            ..base
        },
        |_, lr, g, w, s| ftrl_textbook(-0.7, 0.05, 0.0, 0.0, 0.0)(lr, g, w, s),
    );
}

#[test]
fn rmsprop_every_variant() {
    let base = ParamsRmsProp {
        lr: 0.05,
        rho: 0.8,
        momentum: 0.0,
        eps: 1e-3,
        centered: false,
    };
    // Without momentum: epsilon outside the root.
    both_shardings(base, |_, lr, g, w, s| {
        s[0] = 0.8 * s[0] + 0.2 * g * g;
        *w -= lr * g / (s[0].sqrt() + 1e-3);
    });
    both_shardings(
        ParamsRmsProp {
            centered: true,
            ..base
        },
        |_, lr, g, w, s| {
            s[0] = 0.8 * s[0] + 0.2 * g * g;
            s[1] = 0.8 * s[1] + 0.2 * g;
            *w -= lr * g / ((s[0] - s[1] * s[1]).sqrt() + 1e-3);
        },
    );
    // With momentum: epsilon inside the root (TensorFlow's kernels).
    both_shardings(
        ParamsRmsProp {
            momentum: 0.5,
            ..base
        },
        |_, lr, g, w, s| {
            s[0] = 0.8 * s[0] + 0.2 * g * g;
            s[1] = 0.5 * s[1] + lr * g / (s[0] + 1e-3).sqrt();
            *w -= s[1];
        },
    );
    both_shardings(
        ParamsRmsProp {
            momentum: 0.5,
            centered: true,
            ..base
        },
        |_, lr, g, w, s| {
            s[0] = 0.8 * s[0] + 0.2 * g * g;
            s[2] = 0.8 * s[2] + 0.2 * g;
            s[1] = 0.5 * s[1] + lr * g / (s[0] - s[2] * s[2] + 1e-3).sqrt();
            *w -= s[1];
        },
    );
}

/// A batch with repeated keys equals the batch of its distinct keys with
/// their gradients summed, bit for bit, for every optimizer.
#[test]
fn repeated_keys_equal_their_summed_gradient() {
    fn same<R: Rule>(params: R) {
        let (a, b) = (variable(2), variable(2));
        let (opt_a, opt_b) = (
            Sparse::new(params.clone()).unwrap(),
            Sparse::new(params).unwrap(),
        );
        let keys = [3_i64, 9, 3, 3, -1, 9];
        let grads: Vec<f32> = (0..keys.len() * DIM)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let mut summed = vec![0.0; 3 * DIM];
        for (k, g) in keys.iter().zip(grads.chunks(DIM)) {
            let at = [3, 9, -1].iter().position(|x| x == k).unwrap();
            for (s, g) in summed[at * DIM..(at + 1) * DIM].iter_mut().zip(g) {
                *s += g;
            }
        }
        for _ in 0..3 {
            opt_a.apply(&a, &keys, &grads).unwrap();
            opt_b.apply(&b, &[3, 9, -1], &summed).unwrap();
        }
        let (ka, va) = a.export().unwrap();
        let mut rows_b = vec![0.0; va.len()];
        b.lookup(&ka, &mut rows_b).unwrap();
        assert_eq!(va, rows_b, "{}", R::NAME);
        assert_eq!(a.size(), 3);
    }
    same(ParamsSgd { lr: 0.1 });
    same(ParamsMomentum {
        momentum: 0.9,
        nesterov: true,
        ..Default::default()
    });
    same(ParamsAdagrad::default());
    same(ParamsAdam {
        amsgrad: true,
        ..Default::default()
    });
    same(ParamsAdamW::default());
    same(ParamsAdamax::default());
    same(ParamsAdadelta::default());
    same(ParamsFtrl {
        l1: 0.01,
        l2_shrinkage: 0.1,
        ..Default::default()
    });
    same(ParamsRmsProp {
        momentum: 0.5,
        centered: true,
        ..Default::default()
    });
}
