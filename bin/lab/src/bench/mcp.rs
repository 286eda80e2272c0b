//! The MCP run of `keel bench` (`--only mcp`, docs/bench.md, "MCP tool
//! calls"): tool turns that call a tool of an MCP server, beside `bash`
//! tool turns at the same sizes, and cancel to idle while an MCP call is
//! in flight. The server is the daemon's `bench`: one the bench hands its
//! own daemon (`KEEL_MCP_SERVERS={"bench": …}`, from `--mcp-server`), or
//! the one the daemon at `--addr` was configured with. It is meant to be
//! `tests/mcp/slow_server.py` (tools `echo` and `slow`; `started ID` and
//! `cancelled ID` noted in the file `$SLOW_LOG`, which the bench sets for
//! a server it hands its daemon).
//!
//! keel's CPU is the daemon's process alone, as in every run; the server
//! is a process of its own (a child of the daemon for stdio), whose CPU
//! is read apart where it can be found: the daemon's child processes that
//! are not keel (its `keel spawner` is), and their descendants.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use serde::Serialize;
use serde_json::Value;

use keel_api::client::{Client, Frame};
use keel_api::types::{ApiEventKind, ApiLiveEvent, ApiState};
use keel_test_support as rig;

use super::runs::{create_many_with, latency, ms, open, turn_run, turns_of, Latency, Turns};

/// The name the daemon knows the measured server by.
pub const SERVER: &str = "bench";
/// The message of an MCP tool turn: the fake provider makes it one call
/// of the server's `echo`, and answers its result with text.
const ECHO: &str = r#"call: mcp__bench__echo {"message": "hi"}"#;
/// A call that runs until it is cancelled.
const SLOW: &str = r#"call: mcp__bench__slow {"seconds": 60}"#;
/// The tools the run needs: `echo` for turns, `slow` for cancels.
const ECHO_TOOL: &str = "mcp__bench__echo";
const SLOW_TOOL: &str = "mcp__bench__slow";
/// How long the first call may wait for the server to start, and a `slow`
/// call for the server's `started` note.
const START_PATIENCE: Duration = Duration::from_secs(90);
/// How long a cancel may take to reach the server's notes before it
/// counts as not seen.
const CANCEL_NOTE_PATIENCE: Duration = Duration::from_secs(5);
/// How long the server's processes get to end after the daemon stopped.
const EXIT_PATIENCE: Duration = Duration::from_secs(10);

/// (conversations at once, turns each) for MCP turns (and `bash` turns
/// beside them), and the number of cancels.
#[derive(Debug, Clone)]
pub(super) struct McpSizes {
    pub(super) turns: Vec<(usize, usize)>,
    pub(super) cancels: usize,
}

/// The MCP run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct McpReport {
    /// The server's table as the bench handed it to its daemon
    /// (`KEEL_MCP_SERVERS={"bench": …}`, with the `cwd` and `SLOW_LOG` it
    /// added); `None` at `--addr`, whose own `bench` was measured.
    pub server: Option<Value>,
    /// The server's tools, as the daemon lists them.
    pub tools: Vec<String>,
    /// MCP tool turns (`call: mcp__bench__echo {"message": "hi"}`: a
    /// request, the MCP call, a request), one run per size.
    pub turns: Vec<McpTurns>,
    /// `bash` tool turns (`run: true`) at the same sizes, measured just
    /// after each MCP run, for comparison.
    pub bash_turns: Vec<Turns>,
    /// Cancel to idle with a `slow` call in flight; `None` when the server
    /// has no `slow` tool.
    pub cancel: Option<McpCancels>,
    /// The server's processes when the bench stopped its daemon (the
    /// daemon's children that are not keel, and theirs), and those still
    /// running `EXIT_PATIENCE` after it exited; `None` at `--addr`.
    pub server_processes_at_stop: Option<Vec<u32>>,
    pub server_processes_left: Option<Vec<u32>>,
    /// From the daemon's exit until the last of them was gone.
    pub server_gone_after_stop_ms: Option<f64>,
}

/// One run of MCP tool turns.
#[derive(Debug, Clone, Serialize)]
pub struct McpTurns {
    #[serde(flatten)]
    pub turns: Turns,
    /// The server's CPU (user + system of its processes, from `/proc`)
    /// per turn; `None` when none of the daemon's children is the server
    /// (a server over HTTP, or the daemon's process unknown).
    pub server_cpu_ms_per_turn: Option<f64>,
}

