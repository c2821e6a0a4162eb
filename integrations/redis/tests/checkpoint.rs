//! Checkpoints move a model between local tables and Redis: local →
//! Redis → local through checkpoints in `Variable::save`'s format, with
//! rows, slots and scores intact; `load` keeps what the checkpoint lacks;
//! a checkpoint that does not fit changes nothing.

use dynemb::{Error, Initializer, RestrictPolicy, Variable};
use dynemb_optim::{ParamsAdam, SparseAdam, SparseOptimizer};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::{Cluster, Server};

const DIM: usize = 6;

/// Everything a table holds for `keys`: rows, each slot's rows, scores.
type Contents = (Vec<f32>, Vec<Vec<f32>>, Vec<u64>);

fn local_contents(v: &Variable<i64>, keys: &[i64]) -> Contents {
    let mut rows = vec![0.0; keys.len() * DIM];
    v.lookup(keys, &mut rows).unwrap();
    let slots = v
        .slot_names()
        .iter()
        .map(|name| {
            let mut out = vec![0.0; keys.len() * DIM];
            v.lookup_slot(v.slot_id(name).unwrap(), keys, &mut out)
                .unwrap();
            out
        })
        .collect();
    let mut scores = vec![0; keys.len()];
    v.lookup_scores(keys, &mut scores).unwrap();
    (rows, slots, scores)
}

fn remote_contents(v: &RedisVariable<i64>, keys: &[i64]) -> Contents {
    let mut rows = vec![0.0; keys.len() * DIM];
    v.lookup(keys, &mut rows).unwrap();
    let slots = v
        .slot_names()
        .unwrap()
        .iter()
        .map(|name| {
            let mut out = vec![0.0; keys.len() * DIM];
            v.lookup_slot(v.slot_id(name).unwrap(), keys, &mut out)
                .unwrap();
            out
        })
        .collect();
    let mut scores = vec![0; keys.len()];
    v.lookup_scores(keys, &mut scores).unwrap();
    (rows, slots, scores)
}

fn local(shards: usize) -> Variable<i64> {
    Variable::<i64>::builder("emb")
        .dim(DIM)
        .shards(shards)
        .initializer(Initializer::RandomNormal {
            mean: 0.0,
            stddev: 0.1,
            seed: 3,
        })
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap()
}

fn remote(config: RedisConfig) -> RedisVariable<i64> {
    RedisVariable::open(
        Variable::<i64>::builder("emb")
            .dim(DIM)
            .initializer(Initializer::RandomNormal {
                mean: 0.0,
                stddev: 0.1,
                seed: 3,
            })
            .restrict_policy(RestrictPolicy::Frequency),
        config,
    )
    .unwrap()
}

