//! The admission state in a checkpoint: what [`Admitter::state`] holds,
//! written beside the rows as `admission-PPPPP.safetensors` files and
//! listed in `index.json` under `admission` (see the Format section of the
//! [module docs](super)).
//!
//! Restore and load check the state files with the rest of the
//! checkpoint, before anything changes: the rule against the variable's
//! (the same kind; a sketch of the same width and depth), each file's
//! size, checksum, tensors, dtypes and shapes, counts of at least 1. A
//! file is read only if it is no larger than a save writes: one chunk of
//! at most [`PENDING_PER_FILE`] keys, or a sketch the size of the
//! variable's own.

use super::files::{self, KeyCodec, MAX_HEADER_BYTES};
use super::manifest::{
    corrupt, AdmissionEntry, AdmissionFile, Manifest, EXACT, PENDING_PER_FILE, SKETCH,
};
use super::{io_error, FilesWriter};
use crate::lifecycle::admission::{AdmissionState, Admitter};
use crate::{Admission, Error, Result};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// The tensors of a file to write: name, dtype, shape, little-endian bytes.
type Tensors<'a> = Vec<(&'a str, Dtype, Vec<usize>, &'a [u8])>;

/// The name of the `index`-th admission state file.
fn file_name(index: usize) -> String {
    format!("admission-{index:05}.safetensors")
}

