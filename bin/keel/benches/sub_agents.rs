//! Sub-agents: what a `spawn_agents` call costs over its children's own
//! work. The real `keel mock-llm` as its own process, a `keel_actors`
//! runtime in this process on redb (a fresh data dir), default settings.
//!
//! Each round creates a parent conversation whose first answer is a
//! `spawn_agents` call with N tasks; each child's one answer (scripted by
//! its task, the mock's `when`) is a `submit_result`, with the mock
//! dripping its deltas `drip_ms` apart (0: as fast as the mock answers).
//! Timed in this process, from the parent's subscription: from the
//! `AssistantMessage` that holds the call (durable and published) to the
//! call's `ToolResult` (the aggregate, durable and published). That span
//! holds creating N conversations through the door (each one's `Created`
//! and `SessionStarted` durable), giving each its task, their requests to
//! the mock, their events, following them, and the aggregate.
//!
//! The children's own work is read from their logs: from the task's
//! `UserMessage` to `Finished` (the request to the mock, its answer, the
//! submission and every event they write), the longest of the call's
//! children (log timestamps are whole milliseconds). The overhead is the
//! call's span minus that, per round: what running N children in parallel
//! adds to the time the slowest of them takes. For context, a plain
//! conversation's turn answered with text at the same drip (one request,
//! send to `TurnCompleted`).
//!
//! Run: `cargo bench -p keel --bench sub_agents` (about a minute), or with
//! `KEEL_BENCH_QUICK=1` for a smoke run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use keel_actors::core::event::EventKind;
use keel_actors::core::message::AssistantBlock;
use keel_actors::core::{ConversationConfig, ModelRef, ProviderKind};
use keel_actors::provider::ProviderConfig;
use keel_actors::store::{self, BackendKind};
use keel_actors::tool::ToolRegistry;
use keel_actors::{Received, Runtime, RuntimeConfig, Settings, Update};
use keel_test_support::stats::nearest_rank as percentile;
use keel_test_support::FakeProvider;

/// Longest one round may take before the benchmark fails.
const PATIENCE: Duration = Duration::from_secs(60);

fn main() {
    let quick = std::env::var_os("KEEL_BENCH_QUICK").is_some()
        || std::env::args().any(|arg| arg == "--quick")
        || !std::env::args().any(|arg| arg == "--bench");
    let rounds = if quick { 3 } else { 30 };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(rounds));
}

async fn run(rounds: usize) {
    let mock = FakeProvider::start(Path::new(env!("CARGO_BIN_EXE_keel")), &[])
        .expect("start keel mock-llm");
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let data = dir.path().join("data");
    let config = RuntimeConfig {
        store: store::open(BackendKind::Redb, &data, None).unwrap(),
        providers: ProviderConfig {
            mock_url: Some(mock.url().to_owned()),
            ..ProviderConfig::default()
        },
        tools: ToolRegistry::with_defaults(),
        process_dir: Some(data.join("processes")),
        spawner: None,
        settings: Settings::default(),
        mcp_servers: Default::default(),
        sandbox: keel_actors::tool_sandbox::SandboxSettings {
            data_dir: Some(data.clone()),
            ..Default::default()
        },
    };
    let (runtime, _) = Runtime::open(config).await.unwrap();
    let mut rig = Rig {
        runtime,
        mock_url: mock.url().to_owned(),
        work,
        next_round: 0,
    };
    println!("| children | drip | n | plain turn, p50 | spawn call, p50 / p90 / max | slowest child's own work, p50 | overhead, p50 / p90 / max |");
    println!("|---|---|---|---|---|---|---|");
    for (n_children, drip_ms) in [(1, 0), (10, 0), (10, 100)] {
        // One round first, not counted: connections, caches.
        rig.single(drip_ms).await;
        rig.spawn(n_children, drip_ms).await;
        let mut plain = Vec::new();
        let mut calls = Vec::new();
        let mut own = Vec::new();
        let mut overheads = Vec::new();
        for _ in 0..rounds {
            plain.push(rig.single(drip_ms).await);
            let (call, slowest_child) = rig.spawn(n_children, drip_ms).await;
            calls.push(call);
            own.push(slowest_child);
            overheads.push(call.saturating_sub(slowest_child));
        }
        println!(
            "| {n_children} | {drip_ms} ms | {rounds} | {} | {} / {} / {} | {} | {} / {} / {} |",
            ms(percentile(&plain, 0.5)),
            ms(percentile(&calls, 0.5)),
            ms(percentile(&calls, 0.9)),
            ms(percentile(&calls, 1.0)),
            ms(percentile(&own, 0.5)),
            ms(percentile(&overheads, 0.5)),
            ms(percentile(&overheads, 0.9)),
            ms(percentile(&overheads, 1.0)),
        );
    }
    rig.runtime.shutdown().await;
}

