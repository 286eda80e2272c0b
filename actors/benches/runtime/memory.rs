//! 3. Memory per live idle conversation.

use std::time::Duration;

use keel_actors::core::{codec, Conversation, ConversationId, Event, StateName};
use keel_actors::store::{self, BackendKind};
use keel_actors::{Runtime, Settings};
use tokio::task::JoinSet;

use crate::logs::{history, opening, seed};
use crate::plumbing::{fresh_id, open_runtime, scratch, workdir};
use crate::{Counts, ALLOCATOR, SHORT_EVENTS};

pub(crate) async fn memory(counts: &Counts) {
    let n = counts.memory;
    let dir = scratch();
    let store = store::open(BackendKind::Redb, &dir.path().join("data"), None).unwrap();
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

/// Resident set size (VmRSS), from /proc.
fn rss_bytes() -> usize {
    keel_test_support::rss_bytes(std::process::id()).unwrap() as usize
}
