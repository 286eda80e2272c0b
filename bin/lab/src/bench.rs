//! `keel bench`: what a user of the daemon sees, measured. It starts the
//! fake provider in this process (zero delay) and `keel serve` (this same
//! binary) as a child process over a temporary data dir, drives it over
//! HTTP and SSE as clients do, and reads the daemon's own CPU time and
//! memory from `/proc`: keel's process only, apart from the clients and
//! the fake provider (docs/bench.md). With `--addr` it measures a daemon
//! already running on this machine instead, found by its port.
//!
//! Figures: text and `bash` tool turns per second, keel's CPU per turn and
//! the turn's latency (message sent to `turn_completed` received) at
//! several numbers of conversations working at once; resident memory per
//! live idle conversation; restart to ready with every conversation
//! stored; loading one cold conversation; cancel to idle for a stream and
//! for a process tree; SSE delivery of a message to many subscribers of
//! one conversation; on-demand compaction of a conversation with 100,000
//! tokens of history, until its `compacted` event is read. Apart from the
//! full run, `--only mcp`: tool turns that call an MCP server's tool, and
//! cancel to idle with an MCP call in flight (`mcp`). And what the tool
//! sandbox costs: keel's CPU (daemon and spawner) per tool turn, confined
//! and not (`sandbox`).

use std::io::Write;
use std::time::Instant;

use anyhow::{anyhow, Context as _};
use serde::Serialize;

use keel_api::client::Client;
use keel_api::types::ApiProvider;
use keel_test_support::{self as rig, ChildDaemon};

mod mcp;
mod runs;
mod sandbox;

use mcp::McpSizes;
pub use mcp::{McpCancels, McpReport, McpTurns};
use runs::{
    cancels, compaction_run, crowded_run, fanout, idle_memory, latency, ms, shaped_run, turn_run,
};
pub use runs::{CompactionSample, Compactions, Latency, Turns};
pub use sandbox::SandboxCost;

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Small numbers, for a smoke run.
    pub quick: bool,
    pub json: bool,
    /// Measure the daemon already running at this address (on this
    /// machine) instead of starting one; its token is found as the client
    /// commands find it (`KEEL_TOKEN`, else `KEEL_DATA_DIR/token`).
    pub addr: Option<String>,
    /// The daemon's pid, for its CPU and memory; at `addr` without it, the
    /// process listening on the address's port.
    pub pid: Option<u32>,
    /// The fake provider the daemon at `addr` uses, which cancel to idle
    /// while streaming needs to script a held answer.
    pub mock_url: Option<String>,
    /// Only these runs of turns (or compaction, or MCP), and nothing else
    /// (no memory, restart, cold loads, cancels or delivery); empty for
    /// everything but MCP.
    pub only: Vec<TurnKind>,
    /// For `mcp`: the MCP server to measure, one server's table of
    /// `KEEL_MCP_SERVERS` as JSON (`{"command": …, "args": […]}`), which a
    /// daemon the bench starts gets as `bench`; a daemon at `addr` must
    /// have its own server named `bench`, and this is not used.
    pub mcp_server: Option<String>,
}

/// A kind of turn run (or the compaction run), for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TurnKind {
    Text,
    Tool,
    /// Client-shaped tool turns.
    Shaped,
    /// Tool turns with many other event streams open (`crowded_run`).
    Crowded,
    /// On-demand compaction of a long history (`compaction_run`).
    Compaction,
    /// MCP tool turns beside `bash` ones, and cancel to idle of an MCP call
    /// (`mcp`); never part of the full run, as it needs an MCP server.
    Mcp,
    /// Tool turns confined and not (`sandbox.rs`).
    Sandbox,
}

