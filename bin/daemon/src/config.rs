//! `keel serve`'s configuration: the environment, over an optional
//! `keel.toml`, checked at start with errors that name the setting and say
//! what would work (docs/daemon.md, "Configuration").
//!
//! Every setting has one name, its environment variable; the file's keys
//! map onto those names, so one lookup reads both and the environment wins.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use keel_actors::core::config::{
    ModelRef, NetworkAccess, ProviderKind, SandboxMode, SandboxPolicy,
};
use keel_actors::provider::ProviderConfig;
use keel_actors::store::BackendKind;
use keel_actors::{McpServerConfig, DEFAULT_LIVE_INTERVAL};
use keel_api::types::ApiNetwork;

/// The default address: loopback only, so a first run exposes nothing.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7777";
pub const DEFAULT_DATA_DIR: &str = "./keel-data";
/// Models used when `KEEL_MODEL` is unset.
pub const DEFAULT_ANTHROPIC_MODEL: &str = "claude-sonnet-4-5";
pub const DEFAULT_OPENAI_MODEL: &str = "gpt-4o-mini";

/// A setting that cannot be used, and why; shown to the person starting
/// the daemon as it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{setting}: {reason}")]
pub struct ConfigError {
    /// The environment variable (or, for the file itself, its path).
    pub setting: String,
    pub reason: String,
}

fn invalid(setting: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        setting: setting.to_owned(),
        reason: reason.into(),
    }
}

/// Everything `keel serve` is started with, checked.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub addr: SocketAddr,
    /// `KEEL_TOKEN`; `None` means one is read from (or generated into) the
    /// data dir.
    pub token: Option<String>,
    pub store: BackendKind,
    /// `KEEL_DATABASE_URL`: the PostgreSQL database of `KEEL_STORE=postgres`
    /// (docs/postgres.md); required with it, refused without it.
    pub database_url: Option<String>,
    /// The model new conversations ask unless they name another.
    pub model: ModelRef,
    pub providers: ProviderConfig,
    /// No provider was configured: the daemon runs the built-in fake
    /// provider in-process and says so.
    pub builtin_mock: bool,
    /// `KEEL_LOG_FORMAT`: `plain` or `json`, read by the tracing set-up.
    pub log_format: Option<String>,
    /// `KEEL_SHUTDOWN_GRACE_MS`: how long a graceful stop lets turns in
    /// flight finish before it interrupts them.
    pub shutdown_grace: Duration,
    /// `KEEL_LIVE_INTERVAL_MS`: how often at most live-only updates go out
    /// to a conversation's watchers (`Settings::live_interval`).
    pub live_interval: Duration,
    /// `KEEL_MAX_MESSAGE_BYTES`: the most bytes a message's text may have
    /// (its images are bounded on their own).
    pub max_message_bytes: usize,
    /// `KEEL_WORKER_THREADS`: how many threads run the daemon's async
    /// work; `None`, one per core but one (or `TOKIO_WORKER_THREADS`
    /// if that is set). docs/daemon.md, `KEEL_WORKER_THREADS`.
    pub worker_threads: Option<usize>,
    /// `KEEL_STORE_STOPPED_EXIT_MS`: how long a daemon whose store stopped
    /// taking writes goes on answering 503 (so health checks and clients
    /// see why) before it exits for its supervisor to restart it.
    pub store_stopped_exit: Duration,
    /// `KEEL_RETENTION_DAYS`: conversations untouched for this long are
    /// deleted by a background sweep; `None` (the default) keeps them.
    pub retention: Option<Duration>,
    /// `[mcp.NAME]` tables, or `KEEL_MCP_SERVERS` (the same as JSON): the
    /// MCP servers conversations may use (docs/mcp.md).
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// `KEEL_SANDBOX` and `KEEL_SANDBOX_NETWORK`: the sandbox of
    /// conversations that name none (docs/sandbox.md).
    pub sandbox: SandboxPolicy,
    /// `KEEL_SANDBOX_FULL_ACCESS=allow`: conversations may run their tools
    /// unconfined. Implied by `KEEL_SANDBOX=full-access`.
    pub sandbox_full_access: bool,
    /// `KEEL_NODE` and its companions: this daemon is one of several
    /// nodes over one PostgreSQL database (docs/nodes.md).
    pub node: Option<NodeConfig>,
    /// Where the file came from, if one was read.
    pub file: Option<PathBuf>,
}

/// A node among several (docs/nodes.md).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// `KEEL_NODE`: its name, the same across its restarts.
    pub name: String,
    /// `KEEL_NODE_URL`: where the other nodes reach its API
    /// (`http://HOST:PORT`); by default `http://` and `KEEL_ADDR`, its
    /// port as bound.
    pub url: Option<String>,
    /// `KEEL_NODE_LEASE_MS`: how long a node not heard from keeps its
    /// conversations before another takes them over.
    pub lease: Duration,
}

/// The default of `KEEL_NODE_LEASE_MS`.
pub const DEFAULT_NODE_LEASE: Duration = Duration::from_secs(10);

