//! Live events: broadcast to subscribers, never logged. Losing one loses
//! nothing durable; a client that missed some re-reads the log.

use serde::{Deserialize, Serialize};

use crate::config::ModelRef;
use crate::event::PendingCall;
use crate::ids::{ConversationId, ToolCallId};
use crate::state::{Generation, StateName};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LiveEvent {
    StateChanged {
        state: StateName,
    },
    /// A piece of the response being streamed by request `generation`.
    Delta {
        generation: Generation,
        delta: StreamDelta,
    },
    ToolOutput {
        tool_call_id: ToolCallId,
        chunk: String,
    },
    /// The request failed and will be sent again after `delay_ms`.
    Retrying {
        /// Which retry this will be (1-based), of `max_retries`.
        retry: u32,
        max_retries: u32,
        delay_ms: u64,
        error: String,
        model: ModelRef,
    },
    /// Forget every delta of this request: it failed and is retried whole.
    AttemptDiscarded {
        generation: Generation,
    },
    /// The primary's retries are exhausted; the fallback answers from now on.
    FallbackUsed {
        from: ModelRef,
        to: ModelRef,
        error: String,
    },
    /// An image of the history could not be put into request `generation`
    /// (its bytes are gone or damaged, or it cannot be made to fit the
    /// provider): the request carries a short note in its place and goes
    /// on. The log is unchanged, so the next request tries the image again.
    ImageOmitted {
        generation: Generation,
        /// The image's content hash.
        hash: String,
        /// Why, in words safe to show the user.
        reason: String,
    },
    /// A sub-agent of the running `spawn_agents` call changed state (its
    /// own log has the details). Published on the parent, so that whoever
    /// watches it sees its children work.
    ChildState {
        /// The `spawn_agents` call that started it.
        tool_call_id: ToolCallId,
        /// Its task's position in the call, from 0.
        task_idx: usize,
        child: ConversationId,
        state: StateName,
    },
    ContextUsage {
        used: u64,
        limit: u64,
        /// Set when this response crossed 80% or 95% of the window.
        warning: Option<ContextWarning>,
    },
    /// A compaction a user asked for could not get its summary: the prompt
    /// is as it was (docs/compaction.md).
    CompactionFailed {
        error: String,
    },
    /// The calls a sub-agent of the running `spawn_agents` call now waits
    /// on (an approval: it inherits the parent's gates), all of them, empty
    /// once none waits. Published on the parent, because nobody watches the
    /// sub-agent: whoever watches the parent decides them, through the
    /// parent (a resolution for the sub-agent's call is passed on to it).
    ChildPending {
        /// The `spawn_agents` call that started it.
        tool_call_id: ToolCallId,
        child: ConversationId,
        pending: Vec<PendingCall>,
    },
}

/// A call a sub-agent of a conversation's running `spawn_agents` call
/// waits on, as its parent lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildPendingCall {
    /// The sub-agent whose call it is.
    pub child: ConversationId,
    pub pending: PendingCall,
}

/// A fragment of a streamed response, as the provider decoders produce it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StreamDelta {
    Text {
        text: String,
    },
    Thinking {
        text: String,
    },
    ToolUseStarted {
        id: ToolCallId,
        name: String,
    },
    ToolInput {
        id: ToolCallId,
        partial_json: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextWarning {
    /// At least 80% of the context window is used.
    Approaching,
    /// At least 95% of the context window is used.
    Critical,
}

impl ContextWarning {
    pub fn level(used: u64, limit: u64) -> Option<ContextWarning> {
        if limit == 0 {
            return None;
        }
        let permille = used.saturating_mul(1000) / limit;
        if permille >= 950 {
            Some(ContextWarning::Critical)
        } else if permille >= 800 {
            Some(ContextWarning::Approaching)
        } else {
            None
        }
    }
}
