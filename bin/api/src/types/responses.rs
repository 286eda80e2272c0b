//! What the daemon answers on its JSON routes: errors, conversations,
//! messages, pending calls and admin listings, converted from keel-core's
//! types by hand (the `From` impls) so either side can change alone.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use keel_core::event::{PendingCall, PendingKind};
use keel_core::live::ChildPendingCall;
use keel_core::message::{AssistantBlock, ContentBlock, ImageRef, Message, Role, ToolCall, Usage};
use keel_core::state::StateName;

use super::requests::*;
use crate::ErrorCode;

/// Every error: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable: `bad_request`, `not_found`, `busy`, …
    #[schema(value_type = String, example = "busy")]
    pub code: ErrorCode,
    /// For a person: what went wrong and what to do.
    pub message: String,
    /// With `busy` only: the state the conversation is busy in
    /// (`streaming`, `executing_tools`, …), so a client need not read it
    /// out of `message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
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

/// What `DELETE /v1/conversations/{id}` removed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeletedConversation {
    /// The conversations deleted: its sub-agents, then it.
    pub deleted: Vec<String>,
    /// Events removed from their logs.
    pub events: u64,
    /// Image blobs removed with them (no other conversation names them).
    pub blobs_removed: usize,
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
    /// A compaction asked for is under way; no turn runs.
    Compacting,
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
            StateName::Compacting => ApiState::Compacting,
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
    /// How its tools are confined now (docs/sandbox.md): its own setting
    /// or the daemon's default.
    #[serde(default)]
    pub sandbox: Option<ApiSandboxState>,
    pub last_seq: u64,
    pub turn: u32,
    pub usage: ApiUsage,
    /// The prompt's estimated tokens now: what decides when it is
    /// compacted (the provider's count of the latest request, `usage`, when
    /// that is larger).
    #[serde(default)]
    pub context_tokens: u64,
    /// The latest compaction: the prompt before and after it.
    #[serde(default)]
    pub last_compaction: Option<ApiCompaction>,
    /// Set for a fork: where its history came from.
    #[serde(default)]
    pub forked_from: Option<ApiForkOrigin>,
    /// The MCP servers it may use, and what each is doing now.
    #[serde(default)]
    pub mcp_servers: Vec<ApiMcpServerState>,
    pub context_window: u64,
    /// The percentage of the context window past which the prompt is
    /// compacted before it is sent; 0: only when a provider refuses it.
    pub compact_at_percent: u8,
    /// Largest generation the model may produce per request.
    pub max_tokens: u32,
    /// The system prompt.
    pub system: Option<String>,
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
        /// Images that came with the result; absent when there are none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ApiImage>,
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
                images: result.images.into_iter().map(Into::into).collect(),
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
pub fn all_pending(own: Vec<PendingCall>, children: Vec<ChildPendingCall>) -> Vec<ApiPendingCall> {
    own.into_iter()
        .map(ApiPendingCall::from)
        .chain(children.into_iter().map(ApiPendingCall::from))
        .collect()
}

/// `GET /admin/nodes`: the nodes sharing this daemon's PostgreSQL
/// database (docs/nodes.md). Empty, with `this_node` null, for a daemon
/// that is not a node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    /// The node that answered.
    pub this_node: Option<String>,
    /// How long a node not heard from keeps its conversations.
    pub lease_ms: Option<u64>,
    pub nodes: Vec<NodeSummary>,
}

/// `GET /admin/conversations/{id}/writers`: which node, under which
/// epoch, appended which seqs of the conversation (docs/nodes.md). Empty
/// for a daemon that is not a node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WriterList {
    pub writers: Vec<WriterSummary>,
}

/// One node's appends to a conversation under one epoch.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WriterSummary {
    pub node: String,
    pub epoch: i64,
    pub first_seq: u64,
    pub last_seq: u64,
}

