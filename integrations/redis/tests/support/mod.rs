//! Real Redis servers for the tests: `redis-server` processes on free
//! loopback ports, each in a temporary directory of its own, stopped by
//! PID when dropped. A single server, or a cluster of masters joined with
//! `redis-cli --cluster create`. No mocks.
//!
//! Every test binary includes this module (`mod support;`); not every one
//! uses all of it.
#![allow(dead_code)]

use dynemb_redis::RedisConfig;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// `dynemb-redis-module`'s shared library, which every server loads (see
/// [`Server::start_with`]): built once per test process with `cargo build
/// --profile test -p dynemb-redis-module` into the target directory this
/// test binary was built in (`cargo test` builds no `cdylib`; the test
/// profile reuses the dependencies the tests built), so a test run needs
/// nothing built by hand.
pub fn module_path() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        // <target>/<profile>/deps/<test binary>
        let target = exe
            .ancestors()
            .nth(3)
            .expect("the test binary lives in <target>/<profile>/deps");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "--locked", "--quiet", "--profile", "test"])
            .args(["-p", "dynemb-redis-module"])
            .arg("--target-dir")
            .arg(target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo runs");
        assert!(
            out.status.success(),
            "building dynemb-redis-module failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = target.join("debug").join("libdynemb_redis_module.so");
        assert!(path.exists(), "{} was not built", path.display());
        path
    })
    .clone()
}

/// One `redis-server` process.
pub struct Server {
    port: u16,
    args: Vec<String>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Server {
    /// A server without persistence.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// A server without persistence and without `dynemb-redis-module`:
    /// variables on it run their writes as Lua scripts.
    pub fn start_without_module() -> Server {
        Server::launch(&[], false)
    }

    /// A server with extra `redis-server` arguments.
    ///
    /// The port is free when chosen but not held until `redis-server`
    /// binds it: meanwhile another test's connection may take it as its
    /// source port, or another test's server may be given it. Then this
    /// server exits (`Address already in use`) and the start is tried
    /// again on another port; a server that answers on the port but is
    /// not this one never counts as started (see [`Server::answers`]).
    ///
    /// The server loads `dynemb-redis-module` ([`module_path`]), so
    /// variables use its commands unless their config says
    /// `use_module: false` (see [`Form`]).
    pub fn start_with(extra: &[&str]) -> Server {
        Server::launch(extra, true)
    }

    fn launch(extra: &[&str], module: bool) -> Server {
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
            if module {
                args.push("--loadmodule".into());
                args.push(module_path().to_str().unwrap().into());
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            let mut server = Server {
                port,
                args,
                dir,
                child: None,
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
        let child = Command::new("redis-server")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server)");
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
    pub servers: Vec<Server>,
}

impl Cluster {
    /// `masters` masters (at least 3, as `redis-cli --cluster create`
    /// requires), joined, with every slot covered, `cluster_state:ok`.
    pub fn start(masters: usize) -> Cluster {
        Cluster::start_with(masters, &[])
    }

    /// [`Cluster::start`] with extra `redis-server` arguments.
    pub fn start_with(masters: usize, extra: &[&str]) -> Cluster {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
        ];
        args.extend_from_slice(extra);
        let servers: Vec<Server> = (0..masters).map(|_| Server::start_with(&args)).collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for s in &servers {
            create.arg(s.addr());
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { servers };
        cluster.wait_ok();
        cluster
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
    /// Both forms.
    pub const BOTH: [Form; 2] = [Form::Module, Form::Lua];

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
