//! A typed client of the daemon's HTTP API (docs/daemon.md): one async
//! method per route, taking and returning the API's own types from
//! `crate::types` (the daemon serialises them, the client reads them
//! back, so the two cannot drift), an [`Error`] whose messages say what to
//! do, and [`Events`], a follower of a conversation's event stream that
//! reconnects with `Last-Event-ID` and so never misses or repeats a
//! canonical event.
//!
//! The CLI (the `keel` binary's `cli`) is built on it; so can anything else that drives
//! a daemon:
//!
//! ```no_run
//! # async fn demo() -> Result<(), keel_api::client::Error> {
//! use keel_api::types::CreateConversation;
//! use keel_api::client::{Client, Frame};
//! let client = Client::from_env();
//! let id = client.create(&CreateConversation::default()).await?.id;
//! let mut events = client.events(&id, None);
//! client.send_text(&id, "hello").await?;
//! loop {
//!     if let Frame::Canonical(event) = events.next().await? {
//!         println!("{} {:?}", event.seq, event.kind);
//!     }
//! }
//! # }
//! ```

pub mod error;
pub mod events;

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::{
    AcceptedMessage, ActorList, ApiDecisionKind, CancelAccepted, CompactAccepted,
    ConversationDetail, ConversationList, CreateConversation, CreatedConversation,
    DeletedConversation, Evicted, ForkRequest, ForkedConversation, Health, ImageBody, Killed,
    LogPage, McpServerList, NodeList, ReclaimedSpace, ResolveAccepted, ResolveRequest,
    RewindRequest, RewoundConversation, SendMessage, UpdateConversation, WriterList,
};

pub use error::Error;
pub use events::{Events, Frame, StreamError};

/// Where the daemon listens unless `KEEL_ADDR` says otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7777";
/// The daemon's data dir unless `KEEL_DATA_DIR` says otherwise; its
/// `token` file holds the generated token.
pub const DEFAULT_DATA_DIR: &str = "./keel-data";

/// How long connecting may take: the daemon is usually on this machine,
/// so a slow connect means it is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long any request but the event stream may take. A cancel waits for
/// the turn to come to rest, which the daemon bounds well below this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A client of one daemon. Cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The address as the user gave it, for messages.
    addr: String,
    /// `http://HOST:PORT`, without a trailing `/`.
    base: String,
    token: Option<String>,
    /// Where the token came from (or was looked for), for the message of
    /// a refused one.
    token_hint: String,
}

impl std::fmt::Debug for Client {
    // Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("addr", &self.addr).finish()
    }
}

impl Client {
    /// A client of the daemon at `addr` (`HOST:PORT`, or an `http://`
    /// URL) sending `token`, if any, as its bearer token.
    pub fn new(addr: &str, token: Option<String>) -> Client {
        Client::with_hint(addr, token, "the token given".to_owned())
    }

    fn with_hint(addr: &str, token: Option<String>, token_hint: String) -> Client {
        Client::built(addr, token, token_hint, crate::http::client_builder())
    }

    fn built(
        addr: &str,
        token: Option<String>,
        token_hint: String,
        builder: reqwest::ClientBuilder,
    ) -> Client {
        let addr = addr.trim().trim_end_matches('/').to_owned();
        let base = if addr.starts_with("http://") || addr.starts_with("https://") {
            addr.clone()
        } else {
            format!("http://{addr}")
        };
        let http = builder
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            // Building fails only without a TLS backend or a resolver,
            // neither of which this plain-HTTP client configures; the
            // default client is the same minus the connect timeout.
            .unwrap_or_default();
        Client {
            http,
            addr,
            base,
            token,
            token_hint,
        }
    }

    /// The same daemon and token through a client that keeps no
    /// connection: each request opens one of its own, closed once its
    /// response is read, as a client that opens a connection per request
    /// (or a process per request) does. Build it once and use it for
    /// many requests: building a client reads the system's certificates.
    pub fn unpooled(&self) -> Client {
        Client::built(
            &self.addr,
            self.token.clone(),
            self.token_hint.clone(),
            crate::http::client_builder().pool_max_idle_per_host(0),
        )
    }