/// Cancels of an in-flight MCP call.
#[derive(Debug, Clone, Serialize)]
pub struct McpCancels {
    /// `POST …/cancel` until it answers, the conversation at rest (idle).
    pub to_idle: Latency,
    /// Whether each cancel waited for the server's `started` note (its
    /// notes are read), not only for the state `executing_tools`.
    pub waited_for_server: bool,
    /// Cancels the server noted (`cancelled ID` for the call's request)
    /// within `CANCEL_NOTE_PATIENCE`; `None` when its notes are not read.
    pub seen_by_server: Option<usize>,
    /// From the cancel sent to the bench reading the server's note (the
    /// file polled every millisecond); `None` when not read.
    pub to_server_note: Option<Latency>,
}

/// The server as `--mcp-server` gives it (one table of `KEEL_MCP_SERVERS`),
/// made ready for the bench's daemon, which runs in a temporary directory:
/// a relative `command` with a `/` is made absolute and `cwd` defaults to
/// `here` (the bench's own directory), so that relative paths mean what
/// they meant where the bench was started; a stdio server's `env` gets
/// `SLOW_LOG` = `notes` unless it names one. The table, and the file the
/// server notes into (`None` for a server over HTTP).
pub(super) fn prepare(
    json: &str,
    here: &Path,
    notes: &Path,
) -> anyhow::Result<(Value, Option<PathBuf>)> {
    let mut table: Value =
        serde_json::from_str(json).with_context(|| format!("--mcp-server is not JSON: {json}"))?;
    let Some(fields) = table.as_object_mut() else {
        return Err(anyhow!(
            "--mcp-server must be one server's table, a JSON object like {{\"command\": \"python\", \"args\": [\"server.py\"]}}, not {json}"
        ));
    };
    let Some(command) = fields.get("command").and_then(Value::as_str) else {
        // Over HTTP (`url`): the daemon checks the rest.
        return Ok((table, None));
    };
    if command.contains('/') && Path::new(command).is_relative() {
        let absolute = here.join(command).display().to_string();
        fields.insert("command".to_owned(), Value::String(absolute));
    }
    let cwd = match fields.get("cwd").and_then(Value::as_str) {
        Some(cwd) => here.join(cwd),
        None => here.to_path_buf(),
    };
    fields.insert("cwd".to_owned(), Value::String(cwd.display().to_string()));
    let env = fields
        .entry("env")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    let Some(env) = env.as_object_mut() else {
        return Err(anyhow!("--mcp-server's env must be a JSON object"));
    };
    let noted = match env.get("SLOW_LOG").and_then(Value::as_str) {
        Some(path) => cwd.join(path),
        None => {
            env.insert(
                "SLOW_LOG".to_owned(),
                Value::String(notes.display().to_string()),
            );
            notes.to_path_buf()
        }
    };
    Ok((table, Some(noted)))
}