/// Largest body of `POST …/messages`: images come base64 in it (4/3 of
/// their size), each up to 20 MiB before keel scales it down. The ceiling
/// of `KEEL_MAX_MESSAGE_BYTES`.
pub const MESSAGE_BODY_LIMIT: usize = 64 * 1024 * 1024;

/// The default of `KEEL_MAX_MESSAGE_BYTES`: 1 MiB, a long document pasted
/// whole; a message is a prompt, not a file transfer.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// The most async worker threads `KEEL_WORKER_THREADS` may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;

/// The default of `KEEL_SHUTDOWN_GRACE_MS`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Long enough for a health check or two to see the 503 and its reason,
/// short enough that a supervisor brings the daemon back soon after the
/// disk has room again.
pub const DEFAULT_STORE_STOPPED_EXIT: Duration = Duration::from_secs(5);

/// `keel.toml`. Unknown keys are an error: a misspelt key silently
/// ignored is a setting the user thinks they made.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    data_dir: Option<String>,
    addr: Option<String>,
    token: Option<String>,
    store: Option<String>,
    database_url: Option<String>,
    provider: Option<String>,
    model: Option<String>,
    log_format: Option<String>,
    mock_url: Option<String>,
    shutdown_grace_ms: Option<u64>,
    live_interval_ms: Option<u64>,
    max_message_bytes: Option<u64>,
    worker_threads: Option<u64>,
    store_stopped_exit_ms: Option<u64>,
    retention_days: Option<f64>,
    #[serde(default)]
    sandbox: SandboxSection,
    #[serde(default)]
    anthropic: ProviderSection,
    #[serde(default)]
    openai: ProviderSection,
    #[serde(default)]
    timeouts: Timeouts,
    node: Option<String>,
    node_url: Option<String>,
    node_lease_ms: Option<u64>,
    #[serde(default)]
    mcp: BTreeMap<String, McpSection>,
}

/// One MCP server: `command` (stdio) or `url` (streamable HTTP).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpSection {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// The environment variable holding a bearer token for `url`.
    bearer_token_env: Option<String>,
    /// A `command` started once per conversation that uses it, instead of
    /// one shared by all.
    #[serde(default)]
    per_conversation: bool,
    /// Confine a `command` as tools are (docs/sandbox.md): `{mode =
    /// "workspace-write", network = "off"}`, writing in its `cwd`.
    sandbox: Option<McpSandbox>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpSandbox {
    mode: Option<String>,
    network: Option<ApiNetwork>,
}

/// `[sandbox]`: `mode`, `network` (a string or a list) and `full_access`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SandboxSection {
    mode: Option<String>,
    network: Option<ApiNetwork>,
    full_access: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderSection {
    api_key: Option<String>,
    base_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Timeouts {
    connect_ms: Option<u64>,
    first_byte_ms: Option<u64>,
    idle_ms: Option<u64>,
}

impl File {
    /// The file's settings under their environment variables' names.
    fn into_settings(self) -> HashMap<&'static str, String> {
        let pairs = [
            ("KEEL_DATA_DIR", self.data_dir),
            ("KEEL_ADDR", self.addr),
            ("KEEL_TOKEN", self.token),
            ("KEEL_STORE", self.store),
            ("KEEL_DATABASE_URL", self.database_url),
            ("KEEL_PROVIDER", self.provider),
            ("KEEL_MODEL", self.model),
            ("KEEL_LOG_FORMAT", self.log_format),
            ("KEEL_MOCK_URL", self.mock_url),
            (
                "KEEL_SHUTDOWN_GRACE_MS",
                self.shutdown_grace_ms.map(|ms| ms.to_string()),
            ),
            (
                "KEEL_LIVE_INTERVAL_MS",
                self.live_interval_ms.map(|ms| ms.to_string()),
            ),
            (
                "KEEL_MAX_MESSAGE_BYTES",
                self.max_message_bytes.map(|bytes| bytes.to_string()),
            ),
            (
                "KEEL_WORKER_THREADS",
                self.worker_threads.map(|threads| threads.to_string()),
            ),
            (
                "KEEL_STORE_STOPPED_EXIT_MS",
                self.store_stopped_exit_ms.map(|ms| ms.to_string()),
            ),
            (
                "KEEL_RETENTION_DAYS",
                self.retention_days.map(|days| days.to_string()),
            ),
            ("KEEL_NODE", self.node),
            ("KEEL_NODE_URL", self.node_url),
            (
                "KEEL_NODE_LEASE_MS",
                self.node_lease_ms.map(|ms| ms.to_string()),
            ),
            ("KEEL_SANDBOX", self.sandbox.mode),
            (
                "KEEL_SANDBOX_NETWORK",
                self.sandbox.network.map(|network| match network {
                    ApiNetwork::One(one) => one,
                    ApiNetwork::List(list) => list.join(","),
                }),
            ),
            ("KEEL_SANDBOX_FULL_ACCESS", self.sandbox.full_access),
            ("ANTHROPIC_API_KEY", self.anthropic.api_key),
            ("ANTHROPIC_BASE_URL", self.anthropic.base_url),
            ("OPENAI_API_KEY", self.openai.api_key),
            ("OPENAI_BASE_URL", self.openai.base_url),
            (
                "KEEL_CONNECT_TIMEOUT_MS",
                self.timeouts.connect_ms.map(|ms| ms.to_string()),
            ),
            (
                "KEEL_FIRST_BYTE_TIMEOUT_MS",
                self.timeouts.first_byte_ms.map(|ms| ms.to_string()),
            ),
            (
                "KEEL_IDLE_TIMEOUT_MS",
                self.timeouts.idle_ms.map(|ms| ms.to_string()),
            ),
        ];
        pairs
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?)))
            .collect()
    }
}

