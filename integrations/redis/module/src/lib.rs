//! # dynemb-redis-module — dynemb-redis's bucket writes as native commands
//!
//! `dynemb-redis` makes every write that depends on a row's current state
//! atomic by running it on the server, as one Lua script call per bucket.
//! Lua's `struct` conversions make `accum`'s float additions the largest
//! cost on the server (three conversions of a row's floats). This module does the same writes in Rust: load it into every
//! node (`redis-server --loadmodule .../libdynemb_redis_module.so`, or
//! `loadmodule` in `redis.conf`) and `dynemb-redis` sends these commands
//! instead of the scripts (see its `RedisConfig::use_module`).
//!
//! | command | twin of the script |
//! |---|---|
//! | `DYNEMB.INSERT_ABSENT bucket record ttl mode stamp version [field body]...` | `INSERT_ABSENT` |
//! | `DYNEMB.UPSERT bucket record ttl mode stamp version [field values]...` | `UPSERT` |
//! | `DYNEMB.ACCUM bucket record ttl mode stamp version dim [field exists deltas]...` | `ACCUM` |
//! | `DYNEMB.WRITE_IF_UNCHANGED bucket record ttl [field expected row]...` | `WRITE_IF_UNCHANGED` |
//! | `DYNEMB.SCORES bucket` (a read) | `SCORES` |
//! | `DYNEMB.REMOVE_BELOW bucket record ttl threshold quota` | `REMOVE_BELOW` |
//!
//! Each takes the script's `KEYS` then its `ARGV` and answers what the
//! script answers (`SCORES` and `REMOVE_BELOW`, `restrict`'s scan and
//! removal and `expire`'s removal, read the bucket's rows in place with
//! `RedisModule_ScanKey` and look only at their scores: no row is
//! copied, where the scripts copy the whole bucket into Lua) ([`rows`]
//! says what each does to the rows, and where a corrupt stored row makes
//! the native form stricter than the script).
//!
//! Needs Redis 7.0 or later. In Redis 7.0 a module's commands belong to
//! no ACL category, so a user restricted by categories (`+@write`) needs
//! them by name (`+dynemb.accum` ...) or `+@all`; a client that may not
//! call them uses the scripts (`dynemb-redis` checks at open).
//!
//! # Invariants
//!
//! - **Atomic**: a command runs whole, as a script does (Redis runs one
//!   command at a time); concurrent writers lose no update.
//! - **At most once**: `record` names the write (one id per client call);
//!   a command that finds its record answers with it and changes nothing,
//!   and a command that runs stores its reply there (MessagePack, for
//!   `ttl` milliseconds), as the scripts do: a resent write is applied
//!   once. Records are the same format as the scripts', so either form
//!   reads the other's.
//! - **A malformed call changes nothing**: every argument is checked (the
//!   record's TTL bounded, so that recording cannot fail after the rows
//!   are written) and the new rows computed before the first write; an
//!   error is an error reply. A panic (a bug) is caught and answered as an
//!   error, never unwound into the server.
//! - **Memory**: a command that finds its record answers it whatever the
//!   server's memory (a resent write must get its first run's answer); a
//!   new write is refused whole when the server is over `maxmemory` (its
//!   `HSET` runs with the OOM check, before anything is written), so the
//!   commands do not carry `deny-oom` themselves. The commands' transient
//!   copies use the system allocator, outside Redis's `maxmemory`
//!   accounting (a few times the call's arguments).
//! - **Replication**: the writes (`HSET`, `SET`) are replicated as
//!   effects, as a script's are.
//!
//! The only `unsafe` is the C entry point and command shims that the
//! `redis-module` crate's `redis_module!` macro generates.
#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod record;
pub mod rows;

use redis_module::key::KeyFlags;
use redis_module::{
    CallOptions, CallOptionsBuilder, CallReply, CallResult, Context, RedisError, RedisResult,
    RedisString, RedisValue,
};
use rows::{lossy, AccumEntry, Effect, Guarded, Reply, Scoring};

