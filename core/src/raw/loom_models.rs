//! loom models of the index protocol (run with `RUSTFLAGS="--cfg loom"`, see
//! `.ci/run`): every interleaving of two threads on a one-group index, for
//! insert/insert, insert/remove, insert/find and one migration step against
//! a reader, a remover and an inserter; and the conditional unlink that
//! eviction and expiry use (`remove_row`) against a remove, a re-insert of
//! the key with another row, another unlink and a migration.

use super::index::{hash_key, Index, Insert, Remove};
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

fn insert(index: &Index, key: u64, row: u64) -> Insert {
    let mut budget = 0;
    let outcome = index.insert(key, hash_key(key), row, &mut budget, || {});
    index.unreserve(budget);
    outcome
}

fn find(index: &Index, key: u64) -> Option<u64> {
    index.find(key, hash_key(key))
}

/// Waits for a migration to finish, as a writer that met a moved slot does.
fn wait_for_migration(old: &Index) {
    while !old.migration_complete() {
        thread::yield_now();
    }
}

#[test]
fn two_inserts_of_one_key_make_one_row() {
    model(|| {
        let index = Arc::new(Index::with_capacity(16));
        let other = Arc::clone(&index);
        let t = thread::spawn(move || insert(&other, 5, 1));
        let here = insert(&index, 5, 2);
        let there = t.join().unwrap();
        let row = find(&index, 5).expect("key present");
        match (here, there) {
            (Insert::Inserted, Insert::Found(r)) => assert_eq!((row, r), (2, 2)),
            (Insert::Found(r), Insert::Inserted) => assert_eq!((row, r), (1, 1)),
            outcomes => panic!("both or neither inserted: {outcomes:?}"),
        }
    });
}

#[test]
fn two_inserts_of_different_keys_both_land() {
    model(|| {
        let index = Arc::new(Index::with_capacity(16));
        let other = Arc::clone(&index);
        let t = thread::spawn(move || insert(&other, 3, 30));
        assert_eq!(insert(&index, 4, 40), Insert::Inserted);
        assert_eq!(t.join().unwrap(), Insert::Inserted);
        assert_eq!(find(&index, 3), Some(30));
        assert_eq!(find(&index, 4), Some(40));
    });
}

#[test]
fn insert_and_remove_of_one_key_linearize() {
    model(|| {
        let index = Arc::new(Index::with_capacity(16));
        assert_eq!(insert(&index, 9, 1), Insert::Inserted);
        let other = Arc::clone(&index);
        let t = thread::spawn(move || other.remove(9, hash_key(9)));
        let inserted = insert(&index, 9, 2);
        let removed = t.join().unwrap();
        assert_eq!(
            removed,
            Remove::Removed(1),
            "the first row is what gets removed"
        );
        match inserted {
            // insert ran after the remove: the new row stays
            Insert::Inserted => assert_eq!(find(&index, 9), Some(2)),
            // insert ran before the remove: it saw row 1, which is now gone
            Insert::Found(1) => assert_eq!(find(&index, 9), None),
            other => panic!("unexpected {other:?}"),
        }
    });
}

#[test]
fn a_reader_sees_nothing_or_the_whole_insert() {
    model(|| {
        let index = Arc::new(Index::with_capacity(16));
        let other = Arc::clone(&index);
        let t = thread::spawn(move || find(&other, 11));
        assert_eq!(insert(&index, 11, 77), Insert::Inserted);
        let seen = t.join().unwrap();
        assert!(seen.is_none() || seen == Some(77), "reader saw {seen:?}");
    });
}

/// One group with keys 1 (FULL) and 2 (removed), migrated by one thread.
fn migrating_pair() -> (Arc<Index>, Arc<Index>) {
    let old = Index::with_capacity(16);
    assert_eq!(insert(&old, 1, 10), Insert::Inserted);
    assert_eq!(insert(&old, 2, 20), Insert::Inserted);
    assert_eq!(old.remove(2, hash_key(2)), Remove::Removed(20));
    let bound = old.close().unwrap();
    (Arc::new(old), Arc::new(Index::with_capacity(bound * 2)))
}

/// Migrates the one group; returns how many keys were copied.
fn migrate(old: &Index, new: &Index) -> usize {
    let copied = old.migrate_group(0, new);
    old.finish_migration_chunk(1);
    copied
}

#[test]
fn a_reader_always_finds_a_key_being_migrated() {
    model(|| {
        let (old, new) = migrating_pair();
        let (o, n) = (Arc::clone(&old), Arc::clone(&new));
        let t = thread::spawn(move || assert_eq!(migrate(&o, &n), 1));
        // The reader's rule: the old index, then `next` if not found there.
        let seen = find(&old, 1).or_else(|| find(&new, 1));
        assert_eq!(seen, Some(10));
        assert_eq!(find(&old, 2).or_else(|| find(&new, 2)), None);
        t.join().unwrap();
        assert_eq!(find(&new, 1), Some(10));
    });
}