/// One turn calling the server's `echo` in a new conversation, which
/// starts the server if it has not started yet and checks that a call
/// works (its result is not an error); then the server's tools as the
/// daemon lists them. An error names what is missing: the daemon has no
/// server `bench`, the server failed, it has no `echo`.
async fn warm_up(client: &Client, cwd: &str) -> anyhow::Result<Vec<String>> {
    let listed = client.mcp_servers().await?;
    if !listed.servers.iter().any(|server| server.name == SERVER) {
        let names: Vec<&str> = listed
            .servers
            .iter()
            .map(|server| server.name.as_str())
            .collect();
        return Err(anyhow!(
            "the daemon has no MCP server named {SERVER:?} (it has {names:?}); give it one (docs/bench.md, \"MCP tool calls\")"
        ));
    }
    let id = create_many_with(client, cwd, 1, &[SERVER.to_owned()])
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no conversation was created"))?;
    let mut events = open(client, &id).await?;
    let accepted = client.send_text(&id, ECHO).await?;
    let result = tokio::time::timeout(START_PATIENCE, async {
        let mut result = None;
        loop {
            if let Frame::Canonical(event) = events.next().await? {
                if event.seq <= accepted.seq {
                    continue;
                }
                match event.kind {
                    ApiEventKind::ToolResult {
                        content, is_error, ..
                    } => result = Some((content, is_error)),
                    ApiEventKind::TurnCompleted { .. } => return Ok::<_, anyhow::Error>(result),
                    ApiEventKind::TurnFailed { error, .. } => {
                        return Err(anyhow!("the first MCP turn failed: {error}"));
                    }
                    _ => {}
                }
            }
        }
    })
    .await
    .map_err(|_| anyhow!("the first MCP turn did not end within {START_PATIENCE:?}"))??;
    match result {
        Some((_, false)) => {}
        Some((content, true)) => {
            return Err(anyhow!(
                "the first call of {ECHO_TOOL} was an error: {content}"
            ))
        }
        None => return Err(anyhow!("the first MCP turn had no tool result")),
    }
    let listed = client.mcp_servers().await?;
    let server = listed
        .servers
        .into_iter()
        .find(|server| server.name == SERVER)
        .ok_or_else(|| anyhow!("the MCP server {SERVER:?} is gone"))?;
    if server.state != "ready" {
        return Err(anyhow!(
            "the MCP server {SERVER:?} is {} after a call: {}",
            server.state,
            server.error.unwrap_or_default()
        ));
    }
    if !server.tools.iter().any(|tool| tool == ECHO_TOOL) {
        return Err(anyhow!(
            "the MCP server {SERVER:?} has no tool echo(message) (its tools: {:?}); the bench's is tests/mcp/slow_server.py",
            server.tools
        ));
    }
    Ok(server.tools)
}

/// Whether `tools` (as [`warm_up`] gives them) include `slow`, which the
/// cancels need.
fn has_slow(tools: &[String]) -> bool {
    tools.iter().any(|tool| tool == SLOW_TOOL)
}

/// `conversations` conversations that use the server, each doing `each`
/// MCP tool turns one after the other, all at once ([`turns_of`]); and the
/// server's CPU over the same span.
async fn echo_turns(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    conversations: usize,
    each: usize,
) -> anyhow::Result<McpTurns> {
    let ids = create_many_with(client, cwd, conversations, &[SERVER.to_owned()]).await?;
    let before = pid.map(server_cpu).unwrap_or_default();
    let turns = turns_of(client, pid, "mcp", &ids, ECHO, each).await?;
    let after = pid.map(server_cpu).unwrap_or_default();
    let server_cpu_ms_per_turn = (!after.is_empty()).then(|| {
        let used: Duration = after
            .iter()
            .map(|(pid, cpu)| cpu.saturating_sub(before.get(pid).copied().unwrap_or_default()))
            .sum();
        ms(used) / turns.turns.max(1) as f64
    });
    Ok(McpTurns {
        turns,
        server_cpu_ms_per_turn,
    })
}

/// `bash` tool turns at the same size, for comparison.
async fn bash_beside(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    conversations: usize,
    each: usize,
) -> anyhow::Result<Turns> {
    Ok(turn_run(client, pid, cwd, "tool", conversations, each)
        .await?
        .0)
}

/// The MCP run (`--only mcp`): a first call (the server started and
/// checked), MCP tool turns and `bash` tool turns at each size, and
/// cancels of an MCP call in flight when the server has `slow`.
pub(super) async fn run(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    server: Option<serde_json::Value>,
    notes: Option<&Path>,
    sizes: &McpSizes,
    progress: &mut impl FnMut(String) -> anyhow::Result<()>,
) -> anyhow::Result<McpReport> {
    let tools = warm_up(client, cwd).await?;
    progress(format!("MCP server `{SERVER}` ready: {}", tools.join(", ")))?;
    let mut turns = Vec::with_capacity(sizes.turns.len());
    let mut bash_turns = Vec::with_capacity(sizes.turns.len());
    for &(conversations, each) in &sizes.turns {
        let run = echo_turns(client, pid, cwd, conversations, each).await?;
        let bash = bash_beside(client, pid, cwd, conversations, each).await?;
        let cpu =
            |cpu: Option<f64>| cpu.map_or("not measured".to_owned(), |cpu| format!("{cpu:.2} ms"));
        progress(format!(
            "MCP tool turns, {conversations} at once: {:.0}/s, keel CPU {} per turn (the server's {}), p50 {:.1} ms, p99 {:.1} ms; bash beside them: {:.0}/s, keel CPU {}, p50 {:.1} ms",
            run.turns.turns_per_second,
            cpu(run.turns.cpu_ms_per_turn),
            cpu(run.server_cpu_ms_per_turn),
            run.turns.latency_p50_ms,
            run.turns.latency_p99_ms,
            bash.turns_per_second,
            cpu(bash.cpu_ms_per_turn),
            bash.latency_p50_ms,
        ))?;
        turns.push(run);
        bash_turns.push(bash);
    }
    let cancel = if has_slow(&tools) {
        let cancel = mcp_cancels(client, cwd, notes, sizes.cancels).await?;
        progress(format!(
            "cancel to idle, an MCP call in flight: p50 {:.2} ms, p99 {:.2} ms ({} cancels); {}",
            cancel.to_idle.p50_ms,
            cancel.to_idle.p99_ms,
            cancel.to_idle.samples,
            cancel.seen_by_server.map_or(
                "whether the server saw them is not measured".to_owned(),
                |seen| format!("the server noted {seen} of them")
            ),
        ))?;
        Some(cancel)
    } else {
        progress("the MCP server has no tool `slow`: cancel to idle not measured".to_owned())?;
        None
    };
    Ok(McpReport {
        server,
        tools,
        turns,
        bash_turns,
        cancel,
        server_processes_at_stop: None,
        server_processes_left: None,
        server_gone_after_stop_ms: None,
    })
}

