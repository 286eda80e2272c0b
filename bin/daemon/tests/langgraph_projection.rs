//! The LangGraph projection (`api/langgraph/project.rs`) as a pure
//! function: logs made here, their frames rendered and compared to the
//! expected files in `tests/langgraph/` (rewritten with `KEEL_BLESS=1`
//! after a deliberate change; read the diff), and the runs read off logs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use serde_json::json;

use keel_actors::core::config::ProviderKind;
use keel_actors::core::event::{
    Decision, Event, EventKind, InterruptReason, PendingCall, PendingKind,
};
use keel_actors::core::live::{LiveEvent, StreamDelta};
use keel_actors::core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_actors::core::state::Generation;
use keel_actors::core::time::Timestamp;
use keel_actors::core::{Seq, ToolCallId};
use keel_daemon::api::langgraph::project::{runs, Frame, Modes, Projection, RunStatus};

/// A log built one event at a time, seqs from 2 (1 would be `Created`,
/// which the projection does not look at).
struct Log {
    events: Vec<Event>,
}

impl Log {
    fn new() -> Log {
        Log { events: Vec::new() }
    }

    fn push(&mut self, kind: EventKind) -> Event {
        let seq = self.events.len() as Seq + 2;
        let triggers_turn = matches!(kind, EventKind::UserMessage { .. });
        let event = Event {
            seq,
            at: Timestamp(1_800_000_000_000 + seq * 1000),
            parent: Some(seq - 1),
            triggers_turn,
            kind,
        };
        self.events.push(event.clone());
        event
    }
}

fn message(text: &str) -> EventKind {
    EventKind::UserMessage {
        text: text.to_owned(),
        images: Vec::new(),
    }
}

fn answer(blocks: Vec<AssistantBlock>) -> EventKind {
    EventKind::AssistantMessage {
        blocks,
        stop_reason: StopReason::EndTurn,
        usage: Usage::default(),
        provider: ProviderKind::Mock,
        model: "mock".to_owned(),
    }
}

fn text(text: &str) -> AssistantBlock {
    AssistantBlock::Text {
        text: text.to_owned(),
    }
}

fn call(id: &str, name: &str, input: serde_json::Value) -> ToolCall {
    ToolCall {
        id: ToolCallId::new(id),
        name: name.to_owned(),
        input,
    }
}

fn result(id: &str, content: &str, is_error: bool) -> EventKind {
    EventKind::ToolResult {
        tool_call_id: ToolCallId::new(id),
        content: content.to_owned(),
        is_error,
        synthetic: false,
        images: Vec::new(),
    }
}

fn delta(chunk: &str) -> LiveEvent {
    LiveEvent::Delta {
        generation: Generation {
            turn: 1,
            attempt: 1,
        },
        delta: StreamDelta::Text {
            text: chunk.to_owned(),
        },
    }
}

fn all_modes() -> Modes {
    Modes {
        values: true,
        updates: true,
        messages_tuple: true,
        messages: true,
    }
}

