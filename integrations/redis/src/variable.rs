//! [`RedisVariable`]: its handle, how it is opened from a
//! [`VariableBuilder`] (the settings every table takes, checked once by
//! [`TableOptions::check`], and refused where Redis cannot honour them),
//! and the batch operations (lookups, inserts, upserts, `accum`, removal,
//! size, scores). Slots, `update_rows`, scans and checkpoints are in their
//! own modules.

use crate::batch::Grouped;
use crate::cluster::{Cluster, Request};
use crate::config::RedisConfig;
use crate::layout::{self, Row};
use crate::meta::Meta;
use crate::reply;
use crate::scripts::{self, Lua};
use dynemb::{
    BackendErrorKind, Dtype, Error, Initializer, Key, LifecycleStats, Partitioner, RestrictPolicy,
    Result, SlotId, TableOptions, VariableBuilder,
};
use redis::Value;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

/// A dynamic embedding table stored in Redis: rows of `dim` `f32`s keyed by
/// `K`, shared by every process that opens it, with
/// [`Variable`](dynemb::Variable)'s semantics. Clones share one connection
/// pool.
///
/// - [`lookup`](RedisVariable::lookup) never inserts: a missing key reads
///   the initializer's row, computed here by the variable's
///   [`Initializer`] exactly as a local variable computes it
///   (deterministic per key), and that row is what
///   [`lookup_or_insert`](RedisVariable::lookup_or_insert) stores;
/// - [`upsert`](RedisVariable::upsert): a key repeated in a batch, the last
///   one wins; a present row keeps its slot columns;
/// - [`accum`](RedisVariable::accum) follows bp_v2's truth table, adding on
///   the server (a script per bucket), so concurrent trainers' deltas all
///   count;
/// - [`update_rows`](RedisVariable::update_rows) is atomic per row (see
///   [`update`](crate::update));
/// - inputs are checked before anything is sent: a wrong length, a
///   non-finite value or delta, a slot of another store is an error that
///   changes nothing.
///
/// Every batch costs one pipelined round trip per node (two for a
/// `lookup_or_insert` that inserts: the read, then the inserts; an
/// `update_rows` takes two, one more per round of conflicts, and cuts
/// rounds of many keys into pipelined chunks, see [`update`](crate::update)). A node's
/// commands whose reply was lost are resent, and every write runs at most
/// once (it records its reply on the server, see the
/// [crate docs](crate)), so a batch that returns `Ok` was applied exactly
/// once. What a remote store adds to a local one's errors is
/// [`Error::Backend`]: a batch that fails that way may have been applied
/// on some nodes and not others (each command at most once, each row
/// whole or not at all).
///
/// Scores follow the restrict policy as on a local variable (see
/// [`dynemb::restrict`]): every write of a row counts or stamps it, reads
/// leave it; a timestamp is taken once per batch from the process's clock
/// ([`dynemb::restrict::next_timestamp`]), so processes on machines with
/// skewed clocks stamp accordingly.
#[derive(Clone)]
pub struct RedisVariable<K: Key> {
    pub(crate) inner: Arc<Inner>,
    _key: PhantomData<fn() -> K>,
}

pub(crate) struct Inner {
    pub id: u64,
    pub name: String,
    /// `"redis <prefix>:<name>"`, for errors.
    pub store: String,
    pub dim: usize,
    pub initializer: Initializer,
    pub policy: Option<RestrictPolicy>,
    pub trainable: bool,
    pub checkpoint: bool,
    pub buckets: u32,
    /// Redis key of each bucket.
    pub bucket_keys: Vec<Vec<u8>>,
    pub meta_key: Vec<u8>,
    /// [`RedisConfig::record_ttl`] in milliseconds, for the scripts.
    pub record_ttl_ms: u64,
    /// Whether bucket writes go as `dynemb-redis-module`'s commands
    /// ([`RedisConfig::use_module`] and every node had the module when the
    /// variable was opened) rather than as scripts.
    pub native: bool,
    pub cluster: Cluster,
    /// Slot names and initial values by index, as last read from the
    /// metadata (slots are only ever appended).
    pub slots: RwLock<Vec<(String, f32)>>,
    /// Rows this handle and its clones removed by
    /// [`RedisVariable::expire`].
    pub expired: AtomicU64,
}

impl<K: Key> std::fmt::Debug for RedisVariable<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisVariable")
            .field("name", &self.inner.name)
            .field("store", &self.inner.store)
            .field("key", &K::TYPE_NAME)
            .field("dim", &self.inner.dim)
            .field("buckets", &self.inner.buckets)
            .field("nodes", &self.inner.cluster.node_addrs())
            .finish()
    }
}

