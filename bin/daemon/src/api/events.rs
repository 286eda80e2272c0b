//! `GET /v1/conversations/{id}/events`: a conversation as server-sent
//! events. The first frame (`event: snapshot`) says where it stands; then
//! every canonical event (`event: canonical`, its seq as the SSE `id`) and
//! the live-only ones between them (`event: live`, no `id`).
//!
//! Resuming is the runtime's business: `Last-Event-ID: N` (or `?from=N+1`)
//! subscribes from seq N+1 (`ConversationHandle::subscribe_from`), which
//! reads what the client missed from the log and then follows live, with
//! nothing missed or doubled. A client that falls behind is caught up from
//! the log by the subscription too. If the conversation's actor stops
//! (evicted, crashed and restarted), the stream subscribes again from the
//! next seq it owes, sending a fresh snapshot. A client that disconnects
//! drops its subscription, and the actor frees the channel.
//!
//! A stream never wakes a conversation (docs/daemon.md, "Streams of a
//! conversation at rest"). Opening one of a conversation no actor serves
//! (evicted, or not started since the daemon did) sends its snapshot read
//! from the store and the canonical events the client is owed from the
//! log, then waits, quiet but for keep-alives, until something else starts
//! the conversation (a message, a resolution, the supervisor's restart);
//! then it follows that life from the next seq owed. A stream whose
//! conversation is evicted waits the same way.
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

mod frame;
mod keep_alive;
mod stop;

use std::future::Future as _;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::measure::OpenStream;
use futures_util::stream;
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;

use keel_actors::core::{ConversationId, Seq};
use keel_actors::{ConversationHandle, Following, Received, Subscription, View, Wave};

use super::error::{ApiError, ApiQuery};
use super::{AppState, ConversationPath};
use keel_api::types::{ApiLiveEvent, ErrorBody, Snapshot};
use keel_api::ErrorCode;
use keep_alive::KeepAlive;
use stop::Stop;

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
    let handle = state.runtime.handle(id.clone());
    let following = handle
        .follow(from)
        .await
        .map_err(|error| ApiError::from_runtime(id.as_str(), error))?;
    let (subscription, at_rest, resume_from) = match following {
        Following::Live(subscription) => (Some(subscription), None, None),
        Following::AtRest(view) => {
            let next = from.unwrap_or(view.last_seq + 1).max(1);
            (None, Some(view), Some(next))
        }
    };
    let follow = Follow {
        handle,
        id,
        subscription,
        at_rest,
        snapshot_sent: false,
        resume_from,
        stop: Stop::new(state.stopping.clone()),
        done: false,
        _open: OpenStream::open(),
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

/// One client's stream.
struct Follow {
    handle: ConversationHandle,
    id: ConversationId,
    subscription: Option<Subscription>,
    /// The conversation rested with no actor when the stream opened: its
    /// view, sent as the snapshot before anything else.
    at_rest: Option<View>,
    snapshot_sent: bool,
    /// The seq to subscribe from again once the actor's next life answers.
    resume_from: Option<Seq>,
    stop: Stop,
    done: bool,
    /// Counts this stream in `keel_event_streams_open` while it lives.
    _open: OpenStream,
}

/// Canonical events read from the log per frame batch while a stream of a
/// conversation at rest sends what its client is owed.
const LOG_PAGE: usize = 256;

/// An error frame: the stream ends after it; the client reconnects with
/// its `Last-Event-ID`.
#[derive(Serialize)]
struct StreamError {
    code: ErrorCode,
    message: String,
}

impl Follow {
    async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if self.done || self.stop.is_stopping() {
                return None;
            }
            if self.subscription.is_none() {
                if let Some(view) = self.at_rest.take() {
                    self.snapshot_sent = true;
                    return Some(frame::render(
                        "snapshot",
                        None,
                        &crate::convert::snapshot(view),
                    ));
                }
                match self.owed_from_log().await {
                    Ok(Some(frames)) => return Some(frames),
                    Ok(None) => {}
                    Err(frame) => {
                        self.done = true;
                        return frame;
                    }
                }
                if let Err(frame) = self.resubscribe().await {
                    self.done = true;
                    return frame;
                }
            }
            let Some(subscription) = self.subscription.as_mut() else {
                continue;
            };
            if !self.snapshot_sent {
                self.snapshot_sent = true;
                return Some(frame::render(
                    "snapshot",
                    None,
                    &crate::convert::snapshot(subscription.view.clone()),
                ));
            }
            // The next update, or the daemon's stop. The subscription is
            // polled first; the stop (checked above for every frame) only
            // while no update is ready, and cheaply (`stop`).
            let received = {
                let stop = &mut self.stop;
                let mut next = std::pin::pin!(subscription.next_wave());
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(received) = next.as_mut().poll(cx) {
                        return Poll::Ready(Some(received));
                    }
                    stop.poll_stopped(cx).map(|()| None)
                })
                .await
            };
            // `None`: the daemon is stopping.
            let received = received?;
            match received {
                Received::Update(published) => return Some(self.shared_frame(&published)),
                Received::Lagged { missed } => {
                    return Some(frame::render(
                        "live",
                        None,
                        &ApiLiveEvent::Lagged { missed },
                    ));
                }
                Received::CatchUpFailed { error } => {
                    self.done = true;
                    return Some(frame::render(
                        "error",
                        None,
                        &StreamError {
                            code: ErrorCode::CatchUpFailed,
                            message: format!(
                                "could not read missed events from the log ({error}); reconnect with Last-Event-ID"
                            ),
                        },
                    ));
                }
                Received::Closed => {
                    // The actor stopped; follow its next life from the
                    // next seq this client is owed.
                    let next = subscription.next_seq();
                    self.subscription = None;
                    self.resume_from = Some(next);
                }
            }
        }
    }

    /// The frames of a wave as the conversation published it: rendered
    /// by the first of its streams to get there, the same bytes for all.
    fn shared_frame(&self, published: &Arc<Wave>) -> Bytes {
        published
            .rendered(|updates| SseFrame(frame::updates(&self.id, updates)))
            .0
    }
}