#[test]
fn a_remove_during_migration_is_never_lost() {
    model(|| {
        let (old, new) = migrating_pair();
        let (o, n) = (Arc::clone(&old), Arc::clone(&new));
        let t = thread::spawn(move || migrate(&o, &n));
        let removed = match old.remove(1, hash_key(1)) {
            Remove::Migrating => {
                wait_for_migration(&old);
                new.remove(1, hash_key(1))
            }
            outcome => outcome,
        };
        assert_eq!(removed, Remove::Removed(10));
        let copied = t.join().unwrap();
        assert!(copied <= 1);
        assert_eq!(find(&new, 1), None, "the removed key was not resurrected");
        assert_eq!(find(&old, 1), None);
    });
}

#[test]
fn an_insert_during_migration_lands_exactly_once() {
    model(|| {
        let old = Index::with_capacity(16);
        assert_eq!(insert(&old, 1, 10), Insert::Inserted);
        let mut budget = 0;
        assert!(old.reserve(1));
        budget += 1;
        let bound = old.close().unwrap();
        let (old, new) = (Arc::new(old), Arc::new(Index::with_capacity(bound * 2)));
        let (o, n) = (Arc::clone(&old), Arc::clone(&new));
        let t = thread::spawn(move || {
            o.migrate_group(0, &n);
            o.finish_migration_chunk(1);
        });
        // An inserter that reserved before the index closed.
        let outcome = old.insert(3, hash_key(3), 30, &mut budget, || {});
        let outcome = match outcome {
            Insert::Migrating => {
                wait_for_migration(&old);
                insert(&new, 3, 30)
            }
            outcome => outcome,
        };
        assert_eq!(outcome, Insert::Inserted);
        t.join().unwrap();
        assert_eq!(find(&new, 3), Some(30));
        assert_eq!(find(&new, 1), Some(10));
        let mut count = 0;
        new.for_each_present(|key, _| count += usize::from(key == 3));
        assert_eq!(count, 1, "key 3 is in the new index once");
    });
}

/// Two inserters of one absent key, both holding reservations made before
/// the index closed, race the migrator of its group: exactly one row lands,
/// in the new index, and the other inserter sees it. Three threads, so the
/// preemption bound is lower to keep the model small.
#[test]
fn two_inserts_of_one_key_racing_a_migration() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(1);
    builder.check(|| {
        let old = Index::with_capacity(16);
        assert!(old.reserve(2));
        let bound = old.close().unwrap();
        let (old, new) = (Arc::new(old), Arc::new(Index::with_capacity(bound * 2)));
        let (o, n) = (Arc::clone(&old), Arc::clone(&new));
        let migrator = thread::spawn(move || migrate(&o, &n));
        let insert_racing = |old: &Index, new: &Index, row: u64| {
            let mut budget = 1;
            match old.insert(7, hash_key(7), row, &mut budget, || {}) {
                Insert::Migrating => {
                    wait_for_migration(old);
                    insert(new, 7, row)
                }
                outcome => outcome,
            }
        };
        let (o, n) = (Arc::clone(&old), Arc::clone(&new));
        let other = thread::spawn(move || insert_racing(&o, &n, 1));
        let here = insert_racing(&old, &new, 2);
        let there = other.join().unwrap();
        migrator.join().unwrap();
        let row = find(&new, 7).expect("present in the new index");
        match (here, there) {
            (Insert::Inserted, Insert::Found(r)) => assert_eq!((row, r), (2, 2)),
            (Insert::Found(r), Insert::Inserted) => assert_eq!((row, r), (1, 1)),
            outcomes => panic!("both or neither inserted: {outcomes:?}"),
        }
        let mut copies = 0;
        new.for_each_present(|key, _| copies += usize::from(key == 7));
        assert_eq!(copies, 1);
    });
}

/// `remove_row` as eviction and expiry call it: retried in the new index
/// when it meets a migration.
fn remove_row_through(old: &Index, new: &Index, key: u64, row: u64) -> Remove {
    match old.remove_row(key, hash_key(key), row) {
        Remove::Migrating => {
            wait_for_migration(old);
            new.remove_row(key, hash_key(key), row)
        }
        outcome => outcome,
    }
}

/// An eviction's conditional unlink of key 5's row 1 races a remover that
/// removes the key and inserts it again with row 2: exactly one of them
/// removes row 1, and the stale `remove_row` never removes row 2.
#[test]
fn a_stale_remove_row_never_removes_a_reinserted_key() {
    model(|| {
        let index = Arc::new(Index::with_capacity(16));
        assert_eq!(insert(&index, 5, 1), Insert::Inserted);
        let other = Arc::clone(&index);
        let evictor = thread::spawn(move || other.remove_row(5, hash_key(5), 1));
        let removed = index.remove(5, hash_key(5));
        assert_eq!(insert(&index, 5, 2), Insert::Inserted);
        let evicted = evictor.join().unwrap();
        match (removed, evicted) {
            (Remove::Removed(1), Remove::Absent) | (Remove::Absent, Remove::Removed(1)) => {}
            outcomes => panic!("not exactly one remover of row 1: {outcomes:?}"),
        }
        assert_eq!(find(&index, 5), Some(2), "the re-inserted row stays");
    });
}