    /// The daemon the environment names, as `keel serve` reads it:
    /// `KEEL_ADDR` (default `127.0.0.1:7777`), and the token from
    /// `KEEL_TOKEN` or else the `token` file in `KEEL_DATA_DIR` (default
    /// `./keel-data`). With no token found, requests go without one and a
    /// refusal says where the token was looked for.
    pub fn from_env() -> Client {
        let addr = non_empty_var("KEEL_ADDR").unwrap_or_else(|| DEFAULT_ADDR.to_owned());
        Client::from_env_at(&addr)
    }

    /// The daemon at `addr`, with the token found as [`Client::from_env`]
    /// finds it.
    pub fn from_env_at(addr: &str) -> Client {
        let addr = addr.to_owned();
        if let Some(token) = non_empty_var("KEEL_TOKEN") {
            return Client::with_hint(&addr, Some(token), "KEEL_TOKEN is set".to_owned());
        }
        let data_dir =
            non_empty_var("KEEL_DATA_DIR").unwrap_or_else(|| DEFAULT_DATA_DIR.to_owned());
        let path = Path::new(&data_dir).join("token");
        let token = std::fs::read_to_string(&path)
            .ok()
            .map(|text| text.trim().to_owned())
            .filter(|token| !token.is_empty());
        let hint = match token {
            Some(_) => format!("read from {}", path.display()),
            None => format!("no token in {}", path.display()),
        };
        Client::with_hint(&addr, token, hint)
    }

    /// The daemon's address as given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    // --- routes -----------------------------------------------------------

    /// `GET /healthz`: the daemon is up.
    pub async fn health(&self) -> Result<Health, Error> {
        self.call(Method::GET, "/healthz", None, NO_BODY).await
    }

    /// `POST /v1/conversations`: a new conversation.
    pub async fn create(&self, request: &CreateConversation) -> Result<CreatedConversation, Error> {
        self.call(Method::POST, "/v1/conversations", None, Some(request))
            .await
    }

    /// `GET /v1/conversations`, every page: the user's conversations;
    /// `all` adds sub-agents. The result holds them all (`next_cursor`
    /// null).
    pub async fn list(&self, all: bool) -> Result<ConversationList, Error> {
        // The largest pages: every page costs the daemon a read of its index.
        let limit = Some(crate::MAX_PAGE_LIMIT);
        let mut list = self.list_page(all, limit, None).await?;
        while let Some(cursor) = list.next_cursor.take() {
            let mut page = self.list_page(all, limit, Some(&cursor)).await?;
            list.conversations.append(&mut page.conversations);
            list.next_cursor = page.next_cursor;
        }
        Ok(list)
    }

    /// One page of `GET /v1/conversations`: at most `limit` (the daemon's
    /// default if `None`), after `cursor` (a page's `next_cursor`).
    pub async fn list_page(
        &self,
        all: bool,
        limit: Option<usize>,
        cursor: Option<&str>,
    ) -> Result<ConversationList, Error> {
        let mut query = Vec::new();
        if all {
            query.push("all=true".to_owned());
        }
        query.extend(page_query(limit, cursor));
        let path = with_query("/v1/conversations", &query);
        self.call(Method::GET, &path, None, NO_BODY).await
    }

    /// `GET /v1/conversations/{id}`: state, history, usage, pending calls.
    pub async fn get(&self, id: &str) -> Result<ConversationDetail, Error> {
        self.call(Method::GET, &conversation_path(id, ""), Some(id), NO_BODY)
            .await
    }

    /// `POST /v1/conversations/{id}/messages`.
    pub async fn send(&self, id: &str, message: &SendMessage) -> Result<AcceptedMessage, Error> {
        self.call(
            Method::POST,
            &conversation_path(id, "/messages"),
            Some(id),
            Some(message),
        )
        .await
    }

    /// [`Client::send`] of text alone.
    pub async fn send_text(&self, id: &str, text: &str) -> Result<AcceptedMessage, Error> {
        let message = SendMessage {
            text: text.to_owned(),
            images: Vec::new(),
        };
        self.send(id, &message).await
    }

    /// `PATCH /v1/conversations/{id}`: change the settings a conversation
    /// may change (the context window, compaction, the retry policy, …);
    /// the answer is the conversation with its new settings.
    pub async fn update(
        &self,
        id: &str,
        update: &UpdateConversation,
    ) -> Result<ConversationDetail, Error> {
        self.call(
            Method::PATCH,
            &conversation_path(id, ""),
            Some(id),
            Some(update),
        )
        .await
    }

