//! Saves a variable to a checkpoint directory and restores it into a
//! variable with another shard count.
//!
//! `cargo run --release -p dynemb --example checkpoint [-- DIR]`
//! (default `target/checkpoint-example`). The README shows how to read the
//! same directory from Python.

use dynemb::{Initializer, Variable};

fn main() -> dynemb::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/checkpoint-example".to_string());
    let emb = Variable::<i64>::builder("user_emb")
        .dim(8)
        .shards(2)
        .initializer(Initializer::RandomNormal {
            mean: 0.0,
            stddev: 0.1,
            seed: 7,
        })
        .build()?;
    let keys: Vec<i64> = (-500..500).collect();
    let mut rows = vec![0.0; keys.len() * 8];
    emb.lookup_or_insert(&keys, &mut rows)?;
    emb.save(&dir)?;
    println!("saved {} rows of {} to {dir}", emb.size(), emb.name());

    let restored = Variable::<i64>::builder("user_emb")
        .dim(8)
        .shards(3)
        .build()?;
    restored.restore(&dir)?;
    let mut back = vec![0.0; keys.len() * 8];
    restored.lookup(&keys, &mut back)?;
    assert_eq!(back, rows);
    println!(
        "restored {} rows into {} shards; row of key -500 starts {:?}",
        restored.size(),
        restored.num_shards(),
        &back[..3]
    );
    Ok(())
}