struct Sizes {
    /// (conversations at once, turns each) for text turns.
    text: Vec<(usize, usize)>,
    /// The same for tool turns.
    tool: Vec<(usize, usize)>,
    /// The same for client-shaped tool turns (`shaped_run`).
    shaped: Vec<(usize, usize)>,
    /// (event streams held open, turns) for tool turns of one conversation
    /// while that many streams of another are open (`crowded_run`).
    crowded: Vec<(usize, usize)>,
    /// (conversations, tokens of history each, rounds) for on-demand
    /// compaction (`compaction_run`); `None` for none.
    compaction: Option<(usize, u64, usize)>,
    /// MCP tool turns and cancels; `None` for none.
    mcp: Option<McpSizes>,
    /// (conversations at once, turns each, rounds) of each run of the
    /// sandbox's cost; empty for none.
    sandbox: Vec<(usize, usize, usize)>,
    cancels: usize,
    cold_loads: usize,
    /// Subscribers of one conversation, and messages sent to it.
    fanout: (usize, usize),
    /// Whether to measure more than turns (memory, restart, cold loads,
    /// cancels, delivery).
    rest: bool,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            text: vec![(1, 300), (100, 10), (10_000, 1)],
            tool: vec![(1, 100), (100, 3), (1_000, 1)],
            shaped: vec![(1, 100), (10, 30), (100, 3)],
            crowded: vec![(10_000, 100)],
            compaction: Some((5, 100_000, 20)),
            mcp: Some(McpSizes {
                turns: vec![(1, 200), (20, 10)],
                cancels: 50,
            }),
            sandbox: vec![(1, 100, 16), (100, 5, 8)],
            cancels: 20,
            cold_loads: 200,
            fanout: (1_000, 30),
            rest: true,
        }
    }

    /// Only the turn runs of `kinds` (everything but MCP when empty).
    fn keep_only(&mut self, kinds: &[TurnKind]) {
        if !kinds.contains(&TurnKind::Mcp) {
            self.mcp = None;
        }
        if kinds.is_empty() {
            return;
        }
        for (kind, runs) in [
            (TurnKind::Text, &mut self.text),
            (TurnKind::Tool, &mut self.tool),
            (TurnKind::Shaped, &mut self.shaped),
            (TurnKind::Crowded, &mut self.crowded),
        ] {
            if !kinds.contains(&kind) {
                runs.clear();
            }
        }
        if !kinds.contains(&TurnKind::Compaction) {
            self.compaction = None;
        }
        if !kinds.contains(&TurnKind::Sandbox) {
            self.sandbox = Vec::new();
        }
        self.rest = false;
    }

    fn quick() -> Sizes {
        Sizes {
            text: vec![(1, 20), (20, 2), (200, 1)],
            tool: vec![(1, 10), (10, 1)],
            shaped: vec![(1, 3)],
            crowded: vec![(20, 3)],
            compaction: Some((1, 5_000, 2)),
            mcp: Some(McpSizes {
                turns: vec![(1, 5), (5, 1)],
                cancels: 3,
            }),
            sandbox: vec![(1, 5, 2), (10, 2, 2)],
            cancels: 3,
            cold_loads: 10,
            fanout: (50, 3),
            rest: true,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    /// The daemon measured: `None` for one this bench started, else the
    /// `--addr` given.
    pub addr: Option<String>,
    /// The process whose CPU and memory were read, if known.
    pub pid: Option<u32>,
    pub turns: Vec<Turns>,
    /// On-demand compactions of long histories; `None` when `--only` left
    /// them out.
    pub compaction: Option<Compactions>,
    /// MCP tool calls; `None` unless `--only` named `mcp`.
    pub mcp: Option<McpReport>,
    /// What the tool sandbox costs; `None` when left out, or where the
    /// daemon's processes are not known.
    pub sandbox: Vec<SandboxCost>,
    /// Growth of keel's resident memory per live idle conversation, with
    /// this many live; `None` when the process is unknown.
    pub rss_per_idle_conversation_bytes: Option<f64>,
    pub live_conversations: usize,
    /// From start to `/healthz` answering, with the text runs'
    /// conversations stored (`stored_conversations`); `None` at `--addr`
    /// (the bench restarts only a daemon it started).
    pub restart_to_ready_ms: Option<f64>,
    /// Conversations stored at the restart (at `--addr`: at the end).
    pub stored_conversations: usize,
    /// `GET /v1/conversations/{id}` of a conversation just evicted (its
    /// actor stopped, so the load reads the store).
    /// (`None` for this and all below when `--only` chose turns.)
    pub cold_load: Option<Latency>,
    /// `POST …/cancel` of a streaming turn until it rests (the request's
    /// answer says the state it came to rest in); `None` at `--addr`
    /// without `--mock-url`.
    pub cancel_stream: Option<Latency>,
    /// The same while `bash` runs a process tree.
    pub cancel_process_tree: Option<Latency>,
    /// Subscribers of one conversation in `fanout`.
    pub fanout_subscribers: usize,
    /// Each message's `user_message` frame, from its publish (the earlier
    /// of the 202 and the first subscriber's read) to each subscriber's
    /// read, through keel's own client (`keel::client`).
    pub fanout: Option<Latency>,
}

pub fn run(mut out: impl Write, options: Options) -> anyhow::Result<Report> {
    let mut sizes = if options.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    sizes.keep_only(&options.only);
    // The client stands for many clients, each reading its own socket: its
    // runtime takes turns as the daemon's does (`global_queue_interval(1)`,
    // see keel-daemon's `daemon`), so that a subscriber is not read late only because this
    // one process overflowed its own run queue.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .global_queue_interval(1)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(bench(&sizes, &options, &mut out))?;
    if options.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
    } else {
        print_report(&mut out, &report)?;
    }
    Ok(report)
}

