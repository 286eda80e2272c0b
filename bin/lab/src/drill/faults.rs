//! `keel drill faults`: the fault matrix. Every fault the fake provider
//! can stage (each error status, `retry-after`, a cut mid-stream, malformed
//! SSE, an error event, a slow drip, a hang, a stall, a refused
//! connection), in both wire formats, with and without a fallback, and
//! once (the fault, then a healthy answer). Each case is one turn of a
//! fresh conversation on a real daemon (keel-daemon's `daemon::start`, the same start-up
//! as `keel serve`, over a temporary data dir) against the fake provider
//! (`keel mock-llm`'s server), both in this process on loopback, driven
//! over HTTP and SSE as any client would.
//!
//! What a case reads off the conversation's event stream: the states it
//! passed through, each retry and its delay, a fallback, which model
//! answered, how the turn ended and the state it came to rest in; and off
//! the fake provider's recording, how many requests each wire format got.
//! It checks them against what keel promises for that fault
//! (docs/drills.md): a fault worth retrying is retried `max_retries` times
//! and then handed to the fallback (or fails the turn, saying how often it
//! was tried); a final one (a 4xx) fails the turn at once and is never
//! retried or handed over; a slow but healthy answer completes untouched.

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use serde::Serialize;
use serde_json::{json, Value};

use keel_api::client::{Client, Frame};
use keel_api::types::{
    ApiEventKind, ApiLiveEvent, ApiModelChoice, ApiProvider, ApiRetry, ApiState, CreateConversation,
};
use keel_daemon::config::Config;
use keel_daemon::daemon;

mod matrix;
mod seen;
use matrix::*;
use seen::*;

/// Retries per provider in every case: enough to see the backoff, few
/// enough to keep the matrix quick.
const MAX_RETRIES: u32 = 2;
/// Backoff of the cases: 10 ms doubling to 20 ms.
const BASE_DELAY_MS: u64 = 10;
const MAX_DELAY_MS: u64 = 20;
/// The cap on `retry-after`: the 429 case asks for 1 s and must wait this.
const RETRY_AFTER_CAP_MS: u64 = 80;
/// The daemon's provider clocks: a hang or a stall counts as a (retryable)
/// timeout after this long. Long enough that a healthy answer on a loaded
/// machine never reaches it (a false timeout would show as a retry the
/// case did not expect).
const PROVIDER_TIMEOUT_MS: u64 = 750;
/// The longest one case may take before it is reported stuck.
const CASE_LIMIT: Duration = Duration::from_secs(30);
/// Models the fake provider is asked for, by wire format.
const ANTHROPIC_MODEL: &str = "claude-drill";
const OPENAI_MODEL: &str = "gpt-drill";
/// The message every case sends; the fake provider's default reply
/// echoes it.
const MESSAGE: &str = "one two three four five";

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Run only the cases whose fault name contains this.
    pub only: Option<String>,
    /// One JSON object per case, then a summary object.
    pub json: bool,
}

/// What the drill found: every case, and whether all met expectations.
#[derive(Debug, Serialize)]
pub struct Report {
    pub cases: Vec<CaseReport>,
    pub passed: usize,
    pub failed: usize,
}

impl Report {
    pub fn all_passed(&self) -> bool {
        self.failed == 0
    }
}

/// Run the matrix, printing each case as it ends.
pub fn run(mut out: impl Write, options: Options) -> anyhow::Result<Report> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let lab = Lab::start().await?;
        let outcome = drive(&lab, &mut out, &options).await;
        lab.stop().await;
        outcome
    })
}

