//! What a user does to a conversation's history: compact it now
//! (docs/compaction.md), fork it and rewind it to a turn boundary
//! (docs/history.md). Each is refused while a turn runs (409 `busy`); a
//! seq that is not a turn boundary is 422 `not_a_boundary`, naming the
//! nearest ones.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use keel_actors::core::StateName;
use keel_api::types::{
    ApiForkOrigin, CompactAccepted, ErrorBody, ForkRequest, ForkedConversation, RewindRequest,
    RewoundConversation,
};

use super::error::{ApiError, ApiJson, ApiJsonOrEmpty};
use super::{AppState, ConversationPath};

/// Compact now: everything before the latest turn is summarised by the
/// conversation's model, whatever the threshold. Answers once the summary
/// request is under way (`compacting`); the `compacted` event follows on
/// the stream, or a `compaction_failed` live event that leaves the prompt
/// as it was.
#[utoipa::path(
    post,
    path = "/v1/conversations/{id}/compact",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id")),
    responses(
        (status = 202, body = CompactAccepted),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Busy, or nothing before the latest turn to compact", body = ErrorBody),
        (status = 422, description = "A sub-agent: compact its parent", body = ErrorBody),
    )
)]
pub async fn compact(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
) -> Result<(StatusCode, Json<CompactAccepted>), ApiError> {
    state
        .runtime
        .handle(id.clone())
        .compact()
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CompactAccepted {
            state: StateName::Compacting.into(),
        }),
    ))
}

/// Fork: a new conversation whose history is this one's up to `at_seq`
/// (the end of its log by default), which must be a turn boundary. The
/// source is untouched; the fork's first event records where it came from.
#[utoipa::path(
    post,
    path = "/v1/conversations/{id}/fork",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id")),
    request_body(content = ForkRequest, description = "May be left out: fork at the end"),
    responses(
        (status = 201, body = ForkedConversation),
        (status = 404, body = ErrorBody),
        (status = 422, description = "Not a turn boundary (the message names the nearest ones), or a sub-agent", body = ErrorBody),
    )
)]
pub async fn fork(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
    ApiJsonOrEmpty(request): ApiJsonOrEmpty<ForkRequest>,
) -> Result<(StatusCode, Json<ForkedConversation>), ApiError> {
    let fork = state
        .runtime
        .fork(&id, request.at_seq)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok((
        StatusCode::CREATED,
        Json(ForkedConversation {
            id: fork.id.to_string(),
            forked_from: ApiForkOrigin {
                conversation: id.to_string(),
                seq: fork.seq,
            },
        }),
    ))
}

/// Rewind: from now on the prompt is the one the conversation had at
/// `to_seq`, a turn boundary; the log keeps everything after it for audit.
/// Refused while a turn runs; a turn waiting on a human is called off and
/// its calls closed.
#[utoipa::path(
    post,
    path = "/v1/conversations/{id}/rewind",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id")),
    request_body = RewindRequest,
    responses(
        (status = 200, body = RewoundConversation),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A turn runs: cancel it first", body = ErrorBody),
        (status = 422, description = "Not a turn boundary (the message names the nearest ones), or a sub-agent", body = ErrorBody),
    )
)]
pub async fn rewind(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
    ApiJson(request): ApiJson<RewindRequest>,
) -> Result<Json<RewoundConversation>, ApiError> {
    let handle = state.runtime.handle(id.clone());
    let to_runtime = |error| ApiError::from_runtime(id.as_str(), error);
    handle.rewind(request.to_seq).await.map_err(to_runtime)?;
    let inspection = handle.inspect().await.map_err(to_runtime)?;
    Ok(Json(RewoundConversation {
        to_seq: request.to_seq,
        state: inspection.state.into(),
    }))
}