    /// `POST /v1/conversations/{id}/cancel`: stops the running turn; the
    /// answer is the state it came to rest in.
    pub async fn cancel(&self, id: &str) -> Result<CancelAccepted, Error> {
        self.call(
            Method::POST,
            &conversation_path(id, "/cancel"),
            Some(id),
            NO_BODY,
        )
        .await
    }

    /// `POST /v1/conversations/{id}/compact`: summarise everything before
    /// the latest turn now; the `compacted` event follows on the stream.
    pub async fn compact(&self, id: &str) -> Result<CompactAccepted, Error> {
        self.call(
            Method::POST,
            &conversation_path(id, "/compact"),
            Some(id),
            NO_BODY,
        )
        .await
    }

    /// `POST /v1/conversations/{id}/fork`: a new conversation whose history
    /// is this one's up to `at_seq` (the end when `None`).
    pub async fn fork(&self, id: &str, at_seq: Option<u64>) -> Result<ForkedConversation, Error> {
        self.call(
            Method::POST,
            &conversation_path(id, "/fork"),
            Some(id),
            Some(&ForkRequest { at_seq }),
        )
        .await
    }

    /// `POST /v1/conversations/{id}/rewind`: from now on the prompt is the
    /// one the conversation had at `to_seq`, a turn boundary.
    pub async fn rewind(&self, id: &str, to_seq: u64) -> Result<RewoundConversation, Error> {
        self.call(
            Method::POST,
            &conversation_path(id, "/rewind"),
            Some(id),
            Some(&RewindRequest { to_seq }),
        )
        .await
    }

    /// `POST /v1/conversations/{id}/resolve`: approve, deny or answer a
    /// pending call. Exactly once: the same resolution again is accepted
    /// and changes nothing.
    pub async fn resolve(
        &self,
        id: &str,
        request: &ResolveRequest,
    ) -> Result<ResolveAccepted, Error> {
        self.call(
            Method::POST,
            &conversation_path(id, "/resolve"),
            Some(id),
            Some(request),
        )
        .await
    }

    /// [`Client::resolve`] from its parts; `by` names who decided, for
    /// the log.
    pub async fn decide(
        &self,
        id: &str,
        tool_call_id: &str,
        decision: ApiDecisionKind,
        text: Option<String>,
        by: Option<String>,
    ) -> Result<ResolveAccepted, Error> {
        let request = ResolveRequest {
            tool_call_id: tool_call_id.to_owned(),
            decision,
            text,
            input: None,
            by,
        };
        self.resolve(id, &request).await
    }

    /// `GET /v1/conversations/{id}/log`: one page of canonical events from
    /// seq `from`; `limit` caps it (the daemon has its own cap).
    pub async fn log(&self, id: &str, from: u64, limit: Option<u32>) -> Result<LogPage, Error> {
        let mut path = conversation_path(id, &format!("/log?from={from}"));
        if let Some(limit) = limit {
            path.push_str(&format!("&limit={limit}"));
        }
        self.call(Method::GET, &path, Some(id), NO_BODY).await
    }

    /// `GET /admin/nodes`: the nodes sharing this daemon's database, and
    /// which one answered (docs/nodes.md).
    pub async fn nodes(&self) -> Result<NodeList, Error> {
        self.call(Method::GET, "/admin/nodes", None, NO_BODY).await
    }

    /// `GET /admin/conversations/{id}/writers`: which node appended which
    /// seqs of conversation `id`, under which epoch (docs/nodes.md).
    pub async fn writers(&self, id: &str) -> Result<WriterList, Error> {
        let path = format!("/admin/conversations/{}/writers", encode(id));
        self.call(Method::GET, &path, Some(id), NO_BODY).await
    }

    /// `GET /admin/actors`, every page: the live actors (`next_cursor`
    /// null).
    pub async fn actors(&self) -> Result<ActorList, Error> {
        let limit = Some(crate::MAX_PAGE_LIMIT);
        let mut list = self.actors_page(limit, None).await?;
        while let Some(cursor) = list.next_cursor.take() {
            let mut page = self.actors_page(limit, Some(&cursor)).await?;
            list.actors.append(&mut page.actors);
            list.next_cursor = page.next_cursor;
        }
        Ok(list)
    }

    /// One page of `GET /admin/actors`: at most `limit` (the daemon's
    /// default if `None`), after `cursor` (a page's `next_cursor`).
    pub async fn actors_page(
        &self,
        limit: Option<usize>,
        cursor: Option<&str>,
    ) -> Result<ActorList, Error> {
        let path = with_query("/admin/actors", &page_query(limit, cursor));
        self.call(Method::GET, &path, None, NO_BODY).await
    }

