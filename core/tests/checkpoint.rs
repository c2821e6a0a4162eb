//! Checkpoints: round trips, restore vs load, re-partitioning, saving while
//! training, and every kind of bad checkpoint.

use dynemb::{Error, Key, RestrictPolicy, Variable};
use std::collections::HashMap;
use std::path::Path;

/// `n` keys spread over the key type's range, with negative ones for signed
/// types.
fn spread_keys<K: Key>(n: usize) -> Vec<K> {
    (0..n as u64)
        .map(|i| K::from_bits(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect()
}

/// Row of `key`: distinct per key and column.
fn row_of(bits: u64, dim: usize) -> Vec<f32> {
    (0..dim)
        .map(|c| ((bits % 10_007) as f32) + c as f32 * 0.25)
        .collect()
}

fn filled<K: Key>(name: &str, dim: usize, shards: usize, keys: &[K]) -> Variable<K> {
    let var = Variable::<K>::builder(name)
        .dim(dim)
        .shards(shards)
        .build()
        .unwrap();
    let values: Vec<f32> = keys.iter().flat_map(|k| row_of(k.to_bits(), dim)).collect();
    var.upsert(keys, &values).unwrap();
    var
}

/// A checkpoint's `index.json`, parsed.
fn read_index(ckpt: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(ckpt.join("index.json")).unwrap()).unwrap()
}

/// The variable's contents as a map.
fn contents<K: Key>(var: &Variable<K>) -> HashMap<K, Vec<f32>> {
    let (keys, values) = var.export().unwrap();
    let dim = var.dim();
    keys.into_iter()
        .zip(values.chunks(dim).map(<[f32]>::to_vec))
        .collect()
}

fn round_trip<K: Key>() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let mut keys: Vec<K> = spread_keys(5_000);
    keys.push(K::from_bits(0));
    keys.push(K::from_bits(u64::MAX));
    let var = filled("emb", 3, 2, &keys);
    var.save(&path).unwrap();
    let back = Variable::<K>::builder("emb")
        .dim(3)
        .shards(2)
        .build()
        .unwrap();
    back.restore(&path).unwrap();
    assert_eq!(back.size(), var.size());
    assert_eq!(contents(&back), contents(&var), "{}", K::TYPE_NAME);
}

#[test]
fn every_key_type_round_trips_exactly() {
    round_trip::<i64>();
    round_trip::<u64>();
    round_trip::<i32>();
    round_trip::<u32>();
}

#[test]
fn checkpoint_is_index_json_plus_safetensors_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let var = filled::<i64>("tower/emb", 4, 3, &spread_keys(1_000));
    var.save(&path).unwrap();
    let index: serde_json::Value = read_index(&path);
    assert_eq!(index["format"], "dynemb-checkpoint");
    assert_eq!(index["version"], 1);
    assert_eq!(index["name"], "tower/emb");
    assert_eq!(index["key_type"], "i64");
    assert_eq!(index["dim"], 4);
    assert_eq!(index["shards"], 3);
    assert_eq!(index["rows"], 1_000);
    let files = index["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "one file per non-empty shard at this size");
    for file in files {
        let name = file["file"].as_str().unwrap();
        assert!(name.ends_with(".safetensors"));
        let bytes = std::fs::read(path.join(name)).unwrap();
        assert_eq!(bytes.len() as u64, file["bytes"].as_u64().unwrap());
    }
    let mut leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    leftovers.sort();
    assert_eq!(
        leftovers,
        vec![".ckpt.dynemb-lock", ".ckpt.dynemb-queue", "ckpt"],
        "the lock files stay; no staging directory is left behind"
    );
}

#[test]
fn large_variables_are_split_into_bounded_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let var = filled::<u64>("big", 64, 1, &spread_keys(150_000));
    var.save(&path).unwrap();
    let index: serde_json::Value = read_index(&path);
    let per_file = index["rows_per_file"].as_u64().unwrap();
    let files = index["files"].as_array().unwrap();
    assert!(
        files.len() >= 3,
        "150k rows of 64 floats span several files"
    );
    assert!(files
        .iter()
        .all(|f| f["rows"].as_u64().unwrap() <= per_file));
    let back = Variable::<u64>::builder("big").dim(64).build().unwrap();
    back.restore(&path).unwrap();
    assert_eq!(contents(&back), contents(&var));
}

