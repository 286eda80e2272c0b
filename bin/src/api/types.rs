//! The HTTP API's own shapes. keel-core's serde shape is the stored log
//! format; these are what clients see, converted from the runtime's types by
//! hand (the `From` impls below), so either can change without breaking the
//! other. Every type here is in `/openapi.json` through `ToSchema`.
//!
//! They serialise and deserialise both ways: the daemon answers with them
//! and the client (`crate::client`) reads them back, so the two share one
//! shape and cannot drift apart.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use std::collections::BTreeMap;

use keel_actors::core::config::{BusyPolicy, ProviderKind, ToolPolicy};
use keel_actors::core::event::{
    Decision, Event, EventKind, InterruptReason, NudgeReason, Outcome, PendingCall, PendingKind,
    RecoveryAction, TurnNote,
};
use keel_actors::core::live::{ChildPendingCall, ContextWarning, LiveEvent, StreamDelta};
use keel_actors::core::message::{
    AssistantBlock, ContentBlock, ImageRef, Message, Role, StopReason, ToolCall, Usage,
};
use keel_actors::core::state::StateName;
use keel_actors::core::{ConversationId, Generation, Status};
use keel_actors::store::IndexEntry;
use keel_actors::{Inspection, View};

// --- requests -------------------------------------------------------------

/// `POST /v1/conversations`. Every field is optional; the daemon's
/// configured model and the daemon's working directory are the defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateConversation {
    /// Absolute path of the directory every tool call runs in, fixed for
    /// the conversation's life. It must exist.
    pub cwd: Option<String>,
    /// The system prompt.
    pub system: Option<String>,
    pub provider: Option<ApiProvider>,
    pub model: Option<String>,
    pub busy_policy: Option<ApiBusyPolicy>,
    /// How each named tool runs: `auto` (the default), `approve` (waits
    /// for a human's approve or deny) or `client` (the client runs it and
    /// answers).
    #[serde(default)]
    pub tools: BTreeMap<String, ApiToolPolicy>,
    /// Asked with the same request once the primary's retries are
    /// exhausted; its model defaults to the provider's default model.
    pub fallback: Option<ApiModelChoice>,
    /// How a failed LLM request is retried; fields left out keep keel's
    /// defaults (3 retries from 1 s, doubling to 30 s, `retry-after`
    /// honoured up to 60 s).
    pub retry: Option<ApiRetry>,
    /// Longest a whole LLM request may take before it counts as a
    /// (retryable) timeout; 0 or left out: no limit.
    pub request_timeout_ms: Option<u64>,
    /// Let the file tools (`read_file`, `write_file`, `edit_file`, `glob`,
    /// `grep`) reach paths outside `cwd`. Default false: a path that
    /// resolves outside it (`..`, absolute, through a symlink) is refused.
    #[serde(default)]
    pub tools_may_leave_cwd: bool,
}

/// A provider and, optionally, its model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiModelChoice {
    pub provider: ApiProvider,
    pub model: Option<String>,
}

/// A retry policy; every field is optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiRetry {
    /// Retries after the first attempt, per provider (at most 10).
    pub max_retries: Option<u32>,
    /// Delay before the first retry, doubling with each further one.
    pub base_delay_ms: Option<u64>,
    /// Ceiling of that delay.
    pub max_delay_ms: Option<u64>,
    /// Ceiling of a provider's `retry-after`.
    pub retry_after_cap_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiToolPolicy {
    Auto,
    Approve,
    Client,
}

