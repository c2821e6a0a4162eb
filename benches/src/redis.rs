//! `compare --ops redis`: `dynemb-redis`'s [`RedisVariable`] on a Redis
//! Cluster against a per-key client and against the servers' own
//! pipelined limit.
//!
//! The workload: a 3-master Redis Cluster on loopback, started
//! and stopped (by PID) by the bench itself ([`LocalCluster`]), a
//! `RedisVariable<i64>` of dim 64 holding `--keys` keys (default
//! [`DEFAULT_KEYS`]), batches of `--batch` keys. Timed, in keys/s, each one
//! pass over every key in batches:
//! - `upsert`: the second write of every row (the first pass fills the
//!   table and is not timed);
//! - `lookup`: every row read;
//! - `accum`: bp_v2 `accum` of every row, added on the server (a module
//!   command or a Lua script per bucket);
//! - `apply`: `dynemb-optim`'s `SparseAdam::apply` through
//!   `EmbeddingStore` (its first pass, which creates the `m` and `v`
//!   columns: an optimistic read of rows and slots, the kernel here, a
//!   versioned write-back per bucket).
//!
//! The servers load `dynemb-redis-module` (built by the bench itself,
//! from its own workspace, `integrations/redis/module`; see [`module_path`]),
//! and the passes run twice: with the module's native commands (the
//! `dynemb-redis` column, which the ratios use) and with the Lua
//! scripts (`use_module: false`, the `Lua` column), each on a table of its
//! own, the servers flushed in between. The servers' `INFO commandstats`
//! must show the module's commands run in the first pass and none in the
//! second, or the group fails.
//!
//! Against:
//! 1. **a per-key client**, what a user writes by hand with the `redis`
//!    crate: one connection to each node, one command at a time, routed by
//!    the bucket's hash slot; the same layout (256 buckets, each a hash
//!    with a hash tag, field = the key's 8 bytes, value = an 8-byte
//!    version, an 8-byte score and the values, then the slot columns).
//!    `upsert` is an `HSET`, `lookup` an `HGET` (decoded), `accum` and
//!    `apply` an `HGET` then an `HSET` (read, add or run Adam here, write;
//!    not atomic, as such clients are). It is slow, so it runs on the first
//!    [`PER_KEY_SAMPLE`] keys and its keys/s are that sample's.
//! 2. **the servers' limit**: `redis-benchmark --cluster` on the same
//!    cluster, pipelined ([`PIPELINE`] commands), values of a row's bytes,
//!    random keys over the whole key range. Decision: its `SET` and `GET`
//!    tests, not `HSET`/`HGET`: redis-benchmark has no `HGET` test, and its
//!    `HSET` test writes one hash (`myhash`), so on one node only; `SET`
//!    and `GET` of row-sized values spread over every node are the cheapest
//!    write and read of a row the servers can serve. `lookup` is held
//!    against `GET`, `upsert` and `accum` against `SET` (one write a key),
//!    `apply` against one `GET` and one `SET` a key
//!    ([`combined`]: `1 / (1/get + 1/set)`). The benchmark runs before the
//!    variable is filled, and its keys are flushed afterwards.
//!
//! The report gives dynemb-redis / the per-key client and dynemb-redis /
//! the servers' limit for each op. The cluster, the client and the bench
//! share the machine's cores, so on a small machine every figure here is
//! bounded by that.

use crate::suite::Progress;
use dynemb_optim::{ParamsAdam, SparseAdam, SparseOptimizer};
use dynemb_redis::{RedisConfig, RedisVariable};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use redis::Value;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Keys of the Redis workload when `--keys` is not given.
pub const DEFAULT_KEYS: usize = 1_000_000;
/// Keys the per-key client is timed on.
pub const PER_KEY_SAMPLE: usize = 20_000;
/// Masters of the bench's cluster.
pub const MASTERS: usize = 3;
/// Commands per pipeline of `redis-benchmark`.
pub const PIPELINE: usize = 64;
/// Requests of each `redis-benchmark` test.
pub const BENCHMARK_REQUESTS: usize = 2_000_000;
/// Buckets of both layouts (`RedisConfig`'s default).
const BUCKETS: u32 = 256;
/// Redis Cluster's hash slots.
const SLOTS: u16 = 16384;
/// Seed of the keys and values.
const SEED: u64 = 0x05EE_D0F2_ED15;

