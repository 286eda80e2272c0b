//! `keel mock-llm`: a fake LLM provider over HTTP, so the demo runs without
//! a key and every failure path of a provider client can be tested for real,
//! over a real socket.
//!
//! It speaks both wire formats keel uses: the Anthropic Messages API on
//! `POST /v1/messages` and OpenAI Chat Completions on
//! `POST /v1/chat/completions` (also without the `/v1`, for clients whose
//! base URL already ends in it). Any key is accepted. A request is answered
//! by, in order of precedence: its `x-mock-fault` header (one script entry
//! as JSON); a refusal as too long, when its prompt is estimated over the
//! context window (`--context-window`, `POST /_mock/settings`); the next
//! entry of the script that fits it (`--script FILE`, and
//! `POST /_mock/script`; an entry may ask for a text in the prompt with
//! `"when"`, see `script`); the fake's own summary, for keel's summary
//! requests (`summary`); or the default behaviour of `reply`. Every request
//! is recorded, with how it ended (`GET /_mock/requests`). Usage grows with
//! the prompt and the answer (`tokens`).
//!
//! Modules: `choice` (which answer a request gets), `script` (the entries
//! and the queue), `reply` (what to say),
//! `summary` (summary requests), `tokens` (the counts), `settings` (the
//! context window), `anthropic` and `openai` (rendering), `plan` (a body as
//! data), `body` (sending it), `recording`, `control` (the `/_mock/`
//! routes).

mod anthropic;
mod body;
mod choice;
mod control;
mod openai;
mod plan;
pub mod recording;
mod reply;
mod script;
mod settings;
mod summary;
mod tokens;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context as _;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;

use self::plan::{After, Plan, PlannedEvent};
use self::recording::{now_ms, Exchange, ExchangeOutcome, Recorder};
use self::script::{Action, Ending, Entry, Reply, Script, ScriptedUsage, StatusFault};

pub use self::script::{parse_script, ScriptError, WireApi};
pub use self::settings::{Settings, CONTEXT_WINDOW_ENV};

/// The header that dictates the answer to one request.
pub const FAULT_HEADER: &str = "x-mock-fault";

/// Largest request body accepted: Anthropic's own limit, so requests with
/// images pass here exactly when they would pass there.
const MAX_REQUEST_BYTES: usize = 32 * 1024 * 1024;

/// What `keel mock-llm` was asked for on the command line.
#[derive(Debug, Clone)]
pub struct Options {
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    /// A script file: an array of entries, or `{"replies": [..]}`.
    pub script: Option<PathBuf>,
    /// How many of the latest requests `GET /_mock/requests` keeps.
    pub keep_requests: usize,
    /// Refuse prompts estimated over this many tokens as too long.
    pub context_window: Option<u64>,
}

/// Serve until SIGTERM or ctrl-c. Prints `mock-llm listening on
/// http://HOST:PORT` on stdout once the socket is bound.
pub fn run(options: Options) -> anyhow::Result<()> {
    let entries = match &options.script {
        Some(path) => load_script(path)?,
        None => Vec::new(),
    };
    let settings = Settings::with_context_window(options.context_window)
        .map_err(|err| anyhow::anyhow!("--context-window: {err}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(options, entries, settings))
}

fn load_script(path: &std::path::Path) -> anyhow::Result<Vec<Entry>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the script {}", path.display()))?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("the script {} is not JSON", path.display()))?;
    parse_script(&value).with_context(|| format!("in the script {}", path.display()))
}

async fn serve(options: Options, entries: Vec<Entry>, settings: Settings) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((options.host.as_str(), options.port))
        .await
        .with_context(|| format!("binding {}:{}", options.host, options.port))?;
    let address = listener.local_addr().context("reading the bound address")?;
    let mock = Mock::keeping_requests(options.keep_requests);
    mock.script().push(entries);
    *mock.settings() = settings;

    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "mock-llm listening on http://{address}")
            .and_then(|()| stdout.flush())
            .context("printing the address")?;
    }
    // Not a graceful shutdown: a hanging request would hold it up forever,
    // and a fake provider has nothing to save.
    tokio::select! {
        served = axum::serve(keel_daemon::net::no_delay(listener), app(mock).into_make_service()) => served.context("serving"),
        () = keel_daemon::daemon::stop_signal() => Ok(()),
    }
}

