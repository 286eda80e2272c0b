//! Operations: the live actors, evicting one, killing one (a crash, for
//! drills), `/metrics` and `/healthz`.

use std::collections::HashSet;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use keel_actors::core::ConversationId;

use super::error::{storage_unavailable_message, ApiError, ApiQuery};
use super::paging::{self, PageQuery};
use super::{AppState, ConversationPath};
use crate::telemetry::{LIVE_CONVERSATIONS, STORE_AVAILABLE};
use keel_api::types::{
    ActorList, ActorSummary, ApiMcpServer, ErrorBody, Evicted, Health, Killed, McpServerList,
    NodeList, NodeSummary, ReclaimedSpace, WriterList, WriterSummary,
};

/// The live actors: state, idle time, mailbox, subscribers and a memory
/// estimate; an actor stuck on one message is listed `responding: false`.
/// By id, a page at a time (`limit`, and `cursor` from the page before's
/// `next_cursor`); only the page's actors are asked.
#[utoipa::path(
    get,
    path = "/admin/actors",
    tag = "admin",
    params(PageQuery),
    responses((status = 200, body = ActorList), (status = 400, body = ErrorBody))
)]
pub async fn actors(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<ActorList>, ApiError> {
    let limit = query.limit()?;
    let after = query.after()?;
    let mut live: Vec<String> = state
        .runtime
        .live()
        .into_iter()
        .map(|id| id.to_string())
        .collect();
    live.sort();
    let (page, next_cursor) = paging::page(
        live.into_iter().map(|id| (id.clone(), id)),
        after.as_deref(),
        limit,
    );
    let page: HashSet<String> = page.into_iter().collect();
    let mut actors: Vec<ActorSummary> = state
        .runtime
        .actors_where(|id| page.contains(id.as_str()))
        .await
        .into_iter()
        .map(|stats| ActorSummary {
            id: stats.id.to_string(),
            state: stats.state.into(),
            responding: stats.responding,
            mailbox: stats.mailbox,
            idle_ms: stats.idle_ms,
            memory_bytes: stats.memory_bytes,
            subscribers: stats.subscribers,
            hibernated: stats.hibernated,
        })
        .collect();
    actors.sort_by(|left, right| left.id.cmp(&right.id));
    Ok(Json(ActorList {
        actors,
        next_cursor,
    }))
}

/// The nodes sharing this daemon's PostgreSQL database, with their
/// liveness and how many conversation trees each owns (docs/nodes.md).
/// A daemon that is not a node lists none.
#[utoipa::path(
    get,
    path = "/admin/nodes",
    tag = "admin",
    responses((status = 200, body = NodeList), (status = 503, body = ErrorBody))
)]
pub async fn nodes(State(state): State<AppState>) -> Result<Json<NodeList>, ApiError> {
    let Some(cluster) = &state.cluster else {
        return Ok(Json(NodeList {
            this_node: None,
            lease_ms: None,
            nodes: Vec::new(),
        }));
    };
    let rows = cluster
        .nodes()
        .list(cluster.lease)
        .await
        .map_err(|error| ApiError::storage_unavailable(&error.to_string()))?;
    Ok(Json(NodeList {
        this_node: Some(cluster.name().to_owned()),
        lease_ms: Some(u64::try_from(cluster.lease.as_millis()).unwrap_or(u64::MAX)),
        nodes: rows
            .into_iter()
            .map(|row| NodeSummary {
                node: row.node,
                url: row.addr,
                epoch: row.epoch,
                live: row.live,
                fenced: row.fenced,
                heartbeat_age_ms: u64::try_from(row.heartbeat_age.as_millis()).unwrap_or(u64::MAX),
                owns: row.owns,
            })
            .collect(),
    }))
}

/// Which node appended which seqs of the conversation, under which epoch
/// (docs/nodes.md): the record each commit of a node leaves in the same
/// transaction. A drill checks no two epochs ever interleave.
#[utoipa::path(
    get,
    path = "/admin/conversations/{id}/writers",
    tag = "admin",
    params(("id" = String, Path, description = "The conversation")),
    responses((status = 200, body = WriterList), (status = 503, body = ErrorBody))
)]
pub async fn writers(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
) -> Result<Json<WriterList>, ApiError> {
    let Some(cluster) = &state.cluster else {
        return Ok(Json(WriterList {
            writers: Vec::new(),
        }));
    };
    let rows = cluster
        .nodes()
        .writers(id.as_str())
        .await
        .map_err(|error| ApiError::storage_unavailable(&error.to_string()))?;
    Ok(Json(WriterList {
        writers: rows
            .into_iter()
            .map(|row| WriterSummary {
                node: row.node,
                epoch: row.epoch,
                first_seq: u64::try_from(row.first_seq).unwrap_or(0),
                last_seq: u64::try_from(row.last_seq).unwrap_or(0),
            })
            .collect(),
    }))
}

