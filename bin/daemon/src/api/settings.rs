//! `PATCH /v1/conversations/{id}`: the settings a conversation may change
//! after creation (the context window and compaction threshold among them,
//! docs/compaction.md), checked as at creation and recorded in the log as a
//! `config_changed` event. What the conversation is (its id, working
//! directory, models) does not change here.

use axum::extract::State;
use axum::Json;

use keel_api::types::{ConversationDetail, ErrorBody, UpdateConversation};

use super::conversations::{compact_at_percent, context_window, retry_policy};
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
    if let Some(system) = update.system {
        config.system = (!system.is_empty()).then_some(system);
    }
    if let Some(policy) = update.busy_policy {
        config.busy_policy = policy.into();
    }
    if let Some(tools) = update.tools {
        config.tools = tools
            .into_iter()
            .map(|(name, policy)| (name, policy.into()))
            .collect();
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
    handle.change_config(config).await.map_err(runtime_error)?;
    let inspection = handle.inspect().await.map_err(runtime_error)?;
    Ok(Json(crate::convert::detail(inspection)))
}
