//! Logs, traces and metrics for the binary, installed in one place so the
//! daemon and any other long-running command set them up alike.
//!
//! - [`init_tracing`]: log lines to stderr (plain or JSON, `KEEL_LOG_FORMAT`),
//!   filtered by `RUST_LOG`; and, only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, the runtime's spans
//!   exported over OTLP HTTP/protobuf. keel-actors names its spans after the
//!   OpenTelemetry GenAI conventions (`invoke_agent keel` per turn, `chat
//!   {model}` per LLM request, `execute_tool {name}` per tool run), so a GenAI
//!   aware backend reads them as they are.
//! - [`install_metrics`]: a Prometheus recorder for the metrics keel-actors
//!   emits (their names: [`keel_actors::metrics`]), rendered on demand by
//!   [`MetricsHandle::render`]: whoever serves `/metrics` calls it; nothing
//!   here listens on a port.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context};
use keel_actors::metrics as names;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The filter when `RUST_LOG` is unset or empty. ractor's own spans (an
/// `Actor` span around every actor's start and loop, entered at each poll)
/// are left out: keel's spans already name the conversation, turn, request
/// and tool, and ractor's cost about 3% of the daemon's work per tool turn
/// (docs/benchmarks.md, "Work per turn counted by instructions").
pub const DEFAULT_FILTER: &str = "info,keel=info,ractor=warn";

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line per event for people.
    #[default]
    Plain,
    /// One JSON object per event, with its spans, for log collectors.
    Json,
}

impl LogFormat {
    /// The variable [`LogFormat::from_env`] reads.
    pub const ENV: &'static str = "KEEL_LOG_FORMAT";

    /// `KEEL_LOG_FORMAT`: `plain` (also when unset or empty) or `json`. Any
    /// other value is an error rather than a silent default, so a typo in a
    /// deployment does not quietly change what the log collector receives.
    pub fn from_env() -> anyhow::Result<LogFormat> {
        LogFormat::from_setting(std::env::var_os(LogFormat::ENV))
    }

    fn from_setting(value: Option<OsString>) -> anyhow::Result<LogFormat> {
        let Some(value) = value else {
            return Ok(LogFormat::Plain);
        };
        let Some(text) = value.to_str() else {
            bail!("{}: not UTF-8; use plain or json", LogFormat::ENV);
        };
        if text.trim().is_empty() {
            return Ok(LogFormat::Plain);
        }
        text.parse()
            .with_context(|| format!("{} is unusable", LogFormat::ENV))
    }
}

impl FromStr for LogFormat {
    type Err = anyhow::Error;

    /// `plain` or `json`, in any case, around any whitespace.
    fn from_str(text: &str) -> anyhow::Result<LogFormat> {
        match text.trim().to_ascii_lowercase().as_str() {
            "plain" => Ok(LogFormat::Plain),
            "json" => Ok(LogFormat::Json),
            _ => bail!("unknown log format {text:?}; use plain or json"),
        }
    }
}

/// Keeps trace export running; dropping it shuts the tracer provider down,
/// which exports the spans still batched (waiting up to 5 s for the
/// collector). Hold it in `main` for the life of the process: spans closed
/// after it drops are not exported.
#[must_use = "dropping the guard stops trace export at once"]
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are being exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(error) = provider.shutdown() {
                tracing::warn!(%error, "could not export the last spans");
            }
        }
    }
}

