//! Any node answers any request (docs/nodes.md): a request about a
//! conversation is carried out by the node that owns its tree, and
//! forwarded there, as it came (method, path, headers, body streamed both
//! ways, event streams included), when that is another node.
//!
//! - **Owned here**: handled here.
//! - **Owned by a live node**: forwarded to it, marked with
//!   [`FORWARDED_BY`]; a node given a forwarded request it does not own
//!   answers 503 `owner_unavailable` rather than forward it again, so a
//!   request never circles. The client retries; by then the owner is
//!   known.
//! - **Owned by a node not heard from within its lease**: 503
//!   `owner_unavailable`, until another node takes the tree over.
//! - **Owned by nobody**: handled by the node rendezvous hashing picks
//!   among the live nodes (here, or forwarded there), which claims it
//!   when it starts the conversation.
//!
//! Correctness does not rest on this: a conversation starts only on the
//! node PostgreSQL says owns it (`keel_actors::ownership`), whatever
//! request reaches which node. This is what makes the answer come from
//! that node.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderName};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use keel_actors::core::ConversationId;
use keel_actors::store::rendezvous;
use keel_api::ErrorCode;

use super::error::ApiError;
use super::AppState;
use crate::cluster::Cluster;

mod events;

/// Set on a forwarded request: the node that forwarded it.
pub const FORWARDED_BY: &str = "x-keel-forwarded-by";

/// Set on every answer of a node: which node carried the request out.
pub const ANSWERED_BY: &str = "x-keel-node";

/// The conversation a path is about, if any.
fn conversation_of(path: &str) -> Option<&str> {
    let mut parts = path.trim_start_matches('/').split('/');
    let id = match (parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some("conversations"), Some(id)) => id,
        (Some("langgraph"), Some("threads"), Some("search")) => return None,
        (Some("langgraph"), Some("threads"), Some(id)) => id,
        (Some("ag-ui"), Some(id), Some(_)) => id,
        (Some("admin"), Some("actors"), Some(id)) => id,
        _ => return None,
    };
    (!id.is_empty()).then_some(id)
}

fn unavailable(message: String) -> Response {
    let mut response = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::OwnerUnavailable,
        message,
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    response
}

/// The middleware: see the module's comment.
pub async fn to_owner(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(cluster) = state.cluster.clone() else {
        return next.run(request).await;
    };
    let here = |response: Response| with_node(response, cluster.name());
    let (id, request) =
        if request.method() == axum::http::Method::POST && request.uri().path() == "/ag-ui" {
            match thread_of(request).await {
                Ok(found) => found,
                Err(refused) => return refused,
            }
        } else {
            let id = conversation_of(request.uri().path())
                .and_then(|id| ConversationId::new(id.to_owned()).ok());
            (id, request)
        };
    let Some(id) = id else {
        return here(next.run(request).await);
    };
    if state.runtime.is_live(&id) {
        // Running here: this node claimed its tree when it started it, and
        // keeps it until it is fenced (and then exits).
        return here(next.run(request).await);
    }
    let forwarded = request.headers().contains_key(FORWARDED_BY);
    let entry = match state.runtime.store().index_entry(&id).await {
        Ok(entry) => entry,
        Err(error) => return ApiError::storage_unavailable(&error.to_string()).into_response(),
    };
    let Some(entry) = entry else {
        // Unknown here is unknown everywhere (one database): the handler
        // says so, or creates it (AG-UI and LangGraph name new threads).
        return here(next.run(request).await);
    };
    let root = match &entry.parent {
        None => id.clone(),
        Some(parent) => match state.runtime.root_of(parent).await {
            Ok(root) => root,
            Err(error) => return ApiError::storage_unavailable(&error.to_string()).into_response(),
        },
    };
    let owner = match cluster.nodes().owner(root.as_str(), cluster.lease).await {
        Ok(owner) => owner,
        Err(error) => return ApiError::storage_unavailable(&error.to_string()).into_response(),
    };
    let (node, url) = match owner {
        Some(owner) if owner.node == cluster.name() => return here(next.run(request).await),
        Some(owner) if forwarded => {
            return unavailable(format!(
                "conversation {id} moved to node {} while this request was forwarded; try again",
                owner.node
            ))
        }
        Some(owner) if owner.live => (owner.node, owner.addr),
        Some(owner) => {
            return unavailable(format!(
                "conversation {id} belongs to node {}, which has not been heard from; another node takes it over once its lease of {} ms runs out",
                owner.node,
                cluster.lease.as_millis()
            ))
        }
        None if forwarded => return here(next.run(request).await),
        None => {
            let live = match cluster.nodes().live(cluster.lease).await {
                Ok(live) => live,
                Err(error) => {
                    return ApiError::storage_unavailable(&error.to_string()).into_response()
                }
            };
            let names: Vec<String> = live.iter().map(|(name, _)| name.clone()).collect();
            match rendezvous(root.as_str(), &names) {
                Some(chosen) if chosen != cluster.name() => {
                    let url = live
                        .iter()
                        .find(|(name, _)| name == chosen)
                        .and_then(|(_, url)| url.clone());
                    (chosen.to_owned(), url)
                }
                _ => return here(next.run(request).await),
            }
        }
    };
    let Some(url) = url else {
        return unavailable(format!("node {node} has not said where it answers yet"));
    };
    if request.method() == axum::http::Method::GET
        && request.uri().path().ends_with("/events")
        && request.uri().path().starts_with("/v1/")
    {
        return events::forward(cluster, id, root, node, url, request).await;
    }
    forward(&cluster, &node, &url, request).await
}

