//! `/v1/conversations…`: create, list, read, send, cancel, resolve and the
//! log. Each handler checks its input, makes one call on the runtime and
//! converts the answer; a refused request changes nothing.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use utoipa::IntoParams;

use keel_actors::core::config::{ConversationConfig, ModelRef, ProviderKind};
use keel_actors::core::event::Decision;
use keel_actors::core::{ConversationId, StateName, ToolCallId};
use keel_actors::store::IndexEntry;
use keel_actors::ImageUpload;

use super::error::{ApiError, ApiJson, ApiQuery};
use super::paging::{self, PageQuery};
use super::settings;
use super::{AppState, ConversationPath};
use crate::config::{DEFAULT_ANTHROPIC_MODEL, DEFAULT_OPENAI_MODEL};
use keel_api::types::{
    AcceptedMessage, ApiDecisionKind, ApiEvent, CancelAccepted, ConversationDetail,
    ConversationList, CreateConversation, CreatedConversation, ErrorBody, LogPage, ResolveAccepted,
    ResolveRequest, SendMessage, UpdateConversation,
};
use keel_api::ErrorCode;

/// Most events one `GET …/log` returns.
pub const MAX_LOG_PAGE: usize = 10_000;
/// Most images one message may carry.
pub const MAX_IMAGES: usize = 20;

/// Create a conversation.
#[utoipa::path(
    post,
    path = "/v1/conversations",
    tag = "conversations",
    request_body = CreateConversation,
    responses(
        (status = 201, body = CreatedConversation),
        (status = 400, description = "Malformed JSON, an unknown field, or a working directory that is not an existing absolute directory", body = ErrorBody),
        (status = 413, body = ErrorBody),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<CreateConversation>,
) -> Result<(StatusCode, Json<CreatedConversation>), ApiError> {
    let cwd = match request.cwd {
        Some(cwd) => {
            let cwd = PathBuf::from(cwd);
            if !cwd.is_absolute() {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidCwd,
                    format!(
                        "cwd {} is relative; give an absolute path (the daemon's directory is not the client's)",
                        cwd.display()
                    ),
                ));
            }
            cwd
        }
        None => state.default_cwd.as_ref().clone(),
    };
    let default = state.default_model.as_ref();
    let provider = request
        .provider
        .map_or(default.provider, ProviderKind::from);
    let model = match request.model {
        Some(model) if model.trim().is_empty() => {
            return Err(ApiError::bad_request("model is empty"))
        }
        Some(model) => model,
        None if provider == default.provider => default.model.clone(),
        None => default_model_of(provider).to_owned(),
    };
    for server in &request.mcp_servers {
        if !state.runtime.mcp().has(server) {
            let known = state.runtime.mcp().names();
            return Err(ApiError::bad_request(if known.is_empty() {
                format!("mcp_servers names {server:?}, but this daemon has no MCP servers (keel.toml [mcp.NAME], KEEL_MCP_SERVERS)")
            } else {
                format!(
                    "mcp_servers names {server:?}; this daemon's MCP servers are: {}",
                    known.join(", ")
                )
            }));
        }
    }
    let mut config = ConversationConfig {
        mcp_servers: request.mcp_servers,
        system: request.system,
        primary: ModelRef { provider, model },
        tools: settings::tool_policies(request.tools),
        tools_may_leave_cwd: request.tools_may_leave_cwd,
        ..ConversationConfig::default()
    };
    if let Some(fallback) = request.fallback {
        let provider = ProviderKind::from(fallback.provider);
        let model = match fallback.model {
            Some(model) if model.trim().is_empty() => {
                return Err(ApiError::bad_request("fallback.model is empty"))
            }
            Some(model) => model,
            None => default_model_of(provider).to_owned(),
        };
        config.fallback = Some(ModelRef { provider, model });
    }
    // The settings a conversation may also change later, checked as a
    // `PATCH` checks them.
    settings::apply(
        &mut config,
        UpdateConversation {
            busy_policy: request.busy_policy,
            retry: request.retry,
            request_timeout_ms: request.request_timeout_ms,
            context_window: request.context_window,
            compact_at_percent: request.compact_at_percent,
            sandbox: request.sandbox,
            ..UpdateConversation::default()
        },
        state.runtime.sandbox(),
    )?;
    let handle = state
        .runtime
        .create(&cwd, config)
        .await
        .map_err(|error| ApiError::from_runtime("(new)", error))?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedConversation {
            id: handle.id().to_string(),
        }),
    ))
}

