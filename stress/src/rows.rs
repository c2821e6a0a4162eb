//! Keys and row encodings: every row the soak writes is in a state that can
//! be recognised from the row alone (plus its key), so every read checks it.
//!
//! # Main variable
//!
//! Keys are `main_key(id)` for ids `0, 1, 2, ...` handed out in order (a
//! bijective mix, so keys spread over all of `i64`). Each key has a tag
//! `t = tag(key)` in `1..P`. A row's values are all equal (`v`), and so are
//! its slot row's (`s`); the valid `(v, s)` pairs are
//!
//! - *untagged*: `v = P*Q*a` (a >= 0) and `s = 0`: a fresh row (the
//!   initializer writes 0, the slot starts at 0) plus `a` units of `accum`;
//! - *tagged*: `v = t + P*(u + Q*a)` with `u < Q`, and `s = t + P*u`: a row
//!   that `update_rows` has stepped (it stamps the key's tag into both).
//!
//! `accum` adds `P*Q*d` to every value and leaves the slot alone, and
//! `update_rows` maps a valid pair to a valid pair (`u` advances by the
//! gradient mod `Q`, `a` is reduced mod [`A_WRAP`]), so every row stays in
//! one of the two states. All numbers stay below 2^24, so every f32 is an
//! exact integer. A row torn between two writes (values not all equal, or
//! values and slot from different versions), a row or slot row of another key
//! (the tag is wrong with probability `(P-2)/(P-1)`), or a stale slot left
//! in a reused row (`s != 0` beside an untagged `v`) fails the check.
//!
//! A single `lookup` or `lookup_slot` reads one column, so it checks that
//! column's half of the pair ([`check_value`], [`check_slot`]); inside
//! `update_rows`, in audits and in restored checkpoints both halves come
//! from one version and [`check_pair`] checks the whole pair.
//!
//! # Ledger variable
//!
//! Keys `ledger_key(j)` for `j < 2n`: `j < n` are trained by `update_rows`
//! (value `+= g`, slot `+= 2g`, so `s == 2v` always), `j >= n` by `accum`
//! (value `+= g`, slot stays 0). Gradients are small positive integers.

/// The tag modulus: a tagged value is `tag(key)` mod `P`.
pub const P: u32 = 61;
/// The update counter modulus.
pub const Q: u32 = 64;
/// `update_rows` reduces the accum count `a` mod this, so values stay exact.
pub const A_WRAP: u32 = 1024;
/// One unit of `accum` on the main variable.
pub const ACCUM_UNIT: f32 = (P * Q) as f32;
/// Every number the soak stores is an integer below this (f32 is exact there).
pub const EXACT_LIMIT: f32 = 16_777_216.0;

/// xorshift64*: a small deterministic generator, one per thread.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Rng(mix(seed) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// splitmix64's finalizer: a bijection of `u64`.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The main variable's key of id `id` (distinct ids give distinct keys).
pub fn main_key(id: u64) -> i64 {
    mix(id) as i64
}

/// The tag of a main key, in `1..P`.
pub fn tag(key: i64) -> u32 {
    1 + (key as u64 % u64::from(P - 1)) as u32
}

/// Spacing of ledger keys.
const LEDGER_STRIDE: i64 = 1_000_003;

/// Ledger indexes past the books (`2 * per_kind ..`): marker keys, one on
/// each shard of a ledger of at most 4 shards (4 consecutive multiples of
/// the odd stride 1,000,003, which is prime to 3, fall on every shard),
/// set to the round number before each save.
pub const LEDGER_MARKERS: usize = 4;

/// The ledger's key of index `j`, for `j < 2 * per_kind + LEDGER_MARKERS`
/// (negative and positive keys).
pub fn ledger_key(j: usize, per_kind: usize) -> i64 {
    (j as i64 - per_kind as i64) * LEDGER_STRIDE
}

/// The ledger index of `key`, if it is a ledger key (markers included).
pub fn ledger_index(key: i64, per_kind: usize) -> Option<usize> {
    if key % LEDGER_STRIDE != 0 {
        return None;
    }
    let j = key / LEDGER_STRIDE + per_kind as i64;
    (0..(2 * per_kind + LEDGER_MARKERS) as i64)
        .contains(&j)
        .then_some(j as usize)
}

/// A main row's value, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MainValue {
    /// `v = P*Q*a`: fresh, plus `a` accum units.
    Untagged {
        /// Accum units.
        a: u32,
    },
    /// `v = t + P*(u + Q*a)`.
    Tagged {
        /// The update counter, `< Q`.
        u: u32,
        /// Accum units.
        a: u32,
    },
}

/// The common value of a row whose elements must all be equal, as an exact
/// non-negative integer below [`EXACT_LIMIT`].
fn uniform_integer(what: &str, key: i64, row: &[f32]) -> Result<u32, String> {
    let first = row[0];
    if let Some(j) = row.iter().position(|&x| x.to_bits() != first.to_bits()) {
        return Err(format!(
            "torn {what} of key {key}: element 0 is {first} but element {j} is {} (row {row:?})",
            row[j]
        ));
    }
    if !(0.0..EXACT_LIMIT).contains(&first) || first.fract() != 0.0 {
        return Err(format!(
            "{what} of key {key} is {first}, not an integer in [0, 2^24) (row {row:?})"
        ));
    }
    Ok(first as u32)
}

