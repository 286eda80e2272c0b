//! `keel serve`: the daemon. It reads its configuration (`config`), sets up
//! logs, traces and metrics, opens the store in the data dir, starts the
//! runtime (boot recovery, orphaned tool groups reaped), and serves the
//! HTTP API (`crate::api`) until SIGTERM or Ctrl-C, then stops gracefully
//! through the runtime's graceful stop and exits 0. A second signal exits
//! at once. See docs/daemon.md.
//!
//! Start-up is [`start`], which returns a [`Daemon`] running in this
//! process; `keel serve` and `keel demo` both go through it, and the demo
//! also uses [`Daemon::crash`] to kill one mid-turn and start another on
//! the same data dir.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context as _;
use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use keel_actors::core::config::SandboxMode;
use keel_actors::spawner::SpawnerCommand;
use keel_actors::store::{Availability, EventLog};
use keel_actors::tool::ToolRegistry;
use keel_actors::tool_sandbox::SandboxSettings;
use keel_actors::{BootReport, Runtime, RuntimeConfig, Settings};

use crate::api::error::storage_unavailable_message;
use crate::api::{self, AppState, MetricsRender};
use crate::config::{self, Config};
use crate::net;
use crate::telemetry::{self, LogFormat};
use crate::token;

/// The hidden subcommand this binary serves as the process spawner under
/// (`cli::Command::Spawner`).
pub const SPAWNER_COMMAND: &str = "spawner";

/// How long, after the signal, HTTP connections may take to finish their
/// request before the daemon stops waiting for them.
const HTTP_DRAIN: Duration = Duration::from_secs(5);

/// How long a crash drill waits for requests that were in flight to end
/// against the killed runtime and let go of the store.
const CRASH_DRAIN: Duration = Duration::from_secs(2);

/// What `keel serve` was given on the command line, and by the binary.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--config FILE`; else `KEEL_CONFIG`; else `./keel.toml` if present.
    pub config: Option<PathBuf>,
    /// How to start a fake provider in this process when no provider is
    /// configured ([`Config::builtin_mock`]). The daemon knows no fake
    /// provider of its own: the binary that composes it chooses one.
    /// `None`: such a configuration is refused.
    pub fake_provider: Option<StartFakeProvider>,
}

/// Starts a fake provider in this process (within the daemon's async
/// runtime) and returns its base URL, `http://HOST:PORT`.
pub type StartFakeProvider = fn() -> BoxFuture<'static, anyhow::Result<String>>;

/// Set by the drills and `keel bench` (keel-test-support's `ChildDaemon`) for the daemons they start:
/// the pid of the starting process, which this daemon must not outlive.
/// A drill killed by the OOM killer cannot stop its daemon itself.
pub const EXIT_WITH_PARENT_ENV: &str = "KEEL_EXIT_WITH_PARENT";

pub fn run(options: Options) -> anyhow::Result<()> {
    exit_with_parent()?;
    let config = load_config(&options)?;
    let format = match config.log_format.as_deref() {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Plain,
    };
    let _telemetry = telemetry::init_tracing(format)?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .enable_all()
        .global_queue_interval(GLOBAL_QUEUE_INTERVAL);
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let tokio_set = std::env::var_os("TOKIO_WORKER_THREADS").is_some();
    if let Some(threads) = worker_threads(config.worker_threads, cores, tokio_set) {
        builder.worker_threads(threads);
    }
    let runtime = builder.build().context("starting the async runtime")?;
    runtime.block_on(serve(config, options.fake_provider))
}

/// How many threads run the daemon's async work (docs/daemon.md, `KEEL_WORKER_THREADS`):
/// `KEEL_WORKER_THREADS` if set; else tokio's own count if
/// `TOKIO_WORKER_THREADS` is set (`None`: the builder is left to read it);
/// else one per core but one, and at least one. The spare core is for what
/// runs beside the workers on every turn (the store's committer, its reads,
/// the tool spawner, the tools): on a small machine a worker for every core
/// wakes its idle peers for nothing and costs CPU on each turn
/// (docs/benchmarks.md, "One async worker fewer than cores").
fn worker_threads(configured: Option<usize>, cores: usize, tokio_set: bool) -> Option<usize> {
    match configured {
        Some(threads) => Some(threads),
        None if tokio_set => None,
        None => Some(cores.saturating_sub(1).max(1)),
    }
}

