//! Carrying out a `Plan`: a task sends the frames at the planned pace into
//! a one-slot channel, and `PlannedBody`, the response body hyper polls,
//! hands them on. Cutting the connection is the body failing (hyper then
//! drops the connection without ending the chunked body); a stall is a
//! body that never yields again.
//!
//! The body owns the request's `Exchange`, so its end is recorded where it
//! happens: the last frame taken, the cut, or hyper dropping the body
//! because the client went away.

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
use super::recording::{Exchange, Outcome};

pub const EVENT_STREAM: &str = "text/event-stream; charset=utf-8";
pub const JSON: &str = "application/json";

enum Piece {
    Data(Bytes),
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
    for frame in plan.frames {
        if let (true, Some(drip)) = (frame.is_delta, plan.drip) {
            tokio::select! {
                () = tokio::time::sleep(drip) => {}
                // The client went away while we waited: nothing to send.
                () = sender.closed() => return,
            }
        }
        if sender
            .send(Piece::Data(Bytes::from(frame.text)))
            .await
            .is_err()
        {
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
            Poll::Ready(Some(Piece::Cut)) => {
                this.exchange.finish(Outcome::Cut);
                Poll::Ready(Some(Err(io::Error::other(
                    "mock-llm cut the stream on purpose",
                ))))
            }
            Poll::Ready(None) => {
                this.exchange.finish(Outcome::Completed);
                Poll::Ready(None)
            }
        }
    }
}