async fn drive(lab: &Lab, out: &mut impl Write, options: &Options) -> anyhow::Result<Report> {
    let cases: Vec<Case> = matrix()
        .into_iter()
        .filter(|case| {
            options
                .only
                .as_deref()
                .is_none_or(|only| case.fault.name.contains(only))
        })
        .collect();
    if cases.is_empty() {
        return Err(anyhow!(
            "no fault matches {:?}; the faults are: {}",
            options.only.as_deref().unwrap_or_default(),
            FAULTS
                .iter()
                .map(|fault| fault.name)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !options.json {
        writeln!(
            out,
            "keel drill faults: {} cases, {MAX_RETRIES} retries each, provider timeouts {PROVIDER_TIMEOUT_MS} ms\n",
            cases.len()
        )?;
    }
    let mut reports = Vec::new();
    for case in cases {
        let report = match lab.run(&case).await {
            Ok(seen) => CaseReport::new(&case, seen),
            Err(error) => CaseReport::broken(&case, format!("{error:#}")),
        };
        if options.json {
            writeln!(out, "{}", serde_json::to_string(&report)?)?;
        } else {
            write!(out, "{report}")?;
        }
        out.flush()?;
        reports.push(report);
    }
    let failed = reports.iter().filter(|report| !report.passed).count();
    let report = Report {
        passed: reports.len() - failed,
        failed,
        cases: reports,
    };
    if options.json {
        writeln!(
            out,
            "{}",
            json!({"summary": {"passed": report.passed, "failed": report.failed}})
        )?;
    } else {
        writeln!(
            out,
            "\n{} of {} cases reached their expected end state{}",
            report.passed,
            report.passed + report.failed,
            if report.failed == 0 {
                String::new()
            } else {
                format!("; {} did not (above, marked FAIL)", report.failed)
            }
        )?;
    }
    Ok(report)
}

// --- the lab: a fake provider and a daemon ------------------------------

struct Lab {
    mock_url: String,
    http: reqwest::Client,
    client: Client,
    daemon: daemon::Daemon,
    /// Held for its drop, which removes the data dir.
    _data: tempfile::TempDir,
}

impl Lab {
    async fn start() -> anyhow::Result<Lab> {
        let mock_url =
            crate::mock_llm::start_in_process(crate::mock_llm::Settings::default()).await?;
        // A port nobody listens on: bound, read, let go.
        let refused = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .context("finding a free port for the refused connection")?;
        let data = tempfile::Builder::new()
            .prefix("keel-drill-")
            .tempdir()
            .context("creating a temporary data dir")?;
        let config = config(data.path(), &mock_url, &format!("http://{refused}"))?;
        let daemon = daemon::start(config, None).await?;
        let client = Client::new(&daemon.addr.to_string(), Some(daemon.token.clone()));
        Ok(Lab {
            mock_url,
            http: keel_api::http::client(),
            client,
            daemon,
            _data: data,
        })
    }

    async fn stop(self) {
        self.daemon.stop().await;
    }

    /// Ask the fake provider something over its own API.
    async fn mock(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.mock_url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("asking the fake provider ({path})"))?;
        let status = response.status();
        let value: Value = response
            .json()
            .await
            .with_context(|| format!("reading the fake provider's answer ({path})"))?;
        if !status.is_success() {
            return Err(anyhow!(
                "the fake provider refused {path}: {status} {value}"
            ));
        }
        Ok(value)
    }

    async fn run(&self, case: &Case) -> anyhow::Result<Seen> {
        self.mock(reqwest::Method::DELETE, "/_mock/script", None)
            .await?;
        self.mock(reqwest::Method::DELETE, "/_mock/requests", None)
            .await?;
        if let (Some(entry), Some(endpoint)) = (case.fault.entry, case.wire.endpoint()) {
            let times = match case.mode {
                Mode::Always => MAX_RETRIES + 1,
                Mode::Once => 1,
            };
            let mut entry = entry();
            if let Some(object) = entry.as_object_mut() {
                object.insert("endpoint".to_owned(), json!(endpoint));
            }
            let entries: Vec<Value> = (0..times).map(|_| entry.clone()).collect();
            self.mock(
                reqwest::Method::POST,
                "/_mock/script",
                Some(Value::Array(entries)),
            )
            .await?;
        }
        let request = CreateConversation {
            provider: Some(case.wire.provider()),
            model: Some(case.wire.model().to_owned()),
            fallback: case.fallback.then(|| ApiModelChoice {
                provider: case.wire.other().provider(),
                model: Some(case.wire.other().model().to_owned()),
            }),
            retry: Some(ApiRetry {
                max_retries: Some(MAX_RETRIES),
                base_delay_ms: Some(BASE_DELAY_MS),
                max_delay_ms: Some(MAX_DELAY_MS),
                retry_after_cap_ms: Some(RETRY_AFTER_CAP_MS),
            }),
            ..CreateConversation::default()
        };
        let id = self.client.create(&request).await?.id;
        let mut seen = tokio::time::timeout(CASE_LIMIT, self.one_turn(&id))
            .await
            .map_err(|_| anyhow!("conversation {id} was still busy after {CASE_LIMIT:?}"))??;
        let records = self
            .mock(reqwest::Method::GET, "/_mock/requests", None)
            .await?;
        for record in records.as_array().into_iter().flatten() {
            if let Some(endpoint) = record.get("endpoint").and_then(Value::as_str) {
                *seen.requests.entry(endpoint.to_owned()).or_default() += 1;
            }
        }
        Ok(seen)
    }

    /// Send the message and follow the turn to its end and the state it
    /// rests in.
    async fn one_turn(&self, id: &str) -> anyhow::Result<Seen> {
        let mut events = self.client.events(id, None);
        // The stream is open (its snapshot came) before the message goes.
        match events.next().await? {
            Frame::Snapshot(_) => {}
            other => return Err(anyhow!("the stream began with {other:?}")),
        }
        self.client.send_text(id, MESSAGE).await?;
        let mut seen = Seen::default();
        loop {
            match events.next().await? {
                Frame::Live(ApiLiveEvent::StateChanged { state }) => {
                    let name = state_name(state);
                    if seen.trail.last() != Some(&name) {
                        seen.trail.push(name);
                    }
                    if seen.end.is_some() {
                        seen.state = Some(state);
                        return Ok(seen);
                    }
                }
                Frame::Live(ApiLiveEvent::Retrying {
                    retry, delay_ms, ..
                }) => {
                    seen.retry_delays_ms.push(delay_ms);
                    seen.trail.push(format!("retry {retry} in {delay_ms} ms"));
                }
                Frame::Live(ApiLiveEvent::FallbackUsed { to, .. }) => {
                    seen.fallback_used = true;
                    seen.trail.push(format!("fallback to {to}"));
                }
                Frame::Live(ApiLiveEvent::TextDelta { .. }) => seen.text_deltas += 1,
                Frame::Canonical(event) => match event.kind {
                    ApiEventKind::AssistantMessage {
                        provider, model, ..
                    } => seen.answered_by = Some((provider_name(provider), model)),
                    ApiEventKind::TurnCompleted { .. } => seen.end = Some("completed".to_owned()),
                    ApiEventKind::TurnFailed { error, .. } => {
                        seen.end = Some("failed".to_owned());
                        seen.error = Some(error);
                    }
                    ApiEventKind::TurnInterrupted { reason, .. } => {
                        seen.end = Some("interrupted".to_owned());
                        seen.error = Some(reason);
                    }
                    _ => {}
                },
                Frame::Error(error) => {
                    return Err(anyhow!("the event stream failed: {}", error.message))
                }
                _ => {}
            }
        }
    }
}

fn state_name(state: ApiState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{state:?}"))
}

/// The daemon's configuration: the drill's data dir, any free loopback
/// port, both wire formats at the fake provider, the `mock` provider at a
/// port nobody listens on, and short provider clocks. Built from these
/// settings alone, never the environment: a key there must not send the
/// drill to a real provider.
fn config(data_dir: &Path, mock_url: &str, refused_url: &str) -> anyhow::Result<Config> {
    let data_dir = data_dir
        .to_str()
        .ok_or_else(|| anyhow!("the temporary directory is not UTF-8"))?;
    let timeout = PROVIDER_TIMEOUT_MS.to_string();
    let settings: HashMap<&str, String> = HashMap::from([
        ("KEEL_DATA_DIR", data_dir.to_owned()),
        ("KEEL_ADDR", "127.0.0.1:0".to_owned()),
        ("KEEL_PROVIDER", "anthropic".to_owned()),
        ("KEEL_MODEL", ANTHROPIC_MODEL.to_owned()),
        ("ANTHROPIC_BASE_URL", mock_url.to_owned()),
        ("ANTHROPIC_API_KEY", "drill".to_owned()),
        ("OPENAI_BASE_URL", format!("{mock_url}/v1")),
        ("OPENAI_API_KEY", "drill".to_owned()),
        ("KEEL_MOCK_URL", refused_url.to_owned()),
        ("KEEL_FIRST_BYTE_TIMEOUT_MS", timeout.clone()),
        ("KEEL_IDLE_TIMEOUT_MS", timeout),
        ("KEEL_SHUTDOWN_GRACE_MS", "1000".to_owned()),
    ]);
    Ok(Config::load(|name| settings.get(name).cloned(), None)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_is_in_the_matrix_in_both_formats_with_and_without_fallback() {
        let cases = matrix();
        for fault in FAULTS {
            let of_fault: Vec<&Case> = cases
                .iter()
                .filter(|case| case.fault.name == fault.name)
                .collect();
            let wires = if fault.entry.is_some() { 2 } else { 1 };
            let once = if fault.class == Class::Retryable && fault.entry.is_some() {
                wires
            } else {
                0
            };
            assert_eq!(of_fault.len(), wires * 2 + once, "{}", fault.name);
            assert!(of_fault.iter().any(|case| case.fallback));
            assert!(of_fault.iter().any(|case| !case.fallback));
        }
    }

    #[test]
    fn a_final_fault_is_never_retried_nor_handed_over() {
        let case = Case {
            fault: &FAULTS[5],
            wire: Wire::Openai,
            fallback: true,
            mode: Mode::Always,
        };
        assert_eq!(case.fault.class, Class::Final);
        let expected = case.expected();
        assert_eq!(expected.end, "failed");
        assert_eq!(expected.retries, 0);
        assert!(!expected.fallback_used);
        assert_eq!(expected.fallback_requests, 0);
    }

    #[test]
    fn a_check_reports_each_difference() {
        let case = Case {
            fault: &FAULTS[1],
            wire: Wire::Anthropic,
            fallback: true,
            mode: Mode::Always,
        };
        let expected = case.expected();
        let seen = Seen {
            end: Some("failed".to_owned()),
            state: Some(ApiState::Error),
            retry_delays_ms: vec![15, 20],
            error: Some("claude-drill failed 3 times; last error: 500".to_owned()),
            requests: HashMap::from([("anthropic".to_owned(), 3)]),
            ..Seen::default()
        };
        let violations = check(&case, &expected, &seen);
        assert!(
            violations
                .iter()
                .any(|v| v.starts_with("end: expected completed, got failed")),
            "{violations:?}"
        );
        assert!(
            violations.iter().any(|v| v.starts_with("fallback used")),
            "{violations:?}"
        );
        assert!(
            violations
                .iter()
                .any(|v| v.starts_with("requests to the fallback")),
            "{violations:?}"
        );
        assert!(
            !violations.iter().any(|v| v.starts_with("retries")),
            "{violations:?}"
        );
    }
}