/// Arguments before the per-row ones: `bucket record ttl`.
const WRITE_ARGS: usize = 3;

/// Longest record TTL, in milliseconds (a year; `dynemb-redis` asks for at
/// most four days): a `SET .. PX` of it cannot fail after the rows are
/// written.
const MAX_TTL_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// Bytes of a write's version.
const VERSION_BYTES: usize = 8;

/// A bucket write's common arguments and the rows it names.
struct Call<'a> {
    bucket: &'a [u8],
    record: &'a [u8],
    ttl: &'a [u8],
    /// The arguments after `ttl`.
    rest: Vec<&'a [u8]>,
}

impl<'a> Call<'a> {
    fn parse(args: &'a [RedisString]) -> Result<Call<'a>, RedisError> {
        // args[0] is the command's name.
        if args.len() < 1 + WRITE_ARGS {
            return Err(RedisError::WrongArity);
        }
        let ttl = args[3].as_slice();
        let valid_ttl = std::str::from_utf8(ttl)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
            .is_some_and(|t| (1..=MAX_TTL_MS).contains(&t));
        if !valid_ttl {
            return Err(error(format!(
                "the record's ttl {:?} is not a whole number of milliseconds in 1..={MAX_TTL_MS}",
                lossy(ttl)
            )));
        }
        Ok(Call {
            bucket: args[1].as_slice(),
            record: args[2].as_slice(),
            ttl,
            rest: args[4..].iter().map(RedisString::as_slice).collect(),
        })
    }
}

/// An error reply.
fn error(message: String) -> RedisError {
    RedisError::String(format!("ERR dynemb: {message}"))
}

/// How a command runs inside a module command.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// A read.
    Read,
    /// A write, replicated as an effect.
    Write,
    /// A write that is refused (before it runs) when Redis is over its
    /// `maxmemory`, replicated as an effect.
    WriteUnlessOom,
}

fn options(mode: Mode) -> CallOptions {
    let builder = CallOptionsBuilder::new().errors_as_replies();
    match mode {
        Mode::Read => builder.build(),
        Mode::Write => builder.replicate().build(),
        Mode::WriteUnlessOom => builder.replicate().verify_oom().build(),
    }
}

/// Runs a Redis command from inside a module command.
fn run_command(
    ctx: &Context,
    command: &str,
    args: &[&[u8]],
    mode: Mode,
) -> Result<CallReply<'static>, RedisError> {
    let result: CallResult<'static> = ctx.call_ext(command, &options(mode), args);
    result.map_err(|e| {
        error(format!(
            "{command} failed: {}",
            e.to_utf8_string().unwrap_or_default()
        ))
    })
}

/// The recorded reply of this write, if it ran before.
fn recorded(ctx: &Context, call: &Call<'_>) -> Result<Option<Reply>, RedisError> {
    match run_command(ctx, "GET", &[call.record], Mode::Read)? {
        CallReply::String(s) => record::decode(s.as_bytes()).map(Some).map_err(error),
        CallReply::Null(_) => Ok(None),
        other => Err(error(format!("GET of a record gave {other:?}"))),
    }
}

/// The stored rows of `fields` (`None` for absent ones), in order.
fn read_rows(
    ctx: &Context,
    bucket: &[u8],
    fields: &[&[u8]],
) -> Result<Vec<Option<Vec<u8>>>, RedisError> {
    if fields.is_empty() {
        return Ok(Vec::new());
    }
    let mut args = Vec::with_capacity(fields.len() + 1);
    args.push(bucket);
    args.extend_from_slice(fields);
    let CallReply::Array(rows) = run_command(ctx, "HMGET", &args, Mode::Read)? else {
        return Err(error("HMGET gave no array".into()));
    };
    rows.iter()
        .map(|row| match row {
            Ok(CallReply::String(s)) => Ok(Some(s.as_bytes().to_vec())),
            Ok(CallReply::Null(_)) => Ok(None),
            other => Err(error(format!("HMGET gave {other:?}"))),
        })
        .collect()
}

