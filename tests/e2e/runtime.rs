//! The actor runtime (keel-actors) as an embedder uses it, against the real
//! `keel mock-llm` over loopback, on the in-memory store and on disk (redb
//! and sled): full turns with a real `bash` tool, busy policies, cancel from
//! every busy state, crash restarts, eviction, concurrent `ensure_started`,
//! a runtime dropped mid-turn and reopened on the same store, attached
//! images (`runtime/images.rs`), the file tools (`runtime/file_tools.rs`)
//! sub-agents (`runtime/sub_agents.rs`) and replay equals live across
//! random crashes (`runtime/replay.rs`).
//!
//! Tests wait on the conversation's own updates (state changes through a
//! subscription) or on the mock's recording, never on sleeps; every wait is
//! bounded so that a regression fails instead of hanging.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_actors::core::config::{ConversationConfig, ModelRef, ProviderKind, ToolPolicy};
use keel_actors::core::event::{Decision, EventKind};
use keel_actors::core::reducer::WorkingSet;
use keel_actors::core::retry::RetryPolicy;
use keel_actors::core::{
    BusyPolicy, Event, LiveEvent, RecoveryPolicy, Rejection, StateName, StreamDelta,
};
use keel_actors::provider::Timeouts;
use keel_actors::store::{self, BackendKind, EventLog};
use keel_actors::{
    ConversationHandle, Error, Received, Runtime, RuntimeConfig, Settings, Subscription, Update,
};
use serde_json::json;

use crate::harness::{group_is_gone, group_member_states, MockLlm};

mod actors;
mod file_tools;
mod images;
mod replay;
mod sub_agents;

/// Longest any wait here may take before the test fails.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

pub(crate) struct Rig {
    pub(crate) mock: MockLlm,
    /// Holds the working directory and the data directory.
    dir: tempfile::TempDir,
}