fn print_report(out: &mut impl Write, report: &Report) -> anyhow::Result<()> {
    let not_measured = "not measured".to_owned();
    writeln!(out)?;
    if let Some(addr) = &report.addr {
        let process = report
            .pid
            .map_or("its process unknown".to_owned(), |pid| format!("pid {pid}"));
        writeln!(out, "the daemon at {addr} ({process})")?;
        writeln!(out)?;
    }
    if !report.turns.is_empty() {
        writeln!(
            out,
            "| turns | conversations at once | turns | turns/s | keel CPU per turn | of it the spawner's | latency p50 | p99 |"
        )?;
        writeln!(out, "| --- | --- | --- | --- | --- | --- | --- | --- |")?;
    }
    for turns in &report.turns {
        writeln!(
            out,
            "| {}{} | {} | {} | {:.0} | {} | {} | {:.1} ms | {:.1} ms |",
            turns.kind,
            match turns.other_streams_open {
                0 => String::new(),
                streams => format!(" ({streams})"),
            },
            turns.conversations,
            turns.turns,
            turns.turns_per_second,
            turns
                .total_cpu_ms_per_turn()
                .map_or(not_measured.clone(), |cpu| format!("{cpu:.2} ms")),
            turns
                .spawner_cpu_ms_per_turn
                .map_or(not_measured.clone(), |cpu| format!("{cpu:.2} ms")),
            turns.latency_p50_ms,
            turns.latency_p99_ms
        )?;
    }
    if let Some(compactions) = &report.compaction {
        print_compactions(out, compactions)?;
    }
    if let Some(mcp) = &report.mcp {
        mcp::print(out, mcp)?;
    }
    for cost in &report.sandbox {
        sandbox::print(out, cost)?;
    }
    if report.fanout.is_none() {
        // `--only`: turns alone.
        return Ok(());
    }
    writeln!(out)?;
    let memory = report
        .rss_per_idle_conversation_bytes
        .map_or(not_measured.clone(), |bytes| {
            format!("{:.1} KiB", bytes / 1024.0)
        });
    writeln!(
        out,
        "resident memory per live idle conversation ({} live): {memory}",
        report.live_conversations,
    )?;
    let restart = report.restart_to_ready_ms.map_or(
        "not measured (a daemon the bench did not start)".to_owned(),
        |ms| format!("{ms:.1} ms"),
    );
    writeln!(
        out,
        "restart to ready with {} conversations stored: {restart}",
        report.stored_conversations
    )?;
    let fanout = format!(
        "SSE delivery to {} subscribers of one conversation",
        report.fanout_subscribers
    );
    for (what, latency) in [
        (fanout.as_str(), report.fanout.as_ref()),
        ("cold load of one conversation", report.cold_load.as_ref()),
        ("cancel to idle, streaming", report.cancel_stream.as_ref()),
        (
            "cancel to idle, process tree",
            report.cancel_process_tree.as_ref(),
        ),
    ] {
        match latency {
            Some(latency) => writeln!(
                out,
                "{what}: p50 {:.2} ms, p99 {:.2} ms ({} samples)",
                latency.p50_ms, latency.p99_ms, latency.samples
            )?,
            None => writeln!(out, "{what}: not measured (no --mock-url)")?,
        }
    }
    Ok(())
}

