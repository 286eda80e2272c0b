//! What the store's benches share: a realistic conversation log made with
//! keel-test-support's seeded text generator
//! (user messages, turns whose assistant messages carry text and tool
//! calls, tool results; texts of 100-500 bytes).

use keel_core::config::ProviderKind;
use keel_core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_core::{ConversationConfig, ConversationId, Event, EventKind, ToolCallId};
use keel_test_support::text::{Rng, WORDS};

/// 2026-01-01T00:00:00Z, in milliseconds.
pub const T0: u64 = 1_767_225_600_000;

pub fn event(seq: u64, parent: Option<u64>, triggers_turn: bool, kind: EventKind) -> Event {
    Event {
        seq,
        at: keel_core::Timestamp(T0 + seq * 250),
        parent,
        triggers_turn,
        kind,
    }
}

pub fn created(conversation: &ConversationId) -> Event {
    event(
        1,
        None,
        false,
        EventKind::Created {
            conversation: conversation.clone(),
            cwd: "/home/user/project".to_owned(),
            config: ConversationConfig::default(),
            parent_conversation: None,
            user_initiated: true,
            forked_from: None,
        },
    )
}

/// A realistic log of `len` events: user messages, turns whose assistant
/// messages carry text and tool calls, tool results; texts of 100-500 bytes.
pub fn realistic_log(conversation: &ConversationId, len: usize) -> Vec<Event> {
    let mut rng = Rng::new(0x5eed_cafe);
    let mut log = vec![created(conversation)];
    let mut turn = 0u32;
    let mut call = 0u64;
    let push = |log: &mut Vec<Event>, parent: Option<u64>, triggers: bool, kind: EventKind| {
        let seq = log.len() as u64 + 1;
        log.push(event(seq, parent, triggers, kind));
        seq
    };
    while log.len() < len {
        let user = push(
            &mut log,
            None,
            true,
            EventKind::UserMessage {
                text: rng.text(WORDS, 100, 500),
                images: Vec::new(),
            },
        );
        turn += 1;
        let started = push(&mut log, Some(user), false, EventKind::TurnStarted { turn });
        let rounds = rng.range(0, 3);
        for _ in 0..rounds {
            let calls = rng.range(1, 2);
            let mut blocks = vec![AssistantBlock::Text {
                text: rng.text(WORDS, 100, 500),
            }];
            let mut ids = Vec::new();
            for _ in 0..calls {
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
                    usage: Usage {
                        input_tokens: 1_000 + call * 50,
                        output_tokens: 120,
                        cache_creation_input_tokens: 0,
                        cache_read_input_tokens: 900,
                    },
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
                usage: Usage {
                    input_tokens: 2_000,
                    output_tokens: 200,
                    cache_creation_input_tokens: 0,
                    cache_read_input_tokens: 1_800,
                },
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
    log.truncate(len);
    log
}
