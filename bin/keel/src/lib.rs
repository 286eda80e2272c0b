//! keel, the binary's library: the command line (`cli`), which parses
//! arguments and dispatches each command to the crate that does it (the
//! daemon to keel-daemon, `demo`, `drill`, `bench` and `mock-llm` to
//! keel-lab, the client commands to keel-api's client). It is the
//! composition root: it chooses the fake provider `keel serve` falls back
//! to. `main.rs` only parses arguments and calls `cli::run`, so everything
//! here can be tested without spawning a process.

pub mod cli;
