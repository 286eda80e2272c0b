//! keel, the binary's library: the command line (`cli`) and the daemon
//! client it is built on (`client`), what each
//! command does, and the logs, traces and metrics a long-running command
//! installs (`telemetry`). `main.rs` only parses arguments and calls
//! `cli::run`, so everything here can be tested without spawning a process.

pub mod api;
pub mod cli;
pub mod client;
pub mod demo;
pub mod drill;
pub mod mock_llm;
pub mod net;
pub mod serve;
pub mod telemetry;