impl From<ApiToolPolicy> for ToolPolicy {
    fn from(policy: ApiToolPolicy) -> ToolPolicy {
        match policy {
            ApiToolPolicy::Auto => ToolPolicy::Auto,
            ApiToolPolicy::Approve => ToolPolicy::Approve,
            ApiToolPolicy::Client => ToolPolicy::Client,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiProvider {
    Anthropic,
    #[serde(rename = "openai")]
    OpenAi,
    Mock,
}

impl From<ApiProvider> for ProviderKind {
    fn from(provider: ApiProvider) -> ProviderKind {
        match provider {
            ApiProvider::Anthropic => ProviderKind::Anthropic,
            ApiProvider::OpenAi => ProviderKind::OpenAi,
            ApiProvider::Mock => ProviderKind::Mock,
        }
    }
}

impl From<ProviderKind> for ApiProvider {
    fn from(provider: ProviderKind) -> ApiProvider {
        match provider {
            ProviderKind::Anthropic => ApiProvider::Anthropic,
            ProviderKind::OpenAi => ApiProvider::OpenAi,
            ProviderKind::Mock => ApiProvider::Mock,
        }
    }
}

/// What a message sent mid-turn does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiBusyPolicy {
    /// Refused with 409; cancel first.
    Reject,
    /// Interrupts the running turn (after 100 ms without another message).
    Interrupt,
    /// Waits, durably, for the running turn to end.
    Queue,
}

impl From<ApiBusyPolicy> for BusyPolicy {
    fn from(policy: ApiBusyPolicy) -> BusyPolicy {
        match policy {
            ApiBusyPolicy::Reject => BusyPolicy::Reject,
            ApiBusyPolicy::Interrupt => BusyPolicy::Interrupt,
            ApiBusyPolicy::Queue => BusyPolicy::Queue,
        }
    }
}

impl From<BusyPolicy> for ApiBusyPolicy {
    fn from(policy: BusyPolicy) -> ApiBusyPolicy {
        match policy {
            BusyPolicy::Reject => ApiBusyPolicy::Reject,
            BusyPolicy::Interrupt => ApiBusyPolicy::Interrupt,
            BusyPolicy::Queue => ApiBusyPolicy::Queue,
        }
    }
}

/// `POST /v1/conversations/{id}/messages`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub images: Vec<ImageBody>,
}

/// An attached image: its bytes in standard base64 (no `data:` prefix).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageBody {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
    pub media_type: String,
    pub data: String,
}

/// `POST /v1/conversations/{id}/resolve`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    pub tool_call_id: String,
    pub decision: ApiDecisionKind,
    /// The answer (`decision = answer`): the reply to a question, or a
    /// client-run tool's output.
    pub text: Option<String>,
    /// Who decided, recorded in the log.
    pub by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiDecisionKind {
    Approve,
    Deny,
    Answer,
}

// --- responses ------------------------------------------------------------

