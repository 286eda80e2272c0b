//! The provider layer against the real fake server, over loopback: keel's
//! `ProviderClient` talks to `keel mock-llm` in both wire formats (Anthropic
//! Messages and OpenAI Chat Completions), through every fault the mock can
//! stage, and the real core drives retries and fallback through it.
//!
//! Every test starts its own mock, so tests run in parallel without sharing
//! a script. Nothing sleeps to synchronise: the mock's `wait_ended` says when
//! a request is over; the only sleeps are the retry delays the core asks for
//! (a few milliseconds).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keel_actors::provider::{ProviderClient, Timeouts};
use keel_core::message::{AssistantBlock, ContentBlock, Message, Role, StopReason};
use keel_core::retry::RetryPolicy;
use keel_core::state::Phase;
use keel_core::wire::{PromptRequest, ToolSpecs};
use keel_core::{
    AssistantResponse, Conversation, ConversationConfig, ConversationId, Effect, Event, EventKind,
    Input, LiveEvent, LlmFailure, ModelRef, NewConversation, ProviderKind, StreamDelta, Timer,
    Timestamp,
};
use serde_json::{json, Value};

use crate::harness::MockLlm;

const FORMATS: [ProviderKind; 2] = [ProviderKind::Anthropic, ProviderKind::OpenAi];

/// Ten words: ten text deltas in either format.
const TEN_WORDS: &str = "one two three four five six seven eight nine ten";

/// Generous clocks for tests that are not about timeouts: a slow CI box
/// must not turn them into timeout tests.
const RELAXED: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    first_byte: Duration::from_secs(5),
    idle: Duration::from_secs(5),
};

/// The mock's name for the endpoint a provider kind talks to.
fn endpoint(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::OpenAi => "openai",
        ProviderKind::Mock => unreachable!("the mock kind is not tested here"),
    }
}

fn model(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Anthropic => "claude-mock",
        ProviderKind::OpenAi => "gpt-mock",
        ProviderKind::Mock => unreachable!("the mock kind is not tested here"),
    }
}

fn client(mock: &MockLlm, timeouts: Timeouts) -> ProviderClient {
    ProviderClient::new(mock.provider_config(timeouts)).expect("an HTTP client")
}

/// SSE events the mock sends before the `n`th text delta of a text-only
/// answer, so `cut_after_events`/`hang_after_events` of this plus `n` lets
/// exactly `n` deltas through. Anthropic: `message_start`,
/// `content_block_start`, `ping`; OpenAI: the role chunk.
fn events_before_text(kind: ProviderKind) -> usize {
    match kind {
        ProviderKind::Anthropic => 3,
        _ => 1,
    }
}

/// What one request came to.
struct Asked {
    result: Result<AssistantResponse, LlmFailure>,
    deltas: Vec<StreamDelta>,
    elapsed: Duration,
}

impl Asked {
    fn text(&self) -> String {
        streamed_text(&self.deltas)
    }

    fn failure(&self, what: &str) -> &LlmFailure {
        match &self.result {
            Err(failure) => failure,
            Ok(response) => panic!("{what}: expected a failure, got {response:?}"),
        }
    }

    fn response(&self, what: &str) -> &AssistantResponse {
        match &self.result {
            Ok(response) => response,
            Err(failure) => panic!("{what}: expected a response, got {failure:?}"),
        }
    }
}

