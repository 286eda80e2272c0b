//! The runtime's metrics: their names, and the helpers that emit them
//! through the [`metrics`] facade. Nothing is recorded until the embedder
//! installs a recorder (the `keel` binary's `telemetry::install_metrics`
//! installs Prometheus'); without one every helper is a no-op, so tests and
//! embedders that do not care pay nothing. One place for the names, so the
//! daemon, its docs and dashboards read them from here.
//!
//! | name | kind | labels | counted |
//! | --- | --- | --- | --- |
//! | `keel_turns_total` | counter | `outcome` = `completed` \| `failed` \| `interrupted` | when `TurnCompleted`, `TurnFailed` or `TurnInterrupted` is durably appended |
//! | `keel_turn_duration_seconds` | histogram | `outcome`, as above | with the same: `TurnCompleted`'s `duration_ms`, else from the turn's `TurnStarted` to the ending event (both by the conversation's clock, so a restart mid-turn counts its downtime) |
//! | `keel_llm_retries_total` | counter | | when a `Retrying` live event is published (a failed request will be sent again) |
//! | `keel_llm_fallbacks_total` | counter | | when a `FallbackUsed` live event is published |
//! | `keel_llm_requests_total` | counter | `provider` = `anthropic` \| `openai` \| `mock`; `outcome` = `ok` \| `retryable_error` \| `error` | when a stream worker's request ends (a request killed by a cancel or an abort is not counted) |
//! | `keel_llm_time_to_first_token_seconds` | histogram | `provider` | from sending a request to its first streamed delta |
//! | `keel_tool_runs_total` | counter | `tool` (a registered tool's name); `outcome` = `ok` \| `error` | when a tool worker's tool returns (or panics: `error`); a call naming no registered tool runs nothing and is not counted, which also keeps the model's made-up names out of the labels |
//! | `keel_cancels_total` | counter | | when a client's cancel reaches the conversation |
//! | `keel_append_seconds` | histogram | | each event-log append of the effect pipeline, until durable |

use std::time::Duration;

use keel_core::{AssistantResponse, LlmFailure, ProviderKind};

pub const TURNS_TOTAL: &str = "keel_turns_total";
pub const TURN_DURATION_SECONDS: &str = "keel_turn_duration_seconds";
pub const LLM_RETRIES_TOTAL: &str = "keel_llm_retries_total";
pub const LLM_FALLBACKS_TOTAL: &str = "keel_llm_fallbacks_total";
pub const LLM_REQUESTS_TOTAL: &str = "keel_llm_requests_total";
pub const LLM_TIME_TO_FIRST_TOKEN_SECONDS: &str = "keel_llm_time_to_first_token_seconds";
pub const TOOL_RUNS_TOTAL: &str = "keel_tool_runs_total";
pub const CANCELS_TOTAL: &str = "keel_cancels_total";
pub const APPEND_SECONDS: &str = "keel_append_seconds";

/// Every metric name above, for an exporter to check or document.
pub const ALL: [&str; 9] = [
    TURNS_TOTAL,
    TURN_DURATION_SECONDS,
    LLM_RETRIES_TOTAL,
    LLM_FALLBACKS_TOTAL,
    LLM_REQUESTS_TOTAL,
    LLM_TIME_TO_FIRST_TOKEN_SECONDS,
    TOOL_RUNS_TOTAL,
    CANCELS_TOTAL,
    APPEND_SECONDS,
];

/// How a turn ended: the `outcome` label of the turn metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnOutcome {
    Completed,
    Failed,
    Interrupted,
}

impl TurnOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            TurnOutcome::Completed => "completed",
            TurnOutcome::Failed => "failed",
            TurnOutcome::Interrupted => "interrupted",
        }
    }
}

/// How an LLM request ended: the `outcome` label of
/// `keel_llm_requests_total`, and the `error.type` of its `chat` span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    Ok,
    /// Network errors, timeouts, 429 and 5xx: keel may send it again.
    RetryableError,
    /// Anything retrying cannot fix (auth, a bad request, a quota).
    Error,
}