fn print_compactions(out: &mut impl Write, run: &Compactions) -> anyhow::Result<()> {
    let not_measured = "not measured".to_owned();
    let samples = &run.samples;
    writeln!(out)?;
    writeln!(
        out,
        "on-demand compaction at {} tokens of history: {} conversations, {} `bash` turns each, built in {:.1} s ({} keel CPU per turn)",
        run.target_tokens,
        run.conversations,
        run.turns_each,
        run.build_seconds,
        run.build_cpu_ms_per_turn
            .map_or(not_measured.clone(), |cpu| format!("{cpu:.2} ms")),
    )?;
    writeln!(
        out,
        "  POST …/compact to `compacted` read from the stream, {} compactions ({} rounds, rewound between them): p50 {:.1} ms, max {:.1} ms; keel CPU {} per compaction",
        run.compactions,
        run.rounds,
        run.wall_p50_ms,
        run.wall_max_ms,
        run.cpu_ms_per_compaction
            .map_or(not_measured.clone(), |cpu| format!("{cpu:.2} ms")),
    )?;
    writeln!(
        out,
        "  the compacted event: tokens {} before, {} after, {} messages replaced, a summary of {} bytes",
        span(samples.iter().map(|sample| sample.tokens_before)),
        span(samples.iter().map(|sample| sample.tokens_after)),
        span(samples.iter().map(|sample| u64::from(sample.replaced_messages))),
        span(samples.iter().map(|sample| sample.summary_bytes as u64)),
    )?;
    let request_bytes: Vec<u64> = samples
        .iter()
        .filter_map(|sample| sample.summary_request_bytes.map(|bytes| bytes as u64))
        .collect();
    if request_bytes.is_empty() {
        writeln!(out, "  the summary request: not measured (no --mock-url)")?;
    } else {
        writeln!(
            out,
            "  the summary request the provider received: {} bytes, {} prompt tokens (the fake's estimate), answered in {} ms",
            span(request_bytes.into_iter()),
            span(samples.iter().filter_map(|sample| sample.summary_request_prompt_tokens)),
            span(samples.iter().filter_map(|sample| sample.summary_request_ms)),
        )?;
    }
    Ok(())
}

/// `a` when every value is `a`, else `least-most`; `-` for none.
fn span(values: impl Iterator<Item = u64>) -> String {
    let (least, most) = values.fold((u64::MAX, 0), |(least, most), value| {
        (least.min(value), most.max(value))
    });
    match (least, most) {
        (u64::MAX, 0) => "-".to_owned(),
        (least, most) if least == most => least.to_string(),
        (least, most) => format!("{least}-{most}"),
    }
}

/// The daemon measured: one this bench started (over its own temporary
/// data dir, against the fake provider in this process), or one already
/// running at `--addr`.
struct Target {
    own: Option<ChildDaemon>,
    client: Client,
    /// The pid of the daemon at `--addr`, if known.
    pid_at: Option<u32>,
    mock_url: Option<String>,
}

