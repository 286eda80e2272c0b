//! `PATCH /v1/conversations/{id}`: the settings a conversation may change
//! after creation (the context window and compaction threshold among them,
//! docs/compaction.md), recorded in the log as a `config_changed` event.
//! [`apply`] checks and applies them, for creation too, so a value is
//! refused the same way wherever it is given. What the conversation is
//! (its id, working directory, models) does not change here.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;

use axum::http::StatusCode;
use keel_actors::core::config::{ConversationConfig, SandboxMode, SandboxPolicy, ToolPolicy};
use keel_actors::core::retry::RetryPolicy;
use keel_actors::tool_sandbox::{ToolSandbox, FULL_ACCESS_SETTING};
use keel_api::types::{
    ApiRetry, ApiSandbox, ApiToolPolicy, ConversationDetail, ErrorBody, UpdateConversation,
};
use keel_api::ErrorCode;

use super::error::{ApiError, ApiJson};
use super::{AppState, ConversationPath};

/// The most tokens a conversation may ask one response for.
const MAX_MAX_TOKENS: u32 = 1_000_000;

/// Change a conversation's settings; they apply from its next LLM request.
#[utoipa::path(
    patch,
    path = "/v1/conversations/{id}",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id")),
    request_body = UpdateConversation,
    responses(
        (status = 200, description = "The conversation with its new settings", body = ConversationDetail),
        (status = 400, description = "Malformed JSON, an unknown field, or a value out of range", body = ErrorBody),
        (status = 403, description = "A sandbox the daemon does not allow (`sandbox_not_allowed`)", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A sub-agent that has finished", body = ErrorBody),
    )
)]
pub async fn update(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
    ApiJson(update): ApiJson<UpdateConversation>,
) -> Result<Json<ConversationDetail>, ApiError> {
    let handle = state.runtime.handle(id.clone());
    let runtime_error = |error| ApiError::from_runtime(id.as_str(), error);
    let mut config = handle.inspect().await.map_err(runtime_error)?.config;
    apply(&mut config, update, state.runtime.sandbox())?;
    handle.change_config(config).await.map_err(runtime_error)?;
    let inspection = handle.inspect().await.map_err(runtime_error)?;
    Ok(Json(crate::convert::detail(
        inspection,
        &state.runtime.mcp().statuses(),
        state.runtime.sandbox(),
    )))
}

/// Check the settings `update` gives and apply them to `config`; the first
/// value out of range is refused, naming it, and `config` is then not to be
/// used.
pub(super) fn apply(
    config: &mut ConversationConfig,
    update: UpdateConversation,
    sandbox: &ToolSandbox,
) -> Result<(), ApiError> {
    if let Some(asked) = update.sandbox {
        config.sandbox = Some(sandbox_policy(config.sandbox.as_ref(), asked, sandbox)?);
    }
    if let Some(system) = update.system {
        config.system = (!system.is_empty()).then_some(system);
    }
    if let Some(policy) = update.busy_policy {
        config.busy_policy = policy.into();
    }
    if let Some(tools) = update.tools {
        config.tools = tool_policies(tools);
    }
    if let Some(retry) = update.retry {
        config.retry = retry_policy(retry)?;
    }
    if let Some(timeout_ms) = update.request_timeout_ms {
        config.request_timeout_ms = timeout_ms;
    }
    if let Some(window) = update.context_window {
        config.context_window = context_window(window)?;
    }
    if let Some(percent) = update.compact_at_percent {
        config.compact_at_percent = compact_at_percent(percent)?;
    }
    if let Some(max_tokens) = update.max_tokens {
        if !(1..=MAX_MAX_TOKENS).contains(&max_tokens) {
            return Err(ApiError::bad_request(format!(
                "max_tokens is {max_tokens}; give 1 to {MAX_MAX_TOKENS}"
            )));
        }
        config.max_tokens = max_tokens;
    }
    Ok(())
}

