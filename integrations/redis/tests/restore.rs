//! A restore that stops part-way (here: the server runs out of memory
//! while the rows are written) leaves the variable marked: every handle's
//! reads are errors naming the checkpoint, the whole-table operations and
//! `load` refuse to run, and running the restore again finishes it
//! exactly (the new rows, none of the old). `clear` ends it too. A
//! `restrict` that meets a bucket being restored stops there. Under
//! both forms of the writes.

use dynemb::{BackendErrorKind, Error, Initializer, RestrictPolicy, Variable};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::{unique_name, Form, Server};

const DIM: usize = 16;

/// Rows of the checkpoint restored (about 3 MB on the server).
const NEW_ROWS: i64 = 20_000;

fn open(config: RedisConfig, name: &str) -> RedisVariable<i64> {
    RedisVariable::open(
        Variable::<i64>::builder(name)
            .dim(DIM)
            .initializer(Initializer::Constant(0.5))
            .restrict_policy(RestrictPolicy::Frequency),
        config,
    )
    .unwrap()
}

fn values(keys: &[i64]) -> Vec<f32> {
    keys.iter()
        .flat_map(|&k| (0..DIM).map(move |j| (k + j as i64) as f32))
        .collect()
}

fn used_memory(server: &Server) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Limits the server's memory to what it uses now plus `room` bytes,
/// once the memory of removed keys has been freed (`UNLINK` frees it in
/// the background).
fn limit_memory(server: &Server, room: u64) {
    loop {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query(&mut server.connection())
            .unwrap();
        if info.contains("lazyfree_pending_objects:0") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    set_maxmemory(server, used_memory(server) + room);
}

fn set_maxmemory(server: &Server, bytes: u64) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .query(&mut server.connection())
        .unwrap();
}

/// Whether `err` is the error of a variable being restored from `dir`.
fn is_restoring(err: &Error, dir: &std::path::Path) -> bool {
    matches!(
        err,
        Error::Backend {
            kind: BackendErrorKind::NotServing,
            message,
            ..
        } if message.contains("restore") && message.contains(&dir.display().to_string())
    )
}

#[test]
fn an_interrupted_restore_is_an_error_to_every_reader_and_a_retry_finishes_it_with_the_module() {
    interrupted_restore(Form::Module);
}

#[test]
fn an_interrupted_restore_is_an_error_to_every_reader_and_a_retry_finishes_it_with_the_scripts() {
    interrupted_restore(Form::Lua);
}