/// Start the fake provider in this process on a free loopback port (as
/// `keel serve` does when no provider is configured, and the demo, drills
/// and `keel bench` do for their daemons), with `settings`; its base URL.
pub async fn start_in_process(settings: Settings) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding the built-in fake provider")?;
    let address = listener.local_addr().context("reading its address")?;
    let mock = Mock::default();
    *mock.settings() = settings;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(
            keel_daemon::net::no_delay(listener),
            app(mock).into_make_service(),
        )
        .await
        {
            tracing::error!(error = %error, "the built-in fake provider stopped");
        }
    });
    Ok(format!("http://{address}"))
}

/// The fake provider `keel serve` starts in its own process when no
/// provider is configured: [`start_in_process`] with the settings of the
/// environment ([`CONTEXT_WINDOW_ENV`]).
pub async fn start_builtin() -> anyhow::Result<String> {
    let settings =
        Settings::from_env(|name| std::env::var(name).ok()).map_err(anyhow::Error::msg)?;
    start_in_process(settings).await
}

/// The server's state: the script, the settings, the recording and the id
/// counters.
#[derive(Debug, Clone, Default)]
pub struct Mock {
    script: Arc<Mutex<Script>>,
    settings: Arc<Mutex<Settings>>,
    recorder: Recorder,
    /// Numbers message ids (`msg_mock_N`, `chatcmpl-mock-N`).
    n_messages: Arc<AtomicU64>,
    /// Numbers tool call ids (`toolu_mock_N`, `call_mock_N`).
    n_tool_calls: Arc<AtomicU64>,
}

impl Mock {
    /// A mock whose recording keeps the latest `keep` requests
    /// (`Mock::default()` keeps `recording::KEEP_RECORDS`).
    pub fn keeping_requests(keep: usize) -> Mock {
        Mock {
            recorder: Recorder::keeping(keep),
            ..Mock::default()
        }
    }