/// Install the process's tracing subscriber: a registry filtered by
/// `RUST_LOG` (default [`DEFAULT_FILTER`]; an invalid filter is an error),
/// a fmt layer writing `format` to stderr, and, when an OTLP endpoint is
/// configured, a tracing-opentelemetry layer exporting spans over OTLP
/// HTTP/protobuf with `service.name=keel`. The exporter reads the standard
/// `OTEL_EXPORTER_OTLP_*` variables (endpoint, headers, timeout); nothing
/// is exported when no endpoint is set. `RUST_LOG` governs the export too:
/// spans it filters out are neither logged nor exported (keel's spans are
/// at `info`).
///
/// Fails if a global subscriber is already installed.
pub fn init_tracing(format: LogFormat) -> anyhow::Result<TelemetryGuard> {
    let filter = env_filter()?;
    let provider = if otlp_configured() {
        Some(tracer_provider(None)?)
    } else {
        None
    };
    let fmt = match format {
        LogFormat::Plain => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let otel = provider.as_ref().map(otel_layer);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    // Built first so that a failed install still shuts the provider down.
    let guard = TelemetryGuard { provider };
    installed.context("cannot install the tracing subscriber: one is already installed")?;
    Ok(guard)
}

/// `RUST_LOG`, or [`DEFAULT_FILTER`] when it is unset or empty.
fn env_filter() -> anyhow::Result<EnvFilter> {
    let directives = match std::env::var("RUST_LOG") {
        Ok(value) if !value.trim().is_empty() => value,
        Ok(_) | Err(std::env::VarError::NotPresent) => DEFAULT_FILTER.to_owned(),
        Err(std::env::VarError::NotUnicode(_)) => bail!("RUST_LOG is not UTF-8"),
    };
    EnvFilter::try_new(&directives).with_context(|| format!("RUST_LOG={directives:?} is invalid"))
}

/// An OTLP endpoint is set: the general one or the traces-only one (the
/// exporter honours both, the latter first).
fn otlp_configured() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

/// A tracer provider batching spans to an OTLP HTTP/protobuf exporter.
/// `endpoint` is the full URL of the traces endpoint; `None` leaves it to
/// the `OTEL_EXPORTER_OTLP_*` variables (the general endpoint gets
/// `/v1/traces` appended).
fn tracer_provider(endpoint: Option<&str>) -> anyhow::Result<SdkTracerProvider> {
    // The exporter builds a reqwest client, which needs a crypto provider
    // installed (keel's reqwest has none of its own).
    keel_api::http::install_crypto_provider();
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary);
    if let Some(endpoint) = endpoint {
        exporter = exporter.with_endpoint(endpoint);
    }
    let exporter = exporter
        .build()
        .context("cannot set up the OTLP trace exporter")?;
    Ok(SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name("keel").build())
        // The SDK's batch processor exports from a thread of its own, with
        // the blocking client, so it needs no async runtime.
        .with_batch_exporter(exporter)
        .build())
}

fn otel_layer<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("keel"))
}

/// `/metrics`' own families, beside the runtime's
/// ([`keel_actors::metrics::ALL`]); docs/daemon.md lists them all.
pub const HTTP_REQUESTS_TOTAL: &str = "keel_http_requests_total";
pub const EVENT_STREAMS_OPEN: &str = "keel_event_streams_open";
/// Read at scrape time from the runtime, not recorded.
pub const LIVE_CONVERSATIONS: &str = "keel_live_conversations";
/// Read at scrape time from the store: 1 while it takes writes, else 0.
pub const STORE_AVAILABLE: &str = "keel_store_available";

/// Several nodes (docs/nodes.md): requests this node forwarded to the
/// node owning their conversation, by `outcome` (`ok`: passed on whatever
/// the owner answered; `unreachable`: the owner could not be reached).
pub const NODE_FORWARDED_TOTAL: &str = "keel_node_forwarded_requests_total";
/// Conversation trees this node took over from fenced nodes.
pub const NODE_TAKEOVERS_TOTAL: &str = "keel_node_takeovers_total";
/// Nodes this node fenced (not heard from within their lease).
pub const NODE_FENCED_TOTAL: &str = "keel_node_fenced_total";
/// 1 while this node's lease is current, by its last heartbeat; 0 once it
/// lapsed or the node was fenced (and 0 for a daemon that is not a node).
pub const NODE_LEASE_CURRENT: &str = "keel_node_lease_current";

/// Every family the daemon's `/metrics` lists from its start.
pub fn families() -> Vec<&'static str> {
    let mut all = names::ALL.to_vec();
    all.extend([
        HTTP_REQUESTS_TOTAL,
        EVENT_STREAMS_OPEN,
        LIVE_CONVERSATIONS,
        STORE_AVAILABLE,
        NODE_FORWARDED_TOTAL,
        NODE_TAKEOVERS_TOTAL,
        NODE_FENCED_TOTAL,
        NODE_LEASE_CURRENT,
    ]);
    all
}

