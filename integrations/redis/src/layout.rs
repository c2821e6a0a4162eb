//! Where a variable's rows live in Redis and how they are encoded: the
//! storage format, which every process sharing a variable must agree on
//! (its version is part of the metadata, see [`crate::meta`]).
//!
//! # Keys
//!
//! - `<prefix>:<name>:{<b>}` — bucket `b` (`0..buckets`), one Redis hash.
//!   The hash tag `{<b>}` decides the cluster slot, so a bucket lives on
//!   one node and the buckets spread over the nodes.
//! - `<prefix>:<name>:meta` — the variable's metadata hash.
//! - `<prefix>:<name>:{<b>}:w:<id>` — the record of one write to bucket
//!   `b` (its reply, so that a resent write runs once; see
//!   [`crate::scripts`]), expiring on its own. Same hash tag, same node.
//!
//! A key's bucket is [`bucket_of`]: a fixed 64-bit mix of the key's bits
//! (SplitMix64's finalizer) modulo the bucket count, the same on every
//! machine and build forever (it is part of the format).
//!
//! # Rows
//!
//! A bucket's field is the key's 64-bit pattern, 8 bytes little-endian.
//! Its value is the row:
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | version: a random `u64` set by every write ([`new_version`]) |
//! | 8..16 | score (`u64`): the restrict policy's timestamp or count, 0 without one |
//! | 16..16+4·dim | the values (`f32`) |
//! | then 4·dim per slot | slot columns in slot index order (`f32`) |
//!
//! all little-endian. A row may hold fewer slot columns than the variable
//! has (rows written before a slot was created): a missing column reads
//! as the slot's initial value, so creating a slot rewrites nothing.
//!
//! A bucket may also hold the field [`RESTORING_FIELD`] (9 bytes, so never
//! a key's field): the marker of a restore in progress (see
//! `checkpoint`), whose value names the checkpoint. A bucket that has it
//! is read by no one but the restore.

use dynemb::{BackendErrorKind, Error, Result};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The field that marks a bucket being restored (see the module docs).
pub(crate) const RESTORING_FIELD: &[u8] = b"restoring";

/// Bytes before a row's values: version and score.
pub(crate) const HEADER: usize = 16;

/// The bucket (`0..buckets`) of the key whose bits are `bits`.
pub(crate) fn bucket_of(bits: u64, buckets: u32) -> u32 {
    let mut z = bits;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % u64::from(buckets)) as u32
}

/// The Redis key of bucket `bucket` of the variable `name` under `prefix`.
pub(crate) fn bucket_key(prefix: &str, name: &str, bucket: u32) -> Vec<u8> {
    format!("{prefix}:{name}:{{{bucket}}}").into_bytes()
}

/// The Redis key of the metadata hash of the variable `name`.
pub(crate) fn meta_key(prefix: &str, name: &str) -> Vec<u8> {
    format!("{prefix}:{name}:meta").into_bytes()
}

/// The Redis key recording the write `id` to the bucket `bucket_key`:
/// `<bucket key>:w:<id in hex>`, in the bucket's hash slot.
pub(crate) fn record_key(bucket_key: &[u8], id: [u8; 8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(bucket_key.len() + 19);
    key.extend_from_slice(bucket_key);
    key.extend_from_slice(format!(":w:{:016x}", u64::from_le_bytes(id)).as_bytes());
    key
}

/// The hash field of a key.
pub(crate) fn field(bits: u64) -> [u8; 8] {
    bits.to_le_bytes()
}

/// The key bits of a hash field (`None` if it is not 8 bytes).
pub(crate) fn bits_of_field(field: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(field.try_into().ok()?))
}

/// A version for one call's writes: random, never repeating within the
/// process (a counter through a randomly keyed SipHash) and unrelated
/// across processes, so a row's version changes with every write and never
/// comes back (a reader that sees its version unchanged knows the row was
/// not written since, up to a 2^-64 chance).
pub(crate) fn new_version() -> [u8; 8] {
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = KEYS
        .get_or_init(std::collections::hash_map::RandomState::new)
        .build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish().to_le_bytes()
}

/// Little-endian bytes of `values`.
pub(crate) fn f32_bytes(values: &[f32], out: &mut Vec<u8>) {
    out.reserve(values.len() * 4);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// `count` copies of `value`, as little-endian bytes appended to `out`
/// (a slot column at its initial value).
pub(crate) fn f32_fill_bytes(value: f32, count: usize, out: &mut Vec<u8>) {
    let bytes = value.to_le_bytes();
    out.reserve(count * 4);
    for _ in 0..count {
        out.extend_from_slice(&bytes);
    }
}

/// Decodes little-endian `f32`s from `bytes` into `out` (same count).
pub(crate) fn read_f32s(bytes: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes(c.try_into().expect("4 bytes"));
    }
}

