//! Why an input was refused. keel-core never fails; it answers a bad or
//! ill-timed input with a `Rejection` and leaves the conversation as it was.
//! The Display text is safe and useful to show a user.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::{Decision, PendingKind};
use crate::history::HistoryError;
use crate::ids::ToolCallId;
use crate::state::StateName;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Rejection {
    /// A message arrived mid-turn under `busy_policy = reject` (REQ-BED-002).
    Busy { state: StateName },
    /// `busy_policy = queue` and the queue is full.
    QueueFull { limit: usize },
    /// A message with neither text nor images.
    EmptyMessage,
    /// A sub-agent reached `Completed` or `Failed` and takes nothing more.
    Finished,
    /// The actor is stopping.
    ShuttingDown,
    /// No pending call has this id, none among the latest resolutions and
    /// none with a result in the prompt: the conversation never had it, or the call
    /// has not come to wait yet (it runs, or waits behind another call).
    UnknownCall { tool_call_id: ToolCallId },
    /// The call was already resolved with another decision, the one given
    /// here; a resolution is never replaced. (The same decision again is
    /// accepted and changes nothing.)
    AlreadyResolved {
        tool_call_id: ToolCallId,
        decision: Decision,
    },
    /// The call has its result and no resolution of it is on record: it got it otherwise (it ran, keel answered it when the turn
    /// was cancelled or interrupted), or was resolved so long ago that its
    /// resolution is no longer on record (`reducer::RESOLUTIONS_KEPT`).
    AlreadySettled { tool_call_id: ToolCallId },
    /// The `by` of a resolution is longer than
    /// [`MAX_RESOLVED_BY_CHARS`](crate::event::MAX_RESOLVED_BY_CHARS).
    ResolvedByTooLong { limit: usize },
    /// A compaction was asked for, but the prompt has no turn before the
    /// latest one: nothing can be replaced without parting it.
    NothingToCompact,
    /// Compaction, fork and rewind are not for a sub-agent: its history
    /// belongs to the call that started it.
    SubAgentHistory,
    /// A rewind to a seq that is not a turn boundary of the log.
    History { error: HistoryError },
    /// The decision does not fit the pending call (approving a question, say).
    InvalidDecision {
        tool_call_id: ToolCallId,
        kind: PendingKind,
        decision: Decision,
    },
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Busy { state } => write!(
                f,
                "agent is busy ({state}); cancel to interrupt the current turn, then send again"
            ),
            Rejection::QueueFull { limit } => write!(
                f,
                "agent is busy and {limit} messages are already queued; wait, or cancel to interrupt"
            ),
            Rejection::EmptyMessage => write!(f, "message has no text and no images"),
            Rejection::Finished => write!(f, "conversation has finished and takes no more input"),
            Rejection::ShuttingDown => write!(f, "conversation is shutting down; try again"),
            Rejection::UnknownCall { tool_call_id } => {
                write!(f, "no pending tool call has id {tool_call_id}")
            }
            Rejection::InvalidDecision {
                tool_call_id,
                kind,
                decision,
            } => {
                let wanted = match kind {
                    PendingKind::Approval => "approve or deny",
                    PendingKind::Elicitation => "answer or deny",
                    PendingKind::ClientExec => "answer (with the tool's output) or deny",
                };
                let got = decision_name(decision);
                write!(f, "tool call {tool_call_id} takes {wanted}, not {got}")
            }
            Rejection::AlreadyResolved {
                tool_call_id,
                decision,
            } => {
                // The answer's text is left out: it may be long, and the
                // one asking may not be the one who answered.
                let recorded = decision_name(decision);
                write!(
                    f,
                    "tool call {tool_call_id} was already resolved ({recorded}); a resolution cannot be changed"
                )
            }
            Rejection::AlreadySettled { tool_call_id } => write!(
                f,
                "tool call {tool_call_id} was already settled (it has its result: it ran, was cancelled or interrupted, or was resolved long ago); nothing to resolve"
            ),
            Rejection::ResolvedByTooLong { limit } => write!(
                f,
                "the name of who resolves (by) is too long; at most {limit} characters"
            ),
            Rejection::NothingToCompact => write!(
                f,
                "nothing to compact: the conversation has no turn before the latest one"
            ),
            Rejection::SubAgentHistory => write!(
                f,
                "a sub-agent's history belongs to the call that started it; compact, fork or rewind its parent"
            ),
            Rejection::History { error } => write!(f, "cannot rewind: {error}"),
        }
    }
}

fn decision_name(decision: &Decision) -> &'static str {
    match decision {
        Decision::Approve => "approve",
        Decision::Edit { .. } => "edit",
        Decision::Deny => "deny",
        Decision::Answer { .. } => "answer",
    }
}
