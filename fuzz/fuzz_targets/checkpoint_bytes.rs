//! Corrupt checkpoints: `restore` and `load` of a mutated checkpoint must
//! either fail and leave the variable exactly as it was, or succeed with
//! exactly the contents an independent reading of the checkpoint gives,
//! and never panic, hang or allocate much.
//!
//! A few small checkpoints (every key type, 1 to 3 shards, with and
//! without slot columns and frequency or timestamp scores, one empty) are
//! saved once per process. Each input picks one, applies a list of
//! mutations to its files in memory and writes them to a scratch
//! directory: byte flips, truncation, extension and overwrites of any file;
//! fields of `index.json` replaced with fuzzer-chosen JSON values (rows,
//! bytes, crc32, dim, rows_per_file, file and slot names, scores, ...),
//! removed, added, entries duplicated or dropped; the safetensors files
//! rewritten at the tensor level (keys, values, slot rows and scores set,
//! tensors dropped, renamed, re-typed, re-shaped, rows dropped) or their
//! JSON header edited in place; files replaced by directories or symlinks;
//! and an entry's `bytes`, `crc32` (and `rows`) recomputed from the mutated
//! file, so corruption gets past the checksum to the parsers and checks
//! behind it.
//!
//! The variable it is read into has the checkpoint's settings or another
//! key type, dim, shard count, restrict policy or a conflicting slot, and
//! may hold rows already. The oracle reads the checkpoint as its format
//! documents it (a lenient reader: every reading it accepts is one the
//! format allows) and computes the state `restore` (clear, then insert) or
//! `load` (upsert) must give.

#![no_main]

use arbitrary::Arbitrary;
use dynemb::{Key, RestrictPolicy, Variable, MAX_SLOTS};
use dynemb_fuzz::{small_row, FuzzKey};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Most mutations per input.
const MAX_MUTATIONS: usize = 12;

// ------------------------------------------------------------ base checkpoints

/// A saved checkpoint and the settings of the variable it came from.
struct Base {
    key_type: &'static str,
    dim: usize,
    shards: usize,
    policy: Option<RestrictPolicy>,
    slots: Vec<(&'static str, f32)>,
    /// File name -> bytes, `index.json` included.
    files: BTreeMap<String, Vec<u8>>,
}

struct BaseSpec {
    key_type: &'static str,
    dim: usize,
    shards: usize,
    policy: Option<RestrictPolicy>,
    slots: &'static [(&'static str, f32)],
    rows: usize,
}

const SPECS: [BaseSpec; 4] = [
    BaseSpec {
        key_type: "i64",
        dim: 3,
        shards: 2,
        policy: Some(RestrictPolicy::Frequency),
        slots: &[("m", 0.5)],
        rows: 10,
    },
    BaseSpec {
        key_type: "u32",
        dim: 1,
        shards: 1,
        policy: Some(RestrictPolicy::Timestamp),
        slots: &[("m", 0.0), ("v", 1.0)],
        rows: 6,
    },
    BaseSpec {
        key_type: "i32",
        dim: 2,
        shards: 3,
        policy: None,
        slots: &[],
        rows: 5,
    },
    BaseSpec {
        key_type: "u64",
        dim: 4,
        shards: 1,
        policy: Some(RestrictPolicy::Frequency),
        slots: &[("acc", -1.0)],
        rows: 0,
    },
];

fn builder<K: Key>(
    dim: usize,
    shards: usize,
    policy: Option<RestrictPolicy>,
) -> dynemb::VariableBuilder<K> {
    let b = Variable::<K>::builder("ckpt")
        .dim(dim)
        .shards(shards)
        .init_size(1);
    match policy {
        Some(p) => b.restrict_policy(p),
        None => b,
    }
}

fn save_base<K: FuzzKey>(spec: &BaseSpec, root: &Path, n: usize) -> Base {
    let var = builder::<K>(spec.dim, spec.shards, spec.policy)
        .build()
        .expect("base variable");
    let ids: Vec<_> = spec
        .slots
        .iter()
        .map(|&(name, initial)| var.create_slot(name, initial).expect("base slot"))
        .collect();
    for i in 0..spec.rows {
        let key = K::nth(i);
        var.upsert(&[key], &small_row(i as i8, 0, spec.dim))
            .expect("base upsert");
        // Varying scores: key i is written i more times.
        for j in 0..i {
            var.update_rows(&[key], &ids, |_, values, slots| {
                values[0] += 1.0;
                for (c, s) in slots.iter_mut().enumerate() {
                    *s += (j + c) as f32;
                }
            })
            .expect("base update");
        }
    }
    let dir = root.join(format!("base{n}"));
    var.save(&dir).expect("base save");
    let files = std::fs::read_dir(&dir)
        .expect("read base")
        .map(|e| {
            let e = e.expect("entry");
            let name = e.file_name().into_string().expect("utf-8 name");
            (name, std::fs::read(e.path()).expect("read base file"))
        })
        .collect();
    Base {
        key_type: K::TYPE_NAME,
        dim: spec.dim,
        shards: spec.shards,
        policy: spec.policy,
        slots: spec.slots.to_vec(),
        files,
    }
}

struct World {
    bases: Vec<Base>,
    /// The scratch directory the mutated checkpoint is written to.
    scratch: PathBuf,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let tmp = std::env::temp_dir();
        // Scratch directories of earlier processes that are gone.
        for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("dynemb-fuzz-ckpt-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let root = tmp.join(format!("dynemb-fuzz-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("scratch root");
        let bases = SPECS
            .iter()
            .enumerate()
            .map(|(n, spec)| match spec.key_type {
                "i64" => save_base::<i64>(spec, &root, n),
                "u64" => save_base::<u64>(spec, &root, n),
                "i32" => save_base::<i32>(spec, &root, n),
                _ => save_base::<u32>(spec, &root, n),
            })
            .collect();
        World {
            bases,
            scratch: root.join("ckpt"),
        }
    })
}

// ------------------------------------------------------------ input

#[derive(Arbitrary, Debug)]
struct Input {
    base: u8,
    target: Target,
    /// `load` (upsert) instead of `restore`.
    load: bool,
    mutations: Vec<Mutation>,
}