/// Frames as the expected files hold them: `event`, `id`, pretty JSON.
fn rendered(frames: &[Frame]) -> String {
    frames
        .iter()
        .map(|frame| {
            format!(
                "event: {}\nid: {}\n{}\n",
                frame.event,
                frame.id.as_deref().unwrap_or("-"),
                serde_json::to_string_pretty(&frame.data).unwrap()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn check_expected(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/langgraph")
        .join(format!("{name}.txt"));
    if std::env::var_os("KEEL_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error} (write it with KEEL_BLESS=1)", path.display()));
    assert!(
        expected == actual,
        "{name}: the frames differ from {} (KEEL_BLESS=1 rewrites it):\n{actual}",
        path.display()
    );
}

/// A streamed answer in every mode: its tokens, then the answer.
#[test]
fn a_streamed_answer_in_every_mode() {
    let mut log = Log::new();
    let mut projection = Projection::new("c-thread");
    let mut frames = Vec::new();
    let event = log.push(message("hi"));
    projection.frames(&event, all_modes(), &mut frames);
    let event = log.push(EventKind::TurnStarted { turn: 1 });
    projection.frames(&event, all_modes(), &mut frames);
    for chunk in ["Hel", "lo"] {
        projection.live(&delta(chunk), all_modes(), &mut frames);
    }
    let event = log.push(answer(vec![text("Hello")]));
    projection.frames(&event, all_modes(), &mut frames);
    check_expected("streamed_answer", &rendered(&frames));
}

/// Tool calls, an approval interrupt resumed with an edit, a question.
#[test]
fn tools_and_interrupts() {
    let mut log = Log::new();
    let modes = Modes {
        values: false,
        updates: true,
        messages_tuple: true,
        messages: false,
    };
    let mut projection = Projection::new("c-thread");
    let mut frames = Vec::new();
    let bash = call("t1", "bash", json!({"command": "ls"}));
    let deploy = call("t2", "deploy", json!({"target": "prod"}));
    for kind in [
        message("deploy it"),
        EventKind::TurnStarted { turn: 1 },
        answer(vec![AssistantBlock::ToolUse { call: bash }]),
        result("t1", "Cargo.toml\n", false),
        answer(vec![
            text("Deploying."),
            AssistantBlock::ToolUse {
                call: deploy.clone(),
            },
        ]),
        EventKind::Suspended {
            pending: vec![PendingCall {
                call: deploy,
                kind: PendingKind::Approval,
                prompt: None,
            }],
        },
        EventKind::Resolved {
            tool_call_id: ToolCallId::new("t2"),
            decision: Decision::Edit {
                input: json!({"target": "staging"}),
            },
            by: Some("langgraph".to_owned()),
        },
        result("t2", "deployed to staging", false),
        answer(vec![AssistantBlock::ToolUse {
            call: call("q1", "ask_user", json!({"question": "which color?"})),
        }]),
        EventKind::Suspended {
            pending: vec![PendingCall {
                call: call("q1", "ask_user", json!({"question": "which color?"})),
                kind: PendingKind::Elicitation,
                prompt: Some("which color?".to_owned()),
            }],
        },
    ] {
        let event = log.push(kind);
        projection.frames(&event, modes, &mut frames);
    }
    check_expected("tools_and_interrupts", &rendered(&frames));
    assert_eq!(
        projection.values()["__interrupt__"][0]["value"]["action_requests"][0]["description"],
        "which color?"
    );
}

/// A stream resumed from `SEQ:BYTES` mid-answer: no token one by one,
/// the rest of the text in one chunk when the answer is recorded, so the
/// client's chunks join to the answer once.
#[test]
fn a_stream_resumed_mid_answer_sends_the_rest_once() {
    let mut log = Log::new();
    let modes = Modes {
        messages_tuple: true,
        ..Modes::default()
    };
    let mut first = Projection::new("c-thread");
    let mut before = Vec::new();
    for kind in [message("hi"), EventKind::TurnStarted { turn: 1 }] {
        let event = log.push(kind);
        first.frames(&event, modes, &mut before);
    }
    first.live(&delta("Hello, "), modes, &mut before);
    let cut_at = before.last().and_then(|frame| frame.id.clone()).unwrap();
    assert_eq!(cut_at, "3:7", "the last event's seq and the bytes sent");

    let mut resumed = Projection::new("c-thread");
    for event in &log.events {
        resumed.absorb(event);
    }
    resumed.resume_mid_answer(7);
    let mut after = Vec::new();
    resumed.live(&delta("Hello, "), modes, &mut after);
    resumed.live(&delta("world"), modes, &mut after);
    assert!(
        after.is_empty(),
        "tokens are held back after a resume: {after:?}"
    );
    let event = log.push(answer(vec![text("Hello, world")]));
    resumed.frames(&event, modes, &mut after);
    let joined: String = before
        .iter()
        .chain(&after)
        .map(|frame| frame.data[0]["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(joined, "Hello, world");
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].id.as_deref(), Some("4"));
}

#[test]
fn runs_are_read_off_the_log() {
    let mut log = Log::new();
    let first = log.push(message("one")).seq;
    log.push(EventKind::TurnStarted { turn: 1 });
    // Queued behind the running turn.
    let queued = log.push(message("two")).seq;
    log.push(EventKind::TurnCompleted {
        turn: 1,
        duration_ms: 1,
        note: None,
    });
    log.push(EventKind::TurnStarted { turn: 2 });
    log.push(answer(vec![AssistantBlock::ToolUse {
        call: call("d1", "deploy", json!({})),
    }]));
    log.push(EventKind::Suspended {
        pending: vec![PendingCall {
            call: call("d1", "deploy", json!({})),
            kind: PendingKind::Approval,
            prompt: None,
        }],
    });
    let statuses = |log: &Log| -> Vec<(Seq, RunStatus)> {
        runs(&log.events)
            .iter()
            .map(|run| (run.seq, run.status))
            .collect()
    };
    assert_eq!(
        statuses(&log),
        vec![(first, RunStatus::Success), (queued, RunStatus::Success)],
        "a run that stops for a decision has ended"
    );
    let resumed = log
        .push(EventKind::Resolved {
            tool_call_id: ToolCallId::new("d1"),
            decision: Decision::Approve,
            by: None,
        })
        .seq;
    assert_eq!(statuses(&log)[2], (resumed, RunStatus::Running));
    log.push(EventKind::TurnInterrupted {
        turn: 2,
        reason: InterruptReason::Cancelled,
        partial_text: None,
    });
    let failed = log.push(message("three")).seq;
    log.push(EventKind::TurnStarted { turn: 3 });
    log.push(EventKind::TurnFailed {
        turn: 3,
        error: "the provider is down".to_owned(),
    });
    let unanswered = log.push(message("four")).seq;
    log.push(EventKind::Unanswered {
        messages: vec![unanswered],
        reason: InterruptReason::Cancelled,
    });
    assert_eq!(
        statuses(&log),
        vec![
            (first, RunStatus::Success),
            (queued, RunStatus::Success),
            (resumed, RunStatus::Interrupted),
            (failed, RunStatus::Error),
            (unanswered, RunStatus::Interrupted),
        ]
    );
}
