//! The runtime's metrics: their names, and the helpers that emit them
//! through the [`metrics`] facade. Nothing is recorded until the embedder
//! installs a recorder (the `keel` binary's `telemetry::install_metrics`
//! installs Prometheus'); without one every helper is a no-op, so tests and
//! embedders that do not care pay nothing. One place for the names, so the
//! daemon, its docs and dashboards read them from here.
//!
//! Every series whose labels are known up front is registered at zero by
//! [`register`] when a runtime opens, so that a fresh process already
//! exports it (Prometheus' advice: a series that appears only once its
//! first event happens breaks `rate()` and alerts on it).
//!
//! | name | kind | labels | counted |
//! | --- | --- | --- | --- |
//! | `keel_turns_total` | counter | `outcome` = `completed` \| `failed` \| `interrupted` | when `TurnCompleted`, `TurnFailed` or `TurnInterrupted` is durably appended |
//! | `keel_turn_duration_seconds` | histogram | `outcome`, as above | with the same: `TurnCompleted`'s `duration_ms`, else from the turn's `TurnStarted` to the ending event (both by the conversation's clock, so a restart mid-turn counts its downtime) |
//! | `keel_llm_retries_total` | counter | | when a `Retrying` live event is published (a failed request will be sent again) |
//! | `keel_llm_fallbacks_total` | counter | | when a `FallbackUsed` live event is published |
//! | `keel_llm_requests_total` | counter | `provider` = `anthropic` \| `openai` \| `mock`; `outcome` = `ok` \| `retried` \| `fallback` \| `failed` | when a request ends: `ok` when its response arrived whole; a failure by what the conversation did next: sent it again (`retried`), handed it to the fallback model (`fallback`), or gave up (`failed`: the turn failed). A request killed by a cancel or an abort is not counted |
//! | `keel_llm_time_to_first_token_seconds` | histogram | `provider` | from sending a request to its first streamed delta |
//! | `gen_ai_client_token_usage` | histogram | `gen_ai_token_type` = `input` \| `output`; `gen_ai_provider_name` = `anthropic` \| `openai` \| `mock` | tokens of each whole response, as the provider counted them: OpenTelemetry's `gen_ai.client.token.usage` (unit `{token}`) with its dots made underscores, so `_sum` is the tokens in or out and `_count` the responses |
//! | `keel_tool_runs_total` | counter | `tool` (a registered tool's name); `outcome` = `ok` \| `error` | when a tool worker's tool returns (or panics: `error`); a call naming no registered tool runs nothing and is not counted, which also keeps the model's made-up names out of the labels |
//! | `keel_cancels_total` | counter | | when a client's cancel reaches the conversation |
//! | `keel_append_seconds` | histogram | | each event-log append of the effect pipeline, until durable (the store's append latency) |
//! | `keel_store_errors_total` | counter | `op` = `read` \| `write` | each store call that failed (the runtime's store is wrapped in [`MeteredLog`]) |

use std::time::Duration;

use keel_core::ProviderKind;

mod metered_log;

pub use metered_log::MeteredLog;

pub const TURNS_TOTAL: &str = "keel_turns_total";
pub const TURN_DURATION_SECONDS: &str = "keel_turn_duration_seconds";
pub const LLM_RETRIES_TOTAL: &str = "keel_llm_retries_total";
pub const LLM_FALLBACKS_TOTAL: &str = "keel_llm_fallbacks_total";
pub const LLM_REQUESTS_TOTAL: &str = "keel_llm_requests_total";
pub const LLM_TIME_TO_FIRST_TOKEN_SECONDS: &str = "keel_llm_time_to_first_token_seconds";
pub const TOOL_RUNS_TOTAL: &str = "keel_tool_runs_total";
pub const CANCELS_TOTAL: &str = "keel_cancels_total";
pub const APPEND_SECONDS: &str = "keel_append_seconds";
pub const TOKEN_USAGE: &str = "gen_ai_client_token_usage";
pub const STORE_ERRORS_TOTAL: &str = "keel_store_errors_total";
pub const MCP_CALLS_TOTAL: &str = "keel_mcp_calls_total";

/// Every metric name above, for an exporter to check or document.
pub const ALL: [&str; 12] = [
    TURNS_TOTAL,
    TURN_DURATION_SECONDS,
    LLM_RETRIES_TOTAL,
    LLM_FALLBACKS_TOTAL,
    LLM_REQUESTS_TOTAL,
    LLM_TIME_TO_FIRST_TOKEN_SECONDS,
    TOKEN_USAGE,
    TOOL_RUNS_TOTAL,
    CANCELS_TOTAL,
    APPEND_SECONDS,
    STORE_ERRORS_TOTAL,
    MCP_CALLS_TOTAL,
];

/// Every provider, for the `provider` labels registered up front.
const PROVIDERS: [ProviderKind; 3] = [
    ProviderKind::Anthropic,
    ProviderKind::OpenAi,
    ProviderKind::Mock,
];

/// How a turn ended: the `outcome` label of the turn metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnOutcome {
    Completed,
    Failed,
    Interrupted,
}

impl TurnOutcome {
    pub const ALL: [TurnOutcome; 3] = [
        TurnOutcome::Completed,
        TurnOutcome::Failed,
        TurnOutcome::Interrupted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TurnOutcome::Completed => "completed",
            TurnOutcome::Failed => "failed",
            TurnOutcome::Interrupted => "interrupted",
        }
    }
}

