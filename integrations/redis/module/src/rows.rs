//! What each bucket write does to a bucket's rows, apart from Redis: given
//! the rows the call names as they are stored (`None` for an absent one),
//! the rows to write (in first-written order) and the reply. Each
//! function is the native twin of one of `dynemb-redis`'s Lua scripts
//! (`src/scripts.rs` there), with the same arguments and the same reply,
//! so either form may serve a client.
//!
//! Rows are `dynemb-redis`'s layout: an 8-byte version, an 8-byte score,
//! then `f32`s, all little-endian. Scores follow the restrict policy's
//! mode: `n` (none: 0), `f` (frequency: +1 per write, an insert counting
//! as the first, saturating at `u64::MAX`) or `t` (timestamp: the batch's
//! stamp).
//!
//! Invariant: a function either returns every row to write and its reply,
//! or an error and nothing to write (a malformed call changes nothing).
//!
//! Where rows are well formed (every stored row has its header and at
//! least `dim` values), each function gives the script's rows and reply
//! byte for byte. On a corrupt stored row the native form is stricter:
//! it refuses the whole call, where a script may have failed part way
//! (Lua scripts are not rolled back) or, for `accum` with dim 0 or an
//! overflow refused before the short part, gone on.

use std::collections::HashMap;

/// Bytes before a row's values: version and score.
pub const HEADER: usize = 16;

/// Most bytes of a row's values a call may name (512 MiB, Redis's largest
/// string): a larger `dim` is an error, not an overflow.
pub const MAX_ROW_BYTES: usize = 512 << 20;

/// A reply, as the Lua scripts give it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bytes(Vec<u8>),
    /// Nil (the scripts' `false`).
    Nil,
    /// An array.
    Array(Vec<Reply>),
}

/// A call's effect: the rows to write and the reply.
#[derive(Debug, PartialEq)]
pub struct Effect {
    /// `(field, row)` to store, each field once.
    pub writes: Vec<(Vec<u8>, Vec<u8>)>,
    /// What the command answers.
    pub reply: Reply,
}

/// The score of a write: the policy's mode and the batch's stamp.
#[derive(Debug, Clone, Copy)]
pub struct Scoring {
    mode: u8,
    stamp: [u8; 8],
}

impl Scoring {
    /// From the commands' `mode` and `stamp` arguments.
    pub fn new(mode: &[u8], stamp: &[u8]) -> Result<Scoring, String> {
        let mode = match mode {
            b"n" | b"f" | b"t" => mode[0],
            _ => return Err(format!("unknown score mode {:?}", lossy(mode))),
        };
        let stamp = if mode == b't' {
            stamp
                .try_into()
                .map_err(|_| format!("a stamp is 8 bytes, got {}", stamp.len()))?
        } else {
            [0; 8]
        };
        Ok(Scoring { mode, stamp })
    }

    /// The score bytes of a write over `current` (the stored row, if any).
    fn next(&self, current: Option<&[u8]>) -> Result<[u8; 8], String> {
        Ok(match self.mode {
            b't' => self.stamp,
            b'n' => [0; 8],
            _ => match current {
                None => 1u64.to_le_bytes(),
                Some(row) => {
                    let count = u64::from_le_bytes(header(row)?[8..16].try_into().expect("8"));
                    count.saturating_add(1).to_le_bytes()
                }
            },
        })
    }
}

/// The first [`HEADER`] bytes of a stored row.
fn header(row: &[u8]) -> Result<&[u8], String> {
    row.get(..HEADER)
        .ok_or_else(|| format!("a stored row of {} bytes has no header", row.len()))
}

/// A row: `version`, `score`, then the parts.
fn row(version: &[u8], score: [u8; 8], parts: &[&[u8]]) -> Vec<u8> {
    let len = HEADER + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(version);
    out.extend_from_slice(&score);
    for part in parts {
        out.extend_from_slice(part);
    }
    out
}

/// A field's row as a call goes: the stored one until the call writes it.
struct Current {
    row: Option<Vec<u8>>,
    written: bool,
    inserted: bool,
}

