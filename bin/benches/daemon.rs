//! The daemon over real HTTP, measured from outside: the real `keel serve`
//! binary and the real `keel mock-llm` as their own processes, a client
//! in this process speaking HTTP/1.1 and reading SSE off plain sockets.
//! Every daemon is fresh (its own data dir, redb) for each part.
//!
//! 1. Fan-out: 100, then 1,000 subscribers on one conversation's
//!    `GET /v1/conversations/{id}/events`, and 50 messages sent to it, one
//!    after the other's turn has reached every subscriber. For each
//!    subscriber and message, the time from the daemon publishing the
//!    `user_message` frame to the subscriber reading it. The daemon
//!    publishes right after the append is durable and just before it
//!    answers 202, so the clock starts at the first sign of the publish:
//!    the 202 or the first subscriber's read, whichever comes first (this
//!    leaves out one loopback hop, tens of microseconds). Also from the
//!    POST being sent (the durable append included), and, for every
//!    canonical frame of the turns, the spread from the first subscriber
//!    to read it to each of the others.
//! 2. 10,000 open streams, twice: 10,000 conversations with one stream
//!    each, then 100 conversations with 100 each (what a stream costs
//!    apart from its conversation's channel). The daemon's RSS (VmRSS) and
//!    CPU (utime + stime) from /proc before and after creating the
//!    conversations and before and after opening the streams, and the time
//!    to open them all (each open waits for its snapshot).
//! 3. CPU per tool turn: the mock scripted to answer each turn with a
//!    `bash` call (`true`) and then a text; 300 turns over HTTP (POST,
//!    then read the SSE stream until `turn_completed`) with the daemon's
//!    CPU from /proc, then the same turns in this process through
//!    `keel_actors::Runtime` (same store engine, settings, mock and tools)
//!    with this process's CPU from /proc while nothing but the runtime and
//!    its minimal driver (send, read the subscription) runs in it.
//!    Alternated over 5 rounds. CPU time of the `bash` children is not in
//!    either figure (it is the children's, not the process's).
//!
//! Run: `cargo bench -p keel --bench daemon` (about six minutes, most of
//! it part 3), or with `-- --quick` (or `KEEL_BENCH_QUICK=1`) for a smoke
//! run with small numbers; run as a test (without cargo bench's `--bench`)
//! it is quick. `KEEL_BENCH_ONLY=fanout|streams|turns` runs one part;
//! `KEEL_BENCH_WAVES=1` prints each fan-out message's turn as its
//! subscribers read it. The fan-out's streams stay open until every
//! subscriber has read every turn, so that the clients' closing is not
//! measured with the last turn.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read as _};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use keel::lab::{find, FrameScanner, Scanned, ScannedKind, TallyFollower, TurnTally};
use keel_actors::core::event::EventKind;
use keel_actors::core::{ConversationConfig, ModelRef, ProviderKind};
use keel_actors::provider::ProviderConfig;
use keel_actors::store::{self, BackendKind};
use keel_actors::tool::ToolRegistry;
use keel_actors::{ConversationHandle, Received, Runtime, RuntimeConfig, Settings, Update};

/// The daemon's bearer token (`KEEL_TOKEN`).
const TOKEN: &str = "keel-bench-token";
/// Streams being opened at once (the daemon's listen backlog is 1,024).
const OPENING: usize = 128;
/// Conversations being created at once.
const CREATING: usize = 32;