/// Read `keel.toml` from `path`. A file that was asked for by name must
/// exist; the default `./keel.toml` is read only if it is there.
pub fn read_file(path: &Path, asked: bool) -> Result<Option<String>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && !asked => Ok(None),
        Err(error) => Err(invalid(
            &path.display().to_string(),
            format!("cannot read the configuration file: {error}"),
        )),
    }
}

impl Config {
    /// The configuration from `env` (the process environment in `keel
    /// serve`) over the text of `keel.toml`, if any, read from `file`.
    pub fn load(
        env: impl Fn(&str) -> Option<String>,
        file: Option<(&Path, &str)>,
    ) -> Result<Config, ConfigError> {
        let (from_file, mcp_sections) = match file {
            Some((path, text)) => {
                let mut parsed = toml::from_str::<File>(text).map_err(|error| {
                    invalid(
                        &path.display().to_string(),
                        format!("not a valid keel.toml: {}", error.message()),
                    )
                })?;
                let mcp = std::mem::take(&mut parsed.mcp);
                (parsed.into_settings(), mcp)
            }
            None => (HashMap::new(), BTreeMap::new()),
        };
        let lookup = |name: &str| {
            env(name)
                .or_else(|| from_file.get(name).cloned())
                .map(|value| value.trim().to_owned())
                .filter(|value| !value.is_empty())
        };

        let data_dir = PathBuf::from(lookup("KEEL_DATA_DIR").unwrap_or(DEFAULT_DATA_DIR.into()));
        let addr_text = lookup("KEEL_ADDR").unwrap_or(DEFAULT_ADDR.into());
        let addr: SocketAddr = addr_text.parse().map_err(|_| {
            invalid(
                "KEEL_ADDR",
                format!("{addr_text:?} is not IP:PORT (for example {DEFAULT_ADDR}, or 0.0.0.0:7777 with KEEL_TOKEN set)"),
            )
        })?;
        let token = lookup("KEEL_TOKEN");
        if token.is_none() && !addr.ip().is_loopback() {
            return Err(invalid(
                "KEEL_TOKEN",
                format!(
                    "must be set when keel listens beyond this machine (KEEL_ADDR={addr}); \
                     a generated token is only for a loopback address"
                ),
            ));
        }
        let store = match lookup("KEEL_STORE") {
            None => BackendKind::Redb,
            Some(raw) => match raw.parse::<BackendKind>() {
                Ok(BackendKind::Memory) => {
                    return Err(invalid(
                        "KEEL_STORE",
                        "memory keeps nothing across a restart; a daemon uses redb (the default) or sled",
                    ))
                }
                Ok(kind) => kind,
                Err(reason) => return Err(invalid("KEEL_STORE", reason)),
            },
        };
        let database_url = lookup("KEEL_DATABASE_URL");
        match (store, &database_url) {
            (BackendKind::Postgres, None) => return Err(invalid(
                "KEEL_DATABASE_URL",
                "KEEL_STORE=postgres needs the database's URL (postgres://USER@HOST:PORT/DATABASE)",
            )),
            (BackendKind::Postgres, Some(_)) | (_, None) => {}
            (other, Some(_)) => {
                return Err(invalid(
                    "KEEL_DATABASE_URL",
                    format!(
                    "is for KEEL_STORE=postgres; the {other} store keeps its data in KEEL_DATA_DIR"
                ),
                ))
            }
        }
        let node = node(&lookup, store, token.is_some())?;
        let log_format = lookup("KEEL_LOG_FORMAT");
        if let Some(format) = &log_format {
            if format != "plain" && format != "json" {
                return Err(invalid(
                    "KEEL_LOG_FORMAT",
                    format!("{format:?} is not plain or json"),
                ));
            }
        }
        let shutdown_grace =
            millis(&lookup, "KEEL_SHUTDOWN_GRACE_MS")?.unwrap_or(DEFAULT_SHUTDOWN_GRACE);
        let live_interval =
            millis(&lookup, "KEEL_LIVE_INTERVAL_MS")?.unwrap_or(DEFAULT_LIVE_INTERVAL);
        let max_message_bytes = match lookup("KEEL_MAX_MESSAGE_BYTES") {
            None => DEFAULT_MAX_MESSAGE_BYTES,
            Some(raw) => raw
                .parse::<usize>()
                .ok()
                .filter(|bytes| (1..=MESSAGE_BODY_LIMIT).contains(bytes))
                .ok_or_else(|| {
                    invalid(
                        "KEEL_MAX_MESSAGE_BYTES",
                        format!(
                            "{raw:?} is not a number of bytes from 1 to {MESSAGE_BODY_LIMIT} \
                             (the most a message's body may carry)"
                        ),
                    )
                })?,
        };
        let worker_threads = match lookup("KEEL_WORKER_THREADS") {
            None => None,
            Some(raw) => Some(
                raw.parse::<usize>()
                    .ok()
                    .filter(|threads| (1..=MAX_WORKER_THREADS).contains(threads))
                    .ok_or_else(|| {
                        invalid(
                            "KEEL_WORKER_THREADS",
                            format!(
                                "{raw:?} is not a number of threads from 1 to {MAX_WORKER_THREADS}"
                            ),
                        )
                    })?,
            ),
        };
        let store_stopped_exit =
            millis(&lookup, "KEEL_STORE_STOPPED_EXIT_MS")?.unwrap_or(DEFAULT_STORE_STOPPED_EXIT);
        let retention = retention(&lookup)?;
        let mcp_servers = match env("KEEL_MCP_SERVERS") {
            Some(json) => {
                let sections: BTreeMap<String, McpSection> = serde_json::from_str(&json)
                    .map_err(|error| {
                        invalid(
                            "KEEL_MCP_SERVERS",
                            format!("not a JSON object of servers like keel.toml's [mcp.NAME] tables: {error}"),
                        )
                    })?;
                mcp_servers("KEEL_MCP_SERVERS", sections, &env)?
            }
            None => mcp_servers("keel.toml [mcp]", mcp_sections, &env)?,
        };
        let (sandbox, sandbox_full_access) = sandbox(&lookup)?;
        let mut providers = ProviderConfig::from_lookup(lookup).map_err(|error| match error {
            keel_actors::Error::Config { name, reason } => invalid(name, reason),
            other => invalid("provider", other.to_string()),
        })?;
        let (model, builtin_mock) = choose_model(&lookup, &providers)?;
        if builtin_mock {
            // Filled in once the in-process fake provider has its port.
            providers.mock_url = None;
        }
        Ok(Config {
            data_dir,
            addr,
            token,
            store,
            database_url,
            model,
            providers,
            builtin_mock,
            log_format,
            shutdown_grace,
            live_interval,
            max_message_bytes,
            worker_threads,
            store_stopped_exit,
            retention,
            mcp_servers,
            sandbox,
            sandbox_full_access,
            node,
            file: file.map(|(path, _)| path.to_owned()),
        })
    }
}