/// The rows of a call as it goes, and the order in which fields were first
/// written.
#[derive(Default)]
struct Working<'a> {
    rows: HashMap<&'a [u8], Current>,
    order: Vec<&'a [u8]>,
}

impl<'a> Working<'a> {
    /// The field's current row, taken from `stored` on first sight.
    fn current(&mut self, field: &'a [u8], stored: &Option<Vec<u8>>) -> &mut Current {
        self.rows.entry(field).or_insert_with(|| Current {
            row: stored.clone(),
            written: false,
            inserted: false,
        })
    }

    /// Stores `new` as the field's row (which [`Working::current`] saw).
    fn write(&mut self, field: &'a [u8], new: Vec<u8>) {
        let current = self.rows.get_mut(field).expect("seen before written");
        current.row = Some(new);
        if !current.written {
            current.written = true;
            self.order.push(field);
        }
    }

    fn into_writes(mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.order
            .iter()
            .map(|f| {
                let row = self.rows.remove(f).and_then(|c| c.row);
                (f.to_vec(), row.expect("a written row"))
            })
            .collect()
    }
}

/// `lookup_or_insert`'s insert: `pairs` are `(field, body)` (distinct
/// fields); an absent field gets `version . score . body`. Replies, per
/// field, nil (inserted) or the row already stored.
pub fn insert_absent(
    scoring: Scoring,
    version: &[u8],
    pairs: &[(&[u8], &[u8])],
    stored: &[Option<Vec<u8>>],
) -> Result<Effect, String> {
    let mut writes = Vec::new();
    let mut out = Vec::with_capacity(pairs.len());
    for (&(field, body), got) in pairs.iter().zip(stored) {
        match got {
            Some(current) => out.push(Reply::Bytes(current.clone())),
            None => {
                out.push(Reply::Nil);
                writes.push((field.to_vec(), row(version, scoring.next(None)?, &[body])));
            }
        }
    }
    Ok(Effect {
        writes,
        reply: Reply::Array(out),
    })
}

/// `upsert`: `pairs` are `(field, values)` in batch order (the last of a
/// repeated field wins; each occurrence scores); a stored row keeps its
/// slot columns (its bytes past the new values). Replies the number of
/// occurrences written.
pub fn upsert(
    scoring: Scoring,
    version: &[u8],
    pairs: &[(&[u8], &[u8])],
    stored: &[Option<Vec<u8>>],
) -> Result<Effect, String> {
    let mut working = Working::default();
    for (&(field, values), got) in pairs.iter().zip(stored) {
        let current = working.current(field, got).row.as_deref();
        let tail = current
            .and_then(|c| c.get(HEADER + values.len()..))
            .unwrap_or(&[]);
        let new = row(version, scoring.next(current)?, &[values, tail]);
        working.write(field, new);
    }
    Ok(Effect {
        writes: working.into_writes(),
        reply: Reply::Int(pairs.len() as i64),
    })
}

/// One occurrence of `accum`: the field, whether the caller saw it
/// existing, and its deltas (`dim` little-endian `f32`s).
pub struct AccumEntry<'a> {
    /// The row's field.
    pub field: &'a [u8],
    /// bp_v2's `exists` flag.
    pub exists: bool,
    /// The deltas' bytes.
    pub deltas: &'a [u8],
}