/// Refuses the settings of `options` a Redis table cannot honour (see
/// [`RedisVariable::open`]); the others are checked by
/// [`TableOptions::check`].
fn check_redis_options(name: &str, options: &TableOptions) -> Result<()> {
    if name.is_empty() || name.contains(['{', '}', ':']) {
        return Err(Error::InvalidArgument(format!(
            "variable name {name:?} must not be empty or contain {{, }} or : (a Redis table's \
             keys are `<prefix>:<name>:{{bucket}}`: braces would move the hash tag, and a \
             colon would let another prefix and name reach the same keys)"
        )));
    }
    if options.shards != 1 {
        return Err(Error::InvalidArgument(format!(
            "variable {name:?}: a Redis table has one shard, got shards = {}; its keys are \
             spread over RedisConfig::buckets buckets instead",
            options.shards
        )));
    }
    if let Partitioner::Custom(_) = options.partitioner {
        return Err(Error::InvalidArgument(format!(
            "variable {name:?}: a Redis table places keys in buckets by a fixed hash of the \
             key, so it cannot take a custom partitioner"
        )));
    }
    Ok(())
}

/// The store id of the table `identity` (servers, prefix and name): the
/// same for every handle of it in this process, distinct from every other
/// table's (see [`dynemb::EmbeddingStore::store_id`]).
fn table_id(identity: &str) -> u64 {
    static IDS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);
    let mut ids = IDS.lock().unwrap_or_else(PoisonError::into_inner);
    *ids.get_or_insert_with(HashMap::new)
        .entry(identity.to_string())
        .or_insert_with(dynemb::new_store_id)
}

/// Buckets a whole-table pass sends one command each per round trip
/// (`HLEN`, a clear, a restore's marker): a table of many buckets takes
/// several round trips, none larger than this.
pub(crate) const BUCKETS_PER_ROUND_TRIP: u32 = 4096;

/// The buckets `0..buckets` in consecutive windows of at most
/// [`BUCKETS_PER_ROUND_TRIP`].
pub(crate) fn bucket_windows(buckets: u32) -> impl Iterator<Item = Range<u32>> {
    (0..buckets)
        .step_by(BUCKETS_PER_ROUND_TRIP as usize)
        .map(move |start| start..buckets.min(start + BUCKETS_PER_ROUND_TRIP))
}

/// The error of a read of a variable being restored: a restore of
/// `checkpoint` is in progress, or was interrupted.
pub(crate) fn restoring_error(store: &str, checkpoint: &[u8]) -> Error {
    Error::Backend {
        store: store.to_string(),
        kind: BackendErrorKind::NotServing,
        message: format!(
            "a restore of checkpoint {} is in progress or was interrupted; until it is run again to its end (or the variable is cleared), the variable is not read",
            String::from_utf8_lossy(checkpoint)
        ),
    }
}

/// `EVALSHA <script> 1 <key>`, arguments to follow.
pub(crate) fn script_cmd(script: &Lua, key: &[u8]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.sha()).arg(1).arg(key);
    cmd
}

pub(crate) use dynemb::checks::{batch_len, check_finite, check_len};

/// Refuses the lifecycle settings a Redis table cannot honour: a capacity
/// (and so its listener and frequency decay, which need one) and
/// admission (its counts of keys not yet admitted would have to live on
/// the servers, shared by every trainer). A capacity is not left to
/// Redis's `maxmemory` eviction either: that evicts whole keys, a bucket
/// of thousands of rows chosen without their scores (or the metadata, or
/// with a `volatile-*` policy only the write records), and tells no
/// listener. A table is bounded by [`RedisVariable::restrict`] or
/// [`RedisVariable::expire`] instead.
fn refuse_lifecycle(
    name: &str,
    capacity: Option<usize>,
    admission: Option<dynemb::Admission>,
    on_evict: bool,
) -> Result<()> {
    let refused = if capacity.is_some() {
        "a capacity (eviction)"
    } else if admission.is_some() {
        "admission"
    } else if on_evict {
        "an eviction listener"
    } else {
        return Ok(());
    };
    Err(Error::InvalidArgument(format!(
        "variable {name:?}: a Redis table does not support {refused}; bound it with \
         expire or restrict instead"
    )))
}

/// Refuses half-precision values or slots: a Redis table stores `f32`.
/// Its server-side scripts (`accum`'s addition, the module's commands) add
/// in `f32` (or Lua's doubles) where a local table rounds every result to
/// its dtype, so a Redis table could not round as a local one does.
fn refuse_half_precision(name: &str, values: Dtype, slots: Dtype) -> Result<()> {
    match [("value", values), ("slot", slots)]
        .into_iter()
        .find(|&(_, dtype)| dtype != Dtype::F32)
    {
        None => Ok(()),
        Some((column, dtype)) => Err(Error::InvalidArgument(format!(
            "variable {name:?}: a Redis table stores f32; its {column} dtype cannot be {dtype}"
        ))),
    }
}

