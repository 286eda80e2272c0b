#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Benchmarks of the actor runtime (see the `actors` section of docs/benchmarks.md
//! at the workspace root). Run them with
//!
//! ```text
//! cargo bench -p keel-actors --bench runtime
//! KEEL_BENCH_QUICK=1 cargo bench -p keel-actors --bench runtime   # smoke run
//! ```
//!
//! A plain `main`, not criterion: the targets are percentiles of one-off
//! operations (a cold start, a cancel), so every sample is kept and the
//! table gives n, mean, p50, p90, p99 and max.
//!
//! - **warm `ensure_started`**: `Runtime::open_conversation` on a live
//!   conversation (registry lookup and a handle), and for context a full
//!   `inspect()` round trip through the actor's mailbox, which clones the
//!   history it returns.
//! - **cold start**: a conversation with about 1,000 events of history,
//!   evicted; timed from `open_conversation` (rehydrate: read, decode,
//!   replay, snapshot check) to the answer of one `inspect()`, which the
//!   actor gives only after `Input::Started` (a durable `SessionStarted`).
//!   On sled and on redb (the default).
//! - **memory per live idle conversation**: heap bytes in use (a counting
//!   global allocator) before and after opening 2,000 conversations with a
//!   short history (about 3 turns), on redb on disk: just opened, and after
//!   the short-idle tier. For context: the same with no history, the
//!   replayed `Conversation` alone, and a trivial ractor actor.
//! - **cancel to idle**: a conversation running a real `bash` process tree
//!   (`sleep 30 & sleep 30 & wait`), timed from `cancel()` to its answer
//!   (`Idle`) and to the moment the process group is gone.
//!
//! Every log is written straight to the store with `EventLog::append` and
//! checked with the reducer first; no LLM is called. Logs and conversations
//! are built before the clock starts. Data directories are `tempfile`
//! directories under cargo's target tmp dir, on the same disk as the
//! repository. A full run takes about 20 s after the build.

use std::alloc::System;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cap::Cap;
use keel_actors::core::config::ProviderKind;
use keel_actors::core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_actors::core::recovery::{plan_recovery, RecoveryPlan};
use keel_actors::core::{
    codec, Conversation, ConversationConfig, ConversationId, Event, EventKind, StateName,
    Timestamp, ToolCallId, WorkingSet,
};
use keel_actors::store::{self, BackendKind, EventLog};
use keel_actors::{ConversationHandle, Runtime, RuntimeConfig, Settings};
use nix::errno::Errno;
use nix::sys::signal::killpg;
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::task::JoinSet;

/// Counts every live heap byte of the process (the size each allocation
/// asked for; the allocator's own overhead is not included). It costs one
/// atomic add per allocation and free, in every figure here.
#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// 2026-01-01T00:00:00Z, in milliseconds.
const T0: u64 = 1_767_225_600_000;

/// Events of history for the cold start (whole turns, so a few more).
const LONG_EVENTS: usize = 1_000;

/// Events of history of a "short" conversation (whole turns: about 3).
const SHORT_EVENTS: usize = 20;

/// What the bash tool runs in the cancel benchmark: it writes its pid (the
/// process group's id, since bash leads the group) and starts two children.
const BUSY_COMMAND: &str = "echo $$ > pgid; sleep 30 & sleep 30 & wait";

/// Longest any wait for the runtime may take before the benchmark fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// Sample counts; `KEEL_BENCH_QUICK=1` selects the small set.
struct Counts {
    warm_open: usize,
    warm_inspect: usize,
    cold: usize,
    /// Conversations the cold starts rotate over, so that the events each
    /// cold start appends (`SessionStarted`, then `SessionEnded` on
    /// eviction) grow each log by only a few percent.
    cold_conversations: usize,
    memory: usize,
    cancel: usize,
}

const FULL: Counts = Counts {
    warm_open: 200_000,
    warm_inspect: 20_000,
    cold: 500,
    cold_conversations: 20,
    memory: 2_000,
    cancel: 200,
};