/// Save the conversation's snapshot and stop its actor; the next request
/// starts it again from the store. A busy conversation answers 409.
#[utoipa::path(
    post,
    path = "/admin/actors/{id}/evict",
    tag = "admin",
    params(("id" = String, Path, description = "Conversation id")),
    responses(
        (status = 200, body = Evicted),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Busy: cancel first", body = ErrorBody),
    )
)]
pub async fn evict(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
) -> Result<Json<Evicted>, ApiError> {
    ensure_exists(&state, &id).await?;
    let was_live = state.runtime.is_live(&id);
    state
        .runtime
        .handle(id.clone())
        .evict()
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok(Json(Evicted {
        id: id.to_string(),
        was_live,
    }))
}

/// Crash the conversation's actor on purpose (drills): its supervisor
/// restarts it from the log under its recovery policy.
/// The daemon's MCP servers: how each is reached, whether it runs, its
/// tools and the tools left out (docs/mcp.md).
#[utoipa::path(
    get,
    path = "/admin/mcp",
    tag = "admin",
    responses((status = 200, body = McpServerList))
)]
pub async fn mcp(State(state): State<AppState>) -> Json<McpServerList> {
    let servers = state
        .runtime
        .mcp()
        .statuses()
        .into_iter()
        .map(|status| ApiMcpServer {
            name: status.name,
            transport: status.transport.to_owned(),
            state: status.state.to_owned(),
            error: status.error,
            tools: status.tools,
            problems: status.problems,
        })
        .collect();
    Json(McpServerList { servers })
}

/// Give the store's freed space back to the disk, after deleting many
/// conversations (`DELETE`, retention): redb rewrites its file; sled frees
/// space by itself and has nothing to do. Writes wait while it runs (on
/// redb, reads too): an operator's call, for a quiet moment.
#[utoipa::path(
    post,
    path = "/admin/reclaim",
    tag = "admin",
    responses((status = 200, body = ReclaimedSpace))
)]
pub async fn reclaim(State(state): State<AppState>) -> Result<Json<ReclaimedSpace>, ApiError> {
    let reclaimed = state
        .runtime
        .reclaim()
        .await
        .map_err(|error| ApiError::from_runtime("", error))?;
    let action = match reclaimed.action {
        keel_actors::store::Reclaim::Compacted => "compacted",
        keel_actors::store::Reclaim::ByItself => "by_itself",
        keel_actors::store::Reclaim::InMemory => "in_memory",
    };
    Ok(Json(ReclaimedSpace {
        action: action.to_owned(),
        disk_bytes_before: reclaimed.disk_bytes_before,
        disk_bytes_after: reclaimed.disk_bytes_after,
        took_ms: u64::try_from(reclaimed.took.as_millis()).unwrap_or(u64::MAX),
    }))
}

#[utoipa::path(
    post,
    path = "/admin/actors/{id}/kill",
    tag = "admin",
    params(("id" = String, Path, description = "Conversation id")),
    responses((status = 202, body = Killed), (status = 404, body = ErrorBody))
)]
pub async fn kill(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
) -> Result<(StatusCode, Json<Killed>), ApiError> {
    state
        .runtime
        .handle(id.clone())
        .crash()
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    Ok((StatusCode::ACCEPTED, Json(Killed { id: id.to_string() })))
}

async fn ensure_exists(state: &AppState, id: &ConversationId) -> Result<(), ApiError> {
    let last_seq = state
        .runtime
        .store()
        .last_seq(id)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error.into()))?;
    if last_seq == 0 {
        return Err(ApiError::not_found(id.as_str()));
    }
    Ok(())
}

/// Prometheus text: the runtime's counters and histograms (docs/daemon.md,
/// "Metrics") and the number of live conversations now.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "admin",
    responses((status = 200, content_type = "text/plain; version=0.0.4", body = String))
)]
pub async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = state
        .metrics
        .as_ref()
        .map(|render| render())
        .unwrap_or_default();
    let live = state.runtime.live().len();
    text.push_str(&format!(
        "# HELP {LIVE_CONVERSATIONS} Conversations with a live actor now.\n\
         # TYPE {LIVE_CONVERSATIONS} gauge\n\
         {LIVE_CONVERSATIONS} {live}\n"
    ));
    let available = u8::from(state.store.stopped().is_none());
    text.push_str(&format!(
        "# HELP {STORE_AVAILABLE} 1 while the store takes writes, 0 once it has stopped.\n\
         # TYPE {STORE_AVAILABLE} gauge\n\
         {STORE_AVAILABLE} {available}\n"
    ));
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}

/// Health: answers without a token. 503 with the reason once the store
/// has stopped taking writes (the daemon then exits for its supervisor to
/// restart it; docs/daemon.md, "When the store stops").
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "admin",
    security(()),
    responses(
        (status = 200, body = Health),
        (status = 503, description = "The store stopped taking writes", body = Health),
    )
)]
pub async fn healthz(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    match state.store.stopped() {
        None => (
            StatusCode::OK,
            Json(Health {
                status: "ok".to_owned(),
                reason: None,
            }),
        ),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health {
                status: "storage_unavailable".to_owned(),
                reason: Some(storage_unavailable_message(&reason)),
            }),
        ),
    }
}