impl RequestOutcome {
    pub fn of(result: &Result<AssistantResponse, LlmFailure>) -> RequestOutcome {
        match result {
            Ok(_) => RequestOutcome::Ok,
            Err(failure) if failure.retryable => RequestOutcome::RetryableError,
            Err(_) => RequestOutcome::Error,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Ok => "ok",
            RequestOutcome::RetryableError => "retryable_error",
            RequestOutcome::Error => "error",
        }
    }
}

/// The `provider` label: static, so labelling allocates nothing.
pub fn provider_label(provider: ProviderKind) -> &'static str {
    match provider {
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::OpenAi => "openai",
        ProviderKind::Mock => "mock",
    }
}

/// Registers each metric's help text with the installed recorder; call it
/// once after installing one (descriptions sent before are lost).
pub fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(TURNS_TOTAL, "Turns ended, by outcome.");
    describe_histogram!(
        TURN_DURATION_SECONDS,
        Unit::Seconds,
        "Wall-clock length of a turn, from TurnStarted to its ending event."
    );
    describe_counter!(
        LLM_RETRIES_TOTAL,
        "Failed LLM requests scheduled to be sent again."
    );
    describe_counter!(
        LLM_FALLBACKS_TOTAL,
        "Turns that switched to the fallback model after the primary's retries ran out."
    );
    describe_counter!(
        LLM_REQUESTS_TOTAL,
        "LLM requests that ended, by provider and outcome."
    );
    describe_histogram!(
        LLM_TIME_TO_FIRST_TOKEN_SECONDS,
        Unit::Seconds,
        "Time from sending an LLM request to its first streamed delta."
    );
    describe_counter!(
        TOOL_RUNS_TOTAL,
        "Tool runs that returned, by tool and outcome."
    );
    describe_counter!(CANCELS_TOTAL, "Cancels asked for by clients.");
    describe_histogram!(
        APPEND_SECONDS,
        Unit::Seconds,
        "Latency of one event-log append, until durable."
    );
}

/// A turn ended, `duration` after it started when that is known.
pub fn turn_ended(outcome: TurnOutcome, duration: Option<Duration>) {
    let outcome = outcome.as_str();
    metrics::counter!(TURNS_TOTAL, "outcome" => outcome).increment(1);
    if let Some(duration) = duration {
        metrics::histogram!(TURN_DURATION_SECONDS, "outcome" => outcome).record(duration);
    }
}

/// A failed request will be sent again.
pub fn llm_retry() {
    metrics::counter!(LLM_RETRIES_TOTAL).increment(1);
}

/// The fallback model answers from now on.
pub fn llm_fallback() {
    metrics::counter!(LLM_FALLBACKS_TOTAL).increment(1);
}

/// An LLM request to `provider` ended.
pub fn llm_request(provider: ProviderKind, outcome: RequestOutcome) {
    metrics::counter!(
        LLM_REQUESTS_TOTAL,
        "provider" => provider_label(provider),
        "outcome" => outcome.as_str()
    )
    .increment(1);
}

/// The first delta of a request to `provider` arrived `elapsed` after it
/// was sent.
pub fn llm_first_token(provider: ProviderKind, elapsed: Duration) {
    metrics::histogram!(LLM_TIME_TO_FIRST_TOKEN_SECONDS, "provider" => provider_label(provider))
        .record(elapsed);
}

/// The registered tool `tool` returned, with an error result or not.
pub fn tool_run(tool: &str, is_error: bool) {
    let outcome = if is_error { "error" } else { "ok" };
    metrics::counter!(TOOL_RUNS_TOTAL, "tool" => tool.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// A client's cancel reached a conversation.
pub fn cancel() {
    metrics::counter!(CANCELS_TOTAL).increment(1);
}

/// One event-log append took `elapsed` to be durable.
pub fn append(elapsed: Duration) {
    metrics::histogram!(APPEND_SECONDS).record(elapsed);
}
