//! Slots kept inside the rows (`VariableBuilder::inline_slots`) hold the
//! same numbers as slots in columns of their own, through every path that
//! touches a slot:
//!
//! - optimizer-like `update_rows` steps (a slot past the inline room
//!   included, slots created after rows exist, inserts and updates), keys
//!   removed and inserted again by a training read and by an upsert, and
//!   accumulation, in every value and slot dtype;
//! - checkpoints, saved in one layout and restored into the other;
//! - rows evicted by capacity, as the listener receives them;
//! - rows reused after a removal, whose inline slots start over;
//! - the setting itself: reported by the variable, refused past
//!   `MAX_SLOTS` or past rows of `MAX_DIM` f32 values.

use dynemb::{Dtype, Error, Evicted, Initializer, SlotId, Variable, MAX_DIM, MAX_SLOTS};
use std::sync::{Arc, Mutex};

const DIM: usize = 9;

fn var(inline_slots: usize, values: Dtype, slots: Dtype) -> Variable<u64> {
    Variable::<u64>::builder("inline")
        .dim(DIM)
        .shards(2)
        .init_size(1)
        .initializer(Initializer::RandomNormal {
            mean: 0.0,
            stddev: 0.5,
            seed: 11,
        })
        .value_dtype(values)
        .slot_dtype(slots)
        .inline_slots(inline_slots)
        .build()
        .expect("build")
}

/// An Adam-like step of `keys` on slots `m`, `v` and, if given, `vhat`:
/// every number depends on the row, its slots and the key, so a slot read
/// from the wrong place shows.
fn step(var: &Variable<u64>, slots: &[SlotId], keys: &[u64], t: u32) {
    var.update_rows(keys, slots, |i, values, rows| {
        let (m, rest) = rows.split_at_mut(DIM);
        let (v, vhat) = rest.split_at_mut(DIM);
        for j in 0..DIM {
            let g = ((keys[i] % 7) as f32 - 3.0) * 0.1 + j as f32 * 0.01 + t as f32 * 0.001;
            m[j] = 0.9 * m[j] + 0.1 * g;
            v[j] = 0.99 * v[j] + 0.01 * g * g;
            let denominator = match vhat.get_mut(j) {
                Some(vhat) => {
                    *vhat = vhat.max(v[j]);
                    *vhat
                }
                None => v[j],
            };
            values[j] -= 0.05 * m[j] / (denominator.sqrt() + 0.1);
        }
    })
    .expect("step");
}

/// Every key's values and the rows of `slots`.
fn contents(var: &Variable<u64>, slots: &[SlotId], keys: &[u64]) -> Vec<Vec<f32>> {
    let mut out = vec![vec![0.0; keys.len() * DIM]; 1 + slots.len()];
    var.lookup(keys, &mut out[0]).expect("lookup");
    for (slot, rows) in slots.iter().zip(&mut out[1..]) {
        var.lookup_slot(*slot, keys, rows).expect("lookup_slot");
    }
    out
}

/// Runs the same steps, creations and removals on `var`; returns the
/// slots it created.
fn train(var: &Variable<u64>, keys: &[u64]) -> Vec<SlotId> {
    // Rows exist before the slots: they read the slots' initial values.
    var.upsert(&keys[..20], &vec![0.25; 20 * DIM])
        .expect("upsert");
    let mut slots = vec![
        var.create_slot("m", 0.0).expect("m"),
        var.create_slot("v", 0.5).expect("v"),
    ];
    for t in 0..4 {
        step(var, &slots, &keys[..30], t);
    }
    slots.push(var.create_slot("vhat", 0.125).expect("vhat"));
    for t in 4..10 {
        let batch = &keys[(t as usize * 7) % 40..][..24];
        step(var, &slots, batch, t);
    }
    step(var, &slots, &keys[..40], 10);
    // Removed keys come back, on reused row ids, with their slots at the
    // initial values: inserted by a training read and by an upsert.
    var.remove(&keys[5..15]).expect("remove");
    let mut rows = vec![0.0; 5 * DIM];
    var.lookup_or_insert(&keys[5..10], &mut rows)
        .expect("lookup_or_insert");
    var.upsert(&keys[10..15], &[-0.5; 5 * DIM]).expect("upsert");
    for (slot, initial) in slots.iter().zip([0.0, 0.5, 0.125]) {
        let mut slot_rows = vec![1.0; 10 * DIM];
        var.lookup_slot(*slot, &keys[5..15], &mut slot_rows)
            .expect("lookup_slot");
        assert!(slot_rows.iter().all(|&x| x == initial), "{slot_rows:?}");
    }
    // Accumulation into present rows writes the values alone.
    let deltas: Vec<f32> = (0..10 * DIM).map(|i| (i % 5) as f32 * 0.25).collect();
    var.accum(&keys[20..30], &deltas, &[true; 10])
        .expect("accum");
    slots
}