/// The nodes' series, at zero, so a dashboard has them from the start.
pub fn register_node_metrics() {
    for outcome in ["ok", "unreachable"] {
        metrics::counter!(NODE_FORWARDED_TOTAL, "outcome" => outcome).increment(0);
    }
    metrics::counter!(NODE_TAKEOVERS_TOTAL).increment(0);
    metrics::counter!(NODE_FENCED_TOTAL).increment(0);
    metrics::gauge!(NODE_LEASE_CURRENT).set(0.0);
}

/// Renders the installed Prometheus recorder's metrics.
#[derive(Debug, Clone)]
pub struct MetricsHandle {
    handle: PrometheusHandle,
}

impl MetricsHandle {
    /// Every metric recorded so far, in the Prometheus text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

/// Buckets of the seconds histograms, chosen for what each measures: an
/// append is a local write (sub-millisecond in memory, a few ms with an
/// fsync), a first token comes in about a second, a turn can run for
/// minutes.
const BUCKETS: [(&str, &[f64]); 4] = [
    (
        names::APPEND_SECONDS,
        &[
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
        ],
    ),
    (
        names::LLM_TIME_TO_FIRST_TOKEN_SECONDS,
        &[0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0],
    ),
    // OpenTelemetry's advised boundaries for gen_ai.client.token.usage.
    (
        names::TOKEN_USAGE,
        &[
            1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
            4194304.0, 16777216.0, 67108864.0,
        ],
    ),
    (
        names::TURN_DURATION_SECONDS,
        &[
            0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
        ],
    ),
];

/// How often the recorder's histograms are drained when nobody renders
/// them (the exporter's own default).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Install the Prometheus recorder as the process's `metrics` recorder,
/// without its HTTP listener, and describe keel's metrics to it.
///
/// Idempotent: the first call installs it and every later call returns a
/// handle to the same recorder (a process has one global recorder). If
/// some other recorder was installed first, every call fails saying so.
pub fn install_metrics() -> anyhow::Result<MetricsHandle> {
    static INSTALLED: OnceLock<Result<MetricsHandle, String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| install_prometheus().map_err(|error| format!("{error:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn install_prometheus() -> anyhow::Result<MetricsHandle> {
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in BUCKETS {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .with_context(|| format!("the buckets of {name}"))?;
    }
    let handle = builder.install_recorder().context(
        "cannot install the Prometheus metrics recorder: \
         another metrics recorder is already installed in this process",
    )?;
    names::describe();
    metrics::describe_counter!(
        HTTP_REQUESTS_TOTAL,
        "HTTP requests answered, by method, route template and status."
    );
    metrics::describe_gauge!(EVENT_STREAMS_OPEN, "Event streams (SSE) open now.");
    metrics::describe_counter!(
        NODE_FORWARDED_TOTAL,
        "Requests forwarded to the node owning their conversation, by outcome."
    );
    metrics::describe_counter!(
        NODE_TAKEOVERS_TOTAL,
        "Conversation trees this node took over from fenced nodes."
    );
    metrics::describe_counter!(NODE_FENCED_TOTAL, "Nodes this node fenced.");
    metrics::describe_gauge!(
        NODE_LEASE_CURRENT,
        "1 while this node's lease is current; 0 otherwise, and for a daemon that is not a node."
    );
    // Without the exporter's listener nothing drains the histograms but a
    // render; drain them on a schedule so they stay small between scrapes,
    // or when nobody scrapes at all. A plain thread: this works with or
    // without an async runtime, and lives as long as the global recorder.
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("keel-metrics-upkeep".to_owned())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            upkeep.run_upkeep();
        })
        .context("cannot start the metrics upkeep thread")?;
    Ok(MetricsHandle { handle })
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;

    use keel_actors::core::ProviderKind;
    use keel_actors::metrics::{self, RequestOutcome, StoreOp, TurnOutcome};

    use super::*;

    #[test]
    fn log_formats_parse_and_anything_else_is_refused() {
        assert_eq!("plain".parse::<LogFormat>().unwrap(), LogFormat::Plain);
        assert_eq!(" JSON ".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert!("yaml".parse::<LogFormat>().is_err());
        assert!("".parse::<LogFormat>().is_err());

        let setting = |value: Option<&str>| LogFormat::from_setting(value.map(OsString::from));
        assert_eq!(setting(None).unwrap(), LogFormat::Plain);
        assert_eq!(setting(Some("")).unwrap(), LogFormat::Plain);
        assert_eq!(setting(Some("json")).unwrap(), LogFormat::Json);
        let error = setting(Some("jsonl")).unwrap_err();
        assert!(
            format!("{error:#}").contains("KEEL_LOG_FORMAT"),
            "{error:#}"
        );
    }

    #[test]
    fn installed_metrics_render_every_keel_metric() {
        let handle = install_metrics().unwrap();
        // A second install reuses the recorder rather than failing.
        let again = install_metrics().unwrap();

        metrics::turn_ended(TurnOutcome::Completed, Some(Duration::from_millis(1500)));
        metrics::turn_ended(TurnOutcome::Interrupted, None);
        metrics::llm_retry();
        metrics::llm_fallback();
        metrics::llm_request(ProviderKind::Anthropic, RequestOutcome::Ok);
        metrics::llm_first_token(ProviderKind::Anthropic, Duration::from_millis(300));
        metrics::tool_run("bash", false);
        metrics::cancel();
        metrics::append(Duration::from_micros(200));
        metrics::token_usage(ProviderKind::Anthropic, 1200, 80);
        metrics::store_error(StoreOp::Write);
        metrics::mcp_call("files", "cancelled");

        let text = again.render();
        for name in metrics::ALL {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        assert!(
            text.contains(r#"keel_turns_total{outcome="completed"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"keel_tool_runs_total{tool="bash",outcome="ok"} 1"#),
            "{text}"
        );
        // Histograms with buckets, not summaries.
        assert!(
            text.contains("keel_append_seconds_bucket{le=\"0.00025\"} 1"),
            "{text}"
        );
        assert!(text.contains("# HELP keel_cancels_total"), "{text}");
        assert!(
            text.contains(r#"keel_mcp_calls_total{server="files",outcome="cancelled"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gen_ai_client_token_usage_sum{gen_ai_token_type="input",gen_ai_provider_name="anthropic"} 1200"#
            ),
            "{text}"
        );
        assert!(handle.render().contains("keel_cancels_total"));
    }

    #[test]
    fn tracing_installs_once_per_process() {
        // The only test here that installs the global subscriber.
        let guard = init_tracing(LogFormat::Json).unwrap();
        tracing::info!(answer = 42, "telemetry test");
        let error = init_tracing(LogFormat::Plain).unwrap_err();
        assert!(
            format!("{error:#}").contains("already installed"),
            "{error:#}"
        );
        drop(guard);
    }

    /// A loopback OTLP collector that answers one request and returns its
    /// request line, headers and body length.
    fn collector() -> (
        String,
        std::thread::JoinHandle<(String, Vec<String>, usize)>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        let served = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut headers = Vec::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line.trim().is_empty() {
                    break;
                }
                headers.push(line.trim().to_ascii_lowercase());
            }
            let length: usize = headers
                .iter()
                .find_map(|header| header.strip_prefix("content-length:"))
                .map(|value| value.trim().parse().unwrap())
                .unwrap_or(0);
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let mut stream = stream;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .unwrap();
            (request_line.trim().to_owned(), headers, body.len())
        });
        (url, served)
    }

    #[test]
    fn spans_are_exported_over_otlp_http_protobuf_when_the_provider_shuts_down() {
        let (url, served) = collector();
        let provider = tracer_provider(Some(&url)).unwrap();
        let guard = TelemetryGuard {
            provider: Some(provider.clone()),
        };
        let subscriber = tracing_subscriber::registry().with(otel_layer(&provider));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "llm_request",
                otel.name = "chat claude-mock",
                gen_ai.operation.name = "chat",
            );
            span.in_scope(|| tracing::info!("inside"));
        });
        assert!(guard.exporting());
        // Dropping the guard flushes the batch.
        drop(guard);

        let (request_line, headers, body) = served.join().unwrap();
        assert_eq!(request_line, "POST /v1/traces HTTP/1.1");
        assert!(
            headers.contains(&"content-type: application/x-protobuf".to_owned()),
            "{headers:?}"
        );
        assert!(body > 0);
    }
}
