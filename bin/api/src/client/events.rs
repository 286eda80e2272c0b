//! [`Events`]: a follower of `GET /v1/conversations/{id}/events` that
//! yields typed [`Frame`]s and outlives the connection under it. When the
//! stream breaks (the daemon restarted, stopped, or ended the stream with
//! an error frame) it connects again with `Last-Event-ID` set to the last
//! canonical seq it yielded, so every canonical event comes once and in
//! order across any number of reconnections. SSE framing is `sseer`'s
//! parser over reqwest's byte stream, the same pairing keel-actors reads
//! providers with.

use std::pin::Pin;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use sseer::errors::EventStreamError;
use sseer::EventStream;

use super::{content_type, Client, Error};
use crate::types::{ApiEvent, ApiLiveEvent, Snapshot};

/// What the follower yields: the daemon's three kinds of frame, its error
/// frame, and word of a broken connection. Serialised as `{"frame":
/// "canonical", "data": …}`, one shape for `--json` output.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "frame", content = "data", rename_all = "snake_case")]
pub enum Frame {
    /// Where the conversation stands; first on every connection.
    Snapshot(Snapshot),
    /// An event of the log; its `seq` is the resume point.
    Canonical(ApiEvent),
    /// Live-only: deltas, tool output, state changes.
    Live(ApiLiveEvent),
    /// The daemon ended the stream with an error frame; the follower
    /// connects again on the next call.
    Error(StreamError),
    /// The connection broke or could not be made; the follower keeps
    /// trying (from the last seq seen) on the next calls, and says so once
    /// per outage.
    Reconnecting { error: String },
}

/// The daemon's `event: error` frame.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamError {
    pub code: String,
    pub message: String,
}

type Body = Pin<
    Box<dyn Stream<Item = Result<sseer::event::Event, EventStreamError<reqwest::Error>>> + Send>,
>;

/// How long the follower keeps trying to reconnect, by default, before
/// [`Events::next`] gives up with the last error.
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(60);
/// The longest pause between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The pause before reconnecting after the daemon's error frame.
const ERROR_PAUSE: Duration = Duration::from_millis(250);

/// One conversation's event stream, reconnecting as needed. Made by
/// [`Client::events`].
pub struct Events {
    client: Client,
    id: String,
    /// The first seq the first connection asks for (`?from=`), until a
    /// canonical event or a snapshot gives a resume point.
    from: Option<u64>,
    /// The seq of the last canonical event yielded (or the snapshot's
    /// `last_seq` when following from now): `Last-Event-ID` on reconnect.
    last_seq: Option<u64>,
    body: Option<Body>,
    /// When the current outage began, if the stream is down.
    down_since: Option<Instant>,
    /// Failed attempts in the current outage, for the backoff.
    attempts: u32,
    /// The outage was reported (one `Reconnecting` per outage).
    reported: bool,
    /// How long an outage may last before `next` fails; `None`: forever.
    patience: Option<Duration>,
    /// A connection was made once. Until then every error is returned as
    /// it is: a command pointed at no daemon, or at an unknown
    /// conversation, should say so at once, not retry.
    connected: bool,
    /// The daemon ended the last stream with an error frame: pause before
    /// connecting again, so a daemon that keeps failing is not hammered.
    pause: bool,
}

impl Events {
    pub(super) fn new(client: Client, id: String, from: Option<u64>) -> Events {
        Events {
            client,
            id,
            from,
            last_seq: None,
            body: None,
            down_since: None,
            attempts: 0,
            reported: false,
            patience: Some(DEFAULT_PATIENCE),
            connected: false,
            pause: false,
        }
    }

    /// How long to keep reconnecting before giving up (`None`: forever,
    /// for an interactive session a person can leave).
    pub fn with_patience(mut self, patience: Option<Duration>) -> Events {
        self.patience = patience;
        self
    }

