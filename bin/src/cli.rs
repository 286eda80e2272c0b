//! The command line: clap's derive definitions and `run`, which dispatches to
//! each command. Errors are `anyhow` here; `main` prints them and exits 1.

use std::io;

use clap::{Parser, Subcommand};

use crate::demo;

#[derive(Debug, Parser)]
#[command(
    name = "keel",
    version,
    about = "keel runs LLM agent conversations that never get stuck, never lose state, and can always be stopped."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Walk one conversation through keel's pure core, in this process: a
    /// scripted model, a real `bash` tool, a cancel, and a replay of the log.
    /// No daemon and no network.
    Demo {
        /// Print one JSON object per line instead of a trace for people.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    let outcome = match cli.command {
        Command::Demo { json } => {
            let format = if json {
                demo::Format::Json
            } else {
                demo::Format::Human
            };
            let stdout = io::stdout().lock();
            demo::run(io::BufWriter::new(stdout), format)
        }
    };
    match outcome {
        // `keel demo | head` closes the pipe early; that is the reader's
        // choice, not a failure.
        Err(err) if is_broken_pipe(&err) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io_err| io_err.kind() == io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn demo_takes_an_optional_json_flag() {
        let cli = Cli::try_parse_from(["keel", "demo", "--json"]).unwrap();
        assert!(matches!(cli.command, Command::Demo { json: true }));
        let cli = Cli::try_parse_from(["keel", "demo"]).unwrap();
        assert!(matches!(cli.command, Command::Demo { json: false }));
        assert!(Cli::try_parse_from(["keel", "nonsense"]).is_err());
    }

    #[test]
    fn a_broken_pipe_is_recognised_through_context() {
        let err = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("writing the trace");
        assert!(is_broken_pipe(&err));
        assert!(!is_broken_pipe(&anyhow::anyhow!("something else")));
    }
}