fn default_model_of(provider: ProviderKind) -> &'static str {
    match provider {
        ProviderKind::Anthropic => DEFAULT_ANTHROPIC_MODEL,
        ProviderKind::OpenAi => DEFAULT_OPENAI_MODEL,
        ProviderKind::Mock => "mock",
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Include sub-agents.
    #[serde(default)]
    pub all: bool,
    /// Conversations per page: 1 to 1000, default 100.
    pub limit: Option<usize>,
    /// Where to go on: the `next_cursor` of the page before.
    pub cursor: Option<String>,
    /// Only the sub-agents this conversation started (implies `all`).
    pub parent: Option<String>,
}

/// List conversations, oldest first (by creation, then id): the user's
/// own, and with `all=true` their sub-agents too (with `parent=ID`, only
/// the sub-agents of ID), a page at a time (`limit`, and `cursor` from
/// the page before's `next_cursor`).
#[utoipa::path(
    get,
    path = "/v1/conversations",
    tag = "conversations",
    params(ListQuery),
    responses((status = 200, body = ConversationList), (status = 400, body = ErrorBody))
)]
pub async fn list(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<ConversationList>, ApiError> {
    let paging = PageQuery {
        limit: query.limit,
        cursor: query.cursor,
    };
    let limit = paging.limit()?;
    let after = paging.after()?;
    let mut entries = state
        .runtime
        .list(query.all || query.parent.is_some())
        .await
        .map_err(|error| ApiError::from_runtime("(list)", error))?;
    if let Some(parent) = &query.parent {
        entries.retain(|entry| entry.parent.as_ref().map(ConversationId::as_str) == Some(parent));
    }
    let mut keyed: Vec<(String, IndexEntry)> = entries
        .into_iter()
        .map(|entry| (sort_key(&entry), entry))
        .collect();
    keyed.sort_unstable_by(|left, right| left.0.cmp(&right.0));
    let (entries, next_cursor) = paging::page(keyed, after.as_deref(), limit);
    // A live conversation's state is its actor's; the others' is what
    // their log implies, kept in the index. Only this page's are asked.
    let on_page: HashSet<&ConversationId> = entries.iter().map(|entry| &entry.id).collect();
    let live: HashMap<ConversationId, StateName> = state
        .runtime
        .actors_where(|id| on_page.contains(id))
        .await
        .into_iter()
        .map(|actor| (actor.id, actor.state))
        .collect();
    let conversations = entries
        .into_iter()
        .map(|entry| {
            let actor_state = live.get(&entry.id).copied();
            crate::convert::summary(entry, actor_state)
        })
        .collect();
    Ok(Json(ConversationList {
        conversations,
        next_cursor,
    }))
}

/// A conversation's place in the listing: creation time (zero-padded, so
/// text order is time order), then id.
fn sort_key(entry: &IndexEntry) -> String {
    format!("{:020}/{}", entry.created_at.0, entry.id)
}

/// A conversation: its state, history, usage and pending calls. Reading
/// one that has no live actor wakes nothing.
#[utoipa::path(
    get,
    path = "/v1/conversations/{id}",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id")),
    responses((status = 200, body = ConversationDetail), (status = 404, body = ErrorBody))
)]
pub async fn get_one(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
) -> Result<Json<ConversationDetail>, ApiError> {
    let inspection = state
        .runtime
        .handle(id.clone())
        .inspect()
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok(Json(crate::convert::detail(
        inspection,
        &state.runtime.mcp().statuses(),
        state.runtime.sandbox(),
    )))
}

/// Send a user message. Accepted once it is durable; the reply streams on
/// `GET …/events`.
#[utoipa::path(
    post,
    path = "/v1/conversations/{id}/messages",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id")),
    request_body = SendMessage,
    responses(
        (status = 202, body = AcceptedMessage),
        (status = 400, description = "Malformed JSON or an empty message", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Busy: cancel the running turn first", body = ErrorBody),
        (status = 413, description = "The body is over 64 MiB, or the text over the daemon's KEEL_MAX_MESSAGE_BYTES (1 MiB by default)", body = ErrorBody),
        (status = 422, description = "An image that cannot be decoded or used", body = ErrorBody),
    )
)]
pub async fn send(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
    ApiJson(request): ApiJson<SendMessage>,
) -> Result<(StatusCode, Json<AcceptedMessage>), ApiError> {
    let limit = state.max_message_bytes;
    if request.text.len() > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!(
                "the message's text is {} bytes; at most {limit} (KEEL_MAX_MESSAGE_BYTES)",
                request.text.len()
            ),
        ));
    }
    let count = request.images.len();
    if count > MAX_IMAGES {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::InvalidImage,
            format!("{count} images; a message may carry at most {MAX_IMAGES}"),
        ));
    }
    let mut uploads = Vec::with_capacity(count);
    for (index, image) in request.images.into_iter().enumerate() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(image.data.trim())
            .map_err(|error| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ErrorCode::InvalidImage,
                    format!(
                        "image {} of {count} was refused: its data is not standard base64 ({error})",
                        index + 1
                    ),
                )
            })?;
        uploads.push(ImageUpload::new(image.media_type, bytes));
    }
    let event_id = state
        .runtime
        .handle(id.clone())
        .send(request.text, uploads)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(AcceptedMessage {
            seq: event_id.seq,
            event_id: event_id.to_string(),
        }),
    ))
}