fn streamed_text(deltas: &[StreamDelta]) -> String {
    deltas
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn user(text: &str) -> Vec<Message> {
    vec![Message {
        role: Role::User,
        content: vec![ContentBlock::Text {
            text: text.to_owned(),
        }],
    }]
}

/// Send one user message to `kind` through `client` and collect everything.
async fn ask(
    client: &ProviderClient,
    kind: ProviderKind,
    text: &str,
    limit: Option<Duration>,
) -> Asked {
    let messages = user(text);
    let images = BTreeMap::new();
    let request = PromptRequest {
        model: model(kind),
        system: Some("You are a test fixture."),
        messages: &messages,
        tools: &ToolSpecs::default(),
        max_tokens: 256,
        images: &images,
    };
    let mut deltas = Vec::new();
    let started = Instant::now();
    let result = client
        .stream(kind, &request, limit, |delta| deltas.push(delta))
        .await;
    Asked {
        result,
        deltas,
        elapsed: started.elapsed(),
    }
}

/// A fresh mock with `script` queued, and a client for it.
async fn mock_with(script: Value, timeouts: Timeouts) -> (MockLlm, ProviderClient) {
    let mock = MockLlm::start();
    if script != json!([]) {
        mock.push_script(script).await;
    }
    let client = client(&mock, timeouts);
    (mock, client)
}

/// The one recorded request of a mock that was asked once, once it ended.
async fn only_request(mock: &MockLlm) -> Value {
    let mut records = mock.wait_ended(1).await;
    assert_eq!(records.len(), 1, "one request: {records:?}");
    records.remove(0)
}

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

// ---------------------------------------------------------------------------
// 1. Decoding the default answers.

#[tokio::test]
async fn default_echo_decodes_in_both_formats() {
    for kind in FORMATS {
        let (mock, client) = mock_with(json!([]), RELAXED).await;
        let asked = ask(&client, kind, "Hello there, São Paulo!", None).await;
        let response = asked.response("echo");
        assert_eq!(
            response.blocks,
            vec![AssistantBlock::Text {
                text: "Hello there, São Paulo!".to_owned()
            }],
            "{kind}"
        );
        assert_eq!(asked.text(), "Hello there, São Paulo!", "{kind}: deltas");
        assert!(asked.deltas.len() > 1, "{kind}: streamed in pieces");
        assert_eq!(response.stop_reason, StopReason::EndTurn, "{kind}");
        assert_eq!(response.provider, kind);
        assert_eq!(response.model, model(kind));
        assert!(response.usage.input_tokens > 0, "{kind}: {response:?}");
        assert!(response.usage.output_tokens > 0, "{kind}: {response:?}");

        // What went over the wire, as the mock saw it.
        let record = only_request(&mock).await;
        assert_eq!(record["endpoint"], endpoint(kind));
        assert_eq!(record["source"], "default");
        assert_eq!(record["outcome"], "completed");
        assert_eq!(record["stream"], true);
        assert_eq!(record["body"]["model"], model(kind));
        let headers = &record["headers"];
        match kind {
            ProviderKind::Anthropic => {
                assert_eq!(record["path"], "/v1/messages");
                assert_eq!(headers["x-api-key"], "sk-ant-e2e");
                assert_eq!(headers["anthropic-version"], "2023-06-01");
                assert_eq!(record["body"]["system"], "You are a test fixture.");
                assert_eq!(record["body"]["max_tokens"], 256);
            }
            _ => {
                assert_eq!(record["path"], "/v1/chat/completions");
                assert_eq!(headers["authorization"], "Bearer sk-openai-e2e");
                assert_eq!(
                    record["body"]["messages"][0]["content"],
                    "You are a test fixture."
                );
            }
        }
    }
}

#[tokio::test]
async fn run_command_becomes_a_bash_tool_call_in_both_formats() {
    for kind in FORMATS {
        let (mock, client) = mock_with(json!([]), RELAXED).await;
        let asked = ask(&client, kind, "run: echo \"hi there\" | wc -c", None).await;
        let response = asked.response("run:");
        assert_eq!(response.stop_reason, StopReason::ToolUse, "{kind}");
        let [AssistantBlock::ToolUse { call }] = response.blocks.as_slice() else {
            panic!("{kind}: one tool call: {:?}", response.blocks)
        };
        assert_eq!(call.name, "bash");
        assert_eq!(
            call.input,
            json!({"command": "echo \"hi there\" | wc -c"}),
            "{kind}"
        );
        let prefix = match kind {
            ProviderKind::Anthropic => "toolu_mock_",
            _ => "call_mock_",
        };
        assert!(call.id.as_str().starts_with(prefix), "{kind}: {}", call.id);

        // The deltas announce the call, then its input in pieces that join
        // back to the JSON.
        let started: Vec<_> = asked
            .deltas
            .iter()
            .filter_map(|delta| match delta {
                StreamDelta::ToolUseStarted { id, name } => Some((id.clone(), name.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            started,
            vec![(call.id.clone(), "bash".to_owned())],
            "{kind}"
        );
        let input: String = asked
            .deltas
            .iter()
            .filter_map(|delta| match delta {
                StreamDelta::ToolInput { id, partial_json } if *id == call.id => {
                    Some(partial_json.as_str())
                }
                _ => None,
            })
            .collect();
        let pieces = asked
            .deltas
            .iter()
            .filter(|delta| matches!(delta, StreamDelta::ToolInput { .. }))
            .count();
        assert!(pieces > 1, "{kind}: the input streamed in pieces");
        assert_eq!(
            serde_json::from_str::<Value>(&input).unwrap(),
            call.input,
            "{kind}"
        );
        assert_eq!(only_request(&mock).await["outcome"], "completed");
    }
}

// ---------------------------------------------------------------------------
// 2. Every fault, classified.

#[tokio::test]
async fn rate_limits_are_retryable_and_carry_retry_after() {
    for kind in FORMATS {
        let script = json!([
            {"endpoint": endpoint(kind), "status": 429, "retry_after": 2},
            // OpenAI's millisecond header wins over `retry-after`.
            {"endpoint": endpoint(kind), "status": 429, "retry_after": "7", "retry_after_ms": 250},
        ]);
        let (mock, client) = mock_with(script, RELAXED).await;

        let failure = ask(&client, kind, "hi", None).await.failure("429").clone();
        assert!(failure.retryable, "{kind}: {failure:?}");
        assert_eq!(failure.retry_after_ms, Some(2_000), "{kind}: {failure:?}");
        assert!(failure.message.contains("429"), "{kind}: {failure:?}");
        assert!(
            failure.message.contains("scripted by mock-llm"),
            "{kind}: the provider's message is kept: {failure:?}"
        );

        let failure = ask(&client, kind, "hi", None)
            .await
            .failure("429 ms")
            .clone();
        assert!(failure.retryable, "{kind}: {failure:?}");
        assert_eq!(failure.retry_after_ms, Some(250), "{kind}: {failure:?}");

        let records = mock.wait_ended(2).await;
        assert!(records
            .iter()
            .all(|record| record["outcome"] == "completed"));
    }
}

#[tokio::test]
async fn server_errors_and_overload_are_retryable() {
    for kind in FORMATS {
        let statuses = [500, 529, 503];
        let script: Vec<Value> = statuses
            .iter()
            .map(|status| json!({"endpoint": endpoint(kind), "status": status}))
            .collect();
        let (mock, client) = mock_with(Value::Array(script), RELAXED).await;
        for status in statuses {
            let asked = ask(&client, kind, "hi", None).await;
            let failure = asked.failure(&format!("{kind} {status}"));
            assert!(failure.retryable, "{kind} {status}: {failure:?}");
            assert_eq!(failure.retry_after_ms, None, "{kind} {status}");
            assert!(
                failure.message.starts_with(&format!("HTTP {status}: ")),
                "{kind} {status}: {failure:?}"
            );
            assert!(asked.deltas.is_empty());
        }
        assert_eq!(mock.wait_ended(3).await.len(), 3);
    }
}

#[tokio::test]
async fn client_errors_are_final_and_keep_the_providers_message() {
    for kind in FORMATS {
        let (bad_request, bad_key) = match kind {
            ProviderKind::Anthropic => (
                json!({"type": "error", "error": {"type": "invalid_request_error",
                    "message": "messages.0.content: Input should be a valid list"}}),
                json!({"type": "error", "error": {"type": "authentication_error",
                    "message": "invalid x-api-key"}}),
            ),
            _ => (
                json!({"error": {"message": "Invalid value for 'max_tokens': must be positive.",
                    "type": "invalid_request_error", "param": "max_tokens", "code": null}}),
                json!({"error": {"message": "Incorrect API key provided: sk-opena***2e2e.",
                    "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
            ),
        };
        let script = json!([
            {"endpoint": endpoint(kind), "status": 400, "body": bad_request},
            {"endpoint": endpoint(kind), "status": 401, "body": bad_key},
        ]);
        let (mock, client) = mock_with(script, RELAXED).await;
        for (status, body) in [(400, &bad_request), (401, &bad_key)] {
            let asked = ask(&client, kind, "hi", None).await;
            let failure = asked.failure(&format!("{kind} {status}"));
            assert!(!failure.retryable, "{kind} {status}: {failure:?}");
            assert_eq!(failure.retry_after_ms, None);
            let error = &body["error"];
            let expected = format!(
                "HTTP {status}: {}: {}",
                error["type"].as_str().unwrap(),
                error["message"].as_str().unwrap()
            );
            assert_eq!(failure.message, expected, "{kind} {status}");
        }
        assert_eq!(mock.wait_ended(2).await.len(), 2);
    }
}

#[tokio::test]
async fn a_cut_stream_is_retryable_after_the_deltas_it_sent() {
    for kind in FORMATS {
        let cut_after = events_before_text(kind) + 2;
        let script = json!([
            // The connection dropped mid-body.
            {"endpoint": endpoint(kind), "text": TEN_WORDS, "cut_after_events": cut_after},
            // The body ended properly, but the closing events are missing.
            {"endpoint": endpoint(kind), "text": TEN_WORDS, "cut_after_events": cut_after,
             "clean_eof": true},
        ]);
        let (mock, client) = mock_with(script, RELAXED).await;
        for how in ["dropped", "clean eof"] {
            let asked = ask(&client, kind, "hi", None).await;
            let failure = asked.failure(&format!("{kind} cut, {how}"));
            assert!(failure.retryable, "{kind} cut, {how}: {failure:?}");
            assert_eq!(
                asked.text(),
                "one two",
                "{kind} cut, {how}: deltas before the cut"
            );
        }
        let records = mock.wait_ended(2).await;
        assert_eq!(records[0]["outcome"], "cut", "{kind}");
        assert_eq!(records[0]["events_sent"], cut_after, "{kind}");
        assert_eq!(records[1]["outcome"], "completed", "{kind}");
    }
}

#[tokio::test]
async fn a_malformed_event_stream_is_retryable() {
    for kind in FORMATS {
        let script = json!([{"endpoint": endpoint(kind), "malformed": true}]);
        let (mock, client) = mock_with(script, RELAXED).await;
        let asked = ask(&client, kind, "hi", None).await;
        let failure = asked.failure(&format!("{kind} malformed"));
        assert!(failure.retryable, "{kind}: {failure:?}");
        assert!(
            failure.message.contains("malformed"),
            "{kind}: says what was wrong: {failure:?}"
        );
        assert!(asked.deltas.is_empty(), "{kind}: {:?}", asked.deltas);
        assert_eq!(only_request(&mock).await["outcome"], "completed");
    }
}

#[tokio::test]
async fn an_overloaded_error_event_mid_stream_is_retryable_after_its_deltas() {
    for kind in FORMATS {
        let script = json!([{
            "endpoint": endpoint(kind),
            "after_text": "Half an answer ",
            "error_event": {"type": "overloaded_error", "message": "Overloaded"},
        }]);
        let (mock, client) = mock_with(script, RELAXED).await;
        let asked = ask(&client, kind, "hi", None).await;
        let failure = asked.failure(&format!("{kind} error event"));
        assert!(failure.retryable, "{kind}: {failure:?}");
        assert_eq!(failure.message, "overloaded_error: Overloaded", "{kind}");
        assert_eq!(
            asked.text(),
            "Half an answer ",
            "{kind}: deltas before the error"
        );
        assert_eq!(only_request(&mock).await["outcome"], "completed");
    }
}

#[tokio::test]
async fn a_server_that_never_answers_hits_the_first_byte_timeout() {
    let timeouts = Timeouts {
        first_byte: Duration::from_millis(300),
        ..RELAXED
    };
    for kind in FORMATS {
        let script = json!([{"endpoint": endpoint(kind), "hang": true}]);
        let (mock, client) = mock_with(script, timeouts).await;
        let asked = ask(&client, kind, "hi", None).await;
        let failure = asked.failure(&format!("{kind} hang"));
        assert!(failure.retryable, "{kind}: {failure:?}");
        assert!(
            failure.message.contains("timed out after 300 ms")
                && failure.message.contains("response headers"),
            "{kind}: {failure:?}"
        );
        assert!(
            asked.elapsed >= Duration::from_millis(300) && asked.elapsed < Duration::from_secs(3),
            "{kind}: {:?}",
            asked.elapsed
        );
        // Giving up closed the connection.
        let record = only_request(&mock).await;
        assert_eq!(record["outcome"], "disconnected", "{kind}: {record}");
    }
}

#[tokio::test]
async fn a_stream_that_stalls_hits_the_idle_timeout() {
    let timeouts = Timeouts {
        idle: Duration::from_millis(300),
        ..RELAXED
    };
    for kind in FORMATS {
        let script = json!([{
            "endpoint": endpoint(kind),
            "text": TEN_WORDS,
            "hang_after_events": events_before_text(kind) + 2,
        }]);
        let (mock, client) = mock_with(script, timeouts).await;
        let asked = ask(&client, kind, "hi", None).await;
        let failure = asked.failure(&format!("{kind} stall"));
        assert!(failure.retryable, "{kind}: {failure:?}");
        assert!(
            failure.message.contains("timed out after 300 ms")
                && failure.message.contains("next part of the response"),
            "{kind}: {failure:?}"
        );
        assert_eq!(asked.text(), "one two", "{kind}: deltas before the stall");
        assert!(
            asked.elapsed < Duration::from_secs(3),
            "{kind}: {:?}",
            asked.elapsed
        );
        let record = only_request(&mock).await;
        assert_eq!(record["outcome"], "disconnected", "{kind}: {record}");
    }
}

#[tokio::test]
async fn a_drip_slower_than_the_request_limit_times_out_whole() {
    // Each delta takes 100 ms; the whole request may take 350 ms; the idle
    // clock (5 s) never fires.
    let limit = Duration::from_millis(350);
    for kind in FORMATS {
        let script = json!([{"endpoint": endpoint(kind), "text": TEN_WORDS, "drip_ms": 100}]);
        let (mock, client) = mock_with(script, RELAXED).await;
        let asked = ask(&client, kind, "hi", Some(limit)).await;
        let failure = asked.failure(&format!("{kind} drip"));
        assert!(failure.retryable, "{kind}: {failure:?}");
        assert!(
            failure.message.contains("timed out after 350 ms")
                && failure
                    .message
                    .contains("before the whole response arrived"),
            "{kind}: {failure:?}"
        );
        let text = asked.text();
        assert!(
            !text.is_empty() && text.len() < TEN_WORDS.len() && TEN_WORDS.starts_with(&text),
            "{kind}: some deltas, not all: {text:?}"
        );
        assert!(
            asked.elapsed >= limit && asked.elapsed < Duration::from_secs(3),
            "{kind}: {:?}",
            asked.elapsed
        );
        let record = only_request(&mock).await;
        assert_eq!(record["outcome"], "disconnected", "{kind}: {record}");
    }
}

// ---------------------------------------------------------------------------
// 3. Cancelling closes the socket.

/// How long the mock may take to see the socket close after the client
/// dropped it. Invariant 5 wants the stream closed at once; the mock notices
/// at its next write at the latest (one 50 ms drip).
const CLOSE_NOTICED_WITHIN_MS: u64 = 1_000;

fn assert_disconnected_promptly(kind: ProviderKind, how: &str, record: &Value, dropped_at: u64) {
    assert_eq!(record["outcome"], "disconnected", "{kind} {how}: {record}");
    let total_frames = record["events_sent"].as_u64().unwrap();
    assert!(
        total_frames < 10,
        "{kind} {how}: the stream was not sent to its end: {record}"
    );
    let disconnected_at = record["disconnected_at_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("{kind} {how}: disconnected_at_ms: {record}"));
    let latency = disconnected_at.saturating_sub(dropped_at);
    assert!(
        latency < CLOSE_NOTICED_WITHIN_MS,
        "{kind} {how}: the mock saw the close {latency} ms after the drop"
    );
}

#[tokio::test]
async fn dropping_the_stream_future_closes_the_connection() {
    for kind in FORMATS {
        let script = json!([{"endpoint": endpoint(kind), "text": TEN_WORDS, "drip_ms": 50}]);
        let (mock, client) = mock_with(script, RELAXED).await;
        let messages = user("hi");
        let images = BTreeMap::new();
        let request = PromptRequest {
            model: model(kind),
            system: None,
            messages: &messages,
            tools: &ToolSpecs::default(),
            max_tokens: 256,
            images: &images,
        };
        let (first_delta, got_first_delta) = tokio::sync::oneshot::channel();
        let mut first_delta = Some(first_delta);
        let stream = client.stream(kind, &request, None, move |_delta| {
            if let Some(first_delta) = first_delta.take() {
                let _ = first_delta.send(());
            }
        });
        // The stream loses the race to its own first delta and is dropped.
        tokio::select! {
            finished = stream => panic!("{kind}: the drip finished before the cancel: {finished:?}"),
            _ = got_first_delta => {}
        }
        let dropped_at = now_ms();
        let record = only_request(&mock).await;
        assert_disconnected_promptly(kind, "select!", &record, dropped_at);
    }
}

#[tokio::test]
async fn aborting_the_streaming_task_closes_the_connection() {
    for kind in FORMATS {
        let script = json!([{"endpoint": endpoint(kind), "text": TEN_WORDS, "drip_ms": 50}]);
        let (mock, client) = mock_with(script, RELAXED).await;
        let (first_delta, got_first_delta) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let messages = user("hi");
            let images = BTreeMap::new();
            let request = PromptRequest {
                model: model(kind),
                system: None,
                messages: &messages,
                tools: &ToolSpecs::default(),
                max_tokens: 256,
                images: &images,
            };
            let mut first_delta = Some(first_delta);
            client
                .stream(kind, &request, None, move |_delta| {
                    if let Some(first_delta) = first_delta.take() {
                        let _ = first_delta.send(());
                    }
                })
                .await
        });
        got_first_delta.await.expect("a first delta");
        task.abort();
        let dropped_at = now_ms();
        let joined = task.await;
        assert!(
            joined.as_ref().is_err_and(|err| err.is_cancelled()),
            "{kind}: {joined:?}"
        );
        let record = only_request(&mock).await;
        assert_disconnected_promptly(kind, "abort", &record, dropped_at);
    }
}

// ---------------------------------------------------------------------------
// 4. Retries and fallback through the real core.

/// A minimal shell around `keel_core::transition`: it carries out the
/// effects with the real `ProviderClient` and real (tiny) timers, and keeps
/// the log and the live events for the test to read.
struct Shell {
    client: ProviderClient,
    conversation: Option<Conversation>,
    log: Vec<Event>,
    live: Vec<LiveEvent>,
    /// Timers the core asked for and that have not fired yet.
    timers: Vec<(Timer, Timestamp)>,
}

fn now() -> Timestamp {
    Timestamp::from_millis(now_ms())
}

impl Shell {
    fn new(client: ProviderClient, config: ConversationConfig) -> Shell {
        let new = NewConversation {
            id: ConversationId::new("e2e-provider").unwrap(),
            cwd: std::env::temp_dir().display().to_string(),
            config,
            parent_conversation: None,
        };
        let step = keel_core::create(new, now());
        let mut shell = Shell {
            client,
            conversation: Some(step.state),
            log: Vec::new(),
            live: Vec::new(),
            timers: Vec::new(),
        };
        for effect in step.effects {
            match effect {
                Effect::Append { events } => shell.log.extend(events),
                Effect::Publish { event } => shell.live.push(event),
                other => panic!("unexpected effect on create: {other:?}"),
            }
        }
        shell
    }

    fn conversation(&self) -> &Conversation {
        self.conversation.as_ref().expect("a conversation")
    }

    /// Send a user message and run until nothing is left to do.
    async fn send(&mut self, text: &str) {
        self.live.clear();
        self.run(Input::UserMessage {
            text: text.to_owned(),
            images: Vec::new(),
        })
        .await;
    }

    async fn run(&mut self, first: Input) {
        let mut inputs = VecDeque::from([first]);
        loop {
            while let Some(input) = inputs.pop_front() {
                let conversation = self.conversation.take().expect("a conversation");
                let step = keel_core::transition(conversation, input.clone(), now());
                assert_eq!(step.rejection, None, "the core refused {input:?}");
                self.conversation = Some(step.state);
                for effect in step.effects {
                    self.carry_out(effect, &mut inputs).await;
                }
            }
            // Idle until the earliest timer.
            let Some(next_idx) = (0..self.timers.len()).min_by_key(|idx| self.timers[*idx].1)
            else {
                return;
            };
            let (timer, at) = self.timers.remove(next_idx);
            let wait = at.as_millis().saturating_sub(now_ms());
            assert!(wait <= 1_000, "the core asked for a long delay: {wait} ms");
            tokio::time::sleep(Duration::from_millis(wait)).await;
            inputs.push_back(Input::TimerFired { timer });
        }
    }

    async fn carry_out(&mut self, effect: Effect, inputs: &mut VecDeque<Input>) {
        match effect {
            Effect::Append { events } => self.log.extend(events),
            Effect::Publish { event } => self.live.push(event),
            Effect::StartStream {
                generation,
                model,
                timeout_ms,
                // No conversation here grows past its window.
                summarise: _,
            } => {
                let working = &self.conversation().working;
                let images = BTreeMap::new();
                let request = PromptRequest {
                    model: &model.model,
                    system: working.config.system.as_deref(),
                    messages: &working.messages,
                    tools: &ToolSpecs::default(),
                    max_tokens: working.config.max_tokens,
                    images: &images,
                };
                let mut deltas = Vec::new();
                let limit = Some(Duration::from_millis(timeout_ms));
                let result = self
                    .client
                    .stream(model.provider, &request, limit, |delta| deltas.push(delta))
                    .await;
                inputs.extend(
                    deltas
                        .into_iter()
                        .map(|delta| Input::StreamDelta { generation, delta }),
                );
                inputs.push_back(match result {
                    Ok(response) => Input::StreamFinished {
                        generation,
                        response,
                    },
                    Err(failure) => Input::StreamFailed {
                        generation,
                        failure,
                        jitter: 500,
                    },
                });
            }
            Effect::SetTimer { timer, at } => self.timers.push((timer, at)),
            Effect::SaveSnapshot => {}
            other => panic!("unexpected effect for a tool-less conversation: {other:?}"),
        }
    }

    fn phase(&self) -> &Phase {
        &self.conversation().phase
    }

    fn retries(&self) -> Vec<(u32, u64, String, ModelRef)> {
        self.live
            .iter()
            .filter_map(|event| match event {
                LiveEvent::Retrying {
                    retry,
                    max_retries,
                    delay_ms,
                    error,
                    model,
                } => {
                    assert_eq!(*max_retries, 2);
                    Some((*retry, *delay_ms, error.clone(), model.clone()))
                }
                _ => None,
            })
            .collect()
    }

    fn fallbacks(&self) -> Vec<(ModelRef, ModelRef, String)> {
        self.live
            .iter()
            .filter_map(|event| match event {
                LiveEvent::FallbackUsed { from, to, error } => {
                    Some((from.clone(), to.clone(), error.clone()))
                }
                _ => None,
            })
            .collect()
    }

    fn discarded(&self) -> usize {
        self.live
            .iter()
            .filter(|event| matches!(event, LiveEvent::AttemptDiscarded { .. }))
            .count()
    }

    /// The last assistant message in the log: its text, provider and model.
    fn last_answer(&self) -> (String, ProviderKind, String) {
        self.log
            .iter()
            .rev()
            .find_map(|event| match &event.kind {
                EventKind::AssistantMessage {
                    blocks,
                    provider,
                    model,
                    ..
                } => {
                    let text = blocks
                        .iter()
                        .filter_map(|block| match block {
                            AssistantBlock::Text { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect();
                    Some((text, *provider, model.clone()))
                }
                _ => None,
            })
            .expect("an assistant message")
    }

    fn count(&self, matches: impl Fn(&EventKind) -> bool) -> usize {
        self.log.iter().filter(|event| matches(&event.kind)).count()
    }
}

fn primary() -> ModelRef {
    ModelRef {
        provider: ProviderKind::Anthropic,
        model: "claude-mock".to_owned(),
    }
}

fn fallback() -> ModelRef {
    ModelRef {
        provider: ProviderKind::OpenAi,
        model: "gpt-mock".to_owned(),
    }
}

fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        base_delay_ms: 10,
        max_delay_ms: 50,
        max_retries: 2,
        ..RetryPolicy::default()
    }
}

/// A shell whose conversation asks Anthropic on the mock first and OpenAI on
/// the mock when that fails, with `script` queued.
async fn shell_with(script: Value) -> (MockLlm, Shell) {
    let (mock, client) = mock_with(script, RELAXED).await;
    let config = ConversationConfig {
        system: Some("You are a test fixture.".to_owned()),
        primary: primary(),
        fallback: Some(fallback()),
        request_timeout_ms: 1_000,
        retry: retry_policy(),
        max_tokens: 512,
        ..ConversationConfig::default()
    };
    (mock, Shell::new(client, config))
}

/// The delays the core should ask for with jitter 500: 7 ms, then 15 ms.
fn expected_delays() -> [u64; 2] {
    let policy = retry_policy();
    [policy.delay_ms(1, None, 500), policy.delay_ms(2, None, 500)]
}

#[tokio::test]
async fn core_retries_the_primary_and_succeeds() {
    let (mock, mut shell) = shell_with(json!([
        {"endpoint": "anthropic", "status": 503},
        {"endpoint": "anthropic", "text": TEN_WORDS, "cut_after_events": 5},
        {"endpoint": "anthropic", "text": "The answer, at last."},
    ]))
    .await;
    shell.send("What is the answer?").await;

    assert_eq!(shell.phase(), &Phase::Idle);
    assert_eq!(
        shell.last_answer(),
        (
            "The answer, at last.".to_owned(),
            ProviderKind::Anthropic,
            "claude-mock".to_owned()
        )
    );
    let retries = shell.retries();
    assert_eq!(retries.len(), 2, "{retries:?}");
    let delays = expected_delays();
    for (idx, (retry, delay_ms, _, model)) in retries.iter().enumerate() {
        assert_eq!(*retry, idx as u32 + 1);
        assert_eq!(*delay_ms, delays[idx]);
        assert_eq!(*model, primary());
    }
    assert!(retries[0].2.starts_with("HTTP 503: "), "{retries:?}");
    assert_eq!(shell.discarded(), 2);
    assert!(shell.fallbacks().is_empty());
    assert_eq!(
        shell.count(|kind| matches!(kind, EventKind::TurnCompleted { .. })),
        1
    );
    assert_eq!(
        shell.count(|kind| matches!(kind, EventKind::AssistantMessage { .. })),
        1,
        "a failed attempt leaves nothing in the log"
    );

    // Three requests, all to the primary, each the same prompt: nothing of
    // the cut attempt was sent back.
    let records = mock.wait_ended(3).await;
    assert_eq!(records.len(), 3);
    let outcomes: Vec<&Value> = records.iter().map(|record| &record["outcome"]).collect();
    assert_eq!(
        outcomes,
        [&json!("completed"), &json!("cut"), &json!("completed")]
    );
    for record in &records {
        assert_eq!(record["endpoint"], "anthropic");
        assert_eq!(record["body"]["messages"], records[0]["body"]["messages"]);
    }
}

#[tokio::test]
async fn core_falls_back_to_openai_when_the_primary_keeps_failing() {
    let (mock, mut shell) = shell_with(json!([
        {"endpoint": "anthropic", "status": 500},
        {"endpoint": "anthropic", "after_text": "Half an ",
         "error_event": {"type": "overloaded_error", "message": "Overloaded"}},
        {"endpoint": "anthropic", "malformed": true},
        // No entry for OpenAI: its default echo answers.
    ]))
    .await;
    shell.send("Echo me, fallback.").await;

    assert_eq!(shell.phase(), &Phase::Idle);
    assert_eq!(
        shell.last_answer(),
        (
            "Echo me, fallback.".to_owned(),
            ProviderKind::OpenAi,
            "gpt-mock".to_owned()
        ),
        "the answer records who answered"
    );
    let retries = shell.retries();
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert!(retries.iter().all(|retry| retry.3 == primary()));
    assert_eq!(retries[1].2, "overloaded_error: Overloaded");
    let fallbacks = shell.fallbacks();
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    let (from, to, error) = &fallbacks[0];
    assert_eq!((from, to), (&primary(), &fallback()));
    assert!(error.contains("malformed"), "the last error: {error}");
    // The fallback event comes before any delta of the fallback's answer.
    let fallback_idx = shell
        .live
        .iter()
        .position(|event| matches!(event, LiveEvent::FallbackUsed { .. }))
        .unwrap();
    let answered: String = shell.live[fallback_idx..]
        .iter()
        .filter_map(|event| match event {
            LiveEvent::Delta {
                delta: StreamDelta::Text { text },
                ..
            } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(answered, "Echo me, fallback.");

    let records = mock.wait_ended(4).await;
    let endpoints: Vec<&Value> = records.iter().map(|record| &record["endpoint"]).collect();
    assert_eq!(
        endpoints,
        [
            &json!("anthropic"),
            &json!("anthropic"),
            &json!("anthropic"),
            &json!("openai")
        ]
    );
    let openai = &records[3];
    assert_eq!(openai["path"], "/v1/chat/completions");
    assert_eq!(openai["body"]["model"], "gpt-mock");
    let sent = openai["body"]["messages"].to_string();
    assert!(sent.contains("Echo me, fallback."), "{sent}");
    assert!(
        !sent.contains("Half an"),
        "a failed attempt's text leaked: {sent}"
    );
}

#[tokio::test]
async fn core_fails_at_once_on_an_auth_error_and_a_new_message_continues() {
    let (mock, mut shell) = shell_with(json!([{
        "endpoint": "anthropic",
        "status": 401,
        "body": {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
    }]))
    .await;
    shell.send("Hello?").await;

    let expected =
        "anthropic/claude-mock failed: HTTP 401: authentication_error: invalid x-api-key";
    assert_eq!(
        shell.phase(),
        &Phase::Error {
            message: expected.to_owned()
        }
    );
    assert!(
        shell.retries().is_empty(),
        "no retry: {:?}",
        shell.retries()
    );
    assert!(shell.fallbacks().is_empty(), "no fallback either");
    let failed: Vec<&str> = shell
        .log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::TurnFailed { error, .. } => Some(error.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [expected]);
    assert_eq!(mock.wait_ended(1).await.len(), 1, "exactly one request");

    // The conversation is not stuck: the next message gets an answer.
    shell.send("Hello again").await;
    assert_eq!(shell.phase(), &Phase::Idle);
    // The failed turn left no assistant message, so the two user messages
    // form one user turn (roles alternate) and the echo repeats both.
    assert_eq!(shell.last_answer().0, "Hello?\nHello again");
    let records = mock.requests().await;
    assert_eq!(records.len(), 2);
    assert_eq!(records[1]["source"], "default");
}

#[tokio::test]
async fn core_errors_when_every_attempt_on_both_providers_fails() {
    let (mock, mut shell) = shell_with(json!([
        {"endpoint": "anthropic", "status": 503},
        // request_timeout_ms (1 s) bounds a request that never answers.
        {"endpoint": "anthropic", "hang": true},
        {"endpoint": "anthropic", "status": 529},
        {"endpoint": "openai", "status": 500},
        {"endpoint": "openai", "text": TEN_WORDS, "cut_after_events": 2},
        {"endpoint": "openai", "status": 502,
         "body": {"error": {"message": "Bad gateway upstream", "type": "server_error", "param": null, "code": null}}},
    ]))
    .await;
    shell.send("Anyone there?").await;

    let expected =
        "openai/gpt-mock failed 3 times; last error: HTTP 502: server_error: Bad gateway upstream";
    assert_eq!(
        shell.phase(),
        &Phase::Error {
            message: expected.to_owned()
        }
    );
    let retries = shell.retries();
    let models: Vec<ModelRef> = retries.iter().map(|retry| retry.3.clone()).collect();
    assert_eq!(models, [primary(), primary(), fallback(), fallback()]);
    assert!(
        retries[1].2.contains("timed out after 1000 ms"),
        "the hang hit the request limit: {retries:?}"
    );
    assert_eq!(shell.fallbacks().len(), 1);
    assert_eq!(shell.discarded(), 6);
    assert_eq!(
        shell.count(|kind| matches!(kind, EventKind::AssistantMessage { .. })),
        0
    );
    assert_eq!(
        shell
            .count(|kind| matches!(kind, EventKind::TurnFailed { error, .. } if error == expected)),
        1
    );

    let records = mock.wait_ended(6).await;
    let seen: Vec<(String, String)> = records
        .iter()
        .map(|record| {
            (
                record["endpoint"].as_str().unwrap().to_owned(),
                record["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected_records = [
        ("anthropic", "completed"),
        ("anthropic", "disconnected"),
        ("anthropic", "completed"),
        ("openai", "completed"),
        ("openai", "cut"),
        ("openai", "completed"),
    ]
    .map(|(endpoint, outcome)| (endpoint.to_owned(), outcome.to_owned()));
    assert_eq!(seen, expected_records);
}
