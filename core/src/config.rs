//! Per-conversation configuration. It is recorded in the `Created` event and
//! changed only by `ConfigChanged`, so replay always knows what was in force.
//!
//! Every field has a default and is read with `#[serde(default)]`: a field added
//! later leaves old logs readable.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::retry::RetryPolicy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// The Anthropic Messages API.
    Anthropic,
    /// Any OpenAI-compatible Chat Completions server.
    #[serde(rename = "openai")]
    OpenAi,
    /// keel's own fake provider server.
    Mock,
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::OpenAi => "openai",
            ProviderKind::Mock => "mock",
        })
    }
}

/// A provider and the model to ask there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRef {
    pub provider: ProviderKind,
    pub model: String,
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

/// What a user message does when a turn is already running, chosen per
/// conversation (docs/requirements.md, "Busy policies").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusyPolicy {
    /// Refuse with "agent is busy; cancel to interrupt", recording nothing:
    /// the simplest rule, with no hidden queue (REQ-BED-002).
    #[default]
    Reject,
    /// Interrupt the running turn and start a new one once 100 ms pass
    /// without another message (docs/requirements.md, "Interrupt with a
    /// 100 ms debounce").
    Interrupt,
    /// Keep the message (durably) and start a turn for it when this one ends.
    Queue,
}

/// What to do with a turn that was in flight when the process died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryPolicy {
    /// Re-run a turn that ended in a user message; re-dispatch dangling tool
    /// calls with their same `tool_call_id`, never asking the model again,
    /// which would repeat side effects (docs/requirements.md, "Recovery
    /// after a crash or restart").
    #[default]
    Resume,
    /// Rest in idle; dangling tool calls get synthetic "interrupted by restart"
    /// results, so the history stays valid for every provider.
    Idle,
}

/// How a tool call is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolPolicy {
    /// Runs as soon as its turn in the queue comes.
    #[default]
    Auto,
    /// Waits for a human to approve or deny it (pending kind `approval`).
    Approve,
    /// The client runs it and sends the result back (pending kind `client_exec`).
    Client,
    /// Never runs: it is not offered to the model, and a call of it anyway
    /// gets an error result saying so.
    Deny,
}

/// Compaction's default threshold: a prompt past 80% of the context window
/// is compacted before it is sent.
pub const DEFAULT_COMPACT_AT_PERCENT: u8 = 80;

/// The default cap on sub-agents per `spawn_agents` call, and the one the
/// tool's schema shows the model.
pub const DEFAULT_MAX_CHILDREN: u32 = 10;

/// Limits on sub-agents: how many one call may start (read in the parent)
/// and how long and how many turns each may take (read in the sub-agent,
/// which is created with its parent's configuration). Nobody watches a
/// sub-agent, so only these keep it from running forever
/// (docs/requirements.md, "Sub-agent rules").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SubAgentLimits {
    /// LLM requests a sub-agent may make before its one grace request.
    pub max_turns: u32,
    /// Mandatory wall-clock limit from creation to a submitted result.
    pub timeout_ms: u64,
    /// Most sub-agents one `spawn_agents` call may start; a call asking for
    /// more is refused with an error result the model can act on, so one
    /// request cannot set an unbounded amount of work in motion.
    pub max_children: u32,
}

