//! A walk through every operation on a single server and on a 3-master
//! cluster, with the values, scores and counts each step must leave (the
//! models in `model.rs` cover the same ground at random).

use dynemb::{EmbeddingTable, Initializer, RestrictPolicy, Variable};
use dynemb_redis::RedisVariable;
use dynemb_test_support::servers::{Cluster, Server};

fn exercise(config: dynemb_redis::RedisConfig) {
    let v = RedisVariable::open(
        Variable::<i64>::builder("basics")
            .dim(3)
            .initializer(Initializer::Constant(0.5))
            .restrict_policy(RestrictPolicy::Frequency),
        config,
    )
    .unwrap();
    assert!(
        !dynemb::EmbeddingStore::cpu_bound(&v),
        "callers must not split a remote store's batches over their CPU threads"
    );
    let mut out = vec![0.0; 6];
    v.lookup(&[1, 2], &mut out).unwrap();
    assert_eq!(out, [0.5; 6]);
    assert_eq!(v.size().unwrap(), 0);
    v.lookup_or_insert(&[1, 2], &mut out).unwrap();
    assert_eq!(v.size().unwrap(), 2);
    v.accum(&[1, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[true, false])
        .unwrap();
    v.lookup(&[1, 3], &mut out).unwrap();
    assert_eq!(out, [1.5, 2.5, 3.5, 4.0, 5.0, 6.0]);
    v.upsert(&[2, 2], &[9.0; 6]).unwrap();
    let m = v.create_slot("m", 0.25).unwrap();
    v.update_rows(&[1, 4], &[m], |_, values, slots| {
        values[0] += 1.0;
        slots[0] += 1.0;
    })
    .unwrap();
    let mut s = vec![0.0; 6];
    v.lookup_slot(m, &[1, 4], &mut s).unwrap();
    assert_eq!(s, [1.25, 0.25, 0.25, 1.25, 0.25, 0.25]);
    let mut scores = vec![0; 4];
    v.lookup_scores(&[1, 2, 3, 4], &mut scores).unwrap();
    assert_eq!(scores, [3, 3, 1, 1]);
    let (keys, values) = v.export().unwrap();
    assert_eq!(keys.len(), 4);
    assert_eq!(values.len(), 12);
    assert_eq!(v.restrict(2, 0).unwrap(), 2);
    assert_eq!(v.size().unwrap(), 2);
    v.clear().unwrap();
    assert_eq!(v.size().unwrap(), 0);
    v.destroy().unwrap();
}

#[test]
fn every_operation_on_a_single_server() {
    let Some(server) = Server::start() else {
        return;
    };
    exercise(server.config());
}

#[test]
fn every_operation_on_a_cluster() {
    let Some(cluster) = Cluster::start(3) else {
        return;
    };
    exercise(cluster.config());
}

/// bp_v2 with a key repeated under different `exists` flags: every pattern
/// of three occurrences, on a key absent and on a key present before the
/// batch, gives what a local `Variable` gives (a row the batch inserted
/// takes the later deltas whatever their flag).
#[test]
fn accum_of_repeats_with_mixed_exists_flags_matches_a_local_variable() {
    let Some(server) = Server::start() else {
        return;
    };
    let remote =
        RedisVariable::open(Variable::<i64>::builder("mixed").dim(1), server.config()).unwrap();
    for pattern in 0..8_u32 {
        for present in [false, true] {
            let local = Variable::<i64>::builder("mixed").dim(1).build().unwrap();
            remote.clear().unwrap();
            let key = 7_i64;
            if present {
                local.upsert(&[key], &[100.0]).unwrap();
                remote.upsert(&[key], &[100.0]).unwrap();
            }
            // Other keys between the occurrences, so distance plays no part.
            let keys = [key, 1, key, 2, key];
            let exists = [
                pattern & 1 != 0,
                true,
                pattern & 2 != 0,
                false,
                pattern & 4 != 0,
            ];
            let deltas = [1.0, 5.0, 10.0, 50.0, 100.0];
            local.accum(&keys, &deltas, &exists).unwrap();
            remote.accum(&keys, &deltas, &exists).unwrap();
            let (mut want, mut got) = (vec![0.0; 3], vec![0.0; 3]);
            let (mut want_exists, mut got_exists) = (vec![false; 3], vec![false; 3]);
            local
                .lookup_with_exists(&[key, 1, 2], &mut want, &mut want_exists)
                .unwrap();
            remote
                .lookup_with_exists(&[key, 1, 2], &mut got, &mut got_exists)
                .unwrap();
            assert_eq!(
                (got, got_exists),
                (want, want_exists),
                "exists {exists:?}, present before: {present}"
            );
        }
    }
    remote.destroy().unwrap();
}

/// `accum` adds on the server, in chunks of straight-line code and a
/// generic loop for the values past the last whole chunk: at dims below,
/// at and past a chunk, rows equal a local variable's bit for bit
/// (fractional values, so every sum is rounded), and a sum that
/// overflows in any chunk, of either sign, is refused as locally.
#[test]
fn accum_adds_bit_for_bit_as_a_local_variable_at_every_dim() {
    let Some(server) = Server::start() else {
        return;
    };
    for dim in [1, 15, 16, 17, 37, 64, 100] {
        let name = format!("accum_dim_{dim}");
        let remote = RedisVariable::open(
            Variable::<i64>::builder(name.as_str())
                .dim(dim)
                .initializer(Initializer::Constant(0.1)),
            server.config(),
        )
        .unwrap();
        let local = Variable::<i64>::builder(name.as_str())
            .dim(dim)
            .initializer(Initializer::Constant(0.1))
            .build()
            .unwrap();
        let keys: Vec<i64> = (0..40).chain(5..15).collect();
        let values: Vec<f32> = (0..keys.len() * dim)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
            .collect();
        let exists: Vec<bool> = keys.iter().map(|k| k % 3 != 0).collect();
        let mut start = vec![0.0; keys.len() * dim];
        remote
            .lookup_or_insert(&keys[..20], &mut start[..20 * dim])
            .unwrap();
        local
            .lookup_or_insert(&keys[..20], &mut start[..20 * dim])
            .unwrap();
        for round in 0..3 {
            remote.accum(&keys, &values, &exists).unwrap();
            local.accum(&keys, &values, &exists).unwrap();
            let (mut got, mut want) = (vec![0.0; 40 * dim], vec![0.0; 40 * dim]);
            remote.lookup(&keys[..40], &mut got).unwrap();
            local.lookup(&keys[..40], &mut want).unwrap();
            let (got, want): (Vec<u32>, Vec<u32>) = (
                got.iter().map(|v| v.to_bits()).collect(),
                want.iter().map(|v| v.to_bits()).collect(),
            );
            assert_eq!(got, want, "dim {dim}, round {round}");
        }
        // Overflows: key 2 negative in the first value, key 1 in the last
        // one; key 3 stays finite and is written.
        let big = [2, 1, 3];
        let rows = [vec![-3e38; dim], vec![3e38; dim], vec![3e38; dim]].concat();
        remote.upsert(&big, &rows).unwrap();
        local.upsert(&big, &rows).unwrap();
        let mut deltas = vec![1.0; 3 * dim];
        deltas[0] = -3e38;
        deltas[2 * dim - 1] = 3e38;
        let got = remote.accum(&big, &deltas, &[true; 3]).unwrap_err();
        let want = local.accum(&big, &deltas, &[true; 3]).unwrap_err();
        assert_eq!(got, want, "dim {dim}");
        let (mut got, mut want) = (vec![0.0; 3 * dim], vec![0.0; 3 * dim]);
        remote.lookup(&big, &mut got).unwrap();
        local.lookup(&big, &mut want).unwrap();
        assert_eq!(got, want, "dim {dim}: refused rows kept, the other written");
    }
}

/// Code written once against [`EmbeddingTable`] (writes, reads, scores,
/// slots, a checkpoint round trip, streamed export, `restrict`, `clear`),
/// returning what it saw: the exported rows sorted by key, the scores and
/// the size.
fn through_the_trait<T: EmbeddingTable<Key = i64>>(table: &T) -> (Vec<i64>, Vec<f32>, Vec<u64>) {
    let dim = table.dim();
    let keys: Vec<i64> = (-20..20).collect();
    let mut rows = vec![0.0; keys.len() * dim];
    table
        .lookup_or_insert(&keys[..10], &mut rows[..10 * dim])
        .unwrap();
    table.upsert(&keys[5..15], &vec![2.0; 10 * dim]).unwrap();
    let exists: Vec<bool> = keys.iter().map(|k| k % 2 == 0).collect();
    table
        .accum(&keys, &vec![1.0; keys.len() * dim], &exists)
        .unwrap();
    table.remove(&keys[..3]).unwrap();
    let mut present = vec![false; keys.len()];
    table
        .lookup_with_exists(&keys, &mut rows, &mut present)
        .unwrap();
    let mut scores = vec![0; keys.len()];
    table.lookup_scores(&keys, &mut scores).unwrap();
    let m = table.create_slot("m", 0.5).unwrap();
    assert_eq!(table.slot_names().unwrap(), ["m"]);
    assert_eq!(table.slot_initial(m).unwrap(), 0.5);
    let size = table.size().unwrap();
    assert_eq!(size, present.iter().filter(|&&p| p).count());
    let dir = tempfile::tempdir().unwrap();
    table.save(dir.path()).unwrap();
    table.clear().unwrap();
    assert_eq!(table.size().unwrap(), 0);
    table.restore(dir.path()).unwrap();
    assert_eq!(table.size().unwrap(), size);
    assert!(table.memory_bytes().unwrap() > 0);
    let (mut exported, mut values) = (Vec::new(), Vec::new());
    for chunk in table.export_chunks(7) {
        let (k, v) = chunk.unwrap();
        assert!(k.len() <= 7);
        exported.extend(k);
        values.extend(v);
    }
    let mut order: Vec<usize> = (0..exported.len()).collect();
    order.sort_by_key(|&i| exported[i]);
    let sorted_keys = order.iter().map(|&i| exported[i]).collect();
    let sorted_rows = order
        .iter()
        .flat_map(|&i| values[i * dim..(i + 1) * dim].to_vec())
        .collect();
    // Which of the rows tied at the boundary stay is the storage's choice.
    assert_eq!(table.restrict(size / 2, 0).unwrap(), size - size / 2);
    assert_eq!(table.size().unwrap(), size / 2);
    scores.push(size as u64);
    (sorted_keys, sorted_rows, scores)
}

/// One description builds a local table and opens a Redis one (the
/// capacity hint, a local table's, is accepted by both), and code generic
/// over [`EmbeddingTable`] sees the same table through either.
#[test]
fn one_description_builds_a_local_table_or_opens_a_redis_one_and_the_trait_runs_on_both() {
    let Some(server) = Server::start() else {
        return;
    };
    let description = Variable::<i64>::builder("described")
        .dim(3)
        .initializer(Initializer::Constant(0.25))
        .restrict_policy(RestrictPolicy::Frequency)
        .init_size(1000);
    let local = description.clone().build().unwrap();
    let remote = RedisVariable::open(description, server.config()).unwrap();
    assert_eq!(remote.name(), local.name());
    assert_eq!(remote.dim(), local.dim());
    assert_eq!(remote.initializer(), local.initializer());
    assert_eq!(remote.restrict_policy(), local.restrict_policy());
    assert_eq!(through_the_trait(&remote), through_the_trait(&local));
    remote.destroy().unwrap();
}

/// `memory_bytes` is what the servers hold for the table: it grows by at
/// least the rows' bytes as rows arrive, and falls back when they go.
#[test]
fn memory_bytes_grows_with_the_rows_on_the_servers() {
    let Some(server) = Server::start() else {
        return;
    };
    let dim = 16;
    let var =
        RedisVariable::open(Variable::<i64>::builder("memory").dim(dim), server.config()).unwrap();
    let empty = EmbeddingTable::memory_bytes(&var).unwrap();
    let mut last = empty;
    for round in 1..=3_i64 {
        let keys: Vec<i64> = ((round - 1) * 2000..round * 2000).collect();
        var.upsert(&keys, &vec![1.0; keys.len() * dim]).unwrap();
        let now = var.memory_bytes().unwrap();
        assert!(
            now >= last + keys.len() * dim * 4,
            "round {round}: {now} bytes after {last}, for {} more rows of {dim} values",
            keys.len()
        );
        last = now;
    }
    var.clear().unwrap();
    let cleared = var.memory_bytes().unwrap();
    assert!(
        cleared < last / 10,
        "{cleared} bytes after clear, {last} before"
    );
    var.destroy().unwrap();
}