struct Sizes {
    /// Subscriber counts of the fan-out; the target is for the last.
    subscribers: &'static [usize],
    messages: usize,
    connections: usize,
    /// The conversations of the second many-streams case.
    shared_conversations: usize,
    turns: usize,
    turn_conversations: usize,
    rounds: usize,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            subscribers: &[100, 1_000],
            messages: 50,
            connections: 10_000,
            shared_conversations: 100,
            turns: 300,
            turn_conversations: 30,
            rounds: 5,
        }
    }

    fn quick() -> Sizes {
        Sizes {
            subscribers: &[100],
            messages: 5,
            connections: 500,
            shared_conversations: 5,
            turns: 50,
            turn_conversations: 5,
            rounds: 1,
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|arg| arg == "--quick")
        || std::env::var_os("KEEL_BENCH_QUICK").is_some_and(|value| value != "0")
        || !args.iter().any(|arg| arg == "--bench");
    let sizes = if quick { Sizes::quick() } else { Sizes::full() };
    let mock = MockProcess::start();

    // The client stands for many clients, each reading its own socket: its
    // runtime takes turns as the daemon's does (`global_queue_interval(1)`,
    // see keel serve), so that a subscriber is not read late only because
    // this one process overflowed its own run queue.
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .global_queue_interval(1)
        .enable_all()
        .build()
        .unwrap();
    // `KEEL_BENCH_ONLY=fanout|streams|turns` runs one part (to profile it).
    let only = std::env::var("KEEL_BENCH_ONLY").ok();
    let runs = |part: &str| only.as_deref().is_none_or(|only| only == part);
    let counts: &[usize] = if runs("fanout") {
        sizes.subscribers
    } else {
        &[]
    };
    let mut fanouts = Vec::new();
    for &subscribers in counts {
        let fanout = client.block_on(fanout(&mock.url, subscribers, sizes.messages));
        fanout.print(sizes.messages);
        fanouts.push(fanout);
    }
    let mut opens = Vec::new();
    if runs("streams") {
        for conversations in [sizes.connections, sizes.shared_conversations] {
            let open = client.block_on(open_streams(&mock.url, sizes.connections, conversations));
            open.print();
            opens.push(open);
        }
    }
    let mut rounds = Vec::new();
    let round_count = if runs("turns") { sizes.rounds } else { 0 };
    // The library rounds run in this process while the client's runtime
    // sits idle (no daemon is up then).
    for round in 0..round_count {
        let http = client.block_on(http_turns(&mock.url, &sizes));
        let library = library_turns(&mock.url, &sizes);
        println!(
            "tool turns, round {}: daemon {:.3} ms CPU/turn ({:.2} ms wall), library {:.3} ms CPU/turn ({:.2} ms wall)",
            round + 1,
            http.cpu_ms,
            http.wall_ms,
            library.cpu_ms,
            library.wall_ms
        );
        rounds.push((http, library));
    }
    drop(client);
    print_table(&sizes, &fanouts, &opens, &rounds);
}

// ---------------------------------------------------------------------------
// 1. Fan-out to many subscribers of one conversation

/// What one subscriber read: each canonical frame's seq, whether it was
/// the `user_message`, and when its bytes were read.
struct Seen {
    seq: u64,
    user_message: bool,
    at: Instant,
}

struct Fanout {
    subscribers: usize,
    open_time: Duration,
    /// User-message frames, from the first sign of the publish.
    from_publish: Vec<Duration>,
    /// The same frames, from the POST being sent.
    from_post: Vec<Duration>,
    /// Every canonical frame, from the first subscriber's read.
    spread: Vec<Duration>,
    /// Message frames a subscriber never read (must be 0).
    missing: usize,
    lagged: usize,
    cpu_per_message_ms: f64,
    /// This process's CPU per message: the client reading every frame.
    client_cpu_per_message_ms: f64,
}

