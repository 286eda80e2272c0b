//! The runtime keeps its promises, end to end against the real
//! `keel mock-llm`: a graceful stop lets turns finish or interrupts them
//! past their grace and sends nothing twice after a reopen; messages owed a
//! turn are found at boot; stop reasons (max_tokens, pause_turn, refusal)
//! end or continue a turn visibly; a cancelled retry leaves no timer
//! behind; the working directory is made absolute, canonical and checked;
//! every event but the first carries its causal parent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use keel_actors::core::config::RecoveryPolicy;
use keel_actors::core::event::{EventKind, InterruptReason, TurnNote};
use keel_actors::core::message::StopReason;
use keel_actors::core::{
    create, transition, BusyPolicy, ConversationConfig, Event, Input, NewConversation, StateName,
};
use keel_actors::store::BackendKind;
use keel_actors::{Runtime, RuntimeConfig, Settings};
use serde_json::json;

use crate::runtime::{config, count, log, streaming, tool_results, watch, with_policy, Rig};

/// A runtime on redb whose graceful stop waits `grace` for turns in flight.
async fn runtime_with_grace(rig: &Rig, grace: Duration) -> Runtime {
    rig.open(RuntimeConfig {
        settings: Settings {
            shutdown_grace: grace,
            ..Settings::default()
        },
        ..rig.runtime_config(rig.store(BackendKind::Redb))
    })
    .await
}

fn last_kind(events: &[Event]) -> &EventKind {
    &events.last().unwrap().kind
}