const QUICK: Counts = Counts {
    warm_open: 20_000,
    warm_inspect: 2_000,
    cold: 40,
    cold_conversations: 4,
    memory: 200,
    cancel: 10,
};

fn main() {
    let quick =
        std::env::var("KEEL_BENCH_QUICK").is_ok_and(|value| !value.is_empty() && value != "0");
    let counts = if quick { QUICK } else { FULL };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    println!(
        "keel-actors runtime benchmarks ({}); load average at start: {}",
        if quick {
            "KEEL_BENCH_QUICK"
        } else {
            "full run"
        },
        load_average()
    );
    // The measuring code runs on this thread (`block_on`); the actors run on
    // the runtime's worker threads, one per core. Memory goes first, while
    // nothing else has run in the process.
    tokio.block_on(async {
        memory(&counts).await;
        println!();
        print_header();
        warm(&counts).await;
        cold(&counts, BackendKind::Sled).await;
        cold(&counts, BackendKind::Redb).await;
        cancel(&counts).await;
    });
    println!(
        "\nload average at end: {}; {:.1} s in all",
        load_average(),
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// 1. Warm ensure_started

async fn warm(counts: &Counts) {
    let dir = scratch();
    let store = store::open(BackendKind::Redb, &dir.path().join("data")).unwrap();
    let runtime = open_runtime(store.clone(), dir.path(), Settings::default()).await;
    let cwd = workdir(dir.path(), "work");
    let short = fresh_id("warm-short");
    let long = fresh_id("warm-long");
    seed(store.as_ref(), &history(&short, &cwd, SHORT_EVENTS, 1)).await;
    seed(store.as_ref(), &history(&long, &cwd, LONG_EVENTS, 2)).await;
    let short_handle = runtime.open_conversation(&short).await.unwrap();
    let long_handle = runtime.open_conversation(&long).await.unwrap();
    assert_eq!(short_handle.inspect().await.unwrap().state, StateName::Idle);
    assert_eq!(long_handle.inspect().await.unwrap().state, StateName::Idle);

    for _ in 0..counts.warm_open / 10 {
        black_box(runtime.open_conversation(&short).await.unwrap());
    }
    let mut samples = Vec::with_capacity(counts.warm_open);
    for _ in 0..counts.warm_open {
        let start = Instant::now();
        let handle = runtime.open_conversation(&short).await.unwrap();
        samples.push(start.elapsed());
        black_box(handle);
    }
    print_row("warm open_conversation", &samples);

    inspect_rows("warm inspect", &short_handle, &long_handle, counts).await;
    drop((short_handle, long_handle));
    runtime.shutdown().await;

    // With short_idle = 0 a conversation at rest holds no working set, so
    // every message rebuilds it (checkpoint and tail, or the short log)
    // and lets it go again: what that costs, through inspect.
    let settings = Settings {
        short_idle: Duration::ZERO,
        ..Settings::default()
    };
    let runtime = open_runtime(store.clone(), dir.path(), settings).await;
    let short_handle = runtime.open_conversation(&short).await.unwrap();
    let long_handle = runtime.open_conversation(&long).await.unwrap();
    inspect_rows(
        "short_idle = 0: inspect (rebuild)",
        &short_handle,
        &long_handle,
        counts,
    )
    .await;
    assert!(long_handle.inspect().await.unwrap().hibernated);
    drop((short_handle, long_handle));
    runtime.shutdown().await;
}

/// Round trips of `inspect` to a conversation with a short history and to
/// one with 1,000 events.
async fn inspect_rows(
    what: &str,
    short: &ConversationHandle,
    long: &ConversationHandle,
    counts: &Counts,
) {
    for (history, handle, n) in [
        ("short history", short, counts.warm_inspect),
        ("1,000 events", long, counts.warm_inspect / 10),
    ] {
        for _ in 0..n / 10 {
            black_box(handle.inspect().await.unwrap());
        }
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            let inspection = handle.inspect().await.unwrap();
            samples.push(start.elapsed());
            black_box(inspection);
        }
        print_row(&format!("{what} ({history})"), &samples);
    }
}

// ---------------------------------------------------------------------------
// 2. Cold start from the store

async fn cold(counts: &Counts, kind: BackendKind) {
    let dir = scratch();
    let store = store::open(kind, &dir.path().join("data")).unwrap();
    let runtime = open_runtime(store.clone(), dir.path(), Settings::default()).await;
    let cwd = workdir(dir.path(), "work");
    let ids: Vec<ConversationId> = (0..counts.cold_conversations)
        .map(|_| fresh_id("cold"))
        .collect();
    let mut events_before = 0;
    for (n, id) in ids.iter().enumerate() {
        let log = history(id, &cwd, LONG_EVENTS, 10 + n as u64);
        events_before += log.len();
        if n == 0 {
            let bytes: usize = log.iter().map(|event| codec::encode(event).len()).sum();
            println!(
                "  ({kind}: {} conversations of {}-{} events; the first: {} messages, {} KB encoded)",
                ids.len(),
                LONG_EVENTS,
                LONG_EVENTS + 20,
                Conversation::replay(&log).unwrap().working.messages.len(),
                bytes / 1000
            );
        }
        seed(store.as_ref(), &log).await;
    }
    // One untimed cold start each: the first rehydrate writes the snapshot.
    for id in &ids {
        let handle = runtime.open_conversation(id).await.unwrap();
        handle.inspect().await.unwrap();
        handle.evict().await.unwrap();
    }

    let mut opened = Vec::with_capacity(counts.cold);
    let mut answered = Vec::with_capacity(counts.cold);
    let mut evicted = Vec::with_capacity(counts.cold);
    for n in 0..counts.cold {
        let id = &ids[n % ids.len()];
        assert!(!runtime.is_live(id), "{id} is still live");
        let last_seq = store.last_seq(id).await.unwrap();
        let start = Instant::now();
        let handle = runtime.open_conversation(id).await.unwrap();
        opened.push(start.elapsed());
        let inspection = handle.inspect().await.unwrap();
        answered.push(start.elapsed());
        assert_eq!(inspection.state, StateName::Idle);
        assert_eq!(
            inspection.last_seq,
            last_seq + 1,
            "the actor appended SessionStarted"
        );
        drop(inspection);
        let start = Instant::now();
        handle.evict().await.unwrap();
        evicted.push(start.elapsed());
    }
    print_row(&format!("cold start, {kind}: open_conversation"), &opened);
    print_row(&format!("cold start, {kind}: open + inspect"), &answered);
    print_row(&format!("  context: evict, {kind}"), &evicted);

    // Where a cold start's time goes: the parts it is made of, alone.
    let mut reads = Vec::with_capacity(counts.cold);
    let mut replays = Vec::with_capacity(counts.cold);
    for n in 0..counts.cold {
        let id = &ids[n % ids.len()];
        let start = Instant::now();
        let events = store.read_all(id).await.unwrap();
        reads.push(start.elapsed());
        let start = Instant::now();
        let working = WorkingSet::replay(&events).unwrap();
        replays.push(start.elapsed());
        black_box((working, events));
    }
    // What a cold start does now: the checkpoint eviction saved, and the
    // events after it (the SessionEnded of that eviction).
    let mut rehydrates = Vec::with_capacity(counts.cold);
    for n in 0..counts.cold {
        let id = &ids[n % ids.len()];
        let start = Instant::now();
        let rehydrated = store::rehydrate(store.as_ref(), id).await.unwrap().unwrap();
        rehydrates.push(start.elapsed());
        assert!(rehydrated.from_checkpoint, "{id} has a checkpoint");
        black_box(rehydrated);
    }
    let scratch_id = fresh_id("append");
    let mut log = opening(&scratch_id, &cwd);
    store.append(&scratch_id, log.clone()).await.unwrap();
    let mut appends = Vec::with_capacity(counts.cold);
    for _ in 0..counts.cold {
        push(&mut log, None, false, EventKind::SessionStarted);
        let event = log[log.len() - 1].clone();
        let start = Instant::now();
        store.append(&scratch_id, vec![event]).await.unwrap();
        appends.push(start.elapsed());
    }
    print_row(
        &format!("  context: rehydrate from the checkpoint, {kind}"),
        &rehydrates,
    );
    print_row(&format!("  context: read_all of the log, {kind}"), &reads);
    print_row("  context: WorkingSet::replay of it", &replays);
    print_row(&format!("  context: one durable append, {kind}"), &appends);
    let mut events_after: u64 = 0;
    for id in &ids {
        events_after += store.last_seq(id).await.unwrap();
    }
    println!(
        "  ({kind}: the logs grew from {events_before} to {events_after} events over the run: \
         SessionStarted and SessionEnded per cold start)"
    );
    runtime.shutdown().await;
}

// ---------------------------------------------------------------------------
// 3. Memory per live idle conversation

async fn memory(counts: &Counts) {
    let n = counts.memory;
    let dir = scratch();
    let store = store::open(BackendKind::Redb, &dir.path().join("data")).unwrap();
    let cwd = workdir(dir.path(), "work");
    let short_ids: Vec<ConversationId> = (0..n).map(|_| fresh_id("memory")).collect();
    let empty_ids: Vec<ConversationId> = (0..n).map(|_| fresh_id("empty")).collect();
    let mut logs: Vec<Vec<Event>> = short_ids
        .iter()
        .enumerate()
        .map(|(seed, id)| history(id, &cwd, SHORT_EVENTS, 100 + seed as u64))
        .collect();
    let n_events: usize = logs.iter().map(Vec::len).sum();
    let encoded: usize = logs
        .iter()
        .flatten()
        .map(|event| codec::encode(event).len())
        .sum();

    // The conversation state alone: what the reducer keeps of each log.
    let before = ALLOCATOR.allocated();
    let states: Vec<Conversation> = logs
        .iter()
        .map(|log| Conversation::replay(log).unwrap())
        .collect();
    let state_bytes = ALLOCATOR.allocated() - before;
    let n_messages: usize = states
        .iter()
        .map(|state| state.working.messages.len())
        .sum();
    drop(states);

    logs.extend(empty_ids.iter().map(|id| opening(id, &cwd)));
    let mut writers = JoinSet::new();
    for log in logs {
        let store = store.clone();
        writers.spawn(async move { seed(store.as_ref(), &log).await });
    }
    writers.join_all().await;

    let runtime = open_runtime(store.clone(), dir.path(), Settings::default()).await;
    let before_first_pass = ALLOCATOR.allocated();
    // Two passes open and evict every conversation, so that their snapshots
    // and checkpoints exist (the first eviction writes them), the store's
    // caches hold their pages (the second pass reads the checkpoints) and
    // the runtime's per-conversation control blocks are made before any
    // baseline.
    for _ in 0..2 {
        open_all(&runtime, &short_ids, true).await;
        open_all(&runtime, &empty_ids, true).await;
    }
    settle().await;
    let kept = ALLOCATOR.allocated().saturating_sub(before_first_pass);
    let short = live_bytes(&runtime, &short_ids).await;
    let empty = live_bytes(&runtime, &empty_ids).await;
    runtime.shutdown().await;

    // The same on a runtime whose short-idle tier comes after 300 ms.
    let settings = Settings {
        short_idle: Duration::from_millis(300),
        idle_check: Duration::from_millis(100),
        ..Settings::default()
    };
    let runtime = open_runtime(store.clone(), dir.path(), settings).await;
    open_all(&runtime, &short_ids, true).await;
    settle().await;
    let baseline = ALLOCATOR.allocated();
    open_all(&runtime, &short_ids, false).await;
    // Well past short_idle + idle_check for the last one opened.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(runtime.live().len(), n, "every conversation is live");
    let hibernated = ALLOCATOR.allocated().saturating_sub(baseline);
    evict_all(&runtime, &short_ids).await;
    runtime.shutdown().await;

    // The same with short_idle = 0: released as soon as it is at rest.
    let settings = Settings {
        short_idle: Duration::ZERO,
        ..Settings::default()
    };
    let runtime = open_runtime(store.clone(), dir.path(), settings).await;
    open_all(&runtime, &short_ids, true).await;
    settle().await;
    let at_rest = live_bytes(&runtime, &short_ids).await;
    runtime.shutdown().await;

    // ractor's own cost per actor: one with no state that does nothing.
    settle().await;
    let baseline = ALLOCATOR.allocated();
    let mut trivial = Vec::with_capacity(n);
    for _ in 0..n {
        trivial.push(ractor::Actor::spawn(None, Trivial, ()).await.unwrap());
    }
    settle().await;
    let trivial_bytes = ALLOCATOR.allocated().saturating_sub(baseline);
    for (actor, handle) in trivial {
        actor.stop(None);
        handle.await.unwrap();
    }

    let per = |bytes: usize| bytes as f64 / n as f64 / 1024.0;
    println!(
        "memory per live idle conversation: heap bytes still allocated after opening {n} conversations \
         (redb on disk); the short history is {:.1} events, {:.1} prompt messages, {:.1} KB encoded on average",
        n_events as f64 / n as f64,
        n_messages as f64 / n as f64,
        encoded as f64 / n as f64 / 1000.0,
    );
    for (what, bytes) in [
        ("short history, just opened", short.live),
        ("  of which freed by evicting it", short.freed),
        ("  (RSS growth, for comparison)", short.rss),
        ("short history, after the short-idle tier", hibernated),
        (
            "short history, short_idle = 0 (released at rest)",
            at_rest.live,
        ),
        ("no history (Created, SessionStarted)", empty.live),
        ("  of which freed by evicting it", empty.freed),
        ("context: the Conversation (replayed) alone", state_bytes),
        ("context: a trivial ractor actor", trivial_bytes),
        ("context: kept per conversation once evicted", kept / 2),
    ] {
        println!("  {what:<46} {:>8.2} KiB", per(bytes));
    }
}

/// Heap and RSS growth from opening `ids` (all evicted), and how much of
/// the heap growth evicting them again gave back.
struct LiveBytes {
    live: usize,
    freed: usize,
    rss: usize,
}

async fn live_bytes(runtime: &Runtime, ids: &[ConversationId]) -> LiveBytes {
    let baseline = ALLOCATOR.allocated();
    let baseline_rss = rss_bytes();
    open_all(runtime, ids, false).await;
    settle().await;
    assert_eq!(
        runtime.live().len(),
        ids.len(),
        "every conversation is live"
    );
    let live = ALLOCATOR.allocated();
    let live_rss = rss_bytes();
    evict_all(runtime, ids).await;
    settle().await;
    LiveBytes {
        live: live.saturating_sub(baseline),
        freed: live.saturating_sub(ALLOCATOR.allocated()),
        rss: live_rss.saturating_sub(baseline_rss),
    }
}

/// An actor with no state that handles nothing: ractor's floor.
struct Trivial;

impl ractor::Actor for Trivial {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ractor::ActorRef<()>,
        _args: (),
    ) -> Result<(), ractor::ActorProcessingErr> {
        Ok(())
    }
}

