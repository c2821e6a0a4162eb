//! [`Cluster`]: the servers behind a variable, and how a batch of commands
//! reaches them.
//!
//! # Routing
//!
//! Every command names one Redis key, so it has a cluster hash slot
//! ([`slot_of`], the cluster's CRC16 of the key's hash tag). A single
//! server (cluster mode off) serves every slot; in a cluster, the slot map
//! comes from `CLUSTER SLOTS` on any reachable node and is refreshed when a
//! node answers `MOVED` (after a failover or a resharding).
//!
//! # One round trip per node, all nodes at once
//!
//! [`Cluster::run`] groups a batch's commands by the node serving their
//! slot, packs each group into one pipeline, sends every pipeline before
//! reading any reply, then reads each node's replies: the nodes work in
//! parallel, and the batch costs one round trip per node. Replies come back
//! in the batch's order.
//!
//! Redirections are followed for the commands that got them, not the whole
//! batch (a command that got `MOVED`, `ASK`, `TRYAGAIN` or `NOSCRIPT` was
//! not executed, so sending it again applies it once): `MOVED` refreshes
//! the slot map, `ASK` sends the command to the named node after `ASKING`,
//! `NOSCRIPT` (a server whose scripts were flushed) loads the scripts
//! there first, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING` and `MASTERDOWN` wait
//! a moment. After [`MAX_ROUNDS`] rounds, or when the next pause would
//! pass the batch's deadline, the batch fails with
//! [`BackendErrorKind::NotServing`].
//!
//! # Lost replies are resent
//!
//! Every command this crate sends may run twice with the effect of once:
//! reads, scripts that are idempotent by nature (opening a variable,
//! creating a slot), bucket writes, which record their reply on the
//! server under a write id and answer a second run with it (see
//! [`crate::scripts`]), and `destroy`'s `UNLINK` of the metadata (a
//! second run finds nothing to remove, since no other handle may be in
//! use then). So a node whose replies were lost (its connection
//! broke after the pipeline was sent, or it stayed silent for the command
//! timeout) gets its commands again on a new connection, in up to
//! [`MAX_RESENDS`] more rounds. Decision: resend the node's whole
//! pipeline, not only the commands whose replies were missing; each runs
//! once anyway, and the code stays one path.
//!
//! # One deadline per call
//!
//! A batch ends by its deadline, [`RedisConfig::batch_deadline`] (twice
//! the command timeout) after the call that sends it started, whatever
//! happens: each round waits for the replies of every node until one
//! shared instant (the command timeout from the round's start, or the
//! deadline if sooner), so a silent node costs one wait, not one per
//! node; connecting, sending, pauses and resends fit in the same
//! deadline. One full wait plus one resend's is the reason for twice the
//! command timeout: a batch that just needs the whole command timeout is
//! not cut short, and a reply lost to a blip still has a resend's worth of
//! time.
//!
//! What the deadline covers, precisely: a call of one batch (`lookup`,
//! `lookup_or_insert` with both its round trips, `upsert`, `accum`,
//! `remove`, `lookup_scores`) takes its deadline when it starts, so
//! building its commands here counts against it; every other call
//! (`update_rows`, the slot calls, the whole-table passes) is a series
//! of batches, and each batch takes its deadline when it is sent. The
//! deadline is checked before anything is sent (a batch whose deadline
//! has passed sends nothing and fails with
//! [`BackendErrorKind::Timeout`]), before each piece of a pipeline sent
//! ([`crate::node`] sends it in pieces) and before each reply is read,
//! and every wait on a socket is cut at it. What is not cut is work on
//! this machine already under way (building commands, decoding a reply
//! once its bytes arrive, copying rows out): a call returns by its
//! deadline, or as soon as that work ends if it ends later.
//!
//! # Why not the redis crate's cluster client
//!
//! The redis crate's synchronous `ClusterConnection` is single-threaded
//! (one per thread), sends every redirected command of a pipeline again
//! one at a time, reconnects without reloading scripts, and keeps the slot
//! numbers private; so this module routes itself over plain connections
//! ([`crate::node`]), with the hash from the `crc16` crate the redis crate
//! uses too.
//!
//! # Failures
//!
//! A node that cannot be reached fails the batch before anything is sent
//! (a connection to every node of the batch is had first). A node whose
//! replies are still lost after the resends, or by the deadline, fails
//! the batch with an [`Error::Backend`] naming it (`Timeout` or
//! `Unavailable`, after the other nodes' replies are read, so their
//! connections stay usable); commands sent to other nodes may have been
//! applied then, and on the failing node each command is applied once or
//! not at all: a failed batch is not rolled back.

