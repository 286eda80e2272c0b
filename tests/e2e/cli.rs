//! The admin CLI and the client it is built on, against a real daemon and
//! `keel mock-llm`: `client` drives `keel::client` (the typed HTTP client
//! and its reconnecting event follower), `commands` runs every command of
//! the `keel` binary in both output modes and checks the errors a person
//! sees, `chat` drives `keel chat` through a pseudo-terminal.
//!
//! The CLI finds the daemon as a user's would: `KEEL_ADDR` and the token
//! file in `KEEL_DATA_DIR`. Nothing sleeps to synchronise; every wait is
//! on output or state, bounded by the daemon harness's `PATIENCE`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client;

use crate::daemon::{Daemon, Site, Wire};
use crate::harness::MockLlm;

/// A daemon against a mock, and the site it runs in.
pub struct Rig {
    /// Kept alive for the daemon's sake.
    pub _mock: MockLlm,
    pub site: Site,
    pub daemon: Daemon,
}

impl Rig {
    pub fn start() -> Rig {
        let mock = MockLlm::start();
        let site = Site::new();
        let daemon = Daemon::start(&site, Wire::Anthropic, &mock, &[]);
        Rig {
            _mock: mock,
            site,
            daemon,
        }
    }

    /// `HOST:PORT` of the daemon, as `KEEL_ADDR` takes it.
    pub fn addr(&self) -> String {
        addr_of(&self.daemon)
    }
}

pub fn addr_of(daemon: &Daemon) -> String {
    daemon.url.trim_start_matches("http://").to_owned()
}

/// A free loopback port: bound, read, released.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}
