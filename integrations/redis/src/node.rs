//! [`Node`]: one Redis server (a single server, or one master of a
//! cluster) and a pool of connections to it.
//!
//! A connection is taken from the pool for one exchange (a pipeline sent,
//! its replies read) and put back only if the exchange completed, so a
//! connection in the pool never has replies pending. Any failure on a
//! connection drops it and every other idle connection of the node (after a
//! node restarts, all of them are dead); the next exchange connects afresh.
//! That is the whole reconnect logic: a node that comes back is used again
//! by the next batch.
//!
//! Every wait is bounded: connecting by the configured connect timeout,
//! and everything by the deadline the caller gives (a batch's, see
//! [`crate::cluster`]): a pipeline is sent in pieces, and the socket
//! timeouts are set to the time left before each piece sent and each
//! reply read. A new connection
//! authenticates (the redis crate does, from the password given) and loads
//! the crate's Lua scripts ([`crate::scripts`]) before its first use, so
//! `EVALSHA` finds them even on a node that just restarted empty.

use crate::config::RedisConfig;
use crate::scripts::ALL_SCRIPTS;
use dynemb::{BackendErrorKind, Error, Result};
use redis::{Client, Connection, ConnectionAddr, IntoConnectionInfo, RedisError, Value};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Idle connections kept per node (more are opened when more threads
/// exchange with the node at once, and closed after use).
const MAX_IDLE: usize = 16;

/// Bytes of a pipeline written at a time (see [`Node::send`]).
const SEND_PIECE: usize = 1 << 20;

/// One Redis server and its idle connections.
pub(crate) struct Node {
    /// `host:port`, as the cluster names it.
    addr: String,
    client: Client,
    connect_timeout: Duration,
    command_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
}

/// A connection taken from a node's pool for one exchange.
pub(crate) struct Lease {
    conn: Connection,
    /// Whether it came from the pool (it may have died while idle).
    reused: bool,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("addr", &self.addr).finish()
    }
}