    /// `POST /admin/actors/{id}/evict`: save and stop the actor (refused
    /// with `busy` while a turn runs).
    pub async fn evict(&self, id: &str) -> Result<Evicted, Error> {
        let path = format!("/admin/actors/{}/evict", encode(id));
        self.call(Method::POST, &path, Some(id), NO_BODY).await
    }

    /// `DELETE /v1/conversations/{id}`: delete a conversation and its
    /// sub-agents; a busy one is refused unless `force`, which cancels it.
    pub async fn delete(&self, id: &str, force: bool) -> Result<DeletedConversation, Error> {
        let mut path = conversation_path(id, "");
        if force {
            path.push_str("?force=true");
        }
        self.call(Method::DELETE, &path, Some(id), NO_BODY).await
    }

    /// `GET /admin/mcp`: the daemon's MCP servers, their state and tools.
    pub async fn mcp_servers(&self) -> Result<McpServerList, Error> {
        self.call(Method::GET, "/admin/mcp", None, NO_BODY).await
    }

    /// `POST /admin/reclaim`: give the store's freed space back to the
    /// disk (after deleting many conversations); writes wait meanwhile.
    pub async fn reclaim(&self) -> Result<ReclaimedSpace, Error> {
        self.call(Method::POST, "/admin/reclaim", None, NO_BODY)
            .await
    }

    /// `POST /admin/actors/{id}/kill`: crash the actor, for drills; its
    /// supervisor restarts it from the log.
    pub async fn kill(&self, id: &str) -> Result<Killed, Error> {
        let path = format!("/admin/actors/{}/kill", encode(id));
        self.call(Method::POST, &path, Some(id), NO_BODY).await
    }

    /// Follow conversation `id`'s event stream: a snapshot, then canonical
    /// events from seq `from` (or from now) and live ones. Nothing is sent
    /// until the first [`Events::next`].
    pub fn events(&self, id: &str, from: Option<u64>) -> Events {
        Events::new(self.clone(), id.to_owned(), from)
    }

    /// One connection to a conversation's event stream as raw bytes (the
    /// SSE body, de-chunked), for a reader that scans frames itself
    /// (`keel bench`'s fan-out, see keel-test-support's `FrameScanner`). No reconnecting:
    /// [`Client::events`] is the follower for everything else.
    pub async fn event_bytes(
        &self,
        id: &str,
    ) -> Result<impl futures_util::Stream<Item = Result<bytes::Bytes, Error>> + Send + 'static, Error>
    {
        let response = events::open(self, id, None, None).await?;
        let client = self.clone();
        Ok(futures_util::StreamExt::map(
            response.bytes_stream(),
            move |chunk| chunk.map_err(|error| client.transport(error)),
        ))
    }

    // --- plumbing ---------------------------------------------------------

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
            None => request,
        }
    }

    /// Send a request and read the answer: `T` on success, else the error
    /// the answer means (about conversation `id`, if the route names one).
    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        id: Option<&str>,
        body: Option<&B>,
    ) -> Result<T, Error> {
        let mut request = self.request(method, path).timeout(REQUEST_TIMEOUT);
        request = match body {
            Some(body) => request.json(body),
            // Cancel, evict and kill take no body: none is sent.
            None => request,
        };
        let response = request
            .send()
            .await
            .map_err(|error| self.transport(error))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|error| self.transport(error))?;
        if !status.is_success() {
            return Err(self.refusal(id, status.as_u16(), &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|error| Error::Unexpected {
            addr: self.addr.clone(),
            status: status.as_u16(),
            detail: format!("{error}"),
        })
    }

    fn refusal(&self, id: Option<&str>, status: u16, body: &[u8]) -> Error {
        Error::from_answer(&self.addr, &self.token_hint, id, status, body)
    }

    fn transport(&self, error: reqwest::Error) -> Error {
        if error.is_connect() {
            Error::NoDaemon {
                addr: self.addr.clone(),
                source: error,
            }
        } else if error.is_builder() {
            Error::BadAddr {
                addr: self.addr.clone(),
            }
        } else {
            Error::Http {
                addr: self.addr.clone(),
                source: error,
            }
        }
    }
}

/// The body of a request that has none.
const NO_BODY: Option<&()> = None;