    /// The seq of the last canonical event yielded: where a reconnection
    /// resumes.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// The next frame. Reconnects as needed; fails if the first connection
    /// cannot be made, on a refusal (unknown conversation, bad token), or
    /// when an outage outlasts the patience.
    pub async fn next(&mut self) -> Result<Frame, Error> {
        loop {
            if self.body.is_none() {
                if std::mem::take(&mut self.pause) {
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
                match connect(&self.client, &self.id, self.last_seq, self.from).await {
                    Ok(body) => {
                        self.body = Some(body);
                        self.connected = true;
                        self.down_since = None;
                        self.attempts = 0;
                        self.reported = false;
                    }
                    Err(error) if self.connected && error.is_transient() => {
                        if let Some(frame) = self.outage(error).await? {
                            return Ok(frame);
                        }
                        continue;
                    }
                    Err(error) => return Err(error),
                }
            }
            let Some(body) = self.body.as_mut() else {
                continue;
            };
            match body.next().await {
                Some(Ok(event)) => {
                    if let Some(frame) = self.frame(&event)? {
                        return Ok(frame);
                    }
                }
                Some(Err(error)) => {
                    self.body = None;
                    let error = match error {
                        EventStreamError::Transport(error) => self.client.transport(error),
                        EventStreamError::Utf8Error(error) => Error::Unexpected {
                            addr: self.client.addr.clone(),
                            status: 200,
                            detail: format!("the event stream is not UTF-8: {error}"),
                        },
                    };
                    if let Some(frame) = self.outage(error).await? {
                        return Ok(frame);
                    }
                }
                None => {
                    // The daemon ended the stream: it is stopping, or it
                    // sent an error frame. Either way, connect again.
                    self.body = None;
                    let error = Error::Unexpected {
                        addr: self.client.addr.clone(),
                        status: 200,
                        detail: "the event stream ended".to_owned(),
                    };
                    if let Some(frame) = self.outage(error).await? {
                        return Ok(frame);
                    }
                }
            }
        }
    }

    /// The stream is down with `error`: the frame to report it (once per
    /// outage), after waiting the backoff; or the error itself once the
    /// outage has lasted longer than the patience.
    async fn outage(&mut self, error: Error) -> Result<Option<Frame>, Error> {
        let since = *self.down_since.get_or_insert_with(Instant::now);
        if self
            .patience
            .is_some_and(|patience| since.elapsed() > patience)
        {
            return Err(error);
        }
        if self.attempts > 0 {
            let backoff = Duration::from_millis(100)
                .saturating_mul(2u32.saturating_pow(self.attempts.min(8)))
                .min(MAX_BACKOFF);
            tokio::time::sleep(backoff).await;
        }
        self.attempts += 1;
        if self.reported {
            return Ok(None);
        }
        self.reported = true;
        Ok(Some(Frame::Reconnecting {
            error: error.to_string(),
        }))
    }

    /// The frame an SSE event is, if it is one this follower yields.
    fn frame(&mut self, event: &sseer::event::Event) -> Result<Option<Frame>, Error> {
        let frame = match &*event.event {
            "snapshot" => {
                let snapshot: Snapshot = self.parse(&event.data)?;
                if self.last_seq.is_none() && self.from.is_none() {
                    self.last_seq = Some(snapshot.last_seq);
                }
                Frame::Snapshot(snapshot)
            }
            "canonical" => {
                let canonical: ApiEvent = self.parse(&event.data)?;
                // Never twice, whatever a reconnection replays.
                if self.last_seq.is_some_and(|last| canonical.seq <= last) {
                    return Ok(None);
                }
                self.last_seq = Some(canonical.seq);
                Frame::Canonical(canonical)
            }
            "live" => Frame::Live(self.parse(&event.data)?),
            "error" => {
                self.body = None;
                self.pause = true;
                Frame::Error(self.parse(&event.data)?)
            }
            // A frame kind this client does not know (a newer daemon):
            // nothing it could act on.
            _ => return Ok(None),
        };
        Ok(Some(frame))
    }

    fn parse<T: for<'de> Deserialize<'de>>(&self, data: &str) -> Result<T, Error> {
        serde_json::from_str(data).map_err(|error| Error::Unexpected {
            addr: self.client.addr.clone(),
            status: 200,
            detail: format!("an event frame that does not parse ({error}): {data}"),
        })
    }
}

/// Open the stream from where the follower stands. Borrows no `Events`
/// (whose body is not `Sync`), so a follower can be driven from any task.
async fn connect(
    client: &Client,
    id: &str,
    last_seq: Option<u64>,
    from: Option<u64>,
) -> Result<Body, Error> {
    let response = open(client, id, last_seq, from).await?;
    let chunks = response.bytes_stream();
    Ok(Box::pin(EventStream::new(chunks)) as Body)
}

/// One connection to a conversation's event stream, its status and
/// content type checked, the body not read yet.
pub(super) async fn open(
    client: &Client,
    id: &str,
    last_seq: Option<u64>,
    from: Option<u64>,
) -> Result<reqwest::Response, Error> {
    let mut path = super::conversation_path(id, "/events");
    let mut request;
    match (last_seq, from) {
        (Some(seq), _) => {
            request = client.request(reqwest::Method::GET, &path);
            request = request.header("last-event-id", seq.to_string());
        }
        (None, Some(from)) => {
            path.push_str(&format!("?from={from}"));
            request = client.request(reqwest::Method::GET, &path);
        }
        (None, None) => request = client.request(reqwest::Method::GET, &path),
    }
    let response = request
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await
        .map_err(|error| client.transport(error))?;
    let status = response.status();
    if !status.is_success() {
        let bytes = response.bytes().await.unwrap_or_default();
        return Err(client.refusal(Some(id), status.as_u16(), &bytes));
    }
    let kind = content_type(&response);
    if !kind.starts_with("text/event-stream") {
        return Err(Error::Unexpected {
            addr: client.addr.clone(),
            status: status.as_u16(),
            detail: format!("an event stream was expected, not {kind:?}"),
        });
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::http::HeaderMap;
    use axum::routing::get;
    use axum::Router;

    use super::*;
    use crate::types::{ApiEventKind, ApiState, ApiUsage};

    fn snapshot(last_seq: u64) -> String {
        let snapshot = Snapshot {
            id: "c".to_owned(),
            state: ApiState::Idle,
            last_seq,
            cwd: "/".to_owned(),
            usage: ApiUsage {
                input_tokens: 0,
                output_tokens: 0,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
            pending: Vec::new(),
            recent_messages: Vec::new(),
            omitted_messages: 0,
        };
        let data = serde_json::to_string(&snapshot).unwrap();
        format!("event: snapshot\ndata: {data}\n\n")
    }

    fn canonical(seq: u64) -> String {
        let event = ApiEvent {
            id: format!("c:{seq}"),
            seq,
            at_ms: 0,
            parent: None,
            triggers_turn: false,
            kind: ApiEventKind::TurnStarted { turn: 1 },
        };
        let data = serde_json::to_string(&event).unwrap();
        format!("event: canonical\nid: {seq}\ndata: {data}\n\n")
    }

    /// A stand-in daemon: the first stream ends after seq 5; the second
    /// (which must resume with `Last-Event-ID: 5`) replays 5, sends 6, an
    /// unknown frame and an error frame.
    #[tokio::test]
    async fn the_follower_resumes_after_the_last_seq_and_never_repeats_one() {
        let resumed_from: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let seen = resumed_from.clone();
        let app = Router::new().route(
            "/v1/conversations/c/events",
            get(move |headers: HeaderMap| {
                let seen = seen.clone();
                async move {
                    let last = headers
                        .get("last-event-id")
                        .and_then(|value| value.to_str().ok())
                        .map(str::to_owned);
                    let first = last.is_none();
                    seen.lock().unwrap().push(last);
                    let body = if first {
                        format!("{}{}{}", snapshot(3), canonical(4), canonical(5))
                    } else {
                        format!(
                            "{}{}{}event: novel\ndata: {{}}\n\nevent: error\ndata: {{\"code\":\"x\",\"message\":\"m\"}}\n\n",
                            snapshot(6),
                            canonical(5),
                            canonical(6)
                        )
                    };
                    ([("content-type", "text/event-stream")], body)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });

        let mut events = Client::new(&addr, None).events("c", None);
        let mut kinds = Vec::new();
        for _ in 0..7 {
            let frame = events.next().await.unwrap();
            kinds.push(match frame {
                Frame::Snapshot(snapshot) => format!("snapshot {}", snapshot.last_seq),
                Frame::Canonical(event) => format!("canonical {}", event.seq),
                Frame::Live(_) => "live".to_owned(),
                Frame::Error(error) => format!("error {}", error.code),
                Frame::Reconnecting { .. } => "reconnecting".to_owned(),
            });
        }
        assert_eq!(
            kinds,
            [
                "snapshot 3",
                "canonical 4",
                "canonical 5",
                "reconnecting",
                "snapshot 6",
                "canonical 6",
                "error x"
            ]
        );
        assert_eq!(*resumed_from.lock().unwrap(), [None, Some("5".to_owned())]);
        assert_eq!(events.last_seq(), Some(6));
    }

    #[tokio::test]
    async fn a_first_connection_that_fails_is_an_error_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let mut events = Client::new(&addr, None).events("c", None);
        let error = events.next().await.unwrap_err();
        assert!(matches!(error, Error::NoDaemon { .. }), "{error:?}");
    }
}
