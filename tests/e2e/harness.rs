//! Shared helpers: finding the real `keel` binary and running it.

#![allow(clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `keel` binary Cargo built beside this test: the test runs as
/// `target/<profile>/deps/e2e-HASH`, the binary is `target/<profile>/keel`.
pub fn keel_bin() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let bin = profile_dir.join(format!("keel{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "the keel binary is not at {}; build it first with `cargo build -p keel`, \
         or run the tests with `cargo test --workspace`, which builds it",
        bin.display()
    );
    bin
}

/// Run `keel ARGS` to its end and return what it printed.
pub fn keel(args: &[&str]) -> Output {
    let bin = keel_bin();
    Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("could not run {}: {err}", bin.display()))
}

/// Run `keel ARGS`, require success, and parse stdout as JSON lines.
pub fn keel_json_lines(args: &[&str]) -> Vec<serde_json::Value> {
    let output = keel(args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "keel {args:?} failed with {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"))
        })
        .collect()
}