#[test]
fn inline_slots_hold_what_slot_columns_hold() {
    let keys: Vec<u64> = (0..64).map(|i| i * 0x9E37_79B9 + 3).collect();
    for values in Dtype::ALL {
        for slot_dtype in Dtype::ALL {
            let columns = var(0, values, slot_dtype);
            let expected_slots = train(&columns, &keys);
            let expected = contents(&columns, &expected_slots, &keys);
            for inline in [1, 2, 3, MAX_SLOTS] {
                let inline_var = var(inline, values, slot_dtype);
                assert_eq!(inline_var.inline_slots(), inline);
                let slots = train(&inline_var, &keys);
                assert_eq!(
                    contents(&inline_var, &slots, &keys),
                    expected,
                    "{inline} slots inline, values {values}, slots {slot_dtype}"
                );
                assert_eq!(inline_var.size(), columns.size());
            }
        }
    }
}

#[test]
fn checkpoints_move_between_the_layouts() {
    let keys: Vec<u64> = (0..64).map(|i| i * 31 + 1).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    for (from, to) in [(2, 0), (0, 2), (1, 3)] {
        let saved = var(from, Dtype::F32, Dtype::Bf16);
        let slots = train(&saved, &keys);
        let expected = contents(&saved, &slots, &keys);
        let path = dir.path().join(format!("{from}-{to}"));
        saved.save(&path).expect("save");
        let restored = var(to, Dtype::F32, Dtype::Bf16);
        restored.restore(&path).expect("restore");
        let names = ["m", "v", "vhat"].map(|name| restored.slot_id(name).expect("slot"));
        assert_eq!(
            contents(&restored, &names, &keys),
            expected,
            "{from} slots inline saved, restored into {to}"
        );
    }
}

/// A key, its values and its slots' rows, as the listener received them.
type EvictedRow = (u64, Vec<f32>, Vec<Vec<f32>>);

#[test]
fn evicted_rows_carry_their_inline_slots() {
    let evicted: Arc<Mutex<Vec<EvictedRow>>> = Arc::default();
    let sink = Arc::clone(&evicted);
    let bounded = Variable::<u64>::builder("bounded")
        .dim(DIM)
        .capacity(8)
        .inline_slots(2)
        .on_evict(move |rows: Evicted<'_, u64>| {
            let mut sink = sink.lock().unwrap();
            for (i, &key) in rows.keys().iter().enumerate() {
                let slots = rows
                    .slot_names()
                    .iter()
                    .map(|name| rows.slot(name).expect("named slot")[i * DIM..][..DIM].to_vec())
                    .collect();
                sink.push((key, rows.values()[i * DIM..][..DIM].to_vec(), slots));
            }
        })
        .build()
        .expect("build");
    let slots = [
        bounded.create_slot("m", 0.0).expect("m"),
        bounded.create_slot("v", 0.5).expect("v"),
        bounded.create_slot("vhat", 0.0).expect("vhat"),
    ];
    let mut last = std::collections::HashMap::new();
    for key in 0..24u64 {
        step(&bounded, &slots, &[key], key as u32);
        let [values, m, v, vhat] = contents(&bounded, &slots, &[key])
            .try_into()
            .expect("four columns");
        last.insert(key, (values, vec![m, v, vhat]));
    }
    let evicted = evicted.lock().unwrap();
    assert_eq!(
        evicted.len(),
        24 - 8,
        "every key past the capacity evicts one"
    );
    for (key, values, slots) in evicted.iter() {
        assert_eq!(
            (values, slots),
            (&last[key].0, &last[key].1),
            "key {key} leaves with its row and slots"
        );
    }
}