/// Reopen the data dir after a graceful stop: boot recovers nothing, and
/// no request reaches the provider again.
async fn reopen_sends_nothing(rig: &Rig, requests_before: usize) -> Runtime {
    let (runtime, report) = Runtime::open(rig.runtime_config(rig.store(BackendKind::Redb)))
        .await
        .unwrap();
    assert!(
        report.recovered.is_empty(),
        "after a graceful stop boot recovered {:?}",
        report.recovered
    );
    assert_eq!(rig.mock.requests().await.len(), requests_before);
    runtime
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_lets_a_turn_finish_ends_the_session_and_sends_nothing_twice() {
    let rig = Rig::new();
    // Ten words, 40 ms apart: the turn is still streaming when the stop begins.
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "text": "one two three four five six seven eight nine ten", "drip_ms": 40}]))
        .await;
    let runtime = runtime_with_grace(&rig, Duration::from_secs(20)).await;
    let id = streaming(&rig, &runtime, config(), "talk slowly").await;
    runtime.shutdown().await;

    let runtime = reopen_sends_nothing(&rig, 1).await;
    let conversation = runtime.handle(id);
    let events = conversation.log(1, usize::MAX).await.unwrap();
    assert_eq!(last_kind(&events), &EventKind::SessionEnded);
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnCompleted { .. }
        )),
        1,
        "the turn finished within the grace: {events:#?}"
    );
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnInterrupted { .. }
        )),
        0
    );
    let inspection = conversation.inspect().await.unwrap();
    assert!(!inspection.live, "reading it woke nothing");
    assert_eq!(inspection.state, StateName::Idle);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_interrupts_a_turn_past_its_grace_and_sends_nothing_twice() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "hang": true}]))
        .await;
    let runtime = runtime_with_grace(&rig, Duration::from_millis(200)).await;
    let id = streaming(&rig, &runtime, config(), "are you there?").await;
    runtime.shutdown().await;
    let ended = rig.mock.wait_ended(1).await;
    assert_eq!(ended[0]["outcome"], "disconnected", "the stream was closed");

    let runtime = reopen_sends_nothing(&rig, 1).await;
    let events = runtime.handle(id).log(1, usize::MAX).await.unwrap();
    assert_eq!(last_kind(&events), &EventKind::SessionEnded);
    assert!(
        events.iter().any(|event| matches!(
            event.kind,
            EventKind::TurnInterrupted {
                reason: InterruptReason::Shutdown,
                ..
            }
        )),
        "{events:#?}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_graceful_stop_left_owed_get_their_turn_at_the_next_open() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "hang": true}]))
        .await;
    let runtime = runtime_with_grace(&rig, Duration::from_millis(200)).await;
    let conversation = runtime
        .create(rig.cwd(), with_policy(BusyPolicy::Queue))
        .await
        .unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("first", Vec::new()).await.unwrap();
    subscription.reach(StateName::Streaming).await;
    conversation.send("queued", Vec::new()).await.unwrap();
    let id = conversation.id().clone();
    drop(subscription);
    drop(conversation);
    runtime.shutdown().await;

    let (runtime, report) = Runtime::open(rig.runtime_config(rig.store(BackendKind::Redb)))
        .await
        .unwrap();
    assert_eq!(
        report.recovered,
        vec![id.clone()],
        "boot found the owed message"
    );
    let conversation = runtime.handle(id);
    let mut subscription = watch(&conversation).await;
    subscription.reach(StateName::Idle).await;
    let events = log(&runtime, &conversation).await;
    assert!(
        events
            .iter()
            .any(|event| matches!(event.kind, EventKind::TurnCompleted { turn: 2, .. })),
        "{events:#?}"
    );
    assert_eq!(rig.mock.wait_ended(2).await.len(), 2);
    drop(subscription);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_starts_the_turn_owed_to_a_message_acknowledged_during_its_debounce() {
    let rig = Rig::new();
    let store = rig.store(BackendKind::Redb);
    // The log a crash leaves when it strikes inside the 100 ms debounce:
    // the message is durable, no turn has started.
    let created = create(
        NewConversation {
            id: "c-owed".parse().unwrap(),
            cwd: rig.cwd().display().to_string(),
            config: ConversationConfig {
                busy_policy: BusyPolicy::Interrupt,
                ..config()
            },
            parent_conversation: None,
        },
        keel_actors::core::Timestamp::from_millis(1),
    );
    let id = "c-owed".parse().unwrap();
    store
        .append(&id, created.appended().to_vec())
        .await
        .unwrap();
    let message = transition(
        created.state,
        Input::UserMessage {
            text: "hello?".to_owned(),
            images: Vec::new(),
        },
        keel_actors::core::Timestamp::from_millis(2),
    );
    store
        .append(&id, message.appended().to_vec())
        .await
        .unwrap();
    drop(store);

    let (runtime, report) = Runtime::open(rig.runtime_config(rig.store(BackendKind::Redb)))
        .await
        .unwrap();
    assert_eq!(report.recovered, vec![id.clone()]);
    let conversation = runtime.handle(id);
    let mut subscription = watch(&conversation).await;
    subscription.reach(StateName::Idle).await;
    let events = log(&runtime, &conversation).await;
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::TurnCompleted { .. }
        )),
        1,
        "{events:#?}"
    );
    drop(subscription);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cut_off_at_max_tokens_runs_no_tool_and_ends_with_a_note() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{
            "endpoint": "anthropic",
            "text": "Let me write that file.",
            "tool_calls": [{"name": "bash", "input": {"command": "touch cut-off"}}],
            "stop_reason": "max_tokens"
        }]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("write it", Vec::new()).await.unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    let events = log(&runtime, &conversation).await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 1, "{events:#?}");
    assert!(results[0].1.contains("max_tokens"), "{}", results[0].1);
    assert!(results[0].2, "a synthetic result");
    assert!(matches!(
        last_kind(&events),
        EventKind::TurnCompleted {
            note: Some(TurnNote::MaxTokens { .. }),
            ..
        }
    ));
    assert!(
        !rig.cwd().join("cut-off").exists(),
        "the cut call never ran"
    );
    assert_eq!(
        rig.mock.wait_ended(1).await.len(),
        1,
        "no retry of a cut-off answer"
    );
    check_parents(&events);
    drop(subscription);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_turn_continues_the_turn_and_a_refusal_is_recorded() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([
            {"endpoint": "anthropic", "text": "Searching…", "stop_reason": "pause_turn"},
            {"endpoint": "anthropic", "text": "Found it."},
            {"endpoint": "anthropic", "text": "I can't help with that.", "stop_reason": "refusal"}
        ]))
        .await;
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("search", Vec::new()).await.unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    let events = log(&runtime, &conversation).await;
    assert_eq!(
        count(&events, |kind| matches!(
            kind,
            EventKind::AssistantMessage { .. }
        )),
        2,
        "two responses in one turn"
    );
    assert!(matches!(
        last_kind(&events),
        EventKind::TurnCompleted {
            turn: 1,
            note: None,
            ..
        }
    ));

    conversation
        .send("now something bad", Vec::new())
        .await
        .unwrap();
    subscription
        .through(StateName::Streaming, StateName::Idle)
        .await;
    let events = log(&runtime, &conversation).await;
    assert!(events.iter().any(|event| matches!(
        event.kind,
        EventKind::AssistantMessage {
            stop_reason: StopReason::Refusal,
            ..
        }
    )));
    assert!(matches!(
        last_kind(&events),
        EventKind::TurnCompleted {
            note: Some(TurnNote::Refusal),
            ..
        }
    ));
    check_parents(&events);
    drop(subscription);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_retry_leaves_no_timer_behind() {
    let rig = Rig::new();
    rig.mock
        .push_script(json!([{"endpoint": "anthropic", "status": 503, "retry_after": 30}]))
        .await;
    // With short_idle zero a conversation lets go of its working set as
    // soon as it is at rest, which needs no timer pending.
    let runtime = rig
        .open(RuntimeConfig {
            settings: Settings {
                short_idle: Duration::ZERO,
                ..Settings::default()
            },
            ..rig.runtime_config(rig.store(BackendKind::Memory))
        })
        .await;
    let conversation = runtime.create(rig.cwd(), config()).await.unwrap();
    let mut subscription = watch(&conversation).await;
    conversation.send("hi", Vec::new()).await.unwrap();
    subscription.reach(StateName::RetryWait).await;
    assert_eq!(conversation.cancel().await.unwrap(), StateName::Idle);
    let inspection = conversation.inspect().await.unwrap();
    assert!(
        inspection.hibernated,
        "at rest after the cancel: the retry timer is gone"
    );
    drop(subscription);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_working_directory_is_made_absolute_canonical_and_checked() {
    let rig = Rig::new();
    let runtime = rig.runtime(rig.store(BackendKind::Memory)).await;
    let conversation = runtime
        .create(
            ".",
            ConversationConfig {
                recovery: RecoveryPolicy::Resume,
                ..config()
            },
        )
        .await
        .unwrap();
    let cwd = conversation.inspect().await.unwrap().cwd;
    assert_eq!(
        std::path::Path::new(&cwd),
        std::env::current_dir().unwrap(),
        "made absolute"
    );

    // `..` and symbolic links do not stay in it: it is where the tools
    // run, whatever the link points at later.
    let real = rig.cwd().join("real");
    std::fs::create_dir_all(real.join("sub")).unwrap();
    std::os::unix::fs::symlink(&real, rig.cwd().join("link")).unwrap();
    let winding = rig.cwd().join("link").join("sub").join("..");
    let conversation = runtime.create(&winding, config()).await.unwrap();
    let cwd = conversation.inspect().await.unwrap().cwd;
    assert_eq!(
        std::path::Path::new(&cwd),
        std::fs::canonicalize(&real).unwrap(),
        "made canonical"
    );

    let missing = rig.cwd().join("nowhere");
    let file = rig.cwd().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let not_utf8 = {
        use std::os::unix::ffi::OsStrExt;
        let path = rig.cwd().join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
        std::fs::create_dir(&path).unwrap();
        path
    };
    for (path, reason) in [
        (missing, "does not exist"),
        (file, "not a directory"),
        (not_utf8, "not valid UTF-8"),
    ] {
        let error = runtime.create(&path, config()).await.err().unwrap();
        assert!(
            matches!(&error, keel_actors::Error::InvalidCwd { reason: why, .. } if why.contains(reason)),
            "{}: {error}",
            path.display()
        );
    }
    assert_eq!(
        runtime.list(true).await.unwrap().len(),
        2,
        "nothing else was created"
    );
    runtime.shutdown().await;
}

/// Every event but the first links to an earlier one: a turn's events to
/// its `TurnStarted`, a `TurnStarted` to its message, others to their
/// session.
fn check_parents(events: &[Event]) {
    assert_eq!(events[0].parent, None);
    for event in &events[1..] {
        let parent = event
            .parent
            .unwrap_or_else(|| panic!("no parent: {event:?}"));
        assert!(parent < event.seq, "{event:?}");
        let cause = &events[parent as usize - 1].kind;
        let fits = match &event.kind {
            EventKind::SessionStarted => parent == event.seq - 1,
            EventKind::TurnStarted { .. } => matches!(cause, EventKind::UserMessage { .. }),
            _ => matches!(
                cause,
                EventKind::TurnStarted { .. } | EventKind::SessionStarted
            ),
        };
        assert!(fits, "{:?} links to {cause:?}", event.kind);
    }
}
