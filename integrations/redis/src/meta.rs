//! A variable's metadata hash (`<prefix>:<name>:meta`): what every process
//! opening the variable must agree on, and its slot columns.
//!
//! Fields: `format` ([`FORMAT`], the storage format of [`crate::layout`]),
//! `key_type`, `dim`, `buckets`, `initializer` (its `Debug` form: the
//! rows of missing keys must be the same in every process),
//! `restrict_policy` (`none`, `timestamp` or `frequency`), and the slots:
//! `slots` (their count), `slot.<i>` (a name) and `slot_initial.<i>` (the
//! initial value's `f32` bits, decimal) for each index `i`; and, while a
//! restore is in progress or after one was interrupted, `restoring` (the
//! checkpoint being restored, see `checkpoint`): the whole-table
//! operations read it first and refuse to run while it is there.
//!
//! The first process to open a variable writes the metadata (a script, so
//! two first openers cannot both write); later ones compare theirs with it
//! and get an [`Error::Mismatch`] naming both on any difference. Slots are
//! appended by a script too ([`crate::scripts::CREATE_SLOTS`]), so two
//! processes creating slots at once agree on every slot's index.

use crate::cluster::Request;
use crate::reply;
use crate::variable::{restoring_error, RedisVariable};
use dynemb::Key;
use dynemb::{BackendErrorKind, Error, Initializer, RestrictPolicy, Result};
use redis::Value;
use std::collections::HashMap;

/// The metadata field naming the checkpoint a restore is writing.
const RESTORING: &str = "restoring";

impl<K: Key> RedisVariable<K> {
    /// Runs `cmd`, a command on the variable's metadata key, and returns
    /// its reply.
    pub(crate) fn run_on_meta(&self, cmd: &redis::Cmd) -> Result<Value> {
        let mut replies = self
            .inner
            .cluster
            .run(&[Request::new(&self.inner.meta_key, cmd)])?;
        Ok(replies.pop().expect("one reply a request"))
    }

    /// The checkpoint a restore of this variable is writing (in progress,
    /// or interrupted), if any.
    pub(crate) fn restoring(&self) -> Result<Option<Vec<u8>>> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&self.inner.meta_key[..]).arg(RESTORING);
        let reply = self.run_on_meta(&cmd)?;
        reply::bytes_or_nil(self.store(), "HGET restoring", reply)
    }

    /// An error if a restore is in progress or was interrupted.
    pub(crate) fn check_not_restoring(&self) -> Result<()> {
        match self.restoring()? {
            Some(checkpoint) => Err(restoring_error(self.store(), &checkpoint)),
            None => Ok(()),
        }
    }

    /// Records that a restore of `checkpoint` has started (`Some`), or
    /// that none is under way (`None`).
    pub(crate) fn set_restoring(&self, checkpoint: Option<&[u8]>) -> Result<()> {
        let mut cmd = match checkpoint {
            Some(_) => redis::cmd("HSET"),
            None => redis::cmd("HDEL"),
        };
        cmd.arg(&self.inner.meta_key[..]).arg(RESTORING);
        if let Some(checkpoint) = checkpoint {
            cmd.arg(checkpoint);
        }
        let reply = self.run_on_meta(&cmd)?;
        reply::int(self.store(), "restoring", reply).map(drop)
    }
}

/// The storage format this build writes and reads.
pub(crate) const FORMAT: &str = "dynemb-redis/1";

/// What a variable is, as its metadata records it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Meta {
    pub key_type: String,
    pub dim: usize,
    pub buckets: u32,
    pub initializer: String,
    pub policy: Option<RestrictPolicy>,
}

/// The metadata name of a restrict policy.
fn policy_name(policy: Option<RestrictPolicy>) -> &'static str {
    policy.map_or("none", RestrictPolicy::name)
}

impl Meta {
    /// The metadata of a variable with these settings.
    pub(crate) fn new(
        key_type: &str,
        dim: usize,
        buckets: u32,
        initializer: &Initializer,
        policy: Option<RestrictPolicy>,
    ) -> Meta {
        Meta {
            key_type: key_type.to_string(),
            dim,
            buckets,
            initializer: format!("{initializer:?}"),
            policy,
        }
    }

