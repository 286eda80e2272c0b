//! The `keel` binary: parses the command line and hands over to `keel::cli`.
//! An error is printed with its causes and the process exits with status 1.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    keel::cli::run(keel::cli::Cli::parse())
}
