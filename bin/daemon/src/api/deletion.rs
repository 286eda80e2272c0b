//! `DELETE /v1/conversations/{id}`: a conversation and its sub-agents go,
//! with their logs, snapshots, checkpoints, index entries and the image
//! blobs nothing else names (`Runtime::delete`). A busy one is refused
//! unless `?force=true`, which cancels it first; afterwards the id answers
//! 404 everywhere.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use keel_api::types::{DeletedConversation, ErrorBody};

use super::error::{ApiError, ApiQuery};
use super::{AppState, ConversationPath};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    /// Cancel a conversation that is busy (a turn running, a call waiting
    /// for a person) and delete it anyway.
    #[serde(default)]
    pub force: bool,
}

/// Delete a conversation and its sub-agents.
#[utoipa::path(
    delete,
    path = "/v1/conversations/{id}",
    tag = "conversations",
    params(("id" = String, Path, description = "Conversation id"), DeleteQuery),
    responses(
        (status = 200, body = DeletedConversation),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Busy: cancel it, or delete with ?force=true", body = ErrorBody),
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
    ApiQuery(query): ApiQuery<DeleteQuery>,
) -> Result<Json<DeletedConversation>, ApiError> {
    let deletion = state
        .runtime
        .delete(&id, query.force)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    if let Some(cluster) = &state.cluster {
        // The tree's claim goes with it (a sub-agent has none of its own).
        // If this fails the row stays, naming a conversation that no
        // longer exists: harmless, as its id answers 404 everywhere.
        if let Err(error) = cluster.nodes().release(id.as_str()).await {
            tracing::warn!(conversation = %id, %error, "could not let go of a deleted conversation's claim");
        }
    }
    Ok(Json(DeletedConversation {
        deleted: deletion
            .conversations
            .iter()
            .map(ToString::to_string)
            .collect(),
        events: deletion.events,
        blobs_removed: deletion.blobs_removed,
    }))
}