/// Two conditional unlinks of one row and a plain remove of its key:
/// exactly one of the three wins.
#[test]
fn exactly_one_of_two_remove_rows_and_a_remove_wins() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
        let index = Arc::new(Index::with_capacity(16));
        assert_eq!(insert(&index, 8, 3), Insert::Inserted);
        let spawn_remove_row = |index: &Arc<Index>| {
            let index = Arc::clone(index);
            thread::spawn(move || index.remove_row(8, hash_key(8), 3))
        };
        let a = spawn_remove_row(&index);
        let b = spawn_remove_row(&index);
        let plain = index.remove(8, hash_key(8));
        let outcomes = [plain, a.join().unwrap(), b.join().unwrap()];
        let winners = outcomes
            .iter()
            .filter(|&o| *o == Remove::Removed(3))
            .count();
        assert_eq!(winners, 1, "{outcomes:?}");
        assert!(outcomes
            .iter()
            .all(|o| matches!(o, Remove::Removed(3) | Remove::Absent)));
        assert_eq!(find(&index, 8), None);
    });
}

/// A conditional unlink with a row the key does not have (the key was
/// re-inserted before the eviction looked) is `Absent` and changes
/// nothing, also racing an insert of another key in the same group.
#[test]
fn remove_row_of_another_row_changes_nothing() {
    model(|| {
        let index = Arc::new(Index::with_capacity(16));
        assert_eq!(insert(&index, 5, 2), Insert::Inserted);
        let other = Arc::clone(&index);
        let inserter = thread::spawn(move || insert(&other, 6, 7));
        assert_eq!(index.remove_row(5, hash_key(5), 1), Remove::Absent);
        assert_eq!(inserter.join().unwrap(), Insert::Inserted);
        assert_eq!(find(&index, 5), Some(2));
        assert_eq!(find(&index, 6), Some(7));
    });
}

/// An eviction of key 1's row 10 races the migration of its group: the
/// row is removed exactly once, in whichever index holds it, and is not
/// copied back to life.
#[test]
fn remove_row_during_migration_is_never_lost() {
    model(|| {
        let (old, new) = migrating_pair();
        let (o, n) = (Arc::clone(&old), Arc::clone(&new));
        let migrator = thread::spawn(move || migrate(&o, &n));
        assert_eq!(remove_row_through(&old, &new, 1, 10), Remove::Removed(10));
        let copied = migrator.join().unwrap();
        assert!(copied <= 1);
        assert_eq!(find(&new, 1), None, "the evicted key was not resurrected");
        assert_eq!(find(&old, 1), None);
        assert_eq!(new.remove_row(1, hash_key(1), 10), Remove::Absent);
    });
}

/// A stale eviction of key 1's row 10, a remover that takes the key out
/// and inserts it again with row 11, and the migration of their group,
/// all at once: row 10 is removed exactly once and row 11 stays, in the
/// new index, once.
#[test]
fn a_stale_remove_row_racing_a_reinsert_and_a_migration() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(1);
    builder.check(|| {
        let old = Index::with_capacity(16);
        assert_eq!(insert(&old, 1, 10), Insert::Inserted);
        // The remover's reservation for its insert, made before the close.
        assert!(old.reserve(1));
        let bound = old.close().unwrap();
        let (old, new) = (Arc::new(old), Arc::new(Index::with_capacity(bound * 2)));
        let (o, n) = (Arc::clone(&old), Arc::clone(&new));
        let migrator = thread::spawn(move || migrate(&o, &n));
        let (o, n) = (Arc::clone(&old), Arc::clone(&new));
        let evictor = thread::spawn(move || remove_row_through(&o, &n, 1, 10));
        let removed = match old.remove(1, hash_key(1)) {
            Remove::Migrating => {
                wait_for_migration(&old);
                new.remove(1, hash_key(1))
            }
            outcome => outcome,
        };
        let mut budget = 1;
        let inserted = match old.insert(1, hash_key(1), 11, &mut budget, || {}) {
            Insert::Migrating => {
                wait_for_migration(&old);
                insert(&new, 1, 11)
            }
            outcome => outcome,
        };
        assert_eq!(inserted, Insert::Inserted);
        let evicted = evictor.join().unwrap();
        migrator.join().unwrap();
        match (removed, evicted) {
            (Remove::Removed(10), Remove::Absent) | (Remove::Absent, Remove::Removed(10)) => {}
            outcomes => panic!("not exactly one remover of row 10: {outcomes:?}"),
        }
        assert_eq!(find(&new, 1), Some(11), "the re-inserted row stays");
        let mut copies = 0;
        new.for_each_present(|key, _| copies += usize::from(key == 1));
        assert_eq!(copies, 1);
    });
}
