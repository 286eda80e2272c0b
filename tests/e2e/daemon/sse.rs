//! A minimal server-sent events reader over a reqwest response body: it
//! splits the bytes into lines and the lines into frames (`event`, `id`,
//! `data`), skipping comments such as keep-alives. Enough for keel's
//! streams, which put one JSON object in each frame's data.

use std::collections::VecDeque;
use std::time::Instant;

use serde_json::Value;

use super::PATIENCE;

/// One SSE frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseFrame {
    /// `snapshot`, `canonical`, `live` or `error`.
    pub event: String,
    /// The SSE `id`: a canonical event's seq; none on other frames.
    pub id: Option<String>,
    pub data: String,
    /// The frame's bytes as they came, its closing blank line included.
    pub raw: Vec<u8>,
}

impl SseFrame {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|err| panic!("frame data is not JSON ({err}): {self:?}"))
    }

    /// The `type` of its data (`text_delta`, `turn_completed`, …).
    pub fn kind(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }

    pub fn is_canonical(&self) -> bool {
        self.event == "canonical"
    }

    /// A live frame of this type.
    pub fn is_live(&self, kind: &str) -> bool {
        self.event == "live" && self.kind() == kind
    }

    /// A canonical frame of this type.
    pub fn is_canonical_of(&self, kind: &str) -> bool {
        self.is_canonical() && self.kind() == kind
    }

    /// A live `state_changed` to `state`.
    pub fn is_state(&self, state: &str) -> bool {
        self.is_live("state_changed") && self.json()["state"] == state
    }

    /// A canonical frame's seq, from its `id`, checked against its data.
    pub fn seq(&self) -> u64 {
        assert!(
            self.is_canonical(),
            "only canonical frames have a seq: {self:?}"
        );
        let id = self
            .id
            .as_deref()
            .unwrap_or_else(|| panic!("a canonical frame has an id: {self:?}"));
        let seq: u64 = id
            .parse()
            .unwrap_or_else(|_| panic!("the id is a seq: {self:?}"));
        assert_eq!(
            self.json()["seq"].as_u64(),
            Some(seq),
            "the id is the event's seq"
        );
        seq
    }
}

/// The frames of one `GET …/events` response, as they arrive.
pub struct EventStream {
    response: reqwest::Response,
    /// Bytes received and not yet split into lines.
    pending: Vec<u8>,
    /// The frame being read.
    event: Option<String>,
    id: Option<String>,
    data: Vec<String>,
    /// The bytes of the frame being read.
    raw: Vec<u8>,
    ready: VecDeque<SseFrame>,
    ended: bool,
}

impl EventStream {
    pub fn new(response: reqwest::Response) -> EventStream {
        EventStream {
            response,
            pending: Vec::new(),
            event: None,
            id: None,
            data: Vec::new(),
            raw: Vec::new(),
            ready: VecDeque::new(),
            ended: false,
        }
    }

    /// The next frame; `None` once the server ended the stream. Panics if
    /// nothing comes within [`PATIENCE`].
    pub async fn next(&mut self) -> Option<SseFrame> {
        let deadline = tokio::time::Instant::from_std(Instant::now() + PATIENCE);
        tokio::time::timeout_at(deadline, self.next_frame())
            .await
            .unwrap_or_else(|_| panic!("no SSE frame within {PATIENCE:?}"))
    }

    async fn next_frame(&mut self) -> Option<SseFrame> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Some(frame);
            }
            if self.ended {
                return None;
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.take(&bytes),
                // A closed connection ends the stream like a clean end.
                Ok(None) | Err(_) => self.ended = true,
            }
        }
    }

    /// Reads frames until `done` accepts one; returns them all, that one
    /// last. Panics if the stream ends first or takes longer than
    /// [`PATIENCE`] in all, showing what it read.
    pub async fn until(
        &mut self,
        what: &str,
        mut done: impl FnMut(&SseFrame) -> bool,
    ) -> Vec<SseFrame> {
        let deadline = Instant::now() + PATIENCE;
        let mut frames = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = tokio::time::timeout(left, self.next_frame()).await;
            match next {
                Ok(Some(frame)) => {
                    let found = done(&frame);
                    frames.push(frame);
                    if found {
                        return frames;
                    }
                }
                Ok(None) => panic!("the stream ended before {what}; read: {frames:#?}"),
                Err(_) => panic!("{what}: not within {PATIENCE:?}; read: {frames:#?}"),
            }
        }
    }

    /// Reads until the server ends the stream; returns what came.
    pub async fn until_end(&mut self) -> Vec<SseFrame> {
        let deadline = Instant::now() + PATIENCE;
        let mut frames = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.next_frame()).await {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => return frames,
                Err(_) => panic!("the stream did not end within {PATIENCE:?}; read: {frames:#?}"),
            }
        }
    }

    /// Split `bytes` (with what came before) into lines, and the lines
    /// into frames.
    fn take(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|&byte| byte == b'\n') {
            let mut line: Vec<u8> = self.pending.drain(..=end).collect();
            self.raw.extend_from_slice(&line);
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line).expect("SSE is UTF-8");
            self.line(&line);
        }
    }

    fn line(&mut self, line: &str) {
        if line.is_empty() {
            // A blank line ends a frame; one with neither data nor a name
            // (a keep-alive comment) is no frame.
            let event = self.event.take();
            let id = self.id.take();
            let data = std::mem::take(&mut self.data);
            let raw = std::mem::take(&mut self.raw);
            if event.is_some() || !data.is_empty() {
                self.ready.push_back(SseFrame {
                    event: event.unwrap_or_else(|| "message".to_owned()),
                    id,
                    data: data.join("\n"),
                    raw,
                });
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "id" => self.id = Some(value.to_owned()),
            "data" => self.data.push(value.to_owned()),
            _ => {}
        }
    }
}

/// The canonical frames among `frames`.
pub fn canonical(frames: &[SseFrame]) -> Vec<&SseFrame> {
    frames.iter().filter(|frame| frame.is_canonical()).collect()
}