/// The MCP run's part of the text report.
pub(super) fn print(out: &mut impl Write, run: &McpReport) -> anyhow::Result<()> {
    let not_measured = "not measured".to_owned();
    let cpu = |cpu: Option<f64>| cpu.map_or(not_measured.clone(), |cpu| format!("{cpu:.2} ms"));
    writeln!(out)?;
    let server = run
        .server
        .as_ref()
        .map_or(format!("the daemon's own `{}`", SERVER), |table| {
            format!("`{}` = {table}", SERVER)
        });
    writeln!(
        out,
        "MCP tool turns (`call: mcp__bench__echo {{\"message\": \"hi\"}}`) against {server}, `bash` tool turns beside them; the server's CPU is its own processes', not keel's"
    )?;
    writeln!(
        out,
        "| turns | conversations at once | turns | turns/s | keel CPU per turn | server CPU per turn | latency p50 | p99 |"
    )?;
    writeln!(out, "| --- | --- | --- | --- | --- | --- | --- | --- |")?;
    let rows = run
        .turns
        .iter()
        .map(|mcp| (&mcp.turns, cpu(mcp.server_cpu_ms_per_turn)))
        .zip(run.bash_turns.iter().map(|bash| (bash, "-".to_owned())));
    for (mcp, bash) in rows {
        for (turns, server_cpu) in [mcp, bash] {
            writeln!(
                out,
                "| {} | {} | {} | {:.0} | {} | {server_cpu} | {:.1} ms | {:.1} ms |",
                turns.kind,
                turns.conversations,
                turns.turns,
                turns.turns_per_second,
                cpu(turns.cpu_ms_per_turn),
                turns.latency_p50_ms,
                turns.latency_p99_ms
            )?;
        }
    }
    match &run.cancel {
        Some(cancel) => {
            let waited = if cancel.waited_for_server {
                "after the server noted the call started"
            } else {
                "once the conversation was executing_tools; the server's notes are not read"
            };
            writeln!(
                out,
                "cancel to idle, an MCP call in flight ({waited}): p50 {:.2} ms, p99 {:.2} ms ({} samples)",
                cancel.to_idle.p50_ms, cancel.to_idle.p99_ms, cancel.to_idle.samples
            )?;
            match (cancel.seen_by_server, &cancel.to_server_note) {
                (Some(seen), Some(note)) => writeln!(
                    out,
                    "  the server noted {seen} of {} cancels; cancel sent to its note read: p50 {:.2} ms, p99 {:.2} ms",
                    cancel.to_idle.samples, note.p50_ms, note.p99_ms
                )?,
                _ => writeln!(
                    out,
                    "  whether the server saw each cancel: not measured (its notes, SLOW_LOG, are not known to the bench)"
                )?,
            }
        }
        None => writeln!(
            out,
            "cancel to idle, an MCP call in flight: not measured (the server has no tool `slow`)"
        )?,
    }
    match (&run.server_processes_at_stop, &run.server_processes_left) {
        (Some(at_stop), Some(left)) => writeln!(
            out,
            "the server's processes when the daemon stopped: {at_stop:?}; still running {} s after: {}",
            EXIT_PATIENCE.as_secs(),
            if left.is_empty() {
                run.server_gone_after_stop_ms.map_or("none".to_owned(), |gone| {
                    format!("none (gone {gone:.0} ms after the daemon exited)")
                })
            } else {
                format!("{left:?}")
            }
        )?,
        _ => writeln!(
            out,
            "the server's processes after the daemon stopped: not measured (a daemon the bench did not start)"
        )?,
    }
    Ok(())
}

