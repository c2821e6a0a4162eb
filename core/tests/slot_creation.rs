//! Slot creation is all or nothing ([`Variable::create_slots`], the
//! [`EmbeddingStore`] methods), and names are bounded where they enter
//! (variables, slots, checkpoint writers): a name too long for a checkpoint
//! header is a clear error, never a panic at the next save.

use dynemb::checkpoint::{save_rows, Rows, TableInfo};
use dynemb::{EmbeddingStore, Error, Variable, MAX_NAME_BYTES, MAX_SLOTS};

fn var(name: &str) -> Variable<i64> {
    Variable::<i64>::builder(name).dim(2).build().unwrap()
}

fn fill(v: &Variable<i64>, count: usize) {
    for i in 0..count {
        v.create_slot(&format!("s{i}"), i as f32).unwrap();
    }
}

#[test]
fn create_slots_without_room_adds_none() {
    let v = var("seven");
    fill(&v, MAX_SLOTS - 1);
    v.upsert(&[1, 2], &[1.0; 4]).unwrap();
    let before = v.slot_names();
    let err = v.create_slots(&[("m", 0.0), ("v", 0.0)]).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(
        message.contains("7 slot column") && message.contains("would make 9"),
        "{message}"
    );
    assert_eq!(v.slot_names(), before, "no orphan slot");
    assert!(matches!(v.slot_id("m"), Err(Error::UnknownSlot { .. })));
    // The check says the same, changing nothing; one slot still fits.
    assert_eq!(v.check_create_slots(&[("m", 0.0), ("v", 0.0)]), Err(err));
    assert!(EmbeddingStore::check_create_slots(&v, &[("m", 0.0), ("v", 0.0)]).is_err());
    assert_eq!(v.slot_names(), before);
    v.check_create_slots(&[("m", 0.0)]).unwrap();
    let ids = EmbeddingStore::create_slots(&v, &[("m", 0.0), ("s2", 2.0)]).unwrap();
    assert_eq!((ids[0].index(), ids[1].index()), (MAX_SLOTS - 1, 2));
}

#[test]
fn create_slots_with_one_bad_entry_adds_none() {
    let v = var("bad_entry");
    v.create_slot("m", 0.0).unwrap();
    let bad: [&[(&str, f32)]; 6] = [
        &[("v", 0.0), ("m", 1.0)],           // existing slot, other initial
        &[("v", 0.0), ("w", f32::NAN)],      // non-finite initial
        &[("v", 0.0), ("", 0.0)],            // empty name
        &[("v", 0.0), ("v", 1.0)],           // one name, two initials
        &[("v", 0.0), ("w", f32::INFINITY)], // non-finite initial
        &[("v", 0.0), ("m", f32::NAN)],      // existing slot, NaN initial
    ];
    for slots in bad {
        assert!(v.check_create_slots(slots).is_err(), "{slots:?}");
        assert!(v.create_slots(slots).is_err(), "{slots:?}");
        assert_eq!(v.slot_names(), ["m"], "{slots:?}");
    }
    // A name given twice with one initial value is one slot.
    let ids = v
        .create_slots(&[("v", 0.5), ("v", 0.5), ("m", -0.0)])
        .unwrap();
    assert_eq!(ids[0], ids[1]);
    assert_eq!(ids[2].index(), 0);
    assert_eq!(v.slot_names(), ["m", "v"]);
}

#[test]
fn concurrent_creators_never_exceed_the_room() {
    let v = var("racing");
    fill(&v, MAX_SLOTS - 3);
    std::thread::scope(|s| {
        for t in 0..4 {
            let v = &v;
            s.spawn(move || {
                let a = format!("a{t}");
                let b = format!("b{t}");
                let _ = v.create_slots(&[(&a, 0.0), (&b, 0.0)]);
            });
        }
    });
    // Three columns were free: exactly one pair got in, whole.
    let names = v.slot_names();
    assert_eq!(names.len(), MAX_SLOTS - 1, "{names:?}");
    let pair = &names[MAX_SLOTS - 3..];
    assert_eq!(pair[0][1..], pair[1][1..], "{names:?}");
}

#[test]
fn long_slot_and_variable_names_are_refused_where_they_enter() {
    let long = "x".repeat(MAX_NAME_BYTES + 1);
    let v = var("names");
    let err = v.create_slot(&long, 0.0).unwrap_err();
    assert!(err.to_string().contains("slot name"), "{err}");
    assert!(v.create_slots(&[("m", 0.0), (&long, 0.0)]).is_err());
    assert!(v.slot_names().is_empty());
    v.create_slot(&"y".repeat(MAX_NAME_BYTES), 0.0).unwrap();

    let err = Variable::<i64>::builder(long.clone())
        .dim(2)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("variable name"), "{err}");
    let registry = dynemb::Registry::new();
    let scoped = registry.scope(&"s".repeat(MAX_NAME_BYTES));
    assert!(scoped
        .get_variable(Variable::<i64>::builder("emb").dim(2))
        .is_err());

    // The variable that was built saves and restores.
    let dir = tempfile::tempdir().unwrap();
    v.upsert(&[1], &[1.0, 2.0]).unwrap();
    v.save(dir.path().join("ok")).unwrap();
    let back = var("names");
    back.restore(dir.path().join("ok")).unwrap();
    assert_eq!(back.slot_names(), v.slot_names());
}

#[test]
fn a_checkpoint_header_too_large_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let rows = || {
        std::iter::once(Ok(Rows {
            keys: vec![1_i64],
            values: vec![0.0; 2],
            slots: vec![vec![0.0; 2]],
            scores: None,
        }))
    };
    // A 100 MB slot name: over safetensors' header limit.
    for (name, slot) in [
        ("t".to_string(), "z".repeat(100_000_001)),
        ("t".repeat(MAX_NAME_BYTES + 1), "m".to_string()),
    ] {
        let info = TableInfo {
            name,
            dim: 2,
            slots: vec![(slot, 0.0)],
            scores: None,
            shards: 1,
            value_dtype: dynemb::Dtype::F32,
            slot_dtype: dynemb::Dtype::F32,
        };
        let err = save_rows(dir.path().join("big"), &info, rows()).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(!dir.path().join("big").exists());
    }
}
