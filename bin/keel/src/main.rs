//! The `keel` binary: parses the command line and hands over to `keel::cli`.
//! An error is printed on stderr with its causes and the process exits
//! with status 1; a command's own outcome (a failed turn, say) picks its
//! status through `keel::cli::Exit`.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc: under load, glibc's malloc and free took a quarter of the
/// daemon's CPU (docs/benchmarks.md, "mimalloc instead of glibc's allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // No transparent huge pages for this process: mimalloc asks for them
    // on its arenas, and every fault in a page it had given back then
    // zeroed 2 MiB, an eighth of the daemon's CPU on client-shaped tool
    // turns (docs/benchmarks.md, "Huge pages zeroed"). Where the kernel
    // refuses, nothing else changes.
    let _ = nix::sys::prctl::set_thp_disable(true);
    match keel::cli::run(keel::cli::Cli::parse()) {
        Ok(exit) => exit.into(),
        Err(error) => {
            eprintln!("error: {}", keel::cli::describe_error(&error));
            keel::cli::Exit::Failed.into()
        }
    }
}