/// Writes the effect's rows, records its reply and answers with it.
fn apply(ctx: &Context, call: &Call<'_>, effect: Effect) -> RedisResult {
    if !effect.writes.is_empty() {
        let mut args: Vec<&[u8]> = Vec::with_capacity(2 * effect.writes.len() + 1);
        args.push(call.bucket);
        for (field, row) in &effect.writes {
            args.push(field);
            args.push(row);
        }
        run_command(ctx, "HSET", &args, Mode::WriteUnlessOom)?;
    }
    record_reply(ctx, call, effect.reply)
}

/// Records `reply` under the call's write id (for its TTL), so that a
/// resend is answered from it, and returns it.
fn record_reply(ctx: &Context, call: &Call<'_>, reply: Reply) -> RedisResult {
    let record = record::encode(&reply);
    run_command(
        ctx,
        "SET",
        &[call.record, &record, b"PX", call.ttl],
        Mode::Write,
    )?;
    Ok(value(reply))
}

fn value(reply: Reply) -> RedisValue {
    match reply {
        Reply::Int(i) => RedisValue::Integer(i),
        Reply::Bytes(b) => RedisValue::StringBuffer(b),
        Reply::Nil => RedisValue::Null,
        Reply::Array(items) => RedisValue::Array(items.into_iter().map(value).collect()),
    }
}

/// The common flow of a bucket write: answer from the record if it ran;
/// else parse, read the rows, compute the effect, write and record it.
/// `run(rest, stored_of)` parses the per-row arguments (`rest`), asks
/// `stored_of` for the rows of the fields it names, and computes the
/// effect.
fn bucket_write(
    ctx: &Context,
    args: &[RedisString],
    run: impl FnOnce(
        &[&[u8]],
        &mut dyn FnMut(&[&[u8]]) -> Result<Vec<Option<Vec<u8>>>, RedisError>,
    ) -> Result<Effect, RedisError>,
) -> RedisResult {
    let call = Call::parse(args)?;
    if let Some(reply) = recorded(ctx, &call)? {
        return Ok(value(reply));
    }
    let effect = run(&call.rest, &mut |fields| {
        read_rows(ctx, call.bucket, fields)
    })?;
    apply(ctx, &call, effect)
}

/// The leading `mode stamp version` arguments of the scored writes.
struct Scored<'a, 'b> {
    scoring: Scoring,
    version: &'a [u8],
    /// The arguments after them.
    tail: &'b [&'a [u8]],
}

fn scored<'a, 'b>(rest: &'b [&'a [u8]]) -> Result<Scored<'a, 'b>, RedisError> {
    let [mode, stamp, version, tail @ ..] = rest else {
        return Err(RedisError::WrongArity);
    };
    if version.len() != VERSION_BYTES {
        return Err(error(format!(
            "a version is {VERSION_BYTES} bytes, got {}",
            version.len()
        )));
    }
    Ok(Scored {
        scoring: Scoring::new(mode, stamp).map_err(error)?,
        version,
        tail,
    })
}

/// The `k`-sized groups of `args` (an error if they do not divide).
fn groups<'b, 'a>(
    args: &'b [&'a [u8]],
    k: usize,
) -> Result<std::slice::ChunksExact<'b, &'a [u8]>, RedisError> {
    if args.len().is_multiple_of(k) {
        Ok(args.chunks_exact(k))
    } else {
        Err(RedisError::WrongArity)
    }
}

/// A scored write whose rows are `field value` pairs: `apply` is
/// [`rows::insert_absent`] or [`rows::upsert`].
fn pairs_write(ctx: &Context, args: &[RedisString], apply: PairsWrite) -> RedisResult {
    bucket_write(ctx, args, |rest, stored_of| {
        let Scored {
            scoring,
            version,
            tail,
        } = scored(rest)?;
        let pairs: Vec<(&[u8], &[u8])> = groups(tail, 2)?.map(|p| (p[0], p[1])).collect();
        let fields: Vec<&[u8]> = pairs.iter().map(|p| p.0).collect();
        let stored = stored_of(&fields)?;
        apply(scoring, version, &pairs, &stored).map_err(error)
    })
}

