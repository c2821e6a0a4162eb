//! Real Redis servers for tests: `redis-server` processes on free loopback
//! ports, each in a temporary directory of its own, stopped by PID when
//! dropped; a single server, or a cluster of masters joined with
//! `redis-cli --cluster create`. No mocks.
//!
//! A test that needs a program this machine lacks skips ([`crate::skip`]):
//! [`Server::start`] and [`Cluster::start`] return `None` when
//! `redis-server` (or, for a cluster, `redis-cli`) is not found, and
//! [`Server::start_with_module`] and [`Form::available`] when
//! `dynemb-redis-module` cannot be built (its bindings need libclang).
//! The programs are the ones on `PATH`, or those named by
//! [`REDIS_SERVER_VAR`] and [`REDIS_CLI_VAR`].

use crate::skip::skip;
use dynemb_redis::RedisConfig;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The environment variable naming the `redis-server` program to run
/// (default: `redis-server` on `PATH`).
pub const REDIS_SERVER_VAR: &str = "DYNEMB_REDIS_SERVER";

/// The environment variable naming the `redis-cli` program to run
/// (default: `redis-cli` on `PATH`).
pub const REDIS_CLI_VAR: &str = "DYNEMB_REDIS_CLI";

/// How to install the Redis programs.
const INSTALL_REDIS: &str = "sudo apt-get install redis-server";

/// How to install what the module's build needs.
const INSTALL_LIBCLANG: &str = "sudo apt-get install libclang-dev";

/// `program` (or the one `var` names) if it runs here (`--version`
/// succeeds), else why not.
fn find(var: &str, program: &str) -> Result<PathBuf, String> {
    let (path, missing) = match std::env::var_os(var) {
        Some(path) => {
            let path = PathBuf::from(path);
            let missing = format!("{program} not found at {} ({var})", path.display());
            (path, missing)
        }
        None => (PathBuf::from(program), format!("{program} not found")),
    };
    match Command::new(&path).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(path),
        _ => Err(missing),
    }
}

/// The `redis-server` program, or why it is missing.
fn redis_server() -> &'static Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(|| find(REDIS_SERVER_VAR, "redis-server"))
}

/// The `redis-cli` program, or why it is missing.
fn redis_cli() -> &'static Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(|| find(REDIS_CLI_VAR, "redis-cli"))
}

/// `found`'s program, or `None` after a [`skip`] saying it is missing.
fn required(found: &'static Result<PathBuf, String>) -> Option<&'static Path> {
    match found {
        Ok(path) => Some(path),
        Err(missing) => {
            skip(missing, INSTALL_REDIS);
            None
        }
    }
}

/// How long a server or a cluster may take to come up.
const STARTUP: Duration = Duration::from_secs(30);

/// Starts of a server tried before its start-up fails the test.
const START_ATTEMPTS: usize = 5;

/// Ports handed out by [`absent_port`]: no server of this process is
/// started on them.
static ABSENT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// A port free on loopback whose cluster bus port (+10000) is free too,
/// and not one of the [`absent_port`]s.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        let absent = ABSENT.lock().unwrap();
        if port < 55_000
            && !absent.contains(&port)
            && !absent.contains(&(port + 10_000))
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
}

/// A loopback port nothing listens on, for the rest of this process: the
/// servers that the tests running meanwhile start are never given it.
pub fn absent_port() -> u16 {
    let mut absent = ABSENT.lock().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().unwrap().port();
    absent.push(port);
    port
}

/// `dynemb-redis-module`'s manifest: the module is a workspace of its
/// own, outside the default build.
const MODULE_MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../integrations/redis/module/Cargo.toml"
);