/// `KEEL_NODE` and its companions, checked: a node shares a PostgreSQL
/// store and a token with the others (requests are forwarded between
/// nodes with the client's own token).
fn node(
    lookup: &impl Fn(&str) -> Option<String>,
    store: BackendKind,
    has_token: bool,
) -> Result<Option<NodeConfig>, ConfigError> {
    let Some(name) = lookup("KEEL_NODE") else {
        for companion in ["KEEL_NODE_URL", "KEEL_NODE_LEASE_MS"] {
            if lookup(companion).is_some() {
                return Err(invalid(companion, "is for a node: set KEEL_NODE too"));
            }
        }
        return Ok(None);
    };
    if name.len() > 200
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(invalid(
            "KEEL_NODE",
            format!("{name:?} is not a node name: 1 to 200 of A-Z a-z 0-9 - _ ."),
        ));
    }
    if store != BackendKind::Postgres {
        return Err(invalid(
            "KEEL_NODE",
            "nodes share one PostgreSQL database: set KEEL_STORE=postgres and KEEL_DATABASE_URL",
        ));
    }
    if !has_token {
        return Err(invalid(
            "KEEL_TOKEN",
            "must be set for a node, the same on every node: requests are forwarded between nodes with the client's token",
        ));
    }
    let url = match lookup("KEEL_NODE_URL") {
        None => None,
        Some(url) => {
            let parsed = reqwest::Url::parse(&url).ok().filter(|parsed| {
                matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some()
            });
            if parsed.is_none() {
                return Err(invalid(
                    "KEEL_NODE_URL",
                    format!("{url:?} is not an http(s) URL like http://10.0.0.5:7777"),
                ));
            }
            Some(url.trim_end_matches('/').to_owned())
        }
    };
    let lease = millis(lookup, "KEEL_NODE_LEASE_MS")?.unwrap_or(DEFAULT_NODE_LEASE);
    if lease < Duration::from_millis(300) {
        return Err(invalid(
            "KEEL_NODE_LEASE_MS",
            "must be at least 300: a node renews its lease three times per lease, over the network",
        ));
    }
    Ok(Some(NodeConfig { name, url, lease }))
}

