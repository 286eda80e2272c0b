//! MCP servers as a tool source (docs/mcp.md), through the official SDK
//! (`rmcp`). The daemon names its servers ([`McpServerConfig`]); a
//! conversation names the ones it may use (`ConversationConfig::mcp_servers`)
//! and is offered their tools as `mcp__{server}__{tool}`.
//!
//! One [`McpHub`] per runtime holds a slot per server. A server is started
//! (stdio) or connected (streamable HTTP) when a conversation first needs
//! it, and shared by every conversation that uses it. Its tools are listed
//! then and listed again on its `tools/list_changed`; a tool whose name or
//! schema a provider would refuse is left out and said so
//! ([`McpServerStatus::problems`]). A call runs as keel's own tools do, in
//! a `ToolActor`, its input checked against the server's schema first;
//! cancelling it drops the call's future, and rmcp then tells the server
//! (`notifications/cancelled`, and for HTTP the request's stream closes).
//!
//! A stdio server runs in a process group of its own, recorded in the
//! runtime's process ledger so that a daemon that crashed kills it at its
//! next start; the SDK kills only its direct child, so when a server ends
//! keel kills the whole group (no `npx`/`uvx` grandchildren stay behind).
//! A server that died makes its in-flight call an error result naming it
//! and what it last printed; the next call starts it again, no sooner than
//! a backoff after the last failure.

use base64::Engine as _;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use keel_core::ids::ConversationId;
use keel_core::wire::ToolSpec;
use rmcp::handler::client::progress::ProgressDispatcher;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientCapabilities, ClientConfig, ClientRequest, ContentBlock, Implementation,
    ProgressNotificationParam, ProtocolVersion, RequestId, ResourceContents, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, oneshot};

use crate::image::ImageUpload;
use crate::process_group::ProcessLedger;
use crate::tool::{schema::Checked, Tool, ToolContext, ToolOutcome};
use crate::tool_sandbox::{CallSandbox, Prepared, ToolSandbox};
use keel_core::config::SandboxPolicy;

/// How a tool of an MCP server is named to the model.
pub const PREFIX: &str = "mcp__";

/// Longest a server may take to start and answer `initialize` and
/// `tools/list`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The first wait before a server that failed is started again; it doubles
/// up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How many of a server's last stderr lines are kept, for the error result
/// of a call it died in.
const STDERR_LINES: usize = 20;

/// How long a server's process group gets after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// One MCP server, as the daemon's configuration names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpServerConfig {
    /// A local server speaking MCP over its stdin and stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
        /// One server process per conversation that uses it, stopped with
        /// the conversation's actor, instead of one shared by all.
        per_conversation: bool,
        /// Confine the server as a tool's process is (docs/sandbox.md),
        /// writing in `cwd` (the daemon's when not given); `None` runs it
        /// as the daemon's user, with the daemon's environment.
        sandbox: Option<SandboxPolicy>,
    },
    /// A remote server over streamable HTTP.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
        /// The bearer token (already read from its environment variable:
        /// never written to the log or shown).
        bearer_token: Option<String>,
    },
}

/// Whether `name` may name a server: what a provider accepts in a tool
/// name (`mcp__{server}__{tool}` must be letters, digits, `_` and `-`, at
/// most 64 characters), without `__`, which separates the parts.
pub fn valid_server_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 32 {
        return Err(format!(
            "MCP server name {name:?} must be 1 to 32 characters"
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        || name.contains("__")
    {
        return Err(format!(
            "MCP server name {name:?} may hold only letters, digits, '-' and single '_'"
        ));
    }
    Ok(())
}

/// `(server, tool)` of a tool name offered to the model, if it is an MCP
/// tool's.
pub fn split_name(full: &str) -> Option<(&str, &str)> {
    full.strip_prefix(PREFIX)?.split_once("__")
}

/// What a server is doing, for `keel inspect`, `keel mcp ls` and the API.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct McpServerStatus {
    pub name: String,
    /// `stdio` or `http`.
    pub transport: &'static str,
    /// `idle` (not started yet), `ready`, `failed`.
    pub state: &'static str,
    /// Why it failed last, when it did.
    pub error: Option<String>,
    /// The tools offered, by their full names.
    pub tools: Vec<String>,
    /// Tools left out, and why (a name or schema a provider would refuse).
    pub problems: Vec<String>,
}

/// Every configured MCP server of a runtime.
pub struct McpHub {
    servers: BTreeMap<String, Arc<Server>>,
    /// The servers started for one conversation (`per_conversation`).
    private: Mutex<BTreeMap<(String, ConversationId), Arc<Server>>>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.servers.keys()).finish()
    }
}