#[derive(Arbitrary, Debug)]
struct Target {
    /// 240 and above: another key type (i64, u64, i32, u32 by `% 4`) than
    /// the checkpoint's.
    key_type: u8,
    /// 240 and above: another dim (1 to 5).
    dim: u8,
    shards: u8,
    /// 224 and above: another restrict policy (none, frequency, timestamp
    /// by `% 3`).
    policy: u8,
    /// Slots the variable has before: (name choice, initial).
    slots: Vec<(u8, i8)>,
    /// Rows it holds before: (key index, value seed).
    rows: Vec<(u8, i8)>,
}

#[derive(Arbitrary, Debug, Clone)]
enum JsonVal {
    Small(u8),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(StrVal),
    Null,
    Bool(bool),
    EmptyArray,
    EmptyObject,
    /// The field's value plus or minus a little (numbers only).
    Nudge(i8),
}

#[derive(Arbitrary, Debug, Clone)]
enum StrVal {
    Pick(u8),
    Own(String),
}

/// Interesting strings for JSON fields.
const STRINGS: [&str; 22] = [
    "",
    "i64",
    "u64",
    "i32",
    "u32",
    "timestamp",
    "frequency",
    "dynemb-checkpoint",
    "index.json",
    "shard-00000-00000.safetensors",
    "shard-00001-00001.safetensors",
    "shard-00002-00002.safetensors",
    "shard-00000-00001.safetensors",
    "m",
    "v",
    "acc",
    "slot.m",
    "../index.json",
    "/etc/passwd",
    ".",
    "..",
    "keys",
];

#[derive(Arbitrary, Debug, Clone, Copy)]
enum TopField {
    Format,
    Version,
    Name,
    KeyType,
    Dim,
    Shards,
    Slots,
    Scores,
    RowsPerFile,
    Rows,
    Files,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum FileField {
    File,
    Shard,
    Rows,
    Bytes,
    Crc32,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum SlotField {
    Name,
    Initial,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum TensorSel {
    Keys,
    Values,
    Scores,
    /// The `n`-th `slot.*` tensor.
    Slot(u8),
    /// The `n`-th tensor whatever it is.
    Nth(u8),
}

#[derive(Arbitrary, Debug, Clone)]
enum Mutation {
    // Bytes of any file (`file` indexes the current file list, index.json
    // included).
    Flip {
        file: u8,
        at: u16,
        xor: u8,
    },
    Truncate {
        file: u8,
        len: u16,
    },
    Extend {
        file: u8,
        bytes: Vec<u8>,
    },
    Overwrite {
        file: u8,
        at: u16,
        bytes: Vec<u8>,
    },
    Remove {
        file: u8,
    },
    /// Replaces a file by a directory of that name.
    MakeDir {
        file: u8,
    },
    /// Replaces a file by a symlink to another file, or to /dev/zero.
    Symlink {
        file: u8,
        to: Option<u8>,
    },
    /// A new file beside the others.
    AddFile {
        name: StrVal,
        bytes: Vec<u8>,
    },
    // index.json fields.
    SetTop(TopField, JsonVal),
    DropTop(TopField),
    AddUnknownTop(JsonVal),
    SetFile(u8, FileField, JsonVal),
    DropFileField(u8, FileField),
    DupFileEntry(u8),
    DropFileEntry(u8),
    SwapFileEntries(u8, u8),
    SetSlot(u8, SlotField, JsonVal),
    DupSlotEntry(u8),
    DropSlotEntry(u8),
    AddSlotEntry(StrVal, i8),
    /// Recomputes a data file's `bytes` and `crc32` in index.json (and its
    /// `rows` from its keys tensor, and the total `rows`, if `.1`).
    Fix(u8, bool),
    /// Fix of every listed file.
    FixAll(bool),
    // A data file's tensors (`file` indexes the data files), re-encoded as a
    // well-formed safetensors file.
    SetKey {
        file: u8,
        row: u8,
        key: u64,
    },
    SetFloat {
        file: u8,
        tensor: TensorSel,
        at: u16,
        bits: u32,
    },
    SetScore {
        file: u8,
        row: u8,
        score: u64,
    },
    DropTensor {
        file: u8,
        tensor: TensorSel,
    },
    RenameTensor {
        file: u8,
        tensor: TensorSel,
        name: StrVal,
    },
    RetypeTensor {
        file: u8,
        tensor: TensorSel,
        dtype: u8,
    },
    ReshapeTensor {
        file: u8,
        tensor: TensorSel,
        shape: Vec<u64>,
    },
    /// Duplicates a tensor under another name.
    CopyTensor {
        file: u8,
        tensor: TensorSel,
        name: StrVal,
    },
    /// Keeps the first `rows` rows of every tensor (consistently).
    KeepRows {
        file: u8,
        rows: u8,
    },
    /// Appends a copy of row `row` to every tensor (a duplicate key).
    DupRow {
        file: u8,
        row: u8,
    },
    /// Edits a tensor's entry in the header in place (no re-layout).
    HeaderShape {
        file: u8,
        tensor: TensorSel,
        shape: Vec<u64>,
    },
    HeaderOffsets {
        file: u8,
        tensor: TensorSel,
        begin: u64,
        end: u64,
    },
    HeaderDtype {
        file: u8,
        tensor: TensorSel,
        dtype: u8,
    },
    /// Sets the safetensors header length prefix.
    HeaderLen {
        file: u8,
        len: u64,
    },
}

const DTYPES: [&str; 9] = [
    "F32", "U64", "I64", "I32", "U32", "F16", "BOOL", "U8", "F64",
];

fn str_of(s: &StrVal) -> String {
    match s {
        StrVal::Pick(i) => STRINGS[*i as usize % STRINGS.len()].to_string(),
        StrVal::Own(s) => s.chars().filter(|&c| c != '\0').take(60).collect(),
    }
}

fn json_of(v: &JsonVal, old: Option<&Value>) -> Value {
    match v {
        JsonVal::Small(n) => json!(n),
        JsonVal::U64(n) => json!(n),
        JsonVal::I64(n) => json!(n),
        JsonVal::F64(f) if f.is_finite() => json!(f),
        JsonVal::F64(_) => json!(1.5),
        JsonVal::Str(s) => Value::String(str_of(s)),
        JsonVal::Null => Value::Null,
        JsonVal::Bool(b) => json!(b),
        JsonVal::EmptyArray => json!([]),
        JsonVal::EmptyObject => json!({}),
        JsonVal::Nudge(d) => match old.and_then(Value::as_u64) {
            Some(n) => json!(n.saturating_add_signed(*d as i64)),
            None => match old.and_then(Value::as_f64) {
                Some(f) => json!(f + *d as f64 / 4.0),
                None => json!(*d),
            },
        },
    }
}

fn top_name(f: TopField) -> &'static str {
    match f {
        TopField::Format => "format",
        TopField::Version => "version",
        TopField::Name => "name",
        TopField::KeyType => "key_type",
        TopField::Dim => "dim",
        TopField::Shards => "shards",
        TopField::Slots => "slots",
        TopField::Scores => "scores",
        TopField::RowsPerFile => "rows_per_file",
        TopField::Rows => "rows",
        TopField::Files => "files",
    }
}

fn file_field(f: FileField) -> &'static str {
    match f {
        FileField::File => "file",
        FileField::Shard => "shard",
        FileField::Rows => "rows",
        FileField::Bytes => "bytes",
        FileField::Crc32 => "crc32",
    }
}

fn slot_field(f: SlotField) -> &'static str {
    match f {
        SlotField::Name => "name",
        SlotField::Initial => "initial",
    }
}

