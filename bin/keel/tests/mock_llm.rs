//! `keel mock-llm`, run as a process and spoken to over loopback: both wire
//! formats in the documented event order, the default behaviour, the script
//! and the `x-mock-fault` header, the recording that shows when a client
//! went away, usage that grows with the prompt, the context window and its
//! refusals, and the answers to keel's summary requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use keel_test_support::FakeProvider;

use reqwest::header::HeaderMap;
use reqwest::{Client, Response, StatusCode};
use serde_json::{json, Value};

/// A running `keel mock-llm --port 0` (keel-test-support's
/// `FakeProvider`, killed when dropped) and a client for it.
struct MockLlm {
    provider: FakeProvider,
    client: Client,
}

impl MockLlm {
    fn start() -> MockLlm {
        MockLlm::start_with(&[])
    }

    fn start_with(extra_args: &[&str]) -> MockLlm {
        let provider = FakeProvider::start(Path::new(env!("CARGO_BIN_EXE_keel")), extra_args)
            .expect("keel mock-llm starts");
        let client = keel_api::http::client_builder().no_proxy().build().unwrap();
        MockLlm { provider, client }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.provider.url())
    }

    async fn post(&self, path: &str, body: &Value, fault: Option<Value>) -> Response {
        let mut request = self
            .client
            .post(self.url(path))
            .header("x-api-key", "test-key")
            .header("authorization", "Bearer test-key")
            .json(body);
        if let Some(fault) = fault {
            request = request.header("x-mock-fault", fault.to_string());
        }
        request.send().await.unwrap()
    }

    async fn anthropic(&self, text: &str, fault: Option<Value>) -> Response {
        let body = json!({
            "model": "claude-mock",
            "max_tokens": 100,
            "stream": true,
            "messages": [{"role": "user", "content": text}],
        });
        self.post("/v1/messages", &body, fault).await
    }

    async fn openai(&self, text: &str, fault: Option<Value>) -> Response {
        let body = json!({
            "model": "gpt-mock",
            "max_tokens": 100,
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": text}],
        });
        self.post("/v1/chat/completions", &body, fault).await
    }

    async fn push_script(&self, script: Value) -> Value {
        let response = self
            .client
            .post(self.url("/_mock/script"))
            .json(&script)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    /// `POST /_mock/settings` with `change`: the status and the answer.
    async fn change_settings(&self, change: Value) -> (StatusCode, Value) {
        let response = self
            .client
            .post(self.url("/_mock/settings"))
            .json(&change)
            .send()
            .await
            .unwrap();
        (response.status(), response.json().await.unwrap())
    }

    /// The recording, once at least `n_requests` requests have ended.
    async fn requests_ended(&self, n_requests: usize) -> Vec<Value> {
        let url = self.url(&format!(
            "/_mock/requests?wait_ended={n_requests}&timeout_ms=5000"
        ));
        let records: Vec<Value> = self
            .client
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(records.len() >= n_requests, "{records:#?}");
        records
    }
}

/// One SSE event: its `event:` name, if any, and its data.
#[derive(Debug, Clone)]
struct Event {
    name: Option<String>,
    data: String,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|err| panic!("data is not JSON ({err}): {}", self.data))
    }
}

/// A response body read to its end.
struct Body {
    events: Vec<Event>,
    /// The body ended properly (not by a dropped connection).
    clean_end: bool,
}

async fn read_body(mut response: Response) -> Body {
    let mut bytes = Vec::new();
    let clean_end = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    Body {
        events: parse_sse(&String::from_utf8(bytes).unwrap()),
        clean_end,
    }
}

fn parse_sse(text: &str) -> Vec<Event> {
    text.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .map(|frame| {
            let mut event = Event {
                name: None,
                data: String::new(),
            };
            for line in frame.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event.name = Some(name.to_owned());
                } else if let Some(data) = line.strip_prefix("data: ") {
                    event.data.push_str(data);
                } else {
                    panic!("unexpected SSE line {line:?} in {frame:?}");
                }
            }
            event
        })
        .collect()
}

