//! The `keel` command line, run as a process: what a user sees and the exit
//! codes scripts rely on (`keel demo` and the daemon's commands are checked
//! end to end in keel-tests: tests/e2e/demo.rs, tests/e2e/cli.rs). Building
//! this test also builds `target/*/keel`, which the end-to-end tests in
//! keel-tests run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn keel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .output()
        .expect("the keel binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

#[test]
fn version_names_the_package_version() {
    let output = keel(&["--version"]);
    assert!(output.status.success());
    assert_eq!(
        stdout(&output).trim(),
        format!("keel {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn an_unknown_command_fails_with_a_usage_error() {
    let output = keel(&["nonsense"]);
    assert!(!output.status.success());
    assert_eq!(output.status.code(), Some(2), "clap's usage-error status");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unrecognized subcommand 'nonsense'"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
}
