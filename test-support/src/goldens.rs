//! The TensorFlow goldens of the optimizers (`optim/tests/golden/
//! goldens.json`, made by `make_goldens.py` with real TensorFlow), read by
//! every test that replays them: the optimizers' own parity tests, their
//! half-precision bound, and the Redis backend's parity.

use serde_json::Value;

/// The goldens file, parsed.
///
/// # Panics
/// If the file is missing or is not JSON.
pub fn load() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../optim/tests/golden/goldens.json"
    );
    serde_json::from_slice(&std::fs::read(path).expect("goldens.json")).expect("valid JSON")
}

/// Every number of a (nested) JSON array, flattened, as `f32`.
///
/// # Panics
/// If `v` holds anything but arrays and numbers.
pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array")
        .iter()
        .flat_map(|x| match x {
            Value::Array(_) => floats(x),
            _ => vec![x.as_f64().expect("a number") as f32],
        })
        .collect()
}

/// A JSON array of ids.
///
/// # Panics
/// If `v` is not an array of integers.
pub fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_i64().expect("an id"))
        .collect()
}
