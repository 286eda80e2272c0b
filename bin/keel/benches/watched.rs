//! What a watched conversation costs once its watcher has left, measured as
//! a user sees it: this process's resident set (VmRSS) and CPU time from
//! /proc, with real HTTP to the fake provider (`keel mock-llm`, a separate
//! process, so its own memory is not counted) and a redb store on disk.
//!
//! N conversations (default 10,000; `KEEL_BENCH_CONVERSATIONS`) each get a
//! subscriber, one text turn, and then lose their subscriber. The figures:
//! RSS growth per conversation right after (what the default daemon holds
//! during the minute after a turn, the short-idle tier), and again once
//! the short-idle tier has let go of the working sets.
//!
//! Run: `cargo bench -p keel --bench watched`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use keel_actors::core::event::EventKind;
use keel_actors::core::{ConversationConfig, ModelRef, ProviderKind};
use keel_actors::provider::ProviderConfig;
use keel_actors::store::{self, BackendKind};
use keel_actors::tool::ToolRegistry;
use keel_actors::{Received, Runtime, RuntimeConfig, Settings, Update};
use keel_test_support::FakeProvider;

/// Turns in flight at once while the conversations are made.
const CONCURRENCY: usize = 32;

fn main() {
    let n: usize = std::env::var("KEEL_BENCH_CONVERSATIONS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(10_000);
    // The fake provider, as its own process.
    let mock = FakeProvider::start(Path::new(env!("CARGO_BIN_EXE_keel")), &[])
        .expect("start keel mock-llm");
    let base = mock.url().to_owned();

    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(run(n, base));
    drop(mock);
}

async fn run(n: usize, base: String) {
    let data = tempfile::tempdir().unwrap();
    let store = store::open(BackendKind::Redb, data.path(), None).unwrap();
    let short_idle = Duration::from_millis(
        std::env::var("KEEL_BENCH_SHORT_IDLE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5000),
    );
    let config = RuntimeConfig {
        store,
        providers: ProviderConfig {
            mock_url: Some(base),
            ..ProviderConfig::default()
        },
        tools: ToolRegistry::with_defaults(),
        process_dir: None,
        spawner: None,
        settings: Settings {
            short_idle,
            idle_check: Duration::from_secs(1),
            ..Settings::default()
        },
        mcp_servers: Default::default(),
        sandbox: Default::default(),
    };
    let (runtime, _) = Runtime::open(config).await.unwrap();
    let cwd = data.path().to_path_buf();
    let conversation_config = ConversationConfig {
        primary: ModelRef {
            provider: ProviderKind::Mock,
            model: "mock".to_owned(),
        },
        ..ConversationConfig::default()
    };
    // Warm up (the HTTP pool, the allocator's arenas) before the baseline.
    watched_turn(&runtime, &cwd, &conversation_config).await;

    let rss_before = rss_bytes();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let mut made = 0;
    while made < n {
        let batch = CONCURRENCY.min(n - made);
        let mut turns = tokio::task::JoinSet::new();
        for _ in 0..batch {
            let runtime = runtime.clone();
            let cwd = cwd.clone();
            let config = conversation_config.clone();
            turns.spawn(async move { watched_turn(&runtime, &cwd, &config).await });
        }
        while turns.join_next().await.is_some() {}
        made += batch;
    }
    let elapsed = started.elapsed();
    // Let the actors read the last `Unsubscribed` and answers settle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = rss_bytes();
    let cpu_after = cpu_seconds();
    let live = runtime.live().len();

    tokio::time::sleep(short_idle + Duration::from_secs(3)).await;
    let rss_rested = rss_bytes();

    let per = |bytes: usize| bytes.saturating_sub(rss_before) as f64 / n as f64 / 1024.0;
    println!("watched conversations: {n} (one text turn each over HTTP, subscriber gone after)");
    println!("  live actors: {live}");
    println!(
        "  made in {:.1} s ({:.0} turns/s), CPU {:.1} s",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        cpu_after - cpu_before
    );
    println!(
        "  RSS {:.1} MiB -> {:.1} MiB: {:.1} KiB per conversation within the short-idle tier",
        rss_before as f64 / 1048576.0,
        rss_after as f64 / 1048576.0,
        per(rss_after)
    );
    println!(
        "  RSS {:.1} MiB after the short-idle tier: {:.1} KiB per live idle conversation",
        rss_rested as f64 / 1048576.0,
        per(rss_rested)
    );
    let on_disk: u64 = std::fs::read_dir(data.path())
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len())
        .sum();
    println!(
        "  the store on disk: {:.1} MiB ({:.1} KiB per conversation)",
        on_disk as f64 / 1048576.0,
        on_disk as f64 / n as f64 / 1024.0
    );
    runtime.shutdown().await;
}

/// One conversation: subscribe, one text turn, then the subscriber leaves.
async fn watched_turn(runtime: &Runtime, cwd: &std::path::Path, config: &ConversationConfig) {
    let conversation = runtime.create(cwd, config.clone()).await.unwrap();
    let mut subscription = conversation.subscribe().await.unwrap();
    conversation.send("hello there", Vec::new()).await.unwrap();
    loop {
        match subscription.next().await {
            Received::Update(Update::Event { event })
                if matches!(event.kind, EventKind::TurnCompleted { .. }) =>
            {
                break
            }
            Received::Closed => panic!("the conversation stopped"),
            _ => {}
        }
    }
}

/// Resident set size (VmRSS), from /proc.
fn rss_bytes() -> usize {
    keel_test_support::rss_bytes(std::process::id()).unwrap() as usize
}

/// User and system CPU time of this process, from /proc.
fn cpu_seconds() -> f64 {
    keel_test_support::cpu_time(std::process::id())
        .unwrap()
        .as_secs_f64()
}
