//! How the `train` binary sets up glibc's allocator: it keeps freed memory
//! in the process, so that a training step's large temporaries reuse pages
//! instead of faulting fresh ones in.
//!
//! candle's CPU backend allocates a new buffer for every op's output (a
//! step of the linear model allocates some 40 MB of them, the 1M-row
//! baseline's `AdamW` several 64 MB ones per parameter). With glibc's
//! defaults, a buffer above the *dynamic* mmap threshold (128 KiB at
//! start, raised to the size of each mmapped buffer freed, at most 32 MiB)
//! is a fresh `mmap`, page-faulted in (and zeroed by the kernel) on first
//! touch, and memory freed at the top of the heap is trimmed back to the
//! kernel. That made the 1M-row baseline several times slower, and, since
//! the threshold moves with what the process freed before, made a run's
//! figures depend on the runs before it.
//!
//! [`TUNABLES`] fixes the mmap threshold above any buffer of the benchmark
//! and never trims, so every run allocates from the same retained heap
//! after its first steps. glibc reads `GLIBC_TUNABLES` only at start-up,
//! so [`reexec_with_tunables`] re-executes the binary with it set (unless
//! the environment already sets `GLIBC_TUNABLES`); `--glibc-malloc` keeps
//! glibc's defaults instead. The report prints the settings in effect
//! ([`malloc_env`]). Other C libraries ignore the variable.

use std::ffi::OsString;

/// The glibc tunables the binary runs with: no mmap below 4 GiB, no trim
/// below 16 GiB.
pub const TUNABLES: &str =
    "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184";

/// The variable glibc reads its tunables from.
const VARIABLE: &str = "GLIBC_TUNABLES";

/// Re-executes this program with `args` and [`TUNABLES`] in its
/// environment, unless `GLIBC_TUNABLES` is already set (then it returns
/// `Ok`, and the program goes on as it is). On success it does not return.
#[cfg(unix)]
pub fn reexec_with_tunables(args: impl IntoIterator<Item = OsString>) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(VARIABLE).is_some() {
        return Ok(());
    }
    let error = std::process::Command::new(std::env::current_exe()?)
        .args(args)
        .env(VARIABLE, TUNABLES)
        .exec();
    Err(error)
}

/// Elsewhere glibc's tunables do not apply: nothing to do.
#[cfg(not(unix))]
pub fn reexec_with_tunables(_args: impl IntoIterator<Item = OsString>) -> std::io::Result<()> {
    Ok(())
}

/// The glibc malloc settings in this process's environment (`MALLOC_*`,
/// `GLIBC_TUNABLES`), as `NAME=value`, sorted; empty: glibc's defaults.
pub fn malloc_env() -> Vec<String> {
    let mut vars: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with("MALLOC_") || name == VARIABLE)
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    vars.sort();
    vars
}