fn names(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event.name.as_deref().expect("Anthropic names every event"))
        .collect()
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream")
}

/// Each Anthropic event's data names the same type as its `event:` line.
fn assert_types_match_names(events: &[Event]) {
    for event in events {
        assert_eq!(
            event.json()["type"],
            event.name.as_deref().unwrap(),
            "{event:?}"
        );
    }
}

/// The text an Anthropic stream says.
fn anthropic_text(body: &Body) -> String {
    body.events
        .iter()
        .filter(|event| event.name.as_deref() == Some("content_block_delta"))
        .filter_map(|event| event.json()["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// The text an OpenAI stream says.
fn openai_text(body: &Body) -> String {
    openai_chunks(&body.events)
        .iter()
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// The text of every OpenAI chunk but `[DONE]`, parsed.
fn openai_chunks(events: &[Event]) -> Vec<Value> {
    assert!(events.iter().all(|event| event.name.is_none()));
    events
        .iter()
        .filter(|event| event.data != "[DONE]")
        .map(Event::json)
        .collect()
}

#[tokio::test]
async fn anthropic_echo_streams_the_documented_event_order() {
    let mock = MockLlm::start();
    let response = mock.anthropic("hello from the mock", None).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(is_event_stream(response.headers()));
    let body = read_body(response).await;
    assert!(body.clean_end);
    assert_types_match_names(&body.events);

    let names = names(&body.events);
    let n_deltas = names.len() - 6;
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", n_deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    assert!(n_deltas >= 2, "text comes in several deltas");

    let start = body.events[0].json();
    assert_eq!(start["message"]["role"], "assistant");
    assert_eq!(start["message"]["model"], "claude-mock");
    // 19 bytes of text, a quarter token each, and 4 for the message.
    assert_eq!(start["message"]["usage"]["input_tokens"], 5 + 4);
    let text: String = body.events[3..3 + n_deltas]
        .iter()
        .map(|event| {
            let delta = event.json()["delta"].clone();
            assert_eq!(delta["type"], "text_delta");
            delta["text"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, "hello from the mock");
    let message_delta = body.events[names.len() - 2].json();
    assert_eq!(message_delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(message_delta["usage"]["output_tokens"], 5);
}

#[tokio::test]
async fn anthropic_run_streams_one_bash_tool_call() {
    let mock = MockLlm::start();
    let body = read_body(mock.anthropic("run: echo hello from keel", None).await).await;
    assert_types_match_names(&body.events);
    let names = names(&body.events);
    assert_eq!(names[..3], ["message_start", "content_block_start", "ping"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(names[3..names.len() - 3]
        .iter()
        .all(|name| *name == "content_block_delta"));

    let block = body.events[1].json()["content_block"].clone();
    assert_eq!(block["type"], "tool_use");
    assert_eq!(block["name"], "bash");
    assert_eq!(block["input"], json!({}));
    assert!(block["id"].as_str().unwrap().starts_with("toolu_mock_"));
    let input: String = body.events[3..names.len() - 3]
        .iter()
        .map(|event| {
            let delta = event.json()["delta"].clone();
            assert_eq!(delta["type"], "input_json_delta");
            delta["partial_json"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap(),
        json!({"command": "echo hello from keel"})
    );
    let message_delta = body.events[names.len() - 2].json();
    assert_eq!(message_delta["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn openai_echo_streams_chunks_then_usage_then_done() {
    let mock = MockLlm::start();
    let response = mock.openai("hello from the mock", None).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(is_event_stream(response.headers()));
    let body = read_body(response).await;
    assert!(body.clean_end);
    assert_eq!(body.events.last().unwrap().data, "[DONE]");

    let chunks = openai_chunks(&body.events);
    assert!(chunks
        .iter()
        .all(|chunk| chunk["object"] == "chat.completion.chunk" && chunk["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (usage, rest) = chunks.split_last().unwrap();
    let (finish, deltas) = rest.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 5 + 4);
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert!(deltas
        .iter()
        .all(|chunk| chunk["choices"][0]["finish_reason"].is_null()));
    let text: String = deltas
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "hello from the mock");
    assert!(deltas.len() >= 3, "text comes in several deltas");
}

#[tokio::test]
async fn openai_run_streams_one_bash_tool_call() {
    let mock = MockLlm::start();
    let body = read_body(mock.openai("run: ls -la", None).await).await;
    let chunks = openai_chunks(&body.events);
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "bash");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_mock_"));
    assert!(calls[1..].iter().all(|call| call.get("id").is_none()));
    let arguments: String = calls
        .iter()
        .map(|call| call["function"]["arguments"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"command": "ls -la"})
    );
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn tool_results_are_summarised_in_both_formats_without_streaming() {
    let mock = MockLlm::start();
    let anthropic = json!({
        "model": "claude-mock",
        "max_tokens": 100,
        "messages": [
            {"role": "user", "content": "run: echo hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_mock_1", "name": "bash", "input": {"command": "echo hi"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_mock_1", "content": "hi\n", "is_error": false}]},
        ],
    });
    let message: Value = mock
        .post("/v1/messages", &anthropic, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(message["type"], "message");
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(
        message["content"],
        json!([{"type": "text", "text": "The command printed: hi"}])
    );

    let openai = json!({
        "model": "gpt-mock",
        "messages": [
            {"role": "user", "content": "run: false"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_mock_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_mock_1", "content": "Error: exit status 1"},
        ],
    });
    let completion: Value = mock
        .post("/v1/chat/completions", &openai, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(
        completion["choices"][0]["message"]["content"],
        "The command failed: Error: exit status 1"
    );
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn a_scripted_429_carries_retry_after_then_the_script_and_default_follow() {
    let mock = MockLlm::start();
    let queued = mock
        .push_script(json!([
            {"status": 429, "retry_after": 2},
            {"endpoint": "openai", "text": "only for openai"},
            {"text": "after the wait"},
        ]))
        .await;
    assert_eq!(queued, json!({"added": 3, "queued": 3}));

    let limited = mock.anthropic("hi", None).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["retry-after"], "2");
    let error: Value = limited.json().await.unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "rate_limit_error");

    // The openai-only entry is skipped, not lost.
    let body = read_body(mock.anthropic("hi", None).await).await;
    let text: String = body
        .events
        .iter()
        .filter(|event| event.name.as_deref() == Some("content_block_delta"))
        .map(|event| event.json()["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "after the wait");

    let openai = read_body(mock.openai("hi", None).await).await;
    let text: String = openai_chunks(&openai.events)
        .iter()
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, "only for openai");

    let echoed = read_body(mock.openai("back to default", None).await).await;
    assert!(echoed
        .events
        .iter()
        .any(|event| event.data.contains("default")));

    let records = mock.requests_ended(4).await;
    let sources: Vec<&str> = records
        .iter()
        .map(|record| record["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["script", "script", "script", "default"]);
    assert_eq!(
        records[0]["entry"],
        json!({"status": 429, "retry_after": 2})
    );
    assert_eq!(records[0]["headers"]["x-api-key"], "test-key");
}

#[tokio::test]
async fn an_openai_429_has_the_openai_error_shape() {
    let mock = MockLlm::start();
    let fault = json!({"status": 429, "retry_after": 1, "retry_after_ms": 250});
    let limited = mock.openai("hi", Some(fault)).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["retry-after"], "1");
    assert_eq!(limited.headers()["retry-after-ms"], "250");
    let error: Value = limited.json().await.unwrap();
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    assert!(error["error"]["message"].is_string());
}

#[tokio::test]
async fn a_cut_stream_ends_before_message_stop_and_done() {
    let mock = MockLlm::start();
    let fault = json!({"cut_after_events": 4, "text": "one two three four five"});
    let anthropic = read_body(mock.anthropic("hi", Some(fault.clone())).await).await;
    assert!(!anthropic.clean_end, "the connection is dropped");
    assert_eq!(
        names(&anthropic.events),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta"
        ]
    );

    let openai = read_body(mock.openai("hi", Some(fault)).await).await;
    assert!(!openai.clean_end);
    assert_eq!(openai.events.len(), 4);
    assert!(openai.events.iter().all(|event| event.data != "[DONE]"));

    let clean = json!({"cut_after_events": 2, "clean_eof": true});
    let openai = read_body(mock.openai("hi", Some(clean)).await).await;
    assert!(openai.clean_end, "clean_eof ends the body properly");
    assert_eq!(openai.events.len(), 2);

    let records = mock.requests_ended(3).await;
    let outcomes: Vec<&str> = records
        .iter()
        .map(|record| record["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["cut", "cut", "completed"]);
    assert_eq!(records[0]["events_sent"], 4);
}

#[tokio::test]
async fn an_error_event_comes_after_the_partial_text() {
    let mock = MockLlm::start();
    let fault = json!({
        "error_event": {"type": "overloaded_error", "message": "Overloaded"},
        "after_text": "partial "
    });
    let anthropic = read_body(mock.anthropic("hi", Some(fault.clone())).await).await;
    assert_types_match_names(&anthropic.events);
    assert_eq!(
        names(&anthropic.events),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "error"
        ]
    );
    assert_eq!(anthropic.events[3].json()["delta"]["text"], "partial ");
    assert_eq!(
        anthropic.events[4].json(),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );

    let openai = read_body(mock.openai("hi", Some(fault)).await).await;
    let chunks = openai_chunks(&openai.events);
    let error = chunks.last().unwrap();
    assert_eq!(error["error"]["type"], "overloaded_error");
    assert_eq!(error["error"]["message"], "Overloaded");
    assert!(chunks
        .iter()
        .all(|chunk| chunk["choices"][0]["finish_reason"].is_null()));
    assert_eq!(openai.events.last().unwrap().data, "[DONE]");
}

#[tokio::test]
async fn a_malformed_frame_is_not_json() {
    let mock = MockLlm::start();
    let body = read_body(mock.anthropic("hi", Some(json!({"malformed": true}))).await).await;
    assert_eq!(body.events.len(), 1);
    assert!(serde_json::from_str::<Value>(&body.events[0].data).is_err());
    let body = read_body(mock.openai("hi", Some(json!({"malformed": true}))).await).await;
    assert!(serde_json::from_str::<Value>(&body.events[0].data).is_err());
}

#[tokio::test]
async fn dropping_a_dripping_stream_is_recorded_as_a_disconnect() {
    let mock = MockLlm::start();
    let words = vec!["word"; 100].join(" ");
    let fault = json!({"drip_ms": 20, "text": words});
    let mut response = mock.openai("hi", Some(fault)).await;
    // The first chunk (the role) comes at once; the next is a dripped word.
    let mut received = Vec::new();
    while !String::from_utf8_lossy(&received).contains("\"content\":\"word\"") {
        received.extend_from_slice(&response.chunk().await.unwrap().unwrap());
    }
    drop(response);

    let records = mock.requests_ended(1).await;
    let record = &records[0];
    assert_eq!(record["outcome"], "disconnected", "{record:#?}");
    assert!(
        record["disconnected_at_ms"].as_u64().unwrap()
            >= record["received_at_ms"].as_u64().unwrap()
    );
    assert!(record["events_sent"].as_u64().unwrap() < 100);
}

#[tokio::test]
async fn a_hang_never_answers_and_the_client_leaving_is_recorded() {
    let mock = MockLlm::start();
    let outcome = mock
        .client
        .post(mock.url("/v1/messages"))
        .header("x-mock-fault", r#"{"hang": true}"#)
        .json(&json!({"stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    let err = outcome.expect_err("no answer within the timeout");
    assert!(err.is_timeout(), "{err:?}");

    let records = mock.requests_ended(1).await;
    assert_eq!(records[0]["outcome"], "disconnected");
    assert_eq!(records[0]["events_sent"], 0);
}

#[tokio::test]
async fn a_stall_sends_some_events_then_nothing() {
    let mock = MockLlm::start();
    let mut response = mock
        .anthropic("hi", Some(json!({"hang_after_events": 1})))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let first = response.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("event: message_start\n"));
    let next = tokio::time::timeout(Duration::from_millis(200), response.chunk()).await;
    assert!(next.is_err(), "nothing after the first event: {next:?}");
    drop(response);
    let records = mock.requests_ended(1).await;
    assert_eq!(records[0]["outcome"], "disconnected");
    assert_eq!(records[0]["events_sent"], 1);
}

#[tokio::test]
async fn bad_faults_and_scripts_are_refused_with_a_reason() {
    let mock = MockLlm::start();
    let refused = mock
        .anthropic("hi", Some(json!({"status": 500, "text": "both"})))
        .await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let error: Value = refused.json().await.unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("x-mock-fault"), "{message}");

    let refused = mock
        .client
        .post(mock.url("/_mock/script"))
        .json(&json!([{"text": "fine"}, {"txet": "typo"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "bad_script");
    let pending: Value = mock
        .client
        .get(mock.url("/_mock/script"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(pending, json!({"pending": []}), "a bad script adds nothing");

    let not_json = mock
        .client
        .post(mock.url("/v1/chat/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), StatusCode::BAD_REQUEST);
    let error: Value = not_json.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn a_script_file_is_served_first_and_the_recording_can_be_cleared() {
    let path =
        std::env::temp_dir().join(format!("keel-mock-llm-script-{}.json", std::process::id()));
    std::fs::write(
        &path,
        r#"{"replies": [{"tool_calls": [{"name": "bash", "input": {"command": "date"}, "id": "toolu_fixed"}]}]}"#,
    )
    .unwrap();
    let mock = MockLlm::start_with(&["--script", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();

    let body = read_body(mock.anthropic("anything", None).await).await;
    let block = body.events[1].json()["content_block"].clone();
    assert_eq!(block["id"], "toolu_fixed");
    assert_eq!(block["name"], "bash");

    mock.requests_ended(1).await;
    let cleared: Value = mock
        .client
        .delete(mock.url("/_mock/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cleared, json!({"cleared": 1}));
    let records: Vec<Value> = mock
        .client
        .get(mock.url("/_mock/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(records.is_empty());
}

#[test]
fn a_bad_script_file_stops_the_start_with_a_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "mock-llm",
            "--port",
            "0",
            "--script",
            "/nonexistent/keel-script.json",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("reading the script"), "{stderr}");
}

#[cfg(unix)]
#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut mock = MockLlm::start();
    let pid = mock.provider.pid().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let Some(exit) = mock
        .provider
        .wait_for_exit(Duration::from_secs(5))
        .transpose()
    else {
        // Do not leave it running (the guard kills it too).
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
        panic!("the server did not stop within 5 s of SIGTERM");
    };
    let exit = exit.unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn usage_grows_with_the_prompt_unless_the_script_names_it() {
    let mock = MockLlm::start();
    let input_tokens =
        |body: &Body| body.events[0].json()["message"]["usage"]["input_tokens"].clone();
    let short = read_body(mock.anthropic("hi", None).await).await;
    assert_eq!(input_tokens(&short), 1 + 4);
    let long = read_body(mock.anthropic(&"word ".repeat(100), None).await).await;
    assert_eq!(input_tokens(&long), 125 + 4);

    mock.push_script(json!({"text": "x", "usage": {"input_tokens": 150000}}))
        .await;
    let scripted = read_body(mock.anthropic("hi", None).await).await;
    assert_eq!(input_tokens(&scripted), 150_000);
    let message_delta = scripted.events[scripted.events.len() - 2].json();
    assert_eq!(
        message_delta["usage"]["output_tokens"], 1,
        "still estimated"
    );

    let records = mock.requests_ended(3).await;
    let estimates: Vec<&Value> = records
        .iter()
        .map(|record| &record["prompt_tokens"])
        .collect();
    assert_eq!(estimates, [&json!(5), &json!(129), &json!(5)]);
}

#[tokio::test]
async fn a_prompt_over_the_context_window_is_refused_in_each_providers_words() {
    let mock = MockLlm::start_with(&["--context-window", "50"]);
    mock.push_script(json!([{"text": "after compaction"}]))
        .await;
    // 500 bytes and one message: 129 tokens.
    let long = "word ".repeat(100);

    let refused = mock.anthropic(&long, None).await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(
        error,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 129 tokens > 50 maximum"}})
    );
    let refused = mock.openai(&long, None).await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "context_length_exceeded");
    assert_eq!(error["error"]["param"], "messages");
    assert_eq!(
        error["error"]["message"],
        "This model's maximum context length is 50 tokens. However, your messages resulted in \
         129 tokens. Please reduce the length of the messages."
    );

    // The refusals took no planned reply.
    let fits = read_body(mock.anthropic("compacted", None).await).await;
    assert_eq!(anthropic_text(&fits), "after compaction");

    // The window changes at run time, and a bad change changes nothing.
    let shown: Value = mock
        .client
        .get(mock.url("/_mock/settings"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown, json!({"context_window": 50}));
    let (status, error) = mock.change_settings(json!({"context_window": 0})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["code"], "bad_settings");
    let (status, now) = mock.change_settings(json!({"context_window": null})).await;
    assert_eq!(
        (status, now),
        (StatusCode::OK, json!({"context_window": null}))
    );
    let answered = mock.openai(&long, None).await;
    assert_eq!(answered.status(), StatusCode::OK);
    read_body(answered).await;

    let records = mock.requests_ended(4).await;
    let seen: Vec<(&str, &str, u64)> = records
        .iter()
        .map(|record| {
            (
                record["source"].as_str().unwrap(),
                record["outcome"].as_str().unwrap(),
                record["prompt_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("too_long", "completed", 129),
            ("too_long", "completed", 129),
            ("script", "completed", 3 + 4),
            ("default", "completed", 129),
        ]
    );
}

#[tokio::test]
async fn summary_requests_are_answered_without_taking_the_turns_replies() {
    let mock = MockLlm::start();
    mock.push_script(json!([{"text": "the next turn's reply"}]))
        .await;
    let transcript = "Summarise this earlier part of our conversation. The transcript:\n\n\
                      User: list the files in the repository\n\nAssistant: There are two.\n\n";
    let expected = "Summary of the earlier conversation (2 transcript lines, 1 from the user). \
                    The user mentioned: list the files in the….";

    let anthropic = json!({
        "model": "claude-mock",
        "max_tokens": 1000,
        "stream": true,
        "system": "[keel:summary] You summarise the earlier part of a conversation.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": transcript}]}],
    });
    let body = read_body(mock.post("/v1/messages", &anthropic, None).await).await;
    assert_eq!(anthropic_text(&body), expected);
    let openai = json!({
        "model": "gpt-mock",
        "stream": true,
        "messages": [
            {"role": "system", "content": "[keel:summary] You summarise the earlier part of a conversation."},
            {"role": "user", "content": transcript},
        ],
    });
    let body = read_body(mock.post("/v1/chat/completions", &openai, None).await).await;
    assert_eq!(openai_text(&body), expected);

    let turn = read_body(mock.anthropic("go on", None).await).await;
    assert_eq!(anthropic_text(&turn), "the next turn's reply");

    // A script entry for summaries serves the next summary request only.
    mock.push_script(json!([{"summary": true, "status": 529}]))
        .await;
    let echoed = read_body(mock.anthropic("still a turn", None).await).await;
    assert_eq!(anthropic_text(&echoed), "still a turn");
    let failed = mock.post("/v1/messages", &anthropic, None).await;
    assert_eq!(failed.status().as_u16(), 529);

    let records = mock.requests_ended(5).await;
    let sources: Vec<&str> = records
        .iter()
        .map(|record| record["source"].as_str().unwrap())
        .collect();
    assert_eq!(
        sources,
        ["summary", "summary", "script", "default", "script"]
    );
}