/// How an LLM request ended: the `outcome` label of
/// `keel_llm_requests_total`. A failure is labelled by what the
/// conversation made of it, which only the core's step decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// The response arrived whole.
    Ok,
    /// It failed and will be sent again after a delay.
    Retried,
    /// It failed with the primary's retries spent: the fallback model
    /// answers from now on.
    Fallback,
    /// It failed for good: the turn failed with it.
    Failed,
}

impl RequestOutcome {
    pub const ALL: [RequestOutcome; 4] = [
        RequestOutcome::Ok,
        RequestOutcome::Retried,
        RequestOutcome::Fallback,
        RequestOutcome::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Ok => "ok",
            RequestOutcome::Retried => "retried",
            RequestOutcome::Fallback => "fallback",
            RequestOutcome::Failed => "failed",
        }
    }
}

/// Which count of a response's tokens: the `gen_ai_token_type` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Input,
    Output,
}

impl TokenType {
    pub const ALL: [TokenType; 2] = [TokenType::Input, TokenType::Output];

    pub fn as_str(self) -> &'static str {
        match self {
            TokenType::Input => "input",
            TokenType::Output => "output",
        }
    }
}

/// Which kind of store call failed: the `op` label of
/// `keel_store_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Read,
    Write,
}

impl StoreOp {
    pub const ALL: [StoreOp; 2] = [StoreOp::Read, StoreOp::Write];

    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::Read => "read",
            StoreOp::Write => "write",
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
    describe_counter!(
        MCP_CALLS_TOTAL,
        "MCP tool calls, by server and outcome (ok, error, cancelled, server_stopped, failed)."
    );
    describe_histogram!(
        APPEND_SECONDS,
        Unit::Seconds,
        "Latency of one event-log append, until durable."
    );
    describe_histogram!(
        TOKEN_USAGE,
        "Tokens of each whole LLM response, by token type (input or output) and provider."
    );
    describe_counter!(
        STORE_ERRORS_TOTAL,
        "Store calls that failed, by op (read or write)."
    );
}

/// Registers every series whose labels are known up front at zero, so a
/// scrape of a fresh process lists them all: each outcome of turns and
/// requests, each provider, each of `tools` by outcome, each token type
/// and store op. Call it once a recorder is installed (a runtime calls it
/// when it opens, with its registry's tools); again is harmless.
pub fn register<'a>(tools: impl IntoIterator<Item = &'a str>) {
    for outcome in TurnOutcome::ALL {
        let outcome = outcome.as_str();
        metrics::counter!(TURNS_TOTAL, "outcome" => outcome).increment(0);
        let _ = metrics::histogram!(TURN_DURATION_SECONDS, "outcome" => outcome);
    }
    metrics::counter!(LLM_RETRIES_TOTAL).increment(0);
    metrics::counter!(LLM_FALLBACKS_TOTAL).increment(0);
    metrics::counter!(CANCELS_TOTAL).increment(0);
    let _ = metrics::histogram!(APPEND_SECONDS);
    for provider in PROVIDERS {
        let provider = provider_label(provider);
        for outcome in RequestOutcome::ALL {
            metrics::counter!(
                LLM_REQUESTS_TOTAL,
                "provider" => provider,
                "outcome" => outcome.as_str()
            )
            .increment(0);
        }
        let _ = metrics::histogram!(LLM_TIME_TO_FIRST_TOKEN_SECONDS, "provider" => provider);
        for token_type in TokenType::ALL {
            let _ = metrics::histogram!(
                TOKEN_USAGE,
                "gen_ai_token_type" => token_type.as_str(),
                "gen_ai_provider_name" => provider
            );
        }
    }
    for tool in tools {
        for outcome in ["ok", "error"] {
            metrics::counter!(TOOL_RUNS_TOTAL, "tool" => tool.to_owned(), "outcome" => outcome)
                .increment(0);
        }
    }
    for op in StoreOp::ALL {
        metrics::counter!(STORE_ERRORS_TOTAL, "op" => op.as_str()).increment(0);
    }
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

/// A whole response from `provider` counted `input` and `output` tokens.
pub fn token_usage(provider: ProviderKind, input: u64, output: u64) {
    let provider = provider_label(provider);
    for (token_type, tokens) in [(TokenType::Input, input), (TokenType::Output, output)] {
        metrics::histogram!(
            TOKEN_USAGE,
            "gen_ai_token_type" => token_type.as_str(),
            "gen_ai_provider_name" => provider
        )
        .record(tokens as f64);
    }
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

/// The outcomes of an MCP call.
pub const MCP_OUTCOMES: [&str; 5] = ["ok", "error", "cancelled", "server_stopped", "failed"];

/// Registers the MCP call series of `server` at zero.
pub fn register_mcp_server(server: &str) {
    for outcome in MCP_OUTCOMES {
        metrics::counter!(MCP_CALLS_TOTAL, "server" => server.to_owned(), "outcome" => outcome)
            .increment(0);
    }
}

/// An MCP call to `server` ended with `outcome` (one of [`MCP_OUTCOMES`]).
pub fn mcp_call(server: &str, outcome: &'static str) {
    metrics::counter!(MCP_CALLS_TOTAL, "server" => server.to_owned(), "outcome" => outcome)
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

/// A store call of kind `op` failed.
pub fn store_error(op: StoreOp) {
    metrics::counter!(STORE_ERRORS_TOTAL, "op" => op.as_str()).increment(1);
}
