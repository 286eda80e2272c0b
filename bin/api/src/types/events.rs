//! What the event routes carry: the log's canonical events (`/log` and the
//! SSE `canonical` frames), the live events (SSE `live` frames) and the
//! snapshot each stream starts with.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use keel_core::event::{
    Decision, Event, EventKind, InterruptReason, NudgeReason, RecoveryAction, SubAgentOutcome,
    TurnNote,
};
use keel_core::live::{ContextWarning, LiveEvent, StreamDelta};
use keel_core::message::StopReason;
use keel_core::{ConversationId, Generation};

use super::requests::*;
use super::responses::*;

/// `GET /v1/conversations/{id}/log`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogPage {
    pub events: Vec<ApiEvent>,
    /// The `from` of the next page; equal to this page's `from` when the
    /// log has nothing more yet.
    pub next_from: u64,
}

/// A canonical event, as stored in the log (and the SSE `id` of its
/// frame is its `seq`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiEvent {
    /// `{conversation}:{seq}`.
    pub id: String,
    pub seq: u64,
    pub at_ms: u64,
    /// The seq of the causal parent; only the first event has none.
    pub parent: Option<u64>,
    pub triggers_turn: bool,
    #[serde(flatten)]
    pub kind: ApiEventKind,
}

impl ApiEvent {
    pub fn new(conversation: &ConversationId, event: Event) -> ApiEvent {
        ApiEvent {
            id: conversation.event_id(event.seq).to_string(),
            seq: event.seq,
            at_ms: event.at.as_millis(),
            parent: event.parent,
            triggers_turn: event.triggers_turn,
            kind: event.kind.into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ApiEventKind {
    Created {
        cwd: String,
        provider: ApiProvider,
        model: String,
        parent_conversation: Option<String>,
        user_initiated: bool,
        /// Set for a fork: the conversation and seq its history was copied
        /// from (docs/history.md).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forked_from: Option<ApiForkOrigin>,
    },
    SessionStarted,
    SessionEnded,
    UserMessage {
        text: String,
        images: Vec<ApiImage>,
    },
    TurnStarted {
        turn: u32,
    },
    AssistantMessage {
        content: Vec<ApiContent>,
        stop_reason: String,
        usage: ApiUsage,
        provider: ApiProvider,
        model: String,
    },
    ToolResult {
        tool_call_id: String,
        content: String,
        is_error: bool,
        synthetic: bool,
        /// Images the tool returned (an MCP tool's image content), stored
        /// like a message's images; absent when there are none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ApiImage>,
    },
    Suspended {
        pending: Vec<ApiPendingCall>,
    },
    Resolved {
        tool_call_id: String,
        decision: ApiDecisionKind,
        text: Option<String>,
        /// The input an `edit` ran the call with.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<serde_json::Value>,
        /// Who decided, when the resolve request said.
        by: Option<String>,
    },
    TurnCompleted {
        turn: u32,
        duration_ms: u64,
        /// `max_tokens` or `refusal` when the turn ended for such a reason.
        note: Option<String>,
    },
    TurnInterrupted {
        turn: u32,
        reason: String,
        partial_text: Option<String>,
    },
    TurnFailed {
        turn: u32,
        error: String,
    },
    ConfigChanged {
        provider: ApiProvider,
        model: String,
        context_window: u64,
        compact_at_percent: u8,
        max_tokens: u32,
    },
    Recovered {
        action: String,
    },
    Nudge {
        reason: String,
        text: String,
    },
    /// Acknowledged messages that get no turn of their own, and why.
    Unanswered {
        messages: Vec<u64>,
        reason: String,
    },
    Finished {
        status: String,
        /// The submitted result, or why it failed.
        detail: String,
    },
    /// The older part of the prompt was replaced by a summary (or left out
    /// with a note when none could be had) to fit the context window; the
    /// log keeps everything (docs/compaction.md).
    Compacted {
        /// The last seq the summary stands for.
        through_seq: u64,
        replaced_messages: u32,
        /// `null` when the messages were left out without a summary.
        summary: Option<String>,
        tokens_before: u64,
        tokens_after: u64,
    },
    /// The conversation was rewound: from here on its prompt is the one it
    /// had at `to_seq`; the events between stay for audit
    /// (docs/history.md).
    Rewound {
        to_seq: u64,
        /// How many messages the prompt holds after the rewind.
        messages: usize,
    },
}

impl From<EventKind> for ApiEventKind {
    fn from(kind: EventKind) -> ApiEventKind {
        match kind {
            EventKind::Created {
                cwd,
                config,
                parent_conversation,
                user_initiated,
                forked_from,
                ..
            } => ApiEventKind::Created {
                cwd,
                provider: config.primary.provider.into(),
                model: config.primary.model,
                parent_conversation: parent_conversation.map(String::from),
                user_initiated,
                forked_from: forked_from.map(Into::into),
            },
            EventKind::SessionStarted => ApiEventKind::SessionStarted,
            EventKind::SessionEnded => ApiEventKind::SessionEnded,
            EventKind::UserMessage { text, images } => ApiEventKind::UserMessage {
                text,
                images: images.into_iter().map(Into::into).collect(),
            },
            EventKind::TurnStarted { turn } => ApiEventKind::TurnStarted { turn },
            EventKind::AssistantMessage {
                blocks,
                stop_reason,
                usage,
                provider,
                model,
            } => ApiEventKind::AssistantMessage {
                content: blocks.into_iter().map(Into::into).collect(),
                stop_reason: stop_reason_name(stop_reason).to_owned(),
                usage: usage.into(),
                provider: provider.into(),
                model,
            },
            EventKind::ToolResult {
                tool_call_id,
                content,
                is_error,
                synthetic,
                images,
            } => ApiEventKind::ToolResult {
                tool_call_id: tool_call_id.0,
                content,
                is_error,
                synthetic,
                images: images.into_iter().map(Into::into).collect(),
            },
            EventKind::Suspended { pending } => ApiEventKind::Suspended {
                pending: pending.into_iter().map(Into::into).collect(),
            },
            EventKind::Resolved {
                tool_call_id,
                decision,
                by,
            } => {
                let (decision, text, input) = decision_parts(decision);
                ApiEventKind::Resolved {
                    tool_call_id: tool_call_id.0,
                    decision,
                    text,
                    input,
                    by,
                }
            }
            EventKind::TurnCompleted {
                turn,
                duration_ms,
                note,
            } => ApiEventKind::TurnCompleted {
                turn,
                duration_ms,
                note: note.map(|note| {
                    match note {
                        TurnNote::MaxTokens { .. } => "max_tokens",
                        TurnNote::Refusal => "refusal",
                    }
                    .to_owned()
                }),
            },
            EventKind::TurnInterrupted {
                turn,
                reason,
                partial_text,
            } => ApiEventKind::TurnInterrupted {
                turn,
                reason: interrupt_reason_name(reason).to_owned(),
                partial_text,
            },
            EventKind::TurnFailed { turn, error } => ApiEventKind::TurnFailed { turn, error },
            EventKind::ConfigChanged { config } => ApiEventKind::ConfigChanged {
                provider: config.primary.provider.into(),
                model: config.primary.model,
                context_window: config.context_window,
                compact_at_percent: config.compact_at_percent,
                max_tokens: config.max_tokens,
            },
            EventKind::Recovered { action } => ApiEventKind::Recovered {
                action: match action {
                    RecoveryAction::RerunRequest => "rerun_request",
                    RecoveryAction::Redispatch => "redispatch",
                }
                .to_owned(),
            },
            EventKind::Nudge { reason, text } => ApiEventKind::Nudge {
                reason: match reason {
                    NudgeReason::TurnCap => "turn_cap",
                    NudgeReason::MissingSubmit => "missing_submit",
                }
                .to_owned(),
                text,
            },
            EventKind::DebounceCancelled => ApiEventKind::Unanswered {
                messages: Vec::new(),
                reason: "cancelled".to_owned(),
            },
            EventKind::Unanswered { messages, reason } => ApiEventKind::Unanswered {
                messages,
                reason: interrupt_reason_name(reason).to_owned(),
            },
            EventKind::Compacted {
                through_seq,
                replaced_messages,
                summary,
                tokens_before,
                tokens_after,
            } => ApiEventKind::Compacted {
                through_seq,
                replaced_messages,
                summary,
                tokens_before,
                tokens_after,
            },
            EventKind::Rewound {
                to_seq, messages, ..
            } => ApiEventKind::Rewound {
                to_seq,
                messages: messages.len(),
            },
            EventKind::Finished { outcome } => match outcome {
                SubAgentOutcome::Completed { result } => ApiEventKind::Finished {
                    status: "completed".to_owned(),
                    detail: result,
                },
                SubAgentOutcome::Failed { reason } => ApiEventKind::Finished {
                    status: "failed".to_owned(),
                    detail: reason,
                },
            },
        }
    }
}

fn decision_parts(
    decision: Decision,
) -> (ApiDecisionKind, Option<String>, Option<serde_json::Value>) {
    match decision {
        Decision::Approve => (ApiDecisionKind::Approve, None, None),
        Decision::Edit { input } => (ApiDecisionKind::Edit, None, Some(input)),
        Decision::Deny => (ApiDecisionKind::Deny, None, None),
        Decision::Answer { text } => (ApiDecisionKind::Answer, Some(text), None),
    }
}

fn stop_reason_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "end_turn",
        StopReason::ToolUse => "tool_use",
        StopReason::MaxTokens => "max_tokens",
        StopReason::StopSequence => "stop_sequence",
        StopReason::Refusal => "refusal",
        StopReason::PauseTurn => "pause_turn",
        StopReason::Other => "other",
    }
}

pub fn interrupt_reason_name(reason: InterruptReason) -> &'static str {
    match reason {
        InterruptReason::Cancelled => "cancelled",
        InterruptReason::Superseded => "superseded",
        InterruptReason::Restart => "restart",
        InterruptReason::ResumeLimit => "resume_limit",
        InterruptReason::RequestLimit { .. } => "request_limit",
        InterruptReason::Timeout => "timeout",
        InterruptReason::Finished => "finished",
        InterruptReason::Shutdown => "shutdown",
        InterruptReason::Rewound => "rewound",
    }
}

