//! Canonical events: the only truth about a conversation. They are appended to
//! the log before anything else happens, folded by the reducer
//! (`reducer.rs`) into the working set, and never change meaning once written
//! (`codec.rs` versions their encoding).

use serde::{Deserialize, Serialize};

use crate::config::{ConversationConfig, ProviderKind};
use crate::ids::{ConversationId, Seq, ToolCallId};
use crate::message::{AssistantBlock, ImageRef, Message, StopReason, ToolCall, Usage};
use crate::time::Timestamp;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the conversation's log, from 1, without gaps.
    pub seq: Seq,
    pub at: Timestamp,
    /// The seq of the causal parent; only the first event (`Created`) has
    /// none. Events inside a turn link to its `TurnStarted`, a `TurnStarted`
    /// links to the message that triggered it, a `SessionStarted` to the
    /// event before it, and other events outside a turn to the
    /// `SessionStarted` of the session that recorded them
    /// (docs/requirements.md, "Causal links").
    pub parent: Option<Seq>,
    /// Whether this event asks for an LLM turn (user messages do).
    pub triggers_turn: bool,
    pub kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// Always seq 1: who the conversation is and how it is configured.
    Created {
        conversation: ConversationId,
        /// Fixed working directory for every tool call (REQ-BED-010).
        cwd: String,
        config: ConversationConfig,
        /// Set for sub-agents: the conversation that spawned this one.
        #[serde(default)]
        parent_conversation: Option<ConversationId>,
        /// False for sub-agents, which normal listings leave out (REQ-BED-009).
        user_initiated: bool,
        /// Set for a fork: the conversation and seq its history was copied
        /// from (events 2 to that seq are the source's, docs/history.md).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forked_from: Option<ForkOrigin>,
    },
    /// An actor started serving this conversation.
    SessionStarted,
    /// The actor serving this conversation stopped cleanly (eviction, shutdown).
    SessionEnded,
    UserMessage {
        text: String,
        #[serde(default)]
        images: Vec<ImageRef>,
    },
    TurnStarted {
        turn: u32,
    },
    /// A complete response; partial responses are never recorded here.
    AssistantMessage {
        blocks: Vec<AssistantBlock>,
        stop_reason: StopReason,
        usage: Usage,
        /// Which provider answered: fallback is never silent.
        provider: ProviderKind,
        model: String,
    },
    ToolResult {
        tool_call_id: ToolCallId,
        content: String,
        is_error: bool,
        /// Made by keel (cancel, restart, a rule), not by the tool.
        synthetic: bool,
        /// Images the tool returned (an MCP tool's image content), stored
        /// as blobs like a user's attachments: the model sees them with
        /// the result (docs/mcp.md).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageRef>,
    },
    /// Tool calls now wait for a human or a client.
    Suspended {
        pending: Vec<PendingCall>,
    },
    /// A pending call was decided. Recorded once per call: asking again
    /// with the same decision changes nothing, another one is refused.
    Resolved {
        tool_call_id: ToolCallId,
        decision: Decision,
        /// Who decided, as the client named them (a user name, say), at
        /// most [`MAX_RESOLVED_BY_CHARS`] characters; for audit only.
        /// Absent in logs written before it was recorded.
        #[serde(default)]
        by: Option<String>,
    },
    TurnCompleted {
        turn: u32,
        duration_ms: u64,
        /// Set when the turn ended for a reason the user should see: the
        /// response was cut off at `max_tokens`, or the model refused.
        #[serde(default)]
        note: Option<TurnNote>,
    },
    TurnInterrupted {
        turn: u32,
        reason: InterruptReason,
        /// Text streamed before the interruption, for display and audit. The
        /// reducer never sends it to the LLM.
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
    /// Recovery after a restart resumed the turn in flight; counted so that
    /// resumption cannot loop.
    Recovered {
        action: RecoveryAction,
    },
    /// A note keel adds to the prompt as user text (a sub-agent's last call
    /// to submit its result, for instance).
    Nudge {
        reason: NudgeReason,
        text: String,
    },
    /// The user cancelled while a debounce was waiting to start a turn: the
    /// messages stay in history, and no turn is owed for them. Written by
    /// older versions; keel now records [`EventKind::Unanswered`] instead.
    DebounceCancelled,
    /// Acknowledged user messages that will get no turn of their own, and
    /// why (the user cancelled, the process stopped under `recovery =
    /// idle`, …). They stay in history; the model sees them with the next
    /// message. Every acknowledged message either gets a turn or is named
    /// in one of these (docs/requirements.md, "Every acknowledged message").
    Unanswered {
        messages: Vec<Seq>,
        reason: InterruptReason,
    },
    /// A sub-agent reached its terminal state.
    Finished {
        outcome: SubAgentOutcome,
    },
    /// The older part of the prompt was replaced by a summary of it (or,
    /// when no summary could be had, left out with a note) so that the
    /// prompt fits the model's context window. The log keeps every event
    /// it replaced; only the prompt built from the log is smaller
    /// (docs/compaction.md).
    Compacted {
        /// Seq of the last event whose content the summary stands for.
        through_seq: Seq,
        /// How many leading messages of the prompt were replaced: always
        /// up to the start of a turn, so no tool call is parted from its
        /// result.
        replaced_messages: u32,
        /// The model's summary; `None` when the messages were left out
        /// without one (the summary request failed or could not fit).
        summary: Option<String>,
        /// The prompt's estimated tokens before and after.
        tokens_before: u64,
        tokens_after: u64,
    },
    /// The conversation was rewound: from here on its prompt is the one it
    /// had at `to_seq`, a turn boundary. The events between stay in the log
    /// for audit; the model no longer sees them (docs/history.md).
    Rewound {
        to_seq: Seq,
        /// The prompt at `to_seq`, as a replay of the log up to it makes
        /// it: carried here so that a replay needs nothing but this event.
        messages: Vec<Message>,
        /// For each of `messages`, the seq of the event that started it.
        message_seqs: Vec<Seq>,
    },
}