/// Open every conversation, wait until each has processed `Started`
/// (an `inspect` answers after it), and evict it again if `evict`.
async fn open_all(runtime: &Runtime, ids: &[ConversationId], evict: bool) {
    for chunk in ids.chunks(50) {
        let mut openers = JoinSet::new();
        for id in chunk {
            let runtime = runtime.clone();
            let id = id.clone();
            openers.spawn(async move {
                let handle = runtime.open_conversation(&id).await.unwrap();
                assert_eq!(handle.inspect().await.unwrap().state, StateName::Idle);
                if evict {
                    handle.evict().await.unwrap();
                }
            });
        }
        openers.join_all().await;
    }
}

async fn evict_all(runtime: &Runtime, ids: &[ConversationId]) {
    for chunk in ids.chunks(50) {
        let mut evictors = JoinSet::new();
        for id in chunk {
            let handle = runtime.handle(id.clone());
            evictors.spawn(async move { handle.evict().await.unwrap() });
        }
        evictors.join_all().await;
    }
}

/// Let stopped actors and finished tasks drop what they hold.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Resident set size, from /proc/self/statm (4 KiB pages).
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

// ---------------------------------------------------------------------------
// 4. Cancel to idle with a busy process tree

async fn cancel(counts: &Counts) {
    const WARM_UP: usize = 2;
    let dir = scratch();
    let store = store::open(BackendKind::Redb, &dir.path().join("data")).unwrap();
    let runtime = open_runtime(store.clone(), dir.path(), Settings::default()).await;
    let mut to_idle = Vec::with_capacity(counts.cancel);
    let mut to_gone = Vec::with_capacity(counts.cancel);
    for n in 0..WARM_UP + counts.cancel {
        let cwd = workdir(dir.path(), &format!("cancel-{n}"));
        let id = fresh_id("cancel");
        let log = dangling_bash_call(&id, &cwd);
        assert_eq!(
            Conversation::replay(&log).unwrap().state_name(),
            StateName::Recovering
        );
        assert_eq!(
            plan_recovery(&WorkingSet::replay(&log).unwrap()),
            RecoveryPlan::Redispatch
        );
        seed(store.as_ref(), &log).await;
        // Started re-dispatches the call: a real bash runs.
        let handle = runtime.open_conversation(&id).await.unwrap();
        let pgid = wait_for_pgid(&cwd.join("pgid")).await;
        let members = wait_for_members(pgid, 3).await;

        let start = Instant::now();
        let state = handle.cancel().await.unwrap();
        let idle_after = start.elapsed();
        assert_eq!(state, StateName::Idle);
        while !group_is_gone(pgid, &members) {
            assert!(
                start.elapsed() < PATIENCE,
                "process group {pgid} outlived the cancel"
            );
            std::thread::sleep(Duration::from_micros(50));
        }
        let gone_after = start.elapsed();
        if n >= WARM_UP {
            to_idle.push(idle_after);
            to_gone.push(gone_after);
        }
        handle.evict().await.unwrap();
    }
    print_row("cancel -> Idle answered (bash tree)", &to_idle);
    print_row("cancel -> process group gone", &to_gone);
    runtime.shutdown().await;
}