impl<K: Key> RedisVariable<K> {
    /// Opens the Redis table that `builder` describes, on the servers of
    /// `config`: the same description a local [`Variable`](dynemb::Variable) is built from
    /// (`Variable::builder("emb").dim(8)...`), so one description builds a
    /// local table (`build()`) or opens a Redis one, as TFRA's
    /// `kv_creator` does.
    ///
    /// Checks the settings first ([`TableOptions::check`], then what
    /// Redis adds: a name that is not empty and has no `{` or `}` (the
    /// buckets' hash tags) and no `:` (so that no other prefix and name
    /// reach its keys), and [`RedisConfig::validate`]) and refuses,
    /// with an [`Error::InvalidArgument`], a setting a Redis table cannot
    /// honour: more than one shard (its keys are spread over
    /// [`RedisConfig::buckets`] instead), a [`Partitioner::Custom`], and
    /// a half-precision value or slot dtype (a Redis table stores `f32`),
    /// and a capacity, admission or an eviction listener (see the crate docs'
    /// row lifecycle; [`RedisVariable::expire`] and
    /// [`RedisVariable::restrict`] bound a Redis table).
    /// [`init_size`](dynemb::VariableBuilder::init_size) is accepted and
    /// unused (see the [crate docs](crate)), and
    /// [`inline_slots`](dynemb::VariableBuilder::inline_slots) is what a
    /// Redis row always does (its slots follow its values). `trainable` and `checkpoint`
    /// are properties of this handle, not stored.
    ///
    /// Then connects, and creates the variable's metadata if it does not
    /// exist yet, or checks that the existing variable has this key type,
    /// dim, bucket count, initializer and restrict policy
    /// ([`Error::Mismatch`] otherwise).
    pub fn open(builder: VariableBuilder<K>, config: RedisConfig) -> Result<RedisVariable<K>> {
        let (name, options) = builder.into_parts();
        options.check(&name)?;
        check_redis_options(&name, &options)?;
        config.validate()?;
        // Every field named, none skipped with `..`: an option added to
        // TableOptions must be honoured or refused here, never ignored.
        let TableOptions {
            dim,
            shards: _,
            partitioner: _,
            init_size: _,
            initializer,
            trainable,
            checkpoint,
            restrict_policy,
            capacity,
            admission,
            on_evict,
            frequency_decay: _,
            value_dtype,
            slot_dtype,
            // Rounding applies to half-precision columns only, refused below.
            rounding: _,
            // A Redis row always holds its slots after its values.
            inline_slots: _,
        } = options;
        refuse_lifecycle(&name, capacity, admission, on_evict.is_some())?;
        refuse_half_precision(&name, value_dtype, slot_dtype)?;
        let cluster = Cluster::connect(&config)?;
        let native = config.use_module && cluster.every_node_serves(&scripts::native_commands())?;
        let prefix = &config.prefix;
        let store = format!("redis {prefix}:{name}");
        let meta = Meta::new(
            K::TYPE_NAME,
            dim,
            config.buckets,
            &initializer,
            restrict_policy,
        );
        let meta_key = layout::meta_key(prefix, &name);
        let mut open = script_cmd(&scripts::OPEN, &meta_key);
        for (field, value) in meta.fields() {
            open.arg(field).arg(value);
        }
        let reply = cluster
            .run(&[Request::new(&meta_key, &open)])?
            .pop()
            .expect("one reply");
        let slots = meta.check(&name, &store, reply)?;
        let mut addrs = cluster.node_addrs();
        addrs.sort();
        let id = table_id(&format!("{}|{prefix}:{name}", addrs.join(",")));
        Ok(RedisVariable {
            inner: Arc::new(Inner {
                id,
                bucket_keys: (0..config.buckets)
                    .map(|b| layout::bucket_key(prefix, &name, b))
                    .collect(),
                meta_key,
                record_ttl_ms: u64::try_from(config.record_ttl().as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
                native,
                store,
                name,
                dim,
                initializer,
                policy: restrict_policy,
                trainable,
                checkpoint,
                buckets: config.buckets,
                cluster,
                slots: RwLock::new(slots),
                expired: AtomicU64::new(0),
            }),
            _key: PhantomData,
        })
    }

    /// The variable's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether its bucket writes run as `dynemb-redis-module`'s native
    /// commands (decided when it was opened: [`RedisConfig::use_module`]
    /// and every node had the module loaded) rather than as Lua scripts.
    pub fn uses_module(&self) -> bool {
        self.inner.native
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.inner.dim
    }

    /// Whether optimizers train this variable.
    pub fn trainable(&self) -> bool {
        self.inner.trainable
    }

    /// Whether checkpoints save this variable.
    pub fn checkpoint(&self) -> bool {
        self.inner.checkpoint
    }

    /// The initializer of missing keys.
    pub fn initializer(&self) -> &Initializer {
        &self.inner.initializer
    }

    /// The restrict policy its rows' scores follow, if any.
    pub fn restrict_policy(&self) -> Option<RestrictPolicy> {
        self.inner.policy
    }

    /// Always `None`: a Redis table has no capacity (one asked of the
    /// builder is refused by [`RedisVariable::open`]); bound it with
    /// [`RedisVariable::restrict`] or [`RedisVariable::expire`].
    pub fn capacity(&self) -> Option<usize> {
        None
    }

    /// What the row lifecycle did through this handle and its clones:
    /// the rows [`RedisVariable::expire`] removed (expiries by other
    /// handles or processes are theirs to count). Eviction and admission
    /// stay zero: a Redis table refuses them.
    pub fn lifecycle_stats(&self) -> LifecycleStats {
        LifecycleStats {
            expired: self.inner.expired.load(Ordering::Relaxed),
            ..LifecycleStats::default()
        }
    }

    /// Buckets the rows are spread over.
    pub fn buckets(&self) -> u32 {
        self.inner.buckets
    }

    /// Whether the servers form a Redis Cluster (not a single server).
    pub fn is_cluster(&self) -> bool {
        self.inner.cluster.is_cluster()
    }

    /// The id of the table behind this handle (see
    /// [`EmbeddingStore::store_id`](dynemb::EmbeddingStore::store_id)).
    pub fn store_id(&self) -> u64 {
        self.inner.id
    }

    pub(crate) fn store(&self) -> &str {
        &self.inner.store
    }

    /// The bits of `keys`, grouped by bucket.
    pub(crate) fn group(&self, keys: &[K]) -> Result<(Vec<u64>, Grouped)> {
        let bits: Vec<u64> = keys.iter().map(|k| k.to_bits()).collect();
        let grouped = Grouped::new(&bits, self.inner.buckets)?;
        Ok((bits, grouped))
    }

    /// The request of `cmd` on bucket `bucket`.
    pub(crate) fn bucket_request(&self, bucket: u32, cmd: &redis::Cmd) -> Request {
        Request::new(&self.inner.bucket_keys[bucket as usize], cmd)
    }

    /// The key of bucket `bucket`.
    pub(crate) fn bucket_key(&self, bucket: u32) -> &[u8] {
        &self.inner.bucket_keys[bucket as usize]
    }

    /// `EVALSHA <script> 2 <bucket key> <record key> <ttl>`, or the
    /// script's module command `<command> <bucket key> <record key> <ttl>`
    /// when the variable uses the module: a [recorded](crate::scripts)
    /// write to `bucket` (the write `id`, one per call), its own arguments
    /// to follow.
    pub(crate) fn write_cmd(&self, script: &Lua, bucket: u32, id: [u8; 8]) -> redis::Cmd {
        self.write_cmd_with_capacity(script, bucket, id, 0, 0)
    }

    /// A read of bucket `bucket` by `script` (not recorded: it writes
    /// nothing): `EVALSHA <script> 1 <bucket key>`, or its module command
    /// `<command> <bucket key>` when the variable uses the module.
    pub(crate) fn read_cmd(&self, script: &Lua, bucket: u32) -> redis::Cmd {
        let key = self.bucket_key(bucket);
        match script.native().filter(|_| self.inner.native) {
            Some(command) => {
                let mut cmd = redis::cmd(command);
                cmd.arg(key);
                cmd
            }
            None => script_cmd(script, key),
        }
    }

    /// [`RedisVariable::write_cmd`] with room for `args` more arguments of
    /// `bytes` bytes in all, so that a large write is not copied as it
    /// grows.
    pub(crate) fn write_cmd_with_capacity(
        &self,
        script: &Lua,
        bucket: u32,
        id: [u8; 8],
        args: usize,
        bytes: usize,
    ) -> redis::Cmd {
        let key = self.bucket_key(bucket);
        let mut cmd = redis::Cmd::with_capacity(args + 6, bytes + 128);
        match script.native().filter(|_| self.inner.native) {
            Some(command) => cmd.arg(command),
            None => cmd.arg("EVALSHA").arg(script.sha()).arg(2),
        };
        cmd.arg(key)
            .arg(layout::record_key(key, id))
            .arg(self.inner.record_ttl_ms);
        cmd
    }

    /// `(mode, stamp)` script arguments of a write batch's scores.
    pub(crate) fn score_args(&self) -> (&'static str, [u8; 8]) {
        match self.inner.policy {
            None => ("n", [0; 8]),
            Some(RestrictPolicy::Frequency) => ("f", [0; 8]),
            Some(RestrictPolicy::Timestamp) => {
                ("t", dynemb::restrict::next_timestamp().to_le_bytes())
            }
        }
    }

    /// Decodes fetched rows (`None`: absent), every one before any is
    /// used, so a corrupt row fails the call before it writes anything.
    pub(crate) fn parse_rows<'a>(
        &self,
        rows: &'a [Option<Vec<u8>>],
    ) -> Result<Vec<Option<Row<'a>>>> {
        let dim = self.dim();
        rows.iter()
            .map(|r| {
                r.as_deref()
                    .map(|b| Row::parse(b, dim, self.store()))
                    .transpose()
            })
            .collect()
    }

    /// The stored rows of a grouped batch (`HMGET` per bucket), each
    /// position's bytes or `None` if absent, in batch order; a batch of
    /// its own (its deadline starts now).
    pub(crate) fn fetch(&self, bits: &[u64], grouped: &Grouped) -> Result<Vec<Option<Vec<u8>>>> {
        self.fetch_by(bits, grouped, self.inner.cluster.deadline())
    }

    /// [`RedisVariable::fetch`] by the call's `deadline`.
    pub(crate) fn fetch_by(
        &self,
        bits: &[u64],
        grouped: &Grouped,
        deadline: Instant,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let replies = self
            .inner
            .cluster
            .run_by(&self.fetch_requests(bits, grouped), deadline)?;
        self.fetched_rows(bits, grouped, replies)
    }

    /// [`RedisVariable::fetch`]'s requests: an `HMGET` per bucket, of the
    /// restore marker ([`layout::RESTORING_FIELD`]) and then the rows.
    pub(crate) fn fetch_requests(&self, bits: &[u64], grouped: &Grouped) -> Vec<Request> {
        let mut requests = Vec::with_capacity(grouped.len());
        for (bucket, positions) in grouped.iter() {
            let mut cmd = redis::Cmd::with_capacity(positions.len() + 3, 8 * positions.len() + 80);
            cmd.arg("HMGET")
                .arg(self.bucket_key(bucket))
                .arg(layout::RESTORING_FIELD);
            for &p in positions {
                cmd.arg(&layout::field(bits[p as usize])[..]);
            }
            requests.push(self.bucket_request(bucket, &cmd));
        }
        requests
    }

    /// The rows in the replies to [`RedisVariable::fetch_requests`]; a
    /// bucket being restored is an error (see [`restoring_error`]).
    pub(crate) fn fetched_rows(
        &self,
        bits: &[u64],
        grouped: &Grouped,
        replies: Vec<Value>,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        self.fetched_rows_with(bits, grouped, replies, false)
    }

    /// [`RedisVariable::fetched_rows`]; `restorer`: the caller is the
    /// restore itself, which reads the buckets it marked.
    pub(crate) fn fetched_rows_with(
        &self,
        bits: &[u64],
        grouped: &Grouped,
        replies: Vec<Value>,
        restorer: bool,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let mut rows: Vec<Option<Vec<u8>>> = vec![None; bits.len()];
        for ((_, positions), reply) in grouped.iter().zip(replies) {
            let items = reply::array(self.store(), "HMGET", reply)?;
            if items.len() != positions.len() + 1 {
                return Err(reply::unexpected(
                    self.store(),
                    "HMGET",
                    &Value::Array(items),
                ));
            }
            let mut items = items.into_iter();
            let marker = items.next().expect("the marker's item");
            if let Some(checkpoint) = reply::bytes_or_nil(self.store(), "HMGET", marker)? {
                if !restorer {
                    return Err(restoring_error(self.store(), &checkpoint));
                }
            }
            for (&p, item) in positions.iter().zip(items) {
                rows[p as usize] = reply::bytes_or_nil(self.store(), "HMGET", item)?;
            }
        }
        Ok(rows)
    }

    /// Copies the rows of `keys` into `out` (`keys.len() * dim` values).
    /// Missing keys get the initializer's row. Never inserts.
    pub fn lookup(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        self.lookup_rows(keys, out, None, self.inner.cluster.deadline())
    }

    /// [`RedisVariable::lookup`], also telling which keys were present.
    pub fn lookup_with_exists(
        &self,
        keys: &[K],
        out: &mut [f32],
        exists: &mut [bool],
    ) -> Result<()> {
        let deadline = self.inner.cluster.deadline();
        check_len("out", batch_len(keys.len(), self.dim())?, out.len())?;
        check_len("exists", keys.len(), exists.len())?;
        self.lookup_rows(keys, out, Some(exists), deadline)
    }

    fn lookup_rows(
        &self,
        keys: &[K],
        out: &mut [f32],
        exists: Option<&mut [bool]>,
        deadline: Instant,
    ) -> Result<()> {
        let dim = self.dim();
        check_len("out", batch_len(keys.len(), dim)?, out.len())?;
        let (bits, grouped) = self.group(keys)?;
        let rows = self.fetch_by(&bits, &grouped, deadline)?;
        // Decode everything before writing `out`: an error leaves it as it was.
        let parsed = self.parse_rows(&rows)?;
        for (i, row) in parsed.iter().enumerate() {
            let slot = &mut out[i * dim..(i + 1) * dim];
            match row {
                Some(row) => row.values_into(slot),
                None => self.inner.initializer.fill(bits[i], slot),
            }
        }
        if let Some(exists) = exists {
            for (e, row) in exists.iter_mut().zip(&parsed) {
                *e = row.is_some();
            }
        }
        Ok(())
    }

    /// Training read: copies the rows of `keys` into `out`, inserting
    /// missing keys with the initializer's row. If another process inserts
    /// a key at the same moment, both read the one row that was stored.
    pub fn lookup_or_insert(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        let deadline = self.inner.cluster.deadline();
        let dim = self.dim();
        check_len("out", batch_len(keys.len(), dim)?, out.len())?;
        let mut exists = vec![false; keys.len()];
        let mut rows = vec![0.0; out.len()];
        self.lookup_rows(keys, &mut rows, Some(&mut exists), deadline)?;
        // Each missing key once, at its first position.
        let mut first: HashMap<u64, usize> = HashMap::new();
        let mut missing_keys = Vec::new();
        let mut missing_at = Vec::new();
        for (i, (&k, &present)) in keys.iter().zip(&exists).enumerate() {
            if !present && first.insert(k.to_bits(), i).is_none() {
                missing_keys.push(k);
                missing_at.push(i);
            }
        }
        if !missing_keys.is_empty() {
            let (bits, grouped) = self.group(&missing_keys)?;
            let (mode, stamp) = self.score_args();
            let version = layout::new_version();
            let mut requests = Vec::with_capacity(grouped.len());
            let mut body = Vec::with_capacity(4 * dim);
            for (bucket, positions) in grouped.iter() {
                let mut cmd = self.write_cmd(&scripts::INSERT_ABSENT, bucket, version);
                cmd.arg(mode).arg(&stamp[..]).arg(&version[..]);
                for &p in positions {
                    let at = missing_at[p as usize];
                    body.clear();
                    layout::f32_bytes(&rows[at * dim..(at + 1) * dim], &mut body);
                    cmd.arg(&layout::field(bits[p as usize])[..]).arg(&body[..]);
                }
                requests.push(self.bucket_request(bucket, &cmd));
            }
            let replies = self.inner.cluster.run_by(&requests, deadline)?;
            for ((_, positions), reply) in grouped.iter().zip(replies) {
                let items = reply::array(self.store(), "insert", reply)?;
                if items.len() != positions.len() {
                    return Err(reply::unexpected(
                        self.store(),
                        "insert",
                        &Value::Array(items),
                    ));
                }
                for (&p, item) in positions.iter().zip(items) {
                    // Present after all: another writer inserted it first.
                    if let Some(bytes) = reply::bytes_or_nil(self.store(), "insert", item)? {
                        let row = Row::parse(&bytes, dim, self.store())?;
                        let at = missing_at[p as usize];
                        row.values_into(&mut rows[at * dim..(at + 1) * dim]);
                    }
                }
            }
            // Repeated missing keys read what their first position got.
            for (i, k) in keys.iter().enumerate() {
                let at = first.get(&k.to_bits()).copied().unwrap_or(i);
                if at != i && !exists[i] {
                    rows.copy_within(at * dim..(at + 1) * dim, i * dim);
                }
            }
        }
        out.copy_from_slice(&rows);
        Ok(())
    }

    /// Sets the rows of `keys` to `values` (`keys.len() * dim`), inserting
    /// absent keys. A key repeated in one batch: the last one wins. A
    /// present row keeps its slot columns.
    pub fn upsert(&self, keys: &[K], values: &[f32]) -> Result<()> {
        let deadline = self.inner.cluster.deadline();
        let dim = self.dim();
        check_len("values", batch_len(keys.len(), dim)?, values.len())?;
        check_finite("values", values)?;
        let (bits, grouped) = self.group(keys)?;
        let (mode, stamp) = self.score_args();
        let version = layout::new_version();
        let mut requests = Vec::with_capacity(grouped.len());
        let mut body = Vec::with_capacity(4 * dim);
        for (bucket, positions) in grouped.iter() {
            let mut cmd = self.write_cmd(&scripts::UPSERT, bucket, version);
            cmd.arg(mode).arg(&stamp[..]).arg(&version[..]);
            for &p in positions {
                let p = p as usize;
                body.clear();
                layout::f32_bytes(&values[p * dim..(p + 1) * dim], &mut body);
                cmd.arg(&layout::field(bits[p])[..]).arg(&body[..]);
            }
            requests.push(self.bucket_request(bucket, &cmd));
        }
        for reply in self.inner.cluster.run_by(&requests, deadline)? {
            reply::int(self.store(), "upsert", reply)?;
        }
        Ok(())
    }

    /// TFRA `bp_v2` accumulation, on the server. For each key: present and
    /// `exists[i]` → `row += delta`; absent and not `exists[i]` → insert
    /// `delta` as the row; otherwise ignored. Each occurrence of a key
    /// repeated in one batch is decided on the row as the earlier ones left
    /// it, and a row the batch inserted takes every later delta whatever
    /// its `exists` (as on a local variable).
    ///
    /// A NaN or infinite delta is an [`Error::NonFinite`] (`what:
    /// "deltas"`) before anything is sent. A sum that overflows is refused
    /// per row as on a local variable: that row keeps its values, the
    /// others are written, and the call returns [`Error::NonFinite`]
    /// (`what: "accum result"`, the first refused key's position, an
    /// infinite value of the sum's sign).
    pub fn accum(&self, keys: &[K], deltas: &[f32], exists: &[bool]) -> Result<()> {
        let deadline = self.inner.cluster.deadline();
        let dim = self.dim();
        check_len("deltas", batch_len(keys.len(), dim)?, deltas.len())?;
        check_len("exists", keys.len(), exists.len())?;
        check_finite("deltas", deltas)?;
        let (bits, grouped) = self.group(keys)?;
        let (mode, stamp) = self.score_args();
        let version = layout::new_version();
        let mut requests = Vec::with_capacity(grouped.len());
        let mut body = Vec::with_capacity(4 * dim);
        for (bucket, positions) in grouped.iter() {
            let mut cmd = self.write_cmd(&scripts::ACCUM, bucket, version);
            cmd.arg(mode).arg(&stamp[..]).arg(&version[..]).arg(dim);
            for &p in positions {
                let p = p as usize;
                body.clear();
                layout::f32_bytes(&deltas[p * dim..(p + 1) * dim], &mut body);
                cmd.arg(&layout::field(bits[p])[..])
                    .arg(if exists[p] { "1" } else { "0" })
                    .arg(&body[..]);
            }
            requests.push(self.bucket_request(bucket, &cmd));
        }
        let replies = self.inner.cluster.run_by(&requests, deadline)?;
        let mut refused: Option<(usize, f32)> = None;
        for ((_, positions), reply) in grouped.iter().zip(replies) {
            let items = reply::array(self.store(), "accum", reply)?;
            for pair in items.chunks(2) {
                let [at, sign] = pair else {
                    return Err(reply::unexpected(
                        self.store(),
                        "accum",
                        &Value::Array(pair.to_vec()),
                    ));
                };
                let at = reply::int(self.store(), "accum", at.clone())?;
                let sign = reply::int(self.store(), "accum", sign.clone())?;
                let position = usize::try_from(at)
                    .ok()
                    .and_then(|a| positions.get(a))
                    .ok_or_else(|| reply::unexpected(self.store(), "accum", &Value::Int(at)))?;
                let position = *position as usize;
                if refused.is_none_or(|(first, _)| position < first) {
                    let value = if sign < 0 {
                        f32::NEG_INFINITY
                    } else {
                        f32::INFINITY
                    };
                    refused = Some((position, value));
                }
            }
        }
        match refused {
            None => Ok(()),
            Some((index, value)) => Err(Error::NonFinite {
                what: "accum result",
                index,
                value,
            }),
        }
    }

    /// Removes `keys` with their slots and scores; absent keys are ignored.
    pub fn remove(&self, keys: &[K]) -> Result<()> {
        let deadline = self.inner.cluster.deadline();
        let (bits, grouped) = self.group(keys)?;
        // A recorded script, not a plain HDEL: a resent HDEL could remove a
        // row another writer inserted after the first one ran.
        let id = layout::new_version();
        let mut requests = Vec::with_capacity(grouped.len());
        for (bucket, positions) in grouped.iter() {
            let mut cmd = self.write_cmd(&scripts::REMOVE, bucket, id);
            for &p in positions {
                cmd.arg(&layout::field(bits[p as usize])[..]);
            }
            requests.push(self.bucket_request(bucket, &cmd));
        }
        for reply in self.inner.cluster.run_by(&requests, deadline)? {
            reply::int(self.store(), "remove", reply)?;
        }
        Ok(())
    }

    /// Removes every key (the slot columns stay defined, as on a local
    /// variable), 4096 buckets per round trip; it
    /// also ends a restore that was interrupted (see
    /// [`RedisVariable::restore`]), leaving the variable empty. A failure
    /// part-way leaves some buckets cleared and the others as they were.
    pub fn clear(&self) -> Result<()> {
        // Recorded, as `remove` is: a resend never removes later rows.
        for window in bucket_windows(self.inner.buckets) {
            let id = layout::new_version();
            let requests: Vec<Request> = window
                .map(|b| self.bucket_request(b, &self.write_cmd(&scripts::CLEAR, b, id)))
                .collect();
            for reply in self.inner.cluster.run(&requests)? {
                reply::int(self.store(), "clear", reply)?;
            }
        }
        self.set_restoring(None)
    }

    /// Removes the variable from Redis altogether: its rows and its
    /// metadata (slots, settings). Other open handles of it are not told:
    /// they keep the settings and slots they read at open and would write
    /// rows in that layout, so close them first (a handle opened afterwards
    /// creates the variable anew).
    pub fn destroy(self) -> Result<()> {
        self.clear()?;
        let mut cmd = redis::cmd("UNLINK");
        cmd.arg(&self.inner.meta_key[..]);
        let reply = self.run_on_meta(&cmd)?;
        reply::int(self.store(), "UNLINK", reply).map(drop)
    }

    /// Rows in every bucket (`HLEN` of each, 4096 buckets per round
    /// trip): exact when no batch is in flight. An
    /// error while a restore is in progress or after one was interrupted
    /// (see [`RedisVariable::restore`]).
    pub fn size(&self) -> Result<usize> {
        self.check_not_restoring()?;
        let mut total = 0;
        for window in bucket_windows(self.inner.buckets) {
            total += self.bucket_sizes(window)?.iter().sum::<usize>();
        }
        Ok(total)
    }

    /// Bytes the variable takes in the servers' memory: `MEMORY USAGE` of
    /// every bucket and of the metadata, counted exactly (`SAMPLES 0`, a
    /// pass over each bucket on its server), 4096 buckets per round trip.
    pub fn memory_bytes(&self) -> Result<usize> {
        let usage = |key: &[u8]| {
            let mut cmd = redis::cmd("MEMORY");
            cmd.arg("USAGE").arg(key).arg("SAMPLES").arg(0);
            cmd
        };
        let count = |reply: Value| match reply {
            Value::Nil => Ok(0),
            reply => {
                let n = reply::int(self.store(), "MEMORY USAGE", reply)?;
                usize::try_from(n)
                    .map_err(|_| reply::unexpected(self.store(), "MEMORY USAGE", &Value::Int(n)))
            }
        };
        let mut total = count(self.run_on_meta(&usage(&self.inner.meta_key))?)?;
        for window in bucket_windows(self.inner.buckets) {
            let requests: Vec<Request> = window
                .map(|b| self.bucket_request(b, &usage(self.bucket_key(b))))
                .collect();
            for reply in self.inner.cluster.run(&requests)? {
                total += count(reply)?;
            }
        }
        Ok(total)
    }

    /// Rows per bucket of `buckets` (one round trip per node).
    pub(crate) fn bucket_sizes(&self, buckets: Range<u32>) -> Result<Vec<usize>> {
        let requests: Vec<Request> = buckets
            .map(|b| {
                let mut cmd = redis::cmd("HLEN");
                cmd.arg(self.bucket_key(b));
                self.bucket_request(b, &cmd)
            })
            .collect();
        self.inner
            .cluster
            .run(&requests)?
            .into_iter()
            .map(|reply| {
                let n = reply::int(self.store(), "HLEN", reply)?;
                usize::try_from(n)
                    .map_err(|_| reply::unexpected(self.store(), "HLEN", &Value::Int(n)))
            })
            .collect()
    }

    /// Copies the scores of `keys` into `out` (one per key): the restrict
    /// policy's timestamp or count, 0 for a missing key or a variable
    /// without a policy.
    pub fn lookup_scores(&self, keys: &[K], out: &mut [u64]) -> Result<()> {
        let deadline = self.inner.cluster.deadline();
        check_len("out", keys.len(), out.len())?;
        let (bits, grouped) = self.group(keys)?;
        let rows = self.fetch_by(&bits, &grouped, deadline)?;
        let scores = rows
            .iter()
            .map(|r| match r {
                Some(bytes) => Row::parse(bytes, self.dim(), self.store()).map(|r| r.score()),
                None => Ok(0),
            })
            .collect::<Result<Vec<u64>>>()?;
        out.copy_from_slice(&scores);
        Ok(())
    }

    /// Checks that `slot` belongs to this table.
    pub(crate) fn check_slot(&self, slot: SlotId) -> Result<()> {
        dynemb::checks::check_slot(self.inner.id, self.name(), slot)
    }
}
