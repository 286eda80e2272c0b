//! What the store's benches share: a deterministic generator of
//! English-looking text and a realistic conversation log made with it
//! (user messages, turns whose assistant messages carry text and tool
//! calls, tool results; texts of 100-500 bytes).

use keel_core::config::ProviderKind;
use keel_core::message::{AssistantBlock, StopReason, ToolCall, Usage};
use keel_core::{ConversationConfig, ConversationId, Event, EventKind, ToolCallId};

/// 2026-01-01T00:00:00Z, in milliseconds.
pub const T0: u64 = 1_767_225_600_000;

const WORDS: &[&str] = &[
    "the",
    "conversation",
    "log",
    "is",
    "appended",
    "before",
    "anything",
    "else",
    "tool",
    "result",
    "assistant",
    "replays",
    "working",
    "set",
    "request",
    "model",
    "file",
    "src/main.rs",
    "function",
    "returns",
    "error",
    "because",
    "cargo",
    "build",
    "test",
    "passes",
    "and",
    "then",
    "we",
    "check",
    "whether",
    "output",
    "matches",
    "expected",
    "value",
    "of",
    "a",
    "struct",
    "field",
    "with",
    "serde",
    "JSON",
    "line",
    "42",
];

/// A small deterministic generator (xorshift64*): the same data every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// English-looking ASCII text of `lo..=hi` bytes.
    pub fn text(&mut self, lo: usize, hi: usize) -> String {
        let len = self.range(lo, hi);
        let mut text = String::with_capacity(len + 16);
        while text.len() < len {
            if !text.is_empty() {
                text.push(if self.next().is_multiple_of(11) {
                    '\n'
                } else {
                    ' '
                });
            }
            text.push_str(WORDS[self.range(0, WORDS.len() - 1)]);
        }
        text.truncate(len);
        text
    }
}

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
        },
    )
}

/// A realistic log of `len` events: user messages, turns whose assistant
/// messages carry text and tool calls, tool results; texts of 100-500 bytes.
pub fn realistic_log(conversation: &ConversationId, len: usize) -> Vec<Event> {
    let mut rng = Rng(0x5eed_cafe);
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
                text: rng.text(100, 500),
                images: Vec::new(),
            },
        );
        turn += 1;
        let started = push(&mut log, Some(user), false, EventKind::TurnStarted { turn });
        let rounds = rng.range(0, 3);
        for _ in 0..rounds {
            let calls = rng.range(1, 2);
            let mut blocks = vec![AssistantBlock::Text {
                text: rng.text(100, 500),
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
                        content: rng.text(100, 500),
                        is_error: false,
                        synthetic: false,
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
                    text: rng.text(100, 500),
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