/// A log that ends in a `bash` call without a result, mid-turn: what a
/// crash during a tool leaves. Under `recovery = resume` (the default) the
/// next start runs the call again.
fn dangling_bash_call(conversation: &ConversationId, cwd: &Path) -> Vec<Event> {
    let mut log = opening(conversation, cwd);
    let user = push(
        &mut log,
        None,
        true,
        EventKind::UserMessage {
            text: "run the busy command".to_owned(),
            images: Vec::new(),
        },
    );
    let started = push(
        &mut log,
        Some(user),
        false,
        EventKind::TurnStarted { turn: 1 },
    );
    push(
        &mut log,
        Some(started),
        false,
        EventKind::AssistantMessage {
            blocks: vec![
                AssistantBlock::Text {
                    text: "Running it.".to_owned(),
                },
                AssistantBlock::ToolUse {
                    call: ToolCall {
                        id: ToolCallId::new("toolu_busy"),
                        name: "bash".to_owned(),
                        input: serde_json::json!({ "command": BUSY_COMMAND }),
                    },
                },
            ],
            stop_reason: StopReason::ToolUse,
            usage: usage(1_000),
            provider: ProviderKind::Anthropic,
            model: "claude-sonnet".to_owned(),
        },
    );
    log
}

async fn wait_for_pgid(path: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(pgid) = text.trim().parse() {
                return pgid;
            }
        }
        assert!(start.elapsed() < PATIENCE, "the tool never ran");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Pids of the live members of group `pgid`, once there are `at_least`.