#[test]
fn saving_again_replaces_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let var = filled::<i64>("emb", 2, 1, &spread_keys(100));
    var.save(&path).unwrap();
    var.remove(&spread_keys::<i64>(50)).unwrap();
    var.save(&path).unwrap();
    let back = Variable::<i64>::builder("emb").dim(2).build().unwrap();
    back.restore(&path).unwrap();
    assert_eq!(back.size(), 50);
    assert_eq!(contents(&back), contents(&var));
}

#[test]
fn empty_variable_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let var = Variable::<i64>::builder("emb").dim(2).build().unwrap();
    var.save(&path).unwrap();
    let back = filled::<i64>("emb", 2, 1, &spread_keys(10));
    back.restore(&path).unwrap();
    assert_eq!(back.size(), 0);
}

#[test]
fn restore_replaces_and_load_upserts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt");
    let saved = filled::<i64>("emb", 2, 2, &[1, 2, 3]);
    saved.save(&path).unwrap();

    let other = Variable::<i64>::builder("emb")
        .dim(2)
        .shards(2)
        .build()
        .unwrap();
    other.upsert(&[3, 4], &[9.0, 9.0, 4.0, 4.0]).unwrap();
    other.load(&path).unwrap();
    let mut expected = contents(&saved);
    expected.insert(4, vec![4.0, 4.0]);
    assert_eq!(contents(&other), expected, "load keeps key 4, overwrites 3");

    other.restore(&path).unwrap();
    assert_eq!(contents(&other), contents(&saved), "restore drops key 4");
}

#[test]
fn checkpoints_repartition_from_two_to_three_to_one_shard() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<i64> = spread_keys(3_000);
    let two = filled("emb", 5, 2, &keys);
    two.save(dir.path().join("two")).unwrap();

    let three = Variable::<i64>::builder("emb")
        .dim(5)
        .shards(3)
        .build()
        .unwrap();
    three.restore(dir.path().join("two")).unwrap();
    assert_eq!(contents(&three), contents(&two));
    for shard in 0..3 {
        let expected = keys.iter().filter(|k| k.rem_euclid(3) == shard).count();
        assert_eq!(three.shard_size(shard as usize).unwrap(), expected);
    }
    three.save(dir.path().join("three")).unwrap();

    let one = Variable::<i64>::builder("emb").dim(5).build().unwrap();
    one.restore(dir.path().join("three")).unwrap();
    assert_eq!(one.size(), keys.len());
    assert_eq!(contents(&one), contents(&two));
}

/// A variable, a checkpoint of it in `dir/ckpt`, and a copy of its contents.
fn saved_fixture(dir: &Path) -> (Variable<i64>, HashMap<i64, Vec<f32>>) {
    let var = filled::<i64>("emb", 4, 2, &spread_keys(2_000));
    var.save(dir.join("ckpt")).unwrap();
    let before = contents(&var);
    (var, before)
}

/// Asserts that restoring and loading `dir` fail and leave `var` as it was.
fn assert_rejected(var: &Variable<i64>, before: &HashMap<i64, Vec<f32>>, dir: &Path) -> Error {
    let err = var.restore(dir).unwrap_err();
    assert_eq!(
        &contents(var),
        before,
        "restore left the variable as it was"
    );
    let again = var.load(dir).unwrap_err();
    assert_eq!(&contents(var), before, "load left the variable as it was");
    assert_eq!(err, again);
    err
}

/// Path of the first data file of a checkpoint.
fn first_data_file(ckpt: &Path) -> std::path::PathBuf {
    let index: serde_json::Value = read_index(ckpt);
    ckpt.join(index["files"][0]["file"].as_str().unwrap())
}

