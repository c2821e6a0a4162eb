//! Checkpoints never lose data: restores racing saves, saves racing saves,
//! registry names that nest, custom partitioners that reject saved keys,
//! paths that are files, symlinks or someone else's directory, abandoned
//! staging directories, and checkpoint files whose claims would take
//! unbounded memory or never finish reading.
//!
//! The races are timing-dependent, so those tests run many rounds; every
//! round must pass.

use dynemb::{Error, Partitioner, Registry, RestrictPolicy, Variable};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const DIM: usize = 8;

/// A 4-shard variable holding `keys`, every value `value` (so a restore
/// mixing two checkpoints shows).
fn uniform(name: &str, keys: std::ops::Range<i64>, value: f32) -> Variable<i64> {
    let var = Variable::<i64>::builder(name)
        .dim(DIM)
        .shards(4)
        .build()
        .unwrap();
    let keys: Vec<i64> = keys.collect();
    var.upsert(&keys, &vec![value; keys.len() * DIM]).unwrap();
    var
}

fn contents(var: &Variable<i64>) -> HashMap<i64, Vec<f32>> {
    let (keys, values) = var.export().unwrap();
    keys.into_iter()
        .zip(values.chunks(DIM).map(<[f32]>::to_vec))
        .collect()
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Staging directories left next to checkpoints in `dir`.
fn staging_dirs(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.contains(".dynemb-saving"))
        .collect()
}