// ------------------------------------------------------------ safetensors

#[derive(Clone, Debug)]
struct Tensor {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    data: Vec<u8>,
}

fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "U64" | "I64" => 8,
        "F32" | "U32" | "I32" => 4,
        "F16" | "BF16" | "U16" | "I16" => 2,
        "BOOL" | "U8" | "I8" => 1,
        _ => return None,
    })
}

/// The header (as JSON) and data section of a safetensors file.
fn st_split(bytes: &[u8]) -> Option<(Map<String, Value>, &[u8])> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let end = 8usize.checked_add(usize::try_from(n).ok()?)?;
    let header: Value = serde_json::from_slice(bytes.get(8..end)?).ok()?;
    Some((header.as_object()?.clone(), &bytes[end..]))
}

/// Tensors of a safetensors file in header order (lenient: offsets only
/// need to be in range and match the shape; `None` if that fails).
fn st_parse(bytes: &[u8]) -> Option<(Option<Value>, Vec<Tensor>)> {
    let (header, data) = st_split(bytes)?;
    let mut metadata = None;
    let mut tensors = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            metadata = Some(info);
            continue;
        }
        let dtype = info.get("dtype")?.as_str()?.to_string();
        let shape: Vec<u64> = info
            .get("shape")?
            .as_array()?
            .iter()
            .map(Value::as_u64)
            .collect::<Option<_>>()?;
        let offsets = info.get("data_offsets")?.as_array()?;
        if offsets.len() != 2 {
            return None;
        }
        let (b, e) = (offsets[0].as_u64()?, offsets[1].as_u64()?);
        let len = shape
            .iter()
            .try_fold(dtype_size(&dtype)?, |acc, &d| acc.checked_mul(d))?;
        if b > e || e > data.len() as u64 || e - b != len {
            return None;
        }
        tensors.push(Tensor {
            name,
            dtype,
            shape,
            data: data[b as usize..e as usize].to_vec(),
        });
    }
    Some((metadata, tensors))
}

/// A well-formed safetensors file of `tensors` (in this order).
fn st_write(metadata: &Option<Value>, tensors: &[Tensor]) -> Vec<u8> {
    let mut header = Map::new();
    if let Some(m) = metadata {
        header.insert("__metadata__".to_string(), m.clone());
    }
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + t.data.len() as u64;
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut json = serde_json::to_vec(&Value::Object(header)).expect("header");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    out
}

fn pick_tensor(tensors: &[Tensor], sel: TensorSel) -> Option<usize> {
    match sel {
        TensorSel::Keys => tensors.iter().position(|t| t.name == "keys"),
        TensorSel::Values => tensors.iter().position(|t| t.name == "values"),
        TensorSel::Scores => tensors.iter().position(|t| t.name == "scores"),
        TensorSel::Slot(n) => {
            let slots: Vec<usize> = (0..tensors.len())
                .filter(|&i| tensors[i].name.starts_with("slot."))
                .collect();
            (!slots.is_empty()).then(|| slots[n as usize % slots.len()])
        }
        TensorSel::Nth(n) => (!tensors.is_empty()).then(|| n as usize % tensors.len()),
    }
}

// ------------------------------------------------------------ mutating

struct Files {
    /// Name -> bytes, or `Dir`/`Link` specials.
    files: BTreeMap<String, Entry>,
}

#[derive(Clone)]
enum Entry {
    Bytes(Vec<u8>),
    Dir,
    Link(String),
}

impl Files {
    fn names(&self) -> Vec<String> {
        self.files.keys().cloned().collect()
    }

    fn nth(&self, i: u8) -> Option<String> {
        let names = self.names();
        (!names.is_empty()).then(|| names[i as usize % names.len()].clone())
    }

    /// The data files (not index.json).
    fn nth_data(&self, i: u8) -> Option<String> {
        let names: Vec<String> = self
            .files
            .iter()
            .filter(|(n, e)| n.as_str() != "index.json" && matches!(e, Entry::Bytes(_)))
            .map(|(n, _)| n.clone())
            .collect();
        (!names.is_empty()).then(|| names[i as usize % names.len()].clone())
    }

    fn bytes_mut(&mut self, name: &str) -> Option<&mut Vec<u8>> {
        match self.files.get_mut(name) {
            Some(Entry::Bytes(b)) => Some(b),
            _ => None,
        }
    }

    fn index(&self) -> Option<Map<String, Value>> {
        match self.files.get("index.json") {
            Some(Entry::Bytes(b)) => serde_json::from_slice::<Value>(b)
                .ok()?
                .as_object()
                .cloned(),
            _ => None,
        }
    }

    fn set_index(&mut self, index: Map<String, Value>) {
        let bytes = serde_json::to_vec_pretty(&Value::Object(index)).expect("json");
        self.files
            .insert("index.json".to_string(), Entry::Bytes(bytes));
    }