async fn wait_for_members(pgid: i32, at_least: usize) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let members = group_members(pgid);
        if members.len() >= at_least {
            return members;
        }
        assert!(start.elapsed() < PATIENCE, "group {pgid}: {members:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Live (not zombie) processes of group `pgid`, from /proc.
fn group_members(pgid: i32) -> Vec<i32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some((state, group)) = state_and_group(pid) {
            if group == pgid && state != 'Z' {
                members.push(pid);
            }
        }
    }
    members
}

/// State letter and process group of `pid`; `None` once it is gone.
fn state_and_group(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, fields) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = fields.split_whitespace().collect();
    // After the name: state (field 3), ppid (4), pgrp (5).
    Some((
        fields.first()?.chars().next()?,
        fields.get(2)?.parse().ok()?,
    ))
}

/// Gone: nothing left to signal, or every member we saw is dead or a zombie
/// (orphans reparented to an init that does not reap stay zombies).
fn group_is_gone(pgid: i32, members: &[i32]) -> bool {
    match killpg(Pid::from_raw(pgid), None) {
        Err(Errno::ESRCH) => true,
        _ => members.iter().all(|&pid| {
            state_and_group(pid).is_none_or(|(state, group)| state == 'Z' || group != pgid)
        }),
    }
}

// ---------------------------------------------------------------------------
// Logs

