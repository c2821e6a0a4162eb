//! One data file of a checkpoint: a safetensors file with a `keys` tensor
//! (the key type's own dtype, shape `[rows]`), a `values` tensor (the value
//! dtype, `F32`, `F16` or `BF16`, shape `[rows, dim]`), a `slot.<name>`
//! tensor per slot column (the slot dtype, `[rows, dim]`) and, with a
//! restrict policy, a `scores` tensor (`U64`, `[rows]`), all little-endian
//! as safetensors requires. Half-precision tensors hold the stored bits
//! exactly; reading widens them to `f32`.
//!
//! Files are untrusted input: a file is read only if it is a regular file no
//! larger than its manifest entry says and no larger than a save of the
//! variable's rows could write ([`max_file_bytes`]), so memory stays bounded
//! whatever a checkpoint claims; then its size, checksum, tensors, dtypes,
//! shapes and values are checked before any row is used.

use super::manifest::{corrupt, FileEntry};
use crate::raw::kernels::first_non_finite;
use crate::{Error, Result};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// Bytes a data file aims for: files stay small so saving and loading hold
/// one file's rows at a time.
pub(crate) const TARGET_FILE_BYTES: usize = 16 << 20;

/// How keys of a given type are written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyCodec {
    dtype: Dtype,
    width: usize,
    signed: bool,
}

impl KeyCodec {
    /// The codec for a key type name (`Key::TYPE_NAME`).
    pub(crate) fn for_type(type_name: &str) -> KeyCodec {
        let (dtype, width, signed) = match type_name {
            "i64" => (Dtype::I64, 8, true),
            "u64" => (Dtype::U64, 8, false),
            "i32" => (Dtype::I32, 4, true),
            _ => (Dtype::U32, 4, false),
        };
        KeyCodec {
            dtype,
            width,
            signed,
        }
    }

    /// The safetensors dtype keys are written as.
    pub(crate) fn dtype(self) -> Dtype {
        self.dtype
    }

    /// Bytes per key.
    pub(crate) fn width(self) -> usize {
        self.width
    }

    /// Little-endian bytes of keys given as their 64-bit patterns (a view
    /// of `bits` itself for 64-bit keys on little-endian machines).
    pub(crate) fn encode(self, bits: &[u64]) -> Cow<'_, [u8]> {
        if self.width == 8 && cfg!(target_endian = "little") {
            return Cow::Borrowed(bytemuck::cast_slice(bits));
        }
        let mut out = Vec::with_capacity(bits.len() * self.width);
        for &b in bits {
            out.extend_from_slice(&b.to_le_bytes()[..self.width]);
        }
        Cow::Owned(out)
    }

    /// 64-bit patterns of little-endian keys (sign-extending signed 32-bit
    /// keys, as `Key::to_bits` does).
    pub(crate) fn decode(self, bytes: &[u8]) -> Vec<u64> {
        bytes
            .chunks_exact(self.width)
            .map(|c| match (self.width, self.signed) {
                (4, true) => i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64 as u64,
                (4, false) => u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes"))),
                _ => u64::from_le_bytes(c.try_into().expect("8 bytes")),
            })
            .collect()
    }
}

/// The dtypes a checkpoint stores its values and its slot rows in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FloatDtypes {
    pub values: crate::Dtype,
    pub slots: crate::Dtype,
}

/// The safetensors dtype of a stored dtype.
fn tensor_dtype(dtype: crate::Dtype) -> Dtype {
    match dtype {
        crate::Dtype::F32 => Dtype::F32,
        crate::Dtype::F16 => Dtype::F16,
        crate::Dtype::Bf16 => Dtype::BF16,
    }
}

/// Little-endian bytes of `values` as `dtype` (rounded to nearest even; a
/// view of them for `f32` on little-endian machines).
fn le_bytes(values: &[f32], dtype: crate::Dtype) -> Cow<'_, [u8]> {
    let halves = |bits: Vec<u16>| Cow::Owned(bits.iter().flat_map(|b| b.to_le_bytes()).collect());
    let zeros = || vec![0u16; values.len()];
    match dtype {
        crate::Dtype::F32 if cfg!(target_endian = "little") => {
            Cow::Borrowed(bytemuck::cast_slice(values))
        }
        crate::Dtype::F32 => Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        crate::Dtype::F16 => {
            let mut bits = zeros();
            bits.reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(values);
            halves(bits)
        }
        crate::Dtype::Bf16 => {
            let mut bits = zeros();
            bits.reinterpret_cast_mut::<bf16>()
                .convert_from_f32_slice(values);
            halves(bits)
        }
    }
}