    /// Runs `f` on index.json's object (if it is one).
    fn edit_index(&mut self, f: impl FnOnce(&mut Map<String, Value>)) {
        if let Some(mut index) = self.index() {
            f(&mut index);
            self.set_index(index);
        }
    }

    /// Runs `f` on a data file's tensors and re-encodes it (if it parses).
    fn edit_tensors(&mut self, file: u8, f: impl FnOnce(&mut Vec<Tensor>)) {
        let Some(name) = self.nth_data(file) else {
            return;
        };
        let bytes = self.bytes_mut(&name).expect("data file");
        if let Some((metadata, mut tensors)) = st_parse(bytes) {
            f(&mut tensors);
            *bytes = st_write(&metadata, &tensors);
        }
    }

    /// Runs `f` on a data file's header entry of a tensor, in place.
    fn edit_header(&mut self, file: u8, sel: TensorSel, f: impl FnOnce(&mut Map<String, Value>)) {
        let Some(name) = self.nth_data(file) else {
            return;
        };
        let bytes = self.bytes_mut(&name).expect("data file");
        let Some((_, tensors)) = st_parse(bytes) else {
            return;
        };
        let Some(i) = pick_tensor(&tensors, sel) else {
            return;
        };
        let Some((mut header, data)) = st_split(bytes) else {
            return;
        };
        let data = data.to_vec();
        let Some(Value::Object(entry)) = header.get_mut(&tensors[i].name) else {
            return;
        };
        f(entry);
        let mut json = serde_json::to_vec(&Value::Object(header)).expect("json");
        while !json.len().is_multiple_of(8) {
            json.push(b' ');
        }
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.extend_from_slice(&data);
        *bytes = out;
    }