/// Checks a main row's values (all equal, a valid untagged or tagged value
/// for `key`) and decodes them.
pub fn check_value(key: i64, values: &[f32]) -> Result<MainValue, String> {
    let v = uniform_integer("value row", key, values)?;
    let t = tag(key);
    if v.is_multiple_of(P) {
        if !v.is_multiple_of(P * Q) {
            return Err(format!(
                "value row of key {key} is {v}: a multiple of {P} (untagged) but not of {}",
                P * Q
            ));
        }
        return Ok(MainValue::Untagged { a: v / (P * Q) });
    }
    if v % P != t {
        return Err(format!(
            "value row of key {key} is {v}, tag {} but the key's tag is {t}: another key's row?",
            v % P
        ));
    }
    let w = (v - t) / P;
    Ok(MainValue::Tagged { u: w % Q, a: w / Q })
}

/// Checks a main slot row (all equal, 0 or `t + P*u` with `u < Q`) and
/// returns `u` (`None` for 0).
pub fn check_slot(key: i64, slot: &[f32]) -> Result<Option<u32>, String> {
    let s = uniform_integer("slot row", key, slot)?;
    if s == 0 {
        return Ok(None);
    }
    let t = tag(key);
    if s % P != t || s / P >= Q {
        return Err(format!(
            "slot row of key {key} is {s}: not t + {P}*u with the key's tag t = {t} and u < {Q}: \
             another key's slot row?"
        ));
    }
    Ok(Some((s - t) / P))
}

/// Checks that a main row's values and slot row form a valid pair (one
/// version of the row).
pub fn check_pair(key: i64, values: &[f32], slot: &[f32]) -> Result<MainValue, String> {
    let value = check_value(key, values)?;
    let u_slot = check_slot(key, slot)?;
    match (value, u_slot) {
        (MainValue::Untagged { .. }, None) => Ok(value),
        (MainValue::Tagged { u, .. }, Some(us)) if u == us => Ok(value),
        _ => Err(format!(
            "value row {} and slot row {} of key {key} are not one version: {value:?} with slot \
             counter {u_slot:?}",
            values[0], slot[0]
        )),
    }
}

/// The `update_rows` step of the main variable for `key` with gradient `g`
/// (`1..Q`): checks the pair it is given, then advances it. On a failed
/// check it leaves the rows as they are.
pub fn step(key: i64, g: u32, values: &mut [f32], slot: &mut [f32]) -> Result<(), String> {
    let (u, a) = match check_pair(key, values, slot)? {
        MainValue::Untagged { a } => (0, a),
        MainValue::Tagged { u, a } => (u, a),
    };
    let t = tag(key);
    let u = (u + g) % Q;
    let a = a % A_WRAP;
    values.fill((t + P * (u + Q * a)) as f32);
    slot.fill((t + P * u) as f32);
    Ok(())
}

/// The ledger's value of a row (all elements equal, an exact integer).
pub fn ledger_value(what: &str, key: i64, row: &[f32]) -> Result<u64, String> {
    uniform_integer(what, key, row).map(u64::from)
}

/// An order-independent checksum term of one row.
pub fn row_hash(key: i64, value: f32, slot: f32, score: u64) -> u64 {
    mix(mix(mix(key as u64) ^ u64::from(value.to_bits())) ^ u64::from(slot.to_bits()) ^ score)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_accums_keep_rows_valid() {
        for id in 0..200 {
            let key = main_key(id);
            let (mut v, mut s) = (vec![0.0f32; 5], vec![0.0f32; 5]);
            check_pair(key, &v, &s).unwrap();
            for round in 0..300u32 {
                if round.is_multiple_of(3) {
                    for x in &mut v {
                        *x += ACCUM_UNIT * 2.0;
                    }
                } else {
                    step(key, 1 + round % 3, &mut v, &mut s).unwrap();
                }
                check_pair(key, &v, &s).unwrap();
            }
            // Torn, stale or foreign rows are caught.
            let mut torn = v.clone();
            torn[3] += ACCUM_UNIT;
            assert!(check_value(key, &torn).is_err());
            assert!(check_pair(key, &v, &[0.0; 5]).is_err() || (v[0] as u32).is_multiple_of(P));
            let other = main_key(id + 1);
            if tag(other) != tag(key) {
                assert!(check_pair(other, &v, &s).is_err());
            }
        }
    }

    #[test]
    fn ledger_keys_round_trip() {
        for j in 0..20 {
            assert_eq!(ledger_index(ledger_key(j, 10), 10), Some(j));
        }
        for shards in 1..=4 {
            let mut hit = [false; 4];
            for j in 20..20 + LEDGER_MARKERS {
                hit[ledger_key(j, 10).rem_euclid(shards) as usize] = true;
            }
            assert!(
                hit[..shards as usize].iter().all(|&h| h),
                "markers on every shard"
            );
        }
        assert_eq!(ledger_index(ledger_key(23, 10), 10), Some(23));
        assert_eq!(ledger_index(ledger_key(24, 10), 10), None);
        assert_eq!(ledger_index(17, 10), None);
    }
}