/// Runs `restores` restores of `ckpt` into a fresh variable while the
/// `savers` save their variables to it in a loop; every restore must
/// succeed and give exactly one saver's contents.
fn restore_while_saving(ckpt: &Path, savers: Vec<Variable<i64>>, restores: usize) {
    let expected: Vec<HashMap<i64, Vec<f32>>> = savers.iter().map(contents).collect();
    savers[0].save(ckpt).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let saves = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = savers
        .into_iter()
        .map(|var| {
            let (stop, saves, ckpt) = (Arc::clone(&stop), Arc::clone(&saves), ckpt.to_path_buf());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    var.save(&ckpt).unwrap();
                    saves.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let target = uniform("emb", 1_000_000..1_000_010, 7.0);
    for round in 0..restores {
        let before = contents(&target);
        if let Err(e) = target.restore(ckpt) {
            stop.store(true, Ordering::Relaxed);
            assert_eq!(
                contents(&target),
                before,
                "a failed restore changed the variable"
            );
            panic!("round {round}: restore failed while saving: {e}");
        }
        let got = contents(&target);
        assert!(
            expected.contains(&got),
            "round {round}: restored {} rows matching no saved checkpoint",
            got.len()
        );
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    assert!(saves.load(Ordering::Relaxed) > 0);
    let parent = ckpt.parent().unwrap();
    assert_eq!(staging_dirs(parent), Vec::<String>::new());
}

#[test]
fn restores_apply_the_checkpoint_they_verified_while_saves_replace_it() {
    let dir = tempfile::tempdir().unwrap();
    // Two savers with different contents: the directory changes under
    // every restore.
    let savers = vec![
        uniform("emb", 0..3_000, 1.0),
        uniform("emb", 1_000..6_000, 2.0),
    ];
    restore_while_saving(&dir.path().join("ckpt"), savers, 150);
}

#[test]
fn saves_from_several_threads_to_one_directory_each_publish_a_whole_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let a = uniform("emb", 0..2_000, 1.0);
    let b = uniform("emb", 500..4_000, 2.0);
    let c = uniform("emb", -50..50, 3.0);
    let expected = [contents(&a), contents(&b), contents(&c)];
    let handles: Vec<_> = [a, b, c]
        .into_iter()
        .map(|var| {
            let ckpt = ckpt.clone();
            thread::spawn(move || {
                for _ in 0..40 {
                    var.save(&ckpt).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let back = uniform("emb", 0..0, 0.0);
    back.restore(&ckpt).unwrap();
    assert!(expected.contains(&contents(&back)));
    assert_eq!(
        names_in(dir.path()),
        [".ckpt.dynemb-lock", ".ckpt.dynemb-queue", "ckpt"]
    );
}

#[test]
fn save_all_refuses_names_whose_checkpoints_would_nest() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new();
    let inner = registry
        .get_variable(Variable::<i64>::builder("a/b").dim(2))
        .unwrap();
    inner.upsert(&[1, 2], &[0.5; 4]).unwrap();
    registry.save_all(dir.path()).unwrap();
    let saved = dir.path().join("a").join("b");
    assert!(saved.join("index.json").exists());

    registry
        .get_variable(Variable::<i64>::builder("a").dim(2))
        .unwrap();
    let err = registry.save_all(dir.path()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("\"a/b\""), "{err}");
    let err = registry.restore_all(dir.path()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");

    // a/b's checkpoint is untouched and restores.
    let back = Variable::<i64>::builder("a/b").dim(2).build().unwrap();
    back.restore(&saved).unwrap();
    assert_eq!(back.size(), 2);
    assert_eq!(
        names_in(&dir.path().join("a")),
        [".b.dynemb-lock", ".b.dynemb-queue", "b"]
    );
}

#[test]
fn save_all_refuses_names_that_look_like_staging_or_lock_files() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new();
    registry
        .get_variable(Variable::<i64>::builder("x").dim(1))
        .unwrap();
    registry
        .get_variable(Variable::<i64>::builder(".x.dynemb-saving-1-0").dim(1))
        .unwrap();
    let err = registry.save_all(dir.path()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(names_in(dir.path()).is_empty(), "nothing written");

    let var = uniform("emb", 0..3, 1.0);
    let err = var
        .save(dir.path().join(".ckpt.dynemb-saving-1-0"))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[test]
fn save_refuses_to_replace_a_directory_that_is_not_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join("photos")).unwrap();
    std::fs::write(home.join("notes.txt"), "mine").unwrap();
    let var = uniform("emb", 0..3, 1.0);
    let err = var.save(&home).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert_eq!(names_in(&home), ["notes.txt", "photos"]);
    assert_eq!(names_in(dir.path()), ["home"], "nothing beside it either");

    // A checkpoint nesting another variable's checkpoint is not replaced.
    let outer = dir.path().join("outer");
    var.save(outer.join("inner")).unwrap();
    let err = var.save(&outer).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    uniform("emb", 0..0, 0.0)
        .restore(outer.join("inner"))
        .unwrap();

    // An empty directory is fine.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    var.save(&empty).unwrap();
}

#[test]
fn save_to_a_regular_file_is_an_error_that_leaves_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.bin");
    std::fs::write(&file, b"the user's bytes").unwrap();
    let var = uniform("emb", 0..3, 1.0);
    for _ in 0..3 {
        let err = var.save(&file).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("not a directory"), "{err}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"the user's bytes");
    assert_eq!(names_in(dir.path()), ["model.bin"], "nothing hidden moved");
    var.save(dir.path().join("ckpt")).unwrap();
}

#[test]
fn a_symlink_to_a_checkpoint_keeps_pointing_at_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    let link = dir.path().join("latest");
    uniform("emb", 0..5, 1.0).save(&real).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    uniform("emb", 0..9, 2.0).save(&link).unwrap();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let back = uniform("emb", 0..0, 0.0);
    back.restore(&link).unwrap();
    assert_eq!(back.size(), 9);
    back.restore(&real).unwrap();
    assert_eq!(back.size(), 9);
}

#[test]
fn a_restore_whose_partitioner_rejects_a_saved_key_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    uniform("emb", 0..100, 1.0).save(&ckpt).unwrap();
    // Key 77 maps to shard 5 of 2: the partitioner rejects it.
    let picky = Partitioner::Custom(Arc::new(|bits, shards| {
        if bits == 77 {
            5
        } else {
            bits as usize % shards
        }
    }));
    let var = Variable::<i64>::builder("emb")
        .dim(DIM)
        .shards(2)
        .partitioner(picky)
        .build()
        .unwrap();
    var.upsert(&[500, 501], &[9.0; 2 * DIM]).unwrap();
    let before = contents(&var);
    for result in [var.restore(&ckpt), var.load(&ckpt)] {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::UnknownShard { .. }), "{err}");
        assert_eq!(contents(&var), before);
    }
}

#[test]
fn abandoned_staging_directories_are_removed_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let abandoned = dir.path().join(".ckpt.dynemb-saving-4242-0");
    let live = dir.path().join(".ckpt.dynemb-saving-4242-1");
    for d in [&abandoned, &live] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("index.json"), "{}").unwrap();
    }
    // Another saver holds `live` locked, as a save in progress does.
    let holder = std::fs::File::open(&live).unwrap();
    holder.lock().unwrap();
    uniform("emb", 0..5, 1.0).save(&ckpt).unwrap();
    assert!(!abandoned.exists());
    assert!(live.join("index.json").exists());
    drop(holder);
    uniform("emb", 0..5, 1.0).save(&ckpt).unwrap();
    assert_eq!(staging_dirs(dir.path()), Vec::<String>::new());
}