    /// Recomputes a listed file's bytes and crc32 (and rows).
    fn fix(&mut self, entry: &mut Map<String, Value>, rows: bool) -> i64 {
        let Some(name) = entry
            .get("file")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return 0;
        };
        let Some(Entry::Bytes(bytes)) = self.files.get(&name) else {
            return 0;
        };
        entry.insert("bytes".to_string(), json!(bytes.len()));
        entry.insert("crc32".to_string(), json!(crc32fast::hash(bytes)));
        if !rows {
            return 0;
        }
        let Some((_, tensors)) = st_parse(bytes) else {
            return 0;
        };
        let Some(keys) = tensors.iter().find(|t| t.name == "keys") else {
            return 0;
        };
        let Some(&n) = keys.shape.first() else {
            return 0;
        };
        let old = entry.get("rows").and_then(Value::as_u64).unwrap_or(0);
        entry.insert("rows".to_string(), json!(n));
        n as i64 - old as i64
    }

    fn fix_files(&mut self, which: Option<u8>, rows: bool) {
        let Some(mut index) = self.index() else {
            return;
        };
        let Some(Value::Array(mut entries)) = index.get("files").cloned() else {
            return;
        };
        let mut delta = 0i64;
        let n = entries.len();
        for (i, e) in entries.iter_mut().enumerate() {
            if which.is_some_and(|w| w as usize % n.max(1) != i) {
                continue;
            }
            if let Value::Object(entry) = e {
                delta += self.fix(entry, rows);
            }
        }
        index.insert("files".to_string(), Value::Array(entries));
        if rows && delta != 0 {
            if let Some(total) = index.get("rows").and_then(Value::as_u64) {
                index.insert(
                    "rows".to_string(),
                    json!(total.saturating_add_signed(delta)),
                );
            }
        }
        self.set_index(index);
    }

    fn apply(&mut self, m: &Mutation) {
        let index_entries = |index: &mut Map<String, Value>, key: &str| -> Option<Vec<Value>> {
            index.get(key).and_then(Value::as_array).cloned()
        };
        match m {
            Mutation::Flip { file, at, xor } => {
                if let Some(b) = self.nth(*file).and_then(|n| self.bytes_mut(&n)) {
                    if !b.is_empty() {
                        let i = *at as usize % b.len();
                        b[i] ^= xor | 1;
                    }
                }
            }
            Mutation::Truncate { file, len } => {
                if let Some(b) = self.nth(*file).and_then(|n| self.bytes_mut(&n)) {
                    let keep = *len as usize % (b.len() + 1);
                    b.truncate(keep);
                }
            }
            Mutation::Extend { file, bytes } => {
                if let Some(b) = self.nth(*file).and_then(|n| self.bytes_mut(&n)) {
                    b.extend(bytes.iter().take(4096));
                }
            }
            Mutation::Overwrite { file, at, bytes } => {
                if let Some(b) = self.nth(*file).and_then(|n| self.bytes_mut(&n)) {
                    let start = *at as usize % (b.len() + 1);
                    for (i, &x) in bytes.iter().take(4096).enumerate() {
                        match b.get_mut(start + i) {
                            Some(y) => *y = x,
                            None => b.push(x),
                        }
                    }
                }
            }
            Mutation::Remove { file } => {
                if let Some(n) = self.nth(*file) {
                    self.files.remove(&n);
                }
            }
            Mutation::MakeDir { file } => {
                if let Some(n) = self.nth(*file) {
                    self.files.insert(n, Entry::Dir);
                }
            }
            Mutation::Symlink { file, to } => {
                if let Some(n) = self.nth(*file) {
                    let target = match to {
                        Some(t) => self.nth(*t).unwrap_or_default(),
                        None => "/dev/zero".to_string(),
                    };
                    if target != n {
                        self.files.insert(n, Entry::Link(target));
                    }
                }
            }
            Mutation::AddFile { name, bytes } => {
                let name = str_of(name);
                let plain = !name.is_empty()
                    && Path::new(&name)
                        .file_name()
                        .is_some_and(|f| f == name.as_str());
                if plain && !self.files.contains_key(&name) {
                    self.files.insert(
                        name,
                        Entry::Bytes(bytes.iter().take(4096).copied().collect()),
                    );
                }
            }
            Mutation::SetTop(f, v) => self.edit_index(|index| {
                let old = index.get(top_name(*f)).cloned();
                index.insert(top_name(*f).to_string(), json_of(v, old.as_ref()));
            }),
            Mutation::DropTop(f) => self.edit_index(|index| {
                index.remove(top_name(*f));
            }),
            Mutation::AddUnknownTop(v) => self.edit_index(|index| {
                index.insert("extra".to_string(), json_of(v, None));
            }),
            Mutation::SetFile(i, f, v) => self.edit_index(|index| {
                let Some(mut entries) = index_entries(index, "files") else {
                    return;
                };
                if entries.is_empty() {
                    return;
                }
                let n = entries.len();
                if let Value::Object(e) = &mut entries[*i as usize % n] {
                    let old = e.get(file_field(*f)).cloned();
                    e.insert(file_field(*f).to_string(), json_of(v, old.as_ref()));
                }
                index.insert("files".to_string(), Value::Array(entries));
            }),
            Mutation::DropFileField(i, f) => self.edit_index(|index| {
                let Some(mut entries) = index_entries(index, "files") else {
                    return;
                };
                if entries.is_empty() {
                    return;
                }
                let n = entries.len();
                if let Value::Object(e) = &mut entries[*i as usize % n] {
                    e.remove(file_field(*f));
                }
                index.insert("files".to_string(), Value::Array(entries));
            }),
            Mutation::DupFileEntry(i) | Mutation::DropFileEntry(i) => self.edit_index(|index| {
                let Some(mut entries) = index_entries(index, "files") else {
                    return;
                };
                if entries.is_empty() {
                    return;
                }
                let at = *i as usize % entries.len();
                if matches!(m, Mutation::DupFileEntry(_)) {
                    let e = entries[at].clone();
                    entries.push(e);
                } else {
                    entries.remove(at);
                }
                index.insert("files".to_string(), Value::Array(entries));
            }),
            Mutation::SwapFileEntries(a, b) => self.edit_index(|index| {
                let Some(mut entries) = index_entries(index, "files") else {
                    return;
                };
                if entries.is_empty() {
                    return;
                }
                let n = entries.len();
                entries.swap(*a as usize % n, *b as usize % n);
                index.insert("files".to_string(), Value::Array(entries));
            }),
            Mutation::SetSlot(i, f, v) => self.edit_index(|index| {
                let Some(mut entries) = index_entries(index, "slots") else {
                    return;
                };
                if entries.is_empty() {
                    return;
                }
                let n = entries.len();
                if let Value::Object(e) = &mut entries[*i as usize % n] {
                    let old = e.get(slot_field(*f)).cloned();
                    e.insert(slot_field(*f).to_string(), json_of(v, old.as_ref()));
                }
                index.insert("slots".to_string(), Value::Array(entries));
            }),
            Mutation::DupSlotEntry(i) | Mutation::DropSlotEntry(i) => self.edit_index(|index| {
                let Some(mut entries) = index_entries(index, "slots") else {
                    return;
                };
                if entries.is_empty() {
                    return;
                }
                let at = *i as usize % entries.len();
                if matches!(m, Mutation::DupSlotEntry(_)) {
                    let e = entries[at].clone();
                    entries.push(e);
                } else {
                    entries.remove(at);
                }
                index.insert("slots".to_string(), Value::Array(entries));
            }),
            Mutation::AddSlotEntry(name, initial) => self.edit_index(|index| {
                let Some(mut entries) = index_entries(index, "slots") else {
                    return;
                };
                entries.push(json!({"name": str_of(name), "initial": *initial as f32 / 2.0}));
                index.insert("slots".to_string(), Value::Array(entries));
            }),
            Mutation::Fix(i, rows) => self.fix_files(Some(*i), *rows),
            Mutation::FixAll(rows) => self.fix_files(None, *rows),
            Mutation::SetKey { file, row, key } => self.edit_tensors(*file, |ts| {
                let Some(t) = ts.iter_mut().find(|t| t.name == "keys") else {
                    return;
                };
                let Some(w) = dtype_size(&t.dtype) else {
                    return;
                };
                let w = w as usize;
                let rows = t.data.len() / w;
                if rows == 0 {
                    return;
                }
                let at = *row as usize % rows * w;
                t.data[at..at + w].copy_from_slice(&key.to_le_bytes()[..w.min(8)]);
            }),
            Mutation::SetFloat {
                file,
                tensor,
                at,
                bits,
            } => self.edit_tensors(*file, |ts| {
                let Some(i) = pick_tensor(ts, *tensor) else {
                    return;
                };
                let n = ts[i].data.len() / 4;
                if n > 0 {
                    let at = *at as usize % n * 4;
                    ts[i].data[at..at + 4].copy_from_slice(&bits.to_le_bytes());
                }
            }),
            Mutation::SetScore { file, row, score } => self.edit_tensors(*file, |ts| {
                let Some(t) = ts.iter_mut().find(|t| t.name == "scores") else {
                    return;
                };
                let n = t.data.len() / 8;
                if n > 0 {
                    let at = *row as usize % n * 8;
                    t.data[at..at + 8].copy_from_slice(&score.to_le_bytes());
                }
            }),
            Mutation::DropTensor { file, tensor } => self.edit_tensors(*file, |ts| {
                if let Some(i) = pick_tensor(ts, *tensor) {
                    ts.remove(i);
                }
            }),
            Mutation::RenameTensor { file, tensor, name } => self.edit_tensors(*file, |ts| {
                let name = str_of(name);
                if name == "__metadata__" || ts.iter().any(|t| t.name == name) {
                    return;
                }
                if let Some(i) = pick_tensor(ts, *tensor) {
                    ts[i].name = name;
                }
            }),
            Mutation::RetypeTensor {
                file,
                tensor,
                dtype,
            } => self.edit_tensors(*file, |ts| {
                let Some(i) = pick_tensor(ts, *tensor) else {
                    return;
                };
                let dtype = DTYPES[*dtype as usize % DTYPES.len()];
                // Keeps the element count: re-sizes the data.
                let count = ts[i].shape.iter().product::<u64>();
                let size = dtype_size(dtype).expect("known dtype");
                let Some(len) = count.checked_mul(size).filter(|&l| l <= 1 << 16) else {
                    return;
                };
                ts[i].dtype = dtype.to_string();
                ts[i].data.resize(len as usize, 0);
            }),
            Mutation::ReshapeTensor {
                file,
                tensor,
                shape,
            } => self.edit_tensors(*file, |ts| {
                let Some(i) = pick_tensor(ts, *tensor) else {
                    return;
                };
                let shape: Vec<u64> = shape.iter().take(4).map(|&d| d % 64).collect();
                let size = dtype_size(&ts[i].dtype).unwrap_or(1);
                let Some(len) = shape.iter().try_fold(size, |a, &d| a.checked_mul(d)) else {
                    return;
                };
                if len > 1 << 16 {
                    return;
                }
                ts[i].shape = shape;
                ts[i].data.resize(len as usize, 0);
            }),
            Mutation::CopyTensor { file, tensor, name } => self.edit_tensors(*file, |ts| {
                let name = str_of(name);
                if name == "__metadata__" || ts.iter().any(|t| t.name == name) {
                    return;
                }
                if let Some(i) = pick_tensor(ts, *tensor) {
                    let mut t = ts[i].clone();
                    t.name = name;
                    ts.push(t);
                }
            }),
            Mutation::KeepRows { file, rows } => self.edit_tensors(*file, |ts| {
                for t in ts.iter_mut() {
                    let Some(&n) = t.shape.first() else { continue };
                    if n == 0 {
                        continue;
                    }
                    let keep = (*rows as u64).min(n);
                    let row_bytes = t.data.len() as u64 / n;
                    t.shape[0] = keep;
                    t.data.truncate((keep * row_bytes) as usize);
                }
            }),
            Mutation::DupRow { file, row } => self.edit_tensors(*file, |ts| {
                for t in ts.iter_mut() {
                    let Some(&n) = t.shape.first() else { continue };
                    if n == 0 {
                        continue;
                    }
                    let row_bytes = (t.data.len() as u64 / n) as usize;
                    let at = (*row as u64 % n) as usize * row_bytes;
                    let copy = t.data[at..at + row_bytes].to_vec();
                    t.data.extend(copy);
                    t.shape[0] = n + 1;
                }
            }),
            Mutation::HeaderShape {
                file,
                tensor,
                shape,
            } => {
                let shape: Vec<u64> = shape.iter().take(4).copied().collect();
                self.edit_header(*file, *tensor, |e| {
                    e.insert("shape".to_string(), json!(shape));
                })
            }
            Mutation::HeaderOffsets {
                file,
                tensor,
                begin,
                end,
            } => self.edit_header(*file, *tensor, |e| {
                e.insert("data_offsets".to_string(), json!([begin, end]));
            }),
            Mutation::HeaderDtype {
                file,
                tensor,
                dtype,
            } => {
                let dtype = DTYPES[*dtype as usize % DTYPES.len()];
                self.edit_header(*file, *tensor, |e| {
                    e.insert("dtype".to_string(), json!(dtype));
                })
            }
            Mutation::HeaderLen { file, len } => {
                if let Some(b) = self.nth_data(*file).and_then(|n| self.bytes_mut(&n)) {
                    if b.len() >= 8 {
                        b[..8].copy_from_slice(&len.to_le_bytes());
                    }
                }
            }
        }
    }

    /// Writes the files into the empty directory `dir`.
    fn write(&self, dir: &Path) {
        for (name, entry) in &self.files {
            let path = dir.join(name);
            match entry {
                Entry::Bytes(b) => std::fs::write(&path, b).expect("write scratch file"),
                Entry::Dir => std::fs::create_dir(&path).expect("scratch dir"),
                Entry::Link(to) => std::os::unix::fs::symlink(to, &path).expect("scratch symlink"),
            }
        }
    }
}