impl Default for SubAgentLimits {
    fn default() -> Self {
        SubAgentLimits {
            max_turns: 20,
            timeout_ms: 10 * 60 * 1000,
            max_children: DEFAULT_MAX_CHILDREN,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConversationConfig {
    /// The system prompt.
    pub system: Option<String>,
    pub primary: ModelRef,
    /// Asked with the same request once the primary's retries are exhausted.
    pub fallback: Option<ModelRef>,
    /// Longest a whole LLM request may take before it counts as a
    /// (retryable) timeout; 0, the default, sets no limit. A slow model's
    /// long answer is healthy while it keeps streaming: the shell's connect,
    /// first-byte and idle clocks catch a provider that stops talking.
    pub request_timeout_ms: u64,
    pub busy_policy: BusyPolicy,
    pub recovery: RecoveryPolicy,
    pub retry: RetryPolicy,
    /// Policy per tool name; tools not listed run with [`ToolPolicy::Auto`].
    pub tools: BTreeMap<String, ToolPolicy>,
    /// The model's context window in tokens; warnings go out at 80% and 95%.
    pub context_window: u64,
    /// Compact the prompt before a request that would fill more than this
    /// share of the context window, in percent (docs/compaction.md); 0
    /// never compacts ahead (a provider's "too long" still does).
    pub compact_at_percent: u8,
    /// Most LLM requests one user turn may make; stops runaway tool loops.
    pub max_requests_per_turn: u32,
    /// Largest generation the model may produce per request.
    pub max_tokens: u32,
    pub sub_agent: SubAgentLimits,
    /// Whether the file tools (`read_file`, `write_file`, `edit_file`,
    /// `glob`, `grep`) may reach paths outside the working directory. False
    /// by default: a path that resolves outside it (`..`, an absolute path
    /// elsewhere, a symlink pointing out) is refused, so a model working on
    /// one project does not wander into the rest of the machine by mistake.
    /// It is not a sandbox: `bash` is not confined.
    pub tools_may_leave_cwd: bool,
    /// The daemon's MCP servers this conversation may use, by name
    /// (docs/mcp.md): their tools are offered as `mcp__{server}__{tool}`.
    pub mcp_servers: Vec<String>,
    /// Tools the client runs (an AG-UI frontend's tools, docs/ag-ui.md):
    /// offered to the model beside keel's own, and a call of one waits for
    /// the client's result (pending kind `client_exec`), as
    /// [`ToolPolicy::Client`] does. Left out of the encoding while empty,
    /// so configs recorded before it existed read and write the same.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<ClientTool>,
    /// What the processes and file tools of this conversation's calls may
    /// do (docs/sandbox.md); `None` is the runtime's default, which is also
    /// what a config recorded before the field existed reads as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxPolicy>,
}

/// How a conversation's tools are confined (docs/sandbox.md): where they
/// may write, and which network they may use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxPolicy {
    pub mode: SandboxMode,
    pub network: NetworkAccess,
}

/// Where a tool may write, by the names codex and its peers use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Nothing but its own temporary directory.
    ReadOnly,
    /// The working directory and its own temporary directory.
    #[default]
    WorkspaceWrite,
    /// No confinement at all, where the operator allows it.
    FullAccess,
}

/// Which network a confined tool may use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkAccess {
    /// No IP network (Unix sockets only).
    #[default]
    Off,
    /// Any host and port (but the daemon's own).
    All,
    /// TCP to these ports only, on any host.
    Ports(Vec<u16>),
    /// TCP to these hosts and ports only: the call gets a network of its
    /// own whose only way out is keel's proxy, which lets through what the
    /// list names (docs/sandbox.md, "A list of hosts").
    Hosts(Vec<HostPort>),
}

/// One entry of a network list that names hosts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HostPort {
    /// A DNS name (lowercase), an IP address, `*` (any host) or
    /// `*.example.com` (every name beneath `example.com`, not itself).
    pub host: String,
    pub port: u16,
}

impl HostPort {
    /// Whether a connection to `host` (a name or an address as a client
    /// gave it, IPv6 with or without brackets) and `port` is allowed by
    /// this entry. Names are compared as names: an entry naming
    /// `localhost` does not allow `127.0.0.1`, nor the reverse.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        if port != self.port {
            return false;
        }
        let Some(host) = normalized_host(host) else {
            return false;
        };
        if self.host == "*" {
            return true;
        }
        if let Some(parent) = self.host.strip_prefix("*.") {
            return host
                .strip_suffix(parent)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'));
        }
        host == self.host
    }

    /// Whether the host is this machine's loopback (`localhost`,
    /// `127.0.0.0/8`, `::1`), which a call reaches at the same address
    /// and port as outside, not only through the proxy.
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A host as entries keep it: lowercase, without brackets or a final dot,
/// an IP address in its canonical form; `None` if it is neither a name
/// nor an address.
fn normalized_host(host: &str) -> Option<String> {
    let host = host.trim();
    let host = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Some(ip.to_string());
    }
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
    };
    (!name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)).then_some(name)
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::ReadOnly => "read-only",
            SandboxMode::WorkspaceWrite => "workspace-write",
            SandboxMode::FullAccess => "full-access",
        }
    }
}

