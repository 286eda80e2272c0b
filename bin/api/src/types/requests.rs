//! What clients send: the bodies of the API's POST routes and the enums
//! they name, with their conversions into keel-core's configuration types.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use std::collections::BTreeMap;

use keel_core::config::{BusyPolicy, NetworkAccess, ProviderKind, SandboxMode, ToolPolicy};

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
    /// for a human's approve or deny), `client` (the client runs it and
    /// answers) or `deny` (never offered, never run). MCP tools go by
    /// their full names, `mcp__{server}__{tool}`.
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
    /// The model's context window in tokens (200,000 when left out):
    /// usage warnings and compaction are measured against it.
    pub context_window: Option<u64>,
    /// Compact the prompt before a request that would fill more than this
    /// percentage of the context window (80 when left out; 0: only when a
    /// provider refuses the prompt as too long).
    pub compact_at_percent: Option<u8>,
    /// The daemon's MCP servers this conversation may use (docs/mcp.md);
    /// their tools are offered as `mcp__{server}__{tool}`.
    #[serde(default)]
    pub mcp_servers: Vec<String>,
    /// How its tools are confined (docs/sandbox.md); what is left out is
    /// the daemon's default (`KEEL_SANDBOX`, `KEEL_SANDBOX_NETWORK`).
    pub sandbox: Option<ApiSandbox>,
}

/// `PATCH /v1/conversations/{id}`: the settings a conversation may change
/// after creation. Fields left out keep their values; each is checked as
/// at creation, and the change is recorded in the log (`config_changed`)
/// and applies from the next LLM request.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateConversation {
    /// The system prompt; an empty string removes it.
    pub system: Option<String>,
    pub busy_policy: Option<ApiBusyPolicy>,
    /// Replaces the per-tool policies as a whole.
    pub tools: Option<BTreeMap<String, ApiToolPolicy>>,
    /// Replaces the retry policy (fields left out: keel's defaults).
    pub retry: Option<ApiRetry>,
    /// 0: no limit.
    pub request_timeout_ms: Option<u64>,
    pub context_window: Option<u64>,
    pub compact_at_percent: Option<u8>,
    /// Largest generation the model may produce per request.
    pub max_tokens: Option<u32>,
    /// How its tools are confined from the next call on (docs/sandbox.md);
    /// what is left out keeps its value.
    pub sandbox: Option<ApiSandbox>,
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

/// A conversation's sandbox as a request gives it (docs/sandbox.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiSandbox {
    /// `read-only`, `workspace-write` (keel's default) or `full-access`
    /// (only where the daemon allows it: `KEEL_SANDBOX_FULL_ACCESS=allow`).
    pub mode: Option<ApiSandboxMode>,
    /// `"off"` (keel's default), `"all"` (every host and port but the
    /// daemon's own), or a list of `"HOST:PORT"` (TCP to those only; HOST
    /// `*` for any host).
    pub network: Option<ApiNetwork>,
}

/// Where a conversation's tools may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ApiSandboxMode {
    ReadOnly,
    WorkspaceWrite,
    FullAccess,
}

impl From<ApiSandboxMode> for SandboxMode {
    fn from(mode: ApiSandboxMode) -> SandboxMode {
        match mode {
            ApiSandboxMode::ReadOnly => SandboxMode::ReadOnly,
            ApiSandboxMode::WorkspaceWrite => SandboxMode::WorkspaceWrite,
            ApiSandboxMode::FullAccess => SandboxMode::FullAccess,
        }
    }
}

impl From<SandboxMode> for ApiSandboxMode {
    fn from(mode: SandboxMode) -> ApiSandboxMode {
        match mode {
            SandboxMode::ReadOnly => ApiSandboxMode::ReadOnly,
            SandboxMode::WorkspaceWrite => ApiSandboxMode::WorkspaceWrite,
            SandboxMode::FullAccess => ApiSandboxMode::FullAccess,
        }
    }
}

/// The network a conversation's tools may use: `"off"`, `"all"`, or a
/// list of `"HOST:PORT"` (HOST `*` for any host, a DNS name, `*.NAME` or
/// an IP address).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ApiNetwork {
    One(String),
    List(Vec<String>),
}

impl ApiNetwork {
    /// The network as keel-core keeps it, or why this one is refused.
    pub fn to_core(&self) -> Result<NetworkAccess, String> {
        match self {
            ApiNetwork::One(one) => NetworkAccess::parse_list([one.as_str()]),
            ApiNetwork::List(list) if list.is_empty() => Ok(NetworkAccess::Off),
            ApiNetwork::List(list) => {
                if list.iter().any(|entry| entry == "off" || entry == "all") {
                    return Err(format!(
                        "network {list:?}: give \"off\" or \"all\" alone, or a list of \"HOST:PORT\""
                    ));
                }
                NetworkAccess::parse_list(list.iter().map(String::as_str))
            }
        }
    }

    pub fn from_core(network: &NetworkAccess) -> ApiNetwork {
        match network {
            NetworkAccess::Off => ApiNetwork::One("off".to_owned()),
            NetworkAccess::All => ApiNetwork::One("all".to_owned()),
            NetworkAccess::Ports(_) | NetworkAccess::Hosts(_) => {
                ApiNetwork::List(network.to_list())
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiToolPolicy {
    Auto,
    Approve,
    Client,
    /// Never offered to the model; a call of it anyway is refused.
    Deny,
}

impl From<ApiToolPolicy> for ToolPolicy {
    fn from(policy: ApiToolPolicy) -> ToolPolicy {
        match policy {
            ApiToolPolicy::Auto => ToolPolicy::Auto,
            ApiToolPolicy::Approve => ToolPolicy::Approve,
            ApiToolPolicy::Client => ToolPolicy::Client,
            ApiToolPolicy::Deny => ToolPolicy::Deny,
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
    /// The input the call runs with instead of the model's (`decision =
    /// edit`, an approval only): an object its tool's schema takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Value>,
    /// Who decided, recorded in the log.
    pub by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiDecisionKind {
    Approve,
    /// Approve with a changed input (`input`).
    Edit,
    Deny,
    Answer,
}

/// `POST /v1/conversations/{id}/fork`: a new conversation whose history is
/// this one's up to `at_seq` (docs/history.md). The body may be left out.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The last seq to copy: a turn boundary (the end of a turn, or seq 1).
    /// The end of the log when left out.
    #[serde(default)]
    pub at_seq: Option<u64>,
}

/// `POST /v1/conversations/{id}/rewind`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindRequest {
    /// The seq to rewind to: a turn boundary before the end of the log.
    pub to_seq: u64,
}