#[test]
fn missing_checkpoint_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (var, before) = saved_fixture(dir.path());
    let err = assert_rejected(&var, &before, &dir.path().join("nothing-here"));
    assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
    assert!(err.to_string().contains("index.json is missing"), "{err}");
}

#[test]
fn truncated_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (var, before) = saved_fixture(dir.path());
    let file = first_data_file(&dir.path().join("ckpt"));
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let err = assert_rejected(&var, &before, &dir.path().join("ckpt"));
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn flipped_byte_fails_the_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let (var, before) = saved_fixture(dir.path());
    let file = first_data_file(&dir.path().join("ckpt"));
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let err = assert_rejected(&var, &before, &dir.path().join("ckpt"));
    assert!(err.to_string().contains("checksum"), "{err}");
}

#[test]
fn missing_data_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (var, before) = saved_fixture(dir.path());
    std::fs::remove_file(first_data_file(&dir.path().join("ckpt"))).unwrap();
    let err = assert_rejected(&var, &before, &dir.path().join("ckpt"));
    assert!(
        matches!(
            err,
            Error::Io {
                kind: std::io::ErrorKind::NotFound,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn garbled_index_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (var, before) = saved_fixture(dir.path());
    let ckpt = dir.path().join("ckpt");
    std::fs::write(
        ckpt.join("index.json"),
        b"{\"format\": \"dynemb-checkpoint\"",
    )
    .unwrap();
    let err = assert_rejected(&var, &before, &ckpt);
    assert!(err.to_string().contains("unreadable index.json"), "{err}");

    std::fs::write(ckpt.join("index.json"), b"{}").unwrap();
    let err = assert_rejected(&var, &before, &ckpt);
    assert!(err.to_string().contains("missing field"), "{err}");
}

#[test]
fn future_format_version_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (var, before) = saved_fixture(dir.path());
    let ckpt = dir.path().join("ckpt");
    let mut index: serde_json::Value = read_index(&ckpt);
    index["version"] = 99.into();
    std::fs::write(ckpt.join("index.json"), index.to_string()).unwrap();
    let err = assert_rejected(&var, &before, &ckpt);
    assert!(err.to_string().contains("format version 99"), "{err}");
}

#[test]
fn wrong_dim_or_key_type_is_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _) = saved_fixture(dir.path());
    let ckpt = dir.path().join("ckpt");

    let wide = Variable::<i64>::builder("emb").dim(5).build().unwrap();
    let err = wide.restore(&ckpt).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    assert!(
        err.to_string().contains("dim 4") && err.to_string().contains("dim 5"),
        "{err}"
    );

    let unsigned = Variable::<u64>::builder("emb").dim(4).build().unwrap();
    unsigned.upsert(&[7], &[1.0; 4]).unwrap();
    let err = unsigned.load(&ckpt).unwrap_err();
    assert!(
        err.to_string().contains("key type i64") && err.to_string().contains("key type u64"),
        "{err}"
    );
    assert_eq!(unsigned.size(), 1);
}

#[test]
fn non_finite_values_in_a_file_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let var = filled::<i64>("emb", 2, 1, &[1, 2]);
    var.save(&ckpt).unwrap();
    // Rewrite the data file with a NaN and fix up its size and checksum, as
    // a buggy external writer might.
    let file = first_data_file(&ckpt);
    let mut bytes = std::fs::read(&file).unwrap();
    let nan = f32::NAN.to_le_bytes();
    let at = bytes.len() - 4;
    bytes[at..].copy_from_slice(&nan);
    std::fs::write(&file, &bytes).unwrap();
    let mut index: serde_json::Value = read_index(&ckpt);
    index["files"][0]["crc32"] = crc32(&bytes).into();
    std::fs::write(ckpt.join("index.json"), index.to_string()).unwrap();
    let before = contents(&var);
    let err = assert_rejected(&var, &before, &ckpt);
    assert!(err.to_string().contains("not finite"), "{err}");
}

