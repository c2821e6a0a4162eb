//! A save killed at any point leaves a complete checkpoint in place.
//!
//! The test re-runs its own binary as a child process that saves a variable
//! over and over into a directory that already holds a checkpoint, kills it
//! with SIGKILL after a varying delay, and checks that the directory restores
//! to exactly one of the two versions, whole: values, slot and scores.

use dynemb::{RestrictPolicy, Variable};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::Duration;

/// Environment variable telling the child which directory to save into.
const CHILD_DIR: &str = "DYNEMB_CRASH_TEST_SAVE_DIR";
const DIM: usize = 32;
const ROWS: i64 = 200_000;

/// A variable with a slot `m` and frequency scores.
fn empty() -> Variable<i64> {
    Variable::<i64>::builder("emb")
        .dim(DIM)
        .shards(2)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap()
}

/// The variable of a version: every row of version `v` holds `v` (and the
/// key), its slot row `-v`, and its score is 1, so any mix of versions is
/// visible.
fn version(v: f32) -> Variable<i64> {
    let var = empty();
    let m = var.create_slot("m", 0.0).unwrap();
    let keys: Vec<i64> = (0..ROWS).collect();
    var.update_rows(&keys, &[m], |i, row, slot| {
        row.fill(v);
        row[1] = keys[i] as f32;
        slot.fill(-v);
    })
    .unwrap();
    var
}

/// Which version a restored variable is, or a description of what is wrong.
fn restored_version(dir: &Path) -> Result<f32, String> {
    let var = empty();
    var.restore(dir).map_err(|e| e.to_string())?;
    let (keys, values) = var.export().map_err(|e| e.to_string())?;
    if keys.len() != ROWS as usize {
        return Err(format!("{} rows, expected {ROWS}", keys.len()));
    }
    let mut slots = vec![0.0; values.len()];
    let m = var.slot_id("m").map_err(|e| e.to_string())?;
    var.lookup_slot(m, &keys, &mut slots)
        .map_err(|e| e.to_string())?;
    let mut scores = vec![0; keys.len()];
    var.lookup_scores(&keys, &mut scores)
        .map_err(|e| e.to_string())?;
    let mut versions = HashMap::new();
    for (i, (key, row)) in keys.iter().zip(values.chunks(DIM)).enumerate() {
        if row[1] != *key as f32 {
            return Err(format!("row of key {key} holds key {}", row[1]));
        }
        if slots[i * DIM..(i + 1) * DIM].iter().any(|&s| s != -row[0]) || scores[i] != 1 {
            return Err(format!("key {key}: slot or score of another version"));
        }
        *versions.entry(row[0].to_bits()).or_insert(0) += 1;
    }
    match versions.len() {
        1 => Ok(f32::from_bits(*versions.keys().next().unwrap())),
        _ => Err(format!("rows of several versions: {versions:?}")),
    }
}

/// Environment variable telling the child which version to save.
const CHILD_VERSION: &str = "DYNEMB_CRASH_TEST_VERSION";

/// Whether a save's staging directory is in `root`.
fn staging_exists(root: &Path) -> bool {
    std::fs::read_dir(root).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".ckpt.dynemb-saving-")
    })
}

/// In a child started by `test` (the environment names a directory and a
/// version), saves that version over and over, reporting each completed
/// save, until killed; returns in the parent.
fn run_child_saver() {
    if let (Ok(dir), Ok(v)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_VERSION)) {
        let var = version(v.parse().unwrap());
        println!("ready");
        loop {
            var.save(&dir).unwrap();
            println!("saved");
        }
    }
}

/// A child process saving in a loop, and the lines it printed.
struct Saver {
    child: Child,
    lines: Receiver<String>,
    reader: JoinHandle<()>,
}

impl Saver {
    /// Kills the child and returns how many saves it completed.
    fn kill(mut self) -> usize {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.reader.join().unwrap();
        self.lines.try_iter().filter(|line| line == "saved").count()
    }
}

/// Starts this binary as a child saving `version` into `dir` in a loop
/// (see [`run_child_saver`]) and waits until it is ready.
fn start_saver(test: &str, dir: &Path, version: f32) -> Saver {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(CHILD_DIR, dir)
        .env(CHILD_VERSION, version.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // (libtest prints its own lines first.)
    while rx.recv().expect("the child starts") != "ready" {}
    Saver {
        child,
        lines: rx,
        reader,
    }
}

#[test]
fn restores_while_another_process_saves_are_whole() {
    const TEST: &str = "restores_while_another_process_saves_are_whole";
    run_child_saver();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    version(1.0).save(&dir).unwrap();
    // A trainer process saves version 2 over and over; this process, a
    // server, reloads meanwhile: every reload is whole, of one version.
    let saver = start_saver(TEST, &dir, 2.0);
    let mut seen = [0; 2];
    for round in 0..40 {
        let restored = restored_version(&dir).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(
            restored == 1.0 || restored == 2.0,
            "round {round}: {restored}"
        );
        seen[restored as usize - 1] += 1;
    }
    let saves = saver.kill();
    assert!(saves > 0, "the child completed no save");
    println!("40 restores during {saves} saves of another process: versions seen {seen:?}");
}

#[test]
fn killed_save_leaves_a_complete_checkpoint() {
    const TEST: &str = "killed_save_leaves_a_complete_checkpoint";
    run_child_saver();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    version(1.0).save(&dir).unwrap();
    let (rounds, mut mid_save_kills, mut completed_rounds) = (10u64, 0, 0);
    let mut previous = 1.0;
    for round in 0..rounds {
        let this = (round + 2) as f32;
        let saver = start_saver(TEST, &dir, this);
        // Kill at a different point of the save (or of a later one) each round.
        std::thread::sleep(Duration::from_millis(round * round * 23 % 700));
        let saved = saver.kill() > 0;
        if staging_exists(root.path()) {
            mid_save_kills += 1;
        }
        let restored = restored_version(&dir).unwrap_or_else(|e| panic!("round {round}: {e}"));
        if saved {
            completed_rounds += 1;
            assert_eq!(
                restored, this,
                "round {round}: a completed save is what restores"
            );
        } else {
            assert!(
                restored == previous || restored == this,
                "round {round}: restored version {restored}, expected {previous} or {this}"
            );
        }
        previous = restored;
    }
    assert!(mid_save_kills > 0, "no kill landed inside a save");
    // The next save cleans up after the killed one.
    version(99.0).save(&dir).unwrap();
    assert!(!staging_exists(root.path()));
    assert_eq!(restored_version(&dir), Ok(99.0));
    println!("{rounds} rounds: {mid_save_kills} kills inside a save, {completed_rounds} after a completed save");
}
