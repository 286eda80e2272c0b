//! The admin CLI and the client it is built on, against a real daemon and
//! `keel mock-llm`: `client` drives `keel::client` (the typed HTTP client
//! and its reconnecting event follower), `commands` runs every command of
//! the `keel` binary in both output modes and checks the errors a person
//! sees, `terminal` drives `keel chat` (and checks colour) through a
//! pseudo-terminal.
//!
//! The CLI finds the daemon as a user's would: `KEEL_ADDR` and the token
//! file in `KEEL_DATA_DIR`. Nothing sleeps to synchronise; every wait is
//! on output or state, bounded by the daemon harness's `PATIENCE`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client;
mod commands;
mod terminal;

use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::daemon::{Daemon, Site, Wire};
use crate::harness::{keel_bin, MockLlm};

/// A daemon against a mock, and the site it runs in.
pub struct Rig {
    /// The fake provider the daemon talks to.
    pub mock: MockLlm,
    pub site: Site,
    pub daemon: Daemon,
}

impl Rig {
    pub fn start() -> Rig {
        let mock = MockLlm::start();
        let site = Site::new();
        let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
        Rig { mock, site, daemon }
    }

    /// `HOST:PORT` of the daemon, as `KEEL_ADDR` takes it.
    pub fn addr(&self) -> String {
        addr_of(&self.daemon)
    }

    /// A `keel ARGS` command that finds this daemon through the
    /// environment, run in the site's working directory.
    pub fn command(&self, args: &[&str]) -> Command {
        command_for(&self.daemon, &self.site, args)
    }

    /// Run `keel ARGS` to its end.
    pub fn keel(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Run `keel ARGS`, require success, return stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.keel(args);
        assert!(
            output.status.success(),
            "keel {args:?} failed: {}",
            describe(&output)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// Run `keel ARGS --json`, require success, parse stdout as one JSON
    /// value.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let stdout = self.ok(&all);
        serde_json::from_str(&stdout).unwrap_or_else(|err| panic!("not JSON ({err}): {stdout}"))
    }

    /// A new conversation made with `keel new --json`, in the site's
    /// working directory; its id.
    pub fn new_conversation(&self, extra: &[&str]) -> String {
        let mut args = vec!["new"];
        args.extend_from_slice(extra);
        let created = self.json(&args);
        created["id"].as_str().unwrap().to_owned()
    }
}

/// `keel ARGS` finding `daemon` as a user's shell would (`KEEL_ADDR`, the
/// token file in `KEEL_DATA_DIR`), run in `site`'s working directory.
pub fn command_for(daemon: &Daemon, site: &Site, args: &[&str]) -> Command {
    let mut command = Command::new(keel_bin());
    command
        .args(args)
        .env_clear()
        .env("KEEL_ADDR", addr_of(daemon))
        .env("KEEL_DATA_DIR", daemon.data_dir())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .current_dir(site.cwd())
        .stdin(Stdio::null());
    command
}

pub fn addr_of(daemon: &Daemon) -> String {
    daemon.url.trim_start_matches("http://").to_owned()
}

/// Status, stdout and stderr, for a failure message.
pub fn describe(output: &Output) -> String {
    format!(
        "{:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A free loopback port: bound, read, released.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}
