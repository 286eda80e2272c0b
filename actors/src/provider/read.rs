//! Reading a response body: the event stream of a successful request, fed
//! event by event to a `StreamDecoder`, and the (bounded) body of an error.
//! Both are guarded by the idle timeout between chunks.

use std::fmt;
use std::pin::pin;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use keel_core::wire::classify::network_failure;
use keel_core::wire::{SseEvent, StreamDecoder};
use keel_core::{AssistantResponse, LlmFailure, StreamDelta};
use reqwest::header::CONTENT_TYPE;
use reqwest::Response;

use super::failure;

/// Most of an error body kept: enough for any provider's JSON error, and a
/// bound on what a misbehaving server can make keel hold.
pub(super) const MAX_ERROR_BODY: usize = 64 * 1024;

/// Why the byte stream under the SSE parser stopped.
#[derive(Debug)]
enum ChunkError {
    /// No chunk within the idle timeout.
    Idle,
    Http(reqwest::Error),
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkError::Idle => f.write_str("idle timeout"),
            ChunkError::Http(error) => error.fmt(f),
        }
    }
}

/// The body's chunks, ending with [`ChunkError::Idle`] when the server
/// stays silent for `idle`. After an error the body is dropped, which
/// closes the connection.
fn guarded_chunks(
    response: Response,
    idle: Duration,
) -> impl Stream<Item = Result<Bytes, ChunkError>> + Send {
    let chunks = Box::pin(response.bytes_stream());
    futures_util::stream::unfold(Some(chunks), move |state| async move {
        let mut chunks = state?;
        match tokio::time::timeout(idle, chunks.next()).await {
            Err(_) => Some((Err(ChunkError::Idle), None)),
            Ok(None) => None,
            Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some(chunks))),
            Ok(Some(Err(error))) => Some((Err(ChunkError::Http(error)), None)),
        }
    })
}

/// Feeds every event of `response` to `decoder` and hands its deltas to
/// `on_delta`, until the decoder says the response is complete or the
/// stream ends; then the decoder's verdict.
pub(super) async fn decode_events<F>(
    response: Response,
    mut decoder: Box<dyn StreamDecoder>,
    idle: Duration,
    mut on_delta: F,
) -> Result<AssistantResponse, LlmFailure>
where
    F: FnMut(StreamDelta) + Send,
{
    let mut events = pin!(guarded_chunks(response, idle).eventsource());
    while let Some(event) = events.next().await {
        let event = event.map_err(|error| stream_failure(error, idle))?;
        // The SSE spec names an event without an `event:` field "message";
        // keel-core's decoders take the empty name for it.
        let name = match event.event.as_str() {
            "message" => "",
            name => name,
        };
        let deltas = decoder.feed(SseEvent {
            event: name,
            data: &event.data,
        })?;
        for delta in deltas {
            on_delta(delta);
        }
        if decoder.is_complete() {
            break;
        }
    }
    decoder.finish()
}

fn stream_failure(error: EventStreamError<ChunkError>, idle: Duration) -> LlmFailure {
    match error {
        EventStreamError::Transport(ChunkError::Idle) => {
            failure::timed_out("waiting for the next part of the response", idle)
        }
        EventStreamError::Transport(ChunkError::Http(error)) => failure::transport(&error),
        EventStreamError::Utf8(error) => {
            network_failure(&format!("the event stream is not valid UTF-8: {error}"))
        }
        EventStreamError::Parser(error) => {
            network_failure(&format!("the event stream is malformed: {error}"))
        }
    }
}

/// The response says its body is JSON.
pub(super) fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        })
}

/// Up to [`MAX_ERROR_BODY`] bytes of the body, as text. A body that breaks
/// off or stalls gives what arrived until then: the status alone still
/// classifies the failure.
pub(super) async fn bounded_body(mut response: Response, idle: Duration) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match tokio::time::timeout(idle, response.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                let room = MAX_ERROR_BODY - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => break,
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}