use crate::config::{parse_node, RedisConfig};
use crate::node::{backend_error, Lease, Node};
use crate::scripts::ALL_SCRIPTS;
use dynemb::{BackendErrorKind, Error, Result};
use redis::{ServerErrorKind, Value};
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// Rounds of redirections and retries a batch may take.
pub(crate) const MAX_ROUNDS: usize = 8;

/// Rounds in which a batch resends commands whose reply was lost.
pub(crate) const MAX_RESENDS: usize = 2;

/// The cluster hash slot of a Redis key: CRC16 (XMODEM) of its hash tag
/// (the bytes between the first `{` and the next `}`, if not empty) or of
/// the whole key, modulo 16384.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let hashed = tagged.unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS as u16
}

/// One command of a batch: the slot of its key and its packed bytes.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// The hash slot of the command's key.
    pub slot: u16,
    /// The command in the wire protocol (`redis::Cmd::get_packed_command`).
    pub packed: Vec<u8>,
}

impl Request {
    /// The request for `cmd`, whose key is `key`.
    pub(crate) fn new(key: &[u8], cmd: &redis::Cmd) -> Request {
        Request {
            slot: slot_of(key),
            packed: cmd.get_packed_command(),
        }
    }
}

/// Which node serves which slot.
#[derive(Debug)]
struct Topology {
    /// The masters (one for a single server).
    nodes: Vec<Arc<Node>>,
    /// Per slot, its node's index in `nodes`; `None`: a single server.
    slots: Option<Vec<u16>>,
}

impl Topology {
    fn node_of(&self, slot: u16) -> Option<&Arc<Node>> {
        match &self.slots {
            None => self.nodes.first(),
            Some(map) => {
                let i = map[usize::from(slot)];
                self.nodes.get(usize::from(i))
            }
        }
    }
}

/// The servers of a variable: a single Redis server or the masters of a
/// Redis Cluster, with a pool of connections to each.
#[derive(Debug)]
pub(crate) struct Cluster {
    config: RedisConfig,
    topology: RwLock<Arc<Topology>>,
}

/// What a round did with one command.
enum Outcome {
    Done(Value),
    /// Send again after refreshing the slot map.
    Moved,
    /// Send again to this node, after `ASKING`.
    Ask(String),
    /// Send again after loading the scripts on this node.
    NoScript(Arc<Node>),
    /// Send again after a pause.
    Wait(String),
    /// The node's reply was lost (this error): send again, on a new
    /// connection.
    Lost(Error),
}

impl Cluster {
    /// Connects to the first reachable node of `config.nodes` and learns
    /// the topology from it.
    pub(crate) fn connect(config: &RedisConfig) -> Result<Cluster> {
        config.validate()?;
        let topology = discover(config, &[])?;
        Ok(Cluster {
            config: config.clone(),
            topology: RwLock::new(Arc::new(topology)),
        })
    }

    /// Whether the servers form a Redis Cluster (not a single server).
    pub(crate) fn is_cluster(&self) -> bool {
        self.topology().slots.is_some()
    }

    /// The nodes' `host:port`s (masters, in a cluster).
    pub(crate) fn node_addrs(&self) -> Vec<String> {
        self.topology()
            .nodes
            .iter()
            .map(|n| n.addr().to_string())
            .collect()
    }