/// AG-UI's `POST /ag-ui` names its thread (the conversation) in its body:
/// the body read whole (within the messages' limit), its `threadId`, and
/// the request again with the same body. A body that is not JSON or names
/// no thread is left to the handler, which says what is wrong with it.
async fn thread_of(request: Request) -> Result<(Option<ConversationId>, Request), Response> {
    #[derive(serde::Deserialize)]
    struct Thread {
        #[serde(rename = "threadId")]
        thread_id: String,
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, crate::config::MESSAGE_BODY_LIMIT)
        .await
        .map_err(|error| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::PayloadTooLarge,
                format!("the body could not be read whole: {error}"),
            )
            .into_response()
        })?;
    let id = serde_json::from_slice::<Thread>(&bytes)
        .ok()
        .and_then(|thread| ConversationId::new(thread.thread_id).ok());
    Ok((id, Request::from_parts(parts, Body::from(bytes))))
}

fn with_node(mut response: Response, node: &str) -> Response {
    if let Ok(value) = header::HeaderValue::from_str(node) {
        response
            .headers_mut()
            .entry(HeaderName::from_static(ANSWERED_BY))
            .or_insert(value);
    }
    response
}

/// Headers that describe one hop, not the request: never forwarded.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// The request to send to node `url` for `parts`, with `path_and_query`.
fn outgoing(
    cluster: &Cluster,
    url: &str,
    parts: &axum::http::request::Parts,
    path_and_query: &str,
) -> reqwest::RequestBuilder {
    let mut outgoing = cluster
        .http
        .request(parts.method.clone(), format!("{url}{path_and_query}"));
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    outgoing.header(FORWARDED_BY, cluster.name())
}

/// A node's answer, passed on as it comes.
fn passed_on(node: &str, answer: reqwest::Response) -> Response {
    metrics::counter!(crate::telemetry::NODE_FORWARDED_TOTAL, "outcome" => "ok").increment(1);
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|error| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                ErrorCode::OwnerUnavailable,
                format!("node {node}'s answer could not be passed on: {error}"),
            )
            .into_response()
        })
}

fn unreachable_node(node: &str, error: &reqwest::Error) -> Response {
    metrics::counter!(crate::telemetry::NODE_FORWARDED_TOTAL, "outcome" => "unreachable")
        .increment(1);
    tracing::warn!(node, %error, "cannot forward a request to its conversation's node");
    unavailable(format!(
        "the conversation's node {node} cannot be reached ({error}); if it is gone, another node takes over once its lease runs out"
    ))
}

/// Carry `request` out on node `node` at `url`, streaming both bodies.
async fn forward(cluster: &Cluster, node: &str, url: &str, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .to_owned();
    let request = outgoing(cluster, url, &parts, &path)
        .body(reqwest::Body::wrap_stream(body.into_data_stream()));
    match send_while_live(cluster, node, request).await {
        Ok(answer) => passed_on(node, answer),
        Err(response) => response,
    }
}

/// Send `request` to node `node` and wait for its answer's head for as
/// long as that node stays live: a paused node accepts connections (the
/// kernel does) but never answers, and a request must not wait on it
/// forever. A long wait on a live node (LangGraph's `runs/wait`) is fine.
async fn send_while_live(
    cluster: &Cluster,
    node: &str,
    request: reqwest::RequestBuilder,
) -> Result<reqwest::Response, Response> {
    let sent = request.send();
    tokio::pin!(sent);
    let every = cluster.lease / 4;
    let mut looks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            answer = &mut sent => {
                return answer.map_err(|error| unreachable_node(node, &error));
            }
            _ = looks.tick() => {
                if !node_live(cluster, node).await {
                    metrics::counter!(crate::telemetry::NODE_FORWARDED_TOTAL, "outcome" => "unreachable")
                        .increment(1);
                    return Err(unavailable(format!(
                        "the conversation's node {node} stopped answering (not heard from within its lease); another node takes it over"
                    )));
                }
            }
        }
    }
}

/// Whether node `node` is live by PostgreSQL (a failed look counts as
/// live: PostgreSQL's trouble is not the node's).
async fn node_live(cluster: &Cluster, node: &str) -> bool {
    match cluster.nodes().live(cluster.lease).await {
        Ok(live) => live.iter().any(|(name, _)| name == node),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversation_a_path_is_about() {
        let cases = [
            ("/v1/conversations/c-1", Some("c-1")),
            ("/v1/conversations/c-1/events", Some("c-1")),
            ("/v1/conversations", None),
            ("/v1/conversations/", None),
            ("/langgraph/threads/c-2/runs/stream", Some("c-2")),
            ("/langgraph/threads/search", None),
            ("/langgraph/threads", None),
            ("/ag-ui/c-3/runs/r/events", Some("c-3")),
            ("/ag-ui", None),
            ("/admin/actors/c-4/evict", Some("c-4")),
            ("/admin/actors", None),
            ("/healthz", None),
        ];
        for (path, expected) in cases {
            assert_eq!(conversation_of(path), expected, "{path}");
        }
    }
}