impl Target {
    /// `mcp_servers`: the daemon's `KEEL_MCP_SERVERS`, if the bench starts
    /// it (set even when `{}`, so that none comes from the bench's own
    /// environment, which the daemon inherits).
    async fn start(
        options: &Options,
        dir: &std::path::Path,
        mcp_servers: &str,
    ) -> anyhow::Result<Target> {
        let Some(addr) = &options.addr else {
            let mock_url =
                crate::mock_llm::start_in_process(crate::mock_llm::Settings::default()).await?;
            let mut daemon = ChildDaemon::new(dir, &mock_url, "keel-bench")?;
            daemon.env("KEEL_MCP_SERVERS", mcp_servers);
            // The sandbox's cost is measured beside unconfined tool runs.
            daemon.env("KEEL_SANDBOX_FULL_ACCESS", "allow");
            daemon.spawn()?;
            let client = daemon.client();
            daemon.ready(&client).await?;
            return Ok(Target {
                own: Some(daemon),
                client,
                pid_at: None,
                mock_url: Some(mock_url),
            });
        };
        let client = Client::from_env_at(addr);
        client
            .health()
            .await
            .with_context(|| format!("no keel daemon answers at {addr}"))?;
        let pid_at = options
            .pid
            .or_else(|| rig::port_of(addr).and_then(rig::listener_pid));
        Ok(Target {
            own: None,
            client,
            pid_at,
            mock_url: options.mock_url.clone(),
        })
    }

    /// The daemon's process now, if known.
    fn pid(&self) -> Option<u32> {
        match &self.own {
            Some(daemon) => daemon.pid(),
            None => self.pid_at,
        }
    }
}

/// A run's CPU for its progress line: keel's per turn (the daemon and
/// its spawner), and the spawner's part of it.
fn cpu_note(run: &Turns) -> String {
    match (run.total_cpu_ms_per_turn(), run.spawner_cpu_ms_per_turn) {
        (None, _) => String::new(),
        (Some(total), None) => format!(", {total:.2} ms CPU per turn"),
        (Some(total), Some(spawner)) => {
            format!(", {total:.2} ms CPU per turn ({spawner:.2} ms of it the spawner's)")
        }
    }
}