#[test]
fn a_model_moves_local_to_redis_and_back() {
    let Some(cluster) = Cluster::start(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let original = local(3);
    let opt = SparseAdam::new(ParamsAdam::default()).unwrap();
    let keys: Vec<i64> = (-300..3000).step_by(3).collect();
    for step in 0..5 {
        let batch: Vec<i64> = keys
            .iter()
            .copied()
            .filter(|k| (k + step) % 4 != 0)
            .collect();
        original
            .lookup_or_insert(&batch, &mut vec![0.0; batch.len() * DIM])
            .unwrap();
        let grads: Vec<f32> = (0..batch.len() * DIM)
            .map(|i| (i % 13) as f32 * 0.1 - 0.6)
            .collect();
        opt.apply(&original, &batch, &grads).unwrap();
    }
    let want = local_contents(&original, &keys);
    original.save(dir.path().join("local")).unwrap();

    let redis = remote(cluster.config());
    redis.restore(dir.path().join("local")).unwrap();
    assert_eq!(redis.size().unwrap(), original.size());
    assert_eq!(redis.slot_names().unwrap(), original.slot_names());
    assert_eq!(remote_contents(&redis, &keys), want, "restored into Redis");

    redis.save(dir.path().join("redis")).unwrap();
    let back = local(1);
    back.restore(dir.path().join("redis")).unwrap();
    assert_eq!(back.size(), original.size());
    assert_eq!(
        local_contents(&back, &keys),
        want,
        "back in a local variable"
    );

    // Restoring replaces: a key only Redis had is gone afterwards.
    redis.upsert(&[77_777], &[1.0; DIM]).unwrap();
    redis.restore(dir.path().join("local")).unwrap();
    assert_eq!(redis.size().unwrap(), original.size());
}

#[test]
fn load_keeps_what_the_checkpoint_lacks_and_misfits_change_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let saved = local(2);
    saved.upsert(&[1, 2], &[1.0; 2 * DIM]).unwrap();
    saved.create_slot("m", 0.0).unwrap();
    saved.save(dir.path().join("c")).unwrap();

    let redis = remote(server.config());
    redis.upsert(&[2, 3], &[5.0; 2 * DIM]).unwrap();
    let acc = redis.create_slot("acc", 0.1).unwrap();
    redis
        .update_rows(&[2], &[acc], |_, _, slot| slot.fill(7.0))
        .unwrap();
    redis.load(dir.path().join("c")).unwrap();
    let mut rows = vec![0.0; 3 * DIM];
    redis.lookup(&[1, 2, 3], &mut rows).unwrap();
    assert_eq!(rows[..2 * DIM], [1.0; 2 * DIM], "loaded rows");
    assert_eq!(
        rows[2 * DIM..],
        [5.0; DIM],
        "a key the checkpoint lacks keeps its row"
    );
    let mut slot = vec![0.0; 2 * DIM];
    redis.lookup_slot(acc, &[1, 2], &mut slot).unwrap();
    assert_eq!(
        slot[..DIM],
        [0.1; DIM],
        "a new row's missing slot starts at its initial"
    );
    assert_eq!(
        slot[DIM..],
        [7.0; DIM],
        "a present row keeps a slot the checkpoint lacks"
    );
    assert_eq!(redis.slot_names().unwrap(), ["acc", "m"]);

    // Misfits: another dim, another slot initial value, another policy.
    let before = remote_contents(&redis, &[1, 2, 3]);
    let other_dim = RedisVariable::open(
        Variable::<i64>::builder("other_dim").dim(DIM + 1),
        server.config(),
    )
    .unwrap();
    let err = other_dim.restore(dir.path().join("c")).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    let other_slot = RedisVariable::open(
        Variable::<i64>::builder("other_slot")
            .dim(DIM)
            .restrict_policy(RestrictPolicy::Frequency),
        server.config(),
    )
    .unwrap();
    other_slot.upsert(&[9], &[9.0; DIM]).unwrap();
    other_slot.create_slot("m", 0.5).unwrap();
    let err = other_slot.restore(dir.path().join("c")).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    assert_eq!(other_slot.size().unwrap(), 1, "nothing changed");
    let timestamps = RedisVariable::open(
        Variable::<i64>::builder("timestamps")
            .dim(DIM)
            .restrict_policy(RestrictPolicy::Timestamp),
        server.config(),
    )
    .unwrap();
    let err = timestamps.load(dir.path().join("c")).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    assert_eq!(remote_contents(&redis, &[1, 2, 3]), before);
}

