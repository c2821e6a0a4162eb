//! `Variable::reserve` (and `reserve_rows`) back the rows they make room
//! for with memory, so that the inserts that follow find their pages ready,
//! and back no more than their bound. Linux only (`MADV_POPULATE_WRITE`,
//! kernel 5.14 or later: on an older kernel the test says so and checks
//! nothing), and a test binary of its own: the checks read the process's
//! resident size, which no other test may move meanwhile.
#![cfg(target_os = "linux")]

use dynemb::{Initializer, Variable};

/// The process's resident memory in bytes (`VmRSS`).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .unwrap();
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// Whether the kernel has `MADV_POPULATE_WRITE` (Linux 5.14).
fn kernel_populates() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    version >= (5, 14)
}

fn variable(dim: usize) -> Variable<i64> {
    let var = Variable::<i64>::builder("reserved")
        .dim(dim)
        .initializer(Initializer::Constant(0.5))
        .build()
        .unwrap();
    // Adam's two slot columns: reserve backs their rows too.
    var.create_slot("m", 0.0).unwrap();
    var.create_slot("v", 0.0).unwrap();
    var
}

#[test]
fn reserve_backs_the_new_rows_with_memory_up_to_its_bound() {
    const DIM: usize = 64;
    // Bytes per row: two header words and 32 value words, and 32 words in
    // each slot column.
    const ROW_BYTES: u64 = (2 + 32 + 2 * 32) * 8;
    const ROWS: usize = 200_000;
    if !kernel_populates() {
        eprintln!("skipped: this kernel predates MADV_POPULATE_WRITE (Linux 5.14)");
        return;
    }
    let var = variable(DIM);
    let first: Vec<i64> = (0..1_000).collect();
    let mut out = vec![0.0; first.len() * DIM];
    var.lookup_or_insert(&first, &mut out).unwrap();

    let before = resident_bytes();
    var.reserve(ROWS);
    let reserved = resident_bytes().saturating_sub(before);
    let expected = ROWS as u64 * ROW_BYTES;
    assert!(
        reserved >= expected * 9 / 10,
        "reserve({ROWS}) backed {reserved} bytes, expected about {expected}"
    );
    assert_eq!(var.size(), first.len(), "reserve inserts nothing");

    // The inserts then find their rows' pages backed already.
    let keys: Vec<i64> = (1_000..1_000 + ROWS as i64).collect();
    // Written before measuring, so its own pages count before the inserts.
    let mut out = vec![1.0; keys.len() * DIM];
    let before_inserts = resident_bytes();
    var.lookup_or_insert(&keys, &mut out).unwrap();
    let grown = resident_bytes().saturating_sub(before_inserts);
    assert!(
        grown < expected / 4,
        "inserting {ROWS} reserved rows grew the process by {grown} bytes"
    );
    assert!(out.iter().all(|&v| v == 0.5));
    assert_eq!(var.size(), first.len() + ROWS);

    // Rows for far more keys than memory holds: at most 1 GiB of them (and
    // the rest of a 2 MiB page per column), and nothing changes.
    let before_huge = resident_bytes();
    var.reserve_rows(usize::MAX);
    let huge = resident_bytes().saturating_sub(before_huge);
    assert!(
        huge <= (1 << 30) + 3 * (2 << 20) + (16 << 20),
        "reserve_rows(usize::MAX) backed {huge} bytes"
    );
    assert_eq!(var.size(), first.len() + ROWS);
    let mut row = vec![0.0; DIM];
    var.lookup(&[7], &mut row).unwrap();
    assert!(row.iter().all(|&v| v == 0.5));
    drop(var);

    // The bound is the variable's, split over its shards.
    let sharded = Variable::<i64>::builder("sharded")
        .dim(DIM)
        .shards(4)
        .build()
        .unwrap();
    sharded.create_slot("m", 0.0).unwrap();
    let before_sharded = resident_bytes();
    sharded.reserve_rows(usize::MAX);
    let backed = resident_bytes().saturating_sub(before_sharded);
    assert!(
        backed <= (1 << 30) + 4 * 2 * (2 << 20) + (16 << 20),
        "reserve_rows(usize::MAX) over 4 shards backed {backed} bytes"
    );
    assert!(backed >= 1 << 29, "it backed {backed} bytes");
    assert_eq!(sharded.size(), 0);
    drop(sharded);

    // A few rows' worth backs at most the rest of the page each column of
    // each shard ends in (9 columns, 8 shards).
    let wide = Variable::<i64>::builder("wide")
        .dim(4096)
        .shards(8)
        .build()
        .unwrap();
    for slot in 0..8 {
        wide.create_slot(&format!("s{slot}"), 0.0).unwrap();
    }
    let before_few = resident_bytes();
    wide.reserve_rows(8);
    let few = resident_bytes().saturating_sub(before_few);
    assert!(
        few <= 8 * 9 * (2 << 20) + (16 << 20),
        "reserve_rows(8) backed {few} bytes"
    );
}
