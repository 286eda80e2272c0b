//! The provider client against a scripted HTTP/1.1 server on loopback: a
//! raw tokio `TcpListener` that reads one request, writes exactly the bytes
//! (and pauses) a test scripts, and reports when the client hangs up. Real
//! sockets and real clocks: the timeouts under test are a few hundred
//! milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keel_actors::provider::{Endpoint, ProviderClient, ProviderConfig, Timeouts};
use keel_core::message::{AssistantBlock, ContentBlock, Message, Role, StopReason};
use keel_core::wire::{ImageData, PromptRequest, ToolSpecs};
use keel_core::{AssistantResponse, LlmFailure, ProviderKind, StreamDelta};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Longest any test waits for something that should happen at once.
const PATIENCE: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// The scripted server.

/// What the server does once it has read the request.
enum Step {
    Write(Vec<u8>),
    Pause(Duration),
}

/// A request as the server received it.
#[derive(Debug)]
struct Received {
    request_line: String,
    /// Header names lowercased.
    headers: BTreeMap<String, String>,
    body: Value,
}

struct Server {
    /// `http://127.0.0.1:PORT`.
    url: String,
    requests: mpsc::UnboundedReceiver<Received>,
    /// One message when the client closes its end of the connection.
    disconnects: mpsc::UnboundedReceiver<()>,
}

impl Server {
    async fn request(&mut self) -> Received {
        tokio::time::timeout(PATIENCE, self.requests.recv())
            .await
            .expect("the server received no request")
            .unwrap()
    }

    /// Waits until the client has closed the connection.
    async fn disconnect(&mut self) -> Duration {
        let start = Instant::now();
        tokio::time::timeout(PATIENCE, self.disconnects.recv())
            .await
            .expect("the client kept the connection open")
            .unwrap();
        start.elapsed()
    }
}

/// Serves one connection: reads a request, plays `script`, then keeps the
/// connection open until the client closes it (so a script that ends
/// without closing is a server that hangs).
async fn serve(script: Vec<Step>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (request_tx, requests) = mpsc::unbounded_channel();
    let (disconnect_tx, disconnects) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let request = read_request(&mut socket).await;
        let _ = request_tx.send(request);
        let (mut reader, mut writer) = socket.into_split();
        // Watch for the client hanging up while the script plays.
        tokio::spawn(async move {
            let mut rest = [0u8; 1024];
            while let Ok(n) = reader.read(&mut rest).await {
                if n == 0 {
                    break;
                }
            }
            let _ = disconnect_tx.send(());
        });
        for step in script {
            match step {
                Step::Write(bytes) => {
                    if writer.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                Step::Pause(pause) => tokio::time::sleep(pause).await,
            }
        }
        // Keep the connection open until the client closes it.
        std::future::pending::<()>().await;
    });
    Server {
        url,
        requests,
        disconnects,
    }
}

async fn read_request(socket: &mut TcpStream) -> Received {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the client closed before sending a request");
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap().to_owned();
    let headers: BTreeMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers["content-length"].parse().unwrap();
    while buffer.len() < head_end + length {
        let n = socket.read(&mut chunk).await.unwrap();
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap();
    Received {
        request_line,
        headers,
        body,
    }
}

/// The status line and headers of a chunked event-stream response.
fn stream_head() -> Step {
    Step::Write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
    )
}

/// One HTTP chunk holding `text`.
fn chunk(text: &str) -> Step {
    Step::Write(format!("{:x}\r\n{text}\r\n", text.len()).into_bytes())
}

/// One HTTP chunk holding one named server-sent event.
fn event(name: &str, data: &str) -> Step {
    chunk(&format!("event: {name}\ndata: {data}\n\n"))
}

/// A complete non-streaming response.
fn plain_response(status: &str, headers: &[(&str, &str)], body: &str) -> Step {
    let mut head = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    Step::Write(head.into_bytes())
}

