//! The map's frames for each path a run takes, rendered as the client
//! gets them and compared to the files in `fixtures/` (`KEEL_BLESS=1`
//! rewrites them). Each scenario is a run's updates, in order, as a
//! follower hands them out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use keel_actors::core::event::{
    Decision, Event, EventKind, InterruptReason, PendingCall, PendingKind,
};
use keel_actors::core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_actors::core::{Generation, LiveEvent, ProviderKind, StreamDelta, Timestamp, ToolCallId};
use keel_actors::Update;
use serde_json::json;

use super::*;

/// A run's updates and what the test does with them.
struct Script {
    /// The run's first seq.
    from: u64,
    seq: u64,
    updates: Vec<Update>,
    events: Vec<Event>,
}

impl Script {
    fn new(from: u64) -> Script {
        Script {
            from,
            seq: from - 1,
            updates: Vec::new(),
            events: Vec::new(),
        }
    }

    fn event(&mut self, kind: EventKind) -> &mut Script {
        self.seq += 1;
        let event = Event {
            seq: self.seq,
            at: Timestamp::from_millis(1_700_000_000_000),
            parent: Some(1),
            triggers_turn: matches!(kind, EventKind::UserMessage { .. }),
            kind,
        };
        self.events.push(event.clone());
        self.updates.push(Update::Event {
            event: Arc::new(event),
        });
        self
    }

    fn live(&mut self, event: LiveEvent) -> &mut Script {
        self.updates.push(Update::Live { event });
        self
    }

    fn delta(&mut self, turn: u32, attempt: u32, delta: StreamDelta) -> &mut Script {
        self.live(LiveEvent::Delta {
            generation: Generation { turn, attempt },
            delta,
        })
    }

    fn text(&mut self, turn: u32, attempt: u32, text: &str) -> &mut Script {
        self.delta(
            turn,
            attempt,
            StreamDelta::Text {
                text: text.to_owned(),
            },
        )
    }

    fn assistant(&mut self, blocks: Vec<AssistantBlock>) -> &mut Script {
        self.event(EventKind::AssistantMessage {
            blocks,
            stop_reason: StopReason::EndTurn,
            usage: Usage::default(),
            provider: ProviderKind::Mock,
            model: "mock".to_owned(),
        })
    }