/// `dynemb-redis-module`'s shared library, built once per test process
/// (`cargo build --release --manifest-path <module>/Cargo.toml`, its own
/// lock file) into `redis-module/` under the target directory the test
/// binary was built in, so that every test binary reuses one build and a
/// test run needs nothing built by hand; or why it cannot be built here
/// (no libclang). A build that fails for another reason fails the test.
fn module_build() -> &'static Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        // <target>/<profile>/deps/<test>, or <target>/<profile>/examples/<example>.
        let target = exe
            .ancestors()
            .nth(3)
            .expect("the test binary lives in <target>/<profile>/<dir>")
            .join("redis-module");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args([
                "build",
                "--locked",
                "--quiet",
                "--release",
                "--manifest-path",
            ])
            .arg(MODULE_MANIFEST)
            .arg("--target-dir")
            .arg(&target)
            .output()
            .expect("cargo runs");
        if !out.status.success() {
            let log = String::from_utf8_lossy(&out.stderr);
            if log.contains("libclang") {
                return Err(
                    "dynemb-redis-module cannot be built: its bindings need libclang, not found"
                        .into(),
                );
            }
            panic!("building dynemb-redis-module failed: {log}");
        }
        let path = target.join("release").join("libdynemb_redis_module.so");
        assert!(path.exists(), "{} was not built", path.display());
        Ok(path)
    })
}

/// `dynemb-redis-module`'s shared library, built if need be (see
/// [`Server::start`]); `None` after a [`skip`] if it cannot be built here.
pub fn module_path() -> Option<PathBuf> {
    match module_build() {
        Ok(path) => Some(path.clone()),
        Err(missing) => {
            skip(missing, INSTALL_LIBCLANG);
            None
        }
    }
}

/// One `redis-server` process.
pub struct Server {
    program: &'static Path,
    port: u16,
    args: Vec<String>,
    dir: tempfile::TempDir,
    child: Option<Child>,
    module: bool,
}

impl Server {
    /// A server without persistence, loading `dynemb-redis-module` when
    /// it can be built here ([`module_path`]; else variables on it run
    /// their writes as Lua scripts, see [`Server::has_module`] and
    /// [`Server::start_with`]); `None` after a [`skip`] if `redis-server`
    /// is not found.
    pub fn start() -> Option<Server> {
        Server::start_with(&[])
    }

    /// [`Server::start`] for a test that needs the module: `None` after a
    /// [`skip`] if it cannot be built here.
    pub fn start_with_module() -> Option<Server> {
        let program = required(redis_server())?;
        let module = module_path()?;
        Some(Server::launch(program, &[], Some(module)))
    }

    /// A server without persistence and without `dynemb-redis-module`:
    /// variables on it run their writes as Lua scripts. `None` after a
    /// [`skip`] if `redis-server` is not found.
    pub fn start_without_module() -> Option<Server> {
        let program = required(redis_server())?;
        Some(Server::launch(program, &[], None))
    }

    /// [`Server::start`] with extra `redis-server` arguments.
    ///
    /// The port is free when chosen but not held until `redis-server`
    /// binds it: meanwhile another test's connection may take it as its
    /// source port, or another test's server may be given it. Then this
    /// server exits (`Address already in use`) and the start is tried
    /// again on another port; a server that answers on the port but is
    /// not this one never counts as started (see [`Server::answers`]).
    ///
    /// Without the module, the test's variables run the Lua scripts only:
    /// that is said on a [`skip`] line (a failure under
    /// `DYNEMB_REQUIRE_ALL_TESTS=1`), and the test goes on.
    pub fn start_with(extra: &[&str]) -> Option<Server> {
        let program = required(redis_server())?;
        let module = match module_build() {
            Ok(path) => Some(path.clone()),
            Err(missing) => {
                skip(
                    &format!("{missing} (the module's form is not tested)"),
                    INSTALL_LIBCLANG,
                );
                None
            }
        };
        Some(Server::launch(program, extra, module))
    }

    /// Whether the server loaded `dynemb-redis-module`, so that variables
    /// use its commands unless their config says `use_module: false` (see
    /// [`Form`]).
    pub fn has_module(&self) -> bool {
        self.module
    }