/// What the Redis group runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RedisShape {
    /// Keys in the variable.
    pub keys: usize,
    /// Values per row.
    pub dim: usize,
    /// Keys per batch.
    pub batch: usize,
    /// Keys the per-key client is timed on (at most `keys`).
    pub sample: usize,
}

/// One op's figures, keys/s.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedisRow {
    /// `lookup`, `upsert`, `accum` or `apply` (SparseAdam).
    pub op: String,
    /// `RedisVariable`'s batched API, writes as the module's commands.
    pub dynemb: f64,
    /// The same with the writes as Lua scripts (`use_module: false`).
    pub lua: f64,
    /// The per-key client.
    pub per_key: f64,
    /// The servers' pipelined limit for this op (see the module docs).
    pub limit: f64,
    /// Which `redis-benchmark` figure `limit` is.
    pub limit_of: String,
}

impl RedisRow {
    /// dynemb-redis / per-key client.
    pub fn per_key_ratio(&self) -> f64 {
        self.dynemb / self.per_key
    }

    /// dynemb-redis / the servers' limit.
    pub fn limit_ratio(&self) -> f64 {
        self.dynemb / self.limit
    }
}

/// Everything the Redis group measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedisResults {
    /// The workload.
    pub shape: RedisShape,
    /// Masters of the cluster.
    pub masters: usize,
    /// `redis-benchmark`'s requests/s per test (`SET`, `GET`).
    pub benchmark: BTreeMap<String, f64>,
    /// Per op, in report order.
    pub rows: Vec<RedisRow>,
    /// Seconds the group took, cluster start and stop included.
    pub seconds: f64,
}

/// Whether `redis-server`, `redis-cli` and `redis-benchmark` can be run
/// (the default `--ops` includes the Redis group only then).
pub fn available() -> bool {
    ["redis-server", "redis-cli", "redis-benchmark"]
        .iter()
        .all(|tool| {
            Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// The requests/s of each test in `redis-benchmark -q` output (`SET:
/// 123456.79 requests per second, p50=...`; progress lines, separated by
/// carriage returns, are skipped).
pub fn parse_benchmark(output: &str) -> BTreeMap<String, f64> {
    let mut figures = BTreeMap::new();
    for line in output.split(['\r', '\n']) {
        let Some((test, rest)) = line.trim().split_once(": ") else {
            continue;
        };
        let Some((number, _)) = rest.split_once(" requests per second") else {
            continue;
        };
        if let Ok(rps) = number.trim().parse::<f64>() {
            figures.insert(test.trim().to_string(), rps);
        }
    }
    figures
}

/// Keys/s of an op that reads and writes each key once, from the read and
/// write rates: `1 / (1/read + 1/write)`.
pub fn combined(read: f64, write: f64) -> f64 {
    1.0 / (1.0 / read + 1.0 / write)
}

/// The Markdown section of the results: a table of ops with their
/// ratios.
pub fn render(r: &RedisResults) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n### dynemb-redis on a {}-master Redis Cluster on loopback (dim {}, {} keys, batches \
         of {}; K keys/s; per-key client timed on {} keys; limit: redis-benchmark --cluster \
         -P {PIPELINE}, SET {:.0} K/s, GET {:.0} K/s)\n",
        r.masters,
        r.shape.dim,
        r.shape.keys,
        r.shape.batch,
        r.shape.sample,
        r.benchmark.get("SET").copied().unwrap_or(f64::NAN) / 1e3,
        r.benchmark.get("GET").copied().unwrap_or(f64::NAN) / 1e3,
    );
    s.push_str(
        "| op | dynemb-redis (module) | (Lua scripts) | per-key client | ratio | server limit | \
         ratio |\n|---|---|---|---|---|---|---|\n",
    );
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1}x | {:.1} ({}) | {:.2}x |",
            row.op,
            row.dynemb / 1e3,
            row.lua / 1e3,
            row.per_key / 1e3,
            row.per_key_ratio(),
            row.limit / 1e3,
            row.limit_of,
            row.limit_ratio(),
        );
    }
    let _ = writeln!(s, "\n({:.0} s in all)", r.seconds);
    s
}