/// `f32` values of little-endian `bytes` of `dtype`.
fn from_le_bytes(bytes: &[u8], dtype: crate::Dtype) -> Vec<f32> {
    if dtype == crate::Dtype::F32 {
        return bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
    }
    let bits: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().expect("2 bytes")))
        .collect();
    let mut out = vec![0.0; bits.len()];
    match dtype {
        crate::Dtype::F16 => bits
            .reinterpret_cast::<f16>()
            .convert_to_f32_slice(&mut out),
        _ => bits
            .reinterpret_cast::<bf16>()
            .convert_to_f32_slice(&mut out),
    }
    out
}

/// Little-endian bytes of `scores` (a view of them on little-endian
/// machines).
pub(crate) fn le_bytes_u64(scores: &[u64]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(scores))
    } else {
        Cow::Owned(scores.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// Rows per file for rows of `dim` values stored as `dtypes` with `slots`
/// slot columns, keys of `codec`, and a score if `scored`.
pub(crate) fn rows_per_file(
    dim: usize,
    dtypes: FloatDtypes,
    codec: KeyCodec,
    slots: usize,
    scored: bool,
) -> usize {
    let floats = dtypes.values.size_bytes() + slots * dtypes.slots.size_bytes();
    let row_bytes = dim * floats + codec.width + if scored { 8 } else { 0 };
    (TARGET_FILE_BYTES / row_bytes).max(1)
}

/// Room for a data file's safetensors header (tensor names, dtypes, shapes
/// and offsets as JSON, padded) beyond its rows' bytes.
pub(crate) const MAX_HEADER_BYTES: usize = 64 << 10;

/// The largest data file a save writes for rows like these (whatever their
/// dtypes: `f32` rows are the largest): the target size or one row,
/// whichever is larger, plus its header. Reading refuses larger
/// files before reading them, so a checkpoint's claims never decide how
/// much memory a restore takes.
pub(crate) fn max_file_bytes(dim: usize, codec: KeyCodec, slots: usize, scored: bool) -> u64 {
    let row_bytes = (dim as u64)
        .saturating_mul(4 * (1 + slots as u64))
        .saturating_add(codec.width as u64 + if scored { 8 } else { 0 });
    row_bytes
        .max(TARGET_FILE_BYTES as u64)
        .saturating_add(row_bytes)
        .saturating_add(MAX_HEADER_BYTES as u64)
}

/// Reads the regular file at `path` if it holds at most `max_bytes`
/// (checked before reading; a special file such as a FIFO or a device is
/// refused without being opened).
pub(crate) fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let io = |e: std::io::Error| super::io_error(path, &e);
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(corrupt(path, "not a regular file"));
    }
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > max_bytes {
        return Err(corrupt(
            path,
            format!("{len} bytes, more than the {max_bytes} expected"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(corrupt(path, "grew while being read"));
    }
    Ok(bytes)
}

/// The tensor name of a slot column.
pub(crate) fn slot_tensor(name: &str) -> String {
    format!("slot.{name}")
}

/// The rows of one data file: keys as bits, and per row `dim` values, `dim`
/// values per slot column, and a score if the checkpoint has scores.
#[derive(Debug, Default)]
pub(crate) struct FileRows {
    pub keys: Vec<u64>,
    pub values: Vec<f32>,
    /// One vector per slot column, in the manifest's slot order.
    pub slots: Vec<Vec<f32>>,
    pub scores: Option<Vec<u64>>,
}

/// The bytes of a data file holding `rows` (`slot_names[i]` names
/// `rows.slots[i]`); an [`Error::InvalidArgument`] naming `path`, never a
/// panic, if safetensors cannot write them (a header over its limit).
pub(crate) fn encode(
    path: &Path,
    codec: KeyCodec,
    dtypes: FloatDtypes,
    rows: &FileRows,
    slot_names: &[String],
    dim: usize,
) -> Result<Vec<u8>> {
    let unwritable = |e: safetensors::SafeTensorError| {
        Error::InvalidArgument(format!(
            "checkpoint file {} cannot be written: {e}",
            path.display()
        ))
    };
    let n = rows.keys.len();
    let key_bytes = codec.encode(&rows.keys);
    let value_bytes = le_bytes(&rows.values, dtypes.values);
    let slot_bytes: Vec<Cow<'_, [u8]>> = rows
        .slots
        .iter()
        .map(|s| le_bytes(s, dtypes.slots))
        .collect();
    let score_bytes = rows.scores.as_deref().map(le_bytes_u64);
    let view = |dtype, shape, bytes| TensorView::new(dtype, shape, bytes).map_err(unwritable);
    let mut tensors = vec![
        ("keys".to_string(), view(codec.dtype, vec![n], &key_bytes)?),
        (
            "values".to_string(),
            view(tensor_dtype(dtypes.values), vec![n, dim], &value_bytes)?,
        ),
    ];
    for (name, bytes) in slot_names.iter().zip(&slot_bytes) {
        let dtype = tensor_dtype(dtypes.slots);
        tensors.push((slot_tensor(name), view(dtype, vec![n, dim], bytes)?));
    }
    if let Some(bytes) = &score_bytes {
        tensors.push(("scores".to_string(), view(Dtype::U64, vec![n], bytes)?));
    }
    let metadata = HashMap::from([("writer".to_string(), "dynemb".to_string())]);
    safetensors::serialize(tensors, Some(metadata)).map_err(unwritable)
}

/// Reads a data file and checks it against its manifest entry (size,
/// checksum, tensor names, dtypes and shapes, finite values); returns its
/// rows, with the slot columns named `slot_names` and scores if `scored`,
/// values and slot rows stored as `dtypes` and widened to `f32`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_verified(
    dir: &Path,
    entry: &FileEntry,
    codec: KeyCodec,
    dtypes: FloatDtypes,
    dim: usize,
    slot_names: &[String],
    scored: bool,
    max_bytes: u64,
) -> Result<FileRows> {
    let path = dir.join(&entry.file);
    let bytes = read_checked(&path, entry.bytes, entry.crc32, max_bytes)?;
    let file = parse(&path, &bytes)?;
    let checked =
        |name: &str, dtype: Dtype, shape: &[usize]| tensor(&file, &path, name, dtype, shape);
    let floats = |name: &str, dtype: crate::Dtype| -> Result<Vec<f32>> {
        let bytes = checked(name, tensor_dtype(dtype), &[entry.rows, dim])?;
        let values = from_le_bytes(bytes, dtype);
        match first_non_finite(&values) {
            None => Ok(values),
            Some(i) => Err(corrupt(
                &path,
                format!("{name} {} of row {} is not finite", values[i], i / dim),
            )),
        }
    };
    let rows = FileRows {
        keys: codec.decode(checked("keys", codec.dtype, &[entry.rows])?),
        values: floats("values", dtypes.values)?,
        slots: slot_names
            .iter()
            .map(|name| floats(&slot_tensor(name), dtypes.slots))
            .collect::<Result<_>>()?,
        scores: if scored {
            let bytes = checked("scores", Dtype::U64, &[entry.rows])?;
            Some(
                bytes
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect(),
            )
        } else {
            None
        },
    };
    check_tensor_count(&file, &path, 2 + slot_names.len() + usize::from(scored))?;
    Ok(rows)
}

/// Reads the checkpoint file at `path` and checks it against what
/// `index.json` says of it (`bytes` long, CRC-32 `crc32`): read only if it
/// is a regular file of at most `bytes`, and `bytes` is at most
/// `max_bytes`, the most a save of this table writes.
pub(crate) fn read_checked(path: &Path, bytes: u64, crc32: u32, max_bytes: u64) -> Result<Vec<u8>> {
    if bytes > max_bytes {
        return Err(corrupt(
            path,
            format!(
                "index.json says {bytes} bytes, more than the {max_bytes} a checkpoint file of this variable can have"
            ),
        ));
    }
    let read = read_bounded(path, bytes)?;
    if read.len() as u64 != bytes {
        return Err(corrupt(
            path,
            format!("{} bytes, index.json says {bytes} (truncated?)", read.len()),
        ));
    }
    let crc = crc32fast::hash(&read);
    if crc != crc32 {
        return Err(corrupt(
            path,
            format!("checksum {crc:#010x}, index.json says {crc32:#010x}"),
        ));
    }
    Ok(read)
}

/// The safetensors file in `bytes` (read from `path`).
pub(crate) fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes)
        .map_err(|e| corrupt(path, format!("not a safetensors file: {e}")))
}