impl std::str::FromStr for SandboxMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "read-only" => Ok(SandboxMode::ReadOnly),
            "workspace-write" => Ok(SandboxMode::WorkspaceWrite),
            "full-access" => Ok(SandboxMode::FullAccess),
            other => Err(format!(
                "{other:?} is not a sandbox mode: give read-only, workspace-write or full-access"
            )),
        }
    }
}

impl NetworkAccess {
    /// `off`, `all`, or a list of `HOST:PORT` entries (a bare `PORT` is
    /// `*:PORT`). HOST is `*` (any host), a DNS name, `*.example.com` or an
    /// IP address (IPv6 in brackets). A list whose hosts are all `*` is
    /// [`NetworkAccess::Ports`], which the kernel's own rules enforce; one
    /// that names a host is [`NetworkAccess::Hosts`].
    pub fn parse_list<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let entries: Vec<&str> = entries
            .into_iter()
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .collect();
        match entries.as_slice() {
            [] | ["off"] => return Ok(NetworkAccess::Off),
            ["all"] => return Ok(NetworkAccess::All),
            _ => {}
        }
        let mut allowed = Vec::new();
        for entry in entries {
            let (host, port) = entry.rsplit_once(':').unwrap_or(("*", entry));
            let port = match port.parse::<u16>() {
                Ok(port) if port > 0 => port,
                _ => {
                    return Err(format!(
                        "network entry {entry:?}: {port:?} is not a port (1 to 65535); give \
                         HOST:PORT, \"all\" or \"off\""
                    ))
                }
            };
            let host = match host {
                "*" => "*".to_owned(),
                host if host.starts_with("*.") => {
                    match normalized_host(host.trim_start_matches("*.")) {
                        Some(parent) if parent.parse::<std::net::IpAddr>().is_err() => {
                            format!("*.{parent}")
                        }
                        _ => return Err(not_a_host(entry, host)),
                    }
                }
                host => normalized_host(host).ok_or_else(|| not_a_host(entry, host))?,
            };
            allowed.push(HostPort { host, port });
        }
        allowed.sort();
        allowed.dedup();
        if allowed.iter().all(|entry| entry.host == "*") {
            return Ok(NetworkAccess::Ports(
                allowed.iter().map(|entry| entry.port).collect(),
            ));
        }
        Ok(NetworkAccess::Hosts(allowed))
    }

    /// The entries as [`NetworkAccess::parse_list`] reads them.
    pub fn to_list(&self) -> Vec<String> {
        match self {
            NetworkAccess::Off => vec!["off".to_owned()],
            NetworkAccess::All => vec!["all".to_owned()],
            NetworkAccess::Ports(ports) => ports.iter().map(|port| format!("*:{port}")).collect(),
            NetworkAccess::Hosts(allowed) => allowed.iter().map(HostPort::to_string).collect(),
        }
    }
}

fn not_a_host(entry: &str, host: &str) -> String {
    format!(
        "network entry {entry:?}: {host:?} is not a host; give a DNS name, *.NAME, an IP \
         address ([::1] for IPv6) or * for any host"
    )
}

/// A tool that exists only in the client: keel offers it to the model and
/// hands its calls to the client, which answers with the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientTool {
    pub name: String,
    pub description: String,
    /// JSON Schema of the tool's input object, as the client gave it.
    pub input_schema: serde_json::Value,
}