async fn fanout(mock_url: &str, subscribers: usize, messages: usize) -> Fanout {
    let daemon = Daemon::start(mock_url);
    let api = Api::new(&daemon);
    let id = api.create().await;
    // Warm up: one watched turn before anything is counted.
    let mut warm = Sse::open(daemon.addr, &id).await;
    api.send(&id, "warm up").await;
    warm.until_turn_completed().await;
    drop(warm);

    let started = Instant::now();
    let streams = open_many(daemon.addr, vec![id.clone(); subscribers]).await;
    let open_time = started.elapsed();

    let done = TurnTally::new(subscribers);
    let mut followers = JoinSet::new();
    for (_, sse, _) in streams {
        followers.spawn(follow(sse, messages, done.follower()));
    }
    let mut sent = Vec::new();
    let cpu_before = daemon.cpu_seconds();
    let client_cpu_before = self_cpu_seconds();
    let mut took = Vec::new();
    for message in 0..messages {
        let posted = Instant::now();
        let seq = api.send(&id, &format!("message {message}")).await;
        let accepted = Instant::now();
        sent.push((seq, posted, accepted));
        done.wait_for(message + 1)
            .await
            .expect("a subscriber stopped");
        took.push(posted.elapsed());
    }
    let cpu = daemon.cpu_seconds() - cpu_before;
    let client_cpu = self_cpu_seconds() - client_cpu_before;
    let mut seen = Vec::new();
    let mut lagged = 0;
    while let Some(joined) = followers.join_next().await {
        // The stream closes only now, after every subscriber has read
        // every turn: a thousand closes are the daemon's work too, and
        // would land amid the last turn's deliveries.
        let (frames, lags, _stream) = joined.unwrap();
        seen.push(frames);
        lagged += lags;
    }

    let mut from_publish = Vec::new();
    let mut from_post = Vec::new();
    let mut missing = 0;
    for &(seq, posted, accepted) in &sent {
        let reads: Vec<Instant> = seen
            .iter()
            .filter_map(|frames| {
                frames
                    .iter()
                    .find(|frame| frame.user_message && frame.seq == seq)
                    .map(|frame| frame.at)
            })
            .collect();
        missing += subscribers - reads.len();
        let first = reads.iter().min().copied().unwrap_or(accepted);
        let published = first.min(accepted);
        for at in reads {
            from_publish.push(at - published);
            from_post.push(at - posted);
        }
    }
    let mut firsts = std::collections::HashMap::<u64, Instant>::new();
    for frame in seen.iter().flatten() {
        let first = firsts.entry(frame.seq).or_insert(frame.at);
        *first = (*first).min(frame.at);
    }
    // `KEEL_BENCH_WAVES=1`: each message's turn as its subscribers read
    // it, its first four canonical frames from the first read of the
    // `user_message` (to see one slow turn among fast ones, or frames of
    // one step that did not reach a stream together).
    if std::env::var_os("KEEL_BENCH_WAVES").is_some() {
        let mut reads = std::collections::HashMap::<u64, Vec<Instant>>::new();
        for frame in seen.iter().flatten() {
            reads.entry(frame.seq).or_default().push(frame.at);
        }
        for (index, (&(seq, _, _), took)) in sent.iter().zip(&took).enumerate() {
            let start = firsts[&seq];
            let ms = |at: Instant| (at - start).as_secs_f64() * 1000.0;
            let mut line = format!(
                "message {}: turn {:.1} ms |",
                index + 1,
                took.as_secs_f64() * 1000.0
            );
            for (offset, frame) in (seq..seq + 4).enumerate() {
                if let Some(at) = reads.get_mut(&frame) {
                    at.sort();
                    line += &format!(
                        " seq+{offset}: first {:.2} p50 {:.2} p99 {:.2} |",
                        ms(at[0]),
                        ms(at[at.len() / 2]),
                        ms(at[at.len() * 99 / 100])
                    );
                }
            }
            println!("{line}");
        }
    }
    let spread = seen
        .iter()
        .flatten()
        .map(|frame| frame.at - firsts[&frame.seq])
        .collect();
    Fanout {
        subscribers,
        open_time,
        from_publish,
        from_post,
        spread,
        missing,
        lagged,
        cpu_per_message_ms: cpu * 1000.0 / messages as f64,
        client_cpu_per_message_ms: client_cpu * 1000.0 / messages as f64,
    }
}

/// Read one subscriber's stream until it has seen `turns` turns end; the
/// stream is given back open.
async fn follow(mut sse: Sse, turns: usize, done: TallyFollower) -> (Vec<Seen>, usize, Sse) {
    let mut seen = Vec::with_capacity(turns * 8);
    let mut lagged = 0;
    let mut completed = 0;
    while completed < turns {
        let at = sse.fill().await.expect("a stream ended");
        while let Some(frame) = sse.next_frame() {
            match frame {
                Scanned::Canonical { seq, kind } => {
                    seen.push(Seen {
                        seq,
                        user_message: kind == ScannedKind::UserMessage,
                        at,
                    });
                    if kind == ScannedKind::TurnCompleted {
                        completed += 1;
                        done.turn_completed();
                    }
                }
                Scanned::Live { lagged: true } => lagged += 1,
                _ => {}
            }
        }
    }
    done.finish();
    (seen, lagged, sse)
}

impl Fanout {
    fn print(&self, messages: usize) {
        println!(
            "fan-out: {} subscribers of one conversation opened in {:.2} s; {} messages",
            self.subscribers,
            self.open_time.as_secs_f64(),
            messages
        );
        println!(
            "  user_message from publish: {}; from POST sent: {}",
            summary(&self.from_publish),
            summary(&self.from_post)
        );
        println!(
            "  every canonical frame from its first read: {}",
            summary(&self.spread)
        );
        println!(
            "  user_message from publish, how many within: {}",
            histogram(&self.from_publish)
        );
        println!(
            "  missing {}, lagged {}, CPU per message (a whole turn to every subscriber): daemon {:.1} ms, client {:.1} ms",
            self.missing, self.lagged, self.cpu_per_message_ms, self.client_cpu_per_message_ms
        );
    }
}

// ---------------------------------------------------------------------------
// 2. Many open streams