fn non_empty_var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// `/v1/conversations/{id}{rest}`.
fn conversation_path(id: &str, rest: &str) -> String {
    format!("/v1/conversations/{}{rest}", encode(id))
}

/// An id as one path segment. Ids are `[A-Za-z0-9_-]` in practice; anything
/// else is percent-encoded so a stray `/` or `?` cannot reach another route.
/// `limit` and `cursor` as query parameters.
fn page_query(limit: Option<usize>, cursor: Option<&str>) -> Vec<String> {
    let mut query = Vec::new();
    if let Some(limit) = limit {
        query.push(format!("limit={limit}"));
    }
    if let Some(cursor) = cursor {
        query.push(format!("cursor={}", encode(cursor)));
    }
    query
}

/// `path` with `query`'s parameters, if any.
fn with_query(path: &str, query: &[String]) -> String {
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

fn encode(id: &str) -> String {
    let mut encoded = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// An image file as the API takes it: its bytes in base64 with the media
/// type its first bytes show (PNG, JPEG, GIF or WebP; the daemon checks
/// and scales it).
pub fn image_body(path: &Path) -> Result<ImageBody, Error> {
    let bytes = std::fs::read(path).map_err(|error| Error::Image {
        path: PathBuf::from(path),
        reason: error.to_string(),
    })?;
    let media_type = sniff_media_type(&bytes).ok_or_else(|| Error::Image {
        path: PathBuf::from(path),
        reason: "not a PNG, JPEG, GIF or WebP image".to_owned(),
    })?;
    Ok(ImageBody {
        media_type: media_type.to_owned(),
        data: base64::engine::general_purpose::STANDARD.encode(&bytes),
    })
}

fn sniff_media_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The `Content-Type` of an answer (the follower checks that an event
/// stream is one).
pub(crate) fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_becomes_a_base_url() {
        assert_eq!(
            Client::new("127.0.0.1:7777", None).base,
            "http://127.0.0.1:7777"
        );
        assert_eq!(
            Client::new("http://localhost:1/", None).base,
            "http://localhost:1"
        );
    }

    #[test]
    fn ids_cannot_escape_their_path_segment() {
        assert_eq!(encode("7f3c-ab_1"), "7f3c-ab_1");
        assert_eq!(encode("../admin?x"), "..%2Fadmin%3Fx");
    }

    #[test]
    fn images_are_known_by_their_first_bytes() {
        assert_eq!(
            sniff_media_type(b"\x89PNG\r\n\x1a\nrest"),
            Some("image/png")
        );
        assert_eq!(
            sniff_media_type(&[0xFF, 0xD8, 0xFF, 0xE0]),
            Some("image/jpeg")
        );
        assert_eq!(sniff_media_type(b"GIF89a..."), Some("image/gif"));
        assert_eq!(
            sniff_media_type(b"RIFF\0\0\0\0WEBPVP8 "),
            Some("image/webp")
        );
        assert_eq!(sniff_media_type(b"%PDF-1.7"), None);
    }

    #[test]
    fn the_debug_form_never_shows_the_token() {
        let client = Client::new("127.0.0.1:1", Some("secret-token".to_owned()));
        assert!(!format!("{client:?}").contains("secret-token"));
    }

    /// A server that answers every request of every connection with a
    /// healthy `/healthz` and keeps the connection open; it counts the
    /// connections it accepted.
    async fn counting_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0_u8; 1024];
                    while let Ok(read) = socket.read(&mut buffer).await {
                        if read == 0 {
                            return;
                        }
                        request.extend_from_slice(&buffer[..read]);
                        while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                            request.drain(..end + 4);
                            let body = r#"{"status":"ok"}"#;
                            let response = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                 content-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if socket.write_all(response.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn an_unpooled_client_opens_a_connection_per_request() {
        use std::sync::atomic::Ordering;
        let (addr, accepted) = counting_server().await;
        let pooled = Client::new(&addr, None);
        for _ in 0..3 {
            assert_eq!(pooled.health().await.unwrap().status, "ok");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "a client reuses its connection"
        );
        let unpooled = pooled.unpooled();
        for _ in 0..3 {
            assert_eq!(unpooled.health().await.unwrap().status, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn nothing_listening_is_no_daemon() {
        // A port that was free a moment ago: bind, read it, close.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let error = Client::new(&addr, None).health().await.unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("no daemon at {addr}: start one with `keel serve`")
        );
        assert!(error.is_transient());
    }
}
