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
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use keel_actors::core::event::EventKind;
use keel_actors::core::{ConversationConfig, ModelRef, ProviderKind};
use keel_actors::provider::ProviderConfig;
use keel_actors::store::{self, BackendKind};
use keel_actors::tool::ToolRegistry;
use keel_actors::{ConversationHandle, Received, Runtime, RuntimeConfig, Settings, Update};
use keel_test_support::stats::nearest_rank as percentile;
use keel_test_support::{
    cpu_time, find, rss_bytes, FakeProvider, FrameScanner, Scanned, ScannedKind, TallyFollower,
    TurnTally,
};

mod client;
mod fanout;
mod processes;
mod streams;
mod turns;

use fanout::*;
use streams::*;
use turns::*;

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
    let mock = FakeProvider::start(Path::new(env!("CARGO_BIN_EXE_keel")), &[])
        .expect("start keel mock-llm");

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
        let fanout = client.block_on(fanout(mock.url(), subscribers, sizes.messages));
        fanout.print(sizes.messages);
        fanouts.push(fanout);
    }
    let mut opens = Vec::new();
    if runs("streams") {
        for conversations in [sizes.connections, sizes.shared_conversations] {
            let open = client.block_on(open_streams(mock.url(), sizes.connections, conversations));
            open.print();
            opens.push(open);
        }
    }
    let mut rounds = Vec::new();
    let round_count = if runs("turns") { sizes.rounds } else { 0 };
    // The library rounds run in this process while the client's runtime
    // sits idle (no daemon is up then).
    for round in 0..round_count {
        let http = client.block_on(http_turns(mock.url(), &sizes));
        let library = library_turns(mock.url(), &sizes);
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