/// The default sandbox and whether full access is allowed.
fn sandbox(lookup: &impl Fn(&str) -> Option<String>) -> Result<(SandboxPolicy, bool), ConfigError> {
    let mode = match lookup("KEEL_SANDBOX") {
        None => SandboxMode::default(),
        Some(raw) => raw
            .parse::<SandboxMode>()
            .map_err(|reason| invalid("KEEL_SANDBOX", reason))?,
    };
    let network = match lookup("KEEL_SANDBOX_NETWORK") {
        None => NetworkAccess::default(),
        Some(raw) => NetworkAccess::parse_list(raw.split(','))
            .map_err(|reason| invalid("KEEL_SANDBOX_NETWORK", reason))?,
    };
    let full_access = match lookup("KEEL_SANDBOX_FULL_ACCESS").as_deref() {
        None => mode == SandboxMode::FullAccess,
        Some("deny") if mode == SandboxMode::FullAccess => {
            return Err(invalid(
                "KEEL_SANDBOX_FULL_ACCESS",
                "is deny, but KEEL_SANDBOX makes full-access the default",
            ))
        }
        Some("deny") => false,
        Some("allow") => true,
        Some(other) => {
            return Err(invalid(
                "KEEL_SANDBOX_FULL_ACCESS",
                format!("{other:?} is not allow or deny"),
            ))
        }
    };
    Ok((SandboxPolicy { mode, network }, full_access))
}

/// The MCP servers of `sections`, checked: a name a provider's tool names
/// can hold, a command that exists (on `PATH` or as a path) or an http(s)
/// URL, and a bearer token's variable that is set. `setting` names where
/// they came from in an error.
fn mcp_servers(
    setting: &str,
    sections: BTreeMap<String, McpSection>,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, McpServerConfig>, ConfigError> {
    let mut servers = BTreeMap::new();
    for (name, section) in sections {
        let at = format!("{setting}: {name}");
        keel_actors::mcp::valid_server_name(&name).map_err(|reason| invalid(&at, reason))?;
        let server = match (section.command, section.url) {
            (Some(command), None) => {
                if section.bearer_token_env.is_some() || !section.headers.is_empty() {
                    return Err(invalid(
                        &at,
                        "headers and bearer_token_env are for a url, not a command",
                    ));
                }
                let found = find_command(&command, env).ok_or_else(|| {
                    invalid(
                        &at,
                        format!("command {command:?} is not an executable file, nor one on PATH"),
                    )
                })?;
                let cwd = section.cwd.map(PathBuf::from);
                if let Some(cwd) = &cwd {
                    if !cwd.is_dir() {
                        return Err(invalid(
                            &at,
                            format!("cwd {} is not a directory", cwd.display()),
                        ));
                    }
                }
                let sandbox = match section.sandbox {
                    None => None,
                    Some(sandbox) => Some(SandboxPolicy {
                        mode: match sandbox.mode {
                            None => SandboxMode::default(),
                            Some(mode) => mode.parse().map_err(|reason| {
                                invalid(&format!("{at}: sandbox.mode"), reason)
                            })?,
                        },
                        network: sandbox
                            .network
                            .map_or(Ok(NetworkAccess::Off), |network| match network {
                                ApiNetwork::One(one) => NetworkAccess::parse_list([one.as_str()]),
                                ApiNetwork::List(list) => {
                                    NetworkAccess::parse_list(list.iter().map(String::as_str))
                                }
                            })
                            .map_err(|reason| invalid(&format!("{at}: sandbox.network"), reason))?,
                    }),
                };
                McpServerConfig::Stdio {
                    command: found.display().to_string(),
                    args: section.args,
                    env: section.env,
                    cwd,
                    per_conversation: section.per_conversation,
                    sandbox,
                }
            }
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(invalid(
                        &at,
                        format!("url {url:?} is not an http:// or https:// URL"),
                    ));
                }
                if !section.args.is_empty()
                    || !section.env.is_empty()
                    || section.cwd.is_some()
                    || section.per_conversation
                {
                    return Err(invalid(
                        &at,
                        "args, env, cwd and per_conversation are for a command, not a url",
                    ));
                }
                let bearer_token = match section.bearer_token_env {
                    Some(variable) => Some(
                        env(&variable)
                            .filter(|token| !token.is_empty())
                            .ok_or_else(|| {
                                invalid(
                                    &at,
                                    format!("bearer_token_env names {variable}, which is not set"),
                                )
                            })?,
                    ),
                    None => None,
                };
                McpServerConfig::Http {
                    url,
                    headers: section.headers,
                    bearer_token,
                }
            }
            (Some(_), Some(_)) => return Err(invalid(&at, "give a command or a url, not both")),
            (None, None) => {
                return Err(invalid(
                    &at,
                    "give a command (stdio) or a url (streamable HTTP)",
                ))
            }
        };
        servers.insert(name, server);
    }
    Ok(servers)
}

/// `command` as a path to an executable file: itself when it holds a `/`,
/// else the first match on `PATH`.
fn find_command(command: &str, env: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if command.contains('/') {
        let path = PathBuf::from(command);
        return executable(&path).then_some(path);
    }
    let path = env("PATH").or_else(|| std::env::var("PATH").ok())?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|candidate| executable(candidate))
}

/// The longest retention `KEEL_RETENTION_DAYS` takes: a century.
const MAX_RETENTION_DAYS: f64 = 36_525.0;