    fn launch(program: &'static Path, extra: &[&str], module: Option<PathBuf>) -> Server {
        let mut attempt = 1;
        loop {
            // A directory of its own per attempt: nothing of a failed
            // start (its log, a cluster's nodes.conf) is left in it.
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let mut args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                dir.path().to_str().unwrap(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if let Some(module) = &module {
                args.push("--loadmodule".into());
                args.push(module.to_str().unwrap().into());
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            let mut server = Server {
                program,
                port,
                args,
                dir,
                child: None,
                module: module.is_some(),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(log) if attempt < START_ATTEMPTS => {
                    eprintln!("redis-server on {port} exited at start-up, another port: {log}");
                    attempt += 1;
                }
                Err(log) => panic!("redis-server on {port} exited at start-up: {log}"),
            }
        }
    }

    /// Starts the process and waits until it answers on its port: `Err`
    /// with its log if it exits first (its port was taken).
    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("server.log")).unwrap();
        let child = Command::new(self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP;
        loop {
            if self.answers() {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("{status}: {}", self.log()));
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not start: {}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its directory (data files, `nodes.conf`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A configuration for this server alone.
    pub fn config(&self) -> RedisConfig {
        RedisConfig::with_nodes([self.addr()])
    }

    /// A direct connection, for checks behind the variable's back.
    pub fn connection(&self) -> redis::Connection {
        let client = redis::Client::open(format!("redis://{}/", self.addr())).unwrap();
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn
    }

    /// Whether this server, the process started here, answers on its
    /// port: a server that another test started on the same port does not
    /// count (its `process_id` differs).
    fn answers(&self) -> bool {
        let pid = self.pid();
        let client = match self.password() {
            Some(password) => redis::Client::open(format!("redis://:{password}@{}/", self.addr())),
            None => redis::Client::open(format!("redis://{}/", self.addr())),
        };
        // Bounded waits: a start-up poll must not hang on a process that
        // accepted the connection but does not answer.
        let Ok(mut conn) =
            client.and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
        else {
            return false;
        };
        if conn.set_read_timeout(Some(Duration::from_secs(2))).is_err() {
            return false;
        }
        let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut conn) else {
            return false;
        };
        info.lines()
            .any(|line| line.trim() == format!("process_id:{pid}"))
    }

    /// The `--requirepass` among the arguments.
    fn password(&self) -> Option<&str> {
        let at = self.args.iter().position(|a| a == "--requirepass")?;
        self.args.get(at + 1).map(String::as_str)
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, in the same directory. The
    /// port is free from the kill until the new process binds it, so
    /// another test's connection may hold it as its source port for a
    /// moment: the start is tried again then, on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let mut attempt = 1;
        while let Err(log) = self.spawn() {
            assert!(
                attempt < START_ATTEMPTS,
                "redis-server on {} exited at restart: {log}",
                self.port
            );
            attempt += 1;
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Freezes the process (SIGSTOP): it keeps its connections open and
    /// answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Thaws the paused process after `delay`, from another thread (to
    /// be joined before the server is dropped).
    pub fn resume_after(&self, delay: Duration) -> std::thread::JoinHandle<()> {
        let pid = self.pid();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            signal(pid, "-CONT");
        })
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn signal(&self, signal: &str) {
        self::signal(self.pid(), signal);
    }
}

/// Sends `signal` (`-STOP`, `-CONT`) to the process `pid`.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

impl Drop for Server {
    /// Kills the process by its PID (SIGKILL stops a paused one too).
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of masters without replicas.
pub struct Cluster {
    /// Its masters.
    pub servers: Vec<Server>,
}

impl Cluster {
    /// `masters` masters (at least 3, as `redis-cli --cluster create`
    /// requires), joined, with every slot covered, `cluster_state:ok`,
    /// each loading `dynemb-redis-module` when it can be built (see
    /// [`Server::start`]); `None` after a [`skip`] if `redis-server` or
    /// `redis-cli` is not found.
    pub fn start(masters: usize) -> Option<Cluster> {
        Cluster::start_with(masters, &[])
    }

    /// [`Cluster::start`] with extra `redis-server` arguments.
    pub fn start_with(masters: usize, extra: &[&str]) -> Option<Cluster> {
        let cli = required(redis_cli())?;
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
        ];
        args.extend_from_slice(extra);
        let servers = (0..masters)
            .map(|_| Server::start_with(&args))
            .collect::<Option<Vec<Server>>>()?;
        let mut create = Command::new(cli);
        create.arg("--cluster").arg("create");
        for s in &servers {
            create.arg(s.addr());
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { servers };
        cluster.wait_ok();
        Some(cluster)
    }

    /// Waits until every node says `cluster_state:ok` and knows every
    /// master.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + STARTUP;
        loop {
            let ok = self.servers.iter().all(|s| {
                let Ok(client) = redis::Client::open(format!("redis://{}/", s.addr())) else {
                    return false;
                };
                let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(500))
                else {
                    return false;
                };
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut conn)
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{}", self.servers.len()))
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A configuration naming every node.
    pub fn config(&self) -> RedisConfig {
        RedisConfig::with_nodes(self.servers.iter().map(Server::addr))
    }
}

/// A variable name unique in this test process (tests share servers
/// rarely, but proptest cases do).
pub fn unique_name(base: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{base}_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The environment variable that makes a test binary's `worker` test run
/// a worker role (see [`spawn_worker`]).
pub const WORKER_ROLE: &str = "DYNEMB_REDIS_WORKER";

/// Runs this test binary again as a child process that runs only the
/// ignored test `worker` (`--exact --ignored`), with `env` set (the role
/// under [`WORKER_ROLE`] and its parameters): a second process using the
/// same servers.
pub fn spawn_worker(env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "worker",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("spawn the test binary")
}

/// Waits for a worker and fails the test with its output if it failed.
pub fn join_worker(child: Child) {
    let out = child.wait_with_output().expect("wait for the worker");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "worker failed: {text}");
    assert!(text.contains("1 passed"), "the worker ran no test: {text}");
}

/// The value of a worker parameter.
pub fn worker_param(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("worker parameter {name} is not set"))
}

/// How a variable's bucket writes run: as `dynemb-redis-module`'s
/// commands (the servers here load it) or as Lua scripts. The tests of
/// write semantics run under both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The module's native commands.
    Module,
    /// The Lua scripts (`use_module: false`).
    Lua,
}

impl Form {
    /// The forms a test can run here: both, or only [`Form::Lua`] after a
    /// [`skip`] of the module's if it cannot be built here.
    pub fn available() -> Vec<Form> {
        [Form::Module, Form::Lua]
            .into_iter()
            .filter(|form| form.is_available())
            .collect()
    }

    /// Whether a test can run this form here: always for [`Form::Lua`];
    /// for [`Form::Module`], whether the module can be built (`false`
    /// after a [`skip`]). A server started afterwards loads it.
    pub fn is_available(self) -> bool {
        self == Form::Lua || module_path().is_some()
    }

    /// `config` set to use this form.
    pub fn config(self, config: RedisConfig) -> RedisConfig {
        RedisConfig {
            use_module: self == Form::Module,
            ..config
        }
    }
}

/// Calls `server` has run of the commands whose `INFO commandstats` name
/// (lower case, as `evalsha` or `dynemb.accum`) `counted` accepts.
pub fn command_calls(server: &Server, counted: impl Fn(&str) -> bool) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(":calls="))
        .filter(|(name, _)| counted(name))
        .map(|(_, rest)| rest.split(',').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Calls of `dynemb-redis-module`'s commands (`dynemb.*`) that `servers`
/// have run: proof that a variable's writes really went as the module's
/// commands (or, unchanged, that they did not).
pub fn module_calls<'a>(servers: impl IntoIterator<Item = &'a Server>) -> u64 {
    servers
        .into_iter()
        .map(|server| command_calls(server, |name| name.starts_with("dynemb.")))
        .sum()
}