/// bp_v2 `accum`, in batch order, each occurrence decided on the row as
/// the ones before it left it: present and `exists` adds the deltas;
/// absent and not `exists` inserts them as the row; a row this call
/// inserted takes every later occurrence's deltas; otherwise nothing. A
/// sum that rounds to infinity as an `f32` is refused (the row is kept).
/// Replies the refused occurrences as `[position, sign]` pairs (0-based
/// position; the sign of the first infinite sum in the row).
pub fn accum(
    scoring: Scoring,
    version: &[u8],
    dim: usize,
    entries: &[AccumEntry<'_>],
    stored: &[Option<Vec<u8>>],
) -> Result<Effect, String> {
    let width = dim
        .checked_mul(4)
        .filter(|&w| w <= MAX_ROW_BYTES)
        .ok_or_else(|| format!("dim {dim} is too large"))?;
    if let Some(bad) = entries.iter().find(|e| e.deltas.len() != width) {
        return Err(format!(
            "deltas of {} bytes for dim {dim}",
            bad.deltas.len()
        ));
    }
    let mut working = Working::default();
    let mut refused = Vec::new();
    for (n, (entry, got)) in entries.iter().zip(stored).enumerate() {
        let current = working.current(entry.field, got);
        let new = match current.row.as_deref() {
            Some(cur) if entry.exists || current.inserted => {
                let values = cur.get(HEADER..HEADER + width).ok_or_else(|| {
                    format!(
                        "a stored row of {} bytes is shorter than dim {dim}",
                        cur.len()
                    )
                })?;
                match add(values, entry.deltas) {
                    Ok(sums) => row(
                        version,
                        scoring.next(Some(cur))?,
                        &[&sums, &cur[HEADER + width..]],
                    ),
                    Err(sign) => {
                        refused.push(Reply::Int(n as i64));
                        refused.push(Reply::Int(sign));
                        continue;
                    }
                }
            }
            None if !entry.exists => {
                current.inserted = true;
                row(version, scoring.next(None)?, &[entry.deltas])
            }
            _ => continue,
        };
        working.write(entry.field, new);
    }
    Ok(Effect {
        writes: working.into_writes(),
        reply: Reply::Array(refused),
    })
}

/// The `f32` bytes of `a + b` elementwise, or the sign (`1` or `-1`) of
/// the first sum that is infinite. `f32` addition rounds the exact sum
/// once, as the scripts' double sum rounded to `f32` does.
fn add(a: &[u8], b: &[u8]) -> Result<Vec<u8>, i64> {
    let mut out = Vec::with_capacity(a.len());
    for (x, y) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        let sum = f32::from_le_bytes(x.try_into().expect("4"))
            + f32::from_le_bytes(y.try_into().expect("4"));
        if sum.is_infinite() {
            return Err(if sum > 0.0 { 1 } else { -1 });
        }
        out.extend_from_slice(&sum.to_le_bytes());
    }
    Ok(out)
}

/// One row of the optimizers' write-back: the field, the version it was
/// read at (empty: it was absent) and the new row.
pub struct Guarded<'a> {
    /// The row's field.
    pub field: &'a [u8],
    /// The version read (8 bytes), or empty for a row read as absent.
    pub expected: &'a [u8],
    /// The row to store.
    pub row: &'a [u8],
}

