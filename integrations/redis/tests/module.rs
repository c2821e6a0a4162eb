//! `dynemb-redis-module`'s commands on a real server: malformed calls are
//! error replies that change nothing; a write's record is read by either
//! form (a Lua script's record answers a module command, and a module
//! command's record unpacks in Lua as the script's own would); a resent
//! write is answered from its record even when the server is over its
//! memory limit, while a new one is refused whole; a variable whose user
//! may not call the module's commands uses the scripts. Their semantics
//! under a variable are the other tests' (each runs under both forms).

use dynemb::{Initializer, Variable};
use dynemb_redis::{RedisConfig, RedisVariable};
use dynemb_test_support::servers::Server;
use redis::Value;

const BUCKET: &[u8] = b"t:emb:{0}";

fn row(version: &[u8; 8], score: u64, values: &[f32]) -> Vec<u8> {
    let mut out = version.to_vec();
    out.extend_from_slice(&score.to_le_bytes());
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    out
}

fn floats(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `DYNEMB.ACCUM` on [`BUCKET`] with `record` and the given arguments
/// after the ttl.
fn accum(conn: &mut redis::Connection, record: &str, rest: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("DYNEMB.ACCUM");
    cmd.arg(BUCKET).arg(record).arg(60_000);
    for a in rest {
        cmd.arg(*a);
    }
    cmd.query(conn)
}

/// The bucket's fields and rows.
fn bucket(conn: &mut redis::Connection) -> Vec<(Vec<u8>, Vec<u8>)> {
    redis::cmd("HGETALL").arg(BUCKET).query(conn).unwrap()
}

#[test]
fn malformed_calls_are_errors_and_change_nothing() {
    let Some(server) = Server::start_with_module() else {
        return;
    };
    let mut conn = server.connection();
    let stored = row(b"VERSION0", 1, &[1.0, 2.0]);
    let _: () = redis::cmd("HSET")
        .arg(BUCKET)
        .arg(b"key")
        .arg(&stored)
        .query(&mut conn)
        .unwrap();
    let short = row(b"VERSION0", 1, &[1.0]);
    let _: () = redis::cmd("HSET")
        .arg(BUCKET)
        .arg(b"short")
        .arg(&short)
        .query(&mut conn)
        .unwrap();
    let d2 = floats(&[1.0, 1.0]);
    let d1 = floats(&[1.0]);
    let cases: Vec<(&str, Vec<&[u8]>)> = vec![
        ("no scoring arguments", vec![]),
        (
            "an unknown score mode",
            vec![&b"x"[..], b"", b"NEWVERS0", b"2", b"key", b"1", &d2],
        ),
        (
            "a short stamp",
            vec![&b"t"[..], b"abc", b"NEWVERS0", b"2", b"key", b"1", &d2],
        ),
        (
            "dim is not a number",
            vec![&b"n"[..], b"", b"NEWVERS0", b"two", b"key", b"1", &d2],
        ),
        (
            "a row's arguments cut short",
            vec![&b"n"[..], b"", b"NEWVERS0", b"2", b"key", b"1"],
        ),
        (
            "exists is not 1 or 0",
            vec![&b"n"[..], b"", b"NEWVERS0", b"2", b"key", b"yes", &d2],
        ),
        (
            "deltas of the wrong length",
            vec![&b"n"[..], b"", b"NEWVERS0", b"2", b"key", b"1", &d1],
        ),
        (
            "a dim whose bytes overflow",
            vec![
                &b"n"[..],
                b"",
                b"NEWVERS0",
                b"4611686018427387904",
                b"key",
                b"1",
                &d2,
            ],
        ),
        (
            "a version of 3 bytes",
            vec![&b"n"[..], b"", b"NEW", b"2", b"key", b"1", &d2],
        ),
        (
            "a good row, then a stored row shorter than dim",
            vec![
                &b"n"[..],
                b"",
                b"NEWVERS0",
                b"2",
                b"key",
                b"1",
                &d2,
                b"short",
                b"1",
                &d2,
            ],
        ),
    ];
    for (i, (what, rest)) in cases.iter().enumerate() {
        let got = accum(&mut conn, &format!("rec{i}"), rest);
        assert!(got.is_err(), "{what}: {got:?}");
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("rec{i}"))
            .query(&mut conn)
            .unwrap();
        assert!(!exists, "{what}: no record of a failed call");
    }
    let mut bad_ttl = redis::cmd("DYNEMB.UPSERT");
    bad_ttl
        .arg(BUCKET)
        .arg("r")
        .arg("soon")
        .arg("n")
        .arg("")
        .arg("NEWVERS0");
    assert!(
        bad_ttl.query::<Value>(&mut conn).is_err(),
        "a ttl that is not a number"
    );
    let mut no_ttl = redis::cmd("DYNEMB.WRITE_IF_UNCHANGED");
    no_ttl.arg(BUCKET).arg("r");
    assert!(
        no_ttl.query::<Value>(&mut conn).is_err(),
        "too few arguments"
    );
    let mut garbled = redis::cmd("SET");
    garbled.arg("garbled").arg(b"\x92\x01");
    let _: () = garbled.query(&mut conn).unwrap();
    let got = accum(
        &mut conn,
        "garbled",
        &[b"n", b"", b"NEWVERS0", b"2", b"key", b"1", &d2],
    );
    assert!(got.is_err(), "a garbled record: {got:?}");

    let mut rows = bucket(&mut conn);
    rows.sort();
    assert_eq!(
        rows,
        vec![(b"key".to_vec(), stored), (b"short".to_vec(), short)],
        "every row as it was"
    );
}