    /// The `(field, value)`s written when the variable is created.
    pub(crate) fn fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("format", FORMAT.to_string()),
            ("key_type", self.key_type.clone()),
            ("dim", self.dim.to_string()),
            ("buckets", self.buckets.to_string()),
            ("initializer", self.initializer.clone()),
            ("restrict_policy", policy_name(self.policy).to_string()),
            ("slots", "0".to_string()),
        ]
    }

    /// A description for [`Error::Mismatch`].
    fn describe(&self) -> String {
        format!(
            "key type {}, dim {}, {} buckets, initializer {}, restrict policy {}",
            self.key_type,
            self.dim,
            self.buckets,
            self.initializer,
            policy_name(self.policy)
        )
    }

    /// Checks that the stored metadata `stored` (an `HGETALL` reply)
    /// describes this variable; returns its slots.
    pub(crate) fn check(
        &self,
        name: &str,
        store: &str,
        stored: Value,
    ) -> Result<Vec<(String, f32)>> {
        let fields = hash(store, stored)?;
        let corrupt = |what: String| Error::Backend {
            store: store.to_string(),
            kind: BackendErrorKind::Corrupt,
            message: format!("metadata of {name:?}: {what}"),
        };
        let get = |field: &str| {
            fields
                .get(field)
                .cloned()
                .ok_or_else(|| corrupt(format!("no field {field:?}")))
        };
        let format = get("format")?;
        if format != FORMAT {
            return Err(corrupt(format!(
                "storage format {format:?}; this build reads {FORMAT:?}"
            )));
        }
        let number = |field: &str| -> Result<u64> {
            let text = get(field)?;
            text.parse()
                .map_err(|_| corrupt(format!("{field} is {text:?}, not a number")))
        };
        let policy_text = get("restrict_policy")?;
        let policy = match policy_text.as_str() {
            "none" => None,
            other => Some(
                RestrictPolicy::from_name(other)
                    .ok_or_else(|| corrupt(format!("unknown restrict policy {other:?}")))?,
            ),
        };
        let existing = Meta {
            key_type: get("key_type")?,
            dim: usize::try_from(number("dim")?).map_err(|_| corrupt("dim too large".into()))?,
            buckets: u32::try_from(number("buckets")?)
                .map_err(|_| corrupt("buckets too large".into()))?,
            initializer: get("initializer")?,
            policy,
        };
        if existing != *self {
            return Err(Error::Mismatch {
                name: name.to_string(),
                existing: format!("redis variable with {}", existing.describe()),
                requested: self.describe(),
            });
        }
        slots_of(&fields, &corrupt)
    }
}

/// The field/value pairs of an `HGETALL` reply, as text.
fn hash(store: &str, reply: Value) -> Result<HashMap<String, String>> {
    let items = match reply {
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => reply::array(store, "HGETALL of metadata", other)?,
    };
    let mut fields = HashMap::new();
    let mut items = items.into_iter();
    while let (Some(k), Some(v)) = (items.next(), items.next()) {
        let k = reply::bytes(store, "metadata field", k)?;
        let v = reply::bytes(store, "metadata value", v)?;
        fields.insert(
            String::from_utf8_lossy(&k).into_owned(),
            String::from_utf8_lossy(&v).into_owned(),
        );
    }
    Ok(fields)
}

/// The slots recorded in metadata `fields`, in index order.
fn slots_of(
    fields: &HashMap<String, String>,
    corrupt: &dyn Fn(String) -> Error,
) -> Result<Vec<(String, f32)>> {
    let count: usize = fields
        .get("slots")
        .map_or(Ok(0), |n| n.parse())
        .map_err(|_| corrupt("slots is not a number".into()))?;
    if count > dynemb::MAX_SLOTS {
        return Err(corrupt(format!(
            "{count} slots, more than {}",
            dynemb::MAX_SLOTS
        )));
    }
    (0..count)
        .map(|i| {
            let name = fields
                .get(&format!("slot.{i}"))
                .ok_or_else(|| corrupt(format!("slot {i} has no name")))?;
            let initial = fields
                .get(&format!("slot_initial.{i}"))
                .and_then(|bits| bits.parse::<u32>().ok())
                .map(f32::from_bits)
                .ok_or_else(|| corrupt(format!("slot {i} has no initial value")))?;
            Ok((name.clone(), initial))
        })
        .collect()
}

/// The slots in a metadata `HGETALL` reply.
pub(crate) fn slots_in(name: &str, store: &str, reply: Value) -> Result<Vec<(String, f32)>> {
    let fields = hash(store, reply)?;
    slots_of(&fields, &|what| Error::Backend {
        store: store.to_string(),
        kind: BackendErrorKind::Corrupt,
        message: format!("metadata of {name:?}: {what}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(pairs: &[(&str, &str)]) -> Value {
        Value::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| {
                    [
                        Value::BulkString(k.as_bytes().to_vec()),
                        Value::BulkString(v.as_bytes().to_vec()),
                    ]
                })
                .collect(),
        )
    }

    #[test]
    fn stored_metadata_is_checked_field_by_field() {
        let meta = Meta::new("i64", 8, 16, &Initializer::Zeros, None);
        let mut fields: Vec<(&str, String)> = meta.fields();
        fields.push(("slot.0", "m".into()));
        fields.push(("slot_initial.0", 0.5f32.to_bits().to_string()));
        fields.retain(|(k, _)| *k != "slots");
        fields.push(("slots", "1".into()));
        let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            meta.check("e", "s", reply(&pairs)).unwrap(),
            vec![("m".to_string(), 0.5)]
        );
        let other = Meta::new("i64", 4, 16, &Initializer::Zeros, None);
        let err = other.check("e", "s", reply(&pairs)).unwrap_err();
        assert!(matches!(err, Error::Mismatch { .. }), "{err}");
        assert!(err.to_string().contains("dim 8") && err.to_string().contains("dim 4"));
        let err = meta.check("e", "s", reply(&[("format", "x")])).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Backend {
                    kind: BackendErrorKind::Corrupt,
                    ..
                }
            ),
            "{err}"
        );
    }
}
