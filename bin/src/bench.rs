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
//! one conversation.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use futures_util::{Stream, StreamExt as _};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::api::types::{ApiEventKind, ApiLiveEvent, ApiProvider, ApiState, CreateConversation};
use crate::client::{Client, Error as ClientError, Events, Frame};
use crate::lab::{self, ChildDaemon, FrameScanner, Scanned, ScannedKind, TurnTally};
use crate::serve;

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
    /// Only these runs of turns, and nothing else (no memory, restart,
    /// cold loads, cancels or delivery); empty for everything.
    pub only: Vec<TurnKind>,
}

/// A kind of turn run, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TurnKind {
    Text,
    Tool,
    /// Client-shaped tool turns.
    Shaped,
    /// Tool turns with many other event streams open (`crowded_run`).
    Crowded,
}

/// Conversations being created, or streams opened, at once.
const OPENING: usize = 128;
/// How long one turn may take before the bench gives up on it.
const TURN_LIMIT: Duration = Duration::from_secs(120);

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
            shaped: vec![(1, 100), (100, 3)],
            crowded: vec![(10_000, 100)],
            cancels: 20,
            cold_loads: 200,
            fanout: (1_000, 30),
            rest: true,
        }
    }

    /// Only the turn runs of `kinds` (all of everything when empty).
    fn keep_only(&mut self, kinds: &[TurnKind]) {
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
        self.rest = false;
    }

    fn quick() -> Sizes {
        Sizes {
            text: vec![(1, 20), (20, 2), (200, 1)],
            tool: vec![(1, 10), (10, 1)],
            shaped: vec![(1, 3)],
            crowded: vec![(20, 3)],
            cancels: 3,
            cold_loads: 10,
            fanout: (50, 3),
            rest: true,
        }
    }
}