    fn script(&self) -> MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn settings(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A request body as the recording keeps it: the text received when it is
/// a JSON object, otherwise that text as a JSON string.
fn recorded_body(raw_body: &[u8], is_json: bool) -> Box<RawValue> {
    let text = String::from_utf8_lossy(raw_body);
    let json = if is_json {
        RawValue::from_string(text.into_owned())
    } else {
        serde_json::value::to_raw_value(&text)
    };
    // Neither can fail (the text parsed as JSON; a string serialises), but
    // a recording is no reason to fail a request.
    json.unwrap_or_else(|_| Box::<RawValue>::default())
}

/// Every route of the mock.
pub fn app(mock: Mock) -> Router {
    Router::new()
        .route("/v1/messages", post(anthropic_messages))
        .route("/messages", post(anthropic_messages))
        .route("/v1/chat/completions", post(openai_chat))
        .route("/chat/completions", post(openai_chat))
        .route(
            "/_mock/script",
            post(control::push_script)
                .get(control::show_script)
                .delete(control::clear_script),
        )
        .route(
            "/_mock/settings",
            get(control::show_settings).post(control::change_settings),
        )
        .route(
            "/_mock/requests",
            get(control::list_requests).delete(control::clear_requests),
        )
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .with_state(mock)
}

async fn anthropic_messages(
    State(mock): State<Mock>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    mock.answer(WireApi::Anthropic, uri.path(), &headers, &body)
        .await
}

async fn openai_chat(
    State(mock): State<Mock>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    mock.answer(WireApi::Openai, uri.path(), &headers, &body)
        .await
}

impl Mock {
    async fn answer(
        &self,
        endpoint: WireApi,
        path: &str,
        headers: &HeaderMap,
        raw_body: &[u8],
    ) -> Response {
        let parsed = serde_json::from_slice::<Value>(raw_body)
            .ok()
            .filter(Value::is_object);
        let recorded_body = recorded_body(raw_body, parsed.is_some());
        let stream = parsed
            .as_ref()
            .is_some_and(|request| request["stream"] == true);
        let mut exchange = self
            .recorder
            .start(endpoint, path, headers, recorded_body, stream);
        let seq = exchange.seq();

        let mut response = match parsed {
            None => invalid_request(
                endpoint,
                "mock-llm: the request body is not a JSON object",
                &mut exchange,
            ),
            Some(request) if !request["messages"].is_array() => invalid_request(
                endpoint,
                "mock-llm: messages: an array is required",
                &mut exchange,
            ),
            Some(request) => {
                let prompt_tokens = tokens::prompt_tokens(&request);
                exchange.measured(prompt_tokens);
                match self.choose(endpoint, headers, &request, prompt_tokens) {
                    Err(message) => invalid_request(endpoint, &message, &mut exchange),
                    Ok(choice) => {
                        exchange.answered_by(choice.source, choice.entry);
                        let asked = Asked {
                            endpoint,
                            request: &request,
                            stream,
                            prompt_tokens,
                        };
                        self.act(asked, choice.action, exchange).await
                    }
                }
            }
        };
        let request_id = match endpoint {
            WireApi::Anthropic => ("request-id", format!("req_mock_{seq}")),
            WireApi::Openai => ("x-request-id", format!("req_mock_{seq}")),
        };
        for (name, value) in [
            ("x-mock-seq", seq.to_string()),
            (request_id.0, request_id.1),
        ] {
            if let Ok(value) = HeaderValue::from_str(&value) {
                response
                    .headers_mut()
                    .insert(HeaderName::from_static(name), value);
            }
        }
        response
    }

    async fn act(&self, asked: Asked<'_>, action: Action, mut exchange: Exchange) -> Response {
        let Asked {
            endpoint, stream, ..
        } = asked;
        match action {
            Action::Status(fault) => status_response(endpoint, &fault, &mut exchange),
            Action::Hang => {
                // Never answer. When the client closes the connection, hyper
                // drops this future and with it the exchange, which records
                // the disconnect.
                let _exchange = exchange;
                std::future::pending::<Response>().await
            }
            Action::Malformed => {
                let (frame, content_type) = if stream {
                    let frame = match endpoint {
                        WireApi::Anthropic => anthropic::malformed_frame(),
                        WireApi::Openai => openai::malformed_frame(),
                    };
                    (frame, body::EVENT_STREAM)
                } else {
                    let cut_json = "{\"id\":\"mock\",\"type\":\"mess".to_owned();
                    (PlannedEvent::event(cut_json), body::JSON)
                };
                body::respond(Plan::whole(vec![frame]), exchange, content_type)
            }
            Action::Reply(reply) => self.reply(asked, &reply, exchange),
        }
    }

    fn reply(&self, asked: Asked<'_>, reply: &Reply, mut exchange: Exchange) -> Response {
        let Asked {
            endpoint,
            request,
            stream,
            prompt_tokens,
        } = asked;
        let n_message = self.n_messages.fetch_add(1, Ordering::Relaxed) + 1;
        let mut answer = reply::answer(
            endpoint,
            request,
            prompt_tokens,
            &reply.content,
            reply.stop,
            || self.n_tool_calls.fetch_add(1, Ordering::Relaxed) + 1,
        );
        let ScriptedUsage {
            input_tokens,
            output_tokens,
        } = reply.usage;
        answer.usage.input_tokens = input_tokens.unwrap_or(answer.usage.input_tokens);
        answer.usage.output_tokens = output_tokens.unwrap_or(answer.usage.output_tokens);
        let model = request["model"].as_str().unwrap_or("mock-model");
        let message_id = match endpoint {
            WireApi::Anthropic => format!("msg_mock_{n_message}"),
            WireApi::Openai => format!("chatcmpl-mock-{n_message}"),
        };
        let chunk_meta = openai::ChunkMeta {
            id: &message_id,
            model,
            created: now_ms() / 1000,
            include_usage: request["stream_options"]["include_usage"] == true,
        };

        if stream {
            let planned = match endpoint {
                WireApi::Anthropic => plan::plan(
                    anthropic::stream(&answer, &message_id, model),
                    &reply.ending,
                    reply.drip_ms,
                    anthropic::error_frames,
                ),
                WireApi::Openai => plan::plan(
                    openai::stream(&answer, chunk_meta),
                    &reply.ending,
                    reply.drip_ms,
                    openai::error_frames,
                ),
            };
            return body::respond(planned, exchange, body::EVENT_STREAM);
        }

        // Not streamed: the same answer as one JSON object. Faults that
        // live inside a stream take their nearest plain-HTTP form.
        let whole = match endpoint {
            WireApi::Anthropic => anthropic::message(&answer, &message_id, model),
            WireApi::Openai => openai::completion(&answer, chunk_meta),
        };
        match &reply.ending {
            Ending::Complete => {
                exchange.finish(ExchangeOutcome::Completed);
                Json(whole).into_response()
            }
            Ending::Cut { clean_eof, .. } => {
                let text = whole.to_string();
                let mut half = text.len() / 2;
                while !text.is_char_boundary(half) {
                    half -= 1;
                }
                let planned = Plan {
                    frames: vec![PlannedEvent::event(text[..half].to_owned())],
                    drip: None,
                    after: if *clean_eof { After::End } else { After::Abort },
                };
                body::respond(planned, exchange, body::JSON)
            }
            Ending::Stall { .. } => {
                let planned = Plan {
                    frames: Vec::new(),
                    drip: None,
                    after: After::Stall,
                };
                body::respond(planned, exchange, body::JSON)
            }
            Ending::Error(error) => {
                let (status, body) = match endpoint {
                    WireApi::Anthropic => (
                        anthropic::error_status(error),
                        anthropic::error_response_body(error),
                    ),
                    WireApi::Openai => (
                        openai::error_status(error),
                        openai::error_response_body(error),
                    ),
                };
                exchange.finish(ExchangeOutcome::Completed);
                let status =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                (status, Json(body)).into_response()
            }
        }
    }
}

/// A provider request, as the answer to it needs it.
#[derive(Debug, Clone, Copy)]
struct Asked<'a> {
    endpoint: WireApi,
    request: &'a Value,
    stream: bool,
    /// The prompt's estimated tokens (`tokens::prompt_tokens`).
    prompt_tokens: u64,
}

fn error_body(endpoint: WireApi, status: u16, message: &str) -> Value {
    match endpoint {
        WireApi::Anthropic => anthropic::error_body(status, message),
        WireApi::Openai => openai::error_body(status, message),
    }
}

fn invalid_request(endpoint: WireApi, message: &str, exchange: &mut Exchange) -> Response {
    exchange.finish(ExchangeOutcome::Completed);
    (
        StatusCode::BAD_REQUEST,
        Json(error_body(endpoint, 400, message)),
    )
        .into_response()
}

fn status_response(endpoint: WireApi, fault: &StatusFault, exchange: &mut Exchange) -> Response {
    let status = StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = fault.body.clone().unwrap_or_else(|| {
        let reason = status.canonical_reason().unwrap_or("Error");
        error_body(
            endpoint,
            status.as_u16(),
            &format!("{reason} (scripted by mock-llm)"),
        )
    });
    let mut response = (status, Json(body)).into_response();
    let retry_headers = [
        ("retry-after", fault.retry_after.clone()),
        (
            "retry-after-ms",
            fault.retry_after_ms.map(|millis| millis.to_string()),
        ),
    ];
    for (name, value) in retry_headers {
        if let Some(value) = value.and_then(|value| HeaderValue::from_str(&value).ok()) {
            response
                .headers_mut()
                .insert(HeaderName::from_static(name), value);
        }
    }
    exchange.finish(ExchangeOutcome::Completed);
    response
}

/// The mock's streams, fed to keel's own decoders: what the mock says is
/// what keel's provider clients understand.
#[cfg(test)]
mod tests {
    use keel_core::message::{AssistantBlock, StopReason};
    use keel_core::wire::classify::classify_status;
    use keel_core::wire::{self, SseEvent, StreamDecoder};
    use serde_json::json;