/// The row logic of a [`pairs_write`].
type PairsWrite =
    fn(Scoring, &[u8], &[(&[u8], &[u8])], &[Option<Vec<u8>>]) -> Result<Effect, String>;

fn insert_absent_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    pairs_write(ctx, &args, rows::insert_absent)
}

fn upsert_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    pairs_write(ctx, &args, rows::upsert)
}

fn accum_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    bucket_write(ctx, &args, |rest, stored_of| {
        let Scored {
            scoring,
            version,
            tail,
        } = scored(rest)?;
        let [dim, tail @ ..] = tail else {
            return Err(RedisError::WrongArity);
        };
        let dim = std::str::from_utf8(dim)
            .ok()
            .and_then(|d| d.parse::<usize>().ok())
            .ok_or_else(|| error(format!("dim {:?} is not a number", lossy(dim))))?;
        let entries = groups(tail, 3)?
            .map(|t| match t[1] {
                b"1" | b"0" => Ok(AccumEntry {
                    field: t[0],
                    exists: t[1] == b"1",
                    deltas: t[2],
                }),
                other => Err(error(format!("exists is {:?}, not 1 or 0", lossy(other)))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fields: Vec<&[u8]> = entries.iter().map(|e| e.field).collect();
        let stored = stored_of(&fields)?;
        rows::accum(scoring, version, dim, &entries, &stored).map_err(error)
    })
}

fn write_if_unchanged_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    bucket_write(ctx, &args, |rest, stored_of| {
        let entries: Vec<Guarded<'_>> = groups(rest, 3)?
            .map(|t| Guarded {
                field: t[0],
                expected: t[1],
                row: t[2],
            })
            .collect();
        let fields: Vec<&[u8]> = entries.iter().map(|e| e.field).collect();
        let stored = stored_of(&fields)?;
        rows::write_if_unchanged(&entries, &stored).map_err(error)
    })
}

/// The `(field, score)` of every row of the hash `bucket` (none if the
/// key does not exist; an error if it is not a hash or a row has no
/// header), read in place with `RedisModule_ScanKey`: no row is copied.
fn bucket_scores(
    ctx: &Context,
    bucket: &RedisString,
) -> Result<Vec<([u8; rows::FIELD_BYTES], u64)>, RedisError> {
    let key = ctx.open_key_with_flags(bucket, KeyFlags::NOEFFECTS);
    if key.is_null() {
        return Ok(Vec::new());
    }
    if key.key_type() != redis_module::KeyType::Hash {
        return Err(RedisError::WrongType);
    }
    let mut found = Vec::new();
    let mut bad = None;
    let mut restoring = None;
    redis_module::ScanKeyCursor::new(key).for_each(|_, field, row| {
        if field.as_slice() == rows::RESTORING_FIELD {
            restoring = Some(rows::lossy(row.as_slice()));
            return;
        }
        match rows::scored(field.as_slice(), row.as_slice()) {
            Ok(Some(entry)) => found.push(entry),
            Ok(None) => {}
            Err(e) => bad = Some(e),
        }
    });
    if let Some(checkpoint) = restoring {
        return Err(RedisError::String(format!(
            "{} {checkpoint}",
            rows::RESTORING_ERROR
        )));
    }
    match bad {
        Some(e) => Err(error(e)),
        None => Ok(found),
    }
}

/// `DYNEMB.SCORES bucket`: the scores of the bucket's rows, 8
/// little-endian bytes each, as one bulk string; the error
/// [`rows::RESTORING_ERROR`] if the bucket is being restored.
fn scores_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let [_, bucket] = &args[..] else {
        return Err(RedisError::WrongArity);
    };
    let out: Vec<u8> = bucket_scores(ctx, bucket)?
        .iter()
        .flat_map(|(_, score)| score.to_le_bytes())
        .collect();
    Ok(RedisValue::StringBuffer(out))
}

