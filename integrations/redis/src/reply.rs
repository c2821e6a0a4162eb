//! Reading the servers' replies: every reply is checked for its expected
//! shape, and an error reply or an unexpected shape is an
//! [`Error::Backend`] naming the store, never a panic.

use dynemb::{BackendErrorKind, Error, Result};
use redis::Value;

/// The [`Error::Backend`] for a reply that is an error or not what the
/// command returns.
pub(crate) fn unexpected(store: &str, what: &str, value: &Value) -> Error {
    let message = match value {
        Value::ServerError(e) => format!(
            "{what}: the server answered {} {}",
            e.code(),
            e.details().unwrap_or("")
        ),
        other => format!("{what}: unexpected reply {other:?}"),
    };
    Error::Backend {
        store: store.to_string(),
        kind: BackendErrorKind::Server,
        message,
    }
}

/// The elements of an array reply.
pub(crate) fn array(store: &str, what: &str, value: Value) -> Result<Vec<Value>> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(unexpected(store, what, &other)),
    }
}

/// A bulk string reply, or `None` for a nil.
pub(crate) fn bytes_or_nil(store: &str, what: &str, value: Value) -> Result<Option<Vec<u8>>> {
    match value {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => Ok(Some(bytes)),
        other => Err(unexpected(store, what, &other)),
    }
}

/// A bulk string reply.
pub(crate) fn bytes(store: &str, what: &str, value: Value) -> Result<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        other => Err(unexpected(store, what, &other)),
    }
}

/// An integer reply.
pub(crate) fn int(store: &str, what: &str, value: Value) -> Result<i64> {
    match value {
        Value::Int(n) => Ok(n),
        other => Err(unexpected(store, what, &other)),
    }
}