/// One run of turns.
#[derive(Debug, Clone, Serialize)]
pub struct Turns {
    pub kind: &'static str,
    pub conversations: usize,
    /// Event streams of another conversation held open meanwhile.
    pub other_streams_open: usize,
    pub turns: usize,
    pub turns_per_second: f64,
    /// keel's CPU (user + system) per turn, in milliseconds; `None` when
    /// the daemon's process is unknown (`--addr` of another machine's).
    pub cpu_ms_per_turn: Option<f64>,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub samples: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    /// The daemon measured: `None` for one this bench started, else the
    /// `--addr` given.
    pub addr: Option<String>,
    /// The process whose CPU and memory were read, if known.
    pub pid: Option<u32>,
    pub turns: Vec<Turns>,
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
    // see `serve`), so that a subscriber is not read late only because this
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
    writeln!(
        out,
        "| turns | conversations at once | turns | turns/s | keel CPU per turn | latency p50 | p99 |"
    )?;
    writeln!(out, "| --- | --- | --- | --- | --- | --- | --- |")?;
    for turns in &report.turns {
        writeln!(
            out,
            "| {}{} | {} | {} | {:.0} | {} | {:.1} ms | {:.1} ms |",
            turns.kind,
            match turns.other_streams_open {
                0 => String::new(),
                streams => format!(" ({streams})"),
            },
            turns.conversations,
            turns.turns,
            turns.turns_per_second,
            turns
                .cpu_ms_per_turn
                .map_or(not_measured.clone(), |cpu| format!("{cpu:.2} ms")),
            turns.latency_p50_ms,
            turns.latency_p99_ms
        )?;
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
    async fn start(options: &Options, dir: &std::path::Path) -> anyhow::Result<Target> {
        let Some(addr) = &options.addr else {
            let mock_url = serve::start_builtin_mock().await?;
            let mut daemon = ChildDaemon::new(dir, &mock_url, "keel-bench")?;
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
            .or_else(|| lab::port_of(addr).and_then(lab::listener_pid));
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

async fn bench(sizes: &Sizes, options: &Options, out: &mut impl Write) -> anyhow::Result<Report> {
    let temp = tempfile::Builder::new()
        .prefix("keel-bench-")
        .tempdir()
        .context("creating a temporary directory")?;
    let workdir = temp.path().join("work");
    std::fs::create_dir_all(&workdir).context("creating the conversations' directory")?;
    let mut target = Target::start(options, temp.path()).await?;
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
            let cpu = run
                .cpu_ms_per_turn
                .map_or(String::new(), |cpu| format!(", {cpu:.2} ms CPU per turn"));
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
                let cpu = run
                    .cpu_ms_per_turn
                    .map_or(String::new(), |cpu| format!(", {cpu:.2} ms CPU per turn"));
                progress(format!(
                    "client-shaped tool turns, {conversations} at once: {:.0}/s{cpu}, p50 {:.1} ms, p99 {:.1} ms",
                    run.turns_per_second, run.latency_p50_ms, run.latency_p99_ms
                ))?;
                turns.push(run);
            }
            for &(streams, each) in &sizes.crowded {
                let run = crowded_run(&client, target.pid(), &cwd, streams, each).await?;
                let cpu = run
                    .cpu_ms_per_turn
                    .map_or(String::new(), |cpu| format!(", {cpu:.2} ms CPU per turn"));
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

    if !sizes.rest {
        if let Some(daemon) = target.own.as_mut() {
            daemon.stop()?;
        }
        return Ok(Report {
            addr: options.addr.clone(),
            pid: target.pid_at,
            turns,
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

/// `subscribers` streams of one conversation and `messages` messages sent
/// to it, each once the turn before it reached every subscriber: the time
/// from each message's publish to each subscriber reading its
/// `user_message` frame. The daemon publishes the frame right after the
/// append is durable and just before it answers 202, so the publish is
/// taken as the earlier of the 202 and the first subscriber's read.
async fn fanout(
    client: &Client,
    cwd: &str,
    subscribers: usize,
    messages: usize,
) -> anyhow::Result<Latency> {
    let id = create_many(client, cwd, 1)
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no conversation was created"))?;
    // Each subscriber scans its stream's bytes rather than parsing every
    // frame: the readers share the machine with the daemon they measure.
    let mut streams = Vec::with_capacity(subscribers);
    for _ in 0..subscribers {
        streams.push(ScannedStream::open(client, &id).await?);
    }
    let tally = TurnTally::new(subscribers);
    let mut readers = JoinSet::new();
    for mut stream in streams {
        let done = tally.follower();
        readers.spawn(async move {
            // (seq, read at) of every user_message frame.
            let mut reads = Vec::with_capacity(messages);
            let mut completed = 0;
            while completed < messages {
                let at = stream.fill().await?;
                while let Some(frame) = stream.frames.next_frame() {
                    match frame {
                        Scanned::Canonical {
                            seq,
                            kind: ScannedKind::UserMessage,
                        } => reads.push((seq, at)),
                        Scanned::Canonical {
                            kind: ScannedKind::TurnCompleted,
                            ..
                        } => {
                            completed += 1;
                            done.turn_completed();
                        }
                        Scanned::Error(data) => {
                            return Err(anyhow!("the daemon ended a stream: {data}"))
                        }
                        _ => {}
                    }
                }
            }
            done.finish();
            // The stream goes back open: it closes once every subscriber
            // has read every turn, so that a thousand closes are not
            // measured with the last turn's deliveries.
            Ok::<_, anyhow::Error>((reads, stream))
        });
    }
    let mut sent = Vec::with_capacity(messages);
    for message in 0..messages {
        let accepted = client.send_text(&id, &format!("fan-out {message}")).await?;
        sent.push((accepted.seq, Instant::now()));
        tokio::time::timeout(TURN_LIMIT, tally.wait_for(message + 1))
            .await
            .map_err(|_| {
                anyhow!("a turn did not reach every subscriber within {TURN_LIMIT:?}")
            })??;
    }
    let mut all_reads = Vec::with_capacity(subscribers);
    let mut open = Vec::with_capacity(subscribers);
    while let Some(joined) = readers.join_next().await {
        let (reads, stream) = joined.context("a subscriber's task failed")??;
        all_reads.push(reads);
        open.push(stream);
    }
    drop(open);
    let mut samples = Vec::with_capacity(subscribers * messages);
    for (seq, answered) in sent {
        let reads: Vec<Instant> = all_reads
            .iter()
            .filter_map(|reads| {
                reads
                    .iter()
                    .find(|(read, _)| *read == seq)
                    .map(|(_, at)| *at)
            })
            .collect();
        if reads.len() != subscribers {
            return Err(anyhow!(
                "message {seq} reached {} of {subscribers} subscribers",
                reads.len()
            ));
        }
        let published = reads.iter().copied().fold(answered, Instant::min);
        samples.extend(reads.iter().map(|at| *at - published));
    }
    Ok(latency(samples))
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn latency(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    Latency {
        p50_ms: percentile(&samples, 0.50),
        p99_ms: percentile(&samples, 0.99),
        samples: samples.len(),
    }
}

fn percentile(sorted: &[Duration], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * quantile).round() as usize;
    ms(sorted[index.min(sorted.len() - 1)])
}

/// Create `count` conversations, `OPENING` at a time.
async fn create_many(client: &Client, cwd: &str, count: usize) -> anyhow::Result<Vec<String>> {
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut tasks = JoinSet::new();
    for _ in 0..count {
        let client = client.clone();
        let gate = gate.clone();
        // The fake provider, named: a daemon at `--addr` with a real
        // provider configured must refuse rather than be billed.
        let request = CreateConversation {
            cwd: Some(cwd.to_owned()),
            provider: Some(ApiProvider::Mock),
            ..CreateConversation::default()
        };
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await;
            client.create(&request).await.map(|created| created.id)
        });
    }
    let mut ids = Vec::with_capacity(count);
    while let Some(joined) = tasks.join_next().await {
        ids.push(joined.context("a creating task failed")??);
    }
    Ok(ids)
}

/// One connection to an event stream, read as bytes and scanned.
struct ScannedStream {
    body: std::pin::Pin<Box<dyn Stream<Item = Result<bytes::Bytes, ClientError>> + Send>>,
    frames: FrameScanner,
}

impl ScannedStream {
    /// Connect and wait for the snapshot.
    async fn open(client: &Client, id: &str) -> anyhow::Result<ScannedStream> {
        let mut stream = ScannedStream {
            body: Box::pin(client.event_bytes(id).await?),
            frames: FrameScanner::default(),
        };
        loop {
            match stream.frames.next_frame() {
                Some(Scanned::Snapshot) => return Ok(stream),
                Some(other) => return Err(anyhow!("a stream began with {other:?}")),
                None => {
                    stream.fill().await?;
                }
            }
        }
    }

    /// Read the next bytes; when they came (taken before any scanning).
    async fn fill(&mut self) -> anyhow::Result<Instant> {
        let chunk = self
            .body
            .next()
            .await
            .ok_or_else(|| anyhow!("the daemon closed an event stream"))??;
        let at = Instant::now();
        self.frames.push(&chunk);
        Ok(at)
    }
}

/// Open `id`'s event stream and wait for its snapshot.
async fn open(client: &Client, id: &str) -> anyhow::Result<Events> {
    let mut events = client.events(id, None);
    match events.next().await? {
        Frame::Snapshot(_) => Ok(events),
        other => Err(anyhow!("a stream began with {other:?}")),
    }
}

/// Send `text` and read the stream to the turn's end; how long it took.
/// The send waits for a permit of `sending`: every open stream holds a
/// connection already, and 10,000 sends at once would need as many more.
async fn one_turn(
    client: &Client,
    sending: &Semaphore,
    events: &mut Events,
    id: &str,
    text: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let accepted = {
        let _permit = sending.acquire().await?;
        client.send_text(id, text).await?
    };
    let ended = tokio::time::timeout(TURN_LIMIT, async {
        loop {
            if let Frame::Canonical(event) = events.next().await? {
                match event.kind {
                    ApiEventKind::TurnCompleted { .. } if event.seq > accepted.seq => {
                        return Ok::<_, anyhow::Error>(());
                    }
                    ApiEventKind::TurnFailed { error, .. } if event.seq > accepted.seq => {
                        return Err(anyhow!("a turn failed: {error}"));
                    }
                    _ => {}
                }
            }
        }
    })
    .await;
    match ended {
        Ok(outcome) => outcome.map(|()| started.elapsed()),
        Err(_) => Err(anyhow!("a turn of {id} did not end within {TURN_LIMIT:?}")),
    }
}

/// Tool turns shaped like the clients met in the wild
/// (docs/bench.md, "Client-shaped tool turns"): each turn sends its
/// message over a new connection, then opens a new event stream from the
/// message's seq (the snapshot first) and reads it to the turn's end, and
/// closes it; the conversation talks OpenAI's wire to the fake provider
/// (the bench's own daemon; at `--addr`, `provider` says which). The same
/// figures as [`turn_run`]; keel's CPU covers the connections and the
/// snapshots, as it does for such clients.
async fn shaped_run(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    provider: ApiProvider,
    conversations: usize,
    each: usize,
) -> anyhow::Result<Turns> {
    let mut ids = Vec::with_capacity(conversations);
    for _ in 0..conversations {
        let request = CreateConversation {
            cwd: Some(cwd.to_owned()),
            provider: Some(provider),
            ..CreateConversation::default()
        };
        ids.push(client.create(&request).await?.id);
    }
    let measuring = Measuring::start(pid)?;
    let mut working = JoinSet::new();
    for id in ids {
        let client = client.clone();
        working.spawn(async move {
            let mut latencies = Vec::with_capacity(each);
            for _ in 0..each {
                latencies.push(shaped_turn(&client, &id).await?);
            }
            Ok::<_, anyhow::Error>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(conversations * each);
    while let Some(joined) = working.join_next().await {
        latencies.extend(joined.context("a turn task failed")??);
    }
    measuring.turns("tool, client-shaped", conversations, latencies)
}

/// Tool turns of one conversation, one after the other, while `streams`
/// event streams of another conversation (idle: nothing but keep-alives
/// crosses them) are open: each open stream is a descriptor in the
/// daemon's table, which a `fork` of the daemon would copy for every
/// tool it starts (docs/bench.md, "Tool turns among open streams").
async fn crowded_run(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    streams: usize,
    each: usize,
) -> anyhow::Result<Turns> {
    let quiet = create_many(client, cwd, 1).await?;
    let quiet = quiet.first().context("no conversation was created")?;
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut opening = JoinSet::new();
    for _ in 0..streams {
        let client = client.clone();
        let gate = gate.clone();
        let quiet = quiet.clone();
        opening.spawn(async move {
            let _permit = gate.acquire_owned().await;
            ScannedStream::open(&client, &quiet).await
        });
    }
    let mut open_streams = Vec::with_capacity(streams);
    while let Some(joined) = opening.join_next().await {
        open_streams.push(joined.context("an opening task failed")??);
    }
    let (mut run, _) = turn_run(client, pid, cwd, "tool", 1, each).await?;
    run.kind = "tool, among open streams";
    run.other_streams_open = streams;
    drop(open_streams);
    Ok(run)
}

/// One client-shaped turn: a new connection sends, another follows from
/// the message on (its snapshot first) to the turn's end.
async fn shaped_turn(client: &Client, id: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let accepted = client.fresh().send_text(id, "run: true").await?;
    let mut events = client.fresh().events(id, Some(accepted.seq));
    let ended = tokio::time::timeout(TURN_LIMIT, async {
        loop {
            match events.next().await? {
                Frame::Canonical(event) => match event.kind {
                    ApiEventKind::TurnCompleted { .. } => return Ok::<_, anyhow::Error>(()),
                    ApiEventKind::TurnFailed { error, .. } => {
                        return Err(anyhow!("a turn failed: {error}"));
                    }
                    _ => {}
                },
                Frame::Snapshot(_) | Frame::Live(_) | Frame::Reconnecting { .. } => {}
                Frame::Error(error) => return Err(anyhow!("the stream failed: {error:?}")),
            }
        }
    })
    .await;
    match ended {
        Ok(outcome) => outcome.map(|()| started.elapsed()),
        Err(_) => Err(anyhow!("a turn of {id} did not end within {TURN_LIMIT:?}")),
    }
}

/// `conversations` conversations, each doing `each` turns one after the
/// other, all at once; keel's CPU over the turns alone (creating the
/// conversations and opening their streams is left out).
async fn turn_run(
    client: &Client,
    pid: Option<u32>,
    cwd: &str,
    kind: &'static str,
    conversations: usize,
    each: usize,
) -> anyhow::Result<(Turns, Vec<String>)> {
    let ids = create_many(client, cwd, conversations).await?;
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut opening = JoinSet::new();
    for id in &ids {
        let client = client.clone();
        let gate = gate.clone();
        let id = id.clone();
        opening.spawn(async move {
            let _permit = gate.acquire_owned().await;
            open(&client, &id).await.map(|events| (id, events))
        });
    }
    let mut streams = Vec::with_capacity(conversations);
    while let Some(joined) = opening.join_next().await {
        streams.push(joined.context("an opening task failed")??);
    }
    let text = if kind == "tool" { "run: true" } else { "hello" };
    let measuring = Measuring::start(pid)?;
    let mut working = JoinSet::new();
    for (id, mut events) in streams {
        let client = client.clone();
        let sending = gate.clone();
        working.spawn(async move {
            let mut latencies = Vec::with_capacity(each);
            for _ in 0..each {
                latencies.push(one_turn(&client, &sending, &mut events, &id, text).await?);
            }
            Ok::<_, anyhow::Error>(latencies)
        });
    }
    let mut latencies = Vec::with_capacity(conversations * each);
    while let Some(joined) = working.join_next().await {
        latencies.extend(joined.context("a turn task failed")??);
    }
    Ok((measuring.turns(kind, conversations, latencies)?, ids))
}

/// A run of turns being measured: its start, and the daemon's CPU time
/// then (when its process is known).
struct Measuring {
    pid: Option<u32>,
    started: Instant,
    cpu_before: Option<Duration>,
}

impl Measuring {
    fn start(pid: Option<u32>) -> anyhow::Result<Measuring> {
        Ok(Measuring {
            pid,
            cpu_before: cpu_time(pid)?,
            started: Instant::now(),
        })
    }

    /// The run's figures, now that its turns (each one's latency given)
    /// are done.
    fn turns(
        self,
        kind: &'static str,
        conversations: usize,
        latencies: Vec<Duration>,
    ) -> anyhow::Result<Turns> {
        let wall = self.started.elapsed();
        let cpu_after = cpu_time(self.pid)?;
        let count = latencies.len();
        let measured = latency(latencies);
        Ok(Turns {
            kind,
            conversations,
            other_streams_open: 0,
            turns: count,
            turns_per_second: count as f64 / wall.as_secs_f64(),
            cpu_ms_per_turn: self
                .cpu_before
                .zip(cpu_after)
                .map(|(before, after)| ms(after.saturating_sub(before)) / count as f64),
            latency_p50_ms: measured.p50_ms,
            latency_p99_ms: measured.p99_ms,
        })
    }
}

/// The CPU time (user + system) of process `pid`, if one is given.
fn cpu_time(pid: Option<u32>) -> anyhow::Result<Option<Duration>> {
    pid.map(|pid| {
        lab::cpu_time(pid).ok_or_else(|| anyhow!("cannot read the CPU time of pid {pid}"))
    })
    .transpose()
}

/// Resident memory per live idle conversation: the daemon's RSS before and
/// after `count` new conversations have each done one turn and rest, live.
async fn idle_memory(
    client: &Client,
    pid: u32,
    cwd: &str,
    text_runs: &[(usize, usize)],
) -> anyhow::Result<(usize, f64)> {
    let count = text_runs
        .iter()
        .map(|(conversations, _)| *conversations)
        .max()
        .unwrap_or(1);
    let before = lab::rss_bytes(pid).ok_or_else(|| anyhow!("cannot read the daemon's memory"))?;
    let ids = create_many(client, cwd, count).await?;
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut tasks = JoinSet::new();
    for id in ids {
        let client = client.clone();
        let gate = gate.clone();
        tasks.spawn(async move {
            // Streams stay open (the conversations' turns run at once), so
            // only the opening and the sending take turns.
            let mut events = {
                let _permit = gate.acquire().await?;
                open(&client, &id).await?
            };
            one_turn(&client, &gate, &mut events, &id, "hello").await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("a turn task failed")??;
    }
    let live = client.actors().await?.actors.len();
    let after = lab::rss_bytes(pid).ok_or_else(|| anyhow!("cannot read the daemon's memory"))?;
    Ok((live, after.saturating_sub(before) as f64 / count as f64))
}

/// Cancel a turn while it streams (the fake provider at `stream_of` holds
/// the answer) or, without one, while `bash` runs a process tree, `count`
/// times; how long each cancel took to bring the conversation to rest.
async fn cancels(
    client: &Client,
    stream_of: Option<&str>,
    cwd: &str,
    count: usize,
) -> anyhow::Result<Latency> {
    let http = reqwest::Client::new();
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let id = create_many(client, cwd, 1)
            .await?
            .pop()
            .ok_or_else(|| anyhow!("no conversation was created"))?;
        let mut events = open(client, &id).await?;
        let (text, busy) = match stream_of {
            None => (
                "run: sleep 30 & sleep 30 & (sleep 30; true) & wait".to_owned(),
                ApiState::ExecutingTools,
            ),
            Some(mock_url) => {
                // Only this conversation's request takes the entry: a cancel
                // that lands before the request reaches the provider leaves
                // it queued, and it must not answer a later request.
                let text = format!("hold the stream of {id}");
                http.post(format!("{mock_url}/_mock/script"))
                    .json(&json!([{"when": text, "text": "held", "hang_after_events": 1}]))
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .with_context(|| format!("scripting the fake provider at {mock_url}"))?;
                (text, ApiState::Streaming)
            }
        };
        client.send_text(&id, &text).await?;
        tokio::time::timeout(TURN_LIMIT, async {
            loop {
                if let Frame::Live(ApiLiveEvent::StateChanged { state }) = events.next().await? {
                    if state == busy {
                        return Ok::<_, anyhow::Error>(());
                    }
                }
            }
        })
        .await
        .map_err(|_| anyhow!("the conversation never became {busy:?}"))??;
        let started = Instant::now();
        let rest = client.cancel(&id).await?;
        samples.push(started.elapsed());
        if rest.state != ApiState::Idle {
            return Err(anyhow!("a cancel left the conversation {:?}", rest.state));
        }
    }
    Ok(latency(samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 0.5), 51.0);
        assert_eq!(percentile(&samples, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        let measured = latency(vec![Duration::from_millis(3), Duration::from_millis(1)]);
        assert_eq!(measured.samples, 2);
        assert_eq!(measured.p99_ms, 3.0);
    }
}