impl Rig {
    pub(crate) fn new() -> Rig {
        Rig {
            mock: MockLlm::start(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn cwd(&self) -> std::path::PathBuf {
        let cwd = self.dir.path().join("work");
        std::fs::create_dir_all(&cwd).unwrap();
        cwd
    }

    pub(crate) fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    pub(crate) fn store(&self, kind: BackendKind) -> Arc<dyn EventLog> {
        store::open(kind, &self.data_dir(), None).unwrap()
    }

    /// What the tests open a runtime with, unless they change a field.
    pub(crate) fn runtime_config(&self, store: Arc<dyn EventLog>) -> RuntimeConfig {
        RuntimeConfig {
            store,
            providers: self.mock.provider_config(Timeouts::default()),
            tools: keel_actors::tool::ToolRegistry::with_defaults(),
            process_dir: Some(self.data_dir().join("processes")),
            spawner: None,
            settings: Settings::default(),
            mcp_servers: Default::default(),
            sandbox: keel_actors::tool_sandbox::SandboxSettings {
                data_dir: Some(self.data_dir()),
                ..Default::default()
            },
        }
    }

    pub(crate) async fn open(&self, config: RuntimeConfig) -> Runtime {
        let (runtime, report) = Runtime::open(config).await.unwrap();
        assert!(
            report.failed.is_empty(),
            "boot failures: {:?}",
            report.failed
        );
        runtime
    }

    pub(crate) async fn runtime(&self, store: Arc<dyn EventLog>) -> Runtime {
        self.open(self.runtime_config(store)).await
    }
}

/// Waits (bounded) until `check` holds, polling.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: not within {PATIENCE:?}");
}

pub(crate) fn config() -> ConversationConfig {
    ConversationConfig {
        primary: ModelRef {
            provider: ProviderKind::Anthropic,
            model: "claude-mock".to_owned(),
        },
        ..ConversationConfig::default()
    }
}

pub(crate) fn with_policy(busy_policy: BusyPolicy) -> ConversationConfig {
    ConversationConfig {
        busy_policy,
        ..config()
    }
}

/// A subscription that remembers the last state it heard of.
pub(crate) struct Watch {
    pub(crate) subscription: Subscription,
    pub(crate) state: StateName,
}

pub(crate) async fn watch(conversation: &ConversationHandle) -> Watch {
    let subscription = conversation.subscribe().await.unwrap();
    let state = subscription.view.state;
    Watch {
        subscription,
        state,
    }
}

impl Watch {
    pub(crate) async fn next(&mut self) -> Received {
        let received = self.subscription.next().await;
        if let Received::Update(Update::Live {
            event: LiveEvent::StateChanged { state },
        }) = &received
        {
            self.state = *state;
        }
        received
    }

    /// Waits until the conversation is in `state` (now or later).
    pub(crate) async fn reach(&mut self, state: StateName) {
        let waited = tokio::time::timeout(PATIENCE, async {
            while self.state != state {
                if self.next().await == Received::Closed {
                    panic!("the conversation stopped before reaching {state}");
                }
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "the conversation did not reach {state} within {PATIENCE:?} (last: {})",
            self.state
        );
    }

    /// Waits until the conversation enters `state` anew, then until it
    /// leaves again for `then`.
    pub(crate) async fn through(&mut self, state: StateName, then: StateName) {
        let waited = tokio::time::timeout(PATIENCE, async {
            loop {
                match self.next().await {
                    Received::Update(Update::Live {
                        event: LiveEvent::StateChanged { state: now },
                    }) if now == state => break,
                    Received::Closed => panic!("the conversation stopped before reaching {state}"),
                    _ => {}
                }
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "the conversation did not enter {state} within {PATIENCE:?}"
        );
        self.reach(then).await;
    }
}

pub(crate) async fn log(runtime: &Runtime, conversation: &ConversationHandle) -> Vec<Event> {
    runtime.store().read_all(conversation.id()).await.unwrap()
}

pub(crate) fn count(events: &[Event], matches: impl Fn(&EventKind) -> bool) -> usize {
    events.iter().filter(|event| matches(&event.kind)).count()
}

/// Invariant 3: every tool_use in the history has exactly one result.
pub(crate) async fn assert_paired(conversation: &ConversationHandle) {
    let inspection = conversation.inspect().await.unwrap();
    let mut uses = Vec::new();
    let mut results = Vec::new();
    for message in &inspection.messages {
        for block in &message.content {
            match block {
                keel_actors::core::message::ContentBlock::ToolUse { call } => {
                    uses.push(call.id.clone())
                }
                keel_actors::core::message::ContentBlock::ToolResult { result } => {
                    results.push(result.tool_call_id.clone())
                }
                _ => {}
            }
        }
    }
    uses.sort();
    results.sort();
    assert_eq!(uses, results, "every tool_use has exactly one result");
}

pub(crate) fn tool_results(events: &[Event]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult {
                tool_call_id,
                content,
                synthetic,
                ..
            } => Some((tool_call_id.to_string(), content.clone(), *synthetic)),
            _ => None,
        })
        .collect()
}

async fn wait_group_gone(pgid: i32) {
    let gone = tokio::time::timeout(PATIENCE, async {
        while !group_is_gone(pgid) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "process group {pgid} still runs: {:?}",
        group_member_states(pgid)
    );
}

/// Waits until the mock has received `n` requests (ended or not).
pub(crate) async fn wait_requests(mock: &MockLlm, n: usize) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while mock.requests().await.len() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the mock never received {n} requests");
}

/// A new conversation whose first request (`text`) has reached the mock
/// and is streaming; no handle on it is left, so the runtime can stop.
pub(crate) async fn streaming(
    rig: &Rig,
    runtime: &Runtime,
    config: ConversationConfig,
    text: &str,
) -> keel_actors::core::ConversationId {
    let conversation = runtime.create(rig.cwd(), config).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send(text, Vec::new()).await.unwrap();
    subscription.reach(StateName::Streaming).await;
    wait_requests(&rig.mock, 1).await;
    conversation.id().clone()
}

/// Waits for the process group id a tool's `echo $pid > pgid` (its pid
/// as `/proc/self/stat` says: `$$` is its PID namespace's) writes in the
/// working directory.
async fn wait_pgid(rig: &Rig) -> i32 {
    let path = rig.cwd().join("pgid");
    wait_file(&path)
        .await
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{} holds no process group id", path.display()))
}

/// Waits for a file a tool writes, and returns its contents.
async fn wait_file(path: &Path) -> String {
    let read = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Ok(text) = std::fs::read_to_string(path) {
                if text.ends_with('\n') {
                    return text;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    read.unwrap_or_else(|_| panic!("{} was never written", path.display()))
}

// ---------------------------------------------------------------------------

async fn full_turn_with_a_tool_call(kind: BackendKind) {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(kind)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    assert_eq!(subscription.subscription.view.state, StateName::Idle);

    conversation
        .send("run: pwd; echo hello", Vec::new())
        .await
        .unwrap();
    subscription.reach(StateName::ExecutingTools).await;
    subscription.reach(StateName::Idle).await;

    let events = log(&runtime, &conversation).await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 1, "{events:#?}");
    let (_, content, synthetic) = &results[0];
    assert!(!synthetic);
    assert!(content.contains("hello"), "{content}");
    assert!(
        content.contains(rig.cwd().to_str().unwrap()),
        "the tool ran in the conversation's directory: {content}"
    );
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::AssistantMessage { .. }
        )),
        2
    );
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnCompleted { .. }
        )),
        1
    );
    let inspection = conversation.inspect().await.unwrap();
    let last = inspection.messages.last().unwrap();
    assert!(
        format!("{last:?}").contains("hello"),
        "the model summarised the tool's output: {last:?}"
    );
    assert_paired(&conversation).await;
    assert_eq!(rig.mock.wait_ended(2).await.len(), 2);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_full_turn_with_a_tool_call_in_memory() {
    full_turn_with_a_tool_call(BackendKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_full_turn_with_a_tool_call_on_redb() {
    full_turn_with_a_tool_call(BackendKind::Redb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_full_turn_with_a_tool_call_on_sled() {
    full_turn_with_a_tool_call(BackendKind::Sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_live_tail_follows_the_view_without_gap_or_duplicate() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    conversation.send("first", Vec::new()).await.unwrap();
    let mut first = watch(&conversation).await;
    first.reach(StateName::Idle).await;

    let mut subscription = watch(&conversation).await;
    let from = subscription.subscription.view.last_seq;
    conversation.send("second", Vec::new()).await.unwrap();
    let mut seqs = Vec::new();
    let mut deltas = String::new();
    tokio::time::timeout(PATIENCE, async {
        loop {
            match subscription.next().await {
                Received::Update(Update::Event { event }) => {
                    seqs.push(event.seq);
                    if matches!(event.kind, EventKind::TurnCompleted { .. }) {
                        return;
                    }
                }
                Received::Update(Update::Live {
                    event: LiveEvent::Delta { delta, .. },
                }) => {
                    if let keel_actors::core::StreamDelta::Text { text } = delta {
                        deltas.push_str(&text);
                    }
                }
                Received::Update(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .unwrap();
    let expected: Vec<u64> = (from + 1..=from + seqs.len() as u64).collect();
    assert_eq!(
        seqs, expected,
        "canonical events continue the view's last seq"
    );
    assert!(
        deltas.contains("second"),
        "the echo streamed live: {deltas:?}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_busy_rejection_says_how_to_cancel() {
    let rig = Rig::new();
    rig.mock
        .push_script(
            json!([{"endpoint": "anthropic", "text": "one two three four", "drip_ms": 300}]),
        )
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("slow one", Vec::new()).await.unwrap();
    subscription.reach(StateName::Streaming).await;

    let before = log(&runtime, &conversation).await.len();
    let refused = conversation
        .send("while busy", Vec::new())
        .await
        .unwrap_err();
    match &refused {
        keel_actors::Error::Rejected(Rejection::Busy { state }) => {
            assert_eq!(*state, StateName::Streaming)
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert!(refused.to_string().contains("cancel"), "{refused}");
    assert_eq!(
        log(&runtime, &conversation).await.len(),
        before,
        "a refused message changes nothing"
    );
    subscription.reach(StateName::Idle).await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_interrupt_policy_starts_a_new_turn_for_the_new_message() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": "a b c d e f g h", "drip_ms": 500}]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime
        .create(rig.cwd(), with_policy(BusyPolicy::Interrupt))
        .await
        .unwrap();
    let mut subscription = watch(&conversation).await;
    conversation
        .send("long answer please", Vec::new())
        .await
        .unwrap();
    subscription.reach(StateName::Streaming).await;
    wait_requests(&rig.mock, 1).await;
    conversation
        .send("never mind, this instead", Vec::new())
        .await
        .unwrap();
    subscription.reach(StateName::Debouncing).await;
    subscription.reach(StateName::Idle).await;

    let events = log(&runtime, &conversation).await;
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnInterrupted { .. }
        )),
        1
    );
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnCompleted { .. }
        )),
        1
    );
    let records = rig.mock.wait_ended(2).await;
    assert_eq!(
        records[0]["outcome"], "disconnected",
        "the interrupted stream was closed"
    );
    let last = conversation.inspect().await.unwrap().messages;
    assert!(format!("{:?}", last.last().unwrap()).contains("this instead"));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_queue_policy_runs_the_queued_message_after_the_turn() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": "first answer", "drip_ms": 200}]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime
        .create(rig.cwd(), with_policy(BusyPolicy::Queue))
        .await
        .unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("first", Vec::new()).await.unwrap();
    subscription.reach(StateName::Streaming).await;
    conversation
        .send("queued second", Vec::new())
        .await
        .unwrap();
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            let events = log(&runtime, &conversation).await;
            if count(&events, |kind| {
                matches!(kind, EventKind::TurnCompleted { .. })
            }) == 2
            {
                return events;
            }
            subscription.next().await;
        }
    })
    .await
    .expect("two turns completed");
    assert_eq!(
        count(&waited, |kind| matches!(
            kind,
            EventKind::TurnStarted { .. }
        )),
        2
    );
    let records = rig.mock.wait_ended(2).await;
    assert!(records[1].to_string().contains("queued second"));
    runtime.shutdown().await;
}

/// Live updates go out in waves (docs/requirements.md, "Live updates go
/// out in waves"): deltas that come soon after the user message's wave are
/// held to the live interval, and go out when it ends even though nothing
/// canonical follows (the stream hangs after its deltas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_held_deltas_go_out_when_the_live_interval_ends() {
    const INTERVAL: Duration = Duration::from_millis(300);
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{
            "endpoint": "anthropic",
            "text": "alpha beta gamma",
            "drip_ms": 5,
            // message_start, content_block_start, ping, then three deltas.
            "hang_after_events": 6,
        }]))
        .await;
    let mut runtime_config = rig.runtime_config(rig.store(BackendKind::Memory));
    runtime_config.settings.live_interval = INTERVAL;
    let runtime = rig.open(runtime_config).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut watch = watch(&conversation).await;

    let sent = Instant::now();
    conversation.send("hello?", Vec::new()).await.unwrap();
    let mut text = String::new();
    let mut first_delta = None;
    let waited = tokio::time::timeout(PATIENCE, async {
        while text != "alpha beta gamma" {
            match watch.next().await {
                Received::Update(Update::Live {
                    event:
                        LiveEvent::Delta {
                            delta: StreamDelta::Text { text: piece },
                            ..
                        },
                }) => {
                    first_delta.get_or_insert_with(Instant::now);
                    text.push_str(&piece);
                }
                Received::Update(Update::Event { event }) => {
                    assert!(
                        !matches!(event.kind, EventKind::AssistantMessage { .. }),
                        "the stream hangs: no answer is recorded"
                    );
                }
                Received::Closed => panic!("the conversation stopped"),
                _ => {}
            }
        }
    })
    .await;
    assert!(waited.is_ok(), "the held deltas never went out: {text:?}");
    let held = first_delta.map(|at| at - sent);
    assert!(
        held.is_some_and(|held| held >= INTERVAL),
        "the first delta came {held:?} after the message, within the live interval"
    );
    assert_eq!(watch.state, StateName::Streaming);
    assert_eq!(conversation.cancel().await.unwrap(), StateName::Idle);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_cancel_during_streaming_closes_the_connection() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "hang": true}]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("hello?", Vec::new()).await.unwrap();
    subscription.reach(StateName::Streaming).await;
    // The request reached the server before we cancel it.
    wait_requests(&rig.mock, 1).await;

    assert_eq!(conversation.cancel().await.unwrap(), StateName::Idle);
    let records = rig.mock.wait_ended(1).await;
    assert_eq!(records[0]["outcome"], "disconnected");
    let events = log(&runtime, &conversation).await;
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnInterrupted { .. }
        )),
        1
    );
    // The conversation takes the next message.
    conversation.send("again", Vec::new()).await.unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_cancel_during_a_tool_kills_its_process_tree() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation
        .send(
            "run: read -r pid _ < /proc/self/stat; echo $pid > pgid; sleep 30 & sleep 30 & wait",
            Vec::new(),
        )
        .await
        .unwrap();
    subscription.reach(StateName::ExecutingTools).await;
    let pgid = wait_pgid(&rig).await;
    assert!(!group_is_gone(pgid));

    assert_eq!(conversation.cancel().await.unwrap(), StateName::Idle);
    wait_group_gone(pgid).await;
    let events = log(&runtime, &conversation).await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 1);
    assert!(results[0].2, "the cancelled call got a synthetic result");
    assert_paired(&conversation).await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_cancel_during_retry_wait_ends_idle() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "status": 503, "retry_after": 30}]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("hello", Vec::new()).await.unwrap();
    let retrying = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Received::Update(Update::Live {
                event:
                    LiveEvent::Retrying {
                        retry, delay_ms, ..
                    },
            }) = subscription.next().await
            {
                return (retry, delay_ms);
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(retrying, (1, 30_000), "retry-after is honoured");
    assert_eq!(conversation.cancel().await.unwrap(), StateName::Idle);
    assert_eq!(conversation.inspect().await.unwrap().state, StateName::Idle);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_cancel_while_awaiting_approval_pairs_the_call() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let mut config = config();
    config.tools.insert("bash".to_owned(), ToolPolicy::Approve);
    let conversation = runtime.create(rig.cwd(), config).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation
        .send("run: touch never", Vec::new())
        .await
        .unwrap();
    subscription.reach(StateName::AwaitingInput).await;
    assert_eq!(conversation.inspect().await.unwrap().pending.len(), 1);

    assert_eq!(conversation.cancel().await.unwrap(), StateName::Idle);
    assert!(
        !rig.cwd().join("never").exists(),
        "the unapproved tool never ran"
    );
    assert_paired(&conversation).await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_approval_runs_the_tool_and_survives_a_restart() {
    let rig = Rig::new();
    let mut config = config();
    config.tools.insert("bash".to_owned(), ToolPolicy::Approve);
    let id = {
        let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
        let conversation = runtime.create(rig.cwd(), config).await.unwrap();
        let mut subscription = watch(&conversation).await;
        conversation
            .send("run: touch approved", Vec::new())
            .await
            .unwrap();
        subscription.reach(StateName::AwaitingInput).await;
        let id = conversation.id().clone();
        drop(subscription);
        drop(conversation);
        runtime.shutdown().await;
        id
    };
    // A new runtime on the same store: the approval is still pending.
    let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
    let conversation = runtime.open_conversation(&id).await.unwrap();
    let inspection = conversation.inspect().await.unwrap();
    assert_eq!(inspection.state, StateName::AwaitingInput);
    let call = inspection.pending[0].call.id.clone();
    let mut subscription = watch(&conversation).await;
    conversation
        .resolve_as(call.clone(), Decision::Approve, Some("alice".to_owned()))
        .await
        .unwrap();
    subscription.reach(StateName::Idle).await;
    assert!(rig.cwd().join("approved").exists());
    assert_paired(&conversation).await;

    // Exactly once: asking again (an answer lost on the way) succeeds and
    // records nothing; another decision is refused with the recorded one.
    let before = conversation.inspect().await.unwrap().last_seq;
    conversation
        .resolve(call.clone(), Decision::Approve)
        .await
        .unwrap();
    match conversation.resolve(call.clone(), Decision::Deny).await {
        Err(Error::Rejected(Rejection::AlreadyResolved { decision, .. })) => {
            assert_eq!(decision, Decision::Approve);
        }
        other => panic!("a change of mind was not refused: {other:?}"),
    }
    assert_eq!(conversation.inspect().await.unwrap().last_seq, before);
    let log = conversation.log(1, usize::MAX).await.unwrap();
    let by: Vec<_> = log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Resolved { by, .. } => Some(by.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(by, vec![Some("alice".to_owned())]);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_a_crashed_actor_restarts_with_its_history() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("remember me", Vec::new()).await.unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    let before = conversation.inspect().await.unwrap().messages;

    conversation.crash().await.unwrap();
    tokio::time::timeout(PATIENCE, async {
        while subscription.next().await != Received::Closed {}
    })
    .await
    .expect("the crashed actor's subscribers hear that it stopped");
    tokio::time::timeout(PATIENCE, async {
        while runtime.restarts().await.unwrap() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the supervisor restarted the conversation");
    let after = conversation.inspect().await.unwrap();
    assert_eq!(after.messages, before);
    assert_eq!(after.state, StateName::Idle);
    // It carries on.
    let mut subscription = watch(&conversation).await;
    conversation.send("still there?", Vec::new()).await.unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_a_message_racing_an_eviction_is_recorded_never_left_in_doubt() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    for round in 0..25 {
        let text = format!("racing the eviction, round {round}");
        // The eviction is asked first; the message lands in the mailbox
        // behind it, or in the next life.
        let (_, sent) = tokio::join!(conversation.evict(), async {
            tokio::task::yield_now().await;
            conversation.send(text.clone(), Vec::new()).await
        });
        let event_id = sent.unwrap_or_else(|error| panic!("round {round}: {error}"));
        let seq = event_id.seq;
        let events = log(&runtime, &conversation).await;
        let recorded = events.iter().find(|event| event.seq == seq).unwrap();
        assert!(
            matches!(&recorded.kind, EventKind::UserMessage { text: kept, .. } if *kept == text),
            "round {round}: seq {seq} holds {:?}",
            recorded.kind
        );
        let waited = tokio::time::timeout(PATIENCE, async {
            while conversation.inspect().await.unwrap().state != StateName::Idle {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "round {round}: the turn never ended");
    }
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_two_concurrent_ensure_started_give_one_actor() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let id = conversation.id().clone();
    conversation.evict().await.unwrap();
    assert!(!runtime.is_live(&id));
    let sessions_before = count(&log(&runtime, &conversation).await, |kind| {
        matches!(kind, EventKind::SessionStarted)
    });

    for _ in 0..10 {
        let (one, two) = tokio::join!(
            runtime.open_conversation(&id),
            runtime.open_conversation(&id)
        );
        one.unwrap();
        two.unwrap();
        assert_eq!(runtime.live(), vec![id.clone()]);
        conversation.evict().await.unwrap();
    }
    let sessions = count(&log(&runtime, &conversation).await, |kind| {
        matches!(kind, EventKind::SessionStarted)
    });
    assert_eq!(
        sessions,
        sessions_before + 10,
        "one actor (one session) per start"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_eviction_and_revival_keep_history() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation
        .send("before eviction", Vec::new())
        .await
        .unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    drop(subscription);
    let before = conversation.inspect().await.unwrap().messages;

    conversation.evict().await.unwrap();
    assert!(!runtime.is_live(conversation.id()));
    assert!(
        runtime
            .store()
            .load_snapshot(conversation.id())
            .await
            .unwrap()
            .is_some(),
        "eviction saved the snapshot"
    );
    let checkpoint = runtime
        .store()
        .load_checkpoint(conversation.id())
        .await
        .unwrap()
        .expect("eviction saved a checkpoint of the working set");
    let evicted_log = log(&runtime, &conversation).await;
    assert_eq!(checkpoint, WorkingSet::replay(&evicted_log).unwrap());

    // Reading an evicted conversation reads the store: no actor starts and
    // nothing is written to its log.
    let after = conversation.inspect().await.unwrap();
    assert!(!after.live);
    assert_eq!(after.state, StateName::Idle);
    assert!(
        !runtime.is_live(conversation.id()),
        "inspect woke the conversation"
    );
    assert_eq!(after.messages, before);
    assert_eq!(log(&runtime, &conversation).await, evicted_log);
    assert_eq!(
        conversation.log(1, usize::MAX).await.unwrap(),
        evicted_log,
        "the log reads the store"
    );
    assert!(!runtime.is_live(conversation.id()));
    let listed = runtime.list(false).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(log(&runtime, &conversation).await, evicted_log);

    // Revived from the checkpoint, it carries on as if never evicted.
    let mut subscription = watch(&conversation).await;
    assert!(runtime.is_live(conversation.id()), "subscribing wakes it");
    conversation
        .send("after revival", Vec::new())
        .await
        .unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    let live = conversation.inspect().await.unwrap().messages;
    assert_eq!(live.len(), before.len() + 2, "{live:?}");
    assert_eq!(
        live,
        *WorkingSet::replay(&log(&runtime, &conversation).await)
            .unwrap()
            .messages
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_evicts_idle_conversations_on_its_own() {
    let rig = Rig::new();
    let runtime = rig
        .open(RuntimeConfig {
            settings: Settings {
                short_idle: Duration::from_millis(20),
                long_idle: Duration::from_millis(100),
                idle_check: Duration::from_millis(10),
                ..Settings::default()
            },
            ..rig.runtime_config(rig.store(BackendKind::Memory))
        })
        .await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    eventually("the idle conversation was evicted", || {
        !runtime.is_live(conversation.id())
    })
    .await;
    let events = log(&runtime, &conversation).await;
    assert!(matches!(
        events.last().unwrap().kind,
        EventKind::SessionEnded
    ));
    runtime.shutdown().await;
}

async fn dropped_mid_stream(recovery: RecoveryPolicy) -> (Rig, Vec<Event>) {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "hang": true}]))
        .await;
    let config = ConversationConfig {
        recovery,
        ..config()
    };
    let id = {
        let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
        let id = streaming(&rig, &runtime, config, "are you there?").await;
        runtime.crash().await;
        id
    };
    let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
    let conversation = runtime.handle(id);
    let mut subscription = watch(&conversation).await;
    subscription.reach(StateName::Idle).await;
    let events = log(&runtime, &conversation).await;
    drop(subscription);
    drop(conversation);
    runtime.shutdown().await;
    (rig, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_reopened_mid_stream_reruns_the_request_under_resume() {
    let (rig, events) = dropped_mid_stream(RecoveryPolicy::Resume).await;
    assert_eq!(
        count(&events, |kind| matches!(kind, EventKind::Recovered { .. })),
        1
    );
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnCompleted { .. }
        )),
        1
    );
    let records = rig.mock.wait_ended(2).await;
    assert_eq!(records.len(), 2, "the request was sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_reopened_mid_stream_rests_idle_under_idle() {
    let (rig, events) = dropped_mid_stream(RecoveryPolicy::Idle).await;
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnInterrupted { .. }
        )),
        1
    );
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnCompleted { .. }
        )),
        0
    );
    assert_eq!(rig.mock.requests().await.len(), 1, "nothing was sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_reopened_mid_tool_redispatches_the_same_call_under_resume() {
    let rig = Rig::new();
    let id = {
        let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
        let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
        let mut subscription = watch(&conversation).await;
        conversation
            .send(
                "run: read -r pid _ < /proc/self/stat; echo $pid >> runs; if [ -f done ]; then echo second; else touch done; echo $pid > pgid; sleep 30; fi",
                Vec::new(),
            )
            .await
            .unwrap();
        subscription.reach(StateName::ExecutingTools).await;
        let first_pgid = wait_pgid(&rig).await;
        let id = conversation.id().clone();
        drop(subscription);
        drop(conversation);
        runtime.crash().await;
        // The crash killed the running tool's process group.
        wait_group_gone(first_pgid).await;
        id
    };
    let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
    let conversation = runtime.handle(id);
    let mut subscription = watch(&conversation).await;
    subscription.reach(StateName::Idle).await;
    let events = log(&runtime, &conversation).await;
    let call_ids: Vec<String> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::AssistantMessage { blocks, .. } => Some(blocks),
            _ => None,
        })
        .flatten()
        .filter_map(|block| match block {
            keel_actors::core::message::AssistantBlock::ToolUse { call } => {
                Some(call.id.to_string())
            }
            _ => None,
        })
        .collect();
    let results = tool_results(&events);
    assert_eq!(
        call_ids.len(),
        1,
        "the model was not asked again for the call"
    );
    assert_eq!(results.len(), 1);
    assert_eq!(
        results[0].0, call_ids[0],
        "re-dispatched with the same tool_call_id"
    );
    assert!(results[0].1.contains("second"), "{}", results[0].1);
    let runs = std::fs::read_to_string(rig.cwd().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 2, "the tool ran twice: {runs}");
    assert_paired(&conversation).await;
    drop(subscription);
    drop(conversation);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_unknown_conversation_is_not_found() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let id = keel_actors::core::ConversationId::new("c-nope").unwrap();
    let error = runtime.handle(id).send("hi", Vec::new()).await.unwrap_err();
    assert!(
        matches!(error, keel_actors::Error::NotFound(_)),
        "{error:?}"
    );
    let missing = runtime.create(rig.cwd().join("missing"), config()).await;
    assert!(matches!(
        missing,
        Err(keel_actors::Error::InvalidCwd { .. })
    ));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_retries_then_answers() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            {"endpoint": "anthropic", "status": 503, "retry_after": 0},
            {"endpoint": "anthropic", "text": "after a retry"}
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let config = ConversationConfig {
        retry: RetryPolicy {
            base_delay_ms: 10,
            ..RetryPolicy::default()
        },
        ..config()
    };
    let conversation = runtime.create(rig.cwd(), config).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("hello", Vec::new()).await.unwrap();
    subscription.reach(StateName::RetryWait).await;
    subscription.reach(StateName::Idle).await;
    let last = conversation.inspect().await.unwrap().messages;
    assert!(format!("{:?}", last.last().unwrap()).contains("after a retry"));
    runtime.shutdown().await;
}

