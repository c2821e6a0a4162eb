//! Bounds on names: a variable's (scopes included) and a slot column's.
//!
//! Names travel into checkpoints (a slot's name is a tensor name in every
//! data file's safetensors header, a variable's name is in `index.json`)
//! and into messages, so each is checked where it enters ([`check_name`]):
//! at most [`MAX_NAME_BYTES`] bytes of UTF-8. The bound keeps a data file's
//! header a few kilobytes whatever the names (safetensors refuses a header
//! over 100 MB), so a checkpoint of a variable that was built can always be
//! written.

use crate::{Error, Result};

/// The longest name, in bytes, that a variable (with its scope prefixes)
/// or a slot column may have.
pub const MAX_NAME_BYTES: usize = 1024;

/// Checks a name that enters the crate: an [`Error::InvalidArgument`] if
/// it is longer than [`MAX_NAME_BYTES`] bytes. `what` says whose name it is
/// in the message (`"variable name"`, `"slot name"`). Other crates
/// (backends) check their names with it too.
pub fn check_name(what: &str, name: &str) -> Result<()> {
    if name.len() <= MAX_NAME_BYTES {
        return Ok(());
    }
    let mut end = 32;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    Err(Error::InvalidArgument(format!(
        "{what} {:?}... is {} bytes long, more than the {MAX_NAME_BYTES} a name may have",
        &name[..end],
        name.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_up_to_the_bound_pass_and_longer_ones_are_named_in_the_error() {
        assert!(check_name("slot name", &"m".repeat(MAX_NAME_BYTES)).is_ok());
        // Multi-byte characters: the quoted prefix stops at a boundary.
        let long = "é".repeat(MAX_NAME_BYTES);
        let err = check_name("slot name", &long).unwrap_err().to_string();
        assert!(
            err.contains("slot name") && err.contains("2048 bytes"),
            "{err}"
        );
    }
}
