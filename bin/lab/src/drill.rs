//! `keel drill`: the claims keel makes about failure, turned into commands
//! anyone can run against the real daemon.
//!
//! - `keel drill faults` (`faults`): every fault the fake provider can
//!   stage, in both wire formats, with and without a fallback, each checked
//!   against the end state it must reach (docs/drills.md).
//! - `keel drill crash` (`crash`): SIGKILL a daemon at random moments (or
//!   aimed at a state) while conversations work, restart it, and check
//!   after every restart that nothing was lost, doubled or left stuck;
//!   `running` is its side for a daemon it did not start (`--addr`).
//! - `keel drill nodes` (`nodes`): several nodes over one PostgreSQL
//!   database, SIGKILLed and paused past their lease at random moments,
//!   with the crash drill's workers and checks plus the nodes' own: no two
//!   epochs interleaved in a log, no append under a stale epoch, every
//!   client stream gap-free; and the time a lost node's conversations take
//!   to answer again.

mod approvals;
pub mod crash;
pub mod faults;
pub mod nodes;
pub mod running;