/// `KEEL_RETENTION_DAYS`, a positive number of days (a fraction too: `0.5`
/// is twelve hours), if set.
fn retention(lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Duration>, ConfigError> {
    let Some(raw) = lookup("KEEL_RETENTION_DAYS") else {
        return Ok(None);
    };
    let days = raw
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|days| days.is_finite() && *days > 0.0 && *days <= MAX_RETENTION_DAYS)
        .ok_or_else(|| {
            invalid(
                "KEEL_RETENTION_DAYS",
                format!(
                    "{raw:?} is not a number of days above 0 and at most {MAX_RETENTION_DAYS} \
                     (leave it unset to keep conversations forever)"
                ),
            )
        })?;
    Ok(Some(Duration::from_secs_f64(days * 86_400.0)))
}

/// A setting given in whole milliseconds, if set.
fn millis(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &'static str,
) -> Result<Option<Duration>, ConfigError> {
    let Some(raw) = lookup(name) else {
        return Ok(None);
    };
    let ms = raw.parse::<u64>().map_err(|_| {
        invalid(
            name,
            format!("{raw:?} is not a whole number of milliseconds"),
        )
    })?;
    Ok(Some(Duration::from_millis(ms)))
}

/// Which provider and model new conversations use: `KEEL_PROVIDER` if set,
/// else the first provider with credentials (Anthropic, then OpenAI), else
/// the fake provider. Returns whether the built-in fake provider must run.
fn choose_model(
    lookup: &impl Fn(&str) -> Option<String>,
    providers: &ProviderConfig,
) -> Result<(ModelRef, bool), ConfigError> {
    let explicit = match lookup("KEEL_PROVIDER") {
        None => None,
        Some(raw) => Some(match raw.as_str() {
            "anthropic" => ProviderKind::Anthropic,
            "openai" => ProviderKind::OpenAi,
            "mock" => ProviderKind::Mock,
            other => {
                return Err(invalid(
                    "KEEL_PROVIDER",
                    format!("{other:?} is not anthropic, openai or mock"),
                ))
            }
        }),
    };
    let openai_custom = lookup("OPENAI_BASE_URL").is_some();
    let anthropic_custom = lookup("ANTHROPIC_BASE_URL").is_some();
    let provider = explicit.unwrap_or(if providers.anthropic.api_key.is_some() {
        ProviderKind::Anthropic
    } else if providers.openai.api_key.is_some() || openai_custom {
        ProviderKind::OpenAi
    } else {
        ProviderKind::Mock
    });
    let model = lookup("KEEL_MODEL");
    let model = match provider {
        ProviderKind::Anthropic => {
            if providers.anthropic.api_key.is_none() && !anthropic_custom {
                return Err(invalid(
                    "ANTHROPIC_API_KEY",
                    "KEEL_PROVIDER=anthropic needs a key (or ANTHROPIC_BASE_URL for a server that takes none)",
                ));
            }
            model.unwrap_or(DEFAULT_ANTHROPIC_MODEL.into())
        }
        ProviderKind::OpenAi => {
            if providers.openai.api_key.is_none() && !openai_custom {
                return Err(invalid(
                    "OPENAI_API_KEY",
                    "KEEL_PROVIDER=openai needs a key, or OPENAI_BASE_URL for a local OpenAI-compatible server (Ollama: http://localhost:11434/v1)",
                ));
            }
            match model {
                Some(model) => model,
                None if openai_custom => {
                    return Err(invalid(
                        "KEEL_MODEL",
                        format!(
                            "name the model the server at {} serves (for Ollama, e.g. llama3.1)",
                            providers.openai.base_url
                        ),
                    ))
                }
                None => DEFAULT_OPENAI_MODEL.into(),
            }
        }
        ProviderKind::Mock => model.unwrap_or("mock".into()),
    };
    let builtin_mock = provider == ProviderKind::Mock && providers.mock_url.is_none();
    Ok((ModelRef { provider, model }, builtin_mock))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn load(pairs: &[(&str, &str)], file: Option<&str>) -> Result<Config, ConfigError> {
        Config::load(env(pairs), file.map(|text| (Path::new("keel.toml"), text)))
    }

    #[test]
    fn nothing_configured_runs_the_builtin_fake_provider_on_loopback() {
        let config = load(&[], None).unwrap();
        assert_eq!(config.addr, DEFAULT_ADDR.parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(config.model.provider, ProviderKind::Mock);
        assert!(config.builtin_mock);
        assert_eq!(config.store, BackendKind::Redb);
        assert_eq!(config.token, None);
    }

    #[test]
    fn a_node_takes_its_name_url_and_lease_from_the_environment_or_the_file() {
        let shared = [
            ("KEEL_STORE", "postgres"),
            ("KEEL_DATABASE_URL", "postgres://keel@localhost/keel"),
            ("KEEL_TOKEN", "t"),
        ];
        let mut pairs = shared.to_vec();
        pairs.push(("KEEL_NODE", "n-1.a_b"));
        let node = load(&pairs, None).unwrap().node.unwrap();
        assert_eq!(node.name, "n-1.a_b");
        assert_eq!(node.url, None);
        assert_eq!(node.lease, DEFAULT_NODE_LEASE);
        let file = "node = \"n2\"\nnode_url = \"http://10.0.0.2:7777/\"\nnode_lease_ms = 2500\n";
        let node = load(&shared, Some(file)).unwrap().node.unwrap();
        assert_eq!(node.name, "n2");
        assert_eq!(node.url.as_deref(), Some("http://10.0.0.2:7777"));
        assert_eq!(node.lease, Duration::from_millis(2500));
        assert!(load(&shared, None).unwrap().node.is_none());
    }

    #[test]
    fn a_key_picks_its_provider_and_the_environment_wins_over_the_file() {
        let file = "model = \"from-file\"\n[anthropic]\napi_key = \"sk-file\"\n";
        let config = load(&[("KEEL_MODEL", "from-env")], Some(file)).unwrap();
        assert_eq!(config.model.provider, ProviderKind::Anthropic);
        assert_eq!(config.model.model, "from-env");
        assert_eq!(
            config.providers.anthropic.api_key.as_deref(),
            Some("sk-file")
        );
        assert!(!config.builtin_mock);

        let config = load(&[], Some(file)).unwrap();
        assert_eq!(config.model.model, "from-file");
    }

    #[test]
    fn a_local_openai_compatible_server_needs_a_model_but_no_key() {
        let base = ("OPENAI_BASE_URL", "http://localhost:11434/v1");
        let error = load(&[base], None).unwrap_err();
        assert_eq!(error.setting, "KEEL_MODEL");
        let config = load(&[base, ("KEEL_MODEL", "llama3.1")], None).unwrap();
        assert_eq!(config.model.provider, ProviderKind::OpenAi);
        assert_eq!(config.providers.openai.api_key, None);
    }

    #[test]
    fn the_sandbox_defaults_to_workspace_write_and_reads_its_settings() {
        let config = load(&[], None).unwrap();
        assert_eq!(config.sandbox, SandboxPolicy::default());
        assert!(!config.sandbox_full_access);

        let file = "[sandbox]\nmode = \"read-only\"\nnetwork = [\"*:443\", \"*:80\"]\n";
        let config = load(&[], Some(file)).unwrap();
        assert_eq!(config.sandbox.mode, SandboxMode::ReadOnly);
        assert_eq!(config.sandbox.network, NetworkAccess::Ports(vec![80, 443]));

        let config = load(
            &[
                ("KEEL_SANDBOX_NETWORK", "all"),
                ("KEEL_SANDBOX_FULL_ACCESS", "allow"),
            ],
            Some(file),
        )
        .unwrap();
        assert_eq!(config.sandbox.network, NetworkAccess::All);
        assert!(config.sandbox_full_access);

        let config = load(
            &[("KEEL_SANDBOX_NETWORK", "github.com:443, *.pypi.org:443")],
            None,
        )
        .unwrap();
        assert_eq!(
            config.sandbox.network.to_list(),
            ["*.pypi.org:443", "github.com:443"]
        );

        let config = load(&[("KEEL_SANDBOX", "full-access")], None).unwrap();
        assert!(
            config.sandbox_full_access,
            "the default implies the permission"
        );
    }

    #[test]
    fn unusable_settings_are_refused_naming_the_setting() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("KEEL_ADDR", "localhost")], "KEEL_ADDR"),
            (&[("KEEL_ADDR", "0.0.0.0:7777")], "KEEL_TOKEN"),
            (&[("KEEL_PROVIDER", "gemini")], "KEEL_PROVIDER"),
            (&[("KEEL_PROVIDER", "anthropic")], "ANTHROPIC_API_KEY"),
            (&[("KEEL_PROVIDER", "openai")], "OPENAI_API_KEY"),
            (&[("KEEL_STORE", "memory")], "KEEL_STORE"),
            (&[("KEEL_SANDBOX", "strict")], "KEEL_SANDBOX"),
            (
                &[("KEEL_SANDBOX_NETWORK", "github.com:https")],
                "KEEL_SANDBOX_NETWORK",
            ),
            (
                &[("KEEL_SANDBOX_FULL_ACCESS", "yes")],
                "KEEL_SANDBOX_FULL_ACCESS",
            ),
            (
                &[
                    ("KEEL_SANDBOX", "full-access"),
                    ("KEEL_SANDBOX_FULL_ACCESS", "deny"),
                ],
                "KEEL_SANDBOX_FULL_ACCESS",
            ),
            (&[("KEEL_STORE", "postgres")], "KEEL_DATABASE_URL"),
            (&[("KEEL_STORE", "mysql")], "KEEL_STORE"),
            (&[("KEEL_NODE", "n1")], "KEEL_NODE"),
            (
                &[("KEEL_NODE_URL", "http://10.0.0.1:7777")],
                "KEEL_NODE_URL",
            ),
            (
                &[
                    ("KEEL_STORE", "postgres"),
                    ("KEEL_DATABASE_URL", "postgres://keel@localhost/keel"),
                    ("KEEL_NODE", "n1"),
                ],
                "KEEL_TOKEN",
            ),
            (
                &[
                    ("KEEL_STORE", "postgres"),
                    ("KEEL_DATABASE_URL", "postgres://keel@localhost/keel"),
                    ("KEEL_TOKEN", "t"),
                    ("KEEL_NODE", "n 1"),
                ],
                "KEEL_NODE",
            ),
            (
                &[
                    ("KEEL_STORE", "postgres"),
                    ("KEEL_DATABASE_URL", "postgres://keel@localhost/keel"),
                    ("KEEL_TOKEN", "t"),
                    ("KEEL_NODE", "n1"),
                    ("KEEL_NODE_URL", "10.0.0.1:7777"),
                ],
                "KEEL_NODE_URL",
            ),
            (
                &[
                    ("KEEL_STORE", "postgres"),
                    ("KEEL_DATABASE_URL", "postgres://keel@localhost/keel"),
                    ("KEEL_TOKEN", "t"),
                    ("KEEL_NODE", "n1"),
                    ("KEEL_NODE_LEASE_MS", "100"),
                ],
                "KEEL_NODE_LEASE_MS",
            ),
            (
                &[("KEEL_DATABASE_URL", "postgres://keel@localhost/keel")],
                "KEEL_DATABASE_URL",
            ),
            (&[("KEEL_LOG_FORMAT", "xml")], "KEEL_LOG_FORMAT"),
            (
                &[("KEEL_SHUTDOWN_GRACE_MS", "-1")],
                "KEEL_SHUTDOWN_GRACE_MS",
            ),
            (&[("KEEL_IDLE_TIMEOUT_MS", "soon")], "KEEL_IDLE_TIMEOUT_MS"),
            (
                &[("KEEL_LIVE_INTERVAL_MS", "16ms")],
                "KEEL_LIVE_INTERVAL_MS",
            ),
            (&[("KEEL_MAX_MESSAGE_BYTES", "0")], "KEEL_MAX_MESSAGE_BYTES"),
            (
                &[("KEEL_MAX_MESSAGE_BYTES", "1MiB")],
                "KEEL_MAX_MESSAGE_BYTES",
            ),
        ];
        for (pairs, setting) in cases {
            let error = load(pairs, None).unwrap_err();
            assert_eq!(&error.setting, setting, "{pairs:?} -> {error}");
        }
    }

    #[test]
    fn the_message_size_limit_defaults_and_is_set_from_the_environment_or_the_file() {
        assert_eq!(
            load(&[], None).unwrap().max_message_bytes,
            DEFAULT_MAX_MESSAGE_BYTES
        );
        let config = load(&[("KEEL_MAX_MESSAGE_BYTES", "2048")], None).unwrap();
        assert_eq!(config.max_message_bytes, 2048);
        let config = load(&[], Some("max_message_bytes = 4096\n")).unwrap();
        assert_eq!(config.max_message_bytes, 4096);
    }

    #[test]
    fn the_worker_threads_are_tokios_unless_set_and_a_bad_count_is_refused() {
        assert_eq!(load(&[], None).unwrap().worker_threads, None);
        let config = load(&[("KEEL_WORKER_THREADS", "1")], None).unwrap();
        assert_eq!(config.worker_threads, Some(1));
        let config = load(&[], Some("worker_threads = 3\n")).unwrap();
        assert_eq!(config.worker_threads, Some(3));
        for bad in ["0", "-1", "two", "100000"] {
            let error = load(&[("KEEL_WORKER_THREADS", bad)], None).unwrap_err();
            assert_eq!(error.setting, "KEEL_WORKER_THREADS", "{bad}: {error}");
        }
    }

    #[test]
    fn a_non_loopback_address_is_accepted_with_a_token() {
        let config = load(
            &[("KEEL_ADDR", "0.0.0.0:7777"), ("KEEL_TOKEN", "s3cret")],
            None,
        )
        .unwrap();
        assert_eq!(config.token.as_deref(), Some("s3cret"));
    }

    #[test]
    fn a_misspelt_file_key_is_an_error() {
        let error = load(&[], Some("adress = \"127.0.0.1:1\"\n")).unwrap_err();
        assert_eq!(error.setting, "keel.toml");
        assert!(error.reason.contains("adress"), "{error}");
        let error = load(&[], Some("addr = [")).unwrap_err();
        assert_eq!(error.setting, "keel.toml");
    }

    #[test]
    fn the_live_interval_defaults_and_is_set_from_the_environment_or_the_file() {
        assert_eq!(
            load(&[], None).unwrap().live_interval,
            DEFAULT_LIVE_INTERVAL
        );
        let config = load(&[("KEEL_LIVE_INTERVAL_MS", "0")], None).unwrap();
        assert_eq!(config.live_interval, Duration::ZERO);
        let config = load(&[], Some("live_interval_ms = 40\n")).unwrap();
        assert_eq!(config.live_interval, Duration::from_millis(40));
    }

    #[test]
    fn the_file_sets_timeouts_by_their_own_names() {
        let config = load(&[], Some("[timeouts]\nidle_ms = 1500\n")).unwrap();
        assert_eq!(
            config.providers.timeouts.idle,
            std::time::Duration::from_millis(1500)
        );
    }
}
