//! Carrying out a `Plan`: a task sends the frames at the planned pace into
//! a one-slot channel, and `PlannedBody`, the response body hyper polls,
//! hands them on. Cutting the connection is the body failing (hyper then
//! drops the connection without ending the chunked body); a stall is a
//! body that never yields again.
//!
//! The body owns the request's `Exchange`, so its end is recorded where it
//! happens: the last frame taken, the cut, or hyper dropping the body
//! because the client went away. A plan that ends normally marks its last
//! frame, and the exchange is complete once hyper takes that frame: a
//! client that has read the whole answer may close the connection before
//! hyper polls the body once more for its end, and that is no disconnect.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame as BodyFrame;
use tokio::sync::mpsc;

use super::plan::{After, Plan};
use super::recording::{Exchange, ExchangeOutcome};

pub const EVENT_STREAM: &str = "text/event-stream; charset=utf-8";
pub const JSON: &str = "application/json";

enum Piece {
    Data(Bytes),
    /// A frame whose sending completes the exchange: the last of a plan
    /// that ends normally, or one marked so (`PlannedEvent::completes`).
    Last(Bytes),
    Cut,
}

/// A `200` response whose body follows `plan`.
pub fn respond(plan: Plan, exchange: Exchange, content_type: &'static str) -> Response {
    // One slot: the task runs only as far ahead as the connection takes.
    let (sender, receiver) = mpsc::channel(1);
    tokio::spawn(send_planned(plan, sender));
    let body = PlannedBody { receiver, exchange };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::new(body),
    )
        .into_response()
}

async fn send_planned(plan: Plan, sender: mpsc::Sender<Piece>) {
    let count = plan.frames.len();
    let ends = matches!(plan.after, After::End);
    for (index, frame) in plan.frames.into_iter().enumerate() {
        if let (true, Some(drip)) = (frame.is_delta, plan.drip) {
            tokio::select! {
                () = tokio::time::sleep(drip) => {}
                // The client went away while we waited: nothing to send.
                () = sender.closed() => return,
            }
        }
        let bytes = Bytes::from(frame.text);
        let piece = if frame.completes || (ends && index + 1 == count) {
            Piece::Last(bytes)
        } else {
            Piece::Data(bytes)
        };
        if sender.send(piece).await.is_err() {
            return;
        }
    }
    match plan.after {
        // Dropping the sender ends the body.
        After::End => {}
        After::Abort => {
            let _ = sender.send(Piece::Cut).await;
        }
        // Keep the sender, so the body stays open, until hyper drops the
        // body because the client closed the connection.
        After::Stall => sender.closed().await,
    }
}

struct PlannedBody {
    receiver: mpsc::Receiver<Piece>,
    exchange: Exchange,
}

impl http_body::Body for PlannedBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        match this.receiver.poll_recv(context) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Piece::Data(bytes))) => {
                this.exchange.event_sent();
                Poll::Ready(Some(Ok(BodyFrame::data(bytes))))
            }
            Poll::Ready(Some(Piece::Last(bytes))) => {
                this.exchange.event_sent();
                this.exchange.finish(ExchangeOutcome::Completed);
                Poll::Ready(Some(Ok(BodyFrame::data(bytes))))
            }
            Poll::Ready(Some(Piece::Cut)) => {
                this.exchange.finish(ExchangeOutcome::Cut);
                Poll::Ready(Some(Err(io::Error::other(
                    "mock-llm cut the stream on purpose",
                ))))
            }
            Poll::Ready(None) => {
                this.exchange.finish(ExchangeOutcome::Completed);
                Poll::Ready(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use axum::http::HeaderMap;
    use http_body::Body as _;
    use serde_json::value::RawValue;

    use super::*;
    use crate::mock_llm::plan::PlannedEvent;
    use crate::mock_llm::recording::Recorder;
    use crate::mock_llm::script::WireApi;

    /// A client that has read the whole answer may hang up before hyper
    /// polls the body for its end: the exchange is complete all the same
    /// (it was recorded "disconnected" before, a test failing under load).
    #[tokio::test]
    async fn the_last_frame_taken_completes_the_exchange() {
        let frames = ["one", "two"].map(|text| PlannedEvent::event(text.to_owned()));
        let (recorder, taken) = take(frames.to_vec(), 2).await;
        assert_eq!(taken, ["one", "two"]);
        let records = recorder.list();
        assert_eq!(records[0].outcome, ExchangeOutcome::Completed);
        assert_eq!(records[0].events_sent, 2);
    }

    /// A client may go as soon as it reads an in-stream error, before the
    /// `[DONE]` OpenAI sends after it: the exchange completed with the
    /// error (it was recorded "disconnected" when the client was quick, a
    /// test failing under load).
    #[tokio::test]
    async fn a_frame_marked_completing_completes_the_exchange_before_the_rest() {
        let mut error = PlannedEvent::event("error".to_owned());
        error.completes = true;
        let frames = vec![
            PlannedEvent::event("delta".to_owned()),
            error,
            PlannedEvent::event("[DONE]".to_owned()),
        ];
        let (recorder, taken) = take(frames, 2).await;
        assert_eq!(taken, ["delta", "error"]);
        let records = recorder.list();
        assert_eq!(records[0].outcome, ExchangeOutcome::Completed);
        assert_eq!(records[0].events_sent, 2);
    }

    /// Answer with `frames`, take `count` of them as a client would, then
    /// go away before the body's end is polled.
    async fn take(frames: Vec<PlannedEvent>, count: usize) -> (Recorder, Vec<Bytes>) {
        let recorder = Recorder::default();
        let body = RawValue::from_string("{}".to_owned()).unwrap();
        let exchange = recorder.start(
            WireApi::Anthropic,
            "/v1/messages",
            &HeaderMap::new(),
            body,
            true,
        );
        let response = respond(Plan::whole(frames), exchange, EVENT_STREAM);
        let mut body = response.into_body();
        let mut taken = Vec::new();
        for _ in 0..count {
            let frame = poll_fn(|context| Pin::new(&mut body).poll_frame(context))
                .await
                .unwrap()
                .unwrap();
            taken.push(frame.into_data().unwrap());
        }
        drop(body);
        (recorder, taken)
    }
}
