//! The command line: clap's derive definitions and `run`, which dispatches to
//! each command. Errors are `anyhow` here; `main` prints them and exits 1.
//!
//! The client commands (`ls`, `new`, `send`, `chat`, `log`, `inspect`,
//! `cancel`, `approve`, `deny`, `answer`, `evict`, `ps`) are clients of a
//! running daemon through keel-api's `client`, found at `KEEL_ADDR` with the
//! token from `KEEL_TOKEN` or `KEEL_DATA_DIR/token`; they live in `cli/`
//! (docs/cli.md describes them, their output and their exit codes).

pub mod chat;
pub mod commands;
pub mod output;
pub mod turn;

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use keel_api::client::Client;
use keel_api::types::{
    ApiBusyPolicy, ApiDecisionKind, ApiModelChoice, ApiNetwork, ApiProvider, ApiSandboxMode,
    ApiToolPolicy,
};
use keel_daemon::daemon;
use keel_lab::{bench, demo, drill, mock_llm};

/// How a command ends, as its exit status. Scripts branch on these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done; for `send`, the turn completed.
    Ok,
    /// The command failed: no daemon, a refused request, bad input. (2 is
    /// clap's, for a command line that does not parse.)
    Failed,
    /// `send`: the turn failed (the provider gave up, say).
    TurnFailed,
    /// `send`: the turn was interrupted (cancelled, superseded, the
    /// daemon stopped) before it completed.
    Interrupted,
    /// `send`: the turn waits for a decision on a pending call; the call
    /// ids and the commands to decide them are printed on stdout.
    Pending,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::TurnFailed => 3,
            Exit::Interrupted => 4,
            Exit::Pending => 5,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

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
    /// The process `keel serve` starts its tools' processes through
    /// (keel_actors::spawner): started by the daemon with a socket as its
    /// stdin; not for people.
    #[command(hide = true)]
    Spawner {
        /// Kill every process group it started once the runtime is gone
        /// (a node among several: its tools must not outlive it).
        #[arg(long)]
        kill_on_exit: bool,
    },
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
    /// Measure a daemon as its users see it: keel serve as a child process
    /// (or the daemon at --addr) against the fake provider at zero delay,
    /// driven over HTTP and SSE; turns per second, keel's own CPU per turn
    /// (from /proc) and latency at several numbers of conversations, memory
    /// per idle conversation, restart to ready, cold load, cancel to idle,
    /// SSE delivery to many subscribers.
    Bench {
        /// Small numbers, for a smoke run (seconds instead of minutes).
        #[arg(long)]
        quick: bool,
        /// The report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Measure the daemon already running at HOST:PORT (on this
        /// machine, using the fake provider) instead of starting one; its
        /// token as for the client commands (KEEL_TOKEN or
        /// KEEL_DATA_DIR/token). Restart to ready is then not measured.
        #[arg(long, value_name = "HOST:PORT")]
        addr: Option<String>,
        /// The pid of the daemon at --addr, for its CPU and memory; by
        /// default the process listening on that port.
        #[arg(long, requires = "addr")]
        pid: Option<u32>,
        /// The fake provider the daemon at --addr uses (`keel mock-llm`),
        /// for cancel to idle while streaming.
        #[arg(long, value_name = "URL", requires = "addr")]
        mock_url: Option<String>,
        /// Only these runs (text, tool, shaped: client-shaped tool turns,
        /// crowded: tool turns among open streams, compaction: compacting
        /// 100k tokens of history, mcp: MCP tool calls, which the full run
        /// leaves out), and nothing else; repeat or separate with commas.
        #[arg(long, value_enum, value_delimiter = ',')]
        only: Vec<bench::TurnKind>,
        /// For --only mcp: the MCP server to measure, one server's table of
        /// KEEL_MCP_SERVERS as JSON ('{"command": "python", "args":
        /// ["tests/mcp/slow_server.py"]}'), which the bench's daemon gets as
        /// `bench`; default $KEEL_BENCH_MCP_SERVER. At --addr the daemon
        /// must have its own server named `bench`.
        #[arg(long, value_name = "JSON")]
        mcp_server: Option<String>,
    },
    /// Drills that prove keel's promises against a real daemon and the fake
    /// provider, both started in this process on a temporary data dir.
    #[command(subcommand)]
    Drill(DrillCommand),
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
        /// How many of the latest requests `GET /_mock/requests` keeps
        /// (older ones are dropped, and so are the oldest once their bodies
        /// pass 64 MiB), so a long run does not grow without bound.
        #[arg(long, value_name = "N", default_value_t = mock_llm::recording::KEEP_RECORDS)]
        keep_requests: usize,
        /// Refuse a prompt estimated over this many tokens with the
        /// provider's own "too long" error (changed at run time with
        /// `POST /_mock/settings`); no limit without it.
        #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
        context_window: Option<u64>,
    },
    /// List the conversations: id, state, turns, last activity, cwd.
    Ls {
        /// Add sub-agents, with their parent.
        #[arg(long)]
        all: bool,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Create a conversation; prints its id.
    New {
        #[command(flatten)]
        options: commands::NewOptions,
        /// Print `{"id": …}`.
        #[arg(long)]
        json: bool,
    },
    /// Send a message and print the reply, tool calls and their output as
    /// they stream.
    #[command(after_help = SEND_EXIT_CODES)]
    Send {
        id: String,
        text: String,
        /// Attach an image (PNG, JPEG, GIF or WebP); repeatable.
        #[arg(long = "image", value_name = "FILE")]
        images: Vec<PathBuf>,
        /// Print every frame of the turn as a JSON line
        /// (`{"frame": "live"|"canonical"|…, "data": …}`).
        #[arg(long)]
        json: bool,
    },
    /// An interactive session: type messages, see replies stream, approve
    /// or answer calls inline. Ctrl-C cancels the running turn; Ctrl-C
    /// twice at the prompt (or Ctrl-D) leaves. Without ID, a new
    /// conversation in this directory.
    Chat {
        id: Option<String>,
        /// Print frames as JSON lines instead of text (for tools that
        /// drive a chat session).
        #[arg(long)]
        json: bool,
    },
    /// Print a conversation's log: its canonical events.
    Log {
        id: String,
        /// The first seq to print.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Then print each new event as it is stored, until Ctrl-C.
        #[arg(long)]
        follow: bool,
        /// One event a line, as the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// A conversation's state, pending calls, usage against the context
    /// window, and its live actor's memory and mailbox.
    Inspect {
        id: String,
        /// `{"conversation": …, "actor": …}` as the API gives them.
        #[arg(long)]
        json: bool,
    },
    /// Cancel the running turn; prints the state it came to rest in.
    Cancel {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending call: it runs.
    Approve {
        id: String,
        call_id: String,
        /// Run the call with this input (a JSON object) instead of the
        /// model's: recorded as an edit, and the model sees the call so.
        #[arg(long, value_name = "JSON")]
        input: Option<String>,
        /// Who decided, recorded in the log with the decision.
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Deny a pending call: the model is told it was denied.
    Deny {
        id: String,
        call_id: String,
        /// Who decided, recorded in the log with the decision.
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Answer a pending question, or give a client-run tool's output.
    Answer {
        id: String,
        call_id: String,
        text: String,
        /// Who answered, recorded in the log with the answer.
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The daemon's MCP servers (docs/mcp.md).
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Give the store's freed space back to the disk, after deleting many
    /// conversations; writes wait while it runs.
    Reclaim {
        #[arg(long)]
        json: bool,
    },
    /// Compact now: the conversation's model summarises everything before
    /// the latest turn; waits for it and prints the tokens before and after.
    Compact {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// A new conversation whose history is this one's up to a turn
    /// boundary; prints its id. The source is untouched.
    Fork {
        id: String,
        /// The last seq to copy (the end of a turn); the end of the log
        /// by default.
        #[arg(long = "at", value_name = "SEQ")]
        at: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Take the conversation back to a turn boundary: from now on the
    /// model sees the history only up to SEQ (the log keeps the rest).
    Rewind {
        id: String,
        /// The seq to go back to (the end of a turn; see `keel log`).
        #[arg(long = "to", value_name = "SEQ")]
        to: u64,
        #[arg(long)]
        json: bool,
    },
    /// Delete a conversation and its sub-agents: their logs and the images
    /// nothing else shows (refused while busy unless --force).
    Rm {
        id: String,
        /// Cancel a busy conversation first.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Save a conversation and stop its actor (refused while busy).
    Evict {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// The live actors: state, idle time, mailbox, memory.
    Ps {
        #[arg(long)]
        json: bool,
    },
}

const SEND_EXIT_CODES: &str = "\
Exit status:
  0  the turn completed
  1  the command failed (no daemon, unknown conversation, busy, bad image)
  3  the turn failed (the provider gave up; the reason is printed)
  4  the turn was interrupted (`keel cancel`, a newer message, the daemon stopping)
  5  the turn waits for a decision on a tool call: the call ids and the
     `keel approve|deny|answer` commands are printed; after deciding,
     `keel log ID --from SEQ --follow` shows the rest of the turn

keel send does not wait for a person: a script decides pending calls itself.";

fn parse_sandbox_mode(text: &str) -> Result<ApiSandboxMode, String> {
    wire_enum(text, "read-only, workspace-write or full-access")
}

/// `off`, `all`, or `HOST:PORT` entries separated by commas, checked as the
/// daemon checks them.
fn parse_network(text: &str) -> Result<ApiNetwork, String> {
    let network = match text.trim() {
        one @ ("off" | "all") => ApiNetwork::One(one.to_owned()),
        list => ApiNetwork::List(
            list.split(',')
                .map(|entry| entry.trim().to_owned())
                .collect(),
        ),
    };
    network.to_core()?;
    Ok(network)
}

fn parse_provider(text: &str) -> Result<ApiProvider, String> {
    wire_enum(text, "anthropic, openai or mock")
}

/// `PROVIDER` or `PROVIDER/MODEL`.
fn parse_fallback(text: &str) -> Result<ApiModelChoice, String> {
    let (provider, model) = match text.split_once('/') {
        Some((provider, model)) if !model.trim().is_empty() => {
            (provider, Some(model.trim().to_owned()))
        }
        Some(_) => return Err(format!("{text:?} names no model after the /")),
        None => (text, None),
    };
    Ok(ApiModelChoice {
        provider: parse_provider(provider.trim())?,
        model,
    })
}

fn parse_busy_policy(text: &str) -> Result<ApiBusyPolicy, String> {
    wire_enum(text, "reject, interrupt or queue")
}

fn parse_tool(text: &str) -> Result<(String, ApiToolPolicy), String> {
    let (name, policy) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: give NAME=POLICY, such as bash=approve"))?;
    Ok((
        name.to_owned(),
        wire_enum(policy, "auto, approve, client or deny")?,
    ))
}

/// `keel mcp …`.
#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// The configured MCP servers: transport, state, tools, and tools left
    /// out with why.
    Ls {
        #[arg(long)]
        json: bool,
    },
}

/// `keel drill …`.
#[derive(Debug, Subcommand)]
pub enum DrillCommand {
    /// Kill a daemon with SIGKILL again and again while conversations
    /// stream, run tools, wait for approvals and retry; restart it on the
    /// same data dir and check after every restart that every acknowledged
    /// event is in the log, seqs are contiguous, every tool call has one
    /// result, pending approvals still wait, no tool process outlived its
    /// daemon, and at the end that nothing stays busy and no side effect
    /// ran twice under different ids. Exits 1 on any violation.
    Crash {
        /// Conversations working at once.
        #[arg(long, default_value_t = 6)]
        conversations: usize,
        /// How many times to kill the daemon.
        #[arg(long, default_value_t = 20)]
        kills: usize,
        /// Fixes the workload and the kill schedule (printed when not given).
        #[arg(long)]
        seed: Option<u64>,
        /// Aim every kill at this effect boundary (see docs/drills.md).
        #[arg(long, value_enum, default_value_t = drill::crash::Boundary::Any)]
        at: drill::crash::Boundary,
        /// The report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Drill the daemon running on this machine at HOST:PORT instead of
        /// one of the drill's own: it is killed with SIGKILL and must come
        /// back (a supervisor, or --restart). Its token comes from
        /// KEEL_TOKEN or KEEL_DATA_DIR, as for the client commands; it must
        /// offer the fake provider as `mock` (KEEL_MOCK_URL).
        #[arg(long, value_name = "HOST:PORT")]
        addr: Option<String>,
        /// The fake provider the daemon at --addr uses (`keel mock-llm`), so
        /// the drill can queue provider faults there; without it, none are.
        #[arg(long, value_name = "URL", requires = "addr")]
        mock_url: Option<String>,
        /// A shell command (`sh -c`) that starts the daemon at --addr again,
        /// run after every kill; leave it out when a supervisor restarts it.
        #[arg(long, value_name = "CMD", requires = "addr")]
        restart: Option<String>,
    },
    /// Start PostgreSQL and several `keel serve` nodes over it (docs/nodes.md),
    /// drive conversations through random nodes, and SIGKILL or pause
    /// (SIGSTOP past the lease, then SIGCONT) a node at random moments,
    /// restarting it; after each fault check what `keel drill crash` checks,
    /// plus that no two epochs interleave in a log, nothing is appended
    /// under a stale epoch, and every client stream is gap-free. Reports
    /// the time a lost node's conversations take to answer again. Needs
    /// PostgreSQL's server binaries. Exits 1 on any violation.
    Nodes {
        /// How many nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Conversations working at once.
        #[arg(long, default_value_t = 6)]
        conversations: usize,
        /// How many faults (SIGKILLs and pauses) to deal.
        #[arg(long, default_value_t = 20)]
        kills: usize,
        /// Fixes the workload and the fault schedule (printed when not given).
        #[arg(long)]
        seed: Option<u64>,
        /// Each node's lease (KEEL_NODE_LEASE_MS): how long a node not heard
        /// from keeps its conversations.
        #[arg(long, default_value_t = 1000)]
        lease_ms: u64,
        /// The report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Every fault of the fake provider (error statuses, retry-after, a cut
    /// or stalled stream, malformed SSE, an error event, a slow drip, a
    /// hang, a refused connection), in both wire formats, with and without
    /// a fallback: the states each passes through and its end state,
    /// checked against the expected one. Exits 1 if any case differs.
    Faults {
        /// Only the faults whose name contains this (`429`, `stall`, …).
        #[arg(long)]
        only: Option<String>,
        /// One JSON object per case, then `{"summary": …}`.
        #[arg(long)]
        json: bool,
    },
}

/// The fake provider `keel serve` starts in its own process when no
/// provider is configured: the lab's, which the daemon does not know
/// (its context window from `KEEL_MOCK_CONTEXT_WINDOW`).
fn start_fake_provider() -> futures_util::future::BoxFuture<'static, anyhow::Result<String>> {
    Box::pin(mock_llm::start_builtin())
}

/// A value of one of the API's enums by its wire name.
fn wire_enum<T: serde::de::DeserializeOwned>(text: &str, expected: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("{text:?} is not one of {expected}"))
}

pub fn run(cli: Cli) -> anyhow::Result<Exit> {
    let outcome = match cli.command {
        Command::Spawner { kill_on_exit } => keel_actors::spawner::serve_stdin(kill_on_exit)
            .context("serving as the process spawner")
            .map(|()| Exit::Ok),
        Command::Serve { config } => daemon::run(daemon::Options {
            config,
            fake_provider: Some(start_fake_provider),
        })
        .map(|()| Exit::Ok),
        Command::Demo { json } => {
            let format = if json {
                demo::Format::Json
            } else {
                demo::Format::Human
            };
            let stdout = io::stdout().lock();
            demo::run(io::BufWriter::new(stdout), format).map(|()| Exit::Ok)
        }
        Command::MockLlm {
            port,
            host,
            script,
            keep_requests,
            context_window,
        } => mock_llm::run(mock_llm::Options {
            host,
            port,
            script,
            keep_requests,
            context_window,
        })
        .map(|()| Exit::Ok),
        Command::Bench {
            quick,
            json,
            addr,
            pid,
            mock_url,
            only,
            mcp_server,
        } => {
            let stdout = io::stdout().lock();
            let options = bench::Options {
                quick,
                json,
                addr,
                pid,
                mock_url,
                only,
                mcp_server: mcp_server
                    .or_else(|| std::env::var("KEEL_BENCH_MCP_SERVER").ok())
                    .filter(|json| !json.trim().is_empty()),
            };
            bench::run(io::LineWriter::new(stdout), options).map(|_| Exit::Ok)
        }
        Command::Drill(DrillCommand::Crash {
            conversations,
            kills,
            seed,
            at,
            json,
            addr,
            mock_url,
            restart,
        }) => {
            let stdout = io::stdout().lock();
            let report = drill::crash::run(
                io::LineWriter::new(stdout),
                drill::crash::Options {
                    conversations,
                    kills,
                    seed,
                    at,
                    json,
                    addr,
                    mock_url,
                    restart,
                },
            )?;
            Ok(if report.violations.is_empty() {
                Exit::Ok
            } else {
                Exit::Failed
            })
        }
        Command::Drill(DrillCommand::Nodes {
            nodes,
            conversations,
            kills,
            seed,
            lease_ms,
            json,
        }) => {
            let stdout = io::stdout().lock();
            let report = drill::nodes::run(
                io::LineWriter::new(stdout),
                drill::nodes::Options {
                    nodes,
                    conversations,
                    kills,
                    seed,
                    lease_ms,
                    json,
                },
            )?;
            Ok(if report.violations.is_empty() {
                Exit::Ok
            } else {
                Exit::Failed
            })
        }
        Command::Drill(DrillCommand::Faults { only, json }) => {
            let stdout = io::stdout().lock();
            let report = drill::faults::run(
                io::LineWriter::new(stdout),
                drill::faults::Options { only, json },
            )?;
            Ok(if report.all_passed() {
                Exit::Ok
            } else {
                Exit::Failed
            })
        }
        client_command => run_client(client_command),
    };
    match outcome {
        // `keel demo | head` closes the pipe early; that is the reader's
        // choice, not a failure.
        Err(err) if is_broken_pipe(&err) => Ok(Exit::Ok),
        other => other,
    }
}

/// A client command, on a runtime of its own (one thread: a client waits
/// on one daemon at a time).
fn run_client(command: Command) -> anyhow::Result<Exit> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = Client::from_env();
    runtime.block_on(async move {
        match command {
            Command::Ls { all, json } => commands::ls(&client, all, json).await,
            Command::New { options, json } => commands::new(&client, options, json).await,
            Command::Send {
                id,
                text,
                images,
                json,
            } => turn::send(&client, &id, text, &images, json).await,
            Command::Chat { id, json } => chat::run(client, id, json).await,
            Command::Log {
                id,
                from,
                follow,
                json,
            } => commands::log(&client, &id, from, follow, json).await,
            Command::Inspect { id, json } => commands::inspect(&client, &id, json).await,
            Command::Cancel { id, json } => commands::cancel(&client, &id, json).await,
            Command::Approve {
                id,
                call_id,
                input,
                by,
                json,
            } => match input {
                None => {
                    let decision = ApiDecisionKind::Approve;
                    commands::resolve(&client, &id, &call_id, decision, None, by, json).await
                }
                Some(input) => {
                    commands::approve_edited(&client, &id, &call_id, &input, by, json).await
                }
            },
            Command::Deny {
                id,
                call_id,
                by,
                json,
            } => {
                let decision = ApiDecisionKind::Deny;
                commands::resolve(&client, &id, &call_id, decision, None, by, json).await
            }
            Command::Answer {
                id,
                call_id,
                text,
                by,
                json,
            } => {
                let decision = ApiDecisionKind::Answer;
                commands::resolve(&client, &id, &call_id, decision, Some(text), by, json).await
            }
            Command::Evict { id, json } => commands::evict(&client, &id, json).await,
            Command::Rm { id, force, json } => commands::rm(&client, &id, force, json).await,
            Command::Compact { id, json } => commands::compact(&client, &id, json).await,
            Command::Reclaim { json } => commands::reclaim(&client, json).await,
            Command::Mcp(McpCommand::Ls { json }) => commands::mcp_ls(&client, json).await,
            Command::Fork { id, at, json } => commands::fork(&client, &id, at, json).await,
            Command::Rewind { id, to, json } => commands::rewind(&client, &id, to, json).await,
            Command::Ps { json } => commands::ps(&client, json).await,
            Command::Serve { .. }
            | Command::Spawner { .. }
            | Command::Demo { .. }
            | Command::Drill(_)
            | Command::Bench { .. }
            | Command::MockLlm { .. } => Ok(Exit::Ok),
        }
    })
}

/// An error for a person: a client error that says what to do is shown
/// alone (its transport cause would only distract), anything else with
/// its causes on one line.
pub fn describe_error(error: &anyhow::Error) -> String {
    // A client error's message says what to do; what lies under it (the
    // transport's error) is noise, but what a command said above it (the
    // drill that stopped, and where it kept its directory) is not.
    let mut said = Vec::new();
    for cause in error.chain() {
        said.push(cause.to_string());
        if let Some(client_error) = cause.downcast_ref::<keel_api::client::Error>() {
            if client_error.code().is_some()
                || matches!(client_error, keel_api::client::Error::NoDaemon { .. })
            {
                return said.join(": ");
            }
        }
    }
    format!("{error:#}")
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
    fn a_client_error_is_told_with_what_was_said_above_it_and_nothing_under_it() {
        let no_daemon = || {
            let client = keel_api::client::Client::new("127.0.0.1:1", None);
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(client.health())
                .unwrap_err()
        };
        let bare = anyhow::Error::new(no_daemon());
        assert_eq!(
            describe_error(&bare),
            "no daemon at 127.0.0.1:1: start one with `keel serve`"
        );
        let wrapped = anyhow::Error::new(no_daemon()).context("the drill stopped (seed 7)");
        assert_eq!(
            describe_error(&wrapped),
            "the drill stopped (seed 7): no daemon at 127.0.0.1:1: start one with `keel serve`"
        );
        let other = anyhow::anyhow!("inner").context("outer");
        assert_eq!(describe_error(&other), "outer: inner");
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
        let Command::MockLlm {
            port,
            host,
            script,
            keep_requests,
            context_window,
        } = cli.command
        else {
            panic!("mock-llm parses to Command::MockLlm")
        };
        assert_eq!((port, host.as_str(), script), (0, "127.0.0.1", None));
        assert_eq!(keep_requests, mock_llm::recording::KEEP_RECORDS);
        assert_eq!(context_window, None, "no limit unless asked");
        let cli = Cli::try_parse_from([
            "keel",
            "mock-llm",
            "--port",
            "8089",
            "--host",
            "0.0.0.0",
            "--script",
            "s.json",
            "--keep-requests",
            "5",
            "--context-window",
            "8000",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::MockLlm {
                port: 8089,
                ref host,
                script: Some(ref script),
                keep_requests: 5,
                context_window: Some(8000),
            } if host == "0.0.0.0" && script == &PathBuf::from("s.json")
        ));
        let zero = Cli::try_parse_from(["keel", "mock-llm", "--context-window", "0"]);
        assert!(zero.is_err(), "a window of no tokens refuses everything");
    }

    #[test]
    fn new_takes_the_api_s_names_for_its_choices() {
        let cli = Cli::try_parse_from([
            "keel",
            "new",
            "--busy-policy",
            "queue",
            "--provider",
            "openai",
            "--tool",
            "bash=approve",
            "--tool",
            "ask=client",
        ])
        .unwrap();
        let Command::New {
            options:
                commands::NewOptions {
                    busy_policy,
                    provider,
                    tools,
                    ..
                },
            ..
        } = cli.command
        else {
            panic!("new parses to Command::New")
        };
        assert_eq!(busy_policy, Some(ApiBusyPolicy::Queue));
        assert_eq!(provider, Some(ApiProvider::OpenAi));
        assert_eq!(
            tools,
            [
                ("bash".to_owned(), ApiToolPolicy::Approve),
                ("ask".to_owned(), ApiToolPolicy::Client)
            ]
        );
        assert!(Cli::try_parse_from(["keel", "new", "--tool", "bash"]).is_err());
        assert!(Cli::try_parse_from(["keel", "new", "--busy-policy", "wait"]).is_err());
    }

    #[test]
    fn a_fallback_is_a_provider_and_maybe_a_model() {
        assert_eq!(
            parse_fallback("openai/gpt-4o"),
            Ok(ApiModelChoice {
                provider: ApiProvider::OpenAi,
                model: Some("gpt-4o".to_owned()),
            })
        );
        assert_eq!(
            parse_fallback("anthropic"),
            Ok(ApiModelChoice {
                provider: ApiProvider::Anthropic,
                model: None,
            })
        );
        assert!(parse_fallback("openai/").is_err());
        assert!(parse_fallback("gemini/pro").is_err());
        let cli = Cli::try_parse_from(["keel", "new", "--fallback", "mock/m"]).unwrap();
        let Command::New { options, .. } = cli.command else {
            panic!("new parses to Command::New")
        };
        assert_eq!(
            options.fallback.map(|fallback| fallback.provider),
            Some(ApiProvider::Mock)
        );
    }

    #[test]
    fn drill_faults_takes_a_filter_and_json() {
        let cli =
            Cli::try_parse_from(["keel", "drill", "faults", "--only", "429", "--json"]).unwrap();
        let Command::Drill(DrillCommand::Faults { only, json }) = cli.command else {
            panic!("drill faults parses to Command::Drill")
        };
        assert_eq!(only.as_deref(), Some("429"));
        assert!(json);
    }

    #[test]
    fn new_lets_the_file_tools_leave_the_working_directory_only_when_asked() {
        let allowed = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            let Command::New { options, .. } = cli.command else {
                panic!("new parses to Command::New")
            };
            commands::create_request(options)
                .unwrap()
                .tools_may_leave_cwd
        };
        assert!(!allowed(&["keel", "new"]));
        assert!(allowed(&["keel", "new", "--tools-may-leave-cwd"]));
    }

    #[test]
    fn new_takes_a_sandbox_and_a_network() {
        let sandbox = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            let Command::New { options, .. } = cli.command else {
                panic!("new parses to Command::New")
            };
            commands::create_request(options).unwrap().sandbox
        };
        assert_eq!(sandbox(&["keel", "new"]), None);
        assert_eq!(
            sandbox(&[
                "keel",
                "new",
                "--sandbox",
                "read-only",
                "--network",
                "*:443,*:80"
            ]),
            Some(keel_api::types::ApiSandbox {
                mode: Some(ApiSandboxMode::ReadOnly),
                network: Some(ApiNetwork::List(vec![
                    "*:443".to_owned(),
                    "*:80".to_owned()
                ])),
            })
        );
        assert_eq!(
            sandbox(&["keel", "new", "--network", "github.com:443,*.pypi.org:443"])
                .and_then(|sandbox| sandbox.network),
            Some(ApiNetwork::List(vec![
                "github.com:443".to_owned(),
                "*.pypi.org:443".to_owned()
            ]))
        );
        assert!(Cli::try_parse_from(["keel", "new", "--network", "git hub.com:443"]).is_err());
        assert!(Cli::try_parse_from(["keel", "new", "--sandbox", "strict"]).is_err());
    }

    #[test]
    fn every_client_command_takes_json() {
        for args in [
            vec!["ls"],
            vec!["new"],
            vec!["send", "id", "text"],
            vec!["chat"],
            vec!["log", "id"],
            vec!["inspect", "id"],
            vec!["cancel", "id"],
            vec!["approve", "id", "call"],
            vec!["deny", "id", "call"],
            vec!["answer", "id", "call", "text"],
            vec!["evict", "id"],
            vec!["ps"],
        ] {
            let mut argv = vec!["keel"];
            argv.extend(&args);
            argv.push("--json");
            assert!(Cli::try_parse_from(&argv).is_ok(), "{args:?} --json");
        }
    }

    #[test]
    fn exit_statuses_are_distinct() {
        let codes = [
            Exit::Ok,
            Exit::Failed,
            Exit::TurnFailed,
            Exit::Interrupted,
            Exit::Pending,
        ]
        .map(Exit::code);
        assert_eq!(codes, [0, 1, 3, 4, 5], "2 is clap's usage error");
    }

    #[test]
    fn a_broken_pipe_is_recognised_through_context() {
        let err = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("writing the trace");
        assert!(is_broken_pipe(&err));
        assert!(!is_broken_pipe(&anyhow::anyhow!("something else")));
    }
}
