//! Record version 2: the same fields as version 1, in MessagePack instead of
//! JSON, with the event kind and assistant blocks tagged externally
//! (`{"user_message": {...}}`) instead of internally (`{"type":
//! "user_message", ...}`).
//!
//! Why: rebuilding a conversation is dominated by decoding its log, and
//! serde decodes an internally tagged enum by first buffering the whole
//! object to find its tag. An externally tagged enum is decoded in one pass,
//! and MessagePack strings are length-prefixed bytes rather than escaped
//! text. Together about 4x faster than version 1 (docs/benchmarks.md).
//!
//! The mirror types here exist only for the encoding; the domain types keep
//! their JSON shape (the HTTP API and version-1 logs use it). Fields keep
//! their names (MessagePack maps), so a field added later is read with its
//! default, as in version 1; the exhaustive conversions below make adding an
//! event kind a compile error until it is mapped here.

use serde::{Deserialize, Serialize};

use crate::config::{ConversationConfig, ProviderKind};
use crate::event::{
    Decision, Event, EventKind, ForkOrigin, InterruptReason, NudgeReason, PendingCall,
    RecoveryAction, SubAgentOutcome, TurnNote,
};
use crate::ids::{ConversationId, Seq, ToolCallId};
use crate::message::{AssistantBlock, ImageRef, Message, StopReason, ToolCall, Usage};
use crate::time::Timestamp;

#[derive(Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) v: u32,
    pub(super) event: EventV2,
}