impl Default for ConversationConfig {
    fn default() -> Self {
        ConversationConfig {
            system: None,
            primary: ModelRef {
                provider: ProviderKind::Mock,
                model: "mock".to_owned(),
            },
            fallback: None,
            request_timeout_ms: 0,
            busy_policy: BusyPolicy::default(),
            recovery: RecoveryPolicy::default(),
            retry: RetryPolicy::default(),
            tools: BTreeMap::new(),
            context_window: 200_000,
            compact_at_percent: DEFAULT_COMPACT_AT_PERCENT,
            max_requests_per_turn: 50,
            max_tokens: 8192,
            sub_agent: SubAgentLimits::default(),
            tools_may_leave_cwd: false,
            mcp_servers: Vec::new(),
            client_tools: Vec::new(),
            sandbox: None,
        }
    }
}

impl ConversationConfig {
    /// How a call of `tool_name` is carried out: its policy if one is set;
    /// else [`ToolPolicy::Client`] for a client's tool, which only the
    /// client can run; else [`ToolPolicy::Auto`].
    pub fn tool_policy(&self, tool_name: &str) -> ToolPolicy {
        if let Some(policy) = self.tools.get(tool_name) {
            return *policy;
        }
        if self.client_tools.iter().any(|tool| tool.name == tool_name) {
            return ToolPolicy::Client;
        }
        ToolPolicy::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Logs written before a field existed still decode, with the field's
    /// default: in JSON (record version 1) and in named MessagePack
    /// (version 2 and checkpoints).
    #[test]
    fn a_config_recorded_before_tools_may_leave_cwd_reads_as_confined() {
        let mut old = serde_json::to_value(ConversationConfig::default()).unwrap();
        old.as_object_mut().unwrap().remove("tools_may_leave_cwd");
        let from_json: ConversationConfig = serde_json::from_value(old.clone()).unwrap();
        assert!(!from_json.tools_may_leave_cwd);
        let packed = rmp_serde::to_vec_named(&old).unwrap();
        let from_msgpack: ConversationConfig = rmp_serde::from_slice(&packed).unwrap();
        assert_eq!(from_msgpack, ConversationConfig::default());
    }

    /// A client's tool is run by the client unless a policy says otherwise;
    /// an empty list leaves the encoding as it was before the field existed.
    #[test]
    fn a_client_tool_waits_for_the_client_and_an_empty_list_is_not_written() {
        let encoded = serde_json::to_value(ConversationConfig::default()).unwrap();
        assert!(encoded.get("client_tools").is_none(), "{encoded}");
        let mut config = ConversationConfig {
            client_tools: vec![ClientTool {
                name: "confirm_order".to_owned(),
                description: "Ask the user to confirm".to_owned(),
                input_schema: serde_json::json!({"type": "object"}),
            }],
            ..ConversationConfig::default()
        };
        assert_eq!(config.tool_policy("confirm_order"), ToolPolicy::Client);
        assert_eq!(config.tool_policy("bash"), ToolPolicy::Auto);
        config
            .tools
            .insert("confirm_order".to_owned(), ToolPolicy::Deny);
        assert_eq!(config.tool_policy("confirm_order"), ToolPolicy::Deny);
        let packed = rmp_serde::to_vec_named(&config).unwrap();
        let read: ConversationConfig = rmp_serde::from_slice(&packed).unwrap();
        assert_eq!(read, config);
    }

    /// A config recorded before the sandbox existed reads as "the
    /// runtime's default", and none is written until one is set.
    #[test]
    fn a_config_without_a_sandbox_reads_as_the_default_and_writes_none() {
        let encoded = serde_json::to_value(ConversationConfig::default()).unwrap();
        assert!(encoded.get("sandbox").is_none(), "{encoded}");
        let config: ConversationConfig = serde_json::from_value(encoded).unwrap();
        assert_eq!(config.sandbox, None);
        let set = ConversationConfig {
            sandbox: Some(SandboxPolicy {
                mode: SandboxMode::ReadOnly,
                network: NetworkAccess::Ports(vec![443]),
            }),
            ..ConversationConfig::default()
        };
        let packed = rmp_serde::to_vec_named(&set).unwrap();
        let back: ConversationConfig = rmp_serde::from_slice(&packed).unwrap();
        assert_eq!(back, set);
    }

    #[test]
    fn network_lists_read_ports_and_hosts() {
        assert_eq!(NetworkAccess::parse_list(["off"]), Ok(NetworkAccess::Off));
        assert_eq!(NetworkAccess::parse_list([]), Ok(NetworkAccess::Off));
        assert_eq!(NetworkAccess::parse_list(["all"]), Ok(NetworkAccess::All));
        assert_eq!(
            NetworkAccess::parse_list(["*:443", " 80 ", "*:443"]),
            Ok(NetworkAccess::Ports(vec![80, 443]))
        );
        for bad in [
            "*:0",
            "*:70000",
            "*:http",
            "somewhere",
            "exa mple.com:443",
            "-bad.com:443",
            "a..b:443",
            "*.1.2.3.4:80",
            "**:80",
            "http://example.com:443",
        ] {
            assert!(NetworkAccess::parse_list([bad]).is_err(), "{bad}");
        }
        let hosts = NetworkAccess::parse_list([
            "GitHub.com:443",
            "*:22",
            "[::1]:8080",
            "127.0.0.1:80",
            "*.pypi.org.:443",
            "github.com:443",
        ])
        .unwrap();
        let NetworkAccess::Hosts(allowed) = &hosts else {
            panic!("{hosts:?}");
        };
        let entry = |host: &str, port| HostPort {
            host: host.to_owned(),
            port,
        };
        assert_eq!(
            allowed,
            &[
                entry("*", 22),
                entry("*.pypi.org", 443),
                entry("127.0.0.1", 80),
                entry("::1", 8080),
                entry("github.com", 443),
            ]
        );
        assert_eq!(
            hosts.to_list(),
            [
                "*:22",
                "*.pypi.org:443",
                "127.0.0.1:80",
                "[::1]:8080",
                "github.com:443"
            ]
        );
        assert_eq!(
            NetworkAccess::parse_list(hosts.to_list().iter().map(String::as_str)),
            Ok(hosts.clone())
        );
        let ports = NetworkAccess::Ports(vec![80, 443]);
        let list = ports.to_list();
        assert_eq!(
            NetworkAccess::parse_list(list.iter().map(String::as_str)),
            Ok(ports)
        );
        for mode in [
            SandboxMode::ReadOnly,
            SandboxMode::WorkspaceWrite,
            SandboxMode::FullAccess,
        ] {
            assert_eq!(mode.as_str().parse::<SandboxMode>(), Ok(mode));
        }
    }

    #[test]
    fn a_host_entry_allows_its_host_and_port_only() {
        let entry = |host: &str, port| HostPort {
            host: host.to_owned(),
            port,
        };
        let github = entry("github.com", 443);
        assert!(github.allows("github.com", 443));
        assert!(github.allows("GitHub.COM.", 443));
        assert!(!github.allows("github.com", 80));
        assert!(!github.allows("api.github.com", 443));
        assert!(!github.allows("evilgithub.com", 443));
        assert!(!github.allows("github.com.evil.org", 443));
        let any = entry("*", 22);
        assert!(any.allows("anything.example", 22));
        assert!(!any.allows("anything.example", 23));
        assert!(!any.allows("not a host", 22));
        let below = entry("*.pypi.org", 443);
        assert!(below.allows("files.pypi.org", 443));
        assert!(below.allows("a.b.pypi.org", 443));
        assert!(!below.allows("pypi.org", 443));
        assert!(!below.allows("xpypi.org", 443));
        let v6 = entry("::1", 8080);
        assert!(v6.allows("[::1]", 8080));
        assert!(v6.allows("0:0:0:0:0:0:0:1", 8080));
        assert!(!v6.allows("127.0.0.1", 8080));
        assert!(entry("localhost", 1).is_loopback());
        assert!(entry("127.0.0.2", 1).is_loopback());
        assert!(entry("::1", 1).is_loopback());
        assert!(!entry("github.com", 1).is_loopback());
        assert!(!entry("*", 1).is_loopback());
    }
}
