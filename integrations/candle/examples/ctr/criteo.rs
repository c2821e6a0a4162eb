//! A streaming reader of the Criteo Display Advertising Challenge data
//! (`train.txt`, uncompressed): one sample per line, 40 tab-separated
//! columns `label  I1..I13  C1..C26`, no header.
//!
//! **Features.** 39 fields, each salted by field with [`feature_id`]:
//! - `I1..I13` (fields 0..12) are integers, bucketized as the public
//!   Criteo solutions do: `v` itself for `0 <= v <= 2`, else
//!   `3 + floor(ln(v)^2)` (the libffm winners' `floor(ln(v)^2)`, offset by
//!   3 so a log bucket never shares an id with a small value); every
//!   negative value is one bucket ([`NEGATIVE`]); empty is [`MISSING`].
//! - `C1..C26` (fields 13..38) are 32-bit hashes written as 1 to 8 hex
//!   digits, used as they are; empty is [`MISSING`].
//!
//! **Split.** The file is in time order, so the held-out set is the most
//! recent slice: the `eval` lines right after the training lines. Training
//! is the first `train` lines (`--train-samples`), or, when not given,
//! every line but the last `eval`. Opening counts lines (one pass over at
//! most `train + eval` lines, the whole file when `train` is not given),
//! then reads the held-out lines into memory; each epoch streams the
//! training lines again from the file through a `BufReader` (the file is
//! never loaded whole). A file shorter than `train + eval` lines gives
//! training whatever comes before its last `eval` lines.
//!
//! **Errors.** A malformed line (not 40 columns, a label other than `0` or
//! `1`, a bad integer, bad hex) is [`DataError::Malformed`] naming the file
//! and the 1-based line: at open for a held-out line, from
//! [`DataSource::next_batch`] for a training line. `\r\n` line ends are
//! accepted.

use crate::source::{
    check_batch_size, feature_id, Batch, DataError, DataSource, EvalSet, Result, MAX_RAW,
};
use std::fs::File;
use std::io::{BufRead, BufReader, Seek};
use std::path::{Path, PathBuf};

/// Integer fields (`I1..I13`).
pub const INT_FIELDS: usize = 13;
/// Categorical fields (`C1..C26`).
pub const CATEGORICAL_FIELDS: usize = 26;
/// Fields per sample.
pub const FIELDS: usize = INT_FIELDS + CATEGORICAL_FIELDS;
/// Raw value of an empty column.
pub const MISSING: u64 = MAX_RAW;
/// Raw value of every negative integer.
pub const NEGATIVE: u64 = MAX_RAW - 1;

/// Columns per line: the label and the fields.
const COLUMNS: usize = 1 + FIELDS;

/// The bucket (raw value) of integer feature value `value`.
pub fn int_bucket(value: i64) -> u64 {
    match value {
        v if v < 0 => NEGATIVE,
        0..=2 => value as u64,
        v => 3 + (v as f64).ln().powi(2).floor() as u64,
    }
}

/// The name of field `field` (`I1..I13`, `C1..C26`).
pub fn field_name(field: usize) -> String {
    if field < INT_FIELDS {
        format!("I{}", field + 1)
    } else {
        format!("C{}", field - INT_FIELDS + 1)
    }
}

/// Parses one line (without its line end) into its label and one id per
/// field; the error says what is wrong.
pub fn parse_line(line: &[u8], ids: &mut [i64; FIELDS]) -> std::result::Result<f32, String> {
    let mut columns = [&line[..0]; COLUMNS];
    let mut found = 0;
    for column in line.split(|&b| b == b'\t') {
        if let Some(slot) = columns.get_mut(found) {
            *slot = column;
        }
        found += 1;
    }
    if found != COLUMNS {
        return Err(format!(
            "expected {COLUMNS} tab-separated columns, found {found}"
        ));
    }
    let label = match columns[0] {
        b"0" => 0.0,
        b"1" => 1.0,
        other => return Err(format!("label must be 0 or 1, found {}", quoted(other))),
    };
    for (field, (column, id)) in columns[1..].iter().zip(ids.iter_mut()).enumerate() {
        let raw = if column.is_empty() {
            MISSING
        } else if field < INT_FIELDS {
            let value = std::str::from_utf8(column)
                .ok()
                .and_then(|text| text.parse::<i64>().ok())
                .ok_or_else(|| format!("{}: bad integer {}", field_name(field), quoted(column)))?;
            int_bucket(value)
        } else {
            parse_hex(column)
                .ok_or_else(|| format!("{}: bad hex {}", field_name(field), quoted(column)))?
        };
        *id = feature_id(field, raw);
    }
    Ok(label)
}