#[derive(Serialize, Deserialize)]
pub(super) struct EventV2 {
    seq: Seq,
    at: Timestamp,
    #[serde(default)]
    parent: Option<Seq>,
    #[serde(default)]
    triggers_turn: bool,
    kind: Kind,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Created {
        conversation: ConversationId,
        cwd: String,
        config: ConversationConfig,
        #[serde(default)]
        parent_conversation: Option<ConversationId>,
        user_initiated: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forked_from: Option<ForkOrigin>,
    },
    SessionStarted,
    SessionEnded,
    UserMessage {
        text: String,
        #[serde(default)]
        images: Vec<ImageRef>,
    },
    TurnStarted {
        turn: u32,
    },
    AssistantMessage {
        blocks: Vec<Block>,
        stop_reason: StopReason,
        usage: Usage,
        provider: ProviderKind,
        model: String,
    },
    ToolResult {
        tool_call_id: ToolCallId,
        content: String,
        is_error: bool,
        synthetic: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageRef>,
    },
    Suspended {
        pending: Vec<PendingCall>,
    },
    Resolved {
        tool_call_id: ToolCallId,
        decision: Decision,
        #[serde(default)]
        by: Option<String>,
    },
    TurnCompleted {
        turn: u32,
        duration_ms: u64,
        #[serde(default)]
        note: Option<TurnNote>,
    },
    TurnInterrupted {
        turn: u32,
        reason: InterruptReason,
        #[serde(default)]
        partial_text: Option<String>,
    },
    TurnFailed {
        turn: u32,
        error: String,
    },
    ConfigChanged {
        config: ConversationConfig,
    },
    Recovered {
        action: RecoveryAction,
    },
    Nudge {
        reason: NudgeReason,
        text: String,
    },
    DebounceCancelled,
    Finished {
        outcome: SubAgentOutcome,
    },
    Unanswered {
        messages: Vec<Seq>,
        reason: InterruptReason,
    },
    Compacted {
        through_seq: Seq,
        replaced_messages: u32,
        #[serde(default)]
        summary: Option<String>,
        tokens_before: u64,
        tokens_after: u64,
    },
    Rewound {
        to_seq: Seq,
        messages: Vec<Message>,
        message_seqs: Vec<Seq>,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    Thinking {
        text: String,
        #[serde(default)]
        signature: Option<String>,
    },
    ToolUse {
        call: ToolCall,
    },
}

impl From<Event> for EventV2 {
    fn from(event: Event) -> EventV2 {
        EventV2 {
            seq: event.seq,
            at: event.at,
            parent: event.parent,
            triggers_turn: event.triggers_turn,
            kind: event.kind.into(),
        }
    }
}

impl From<EventV2> for Event {
    fn from(event: EventV2) -> Event {
        Event {
            seq: event.seq,
            at: event.at,
            parent: event.parent,
            triggers_turn: event.triggers_turn,
            kind: event.kind.into(),
        }
    }
}

impl From<AssistantBlock> for Block {
    fn from(block: AssistantBlock) -> Block {
        match block {
            AssistantBlock::Text { text } => Block::Text { text },
            AssistantBlock::Thinking { text, signature } => Block::Thinking { text, signature },
            AssistantBlock::ToolUse { call } => Block::ToolUse { call },
        }
    }
}

impl From<Block> for AssistantBlock {
    fn from(block: Block) -> AssistantBlock {
        match block {
            Block::Text { text } => AssistantBlock::Text { text },
            Block::Thinking { text, signature } => AssistantBlock::Thinking { text, signature },
            Block::ToolUse { call } => AssistantBlock::ToolUse { call },
        }
    }
}

/// Both directions in one place, so the two can never disagree on a field.
macro_rules! map_kinds {
    ($from:ident => $to:ident, $blocks:expr) => {
        impl From<$from> for $to {
            fn from(kind: $from) -> $to {
                match kind {
                    $from::Created {
                        conversation,
                        cwd,
                        config,
                        parent_conversation,
                        user_initiated,
                        forked_from,
                    } => $to::Created {
                        conversation,
                        cwd,
                        config,
                        parent_conversation,
                        user_initiated,
                        forked_from,
                    },
                    $from::SessionStarted => $to::SessionStarted,
                    $from::SessionEnded => $to::SessionEnded,
                    $from::UserMessage { text, images } => $to::UserMessage { text, images },
                    $from::TurnStarted { turn } => $to::TurnStarted { turn },
                    $from::AssistantMessage {
                        blocks,
                        stop_reason,
                        usage,
                        provider,
                        model,
                    } => $to::AssistantMessage {
                        blocks: blocks.into_iter().map($blocks).collect(),
                        stop_reason,
                        usage,
                        provider,
                        model,
                    },
                    $from::ToolResult {
                        tool_call_id,
                        content,
                        is_error,
                        synthetic,
                        images,
                    } => $to::ToolResult {
                        tool_call_id,
                        content,
                        is_error,
                        synthetic,
                        images,
                    },
                    $from::Suspended { pending } => $to::Suspended { pending },
                    $from::Resolved {
                        tool_call_id,
                        decision,
                        by,
                    } => $to::Resolved {
                        tool_call_id,
                        decision,
                        by,
                    },
                    $from::TurnCompleted {
                        turn,
                        duration_ms,
                        note,
                    } => $to::TurnCompleted {
                        turn,
                        duration_ms,
                        note,
                    },
                    $from::TurnInterrupted {
                        turn,
                        reason,
                        partial_text,
                    } => $to::TurnInterrupted {
                        turn,
                        reason,
                        partial_text,
                    },
                    $from::TurnFailed { turn, error } => $to::TurnFailed { turn, error },
                    $from::ConfigChanged { config } => $to::ConfigChanged { config },
                    $from::Recovered { action } => $to::Recovered { action },
                    $from::Nudge { reason, text } => $to::Nudge { reason, text },
                    $from::DebounceCancelled => $to::DebounceCancelled,
                    $from::Finished { outcome } => $to::Finished { outcome },
                    $from::Unanswered { messages, reason } => $to::Unanswered { messages, reason },
                    $from::Compacted {
                        through_seq,
                        replaced_messages,
                        summary,
                        tokens_before,
                        tokens_after,
                    } => $to::Compacted {
                        through_seq,
                        replaced_messages,
                        summary,
                        tokens_before,
                        tokens_after,
                    },
                    $from::Rewound {
                        to_seq,
                        messages,
                        message_seqs,
                    } => $to::Rewound {
                        to_seq,
                        messages,
                        message_seqs,
                    },
                }
            }
        }
    };
}

map_kinds!(EventKind => Kind, Block::from);
map_kinds!(Kind => EventKind, AssistantBlock::from);