#[test]
fn records_are_read_by_either_form() {
    let Some(server) = Server::start_with_module() else {
        return;
    };
    let mut conn = server.connection();
    // A record a script wrote (`cmsgpack.pack` of its reply) answers the
    // module's command, which then changes nothing.
    let _: () = redis::cmd("EVAL")
        .arg("redis.call('SET', KEYS[1], cmsgpack.pack({false, 'ab', 3, -1}))")
        .arg(1)
        .arg("lua-record")
        .query(&mut conn)
        .unwrap();
    let d = floats(&[1.0]);
    let got = accum(
        &mut conn,
        "lua-record",
        &[b"n", b"", b"NEWVERS0", b"1", b"key", b"0", &d],
    )
    .unwrap();
    assert_eq!(
        got,
        Value::Array(vec![
            Value::Nil,
            Value::BulkString(b"ab".to_vec()),
            Value::Int(3),
            Value::Int(-1),
        ])
    );
    assert!(
        bucket(&mut conn).is_empty(),
        "the recorded call is not run again"
    );

    // The module's record of an insert (nil for the inserted row, the
    // stored row for the other) unpacks in Lua as the script's reply.
    let stored = row(b"VERSION0", 1, &[2.0]);
    let _: () = redis::cmd("HSET")
        .arg(BUCKET)
        .arg(b"old")
        .arg(&stored)
        .query(&mut conn)
        .unwrap();
    let mut insert = redis::cmd("DYNEMB.INSERT_ABSENT");
    insert
        .arg(BUCKET)
        .arg("module-record")
        .arg(60_000)
        .arg("n")
        .arg("")
        .arg("NEWVERS0")
        .arg(b"new")
        .arg(&d)
        .arg(b"old")
        .arg(&d);
    let expected = Value::Array(vec![Value::Nil, Value::BulkString(stored)]);
    assert_eq!(insert.query::<Value>(&mut conn).unwrap(), expected);
    let in_lua: Value = redis::cmd("EVAL")
        .arg("return cmsgpack.unpack(redis.call('GET', KEYS[1]))")
        .arg(1)
        .arg("module-record")
        .query(&mut conn)
        .unwrap();
    assert_eq!(in_lua, expected);
    let ttl: i64 = redis::cmd("PTTL")
        .arg("module-record")
        .query(&mut conn)
        .unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "the record expires ({ttl} ms)");
}

#[test]
fn over_maxmemory_a_resend_gets_its_record_and_a_new_write_changes_nothing() {
    let Some(server) = Server::start_with_module() else {
        return;
    };
    let mut conn = server.connection();
    let d = floats(&[1.0]);
    let args: [&[u8]; 7] = [b"f", b"", b"NEWVERS0", b"1", b"key", b"0", &d];
    assert_eq!(
        accum(&mut conn, "first", &args).unwrap(),
        Value::Array(vec![])
    );
    let before = bucket(&mut conn);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut conn)
        .unwrap();
    // The resend of the applied write: its recorded reply, no error.
    assert_eq!(
        accum(&mut conn, "first", &args).unwrap(),
        Value::Array(vec![])
    );
    // A new write (an add to the row): refused before it writes
    // anything, and no record.
    let add: [&[u8]; 7] = [b"f", b"", b"NEWVERS1", b"1", b"key", b"1", &d];
    let refused = accum(&mut conn, "second", &add).unwrap_err();
    assert!(refused.to_string().contains("OOM"), "{refused}");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        bucket(&mut conn),
        before,
        "the rows as the first write left them"
    );
    let recorded: bool = redis::cmd("EXISTS").arg("second").query(&mut conn).unwrap();
    assert!(!recorded, "a refused write leaves no record");
}