fn interrupted_restore(form: Form) {
    let Some(server) = Server::start() else {
        return;
    };
    if !form.is_available() {
        return;
    }
    let config = form.config(RedisConfig {
        buckets: 16,
        ..server.config()
    });
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("new");
    let new_keys: Vec<i64> = (0..NEW_ROWS).collect();
    let name = unique_name("emb");
    {
        let source = Variable::<i64>::builder(&name)
            .dim(DIM)
            .restrict_policy(RestrictPolicy::Frequency)
            .build()
            .unwrap();
        source.upsert(&new_keys, &values(&new_keys)).unwrap();
        source
            .upsert(&new_keys[..10], &values(&new_keys[..10]))
            .unwrap();
        source.save(&checkpoint).unwrap();
    }
    let restorer = open(config.clone(), &name);
    let reader = open(config, &name);
    let old_keys: Vec<i64> = (-500..0).collect();
    restorer.upsert(&old_keys, &values(&old_keys)).unwrap();

    // The rows no longer fit: the restore fails after it began writing.
    limit_memory(&server, 1_000_000);
    let err = restorer.restore(&checkpoint).unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    set_maxmemory(&server, 0);

    // Every handle can tell, and reads neither the old rows nor the new.
    let mut out = vec![0.0; 2 * DIM];
    for keys in [[-5, -6], [5, 6], [-5, 6]] {
        let err = reader.lookup(&keys, &mut out).unwrap_err();
        assert!(is_restoring(&err, &checkpoint), "{err}");
    }
    let err = reader.lookup_or_insert(&[7, 8], &mut out).unwrap_err();
    assert!(is_restoring(&err, &checkpoint), "{err}");
    let err = reader.lookup_scores(&[7], &mut [0]).unwrap_err();
    assert!(is_restoring(&err, &checkpoint), "{err}");
    let err = reader.size().unwrap_err();
    assert!(is_restoring(&err, &checkpoint), "{err}");
    let err = reader.restrict(1, 0).unwrap_err();
    assert!(is_restoring(&err, &checkpoint), "{err}");
    let err = reader.export_chunks(100).next().unwrap().unwrap_err();
    assert!(is_restoring(&err, &checkpoint), "{err}");
    let err = reader.save(dir.path().join("half")).unwrap_err();
    assert!(is_restoring(&err, &checkpoint), "{err}");
    assert!(
        !dir.path().join("half").exists(),
        "no checkpoint of half a table"
    );
    let err = reader.load(&checkpoint).unwrap_err();
    assert!(is_restoring(&err, &checkpoint), "{err}");

    // Running it again finishes it exactly.
    restorer.restore(&checkpoint).unwrap();
    assert_eq!(reader.size().unwrap(), NEW_ROWS as usize);
    let mut rows = vec![0.0; new_keys.len() * DIM];
    reader.lookup(&new_keys, &mut rows).unwrap();
    assert_eq!(rows, values(&new_keys));
    let mut scores = vec![0; 20];
    reader.lookup_scores(&new_keys[..20], &mut scores).unwrap();
    assert_eq!(scores[..10], [2; 10], "scores restored");
    assert_eq!(scores[10..], [1; 10]);
    let mut exists = vec![true; old_keys.len()];
    reader
        .lookup_with_exists(&old_keys, &mut vec![0.0; old_keys.len() * DIM], &mut exists)
        .unwrap();
    assert!(exists.iter().all(|&e| !e), "no old row is left");

    // `clear` ends an interrupted restore too, leaving the variable empty.
    reader.clear().unwrap();
    restorer.upsert(&old_keys, &values(&old_keys)).unwrap();
    limit_memory(&server, 1_000_000);
    assert!(restorer.restore(&checkpoint).is_err());
    set_maxmemory(&server, 0);
    assert!(reader.size().is_err());
    reader.clear().unwrap();
    assert_eq!(reader.size().unwrap(), 0);
    reader.lookup(&[5, -5], &mut out).unwrap();
    assert_eq!(out, [0.5; 2 * DIM]);
}

/// A restore that begins while a `restrict` runs marks buckets the
/// restrict has not reached yet (here: a bucket marked, as a restore's
/// step 2 leaves it, after `restrict`'s start checked the metadata).
/// Scanning or pruning such a bucket is an error naming the checkpoint,
/// and nothing in it is removed.
#[test]
fn restrict_stops_at_a_bucket_being_restored() {
    for form in Form::available() {
        let Some(server) = Server::start() else {
            return;
        };
        let config = form.config(RedisConfig {
            buckets: 4,
            ..server.config()
        });
        let name = unique_name("restrict_marked");
        let var = open(config, &name);
        let keys: Vec<i64> = (0..200).collect();
        var.upsert(&keys, &values(&keys)).unwrap();
        var.upsert(&keys[..50], &values(&keys[..50])).unwrap();
        let marked = format!("dynemb:{name}:{{3}}");
        let mut conn = server.connection();
        let rows_before: u64 = redis::cmd("HLEN").arg(&marked).query(&mut conn).unwrap();
        let _: () = redis::cmd("HSET")
            .arg(&marked)
            .arg("restoring")
            .arg("/checkpoints/new")
            .query(&mut conn)
            .unwrap();
        let err = var.restrict(50, 0).unwrap_err();
        assert!(
            is_restoring(&err, std::path::Path::new("/checkpoints/new")),
            "{form:?}: {err}"
        );
        let rows_after: u64 = redis::cmd("HLEN").arg(&marked).query(&mut conn).unwrap();
        assert_eq!(rows_after, rows_before + 1, "{form:?}: nothing removed");
    }
}