const WORDS: &[&str] = &[
    "the",
    "conversation",
    "log",
    "is",
    "appended",
    "before",
    "anything",
    "else",
    "tool",
    "result",
    "assistant",
    "replays",
    "working",
    "set",
    "request",
    "model",
    "file",
    "src/main.rs",
    "function",
    "returns",
    "error",
    "because",
    "cargo",
    "build",
    "test",
    "passes",
    "and",
    "then",
    "we",
    "check",
    "whether",
    "output",
    "matches",
    "expected",
    "value",
    "of",
    "a",
    "struct",
    "field",
    "with",
    "serde",
    "JSON",
    "line",
    "42",
];

/// A small deterministic generator (xorshift64*): the same data every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// English-looking ASCII text of `lo..=hi` bytes.
    fn text(&mut self, lo: usize, hi: usize) -> String {
        let len = self.range(lo, hi);
        let mut text = String::with_capacity(len + 16);
        while text.len() < len {
            if !text.is_empty() {
                text.push(if self.next().is_multiple_of(11) {
                    '\n'
                } else {
                    ' '
                });
            }
            text.push_str(WORDS[self.range(0, WORDS.len() - 1)]);
        }
        text.truncate(len);
        text
    }
}

/// Append an event after the last one of `log`; returns its seq.
fn push(log: &mut Vec<Event>, parent: Option<u64>, triggers_turn: bool, kind: EventKind) -> u64 {
    let seq = log.len() as u64 + 1;
    log.push(Event {
        seq,
        at: Timestamp(T0 + seq * 250),
        parent,
        triggers_turn,
        kind,
    });
    seq
}