/// A variable opened as `user` (password `pw`) on `server`.
fn open_as(server: &Server, user: &str, name: &str) -> RedisVariable<i64> {
    RedisVariable::open(
        Variable::<i64>::builder(name)
            .dim(2)
            .initializer(Initializer::Zeros),
        RedisConfig {
            username: Some(user.into()),
            password: Some("pw".into()),
            ..server.config()
        },
    )
    .unwrap()
}

#[test]
fn a_user_not_allowed_the_modules_commands_gets_the_scripts() {
    let Some(server) = Server::start_with_module() else {
        return;
    };
    let mut conn = server.connection();
    // Enough for the scripts, but no module command (in Redis 7.0 they
    // belong to no ACL category, so `+@write` does not grant them) and no
    // `COMMAND`.
    let base =
        "on >pw ~* &* +@read +@write +@scripting +@keyspace +@connection +cluster|slots +info";
    for (user, extra) in [("scripts", ""), ("scripts_and_command", " +command")] {
        let mut acl = redis::cmd("ACL");
        acl.arg("SETUSER").arg(user);
        for rule in format!("{base}{extra}").split_whitespace() {
            acl.arg(rule);
        }
        let _: () = acl.query(&mut conn).unwrap();
        let var = open_as(&server, user, user);
        assert!(
            !var.uses_module(),
            "{user}: the module's commands are not allowed"
        );
        var.accum(&[1], &[1.0, 2.0], &[false]).unwrap();
        var.accum(&[1], &[1.0, 2.0], &[true]).unwrap();
        let mut row = [0.0; 2];
        var.lookup(&[1], &mut row).unwrap();
        assert_eq!(row, [2.0, 4.0], "{user}");
    }
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("everything")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query(&mut conn)
        .unwrap();
    let var = open_as(&server, "everything", "everything");
    assert!(var.uses_module());
    var.accum(&[1], &[1.0, 2.0], &[false]).unwrap();
}

/// `DYNEMB.REMOVE_BELOW` on `bucket` with `record` and the given
/// threshold and quota arguments.
fn remove_below(
    conn: &mut redis::Connection,
    bucket: &[u8],
    record: &str,
    rest: &[&[u8]],
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("DYNEMB.REMOVE_BELOW");
    cmd.arg(bucket).arg(record).arg(60_000);
    for a in rest {
        cmd.arg(*a);
    }
    cmd.query(conn)
}

