//! The Lua scripts that run on the servers: every write that depends on a
//! row's current state happens inside one script call on the row's bucket,
//! which Redis runs atomically, so concurrent writers (threads or
//! processes) never lose one another's updates.
//!
//! Each bucket script takes the bucket's key as `KEYS[1]` and works on the
//! rows named in `ARGV`, in order (so a key repeated in one batch behaves
//! as it does on a local variable). Rows are laid out as [`crate::layout`]
//! says: an 8-byte version, an 8-byte score, then `f32`s, all
//! little-endian. Every write stores the version the client passes
//! (random per call, see [`crate::layout::new_version`]), so a row read
//! with version `v` and still at `v` has not been written since.
//!
//! # Every bucket write runs at most once
//!
//! A write whose reply was lost (a timeout, a broken connection) is sent
//! again by [`crate::cluster`], so each bucket write must be safe to run
//! twice. Each one is a [`recorded`] script: `KEYS[2]` is a record key of
//! its own, `<bucket key>:w:<write id>` (the same hash tag, so the same
//! cluster node), named by a random id the client draws per call
//! ([`crate::layout::new_version`]), and `ARGV[1]` is the record's TTL in
//! milliseconds. The script's first run stores its reply there (`SET ..
//! PX`, as MessagePack); a run that finds the record returns the recorded
//! reply and changes nothing. So a resent command is applied once and its
//! caller gets the first run's answer, whichever run's reply arrives. The
//! TTL bounds how far apart the two runs may be: the client resends only
//! within a batch's deadline (twice the command timeout), and the TTL is
//! twice that again ([`crate::config::RedisConfig::record_ttl`]); a resend
//! that ran after the record expired would be applied again, which the
//! client never does. The records cost one small key per bucket write for
//! the TTL; they expire on their own (also after `clear` or `destroy`).
//!
//! `update_rows`' write-back ([`WRITE_IF_UNCHANGED`]) also recognises its
//! own write without the record: each row it carries holds a new random
//! version, so a stored row whose version is the carried row's is this
//! write, already applied (not a conflict).
//!
//! Scores follow the variable's restrict policy, passed as a mode: `n` (no
//! policy: the score stays 0), `f` (frequency: +1 per write, an insert
//! counting as the first, saturating at `u64::MAX` as a local table's
//! count does) or `t` (timestamp: the client's stamp for the batch).
//!
//! Float arithmetic (`accum`) is done in Lua's doubles and rounded to `f32`
//! when packed: the sum of two `f32`s rounded once from double is exactly
//! their `f32` sum, so rows match a local variable's bit for bit. A sum
//! that would round to infinity is refused (the row is kept) and reported.

use redis::Script;
use std::sync::LazyLock;

/// The error code of `SCORES` and `REMOVE_BELOW` (and their module
/// twins) on a bucket a restore has marked, followed by the checkpoint's
/// name: `restrict` and `expire` stop there rather than judge a bucket
/// being restored.
pub(crate) const RESTORING_ERROR: &str = "DYNEMB_RESTORING";

/// A Lua script: its code (loaded on every new connection) and its SHA-1
/// (which `EVALSHA` names).
pub(crate) struct Lua {
    code: String,
    script: Script,
    native: Option<&'static str>,
}

impl Lua {
    fn new(code: String) -> Lua {
        let script = Script::new(&code);
        Lua {
            code,
            script,
            native: None,
        }
    }

    /// The same script, with `command` as its twin in
    /// `dynemb-redis-module`.
    fn with_native(self, command: &'static str) -> Lua {
        Lua {
            native: Some(command),
            ..self
        }
    }

    /// The module command that does what this script does (same keys, same
    /// arguments, same reply), if there is one.
    pub(crate) fn native(&self) -> Option<&'static str> {
        self.native
    }

    /// The script's source.
    pub(crate) fn code(&self) -> &str {
        &self.code
    }

    /// The SHA-1 `EVALSHA` runs it by.
    pub(crate) fn sha(&self) -> &str {
        self.script.get_hash()
    }
}