async fn bench(sizes: &Sizes, options: &Options, out: &mut impl Write) -> anyhow::Result<Report> {
    let temp = tempfile::Builder::new()
        .prefix("keel-bench-")
        .tempdir()
        .context("creating a temporary directory")?;
    let workdir = temp.path().join("work");
    std::fs::create_dir_all(&workdir).context("creating the conversations' directory")?;
    // The MCP server a daemon of the bench's own gets, and where it notes
    // what it does.
    let (mcp_table, mcp_notes) = match (&sizes.mcp, &options.addr, &options.mcp_server) {
        (Some(_), None, Some(json)) => {
            let here = std::env::current_dir().context("reading the current directory")?;
            let (table, notes) = mcp::prepare(json, &here, &temp.path().join("mcp-notes"))?;
            (Some(table), notes)
        }
        (Some(_), None, None) => {
            return Err(anyhow!(
                "--only mcp needs the MCP server to measure: --mcp-server '{{\"command\": \"python\", \"args\": [\"tests/mcp/slow_server.py\"]}}' or KEEL_BENCH_MCP_SERVER (docs/bench.md)"
            ));
        }
        _ => (None, None),
    };
    let mcp_servers = match &mcp_table {
        Some(table) => serde_json::json!({ mcp::SERVER: table }).to_string(),
        None => "{}".to_owned(),
    };
    let mut target = Target::start(options, temp.path(), &mcp_servers).await?;
    let client = target.client.clone();
    let quiet = options.json;
    let mut progress = |line: String| -> anyhow::Result<()> {
        if !quiet {
            writeln!(out, "{line}")?;
            out.flush()?;
        }
        Ok(())
    };
    if let Some(addr) = &options.addr {
        progress(match target.pid() {
            Some(pid) => format!("the daemon at {addr}: pid {pid}"),
            None => format!(
                "the daemon at {addr}: its process is not on this machine or not readable, so CPU and memory are not measured (--pid gives it)"
            ),
        })?;
    }
    let cwd = workdir.display().to_string();
    let mut turns = Vec::new();
    let mut all_ids = Vec::new();
    let mut restart = None;
    for (kind, runs) in [("text", &sizes.text), ("tool", &sizes.tool)] {
        for &(conversations, each) in runs {
            let (run, ids) =
                turn_run(&client, target.pid(), &cwd, kind, conversations, each).await?;
            let cpu = cpu_note(&run);
            progress(format!(
                "{kind} turns, {conversations} at once: {:.0}/s{cpu}, p50 {:.1} ms, p99 {:.1} ms",
                run.turns_per_second, run.latency_p50_ms, run.latency_p99_ms
            ))?;
            turns.push(run);
            all_ids.extend(ids);
        }
        if kind == "tool" {
            // The bench's own daemon reaches the fake provider over
            // OpenAI's wire; one at `--addr` is named its fake provider.
            let provider = if target.own.is_some() {
                ApiProvider::OpenAi
            } else {
                ApiProvider::Mock
            };
            for &(conversations, each) in &sizes.shaped {
                let run =
                    shaped_run(&client, target.pid(), &cwd, provider, conversations, each).await?;
                let cpu = cpu_note(&run);
                progress(format!(
                    "client-shaped tool turns, {conversations} at once: {:.0}/s{cpu}, p50 {:.1} ms, p99 {:.1} ms",
                    run.turns_per_second, run.latency_p50_ms, run.latency_p99_ms
                ))?;
                turns.push(run);
            }
            for &(streams, each) in &sizes.crowded {
                let run = crowded_run(&client, target.pid(), &cwd, streams, each).await?;
                let cpu = cpu_note(&run);
                progress(format!(
                    "tool turns with {streams} other streams open: {:.0}/s{cpu}, p50 {:.1} ms, p99 {:.1} ms",
                    run.turns_per_second, run.latency_p50_ms, run.latency_p99_ms
                ))?;
                turns.push(run);
            }
        }
        if kind == "text" && sizes.rest {
            // Restart with the text runs' conversations stored (10,000 and
            // a few in the full run), a daemon of our own only.
            if let Some(daemon) = target.own.as_mut() {
                let stored = client.list(true).await?.conversations.len();
                daemon.stop()?;
                daemon.spawn()?;
                let ready = daemon.ready(&client).await?;
                progress(format!(
                    "restart to ready with {stored} stored: {:.1} ms",
                    ms(ready)
                ))?;
                restart = Some((ms(ready), stored));
            }
        }
    }

    let compaction = match sizes.compaction {
        Some((conversations, tokens, rounds)) => {
            let run = compaction_run(
                &client,
                target.pid(),
                target.mock_url.as_deref(),
                &cwd,
                conversations,
                tokens,
                rounds,
            )
            .await?;
            let cpu = run
                .cpu_ms_per_compaction
                .map_or(String::new(), |cpu| format!(", {cpu:.2} ms CPU each"));
            progress(format!(
                "on-demand compaction at {tokens} tokens, {} compactions of {conversations} conversations ({} turns each, built in {:.1} s): p50 {:.1} ms, max {:.1} ms{cpu}",
                run.compactions, run.turns_each, run.build_seconds, run.wall_p50_ms, run.wall_max_ms
            ))?;
            Some(run)
        }
        None => None,
    };

    let mut sandbox = Vec::new();
    for &run in &sizes.sandbox {
        let Some(pid) = target.pid() else {
            progress("tool sandbox: not measured (the daemon's process is not known)".to_owned())?;
            break;
        };
        let Some(cost) = sandbox::run(&client, pid, &cwd, run).await? else {
            progress("tool sandbox: not measured (the daemon does not allow full-access to compare with: KEEL_SANDBOX_FULL_ACCESS=allow)".to_owned())?;
            break;
        };
        progress(format!(
            "tool sandbox, {} at once: {:.3} ms keel CPU per tool turn confined, {:.3} ms unconfined: +{:.3} ms",
            cost.at_once, cost.confined_cpu_ms, cost.unconfined_cpu_ms, cost.overhead_cpu_ms
        ))?;
        sandbox.push(cost);
    }

    let mut mcp = match &sizes.mcp {
        Some(mcp_sizes) => {
            if options.addr.is_some() && options.mcp_server.is_some() {
                progress(format!(
                    "--mcp-server is not used at --addr: the daemon's own MCP server `{}` is measured",
                    mcp::SERVER
                ))?;
            }
            Some(
                mcp::run(
                    &client,
                    target.pid(),
                    &cwd,
                    mcp_table,
                    mcp_notes.as_deref(),
                    mcp_sizes,
                    &mut progress,
                )
                .await?,
            )
        }
        None => None,
    };

    if !sizes.rest {
        if let Some(daemon) = target.own.as_mut() {
            // The MCP server's processes must end with the daemon.
            let servers = match (&mcp, daemon.pid()) {
                (Some(_), Some(pid)) => Some(mcp::server_processes(pid)),
                _ => None,
            };
            daemon.stop()?;
            if let (Some(servers), Some(run)) = (servers, mcp.as_mut()) {
                let (left, gone) = mcp::left_running(&servers).await;
                progress(format!(
                    "the MCP server's processes when the daemon stopped: {servers:?}; still running after: {left:?}"
                ))?;
                run.server_processes_at_stop = Some(servers);
                run.server_processes_left = Some(left);
                run.server_gone_after_stop_ms = gone;
            }
        }
        return Ok(Report {
            addr: options.addr.clone(),
            pid: target.pid_at,
            turns,
            compaction,
            mcp,
            sandbox,
            rss_per_idle_conversation_bytes: None,
            live_conversations: 0,
            restart_to_ready_ms: None,
            stored_conversations: 0,
            cold_load: None,
            cancel_stream: None,
            cancel_process_tree: None,
            fanout_subscribers: 0,
            fanout: None,
        });
    }
    // Memory: the growth from before the largest text run to after it, per
    // conversation it left live and idle.
    let (live, per_conversation) = match target.pid() {
        Some(pid) => {
            let (live, per_conversation) = idle_memory(&client, pid, &cwd, &sizes.text).await?;
            progress(format!(
                "{:.1} KiB per live idle conversation ({live} live)",
                per_conversation / 1024.0
            ))?;
            (live, Some(per_conversation))
        }
        None => (client.actors().await?.actors.len(), None),
    };

    let cancel_stream = match &target.mock_url {
        Some(mock_url) => Some(cancels(&client, Some(mock_url), &cwd, sizes.cancels).await?),
        None => None,
    };
    let cancel_process_tree = cancels(&client, None, &cwd, sizes.cancels).await?;
    progress(format!(
        "cancel to idle: stream p50 {}, process tree p50 {:.2} ms",
        cancel_stream
            .as_ref()
            .map_or("not measured".to_owned(), |latency| format!(
                "{:.2} ms",
                latency.p50_ms
            )),
        cancel_process_tree.p50_ms
    ))?;

    let (subscribers, messages) = sizes.fanout;
    let fanout = fanout(&client, &cwd, subscribers, messages).await?;
    progress(format!(
        "SSE delivery to {subscribers} subscribers: p50 {:.2} ms, p99 {:.2} ms",
        fanout.p50_ms, fanout.p99_ms
    ))?;

    let stored = match restart {
        Some((_, stored)) => stored,
        None => client.list(true).await?.conversations.len(),
    };
    // Cold: evicted, so the load reads the store.
    let cold_ids: Vec<&String> = all_ids.iter().rev().take(sizes.cold_loads).collect();
    for id in &cold_ids {
        client.evict(id).await?;
    }
    let mut cold = Vec::new();
    for id in cold_ids {
        let started = Instant::now();
        client.get(id).await?;
        cold.push(started.elapsed());
    }
    if let Some(daemon) = target.own.as_mut() {
        daemon.stop()?;
    }
    Ok(Report {
        addr: options.addr.clone(),
        pid: target.pid_at,
        turns,
        compaction,
        mcp,
        sandbox,
        rss_per_idle_conversation_bytes: per_conversation,
        live_conversations: live,
        restart_to_ready_ms: restart.map(|(ready, _)| ready),
        stored_conversations: stored,
        cold_load: Some(latency(cold)),
        cancel_stream,
        cancel_process_tree: Some(cancel_process_tree),
        fanout_subscribers: subscribers,
        fanout: Some(fanout),
    })
}
