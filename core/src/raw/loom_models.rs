//! loom models of the index protocol (run with `RUSTFLAGS="--cfg loom"`, see
//! `.ci/run`): every interleaving of two threads on a one-group index, for
//! insert/insert, insert/remove, insert/find and one migration step against
//! a reader, a remover and an inserter.

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