/// CRC-32 (IEEE), bit by bit: an independent check of the writer's.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn saving_while_training_writes_consistent_rows() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let dim = 16;
    let stable: Vec<i64> = (0..20_000).collect();
    let var = Variable::<i64>::builder("emb")
        .dim(dim)
        .shards(2)
        .build()
        .unwrap();
    var.upsert(&stable, &vec![0.0; stable.len() * dim]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Every write makes all of a row's values equal.
            let mut round = 1.0f32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                var.upsert(&stable, &vec![round; stable.len() * dim])
                    .unwrap();
                let fresh: Vec<i64> = (0..1_000)
                    .map(|i| 1_000_000 + i + round as i64 * 1_000)
                    .collect();
                var.upsert(&fresh, &vec![round; fresh.len() * dim]).unwrap();
                var.remove(&fresh[..500]).unwrap();
                round += 1.0;
            }
        });
        for _ in 0..5 {
            var.save(&ckpt).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let back = Variable::<i64>::builder("emb").dim(dim).build().unwrap();
    back.restore(&ckpt).unwrap();
    let rows = contents(&back);
    for key in &stable {
        assert!(
            rows.contains_key(key),
            "key {key} present throughout was saved"
        );
    }
    for (key, row) in rows {
        assert!(
            row.iter().all(|&v| v == row[0]),
            "row of {key} is torn: {row:?}"
        );
    }
}

#[test]
fn registry_saves_and_restores_every_checkpointed_variable() {
    use dynemb::Registry;
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new();
    let tower = registry.scope("tower");
    let user = tower
        .get_variable(Variable::<i64>::builder("user").dim(3).shards(2))
        .unwrap();
    let item = tower
        .get_variable(Variable::<u32>::builder("item").dim(2))
        .unwrap();
    let scratch = registry
        .get_variable(Variable::<i64>::builder("scratch").dim(2).checkpoint(false))
        .unwrap();
    user.upsert(&[1, -2], &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
        .unwrap();
    item.upsert(&[7], &[7.0, 7.0]).unwrap();
    scratch.upsert(&[5], &[5.0, 5.0]).unwrap();
    registry.save_all(dir.path()).unwrap();
    assert!(dir.path().join("tower/user/index.json").exists());
    assert!(dir.path().join("tower/item/index.json").exists());
    assert!(
        !dir.path().join("scratch").exists(),
        "checkpoint(false) is skipped"
    );
    let (saved_user, saved_item) = (contents(&user), contents(&item));

    // Train on: change everything, then restore the whole model.
    user.upsert(&[1, 3], &[9.0; 6]).unwrap();
    item.remove(&[7]).unwrap();
    scratch.upsert(&[6], &[6.0, 6.0]).unwrap();
    registry.restore_all(dir.path()).unwrap();
    assert_eq!(contents(&user), saved_user);
    assert_eq!(contents(&item), saved_item);
    assert_eq!(
        scratch.size(),
        2,
        "checkpoint(false) variables keep their rows"
    );

    // A registry with a variable that has no checkpoint: nothing changes.
    let extra = tower
        .get_variable(Variable::<i64>::builder("extra").dim(2))
        .unwrap();
    user.upsert(&[42], &[4.0; 3]).unwrap();
    let before = contents(&user);
    let err = registry.restore_all(dir.path()).unwrap_err();
    assert!(err.to_string().contains("index.json is missing"), "{err}");
    assert_eq!(contents(&user), before, "no variable was touched");
    assert_eq!(extra.size(), 0);
}

#[test]
fn names_that_would_leave_the_directory_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dynemb::Registry::new();
    registry
        .scope("up")
        .get_variable(Variable::<i64>::builder("..").dim(1))
        .unwrap();
    let err = registry.save_all(dir.path().join("model")).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(!dir.path().join("model").exists());
}

