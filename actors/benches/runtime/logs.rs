//! The logs the benchmarks start from, built event by event (checked
//! with the reducer) and written straight to the store. Their text comes
//! from keel-test-support's `text` (the `WORDS` vocabulary), seeded.

use std::path::Path;

use keel_actors::core::config::ProviderKind;
use keel_actors::core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_actors::core::{
    Conversation, ConversationConfig, ConversationId, Event, EventKind, StateName, Timestamp,
    ToolCallId, WorkingSet,
};
use keel_actors::store::EventLog;
use keel_test_support::text::{Rng, WORDS};

/// 2026-01-01T00:00:00Z, in milliseconds.
const T0: u64 = 1_767_225_600_000;

/// Append an event after the last one of `log`; returns its seq.
pub(crate) fn push(
    log: &mut Vec<Event>,
    parent: Option<u64>,
    triggers_turn: bool,
    kind: EventKind,
) -> u64 {
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

pub(crate) fn usage(input_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens: 150,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: input_tokens / 2,
    }
}

/// `Created` (default config: `recovery = resume`) and `SessionStarted`,
/// as `keel_core::create` writes them.
pub(crate) fn opening(conversation: &ConversationId, cwd: &Path) -> Vec<Event> {
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
            forked_from: None,
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
pub(crate) fn history(
    conversation: &ConversationId,
    cwd: &Path,
    min_events: usize,
    seed: u64,
) -> Vec<Event> {
    let mut rng = Rng::new(0x5eed_0000 + seed);
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
                text: rng.text(WORDS, 100, 500),
                images: Vec::new(),
            },
        );
        let started = push(&mut log, Some(user), false, EventKind::TurnStarted { turn });
        for _ in 0..rng.range(0, 2) {
            let mut blocks = vec![AssistantBlock::Text {
                text: rng.text(WORDS, 100, 500),
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
                        content: rng.text(WORDS, 100, 500),
                        is_error: false,
                        synthetic: false,
                        images: Vec::new(),
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
                    text: rng.text(WORDS, 100, 500),
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
pub(crate) async fn seed(store: &dyn EventLog, log: &[Event]) {
    let EventKind::Created { conversation, .. } = &log[0].kind else {
        panic!("a log starts with Created");
    };
    for chunk in log.chunks(100) {
        store.append(conversation, chunk.to_vec()).await.unwrap();
    }
}