/// A request's name in the API: `{turn}.{attempt}`.
fn generation_name(generation: Generation) -> String {
    format!("{}.{}", generation.turn, generation.attempt)
}

/// A live-only event: streamed, never stored; the SSE frame carries no
/// `id`, and a client that misses some loses nothing durable.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ApiLiveEvent {
    StateChanged {
        state: ApiState,
    },
    /// Text of the response being streamed by request `generation`
    /// (`{turn}.{attempt}`).
    TextDelta {
        generation: String,
        text: String,
    },
    ThinkingDelta {
        generation: String,
        text: String,
    },
    ToolUseStarted {
        generation: String,
        tool_call_id: String,
        name: String,
    },
    ToolInputDelta {
        generation: String,
        tool_call_id: String,
        partial_json: String,
    },
    /// Output of a running tool.
    ToolOutput {
        tool_call_id: String,
        chunk: String,
    },
    Retrying {
        retry: u32,
        max_retries: u32,
        delay_ms: u64,
        error: String,
        provider: ApiProvider,
        model: String,
    },
    /// Forget the deltas of request `generation`: it is retried whole.
    AttemptDiscarded {
        generation: String,
    },
    FallbackUsed {
        from: String,
        to: String,
        error: String,
    },
    ImageOmitted {
        generation: String,
        hash: String,
        reason: String,
    },
    ContextUsage {
        used: u64,
        limit: u64,
        /// `approaching` (80%) or `critical` (95%).
        warning: Option<String>,
    },
    /// A sub-agent started by this conversation's `spawn_agents` call
    /// `tool_call_id` (task `task_idx`, from 0) is now in `state`; its own
    /// stream (`/v1/conversations/{child}/events`) has the details.
    ChildState {
        tool_call_id: String,
        task_idx: usize,
        child: String,
        state: ApiState,
    },
    /// What a sub-agent of this conversation's `spawn_agents` call
    /// `tool_call_id` waits on now, all of it (empty once nothing waits).
    /// Decide each call through this conversation, as its own.
    ChildPending {
        tool_call_id: String,
        child: String,
        pending: Vec<ApiPendingCall>,
    },
    /// A compaction asked for (`POST …/compact`) could not get its summary;
    /// the prompt is as it was.
    CompactionFailed {
        error: String,
    },
    /// This client fell behind: live-only events were lost, canonical
    /// events it missed follow from the log.
    Lagged {
        /// How many sends it missed, each one or more events.
        missed: u64,
    },
}