/// A frequency-scored variable with two slots (`m` from 0.0, `acc` from
/// 0.1) whose keys were updated 1..=4 times each, with distinct rows.
fn trained(name: &str, shards: usize, keys: &[i64]) -> Variable<i64> {
    let var = Variable::<i64>::builder(name)
        .dim(3)
        .shards(shards)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let m = var.create_slot("m", 0.0).unwrap();
    let acc = var.create_slot("acc", 0.1).unwrap();
    for step in 0..4 {
        let batch: Vec<i64> = keys
            .iter()
            .copied()
            .filter(|k| k.rem_euclid(4) >= step)
            .collect();
        var.update_rows(&batch, &[m, acc], |i, values, slots| {
            let bump = (batch[i] % 1000) as f32 + step as f32;
            values.iter_mut().for_each(|v| *v += bump);
            slots[..3].iter_mut().for_each(|s| *s -= bump);
            slots[3..].iter_mut().for_each(|s| *s += 0.5 * bump);
        })
        .unwrap();
    }
    var
}

/// Every slot row and score of `keys`, by key.
fn slots_and_scores(var: &Variable<i64>, keys: &[i64]) -> (Vec<Vec<f32>>, Vec<u64>) {
    let slots = var
        .slot_names()
        .iter()
        .map(|name| {
            let mut out = vec![0.0; keys.len() * var.dim()];
            var.lookup_slot(var.slot_id(name).unwrap(), keys, &mut out)
                .unwrap();
            out
        })
        .collect();
    let mut scores = vec![0; keys.len()];
    var.lookup_scores(keys, &mut scores).unwrap();
    (slots, scores)
}

#[test]
fn slots_and_scores_round_trip_with_repartitioning() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let keys: Vec<i64> = spread_keys(3_000);
    let var = trained("emb", 2, &keys);
    let (slots, scores) = slots_and_scores(&var, &keys);
    assert!(
        scores.iter().all(|&s| (1..=4).contains(&s)),
        "1 to 4 updates each"
    );
    var.save(&ckpt).unwrap();

    let index = read_index(&ckpt);
    assert_eq!(
        index["slots"],
        serde_json::json!([{"name": "m", "initial": 0.0}, {"name": "acc", "initial": 0.1}])
    );
    assert_eq!(index["scores"], "frequency");
    let bytes = std::fs::read(first_data_file(&ckpt)).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = file.names();
    names.sort();
    assert_eq!(names, ["keys", "scores", "slot.acc", "slot.m", "values"]);
    assert_eq!(
        file.tensor("scores").unwrap().dtype(),
        safetensors::Dtype::U64
    );

    // A variable with no slots yet, and another shard count: the slots are
    // created with their initial values, rows, slots and scores come back.
    let back = Variable::<i64>::builder("emb")
        .dim(3)
        .shards(3)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    back.restore(&ckpt).unwrap();
    assert_eq!(back.slot_names(), ["m", "acc"]);
    assert_eq!(back.slot_initial(back.slot_id("acc").unwrap()), Ok(0.1));
    assert_eq!(contents(&back), contents(&var));
    assert_eq!(
        slots_and_scores(&back, &keys),
        (slots.clone(), scores.clone())
    );

    // Back to one shard, through load into an empty variable.
    let one = Variable::<i64>::builder("emb")
        .dim(3)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    one.load(&ckpt).unwrap();
    assert_eq!(contents(&one), contents(&var));
    assert_eq!(slots_and_scores(&one, &keys), (slots, scores));
}

#[test]
fn timestamps_round_trip_and_later_writes_are_newer() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let var = Variable::<u64>::builder("emb")
        .dim(2)
        .restrict_policy(RestrictPolicy::Timestamp)
        .build()
        .unwrap();
    for k in 0..50u64 {
        var.upsert(&[k], &[k as f32; 2]).unwrap();
    }
    let keys: Vec<u64> = (0..50).collect();
    let mut stamps = vec![0; 50];
    var.lookup_scores(&keys, &mut stamps).unwrap();
    assert!(
        stamps.windows(2).all(|w| w[0] < w[1]),
        "one stamp per batch, increasing"
    );
    var.save(&ckpt).unwrap();
    assert_eq!(read_index(&ckpt)["scores"], "timestamp");

    let back = Variable::<u64>::builder("emb")
        .dim(2)
        .restrict_policy(RestrictPolicy::Timestamp)
        .build()
        .unwrap();
    back.restore(&ckpt).unwrap();
    let mut restored = vec![0; 50];
    back.lookup_scores(&keys, &mut restored).unwrap();
    assert_eq!(restored, stamps);
    back.upsert(&[7], &[0.0; 2]).unwrap();
    let mut newest = [0];
    back.lookup_scores(&[7], &mut newest).unwrap();
    assert!(newest[0] > stamps[49]);
}