// ------------------------------------------------------------ the oracle

/// One row of a variable's state.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    values: Vec<f32>,
    /// In the variable's slot order.
    slots: Vec<Vec<f32>>,
    score: u64,
}

/// A variable's whole observable state.
#[derive(Clone, Debug, PartialEq)]
struct State {
    slots: Vec<(String, f32)>,
    rows: BTreeMap<u64, Row>,
}

fn snapshot<K: FuzzKey>(var: &Variable<K>) -> State {
    let names = var.slot_names();
    let ids: Vec<_> = names
        .iter()
        .map(|n| var.slot_id(n).expect("slot id"))
        .collect();
    let slots = names
        .iter()
        .zip(&ids)
        .map(|(n, &id)| (n.clone(), var.slot_initial(id).expect("initial")))
        .collect();
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for chunk in var.export_chunks(64) {
        let (k, v) = chunk.expect("export");
        keys.extend(k);
        values.extend(v);
    }
    let dim = var.dim();
    let mut scores = vec![0; keys.len()];
    var.lookup_scores(&keys, &mut scores).expect("scores");
    let slot_rows: Vec<Vec<f32>> = ids
        .iter()
        .map(|&id| {
            let mut out = vec![0.0; keys.len() * dim];
            var.lookup_slot(id, &keys, &mut out).expect("slot rows");
            out
        })
        .collect();
    let mut rows = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        let row = Row {
            values: values[i * dim..(i + 1) * dim].to_vec(),
            slots: slot_rows
                .iter()
                .map(|s| s[i * dim..(i + 1) * dim].to_vec())
                .collect(),
            score: scores[i],
        };
        assert!(
            rows.insert(k.to_bits(), row).is_none(),
            "export: key {k} twice"
        );
    }
    State { slots, rows }
}

/// One saved row: key bits, values, slot rows (manifest slot order), score.
type SavedRow = (u64, Vec<f32>, Vec<Vec<f32>>, Option<u64>);

/// A checkpoint as the oracle reads it.
struct Reading {
    slots: Vec<(String, f32)>,
    policy: Option<RestrictPolicy>,
    /// (key bits, values, slot rows in manifest slot order, score) in file
    /// order.
    rows: Vec<SavedRow>,
}

fn field<'a>(o: &'a Map<String, Value>, k: &str) -> Result<&'a Value, String> {
    o.get(k).ok_or_else(|| format!("no {k}"))
}

fn as_uint(v: &Value, what: &str) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("{what} is not an unsigned integer: {v}"))
}

