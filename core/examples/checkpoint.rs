//! Trains a variable with an Adagrad-style slot and a frequency restrict
//! policy for a few steps, saves it to a checkpoint directory and restores it
//! (values, slot and scores) into a variable with another shard count.
//!
//! `cargo run --release -p dynemb --example checkpoint [-- DIR [DTYPE]]`
//! (default `target/checkpoint-example`, `f32`). With `DTYPE` `f16` or
//! `bf16` the variable stores its values and slot in that dtype, and so
//! does the checkpoint; the restore is into `f32` rows, which hold them
//! exactly. The README shows how to read the same directory from Python.

use dynemb::{Dtype, Initializer, RestrictPolicy, Variable};

fn main() -> dynemb::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| "target/checkpoint-example".to_string());
    let dtype: Dtype = args.next().as_deref().unwrap_or("f32").parse()?;
    let emb = Variable::<i64>::builder("user_emb")
        .dim(8)
        .value_dtype(dtype)
        .slot_dtype(dtype)
        .shards(2)
        .initializer(Initializer::RandomNormal {
            mean: 0.0,
            stddev: 0.1,
            seed: 7,
        })
        .restrict_policy(RestrictPolicy::Frequency)
        .build()?;
    let accum = emb.create_slot("accum", 0.1)?;
    let keys: Vec<i64> = (-500..500).collect();
    // Three Adagrad steps (lr 0.05) with a made-up gradient; key k is in the
    // batch of step s when k is divisible by s + 1, so frequencies differ.
    for step in 0..3_i64 {
        let batch: Vec<i64> = keys
            .iter()
            .copied()
            .filter(|k| k % (step + 1) == 0)
            .collect();
        emb.update_rows(&batch, &[accum], |i, row, acc| {
            let grad = 0.01 * (batch[i] % 7) as f32;
            for (w, a) in row.iter_mut().zip(acc.iter_mut()) {
                *a += grad * grad;
                *w -= 0.05 * grad / a.sqrt();
            }
        })?;
    }
    let mut rows = vec![0.0; keys.len() * 8];
    emb.lookup(&keys, &mut rows)?;
    emb.save(&dir)?;
    println!(
        "saved {} rows of {} ({dtype}) to {dir}",
        emb.size(),
        emb.name()
    );

    let restored = Variable::<i64>::builder("user_emb")
        .dim(8)
        .shards(3)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()?;
    restored.restore(&dir)?;
    let mut back = vec![0.0; keys.len() * 8];
    restored.lookup(&keys, &mut back)?;
    assert_eq!(back, rows);
    let (mut slot, mut slot_back) = (vec![0.0; keys.len() * 8], vec![0.0; keys.len() * 8]);
    emb.lookup_slot(accum, &keys, &mut slot)?;
    restored.lookup_slot(restored.slot_id("accum")?, &keys, &mut slot_back)?;
    assert_eq!(slot, slot_back);
    let (mut counts, mut counts_back) = (vec![0; keys.len()], vec![0; keys.len()]);
    emb.lookup_scores(&keys, &mut counts)?;
    restored.lookup_scores(&keys, &mut counts_back)?;
    assert_eq!(counts, counts_back);
    println!(
        "restored {} rows into {} shards; row of key -500 starts {:?}",
        restored.size(),
        restored.num_shards(),
        &back[..3]
    );
    Ok(())
}
