//! [`RedisConfig`]: where the servers are and how long to wait for them.
//!
//! One configuration serves a single Redis server and a Redis Cluster
//! alike: the client asks the first reachable node of
//! [`nodes`](RedisConfig::nodes) whether cluster mode is on, and in a
//! cluster learns every master from it (so one node of the cluster is
//! enough; list several so that opening works while one is down).
//!
//! Every wait is bounded: connecting to a node by
//! [`connect_timeout`](RedisConfig::connect_timeout), waiting for a
//! node's replies by [`command_timeout`](RedisConfig::command_timeout), a
//! whole batch (every node, redirections, resends of lost replies) by
//! [`batch_deadline`](RedisConfig::batch_deadline), twice the command
//! timeout, counted from the start of the call for the calls of one batch
//! (see there). A node that is down or silent is an [`Error::Backend`]
//! within those bounds, never a hang.

use dynemb::{Error, Result};
use std::time::Duration;

/// How to reach the Redis servers of a
/// [`RedisVariable`](crate::RedisVariable) and how its rows are laid out
/// there. `Default` is a single local server (`127.0.0.1:6379`), no
/// password, 256 buckets, prefix `"dynemb"`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `host:port` of the server, or of some nodes of the cluster (one
    /// reachable node is enough; the others are found through it).
    pub nodes: Vec<String>,
    /// How long opening a connection to a node may take.
    pub connect_timeout: Duration,
    /// How long the client waits for a node's replies to a batch's
    /// pipeline before it counts them lost (and resends them; a batch
    /// lasts at most twice this, see
    /// [`batch_deadline`](RedisConfig::batch_deadline)). Size it for the
    /// largest batch, including the time this process takes to build it:
    /// a pipeline of a million rows takes a few seconds. Whole-table
    /// operations (`size`, `restrict`, `export_chunks`, `save`, `restore`,
    /// `clear`) run in round trips of a bounded size (see
    /// [`buckets`](RedisConfig::buckets)), so the table's size does not
    /// matter to it.
    pub command_timeout: Duration,
    /// The ACL user to log in as (`AUTH user password`), if any.
    pub username: Option<String>,
    /// The password (`requirepass`, or the ACL user's), if any.
    pub password: Option<String>,
    /// Buckets a variable's rows are spread over, each one Redis hash (on
    /// one node of a cluster). More buckets spread a variable more evenly
    /// over a cluster's nodes; fewer make a batch fewer, larger commands.
    /// Fixed when the variable is first created (reopening it with another
    /// count is an [`Error::Mismatch`]). At least 1, at most 2^20.
    ///
    /// How to choose it: the whole-table operations read or prune a bucket
    /// whole, in one command, so a bucket (about rows / buckets) is the
    /// least one of their round trips carries and what the client holds
    /// at once. Keep it to a few thousand rows: at least the largest
    /// expected row count divided by 8,192 (the default 256 buckets suit
    /// up to about two million rows; 4,096 buckets, 30 million). More
    /// buckets cost nothing to a batch's round trips, and the
    /// whole-table operations count and clear buckets 4,096 per round
    /// trip.
    pub buckets: u32,
    /// The namespace of every Redis key this crate writes (TFRA's model
    /// tag): models or versions under different prefixes never meet (keys
    /// are `<prefix>:<name>:...`, and a variable's name may not contain
    /// `:`, so a prefix may). Must not contain `{` or `}` (they would
    /// change which cluster node a bucket lives on).
    pub prefix: String,
    /// Whether to send the bucket writes as the `dynemb-redis-module`
    /// commands (`DYNEMB.ACCUM` and its siblings) when every node has that
    /// module loaded when the variable is opened; otherwise, and when this
    /// is `false`, they run as Lua scripts. Both forms have the same
    /// semantics; the module's does `accum`'s float additions and the
    /// optimizers' write-back natively, several times faster on the
    /// servers. Default `true`.
    pub use_module: bool,
}

/// Most buckets a variable may have.
pub const MAX_BUCKETS: u32 = 1 << 20;

/// Longest connect or command timeout (a day): every deadline computed
/// from them stays representable, and a write's record TTL
/// ([`RedisConfig::record_ttl`]) fits Redis's milliseconds.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            nodes: vec!["127.0.0.1:6379".to_string()],
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(10),
            username: None,
            password: None,
            buckets: 256,
            prefix: "dynemb".to_string(),
            use_module: true,
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    /// The password is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("nodes", &self.nodes)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("buckets", &self.buckets)
            .field("prefix", &self.prefix)
            .field("use_module", &self.use_module)
            .finish()
    }
}