const MESSAGE_START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-test-1","usage":{"input_tokens":12,"output_tokens":1}}}"#;

/// A whole Anthropic response saying "Hello world".
fn hello_world() -> Vec<Step> {
    vec![
        stream_head(),
        event("message_start", MESSAGE_START),
        event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        event("ping", r#"{"type":"ping"}"#),
        event(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
        ),
        event(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}"#,
        ),
        event(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        event(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#,
        ),
        event("message_stop", r#"{"type":"message_stop"}"#),
    ]
}

// ---------------------------------------------------------------------------
// The client side.

fn quick_timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(2),
        first_byte: Duration::from_millis(300),
        idle: Duration::from_millis(300),
    }
}

/// A client whose every provider points at `url`.
fn client(url: &str) -> ProviderClient {
    ProviderClient::new(ProviderConfig {
        anthropic: Endpoint {
            base_url: url.to_owned(),
            api_key: Some("sk-ant-test".to_owned()),
        },
        openai: Endpoint {
            base_url: format!("{url}/v1/"),
            api_key: Some("sk-openai-test".to_owned()),
        },
        mock_url: Some(url.to_owned()),
        timeouts: quick_timeouts(),
    })
    .unwrap()
}

fn hello_messages() -> Vec<Message> {
    vec![Message {
        role: Role::User,
        content: vec![ContentBlock::Text {
            text: "Say hello".to_owned(),
        }],
    }]
}

/// Sends a one-message request and collects the deltas.
async fn ask(
    client: &ProviderClient,
    provider: ProviderKind,
    limit: Option<Duration>,
) -> (Result<AssistantResponse, LlmFailure>, Vec<StreamDelta>) {
    let messages = hello_messages();
    let images: BTreeMap<String, ImageData> = BTreeMap::new();
    let request = PromptRequest {
        model: "claude-test-1",
        system: Some("Be brief."),
        messages: &messages,
        tools: &ToolSpecs::default(),
        max_tokens: 256,
        images: &images,
    };
    let mut deltas = Vec::new();
    let result = tokio::time::timeout(
        PATIENCE,
        client.stream(provider, &request, limit, |delta| deltas.push(delta)),
    )
    .await
    .expect("the request neither finished nor failed");
    (result, deltas)
}