struct Server {
    name: String,
    config: McpServerConfig,
    ledger: Option<Arc<ProcessLedger>>,
    sandbox: Arc<ToolSandbox>,
    slot: tokio::sync::Mutex<Slot>,
    /// The latest tool list and state, readable without the slot's lock.
    seen: Mutex<Seen>,
}

#[derive(Default, Clone)]
struct Seen {
    tools: Option<Arc<ToolSet>>,
    error: Option<String>,
}

enum Slot {
    Idle,
    Ready(Arc<Connection>),
    Failed {
        error: String,
        at: Instant,
        backoff: Duration,
    },
}

/// A running server.
struct Connection {
    peer: Peer<RoleClient>,
    /// A stdio server's process group.
    pgid: Option<u32>,
    /// Dropped (or sent) to stop the server.
    _stop: oneshot::Sender<()>,
}

/// A server's tools as offered.
struct ToolSet {
    specs: Arc<[ToolSpec]>,
    /// By full name, each wrapped in its schema check.
    tools: BTreeMap<String, Arc<dyn Tool>>,
    problems: Vec<String>,
}

impl McpHub {
    pub fn new(
        configs: BTreeMap<String, McpServerConfig>,
        ledger: Option<Arc<ProcessLedger>>,
        sandbox: Arc<ToolSandbox>,
    ) -> McpHub {
        let servers = configs
            .into_iter()
            .map(|(name, config)| {
                crate::metrics::register_mcp_server(&name);
                let server = Server {
                    name: name.clone(),
                    config,
                    ledger: ledger.clone(),
                    sandbox: sandbox.clone(),
                    slot: tokio::sync::Mutex::new(Slot::Idle),
                    seen: Mutex::new(Seen::default()),
                };
                (name, Arc::new(server))
            })
            .collect();
        McpHub {
            servers,
            private: Mutex::new(BTreeMap::new()),
        }
    }

    /// The server named `name` as `conversation` uses it: the shared one,
    /// or its own when the server runs one per conversation.
    fn server_for(&self, name: &str, conversation: &ConversationId) -> Option<Arc<Server>> {
        let server = self.servers.get(name)?;
        if !server.per_conversation() {
            return Some(server.clone());
        }
        let mut private = self
            .private
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let own = private
            .entry((name.to_owned(), conversation.clone()))
            .or_insert_with(|| {
                Arc::new(Server {
                    name: server.name.clone(),
                    config: server.config.clone(),
                    ledger: server.ledger.clone(),
                    sandbox: server.sandbox.clone(),
                    slot: tokio::sync::Mutex::new(Slot::Idle),
                    seen: Mutex::new(Seen::default()),
                })
            });
        Some(own.clone())
    }

    /// `conversation`'s actor stopped: the servers started for it alone
    /// stop too. They leave the hub at once (a conversation started again
    /// right away starts its own anew); they stop in the background.
    pub fn release(&self, conversation: &ConversationId) {
        let own: Vec<Arc<Server>> = {
            let mut private = self
                .private
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let keys: Vec<(String, ConversationId)> = private
                .keys()
                .filter(|(_, owner)| owner == conversation)
                .cloned()
                .collect();
            keys.iter().filter_map(|key| private.remove(key)).collect()
        };
        if own.is_empty() {
            return;
        }
        tokio::spawn(async move {
            for server in own {
                *server.slot.lock().await = Slot::Idle;
            }
        });
    }

    /// The configured servers' names.
    pub fn names(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }

    pub fn has(&self, name: &str) -> bool {
        self.servers.contains_key(name)
    }