struct OpenStreams {
    connections: usize,
    conversations: usize,
    snapshots: usize,
    open_time: Duration,
    open_latency: Vec<Duration>,
    rss_start: u64,
    rss_created: u64,
    rss_open: u64,
    cpu_create: f64,
    cpu_open: f64,
    cpu_idle_per_s: f64,
    client_rss_per_stream: f64,
}

/// Open `connections` streams over `conversations` conversations (each
/// gets as many as the others, give or take one).
async fn open_streams(mock_url: &str, connections: usize, conversations: usize) -> OpenStreams {
    let daemon = Daemon::start(mock_url);
    let api = Api::new(&daemon);
    {
        let id = api.create().await;
        let mut warm = Sse::open(daemon.addr, &id).await;
        api.send(&id, "warm up").await;
        warm.until_turn_completed().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_start = daemon.rss_bytes();
    let cpu_start = daemon.cpu_seconds();

    let mut ids = Vec::with_capacity(conversations);
    let gate = Arc::new(Semaphore::new(CREATING));
    let mut creating = JoinSet::new();
    for _ in 0..conversations {
        let api = api.clone();
        let gate = gate.clone();
        creating.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            api.create().await
        });
    }
    while let Some(id) = creating.join_next().await {
        ids.push(id.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_created = daemon.rss_bytes();
    let cpu_created = daemon.cpu_seconds();
    let client_rss_before = self_rss_bytes();

    let targets = ids.iter().cycle().take(connections).cloned().collect();
    let started = Instant::now();
    let streams = open_many(daemon.addr, targets).await;
    let open_time = started.elapsed();
    let snapshots = streams.len();
    let open_latency = streams.iter().map(|(_, _, took)| *took).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_open = daemon.rss_bytes();
    let cpu_open = daemon.cpu_seconds();
    // Idle with every stream open: nothing should be spent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu_idle_per_s = (daemon.cpu_seconds() - cpu_open) / 3.0;
    let client_rss_per_stream =
        self_rss_bytes().saturating_sub(client_rss_before) as f64 / connections as f64;
    drop(streams);
    OpenStreams {
        connections,
        conversations,
        snapshots,
        open_time,
        open_latency,
        rss_start,
        rss_created,
        rss_open,
        cpu_create: cpu_created - cpu_start,
        cpu_open: cpu_open - cpu_created,
        cpu_idle_per_s,
        client_rss_per_stream,
    }
}

impl OpenStreams {
    fn per_stream_kib(&self) -> f64 {
        self.rss_open.saturating_sub(self.rss_created) as f64 / self.connections as f64 / 1024.0
    }

    fn print(&self) {
        let n = self.connections as f64;
        let mib = |bytes: u64| bytes as f64 / 1048576.0;
        println!(
            "open streams: {} over {} conversations; {} snapshots received",
            self.connections, self.conversations, self.snapshots
        );
        println!(
            "  daemon RSS {:.1} MiB -> {:.1} MiB created ({:.1} KiB/conversation) -> {:.1} MiB streams open ({:.1} KiB/stream)",
            mib(self.rss_start),
            mib(self.rss_created),
            self.rss_created.saturating_sub(self.rss_start) as f64
                / self.conversations as f64
                / 1024.0,
            mib(self.rss_open),
            self.per_stream_kib()
        );
        println!(
            "  opened in {:.2} s ({:.0}/s, {} at a time), each {}; daemon CPU {:.1} µs/stream to open, {:.1} µs/conversation to create, {:.3} s/s idle with all open",
            self.open_time.as_secs_f64(),
            n / self.open_time.as_secs_f64(),
            OPENING,
            summary(&self.open_latency),
            self.cpu_open * 1e6 / n,
            self.cpu_create * 1e6 / self.conversations as f64,
            self.cpu_idle_per_s
        );
        println!(
            "  the client's RSS: {:.1} KiB per stream",
            self.client_rss_per_stream / 1024.0
        );
    }
}

// ---------------------------------------------------------------------------
// 3. CPU per tool turn: HTTP + SSE against the library

struct Turns {
    cpu_ms: f64,
    wall_ms: f64,
}

/// The script of one turn: a `bash` call, then a text once it has run.
fn script(turns: usize) -> Value {
    let mut entries = Vec::with_capacity(turns * 2);
    for _ in 0..turns {
        entries.push(json!({"tool_calls": [{"name": "bash", "input": {"command": "true"}}]}));
        entries.push(json!({"text": "It ran."}));
    }
    Value::Array(entries)
}

async fn http_turns(mock_url: &str, sizes: &Sizes) -> Turns {
    let daemon = Daemon::start(mock_url);
    let api = Api::new(&daemon);
    let mut ids = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..sizes.turn_conversations {
        let id = api.create().await;
        streams.push(Sse::open(daemon.addr, &id).await);
        ids.push(id);
    }
    let warm_up = sizes.turn_conversations;
    push_script(mock_url, &script(warm_up + sizes.turns)).await;
    let mut tool_results = 0;
    for (id, sse) in ids.iter().zip(&mut streams) {
        api.send(id, "run the tool").await;
        tool_results += sse.until_turn_completed().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let cpu_before = daemon.cpu_seconds();
    let started = Instant::now();
    for turn in 0..sizes.turns {
        let at = turn % ids.len();
        api.send(&ids[at], "run the tool").await;
        tool_results += streams[at].until_turn_completed().await;
    }
    let wall = started.elapsed();
    let cpu = daemon.cpu_seconds() - cpu_before;
    assert_eq!(
        tool_results,
        warm_up + sizes.turns,
        "one tool result a turn"
    );
    assert_script_used(mock_url).await;
    Turns {
        cpu_ms: cpu * 1000.0 / sizes.turns as f64,
        wall_ms: wall.as_secs_f64() * 1000.0 / sizes.turns as f64,
    }
}

/// The same turns through the library, in this process, on a runtime set
/// up as `keel serve` sets up its own, with the telemetry `keel serve`
/// installs (the tracing subscriber filtered by `RUST_LOG`, logging to
/// stderr as the daemon's does, and the Prometheus recorder): what the
/// comparison leaves is the HTTP layer's own cost, not the logging and
/// metrics every embedder may install as well.
fn library_turns(mock_url: &str, sizes: &Sizes) -> Turns {
    install_daemon_telemetry();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let figures = tokio.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let config = RuntimeConfig {
            store: store::open(BackendKind::Redb, &data).unwrap(),
            providers: ProviderConfig {
                mock_url: Some(mock_url.to_owned()),
                ..ProviderConfig::default()
            },
            tools: ToolRegistry::with_defaults(),
            process_dir: Some(data.join("processes")),
            // As `keel serve` does, so that the two sides spawn alike.
            spawner: Some(keel_actors::spawner::SpawnerCommand {
                program: env!("CARGO_BIN_EXE_keel").into(),
                args: vec!["spawner".into()],
            }),
            settings: Settings::default(),
        };
        let (runtime, _) = Runtime::open(config).await.unwrap();
        let conversation_config = ConversationConfig {
            primary: ModelRef {
                provider: ProviderKind::Mock,
                model: "mock".to_owned(),
            },
            ..ConversationConfig::default()
        };
        let mut conversations = Vec::new();
        for _ in 0..sizes.turn_conversations {
            let handle = runtime
                .create(&work, conversation_config.clone())
                .await
                .unwrap();
            let subscription = handle.subscribe().await.unwrap();
            conversations.push((handle, subscription));
        }
        let warm_up = sizes.turn_conversations;
        push_script(mock_url, &script(warm_up + sizes.turns)).await;
        let mut tool_results = 0;
        for (handle, subscription) in &mut conversations {
            tool_results += library_turn(handle, subscription).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;

        let cpu_before = self_cpu_seconds();
        let started = Instant::now();
        for turn in 0..sizes.turns {
            let at = turn % conversations.len();
            let (handle, subscription) = &mut conversations[at];
            tool_results += library_turn(handle, subscription).await;
        }
        let wall = started.elapsed();
        let cpu = self_cpu_seconds() - cpu_before;
        assert_eq!(
            tool_results,
            warm_up + sizes.turns,
            "one tool result a turn"
        );
        assert_script_used(mock_url).await;
        drop(conversations);
        runtime.shutdown().await;
        Turns {
            cpu_ms: cpu * 1000.0 / sizes.turns as f64,
            wall_ms: wall.as_secs_f64() * 1000.0 / sizes.turns as f64,
        }
    });
    drop(tokio);
    figures
}

/// Install `keel serve`'s tracing subscriber and metrics recorder in this
/// process, once (both are process-global). The HTTP client side of the
/// bench emits no spans or metrics, so only the library rounds pay for it.
fn install_daemon_telemetry() {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        let guard = keel::telemetry::init_tracing(keel::telemetry::LogFormat::Plain)
            .expect("install the daemon's tracing subscriber");
        // Kept for the life of the process, as the daemon keeps its own.
        std::mem::forget(guard);
        let _metrics = keel::telemetry::install_metrics().expect("install the metrics recorder");
    });
}

