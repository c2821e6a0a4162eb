//! Slot creation on Redis is all or nothing, and an optimizer step is
//! checked before it changes anything, through the store trait as on a
//! local variable: a table holding 7 of its 8 slot columns refuses Adam
//! (which needs two) with no orphan slot in the metadata, no row, slot or
//! score changed and no step counted; a step over a local table and a full
//! Redis one is refused before it begins; a restore or load whose
//! checkpoint's slots do not fit creates none and changes nothing.

use dynemb::{EmbeddingStore, Error, RestrictPolicy, Variable, MAX_SLOTS};
use dynemb_optim::{check_step, ParamsAdam, SparseAdam, SparseOptimizer};
use dynemb_redis::RedisVariable;
use dynemb_test_support::servers::{unique_name, Server};

const DIM: usize = 2;
const KEYS: [i64; 3] = [1, 4, 1];
const GRADS: [f32; 6] = [0.1, -0.2, 0.3, 0.4, -0.5, 0.6];

fn open(server: &Server, name: &str) -> RedisVariable<i64> {
    RedisVariable::open(
        Variable::<i64>::builder(name)
            .dim(DIM)
            .restrict_policy(RestrictPolicy::Frequency),
        server.config(),
    )
    .unwrap()
}

/// A Redis table with rows for keys 1..=3 and `slots` slot columns.
fn table(server: &Server, slots: usize) -> RedisVariable<i64> {
    let var = open(server, &unique_name("room"));
    var.upsert(&[1, 2, 3], &[0.5, -0.5, 1.0, 2.0, -3.0, 0.25])
        .unwrap();
    for i in 0..slots {
        var.create_slot(&format!("other{i}"), i as f32).unwrap();
    }
    var
}

/// Slot names, rows, slot rows and scores of keys 1..=4.
type Snapshot = (Vec<String>, Vec<f32>, Vec<Vec<f32>>, Vec<u64>, usize);

fn snapshot<S: EmbeddingStore<Key = i64>>(store: &S, names: Vec<String>, size: usize) -> Snapshot {
    let keys = [1, 2, 3, 4];
    let mut rows = vec![0.0; keys.len() * DIM];
    store.lookup(&keys, &mut rows).unwrap();
    let slots = names
        .iter()
        .map(|name| {
            let mut out = vec![0.0; keys.len() * DIM];
            store
                .lookup_slot(store.slot_id(name).unwrap(), &keys, &mut out)
                .unwrap();
            out
        })
        .collect();
    (names, rows, slots, Vec::new(), size)
}

fn redis_snapshot(var: &RedisVariable<i64>) -> Snapshot {
    let mut out = snapshot(var, var.slot_names().unwrap(), var.size().unwrap());
    let mut scores = vec![0; 4];
    var.lookup_scores(&[1, 2, 3, 4], &mut scores).unwrap();
    out.3 = scores;
    out
}

fn assert_room_error(err: &Error) {
    let message = err.to_string();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && message.contains("would make 9"),
        "{message}"
    );
}

#[test]
fn adam_on_a_redis_table_without_room_changes_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let var = table(&server, MAX_SLOTS - 1);
    let before = redis_snapshot(&var);
    let opt = SparseAdam::new(ParamsAdam::default()).unwrap();
    assert_room_error(&opt.apply(&var, &KEYS, &GRADS).unwrap_err());
    assert_eq!(redis_snapshot(&var), before);
    assert_eq!(opt.steps(), 0);
    // Another handle reads the metadata afresh: no orphan slot there.
    let fresh = open(&server, var.name());
    assert_eq!(fresh.slot_names().unwrap(), before.0);
    assert!(matches!(fresh.slot_id("m"), Err(Error::UnknownSlot { .. })));
}

#[test]
fn a_step_over_a_local_and_a_full_redis_table_is_refused_before_it_begins() {
    let Some(server) = Server::start() else {
        return;
    };
    let remote = table(&server, MAX_SLOTS - 1);
    let local = Variable::<i64>::builder("local").dim(DIM).build().unwrap();
    let (remote_before, local_before) = (
        redis_snapshot(&remote),
        snapshot(&local, local.slot_names(), local.size()),
    );
    let opt = SparseAdam::new(ParamsAdam::default()).unwrap();
    let params = opt.params();
    let checked = check_step(&params, &local, &KEYS, &GRADS)
        .and_then(|()| check_step(&params, &remote, &KEYS, &GRADS));
    assert_room_error(&checked.unwrap_err());
    assert_eq!(redis_snapshot(&remote), remote_before);
    assert_eq!(
        snapshot(&local, local.slot_names(), local.size()),
        local_before
    );
    assert_eq!(opt.steps(), 0);
    // A caller that skipped the check: Step::apply creates no orphan.
    let step = opt.begin_step().unwrap();
    assert_room_error(&step.apply(&remote, &KEYS, &GRADS).unwrap_err());
    assert_eq!(redis_snapshot(&remote), remote_before);
}

