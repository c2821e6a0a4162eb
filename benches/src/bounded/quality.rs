//! Eviction quality, HierarchicalKV's test: how much of what a full
//! bounded variable keeps is what an exact policy would keep.
//!
//! Capacity `C`; `5C` distinct keys, key `k` (the `k`-th written) written
//! `r_k` times in a row, `r_k` uniform in `1..=100` (seeded), through
//! `upsert` in batches of `batch` writes on one thread (a key's run of
//! writes may straddle two batches). Then the kept keys are exported and
//! `|kept ∩ ideal| / C` reported, the ideal set being:
//! - `Frequency` (LFU): the keys whose `r_k` is at least the `C`-th
//!   largest `r_k` (a key tied at that count counts as ideal);
//! - `Timestamp` (LRU): the last `C` keys written.
//!
//! `inserts` (`size()` plus `evicted` at the end) above `5C` counts keys
//! evicted in the middle of their own run of writes and inserted again.

use super::stream::scramble;
use super::{policy_name, BoundedShape};
use crate::report::markdown_table;
use crate::suite::CONSTANT;
use dynemb::{RestrictPolicy, Variable};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use std::time::Instant;

/// Most writes of one key.
pub const MAX_REPEATS: u8 = 100;
/// Keys written per row of capacity.
pub const KEYS_PER_ROW: usize = 5;
/// Seed of the repeat counts.
const SEED: u64 = 0x0E71_C7ED;
/// Added to a key's number before it is scrambled into the key, so these
/// keys are not the stream's.
const KEY_OFFSET: u64 = 1 << 48;

/// One run of the test.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QualityRow {
    /// `LFU` or `LRU`.
    pub policy: String,
    /// `C`.
    pub capacity: usize,
    /// Distinct keys written (`5C`).
    pub keys: usize,
    /// Writes in all.
    pub writes: u64,
    /// Rows held at the end.
    pub kept: usize,
    /// `|kept ∩ ideal| / C`.
    pub overlap: f64,
    /// LFU: the `C`-th largest `r_k`; LRU: none.
    pub threshold: Option<u8>,
    /// Rows evicted.
    pub evicted: u64,
    /// Inserts (`size()` + evicted).
    pub inserts: u64,
    /// Writes per second of the upserts (one thread).
    pub writes_per_second: f64,
}

/// The test's keys and repeat counts: key `i` is `scramble(KEY_OFFSET +
/// i)`, written `repeats[i]` times.
fn repeats(keys: usize) -> Vec<u8> {
    let mut rng = Pcg64Mcg::seed_from_u64(SEED);
    (0..keys)
        .map(|_| rng.random_range(1..=MAX_REPEATS))
        .collect()
}

/// The `c`-th largest of `repeats`.
pub fn threshold(repeats: &[u8], c: usize) -> u8 {
    let mut hist = [0usize; MAX_REPEATS as usize + 1];
    for &r in repeats {
        hist[r as usize] += 1;
    }
    let mut seen = 0;
    for r in (1..=MAX_REPEATS).rev() {
        seen += hist[r as usize];
        if seen >= c {
            return r;
        }
    }
    1
}

/// Runs the test with `policy` at capacity `shape.quality_capacity`.
pub fn run(shape: &BoundedShape, policy: RestrictPolicy) -> QualityRow {
    let c = shape.quality_capacity;
    let n = c * KEYS_PER_ROW;
    let repeats = repeats(n);
    let key = |i: usize| scramble(KEY_OFFSET + i as u64);
    let var = Variable::<u64>::builder("quality")
        .dim(shape.dim)
        .capacity(c)
        .restrict_policy(policy)
        .initializer(CONSTANT)
        .build()
        .expect("valid variable settings");
    let values: Vec<f32> = (0..shape.batch * shape.dim)
        .map(|j| (j % 97) as f32 * 0.01)
        .collect();
    let mut keys = Vec::with_capacity(shape.batch);
    let mut writes = 0u64;
    let start = Instant::now();
    let flush = |keys: &mut Vec<u64>| {
        var.upsert(keys, &values[..keys.len() * shape.dim])
            .expect("upsert");
        keys.clear();
    };
    for (i, &r) in repeats.iter().enumerate() {
        for _ in 0..r {
            keys.push(key(i));
            if keys.len() == shape.batch {
                flush(&mut keys);
            }
        }
        writes += u64::from(r);
    }
    flush(&mut keys);
    let seconds = start.elapsed().as_secs_f64();

    let index: hashbrown::HashMap<u64, u32, ahash::RandomState> = (0..n)
        .map(|i| (key(i), i as u32))
        .collect::<hashbrown::HashMap<_, _, _>>();
    let (kept, _) = var.export().expect("export");
    let at = |k: &u64| index.get(k).copied().expect("a key the test wrote") as usize;
    let (ideal, threshold) = match policy {
        RestrictPolicy::Frequency => {
            let t = threshold(&repeats, c);
            let ideal = kept.iter().filter(|k| repeats[at(k)] >= t).count();
            (ideal, Some(t))
        }
        RestrictPolicy::Timestamp => (kept.iter().filter(|k| at(k) >= n - c).count(), None),
    };
    let evicted = var.lifecycle_stats().evicted;
    QualityRow {
        policy: policy_name(policy).into(),
        capacity: c,
        keys: n,
        writes,
        kept: kept.len(),
        overlap: ideal as f64 / c as f64,
        threshold,
        evicted,
        inserts: kept.len() as u64 + evicted,
        writes_per_second: writes as f64 / seconds.max(1e-9),
    }
}

/// The quality rows as a Markdown table.
pub fn table(rows: &[QualityRow]) -> String {
    let header = [
        "eviction",
        "C",
        "keys",
        "writes",
        "kept",
        "ideal",
        "overlap",
        "inserts - keys",
        "M writes/s",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.policy.clone(),
                r.capacity.to_string(),
                r.keys.to_string(),
                r.writes.to_string(),
                r.kept.to_string(),
                match r.threshold {
                    Some(t) => format!("r_k >= {t}"),
                    None => "last C keys".into(),
                },
                format!("{:.2}%", r.overlap * 100.0),
                (r.inserts as i64 - r.keys as i64).to_string(),
                format!("{:.2}", r.writes_per_second / 1e6),
            ]
        })
        .collect();
    markdown_table(&header, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_is_the_c_th_largest() {
        assert_eq!(threshold(&[5, 1, 9, 9, 3], 1), 9);
        assert_eq!(threshold(&[5, 1, 9, 9, 3], 2), 9);
        assert_eq!(threshold(&[5, 1, 9, 9, 3], 3), 5);
        assert_eq!(threshold(&[5, 1, 9, 9, 3], 5), 1);
        let r = repeats(100_000);
        assert!(r.iter().all(|&x| (1..=MAX_REPEATS).contains(&x)));
        // Uniform in 1..=100: the top fifth starts near 81.
        assert!((80..=82).contains(&threshold(&r, 20_000)));
    }
}