/// Stop whatever the conversation is doing: the stream closes, running
/// tools' process groups are killed, and it comes to rest.
#[utoipa::path(
    post,
    path = "/v1/conversations/{id}/cancel",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id")),
    responses((status = 202, body = CancelAccepted), (status = 404, body = ErrorBody))
)]
pub async fn cancel(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
) -> Result<(StatusCode, Json<CancelAccepted>), ApiError> {
    let state_name = state
        .runtime
        .handle(id.clone())
        .cancel()
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CancelAccepted {
            state: state_name.into(),
        }),
    ))
}

/// Answer a pending call: approve or deny a tool, answer a question, or
/// return a client-run tool's output. Exactly once: the same resolution
/// again answers 200 and changes nothing; a different one, or one for a
/// call a cancel already settled, answers 409.
#[utoipa::path(
    post,
    path = "/v1/conversations/{id}/resolve",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id")),
    request_body = ResolveRequest,
    responses(
        (status = 200, body = ResolveAccepted),
        (status = 400, body = ErrorBody),
        (status = 404, description = "Unknown conversation or tool call", body = ErrorBody),
        (status = 409, description = "The call was resolved otherwise, settled by a cancel, or takes another decision", body = ErrorBody),
    )
)]
pub async fn resolve(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
    ApiJson(request): ApiJson<ResolveRequest>,
) -> Result<Json<ResolveAccepted>, ApiError> {
    let decision = match (request.decision, request.text, request.input) {
        (ApiDecisionKind::Edit, None, Some(input)) if input.is_object() => Decision::Edit { input },
        (ApiDecisionKind::Edit, None, _) => {
            return Err(ApiError::bad_request(
                "decision `edit` needs `input`, the call's new input object",
            ))
        }
        (_, _, Some(_)) => {
            return Err(ApiError::bad_request(
                "`input` goes only with decision `edit`",
            ))
        }
        (ApiDecisionKind::Answer, Some(text), None) => Decision::Answer { text },
        (ApiDecisionKind::Answer, None, None) => {
            return Err(ApiError::bad_request("decision `answer` needs `text`"))
        }
        (_, Some(_), None) => {
            return Err(ApiError::bad_request(
                "`text` goes only with decision `answer`",
            ))
        }
        (ApiDecisionKind::Approve, None, None) => Decision::Approve,
        (ApiDecisionKind::Deny, None, None) => Decision::Deny,
    };
    if request.tool_call_id.is_empty() {
        return Err(ApiError::bad_request("tool_call_id is empty"));
    }
    let tool_call_id = ToolCallId::new(request.tool_call_id);
    state
        .runtime
        .handle(id.clone())
        .resolve_as(tool_call_id.clone(), decision, request.by)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok(Json(ResolveAccepted {
        tool_call_id: tool_call_id.0,
        decision: request.decision,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// First seq to return (from 1).
    #[serde(default = "first_seq")]
    pub from: u64,
    /// Most events to return (at most 10000).
    #[serde(default = "default_limit")]
    pub limit: usize,
}

fn first_seq() -> u64 {
    1
}

fn default_limit() -> usize {
    1000
}

/// The canonical events of the log from seq `from` on. Reading it wakes
/// nothing.
#[utoipa::path(
    get,
    path = "/v1/conversations/{id}/log",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id"), LogQuery),
    responses((status = 200, body = LogPage), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody))
)]
pub async fn log(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
    ApiQuery(query): ApiQuery<LogQuery>,
) -> Result<Json<LogPage>, ApiError> {
    if query.limit == 0 || query.limit > MAX_LOG_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_LOG_PAGE}"
        )));
    }
    let from = query.from.max(1);
    let events = state
        .runtime
        .handle(id.clone())
        .log(from, query.limit)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    let next_from = events.last().map_or(from, |event| event.seq + 1);
    Ok(Json(LogPage {
        events: events
            .into_iter()
            .map(|event| ApiEvent::new(&id, event))
            .collect(),
        next_from,
    }))
}