/// Frequency counts saturate at `u64::MAX` on Redis as they do locally,
/// through every write path (the module and the scripts): a restored
/// count at the top stays there, and the hottest row never wraps to the
/// coldest.
#[test]
fn frequency_counts_saturate_as_locally() {
    use dynemb::checkpoint::{save_rows, Rows, TableInfo};
    use dynemb_test_support::servers::{unique_name, Form};
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let info = |scores| TableInfo {
        name: "emb".into(),
        dim: DIM,
        slots: vec![],
        scores,
        shards: 1,
        value_dtype: dynemb::Dtype::F32,
        slot_dtype: dynemb::Dtype::F32,
    };
    let counted = Rows::<i64> {
        keys: vec![1, 2, 3],
        values: vec![0.5; 3 * DIM],
        slots: vec![],
        scores: Some(vec![u64::MAX, u64::MAX - 1, 5]),
    };
    let plain = Rows::<i64> {
        scores: None,
        ..counted.clone()
    };
    save_rows(
        dir.path().join("counted"),
        &info(Some(RestrictPolicy::Frequency)),
        [Ok(counted)],
    )
    .unwrap();
    save_rows(dir.path().join("plain"), &info(None), [Ok(plain)]).unwrap();
    let opt = SparseAdam::new(ParamsAdam::default()).unwrap();
    for form in Form::available() {
        let name = unique_name("saturate");
        let builder = || {
            Variable::<i64>::builder(name.as_str())
                .dim(DIM)
                .restrict_policy(RestrictPolicy::Frequency)
        };
        let near = builder().build().unwrap();
        let far = RedisVariable::open(builder(), form.config(server.config())).unwrap();
        let scores = |near: &Variable<i64>, far: &RedisVariable<i64>| {
            let (mut a, mut b) = ([0; 3], [0; 3]);
            near.lookup_scores(&[1, 2, 3], &mut a).unwrap();
            far.lookup_scores(&[1, 2, 3], &mut b).unwrap();
            assert_eq!(a, b, "{form:?}: local and Redis scores");
            a
        };
        near.restore(dir.path().join("counted")).unwrap();
        far.restore(dir.path().join("counted")).unwrap();
        near.upsert(&[1, 2, 2, 3], &[0.0; 4 * DIM]).unwrap();
        far.upsert(&[1, 2, 2, 3], &[0.0; 4 * DIM]).unwrap();
        assert_eq!(scores(&near, &far), [u64::MAX, u64::MAX, 6]);
        near.accum(&[1, 3], &[1.0; 2 * DIM], &[true; 2]).unwrap();
        far.accum(&[1, 3], &[1.0; 2 * DIM], &[true; 2]).unwrap();
        assert_eq!(scores(&near, &far), [u64::MAX, u64::MAX, 7]);
        let grads = [0.1; 3 * DIM];
        opt.apply(&near, &[1, 2, 3], &grads).unwrap();
        opt.apply(&far, &[1, 2, 3], &grads).unwrap();
        assert_eq!(scores(&near, &far), [u64::MAX, u64::MAX, 8]);
        // A checkpoint without scores counts its rows as writes.
        near.load(dir.path().join("plain")).unwrap();
        far.load(dir.path().join("plain")).unwrap();
        assert_eq!(scores(&near, &far), [u64::MAX, u64::MAX, 9]);
        far.destroy().unwrap();
    }
}

/// A timestamp ahead of this machine's clock (accepted: within a day) is
/// restored into Redis as the current time, as into a local table.
#[test]
fn stamps_ahead_of_the_clock_are_restored_as_now() {
    use dynemb::checkpoint::{save_rows, Rows, TableInfo};
    use dynemb_test_support::servers::unique_name;
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let now = dynemb::restrict::next_timestamp();
    let ahead = now + 2 * 3_600_000_000_000;
    let info = TableInfo {
        name: "emb".into(),
        dim: DIM,
        slots: vec![],
        scores: Some(RestrictPolicy::Timestamp),
        shards: 1,
        value_dtype: dynemb::Dtype::F32,
        slot_dtype: dynemb::Dtype::F32,
    };
    let rows = Rows::<i64> {
        keys: vec![1, 2],
        values: vec![0.5; 2 * DIM],
        slots: vec![],
        scores: Some(vec![now - 1, ahead]),
    };
    save_rows(dir.path(), &info, [Ok(rows)]).unwrap();
    let redis = RedisVariable::open(
        Variable::<i64>::builder(unique_name("ahead").as_str())
            .dim(DIM)
            .restrict_policy(RestrictPolicy::Timestamp),
        server.config(),
    )
    .unwrap();
    redis.restore(dir.path()).unwrap();
    let mut scores = [0; 2];
    redis.lookup_scores(&[1, 2], &mut scores).unwrap();
    assert_eq!(scores[0], now - 1, "a past stamp is kept");
    assert!(scores[1] > now && scores[1] < ahead, "{scores:?}");
    redis.destroy().unwrap();
}