/// 1 to 8 hex digits as a number.
fn parse_hex(digits: &[u8]) -> Option<u64> {
    if digits.len() > 8 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let text = std::str::from_utf8(digits).ok()?;
    u64::from_str_radix(text, 16).ok()
}

/// A column's text for an error message, quoted and cut at 32 characters.
fn quoted(column: &[u8]) -> String {
    let text = String::from_utf8_lossy(column);
    let cut: String = text.chars().take(32).collect();
    if cut.len() < text.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// Consumes up to `limit` lines (a last line without a line end counts)
/// and returns how many there were.
fn skip_lines(reader: &mut impl BufRead, limit: u64) -> std::io::Result<u64> {
    let mut lines = 0;
    let mut partial = false;
    while lines < limit {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok(lines + u64::from(partial));
        }
        let mut used = 0;
        while used < buffer.len() && lines < limit {
            match buffer[used..].iter().position(|&b| b == b'\n') {
                Some(end) => {
                    used += end + 1;
                    lines += 1;
                    partial = false;
                }
                None => {
                    used = buffer.len();
                    partial = true;
                }
            }
        }
        reader.consume(used);
    }
    Ok(lines)
}

/// Reads the next line into `buffer` without its line end; `false` at the
/// end of the file.
fn read_line(reader: &mut impl BufRead, buffer: &mut Vec<u8>) -> std::io::Result<bool> {
    buffer.clear();
    if reader.read_until(b'\n', buffer)? == 0 {
        return Ok(false);
    }
    if buffer.last() == Some(&b'\n') {
        buffer.pop();
    }
    if buffer.last() == Some(&b'\r') {
        buffer.pop();
    }
    Ok(true)
}

/// The Criteo [`DataSource`] (see the module docs).
#[derive(Debug)]
pub struct Criteo {
    path: PathBuf,
    reader: BufReader<File>,
    /// Training lines per epoch.
    train_lines: u64,
    /// Lines read so far in this epoch.
    line: u64,
    buffer: Vec<u8>,
    eval: EvalSet,
}

impl Criteo {
    /// Opens `path`, holding out the `eval_samples` lines after the first
    /// `train_samples` (or the last `eval_samples` when `None`).
    pub fn open(
        path: impl AsRef<Path>,
        train_samples: Option<usize>,
        eval_samples: usize,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if eval_samples == 0 {
            return Err(DataError::Invalid(
                "the held-out set needs at least one line".into(),
            ));
        }
        let io = |source| DataError::Io {
            path: path.clone(),
            source,
        };
        let limit = match train_samples {
            Some(train) => (train as u64).saturating_add(eval_samples as u64),
            None => u64::MAX,
        };
        let mut reader = BufReader::with_capacity(1 << 20, File::open(&path).map_err(io)?);
        let lines = skip_lines(&mut reader, limit).map_err(io)?;
        if lines <= eval_samples as u64 {
            return Err(DataError::TooSmall {
                path,
                lines,
                eval: eval_samples,
            });
        }
        let train_lines = lines - eval_samples as u64;
        reader.rewind().map_err(io)?;
        skip_lines(&mut reader, train_lines).map_err(io)?;
        let mut source = Self {
            path,
            reader,
            train_lines,
            line: train_lines,
            buffer: Vec::new(),
            eval: EvalSet {
                samples: Batch::with_capacity(FIELDS, 0),
                truth: None,
            },
        };
        let samples = source.read_samples(eval_samples)?;
        source.eval.samples = samples;
        source.rewind()?;
        Ok(source)
    }