#[test]
fn scores_follow_the_restoring_variables_policy() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let keys: Vec<i64> = (0..40).collect();
    trained("emb", 1, &keys).save(&ckpt).unwrap();

    // No policy: the scores are ignored, the rows and slots restored.
    let plain = Variable::<i64>::builder("emb").dim(3).build().unwrap();
    plain.restore(&ckpt).unwrap();
    assert_eq!(plain.size(), 40);
    assert_eq!(plain.slot_names(), ["m", "acc"]);
    let mut scores = vec![9; 40];
    plain.lookup_scores(&keys, &mut scores).unwrap();
    assert!(scores.iter().all(|&s| s == 0));

    // Another policy: a mismatch, and nothing changes.
    let stamped_policy = Variable::<i64>::builder("emb")
        .dim(3)
        .restrict_policy(RestrictPolicy::Timestamp)
        .build()
        .unwrap();
    stamped_policy.upsert(&[1000], &[1.0; 3]).unwrap();
    let before = contents(&stamped_policy);
    let err = stamped_policy.restore(&ckpt).unwrap_err();
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    assert!(err.to_string().contains("frequency"), "{err}");
    assert_eq!(contents(&stamped_policy), before);
    assert!(
        stamped_policy.slot_names().is_empty(),
        "no slot was created"
    );

    // A checkpoint without scores into a scored variable: each restored row
    // is scored as a write.
    let unscored = dir.path().join("unscored");
    filled::<i64>("emb", 3, 1, &keys).save(&unscored).unwrap();
    let counted = Variable::<i64>::builder("emb")
        .dim(3)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    counted.restore(&unscored).unwrap();
    counted.lookup_scores(&keys, &mut scores).unwrap();
    assert!(scores.iter().all(|&s| s == 1));
}

#[test]
fn slots_missing_from_the_checkpoint_start_over_or_stay() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    filled::<i64>("emb", 2, 1, &[1, 2]).save(&ckpt).unwrap();
    let var = Variable::<i64>::builder("emb").dim(2).build().unwrap();
    let v = var.create_slot("v", 0.5).unwrap();
    var.update_rows(&[2, 3], &[v], |_, _, slot| slot.fill(4.0))
        .unwrap();
    // load: key 2 keeps its slot row, key 1 is new and starts at 0.5.
    var.load(&ckpt).unwrap();
    let mut out = vec![0.0; 6];
    var.lookup_slot(v, &[1, 2, 3], &mut out).unwrap();
    assert_eq!(out, [0.5, 0.5, 4.0, 4.0, 4.0, 4.0]);
    // restore: every row is new, so every slot row starts over.
    var.restore(&ckpt).unwrap();
    var.lookup_slot(v, &[1, 2, 3], &mut out).unwrap();
    assert_eq!(out, [0.5; 6]);
    assert_eq!(var.size(), 2);
}

#[test]
fn a_slot_with_another_initial_value_is_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    trained("emb", 1, &[1, 2, 3]).save(&ckpt).unwrap();
    let var = filled::<i64>("emb", 3, 1, &[5]);
    var.create_slot("acc", 0.0).unwrap();
    let before = contents(&var);
    let err = assert_rejected(&var, &before, &ckpt);
    assert!(matches!(err, Error::Mismatch { .. }), "{err}");
    assert_eq!(var.slot_names(), ["acc"], "no slot was created");
}

/// A data file's tensor: name, dtype, shape and bytes.
type Tensor = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);
/// A data file's tensors.
type Tensors = Vec<Tensor>;
/// A change to a data file's tensors.
type Edit = fn(&mut Tensors);

/// The tensor called `name`.
fn tensor<'a>(
    tensors: &'a mut Tensors,
    name: &str,
) -> &'a mut (String, safetensors::Dtype, Vec<usize>, Vec<u8>) {
    tensors.iter_mut().find(|t| t.0 == name).unwrap()
}