/// What this module keeps in a `Wave`'s render-once slot, which is
/// keyed by type: its own type, so that nothing else that renders updates
/// to `Bytes` could take this one's place.
#[derive(Clone)]
struct SseFrame(Bytes);

impl Follow {
    /// The canonical events the client is owed that the log already holds,
    /// while no actor serves the conversation: the next page of them as
    /// frames, or `None` once there are none. `Err` ends the stream, with
    /// the frame to send last.
    async fn owed_from_log(&mut self) -> Result<Option<Bytes>, Option<Bytes>> {
        let Some(from) = self.resume_from else {
            return Ok(None);
        };
        let events = match self.handle.log(from, LOG_PAGE).await {
            Ok(events) => events,
            Err(keel_actors::Error::NotFound(_)) => return Ok(None),
            Err(error) => return Err(Some(unavailable(&error))),
        };
        let Some(last) = events.last() else {
            return Ok(None);
        };
        self.resume_from = Some(last.seq + 1);
        let updates: Vec<keel_actors::Update> = events
            .into_iter()
            .map(|event| keel_actors::Update::Event {
                event: Arc::new(event),
            })
            .collect();
        Ok(Some(frame::updates(&self.id, &updates)))
    }

    /// Follow the conversation again once an actor serves it: started by
    /// something else (a message, a resolution, its supervisor), never by
    /// this stream. `Err` ends the stream, with the frame to send last, if
    /// any.
    async fn resubscribe(&mut self) -> Result<(), Option<Bytes>> {
        loop {
            let woken = {
                let stop = &mut self.stop;
                let mut woken = std::pin::pin!(self.handle.woken());
                std::future::poll_fn(|cx| {
                    if woken.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(true);
                    }
                    stop.poll_stopped(cx).map(|()| false)
                })
                .await
            };
            if !woken {
                return Err(None);
            }
            match self.handle.follow_live(self.resume_from).await {
                Ok(Some(subscription)) => {
                    self.subscription = Some(subscription);
                    self.snapshot_sent = false;
                    return Ok(());
                }
                // It stopped again before it could be followed: wait for
                // its next life.
                Ok(None) => tokio::task::yield_now().await,
                Err(keel_actors::Error::ShuttingDown) => return Err(None),
                Err(error) => return Err(Some(unavailable(&error))),
            }
        }
    }
}

/// The error frame of a stream that cannot follow its conversation.
fn unavailable(error: &keel_actors::Error) -> Bytes {
    frame::render(
        "error",
        None,
        &StreamError {
            code: ErrorCode::ConversationUnavailable,
            message: format!(
                "the conversation could not be followed ({error}); reconnect with Last-Event-ID"
            ),
        },
    )
}
