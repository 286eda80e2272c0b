//! STOPGAP: the few HTTP and SSE calls `keel demo` makes to its daemon,
//! written on reqwest directly because the daemon's typed client
//! (`crate::client`, the admin CLI's) was not there yet when the demo moved
//! onto the real runtime. When it is, the demo should use it and this file
//! should go. Nothing here knows more than docs/daemon.md says: routes,
//! bearer token, JSON bodies, and the SSE frames of `GET …/events`.

use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use futures_util::StreamExt as _;
use serde_json::{json, Value};

/// A connection to one daemon: its base URL and token.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// How long one request may take before the demo gives up on the daemon.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

impl Api {
    pub fn new(base: String, token: String) -> anyhow::Result<Api> {
        let http = reqwest::Client::builder()
            .build()
            .context("building the HTTP client")?;
        Ok(Api { http, base, token })
    }

    /// `POST /v1/conversations`; returns the new conversation's id.
    pub async fn create(&self, body: Value) -> anyhow::Result<String> {
        let created = self.post("/v1/conversations", &body).await?;
        str_field(&created, "id")
    }

    /// `POST /v1/conversations/{id}/messages`; returns the message's seq.
    pub async fn send(&self, id: &str, text: &str) -> anyhow::Result<u64> {
        let accepted = self
            .post(
                &format!("/v1/conversations/{id}/messages"),
                &json!({ "text": text }),
            )
            .await?;
        accepted["seq"]
            .as_u64()
            .ok_or_else(|| anyhow!("no seq in {accepted}"))
    }

    /// `POST /v1/conversations/{id}/resolve` with `approve`.
    pub async fn approve(&self, id: &str, tool_call_id: &str, by: &str) -> anyhow::Result<Value> {
        self.post(
            &format!("/v1/conversations/{id}/resolve"),
            &json!({ "tool_call_id": tool_call_id, "decision": "approve", "by": by }),
        )
        .await
    }

    /// `POST /v1/conversations/{id}/cancel`; returns the state it left.
    pub async fn cancel(&self, id: &str) -> anyhow::Result<String> {
        let accepted = self
            .post(&format!("/v1/conversations/{id}/cancel"), &json!({}))
            .await?;
        str_field(&accepted, "state")
    }

    /// `GET /v1/conversations/{id}`.
    pub async fn conversation(&self, id: &str) -> anyhow::Result<Value> {
        self.get(&format!("/v1/conversations/{id}")).await
    }

    /// The whole log, page by page (`GET …/log?from=SEQ`).
    pub async fn log(&self, id: &str) -> anyhow::Result<Vec<Value>> {
        let mut events = Vec::new();
        let mut from = 1;
        loop {
            let page = self
                .get(&format!("/v1/conversations/{id}/log?from={from}"))
                .await?;
            let batch = page["events"]
                .as_array()
                .ok_or_else(|| anyhow!("no events in the log page {page}"))?;
            if batch.is_empty() {
                return Ok(events);
            }
            events.extend(batch.iter().cloned());
            from = page["next_from"]
                .as_u64()
                .ok_or_else(|| anyhow!("no next_from in the log page"))?;
        }
    }

    /// Follow `GET /v1/conversations/{id}/events`, from seq `from` if
    /// given (the events after it first, from the log), else from a snapshot.
    pub async fn events(&self, id: &str, from: Option<u64>) -> anyhow::Result<Events> {
        let query = from.map(|seq| format!("?from={seq}")).unwrap_or_default();
        let response = self
            .http
            .get(format!("{}/v1/conversations/{id}/events{query}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .context("opening the event stream")?;
        let response = checked(response).await?;
        Ok(Events {
            body: Box::pin(response.bytes_stream()),
            buffer: String::new(),
        })
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        json_of(checked(response).await?, path).await
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        json_of(checked(response).await?, path).await
    }
}

/// The fake provider's script API: `POST /_mock/script` queues replies.
pub async fn push_script(mock_url: &str, entries: Value) -> anyhow::Result<()> {
    let response = reqwest::Client::new()
        .post(format!("{mock_url}/_mock/script"))
        .json(&entries)
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await
        .context("scripting the fake provider")?;
    checked(response).await.map(drop)
}

/// A response whose status says it failed becomes an error carrying the
/// API's `{error:{code,message}}`.
async fn checked(response: reqwest::Response) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    bail!("{status}: {body}")
}

async fn json_of(response: reqwest::Response, path: &str) -> anyhow::Result<Value> {
    response
        .json()
        .await
        .with_context(|| format!("the answer to {path} is not JSON"))
}

fn str_field(value: &Value, name: &str) -> anyhow::Result<String> {
    value[name]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("no {name} in {value}"))
}

/// One SSE frame of the event stream.
#[derive(Debug, Clone)]
pub struct Frame {
    /// `snapshot`, `canonical`, `live` or `error`.
    pub event: String,
    pub data: Value,
}

type Body =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// An open event stream, read frame by frame.
pub struct Events {
    body: Body,
    /// Text received and not yet cut into frames.
    buffer: String,
}

impl Events {
    /// The next frame; `None` when the daemon ended the stream.
    pub async fn next(&mut self) -> anyhow::Result<Option<Frame>> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(frame) = parse_frame(&block)? {
                    return Ok(Some(frame));
                }
                continue;
            }
            match self.body.next().await {
                Some(chunk) => {
                    let chunk = chunk.context("reading the event stream")?;
                    // SSE is UTF-8, and a character may be split across
                    // chunks only if the daemon split it: it never does, as
                    // it writes whole frames.
                    self.buffer.push_str(&String::from_utf8_lossy(&chunk));
                    if self.buffer.contains('\r') {
                        self.buffer = self.buffer.replace("\r\n", "\n");
                    }
                }
                None => return Ok(None),
            }
        }
    }
}

/// One SSE block; comments (the keep-alive) give `None`.
fn parse_frame(block: &str) -> anyhow::Result<Option<Frame>> {
    let mut event = String::from("message");
    let mut data = Vec::new();
    for line in block.lines() {
        if let Some(value) = line.strip_prefix("event:") {
            event = value.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    if data.is_empty() {
        return Ok(None);
    }
    let data = serde_json::from_str(&data.join("\n"))
        .with_context(|| format!("an SSE frame that is not JSON: {block}"))?;
    Ok(Some(Frame { event, data }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_parsed_and_keep_alives_skipped() {
        let frame = parse_frame("event: live\ndata: {\"type\":\"text_delta\"}\n\n")
            .unwrap()
            .unwrap();
        assert_eq!(frame.event, "live");
        assert_eq!(frame.data["type"], "text_delta");
        assert!(parse_frame(":\n\n").unwrap().is_none());
    }
}