/// Little-endian bytes of `values`.
fn le_bytes_u32(values: &[u32]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(values))
    } else {
        Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// Little-endian bytes of `values`.
fn le_bytes_u16(values: &[u16]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(values))
    } else {
        Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// A safetensors file of `tensors` (name, dtype, shape, bytes); an
/// [`Error::InvalidArgument`] naming `path` if it cannot be written.
fn encode(path: &Path, tensors: Tensors<'_>) -> Result<Vec<u8>> {
    let unwritable = |e: safetensors::SafeTensorError| {
        Error::InvalidArgument(format!(
            "checkpoint file {} cannot be written: {e}",
            path.display()
        ))
    };
    let views = tensors
        .into_iter()
        .map(|(name, dtype, shape, bytes)| {
            Ok((
                name.to_string(),
                TensorView::new(dtype, shape, bytes).map_err(unwritable)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([("writer".to_string(), "dynemb".to_string())]);
    safetensors::serialize(views, Some(metadata)).map_err(unwritable)
}

/// Writes `admitter`'s state as the admission files of the checkpoint
/// being written by `writer` (keys as `codec` writes them), and returns
/// its manifest entry.
pub(crate) fn write(
    writer: &mut FilesWriter<'_>,
    admitter: &Admitter,
    codec: KeyCodec,
) -> Result<AdmissionEntry> {
    let rule = admitter.admission();
    let mut files = Vec::new();
    let mut write_file = |entries: u64, tensors: Tensors<'_>| {
        let file = file_name(files.len());
        let path = writer.staging.join(&file);
        let bytes = encode(&path, tensors)?;
        let (size, crc32) = writer.write_named(&file, &bytes)?;
        files.push(AdmissionFile {
            file,
            entries,
            bytes: size,
            crc32,
        });
        Ok::<_, Error>(())
    };
    match admitter.state() {
        AdmissionState::Exact { keys, counts } => {
            for (keys, counts) in keys
                .chunks(PENDING_PER_FILE)
                .zip(counts.chunks(PENDING_PER_FILE))
            {
                let n = keys.len();
                let key_bytes = codec.encode(keys);
                let count_bytes = le_bytes_u32(counts);
                write_file(
                    n as u64,
                    vec![
                        ("keys", codec.dtype(), vec![n], &key_bytes),
                        ("counts", Dtype::U32, vec![n], &count_bytes),
                    ],
                )?;
            }
        }
        AdmissionState::Sketch {
            width,
            depth,
            counters,
            reads,
        } => {
            let counter_bytes = le_bytes_u16(&counters);
            let reads = [reads];
            let read_bytes = files::le_bytes_u64(&reads);
            write_file(
                counters.len() as u64,
                vec![
                    ("counters", Dtype::U16, vec![depth, width], &counter_bytes),
                    ("reads", Dtype::U64, vec![1], &read_bytes),
                ],
            )?;
        }
    }
    let (kind, width, depth) = match rule {
        Admission::Exact { .. } => (EXACT, None, None),
        Admission::Sketch { width, depth, .. } => (SKETCH, Some(width), Some(depth)),
    };
    Ok(AdmissionEntry {
        kind: kind.to_string(),
        min_count: rule.min_count(),
        width,
        depth,
        files,
    })
}

/// Describes an admission rule, for errors.
fn describe(rule: Admission) -> String {
    match rule {
        Admission::Exact { min_count } => format!("exact admission (min_count {min_count})"),
        Admission::Sketch {
            min_count,
            width,
            depth,
        } => format!("an admission sketch of {width} x {depth} counters (min_count {min_count})"),
    }
}

/// Checks that the checkpoint's admission state fits the variable called
/// `name` with counters `admitter`: the same kind, and a sketch of the
/// same width and depth; [`Error::Mismatch`] if not. A variable without
/// admission takes any checkpoint (it ignores the state), and any
/// variable takes a checkpoint without one.
pub(crate) fn check_fits(
    name: &str,
    admitter: Option<&Admitter>,
    dir: &Path,
    manifest: &Manifest,
) -> Result<()> {
    let (Some(admitter), Some(rule)) = (
        admitter,
        manifest.admission.as_ref().and_then(AdmissionEntry::rule),
    ) else {
        return Ok(());
    };
    let own = admitter.admission();
    let fits = match (own, rule) {
        (Admission::Exact { .. }, Admission::Exact { .. }) => true,
        (
            Admission::Sketch { width, depth, .. },
            Admission::Sketch {
                width: saved_width,
                depth: saved_depth,
                ..
            },
        ) => (width, depth) == (saved_width, saved_depth),
        _ => false,
    };
    if fits {
        return Ok(());
    }
    Err(Error::Mismatch {
        name: name.to_string(),
        existing: describe(own),
        requested: format!("checkpoint {} with {}", dir.display(), describe(rule)),
    })
}

/// The largest admission file a save writes under `rule`, keys written by
/// `codec`: a full chunk of pending keys, or the whole sketch.
fn max_file_bytes(rule: Admission, codec: KeyCodec) -> u64 {
    let data = match rule {
        Admission::Exact { .. } => (PENDING_PER_FILE * (codec.width() + 4)) as u64,
        Admission::Sketch { width, depth, .. } => {
            (width as u64).saturating_mul(depth as u64 * 2) + 8
        }
    };
    data.saturating_add(MAX_HEADER_BYTES as u64)
}

/// Reads the admission file `entry` of the checkpoint at `dir` (whose
/// admission is `rule`, keys of `codec`) and checks all of it.
fn read_state(
    dir: &Path,
    entry: &AdmissionFile,
    rule: Admission,
    codec: KeyCodec,
) -> Result<AdmissionState> {
    let path = dir.join(&entry.file);
    let bytes = files::read_checked(&path, entry.bytes, entry.crc32, max_file_bytes(rule, codec))?;
    let file = files::parse(&path, &bytes)?;
    files::check_tensor_count(&file, &path, 2)?;
    let n = usize::try_from(entry.entries).map_err(|_| corrupt(&path, "too many entries"))?;
    match rule {
        Admission::Exact { .. } => {
            let keys = codec.decode(files::tensor(&file, &path, "keys", codec.dtype(), &[n])?);
            let counts: Vec<u32> = files::tensor(&file, &path, "counts", Dtype::U32, &[n])?
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            if let Some(i) = counts.iter().position(|&c| c == 0) {
                return Err(corrupt(
                    &path,
                    format!("pending key {} has a count of 0", keys[i]),
                ));
            }
            Ok(AdmissionState::Exact { keys, counts })
        }
        Admission::Sketch { width, depth, .. } => {
            let counters = files::tensor(&file, &path, "counters", Dtype::U16, &[depth, width])?
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes(c.try_into().expect("2 bytes")))
                .collect();
            let reads = files::tensor(&file, &path, "reads", Dtype::U64, &[1])?;
            let reads = u64::from_le_bytes(reads.try_into().expect("8 bytes"));
            Ok(AdmissionState::Sketch {
                width,
                depth,
                counters,
                reads,
            })
        }
    }
}

/// Calls `state` with each admission file's state (read and checked) of
/// the checkpoint at `dir`, if `admitter` is to take it: nothing for a
/// variable without admission or a checkpoint without state.
fn for_each_state(
    dir: &Path,
    manifest: &Manifest,
    admitter: Option<&Admitter>,
    codec: KeyCodec,
    mut state: impl FnMut(&Admitter, AdmissionState) -> Result<()>,
) -> Result<()> {
    let (Some(admitter), Some(entry)) = (admitter, &manifest.admission) else {
        return Ok(());
    };
    let rule = entry
        .rule()
        .ok_or_else(|| corrupt(dir, "admission rule unreadable"))?;
    for file in &entry.files {
        state(admitter, read_state(dir, file, rule, codec)?)?;
    }
    Ok(())
}

/// Checks every admission file the variable with counters `admitter`
/// would take from the checkpoint at `dir`, changing nothing: each file
/// readable, its tensors of the right dtypes and shapes, and not a hard
/// link to another file of the checkpoint.
pub(crate) fn verify(
    dir: &Path,
    manifest: &Manifest,
    admitter: Option<&Admitter>,
    codec: KeyCodec,
) -> Result<()> {
    if let (Some(_), Some(entry)) = (admitter, &manifest.admission) {
        check_no_links(dir, manifest, entry)?;
    }
    for_each_state(dir, manifest, admitter, codec, |_, _| Ok(()))
}

/// Checks that no admission file is the same file as another file of the
/// checkpoint (a hard link).
fn check_no_links(dir: &Path, manifest: &Manifest, entry: &AdmissionEntry) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let names = manifest
        .files
        .iter()
        .map(|f| &f.file)
        .chain(entry.files.iter().map(|f| &f.file));
    let mut seen = HashMap::new();
    for name in names {
        let path = dir.join(name);
        let meta = std::fs::metadata(&path).map_err(|e| io_error(&path, &e))?;
        if let Some(other) = seen.insert((meta.dev(), meta.ino()), name) {
            return Err(corrupt(
                &path,
                format!("is the same file as {other} (a hard link)"),
            ));
        }
    }
    Ok(())
}

/// Puts the admission state of the verified checkpoint at `dir` into
/// `admitter`: in place of its counts (`replace`: restore; a checkpoint
/// without state clears them) or merged into them (load: each pending key
/// keeps the larger count, each sketch counter the larger value).
pub(crate) fn apply(
    dir: &Path,
    manifest: &Manifest,
    admitter: Option<&Admitter>,
    codec: KeyCodec,
    replace: bool,
) -> Result<()> {
    let Some(own) = admitter else {
        return Ok(());
    };
    let files = manifest.admission.as_ref().map_or(0, |e| e.files.len());
    if replace && files == 0 {
        own.clear();
    }
    // The first file replaces the counts, the next ones add to them.
    let mut replace_next = replace;
    for_each_state(dir, manifest, admitter, codec, |admitter, state| {
        if std::mem::take(&mut replace_next) {
            admitter.set_state(state)
        } else {
            admitter.merge_state(&state)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Variable;
    use std::path::PathBuf;

    fn variable(admission: Option<Admission>) -> Variable<i64> {
        let builder = Variable::<i64>::builder("t").dim(2).shards(2);
        match admission {
            Some(a) => builder.admission(a),
            None => builder,
        }
        .build()
        .unwrap()
    }

    const EXACT3: Admission = Admission::Exact { min_count: 3 };
    const SKETCH3: Admission = Admission::Sketch {
        min_count: 3,
        width: 256,
        depth: 3,
    };

    fn admitter(var: &Variable<i64>) -> &Admitter {
        var.admitter().expect("a variable with admission")
    }

    /// The exact state, sorted by key.
    fn pending(var: &Variable<i64>) -> Vec<(u64, u32)> {
        let AdmissionState::Exact { keys, counts } = admitter(var).state() else {
            panic!("exact counts")
        };
        let mut pairs: Vec<(u64, u32)> = keys.into_iter().zip(counts).collect();
        pairs.sort_unstable();
        pairs
    }

    /// Reads `key` `times` times (as training reads do), through the
    /// admitter itself.
    fn read(var: &Variable<i64>, key: i64, times: usize) {
        for _ in 0..times {
            admitter(var).count(key as u64);
        }
    }

    /// A checkpoint of a variable holding two rows and admission counts
    /// `admission`, each key `k` of `reads` read that many times.
    fn saved(dir: &Path, admission: Option<Admission>, reads: &[(i64, usize)]) -> PathBuf {
        let var = variable(admission);
        var.upsert(&[100, 200], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        for &(key, times) in reads {
            read(&var, key, times);
        }
        let path = dir.join("ckpt");
        var.save(&path).unwrap();
        path
    }

    fn manifest(path: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path.join("index.json")).unwrap()).unwrap()
    }

    fn write_manifest(path: &Path, value: &serde_json::Value) {
        std::fs::write(path.join("index.json"), serde_json::to_vec(value).unwrap()).unwrap();
    }

    #[test]
    fn exact_counts_survive_save_and_restore() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path(), Some(EXACT3), &[(1, 2), (2, 1), (-5, 2), (3, 3)]);
        let index = manifest(&path);
        assert_eq!(index["admission"]["kind"], "exact");
        assert_eq!(index["admission"]["min_count"], 3);
        assert_eq!(index["admission"]["files"][0]["entries"], 3);
        let var = variable(Some(EXACT3));
        read(&var, 9, 1);
        var.restore(&path).unwrap();
        assert_eq!(var.size(), 2);
        assert_eq!(pending(&var), [(1, 2), (2, 1), (-5_i64 as u64, 2)]);
        assert!(admitter(&var).count(1), "the third read admits");
    }

    #[test]
    fn load_keeps_the_larger_count_and_restore_without_state_clears() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(
            dir.path(),
            Some(Admission::Exact { min_count: 5 }),
            &[(1, 2), (2, 1)],
        );
        let var = variable(Some(Admission::Exact { min_count: 5 }));
        read(&var, 1, 1);
        read(&var, 2, 3);
        read(&var, 7, 1);
        var.load(&path).unwrap();
        assert_eq!(pending(&var), [(1, 2), (2, 3), (7, 1)]);
        var.load(&path).unwrap();
        assert_eq!(pending(&var), [(1, 2), (2, 3), (7, 1)], "loading twice");

        let plain = saved(&dir.path().join("plain"), None, &[]);
        assert!(manifest(&plain).get("admission").is_none());
        var.load(&plain).unwrap();
        assert_eq!(
            pending(&var).len(),
            3,
            "load without state keeps the counts"
        );
        var.restore(&plain).unwrap();
        assert!(
            pending(&var).is_empty(),
            "restore without state clears them"
        );
    }

    #[test]
    fn a_smaller_min_count_admits_at_the_next_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(
            dir.path(),
            Some(Admission::Exact { min_count: 9 }),
            &[(1, 6)],
        );
        let var = variable(Some(EXACT3));
        var.restore(&path).unwrap();
        assert_eq!(pending(&var), [(1, 2)]);
        assert!(admitter(&var).count(1));
    }

    #[test]
    fn a_sketch_survives_save_and_restore() {
        let dir = tempfile::tempdir().unwrap();
        let var = variable(Some(SKETCH3));
        read(&var, 1, 2);
        read(&var, 2, 1);
        let path = dir.path().join("ckpt");
        var.save(&path).unwrap();
        let index = manifest(&path);
        assert_eq!(index["admission"]["kind"], "sketch");
        assert_eq!(index["admission"]["width"], 256);
        assert_eq!(index["admission"]["depth"], 3);
        let state = admitter(&var).state();

        let fresh = variable(Some(SKETCH3));
        fresh.restore(&path).unwrap();
        assert_eq!(admitter(&fresh).state(), state);
        assert!(!admitter(&fresh).admits(1));
        assert!(admitter(&fresh).count(1), "the third read admits");

        // Load takes the larger counter.
        let other = variable(Some(SKETCH3));
        read(&other, 3, 2);
        other.load(&path).unwrap();
        let AdmissionState::Sketch { counters: mine, .. } = admitter(&other).state() else {
            unreachable!()
        };
        let AdmissionState::Sketch {
            counters: saved, ..
        } = state
        else {
            unreachable!()
        };
        assert!(mine.iter().zip(&saved).all(|(m, s)| m >= s));
        assert!(admitter(&other).count(3), "its own counts stay");
    }

    #[test]
    fn another_kind_or_shape_is_a_mismatch_that_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let exact = saved(&dir.path().join("e"), Some(EXACT3), &[(1, 2)]);
        let sketch = saved(&dir.path().join("s"), Some(SKETCH3), &[(1, 2)]);
        let cases = [
            (exact.clone(), SKETCH3),
            (sketch.clone(), EXACT3),
            (
                sketch.clone(),
                Admission::Sketch {
                    min_count: 3,
                    width: 128,
                    depth: 3,
                },
            ),
            (
                sketch,
                Admission::Sketch {
                    min_count: 3,
                    width: 256,
                    depth: 4,
                },
            ),
        ];
        for (path, rule) in cases {
            let var = variable(Some(rule));
            var.upsert(&[7], &[7.0, 7.0]).unwrap();
            read(&var, 8, 1);
            let before = admitter(&var).state();
            for replace in [true, false] {
                let result = if replace {
                    var.restore(&path)
                } else {
                    var.load(&path)
                };
                let err = result.unwrap_err();
                assert!(matches!(err, Error::Mismatch { .. }), "{rule:?}: {err}");
                assert_eq!(var.size(), 1);
                assert_eq!(admitter(&var).state(), before);
            }
        }
        // A variable without admission ignores the state, without reading
        // its files.
        let var = variable(None);
        std::fs::write(exact.join("admission-00000.safetensors"), b"garbage").unwrap();
        var.restore(&exact).unwrap();
        assert_eq!(var.size(), 2);
        let err = variable(Some(EXACT3)).restore(&exact).unwrap_err();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
    }

    /// Rewrites the admission file of the checkpoint at `path` as
    /// `tensors` and fixes its size and checksum in `index.json`.
    fn rewrite(path: &Path, tensors: Tensors<'_>, entries: u64) {
        let file = path.join("admission-00000.safetensors");
        let bytes = encode(&file, tensors).unwrap();
        std::fs::write(&file, &bytes).unwrap();
        let mut index = manifest(path);
        let entry = &mut index["admission"]["files"][0];
        entry["bytes"] = bytes.len().into();
        entry["crc32"] = crc32fast::hash(&bytes).into();
        entry["entries"] = entries.into();
        write_manifest(path, &index);
    }

    #[test]
    fn damaged_admission_state_is_an_error_that_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<u8> = [1_i64, 2].iter().flat_map(|k| k.to_le_bytes()).collect();
        let counts: Vec<u8> = [1_u32, 0].iter().flat_map(|c| c.to_le_bytes()).collect();
        let wide: Vec<u8> = [1_u64, 2].iter().flat_map(|c| c.to_le_bytes()).collect();
        type Damage = Box<dyn Fn(&Path)>;
        let damages: Vec<(&str, Damage)> = vec![
            (
                "zero count",
                Box::new(move |p: &Path| {
                    rewrite(
                        p,
                        vec![
                            ("keys", Dtype::I64, vec![2], &keys),
                            ("counts", Dtype::U32, vec![2], &counts),
                        ],
                        2,
                    )
                }),
            ),
            (
                "counts of another dtype",
                Box::new(move |p: &Path| {
                    rewrite(
                        p,
                        vec![
                            ("keys", Dtype::I64, vec![2], &wide),
                            ("counts", Dtype::U64, vec![2], &wide),
                        ],
                        2,
                    )
                }),
            ),
            (
                "entries not as index.json says",
                Box::new(|p: &Path| {
                    let mut index = manifest(p);
                    index["admission"]["files"][0]["entries"] = 1.into();
                    write_manifest(p, &index);
                }),
            ),
            (
                "truncated",
                Box::new(|p: &Path| {
                    let file = p.join("admission-00000.safetensors");
                    let bytes = std::fs::read(&file).unwrap();
                    std::fs::write(&file, &bytes[..bytes.len() - 1]).unwrap();
                }),
            ),
            (
                "flipped byte",
                Box::new(|p: &Path| {
                    let file = p.join("admission-00000.safetensors");
                    let mut bytes = std::fs::read(&file).unwrap();
                    let last = bytes.len() - 1;
                    bytes[last] ^= 1;
                    std::fs::write(&file, &bytes).unwrap();
                }),
            ),
            (
                "missing",
                Box::new(|p: &Path| {
                    std::fs::remove_file(p.join("admission-00000.safetensors")).unwrap()
                }),
            ),
            (
                "unknown kind",
                Box::new(|p: &Path| {
                    let mut index = manifest(p);
                    index["admission"]["kind"] = "bloom".into();
                    write_manifest(p, &index);
                }),
            ),
            (
                "zero min_count",
                Box::new(|p: &Path| {
                    let mut index = manifest(p);
                    index["admission"]["min_count"] = 0.into();
                    write_manifest(p, &index);
                }),
            ),
            (
                "a file name outside the checkpoint",
                Box::new(|p: &Path| {
                    let mut index = manifest(p);
                    index["admission"]["files"][0]["file"] = "../admission-0.safetensors".into();
                    write_manifest(p, &index);
                }),
            ),
            (
                "a data file listed as admission state",
                Box::new(|p: &Path| {
                    let mut index = manifest(p);
                    let data = index["files"][0]["file"].clone();
                    index["admission"]["files"][0]["file"] = data;
                    write_manifest(p, &index);
                }),
            ),
            (
                "too many pending keys for one file",
                Box::new(|p: &Path| {
                    let mut index = manifest(p);
                    index["admission"]["files"][0]["entries"] =
                        (PENDING_PER_FILE as u64 + 1).into();
                    write_manifest(p, &index);
                }),
            ),
            (
                "an unknown field",
                Box::new(|p: &Path| {
                    let mut index = manifest(p);
                    index["admission"]["decay"] = 1.into();
                    write_manifest(p, &index);
                }),
            ),
            (
                "a hard link to a data file",
                Box::new(|p: &Path| {
                    let index = manifest(p);
                    let data = p.join(index["files"][0]["file"].as_str().unwrap());
                    let file = p.join("admission-00000.safetensors");
                    std::fs::remove_file(&file).unwrap();
                    std::fs::hard_link(data, file).unwrap();
                }),
            ),
        ];
        for (i, (what, damage)) in damages.iter().enumerate() {
            let path = saved(
                &dir.path().join(i.to_string()),
                Some(EXACT3),
                &[(1, 2), (2, 1)],
            );
            damage(&path);
            let var = variable(Some(EXACT3));
            var.upsert(&[7], &[7.0, 7.0]).unwrap();
            read(&var, 8, 2);
            for replace in [true, false] {
                let result = if replace {
                    var.restore(&path)
                } else {
                    var.load(&path)
                };
                let err = result.expect_err(what);
                assert!(
                    matches!(err, Error::Checkpoint { .. } | Error::Io { .. }),
                    "{what}: {err}"
                );
                assert_eq!(var.size(), 1, "{what}");
                assert_eq!(pending(&var), [(8, 2)], "{what}");
            }
        }
    }

    #[test]
    fn damaged_sketch_state_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let small = vec![0_u8; 2 * 256 * 2];
        let reads = 0_u64.to_le_bytes();
        let counters = vec![0_u8; 2 * 256 * 3];
        let damages: Vec<(&str, Tensors<'_>, u64)> = vec![
            (
                "counters of another shape",
                vec![
                    ("counters", Dtype::U16, vec![2, 256], &small),
                    ("reads", Dtype::U64, vec![1], &reads),
                ],
                256 * 3,
            ),
            (
                "no reads",
                vec![("counters", Dtype::U16, vec![3, 256], &counters)],
                256 * 3,
            ),
            (
                "an extra tensor",
                vec![
                    ("counters", Dtype::U16, vec![3, 256], &counters),
                    ("reads", Dtype::U64, vec![1], &reads),
                    ("more", Dtype::U64, vec![1], &reads),
                ],
                256 * 3,
            ),
            (
                "entries not the sketch's size",
                vec![
                    ("counters", Dtype::U16, vec![3, 256], &counters),
                    ("reads", Dtype::U64, vec![1], &reads),
                ],
                256 * 2,
            ),
        ];
        for (i, (what, tensors, entries)) in damages.into_iter().enumerate() {
            let path = saved(&dir.path().join(i.to_string()), Some(SKETCH3), &[(1, 2)]);
            rewrite(&path, tensors, entries);
            let var = variable(Some(SKETCH3));
            read(&var, 8, 2);
            let before = admitter(&var).state();
            let err = var.restore(&path).expect_err(what);
            assert!(matches!(err, Error::Checkpoint { .. }), "{what}: {err}");
            assert_eq!(admitter(&var).state(), before, "{what}");
        }
    }

    #[test]
    fn many_pending_keys_take_several_files() {
        let n = PENDING_PER_FILE + 10;
        let var = Variable::<u64>::builder("t")
            .dim(1)
            .admission(Admission::Exact { min_count: 4 })
            .capacity(2 * n)
            .build()
            .unwrap();
        let keys: Vec<u64> = (0..n as u64).collect();
        let counts: Vec<u32> = keys.iter().map(|k| 1 + (k % 3) as u32).collect();
        let admitter = var.admitter().unwrap();
        admitter
            .set_state(AdmissionState::Exact {
                keys: keys.clone(),
                counts: counts.clone(),
            })
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt");
        var.save(&path).unwrap();
        let index = manifest(&path);
        let files = index["admission"]["files"].as_array().unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0]["entries"], PENDING_PER_FILE);
        assert_eq!(files[1]["entries"], 10);
        admitter.clear();
        var.restore(&path).unwrap();
        let AdmissionState::Exact {
            keys: got_keys,
            counts: got_counts,
        } = admitter.state()
        else {
            unreachable!()
        };
        let mut got: Vec<(u64, u32)> = got_keys.into_iter().zip(got_counts).collect();
        got.sort_unstable();
        assert_eq!(got, keys.into_iter().zip(counts).collect::<Vec<_>>());
        // Saved again over itself (admission files are checkpoint files).
        var.save(&path).unwrap();
    }
}