#[test]
fn more_inline_slots_than_a_table_holds_are_refused() {
    let refused = Variable::<u64>::builder("too_many")
        .dim(4)
        .inline_slots(MAX_SLOTS + 1)
        .build();
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("inline_slots")),
        "{:?}",
        refused.err()
    );
    assert_eq!(var(0, Dtype::F32, Dtype::F32).inline_slots(), 0);
    // A row's numbers may take what MAX_DIM f32 values take, no more.
    let wide = |dim: usize, slots: Dtype, inline: usize| {
        Variable::<u64>::builder("wide")
            .dim(dim)
            .slot_dtype(slots)
            .inline_slots(inline)
            .build()
    };
    assert!(wide(MAX_DIM / 2, Dtype::F32, 1).is_ok());
    assert!(wide(MAX_DIM / 2, Dtype::Bf16, 2).is_ok());
    assert!(wide(MAX_DIM, Dtype::F32, 0).is_ok());
    for (dim, slots, inline) in [(MAX_DIM, Dtype::Bf16, 1), (MAX_DIM / 2, Dtype::F32, 2)] {
        let refused = wide(dim, slots, inline);
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("slots inline")),
            "{:?}",
            refused.err()
        );
    }
}

#[test]
fn reused_rows_start_their_inline_slots_over() {
    // One shard, so the keys' rows are reused from one free pool.
    let var = Variable::<u64>::builder("reuse")
        .dim(DIM)
        .inline_slots(2)
        .build()
        .expect("build");
    let slots = [
        var.create_slot("m", 0.0).expect("m"),
        var.create_slot("v", 0.5).expect("v"),
        var.create_slot("vhat", 0.125).expect("vhat"),
    ];
    let keys: Vec<u64> = (1..=16).collect();
    let mut slot_rows = vec![0.0; keys.len() * DIM];
    for cycle in 0..400 {
        // Inserted by an upsert (cycles alternate with training reads):
        // every slot reads its initial value, on fresh and reused rows.
        if cycle % 2 == 0 {
            var.upsert(&keys, &vec![1.0; keys.len() * DIM])
                .expect("upsert");
        } else {
            var.lookup_or_insert(&keys, &mut slot_rows)
                .expect("lookup_or_insert");
        }
        for (slot, initial) in slots.iter().zip([0.0, 0.5, 0.125]) {
            var.lookup_slot(*slot, &keys, &mut slot_rows)
                .expect("lookup_slot");
            assert!(
                slot_rows.iter().all(|&x| x == initial),
                "cycle {cycle}: {slot_rows:?}"
            );
        }
        var.update_rows(&keys, &slots, |_, _, rows| rows.fill(cycle as f32 + 2.0))
            .expect("update_rows");
        var.remove(&keys).expect("remove");
    }
    // Without reuse, 400 cycles would hand out 6,400 rows.
    let fresh_every_cycle = Variable::<u64>::builder("fresh")
        .dim(DIM)
        .inline_slots(2)
        .build()
        .expect("build");
    let all: Vec<u64> = (0..400 * 16).collect();
    fresh_every_cycle
        .upsert(&all, &vec![1.0; all.len() * DIM])
        .expect("upsert");
    assert!(
        var.memory_bytes() < fresh_every_cycle.memory_bytes() / 4,
        "row ids were reused: {} bytes against {}",
        var.memory_bytes(),
        fresh_every_cycle.memory_bytes()
    );
}