    use super::reply::{self, Answer};
    use super::script::{Content, Ending, ErrorSpec, ScriptedCall, Stop, WireApi};
    use super::{anthropic, openai, plan};

    fn answer(endpoint: WireApi) -> Answer {
        let content = Content::Given {
            text: Some("Let me run that.".to_owned()),
            tool_calls: vec![ScriptedCall {
                name: "bash".to_owned(),
                input: json!({"command": "echo \"São Paulo\""}),
                id: None,
            }],
        };
        reply::answer(
            endpoint,
            &json!({"messages": []}),
            1_234,
            &content,
            None,
            || 1,
        )
    }

    fn frames(endpoint: WireApi, answer: &Answer, ending: &Ending) -> Vec<String> {
        let meta = openai::ChunkMeta {
            id: "chatcmpl-mock-1",
            model: "gpt-mock",
            created: 1,
            include_usage: true,
        };
        let planned = match endpoint {
            WireApi::Anthropic => plan::plan(
                anthropic::stream(answer, "msg_mock_1", "claude-mock"),
                ending,
                None,
                anthropic::error_frames,
            ),
            WireApi::Openai => plan::plan(
                openai::stream(answer, meta),
                ending,
                None,
                openai::error_frames,
            ),
        };
        planned.frames.into_iter().map(|frame| frame.text).collect()
    }