/// A custom tool that panics.
struct Explode;

#[async_trait::async_trait]
impl keel_actors::tool::Tool for Explode {
    fn spec(&self) -> keel_actors::core::wire::ToolSpec {
        keel_actors::core::wire::ToolSpec {
            name: "explode".to_owned(),
            description: "Panics.".to_owned(),
            input_schema: json!({"type": "object"}),
        }
    }

    async fn run(
        &self,
        _context: keel_actors::tool::ToolContext,
    ) -> keel_actors::tool::ToolOutcome {
        panic!("boom in a custom tool")
    }
}

/// A custom tool that never finishes; it records when it starts running and
/// when its future is dropped.
struct Forever {
    started: Arc<std::sync::atomic::AtomicBool>,
    dropped: Arc<std::sync::atomic::AtomicBool>,
}

struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl keel_actors::tool::Tool for Forever {
    fn spec(&self) -> keel_actors::core::wire::ToolSpec {
        keel_actors::core::wire::ToolSpec {
            name: "forever".to_owned(),
            description: "Never finishes.".to_owned(),
            input_schema: json!({"type": "object"}),
        }
    }

    async fn run(
        &self,
        _context: keel_actors::tool::ToolContext,
    ) -> keel_actors::tool::ToolOutcome {
        let _guard = SetOnDrop(self.dropped.clone());
        self.started
            .store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        keel_actors::tool::ToolOutcome::ok("done")
    }
}