struct Rig {
    runtime: Runtime,
    mock_url: String,
    work: std::path::PathBuf,
    /// Makes every round's prompts its own, so the mock's `when` entries
    /// of one round never answer another's.
    next_round: usize,
}

impl Rig {
    fn round(&mut self) -> usize {
        self.next_round += 1;
        self.next_round
    }

    fn config() -> ConversationConfig {
        ConversationConfig {
            primary: ModelRef {
                provider: ProviderKind::Mock,
                model: "mock".to_owned(),
            },
            ..ConversationConfig::default()
        }
    }

    /// A child's work alone: one request answered the way a child's is
    /// (drip and all), on a plain conversation; send to `TurnCompleted`.
    async fn single(&mut self, drip_ms: u64) -> Duration {
        let round = self.round();
        let prompt = format!("<single {round}>");
        push_script(
            &self.mock_url,
            &json!([{"when": prompt, "text": "result", "drip_ms": drip_ms}]),
        )
        .await;
        let conversation = self
            .runtime
            .create(&self.work, Self::config())
            .await
            .unwrap();
        let mut subscription = conversation.subscribe().await.unwrap();
        let started = Instant::now();
        conversation.send(prompt, Vec::new()).await.unwrap();
        wait(&mut subscription, |kind| {
            matches!(kind, EventKind::TurnCompleted { .. })
        })
        .await;
        started.elapsed()
    }

    /// One spawn call of `n_children`: from the call's message to its
    /// result, and the slowest child's own work (from its log).
    async fn spawn(&mut self, n_children: usize, drip_ms: u64) -> (Duration, Duration) {
        let round = self.round();
        let parent_prompt = format!("<parent {round}>");
        let tasks: Vec<Value> = (0..n_children)
            .map(|task_idx| json!({"task": format!("<task {round}.{task_idx}>")}))
            .collect();
        let mut script = vec![json!({
            "when": parent_prompt,
            "tool_calls": [{"name": "spawn_agents", "input": {"tasks": tasks}}]
        })];
        for task_idx in 0..n_children {
            script.push(json!({
                "when": format!("<task {round}.{task_idx}>"),
                "text": "result",
                "drip_ms": drip_ms,
                "tool_calls": [{"name": "submit_result", "input": {"result": format!("result {task_idx}")}}]
            }));
        }
        script.push(json!({"when": parent_prompt, "text": "done"}));
        push_script(&self.mock_url, &json!(script)).await;
        let parent = self
            .runtime
            .create(&self.work, Self::config())
            .await
            .unwrap();
        let mut subscription = parent.subscribe().await.unwrap();
        parent.send(parent_prompt, Vec::new()).await.unwrap();
        wait(&mut subscription, |kind| {
            matches!(kind, EventKind::AssistantMessage { blocks, .. }
                if blocks.iter().any(|block| matches!(block, AssistantBlock::ToolUse { .. })))
        })
        .await;
        let started = Instant::now();
        wait(&mut subscription, |kind| {
            matches!(kind, EventKind::ToolResult { .. })
        })
        .await;
        let took = started.elapsed();
        wait(&mut subscription, |kind| {
            matches!(kind, EventKind::TurnCompleted { .. })
        })
        .await;
        let mut slowest_ms = 0;
        for entry in self.runtime.list(true).await.unwrap() {
            if entry.parent.as_ref() != Some(parent.id()) {
                continue;
            }
            let events = self.runtime.store().read_all(&entry.id).await.unwrap();
            let at = |wanted: fn(&EventKind) -> bool| {
                events
                    .iter()
                    .find(|event| wanted(&event.kind))
                    .map(|event| event.at)
                    .unwrap()
            };
            let given = at(|kind| matches!(kind, EventKind::UserMessage { .. }));
            let finished = at(|kind| matches!(kind, EventKind::Finished { .. }));
            slowest_ms = slowest_ms.max(finished.millis_since(given));
        }
        (took, Duration::from_millis(slowest_ms))
    }
}

/// Waits for the first canonical event `done` accepts.
async fn wait(subscription: &mut keel_actors::Subscription, done: impl Fn(&EventKind) -> bool) {
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            match subscription.next().await {
                Received::Update(Update::Event { event }) if done(&event.kind) => return,
                Received::Closed => panic!("the conversation stopped"),
                _ => {}
            }
        }
    })
    .await;
    assert!(waited.is_ok(), "not within {PATIENCE:?}");
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

async fn push_script(mock_url: &str, script: &Value) {
    let response = keel_api::http::client()
        .post(format!("{mock_url}/_mock/script"))
        .json(script)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "the mock took no script");
}