    /// Reads and parses the next `count` lines.
    fn read_samples(&mut self, count: usize) -> Result<Batch> {
        let mut batch = Batch::with_capacity(FIELDS, count);
        let mut ids = [0i64; FIELDS];
        for _ in 0..count {
            self.line += 1;
            let more =
                read_line(&mut self.reader, &mut self.buffer).map_err(|source| DataError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            if !more {
                return Err(self.malformed(
                    "the file ended early (did it change since it was opened?)".into(),
                ));
            }
            let label =
                parse_line(&self.buffer, &mut ids).map_err(|reason| self.malformed(reason))?;
            batch.labels.push(label);
            batch.ids.extend_from_slice(&ids);
        }
        Ok(batch)
    }

    /// A [`DataError::Malformed`] for the current line.
    fn malformed(&self, reason: String) -> DataError {
        DataError::Malformed {
            path: self.path.clone(),
            line: self.line,
            reason,
        }
    }
}

impl DataSource for Criteo {
    fn describe(&self) -> String {
        format!(
            "Criteo {}: {FIELDS} fields, {} training + {} held-out lines",
            self.path.display(),
            self.train_lines,
            self.eval.samples.len()
        )
    }

    fn fields(&self) -> usize {
        FIELDS
    }

    fn field_name(&self, field: usize) -> String {
        field_name(field)
    }

    fn train_samples(&self) -> usize {
        usize::try_from(self.train_lines).unwrap_or(usize::MAX)
    }

    fn rewind(&mut self) -> Result<()> {
        self.reader.rewind().map_err(|source| DataError::Io {
            path: self.path.clone(),
            source,
        })?;
        self.line = 0;
        Ok(())
    }

    fn next_batch(&mut self, batch_size: usize) -> Result<Option<Batch>> {
        check_batch_size(batch_size)?;
        let left = self.train_lines.saturating_sub(self.line);
        if left == 0 {
            return Ok(None);
        }
        let count = usize::try_from(left).map_or(batch_size, |left| left.min(batch_size));
        self.read_samples(count).map(Some)
    }