/// Rewrites `index.json` of `ckpt` with `edit`.
fn edit_index(ckpt: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = ckpt.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut index);
    std::fs::write(&path, serde_json::to_vec(&index).unwrap()).unwrap();
}

/// Saves a small checkpoint with timestamp scores into `dir/ckpt`.
fn scored_checkpoint(dir: &Path) -> PathBuf {
    let ckpt = dir.join("ckpt");
    let var = Variable::<i64>::builder("emb")
        .dim(DIM)
        .restrict_policy(RestrictPolicy::Timestamp)
        .build()
        .unwrap();
    var.upsert(&[1, 2, 3], &[1.0; 3 * DIM]).unwrap();
    var.save(&ckpt).unwrap();
    ckpt
}

/// Asserts `restore` and `load` of `ckpt` fail with a checkpoint error
/// containing `why` and leave a scored variable as it was.
fn refused(ckpt: &Path, why: &str) {
    let var = Variable::<i64>::builder("emb")
        .dim(DIM)
        .restrict_policy(RestrictPolicy::Timestamp)
        .build()
        .unwrap();
    var.upsert(&[40], &[4.0; DIM]).unwrap();
    let before = contents(&var);
    for result in [var.restore(ckpt), var.load(ckpt)] {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
        assert!(err.to_string().contains(why), "{err} (expected {why:?})");
        assert_eq!(contents(&var), before);
    }
}

#[test]
fn a_file_size_claim_beyond_what_a_save_writes_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = scored_checkpoint(dir.path());
    edit_index(&ckpt, |index| {
        index["files"][0]["bytes"] = (1_u64 << 40).into()
    });
    refused(&ckpt, "more than");
}

#[test]
fn an_oversized_data_file_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = scored_checkpoint(dir.path());
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("index.json")).unwrap()).unwrap();
    let name = index["files"][0]["file"].as_str().unwrap().to_string();
    // 64 GiB of zeros (sparse): reading it whole would exhaust memory.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(ckpt.join(&name))
        .unwrap();
    file.set_len(1 << 36).unwrap();
    refused(&ckpt, "bytes");
}

#[test]
fn a_data_file_that_is_a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = scored_checkpoint(dir.path());
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("index.json")).unwrap()).unwrap();
    let name = index["files"][0]["file"].as_str().unwrap().to_string();
    std::fs::remove_file(ckpt.join(&name)).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(ckpt.join(&name))
        .status()
        .unwrap();
    assert!(status.success());
    refused(&ckpt, "not a regular file");
}

#[test]
fn a_file_listed_twice_or_row_counts_that_overflow_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = scored_checkpoint(dir.path());
    edit_index(&ckpt, |index| {
        let file = index["files"][0].clone();
        index["files"].as_array_mut().unwrap().push(file);
        index["rows"] = 6.into();
    });
    refused(&ckpt, "listed twice");

    let ckpt = scored_checkpoint(&dir.path().join("again"));
    edit_index(&ckpt, |index| {
        let mut file = index["files"][0].clone();
        file["file"] = "shard-00000-00009.safetensors".into();
        file["rows"] = u64::MAX.into();
        index["files"].as_array_mut().unwrap().push(file);
        index["rows_per_file"] = u64::MAX.into();
    });
    refused(&ckpt, "rows");
}

#[test]
fn timestamps_far_ahead_of_the_clock_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = scored_checkpoint(dir.path());
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("index.json")).unwrap()).unwrap();
    let entry = &index["files"][0];
    let name = entry["file"].as_str().unwrap().to_string();
    let path = ckpt.join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    // Find the scores tensor through the safetensors header.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let offsets = header["scores"]["data_offsets"].as_array().unwrap();
    let start = 8 + header_len + offsets[0].as_u64().unwrap() as usize;
    bytes[start..start + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    edit_index(&ckpt, |index| {
        index["files"][0]["crc32"] = crc32(&bytes).into();
    });
    refused(&ckpt, "ahead of this machine's clock");
}

/// CRC-32 (IEEE), as `index.json` records it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0_u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

