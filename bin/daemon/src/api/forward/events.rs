//! keel's event stream (`GET /v1/conversations/{id}/events`) through a
//! node that does not own the conversation: the client's connection
//! outlives the owner. The node relays the owner's stream frame by frame,
//! keeping the seq of the last canonical event it passed on; when the
//! owner's stream breaks (the owner died, was fenced, stopped), it finds
//! the conversation's owner again (once another node took it over, or
//! this one) and goes on from there with `Last-Event-ID`, so the client
//! sees every event once, in order, on one connection (docs/nodes.md).
//!
//! Only whole frames are passed on: a frame the broken stream cut short
//! is dropped, and the owner sends it again from the seq after the last
//! one passed on. The new connection's first frame is a snapshot (where
//! the conversation stands), as on any reconnection. Live-only frames
//! (deltas, tool output) sent while no owner answered are not sent again,
//! as for a client that reconnects itself. The stream ends when the
//! client goes, when an owner refuses it (the conversation was deleted),
//! or when no owner answers within [`patience`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::header;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt as _;
use tokio::sync::mpsc;

use keel_actors::core::ConversationId;

use super::{node_live, outgoing, passed_on, send_while_live, ANSWERED_BY};
use crate::cluster::Cluster;

/// How long a relayed stream waits for an owner before it ends: a lost
/// node is taken over after its lease and a quarter; this leaves room for
/// the recovery after it.
fn patience(cluster: &Cluster) -> Duration {
    cluster.lease * 3 + Duration::from_secs(10)
}

/// Between two looks for the owner.
const PAUSE: Duration = Duration::from_millis(200);

pub(super) async fn forward(
    cluster: Arc<Cluster>,
    id: ConversationId,
    root: ConversationId,
    node: String,
    url: String,
    request: Request,
) -> Response {
    let (parts, _) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .to_owned();
    // The first connection's answer is the client's: a refusal (unknown
    // conversation, bad `from`) passes on as it is.
    let answer =
        match send_while_live(&cluster, &node, outgoing(&cluster, &url, &parts, &path)).await {
            Ok(answer) => answer,
            Err(response) => return response,
        };
    if answer.status() != StatusCode::OK {
        return passed_on(&node, answer);
    }
    metrics::counter!(crate::telemetry::NODE_FORWARDED_TOTAL, "outcome" => "ok").increment(1);
    let last_seq = parts
        .headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    let (frames, received) = mpsc::channel::<Bytes>(64);
    let relay = Relay {
        node: node.clone(),
        cluster,
        id,
        root,
        parts,
        last_seq,
        frames,
    };
    tokio::spawn(relay.run(answer));
    let body = futures_util::stream::unfold(received, |mut received| async move {
        received
            .recv()
            .await
            .map(|frame| (Ok::<Bytes, std::io::Error>(frame), received))
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    if let Ok(value) = header::HeaderValue::from_str(&node) {
        headers.insert(ANSWERED_BY, value);
    }
    response
}

struct Relay {
    /// The node whose stream is being passed on.
    node: String,
    cluster: Arc<Cluster>,
    id: ConversationId,
    root: ConversationId,
    parts: axum::http::request::Parts,
    /// The seq of the last canonical event passed on.
    last_seq: Option<u64>,
    frames: mpsc::Sender<Bytes>,
}

impl Relay {
    async fn run(mut self, mut answer: reqwest::Response) {
        loop {
            if !self.pass_on(answer).await {
                return;
            }
            match self.reconnect().await {
                Some(next) => answer = next,
                None => return,
            }
        }
    }

    /// Pass the stream's whole frames on until it ends; `false` once the
    /// client is gone.
    async fn pass_on(&mut self, answer: reqwest::Response) -> bool {
        let mut stream = answer.bytes_stream();
        let mut pending = BytesMut::new();
        // A paused node keeps its connections open and sends nothing: it
        // is looked at now and then, and given up once it is not live.
        let every = self.cluster.lease / 4;
        let mut looks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            let chunk = tokio::select! {
                chunk = stream.next() => chunk,
                _ = looks.tick() => {
                    if node_live(&self.cluster, &self.node).await {
                        continue;
                    }
                    break;
                }
            };
            let Some(Ok(chunk)) = chunk else {
                break;
            };
            pending.extend_from_slice(&chunk);
            while let Some(end) = frame_end(&pending) {
                let frame = pending.split_to(end).freeze();
                if let Some(seq) = frame_id(&frame) {
                    self.last_seq = Some(seq);
                }
                if self.frames.send(frame).await.is_err() {
                    return false;
                }
            }
        }
        !self.frames.is_closed()
    }

    /// The conversation's stream again, from its owner now, after the last
    /// canonical event passed on. `None` when it is refused, the client is
    /// gone, or no owner answers in time.
    async fn reconnect(&mut self) -> Option<reqwest::Response> {
        let deadline = Instant::now() + patience(&self.cluster);
        let path = format!("/v1/conversations/{}/events", self.id);
        while Instant::now() < deadline {
            tokio::time::sleep(PAUSE).await;
            if self.frames.is_closed() {
                return None;
            }
            let owner = match self
                .cluster
                .nodes()
                .owner(self.root.as_str(), self.cluster.lease)
                .await
            {
                Ok(Some(owner)) if owner.live => owner,
                _ => continue,
            };
            // This node itself, once it took the conversation over: its
            // own API, which now answers it here.
            let url = match owner.addr {
                Some(url) if owner.node != self.cluster.name() => url,
                _ => self.cluster.url().to_owned(),
            };
            self.node = owner.node;
            let mut request = outgoing(&self.cluster, &url, &self.parts, &path);
            if let Some(seq) = self.last_seq {
                request = request.header("last-event-id", seq.to_string());
            } else if let Some(query) = self.parts.uri.query() {
                request = outgoing(&self.cluster, &url, &self.parts, &format!("{path}?{query}"));
            }
            match request.send().await {
                Ok(answer) if answer.status() == StatusCode::OK => return Some(answer),
                Ok(answer) if answer.status().is_server_error() => continue,
                Ok(_) => return None,
                Err(_) => continue,
            }
        }
        tracing::warn!(conversation = %self.id, "no node answered for a relayed event stream in time; ending it");
        None
    }
}

/// The end (exclusive) of the first whole frame in `bytes`: after its
/// blank line.
fn frame_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(2)
        .position(|pair| pair == b"\n\n")
        .map(|at| at + 2)
}

/// A frame's `id:` (the seq of a canonical event).
fn frame_id(frame: &[u8]) -> Option<u64> {
    std::str::from_utf8(frame).ok()?.lines().find_map(|line| {
        line.strip_prefix("id:")
            .and_then(|id| id.trim().parse::<u64>().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_frames_and_their_ids() {
        let stream = b"event: canonical\nid: 7\ndata: {}\n\nevent: live\ndata: {}\n\nevent: cano";
        let first = frame_end(stream).unwrap();
        assert_eq!(frame_id(&stream[..first]), Some(7));
        let rest = &stream[first..];
        let second = frame_end(rest).unwrap();
        assert_eq!(frame_id(&rest[..second]), None);
        assert_eq!(frame_end(&rest[second..]), None, "a frame cut short waits");
        assert_eq!(frame_id(b": keep-alive\n\n"), None);
    }
}