/// Rewrites the first data file with its tensors changed by `edit`, and
/// fixes the index's size and checksum for it.
fn rewrite_file(ckpt: &Path, edit: Edit) {
    let path = first_data_file(ckpt);
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Tensors = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
        })
        .collect();
    edit(&mut tensors);
    let views: Vec<_> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let mut index = read_index(ckpt);
    index["files"][0]["bytes"] = bytes.len().into();
    index["files"][0]["crc32"] = crc32(&bytes).into();
    std::fs::write(ckpt.join("index.json"), index.to_string()).unwrap();
}

#[test]
fn bad_slot_and_score_tensors_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Edit); 4] = [
        ("not finite", |t| {
            tensor(t, "slot.m").3[..4].copy_from_slice(&f32::INFINITY.to_le_bytes());
        }),
        ("no \"slot.acc\" tensor", |t| {
            t.retain(|t| t.0 != "slot.acc")
        }),
        ("tensor \"scores\"", |t| {
            tensor(t, "scores").1 = safetensors::Dtype::I64
        }),
        ("6 tensors, expected 5", |t| {
            let mut extra = tensor(t, "slot.m").clone();
            extra.0 = "slot.extra".to_string();
            t.push(extra);
        }),
    ];
    for (i, (expected, edit)) in cases.into_iter().enumerate() {
        let ckpt = dir.path().join(format!("ckpt{i}"));
        trained("emb", 1, &spread_keys(100)).save(&ckpt).unwrap();
        rewrite_file(&ckpt, edit);
        let var = trained("emb", 1, &[1, 2]);
        let before = contents(&var);
        let slot_before = slots_and_scores(&var, &[1, 2]);
        let err = assert_rejected(&var, &before, &ckpt);
        assert!(err.to_string().contains(expected), "{expected}: {err}");
        assert_eq!(slots_and_scores(&var, &[1, 2]), slot_before);
    }
}

#[test]
fn bad_slot_and_score_entries_in_the_index_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    trained("emb", 1, &[1, 2, 3]).save(&ckpt).unwrap();
    let good = read_index(&ckpt);
    let var = trained("emb", 1, &[7]);
    let before = contents(&var);
    for (edit, expected) in [
        (
            serde_json::json!({"scores": "lru"}),
            "unknown restrict policy",
        ),
        (
            serde_json::json!({"slots": [{"name": "m", "initial": 0.0}, {"name": "m", "initial": 0.0}]}),
            "repeated",
        ),
        (
            serde_json::json!({"slots": [{"name": "", "initial": 0.0}]}),
            "empty",
        ),
        (
            serde_json::json!({"slots": ["m", "acc"]}),
            "unreadable index.json",
        ),
    ] {
        let mut index = good.clone();
        for (field, value) in edit.as_object().unwrap() {
            index[field] = value.clone();
        }
        std::fs::write(ckpt.join("index.json"), index.to_string()).unwrap();
        let err = assert_rejected(&var, &before, &ckpt);
        assert!(err.to_string().contains(expected), "{expected}: {err}");
    }
}

/// A checkpoint written before variables had slots and scores (its index
/// says `"slots": []` and `"scores": false`) still restores; `"scores":
/// true`, which no build ever wrote, is refused.
#[test]
fn checkpoints_from_before_slots_and_scores_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let var = filled::<i64>("emb", 4, 2, &spread_keys(300));
    var.save(&ckpt).unwrap();
    let mut index = read_index(&ckpt);
    index["scores"] = false.into();
    std::fs::write(ckpt.join("index.json"), index.to_string()).unwrap();
    let back = Variable::<i64>::builder("emb").dim(4).build().unwrap();
    back.restore(&ckpt).unwrap();
    assert_eq!(contents(&back), contents(&var));
    index["scores"] = true.into();
    std::fs::write(ckpt.join("index.json"), index.to_string()).unwrap();
    let err = back.restore(&ckpt).unwrap_err();
    assert!(err.to_string().contains("unreadable index.json"), "{err}");
}
