//! End-to-end tests: the real `keel` binary, run as a user would. One test
//! binary for the whole package; each module is one area, and `harness`
//! holds the helpers they share.

mod cli;
mod daemon;
mod demo;
mod drill;
mod harness;
mod promises;
mod provider;
mod runtime;
