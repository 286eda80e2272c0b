//! keel-test-support: the rig that runs keel from outside, written once
//! for the lab (`keel drill`, `keel bench`), the benches and the
//! end-to-end tests. A daemon as a child process (`child_daemon`), the
//! fake provider as a child process (`fake_provider`), a PostgreSQL
//! server of a test's own (`postgres`), what `/proc` says of processes
//! (`procs`), percentiles (`stats`), the event stream scanned cheaply
//! (`sse`) and followed by many subscribers (`tally`), and the benches'
//! deterministic text (`text`).
//! The daemon does not depend on it; the lab does, so it ships in the
//! binary only for `keel drill` and `keel bench`.

pub mod child_daemon;
pub mod fake_provider;
pub mod postgres;
pub mod procs;
pub mod sse;
pub mod stats;
pub mod tally;
pub mod text;

pub use child_daemon::{ChildDaemon, LIFE_ENV};
pub use fake_provider::FakeProvider;
pub use postgres::Postgres;
pub use procs::{
    cpu_time, is_running, listener_pid, load_average, pids, port_of, processes_in,
    processes_with_env, rss_bytes, spawner_of,
};
pub use sse::{find, FrameScanner, Scanned, ScannedKind};
pub use tally::{TallyFollower, TurnTally};
