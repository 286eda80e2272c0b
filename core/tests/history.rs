//! What a user does to a conversation's history, through the state machine:
//! compaction on demand (docs/compaction.md), rewind and fork
//! (docs/history.md). Each run's log replays to the live state.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use keel_core::history::{self, HistoryError};
use keel_core::message::{AssistantBlock, ContentBlock, ToolCall};
use keel_core::*;
use serde_json::json;

use common::*;

fn roomy() -> ConversationConfig {
    ConversationConfig::default()
}

fn answer(harness: &mut Harness, text: &str) {
    harness.respond(vec![AssistantBlock::Text {
        text: text.to_owned(),
    }]);
}

fn state(harness: &Harness) -> StateName {
    harness.conv.as_ref().unwrap().state_name()
}

fn rejection(step: &Step) -> Option<Rejection> {
    step.rejection.clone()
}

/// Seqs of the log's `TurnCompleted` events.
fn turn_ends(harness: &Harness) -> Vec<Seq> {
    harness
        .log
        .iter()
        .filter(|event| matches!(event.kind, EventKind::TurnCompleted { .. }))
        .map(|event| event.seq)
        .collect()
}

fn prompt_text(working: &WorkingSet) -> String {
    working
        .messages
        .iter()
        .flat_map(|message| &message.content)
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn compact_on_demand_summarises_all_but_the_latest_turn_and_rests() {
    let mut harness = Harness::new(roomy());
    for n in 1..=3 {
        harness.tool_turn(n);
    }
    let messages = harness.working().messages.len();
    let step = harness.step(Input::Compact);
    assert_eq!(rejection(&step), None);
    assert_eq!(state(&harness), StateName::Compacting);
    // Everything before the latest turn's four messages.
    assert_eq!(harness.summarising, Some((messages - 4) as u32));
    assert!(
        step.appended().is_empty(),
        "nothing recorded before the summary"
    );
    assert!(harness.summarise_if_asked());
    assert_eq!(state(&harness), StateName::Idle);
    let compactions = harness.compactions();
    assert!(matches!(
        compactions[..],
        [EventKind::Compacted {
            summary: Some(_),
            ..
        }]
    ));
    assert_eq!(harness.working().messages.len(), 4);
    assert_eq!(harness.completed_turns(), 3, "no turn ran for it");
    harness.assert_sound();
    // The next message is an ordinary turn on the compacted prompt.
    harness.send("and now?");
    assert!(harness.summarising.is_none());
    answer(&mut harness, "still here");
    assert_eq!(harness.completed_turns(), 4);
    harness.assert_sound();
}

#[test]
fn compact_on_demand_that_gets_no_summary_changes_nothing() {
    let mut harness = Harness::new(roomy());
    for n in 1..=2 {
        harness.tool_turn(n);
    }
    let before = harness.working().clone();
    let log_before = harness.log.len();
    harness.step(Input::Compact);
    harness.summarising = None;
    let step = harness.step(Input::StreamFailed {
        generation: harness.generation(),
        failure: LlmFailure {
            retryable: false,
            retry_after_ms: None,
            message: "invalid request".to_owned(),
            prompt_too_long: false,
        },
        jitter: 0,
    });
    assert!(step.effects.iter().any(|effect| matches!(
        effect,
        Effect::Publish {
            event: LiveEvent::CompactionFailed { .. }
        }
    )));
    assert_eq!(state(&harness), StateName::Idle);
    assert_eq!(harness.log.len(), log_before);
    assert_eq!(harness.working(), &before);
}

#[test]
fn compact_on_demand_is_refused_with_nothing_before_the_latest_turn_or_mid_turn() {
    let mut harness = Harness::new(roomy());
    let step = harness.step(Input::Compact);
    assert_eq!(rejection(&step), Some(Rejection::NothingToCompact));
    harness.tool_turn(1);
    let step = harness.step(Input::Compact);
    assert_eq!(rejection(&step), Some(Rejection::NothingToCompact));
    harness.tool_turn(2);
    harness.send("a third");
    let step = harness.step(Input::Compact);
    assert_eq!(
        rejection(&step),
        Some(Rejection::Busy {
            state: StateName::Streaming
        })
    );
}

#[test]
fn a_cancel_stops_a_compaction_on_demand_and_records_nothing() {
    let mut harness = Harness::new(roomy());
    for n in 1..=2 {
        harness.tool_turn(n);
    }
    let log_before = harness.log.len();
    harness.step(Input::Compact);
    let generation = harness.generation();
    let step = harness.step(Input::Cancel);
    assert!(step.effects.contains(&Effect::AbortStream { generation }));
    assert_eq!(state(&harness), StateName::Idle);
    assert_eq!(harness.log.len(), log_before);
    // A late answer of the aborted request changes nothing.
    let late = harness.step(Input::StreamFinished {
        generation,
        response: AssistantResponse {
            blocks: vec![AssistantBlock::Text {
                text: "late summary".to_owned(),
            }],
            stop_reason: message::StopReason::EndTurn,
            usage: message::Usage::default(),
            provider: ProviderKind::Mock,
            model: "mock".to_owned(),
        },
    });
    assert!(late.appended().is_empty());
    assert!(harness.compactions().is_empty());
}

#[test]
fn a_message_during_a_compaction_on_demand_gets_its_turn_after_it() {
    let mut harness = Harness::new(ConversationConfig {
        busy_policy: config::BusyPolicy::Queue,
        ..roomy()
    });
    for n in 1..=2 {
        harness.tool_turn(n);
    }
    harness.step(Input::Compact);
    harness.send("while you compact");
    assert_eq!(state(&harness), StateName::Compacting);
    assert!(harness.summarise_if_asked());
    // The compaction is recorded, then the message's turn starts.
    assert_eq!(harness.compactions().len(), 1);
    assert_eq!(state(&harness), StateName::Streaming);
    answer(&mut harness, "here I am");
    assert_eq!(harness.completed_turns(), 3);
    assert!(prompt_text(harness.working()).contains("while you compact"));
    harness.assert_sound();
}

#[test]
fn a_crash_during_a_compaction_on_demand_drops_it() {
    let mut harness = Harness::new(roomy());
    for n in 1..=2 {
        harness.tool_turn(n);
    }
    harness.step(Input::Compact);
    let rebuilt = Conversation::replay(&harness.log).unwrap();
    assert_eq!(rebuilt.state_name(), StateName::Idle);
    harness.conv = Some(rebuilt);
    harness.summarising = None;
    let step = harness.step(Input::Started);
    assert!(
        !step
            .effects
            .iter()
            .any(|effect| matches!(effect, Effect::StartStream { .. })),
        "nothing is redone: {:?}",
        step.effects
    );
    assert!(harness.compactions().is_empty());
}

fn rewind(harness: &mut Harness, to_seq: Seq) -> Step {
    let at = history::working_at(&harness.log, to_seq).map(Box::new);
    harness.step(Input::Rewind { to_seq, at })
}

#[test]
fn rewind_then_a_new_message_answers_without_the_rewound_turns() {
    let mut harness = Harness::new(roomy());
    harness.send("remember the word apple");
    answer(&mut harness, "apple noted");
    let boundary = turn_ends(&harness)[0];
    let at_boundary = history::working_at(&harness.log, boundary).unwrap();
    harness.send("remember the word banana");
    answer(&mut harness, "banana noted");
    harness.tool_turn(3);

    let step = rewind(&mut harness, boundary);
    assert_eq!(rejection(&step), None);
    assert!(matches!(
        step.appended(),
        [Event {
            kind: EventKind::Rewound { to_seq, .. },
            ..
        }] if *to_seq == boundary
    ));
    assert_eq!(harness.working().messages, at_boundary.messages);
    assert_eq!(harness.working().message_seqs, at_boundary.message_seqs);
    harness.assert_sound();

    harness.send("which words do you know?");
    let prompt = prompt_text(harness.working());
    assert!(prompt.contains("apple"), "{prompt}");
    assert!(!prompt.contains("banana"), "{prompt}");
    answer(&mut harness, "apple");
    harness.assert_sound();
    // The log keeps the rewound turns for audit.
    assert!(harness.log.iter().any(|event| matches!(
        &event.kind,
        EventKind::UserMessage { text, .. } if text.contains("banana")
    )));
}

#[test]
fn rewind_inside_a_turn_is_refused_naming_the_nearest_boundaries() {
    let mut harness = Harness::new(roomy());
    harness.tool_turn(1);
    harness.tool_turn(2);
    let ends = turn_ends(&harness);
    let inside = ends[0] + 2;
    let log_before = harness.log.len();
    let step = rewind(&mut harness, inside);
    let Some(Rejection::History {
        error: HistoryError::NotABoundary { seq, before, after },
    }) = rejection(&step)
    else {
        panic!("not refused: {:?}", step.rejection);
    };
    assert_eq!(seq, inside);
    assert_eq!(before, Some(ends[0]));
    assert_eq!(after, Some(ends[1]));
    let message = Rejection::History {
        error: HistoryError::NotABoundary { seq, before, after },
    }
    .to_string();
    assert!(
        message.contains(&ends[0].to_string()) && message.contains(&ends[1].to_string()),
        "{message}"
    );
    assert_eq!(harness.log.len(), log_before);

    let beyond = rewind(&mut harness, 10_000);
    assert!(matches!(
        rejection(&beyond),
        Some(Rejection::History {
            error: HistoryError::OutOfRange { .. }
        })
    ));
}

#[test]
fn rewind_is_refused_while_a_turn_runs() {
    let mut harness = Harness::new(roomy());
    harness.tool_turn(1);
    let boundary = turn_ends(&harness)[0];
    harness.send("go on");
    let step = rewind(&mut harness, boundary);
    assert_eq!(
        rejection(&step),
        Some(Rejection::Busy {
            state: StateName::Streaming
        })
    );
}

#[test]
fn rewind_while_awaiting_approval_closes_the_pending_call() {
    let mut harness = Harness::new(ConversationConfig {
        tools: [("bash".to_owned(), ToolPolicy::Approve)]
            .into_iter()
            .collect(),
        ..roomy()
    });
    harness.send("hello");
    answer(&mut harness, "hi");
    let boundary = turn_ends(&harness)[0];
    harness.send("delete everything");
    harness.respond(vec![AssistantBlock::ToolUse {
        call: ToolCall {
            id: ToolCallId::new("call-rm"),
            name: "bash".to_owned(),
            input: json!({"command": "rm -rf /tmp/x"}),
        },
    }]);
    assert_eq!(state(&harness), StateName::AwaitingInput);
    let step = rewind(&mut harness, boundary);
    assert_eq!(rejection(&step), None);
    let kinds: Vec<&EventKind> = step.appended().iter().map(|event| &event.kind).collect();
    assert!(matches!(
        kinds[..],
        [
            EventKind::ToolResult {
                synthetic: true,
                ..
            },
            EventKind::TurnInterrupted {
                reason: InterruptReason::Rewound,
                ..
            },
            EventKind::Rewound { .. }
        ]
    ));
    assert_eq!(state(&harness), StateName::Idle);
    assert!(harness.working().pending.is_empty());
    // Deciding the closed call now is refused.
    let late = harness.step(Input::Resolve {
        tool_call_id: ToolCallId::new("call-rm"),
        decision: Decision::Approve,
        by: None,
    });
    assert!(late.rejection.is_some());
    harness.assert_sound();
}

#[test]
fn fork_copies_the_history_up_to_a_boundary_and_leaves_the_source() {
    let mut harness = Harness::new(roomy());
    harness.send("remember the word apple");
    answer(&mut harness, "apple noted");
    let boundary = turn_ends(&harness)[0];
    harness.send("remember the word banana");
    answer(&mut harness, "banana noted");
    let source = harness.log.clone();

    let id = ConversationId::new("fork-1").unwrap();
    let log = history::fork_log(&source, boundary, id.clone()).unwrap();
    assert_eq!(harness.log, source, "the source is untouched");
    assert_eq!(log.len() as Seq, boundary);
    let EventKind::Created {
        conversation,
        forked_from,
        ..
    } = &log[0].kind
    else {
        panic!("no Created: {:?}", log[0]);
    };
    assert_eq!(conversation, &id);
    let origin = forked_from.clone().unwrap();
    assert_eq!(origin.seq, boundary);
    assert_eq!(origin.conversation, harness.working().id);
    assert_eq!(log[1..], source[1..boundary as usize]);

    let fork = WorkingSet::replay(&log).unwrap();
    let at = history::working_at(&source, boundary).unwrap();
    assert_eq!(fork.messages, at.messages);
    assert_eq!(fork.id, id);
    assert_eq!(fork.status(), Status::Idle);

    let inside = history::fork_log(&source, boundary + 2, id);
    assert!(matches!(
        inside,
        Err(HistoryError::NotABoundary {
            before: Some(_),
            after: Some(_),
            ..
        })
    ));
}