    fn eval_set(&self) -> &EvalSet {
        &self.eval
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// One line in the file's format.
    fn line(
        label: &str,
        ints: &[&str; INT_FIELDS],
        categories: &[&str; CATEGORICAL_FIELDS],
    ) -> String {
        let mut columns = vec![label];
        columns.extend(ints);
        columns.extend(categories);
        columns.join("\t")
    }

    /// A well-formed line whose I1 is `i1`, with an empty I3, a negative
    /// I2, an empty C2 and hex categories.
    fn good(label: &str, i1: &str) -> String {
        let ints = [
            i1, "-1", "", "0", "1", "2", "3", "100", "7", "8", "9", "10", "11",
        ];
        let mut categories = ["68fd1e64"; CATEGORICAL_FIELDS];
        categories[1] = "";
        categories[2] = "0A";
        line(label, &ints, &categories)
    }

    fn file(lines: &[String], end: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        for text in lines {
            write!(file, "{text}{end}").unwrap();
        }
        file.flush().unwrap();
        file
    }

    fn epoch(source: &mut Criteo, batch_size: usize) -> Result<Vec<Batch>> {
        let mut batches = Vec::new();
        while let Some(batch) = source.next_batch(batch_size)? {
            batches.push(batch);
        }
        Ok(batches)
    }

    #[test]
    fn buckets() {
        assert_eq!(int_bucket(0), 0);
        assert_eq!(int_bucket(2), 2);
        assert_eq!(int_bucket(3), 4); // ln(3)^2 = 1.2
        assert_eq!(int_bucket(100), 24); // ln(100)^2 = 21.2
        assert_eq!(int_bucket(i64::MAX), 3 + 1906); // ln(2^63 - 1)^2 = 1906.9
        assert_eq!(int_bucket(-1), NEGATIVE);
        assert_eq!(int_bucket(-1_000_000), NEGATIVE);
        assert_eq!(field_name(0), "I1");
        assert_eq!(field_name(13), "C1");
        assert_eq!(field_name(38), "C26");
    }

    #[test]
    fn reads_training_lines_then_holds_out_the_last() {
        let lines: Vec<String> = (0..5)
            .map(|i| good(if i % 2 == 0 { "1" } else { "0" }, &i.to_string()))
            .collect();
        let data = file(&lines, "\n");
        let mut source = Criteo::open(data.path(), None, 2).unwrap();
        assert_eq!(source.train_samples(), 3);
        assert_eq!(source.fields(), 39);
        let batches = epoch(&mut source, 2).unwrap();
        assert_eq!(
            batches.iter().map(Batch::len).collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert_eq!(batches[0].labels, vec![1.0, 0.0]);
        assert_eq!(batches[1].labels, vec![1.0]);
        let first = &batches[0].ids[..FIELDS];
        assert_eq!(first[0], feature_id(0, 0));
        assert_eq!(
            batches[0].ids[FIELDS],
            feature_id(0, 1),
            "I1 of the second line"
        );
        assert_eq!(first[1], feature_id(1, NEGATIVE));
        assert_eq!(first[2], feature_id(2, MISSING));
        assert_eq!(first[7], feature_id(7, int_bucket(100)));
        assert_eq!(first[13], feature_id(13, 0x68fd_1e64));
        assert_eq!(first[14], feature_id(14, MISSING));
        assert_eq!(first[15], feature_id(15, 0x0a));
        assert_ne!(first[2], first[14], "missing values of two fields differ");
        // The held-out lines are the last two: I1 = 3 and 4.
        let eval = &source.eval_set().samples;
        assert_eq!(eval.labels, vec![0.0, 1.0]);
        assert_eq!(eval.ids[0], feature_id(0, int_bucket(3)));
        assert_eq!(eval.ids[FIELDS], feature_id(0, int_bucket(4)));
        assert!(source.eval_set().truth.is_none());
        // The next epoch replays the same lines.
        source.rewind().unwrap();
        assert_eq!(epoch(&mut source, 2).unwrap(), batches);
    }

    #[test]
    fn train_samples_limits_training_and_eval_follows_it() {
        let lines: Vec<String> = (0..6).map(|i| good("0", &i.to_string())).collect();
        let data = file(&lines, "\r\n");
        let mut source = Criteo::open(data.path(), Some(2), 3).unwrap();
        assert_eq!(source.train_samples(), 2);
        assert_eq!(epoch(&mut source, 10).unwrap()[0].len(), 2);
        let eval = &source.eval_set().samples;
        let i1: Vec<i64> = eval.samples().map(|(_, ids)| ids[0]).collect();
        assert_eq!(
            i1,
            vec![
                feature_id(0, 2),
                feature_id(0, int_bucket(3)),
                feature_id(0, int_bucket(4))
            ]
        );
        // Asking for more than the file holds: training gets what is left.
        let source = Criteo::open(data.path(), Some(100), 3).unwrap();
        assert_eq!(source.train_samples(), 3);
    }

    #[test]
    fn last_line_without_line_end_counts() {
        let lines: Vec<String> = (0..3).map(|i| good("1", &i.to_string())).collect();
        let mut data = file(&lines, "\n");
        write!(data, "{}", good("0", "9")).unwrap();
        data.flush().unwrap();
        let source = Criteo::open(data.path(), None, 1).unwrap();
        assert_eq!(source.train_samples(), 3);
        assert_eq!(source.eval_set().samples.labels, vec![0.0]);
    }

    #[test]
    fn too_small_or_missing_files_are_errors() {
        let data = file(&[good("1", "1"), good("0", "2")], "\n");
        assert!(matches!(
            Criteo::open(data.path(), None, 2),
            Err(DataError::TooSmall {
                lines: 2,
                eval: 2,
                ..
            })
        ));
        assert!(matches!(
            Criteo::open(data.path(), None, 0),
            Err(DataError::Invalid(_))
        ));
        assert!(matches!(
            Criteo::open(data.path().with_extension("absent"), None, 1),
            Err(DataError::Io { .. })
        ));
        let mut source = Criteo::open(data.path(), None, 1).unwrap();
        assert!(matches!(source.next_batch(0), Err(DataError::Invalid(_))));
    }

    /// Skipping batches (by reading them) lands on the next unseen line.
    #[test]
    fn skipping_batches_lands_on_the_next_line() {
        let lines: Vec<String> = (0..9).map(|i| good("0", &i.to_string())).collect();
        let data = file(&lines, "\n");
        let mut read = Criteo::open(data.path(), None, 2).unwrap();
        let all = epoch(&mut read, 2).unwrap();
        let mut source = Criteo::open(data.path(), None, 2).unwrap();
        assert_eq!(source.skip_batches(2, 2).unwrap(), 2);
        assert_eq!(source.next_batch(2).unwrap().as_ref(), Some(&all[2]));
        assert_eq!(source.skip_batches(5, 2).unwrap(), 1);
        assert_eq!(source.next_batch(2).unwrap(), None);
    }

    /// A held-out slice without a click is refused at open by
    /// `check_held_out`.
    #[test]
    fn a_held_out_slice_without_clicks_is_found_at_open() {
        let mut lines: Vec<String> = (0..6).map(|i| good("0", &i.to_string())).collect();
        lines[0] = good("1", "0");
        let data = file(&lines, "\n");
        let source = Criteo::open(data.path(), None, 3).unwrap();
        let message = crate::source::check_held_out(source.eval_set())
            .unwrap_err()
            .to_string();
        assert!(message.contains("--eval-samples 3"), "{message}");
        lines[5] = good("1", "5");
        let data = file(&lines, "\n");
        let source = Criteo::open(data.path(), None, 3).unwrap();
        crate::source::check_held_out(source.eval_set()).unwrap();
    }

    /// Each kind of malformed line, as line 3 of 5, gives an error naming
    /// line 3: from `next_batch` when it is a training line, from `open`
    /// when it is held out.
    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        let mut ints = ["1"; INT_FIELDS];
        let categories = ["68fd1e64"; CATEGORICAL_FIELDS];
        let too_few = line("1", &ints, &categories)
            .rsplit_once('\t')
            .unwrap()
            .0
            .to_string();
        let too_many = format!("{}\t", line("1", &ints, &categories));
        let bad_label = line("2", &ints, &categories);
        let empty_label = line("", &ints, &categories);
        ints[4] = "1.5";
        let fractional = line("1", &ints, &categories);
        ints[4] = "x";
        let not_a_number = line("1", &ints, &categories);
        ints[4] = "1";
        let mut cats = categories;
        cats[5] = "zz";
        let bad_hex = line("0", &ints, &cats);
        cats[5] = "123456789";
        let long_hex = line("0", &ints, &cats);
        let cases = [
            (too_few, "expected 40 tab-separated columns, found 39"),
            (too_many, "expected 40 tab-separated columns, found 41"),
            (bad_label, "label must be 0 or 1"),
            (empty_label, "label must be 0 or 1"),
            (fractional, "I5: bad integer \"1.5\""),
            (not_a_number, "I5: bad integer"),
            (bad_hex, "C6: bad hex \"zz\""),
            (long_hex, "C6: bad hex"),
            (String::new(), "found 1"),
        ];
        for (bad, message) in cases {
            let mut lines: Vec<String> = (0..5).map(|i| good("0", &i.to_string())).collect();
            lines[2] = bad.clone();
            let data = file(&lines, "\n");
            let check = |result: Result<()>, when: &str| match result {
                Err(DataError::Malformed {
                    line: 3, reason, ..
                }) => {
                    assert!(
                        reason.contains(message),
                        "{when}: {reason:?} should contain {message:?}"
                    )
                }
                other => panic!("{when}: {bad:?} gave {other:?}"),
            };
            let mut source = Criteo::open(data.path(), None, 1).unwrap();
            let first = source.next_batch(2).unwrap().unwrap();
            assert_eq!(first.len(), 2, "the lines before the bad one read fine");
            check(source.next_batch(2).map(drop), "training");
            check(Criteo::open(data.path(), None, 3).map(drop), "held out");
            let shown = Criteo::open(data.path(), None, 3).unwrap_err().to_string();
            assert!(
                shown.contains(":3: "),
                "the message names the line: {shown}"
            );
        }
    }
}