    /// The frames of a run over these updates, as the client reads them,
    /// with the thread's messages (those of this script) before the end.
    fn render(&self, map: RunMap) -> String {
        let mut map = map;
        let mut frames = vec![map.started()];
        for update in &self.updates {
            frames.extend(map.update(update));
        }
        assert!(map.ending().is_some(), "the run ends");
        frames.push(Frame {
            id: None,
            event: super::super::wire::Event::MessagesSnapshot {
                messages: messages(&self.events),
            },
        });
        frames.extend(map.finished());
        let bytes = super::super::render(&frames);
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn map(&self) -> RunMap {
        RunMap::new("thread-1".to_owned(), "run-1".to_owned(), self.from)
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

fn tool_use(id: &str, name: &str, input: serde_json::Value) -> AssistantBlock {
    AssistantBlock::ToolUse {
        call: call(id, name, input),
    }
}

fn user(text: &str) -> EventKind {
    EventKind::UserMessage {
        text: text.to_owned(),
        images: Vec::new(),
    }
}

fn result(id: &str, content: &str) -> EventKind {
    EventKind::ToolResult {
        tool_call_id: ToolCallId::new(id),
        content: content.to_owned(),
        is_error: false,
        synthetic: false,
        images: Vec::new(),
    }
}

fn completed() -> EventKind {
    EventKind::TurnCompleted {
        turn: 1,
        duration_ms: 5,
        note: None,
    }
}

/// Compare `actual` to `fixtures/NAME.sse`, or write it with `KEEL_BLESS=1`.
fn expect(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/api/agui/fixtures")
        .join(format!("{name}.sse"));
    if std::env::var_os("KEEL_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("{}: {error}; write it with KEEL_BLESS=1", path.display()));
    assert!(
        expected == actual,
        "{name}: the frames differ from {} (rewrite it with KEEL_BLESS=1 if the change is meant):\n{actual}",
        path.display()
    );
}

#[test]
fn a_streamed_answer_is_one_text_message_settled_by_the_log() {
    let mut script = Script::new(2);
    script
        .event(user("hello"))
        .event(EventKind::TurnStarted { turn: 1 })
        .text(1, 1, "Hel")
        .text(1, 1, "lo")
        .assistant(vec![text("Hello there")])
        .event(completed());
    expect(
        "text_streamed",
        &script.render(script.map().awaiting_turn()),
    );
}

/// A stream that joins late (a reattach) or lost the live deltas gets
/// each message whole from the log.
#[test]
fn an_answer_with_no_live_deltas_is_sent_whole() {
    let mut script = Script::new(4);
    script
        .assistant(vec![text("Hello there")])
        .event(completed());
    expect("text_from_log", &script.render(script.map()));
}

#[test]
fn a_keel_tool_call_streams_its_input_and_gets_its_result() {
    let mut script = Script::new(2);
    script
        .event(user("run: ls"))
        .event(EventKind::TurnStarted { turn: 1 })
        .delta(
            1,
            1,
            StreamDelta::ToolUseStarted {
                id: ToolCallId::new("call-1"),
                name: "bash".to_owned(),
            },
        )
        .delta(
            1,
            1,
            StreamDelta::ToolInput {
                id: ToolCallId::new("call-1"),
                partial_json: "{\"command\":".to_owned(),
            },
        )
        .delta(
            1,
            1,
            StreamDelta::ToolInput {
                id: ToolCallId::new("call-1"),
                partial_json: "\"ls\"}".to_owned(),
            },
        )
        .assistant(vec![tool_use("call-1", "bash", json!({"command": "ls"}))])
        .live(LiveEvent::ToolOutput {
            tool_call_id: ToolCallId::new("call-1"),
            chunk: "a.txt\n".to_owned(),
        })
        .event(result("call-1", "a.txt\n"))
        .text(1, 2, "The command printed a.txt")
        .assistant(vec![text("The command printed a.txt")])
        .event(completed());
    expect("keel_tool", &script.render(script.map().awaiting_turn()));
}

#[test]
fn a_frontend_tool_call_ends_the_run_naming_it_and_its_result_is_not_repeated() {
    let mut first = Script::new(2);
    first
        .event(user("pick a color"))
        .event(EventKind::TurnStarted { turn: 1 })
        .assistant(vec![
            text("Let me ask."),
            tool_use("call-7", "pick_color", json!({"options": ["teal", "red"]})),
        ])
        .event(EventKind::Suspended {
            pending: vec![PendingCall {
                call: call("call-7", "pick_color", json!({"options": ["teal", "red"]})),
                kind: PendingKind::ClientExec,
                prompt: None,
            }],
        });
    expect(
        "frontend_tool_call",
        &first.render(first.map().awaiting_turn()),
    );

    // The next run answers it: its result is the client's own tool
    // message, so the run does not send it back.
    let mut second = Script::new(first.seq + 1);
    second
        .event(EventKind::Resolved {
            tool_call_id: ToolCallId::new("call-7"),
            decision: Decision::Answer {
                text: "teal".to_owned(),
            },
            by: Some("ag-ui".to_owned()),
        })
        .event(result("call-7", "teal"))
        .text(1, 2, "Teal it is.")
        .assistant(vec![text("Teal it is.")])
        .event(completed());
    let map = second.map().answered_by_client(["call-7".to_owned()]);
    expect("frontend_tool_answered", &second.render(map));
}

#[test]
fn an_approval_ends_the_run_with_an_interrupt() {
    let mut script = Script::new(2);
    script
        .event(user("run: rm -rf build"))
        .event(EventKind::TurnStarted { turn: 1 })
        .assistant(vec![tool_use(
            "call-2",
            "bash",
            json!({"command": "rm -rf build"}),
        )])
        .event(EventKind::Suspended {
            pending: vec![PendingCall {
                call: call("call-2", "bash", json!({"command": "rm -rf build"})),
                kind: PendingKind::Approval,
                prompt: None,
            }],
        });
    expect(
        "approval_interrupt",
        &script.render(script.map().awaiting_turn()),
    );
}

#[test]
fn a_question_ends_the_run_with_an_interrupt_carrying_it() {
    let mut script = Script::new(2);
    script
        .event(user("plan my trip"))
        .event(EventKind::TurnStarted { turn: 1 })
        .assistant(vec![tool_use(
            "call-3",
            "ask_user",
            json!({"question": "Where to?"}),
        )])
        .event(EventKind::Suspended {
            pending: vec![PendingCall {
                call: call("call-3", "ask_user", json!({"question": "Where to?"})),
                kind: PendingKind::Elicitation,
                prompt: Some("Where to?".to_owned()),
            }],
        });
    expect(
        "question_interrupt",
        &script.render(script.map().awaiting_turn()),
    );
}

#[test]
fn thinking_streams_as_reasoning_before_the_text() {
    let mut script = Script::new(2);
    script
        .event(user("think first"))
        .event(EventKind::TurnStarted { turn: 1 })
        .delta(
            1,
            1,
            StreamDelta::Thinking {
                text: "Let me see".to_owned(),
            },
        )
        .text(1, 1, "Done.")
        .assistant(vec![
            AssistantBlock::Thinking {
                text: "Let me see.".to_owned(),
                signature: Some("sig".to_owned()),
            },
            text("Done."),
        ])
        .event(completed());
    expect("reasoning", &script.render(script.map().awaiting_turn()));
}

/// A failed attempt's deltas cannot be taken back: its message is closed
/// as it stands, the retry streams as another, and the thread's messages
/// at the end hold only the log's.
#[test]
fn a_discarded_attempt_is_closed_and_the_retry_streams_anew() {
    let mut script = Script::new(2);
    script
        .event(user("hello"))
        .event(EventKind::TurnStarted { turn: 1 })
        .text(1, 1, "Hel")
        .live(LiveEvent::AttemptDiscarded {
            generation: Generation {
                turn: 1,
                attempt: 1,
            },
        })
        .text(1, 2, "Hello")
        .assistant(vec![text("Hello")])
        .event(completed());
    expect(
        "attempt_discarded",
        &script.render(script.map().awaiting_turn()),
    );
}

#[test]
fn a_failed_turn_is_a_run_error() {
    let mut script = Script::new(2);
    script
        .event(user("hello"))
        .event(EventKind::TurnStarted { turn: 1 })
        .text(1, 1, "Hel")
        .event(EventKind::TurnFailed {
            turn: 1,
            error: "the provider refused the key (401)".to_owned(),
        });
    expect("turn_failed", &script.render(script.map().awaiting_turn()));
}

#[test]
fn a_cancelled_turn_ends_the_run_cancelled() {
    let mut script = Script::new(2);
    script
        .event(user("hello"))
        .event(EventKind::TurnStarted { turn: 1 })
        .event(EventKind::TurnInterrupted {
            turn: 1,
            reason: InterruptReason::Cancelled,
            partial_text: None,
        });
    expect("cancelled", &script.render(script.map().awaiting_turn()));
}

/// Under `busy_policy = queue` the run's message waits for the turn
/// before it: that turn's end is not the run's.
#[test]
fn a_queued_message_s_run_ends_with_its_own_turn() {
    let mut script = Script::new(5);
    script
        .event(user("second"))
        .assistant(vec![text("first answer")])
        .event(completed())
        .event(EventKind::TurnStarted { turn: 2 })
        .assistant(vec![text("second answer")])
        .event(EventKind::TurnCompleted {
            turn: 2,
            duration_ms: 5,
            note: None,
        });
    expect("queued", &script.render(script.map().awaiting_turn()));
}

#[test]
fn keel_ids_say_how_far_the_client_has_seen_the_log() {
    assert_eq!(seen_through("keel-12"), Some(12));
    assert_eq!(seen_through("keel-12-t3.1"), Some(12));
    assert_eq!(seen_through("keel-12-t3.1+"), Some(12));
    assert_eq!(seen_through("keel-12-reasoning"), Some(12));
    assert_eq!(seen_through("msg-12"), None);
    assert_eq!(seen_through("keel-"), None);
}

#[test]
fn a_rewind_takes_the_later_messages_out_of_the_thread() {
    let mut script = Script::new(2);
    script
        .event(user("one"))
        .assistant(vec![text("answer one")])
        .event(user("two"))
        .assistant(vec![text("answer two")])
        .event(EventKind::Rewound {
            to_seq: 3,
            messages: Vec::new(),
            message_seqs: Vec::new(),
        });
    let ids: Vec<String> = messages(&script.events)
        .iter()
        .map(|message| {
            serde_json::to_value(message).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids, ["keel-2", "keel-3"]);
}

/// A run whose input brings nothing new ends where the thread stands: a
/// call still waiting is its interrupt again, and a stream that cannot go
/// on is a run error, with whatever it had open closed first.
#[test]
fn a_run_with_nothing_new_rests_where_the_thread_stands() {
    let script = Script::new(9);
    let mut map = script.map();
    let mut frames = vec![map.started()];
    frames.extend(map.rest(&[PendingCall {
        call: call("call-2", "bash", json!({"command": "make"})),
        kind: PendingKind::Approval,
        prompt: None,
    }]));
    frames.extend(map.finished());
    let rested = String::from_utf8(super::super::render(&frames).to_vec()).unwrap();
    expect("rest_pending", &rested);

    let mut map = script.map();
    let mut frames = vec![map.started()];
    frames.extend(map.update(&Update::Live {
        event: LiveEvent::Delta {
            generation: Generation {
                turn: 3,
                attempt: 1,
            },
            delta: StreamDelta::Text {
                text: "partial".to_owned(),
            },
        },
    }));
    frames.extend(map.fail("catch_up_failed", "could not read missed events"));
    frames.extend(map.finished());
    let failed = String::from_utf8(super::super::render(&frames).to_vec()).unwrap();
    expect("stream_failed", &failed);
}