/// A tool whose first run never finishes and whose future lets go slowly
/// when dropped (as a killed process group takes a moment to die),
/// counting how many of its runs are alive at once.
struct SlowToDie {
    runs: Arc<std::sync::atomic::AtomicUsize>,
    alive: Arc<std::sync::atomic::AtomicUsize>,
    most_alive: Arc<std::sync::atomic::AtomicUsize>,
}

/// One run of [`SlowToDie`], alive until its drop has finished.
struct Dying(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Dying {
    fn drop(&mut self) {
        // Blocking on purpose: the worker's task is busy dying.
        std::thread::sleep(Duration::from_millis(300));
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl keel_actors::tool::Tool for SlowToDie {
    fn spec(&self) -> keel_actors::core::wire::ToolSpec {
        keel_actors::core::wire::ToolSpec {
            name: "slow_to_die".to_owned(),
            description: "Hangs the first time; dies slowly.".to_owned(),
            input_schema: json!({"type": "object"}),
        }
    }

    async fn run(
        &self,
        _context: keel_actors::tool::ToolContext,
    ) -> keel_actors::tool::ToolOutcome {
        use std::sync::atomic::Ordering::SeqCst;
        let alive = self.alive.fetch_add(1, SeqCst) + 1;
        self.most_alive.fetch_max(alive, SeqCst);
        let _dying = Dying(self.alive.clone());
        if self.runs.fetch_add(1, SeqCst) == 0 {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        keel_actors::tool::ToolOutcome::ok("ran")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_a_crashed_actor_reruns_a_call_only_once_its_old_copy_is_gone() {
    use std::sync::atomic::Ordering::SeqCst;
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "tool_calls": [{"name": "slow_to_die"}]}]))
        .await;
    let tool = SlowToDie {
        runs: Arc::default(),
        alive: Arc::default(),
        most_alive: Arc::default(),
    };
    let (runs, most_alive) = (tool.runs.clone(), tool.most_alive.clone());
    let mut tools = keel_actors::tool::ToolRegistry::with_defaults();
    tools.register(tool);
    let runtime = runtime_with_tools(&rig, tools).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("hang", Vec::new()).await.unwrap();
    subscription.reach(StateName::ExecutingTools).await;
    eventually("the first run started", || runs.load(SeqCst) == 1).await;

    // The supervisor restarts the actor, and `resume` re-dispatches the
    // call; the old run is still dying when that happens, unless the
    // rebuilt conversation waits for it.
    conversation.crash().await.unwrap();
    eventually("the call ran again", || runs.load(SeqCst) == 2).await;
    let mut subscription = watch(&conversation).await;
    subscription.reach(StateName::Idle).await;
    assert_eq!(
        most_alive.load(SeqCst),
        1,
        "two copies of one call ran at once"
    );
    assert_paired(&conversation).await;
    runtime.shutdown().await;
}

async fn runtime_with_tools(rig: &Rig, tools: keel_actors::tool::ToolRegistry) -> Runtime {
    rig.open(RuntimeConfig {
        tools,
        ..rig.runtime_config(rig.store(BackendKind::Memory))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_a_panicking_tool_becomes_an_error_result() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "tool_calls": [{"name": "explode"}]}]))
        .await;
    let mut tools = keel_actors::tool::ToolRegistry::with_defaults();
    tools.register(Explode);
    let runtime = runtime_with_tools(&rig, tools).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("blow up", Vec::new()).await.unwrap();
    subscription.reach(StateName::ExecutingTools).await;
    subscription.reach(StateName::Idle).await;

    let events = log(&runtime, &conversation).await;
    let result = events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::ToolResult {
                content, is_error, ..
            } => Some((content.clone(), *is_error)),
            _ => None,
        })
        .expect("the panicking call has a result");
    assert!(result.1, "it is an error result");
    assert!(result.0.contains("boom in a custom tool"), "{}", result.0);
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnCompleted { .. }
        )),
        1
    );
    assert_eq!(
        runtime.restarts().await.unwrap(),
        0,
        "the conversation never crashed"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_cancel_drops_a_running_custom_tool() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "tool_calls": [{"name": "forever"}]}]))
        .await;
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tools = keel_actors::tool::ToolRegistry::with_defaults();
    tools.register(Forever {
        started: started.clone(),
        dropped: dropped.clone(),
    });
    let runtime = runtime_with_tools(&rig, tools).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("wait forever", Vec::new()).await.unwrap();
    subscription.reach(StateName::ExecutingTools).await;
    eventually("the tool started", || {
        started.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst));

    assert_eq!(conversation.cancel().await.unwrap(), StateName::Idle);
    eventually("the tool's future was dropped", || {
        dropped.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    assert_paired(&conversation).await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_unknown_tool_is_an_error_result_not_a_stuck_turn() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "tool_calls": [{"name": "no_such_tool"}]}]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation
        .send("call something odd", Vec::new())
        .await
        .unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    let results = tool_results(&log(&runtime, &conversation).await);
    assert_eq!(results.len(), 1);
    assert!(results[0].1.contains("no tool named"), "{}", results[0].1);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_a_subscriber_that_never_reads_lags_and_never_slows_the_conversation() {
    let rig = Rig::new();
    let words: Vec<String> = (0..3000).map(|n| format!("w{n}")).collect();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": words.join(" ")}]))
        .await;
    // No live interval: every delta is a wave of its own, far more than
    // the channel holds. (With one, a fast model's deltas go out in a
    // few waves, docs/requirements.md "Live updates go out in waves".)
    let runtime = rig
        .open(RuntimeConfig {
            settings: Settings {
                live_interval: Duration::ZERO,
                ..Settings::default()
            },
            ..rig.runtime_config(rig.store(BackendKind::Memory))
        })
        .await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    // Subscribed, and never read until the turn is over.
    let mut sleeper = conversation.subscribe().await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("talk a lot", Vec::new()).await.unwrap();
    let mut deltas = 0;
    tokio::time::timeout(PATIENCE, async {
        loop {
            match subscription.next().await {
                Received::Update(Update::Live {
                    event: LiveEvent::Delta { .. },
                }) => deltas += 1,
                Received::Update(Update::Event { event })
                    if matches!(event.kind, EventKind::TurnCompleted { .. }) =>
                {
                    return
                }
                Received::Lagged { .. } => {}
                Received::CatchUpFailed { error } => panic!("{error}"),
                Received::Closed => panic!("closed"),
                Received::Update(_) => {}
            }
        }
    })
    .await
    .expect("the turn completed while a subscriber slept");
    assert!(deltas > 1024, "the reader kept up with {deltas} deltas");
    let first = sleeper.view.last_seq + 1;
    match sleeper.next().await {
        Received::Lagged { missed } => assert!(missed > 0),
        other => panic!("the sleeping subscriber should have lagged, got {other:?}"),
    }
    // The lagging subscriber lost deltas but no canonical event: it reads
    // them from the log, each once, in order.
    let events = log(&runtime, &conversation).await;
    let last = events.last().unwrap().seq;
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while seen.last() != Some(&last) {
            match sleeper.next().await {
                Received::Update(Update::Event { event }) => seen.push(event.seq),
                Received::Closed | Received::CatchUpFailed { .. } => panic!("the sleeper stopped"),
                Received::Update(Update::Live { .. }) | Received::Lagged { .. } => {}
            }
        }
    })
    .await
    .expect("the sleeper caught up");
    assert_eq!(seen, (first..=last).collect::<Vec<_>>());

    // A subscription that starts at an earlier seq gets the events from
    // there, then goes on live.
    let mut resumed = conversation.subscribe_from(2).await.unwrap();
    let mut replayed = Vec::new();
    while replayed.last() != Some(&last) {
        if let Received::Update(Update::Event { event }) = resumed.next().await {
            replayed.push(event.seq);
        }
    }
    assert_eq!(replayed, (2..=last).collect::<Vec<_>>());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_a_hibernating_conversation_wakes_for_its_approval() {
    let rig = Rig::new();
    let runtime = rig
        .open(RuntimeConfig {
            settings: Settings {
                short_idle: Duration::from_millis(30),
                long_idle: Duration::from_secs(3600),
                idle_check: Duration::from_millis(10),
                checkpoint_lag: 2,
                ..Settings::default()
            },
            ..rig.runtime_config(rig.store(BackendKind::Redb))
        })
        .await;
    let mut config = config();
    config.tools.insert("bash".to_owned(), ToolPolicy::Approve);
    let conversation = runtime.create(rig.cwd(), config).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation
        .send("run: touch woken", Vec::new())
        .await
        .unwrap();
    subscription.reach(StateName::AwaitingInput).await;
    let before = conversation.inspect().await.unwrap();
    drop(subscription);

    let hibernated = tokio::time::timeout(PATIENCE, async {
        loop {
            let inspection = conversation.inspect().await.unwrap();
            if inspection.hibernated {
                return inspection;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the conversation hibernated while waiting on a human");
    assert!(
        runtime.is_live(conversation.id()),
        "hibernating is not eviction"
    );
    assert_eq!(
        hibernated.messages, before.messages,
        "the history rebuilt from the log is the same"
    );
    assert_eq!(hibernated.pending, before.pending);
    // Hibernating saved a checkpoint, so waking replays no event.
    let checkpoint = runtime
        .store()
        .load_checkpoint(conversation.id())
        .await
        .unwrap()
        .expect("hibernating saved a checkpoint");
    assert_eq!(checkpoint.last_seq, before.last_seq);
    assert_eq!(*checkpoint.messages, before.messages);

    let mut subscription = watch(&conversation).await;
    let call = before.pending[0].call.id.clone();
    conversation.resolve(call, Decision::Approve).await.unwrap();
    subscription.reach(StateName::Idle).await;
    assert!(rig.cwd().join("woken").exists());
    assert_paired(&conversation).await;
    drop(subscription);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_with_short_idle_zero_holds_no_history_at_rest() {
    let rig = Rig::new();
    let runtime = rig
        .open(RuntimeConfig {
            settings: Settings {
                short_idle: Duration::ZERO,
                ..Settings::default()
            },
            ..rig.runtime_config(rig.store(BackendKind::Redb))
        })
        .await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    assert!(
        conversation.inspect().await.unwrap().hibernated,
        "created and at rest: nothing held"
    );
    let mut subscription = watch(&conversation).await;
    conversation
        .send("run: echo one", Vec::new())
        .await
        .unwrap();
    subscription
        .through(StateName::ExecutingTools, StateName::Idle)
        .await;
    let first = conversation.inspect().await.unwrap();
    assert!(first.hibernated, "back at rest, the working set was let go");

    conversation.send("and again", Vec::new()).await.unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    let second = conversation.inspect().await.unwrap();
    assert!(second.hibernated);
    assert_eq!(second.messages.len(), first.messages.len() + 2);
    assert_eq!(
        second.messages,
        *WorkingSet::replay(&log(&runtime, &conversation).await)
            .unwrap()
            .messages
    );
    assert_paired(&conversation).await;
    drop(subscription);
    runtime.shutdown().await;
}

/// A runtime host process, killed if a test ends without killing it.
struct Host(std::process::Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `keel-runtime-host` over `rig`'s data directory and returns it
/// with the id of the conversation it created once its message is
/// accepted.
fn start_host(
    rig: &Rig,
    recovery: &str,
    message: &str,
) -> (Host, keel_actors::core::ConversationId) {
    use std::io::BufRead;
    let mut host = std::process::Command::new(env!("CARGO_BIN_EXE_keel-runtime-host"))
        .arg(rig.data_dir())
        .arg(rig.mock.base_url())
        .arg(rig.cwd())
        .arg(recovery)
        .arg(message)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = host.stdout.take().unwrap();
    let host = Host(host);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let id = line
        .trim()
        .strip_prefix("conversation ")
        .unwrap_or_else(|| panic!("unexpected first line from the host: {line:?}"));
    (host, keel_actors::core::ConversationId::new(id).unwrap())
}

/// The process hosting the runtime dies by SIGKILL while a tool runs. The
/// tool's process group outlives it; the next runtime over the same data
/// kills that group before anything else, and recovers the conversation:
/// under `idle`, the call gets a synthetic result, and nothing runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_host_killed_mid_tool_leaves_no_process_behind() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let rig = Rig::new();
    let (mut host, id) = start_host(
        &rig,
        "idle",
        "run: read -r pid _ < /proc/self/stat; echo $pid >> runs; echo $pid > pgid; sleep 30 & sleep 30 & wait",
    );
    let pgid = wait_pgid(&rig).await;
    kill(Pid::from_raw(host.0.id() as i32), Signal::SIGKILL).unwrap();
    host.0.wait().unwrap();
    assert!(
        !group_is_gone(pgid),
        "the tool's process group outlived its host, as it would a daemon"
    );

    let (runtime, report) = Runtime::open(rig.runtime_config(rig.store(BackendKind::Redb)))
        .await
        .unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(
        report
            .reaped
            .iter()
            .any(|reaped| reaped.pgid as i32 == pgid && reaped.killed),
        "boot killed the surviving group: {:?}",
        report.reaped
    );
    wait_group_gone(pgid).await;
    assert_eq!(report.recovered, vec![id.clone()]);

    let conversation = runtime.handle(id);
    let mut subscription = watch(&conversation).await;
    subscription.reach(StateName::Idle).await;
    let events = log(&runtime, &conversation).await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].2, "the interrupted call got a synthetic result");
    assert_paired(&conversation).await;
    let runs = std::fs::read_to_string(rig.cwd().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 1, "nothing ran again: {runs}");
    drop(subscription);
    drop(conversation);
    runtime.shutdown().await;
}

/// The JSON of the history is kept from one request to the next
/// (`keel_core::wire::EncodedHistory`): after turns with tools, an approval
/// that edited its call and a compaction (both count as edits of the
/// history), the last request sends exactly the messages a fresh encoding
/// of the conversation's history makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_a_request_reusing_the_historys_json_sends_what_a_fresh_encoding_sends() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Redb)).await;
    let mut config = config();
    config.tools.insert("bash".to_owned(), ToolPolicy::Approve);
    let conversation = runtime.create(rig.cwd(), config.clone()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    let mut requests = 0;
    for (text, decision) in [
        (
            "run: echo one",
            Decision::Edit {
                input: json!({ "command": "echo edited" }),
            },
        ),
        ("run: echo two", Decision::Approve),
    ] {
        conversation.send(text, Vec::new()).await.unwrap();
        subscription.reach(StateName::AwaitingInput).await;
        let call = conversation.inspect().await.unwrap().pending[0]
            .call
            .id
            .clone();
        conversation.resolve(call, decision).await.unwrap();
        subscription.reach(StateName::Idle).await;
        requests += 2;
    }
    conversation.compact().await.unwrap();
    subscription
        .through(StateName::Compacting, StateName::Idle)
        .await;
    requests += 1;
    conversation.send("hello", Vec::new()).await.unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    requests += 1;

    let recorded = rig.mock.wait_ended(requests).await;
    let sent = &recorded.last().expect("a request")["body"]["messages"];
    let inspection = conversation.inspect().await.unwrap();
    assert!(
        inspection.last_compaction.is_some(),
        "the history was compacted"
    );
    // The request went out before the answer joined the history.
    let history = &inspection.messages[..inspection.messages.len() - 1];
    let tools = keel_actors::core::wire::ToolSpecs::default();
    let images = std::collections::BTreeMap::new();
    let fresh = keel_actors::core::wire::anthropic::encode_request(
        &keel_actors::core::wire::PromptRequest {
            model: &config.primary.model,
            system: config.system.as_deref(),
            messages: history,
            tools: &tools,
            max_tokens: config.max_tokens,
            images: &images,
        },
    )
    .unwrap();
    assert_eq!(sent, &fresh["messages"]);
    // The request after the edited call ran sent the call as it ran.
    let after_edit = recorded[1]["body"]["messages"].to_string();
    assert!(
        after_edit.contains(r#""input":{"command":"echo edited"}"#),
        "{after_edit}"
    );
    runtime.shutdown().await;
}