/// The sandbox `asked` makes of `current` (the daemon's default where the
/// conversation has none of its own), checked: `full-access` only where
/// the daemon allows it.
fn sandbox_policy(
    current: Option<&SandboxPolicy>,
    asked: ApiSandbox,
    sandbox: &ToolSandbox,
) -> Result<SandboxPolicy, ApiError> {
    let mut policy = sandbox.policy_of(current);
    if let Some(mode) = asked.mode {
        policy.mode = mode.into();
    }
    if let Some(network) = asked.network {
        policy.network = network
            .to_core()
            .map_err(|reason| ApiError::bad_request(format!("sandbox.{reason}")))?;
    }
    if policy.mode == SandboxMode::FullAccess && !sandbox.settings().allow_full_access {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::SandboxNotAllowed,
            format!(
                "sandbox.mode full-access runs tools unconfined, which this daemon does not \
                 allow; its operator can with {FULL_ACCESS_SETTING}"
            ),
        ));
    }
    Ok(policy)
}

/// The per-tool policies as the API names them, as the core keeps them.
pub(super) fn tool_policies(
    tools: BTreeMap<String, ApiToolPolicy>,
) -> BTreeMap<String, ToolPolicy> {
    tools
        .into_iter()
        .map(|(name, policy)| (name, policy.into()))
        .collect()
}

/// The smallest and largest context windows a conversation may name: a
/// window below a few thousand tokens holds no useful turn.
pub const MIN_CONTEXT_WINDOW: u64 = 1_000;
pub const MAX_CONTEXT_WINDOW: u64 = 100_000_000;

fn context_window(window: u64) -> Result<u64, ApiError> {
    if !(MIN_CONTEXT_WINDOW..=MAX_CONTEXT_WINDOW).contains(&window) {
        return Err(ApiError::bad_request(format!(
            "context_window is {window}; give {MIN_CONTEXT_WINDOW} to {MAX_CONTEXT_WINDOW} tokens"
        )));
    }
    Ok(window)
}

fn compact_at_percent(percent: u8) -> Result<u8, ApiError> {
    if percent > 99 {
        return Err(ApiError::bad_request(format!(
            "compact_at_percent is {percent}; give 1 to 99, or 0 to compact only when a provider refuses the prompt as too long"
        )));
    }
    Ok(percent)
}

/// Most retries a conversation may ask for, and longest delay: a policy
/// past these would park a turn for hours.
const MAX_RETRIES: u32 = 10;
const MAX_RETRY_DELAY_MS: u64 = 10 * 60 * 1000;

/// keel's default retry policy with what the request gives, checked.
fn retry_policy(retry: ApiRetry) -> Result<RetryPolicy, ApiError> {
    let mut policy = RetryPolicy::default();
    if let Some(max_retries) = retry.max_retries {
        if max_retries > MAX_RETRIES {
            return Err(ApiError::bad_request(format!(
                "retry.max_retries is {max_retries}; at most {MAX_RETRIES}"
            )));
        }
        policy.max_retries = max_retries;
    }
    let delays = [
        (
            "base_delay_ms",
            retry.base_delay_ms,
            &mut policy.base_delay_ms,
        ),
        ("max_delay_ms", retry.max_delay_ms, &mut policy.max_delay_ms),
        (
            "retry_after_cap_ms",
            retry.retry_after_cap_ms,
            &mut policy.retry_after_cap_ms,
        ),
    ];
    for (name, given, field) in delays {
        if let Some(value) = given {
            if value > MAX_RETRY_DELAY_MS {
                return Err(ApiError::bad_request(format!(
                    "retry.{name} is {value}; at most {MAX_RETRY_DELAY_MS} (10 minutes)"
                )));
            }
            *field = value;
        }
    }
    if policy.base_delay_ms > policy.max_delay_ms {
        return Err(ApiError::bad_request(format!(
            "retry.base_delay_ms ({}) is above retry.max_delay_ms ({})",
            policy.base_delay_ms, policy.max_delay_ms
        )));
    }
    Ok(policy)
}