/// With [`EXIT_WITH_PARENT_ENV`] set: be sent SIGKILL when the thread that
/// started this process ends (the kernel's parent-death signal; `ChildDaemon`
/// starts its daemons from the thread that lives as long as its process),
/// and stop at once if that already happened.
fn exit_with_parent() -> anyhow::Result<()> {
    let Some(value) = std::env::var_os(EXIT_WITH_PARENT_ENV) else {
        return Ok(());
    };
    let parent: i32 = value
        .to_str()
        .and_then(|text| text.parse().ok())
        .with_context(|| format!("{EXIT_WITH_PARENT_ENV} must be a pid, not {value:?}"))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .context("asking to die with the process that started this daemon")?;
    // Set only now: a parent that died before would go unnoticed.
    let now = nix::unistd::getppid().as_raw();
    anyhow::ensure!(
        now == parent,
        "the process that started this daemon ({parent}) is gone"
    );
    Ok(())
}

/// How many tasks a worker runs from its own queue before it takes one
/// from the runtime's shared queue: every time. An update to a
/// conversation wakes every one of its event streams at once; a worker's
/// own queue holds 256 tasks and the rest wait in the shared queue, which
/// tokio otherwise looks at only now and then. Streams woken again by the
/// turn's next update would then run ahead of streams still owed the
/// first, and with 1,000 subscribers the last of them got a frame twice as
/// late as the median. Taking turns keeps the wake-ups first come, first
/// served (docs/benchmarks.md, "SSE fan-out").
const GLOBAL_QUEUE_INTERVAL: u32 = 1;

fn load_config(options: &Options) -> anyhow::Result<Config> {
    let (path, asked) = match (&options.config, std::env::var_os("KEEL_CONFIG")) {
        (Some(path), _) => (path.clone(), true),
        (None, Some(path)) => (PathBuf::from(path), true),
        (None, None) => (PathBuf::from("keel.toml"), false),
    };
    let text = config::read_file(&path, asked)?;
    let file = text.as_deref().map(|text| (path.as_path(), text));
    Ok(Config::load(|name| std::env::var(name).ok(), file)?)
}