impl From<LiveEvent> for ApiLiveEvent {
    fn from(event: LiveEvent) -> ApiLiveEvent {
        match event {
            LiveEvent::StateChanged { state } => ApiLiveEvent::StateChanged {
                state: state.into(),
            },
            LiveEvent::Delta { generation, delta } => {
                let generation = generation_name(generation);
                match delta {
                    StreamDelta::Text { text } => ApiLiveEvent::TextDelta { generation, text },
                    StreamDelta::Thinking { text } => {
                        ApiLiveEvent::ThinkingDelta { generation, text }
                    }
                    StreamDelta::ToolUseStarted { id, name } => ApiLiveEvent::ToolUseStarted {
                        generation,
                        tool_call_id: id.0,
                        name,
                    },
                    StreamDelta::ToolInput { id, partial_json } => ApiLiveEvent::ToolInputDelta {
                        generation,
                        tool_call_id: id.0,
                        partial_json,
                    },
                }
            }
            LiveEvent::ToolOutput {
                tool_call_id,
                chunk,
            } => ApiLiveEvent::ToolOutput {
                tool_call_id: tool_call_id.0,
                chunk,
            },
            LiveEvent::Retrying {
                retry,
                max_retries,
                delay_ms,
                error,
                model,
            } => ApiLiveEvent::Retrying {
                retry,
                max_retries,
                delay_ms,
                error,
                provider: model.provider.into(),
                model: model.model,
            },
            LiveEvent::AttemptDiscarded { generation } => ApiLiveEvent::AttemptDiscarded {
                generation: generation_name(generation),
            },
            LiveEvent::FallbackUsed { from, to, error } => ApiLiveEvent::FallbackUsed {
                from: from.to_string(),
                to: to.to_string(),
                error,
            },
            LiveEvent::ImageOmitted {
                generation,
                hash,
                reason,
            } => ApiLiveEvent::ImageOmitted {
                generation: generation_name(generation),
                hash,
                reason,
            },
            LiveEvent::ContextUsage {
                used,
                limit,
                warning,
            } => ApiLiveEvent::ContextUsage {
                used,
                limit,
                warning: warning.map(|warning| {
                    match warning {
                        ContextWarning::Approaching => "approaching",
                        ContextWarning::Critical => "critical",
                    }
                    .to_owned()
                }),
            },
            LiveEvent::ChildState {
                tool_call_id,
                task_idx,
                child,
                state,
            } => ApiLiveEvent::ChildState {
                tool_call_id: tool_call_id.0,
                task_idx,
                child: child.to_string(),
                state: state.into(),
            },
            LiveEvent::ChildPending {
                tool_call_id,
                child,
                pending,
            } => ApiLiveEvent::ChildPending {
                tool_call_id: tool_call_id.0,
                pending: pending
                    .into_iter()
                    .map(|pending| ApiPendingCall {
                        conversation: Some(child.to_string()),
                        ..pending.into()
                    })
                    .collect(),
                child: child.to_string(),
            },
            LiveEvent::CompactionFailed { error } => ApiLiveEvent::CompactionFailed { error },
        }
    }
}

/// The first SSE event of a stream: where the conversation stands.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Snapshot {
    pub id: String,
    pub state: ApiState,
    /// The log position this snapshot describes. Canonical events after
    /// it follow (or, resuming, from the `Last-Event-ID` on).
    pub last_seq: u64,
    pub cwd: String,
    pub usage: ApiUsage,
    pub pending: Vec<ApiPendingCall>,
    /// The latest messages; older ones are in the log.
    pub recent_messages: Vec<ApiMessage>,
    pub omitted_messages: usize,
}