/// One node of `GET /admin/nodes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeSummary {
    pub node: String,
    /// Where the other nodes reach its API.
    pub url: Option<String>,
    /// The epoch its current process writes under.
    pub epoch: i64,
    /// Heard from within the lease, and not fenced.
    pub live: bool,
    /// Another node fenced it off after its lease ran out: it writes
    /// nothing until it starts again.
    pub fenced: bool,
    /// Since its last heartbeat, by PostgreSQL's clock.
    pub heartbeat_age_ms: u64,
    /// Conversation trees (a conversation with its sub-agents) it owns.
    pub owns: i64,
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

/// `POST /v1/conversations/{id}/compact`: the compaction is under way.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CompactAccepted {
    /// `compacting`; the `compacted` event (or a `compaction_failed` live
    /// event, which leaves the prompt as it was) follows on the stream.
    pub state: ApiState,
}

/// `POST /v1/conversations/{id}/fork`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ForkedConversation {
    /// The new conversation.
    pub id: String,
    pub forked_from: ApiForkOrigin,
}

/// `POST /v1/conversations/{id}/rewind`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RewoundConversation {
    pub to_seq: u64,
    /// The state it rests in afterwards.
    pub state: ApiState,
}

/// The latest compaction of a conversation (`GET /v1/conversations/{id}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiCompaction {
    /// The seq of its `compacted` event.
    pub seq: u64,
    /// The last seq the summary stands for.
    pub through_seq: u64,
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// False when the messages were left out without a summary.
    pub summarised: bool,
}

impl From<keel_core::reducer::CompactionRecord> for ApiCompaction {
    fn from(record: keel_core::reducer::CompactionRecord) -> ApiCompaction {
        ApiCompaction {
            seq: record.seq,
            through_seq: record.through_seq,
            tokens_before: record.tokens_before,
            tokens_after: record.tokens_after,
            summarised: record.summarised,
        }
    }
}

/// `POST /admin/reclaim`: what the store gave back to the disk.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReclaimedSpace {
    /// `compacted` (redb rewrote its file without the freed space),
    /// `by_itself` (sled frees segments on its own; nothing to ask) or
    /// `in_memory` (no files).
    pub action: String,
    /// The store's files on disk before and after, in bytes; null without
    /// files.
    pub disk_bytes_before: Option<u64>,
    pub disk_bytes_after: Option<u64>,
    /// How long writes waited.
    pub took_ms: u64,
}

/// `GET /admin/mcp`: the daemon's MCP servers (docs/mcp.md).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct McpServerList {
    pub servers: Vec<ApiMcpServer>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiMcpServer {
    pub name: String,
    /// `stdio` or `http`.
    pub transport: String,
    /// `idle` (not started yet), `ready` or `failed`.
    pub state: String,
    /// Why it failed last.
    pub error: Option<String>,
    /// Its tools, by the names the model sees (`mcp__{server}__{tool}`).
    pub tools: Vec<String>,
    /// Tools left out, and why (a name or schema a provider would refuse).
    pub problems: Vec<String>,
}

/// An MCP server a conversation uses, and its state (`idle`, `ready`,
/// `failed`, or `unknown` for one the daemon no longer has).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiMcpServerState {
    pub name: String,
    pub state: String,
}

/// Where a fork's history came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiForkOrigin {
    pub conversation: String,
    /// The last seq of the source's log the fork copied.
    pub seq: u64,
}

impl From<keel_core::event::ForkOrigin> for ApiForkOrigin {
    fn from(origin: keel_core::event::ForkOrigin) -> ApiForkOrigin {
        ApiForkOrigin {
            conversation: origin.conversation.into(),
            seq: origin.seq,
        }
    }
}

/// A conversation's sandbox as it applies (docs/sandbox.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiSandboxState {
    pub mode: super::requests::ApiSandboxMode,
    /// `"off"`, `"all"`, or a list of `"HOST:PORT"` (HOST `*`: any host).
    pub network: super::requests::ApiNetwork,
    /// Whether it is the daemon's default rather than the conversation's
    /// own setting.
    pub default: bool,
}