impl Node {
    /// A node at `host:port` (not connected yet).
    pub(crate) fn new(host: &str, port: u16, config: &RedisConfig) -> Result<Node> {
        let addr = format!("{host}:{port}");
        let mut redis_info = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = &config.username {
            redis_info = redis_info.set_username(user);
        }
        if let Some(password) = &config.password {
            redis_info = redis_info.set_password(password);
        }
        let info = ConnectionAddr::Tcp(host.to_string(), port)
            .into_connection_info()
            .map_err(|e| backend_error(&addr, &e))?
            .set_redis_settings(redis_info);
        let client = Client::open(info).map_err(|e| backend_error(&addr, &e))?;
        Ok(Node {
            addr,
            client,
            connect_timeout: config.connect_timeout,
            command_timeout: config.command_timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// `host:port`.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// An idle connection, or a new one made by `deadline`.
    pub(crate) fn lease(&self, deadline: Instant) -> Result<Lease> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match idle {
            Some(conn) => Ok(Lease { conn, reused: true }),
            None => Ok(Lease {
                conn: self.connect(deadline)?,
                reused: false,
            }),
        }
    }

    /// Opens, authenticates and prepares a connection (scripts loaded),
    /// within the connect timeout and by `deadline`.
    fn connect(&self, deadline: Instant) -> Result<Connection> {
        let fail = |e: RedisError| backend_error(&self.addr, &e);
        let wait = self.remaining(deadline)?.min(self.connect_timeout);
        let mut conn = self
            .client
            .get_connection_with_timeout(wait)
            .map_err(fail)?;
        let deadline = deadline.min(Instant::now() + self.command_timeout);
        let mut load = Vec::new();
        for script in ALL_SCRIPTS.iter() {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script.code())
                .write_packed_command(&mut load);
        }
        self.send_on(&mut conn, &load, deadline)?;
        for reply in self.receive_on(&mut conn, ALL_SCRIPTS.len(), deadline)? {
            if let Value::ServerError(e) = reply {
                return Err(backend_error(&self.addr, &e.into()));
            }
        }
        Ok(conn)
    }

    /// The time left until `deadline` (a [`BackendErrorKind::Timeout`]
    /// if none is).
    fn remaining(&self, deadline: Instant) -> Result<Duration> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(Error::Backend {
                store: format!("redis {}", self.addr),
                kind: BackendErrorKind::Timeout,
                message: "no reply before the batch's deadline".into(),
            })
        } else {
            Ok(left)
        }
    }

    /// Sends a packed pipeline on `lease`, by `deadline` (first half of an
    /// exchange: the replies are read by [`Node::receive`], so that every
    /// node of a batch works at once). A failure drops the node's idle
    /// connections.
    pub(crate) fn send(&self, lease: &mut Lease, packed: &[u8], deadline: Instant) -> Result<()> {
        self.send_on(&mut lease.conn, packed, deadline)
    }

    /// Sends `packed` in pieces of [`SEND_PIECE`] bytes, each only if
    /// `deadline` has not passed and within the time left: a large
    /// pipeline cannot outlast the deadline by more than one piece's
    /// write. A pipeline cut short leaves the connection unusable, so it
    /// is dropped (the commands sent whole may have run: a batch that
    /// fails may have been applied in part, see [`crate::cluster`]).
    fn send_on(&self, conn: &mut Connection, packed: &[u8], deadline: Instant) -> Result<()> {
        for piece in packed.chunks(SEND_PIECE) {
            let wait = self.remaining(deadline).inspect_err(|_| self.drop_idle())?;
            conn.set_write_timeout(Some(wait))
                .and_then(|()| conn.send_packed_command(piece))
                .map_err(|e| self.failed(&e))?;
        }
        Ok(())
    }

    /// Puts an unused, healthy `lease` back in the pool.
    pub(crate) fn give_back(&self, lease: Lease) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(lease.conn);
        }
    }

    /// Reads `count` replies from `lease`, each by `deadline`, and puts it
    /// back in the pool. Error replies are values ([`Value::ServerError`]);
    /// a broken or silent connection is an error, and the connection is
    /// dropped with the node's idle ones.
    pub(crate) fn receive(
        &self,
        mut lease: Lease,
        count: usize,
        deadline: Instant,
    ) -> Result<Vec<Value>> {
        let replies = self.receive_on(&mut lease.conn, count, deadline)?;
        self.give_back(lease);
        Ok(replies)
    }

    /// Reads `count` replies, each by `deadline`, stopping at the first
    /// failure (not the redis crate's pipeline reading, which waits for
    /// every reply even after one timed out).
    fn receive_on(
        &self,
        conn: &mut Connection,
        count: usize,
        deadline: Instant,
    ) -> Result<Vec<Value>> {
        let mut replies = Vec::with_capacity(count);
        for _ in 0..count {
            let wait = self.remaining(deadline).inspect_err(|_| self.drop_idle())?;
            // Error replies come back as `Ok(Value::ServerError)`; an `Err`
            // is the connection failing (broken, timed out, garbled).
            let reply = conn
                .set_read_timeout(Some(wait))
                .and_then(|()| conn.recv_response())
                .map_err(|e| self.failed(&e))?;
            replies.push(reply);
        }
        Ok(replies)
    }

    /// [`Node::send`] and [`Node::receive`] of one pipeline, within the
    /// command timeout; a pooled connection that turns out dead (the node
    /// restarted while it was idle) is replaced once by a new one. Only
    /// for commands that may run twice.
    pub(crate) fn exchange(&self, packed: &[u8], count: usize) -> Result<Vec<Value>> {
        let deadline = Instant::now() + self.command_timeout;
        let mut lease = self.lease(deadline)?;
        let reused = lease.reused;
        let result = self
            .send(&mut lease, packed, deadline)
            .and_then(|()| self.receive(lease, count, deadline));
        match result {
            Err(Error::Backend {
                kind: BackendErrorKind::Unavailable,
                ..
            }) if reused => {
                let mut fresh = Lease {
                    conn: self.connect(deadline)?,
                    reused: false,
                };
                self.send(&mut fresh, packed, deadline)?;
                self.receive(fresh, count, deadline)
            }
            result => result,
        }
    }

    /// The error for a failed exchange on this node; its idle connections
    /// are dropped (a node that failed once has likely restarted or gone).
    fn failed(&self, error: &RedisError) -> Error {
        self.drop_idle();
        backend_error(&self.addr, error)
    }

    /// Drops the node's idle connections.
    fn drop_idle(&self) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// The [`Error::Backend`] for a redis client error on node `addr`.
pub(crate) fn backend_error(addr: &str, error: &RedisError) -> Error {
    let kind = if error.is_timeout() {
        BackendErrorKind::Timeout
    } else if error.is_io_error() || error.is_connection_dropped() || error.is_connection_refusal()
    {
        BackendErrorKind::Unavailable
    } else if error.is_cluster_error() {
        BackendErrorKind::NotServing
    } else {
        BackendErrorKind::Server
    };
    Error::Backend {
        store: format!("redis {addr}"),
        kind,
        message: error.to_string(),
    }
}