/// Where a forked conversation's history came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    pub conversation: ConversationId,
    /// The last seq of the source's log the fork copied.
    pub seq: Seq,
}

/// The longest `by` a resolution may name, in characters: enough for any
/// user name or e-mail address, and bounded because it is written to the
/// log of every resolution.
pub const MAX_RESOLVED_BY_CHARS: usize = 200;

/// A tool call that waits on someone outside keel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    pub call: ToolCall,
    pub kind: PendingKind,
    /// What to show the human: the question of an elicitation.
    #[serde(default)]
    pub prompt: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingKind {
    /// A gated tool that runs on the server once a human approves it.
    Approval,
    /// A question to the user (`ask_user`).
    Elicitation,
    /// A tool the client runs and answers.
    ClientExec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    Approve,
    /// Approve the call to run with this input instead of the model's
    /// (an approval only). The model's history shows the call with the
    /// input it ran with, as LangChain's human-in-the-loop edit does.
    Edit {
        input: serde_json::Value,
    },
    Deny,
    Answer {
        text: String,
    },
}

impl Decision {
    /// Whether the call runs: approved as it is, or edited.
    pub fn runs_call(&self) -> bool {
        matches!(self, Decision::Approve | Decision::Edit { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum InterruptReason {
    /// The user cancelled.
    Cancelled,
    /// A new message interrupted the turn (`busy_policy = interrupt`).
    Superseded,
    /// The process died mid-turn and `recovery = idle`.
    Restart,
    /// The process died mid-turn again after two automatic resumes.
    ResumeLimit,
    /// The turn reached its cap of LLM requests.
    RequestLimit { limit: u32 },
    /// A sub-agent's deadline passed.
    Timeout,
    /// The runtime stopped gracefully and the turn did not finish before
    /// the shutdown deadline.
    Shutdown,
    /// A sub-agent reached its terminal state (it submitted its result or
    /// failed): messages still owed a turn will get none.
    Finished,
    /// The user rewound the conversation while the turn waited on them:
    /// its pending calls are closed and the turn is called off.
    Rewound,
}

/// Why a completed turn ended the way it did, when the user should know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TurnNote {
    /// The response reached the request's `max_tokens` and was cut off; any
    /// tool call in it was not run (its input may be incomplete).
    MaxTokens { max_tokens: u32 },
    /// The model declined to answer; any tool call in it was not run.
    Refusal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    /// The log ended in a user message or tool results: the request is sent again.
    RerunRequest,
    /// The log ended in tool calls without results: they run again, same ids.
    Redispatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NudgeReason {
    /// A sub-agent reached its turn cap: this is its one grace turn.
    TurnCap,
    /// A sub-agent answered in text without calling `submit_result`.
    MissingSubmit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SubAgentOutcome {
    Completed { result: String },
    Failed { reason: String },
}
