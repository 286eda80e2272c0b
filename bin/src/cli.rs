//! The command line: clap's derive definitions and `run`, which dispatches to
//! each command. Errors are `anyhow` here; `main` prints them and exits 1.

use std::io;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::{demo, mock_llm, serve};

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
    /// Run the daemon: the HTTP + SSE API over the store in KEEL_DATA_DIR,
    /// on KEEL_ADDR (127.0.0.1:7777). With no provider configured it runs
    /// the built-in fake provider. SIGTERM or Ctrl-C stop it gracefully.
    Serve {
        /// A keel.toml to read (default: KEEL_CONFIG, else ./keel.toml if
        /// present). Environment variables win over it.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Walk one conversation on the real runtime: a daemon and the fake
    /// provider in this process, on loopback, over a temporary data dir; a
    /// streamed answer, an approved `bash` call, a cancel mid-tool, a crash
    /// and recovery, and the log. Removes everything it made.
    Demo {
        /// Print one JSON object per line instead of a trace for people.
        #[arg(long)]
        json: bool,
    },
    /// Serve a fake LLM provider that speaks the Anthropic Messages and
    /// OpenAI Chat Completions wire formats and injects faults on demand, so
    /// keel runs with no key and every failure path can be tested.
    MockLlm {
        /// Port to listen on; 0 picks a free one. The first line printed
        /// says which: `mock-llm listening on http://HOST:PORT`.
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// A JSON file of scripted replies and faults, served one per
        /// request, in order, before the default behaviour resumes.
        #[arg(long, value_name = "FILE")]
        script: Option<PathBuf>,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    let outcome = match cli.command {
        Command::Serve { config } => serve::run(serve::Options { config }),
        Command::Demo { json } => {
            let format = if json {
                demo::Format::Json
            } else {
                demo::Format::Human
            };
            let stdout = io::stdout().lock();
            demo::run(io::BufWriter::new(stdout), format)
        }
        Command::MockLlm { port, host, script } => {
            mock_llm::run(mock_llm::Options { host, port, script })
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
    fn mock_llm_takes_a_port_a_host_and_a_script() {
        let cli = Cli::try_parse_from(["keel", "mock-llm", "--port", "0"]).unwrap();
        let Command::MockLlm { port, host, script } = cli.command else {
            panic!("mock-llm parses to Command::MockLlm")
        };
        assert_eq!((port, host.as_str(), script), (0, "127.0.0.1", None));
        let cli = Cli::try_parse_from([
            "keel", "mock-llm", "--port", "8089", "--host", "0.0.0.0", "--script", "s.json",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::MockLlm { port: 8089, ref host, script: Some(ref script) }
                if host == "0.0.0.0" && script == &PathBuf::from("s.json")
        ));
    }

    #[test]
    fn a_broken_pipe_is_recognised_through_context() {
        let err = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("writing the trace");
        assert!(is_broken_pipe(&err));
        assert!(!is_broken_pipe(&anyhow::anyhow!("something else")));
    }
}