/// `DYNEMB.REMOVE_BELOW bucket record ttl threshold quota`: `restrict`'s
/// removal, and `expire`'s with a quota of 0 (see [`rows::prune`];
/// `threshold` 8 little-endian bytes, `quota` decimal), recorded as every
/// bucket write is. Replies `[below, ties removed, ties left]`; removes
/// nothing and answers the error [`rows::RESTORING_ERROR`] if the bucket
/// is being restored.
fn remove_below_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let call = Call::parse(&args)?;
    let [threshold, quota] = call.rest[..] else {
        return Err(RedisError::WrongArity);
    };
    if let Some(reply) = recorded(ctx, &call)? {
        return Ok(value(reply));
    }
    let threshold: [u8; 8] = threshold
        .try_into()
        .map_err(|_| error(format!("a threshold is 8 bytes, got {}", threshold.len())))?;
    let quota = std::str::from_utf8(quota)
        .ok()
        .and_then(|q| q.parse::<u64>().ok())
        .ok_or_else(|| error(format!("quota {:?} is not a number", lossy(quota))))?;
    let found = bucket_scores(ctx, &args[1])?;
    let pruning = rows::prune(&found, u64::from_le_bytes(threshold), quota);
    drop(found);
    for victims in pruning.victims.chunks(1024) {
        let mut hdel: Vec<&[u8]> = Vec::with_capacity(victims.len() + 1);
        hdel.push(call.bucket);
        hdel.extend(victims.iter().map(Vec::as_slice));
        run_command(ctx, "HDEL", &hdel, Mode::Write)?;
    }
    record_reply(ctx, &call, pruning.reply())
}

/// Runs a command's handler; a panic (a bug: every input is checked) is an
/// error reply, not an abort of the server (a panic must not unwind into
/// Redis's C code).
fn guarded(
    ctx: &Context,
    args: Vec<RedisString>,
    handler: fn(&Context, Vec<RedisString>) -> RedisResult,
) -> RedisResult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(ctx, args)))
        .unwrap_or_else(|_| Err(error("internal error (a panic) in the command".into())))
}

/// The module's entry point (`RedisModule_OnLoad`) and command shims,
/// which the `redis_module!` macro generates (the crate's only `unsafe`),
/// and the commands, each [`guarded`].
#[allow(unsafe_code)]
mod entry {
    use super::guarded;
    use redis_module::{redis_module, Context, RedisResult, RedisString};

    fn insert_absent(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guarded(ctx, args, super::insert_absent_command)
    }

    fn upsert(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guarded(ctx, args, super::upsert_command)
    }

    fn accum(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guarded(ctx, args, super::accum_command)
    }

    fn write_if_unchanged(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guarded(ctx, args, super::write_if_unchanged_command)
    }

    fn scores(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guarded(ctx, args, super::scores_command)
    }

    fn remove_below(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
        guarded(ctx, args, super::remove_below_command)
    }

    redis_module! {
        name: "dynemb",
        version: 1,
        // The system allocator: the commands' allocations are transient, and
        // the unit tests run without a server.
        allocator: (std::alloc::System, std::alloc::System),
        data_types: [],
        commands: [
            ["dynemb.insert_absent", insert_absent, "write", 1, 2, 1, ""],
            ["dynemb.upsert", upsert, "write", 1, 2, 1, ""],
            ["dynemb.accum", accum, "write", 1, 2, 1, ""],
            ["dynemb.write_if_unchanged", write_if_unchanged, "write", 1, 2, 1, ""],
            ["dynemb.scores", scores, "readonly", 1, 1, 1, ""],
            ["dynemb.remove_below", remove_below, "write", 1, 2, 1, ""],
        ],
    }
}