async fn serve(mut config: Config, fake_provider: Option<StartFakeProvider>) -> anyhow::Result<()> {
    if config.builtin_mock {
        let start = fake_provider.context(
            "no provider configured: set ANTHROPIC_API_KEY, OPENAI_API_KEY or KEEL_PROVIDER",
        )?;
        let url = start()
            .await
            .context("starting the built-in fake provider")?;
        config.providers.mock_url = Some(url);
    }
    let metrics: Option<MetricsRender> = match telemetry::install_metrics() {
        Ok(handle) => Some(Arc::new(move || handle.render())),
        Err(error) => {
            tracing::warn!(error = %error, "metrics are off");
            None
        }
    };
    let daemon = start(config, metrics).await?;
    if let Some(url) = &daemon.builtin_mock {
        tracing::warn!(
            %url,
            "no provider configured: using the built-in fake provider (set ANTHROPIC_API_KEY, OPENAI_API_KEY or KEEL_PROVIDER for a real one)"
        );
        say(&format!(
            "no provider configured: using the built-in fake provider at {url}"
        ))?;
    }
    say(&format!("keel listening on http://{}", daemon.addr))?;
    if let Some(path) = &daemon.token_file {
        say(&format!("token in {}", path.display()))?;
    }

    tokio::spawn(watch_signals(daemon.stop.clone()));
    let mut until_stop = daemon.stop.subscribe();
    let mut store = daemon.store_availability.clone();
    let mut fenced = daemon.cluster.as_ref().map(|cluster| cluster.fenced());
    let until_fenced = async {
        match &mut fenced {
            Some(fenced) => match fenced.wait_for(Option::is_some).await {
                Ok(why) => why.clone().unwrap_or_default(),
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    let reason = tokio::select! {
        _ = until_stop.wait_for(|stopping| *stopping) => None,
        reason = store.until_stopped() => Some(reason),
        why = until_fenced => {
            // Another node took this one's conversations over: nothing
            // more may be done here. Its supervisor starts it again under
            // a new epoch (docs/nodes.md, "Stepping down").
            daemon.abandon().await;
            anyhow::bail!("this node was fenced off and steps down: {why}");
        }
    };
    if let (Some(reason), Some(_)) = (&reason, &daemon.cluster) {
        if reason.contains("fenced off") {
            daemon.abandon().await;
            anyhow::bail!("this node was fenced off and steps down: {reason}");
        }
    }
    let Some(reason) = reason else {
        daemon.stop().await;
        say("keel stopped")?;
        return Ok(());
    };
    // The store stopped taking writes. It cannot be reopened under the
    // running runtime (redb refuses every call after a failed write until
    // its database is closed), so the daemon answers 503 with the reason
    // for a while, for health checks and clients to see why, then exits
    // non-zero for its supervisor to restart it on the same data, which
    // recovers from the log. A signal meanwhile exits at once.
    let exit_after = daemon.store_stopped_exit;
    let message = storage_unavailable_message(&reason);
    tracing::error!(
        reason = %reason,
        data_dir = %daemon.data_dir.display(),
        exit_in = ?exit_after,
        "the store stopped taking writes: answering 503 storage_unavailable, then exiting for the supervisor to restart keel"
    );
    tokio::select! {
        () = tokio::time::sleep(exit_after) => {}
        _ = until_stop.wait_for(|stopping| *stopping) => {}
    }
    daemon.abandon().await;
    anyhow::bail!("{message}")
}

/// A daemon running in this process: the runtime over the store in its
/// data dir and the HTTP API in front of it. `keel serve` runs one until a
/// signal; `keel demo` starts one, crashes it and starts another on the
/// same data dir, so both go through the same start-up.
pub struct Daemon {
    /// Where the API listens (the port chosen when `KEEL_ADDR` asked for 0).
    pub addr: SocketAddr,
    /// The bearer token every request but `/healthz` needs.
    pub token: String,
    /// Where the generated token was written; `None` when `KEEL_TOKEN` gave it.
    pub token_file: Option<PathBuf>,
    /// The built-in fake provider's URL, when no provider was configured.
    pub builtin_mock: Option<String>,
    /// What the runtime's boot did: conversations recovered, tool process
    /// groups reaped, conversations that could not be started.
    pub report: BootReport,
    runtime: Runtime,
    /// Set to true to stop: the HTTP server stops accepting and ends event
    /// streams. `keel serve`'s signal watcher sets it.
    stop: watch::Sender<bool>,
    server: JoinHandle<std::io::Result<()>>,
    /// Whether the store still takes writes: `serve` exits once it stops.
    store_availability: Availability,
    /// This daemon as a node among several, if it is one.
    cluster: Option<Arc<crate::cluster::Cluster>>,
    /// How long to answer 503 after the store stopped before exiting.
    store_stopped_exit: Duration,
    /// The data dir, for the log line when the store stops.
    data_dir: PathBuf,
    /// The store, held weakly: it is released (its files closed, the data
    /// dir's lock let go) once the runtime and every request are gone.
    store: Weak<dyn EventLog>,
}

/// The store a daemon runs on, and for a node (`KEEL_NODE`), its place
/// among the others.
type Opened = (Arc<dyn EventLog>, Option<Arc<crate::cluster::Cluster>>);

/// The store `config` names, and for a node, its place among the others.
fn open_store(config: &Config) -> anyhow::Result<Opened> {
    let data_dir = &config.data_dir;
    if let (Some(node), Some(url)) = (&config.node, &config.database_url) {
        let started = std::time::Instant::now();
        let (store, nodes) =
            keel_actors::store::open_postgres_node_with_dir(url, data_dir, &node.name, node.lease)
                .with_context(|| {
                    format!(
                "opening the postgres store (KEEL_DATABASE_URL) as node {} with data dir {}",
                node.name,
                data_dir.display()
            )
                })?;
        let cluster = crate::cluster::Cluster::new(nodes, node, started)?;
        return Ok((Arc::new(store), Some(cluster)));
    }
    let store = keel_actors::store::open(config.store, data_dir, config.database_url.as_deref())
        .with_context(|| match config.store {
            keel_actors::store::BackendKind::Postgres => {
                "opening the postgres store (KEEL_DATABASE_URL)".to_owned()
            }
            kind => format!(
                "opening the {kind} store in {} (is another keel using this data dir?)",
                data_dir.display()
            ),
        })?;
    Ok((store, None))
}

/// Open the store in `config.data_dir` and the runtime over it (boot
/// recovery, reaping), and serve the API on `config.addr`. Returns once
/// the listener is bound: requests are accepted from then on. When no
/// provider is configured ([`Config::builtin_mock`]), the caller has
/// started a fake provider and put its URL in `config.providers.mock_url`.
pub async fn start(config: Config, metrics: Option<MetricsRender>) -> anyhow::Result<Daemon> {
    let data_dir = &config.data_dir;
    std::fs::create_dir_all(data_dir).with_context(|| {
        format!(
            "creating the data dir {} (KEEL_DATA_DIR)",
            data_dir.display()
        )
    })?;
    let token = token::load_or_generate(config.token.clone(), data_dir)?;

    let builtin_mock = if config.builtin_mock {
        config.providers.mock_url.clone()
    } else {
        None
    };

    let (stop, stopping) = watch::channel(false);
    let (store, cluster) = open_store(&config)?;
    if let Some(cluster) = &cluster {
        // Before boot recovery, which may start tools: they run only
        // within the lease, which these keep renewing.
        cluster.spawn_heartbeats(stopping.clone());
    }
    let held_store = Arc::downgrade(&store);
    let store_availability = store.availability();
    let ownership = cluster.as_ref().map(|cluster| {
        Arc::new(crate::cluster::NodeOwnership(Arc::clone(cluster)))
            as Arc<dyn keel_actors::ownership::Ownership>
    });
    let (runtime, report) = Runtime::open_with_ownership(
        RuntimeConfig {
            store,
            providers: config.providers.clone(),
            tools: ToolRegistry::with_defaults(),
            process_dir: Some(data_dir.join("processes")),
            // This binary's `keel spawner`, started before the listener below
            // exists: tool spawns then cost the same with 10,000 clients
            // connected as with none (keel_actors::spawner).
            // A node's spawner kills its tools if the node dies: another
            // node may run the call again (docs/nodes.md).
            spawner: Some(if cluster.is_some() {
                SpawnerCommand::this_binary([SPAWNER_COMMAND, "--kill-on-exit"])
            } else {
                SpawnerCommand::this_binary([SPAWNER_COMMAND])
            }),
            settings: Settings {
                shutdown_grace: config.shutdown_grace,
                live_interval: config.live_interval,
                ..Settings::default()
            },
            mcp_servers: config.mcp_servers.clone(),
            sandbox: SandboxSettings {
                default: config.sandbox.clone(),
                allow_full_access: config.sandbox_full_access,
                data_dir: Some(data_dir.to_owned()),
                api_port: Some(config.addr.port()).filter(|port| *port != 0),
                protections: None,
            },
        },
        ownership,
    )
    .await
    .context("starting the runtime")?;
    log_sandbox(&runtime, &config);
    tracing::info!(
        recovered = report.recovered.len(),
        reaped = report.reaped.len(),
        failed = report.failed.len(),
        "runtime started"
    );
    for (id, why) in &report.failed {
        tracing::error!(conversation = %id, why, "could not recover");
    }

    let listener = match tokio::net::TcpListener::bind(config.addr).await {
        Ok(listener) => listener,
        Err(error) => {
            // Let go of the data dir before saying why we cannot serve it.
            runtime.shutdown().await;
            return Err(error).with_context(|| {
                format!(
                    "cannot listen on {} (KEEL_ADDR): is another daemon running there?",
                    config.addr
                )
            });
        }
    };
    let addr = listener.local_addr().context("reading the bound address")?;
    if let Some(cluster) = &cluster {
        cluster.set_runtime(runtime.clone());
        if cluster.url().is_empty() {
            let ip = match addr.ip() {
                ip if ip.is_unspecified() => std::net::IpAddr::from([127, 0, 0, 1]),
                ip => ip,
            };
            cluster.set_url(format!("http://{}", SocketAddr::new(ip, addr.port())));
        }
        cluster.heartbeat().await;
    }
    runtime.sandbox().block_port(addr.port());
    let cwd = std::env::current_dir().context("reading the working directory")?;
    let state = AppState::new(
        runtime.clone(),
        token.clone(),
        config.model.clone(),
        cwd,
        metrics,
        stopping.clone(),
    )
    .with_max_message_bytes(config.max_message_bytes)
    .with_cluster(cluster.clone());
    if let Some(cluster) = &cluster {
        cluster.spawn_takeovers(runtime.clone(), stopping.clone());
        tracing::info!(node = cluster.name(), url = cluster.url(), lease = ?cluster.lease, "serving as a node");
    }
    let router = api::router(state);
    tracing::info!(%addr, model = %config.model, data_dir = %data_dir.display(), "serving");

    // Every MCP server is started and its tools listed now, in the
    // background, so a server that cannot start or offers tools a provider
    // would refuse is said at start (logged; `keel mcp ls`).
    if !config.mcp_servers.is_empty() {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.mcp().probe().await });
    }
    if let Some(retention) = config.retention {
        tokio::spawn(crate::retention::sweep(
            runtime.clone(),
            retention,
            stopping.clone(),
        ));
    }
    let mut until_stop = stopping;
    // Served as a make-service that hands each connection the router as
    // it is (an `Arc` clone): `axum::serve` given the `Router` itself
    // rebuilds its whole route table for every connection (axum 0.8's
    // `with_state(())` per connection), which was a sixth of the daemon's
    // CPU for clients that open a connection per request
    // (docs/benchmarks.md, "A connection costs a route table").
    let server = axum::serve(net::no_delay(listener), router.into_make_service())
        .with_graceful_shutdown(async move {
            let _ = until_stop.wait_for(|stopping| *stopping).await;
        });
    let server = tokio::spawn(async move { server.await });
    Ok(Daemon {
        addr,
        token_file: config.token.is_none().then(|| token::token_path(data_dir)),
        token,
        builtin_mock,
        report,
        runtime,
        stop,
        server,
        store_availability,
        cluster,
        store_stopped_exit: config.store_stopped_exit,
        data_dir: data_dir.clone(),
        store: held_store,
    })
}

impl Daemon {
    /// Stop gracefully: no new connections, event streams end, and the
    /// runtime's graceful stop (turns in flight get the grace period,
    /// every conversation writes `SessionEnded` and a checkpoint). Returns
    /// once both are done.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        tracing::info!("stopping: no new requests; turns in flight get the grace period");
        let server = self.server;
        let shutdown = self.runtime.shutdown();
        let http = async {
            if tokio::time::timeout(HTTP_DRAIN, server).await.is_err() {
                tracing::warn!("some HTTP requests did not finish within {HTTP_DRAIN:?}");
            }
        };
        tokio::join!(shutdown, http);
        if let Some(cluster) = &self.cluster {
            // Nothing more is written here: the others may take over now
            // rather than a lease later (docs/nodes.md).
            match cluster.nodes().leave().await {
                Ok(()) => tracing::info!(node = cluster.name(), "left the nodes"),
                Err(error) => {
                    tracing::warn!(%error, "could not leave the nodes; the others take over once the lease runs out")
                }
            }
        }
        tracing::info!("stopped");
    }

    /// Give up after the store stopped taking writes: stop accepting and
    /// end event streams (requests in flight get their answer, a 503), then
    /// kill the runtime where it stands, as a crash would: it can record
    /// nothing more, and the next daemon on this data recovers from the
    /// log.
    async fn abandon(self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(HTTP_DRAIN, self.server).await.is_err() {
            tracing::warn!("some HTTP requests did not finish within {HTTP_DRAIN:?}");
        }
        self.runtime.crash().await;
    }

    /// Die as a crash would, for drills: the runtime is killed where it
    /// stands (`Runtime::crash`: no turn is interrupted or recorded, no
    /// `SessionEnded`, no checkpoint; running tools die with their process
    /// groups), then the HTTP server is torn down. Returns once the store is
    /// released, so a new daemon can open the same data dir and recover
    /// from the log as it would after a killed process.
    pub async fn crash(self) -> anyhow::Result<()> {
        // The runtime first: nothing may get a chance to write anything a
        // killed process would not have written.
        self.runtime.crash().await;
        let _ = self.stop.send(true);
        let mut server = self.server;
        if tokio::time::timeout(CRASH_DRAIN, &mut server)
            .await
            .is_err()
        {
            server.abort();
        }
        // Requests still in flight hold the runtime, and with it the store;
        // against a killed runtime they end at once.
        let deadline = tokio::time::Instant::now() + CRASH_DRAIN;
        while self.store.strong_count() > 0 {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the crashed daemon still holds its store after {CRASH_DRAIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

/// The first SIGTERM or Ctrl-C starts a graceful stop; a second one exits
/// at once.
async fn watch_signals(stop: watch::Sender<bool>) {
    stop_signal().await;
    let _ = stop.send(true);
    stop_signal().await;
    eprintln!("second signal: exiting now");
    std::process::exit(130);
}

/// The next SIGTERM or Ctrl-C (SIGTERM alone where Ctrl-C has no
/// handler). `keel mock-llm` stops on it too.
pub async fn stop_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            // No handler: wait for SIGTERM alone.
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => tokio::select! {
                () = ctrl_c => {}
                _ = terminate.recv() => {}
            },
            Err(_) => ctrl_c.await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}

/// A line for the person who started the daemon (and for tests, which
/// wait for `keel listening on`).
fn say(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

/// Say at start what the kernel lets keel enforce, and what tools run
/// under by default (docs/sandbox.md).
fn log_sandbox(runtime: &Runtime, config: &Config) {
    let protections = runtime.sandbox().protections();
    let default = &config.sandbox;
    let network = default.network.to_list().join(",");
    if protections.enough() {
        tracing::info!(
            kernel = %protections,
            default = default.mode.as_str(),
            network,
            full_access = if config.sandbox_full_access { "allowed" } else { "denied" },
            "tool sandbox: confined by Landlock and seccomp"
        );
    } else if default.mode == SandboxMode::FullAccess {
        tracing::warn!(
            kernel = %protections,
            "tool sandbox: this kernel cannot confine tools; they run unconfined (KEEL_SANDBOX=full-access)"
        );
    } else {
        tracing::warn!(
            kernel = %protections,
            default = default.mode.as_str(),
            "tool sandbox: this kernel cannot confine tools (Landlock ABI 6 and seccomp needed), \
             so tool calls fail with an error saying so; KEEL_SANDBOX=full-access runs them unconfined"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::worker_threads;

    #[test]
    fn the_workers_leave_a_core_spare_unless_a_count_is_set() {
        // Not set: one per core but one, and never none.
        assert_eq!(worker_threads(None, 1, false), Some(1));
        assert_eq!(worker_threads(None, 2, false), Some(1));
        assert_eq!(worker_threads(None, 8, false), Some(7));
        // KEEL_WORKER_THREADS wins over everything.
        assert_eq!(worker_threads(Some(3), 2, false), Some(3));
        assert_eq!(worker_threads(Some(2), 8, true), Some(2));
        // TOKIO_WORKER_THREADS alone: tokio's builder reads it.
        assert_eq!(worker_threads(None, 8, true), None);
    }
}
