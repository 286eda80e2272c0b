//! `keel serve`: the daemon. It reads its configuration (`config`), sets up
//! logs, traces and metrics, opens the store in the data dir, starts the
//! runtime (boot recovery, orphaned tool groups reaped), and serves the
//! HTTP API (`crate::api`) until SIGTERM or Ctrl-C, then stops gracefully
//! through the runtime's graceful stop and exits 0. A second signal exits
//! at once. See docs/daemon.md.

pub mod config;
pub mod token;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::watch;

use keel_actors::tool::ToolRegistry;
use keel_actors::{Runtime, RuntimeConfig, Settings};

use crate::api::{self, AppState, MetricsRender};
use crate::mock_llm;
use crate::net;
use crate::telemetry::{self, LogFormat};
use config::Config;

/// How long, after the signal, HTTP connections may take to finish their
/// request before the daemon stops waiting for them.
const HTTP_DRAIN: Duration = Duration::from_secs(5);

/// What `keel serve` was given on the command line.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--config FILE`; else `KEEL_CONFIG`; else `./keel.toml` if present.
    pub config: Option<PathBuf>,
}

pub fn run(options: Options) -> anyhow::Result<()> {
    let config = load_config(&options)?;
    let format = match config.log_format.as_deref() {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Plain,
    };
    let _telemetry = telemetry::init_tracing(format)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(config))
}

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

async fn serve(mut config: Config) -> anyhow::Result<()> {
    let data_dir = &config.data_dir;
    std::fs::create_dir_all(data_dir).with_context(|| {
        format!(
            "creating the data dir {} (KEEL_DATA_DIR)",
            data_dir.display()
        )
    })?;
    let token = token::load_or_generate(config.token.clone(), data_dir)?;

    if config.builtin_mock {
        let url = start_builtin_mock().await?;
        tracing::warn!(
            %url,
            "no provider configured: using the built-in fake provider (set ANTHROPIC_API_KEY, OPENAI_API_KEY or KEEL_PROVIDER for a real one)"
        );
        say(&format!(
            "no provider configured: using the built-in fake provider at {url}"
        ))?;
        config.providers.mock_url = Some(url);
    }

    let store = keel_actors::store::open(config.store, data_dir).with_context(|| {
        format!(
            "opening the {} store in {} (is another keel using this data dir?)",
            config.store,
            data_dir.display()
        )
    })?;
    let metrics: Option<MetricsRender> = match telemetry::install_metrics() {
        Ok(handle) => Some(Arc::new(move || handle.render())),
        Err(error) => {
            tracing::warn!(error = %error, "metrics are off");
            None
        }
    };
    let (runtime, report) = Runtime::open(RuntimeConfig {
        store,
        providers: config.providers.clone(),
        tools: ToolRegistry::with_defaults(),
        process_dir: Some(data_dir.join("processes")),
        settings: Settings {
            shutdown_grace: config.shutdown_grace,
            ..Settings::default()
        },
    })
    .await
    .context("starting the runtime")?;
    tracing::info!(
        recovered = report.recovered.len(),
        reaped = report.reaped.len(),
        failed = report.failed.len(),
        "runtime started"
    );
    for (id, why) in &report.failed {
        tracing::error!(conversation = %id, why, "could not recover");
    }

    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (KEEL_ADDR): is another daemon running there?",
                config.addr
            )
        })?;
    let address = listener.local_addr().context("reading the bound address")?;
    let (stop, stopping) = watch::channel(false);
    let cwd = std::env::current_dir().context("reading the working directory")?;
    let state = AppState::new(
        runtime.clone(),
        token,
        config.model.clone(),
        cwd,
        metrics,
        stopping.clone(),
    );
    let router = api::router(state);
    tracing::info!(%address, model = %config.model, data_dir = %data_dir.display(), "serving");
    say(&format!("keel listening on http://{address}"))?;
    if config.token.is_none() {
        say(&format!(
            "token in {}",
            token::token_path(data_dir).display()
        ))?;
    }

    tokio::spawn(watch_signals(stop));
    let mut until_stop = stopping.clone();
    let server = axum::serve(net::no_delay(listener), router).with_graceful_shutdown(async move {
        let _ = until_stop.wait_for(|stopping| *stopping).await;
    });
    let server = tokio::spawn(async move { server.await });
    let mut until_stop = stopping.clone();
    let _ = until_stop.wait_for(|stopping| *stopping).await;
    tracing::info!("stopping: no new requests; turns in flight get the grace period");
    let shutdown = runtime.shutdown();
    let http = async {
        if tokio::time::timeout(HTTP_DRAIN, server).await.is_err() {
            tracing::warn!("some HTTP requests did not finish within {HTTP_DRAIN:?}");
        }
    };
    tokio::join!(shutdown, http);
    tracing::info!("stopped");
    say("keel stopped")?;
    Ok(())
}

/// The first SIGTERM or Ctrl-C starts a graceful stop; a second one exits
/// at once.
async fn watch_signals(stop: watch::Sender<bool>) {
    signal().await;
    let _ = stop.send(true);
    signal().await;
    eprintln!("second signal: exiting now");
    std::process::exit(130);
}

async fn signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
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

/// Start the fake provider in this process on a free loopback port.
async fn start_builtin_mock() -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding the built-in fake provider")?;
    let address = listener.local_addr().context("reading its address")?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(
            net::no_delay(listener),
            mock_llm::app(mock_llm::Mock::default()),
        )
        .await
        {
            tracing::error!(error = %error, "the built-in fake provider stopped");
        }
    });
    Ok(format!("http://{address}"))
}

/// A line for the person who started the daemon (and for tests, which
/// wait for `keel listening on`).
fn say(line: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}
