//! Tests that cannot run on this machine: they say so on one loud line
//! and return (`SKIPPED: <test>: <what is missing>; install it: <how>`),
//! so that `cargo test` passes on a machine with only Rust; with
//! [`REQUIRE_ALL_TESTS`] set to `1` (as CI sets it) such a skip fails the
//! test instead, so nothing is skipped there unseen.
//!
//! The line goes straight to the process's standard error, past the test
//! harness's capture of `eprintln!`, so it shows in a passing run too.

use std::io::Write;

/// The environment variable that makes every skip a test failure when it
/// is `1`.
pub const REQUIRE_ALL_TESTS: &str = "DYNEMB_REQUIRE_ALL_TESTS";

/// Whether [`REQUIRE_ALL_TESTS`] is set to `1`.
pub fn all_tests_required() -> bool {
    std::env::var(REQUIRE_ALL_TESTS).is_ok_and(|v| v == "1")
}

/// The running test's name: the test harness names each test's thread
/// after it.
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string()
}

/// Reports that the running test skips (part of) its work because
/// `missing` (e.g. `"redis-server not found"`), which `install` makes
/// available (e.g. `"sudo apt-get install redis-server"`): one line on
/// standard error, or, under [`REQUIRE_ALL_TESTS`]`=1`, a panic that
/// fails the test. The caller then returns (or leaves out the part).
pub fn skip(missing: &str, install: &str) {
    let test = current_test();
    if all_tests_required() {
        panic!(
            "{test}: {missing}; install it: {install} \
             ({REQUIRE_ALL_TESTS}=1: a test that cannot run fails)"
        );
    }
    let line = format!("SKIPPED: {test}: {missing}; install it: {install}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
