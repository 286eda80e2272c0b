//! `GET /v1/conversations/{id}/events`: a conversation as server-sent
//! events. The first frame (`event: snapshot`) says where it stands; then
//! every canonical event (`event: canonical`, its seq as the SSE `id`) and
//! the live-only ones between them (`event: live`, no `id`).
//!
//! The items come from a [`Follower`] (`follow.rs`), which resumes from
//! `Last-Event-ID: N` (or `?from=N+1`) with nothing missed or doubled,
//! follows the conversation's next life when its actor stops, and never
//! wakes a conversation at rest; this module renders them.
//!
//! Frames are bytes rendered whole (`frame`). A wave of updates the
//! conversation publishes (what one of its steps published) reaches its
//! subscribers as one shared `Wave`, and the first stream to send it
//! renders its frames into it, one buffer for the wave
//! (`Wave::rendered`); every other stream of the conversation sends
//! those same bytes, in one write. A thousand subscribers cost one
//! conversion and one JSON serialisation per update, not a thousand. What
//! is one stream's own (its snapshot, `lagged`, events read from the log
//! to resume or catch up, error frames) is rendered for that stream. The
//! body is the stream of those bytes with a keep-alive comment
//! (`keep_alive`).

pub(crate) mod frame;
pub(crate) mod keep_alive;

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use futures_util::stream;
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;

use super::error::{ApiError, ApiQuery};
use super::follow::{Follower, Item};
use super::{AppState, ConversationPath};
use keel_api::types::{ApiLiveEvent, ErrorBody, Snapshot};
use keel_api::ErrorCode;
use keep_alive::KeepAlive;

/// How often an idle stream sends a comment, so proxies keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// The first canonical seq to send (events before it are not sent).
    /// `Last-Event-ID: N` means the same as `from=N+1`, and wins.
    pub from: Option<u64>,
}

/// Follow a conversation: a snapshot, then canonical and live events.
#[utoipa::path(
    get,
    path = "/v1/conversations/{id}/events",
    tag = "conversations",
    params(
        ("id" = String, Path, description = "Conversation id"),
        ("Last-Event-ID" = Option<u64>, Header, description = "The seq of the last canonical event this client saw"),
        EventsQuery
    ),
    responses(
        (status = 200, content_type = "text/event-stream", description = "`event: snapshot` (a Snapshot), then `event: canonical` (an ApiEvent, `id` = its seq) and `event: live` (an ApiLiveEvent) frames", body = Snapshot),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn events(
    State(state): State<AppState>,
    ConversationPath(id): ConversationPath,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let from = match headers.get("last-event-id") {
        Some(value) => {
            let seq = value
                .to_str()
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request("Last-Event-ID must be the seq of a canonical event")
                })?;
            // The client saw N, so it is owed N+1 on. Past the log's end
            // (u64::MAX included, which has no successor) it missed
            // nothing: the stream goes on from the end, as for any seq
            // beyond it.
            Some(seq.saturating_add(1))
        }
        None => query.from,
    };
    let follow = Follow {
        follower: Follower::open(&state, id, from).await?,
    };
    // Boxed: the state moves into and out of each frame's future, and a
    // pointer moves cheaper than the whole stream's state.
    let frames = stream::unfold(Box::new(follow), |mut follow| async move {
        let frame = follow.next_frame().await?;
        Some((frame, follow))
    });
    let body = Body::from_stream(KeepAlive::new(frames, KEEP_ALIVE));
    Ok((
        [
            (CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response())
}

/// One client's stream: the follower's items as keel's SSE frames.
struct Follow {
    follower: Follower,
}

/// An error frame: the stream ends after it; the client reconnects with
/// its `Last-Event-ID`.
#[derive(Serialize)]
struct StreamError {
    code: ErrorCode,
    message: String,
}

impl Follow {
    async fn next_frame(&mut self) -> Option<Bytes> {
        let id = self.follower.id().clone();
        Some(match self.follower.next().await? {
            Item::Snapshot(view) => {
                frame::render("snapshot", None, &crate::convert::snapshot(view))
            }
            Item::Logged(updates) => frame::updates(&id, &updates),
            // Rendered by the first of the conversation's streams to get
            // there, the same bytes for all.
            Item::Wave(published) => {
                published
                    .rendered(|updates| SseFrame(frame::updates(&id, updates)))
                    .0
            }
            Item::Lagged { missed } => {
                frame::render("live", None, &ApiLiveEvent::Lagged { missed })
            }
            Item::Failed { code, message } => {
                frame::render("error", None, &StreamError { code, message })
            }
        })
    }
}

/// What this module keeps in a `Wave`'s render-once slot, which is
/// keyed by type: its own type, so that nothing else that renders updates
/// to `Bytes` could take this one's place.
#[derive(Clone)]
struct SseFrame(Bytes);