impl RedisConfig {
    /// A configuration for these `host:port` nodes, the rest default.
    pub fn with_nodes<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Self {
        RedisConfig {
            nodes: nodes.into_iter().map(Into::into).collect(),
            ..RedisConfig::default()
        }
    }

    /// How long a batch may last: connecting, sending, waiting for
    /// replies, following redirections and resending commands whose reply
    /// was lost all end by then (twice the command timeout: one full wait
    /// for the replies, and one for a resend).
    ///
    /// Counted from the start of the call for the calls that are one
    /// batch (`lookup`, `lookup_with_exists`, `lookup_or_insert` with both
    /// its round trips, `upsert`, `accum`, `remove`, `lookup_scores`), so
    /// the time spent building the batch here counts: a batch whose
    /// deadline has passed by the time it is built is not sent (an
    /// [`Error::Backend`] of kind `Timeout`, nothing changed). Every other
    /// call is a series of batches, each with its own deadline from when
    /// it is sent. Work on this machine already under way is not
    /// interrupted (building commands, decoding a reply whose bytes have
    /// arrived): a call returns by its deadline or as soon as that work
    /// ends.
    pub fn batch_deadline(&self) -> Duration {
        self.command_timeout.saturating_mul(2)
    }

    /// How long a write's record (its reply, kept so that a resend runs
    /// once, see [`RedisVariable`](crate::RedisVariable)) stays on the
    /// server: twice [`batch_deadline`](Self::batch_deadline), so a resend
    /// of this crate, always sent before the batch's deadline, finds it.
    pub fn record_ttl(&self) -> Duration {
        self.batch_deadline().saturating_mul(2)
    }

    /// Checks the settings ([`Error::InvalidArgument`] naming the bad one).
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("RedisConfig: {what}")));
        if self.nodes.is_empty() {
            return bad("nodes must name at least one host:port".into());
        }
        for node in &self.nodes {
            if parse_node(node).is_none() {
                return bad(format!("node {node:?} is not host:port"));
            }
        }
        if self.connect_timeout.is_zero() || self.command_timeout.is_zero() {
            return bad("timeouts must be longer than zero".into());
        }
        if self.connect_timeout > MAX_TIMEOUT || self.command_timeout > MAX_TIMEOUT {
            return bad(format!("timeouts must be at most {MAX_TIMEOUT:?}"));
        }
        if !(1..=MAX_BUCKETS).contains(&self.buckets) {
            return bad(format!(
                "buckets must be in 1..={MAX_BUCKETS}, got {}",
                self.buckets
            ));
        }
        if self.prefix.contains(['{', '}']) {
            return bad(format!(
                "prefix {:?} must not contain {{ or }}",
                self.prefix
            ));
        }
        Ok(())
    }
}

/// `(host, port)` of a `host:port` node name (the port after the last
/// colon, so `[::1]:7000` and `::1:7000` both work; brackets are removed).
pub(crate) fn parse_node(node: &str) -> Option<(String, u16)> {
    let (host, port) = node.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_settings_are_named() {
        RedisConfig::default().validate().unwrap();
        let cases = [
            (
                RedisConfig::with_nodes(Vec::<String>::new()),
                "at least one",
            ),
            (RedisConfig::with_nodes(["localhost"]), "host:port"),
            (
                RedisConfig {
                    buckets: 0,
                    ..RedisConfig::default()
                },
                "buckets",
            ),
            (
                RedisConfig {
                    prefix: "a{b}".into(),
                    ..RedisConfig::default()
                },
                "prefix",
            ),
            (
                RedisConfig {
                    command_timeout: Duration::ZERO,
                    ..RedisConfig::default()
                },
                "timeouts",
            ),
            (
                RedisConfig {
                    command_timeout: Duration::MAX,
                    ..RedisConfig::default()
                },
                "at most",
            ),
        ];
        for (config, what) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
        }
    }

    #[test]
    fn a_batch_and_a_write_record_last_multiples_of_the_command_timeout() {
        let config = RedisConfig::default();
        assert_eq!(config.batch_deadline(), Duration::from_secs(20));
        assert_eq!(config.record_ttl(), Duration::from_secs(40));
    }

    #[test]
    fn node_names_parse() {
        assert_eq!(
            parse_node("127.0.0.1:7000"),
            Some(("127.0.0.1".into(), 7000))
        );
        assert_eq!(parse_node("[::1]:7001"), Some(("::1".into(), 7001)));
        assert_eq!(parse_node("host:x"), None);
        assert_eq!(parse_node(":7000"), None);
    }

    #[test]
    fn debug_hides_the_password() {
        let config = RedisConfig {
            password: Some("hunter2".into()),
            ..RedisConfig::default()
        };
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
