//! Every trainer computes dynemb's rows: after the same steps, every key's
//! value row and slot rows are bit for bit those of dynemb's `Variable`
//! trained by `dynemb-optim`; and the peers lose no update when two threads
//! step the same keys at once.

use super::*;
use crate::peers::Spec;
use crate::workload::{Picks, Shape, Workload};
use dynemb::Initializer;

const KEYS: usize = 300;
const BATCH: usize = 64;

/// Systems that run optimizer steps.
const TRAINERS: [System; 5] = [
    System::Dynemb,
    System::Dense,
    System::DashMap,
    System::Papaya,
    System::Scc,
];

fn workload(dim: usize) -> Workload {
    Workload::generate(Shape {
        keys: KEYS,
        dim,
        batch: BATCH,
        picks: 4 * BATCH,
        zipf_s: 1.1,
        seed: 5,
    })
}

fn spec(dim: usize) -> Spec {
    Spec {
        dim,
        initializer: Initializer::Constant(0.5),
        batch: BATCH,
        dense_rows: KEYS,
    }
}

/// Every key's rows, in key order.
fn rows(trainer: &dyn Trainer, w: &Workload) -> Vec<Vec<u32>> {
    (0..KEYS)
        .map(|r| {
            read(trainer, w.keys.keys[r], r as u32, w.dim())
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

/// Prefills, then steps through `picks` batch by batch on one thread.
fn train(system: System, optimizer: Optimizer, w: &Workload, picks: &Picks) -> Box<dyn Trainer> {
    let trainer = system
        .trainer(optimizer, &spec(w.dim()))
        .expect("a trainer");
    prefill(trainer.as_ref(), w, 1);
    for start in (0..picks.len()).step_by(BATCH) {
        let b = picks.batch(start..(start + BATCH).min(picks.len()));
        trainer.apply(b, w.grads_for(b.len()));
    }
    assert_eq!(trainer.steps() as usize, picks.len().div_ceil(BATCH));
    trainer
}

#[test]
fn every_trainer_matches_dynemb_bit_for_bit() {
    // dim 5: the scalar tail only; dim 16: SIMD lanes only; dim 19: both.
    for dim in [5, 16, 19] {
        let w = workload(dim);
        // Uniform batches, then Zipf batches (many repeated keys).
        let picks = Picks {
            keys: [&w.uniform.keys[..], &w.zipf.keys[..]].concat(),
            rows: [&w.uniform.rows[..], &w.zipf.rows[..]].concat(),
        };
        for optimizer in Optimizer::ALL {
            let want = rows(train(System::Dynemb, optimizer, &w, &picks).as_ref(), &w);
            let initial: Vec<Vec<u32>> = (0..KEYS)
                .map(|r| {
                    let row = initial_row(optimizer, &w, r as u32);
                    row.iter().map(|x| x.to_bits()).collect()
                })
                .collect();
            let changed = want.iter().zip(&initial).filter(|(a, b)| a != b).count();
            assert!(changed > KEYS / 2, "{changed} of {KEYS} keys were trained");
            for system in TRAINERS {
                let trainer = train(system, optimizer, &w, &picks);
                let got = rows(trainer.as_ref(), &w);
                for (r, (got, want)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        got,
                        want,
                        "{} {} dim {dim}: key {} (row {r})",
                        system.name(),
                        optimizer.name(),
                        w.keys.keys[r]
                    );
                }
            }
        }
    }
}

#[test]
fn the_bench_checks_pass_on_every_trainer() {
    let w = workload(16);
    for optimizer in Optimizer::ALL {
        for system in TRAINERS {
            let trainer = system.trainer(optimizer, &spec(16)).expect("a trainer");
            prefill(trainer.as_ref(), &w, 2);
            check_first_steps(trainer.as_ref(), &w);
            for picks in [&w.uniform, &w.zipf] {
                time_apply(trainer.as_ref(), picks, &w, 2);
            }
            check_next_step(trainer.as_ref(), &w);
        }
    }
    assert!(System::HashbrownRwLock
        .trainer(Optimizer::Adam, &spec(16))
        .is_none());
}

#[test]
#[should_panic(expected = "after the first two steps")]
fn the_first_steps_check_catches_a_wrong_row() {
    /// dynemb, but its reads see one value off.
    struct Off(Box<dyn Trainer>);
    impl Trainer for Off {
        fn system(&self) -> System {
            self.0.system()
        }
        fn optimizer(&self) -> Optimizer {
            self.0.optimizer()
        }
        fn prefill(&self, batch: Batch<'_>, values: &[f32]) {
            self.0.prefill(batch, values)
        }
        fn apply(&self, batch: Batch<'_>, grads: &[f32]) {
            self.0.apply(batch, grads)
        }
        fn steps(&self) -> u64 {
            self.0.steps()
        }
        fn read(&self, key: u64, row: u32, out: &mut [f32]) {
            self.0.read(key, row, out);
            out[1] = f32::from_bits(out[1].to_bits() ^ 1);
        }
    }
    let w = workload(8);
    let trainer = Off(System::Dynemb.trainer(Optimizer::Adam, &spec(8)).unwrap());
    prefill(&trainer, &w, 1);
    check_first_steps(&trainer, &w);
}

#[test]
fn peers_lose_no_update_when_two_threads_step_the_same_keys() {
    // Two threads step the same batch (Zipf: repeated keys) at once. SGD
    // ignores the step number and every step subtracts the same amount from
    // a key's row, so whatever the interleaving the rows must equal those
    // of the same steps run on one thread: a lost update would show.
    let dim = 8;
    let w = workload(dim);
    let keys = &w.zipf;
    let rounds = 20;
    for system in [System::Dynemb, System::DashMap, System::Papaya, System::Scc] {
        let trainer = system.trainer(Optimizer::Sgd, &spec(dim)).unwrap();
        let trainer = trainer.as_ref();
        prefill(trainer, &w, 1);
        let before = rows(trainer, &w);
        let grads = vec![0.25_f32; keys.len() * dim];
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..rounds {
                        trainer.apply(keys.batch(0..keys.len()), &grads);
                    }
                });
            }
        });
        assert_eq!(trainer.steps(), 2 * rounds as u64);
        let serial = system.trainer(Optimizer::Sgd, &spec(dim)).unwrap();
        prefill(serial.as_ref(), &w, 1);
        for _ in 0..2 * rounds {
            serial.apply(keys.batch(0..keys.len()), &grads);
        }
        let after = rows(trainer, &w);
        let want = rows(serial.as_ref(), &w);
        let moved = after.iter().zip(&before).filter(|(a, b)| a != b).count();
        assert!(moved > 0);
        assert_eq!(after, want, "{}: an update was lost", system.name());
    }
}