    /// Whether every node serves every one of `commands` to this client:
    /// how a variable learns that the servers have `dynemb-redis-module`
    /// loaded and that its user may call the module's commands. Each is
    /// sent without arguments, which the module answers with a
    /// wrong-number-of-arguments error before it reads or writes anything;
    /// any other answer (an unknown command, `NOPERM` for a user not
    /// allowed it) means no.
    pub(crate) fn every_node_serves(&self, commands: &[&str]) -> Result<bool> {
        let mut packed = Vec::new();
        for command in commands {
            redis::cmd(command).write_packed_command(&mut packed);
        }
        for node in &self.topology().nodes {
            let replies = node.exchange(&packed, commands.len())?;
            let served = |reply: &Value| {
                matches!(reply, Value::ServerError(e)
                    if e.details().is_some_and(|d| d.contains("wrong number of arguments")))
            };
            if !replies.iter().all(served) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn topology(&self) -> Arc<Topology> {
        Arc::clone(&self.topology.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Asks the cluster for its slot map again (known nodes first, then
    /// the configured ones), keeping the pools of nodes that remain.
    fn refresh(&self) -> Result<()> {
        let known = self.topology();
        let fresh = discover(&self.config, &known.nodes)?;
        *self
            .topology
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
        Ok(())
    }

    /// Runs `requests`, one pipeline per node, every node at once; returns
    /// each request's reply in order (error replies as
    /// [`Value::ServerError`], for the caller to judge). Every request must
    /// be safe to run twice (a read, or a recorded write: see
    /// [`crate::scripts`]): one whose reply was lost is sent again. See the
    /// module docs for redirections, resends and failures.
    pub(crate) fn run(&self, requests: &[Request]) -> Result<Vec<Value>> {
        self.run_by(requests, self.deadline())
    }

    /// The deadline of a batch that starts now
    /// ([`RedisConfig::batch_deadline`] from now).
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.config.batch_deadline()
    }

    /// [`Cluster::run`] by `deadline` (a call's, taken when the call
    /// started, so that the work before this batch counts too): if it has
    /// passed already, a [`BackendErrorKind::Timeout`] and nothing is sent.
    pub(crate) fn run_by(&self, requests: &[Request], deadline: Instant) -> Result<Vec<Value>> {
        if Instant::now() >= deadline {
            return Err(Error::Backend {
                store: format!("redis {}", self.config.nodes.join(",")),
                kind: BackendErrorKind::Timeout,
                message: format!(
                    "the call's deadline ({:?}, twice the command timeout) passed before its commands were sent",
                    self.config.batch_deadline()
                ),
            });
        }
        let mut replies: Vec<Option<Value>> = vec![None; requests.len()];
        // (request index, node to ask instead of the slot's owner)
        let mut pending: Vec<(usize, Option<String>)> =
            (0..requests.len()).map(|i| (i, None)).collect();
        let mut last_reason = String::new();
        let mut lost: Option<Error> = None;
        let mut resends = 0;
        let mut pause = Duration::ZERO;
        for round in 0..MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            if !pause.is_zero() {
                if Instant::now() + pause > deadline {
                    break;
                }
                std::thread::sleep(pause);
            }
            // One wait for the replies, as long as the command timeout,
            // within the batch's deadline.
            let wait_until = deadline.min(Instant::now() + self.config.command_timeout);
            let outcomes = self.round(requests, &pending, wait_until)?;
            let mut retry = Vec::new();
            let mut moved = false;
            let mut any_lost = false;
            pause = Duration::ZERO;
            for ((index, _), outcome) in pending.iter().zip(outcomes) {
                match outcome {
                    Outcome::Done(value) => replies[*index] = Some(value),
                    Outcome::Moved => {
                        moved = true;
                        last_reason = "MOVED".into();
                        retry.push((*index, None));
                    }
                    Outcome::Ask(addr) => retry.push((*index, Some(addr))),
                    Outcome::NoScript(node) => {
                        load_scripts(&node)?;
                        retry.push((*index, None));
                    }
                    Outcome::Wait(reason) => {
                        last_reason = reason;
                        pause = Duration::from_millis(10 << (round + 1).min(6));
                        retry.push((*index, None));
                    }
                    Outcome::Lost(error) => {
                        any_lost = true;
                        lost.get_or_insert(error);
                        retry.push((*index, None));
                    }
                }
            }
            if any_lost {
                resends += 1;
                if resends > MAX_RESENDS {
                    break;
                }
            }
            if moved {
                self.refresh()?;
            }
            pending = retry;
        }
        if !pending.is_empty() {
            // A reply lost for good says more than the redirections.
            return Err(lost.unwrap_or_else(|| Error::Backend {
                store: format!("redis {}", self.config.nodes.join(",")),
                kind: BackendErrorKind::NotServing,
                message: format!(
                    "{} command(s) still redirected or refused by the batch's deadline ({last_reason})",
                    pending.len()
                ),
            }));
        }
        Ok(replies
            .into_iter()
            .map(|r| r.expect("every request answered"))
            .collect())
    }

    /// One round: `pending` sent, grouped per node, all nodes at once,
    /// every reply waited for until `wait_until`. A node whose replies
    /// were lost (a broken connection, a timeout) gives
    /// [`Outcome::Lost`] for each of its commands; a node that cannot be
    /// reached fails the round before anything is sent.
    fn round(
        &self,
        requests: &[Request],
        pending: &[(usize, Option<String>)],
        wait_until: Instant,
    ) -> Result<Vec<Outcome>> {
        let topology = self.topology();
        // Per node: the node, its pipeline, and positions in `pending`.
        let mut groups: Vec<(Arc<Node>, Vec<u8>, Vec<usize>)> = Vec::new();
        let mut group_of: HashMap<String, usize> = HashMap::new();
        let mut extra_nodes: HashMap<String, Arc<Node>> = HashMap::new();
        for (at, (index, ask)) in pending.iter().enumerate() {
            let request = &requests[*index];
            let node =
                match ask {
                    None => Arc::clone(topology.node_of(request.slot).ok_or_else(|| {
                        Error::Backend {
                            store: format!("redis {}", self.config.nodes.join(",")),
                            kind: BackendErrorKind::NotServing,
                            message: format!("no node serves hash slot {}", request.slot),
                        }
                    })?),
                    Some(addr) => match topology.nodes.iter().find(|n| n.addr() == addr) {
                        Some(node) => Arc::clone(node),
                        None => match extra_nodes.get(addr) {
                            Some(node) => Arc::clone(node),
                            None => {
                                let (host, port) = parse_node(addr).ok_or_else(|| {
                                    protocol(addr, format!("ASK names node {addr:?}"))
                                })?;
                                let node = Arc::new(Node::new(&host, port, &self.config)?);
                                extra_nodes.insert(addr.clone(), Arc::clone(&node));
                                node
                            }
                        },
                    },
                };
            let g = *group_of.entry(node.addr().to_string()).or_insert_with(|| {
                groups.push((node, Vec::new(), Vec::new()));
                groups.len() - 1
            });
            groups[g].2.push(at);
        }
        // Each node's pipeline, sized first (a large batch is not copied
        // as it grows).
        let asking = redis::cmd("ASKING").get_packed_command();
        for (_, packed, ats) in &mut groups {
            let len: usize = ats
                .iter()
                .map(|&at| {
                    let (index, ask) = &pending[at];
                    requests[*index].packed.len() + ask.as_ref().map_or(0, |_| asking.len())
                })
                .sum();
            packed.reserve_exact(len);
            for &at in ats.iter() {
                let (index, ask) = &pending[at];
                if ask.is_some() {
                    packed.extend_from_slice(&asking);
                }
                packed.extend_from_slice(&requests[*index].packed);
            }
        }
        let asks: Vec<bool> = pending.iter().map(|(_, ask)| ask.is_some()).collect();
        // A connection to every node first: a node that cannot be reached
        // fails the batch before anything is sent anywhere.
        let mut leases: Vec<Lease> = Vec::with_capacity(groups.len());
        for (node, _, _) in &groups {
            match node.lease(wait_until) {
                Ok(lease) => leases.push(lease),
                Err(e) => {
                    for ((node, _, _), lease) in groups.iter().zip(leases) {
                        node.give_back(lease);
                    }
                    return Err(e);
                }
            }
        }
        // Send every pipeline, then read every node's replies.
        let mut sent: Vec<Result<Lease>> = Vec::with_capacity(groups.len());
        for ((node, packed, _), mut lease) in groups.iter().zip(leases) {
            sent.push(node.send(&mut lease, packed, wait_until).map(|()| lease));
        }
        let mut outcomes: Vec<Option<Outcome>> = (0..pending.len()).map(|_| None).collect();
        let mut first_error = None;
        for ((node, _, members), lease) in groups.iter().zip(sent) {
            let count = members.len() + members.iter().filter(|&&at| asks[at]).count();
            match lease.and_then(|lease| node.receive(lease, count, wait_until)) {
                Ok(replies) => {
                    let mut replies = replies.into_iter();
                    for &at in members {
                        if asks[at] {
                            replies.next(); // ASKING's OK
                        }
                        let reply = replies.next().expect("one reply per command");
                        outcomes[at] = Some(classify(node, reply));
                    }
                }
                Err(
                    e @ Error::Backend {
                        kind: BackendErrorKind::Unavailable | BackendErrorKind::Timeout,
                        ..
                    },
                ) => {
                    for &at in members {
                        outcomes[at] = Some(Outcome::Lost(e.clone()));
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.expect("every pending command classified"))
            .collect())
    }
}

/// What to do with `reply` from `node`.
fn classify(node: &Arc<Node>, reply: Value) -> Outcome {
    let Value::ServerError(error) = &reply else {
        return Outcome::Done(reply);
    };
    match error.kind() {
        Some(ServerErrorKind::Moved) => Outcome::Moved,
        Some(ServerErrorKind::Ask) => {
            // "ASK <slot> <host:port>"
            match error.details().and_then(|d| d.split_whitespace().nth(1)) {
                Some(addr) => Outcome::Ask(addr.to_string()),
                None => Outcome::Done(reply),
            }
        }
        Some(ServerErrorKind::NoScript) => Outcome::NoScript(Arc::clone(node)),
        Some(
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::MasterDown,
        ) => Outcome::Wait(format!(
            "{} {}",
            error.code(),
            error.details().unwrap_or("")
        )),
        _ => Outcome::Done(reply),
    }
}

/// Loads every script on `node` (after a `NOSCRIPT`).
fn load_scripts(node: &Node) -> Result<()> {
    let mut packed = Vec::new();
    for script in ALL_SCRIPTS.iter() {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script.code())
            .write_packed_command(&mut packed);
    }
    for reply in node.exchange(&packed, ALL_SCRIPTS.len())? {
        if let Value::ServerError(e) = reply {
            return Err(protocol(node.addr(), format!("SCRIPT LOAD failed: {e:?}")));
        }
    }
    Ok(())
}

/// An [`Error::Backend`] of kind [`BackendErrorKind::Server`] on `addr`.
pub(crate) fn protocol(addr: &str, message: String) -> Error {
    Error::Backend {
        store: format!("redis {addr}"),
        kind: BackendErrorKind::Server,
        message,
    }
}

/// The topology as the first node that answers tells it: tries `known`
/// nodes first, then the configured ones. A node whose cluster support is
/// disabled is a single server.
fn discover(config: &RedisConfig, known: &[Arc<Node>]) -> Result<Topology> {
    let mut candidates: Vec<Arc<Node>> = known.to_vec();
    for name in &config.nodes {
        let (host, port) = parse_node(name)
            .ok_or_else(|| Error::InvalidArgument(format!("node {name:?} is not host:port")))?;
        if !candidates
            .iter()
            .any(|n| n.addr() == format!("{host}:{port}"))
        {
            candidates.push(Arc::new(Node::new(&host, port, config)?));
        }
    }
    let mut last_error = None;
    for node in &candidates {
        let packed = redis::cmd("CLUSTER").arg("SLOTS").get_packed_command();
        let reply = match node.exchange(&packed, 1) {
            Ok(mut replies) => replies.pop().expect("one reply"),
            Err(e) => {
                last_error = Some(e);
                continue;
            }
        };
        match reply {
            Value::ServerError(e)
                if e.details()
                    .unwrap_or("")
                    .contains("cluster support disabled") =>
            {
                return Ok(Topology {
                    nodes: vec![Arc::clone(node)],
                    slots: None,
                });
            }
            Value::ServerError(e) => {
                last_error = Some(backend_error(node.addr(), &e.into()));
            }
            Value::Array(ranges) => match slot_map(node, &ranges, &candidates, config) {
                Ok(topology) => return Ok(topology),
                Err(e) => last_error = Some(e),
            },
            other => {
                last_error = Some(protocol(
                    node.addr(),
                    format!("CLUSTER SLOTS answered {other:?}"),
                ));
            }
        }
    }
    Err(last_error.unwrap_or_else(|| Error::InvalidArgument("no nodes configured".into())))
}

/// The topology of a `CLUSTER SLOTS` reply (`[start, end, [host, port,
/// ...], replicas...]` per range), reusing `known` nodes (and their
/// pools) by address. An empty host means the node that answered.
fn slot_map(
    asked: &Arc<Node>,
    ranges: &[Value],
    known: &[Arc<Node>],
    config: &RedisConfig,
) -> Result<Topology> {
    let bad = |what: &str| protocol(asked.addr(), format!("CLUSTER SLOTS: {what}"));
    let asked_host = parse_node(asked.addr()).map(|(h, _)| h).unwrap_or_default();
    let mut nodes: Vec<Arc<Node>> = Vec::new();
    let mut map = vec![u16::MAX; SLOTS];
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad("a range is not an array"));
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(bad("a range lacks start, end or master"));
        };
        let host = match master.first() {
            Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            Some(Value::SimpleString(h)) => h.clone(),
            _ => return Err(bad("a master has no host")),
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.clone()
        } else {
            host
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return Err(bad("a master has no port"));
        };
        let port = u16::try_from(*port).map_err(|_| bad("a port is out of range"))?;
        let addr = format!("{host}:{port}");
        let index = match nodes.iter().position(|n| n.addr() == addr) {
            Some(i) => i,
            None => {
                let node = match known.iter().find(|n| n.addr() == addr) {
                    Some(node) => Arc::clone(node),
                    None => Arc::new(Node::new(&host, port, config)?),
                };
                nodes.push(node);
                nodes.len() - 1
            }
        };
        let (start, end) = (
            usize::try_from(*start).map_err(|_| bad("a slot is negative"))?,
            usize::try_from(*end).map_err(|_| bad("a slot is negative"))?,
        );
        if start > end || end >= SLOTS {
            return Err(bad("a slot range is out of bounds"));
        }
        map[start..=end].fill(index as u16);
    }
    if nodes.is_empty() {
        return Err(Error::Backend {
            store: format!("redis {}", asked.addr()),
            kind: BackendErrorKind::NotServing,
            message: "the cluster has no slots assigned".into(),
        });
    }
    Ok(Topology {
        nodes,
        slots: Some(map),
    })
}

#[cfg(test)]
mod tests {
    use super::slot_of;

    #[test]
    fn slots_match_the_cluster_specification() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(
            slot_of(b"foo{}{bar}"),
            slot_of(b"bar"),
            "an empty tag hashes the whole key"
        );
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    }
}