/// `update_rows`' write-back (distinct fields): a row is written only if
/// its stored version is still `expected` (or it is still absent, for an
/// empty `expected`). A stored row whose version is the new row's is this
/// very write, already applied: not a conflict. Replies the 0-based
/// positions of the rows that changed meanwhile (not written).
pub fn write_if_unchanged(
    entries: &[Guarded<'_>],
    stored: &[Option<Vec<u8>>],
) -> Result<Effect, String> {
    let mut writes = Vec::new();
    let mut conflicts = Vec::new();
    for (n, (entry, got)) in entries.iter().zip(stored).enumerate() {
        let version = got.as_deref().map(|cur| &cur[..cur.len().min(8)]);
        let same = if entry.expected.is_empty() {
            got.is_none()
        } else {
            version == Some(entry.expected)
        };
        if same {
            writes.push((entry.field.to_vec(), entry.row.to_vec()));
        } else if version != Some(&entry.row[..entry.row.len().min(8)]) {
            conflicts.push(Reply::Int(n as i64));
        }
    }
    Ok(Effect {
        writes,
        reply: Reply::Array(conflicts),
    })
}

/// The field of a bucket being restored (its value names the
/// checkpoint): `restrict`'s scan and removal, and `expire`'s removal,
/// refuse such a bucket.
pub const RESTORING_FIELD: &[u8] = b"restoring";

/// The error code `SCORES` and `REMOVE_BELOW` answer on a bucket being
/// restored, followed by the checkpoint's name.
pub const RESTORING_ERROR: &str = "DYNEMB_RESTORING";

/// Bytes of a key's field: rows are the fields of exactly this length
/// (other fields of a bucket, such as a restore's marker, are not rows).
pub const FIELD_BYTES: usize = 8;

/// The score of a stored row (bytes 8..16, little-endian), or why the row
/// has none.
pub fn score_of(row: &[u8]) -> Result<u64, String> {
    row.get(8..HEADER)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or_else(|| format!("a stored row of {} bytes has no header", row.len()))
}

/// The field and score of a bucket's entry if it is a row (its field is
/// [`FIELD_BYTES`] long: other fields, such as a restore's marker, are not
/// rows), or why the row is corrupt.
pub fn scored(field: &[u8], row: &[u8]) -> Result<Option<([u8; FIELD_BYTES], u64)>, String> {
    match <[u8; FIELD_BYTES]>::try_from(field) {
        Ok(field) => Ok(Some((field, score_of(row)?))),
        Err(_) => Ok(None),
    }
}

/// What `restrict`'s removal does to one bucket: the fields to remove and
/// the reply `[below, ties removed, ties left]`.
#[derive(Debug, PartialEq)]
pub struct Pruning {
    /// Fields to remove.
    pub victims: Vec<Vec<u8>>,
    /// Rows scored below the threshold (all removed).
    pub below: i64,
    /// Rows scored at the threshold that are removed (at most the quota).
    pub ties_removed: i64,
    /// Rows scored at the threshold that stay.
    pub ties_left: i64,
}

impl Pruning {
    /// The reply: `[below, ties removed, ties left]`.
    pub fn reply(&self) -> Reply {
        Reply::Array(vec![
            Reply::Int(self.below),
            Reply::Int(self.ties_removed),
            Reply::Int(self.ties_left),
        ])
    }
}

/// `restrict`'s removal on a bucket's rows (`(field, score)` in the
/// order the bucket is read, see [`scored`]): every row scored below
/// `threshold` goes, and the first `quota` rows scored exactly
/// `threshold`.
pub fn prune(rows: &[([u8; FIELD_BYTES], u64)], threshold: u64, quota: u64) -> Pruning {
    let mut pruning = Pruning {
        victims: Vec::new(),
        below: 0,
        ties_removed: 0,
        ties_left: 0,
    };
    let mut quota = quota;
    for &(field, score) in rows {
        if score < threshold {
            pruning.below += 1;
            pruning.victims.push(field.to_vec());
        } else if score == threshold && quota > 0 {
            quota -= 1;
            pruning.ties_removed += 1;
            pruning.victims.push(field.to_vec());
        } else if score == threshold {
            pruning.ties_left += 1;
        }
    }
    pruning
}

/// Bytes for a message, lossily.
pub(crate) fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: &[u8] = b"VERSION!";

    fn floats(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn stored(score: u64, values: &[f32], tail: &[u8]) -> Vec<u8> {
        let mut row = b"OLDVERSN".to_vec();
        row.extend_from_slice(&score.to_le_bytes());
        row.extend_from_slice(&floats(values));
        row.extend_from_slice(tail);
        row
    }

    fn freq() -> Scoring {
        Scoring::new(b"f", b"").unwrap()
    }

    fn entry<'a>(field: &'a [u8], exists: bool, deltas: &'a [u8]) -> AccumEntry<'a> {
        AccumEntry {
            field,
            exists,
            deltas,
        }
    }

    #[test]
    fn pruning_removes_below_the_threshold_and_ties_up_to_the_quota() {
        let entries = [
            (&b"aaaaaaaa"[..], stored(1, &[0.0], b"")),
            (&b"bbbbbbbb"[..], stored(5, &[0.0], b"")),
            (&b"cccccccc"[..], stored(3, &[0.0], b"")),
            (&b"dddddddd"[..], stored(3, &[0.0], b"")),
            (&b"restoring"[..], b"not a row".to_vec()),
            (&b"eeeeeeee"[..], stored(3, &[0.0], b"")),
        ];
        let rows: Vec<([u8; 8], u64)> = entries
            .iter()
            .filter_map(|(f, r)| scored(f, r).unwrap())
            .collect();
        assert_eq!(
            rows.iter().map(|r| r.1).collect::<Vec<_>>(),
            [1, 5, 3, 3, 3],
            "the marker is no row"
        );
        let p = prune(&rows, 3, 2);
        assert_eq!(
            p.victims,
            [
                b"aaaaaaaa".to_vec(),
                b"cccccccc".to_vec(),
                b"dddddddd".to_vec()
            ]
        );
        assert_eq!((p.below, p.ties_removed, p.ties_left), (1, 2, 1));
        let p = prune(&rows, 3, 0);
        assert_eq!((p.below, p.ties_removed, p.ties_left), (1, 0, 3));
        assert!(scored(b"ffffffff", b"short").is_err());
    }

    #[test]
    fn scores_follow_the_mode() {
        let row = stored(41, &[0.0], b"");
        assert_eq!(freq().next(None).unwrap(), 1u64.to_le_bytes());
        assert_eq!(freq().next(Some(&row)).unwrap(), 42u64.to_le_bytes());
        let top = stored(u64::MAX, &[0.0], b"");
        assert_eq!(freq().next(Some(&top)).unwrap(), u64::MAX.to_le_bytes());
        let none = Scoring::new(b"n", b"").unwrap();
        assert_eq!(none.next(Some(&row)).unwrap(), [0; 8]);
        let stamp = Scoring::new(b"t", &7u64.to_le_bytes()).unwrap();
        assert_eq!(stamp.next(Some(&row)).unwrap(), 7u64.to_le_bytes());
        assert!(Scoring::new(b"x", b"").is_err());
        assert!(Scoring::new(b"t", b"short").is_err());
        assert!(
            freq().next(Some(b"short")).is_err(),
            "a row without a header"
        );
    }

    #[test]
    fn accum_follows_bp_v2s_truth_table() {
        let one = floats(&[1.0, 2.0]);
        let got = [
            Some(stored(5, &[10.0, 20.0], b"SLOT")),
            None,
            None,
            Some(stored(0, &[0.0, 0.0], b"")),
        ];
        let entries = [
            entry(b"present", true, &one),   // present, exists: added
            entry(b"absent1", false, &one),  // absent, not exists: inserted
            entry(b"absent2", true, &one),   // absent, exists: nothing
            entry(b"present2", false, &one), // present, not exists: nothing
        ];
        let effect = accum(freq(), V, 2, &entries, &got).unwrap();
        assert_eq!(effect.reply, Reply::Array(vec![]));
        let mut added = V.to_vec();
        added.extend_from_slice(&6u64.to_le_bytes());
        added.extend_from_slice(&floats(&[11.0, 22.0]));
        added.extend_from_slice(b"SLOT");
        let mut inserted = V.to_vec();
        inserted.extend_from_slice(&1u64.to_le_bytes());
        inserted.extend_from_slice(&one);
        assert_eq!(
            effect.writes,
            vec![
                (b"present".to_vec(), added),
                (b"absent1".to_vec(), inserted)
            ]
        );
    }

    #[test]
    fn a_row_this_call_inserted_takes_later_deltas_whatever_their_flag() {
        let d = floats(&[1.5]);
        let entries = [
            entry(b"k", false, &d),
            entry(b"k", false, &d),
            entry(b"k", true, &d),
        ];
        let effect = accum(freq(), V, 1, &entries, &[None, None, None]).unwrap();
        assert_eq!(effect.writes.len(), 1, "one row written, once");
        let row = &effect.writes[0].1;
        assert_eq!(&row[8..16], &3u64.to_le_bytes(), "three writes scored");
        assert_eq!(&row[16..], &floats(&[4.5])[..]);
    }

    #[test]
    fn an_overflowing_sum_is_refused_with_its_sign_and_the_row_kept() {
        let big = floats(&[1.0, f32::MAX]);
        let neg = floats(&[-f32::MAX, 0.0]);
        let got = [
            Some(stored(0, &[0.0, f32::MAX], b"")),
            Some(stored(0, &[-f32::MAX, 0.0], b"")),
        ];
        let entries = [entry(b"a", true, &big), entry(b"b", true, &neg)];
        let effect = accum(freq(), V, 2, &entries, &got).unwrap();
        assert_eq!(
            effect.reply,
            Reply::Array(vec![
                Reply::Int(0),
                Reply::Int(1),
                Reply::Int(1),
                Reply::Int(-1)
            ])
        );
        assert!(effect.writes.is_empty());
        // The largest finite sum is kept, not refused.
        let half = floats(&[f32::MAX / 2.0]);
        let got = [Some(stored(0, &[f32::MAX / 2.0], b""))];
        let effect = accum(freq(), V, 1, &[entry(b"c", true, &half)], &got).unwrap();
        assert_eq!(effect.reply, Reply::Array(vec![]));
        assert_eq!(&effect.writes[0].1[16..], &floats(&[f32::MAX])[..]);
    }

    #[test]
    fn malformed_accums_change_nothing() {
        let d = floats(&[1.0]);
        for dim in [usize::MAX, usize::MAX / 4 + 1, MAX_ROW_BYTES / 4 + 1] {
            assert!(
                accum(freq(), V, dim, &[entry(b"k", true, &d)], &[None]).is_err(),
                "dim {dim}"
            );
        }
        assert!(
            accum(freq(), V, 2, &[entry(b"k", true, &d)], &[None]).is_err(),
            "short deltas"
        );
        let short = Some(stored(0, &[], b""));
        assert!(
            accum(freq(), V, 1, &[entry(b"k", true, &d)], &[short]).is_err(),
            "short row"
        );
    }

    #[test]
    fn upsert_keeps_slots_and_the_last_repeat_wins() {
        let got = [
            Some(stored(2, &[9.0, 9.0], b"SLOTS")),
            Some(stored(2, &[9.0, 9.0], b"SLOTS")),
            None,
        ];
        let (a, b, c) = (
            floats(&[1.0, 1.0]),
            floats(&[2.0, 2.0]),
            floats(&[3.0, 3.0]),
        );
        let pairs: [(&[u8], &[u8]); 3] = [(b"k", &a), (b"k", &b), (b"new", &c)];
        let effect = upsert(freq(), V, &pairs, &got).unwrap();
        assert_eq!(effect.reply, Reply::Int(3));
        let mut k = V.to_vec();
        k.extend_from_slice(&4u64.to_le_bytes());
        k.extend_from_slice(&b);
        k.extend_from_slice(b"SLOTS");
        let mut new = V.to_vec();
        new.extend_from_slice(&1u64.to_le_bytes());
        new.extend_from_slice(&c);
        assert_eq!(
            effect.writes,
            vec![(b"k".to_vec(), k), (b"new".to_vec(), new)]
        );
    }

    #[test]
    fn insert_absent_inserts_only_the_absent() {
        let present = stored(1, &[5.0], b"");
        let body = floats(&[0.5]);
        let pairs: [(&[u8], &[u8]); 2] = [(b"a", &body), (b"b", &body)];
        let effect = insert_absent(freq(), V, &pairs, &[Some(present.clone()), None]).unwrap();
        assert_eq!(
            effect.reply,
            Reply::Array(vec![Reply::Bytes(present), Reply::Nil])
        );
        assert_eq!(effect.writes.len(), 1);
        assert_eq!(effect.writes[0].0, b"b");
    }

    #[test]
    fn write_if_unchanged_writes_unchanged_rows_and_knows_its_own() {
        let mine = b"NEWVERSNrest".to_vec();
        let entries = [
            Guarded {
                field: b"same",
                expected: b"OLDVERSN",
                row: &mine,
            },
            Guarded {
                field: b"changed",
                expected: b"OTHERVER",
                row: &mine,
            },
            Guarded {
                field: b"absent",
                expected: b"",
                row: &mine,
            },
            Guarded {
                field: b"now-present",
                expected: b"",
                row: &mine,
            },
            Guarded {
                field: b"already-mine",
                expected: b"OLDVERSN",
                row: &mine,
            },
        ];
        let got = [
            Some(stored(0, &[], b"")),
            Some(stored(0, &[], b"")),
            None,
            Some(stored(0, &[], b"")),
            Some(mine.clone()),
        ];
        let effect = write_if_unchanged(&entries, &got).unwrap();
        assert_eq!(
            effect.reply,
            Reply::Array(vec![Reply::Int(1), Reply::Int(3)])
        );
        let written: Vec<&[u8]> = effect.writes.iter().map(|(f, _)| &f[..]).collect();
        assert_eq!(written, [&b"same"[..], b"absent"]);
    }
}