/// The bytes of tensor `name` of `file` (read from `path`), which must be
/// of `dtype` and `shape`.
pub(crate) fn tensor<'a>(
    file: &SafeTensors<'a>,
    path: &Path,
    name: &str,
    dtype: Dtype,
    shape: &[usize],
) -> Result<&'a [u8]> {
    let view = file
        .tensor(name)
        .map_err(|_| corrupt(path, format!("no {name:?} tensor")))?;
    if view.dtype() != dtype || view.shape() != shape {
        return Err(corrupt(
            path,
            format!(
                "tensor {name:?} is {:?} {:?}, expected {dtype:?} {shape:?}",
                view.dtype(),
                view.shape()
            ),
        ));
    }
    Ok(view.data())
}

/// Checks that `file` (read from `path`) holds `expected` tensors.
pub(crate) fn check_tensor_count(
    file: &SafeTensors<'_>,
    path: &Path,
    expected: usize,
) -> Result<()> {
    if file.len() != expected {
        return Err(corrupt(
            path,
            format!("{} tensors, expected {expected}", file.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_over_the_safetensors_limit_is_an_error() {
        let rows = FileRows {
            keys: vec![1],
            values: vec![0.0; 2],
            slots: vec![vec![0.0; 2]],
            scores: None,
        };
        let path = Path::new("shard-00000-00000.safetensors");
        let codec = KeyCodec::for_type("i64");
        let huge = ["z".repeat(100_000_001)];
        let dtypes = FloatDtypes::default();
        let err = encode(path, codec, dtypes, &rows, &huge, 2).unwrap_err();
        assert!(err.to_string().contains("shard-00000-00000"), "{err}");
        assert!(encode(path, codec, dtypes, &rows, &["m".to_string()], 2).is_ok());
    }

    #[test]
    fn key_codecs_round_trip_every_width_and_sign() {
        for (name, bits) in [
            ("i64", vec![0, 1, u64::MAX, i64::MIN as u64]),
            ("u64", vec![0, 1, u64::MAX, 1 << 63]),
            (
                "i32",
                vec![0, -1i64 as u64, i32::MIN as i64 as u64, i32::MAX as u64],
            ),
            ("u32", vec![0, 1, u64::from(u32::MAX)]),
        ] {
            let codec = KeyCodec::for_type(name);
            let bytes = codec.encode(&bits);
            assert_eq!(bytes.len(), bits.len() * codec.width, "{name}");
            assert_eq!(codec.decode(&bytes), bits, "{name}");
            let portable: Vec<u8> = bits
                .iter()
                .flat_map(|b| b.to_le_bytes()[..codec.width].to_vec())
                .collect();
            assert_eq!(&*bytes, &portable[..], "{name}: little-endian");
        }
    }

    #[test]
    fn files_aim_at_the_target_size() {
        let codec = KeyCodec::for_type("i64");
        let f32s = FloatDtypes::default();
        assert_eq!(
            rows_per_file(64, f32s, codec, 0, false),
            TARGET_FILE_BYTES / 264
        );
        assert_eq!(
            rows_per_file(64, f32s, codec, 2, true),
            TARGET_FILE_BYTES / 784
        );
        assert_eq!(rows_per_file(1 << 30, f32s, codec, 0, false), 1);
        let halves = FloatDtypes {
            values: crate::Dtype::Bf16,
            slots: crate::Dtype::F16,
        };
        assert_eq!(
            rows_per_file(64, halves, codec, 2, true),
            TARGET_FILE_BYTES / 400
        );
    }
}