/// A stored row, checked against the variable's `dim`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row<'a> {
    bytes: &'a [u8],
    dim: usize,
}

impl<'a> Row<'a> {
    /// The row stored as `bytes`, or [`BackendErrorKind::Corrupt`] if its
    /// length does not fit `dim` (a header, the values and whole slot
    /// columns).
    pub(crate) fn parse(bytes: &'a [u8], dim: usize, store: &str) -> Result<Row<'a>> {
        let ok = bytes.len() >= HEADER + 4 * dim && (bytes.len() - HEADER).is_multiple_of(4 * dim);
        if ok {
            Ok(Row { bytes, dim })
        } else {
            Err(Error::Backend {
                store: store.to_string(),
                kind: BackendErrorKind::Corrupt,
                message: format!(
                    "a stored row of {} bytes does not fit dim {dim} (16 + 4 * dim * (1 + slots))",
                    bytes.len()
                ),
            })
        }
    }

    /// The version bytes.
    pub(crate) fn version(&self) -> [u8; 8] {
        self.bytes[..8].try_into().expect("8 bytes")
    }

    /// The score.
    pub(crate) fn score(&self) -> u64 {
        u64::from_le_bytes(self.bytes[8..16].try_into().expect("8 bytes"))
    }

    /// Copies the values into `out` (`dim` values).
    pub(crate) fn values_into(&self, out: &mut [f32]) {
        read_f32s(&self.bytes[HEADER..HEADER + 4 * self.dim], out);
    }

    /// How many slot columns the row holds.
    pub(crate) fn slot_columns(&self) -> usize {
        (self.bytes.len() - HEADER) / (4 * self.dim) - 1
    }

    /// Copies slot column `index` into `out` (`dim` values), or fills it
    /// with `initial` if the row predates the slot.
    pub(crate) fn slot_into(&self, index: usize, initial: f32, out: &mut [f32]) {
        if index < self.slot_columns() {
            let at = HEADER + 4 * self.dim * (1 + index);
            read_f32s(&self.bytes[at..at + 4 * self.dim], out);
        } else {
            out.fill(initial);
        }
    }

    /// The raw bytes of slot column `index` (`None` if the row predates it).
    pub(crate) fn slot_bytes(&self, index: usize) -> Option<&'a [u8]> {
        (index < self.slot_columns()).then(|| {
            let at = HEADER + 4 * self.dim * (1 + index);
            &self.bytes[at..at + 4 * self.dim]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_fixed_by_the_format() {
        // The mix is part of the storage format: these must never change.
        assert_eq!(bucket_of(0, 256), 0);
        // SplitMix64's finalizer: mix(1) = 0x5692161d100b05e5,
        // mix(12345) = 0xf36cf1164265dd51 (computed independently).
        assert_eq!(bucket_of(1, 1 << 20), 722_405);
        assert_eq!(bucket_of(12345, 1000), 873);
        let mut counts = [0usize; 16];
        for k in 0..16_000u64 {
            counts[bucket_of(k, 16) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn keys_and_fields_round_trip() {
        assert_eq!(bucket_key("dynemb", "user/emb", 7), b"dynemb:user/emb:{7}");
        assert_eq!(meta_key("m1", "e"), b"m1:e:meta");
        assert_eq!(
            record_key(b"m:e:{3}", 0xabu64.to_le_bytes()),
            b"m:e:{3}:w:00000000000000ab"
        );
        for bits in [0, 1, u64::MAX, 1 << 63] {
            assert_eq!(bits_of_field(&field(bits)), Some(bits));
        }
        assert_eq!(bits_of_field(b"short"), None);
    }

    #[test]
    fn versions_do_not_repeat() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(new_version()));
        }
    }

    #[test]
    fn rows_decode_values_slots_and_missing_slots() {
        let mut bytes = vec![7u8; 8];
        bytes.extend_from_slice(&42u64.to_le_bytes());
        f32_bytes(&[1.0, 2.0], &mut bytes);
        f32_bytes(&[3.0, 4.0], &mut bytes);
        let row = Row::parse(&bytes, 2, "test").unwrap();
        assert_eq!(row.version(), [7; 8]);
        assert_eq!(row.score(), 42);
        let mut out = [0.0; 2];
        row.values_into(&mut out);
        assert_eq!(out, [1.0, 2.0]);
        assert_eq!(row.slot_columns(), 1);
        row.slot_into(0, 9.0, &mut out);
        assert_eq!(out, [3.0, 4.0]);
        row.slot_into(1, 9.0, &mut out);
        assert_eq!(out, [9.0, 9.0]);
        assert!(Row::parse(&bytes[..20], 2, "test").is_err());
        assert!(Row::parse(&bytes, 3, "test").is_err());
    }
}