    /// What each server is doing.
    pub fn statuses(&self) -> Vec<McpServerStatus> {
        self.servers
            .values()
            .map(|server| server.status())
            .collect()
    }

    /// The tools of `servers` to offer the model, each server started if it
    /// is not running. A server that cannot start is logged and its tools
    /// left out: the turn goes on without them.
    pub async fn specs(&self, servers: &[String], conversation: &ConversationId) -> Vec<ToolSpec> {
        let mut specs = Vec::new();
        for name in servers {
            let Some(server) = self.server_for(name, conversation) else {
                continue;
            };
            match server.connect().await {
                Ok(tools) => specs.extend(tools.specs.iter().cloned()),
                Err(error) => {
                    tracing::warn!(server = %name, %error, "MCP server unavailable; its tools are not offered")
                }
            }
        }
        specs
    }

    /// The tool a call of `full_name` runs, for a conversation that may
    /// use `servers`; `Err` says why there is none.
    pub async fn tool(
        &self,
        full_name: &str,
        servers: &[String],
        conversation: &ConversationId,
    ) -> Result<Arc<dyn Tool>, String> {
        let Some((server_name, _)) = split_name(full_name) else {
            return Err(format!("{full_name} is not an MCP tool"));
        };
        if !servers.iter().any(|allowed| allowed == server_name) {
            return Err(format!(
                "this conversation may not use the MCP server {server_name:?}"
            ));
        }
        let server = self
            .server_for(server_name, conversation)
            .ok_or_else(|| format!("no MCP server is named {server_name:?}"))?;
        let tools = server.connect().await?;
        tools.tools.get(full_name).cloned().ok_or_else(|| {
            format!(
                "the MCP server {server_name:?} has no tool {full_name:?}; it offers: {}",
                tools.tools.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// Start every server now and list its tools, so that a server that
    /// cannot start, or offers tools a provider would refuse, is said at
    /// the daemon's start (logged, and in [`statuses`](Self::statuses))
    /// rather than at the first request that needs it.
    pub async fn probe(&self) {
        for server in self
            .servers
            .values()
            .filter(|server| !server.per_conversation())
        {
            if let Ok(tools) = server.connect().await {
                for problem in &tools.problems {
                    tracing::warn!(server = %server.name, %problem, "MCP tool left out");
                }
            }
        }
    }

    /// Stop every server (the runtime stops): each process group gets
    /// SIGTERM, then SIGKILL if it is still there after a grace.
    pub async fn shutdown(&self) {
        let mut groups = Vec::new();
        let private: Vec<Arc<Server>> = std::mem::take(
            &mut *self
                .private
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
        .into_values()
        .collect();
        for server in self.servers.values().chain(private.iter()) {
            let mut slot = server.slot.lock().await;
            if let Slot::Ready(connection) = &*slot {
                if let Some(pgid) = connection.pgid {
                    groups.push((pgid, server.ledger.clone()));
                }
            }
            *slot = Slot::Idle;
        }
        for (pgid, _) in &groups {
            signal_group(*pgid, nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = Instant::now() + TERM_GRACE;
        while Instant::now() < deadline
            && groups
                .iter()
                .any(|(pgid, _)| crate::process_group::group_exists(*pgid))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (pgid, ledger) in groups {
            signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
            if let Some(ledger) = ledger {
                let _ = ledger.remove(pgid);
            }
        }
    }
}

impl Server {
    /// What a stdio server confined by `policy` runs with: its
    /// confinement, its environment (the daemon's without its secrets,
    /// then `env`) and a private temporary directory.
    fn confine(
        &self,
        policy: &SandboxPolicy,
        cwd: Option<&std::path::Path>,
        env: &BTreeMap<String, String>,
    ) -> Result<Prepared, String> {
        let cwd = match cwd {
            Some(cwd) => cwd.to_owned(),
            None => std::env::current_dir().map_err(|error| {
                format!("MCP server {:?}: no working directory: {error}", self.name)
            })?,
        };
        let extra: Vec<(std::ffi::OsString, std::ffi::OsString)> = env
            .iter()
            .map(|(name, value)| (name.into(), value.into()))
            .collect();
        CallSandbox {
            runtime: self.sandbox.clone(),
            policy: policy.clone(),
        }
        .prepare(&cwd, &extra)
        .map_err(|why| format!("MCP server {:?} was not started: {why}", self.name))
    }

    fn per_conversation(&self) -> bool {
        matches!(
            self.config,
            McpServerConfig::Stdio {
                per_conversation: true,
                ..
            }
        )
    }

    fn status(&self) -> McpServerStatus {
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let state = match (&seen.tools, &seen.error) {
            (_, Some(_)) => "failed",
            (Some(_), None) => "ready",
            (None, None) => "idle",
        };
        McpServerStatus {
            name: self.name.clone(),
            transport: match self.config {
                McpServerConfig::Stdio { .. } => "stdio",
                McpServerConfig::Http { .. } => "http",
            },
            state,
            error: seen.error.clone(),
            tools: seen
                .tools
                .as_ref()
                .map(|tools| tools.tools.keys().cloned().collect())
                .unwrap_or_default(),
            problems: seen
                .tools
                .as_ref()
                .map(|tools| tools.problems.clone())
                .unwrap_or_default(),
        }
    }

    fn see(&self, change: impl FnOnce(&mut Seen)) {
        change(
            &mut self
                .seen
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
    }

    /// The tools of the running server, started now if it is not running
    /// (and the backoff after the last failure has passed).
    async fn connect(self: &Arc<Self>) -> Result<Arc<ToolSet>, String> {
        let mut slot = self.slot.lock().await;
        let backoff = match &*slot {
            Slot::Ready(connection) if !connection.peer.is_transport_closed() => {
                if let Some(tools) = self.tool_set() {
                    return Ok(tools);
                }
                FIRST_BACKOFF
            }
            Slot::Ready(_) | Slot::Idle => FIRST_BACKOFF,
            Slot::Failed { error, at, backoff } => {
                if at.elapsed() < *backoff {
                    return Err(format!(
                        "{error} (started again in {} s at the earliest)",
                        backoff.saturating_sub(at.elapsed()).as_secs().max(1)
                    ));
                }
                (*backoff * 2).min(MAX_BACKOFF)
            }
        };
        match tokio::time::timeout(START_TIMEOUT, self.start()).await {
            Ok(Ok((connection, tools))) => {
                let tools = Arc::new(tools);
                self.see(|seen| {
                    seen.tools = Some(tools.clone());
                    seen.error = None;
                });
                *slot = Slot::Ready(Arc::new(connection));
                Ok(tools)
            }
            outcome => {
                let error = match outcome {
                    Ok(Err(error)) => error,
                    _ => format!(
                        "MCP server {:?} did not start within {} s",
                        self.name,
                        START_TIMEOUT.as_secs()
                    ),
                };
                tracing::warn!(server = %self.name, %error, "MCP server failed");
                self.see(|seen| seen.error = Some(error.clone()));
                *slot = Slot::Failed {
                    error: error.clone(),
                    at: Instant::now(),
                    backoff,
                };
                Err(error)
            }
        }
    }

    /// Start the server, initialise it and list its tools.
    async fn start(self: &Arc<Self>) -> Result<(Connection, ToolSet), String> {
        let name = &self.name;
        let (changed, changes) = mpsc::unbounded_channel();
        let progress = ProgressDispatcher::new();
        let handler = Handler {
            changed,
            progress: progress.clone(),
        };
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let (running, pgid) = match &self.config {
            McpServerConfig::Stdio {
                command,
                args,
                env,
                cwd,
                sandbox,
                ..
            } => {
                let mut process = tokio::process::Command::new(command);
                process.args(args).process_group(0);
                if let Some(cwd) = cwd {
                    process.current_dir(cwd);
                }
                // Held for as long as the server runs (its stderr is read):
                // its private temporary directory goes with it.
                let confined = match sandbox {
                    Some(policy) => Some(self.confine(policy, cwd.as_deref(), env)?),
                    None => None,
                };
                match &confined {
                    Some(prepared) => {
                        process.env_clear().envs(prepared.env.iter().cloned());
                    }
                    None => {
                        process.envs(env);
                    }
                }
                let builder = TokioChildProcess::builder(process).stderr(Stdio::piped());
                let spawned = match confined
                    .as_ref()
                    .and_then(|prepared| prepared.confinement.as_ref())
                {
                    Some(confinement) => crate::spawner::spawn_confined_on_tokio(
                        confinement,
                        move || builder.spawn(),
                        |(transport, _)| transport.id(),
                    ),
                    None => builder.spawn(),
                };
                let (transport, pipe) = spawned.map_err(|error| {
                    format!("MCP server {name:?}: cannot start {command:?}: {error}")
                })?;
                let pgid = transport.id();
                if let (Some(pgid), Some(ledger)) = (pgid, &self.ledger) {
                    let _ = ledger.record(pgid, &format!("mcp:{name}"));
                }
                if let Some(pipe) = pipe {
                    let lines = stderr.clone();
                    tokio::spawn(async move {
                        let _confined = confined;
                        let mut reader = tokio::io::BufReader::new(pipe).lines();
                        while let Ok(Some(line)) = reader.next_line().await {
                            let mut lines = lines.lock().unwrap_or_else(|p| p.into_inner());
                            if lines.len() == STDERR_LINES {
                                lines.pop_front();
                            }
                            lines.push_back(line);
                        }
                    });
                }
                let running = handler.serve(transport).await.map_err(|error| {
                    let last = last_words(&stderr);
                    kill_group(pgid, &self.ledger);
                    format!("MCP server {name:?} did not initialise: {error}{last}")
                })?;
                (running, pgid)
            }
            McpServerConfig::Http {
                url,
                headers,
                bearer_token,
            } => {
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
                if let Some(token) = bearer_token {
                    config = config.auth_header(token.clone());
                }
                let mut custom = std::collections::HashMap::new();
                for (header, value) in headers {
                    let header = reqwest::header::HeaderName::try_from(header.as_str()).map_err(
                        |error| format!("MCP server {name:?}: header {header:?}: {error}"),
                    )?;
                    let value = reqwest::header::HeaderValue::try_from(value.as_str())
                        .map_err(|error| format!("MCP server {name:?}: header value: {error}"))?;
                    custom.insert(header, value);
                }
                config = config.custom_headers(custom);
                // reqwest is built without a TLS provider (provider.rs).
                let _ = rustls::crypto::ring::default_provider().install_default();
                let client = reqwest::Client::builder()
                    .pool_max_idle_per_host(0)
                    .connect_timeout(Duration::from_secs(10))
                    .build()
                    .map_err(|error| format!("MCP server {name:?}: HTTP client: {error}"))?;
                let transport = StreamableHttpClientTransport::with_client(client, config);
                let running = handler.serve(transport).await.map_err(|error| {
                    format!("MCP server {name:?} at {url} did not initialise: {error}")
                })?;
                (running, None)
            }
        };
        let peer = running.peer().clone();
        let tools = list_tools(name, &peer, &stderr, &progress)
            .await
            .inspect_err(|_| kill_group(pgid, &self.ledger))?;
        let (stop, stopped) = oneshot::channel();
        let connection = Connection {
            peer: peer.clone(),
            pgid,
            _stop: stop,
        };
        tracing::info!(server = %name, "MCP server ready");
        self.supervise(running, pgid, stopped, peer, changes, (stderr, progress));
        Ok((connection, tools))
    }

    /// Follow the running server: list its tools again when they change,
    /// stop it when asked, and clean up after it whichever way it ends.
    fn supervise(
        self: &Arc<Self>,
        running: RunningService<RoleClient, Handler>,
        pgid: Option<u32>,
        stopped: oneshot::Receiver<()>,
        peer: Peer<RoleClient>,
        mut changes: mpsc::UnboundedReceiver<()>,
        (stderr, progress): (Arc<Mutex<VecDeque<String>>>, ProgressDispatcher),
    ) {
        let server = self.clone();
        tokio::spawn(async move {
            let mut running = running;
            let mut stopped = stopped;
            loop {
                tokio::select! {
                    _ = &mut stopped => {
                        let _ = running.close_with_timeout(TERM_GRACE).await;
                        break;
                    }
                    change = changes.recv() => {
                        if change.is_none() {
                            continue;
                        }
                        match list_tools(&server.name, &peer, &stderr, &progress).await {
                            Ok(tools) => server.replace_tools(tools),
                            Err(error) => tracing::warn!(server = %server.name, %error, "listing the tools again failed"),
                        }
                    }
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {
                        if peer.is_transport_closed() {
                            break;
                        }
                    }
                }
            }
            drop(running);
            kill_group(pgid, &server.ledger);
            tracing::info!(server = %server.name, "MCP server stopped");
        });
    }

    fn replace_tools(&self, tools: ToolSet) {
        self.see(|seen| seen.tools = Some(Arc::new(tools)));
    }

    /// The latest tool list, if the server ever ran.
    fn tool_set(&self) -> Option<Arc<ToolSet>> {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .tools
            .clone()
    }
}

/// The server's last stderr lines, as the end of an error message.
fn last_words(stderr: &Mutex<VecDeque<String>>) -> String {
    let lines = stderr
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if lines.is_empty() {
        return String::new();
    }
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    format!("; it printed last:\n{}", lines.join("\n"))
}

/// Kill a stopped server's whole process group (the SDK kills only its
/// direct child) and forget it in the ledger.
fn kill_group(pgid: Option<u32>, ledger: &Option<Arc<ProcessLedger>>) {
    let Some(pgid) = pgid else {
        return;
    };
    signal_group(pgid, nix::sys::signal::Signal::SIGTERM);
    let ledger = ledger.clone();
    tokio::spawn(async move {
        tokio::time::sleep(TERM_GRACE).await;
        signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
        if let Some(ledger) = ledger {
            let _ = ledger.remove(pgid);
        }
    });
}

fn signal_group(pgid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(raw) = i32::try_from(pgid) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), signal);
    }
}

/// The server's tools as keel offers them: each name prefixed, each
/// schema one a provider takes; the others left out with the reason.
async fn list_tools(
    server: &str,
    peer: &Peer<RoleClient>,
    stderr: &Arc<Mutex<VecDeque<String>>>,
    progress: &ProgressDispatcher,
) -> Result<ToolSet, String> {
    let listed = peer
        .list_all_tools()
        .await
        .map_err(|error| format!("MCP server {server:?}: tools/list failed: {error}"))?;
    let mut specs = Vec::new();
    let mut tools: BTreeMap<String, Arc<dyn Tool>> = BTreeMap::new();
    let mut problems = Vec::new();
    for tool in listed {
        let full = format!("{PREFIX}{server}__{}", tool.name);
        let schema = Value::Object((*tool.input_schema).clone());
        if let Err(problem) = offerable(&full, &schema) {
            problems.push(format!("{full}: {problem}"));
            continue;
        }
        let spec = ToolSpec {
            name: full.clone(),
            description: tool.description.as_deref().unwrap_or_default().to_owned(),
            input_schema: schema,
        };
        let call = McpTool {
            server: server.to_owned(),
            tool: tool.name.to_string(),
            spec: spec.clone(),
            peer: peer.clone(),
            stderr: stderr.clone(),
            progress: progress.clone(),
        };
        tools.insert(full, Arc::new(Checked::new(Arc::new(call))));
        specs.push(spec);
    }
    for problem in &problems {
        tracing::warn!(server, problem = %problem, "MCP tool left out");
    }
    specs.sort_by(|left, right| left.name.cmp(&right.name));
    Ok(ToolSet {
        specs: specs.into(),
        tools,
        problems,
    })
}

/// Whether a provider would take a tool named `full` with input `schema`:
/// a name of at most 64 letters, digits, `_` and `-` (Anthropic's and
/// OpenAI's rule), and an object schema that compiles.
fn offerable(full: &str, schema: &Value) -> Result<(), String> {
    if full.len() > 64
        || !full
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(
            "providers take tool names of at most 64 letters, digits, '_' and '-'".to_owned(),
        );
    }
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(
            "its input schema is not of type \"object\", which providers require".to_owned(),
        );
    }
    if let Some(error) = crate::tool::schema::compile_error(schema) {
        return Err(format!(
            "its input schema is not a valid JSON schema: {error}"
        ));
    }
    Ok(())
}

/// The client side of a connection: it listens for a changed tool list
/// and for the progress of calls.
#[derive(Clone)]
struct Handler {
    changed: mpsc::UnboundedSender<()>,
    progress: ProgressDispatcher,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changed.send(());
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.handle_notification(params).await;
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("keel", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }
}

/// One tool of one server, as keel runs it.
struct McpTool {
    server: String,
    tool: String,
    spec: ToolSpec,
    peer: Peer<RoleClient>,
    /// The server's last stderr lines (stdio), for a call it died in.
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Where the server's progress notifications go, by the call's token.
    progress: ProgressDispatcher,
}

/// Tells the server a call is cancelled when the call is dropped before
/// its answer (a cancel stops the tool worker): dropping rmcp's request
/// handle alone tells it nothing.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    server: String,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        crate::metrics::mcp_call(&self.server, "cancelled");
        let peer = self.peer.clone();
        // The tool worker is stopping; the notice goes out on its own.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let reason = Some("cancelled by keel".to_owned());
                let _ = peer
                    .notify_cancelled(CancelledNotificationParam::new(Some(id), reason))
                    .await;
            });
        }
    }
}