/// One turn through the library; returns how many tool results it had.
async fn library_turn(
    handle: &ConversationHandle,
    subscription: &mut keel_actors::Subscription,
) -> usize {
    handle.send("run the tool", Vec::new()).await.unwrap();
    let mut tool_results = 0;
    loop {
        match subscription.next().await {
            Received::Update(Update::Event { event }) => match event.kind {
                EventKind::ToolResult { .. } => tool_results += 1,
                EventKind::TurnCompleted { .. } => return tool_results,
                EventKind::TurnFailed { .. } | EventKind::TurnInterrupted { .. } => {
                    panic!("the turn did not complete: {event:?}")
                }
                _ => {}
            },
            Received::Closed => panic!("the conversation stopped"),
            _ => {}
        }
    }
}

async fn push_script(mock_url: &str, script: &Value) {
    let response = reqwest::Client::new()
        .post(format!("{mock_url}/_mock/script"))
        .json(script)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "the mock took no script");
}

/// Every scripted answer was taken: each turn had its tool call and text.
async fn assert_script_used(mock_url: &str) {
    let script: Value = reqwest::Client::new()
        .get(format!("{mock_url}/_mock/script"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(script["pending"], json!([]), "scripted answers left over");
}

// ---------------------------------------------------------------------------
// The table

fn print_table(
    sizes: &Sizes,
    fanouts: &[Fanout],
    opens: &[OpenStreams],
    rounds: &[(Turns, Turns)],
) {
    let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
    let yes = |met: bool| if met { "yes" } else { "**no**" };
    let spread = |values: &[Duration]| {
        format!(
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(percentile(values, 0.5)),
            ms(percentile(values, 0.99)),
            ms(percentile(values, 1.0))
        )
    };
    println!();
    println!("| Measure | Figure | Target | Met? |");
    println!("| --- | --- | --- | --- |");
    for (index, fanout) in fanouts.iter().enumerate() {
        let p99 = percentile(&fanout.from_publish, 0.99);
        // The target is for the largest count.
        let (target, met) = if index + 1 == fanouts.len() {
            (
                "p99 < 10 ms",
                yes(p99 < Duration::from_millis(10) && fanout.missing == 0),
            )
        } else {
            ("-", "-")
        };
        println!(
            "| SSE delivery to {} subscribers of one conversation: `user_message` frame, from its publish ({} messages) | {} | {target} | {met} |",
            fanout.subscribers,
            sizes.messages,
            spread(&fanout.from_publish),
        );
        println!(
            "| the same ({}), from the POST being sent (durable append included) | {} | - | - |",
            fanout.subscribers,
            spread(&fanout.from_post)
        );
        println!(
            "| every canonical frame of the turns ({}), from the first subscriber's read | {} | - | - |",
            fanout.subscribers,
            spread(&fanout.spread)
        );
        println!(
            "| CPU per message ({}; a text turn, every frame to every subscriber): daemon, client | {:.1} ms, {:.1} ms | - | - |",
            fanout.subscribers,
            fanout.cpu_per_message_ms,
            fanout.client_cpu_per_message_ms
        );
    }
    for open in opens {
        let case = if open.conversations == open.connections {
            format!("{} conversations, one stream each", open.conversations)
        } else {
            format!(
                "{} conversations, {} streams each",
                open.conversations,
                open.connections / open.conversations
            )
        };
        println!(
            "| {} SSE streams open at once ({case}): snapshots received | {} | all | {} |",
            open.connections,
            open.snapshots,
            yes(open.snapshots == open.connections)
        );
        println!(
            "| daemon RSS per open stream ({case}) | {:.1} KiB ({:.0} MiB in all; the conversations {:.1} KiB each before) | - | - |",
            open.per_stream_kib(),
            open.rss_open.saturating_sub(open.rss_created) as f64 / 1048576.0,
            open.rss_created.saturating_sub(open.rss_start) as f64
                / open.conversations as f64
                / 1024.0
        );
        println!(
            "| time to open them, {OPENING} at a time ({case}) | {:.2} s; each {} | - | - |",
            open.open_time.as_secs_f64(),
            spread(&open.open_latency)
        );
        println!(
            "| daemon CPU to open one stream; idle with all open ({case}) | {:.0} µs; {:.1} ms/s | - | - |",
            open.cpu_open * 1e6 / open.connections as f64,
            open.cpu_idle_per_s * 1000.0
        );
    }
    if !rounds.is_empty() {
        let median = |mut values: Vec<f64>| {
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        let listed = |values: Vec<f64>| {
            values
                .iter()
                .map(|value| format!("{value:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let http: Vec<f64> = rounds.iter().map(|(http, _)| http.cpu_ms).collect();
        let library: Vec<f64> = rounds.iter().map(|(_, library)| library.cpu_ms).collect();
        let added: Vec<f64> = rounds
            .iter()
            .map(|(http, library)| http.cpu_ms - library.cpu_ms)
            .collect();
        println!(
            "| daemon CPU per tool turn over HTTP + SSE, median of {} rounds of {} turns (each round) | {:.2} ms ({}) | - | - |",
            rounds.len(),
            sizes.turns,
            median(http.clone()),
            listed(http)
        );
        println!(
            "| the same turns through the library, in process, with the daemon's telemetry | {:.2} ms ({}) | - | - |",
            median(library.clone()),
            listed(library)
        );
        let added_median = median(added.clone());
        println!(
            "| added by the daemon (HTTP, JSON, SSE), median of the rounds' differences | {added_median:.2} ms ({}) | < 0.3 ms | {} |",
            listed(added),
            yes(added_median < 0.3)
        );
    }
}

fn percentile(values: &[Duration], p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The share of `values` within each of a few bounds.
fn histogram(values: &[Duration]) -> String {
    [1, 2, 5, 10, 20, 40, 60, 100]
        .iter()
        .map(|&bound| {
            let within = values
                .iter()
                .filter(|value| **value <= Duration::from_millis(bound))
                .count();
            format!(
                "{bound} ms {:.1}%",
                within as f64 * 100.0 / values.len().max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn summary(values: &[Duration]) -> String {
    let ms = |p| percentile(values, p).as_secs_f64() * 1000.0;
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n = {})",
        ms(0.5),
        ms(0.99),
        ms(1.0),
        values.len()
    )
}

// ---------------------------------------------------------------------------
// The processes

/// `keel mock-llm` on a free port.
struct MockProcess {
    child: Child,
    url: String,
}

impl MockProcess {
    fn start() -> MockProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["mock-llm", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start keel mock-llm");
        let mut banner = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut banner)
            .unwrap();
        let url = banner
            .trim()
            .strip_prefix("mock-llm listening on ")
            .expect("the mock's banner")
            .to_owned();
        MockProcess { child, url }
    }
}

impl Drop for MockProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `keel serve` on a free port, with its own data dir, the mock as its
/// provider and a fixed token.
struct Daemon {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(mock_url: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command.arg("serve").current_dir(&work);
        // Nothing from this shell's keel or provider settings.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if ["KEEL_", "ANTHROPIC_", "OPENAI_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
            {
                command.env_remove(name.as_ref());
            }
        }
        let mut child = command
            .env("KEEL_ADDR", "127.0.0.1:0")
            .env("KEEL_DATA_DIR", dir.path().join("data"))
            .env("KEEL_TOKEN", TOKEN)
            .env("KEEL_PROVIDER", "mock")
            .env("KEEL_MOCK_URL", mock_url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start keel serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let addr = loop {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "keel serve exited before listening"
            );
            if let Some(addr) = line.trim().strip_prefix("keel listening on http://") {
                break addr.parse().unwrap();
            }
        };
        // Keep reading, so a line the daemon prints later never blocks it.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = stdout.read_to_end(&mut sink);
        });
        Daemon {
            child,
            addr,
            _dir: dir,
        }
    }

    fn rss_bytes(&self) -> u64 {
        rss_of(&format!("/proc/{}/status", self.child.id()))
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_of(&format!("/proc/{}/stat", self.child.id()))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS from a /proc/PID/status.
fn rss_of(path: &str) -> u64 {
    let status = std::fs::read_to_string(path).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// utime + stime from a /proc/PID/stat, in seconds (clock ticks of 10 ms;
/// every thread of the process, finished ones too; not its children).
fn cpu_of(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn self_rss_bytes() -> u64 {
    rss_of("/proc/self/status")
}

fn self_cpu_seconds() -> f64 {
    cpu_of("/proc/self/stat")
}

// ---------------------------------------------------------------------------
// The client

/// The daemon's JSON routes, through reqwest.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(daemon: &Daemon) -> Api {
        Api {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            base: format!("http://{}", daemon.addr),
        }
    }

    async fn create(&self) -> String {
        let response = self
            .http
            .post(format!("{}/v1/conversations", self.base))
            .bearer_auth(TOKEN)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
        let created: Value = response.json().await.unwrap();
        created["id"].as_str().unwrap().to_owned()
    }

    /// Send a message; its seq once the daemon answered 202.
    async fn send(&self, id: &str, text: &str) -> u64 {
        let response = self
            .http
            .post(format!("{}/v1/conversations/{id}/messages", self.base))
            .bearer_auth(TOKEN)
            .json(&json!({ "text": text }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 202);
        let accepted: Value = response.json().await.unwrap();
        accepted["seq"].as_u64().unwrap()
    }
}

/// Open a stream on each conversation of `ids`, `OPENING` at a time; each
/// is returned once its snapshot arrived, with how long that took.
async fn open_many(addr: SocketAddr, ids: Vec<String>) -> Vec<(usize, Sse, Duration)> {
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut opening = JoinSet::new();
    for (index, id) in ids.into_iter().enumerate() {
        let gate = gate.clone();
        opening.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let started = Instant::now();
            let sse = Sse::open(addr, &id).await;
            (index, sse, started.elapsed())
        });
    }
    let mut streams = Vec::new();
    while let Some(opened) = opening.join_next().await {
        streams.push(opened.unwrap());
    }
    streams.sort_by_key(|(index, _, _)| *index);
    streams
}

/// One `GET …/events` over a plain socket: HTTP/1.1, chunked, SSE, parsed
/// only as far as the bench needs, so the client does little work.
struct Sse {
    stream: TcpStream,
    /// Bytes read and not yet taken out of their chunks.
    raw: Vec<u8>,
    /// The body taken out of its chunks, not yet split into frames.
    frames: FrameScanner,
    headers_done: bool,
}

impl Sse {
    async fn open(addr: SocketAddr, id: &str) -> Sse {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let request = format!(
            "GET /v1/conversations/{id}/events HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\naccept: text/event-stream\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut sse = Sse {
            stream,
            raw: Vec::new(),
            frames: FrameScanner::default(),
            headers_done: false,
        };
        loop {
            match sse.next_frame() {
                Some(Scanned::Snapshot) => return sse,
                Some(other) => panic!("a stream began with {other:?}"),
                None => {
                    sse.fill()
                        .await
                        .expect("a stream ended before its snapshot");
                }
            }
        }
    }

    /// Read what the socket has; `None` once it is closed. The instant is
    /// taken as soon as the read returns, before any parsing.
    async fn fill(&mut self) -> Option<Instant> {
        self.raw.reserve(4096);
        let read = self.stream.read_buf(&mut self.raw).await.unwrap();
        let at = Instant::now();
        if read == 0 {
            return None;
        }
        self.unchunk();
        Some(at)
    }

    fn unchunk(&mut self) {
        if !self.headers_done {
            let Some(end) = find(&self.raw, b"\r\n\r\n") else {
                return;
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            assert!(head.contains("transfer-encoding: chunked"), "{head}");
            self.raw.drain(..end + 4);
            self.headers_done = true;
        }
        let mut taken = 0;
        loop {
            let rest = &self.raw[taken..];
            let Some(line) = find(rest, b"\r\n") else {
                break;
            };
            let size = std::str::from_utf8(&rest[..line]).unwrap();
            let size = size.split(';').next().unwrap().trim();
            let size = usize::from_str_radix(size, 16).unwrap();
            if size == 0 || rest.len() < line + 2 + size + 2 {
                break;
            }
            self.frames.push(&rest[line + 2..line + 2 + size]);
            taken += line + 2 + size + 2;
        }
        self.raw.drain(..taken);
    }

    /// The next whole frame read, if any.
    fn next_frame(&mut self) -> Option<Scanned> {
        let frame = self.frames.next_frame()?;
        if let Scanned::Error(data) = &frame {
            panic!("an error frame: {data}");
        }
        Some(frame)
    }

    /// Read until the next `turn_completed`; how many tool results came
    /// before it.
    async fn until_turn_completed(&mut self) -> usize {
        let mut tool_results = 0;
        loop {
            while let Some(frame) = self.next_frame() {
                match frame {
                    Scanned::Canonical {
                        kind: ScannedKind::TurnCompleted,
                        ..
                    } => return tool_results,
                    Scanned::Canonical {
                        kind: ScannedKind::ToolResult,
                        ..
                    } => tool_results += 1,
                    _ => {}
                }
            }
            self.fill().await.expect("a stream ended");
        }
    }
}
