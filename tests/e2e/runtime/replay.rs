//! Replay equals live, as a client sees it. A property over random mixes
//! of messages, tool calls that wait for an approval, approvals, cancels,
//! provider errors (retries), actor crashes and whole-runtime crashes
//! (reopened on the same store), against the real `keel mock-llm`:
//!
//! - the canonical events a subscriber received live, across every crash
//!   (it subscribes again from the next seq it is owed, as a client
//!   reconnecting with `Last-Event-ID` does), ids included, are exactly
//!   the log re-read from the store: nothing missed, nothing twice, the
//!   same events in the same order;
//! - subscribing from any seq gives exactly the rest of the log.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_actors::core::config::ToolPolicy;
use keel_actors::core::event::Decision;
use keel_actors::core::{Event, Seq, StateName};
use keel_actors::store::{BackendKind, EventLog};
use keel_actors::{ConversationHandle, Received, Update};
use proptest::prelude::*;
use serde_json::json;

use super::{config, Rig, PATIENCE};

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A text turn.
    Say,
    /// A `bash` call, which waits for an approval.
    Tool,
    /// Approve every call that waits.
    Approve,
    Cancel,
    /// The next request to the provider fails with a 500 (a retry).
    Fault,
    /// Crash the conversation's actor; its supervisor restarts it.
    CrashActor,
    /// Crash the whole runtime and open a new one on the same store.
    CrashRuntime,
    /// Let things run a little.
    Pause,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Say),
        2 => Just(Op::Tool),
        2 => Just(Op::Approve),
        1 => Just(Op::Cancel),
        1 => Just(Op::Fault),
        1 => Just(Op::CrashActor),
        1 => Just(Op::CrashRuntime),
        2 => Just(Op::Pause),
    ]
}

/// Every canonical event one subscriber received, over every
/// subscription it made.
type Heard = Arc<Mutex<Vec<Event>>>;

/// Follow `conversation` from `from` until its runtime is gone, subscribing
/// again (from the next seq owed) whenever the actor stops.
async fn follow(conversation: ConversationHandle, from: Seq, received: Heard) {
    let mut next = from;
    loop {
        let Ok(mut subscription) = conversation.subscribe_from(next).await else {
            // The runtime crashed or stopped: this life's follower is done.
            return;
        };
        loop {
            match subscription.next().await {
                Received::Update(Update::Event { event }) => {
                    next = event.seq + 1;
                    received
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((*event).clone());
                }
                Received::Update(_) | Received::Lagged { .. } => {}
                Received::CatchUpFailed { .. } | Received::Closed => break,
            }
        }
    }
}

fn received_len(received: &Heard) -> usize {
    received
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .len()
}

async fn run_case(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rig = Rig::new();
    let store: Arc<dyn EventLog> = rig.store(BackendKind::Memory);
    let conversation_config = keel_actors::core::ConversationConfig {
        tools: [("bash".to_owned(), ToolPolicy::Approve)].into(),
        retry: keel_actors::core::retry::RetryPolicy {
            base_delay_ms: 5,
            max_delay_ms: 10,
            ..keel_actors::core::retry::RetryPolicy::default()
        },
        ..config()
    };
    let mut runtime = rig.runtime(store.clone()).await;
    let id = runtime
        .create(rig.cwd(), conversation_config)
        .await
        .expect("created")
        .id()
        .clone();
    let received: Heard = Arc::new(Mutex::new(Vec::new()));
    let mut follower = tokio::spawn(follow(runtime.handle(id.clone()), 1, received.clone()));

    for op in ops {
        let conversation = runtime.handle(id.clone());
        match op {
            // Refusals (busy, settled) are fine: the property is about
            // what the log and the subscriber make of whatever happened.
            Op::Say => drop(conversation.send("hello", Vec::new()).await),
            Op::Tool => drop(conversation.send("run: true", Vec::new()).await),
            Op::Approve => {
                if let Ok(inspection) = conversation.inspect().await {
                    for pending in inspection.pending {
                        drop(
                            conversation
                                .resolve(pending.call.id, Decision::Approve)
                                .await,
                        );
                    }
                }
            }
            Op::Cancel => drop(conversation.cancel().await),
            Op::Fault => {
                rig.mock
                    .push_script(json!([{"endpoint": "anthropic", "status": 500}]))
                    .await;
            }
            Op::CrashActor => drop(conversation.crash().await),
            Op::CrashRuntime => {
                drop(conversation);
                runtime.crash().await;
                // The old life's follower sees its subscription close and
                // the runtime gone.
                let _ = tokio::time::timeout(PATIENCE, &mut follower).await;
                runtime = rig.runtime(store.clone()).await;
                let from = store.last_seq(&id).await.expect("last seq") + 1;
                let owed = received
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .last()
                    .map_or(1, |event| event.seq + 1);
                // Resume from what this client is owed, not from the log's
                // end: events it never received must still come.
                prop_assert!(owed <= from);
                follower = tokio::spawn(follow(runtime.handle(id.clone()), owed, received.clone()));
            }
            Op::Pause => tokio::time::sleep(Duration::from_millis(15)).await,
        }
    }

    // Settle: approve whatever waits until the conversation is at rest.
    let conversation = runtime.handle(id.clone());
    let settled = tokio::time::timeout(PATIENCE, async {
        loop {
            let inspection = conversation.inspect().await.expect("inspect");
            let at_rest = matches!(inspection.state, StateName::Idle | StateName::Error);
            if inspection.pending.is_empty() && at_rest {
                break;
            }
            for pending in inspection.pending {
                drop(
                    conversation
                        .resolve(pending.call.id, Decision::Approve)
                        .await,
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    prop_assert!(settled.is_ok(), "the conversation did not come to rest");
    // Everything in the log by now must reach the subscriber. A restarted
    // actor may still append (its `SessionStarted`) meanwhile, so what it
    // heard is compared with a later read as a prefix of it.
    let log = store.read_all(&id).await.expect("the log");
    let caught_up = tokio::time::timeout(PATIENCE, async {
        while received_len(&received) < log.len() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    prop_assert!(
        caught_up.is_ok(),
        "the subscriber never caught up with the log"
    );
    let live = received
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let log = store.read_all(&id).await.expect("the log");
    prop_assert!(
        live.len() <= log.len(),
        "heard {} events of a log of {}",
        live.len(),
        log.len()
    );
    for (heard, stored) in live.iter().zip(&log) {
        prop_assert_eq!(heard, stored);
    }

    // From any seq, exactly the rest (as far as the log went when read).
    let last = log.len() as Seq;
    for from in [1, last / 2 + 1, last, last + 1] {
        let mut subscription = conversation.subscribe_from(from).await.expect("subscribe");
        let expected = &log[usize::try_from(from - 1).unwrap_or(0).min(log.len())..];
        let mut rest = Vec::new();
        while rest.len() < expected.len() {
            match tokio::time::timeout(PATIENCE, subscription.next()).await {
                Ok(Received::Update(Update::Event { event })) => rest.push((*event).clone()),
                Ok(Received::Update(_)) => {}
                other => prop_assert!(false, "resuming from {} got {:?}", from, other),
            }
        }
        prop_assert_eq!(rest.as_slice(), expected, "resuming from {}", from);
    }

    drop(conversation);
    follower.abort();
    runtime.shutdown().await;
    Ok(())
}

proptest! {
    // Each case runs a runtime against a real fake provider: 32 random
    // mixes of up to 19 steps take seconds.
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn replay_equals_live_as_a_client_sees_it(ops in proptest::collection::vec(op(), 1..20)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(run_case(ops))?;
    }
}
