//! The client: the daemon's JSON routes through reqwest, and event
//! streams read off plain sockets, scanned only as far as the bench needs.

use super::processes::Daemon;
use super::*;

/// The daemon's JSON routes, through reqwest.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
}

impl Api {
    pub(crate) fn new(daemon: &Daemon) -> Api {
        Api {
            http: keel_api::http::client_builder().no_proxy().build().unwrap(),
            base: format!("http://{}", daemon.addr),
        }
    }

    pub(crate) async fn create(&self) -> String {
        let response = self
            .http
            .post(format!("{}/v1/conversations", self.base))
            .bearer_auth(TOKEN)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
        let created: Value = response.json().await.unwrap();
        created["id"].as_str().unwrap().to_owned()
    }

    /// Send a message; its seq once the daemon answered 202.
    pub(crate) async fn send(&self, id: &str, text: &str) -> u64 {
        let response = self
            .http
            .post(format!("{}/v1/conversations/{id}/messages", self.base))
            .bearer_auth(TOKEN)
            .json(&json!({ "text": text }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 202);
        let accepted: Value = response.json().await.unwrap();
        accepted["seq"].as_u64().unwrap()
    }
}

/// Open a stream on each conversation of `ids`, `OPENING` at a time; each
/// is returned once its snapshot arrived, with how long that took.
pub(crate) async fn open_many(addr: SocketAddr, ids: Vec<String>) -> Vec<(usize, Sse, Duration)> {
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut opening = JoinSet::new();
    for (index, id) in ids.into_iter().enumerate() {
        let gate = gate.clone();
        opening.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let started = Instant::now();
            let sse = Sse::open(addr, &id).await;
            (index, sse, started.elapsed())
        });
    }
    let mut streams = Vec::new();
    while let Some(opened) = opening.join_next().await {
        streams.push(opened.unwrap());
    }
    streams.sort_by_key(|(index, _, _)| *index);
    streams
}

/// One `GET …/events` over a plain socket: HTTP/1.1, chunked, SSE, parsed
/// only as far as the bench needs, so the client does little work.
pub(crate) struct Sse {
    pub(crate) stream: TcpStream,
    /// Bytes read and not yet taken out of their chunks.
    pub(crate) raw: Vec<u8>,
    /// The body taken out of its chunks, not yet split into frames.
    pub(crate) frames: FrameScanner,
    pub(crate) headers_done: bool,
}

impl Sse {
    pub(crate) async fn open(addr: SocketAddr, id: &str) -> Sse {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let request = format!(
            "GET /v1/conversations/{id}/events HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\naccept: text/event-stream\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut sse = Sse {
            stream,
            raw: Vec::new(),
            frames: FrameScanner::default(),
            headers_done: false,
        };
        loop {
            match sse.next_frame() {
                Some(Scanned::Snapshot) => return sse,
                Some(other) => panic!("a stream began with {other:?}"),
                None => {
                    sse.fill()
                        .await
                        .expect("a stream ended before its snapshot");
                }
            }
        }
    }

    /// Read what the socket has; `None` once it is closed. The instant is
    /// taken as soon as the read returns, before any parsing.
    pub(crate) async fn fill(&mut self) -> Option<Instant> {
        self.raw.reserve(4096);
        let read = self.stream.read_buf(&mut self.raw).await.unwrap();
        let at = Instant::now();
        if read == 0 {
            return None;
        }
        self.unchunk();
        Some(at)
    }

    pub(crate) fn unchunk(&mut self) {
        if !self.headers_done {
            let Some(end) = find(&self.raw, b"\r\n\r\n") else {
                return;
            };
            let head = String::from_utf8_lossy(&self.raw[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            assert!(head.contains("transfer-encoding: chunked"), "{head}");
            self.raw.drain(..end + 4);
            self.headers_done = true;
        }
        let mut taken = 0;
        loop {
            let rest = &self.raw[taken..];
            let Some(line) = find(rest, b"\r\n") else {
                break;
            };
            let size = std::str::from_utf8(&rest[..line]).unwrap();
            let size = size.split(';').next().unwrap().trim();
            let size = usize::from_str_radix(size, 16).unwrap();
            if size == 0 || rest.len() < line + 2 + size + 2 {
                break;
            }
            self.frames.push(&rest[line + 2..line + 2 + size]);
            taken += line + 2 + size + 2;
        }
        self.raw.drain(..taken);
    }

    /// The next whole frame read, if any.
    pub(crate) fn next_frame(&mut self) -> Option<Scanned> {
        let frame = self.frames.next_frame()?;
        if let Scanned::Error(data) = &frame {
            panic!("an error frame: {data}");
        }
        Some(frame)
    }

    /// Read until the next `turn_completed`; how many tool results came
    /// before it.
    pub(crate) async fn until_turn_completed(&mut self) -> usize {
        let mut tool_results = 0;
        loop {
            while let Some(frame) = self.next_frame() {
                match frame {
                    Scanned::Canonical {
                        kind: ScannedKind::TurnCompleted,
                        ..
                    } => return tool_results,
                    Scanned::Canonical {
                        kind: ScannedKind::ToolResult,
                        ..
                    } => tool_results += 1,
                    _ => {}
                }
            }
            self.fill().await.expect("a stream ended");
        }
    }
}