#[test]
fn create_slots_is_all_or_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let var = table(&server, 1);
    let bad: [&[(&str, f32)]; 5] = [
        &[("m", 0.0), ("other0", 1.0)], // existing slot, other initial
        &[("m", 0.0), ("w", f32::NAN)], // non-finite initial
        &[("m", 0.0), ("", 0.0)],       // empty name
        &[("m", 0.0), ("m", 1.0)],      // one name, two initials
        &[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("d", 0.0),
            ("e", 0.0),
            ("f", 0.0),
            ("g", 0.0),
            ("h", 0.0),
        ],
    ];
    let long = "n".repeat(dynemb::MAX_NAME_BYTES + 1);
    for slots in bad
        .iter()
        .copied()
        .chain([&[("m", 0.0), (long.as_str(), 0.0)][..]])
    {
        assert!(var.check_create_slots(slots).is_err(), "{slots:?}");
        assert!(var.create_slots(slots).is_err(), "{slots:?}");
        assert_eq!(var.slot_names().unwrap(), ["other0"], "{slots:?}");
    }
    // 0.0 equals -0.0; a name twice with one initial is one slot.
    let ids = var
        .create_slots(&[("m", 0.5), ("other0", -0.0), ("m", 0.5)])
        .unwrap();
    assert_eq!(
        ids.iter().map(|id| id.index()).collect::<Vec<_>>(),
        [1, 0, 1]
    );
    // Another handle, whose cache knows no slot, gets the same ids.
    let other = open(&server, var.name());
    let again = other.create_slots(&[("other0", 0.0), ("m", 0.5)]).unwrap();
    assert_eq!((again[0].index(), again[1].index()), (0, 1));
    assert!(matches!(
        other.create_slots(&[("v", 0.0), ("m", 0.25)]),
        Err(Error::Mismatch { .. })
    ));
    assert_eq!(var.slot_names().unwrap(), ["other0", "m"]);
}

#[test]
fn handles_racing_for_the_last_columns_never_split_a_request() {
    let Some(server) = Server::start() else {
        return;
    };
    let var = table(&server, MAX_SLOTS - 3);
    std::thread::scope(|s| {
        for t in 0..4 {
            let handle = open(&server, var.name());
            s.spawn(move || {
                let (a, b) = (format!("a{t}"), format!("b{t}"));
                let _ = handle.create_slots(&[(&a, 0.0), (&b, 0.0)]);
            });
        }
    });
    let names = var.slot_names().unwrap();
    assert_eq!(names.len(), MAX_SLOTS - 1, "{names:?}");
    let pair = &names[MAX_SLOTS - 3..];
    assert_eq!(pair[0][1..], pair[1][1..], "{names:?}");
}

/// A checkpoint of `name` holding Adam's slots (`m`, `v`), and the local
/// variable it was saved from.
fn adam_checkpoint(dir: &std::path::Path, name: &str) -> Variable<i64> {
    let local = Variable::<i64>::builder(name)
        .dim(DIM)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    let adam = SparseAdam::new(ParamsAdam::default()).unwrap();
    adam.apply(&local, &KEYS, &GRADS).unwrap();
    local.save(dir).unwrap();
    local
}

#[test]
fn restore_and_load_create_the_checkpoints_slots_all_or_nothing() {
    let Some(server) = Server::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Seven columns: the checkpoint's two do not fit, so neither is made.
    let full = table(&server, MAX_SLOTS - 1);
    let checkpoint = dir.path().join("full");
    adam_checkpoint(&checkpoint, full.name());
    let before = redis_snapshot(&full);
    for replace in [true, false] {
        let err = if replace {
            full.restore(&checkpoint).unwrap_err()
        } else {
            full.load(&checkpoint).unwrap_err()
        };
        assert!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("slot columns")),
            "{err}"
        );
        assert_eq!(redis_snapshot(&full), before, "nothing changed");
    }
    // With room, and after the server forgot every script: both slots are
    // made in one go, after the table's own.
    let var = table(&server, 1);
    let checkpoint = dir.path().join("room");
    let local = adam_checkpoint(&checkpoint, var.name());
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    var.restore(&checkpoint).unwrap();
    assert_eq!(var.slot_names().unwrap(), ["other0", "m", "v"]);
    for slot in ["m", "v"] {
        let mut stored = vec![0.0; 2 * DIM];
        var.lookup_slot(var.slot_id(slot).unwrap(), &[1, 4], &mut stored)
            .unwrap();
        let mut expected = vec![0.0; 2 * DIM];
        local
            .lookup_slot(local.slot_id(slot).unwrap(), &[1, 4], &mut expected)
            .unwrap();
        assert_eq!(stored, expected, "{slot}");
    }
}
