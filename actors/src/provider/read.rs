//! Reading a response body: the event stream of a successful request, fed
//! event by event to a `StreamDecoder`, and the (bounded) body of an error.
//! Both are guarded by the idle timeout between chunks.

use std::fmt;
use std::pin::pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use keel_core::wire::classify::network_failure;
use keel_core::wire::{SseEvent, StreamDecoder};
use keel_core::{AssistantResponse, LlmFailure, StreamDelta};
use reqwest::header::CONTENT_TYPE;
use reqwest::Response;
use sseer::errors::EventStreamError;
use sseer::EventStream;

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
    decoder: Box<dyn StreamDecoder>,
    idle: Duration,
    on_delta: F,
) -> Result<AssistantResponse, LlmFailure>
where
    F: FnMut(StreamDelta) + Send,
{
    decode_chunks(guarded_chunks(response, idle), decoder, idle, on_delta).await
}

/// [`decode_events`] over any stream of body chunks.
async fn decode_chunks<S, F>(
    chunks: S,
    mut decoder: Box<dyn StreamDecoder>,
    idle: Duration,
    mut on_delta: F,
) -> Result<AssistantResponse, LlmFailure>
where
    S: Stream<Item = Result<Bytes, ChunkError>> + Send,
    F: FnMut(StreamDelta) + Send,
{
    let mut events = pin!(EventStream::new(chunks));
    while let Some(event) = events.next().await {
        let event = event.map_err(|error| stream_failure(error, idle))?;
        // The SSE spec names an event without an `event:` field "message";
        // keel-core's decoders take the empty name for it.
        let name = match &*event.event {
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
        EventStreamError::Utf8Error(error) => {
            network_failure(&format!("the event stream is not valid UTF-8: {error}"))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use keel_core::message::AssistantBlock;
    use keel_core::wire::anthropic;

    use super::*;

    /// An Anthropic stream with CRLF line ends, a comment, a ping and
    /// multi-byte UTF-8, as a server may send it.
    const STREAM: &str = concat!(
        "event: message_start\r\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",",
        "\"role\":\"assistant\",\"model\":\"claude-x\",\"content\":[],\"stop_reason\":null,",
        "\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\r\n\r\n",
        ": keep-alive\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\n",
        "data: {\"type\":\"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"héllo \"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"wörld ✓\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );

    async fn decode(
        chunks: Vec<Bytes>,
    ) -> (Vec<StreamDelta>, Result<AssistantResponse, LlmFailure>) {
        let mut deltas = Vec::new();
        let stream = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, ChunkError>));
        let decoder = Box::new(anthropic::Decoder::new("claude-x"));
        let response = decode_chunks(stream, decoder, Duration::from_secs(1), |delta| {
            deltas.push(delta)
        })
        .await;
        (deltas, response)
    }

    #[tokio::test]
    async fn a_stream_split_at_every_byte_decodes_the_same() {
        let whole = Bytes::from_static(STREAM.as_bytes());
        let (deltas, response) = decode(vec![whole.clone()]).await;
        let response = response.unwrap();
        assert_eq!(
            response.blocks,
            vec![AssistantBlock::Text {
                text: "héllo wörld ✓".to_owned()
            }]
        );
        assert_eq!(deltas.len(), 2, "{deltas:?}");
        for cut in 1..whole.len() {
            let chunks = vec![whole.slice(..cut), whole.slice(cut..)];
            let (split_deltas, split_response) = decode(chunks).await;
            assert_eq!(split_deltas, deltas, "cut at byte {cut}");
            assert_eq!(split_response.unwrap(), response, "cut at byte {cut}");
        }
        let bytes: Vec<Bytes> = (0..whole.len()).map(|i| whole.slice(i..=i)).collect();
        let (byte_deltas, byte_response) = decode(bytes).await;
        assert_eq!(byte_deltas, deltas);
        assert_eq!(byte_response.unwrap(), response);
    }

    #[tokio::test]
    async fn invalid_utf8_is_a_retryable_stream_failure() {
        let mut body = STREAM.as_bytes()[..200].to_vec();
        body.extend_from_slice(b"event: content_block_delta\ndata: \xff\xfe\n\n");
        let (_, response) = decode(vec![Bytes::from(body)]).await;
        let failure = response.unwrap_err();
        assert!(failure.retryable, "{failure:?}");
        assert!(failure.message.contains("UTF-8"), "{failure:?}");
    }

    #[tokio::test]
    async fn a_stream_cut_before_its_end_is_a_retryable_failure() {
        let cut = STREAM.find("event: message_delta").unwrap();
        let (_, response) = decode(vec![Bytes::from_static(&STREAM.as_bytes()[..cut])]).await;
        assert!(response.unwrap_err().retryable);
    }
}