#[async_trait::async_trait]
impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    /// Dropping this future (a cancel) makes rmcp send the server
    /// `notifications/cancelled` for the request.
    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        let arguments = match ctx.call.input {
            Value::Object(map) => Some(map),
            Value::Null => None,
            other => {
                return ToolOutcome::error(format!(
                    "the input of {} must be a JSON object, not {other}",
                    self.spec.name
                ))
            }
        };
        let mut params = CallToolRequestParams::new(self.tool.clone());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = match self
            .peer
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
        {
            Ok(handle) => handle,
            Err(error) => return self.failed(error),
        };
        let mut progress = self.progress.subscribe(handle.progress_token.clone()).await;
        let mut guard = CancelOnDrop {
            peer: self.peer.clone(),
            server: self.server.clone(),
            id: Some(handle.id.clone()),
        };
        let response = handle.await_response();
        tokio::pin!(response);
        let answered = loop {
            tokio::select! {
                answered = &mut response => break answered,
                Some(update) = progress.next() => ctx.output.send(progress_line(&update)),
            }
        };
        guard.id = None;
        match answered {
            Ok(ServerResult::CallToolResult(result)) => {
                let outcome = outcome(result);
                let label = if outcome.is_error { "error" } else { "ok" };
                crate::metrics::mcp_call(&self.server, label);
                outcome
            }
            Ok(_) => ToolOutcome::error(format!(
                "the MCP server {:?} answered the call with something other than a result",
                self.server
            )),
            Err(error) => self.failed(error),
        }
    }
}

