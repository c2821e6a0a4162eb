//! A tour of the `Variable` API: a sharded dynamic embedding that grows as
//! ids arrive, read TFRA-style, accumulated into from several threads, and
//! exported.
//!
//! Run with `cargo run --release -p dynemb --example quickstart`.

use dynemb::{Initializer, Variable};

fn main() -> dynemb::Result<()> {
    let dim = 8;
    let emb = Variable::<i64>::builder("user_emb")
        .dim(dim)
        .shards(4)
        .initializer(Initializer::RandomNormal {
            mean: 0.0,
            stddev: 0.05,
            seed: 42,
        })
        .build()?;
    println!("built {emb:?}");

    // Inference read: missing ids get the initializer's row; nothing is stored.
    let ids = [3_i64, -7, 1 << 40, 3];
    let mut rows = vec![0.0; ids.len() * dim];
    emb.lookup(&ids, &mut rows)?;
    println!("lookup of 4 missing ids: size is still {}", emb.size());

    // Training read: the same rows, now stored (the duplicate 3 once).
    let mut stored = vec![0.0; ids.len() * dim];
    emb.lookup_or_insert(&ids, &mut stored)?;
    assert_eq!(rows, stored, "random rows are deterministic per (seed, id)");
    println!(
        "lookup_or_insert stored {} ids; per shard: {:?}",
        emb.size(),
        (0..emb.num_shards())
            .map(|s| emb.shard_size(s))
            .collect::<dynemb::Result<Vec<_>>>()?
    );

    // Four workers add +1.0 to every element of 100k shared ids, ten times,
    // with TFRA's bp_v2 accumulate: their updates add up instead of
    // overwriting each other, through all the resizes the growth causes.
    let keys: Vec<i64> = (0..100_000).collect();
    let deltas = vec![1.0; keys.len() * dim];
    emb.upsert(&keys, &vec![0.0; keys.len() * dim])?;
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| -> dynemb::Result<()> {
                let exists = vec![true; keys.len()];
                for _ in 0..10 {
                    emb.accum(&keys, &deltas, &exists)?;
                }
                Ok(())
            });
        }
    });
    let mut out = vec![0.0; dim];
    emb.lookup(&[12_345], &mut out)?;
    println!(
        "after 4 threads x 10 accumulates, id 12345 = {:?}",
        &out[..3]
    );
    assert!(out.iter().all(|&v| v == 40.0));

    emb.remove(&[-7, 3])?;
    let (exported_keys, values) = emb.export()?;
    println!(
        "exported {} rows ({} values); {} bytes in memory",
        exported_keys.len(),
        values.len(),
        emb.memory_bytes()
    );

    // Mistakes are errors, not panics.
    let err = emb.lookup(&[1, 2], &mut [0.0; 3]).unwrap_err();
    println!("a short buffer: {err}");
    Ok(())
}