#[test]
fn a_stream_of_overlapping_restores_does_not_starve_a_save() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    uniform("emb", 0..100_000, 1.0).save(&ckpt).unwrap();
    let saves_done = Arc::new(AtomicBool::new(false));
    let loads = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (ckpt, saves_done, loads) =
                (ckpt.clone(), Arc::clone(&saves_done), Arc::clone(&loads));
            thread::spawn(move || {
                let var = uniform("emb", 0..0, 0.0);
                // Readers keep the checkpoint busy until the saves are done.
                // The bound is time, not a count of loads: once a save has
                // published the small checkpoint, a load takes microseconds
                // and any count would run out while the saves still proceed.
                // A save starved for two minutes shows as a failure, not a hang.
                let deadline = Instant::now() + Duration::from_secs(120);
                while Instant::now() < deadline {
                    if saves_done.load(Ordering::Relaxed) {
                        return false;
                    }
                    var.load(&ckpt).unwrap();
                    loads.fetch_add(1, Ordering::Relaxed);
                }
                true
            })
        })
        .collect();
    while loads.load(Ordering::Relaxed) < 3 {
        thread::yield_now();
    }
    let small = uniform("emb", 0..10, 2.0);
    for _ in 0..3 {
        small.save(&ckpt).unwrap();
    }
    saves_done.store(true, Ordering::Relaxed);
    let gave_up: Vec<bool> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert!(
        !gave_up.contains(&true),
        "the saves waited until the readers gave up"
    );
}

#[test]
fn data_files_that_are_one_file_twice_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = scored_checkpoint(dir.path());
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("index.json")).unwrap()).unwrap();
    let name = index["files"][0]["file"].as_str().unwrap().to_string();
    std::fs::hard_link(ckpt.join(&name), ckpt.join("shard-00000-00007.safetensors")).unwrap();
    edit_index(&ckpt, |index| {
        let mut file = index["files"][0].clone();
        file["file"] = "shard-00000-00007.safetensors".into();
        index["files"].as_array_mut().unwrap().push(file);
        index["rows"] = 6.into();
    });
    refused(&ckpt, "hard link");
}

#[test]
fn a_restore_reads_the_previous_checkpoint_a_half_done_publish_left() {
    // Where directories cannot be exchanged atomically, a publish renames
    // the old checkpoint aside first; a crash right then leaves it there.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let saved = uniform("emb", 0..50, 3.0);
    saved.save(&ckpt).unwrap();
    std::fs::rename(&ckpt, dir.path().join(".ckpt.dynemb-previous")).unwrap();
    let back = uniform("emb", 0..0, 0.0);
    back.restore(&ckpt).unwrap();
    assert_eq!(contents(&back), contents(&saved));
    // The next save publishes normally; the stale copy is no longer read.
    uniform("emb", 0..7, 4.0).save(&ckpt).unwrap();
    back.restore(&ckpt).unwrap();
    assert_eq!(back.size(), 7);
}

#[test]
fn lock_files_are_never_followed_through_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere");
    std::os::unix::fs::symlink(&target, dir.path().join(".ckpt.dynemb-queue")).unwrap();
    let err = uniform("emb", 0..3, 1.0)
        .save(dir.path().join("ckpt"))
        .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(!target.exists(), "no file created through the symlink");
    assert!(!dir.path().join("ckpt").exists());
}

#[test]
fn a_lock_file_that_cannot_be_opened_fails_a_restore_instead_of_skipping_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    uniform("emb", 0..5, 1.0).save(&ckpt).unwrap();
    let lock = dir.path().join(".ckpt.dynemb-lock");
    std::fs::rename(&lock, dir.path().join("moved-lock")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("moved-lock"), &lock).unwrap();
    let var = uniform("emb", 100..101, 9.0);
    let err = var.restore(&ckpt).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert_eq!(var.size(), 1);
}

#[test]
fn a_dim_no_table_has_is_refused_even_when_asked_for() {
    for dim in [0_usize, dynemb::MAX_DIM + 1] {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = scored_checkpoint(dir.path());
        edit_index(&ckpt, |index| index["dim"] = dim.into());
        let err = dynemb::checkpoint::Reader::<i64>::open(&ckpt, "emb", dim).unwrap_err();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
        assert!(err.to_string().contains("outside 1..="), "{err}");
        refused(&ckpt, "outside 1..=");
    }
}