/// Reads the checkpoint of `files` as its format says, for a variable of
/// `key_type` and `dim`. Lenient where the format leaves room.
fn read_checkpoint(files: &Files, key_type: &str, dim: usize) -> Result<Reading, String> {
    let Some(Entry::Bytes(bytes)) = files.files.get("index.json") else {
        return Err("no index.json file".into());
    };
    let index: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let index = index.as_object().ok_or("index.json is not an object")?;
    const FIELDS: [&str; 12] = [
        "format",
        "version",
        "name",
        "key_type",
        "dim",
        "shards",
        "slots",
        "scores",
        "rows_per_file",
        "rows",
        "files",
        "admission",
    ];
    if let Some(k) = index.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!("unknown field {k}"));
    }
    // The base checkpoints come from variables without admission: their
    // `admission` entry is absent, or null (the same). This reader accepts
    // no other (a well-formed entry is not something mutations make).
    if index.get("admission").is_some_and(|a| !a.is_null()) {
        return Err("admission state".into());
    }
    if field(index, "format")? != "dynemb-checkpoint" {
        return Err("format".into());
    }
    if as_uint(field(index, "version")?, "version")? != 1 {
        return Err("version".into());
    }
    field(index, "name")?.as_str().ok_or("name")?;
    if field(index, "key_type")?.as_str() != Some(key_type) {
        return Err("key type".into());
    }
    if as_uint(field(index, "dim")?, "dim")? != dim as u64 {
        return Err("dim".into());
    }
    as_uint(field(index, "shards")?, "shards")?;
    let rows_per_file = as_uint(field(index, "rows_per_file")?, "rows_per_file")?;
    let total = as_uint(field(index, "rows")?, "rows")?;
    let policy = match field(index, "scores")? {
        Value::Null | Value::Bool(false) => None,
        Value::String(s) => Some(RestrictPolicy::from_name(s).ok_or("policy")?),
        _ => return Err("scores".into()),
    };
    let mut slots: Vec<(String, f32)> = Vec::new();
    for s in field(index, "slots")?.as_array().ok_or("slots")? {
        let s = s.as_object().ok_or("slot")?;
        if s.keys().any(|k| k != "name" && k != "initial") {
            return Err("slot field".into());
        }
        let name = field(s, "name")?.as_str().ok_or("slot name")?.to_string();
        let initial = field(s, "initial")?.as_f64().ok_or("slot initial")? as f32;
        if name.is_empty() || slots.iter().any(|(n, _)| *n == name) || !initial.is_finite() {
            return Err("slot".into());
        }
        slots.push((name, initial));
    }
    let entries = field(index, "files")?.as_array().ok_or("files")?;
    let mut sum = 0u64;
    let mut names = std::collections::HashSet::new();
    let mut rows = Vec::new();
    for e in entries {
        let e = e.as_object().ok_or("file entry")?;
        const ENTRY: [&str; 5] = ["file", "shard", "rows", "bytes", "crc32"];
        if e.keys().any(|k| !ENTRY.contains(&k.as_str())) {
            return Err("file entry field".into());
        }
        let name = field(e, "file")?.as_str().ok_or("file name")?;
        as_uint(field(e, "shard")?, "shard")?;
        let n = as_uint(field(e, "rows")?, "rows")?;
        let len = as_uint(field(e, "bytes")?, "bytes")?;
        let crc = as_uint(field(e, "crc32")?, "crc32")?;
        if !names.insert(name) || n > rows_per_file {
            return Err("file entry".into());
        }
        sum = sum.checked_add(n).ok_or("rows overflow")?;
        let plain = Path::new(name).file_name().is_some_and(|f| f == name);
        if !plain {
            return Err("file name".into());
        }
        let Some(Entry::Bytes(bytes)) = files.files.get(name) else {
            return Err(format!("{name} is not a regular file"));
        };
        if bytes.len() as u64 != len || u64::from(crc32fast::hash(bytes)) != crc {
            return Err(format!("{name}: size or checksum"));
        }
        let (_, tensors) = st_parse(bytes).ok_or("safetensors")?;
        let tensor = |name: &str, dtype: &str, shape: &[u64]| -> Result<&[u8], String> {
            let t = tensors
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| format!("no tensor {name}"))?;
            if t.dtype != dtype || t.shape != shape {
                return Err(format!("tensor {name}: dtype or shape"));
            }
            Ok(&t.data)
        };
        let expected = 2 + slots.len() + usize::from(policy.is_some());
        if tensors.len() != expected {
            return Err("tensor count".into());
        }
        let key_dtype = key_type.to_uppercase();
        let keys: Vec<u64> = match key_type {
            "i64" | "u64" => tensor("keys", &key_dtype, &[n])?
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            "i32" => tensor("keys", &key_dtype, &[n])?
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64 as u64)
                .collect(),
            _ => tensor("keys", &key_dtype, &[n])?
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as u64)
                .collect(),
        };
        let floats = |name: &str| -> Result<Vec<f32>, String> {
            let v: Vec<f32> = tensor(name, "F32", &[n, dim as u64])?
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            if v.iter().all(|x| x.is_finite()) {
                Ok(v)
            } else {
                Err(format!("{name}: not finite"))
            }
        };
        let values = floats("values")?;
        let slot_rows = slots
            .iter()
            .map(|(s, _)| floats(&format!("slot.{s}")))
            .collect::<Result<Vec<_>, _>>()?;
        let scores: Option<Vec<u64>> = match policy {
            Some(_) => Some(
                tensor("scores", "U64", &[n])?
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            None => None,
        };
        for (i, &k) in keys.iter().enumerate() {
            rows.push((
                k,
                values[i * dim..(i + 1) * dim].to_vec(),
                slot_rows
                    .iter()
                    .map(|s| s[i * dim..(i + 1) * dim].to_vec())
                    .collect(),
                scores.as_ref().map(|s| s[i]),
            ));
        }
    }
    if sum != total {
        return Err("total rows".into());
    }
    Ok(Reading {
        slots,
        policy,
        rows,
    })
}