/// Shared helpers of the bucket scripts: the bucket's rows read with one
/// `HMGET` and written with one `HSET` per call (in chunks that fit Lua's
/// stack) and removed with one `HDEL` per chunk, so a call costs a few
/// commands however many rows it carries.
const BUCKET: &str = r#"
local CHUNK = 1000
-- The rows of fields (false for an absent one), in order.
local function hmget(fields)
  local out = {}
  for i = 1, #fields, CHUNK do
    local got = redis.call('HMGET', KEYS[1], unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
    for j = 1, #got do out[i + j - 1] = got[j] end
  end
  return out
end
-- Writes rows[f] for each field f of order.
local function hset(order, rows)
  for i = 1, #order, CHUNK do
    local args = {}
    for j = i, math.min(i + CHUNK - 1, #order) do
      args[#args + 1] = order[j]
      args[#args + 1] = rows[order[j]]
    end
    redis.call('HSET', KEYS[1], unpack(args))
  end
end
-- Removes fields; returns how many were there.
local function hdel(fields)
  local removed = 0
  for i = 1, #fields, CHUNK do
    removed = removed + redis.call('HDEL', KEYS[1], unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
  end
  return removed
end
"#;

/// A bucket write that runs at most once (see the module docs), with the
/// [`BUCKET`] helpers and `prelude` before it: `body`
/// (Lua statements ending in `return reply`) runs unless `KEYS[2]`
/// records an earlier run, whose reply is returned instead; otherwise its
/// reply is recorded in `KEYS[2]` for `ARGV[1]` milliseconds. The body's
/// own arguments start at `ARGV[2]`.
fn recorded(prelude: &str, body: &str) -> Lua {
    Lua::new(format!(
        r#"
{BUCKET}
local recorded = redis.call('GET', KEYS[2])
if recorded then return cmsgpack.unpack(recorded) end
{prelude}
local function body()
{body}
end
local reply = body()
redis.call('SET', KEYS[2], cmsgpack.pack(reply), 'PX', ARGV[1])
return reply
"#
    ))
}

/// The prelude of the scripts that score their writes:
/// `ARGV[2..4] = [mode, stamp, version]`.
const SCORED: &str = r#"
local MODE, STAMP, VERSION = ARGV[2], ARGV[3], ARGV[4]
local ZERO8 = string.rep('\0', 8)
local function next_score(cur)
  if MODE == 't' then return STAMP end
  if MODE == 'n' then return ZERO8 end
  if not cur then return struct.pack('<I4I4', 1, 0) end
  local lo, hi = struct.unpack('<I4I4', cur, 9)
  if lo == 4294967295 and hi == 4294967295 then return string.sub(cur, 9, 16) end
  lo = lo + 1
  if lo == 4294967296 then
    lo = 0
    hi = hi + 1
  end
  return struct.pack('<I4I4', lo, hi)
end
"#;

/// Rows' sums of `accum`: `add_row(cur, deltas, dim)` is the `f32` bytes
/// of `cur`'s values (from byte 17) plus `deltas`' `dim` values, or
/// `nil, sign` if a sum overflows (`sign` of the first one). Decision:
/// the values are added [`ADD_WIDTH`] at a time by straight-line code
/// on locals ([`add_chunk`]), with one `struct.unpack` per operand and
/// one `struct.pack` per chunk; the generic loop over tables, which
/// `{struct.unpack(...)}` builds, is left for the `dim % ADD_WIDTH`
/// values at the end. Nearly all of the script's time is then `struct`'s
/// conversions (two unpacks and a pack per row), which is why the module's
/// native commands exist.
fn add_row() -> String {
    format!(
        r#"
{limit}{floats}{chunk}
local function add_row(cur, deltas, dim)
  local full = dim - dim % {w}
  local parts = {{}}
  for off = 0, full - 1, {w} do
    local part, sign = add_chunk(cur, 17 + 4 * off, deltas, 1 + 4 * off)
    if not part then return nil, sign end
    parts[#parts + 1] = part
  end
  if full < dim then
    local n = dim - full
    local row = floats(cur, 17 + 4 * full, n)
    local d = floats(deltas, 1 + 4 * full, n)
    for j = 1, n do
      local sum = row[j] + d[j]
      if sum >= LIMIT or sum <= -LIMIT then return nil, sum > 0 and 1 or -1 end
      row[j] = sum
    end
    parts[#parts + 1] = pack(row, n)
  end
  return table.concat(parts)
end
"#,
        limit = OVERFLOW_LIMIT,
        floats = FLOATS,
        chunk = add_chunk(ADD_WIDTH),
        w = ADD_WIDTH,
    )
}

/// Values `accum` adds per straight-line chunk (two operands of this many
/// locals each stay well inside Lua's 200 locals per function).
const ADD_WIDTH: usize = 16;

/// `add_chunk(a, at, b, bt)`: the `f32` bytes of the sums of the `width`
/// `f32`s of `a` from byte `at` and of `b` from byte `bt`, or `nil, sign`
/// if one overflows (`sign` of the first that does).
fn add_chunk(width: usize) -> String {
    let list = |v: &str| {
        (1..=width)
            .map(|i| format!("{v}{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (a, b) = (list("a"), list("b"));
    let sums: String = (1..=width)
        .map(|i| format!("  a{i} = a{i} + b{i}\n"))
        .collect();
    let over = (1..=width)
        .map(|i| format!("a{i} >= LIMIT or a{i} <= -LIMIT"))
        .collect::<Vec<_>>()
        .join(" or ");
    format!(
        r#"
local CHUNK_FORMAT = '<' .. string.rep('f', {width})
local function add_chunk(a, at, b, bt)
  local {a} = struct.unpack(CHUNK_FORMAT, a, at)
  local {b} = struct.unpack(CHUNK_FORMAT, b, bt)
{sums}  if {over} then
    for _, sum in ipairs({{{a}}}) do
      if sum >= LIMIT then return nil, 1 end
      if sum <= -LIMIT then return nil, -1 end
    end
  end
  return struct.pack(CHUNK_FORMAT, {a})
end
"#
    )
}

/// The overflow bound of `accum`'s sums.
const OVERFLOW_LIMIT: &str = r#"
-- A sum at or beyond this magnitude rounds to infinity as an f32
-- (2^128 - 2^103, half an ulp above f32::MAX, ties to even).
local LIMIT = 2^128 - 2^103"#;

/// `floats` and `pack`: `f32`s to and from tables, any count.
const FLOATS: &str = r#"
local FORMATS = {}
local function format(k)
  local f = FORMATS[k]
  if not f then
    f = '<' .. string.rep('f', k)
    FORMATS[k] = f
  end
  return f
end
-- The n f32s of s from byte offset at (1-based), as a table.
local function floats(s, at, n)
  if n <= 1024 then return {struct.unpack(format(n), s, at)} end
  local out = {}
  local i = 0
  while i < n do
    local k = math.min(n - i, 1024)
    local got = {struct.unpack(format(k), s, at + 4 * i)}
    for j = 1, k do out[i + j] = got[j] end
    i = i + k
  end
  return out
end
-- The f32 bytes of the n numbers of t.
local function pack(t, n)
  if n <= 1024 then return struct.pack(format(n), unpack(t, 1, n)) end
  local parts = {}
  local i = 0
  while i < n do
    local k = math.min(n - i, 1024)
    parts[#parts + 1] = struct.pack(format(k), unpack(t, i + 1, i + k))
    i = i + k
  end
  return table.concat(parts)
end"#;

/// `lookup_or_insert`'s insert, [`recorded`]: `ARGV[2..] = [mode, stamp,
/// version, field, body, field, body, ...]` (distinct fields); a field
/// that is absent gets the row `version .. score .. body`. Returns, per
/// field, `false` (inserted) or the row already there.
pub(crate) static INSERT_ABSENT: LazyLock<Lua> = LazyLock::new(|| {
    recorded(
        SCORED,
        r#"
local fields = {}
for i = 5, #ARGV, 2 do fields[#fields + 1] = ARGV[i] end
local got = hmget(fields)
local out, order, rows = {}, {}, {}
for n = 1, #fields do
  if got[n] then
    out[n] = got[n]
  else
    out[n] = false
    order[#order + 1] = fields[n]
    rows[fields[n]] = VERSION .. next_score(false) .. ARGV[4 + 2 * n]
  end
end
hset(order, rows)
return out
"#,
    )
    .with_native("DYNEMB.INSERT_ABSENT")
});

/// `upsert`, [`recorded`]: `ARGV[2..] = [mode, stamp, version, field,
/// values, ...]`, in batch order (the last of a repeated field wins; each
/// occurrence scores). A present row keeps its slot columns. Returns the
/// number of rows written.
pub(crate) static UPSERT: LazyLock<Lua> = LazyLock::new(|| {
    recorded(
        SCORED,
        r#"
local fields = {}
for i = 5, #ARGV, 2 do fields[#fields + 1] = ARGV[i] end
local got = hmget(fields)
local rows, order = {}, {}
for n = 1, #fields do
  local f = fields[n]
  if rows[f] == nil then
    rows[f] = got[n]
    order[#order + 1] = f
  end
  local cur = rows[f]
  local values = ARGV[4 + 2 * n]
  local tail = ''
  if cur then tail = string.sub(cur, 17 + #values) end
  rows[f] = VERSION .. next_score(cur) .. values .. tail
end
hset(order, rows)
return #fields
"#,
    )
    .with_native("DYNEMB.UPSERT")
});

/// bp_v2 `accum`, [`recorded`]: `ARGV[2..] = [mode, stamp, version, dim,
/// field, exists, deltas, ...]` (`exists` is `"1"` or `"0"`), in batch
/// order, each occurrence decided on the row as the occurrences before it
/// left it (as `Variable::accum` does): present and `exists` adds the
/// deltas; absent and not `exists` inserts the deltas as the row; a row
/// this call inserted takes every later occurrence's deltas, whatever its
/// `exists`; otherwise nothing. Returns the refused rows as `[position,
/// sign]` pairs (`position` 0-based among the call's rows, `sign` `1` or
/// `-1` of the sum that overflowed).
pub(crate) static ACCUM: LazyLock<Lua> = LazyLock::new(|| {
    recorded(
        &format!("{SCORED}{}", add_row()),
        r#"
local dim = tonumber(ARGV[5])
local fields = {}
for i = 6, #ARGV, 3 do fields[#fields + 1] = ARGV[i] end
local got = hmget(fields)
local rows, inserted, dirty, order = {}, {}, {}, {}
local refused = {}
for n = 1, #fields do
  local f = fields[n]
  local exists, deltas = ARGV[4 + 3 * n] == '1', ARGV[5 + 3 * n]
  -- HMGET gives false for an absent row: nil means not seen yet.
  if rows[f] == nil then rows[f] = got[n] end
  local present = rows[f] ~= false
  if (present and (exists or inserted[f])) or (not present and not exists) then
    local cur = rows[f]
    local new
    if cur then
      local sums, sign = add_row(cur, deltas, dim)
      if sums then
        new = VERSION .. next_score(cur) .. sums .. string.sub(cur, 17 + 4 * dim)
      else
        refused[#refused + 1] = n - 1
        refused[#refused + 1] = sign
      end
    else
      new = VERSION .. next_score(false) .. deltas
      inserted[f] = true
    end
    if new then
      if not dirty[f] then
        dirty[f] = true
        order[#order + 1] = f
      end
      rows[f] = new
    end
  end
end
hset(order, rows)
return refused
"#,
    )
    .with_native("DYNEMB.ACCUM")
});

/// `update_rows`' write-back, [`recorded`]: `ARGV[2..] = [field,
/// expected, row, ...]` (distinct fields); a row is written only if its
/// version is still `expected` (or, for `expected = ""`, if it is still
/// absent). A stored row whose version is the new row's is this very
/// write, already applied: not a conflict. Returns the 0-based positions
/// of the rows that changed meanwhile (not written).
pub(crate) static WRITE_IF_UNCHANGED: LazyLock<Lua> = LazyLock::new(|| {
    recorded(
        "",
        r#"
local fields = {}
for i = 2, #ARGV, 3 do fields[#fields + 1] = ARGV[i] end
local got = hmget(fields)
local conflicts, order, rows = {}, {}, {}
for n = 1, #fields do
  local expected, row = ARGV[3 * n], ARGV[3 * n + 1]
  local cur = got[n]
  local version = cur and string.sub(cur, 1, 8)
  local same
  if expected == '' then same = (cur == false) else same = version == expected end
  if same then
    order[#order + 1] = fields[n]
    rows[fields[n]] = row
  elseif version ~= string.sub(row, 1, 8) then
    conflicts[#conflicts + 1] = n - 1
  end
end
hset(order, rows)
return conflicts
"#,
    )
    .with_native("DYNEMB.WRITE_IF_UNCHANGED")
});

/// `restrict`'s scan of a bucket (a read, not recorded): the scores of
/// its rows, 8 little-endian bytes each, as one string. Fields that are
/// not 8 bytes are not rows; a restore's marker makes the call the error
/// [`RESTORING_ERROR`] followed by the checkpoint. The script copies the
/// bucket into Lua (`HGETALL`) but sends only the scores; its module twin
/// reads the rows in place.
pub(crate) static SCORES: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  if all[i] == 'restoring' then error({err = 'DYNEMB_RESTORING ' .. all[i + 1]}) end
  if #all[i] == 8 then
    local row = all[i + 1]
    if #row < 16 then error('dynemb: a stored row of ' .. #row .. ' bytes has no header') end
    out[#out + 1] = string.sub(row, 9, 16)
  end
end
return table.concat(out)
"#
        .to_string(),
    )
    .with_native("DYNEMB.SCORES")
});

/// `restrict`'s removal (and `expire`'s, with a quota of 0), [`recorded`]:
/// `ARGV[2..] = [threshold, quota]` (`threshold` a score's 8 little-endian
/// bytes, `quota` decimal): removes every row scored below `threshold` and
/// the first `quota` rows (in the order the bucket is read) scored exactly
/// `threshold`. Fields that are not 8 bytes are not rows and stay.
/// Returns `[below, ties removed, ties left]`. A row without a header, or
/// a restore's marker (the error [`RESTORING_ERROR`], as in [`SCORES`]),
/// fails the call before anything is removed.
pub(crate) static REMOVE_BELOW: LazyLock<Lua> = LazyLock::new(|| {
    recorded(
        "",
        r#"
local tlo, thi = struct.unpack('<I4I4', ARGV[2])
local quota = tonumber(ARGV[3])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] == 'restoring' then error({err = 'DYNEMB_RESTORING ' .. all[i + 1]}) end
  if #all[i] == 8 and #all[i + 1] < 16 then
    error('dynemb: a stored row of ' .. #all[i + 1] .. ' bytes has no header')
  end
end
local victims = {}
local below, removed, left = 0, 0, 0
for i = 1, #all, 2 do
  if #all[i] == 8 then
    local lo, hi = struct.unpack('<I4I4', all[i + 1], 9)
    if hi < thi or (hi == thi and lo < tlo) then
      below = below + 1
      victims[#victims + 1] = all[i]
    elseif hi == thi and lo == tlo then
      if removed < quota then
        removed = removed + 1
        victims[#victims + 1] = all[i]
      else
        left = left + 1
      end
    end
  end
end
hdel(victims)
return {below, removed, left}
"#,
    )
    .with_native("DYNEMB.REMOVE_BELOW")
});

/// `remove`, [`recorded`]: `ARGV[2..]` are the fields to remove. Returns
/// the number removed.
pub(crate) static REMOVE: LazyLock<Lua> = LazyLock::new(|| {
    recorded(
        "",
        r#"
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
return hdel(fields)
"#,
    )
});

/// `clear`, [`recorded`]: removes the bucket (`UNLINK`). Returns 1 if it
/// existed.
pub(crate) static CLEAR: LazyLock<Lua> =
    LazyLock::new(|| recorded("", "return redis.call('UNLINK', KEYS[1])"));

/// `restore`'s start on a bucket, [`recorded`]: `ARGV[2]` the checkpoint
/// being restored. Removes the bucket's rows and leaves only its marker
/// (the field [`crate::layout::RESTORING_FIELD`], whose value is
/// `ARGV[2]`), which makes every read of the bucket an error until the
/// restore is finished. Returns 1.
pub(crate) static MARK_RESTORING: LazyLock<Lua> = LazyLock::new(|| {
    recorded(
        "",
        r#"
redis.call('UNLINK', KEYS[1])
redis.call('HSET', KEYS[1], 'restoring', ARGV[2])
return 1
"#,
    )
});

/// Opening a variable: `KEYS[1]` is its metadata hash, `ARGV = [field,
/// value, ...]` the metadata to store if there is none yet. Returns the
/// stored metadata (`HGETALL`): the given one, or the existing one for the
/// client to compare.
pub(crate) static OPEN: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return redis.call('HGETALL', KEYS[1])
"#
        .to_string(),
    )
});

/// `create_slots`: `KEYS[1]` is the metadata hash, `ARGV = [max slots,
/// (name, initial bits, equal initial bits) per slot]`, names distinct.
/// Slots are the fields `slot.<index>` (the name) and
/// `slot_initial.<index>` (the initial value's `f32` bits, decimal), and
/// `slots` counts them. Checks every named slot that exists (its stored
/// initial must be one of the two bit patterns) and the room, then adds
/// the missing ones, all in one atomic script. Replies `{"ok", index per
/// slot}`, `{"full", slots now}` or `{"mismatch", position in ARGV's
/// slots, stored bits}`; the last two change nothing. Running it twice
/// finds the slots the first run added, so a resend returns their indexes.
pub(crate) static CREATE_SLOTS: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local n = tonumber(redis.call('HGET', KEYS[1], 'slots') or '0')
local index = {}
for i = 0, n - 1 do
  index[redis.call('HGET', KEYS[1], 'slot.' .. i)] = i
end
local new = {}
for j = 2, #ARGV, 3 do
  local i = index[ARGV[j]]
  if i then
    local stored = redis.call('HGET', KEYS[1], 'slot_initial.' .. i)
    if stored ~= ARGV[j + 1] and stored ~= ARGV[j + 2] then
      return {'mismatch', (j - 2) / 3, stored}
    end
  else
    new[#new + 1] = j
  end
end
if n + #new > tonumber(ARGV[1]) then return {'full', n} end
for k, j in ipairs(new) do
  local i = n + k - 1
  redis.call('HSET', KEYS[1], 'slot.' .. i, ARGV[j], 'slot_initial.' .. i, ARGV[j + 1])
  index[ARGV[j]] = i
end
if #new > 0 then redis.call('HSET', KEYS[1], 'slots', n + #new) end
local out = {'ok'}
for j = 2, #ARGV, 3 do out[#out + 1] = index[ARGV[j]] end
return out
"#
        .to_string(),
    )
});

/// The module commands the client sends instead of scripts where every
/// node has them (see [`Lua::native`]).
pub(crate) fn native_commands() -> Vec<&'static str> {
    ALL_SCRIPTS.iter().filter_map(|s| s.native()).collect()
}

/// Every script, loaded on each new connection.
pub(crate) static ALL_SCRIPTS: LazyLock<[&'static Lua; 11]> = LazyLock::new(|| {
    [
        &*INSERT_ABSENT,
        &*UPSERT,
        &*ACCUM,
        &*WRITE_IF_UNCHANGED,
        &*SCORES,
        &*REMOVE_BELOW,
        &*REMOVE,
        &*CLEAR,
        &*MARK_RESTORING,
        &*OPEN,
        &*CREATE_SLOTS,
    ]
});