fn texts(deltas: &[StreamDelta]) -> Vec<&str> {
    deltas
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Tests.

#[tokio::test]
async fn a_good_anthropic_stream_decodes_and_ends_at_message_stop() {
    // The server keeps the connection open after message_stop: the client
    // must stop reading on its own.
    let mut server = serve(hello_world()).await;
    let (result, deltas) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;

    let response = result.unwrap();
    assert_eq!(texts(&deltas), ["Hello", " world"]);
    assert_eq!(
        response.blocks,
        [AssistantBlock::Text {
            text: "Hello world".to_owned()
        }]
    );
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(response.provider, ProviderKind::Anthropic);
    assert_eq!(response.model, "claude-test-1");
    assert_eq!(response.usage.input_tokens, 12);
    assert_eq!(response.usage.output_tokens, 5);

    let request = server.request().await;
    assert_eq!(request.request_line, "POST /v1/messages HTTP/1.1");
    assert_eq!(request.headers["x-api-key"], "sk-ant-test");
    assert_eq!(request.headers["anthropic-version"], "2023-06-01");
    assert_eq!(request.headers["content-type"], "application/json");
    assert_eq!(request.body["model"], "claude-test-1");
    assert_eq!(request.body["stream"], true);
    assert_eq!(request.body["system"], "Be brief.");
    server.disconnect().await;
}

#[tokio::test]
async fn the_mock_provider_speaks_anthropic_and_is_recorded_as_mock() {
    let mut server = serve(hello_world()).await;
    let (result, _) = ask(&client(&server.url), ProviderKind::Mock, None).await;
    assert_eq!(result.unwrap().provider, ProviderKind::Mock);
    let request = server.request().await;
    assert_eq!(request.request_line, "POST /v1/messages HTTP/1.1");
    assert!(!request.headers.contains_key("x-api-key"));
}

#[tokio::test]
async fn an_openai_stream_decodes_from_unnamed_events() {
    let chunk_with = |delta: &str, finish: &str| {
        format!(
            r#"{{"id":"c1","object":"chat.completion.chunk","model":"gpt-test","choices":[{{"index":0,"delta":{delta},"finish_reason":{finish}}}]}}"#
        )
    };
    let mut server = serve(vec![
        stream_head(),
        chunk(&format!(
            "data: {}\n\n",
            chunk_with(r#"{"role":"assistant","content":"Hel"}"#, "null")
        )),
        chunk(&format!(
            "data: {}\n\n",
            chunk_with(r#"{"content":"lo"}"#, "null")
        )),
        chunk(&format!("data: {}\n\n", chunk_with("{}", r#""stop""#))),
        chunk("data: [DONE]\n\n"),
    ])
    .await;
    let (result, deltas) = ask(&client(&server.url), ProviderKind::OpenAi, None).await;

    let response = result.unwrap();
    assert_eq!(texts(&deltas), ["Hel", "lo"]);
    assert_eq!(response.provider, ProviderKind::OpenAi);
    assert_eq!(
        response.blocks,
        [AssistantBlock::Text {
            text: "Hello".to_owned()
        }]
    );
    let request = server.request().await;
    // The base URL ends in /v1 (with a stray slash); the path is appended.
    assert_eq!(request.request_line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(request.headers["authorization"], "Bearer sk-openai-test");
    assert!(!request.headers.contains_key("anthropic-version"));
    server.disconnect().await;
}

#[tokio::test]
async fn a_429_with_retry_after_is_retryable_after_that_long() {
    let body = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
    let server = serve(vec![plain_response(
        "429 Too Many Requests",
        &[("content-type", "application/json"), ("retry-after", "7")],
        body,
    )])
    .await;
    let (result, deltas) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;

    let failure = result.unwrap_err();
    assert!(failure.retryable);
    assert_eq!(failure.retry_after_ms, Some(7_000));
    assert_eq!(
        failure.message,
        "HTTP 429: rate_limit_error: Number of request tokens has exceeded your per-minute rate limit"
    );
    assert!(deltas.is_empty());
}

#[tokio::test]
async fn a_401_is_final_and_keeps_the_provider_message() {
    let body =
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
    let server = serve(vec![plain_response(
        "401 Unauthorized",
        &[("content-type", "application/json")],
        body,
    )])
    .await;
    let (result, _) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;

    let failure = result.unwrap_err();
    assert!(!failure.retryable);
    assert_eq!(failure.retry_after_ms, None);
    assert_eq!(
        failure.message,
        "HTTP 401: authentication_error: invalid x-api-key"
    );
}

#[tokio::test]
async fn an_error_body_is_read_even_when_it_is_large_and_not_json() {
    let page = format!("<html>{}</html>", "overloaded ".repeat(20_000));
    let server = serve(vec![plain_response(
        "503 Service Unavailable",
        &[("content-type", "text/html")],
        &page,
    )])
    .await;
    let (result, _) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;
    let failure = result.unwrap_err();
    assert!(failure.retryable);
    assert!(failure.message.starts_with("HTTP 503: <html>overloaded"));
}

#[tokio::test]
async fn a_server_that_never_answers_hits_the_first_byte_timeout() {
    let mut server = serve(Vec::new()).await;
    let start = Instant::now();
    let (result, _) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;

    let failure = result.unwrap_err();
    assert!(failure.retryable);
    assert!(
        failure.message.contains("timed out after 300 ms"),
        "{}",
        failure.message
    );
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    // Giving up closes the connection.
    server.disconnect().await;
}

#[tokio::test]
async fn a_stream_that_stalls_midway_hits_the_idle_timeout() {
    let mut script = hello_world();
    script.truncate(5); // head, message_start, block start, ping, "Hello"
    let mut server = serve(script).await;
    let (result, deltas) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;

    let failure = result.unwrap_err();
    assert!(failure.retryable);
    assert!(
        failure.message.contains("waiting for the next part"),
        "{}",
        failure.message
    );
    // What arrived before the stall was passed on.
    assert_eq!(texts(&deltas), ["Hello"]);
    server.disconnect().await;
}

#[tokio::test]
async fn pings_keep_a_slow_stream_alive_until_the_whole_request_limit() {
    let mut script = hello_world();
    script.truncate(3);
    for _ in 0..40 {
        script.push(Step::Pause(Duration::from_millis(100)));
        script.push(event("ping", r#"{"type":"ping"}"#));
    }
    let server = serve(script).await;
    let (result, _) = ask(
        &client(&server.url),
        ProviderKind::Anthropic,
        Some(Duration::from_millis(800)),
    )
    .await;
    let failure = result.unwrap_err();
    assert!(failure.retryable);
    assert!(
        failure
            .message
            .contains("timed out after 800 ms before the whole response arrived"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn a_stream_cut_before_message_stop_is_retryable() {
    let mut script = hello_world();
    script.truncate(6);
    script.push(Step::Write(b"0\r\n\r\n".to_vec())); // the last chunk: end of body
    let server = serve(script).await;
    let (result, deltas) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;
    let failure = result.unwrap_err();
    assert!(failure.retryable);
    assert!(
        failure.message.contains("message_stop"),
        "{}",
        failure.message
    );
    assert_eq!(texts(&deltas), ["Hello", " world"]);
}

#[tokio::test]
async fn an_error_event_midway_is_classified() {
    let mut script = hello_world();
    script.truncate(5);
    script.push(event(
        "error",
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ));
    let server = serve(script).await;
    let (result, _) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;
    let failure = result.unwrap_err();
    assert!(failure.retryable);
    assert_eq!(failure.message, "overloaded_error: Overloaded");
}

#[tokio::test]
async fn json_instead_of_a_stream_is_reported() {
    let server = serve(vec![plain_response(
        "200 OK",
        &[("content-type", "application/json")],
        r#"{"id":"msg_1","type":"message","content":[]}"#,
    )])
    .await;
    let (result, _) = ask(&client(&server.url), ProviderKind::Anthropic, None).await;
    let failure = result.unwrap_err();
    assert!(!failure.retryable);
    assert!(
        failure.message.contains("instead of an event stream"),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn dropping_the_stream_future_closes_the_connection_at_once() {
    let mut script = hello_world();
    script.truncate(5);
    script.push(Step::Pause(Duration::from_secs(30)));
    let mut server = serve(script).await;
    let client = client(&server.url);

    let (first_delta_tx, mut first_delta) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let messages = hello_messages();
        let images = BTreeMap::new();
        let request = PromptRequest {
            model: "claude-test-1",
            system: None,
            messages: &messages,
            tools: &ToolSpecs::default(),
            max_tokens: 256,
            images: &images,
        };
        client
            .stream(ProviderKind::Anthropic, &request, None, |delta| {
                let _ = first_delta_tx.send(delta);
            })
            .await
    });
    tokio::time::timeout(PATIENCE, first_delta.recv())
        .await
        .unwrap()
        .unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let waited = server.disconnect().await;
    assert!(waited < Duration::from_millis(500), "{waited:?}");
}

#[tokio::test]
async fn dropping_the_future_while_waiting_for_headers_closes_the_connection() {
    let mut server = serve(Vec::new()).await;
    let client = ProviderClient::new(ProviderConfig {
        mock_url: Some(server.url.clone()),
        timeouts: Timeouts {
            first_byte: Duration::from_secs(60),
            ..quick_timeouts()
        },
        ..ProviderConfig::default()
    })
    .unwrap();
    let pending = ask(&client, ProviderKind::Mock, None);
    tokio::select! {
        _ = pending => panic!("the server never answers"),
        _ = server.request() => {}
    }
    let waited = server.disconnect().await;
    assert!(waited < Duration::from_millis(500), "{waited:?}");
}

#[tokio::test]
async fn a_refused_connection_is_a_retryable_network_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let (result, _) = ask(&client(&url), ProviderKind::Anthropic, None).await;
    let failure = result.unwrap_err();
    assert!(failure.retryable);
    assert!(
        failure.message.starts_with("network error: "),
        "{}",
        failure.message
    );
}

#[tokio::test]
async fn a_missing_configuration_fails_without_a_request() {
    let client = ProviderClient::new(ProviderConfig::default()).unwrap();
    let (result, _) = ask(&client, ProviderKind::Anthropic, None).await;
    let failure = result.unwrap_err();
    assert!(!failure.retryable);
    assert_eq!(
        failure.message,
        "no Anthropic API key: set ANTHROPIC_API_KEY"
    );

    let (result, _) = ask(&client, ProviderKind::Mock, None).await;
    assert_eq!(
        result.unwrap_err().message,
        "the mock provider has no URL: set KEEL_MOCK_URL"
    );
}

#[test]
fn configuration_comes_from_the_documented_environment_names() {
    let env = BTreeMap::from([
        ("ANTHROPIC_API_KEY", "sk-ant-secret"),
        ("OPENAI_BASE_URL", "http://localhost:11434/v1"),
        ("OPENAI_API_KEY", ""),
        ("KEEL_MOCK_URL", "http://127.0.0.1:7778"),
    ]);
    let config =
        ProviderConfig::from_lookup(|name| env.get(name).map(|value| (*value).to_owned())).unwrap();
    assert_eq!(config.anthropic.base_url, "https://api.anthropic.com");
    assert_eq!(config.anthropic.api_key.as_deref(), Some("sk-ant-secret"));
    assert_eq!(config.openai.base_url, "http://localhost:11434/v1");
    assert_eq!(config.openai.api_key, None, "an empty variable is unset");
    assert_eq!(config.mock_url.as_deref(), Some("http://127.0.0.1:7778"));
    assert_eq!(config.timeouts, Timeouts::default());

    let shown = format!("{config:?}");
    assert!(!shown.contains("sk-ant-secret"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

#[test]
fn each_clock_is_configurable_and_a_bad_value_names_its_variable() {
    let env = BTreeMap::from([
        ("KEEL_CONNECT_TIMEOUT_MS", "1500"),
        ("KEEL_FIRST_BYTE_TIMEOUT_MS", "90000"),
        ("KEEL_IDLE_TIMEOUT_MS", " 30000 "),
    ]);
    let config =
        ProviderConfig::from_lookup(|name| env.get(name).map(|value| (*value).to_owned())).unwrap();
    assert_eq!(
        config.timeouts,
        Timeouts {
            connect: Duration::from_millis(1500),
            first_byte: Duration::from_secs(90),
            idle: Duration::from_secs(30),
        }
    );
    for bad in ["0", "-5", "soon", "1.5"] {
        let error = ProviderConfig::from_lookup(|name| {
            (name == "KEEL_IDLE_TIMEOUT_MS").then(|| bad.to_owned())
        })
        .unwrap_err();
        assert!(
            error.to_string().starts_with("KEEL_IDLE_TIMEOUT_MS: "),
            "{error}"
        );
    }
}

/// A long answer from a slow model is healthy while it keeps streaming: no
/// clock limits the whole request unless the caller asks for one.
#[test]
fn no_clock_caps_a_whole_answer_by_default() {
    assert_eq!(
        keel_core::ConversationConfig::default().request_timeout_ms,
        0,
        "the total cap is off by default"
    );
    let timeouts = Timeouts::default();
    assert!(
        timeouts.idle < Duration::from_secs(120) && timeouts.first_byte <= Duration::from_secs(60)
    );
}
