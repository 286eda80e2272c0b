//! keel, the binary's library: the command line (`cli`) and what each
//! command does. `main.rs` only parses arguments and calls `cli::run`, so
//! everything here can be tested without spawning a process.

pub mod api;
pub mod cli;
pub mod demo;
pub mod mock_llm;
pub mod serve;
pub mod telemetry;