    fn new_decoder(endpoint: WireApi) -> Box<dyn StreamDecoder> {
        match endpoint {
            WireApi::Anthropic => Box::new(wire::anthropic::Decoder::new("claude-mock")),
            WireApi::Openai => Box::new(wire::openai::Decoder::new("gpt-mock")),
        }
    }

    /// Feed SSE frames (as the mock writes them) to `decoder`.
    fn feed(
        decoder: &mut dyn StreamDecoder,
        frames: &[String],
    ) -> Result<(), keel_core::LlmFailure> {
        for frame in frames {
            let mut event = "";
            let mut data = "";
            for line in frame.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event = name;
                } else if let Some(payload) = line.strip_prefix("data: ") {
                    data = payload;
                }
            }
            decoder.feed(SseEvent { event, data })?;
        }
        Ok(())
    }

    #[test]
    fn keels_decoders_read_the_mocks_streams() {
        for endpoint in [WireApi::Anthropic, WireApi::Openai] {
            let answer = answer(endpoint);
            let mut decoder = new_decoder(endpoint);
            feed(
                decoder.as_mut(),
                &frames(endpoint, &answer, &Ending::Complete),
            )
            .unwrap();
            assert!(decoder.is_complete(), "{endpoint:?}");
            let response = decoder.finish().unwrap();
            assert_eq!(response.stop_reason, StopReason::ToolUse, "{endpoint:?}");
            let AssistantBlock::Text { text } = &response.blocks[0] else {
                panic!("{endpoint:?}: text first: {:?}", response.blocks)
            };
            assert_eq!(text, "Let me run that.");
            let AssistantBlock::ToolUse { call } = &response.blocks[1] else {
                panic!("{endpoint:?}: then the call: {:?}", response.blocks)
            };
            assert_eq!(call.id.as_str(), answer.tool_calls[0].id);
            assert_eq!(call.name, "bash");
            assert_eq!(call.input, json!({"command": "echo \"São Paulo\""}));
            assert_eq!(response.usage.input_tokens, 1_234, "{endpoint:?}");
            assert_eq!(response.usage.output_tokens, answer.usage.output_tokens);
        }
    }

    #[test]
    fn scripted_stop_reasons_reach_keels_decoders() {
        let cases = [
            (
                Stop::MaxTokens,
                StopReason::MaxTokens,
                StopReason::MaxTokens,
            ),
            (Stop::PauseTurn, StopReason::PauseTurn, StopReason::ToolUse),
            (Stop::Refusal, StopReason::Refusal, StopReason::ToolUse),
        ];
        for (stop, on_anthropic, on_openai) in cases {
            for endpoint in [WireApi::Anthropic, WireApi::Openai] {
                let mut answer = answer(endpoint);
                answer.stop = Some(stop);
                let mut decoder = new_decoder(endpoint);
                feed(
                    decoder.as_mut(),
                    &frames(endpoint, &answer, &Ending::Complete),
                )
                .unwrap();
                let response = decoder.finish().unwrap();
                let expected = match endpoint {
                    WireApi::Anthropic => on_anthropic,
                    // Tool calls decide an OpenAI stop reason, except a
                    // cut-off, which says so whatever it holds.
                    WireApi::Openai => on_openai,
                };
                assert_eq!(response.stop_reason, expected, "{stop:?} on {endpoint:?}");
                let call = response.blocks[1].tool_call().unwrap();
                if stop == Stop::MaxTokens {
                    assert_eq!(call.input, json!({}), "a cut input is kept empty");
                } else {
                    assert_eq!(call.input, json!({"command": "echo \"São Paulo\""}));
                }
            }
        }
    }

    #[test]
    fn keels_decoders_see_the_mocks_faults_as_failures() {
        for endpoint in [WireApi::Anthropic, WireApi::Openai] {
            let answer = answer(endpoint);
            let cut = Ending::Cut {
                after_events: 4,
                clean_eof: true,
            };
            let mut decoder = new_decoder(endpoint);
            feed(decoder.as_mut(), &frames(endpoint, &answer, &cut)).unwrap();
            assert!(!decoder.is_complete());
            let failure = decoder.finish().unwrap_err();
            assert!(failure.retryable, "{endpoint:?}: {failure:?}");

            let overloaded = Ending::Error(ErrorSpec {
                kind: "overloaded_error".to_owned(),
                message: "Overloaded".to_owned(),
            });
            let mut decoder = new_decoder(endpoint);
            let failure = feed(decoder.as_mut(), &frames(endpoint, &answer, &overloaded))
                .err()
                .or_else(|| decoder.finish().err())
                .unwrap();
            assert!(failure.retryable, "{endpoint:?}: {failure:?}");
            assert!(failure.message.contains("Overloaded"), "{failure:?}");

            let malformed = match endpoint {
                WireApi::Anthropic => anthropic::malformed_frame(),
                WireApi::Openai => openai::malformed_frame(),
            };
            let mut decoder = new_decoder(endpoint);
            let failure = feed(decoder.as_mut(), &[malformed.text])
                .err()
                .or_else(|| decoder.finish().err());
            assert!(failure.is_some(), "{endpoint:?}: bad JSON is a failure");
        }
    }

    /// Each provider's "too long" refusal, as the fake sends it, is what
    /// keel's classifier reads as a prompt too long: keel compacts on it
    /// instead of failing the turn.
    #[test]
    fn keels_classifier_reads_the_mocks_too_long_refusals() {
        for body in [
            anthropic::too_long_body(1_200, 1_000),
            openai::too_long_body(1_200, 1_000),
        ] {
            let failure = classify_status(400, None, &body.to_string());
            assert!(failure.prompt_too_long, "{body}");
            assert!(!failure.retryable, "{body}");
            assert!(failure.message.contains("1200"), "{failure:?}");
        }
        assert_eq!(
            anthropic::too_long_body(208_310, 200_000),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"}})
        );
        assert_eq!(
            openai::too_long_body(130_532, 128_000),
            json!({"error": {
                "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130532 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded"
            }})
        );
    }
}
