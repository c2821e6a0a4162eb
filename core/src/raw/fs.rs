//! File-system primitives checkpoints need beyond `std`: swapping two
//! directories in one atomic step.

use std::io;
use std::path::Path;

/// Atomically exchanges the directories `a` and `b` (both must exist): after
/// it returns, `a` holds what `b` held and the reverse, and no observer ever
/// sees either path missing. Linux `renameat2(RENAME_EXCHANGE)`; file
/// systems without it answer `EINVAL` (or `ENOSYS`, `EOPNOTSUPP`).
#[cfg(all(target_os = "linux", target_env = "gnu", not(miri)))]
pub(crate) fn exchange_dirs(a: &Path, b: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let a = CString::new(a.as_os_str().as_bytes())?;
    let b = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both pointers are valid NUL-terminated strings that outlive the
    // call; relative paths resolve against the current directory
    // (`AT_FDCWD`). The call reads nothing else from our memory.
    let status = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if status == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Fallback where the exchange is not available: reports `Unsupported`, and
/// the caller replaces the directory in two renames instead.
#[cfg(not(all(target_os = "linux", target_env = "gnu", not(miri))))]
pub(crate) fn exchange_dirs(_a: &Path, _b: &Path) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore)]
    fn exchange_swaps_contents() {
        let root = std::env::temp_dir().join(format!("dynemb-fs-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("x"), "from a").unwrap();
        std::fs::write(b.join("x"), "from b").unwrap();
        match exchange_dirs(&a, &b) {
            Ok(()) => {
                assert_eq!(std::fs::read_to_string(a.join("x")).unwrap(), "from b");
                assert_eq!(std::fs::read_to_string(b.join("x")).unwrap(), "from a");
            }
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::Unsupported),
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}