impl McpTool {
    /// The error result of a call that got no answer.
    fn failed(&self, error: ServiceError) -> ToolOutcome {
        let label = match error {
            ServiceError::TransportClosed => "server_stopped",
            _ => "failed",
        };
        crate::metrics::mcp_call(&self.server, label);
        match error {
            ServiceError::TransportClosed => ToolOutcome::error(format!(
                "the MCP server {:?} stopped during the call (it is started again for the next one){}",
                self.server,
                last_words(&self.stderr)
            )),
            error => ToolOutcome::error(format!(
                "the MCP server {:?} failed the call: {error}",
                self.server
            )),
        }
    }
}

/// A progress notification as a line of the call's live output.
fn progress_line(update: &ProgressNotificationParam) -> String {
    let done = match update.total {
        Some(total) => format!("{}/{}", update.progress, total),
        None => update.progress.to_string(),
    };
    match &update.message {
        Some(message) => format!("[progress {done}] {message}\n"),
        None => format!("[progress {done}]\n"),
    }
}

/// A call's result as the model reads it: the text of its content, its
/// images (and image resources) as images, other content named,
/// structured content as JSON text when there is no text.
fn outcome(result: CallToolResult) -> ToolOutcome {
    let mut parts = Vec::new();
    let mut images = Vec::new();
    for block in &result.content {
        match block {
            ContentBlock::Text(text) => parts.push(text.text.clone()),
            ContentBlock::Image(image) => match image_upload(&image.mime_type, &image.data) {
                Ok(upload) => images.push(upload),
                Err(why) => parts.push(format!("[an image keel could not read: {why}]")),
            },
            ContentBlock::Resource(embedded) => match &embedded.resource {
                ResourceContents::TextResourceContents { uri, text, .. } => {
                    parts.push(format!("[resource {uri}]\n{text}"))
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type: Some(mime_type),
                    blob,
                    ..
                } if mime_type.starts_with("image/") => match image_upload(mime_type, blob) {
                    Ok(upload) => {
                        parts.push(format!("[resource {uri}: the image below]"));
                        images.push(upload);
                    }
                    Err(why) => parts.push(format!("[resource {uri}: {why}]")),
                },
                ResourceContents::BlobResourceContents { uri, blob, .. } => {
                    parts.push(format!("[resource {uri}: {} bytes of base64]", blob.len()))
                }
                _ => parts.push("[a resource]".to_owned()),
            },
            ContentBlock::ResourceLink(link) => {
                parts.push(format!("[resource link {} ({})]", link.uri, link.name))
            }
            _ => parts.push("[content keel does not show]".to_owned()),
        }
    }
    if let Some(structured) = &result.structured_content {
        if parts.is_empty() {
            parts.push(structured.to_string());
        }
    }
    let content = parts.join("\n");
    let outcome = if result.is_error == Some(true) {
        ToolOutcome::error(content)
    } else {
        ToolOutcome::ok(content)
    };
    outcome.with_images(images)
}