/// A port free on loopback whose cluster bus port (+10000) is free too.
fn free_port() -> std::io::Result<u16> {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
}

/// `dynemb-redis-module`'s shared library, built in release from its own
/// workspace (`cargo build --release --manifest-path
/// integrations/redis/module/Cargo.toml`) into `redis-module/` beside the
/// profile directory the running binary was built in
/// (`<target>/release/compare`).
pub fn module_path() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the bench's path: {e}"))?;
    let target = exe
        .ancestors()
        .nth(2)
        .ok_or("the bench is not in <target>/<profile>/")?
        .join("redis-module");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "--manifest-path",
        ])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../integrations/redis/module/Cargo.toml"
        ))
        .arg("--target-dir")
        .arg(&target)
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building dynemb-redis-module failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let path = target.join("release").join("libdynemb_redis_module.so");
    if path.exists() {
        Ok(path)
    } else {
        Err(format!("{} was not built", path.display()))
    }
}

/// A Redis Cluster of `redis-server` processes on loopback, each in a
/// directory of its own under the system's temporary directory, without
/// persistence, each loading `dynemb-redis-module`; killed by PID and
/// their directories removed when dropped.
pub struct LocalCluster {
    servers: Vec<(Child, u16)>,
    dirs: Vec<PathBuf>,
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for (child, _) in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl LocalCluster {
    /// Starts `masters` masters (at least 3) and joins them with
    /// `redis-cli --cluster create`; returns once every node says
    /// `cluster_state:ok`.
    pub fn start(masters: usize, module: &std::path::Path) -> Result<LocalCluster, String> {
        let mut cluster = LocalCluster {
            servers: Vec::new(),
            dirs: Vec::new(),
        };
        for i in 0..masters {
            let port = free_port().map_err(|e| format!("no free port: {e}"))?;
            let dir = std::env::temp_dir().join(format!(
                "dynemb-compare-redis-{}-{i}-{port}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            cluster.dirs.push(dir.clone());
            let log = std::fs::File::create(dir.join("server.log")).map_err(|e| e.to_string())?;
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .arg("--loadmodule")
                .arg(module)
                .arg("--dir")
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .spawn()
                .map_err(|e| format!("redis-server: {e}"))?;
            cluster.servers.push((child, port));
        }
        for &(_, port) in &cluster.servers {
            wait_for(Duration::from_secs(30), || {
                connect(port).is_ok_and(|mut c| redis::cmd("PING").query::<String>(&mut c).is_ok())
            })
            .map_err(|_| format!("redis-server on {port} did not start"))?;
        }
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(cluster.addrs())
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        let known = format!("cluster_known_nodes:{masters}");
        wait_for(Duration::from_secs(30), || {
            cluster.servers.iter().all(|&(_, port)| {
                connect(port).is_ok_and(|mut c| {
                    let info: String = redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query(&mut c)
                        .unwrap_or_default();
                    info.contains("cluster_state:ok") && info.contains(&known)
                })
            })
        })
        .map_err(|_| "the cluster did not come up".to_string())?;
        Ok(cluster)
    }

    /// `127.0.0.1:<port>` of every node.
    pub fn addrs(&self) -> Vec<String> {
        self.servers
            .iter()
            .map(|(_, port)| format!("127.0.0.1:{port}"))
            .collect()
    }

    /// Ports of the nodes.
    fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(|&(_, port)| port).collect()
    }
}

/// Polls `ready` every 50 ms until it holds or `limit` passes.
fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) -> Result<(), ()> {
    let deadline = Instant::now() + limit;
    while !ready() {
        if Instant::now() > deadline {
            return Err(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A connection to the node on `port`.
fn connect(port: u16) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    Ok(conn)
}

/// Runs the group: starts the cluster, measures, stops it.
pub fn run(shape: RedisShape, progress: &Progress) -> Result<RedisResults, String> {
    let started = Instant::now();
    progress.note(format_args!("redis: building dynemb-redis-module"));
    let module = module_path()?;
    progress.note(format_args!(
        "redis: starting a {MASTERS}-master cluster on loopback"
    ));
    let cluster = LocalCluster::start(MASTERS, &module)?;
    let row_bytes = 16 + 4 * shape.dim;
    progress.note(format_args!(
        "redis: redis-benchmark --cluster -t set,get -P {PIPELINE} -d {row_bytes}"
    ));
    let benchmark = server_limit(&cluster, row_bytes, shape.keys)?;
    flush(&cluster)?;
    let (set, get) = match (benchmark.get("SET"), benchmark.get("GET")) {
        (Some(&set), Some(&get)) => (set, get),
        _ => {
            return Err(format!(
                "redis-benchmark gave no SET/GET figure: {benchmark:?}"
            ))
        }
    };

    let mut rng = Pcg64Mcg::seed_from_u64(SEED);
    let keys: Vec<i64> = (0..shape.keys).map(|_| rng.random()).collect();
    let values: Vec<f32> = (0..shape.batch.min(shape.keys) * shape.dim)
        .map(|_| rng.random_range(-0.1..0.1))
        .collect();
    let dynemb = batched(&cluster, shape, &keys, &values, true, progress)?;
    flush(&cluster)?;
    let lua = batched(&cluster, shape, &keys, &values, false, progress)?;
    progress.note(format_args!(
        "redis: per-key client on {} keys",
        shape.sample
    ));
    let per_key = per_key(&cluster, shape, &keys[..shape.sample], &values)?;
    drop(cluster);

    let limits = [
        ("lookup", get, "GET"),
        ("upsert", set, "SET"),
        ("accum", set, "SET"),
        ("apply", combined(get, set), "GET+SET"),
    ];
    let rows = limits
        .into_iter()
        .map(|(op, limit, limit_of)| RedisRow {
            op: if op == "apply" {
                "apply (SparseAdam)"
            } else {
                op
            }
            .to_string(),
            dynemb: dynemb[op],
            lua: lua[op],
            per_key: per_key[op],
            limit,
            limit_of: limit_of.to_string(),
        })
        .collect();
    Ok(RedisResults {
        shape,
        masters: MASTERS,
        benchmark,
        rows,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `redis-benchmark`'s `SET` and `GET` requests/s on the cluster.
fn server_limit(
    cluster: &LocalCluster,
    row_bytes: usize,
    keys: usize,
) -> Result<BTreeMap<String, f64>, String> {
    let port = cluster.ports()[0].to_string();
    let out = Command::new("redis-benchmark")
        .args([
            "--cluster",
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "set,get",
            "-q",
        ])
        .args(["-P", &PIPELINE.to_string(), "-d", &row_bytes.to_string()])
        .args([
            "-n",
            &BENCHMARK_REQUESTS.to_string(),
            "-r",
            &keys.to_string(),
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("redis-benchmark: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(parse_benchmark(&String::from_utf8_lossy(&out.stdout)))
}

/// Empties every node (the benchmark's keys, a pass's table and records).
fn flush(cluster: &LocalCluster) -> Result<(), String> {
    for port in cluster.ports() {
        let mut conn = connect(port).map_err(|e| e.to_string())?;
        redis::cmd("FLUSHALL")
            .query::<()>(&mut conn)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Calls of the module's commands (`dynemb.*` in `INFO commandstats`)
/// that the nodes have run.
fn module_calls(cluster: &LocalCluster) -> Result<u64, String> {
    let mut calls = 0;
    for port in cluster.ports() {
        let mut conn = connect(port).map_err(|e| e.to_string())?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        for line in info.lines().filter(|l| l.starts_with("cmdstat_dynemb.")) {
            let count = line
                .split_once(":calls=")
                .and_then(|(_, rest)| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| format!("INFO commandstats: {line:?}"))?;
            calls += count;
        }
    }
    Ok(calls)
}

/// `RedisVariable`'s keys/s per op, one pass over every key each, its
/// writes as the module's commands (`module`) or as Lua scripts.
fn batched(
    cluster: &LocalCluster,
    shape: RedisShape,
    keys: &[i64],
    values: &[f32],
    module: bool,
    progress: &Progress,
) -> Result<BTreeMap<&'static str, f64>, String> {
    let config = RedisConfig {
        nodes: cluster.addrs(),
        prefix: "compare".into(),
        buckets: BUCKETS,
        command_timeout: Duration::from_secs(120),
        use_module: module,
        ..RedisConfig::default()
    };
    let form = if module { "module" } else { "Lua" };
    let var = RedisVariable::open(
        dynemb::Variable::<i64>::builder(format!("batched_{form}")).dim(shape.dim),
        config,
    )
    .map_err(|e| e.to_string())?;
    if var.uses_module() != module {
        return Err(format!(
            "the {form} pass's variable does not use the {form} form"
        ));
    }
    let calls_before = module_calls(cluster)?;
    let dim = shape.dim;
    let pass = |what: &str, op: &mut BatchOp<'_>| {
        let started = Instant::now();
        for batch in keys.chunks(shape.batch) {
            op(batch, &values[..batch.len() * dim]).map_err(|e| format!("{what}: {e}"))?;
        }
        let rate = keys.len() as f64 / started.elapsed().as_secs_f64();
        progress.note(format_args!(
            "redis: dynemb-redis ({form}) {what}: {:.1} K keys/s",
            rate / 1e3
        ));
        Ok::<f64, String>(rate)
    };
    pass("fill (upsert of new keys)", &mut |k, v| var.upsert(k, v))?;
    let mut rates = BTreeMap::new();
    rates.insert("upsert", pass("upsert", &mut |k, v| var.upsert(k, v))?);
    let mut out = vec![0.0; shape.batch * dim];
    rates.insert(
        "lookup",
        pass("lookup", &mut |k, _| {
            var.lookup(k, &mut out[..k.len() * dim])
        })?,
    );
    let exists = vec![true; shape.batch];
    rates.insert(
        "accum",
        pass("accum", &mut |k, v| var.accum(k, v, &exists[..k.len()]))?,
    );
    let adam = SparseAdam::new(ParamsAdam {
        lr: 0.001,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    rates.insert(
        "apply",
        pass("apply (SparseAdam)", &mut |k, g| adam.apply(&var, k, g))?,
    );
    let calls = module_calls(cluster)? - calls_before;
    if (calls > 0) != module {
        return Err(format!(
            "the {form} pass ran {calls} module commands: its writes did not go as its form says"
        ));
    }
    var.destroy().map_err(|e| e.to_string())?;
    Ok(rates)
}

/// One batch of a timed pass of the batched API: keys, their values.
type BatchOp<'a> = dyn FnMut(&[i64], &[f32]) -> dynemb::Result<()> + 'a;

/// One key of the per-key client: the node's connection, the bucket's
/// Redis key, the field (the key's bytes), the key's position.
type KeyOp<'a> =
    dyn FnMut(&mut redis::Connection, &str, [u8; 8], usize) -> redis::RedisResult<()> + 'a;

/// Bucket of a key in the per-key client's layout (a multiplicative hash,
/// as cheap as the variable's).
fn bucket_of(key: i64) -> u32 {
    ((key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as u32 % BUCKETS
}

/// Hash slot of bucket `b`, whose Redis key has the hash tag `{b}`.
fn slot_of_bucket(b: u32) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(b.to_string().as_bytes()) % SLOTS
}

/// The node port serving each hash slot (`CLUSTER SLOTS`).
fn slot_map(port: u16) -> Result<Vec<u16>, String> {
    let mut conn = connect(port).map_err(|e| e.to_string())?;
    let ranges: Vec<Vec<Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    let int = |v: &Value| match v {
        Value::Int(n) => Ok(*n),
        other => Err(format!("CLUSTER SLOTS: unexpected {other:?}")),
    };
    let mut map = vec![0u16; SLOTS as usize];
    for range in &ranges {
        let (start, end) = (int(&range[0])?, int(&range[1])?);
        let Value::Array(node) = &range[2] else {
            return Err(format!("CLUSTER SLOTS: unexpected {:?}", range[2]));
        };
        let node_port = int(&node[1])? as u16;
        for slot in start..=end {
            map[slot as usize] = node_port;
        }
    }
    Ok(map)
}

/// The per-key client's keys/s per op on `keys` (see the module docs).
fn per_key(
    cluster: &LocalCluster,
    shape: RedisShape,
    keys: &[i64],
    values: &[f32],
) -> Result<BTreeMap<&'static str, f64>, String> {
    let dim = shape.dim;
    let slots = slot_map(cluster.ports()[0])?;
    let ports = cluster.ports();
    let mut conns = Vec::new();
    for &port in &ports {
        conns.push(connect(port).map_err(|e| e.to_string())?);
    }
    // Route each bucket once: its Redis key and its node's connection.
    let buckets: Vec<(String, usize)> = (0..BUCKETS)
        .map(|b| {
            let port = slots[slot_of_bucket(b) as usize];
            let node = ports.iter().position(|&p| p == port).unwrap_or(0);
            (format!("compare:perkey:{{{b}}}"), node)
        })
        .collect();
    let row_of = |i: usize| &values[(i % shape.batch.min(keys.len())) * dim..][..dim];
    let encode = |row: &[f32], slots: &[f32]| {
        let mut bytes = Vec::with_capacity(16 + 4 * (row.len() + slots.len()));
        bytes.extend_from_slice(&[0; 16]);
        for v in row.iter().chain(slots) {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes
    };
    let decode = |bytes: &[u8]| -> Vec<f32> {
        bytes[16.min(bytes.len())..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let mut rates = BTreeMap::new();
    let mut timed = |what: &'static str, op: &mut KeyOp<'_>| {
        let started = Instant::now();
        for (i, &key) in keys.iter().enumerate() {
            let (bucket, node) = &buckets[bucket_of(key) as usize];
            op(&mut conns[*node], bucket, key.to_le_bytes(), i)
                .map_err(|e| format!("per-key {what}: {e}"))?;
        }
        rates.insert(what, keys.len() as f64 / started.elapsed().as_secs_f64());
        Ok::<(), String>(())
    };
    timed("upsert", &mut |c, bucket, field, i| {
        redis::cmd("HSET")
            .arg(bucket)
            .arg(&field[..])
            .arg(encode(row_of(i), &[]))
            .query(c)
    })?;
    let mut sink = 0.0f32;
    timed("lookup", &mut |c, bucket, field, _| {
        let bytes: Vec<u8> = redis::cmd("HGET").arg(bucket).arg(&field[..]).query(c)?;
        sink += decode(&bytes)[0];
        Ok(())
    })?;
    timed("accum", &mut |c, bucket, field, i| {
        let bytes: Vec<u8> = redis::cmd("HGET").arg(bucket).arg(&field[..]).query(c)?;
        let mut row = decode(&bytes);
        for (v, d) in row.iter_mut().zip(row_of(i)) {
            *v += d;
        }
        redis::cmd("HSET")
            .arg(bucket)
            .arg(&field[..])
            .arg(encode(&row, &[]))
            .query(c)
    })?;
    let (lr, b1, b2, eps) = (0.001f32, 0.9f32, 0.999f32, 1e-8f32);
    timed("apply", &mut |c, bucket, field, i| {
        let bytes: Vec<u8> = redis::cmd("HGET").arg(bucket).arg(&field[..]).query(c)?;
        let mut all = decode(&bytes);
        all.resize(3 * dim, 0.0); // m and v start at 0
        let (row, slots) = all.split_at_mut(dim);
        let (m, v) = slots.split_at_mut(dim);
        for (j, g) in row_of(i).iter().enumerate() {
            m[j] = b1 * m[j] + (1.0 - b1) * g;
            v[j] = b2 * v[j] + (1.0 - b2) * g * g;
            let (mh, vh) = (m[j] / (1.0 - b1), v[j] / (1.0 - b2));
            row[j] -= lr * mh / (vh.sqrt() + eps);
        }
        redis::cmd("HSET")
            .arg(bucket)
            .arg(&field[..])
            .arg(encode(row, slots))
            .query(c)
    })?;
    std::hint::black_box(sink);
    Ok(rates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benchmark_output_parses() {
        let out = "SET: rps=0.0 (overall: nan) avg_msec=nan (overall: nan)\r\
                   SET: 712250.75 requests per second, p50=3.895 msec\n\
                   GET: rps=902133.1 (overall: 902133.1) avg_msec=2.9\r\
                   GET: 917431.19 requests per second, p50=3.047 msec\n\n";
        let figures = parse_benchmark(out);
        assert_eq!(figures.len(), 2, "{figures:?}");
        assert_eq!(figures["SET"], 712_250.75);
        assert_eq!(figures["GET"], 917_431.19);
        assert!(parse_benchmark("Cluster has 3 master nodes:\n").is_empty());
    }

    #[test]
    fn ratios_and_the_table() {
        assert!((combined(100.0, 100.0) - 50.0).abs() < 1e-9);
        assert!((combined(300.0, 150.0) - 100.0).abs() < 1e-9);
        let row = RedisRow {
            op: "lookup".into(),
            dynemb: 500e3,
            lua: 300e3,
            per_key: 10e3,
            limit: 2e6,
            limit_of: "GET".into(),
        };
        assert_eq!(row.per_key_ratio(), 50.0);
        assert_eq!(row.limit_ratio(), 0.25);
        let results = RedisResults {
            shape: RedisShape {
                keys: 1000,
                dim: 64,
                batch: 100,
                sample: 10,
            },
            masters: 3,
            benchmark: [("SET".to_string(), 1e6), ("GET".to_string(), 2e6)].into(),
            rows: vec![row],
            seconds: 3.0,
        };
        let table = render(&results);
        assert!(
            table.contains("| lookup | 500.0 | 300.0 | 10.0 | 50.0x | 2000.0 (GET) | 0.25x |"),
            "{table}"
        );
        assert!(table.contains("SET 1000 K/s, GET 2000 K/s"), "{table}");
        let json = serde_json::to_value(&results).unwrap();
        assert_eq!(json["rows"][0]["per_key"], 10e3);
    }

    #[test]
    fn buckets_spread_and_slots_are_the_clusters() {
        let mut counts = [0usize; BUCKETS as usize];
        for k in 0..100_000i64 {
            counts[bucket_of(k * 7919) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 200), "{counts:?}");
        // Redis Cluster's documented example: the slot of "123456789" is
        // CRC16 0x31C3 mod 16384.
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789") % SLOTS,
            0x31C3 % SLOTS
        );
        assert!(slot_of_bucket(0) < SLOTS);
    }
}