fn usage(input_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens: 150,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: input_tokens / 2,
    }
}

/// `Created` (default config: `recovery = resume`) and `SessionStarted`,
/// as `keel_core::create` writes them.
fn opening(conversation: &ConversationId, cwd: &Path) -> Vec<Event> {
    let mut log = Vec::new();
    push(
        &mut log,
        None,
        false,
        EventKind::Created {
            conversation: conversation.clone(),
            cwd: cwd.display().to_string(),
            config: ConversationConfig::default(),
            parent_conversation: None,
            user_initiated: true,
        },
    );
    push(&mut log, None, false, EventKind::SessionStarted);
    log
}

/// Whole turns until the log has at least `min_events` events, idle at the
/// end: a user message, `TurnStarted`, 0-2 rounds of an assistant message
/// with text and one or two `read_file` calls followed by their results, a
/// final text answer and `TurnCompleted`. Texts are 100-500 bytes. The log
/// is checked with the reducer before it is used.
fn history(conversation: &ConversationId, cwd: &Path, min_events: usize, seed: u64) -> Vec<Event> {
    let mut rng = Rng(0x5eed_0000 + seed);
    let mut log = opening(conversation, cwd);
    let mut turn = 0;
    let mut call = 0u64;
    while log.len() < min_events {
        turn += 1;
        let user = push(
            &mut log,
            None,
            true,
            EventKind::UserMessage {
                text: rng.text(100, 500),
                images: Vec::new(),
            },
        );
        let started = push(&mut log, Some(user), false, EventKind::TurnStarted { turn });
        for _ in 0..rng.range(0, 2) {
            let mut blocks = vec![AssistantBlock::Text {
                text: rng.text(100, 500),
            }];
            let mut ids = Vec::new();
            for _ in 0..rng.range(1, 2) {
                call += 1;
                let id = ToolCallId::new(format!("toolu_{call:016x}"));
                ids.push(id.clone());
                blocks.push(AssistantBlock::ToolUse {
                    call: ToolCall {
                        id,
                        name: "read_file".to_owned(),
                        input: serde_json::json!({ "path": format!("src/module_{call}.rs") }),
                    },
                });
            }
            push(
                &mut log,
                Some(started),
                false,
                EventKind::AssistantMessage {
                    blocks,
                    stop_reason: StopReason::ToolUse,
                    usage: usage(1_000 + call * 50),
                    provider: ProviderKind::Anthropic,
                    model: "claude-sonnet".to_owned(),
                },
            );
            for id in ids {
                push(
                    &mut log,
                    Some(started),
                    false,
                    EventKind::ToolResult {
                        tool_call_id: id,
                        content: rng.text(100, 500),
                        is_error: false,
                        synthetic: false,
                    },
                );
            }
        }
        push(
            &mut log,
            Some(started),
            false,
            EventKind::AssistantMessage {
                blocks: vec![AssistantBlock::Text {
                    text: rng.text(100, 500),
                }],
                stop_reason: StopReason::EndTurn,
                usage: usage(2_000 + call * 50),
                provider: ProviderKind::Anthropic,
                model: "claude-sonnet".to_owned(),
            },
        );
        push(
            &mut log,
            Some(started),
            false,
            EventKind::TurnCompleted {
                turn,
                duration_ms: 4_200,
                note: None,
            },
        );
    }
    WorkingSet::replay(&log).unwrap();
    let state = Conversation::replay(&log).unwrap();
    assert_eq!(state.state_name(), StateName::Idle);
    assert!(state.working.open_calls.is_empty());
    log
}