/// `count` times in a new conversation: a `slow` call sent, waited for
/// until the conversation is `executing_tools` and (with the server's
/// `notes`) the server has noted the call `started`; then `POST …/cancel`,
/// timed until it answers with the conversation idle, and (with `notes`)
/// until the server's `cancelled` note for the call is read.
async fn mcp_cancels(
    client: &Client,
    cwd: &str,
    notes: Option<&Path>,
    count: usize,
) -> anyhow::Result<McpCancels> {
    let mut to_idle = Vec::with_capacity(count);
    let mut to_note = Vec::with_capacity(count);
    for _ in 0..count {
        let id = create_many_with(client, cwd, 1, &[SERVER.to_owned()])
            .await?
            .pop()
            .ok_or_else(|| anyhow!("no conversation was created"))?;
        let mut events = open(client, &id).await?;
        // The server's notes from here on are this call's.
        let offset = notes.map(note_length);
        client.send_text(&id, SLOW).await?;
        tokio::time::timeout(START_PATIENCE, async {
            loop {
                if let Frame::Live(ApiLiveEvent::StateChanged { state }) = events.next().await? {
                    if state == ApiState::ExecutingTools {
                        return Ok::<_, anyhow::Error>(());
                    }
                }
            }
        })
        .await
        .map_err(|_| anyhow!("a slow MCP call never became executing_tools"))??;
        let request = match (notes, offset) {
            (Some(notes), Some(offset)) => Some(
                wait_note(notes, offset, "started", None, START_PATIENCE)
                    .await
                    .ok_or_else(|| {
                        anyhow!(
                            "the MCP server noted no `started` line in {} within {START_PATIENCE:?} (the bench's server is tests/mcp/slow_server.py)",
                            notes.display()
                        )
                    })?,
            ),
            _ => None,
        };
        let started = Instant::now();
        let rest = client.cancel(&id).await?;
        to_idle.push(started.elapsed());
        if rest.state != ApiState::Idle {
            return Err(anyhow!(
                "a cancel of an MCP call left the conversation {:?}",
                rest.state
            ));
        }
        if let (Some(notes), Some(offset), Some(request)) = (notes, offset, request) {
            let seen = wait_note(
                notes,
                offset,
                "cancelled",
                Some(&request),
                CANCEL_NOTE_PATIENCE,
            )
            .await;
            if seen.is_some() {
                to_note.push(started.elapsed());
            }
        }
    }
    Ok(McpCancels {
        to_idle: latency(to_idle),
        waited_for_server: notes.is_some(),
        seen_by_server: notes.map(|_| to_note.len()),
        to_server_note: notes.map(|_| latency(to_note)),
    })
}

/// The length of the server's notes now (0 before its first).
fn note_length(notes: &Path) -> u64 {
    std::fs::metadata(notes).map_or(0, |meta| meta.len())
}

/// Polls the server's notes past `offset`, every millisecond, for a line
/// `{word} ID` (with `id`, that ID); the ID, or `None` after `patience`.
async fn wait_note(
    notes: &Path,
    offset: u64,
    word: &str,
    id: Option<&str>,
    patience: Duration,
) -> Option<String> {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(found) = find_note(&read_from(notes, offset), word, id) {
            return Some(found);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The first line of `text` that is `{word} ID` (with `id`, that ID): the
/// ID.
fn find_note(text: &str, word: &str, id: Option<&str>) -> Option<String> {
    text.lines().find_map(|line| {
        let (first, rest) = line.trim().split_once(' ')?;
        (first == word && id.is_none_or(|id| id == rest)).then(|| rest.to_owned())
    })
}

/// The file's text from byte `offset` on (empty if it cannot be read).
fn read_from(path: &Path, offset: u64) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        if file.seek(SeekFrom::Start(offset)).is_ok() {
            file.read_to_string(&mut text).ok();
        }
    }
    text
}