/// What `restore` (`replace`) or `load` of `reading` into a variable in
/// state `before` with restrict policy `policy` gives, or why it must fail.
/// Scores that the variable stamps itself are `None` (any positive value).
fn expected(
    before: &State,
    reading: &Reading,
    policy: Option<RestrictPolicy>,
    dim: usize,
    replace: bool,
) -> Result<(State, BTreeMap<u64, Option<u64>>), String> {
    let mut state = before.clone();
    let mut slot_of = Vec::new();
    for (name, initial) in &reading.slots {
        match state.slots.iter().position(|(n, _)| n == name) {
            Some(i) if state.slots[i].1 != *initial => return Err("slot initial mismatch".into()),
            Some(i) => slot_of.push(i),
            None => {
                state.slots.push((name.clone(), *initial));
                slot_of.push(state.slots.len() - 1);
                for row in state.rows.values_mut() {
                    row.slots.push(vec![*initial; dim]);
                }
            }
        }
    }
    if state.slots.len() > MAX_SLOTS {
        return Err("too many slots".into());
    }
    if let (Some(saved), Some(own)) = (reading.policy, policy) {
        if saved != own {
            return Err("policy mismatch".into());
        }
    }
    let restore_scores = reading.policy.is_some() && reading.policy == policy;
    if replace {
        state.rows.clear();
    }
    let mut scores: BTreeMap<u64, Option<u64>> = state
        .rows
        .iter()
        .map(|(&k, r)| (k, Some(r.score)))
        .collect();
    for (key, values, slot_rows, score) in &reading.rows {
        let fresh = Row {
            values: Vec::new(),
            slots: state
                .slots
                .iter()
                .map(|&(_, init)| vec![init; dim])
                .collect(),
            score: 0,
        };
        let existed = state.rows.contains_key(key);
        let row = state.rows.entry(*key).or_insert(fresh);
        row.values = values.clone();
        for (j, s) in slot_rows.iter().enumerate() {
            row.slots[slot_of[j]] = s.clone();
        }
        let new_score = match policy {
            None => Some(0),
            Some(_) if restore_scores => *score,
            Some(RestrictPolicy::Frequency) => Some(if existed {
                scores[key].expect("counted") + 1
            } else {
                1
            }),
            Some(RestrictPolicy::Timestamp) => None,
        };
        scores.insert(*key, new_score);
    }
    Ok((state, scores))
}

fn check_state(got: &State, want: &State, scores: &BTreeMap<u64, Option<u64>>, what: &str) {
    assert_eq!(got.slots, want.slots, "{what}: slots");
    assert_eq!(
        got.rows.keys().collect::<Vec<_>>(),
        want.rows.keys().collect::<Vec<_>>(),
        "{what}: keys"
    );
    for (k, w) in &want.rows {
        let g = &got.rows[k];
        assert_eq!(g.values, w.values, "{what}: values of key bits {k:#x}");
        assert_eq!(g.slots, w.slots, "{what}: slot rows of key bits {k:#x}");
        match scores[k] {
            Some(s) => assert_eq!(g.score, s, "{what}: score of key bits {k:#x}"),
            None => assert!(g.score > 0, "{what}: a written row has timestamp 0"),
        }
    }
}

// ------------------------------------------------------------ the target

const TYPES: [&str; 4] = ["i64", "u64", "i32", "u32"];
const SLOT_NAMES: [&str; 4] = ["m", "v", "acc", "w"];

fuzz_target!(|input: Input| {
    let world = world();
    let base = &world.bases[input.base as usize % world.bases.len()];
    // Mostly the checkpoint's own settings: other ones only get as far as
    // the manifest's checks.
    let key_type = match input.target.key_type {
        t @ 240.. => TYPES[t as usize % TYPES.len()],
        _ => base.key_type,
    };
    match key_type {
        "i64" => run::<i64>(world, base, &input),
        "u64" => run::<u64>(world, base, &input),
        "i32" => run::<i32>(world, base, &input),
        _ => run::<u32>(world, base, &input),
    }
});

fn run<K: FuzzKey>(world: &World, base: &Base, input: &Input) {
    let t = &input.target;
    let dim = match t.dim {
        d @ 240.. => 1 + d as usize % 5,
        _ => base.dim,
    };
    let shards = 1 + t.shards as usize % 4;
    let policy = match t.policy {
        p @ 224.. => [
            None,
            Some(RestrictPolicy::Frequency),
            Some(RestrictPolicy::Timestamp),
        ][p as usize % 3],
        _ => base.policy,
    };
    let var = builder::<K>(dim, shards, policy)
        .build()
        .expect("target variable");
    for &(name, initial) in t.slots.iter().take(3) {
        let name = SLOT_NAMES[name as usize % SLOT_NAMES.len()];
        // Conflicting initial values fail; that is fine here.
        let _ = var.create_slot(name, initial as f32 / 2.0);
    }
    let keys: Vec<K> = t.rows.iter().take(8).map(|&(k, _)| K::of(k)).collect();
    let values: Vec<f32> = t
        .rows
        .iter()
        .take(8)
        .enumerate()
        .flat_map(|(r, &(_, s))| small_row(s, r, dim))
        .collect();
    var.upsert(&keys, &values).expect("target rows");

    let mut files = Files {
        files: base
            .files
            .iter()
            .map(|(n, b)| (n.clone(), Entry::Bytes(b.clone())))
            .collect(),
    };
    for m in input.mutations.iter().take(MAX_MUTATIONS) {
        files.apply(m);
    }
    let dir = &world.scratch;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir(dir).expect("scratch checkpoint dir");
    files.write(dir);

    let before = snapshot(&var);
    let result = if input.load {
        var.load(dir)
    } else {
        var.restore(dir)
    };
    let after = snapshot(&var);
    let reading = read_checkpoint(&files, K::TYPE_NAME, dim);
    let want = reading
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|r| expected(&before, r, policy, dim, !input.load));
    match (&result, want) {
        (Err(_), _) => {
            // A checkpoint is refused whole: nothing changed.
            assert_eq!(
                after, before,
                "a failed read changed the variable: {result:?}"
            );
        }
        (Ok(()), Ok((state, scores))) => check_state(&after, &state, &scores, "after a read"),
        (Ok(()), Err(why)) => panic!(
            "accepted a checkpoint the format does not allow ({why}); base {} {:?} {:?}",
            base.key_type, base.slots, base.shards
        ),
    }
}