/// Every error: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable: `bad_request`, `not_found`, `busy`, …
    pub code: String,
    /// For a person: what went wrong and what to do.
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedConversation {
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AcceptedMessage {
    /// `{conversation}:{seq}` of the stored user message.
    pub event_id: String,
    pub seq: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CancelAccepted {
    /// The state the conversation came to rest in.
    pub state: ApiState,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ResolveAccepted {
    pub tool_call_id: String,
    pub decision: ApiDecisionKind,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Evicted {
    pub id: String,
    /// Whether an actor was running (and is now stopped).
    pub was_live: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Killed {
    pub id: String,
}

/// `/healthz`: `ok`, or `storage_unavailable` (with 503) once the store
/// has stopped taking writes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
    /// Why the daemon is not healthy, and what to do; absent when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The phase a conversation is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiState {
    Idle,
    Debouncing,
    Streaming,
    RetryWait,
    ExecutingTools,
    AwaitingInput,
    Recovering,
    Error,
    Terminating,
    Completed,
    Failed,
}

impl From<StateName> for ApiState {
    fn from(state: StateName) -> ApiState {
        match state {
            StateName::Idle => ApiState::Idle,
            StateName::Debouncing => ApiState::Debouncing,
            StateName::Streaming => ApiState::Streaming,
            StateName::RetryWait => ApiState::RetryWait,
            StateName::ExecutingTools => ApiState::ExecutingTools,
            StateName::AwaitingInput => ApiState::AwaitingInput,
            StateName::Recovering => ApiState::Recovering,
            StateName::Error => ApiState::Error,
            StateName::Terminating => ApiState::Terminating,
            StateName::Completed => ApiState::Completed,
            StateName::Failed => ApiState::Failed,
        }
    }
}

/// One conversation of `GET /v1/conversations`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConversationSummary {
    pub id: String,
    /// Its state: a live actor's, or else what its log implies (`recovering`
    /// for a turn that was cut short and resumes when it is next woken).
    pub state: ApiState,
    /// Its working directory.
    pub cwd: String,
    /// How many turns it has had.
    pub turns: u32,
    /// The conversation that spawned this one (sub-agents only).
    pub parent: Option<String>,
    pub user_initiated: bool,
    pub created_at_ms: u64,
    pub last_activity_ms: u64,
    pub last_seq: u64,
    /// A turn was in progress at the last event.
    pub turn_in_flight: bool,
    /// An actor serves it now.
    pub live: bool,
}

impl ConversationSummary {
    /// `entry` from the index, with the state of its live actor if any.
    pub fn new(entry: IndexEntry, actor_state: Option<StateName>) -> ConversationSummary {
        let state = match actor_state {
            Some(state) => state.into(),
            None => match entry.status() {
                Status::Idle => ApiState::Idle,
                Status::Error => ApiState::Error,
                Status::TurnInFlight => ApiState::Recovering,
                Status::AwaitingInput => ApiState::AwaitingInput,
                Status::Completed => ApiState::Completed,
                Status::Failed => ApiState::Failed,
            },
        };
        ConversationSummary {
            id: entry.id.to_string(),
            state,
            cwd: entry.cwd,
            turns: entry.turns,
            parent: entry.parent.map(String::from),
            user_initiated: entry.user_initiated,
            created_at_ms: entry.created_at.as_millis(),
            last_activity_ms: entry.last_activity.as_millis(),
            last_seq: entry.last_seq,
            turn_in_flight: entry.turn_in_flight,
            live: actor_state.is_some(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConversationList {
    pub conversations: Vec<ConversationSummary>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// `GET /v1/conversations/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConversationDetail {
    pub id: String,
    pub state: ApiState,
    /// Why the conversation is in `error`.
    pub error: Option<String>,
    pub cwd: String,
    pub provider: ApiProvider,
    pub model: String,
    pub busy_policy: ApiBusyPolicy,
    /// Whether the file tools may reach paths outside `cwd`.
    pub tools_may_leave_cwd: bool,
    pub last_seq: u64,
    pub turn: u32,
    pub usage: ApiUsage,
    pub context_window: u64,
    /// The history as the model sees it.
    pub messages: Vec<ApiMessage>,
    /// Calls waiting on a human or a client.
    pub pending: Vec<ApiPendingCall>,
    /// Messages waiting for a turn (`busy_policy = queue`).
    pub queued: usize,
    pub parent: Option<String>,
    /// An actor serves it now (an evicted one is read from the store).
    pub live: bool,
    pub idle_ms: u64,
    pub subscribers: usize,
}

impl From<Inspection> for ConversationDetail {
    fn from(inspection: Inspection) -> ConversationDetail {
        ConversationDetail {
            id: inspection.id.to_string(),
            state: inspection.state.into(),
            error: inspection.error,
            cwd: inspection.cwd,
            provider: inspection.config.primary.provider.into(),
            model: inspection.config.primary.model,
            busy_policy: inspection.config.busy_policy.into(),
            tools_may_leave_cwd: inspection.config.tools_may_leave_cwd,
            last_seq: inspection.last_seq,
            turn: inspection.turn,
            usage: inspection.usage.into(),
            context_window: inspection.config.context_window,
            messages: inspection.messages.into_iter().map(Into::into).collect(),
            pending: all_pending(inspection.pending, inspection.child_pending),
            queued: inspection.queued,
            parent: inspection.parent.map(String::from),
            live: inspection.live,
            idle_ms: inspection.idle_ms,
            subscribers: inspection.subscribers,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct ApiUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

impl From<Usage> for ApiUsage {
    fn from(usage: Usage) -> ApiUsage {
        ApiUsage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cache_creation_input_tokens: usage.cache_creation_input_tokens,
            cache_read_input_tokens: usage.cache_read_input_tokens,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiMessage {
    pub role: ApiRole,
    pub content: Vec<ApiContent>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiRole {
    User,
    Assistant,
}

impl From<Message> for ApiMessage {
    fn from(message: Message) -> ApiMessage {
        ApiMessage {
            role: match message.role {
                Role::User => ApiRole::User,
                Role::Assistant => ApiRole::Assistant,
            },
            content: message.content.into_iter().map(Into::into).collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ApiContent {
    Text {
        text: String,
    },
    Thinking {
        text: String,
    },
    Image {
        image: ApiImage,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_call_id: String,
        content: String,
        is_error: bool,
    },
}

impl From<ContentBlock> for ApiContent {
    fn from(block: ContentBlock) -> ApiContent {
        match block {
            ContentBlock::Text { text } => ApiContent::Text { text },
            ContentBlock::Thinking { text, .. } => ApiContent::Thinking { text },
            ContentBlock::Image { image } => ApiContent::Image {
                image: image.into(),
            },
            ContentBlock::ToolUse { call } => tool_use(call),
            ContentBlock::ToolResult { result } => ApiContent::ToolResult {
                tool_call_id: result.tool_call_id.0,
                content: result.content,
                is_error: result.is_error,
            },
        }
    }
}

fn tool_use(call: ToolCall) -> ApiContent {
    ApiContent::ToolUse {
        id: call.id.0,
        name: call.name,
        input: call.input,
    }
}

impl From<AssistantBlock> for ApiContent {
    fn from(block: AssistantBlock) -> ApiContent {
        match block {
            AssistantBlock::Text { text } => ApiContent::Text { text },
            AssistantBlock::Thinking { text, .. } => ApiContent::Thinking { text },
            AssistantBlock::ToolUse { call } => tool_use(call),
        }
    }
}

/// An image stored by keel, named by the SHA-256 of its stored bytes.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiImage {
    pub hash: String,
    pub media_type: String,
    pub width: u32,
    pub height: u32,
    pub size: u64,
}

impl From<ImageRef> for ApiImage {
    fn from(image: ImageRef) -> ApiImage {
        ApiImage {
            hash: image.hash,
            media_type: image.media_type,
            width: image.width,
            height: image.height,
            size: image.size,
        }
    }
}

/// A tool call waiting on someone outside keel.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiPendingCall {
    pub tool_call_id: String,
    pub name: String,
    pub input: Value,
    pub kind: ApiPendingKind,
    /// The question, for `elicitation`.
    pub prompt: Option<String>,
    /// Set when a sub-agent of this conversation's running `spawn_agents`
    /// call waits on it: the sub-agent's id. It is resolved through this
    /// conversation all the same (`POST /v1/conversations/{id}/resolve`
    /// passes the decision on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiPendingKind {
    /// Approve or deny.
    Approval,
    /// Answer or deny.
    Elicitation,
    /// Answer with the tool's output, or deny.
    ClientExec,
}

impl From<PendingCall> for ApiPendingCall {
    fn from(pending: PendingCall) -> ApiPendingCall {
        ApiPendingCall {
            tool_call_id: pending.call.id.0,
            name: pending.call.name,
            input: pending.call.input,
            kind: match pending.kind {
                PendingKind::Approval => ApiPendingKind::Approval,
                PendingKind::Elicitation => ApiPendingKind::Elicitation,
                PendingKind::ClientExec => ApiPendingKind::ClientExec,
            },
            prompt: pending.prompt,
            conversation: None,
        }
    }
}

impl From<ChildPendingCall> for ApiPendingCall {
    fn from(waiting: ChildPendingCall) -> ApiPendingCall {
        ApiPendingCall {
            conversation: Some(waiting.child.to_string()),
            ..waiting.pending.into()
        }
    }
}

/// A conversation's pending calls as the API lists them: its own, then
/// those its sub-agents wait on.
fn all_pending(own: Vec<PendingCall>, children: Vec<ChildPendingCall>) -> Vec<ApiPendingCall> {
    own.into_iter()
        .map(ApiPendingCall::from)
        .chain(children.into_iter().map(ApiPendingCall::from))
        .collect()
}

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
    },
    Suspended {
        pending: Vec<ApiPendingCall>,
    },
    Resolved {
        tool_call_id: String,
        decision: ApiDecisionKind,
        text: Option<String>,
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
}

impl From<EventKind> for ApiEventKind {
    fn from(kind: EventKind) -> ApiEventKind {
        match kind {
            EventKind::Created {
                cwd,
                config,
                parent_conversation,
                user_initiated,
                ..
            } => ApiEventKind::Created {
                cwd,
                provider: config.primary.provider.into(),
                model: config.primary.model,
                parent_conversation: parent_conversation.map(String::from),
                user_initiated,
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
            } => ApiEventKind::ToolResult {
                tool_call_id: tool_call_id.0,
                content,
                is_error,
                synthetic,
            },
            EventKind::Suspended { pending } => ApiEventKind::Suspended {
                pending: pending.into_iter().map(Into::into).collect(),
            },
            EventKind::Resolved {
                tool_call_id,
                decision,
                by,
            } => {
                let (decision, text) = decision_parts(decision);
                ApiEventKind::Resolved {
                    tool_call_id: tool_call_id.0,
                    decision,
                    text,
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
            EventKind::Finished { outcome } => match outcome {
                Outcome::Completed { result } => ApiEventKind::Finished {
                    status: "completed".to_owned(),
                    detail: result,
                },
                Outcome::Failed { reason } => ApiEventKind::Finished {
                    status: "failed".to_owned(),
                    detail: reason,
                },
            },
        }
    }
}

fn decision_parts(decision: Decision) -> (ApiDecisionKind, Option<String>) {
    match decision {
        Decision::Approve => (ApiDecisionKind::Approve, None),
        Decision::Deny => (ApiDecisionKind::Deny, None),
        Decision::Answer { text } => (ApiDecisionKind::Answer, Some(text)),
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

impl From<View> for Snapshot {
    fn from(view: View) -> Snapshot {
        Snapshot {
            id: view.id.to_string(),
            state: view.state.into(),
            last_seq: view.last_seq,
            cwd: view.cwd,
            usage: view.usage.into(),
            pending: all_pending(view.pending, view.child_pending),
            recent_messages: view.recent_messages.into_iter().map(Into::into).collect(),
            omitted_messages: view.omitted_messages,
        }
    }
}

/// One live actor of `GET /admin/actors`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActorSummary {
    pub id: String,
    /// Its state; for an actor not responding, the state it was last seen in.
    pub state: ApiState,
    /// It answered. `false`: it has been on one message longer than the
    /// listing waits (a stuck store write, say); then `idle_ms` is how long
    /// it has been on it, and what only it can tell is null.
    pub responding: bool,
    /// Time since anything happened here (see `responding`).
    pub idle_ms: u64,
    /// Messages waiting in the actor's mailbox (an estimate).
    pub mailbox: usize,
    /// Estimated bytes of the actor's working set.
    pub memory_bytes: Option<u64>,
    pub subscribers: Option<usize>,
    /// Its working set is released (short-idle tier) until the next message.
    pub hibernated: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActorList {
    pub actors: Vec<ActorSummary>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}