/// The MCP servers' processes of the daemon `daemon`: its children that
/// are not keel (its own executable: `keel spawner`), and their
/// descendants.
pub(super) fn server_processes(daemon: u32) -> Vec<u32> {
    let keel = std::fs::read_link(format!("/proc/{daemon}/exe")).ok();
    let parents: Vec<(u32, u32)> = rig::pids()
        .filter_map(|pid| Some((pid, parent(pid)?)))
        .collect();
    let mut found: Vec<u32> = parents
        .iter()
        .filter(|(pid, parent)| {
            *parent == daemon
                && rig::is_running(*pid)
                && std::fs::read_link(format!("/proc/{pid}/exe")).ok() != keel
        })
        .map(|(pid, _)| *pid)
        .collect();
    let mut next = 0;
    while next < found.len() {
        let of = found[next];
        found.extend(
            parents
                .iter()
                .filter(|(pid, parent)| *parent == of && rig::is_running(*pid))
                .map(|(pid, _)| *pid),
        );
        next += 1;
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// The parent of process `pid`, from `/proc`.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The CPU time of each of the daemon's MCP server processes.
fn server_cpu(daemon: u32) -> BTreeMap<u32, Duration> {
    server_processes(daemon)
        .into_iter()
        .filter_map(|pid| Some((pid, rig::cpu_time(pid)?)))
        .collect()
}

/// After the daemon stopped: which of `pids` still run once they are all
/// gone or `EXIT_PATIENCE` has passed, and how long until they were all
/// gone (`None` if some were not).
pub(super) async fn left_running(pids: &[u32]) -> (Vec<u32>, Option<f64>) {
    let started = Instant::now();
    loop {
        let running: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|pid| rig::is_running(*pid))
            .collect();
        if running.is_empty() {
            return (running, Some(ms(started.elapsed())));
        }
        if started.elapsed() > EXIT_PATIENCE {
            return (running, None);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_table_is_made_ready_for_the_bench_daemon() {
        let here = Path::new("/src/keel");
        let notes = Path::new("/tmp/bench/notes");
        let (table, noted) = prepare(
            r#"{"command": "venv/bin/python", "args": ["tests/mcp/slow_server.py"]}"#,
            here,
            notes,
        )
        .expect("a table");
        assert_eq!(table["command"], "/src/keel/venv/bin/python");
        assert_eq!(table["cwd"], "/src/keel");
        assert_eq!(table["env"]["SLOW_LOG"], "/tmp/bench/notes");
        assert_eq!(noted.as_deref(), Some(notes));

        // A command on PATH, a cwd and SLOW_LOG of its own are kept.
        let (table, noted) = prepare(
            r#"{"command": "python3", "cwd": "/srv", "env": {"SLOW_LOG": "slow.log"}}"#,
            here,
            notes,
        )
        .expect("a table");
        assert_eq!(table["command"], "python3");
        assert_eq!(table["cwd"], "/srv");
        assert_eq!(noted, Some(PathBuf::from("/srv/slow.log")));

        let (table, noted) =
            prepare(r#"{"url": "http://127.0.0.1:9/mcp"}"#, here, notes).expect("a table");
        assert_eq!(table, serde_json::json!({"url": "http://127.0.0.1:9/mcp"}));
        assert_eq!(noted, None);

        assert!(prepare("[1]", here, notes).is_err());
        assert!(prepare("not json", here, notes).is_err());
    }

    #[test]
    fn notes_are_found_by_word_and_id() {
        let text = "pid 7\nstarted 3\nstarted 4\ncancelled 4\n";
        assert_eq!(find_note(text, "started", None).as_deref(), Some("3"));
        assert_eq!(
            find_note(text, "cancelled", Some("4")).as_deref(),
            Some("4")
        );
        assert_eq!(find_note(text, "cancelled", Some("3")), None);
    }

    #[test]
    fn a_child_of_another_program_is_a_server_process() {
        let me = std::process::id();
        let parent = parent(me).expect("a parent");
        assert!(parent > 0);
        // A child of this process that is another program is found.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let found = server_processes(me);
        child.kill().ok();
        child.wait().ok();
        assert!(found.contains(&child.id()), "{found:?}");
    }
}
