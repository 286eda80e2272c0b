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

mod approvals;
pub mod crash;
pub mod faults;
pub mod running;