/// Write `log` to the store in appends of 100 events.
async fn seed(store: &dyn EventLog, log: &[Event]) {
    let EventKind::Created { conversation, .. } = &log[0].kind else {
        panic!("a log starts with Created");
    };
    for chunk in log.chunks(100) {
        store.append(conversation, chunk.to_vec()).await.unwrap();
    }
}

// ---------------------------------------------------------------------------
// Plumbing

/// Distinct conversation ids across the whole run.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn fresh_id(prefix: &str) -> ConversationId {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    ConversationId::new(format!("{prefix}-{n}")).unwrap()
}

fn scratch() -> TempDir {
    TempDir::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn workdir(root: &Path, name: &str) -> PathBuf {
    let cwd = root.join(name);
    std::fs::create_dir_all(&cwd).unwrap();
    cwd
}

/// A runtime over `store` with its process ledger under `root`. Providers
/// come from the environment; no benchmark makes an LLM request.
async fn open_runtime(store: Arc<dyn EventLog>, root: &Path, settings: Settings) -> Runtime {
    let mut config = RuntimeConfig::new(store).unwrap();
    config.process_dir = Some(root.join("processes"));
    config.settings = settings;
    let (runtime, report) = Runtime::open(config).await.unwrap();
    assert!(report.failed.is_empty(), "boot: {:?}", report.failed);
    runtime
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn print_header() {
    println!(
        "{:<44} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "benchmark", "n", "mean", "p50", "p90", "p99", "max"
    );
}

fn print_row(name: &str, samples: &[Duration]) {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let mean = sorted.iter().sum::<Duration>() / sorted.len() as u32;
    println!(
        "{:<44} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
        name,
        sorted.len(),
        human(mean),
        human(percentile(&sorted, 50.0)),
        human(percentile(&sorted, 90.0)),
        human(percentile(&sorted, 99.0)),
        human(sorted[sorted.len() - 1]),
    );
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn human(duration: Duration) -> String {
    let micros = duration.as_secs_f64() * 1e6;
    if micros < 1_000.0 {
        format!("{micros:.1} µs")
    } else {
        format!("{:.2} ms", micros / 1_000.0)
    }
}