#[test]
fn restricts_commands_read_scores_prune_once_and_refuse_malformed_calls() {
    let Some(server) = Server::start_with_module() else {
        return;
    };
    let mut conn = server.connection();
    for (field, score) in [
        (&b"aaaaaaaa"[..], 1u64),
        (b"bbbbbbbb", 5),
        (b"cccccccc", 3),
        (b"dddddddd", 3),
        (b"eeeeeeee", 3),
    ] {
        let _: () = redis::cmd("HSET")
            .arg(BUCKET)
            .arg(field)
            .arg(row(b"VERSION0", score, &[1.0, 2.0]))
            .query(&mut conn)
            .unwrap();
    }
    let _: () = redis::cmd("HSET")
        .arg(BUCKET)
        .arg("not a row")
        .arg("anything")
        .query(&mut conn)
        .unwrap();

    // The scores of the rows, and only of the rows.
    let scores: Vec<u8> = redis::cmd("DYNEMB.SCORES")
        .arg(BUCKET)
        .query(&mut conn)
        .unwrap();
    let mut scores: Vec<u64> = scores
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    scores.sort();
    assert_eq!(scores, [1, 3, 3, 3, 5]);
    let none: Vec<u8> = redis::cmd("DYNEMB.SCORES")
        .arg("absent")
        .query(&mut conn)
        .unwrap();
    assert!(none.is_empty());
    let _: () = redis::cmd("SET")
        .arg("a-string")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    for bad in [
        redis::cmd("DYNEMB.SCORES").arg("a-string").clone(),
        redis::cmd("DYNEMB.SCORES").arg(BUCKET).arg("extra").clone(),
    ] {
        assert!(bad.query::<Value>(&mut conn).is_err());
    }

    // Malformed calls and a corrupt row change nothing and record nothing.
    let three = 3u64.to_le_bytes();
    let before = {
        let mut rows = bucket(&mut conn);
        rows.sort();
        rows
    };
    let corrupt: &[u8] = b"t:emb:{1}";
    let _: () = redis::cmd("HSET")
        .arg(corrupt)
        .arg(b"ffffffff")
        .arg(row(b"VERSION0", 0, &[1.0]))
        .arg(b"gggggggg")
        .arg(b"short")
        .query(&mut conn)
        .unwrap();
    type Case<'a> = (&'a str, &'a [u8], Vec<&'a [u8]>);
    let cases: Vec<Case<'_>> = vec![
        ("a threshold of 3 bytes", BUCKET, vec![&b"abc"[..], b"2"]),
        (
            "a quota that is not a number",
            BUCKET,
            vec![&three[..], b"x"],
        ),
        ("no quota", BUCKET, vec![&three[..]]),
        (
            "a stored row without a header",
            corrupt,
            vec![&three[..], b"0"],
        ),
    ];
    for (i, (what, key, rest)) in cases.iter().enumerate() {
        let got = remove_below(&mut conn, key, &format!("bad{i}"), rest);
        assert!(got.is_err(), "{what}: {got:?}");
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("bad{i}"))
            .query(&mut conn)
            .unwrap();
        assert!(!exists, "{what}: no record of a failed call");
    }
    let mut after = bucket(&mut conn);
    after.sort();
    assert_eq!(after, before, "every row as it was");
    let len: usize = redis::cmd("HLEN").arg(corrupt).query(&mut conn).unwrap();
    assert_eq!(len, 2, "the corrupt bucket as it was");

    // Below the threshold goes, ties up to the quota, other fields stay;
    // a resend answers from its record and removes nothing more.
    let expected = Value::Array(vec![Value::Int(1), Value::Int(2), Value::Int(1)]);
    for _ in 0..2 {
        let got = remove_below(&mut conn, BUCKET, "pruned", &[&three, b"2"]).unwrap();
        assert_eq!(got, expected);
        let fields: Vec<Vec<u8>> = bucket(&mut conn).into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields.len(), 3, "{fields:?}");
        assert!(fields.contains(&b"bbbbbbbb".to_vec()));
        assert!(fields.contains(&b"not a row".to_vec()));
    }

    // A bucket a restore has marked: both commands refuse it, naming the
    // checkpoint, and nothing is removed or recorded.
    let marked: &[u8] = b"t:emb:{2}";
    let _: () = redis::cmd("HSET")
        .arg(marked)
        .arg(b"aaaaaaaa")
        .arg(row(b"VERSION0", 1, &[1.0, 2.0]))
        .arg("restoring")
        .arg("/checkpoints/new")
        .query(&mut conn)
        .unwrap();
    let scores = redis::cmd("DYNEMB.SCORES")
        .arg(marked)
        .query::<Value>(&mut conn)
        .unwrap_err();
    let removed = remove_below(&mut conn, marked, "marked", &[&three, b"1"]).unwrap_err();
    for err in [scores, removed] {
        assert_eq!(err.code(), Some("DYNEMB_RESTORING"), "{err:?}");
        assert!(format!("{err:?}").contains("/checkpoints/new"), "{err:?}");
    }
    let len: usize = redis::cmd("HLEN").arg(marked).query(&mut conn).unwrap();
    assert_eq!(len, 2, "the marked bucket as it was");
    let exists: bool = redis::cmd("EXISTS").arg("marked").query(&mut conn).unwrap();
    assert!(!exists, "no record of a refused call");
    let in_lua: Value = redis::cmd("EVAL")
        .arg("return cmsgpack.unpack(redis.call('GET', KEYS[1]))")
        .arg(1)
        .arg("pruned")
        .query(&mut conn)
        .unwrap();
    assert_eq!(in_lua, expected, "a record the scripts read");
}
