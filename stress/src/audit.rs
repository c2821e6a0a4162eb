//! Audits: whole-table checks while every worker is paused (no operation in
//! flight), every `--audit-every` and at the end.
//!
//! - ledger, exactly: for every index `started == done` (nothing in
//!   flight), the row's value equals that sum, its slot twice it (update
//!   keys) or 0 (accum keys), an update key is present iff it was ever
//!   updated, every accum key is present; at the end also: the sum equals
//!   the sum of what each worker recorded adding; the ledger's size counts
//!   the marker keys too;
//! - main: every exported row's values and slot (read by `lookup_slot` right
//!   after, nothing writes in between) are a valid pair of its key;
//! - both: no key exported twice, `size()` equals the number of exported
//!   keys and every `shard_size` its shard's share.

use crate::checkpoints::check_unique_and_sizes;
use crate::rows;
use crate::shared::Shared;
use std::time::Instant;

/// Keys per lookup while auditing.
const CHUNK: usize = 1 << 15;

/// Runs both audits; the caller has paused the workers. `locals` are the
/// workers' own ledger sums, once they have finished.
pub fn run(shared: &Shared, locals: Option<&[u64]>) {
    let started = Instant::now();
    ledger(shared, locals);
    main(shared);
    if let Some(bounded) = &shared.bounded {
        bounded.audit(shared);
    }
    shared.stats.audits.add(started.elapsed());
}

fn ledger(shared: &Shared, locals: Option<&[u64]>) {
    let ledger = &shared.ledger;
    let var = &ledger.var;
    let dim = var.dim();
    let done = ledger.done_now();
    let started = ledger.started_now();
    let indexes: Vec<usize> = (0..ledger.booked()).collect();
    let mut present = 0usize;
    for chunk in indexes.chunks(CHUNK) {
        let keys: Vec<i64> = chunk.iter().map(|&j| ledger.key(j)).collect();
        let mut values = vec![0.0; keys.len() * dim];
        let mut slots = vec![0.0; keys.len() * dim];
        let mut exists = vec![false; keys.len()];
        shared.ok(
            "ledger lookup_with_exists",
            var.lookup_with_exists(&keys, &mut values, &mut exists),
        );
        shared.ok(
            "ledger lookup_slot",
            var.lookup_slot(ledger.slot, &keys, &mut slots),
        );
        for (i, &j) in chunk.iter().enumerate() {
            let key = keys[i];
            if started[j] != done[j] {
                shared.violation(format!(
                    "audit: ledger index {j} has started sum {} but done sum {} while every \
                     worker is paused (a soak bug)",
                    started[j], done[j]
                ));
            }
            if let Some(locals) = locals {
                if locals[j] != done[j] {
                    shared.violation(format!(
                        "final audit: ledger index {j}: the workers recorded adding {} in total \
                         but the books say {} (a soak bug)",
                        locals[j], done[j]
                    ));
                }
            }
            let row = |buf: &[f32], what| {
                rows::ledger_value(what, key, &buf[i * dim..(i + 1) * dim])
                    .unwrap_or_else(|e| shared.violation(format!("audit: ledger {e}")))
            };
            let (v, s) = (row(&values, "value row"), row(&slots, "slot row"));
            let update = ledger.is_update_key(j);
            let should_exist = !update || done[j] > 0;
            if exists[i] != should_exist {
                shared.violation(format!(
                    "audit: ledger key {key} (index {j}, sum {}) is {} but should {}",
                    done[j],
                    if exists[i] { "present" } else { "missing" },
                    if should_exist {
                        "be present"
                    } else {
                        "be missing"
                    }
                ));
            }
            present += usize::from(exists[i]);
            let want_slot = if update { 2 * done[j] } else { 0 };
            if v != done[j] || s != want_slot {
                shared.violation(format!(
                    "audit: ledger key {key} (index {j}, {} key) has value {v} and slot {s}, \
                     want exactly {} and {want_slot}{}",
                    if update { "update" } else { "accum" },
                    done[j],
                    if v < done[j] {
                        ": an update was lost"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    let markers = ledger.marker_keys();
    let mut marker_rows = vec![0.0; markers.len() * dim];
    let mut marker_exists = vec![false; markers.len()];
    shared.ok(
        "ledger lookup_with_exists of the markers",
        var.lookup_with_exists(&markers, &mut marker_rows, &mut marker_exists),
    );
    present += marker_exists.iter().filter(|&&e| e).count();
    if var.size() != present {
        shared.violation(format!(
            "audit: ledger size() is {} but {present} ledger keys (markers included) are present",
            var.size()
        ));
    }
    let shards = var.num_shards();
    let mut per_shard = vec![0usize; shards];
    let mut all = Vec::with_capacity(present);
    for chunk in var.export_chunks(CHUNK) {
        let (keys, values) = shared.ok("ledger export_chunks", chunk);
        for (i, &key) in keys.iter().enumerate() {
            let Some(j) = rows::ledger_index(key, ledger.per_kind) else {
                shared.violation(format!("audit: ledger exports key {key}, no ledger key"));
            };
            let shard = shared.ok("shard_of", var.partitioner().shard_of(key, shards));
            per_shard[shard] += 1;
            if j >= ledger.booked() {
                continue; // a marker: its value is the checkpoint round
            }
            let v = rows::ledger_value("exported value row", key, &values[i * dim..(i + 1) * dim])
                .unwrap_or_else(|e| shared.violation(format!("audit: ledger {e}")));
            if v != done[j] {
                shared.violation(format!(
                    "audit: ledger export of key {key} (index {j}) has value {v}, lookup says {}",
                    done[j]
                ));
            }
        }
        all.extend(keys);
    }
    check_unique_and_sizes(shared, var, "audit: ledger", all, &per_shard);
}

fn main(shared: &Shared) {
    let var = &shared.main;
    let dim = var.dim();
    let shards = var.num_shards();
    let mut per_shard = vec![0usize; shards];
    let mut all = Vec::with_capacity(var.size() + CHUNK);
    for chunk in var.export_chunks(CHUNK) {
        let (keys, values) = shared.ok("main export_chunks", chunk);
        let mut slots = vec![0.0; values.len()];
        shared.ok(
            "main lookup_slot",
            var.lookup_slot(shared.main_slot, &keys, &mut slots),
        );
        for (i, &key) in keys.iter().enumerate() {
            let range = i * dim..(i + 1) * dim;
            if let Err(e) = rows::check_pair(key, &values[range.clone()], &slots[range]) {
                shared.violation(format!("audit: main {e}"));
            }
            let shard = shared.ok("shard_of", var.partitioner().shard_of(key, shards));
            per_shard[shard] += 1;
        }
        all.extend(keys);
    }
    check_unique_and_sizes(shared, var, "audit: main", all, &per_shard);
}