/// An MCP image's bytes (base64 on the wire) as an upload; the tool's
/// worker checks what they are, as it does for any tool's images.
fn image_upload(mime_type: &str, data: &str) -> Result<ImageUpload, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|error| format!("its data is not base64 ({error})"))?;
    Ok(ImageUpload::new(mime_type, bytes))
}

/// The tool a call of `name` runs, found when it runs (in the tool's
/// worker, which a cancel stops): the server may have to start first.
pub(crate) fn deferred(
    hub: Arc<McpHub>,
    name: &str,
    servers: Vec<String>,
    conversation: ConversationId,
) -> Arc<dyn Tool> {
    Arc::new(Deferred {
        hub,
        name: name.to_owned(),
        servers,
        conversation,
    })
}

struct Deferred {
    hub: Arc<McpHub>,
    name: String,
    servers: Vec<String>,
    conversation: ConversationId,
}

#[async_trait::async_trait]
impl Tool for Deferred {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
        }
    }

    async fn run(&self, ctx: ToolContext) -> ToolOutcome {
        match self
            .hub
            .tool(&self.name, &self.servers, &self.conversation)
            .await
        {
            Ok(tool) => tool.run(ctx).await,
            Err(error) => ToolOutcome::error(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tool_is_offered_only_with_a_name_and_schema_providers_take() {
        let object = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(offerable("mcp__files__read", &object), Ok(()));
        let long = format!("mcp__files__{}", "x".repeat(60));
        assert!(offerable(&long, &object).unwrap_err().contains("64"));
        assert!(offerable("mcp__files__read.all", &object).is_err());
        let array = json!({"type": "array"});
        assert!(offerable("mcp__files__list", &array)
            .unwrap_err()
            .contains("object"));
        let broken = json!({"type": "object", "properties": {"a": {"type": "strang"}}});
        assert!(offerable("mcp__files__read", &broken)
            .unwrap_err()
            .contains("not a valid JSON schema"));
    }

    #[test]
    fn server_names_hold_what_a_tool_name_may() {
        assert!(valid_server_name("files").is_ok());
        assert!(valid_server_name("my-files_2").is_ok());
        assert!(valid_server_name("").is_err());
        assert!(valid_server_name("two__parts").is_err());
        assert!(valid_server_name("dots.not").is_err());
        assert!(valid_server_name(&"x".repeat(33)).is_err());
        assert_eq!(
            split_name("mcp__files__read_all"),
            Some(("files", "read_all"))
        );
        assert_eq!(split_name("bash"), None);
    }
}
