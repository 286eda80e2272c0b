//! Inputs: everything that can happen to a conversation, as data. The shell
//! turns user requests, worker reports and timers into these and feeds them to
//! `transition()`.

use serde::{Deserialize, Serialize};

use crate::config::{ConversationConfig, ProviderKind};
use crate::event::Decision;
use crate::ids::{Seq, ToolCallId};
use crate::live::StreamDelta;
use crate::message::{AssistantBlock, ImageRef, StopReason, Usage};
use crate::retry::JitterPermille;
use crate::state::Generation;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Input {
    /// An actor has (re)started on this conversation after rehydrating it
    /// from the log: record the session and recover any turn in flight.
    Started,
    UserMessage {
        text: String,
        images: Vec<ImageRef>,
    },
    StreamDelta {
        generation: Generation,
        delta: StreamDelta,
    },
    StreamFinished {
        generation: Generation,
        response: AssistantResponse,
    },
    StreamFailed {
        generation: Generation,
        failure: LlmFailure,
        /// Drawn uniformly by the shell in `0..=1000`; spreads retries out.
        jitter: JitterPermille,
    },
    ToolOutput {
        tool_call_id: ToolCallId,
        chunk: String,
    },
    ToolFinished {
        tool_call_id: ToolCallId,
        content: String,
        is_error: bool,
        /// Images the tool returned, already stored as blobs.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageRef>,
    },
    /// Decide a pending call. Exactly once: the same decision again is
    /// accepted and changes nothing (a client retrying after a lost
    /// answer), a different one is refused.
    Resolve {
        tool_call_id: ToolCallId,
        decision: Decision,
        /// Who decides, recorded in the `Resolved` event; at most
        /// [`MAX_RESOLVED_BY_CHARS`](crate::event::MAX_RESOLVED_BY_CHARS)
        /// characters.
        #[serde(default)]
        by: Option<String>,
    },
    Cancel,
    TimerFired {
        timer: Timer,
    },
    ChangeConfig {
        config: ConversationConfig,
    },
    /// Stop serving the conversation (idle eviction); refused mid-turn.
    Stop,
    /// Compact now, whatever the threshold: summarise everything before
    /// the latest turn (docs/compaction.md). Refused while a turn runs.
    Compact,
    /// Rewind to seq `to_seq`. `at` is what `history::working_at` made of
    /// the log for it (the shell reads the log): the working set there, or
    /// why it is not a turn boundary. Refused while a turn runs; a turn
    /// waiting on a human is called off first (docs/history.md).
    Rewind {
        to_seq: Seq,
        at: Result<Box<crate::reducer::WorkingSet>, crate::history::HistoryError>,
    },
    /// The runtime stops gracefully and will not wait any longer: end the
    /// session now, interrupting a turn still running.
    Shutdown,
}

/// A complete response from a provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantResponse {
    pub blocks: Vec<AssistantBlock>,
    pub stop_reason: StopReason,
    pub usage: Usage,
    pub provider: ProviderKind,
    pub model: String,
}

/// A failed LLM request, already classified by the provider layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmFailure {
    /// Network errors, timeouts, 408/409/429/5xx/529 are retryable; auth,
    /// other 4xx and an exhausted quota are not.
    pub retryable: bool,
    /// The provider's `retry-after`, if it sent one.
    pub retry_after_ms: Option<u64>,
    /// What went wrong, intact from the provider where it said.
    pub message: String,
    /// The provider refused the prompt as longer than the model's context
    /// window (Anthropic's "prompt is too long", OpenAI's
    /// `context_length_exceeded`): keel compacts and tries again
    /// (docs/compaction.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prompt_too_long: bool,
}

/// Timers the shell schedules on the core's behalf; each names what it is for,
/// so a timer that outlived its purpose is recognised as stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Timer {
    /// Start the turn unless another message came in (`busy_policy = interrupt`);
    /// `token` is the seq of the message that set it.
    Debounce { token: Seq },
    /// Send the request of `generation` again.
    Retry { generation: Generation },
    /// A sub-agent's wall-clock limit.
    Deadline,
}
