//! The HTTP side of talking to an LLM provider: one streaming `POST`, its
//! server-sent events fed to keel-core's `StreamDecoder`, and every way it can
//! go wrong turned into a classified [`LlmFailure`].
//!
//! The wire formats themselves (request bodies, event decoding, status
//! classification) are pure code in `keel_core::wire`; this module adds only
//! what needs a socket and a clock: the connection, the headers, the
//! timeouts, the SSE framing (`sseer`'s parser over reqwest's byte
//! stream; not its `EventSource`, which reconnects and would re-send the
//! `POST`) and the `retry-after` header.
//!
//! # Base URLs
//!
//! The two providers follow their own SDKs' conventions, so a value that
//! works with the official SDK works here:
//!
//! - Anthropic: `ANTHROPIC_BASE_URL` is the host *without* the API version,
//!   default `https://api.anthropic.com`; keel appends `/v1/messages`.
//! - OpenAI and compatible servers: `OPENAI_BASE_URL` *includes* the version,
//!   default `https://api.openai.com/v1` (Ollama: `http://localhost:11434/v1`,
//!   vLLM and llama.cpp: `http://HOST:PORT/v1`); keel appends
//!   `/chat/completions`.
//! - The mock provider (`keel mock-llm`) speaks the Anthropic format, so its
//!   URL (`KEEL_MOCK_URL`, e.g. `http://127.0.0.1:7778`) is a base like
//!   Anthropic's: keel appends `/v1/messages`.
//!
//! # Timeouts
//!
//! Three clocks guard a request, so a provider that stops talking is noticed
//! while the user still cares: connecting, the wait for the response headers
//! ("first byte"), and the longest silence between two chunks of the body
//! ("idle"). Each one firing is a retryable failure, and each is set in
//! [`Timeouts`] (or the `KEEL_*_TIMEOUT_MS` variables). None of them limits
//! a long answer that keeps streaming: a slow model writing for minutes is
//! healthy as long as it keeps sending. A limit on the whole request
//! (`ConversationConfig::request_timeout_ms`) exists for callers who want
//! one, and is off by default.
//!
//! # Cancellation
//!
//! The future returned by [`ProviderClient::stream`] owns the connection.
//! Dropping it (an aborted task, a `select!` that lost) closes the socket at
//! once; nothing keeps reading in the background.

mod failure;
mod read;

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use keel_core::wire::{anthropic, openai, EncodedHistory, PromptRequest, StreamDecoder};
use keel_core::{AssistantResponse, LlmFailure, ProviderKind, StreamDelta};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};

pub use failure::{parse_retry_after, retry_after_ms};

use crate::Error;

/// Anthropic's API, without the version (see "Base URLs" above).
pub const ANTHROPIC_DEFAULT_URL: &str = "https://api.anthropic.com";
/// OpenAI's API, with the version (see "Base URLs" above).
pub const OPENAI_DEFAULT_URL: &str = "https://api.openai.com/v1";
/// The Messages API version keel's Anthropic wire format is written against.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Where a provider is and how to authenticate there.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Base URL by the provider's convention (see "Base URLs" above). A
    /// trailing `/` is ignored.
    pub base_url: String,
    /// Sent as `x-api-key` (Anthropic) or `Authorization: Bearer` (OpenAI).
    /// Optional for OpenAI-compatible local servers, which mostly need none.
    pub api_key: Option<String>,
}

impl fmt::Debug for Endpoint {
    /// Keys are secrets: a logged config shows only whether one is set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The clocks that guard one request; each one firing is a retryable failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Establishing the TCP (and TLS) connection.
    pub connect: Duration,
    /// From sending the request to the response's status and headers. It
    /// covers the upload of the body too, so it should allow for a request
    /// carrying many images.
    pub first_byte: Duration,
    /// Longest silence between two chunks of the response body. Anthropic
    /// pings during long pauses; a server that says nothing for this long
    /// has most likely gone away.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(60),
            idle: Duration::from_secs(60),
        }
    }
}

/// How to reach every provider keel knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    pub anthropic: Endpoint,
    pub openai: Endpoint,
    /// Base URL of the fake provider (`keel mock-llm`), which speaks the
    /// Anthropic format. `None`: requests to the mock provider fail with a
    /// message saying so.
    pub mock_url: Option<String>,
    pub timeouts: Timeouts,
}

impl Default for ProviderConfig {
    /// The public endpoints without keys, no mock, default timeouts.
    fn default() -> Self {
        ProviderConfig {
            anthropic: Endpoint {
                base_url: ANTHROPIC_DEFAULT_URL.to_owned(),
                api_key: None,
            },
            openai: Endpoint {
                base_url: OPENAI_DEFAULT_URL.to_owned(),
                api_key: None,
            },
            mock_url: None,
            timeouts: Timeouts::default(),
        }
    }
}

impl ProviderConfig {
    /// From the process environment: `ANTHROPIC_API_KEY`,
    /// `ANTHROPIC_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_BASE_URL`,
    /// `KEEL_MOCK_URL`, and the three clocks in milliseconds:
    /// `KEEL_CONNECT_TIMEOUT_MS`, `KEEL_FIRST_BYTE_TIMEOUT_MS`,
    /// `KEEL_IDLE_TIMEOUT_MS`. Unset or empty variables keep the defaults; a
    /// timeout that is not a positive whole number of milliseconds is an
    /// error naming the variable.
    pub fn from_env() -> Result<ProviderConfig, Error> {
        ProviderConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`ProviderConfig::from_env`], reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<ProviderConfig, Error> {
        let var = |name: &str| {
            lookup(name)
                .map(|value| value.trim().to_owned())
                .filter(|value| !value.is_empty())
        };
        let millis = |name: &'static str, default: Duration| match var(name) {
            None => Ok(default),
            Some(value) => match value.parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
                _ => Err(Error::Config {
                    name,
                    reason: format!("{value:?} is not a positive number of milliseconds"),
                }),
            },
        };
        let defaults = ProviderConfig::default();
        Ok(ProviderConfig {
            anthropic: Endpoint {
                base_url: var("ANTHROPIC_BASE_URL").unwrap_or(defaults.anthropic.base_url),
                api_key: var("ANTHROPIC_API_KEY"),
            },
            openai: Endpoint {
                base_url: var("OPENAI_BASE_URL").unwrap_or(defaults.openai.base_url),
                api_key: var("OPENAI_API_KEY"),
            },
            mock_url: var("KEEL_MOCK_URL"),
            timeouts: Timeouts {
                connect: millis("KEEL_CONNECT_TIMEOUT_MS", defaults.timeouts.connect)?,
                first_byte: millis("KEEL_FIRST_BYTE_TIMEOUT_MS", defaults.timeouts.first_byte)?,
                idle: millis("KEEL_IDLE_TIMEOUT_MS", defaults.timeouts.idle)?,
            },
        })
    }
}

/// Streams responses from providers. Cheap to clone; clones share one
/// connection pool.
#[derive(Debug, Clone)]
pub struct ProviderClient {
    config: ProviderConfig,
    http: reqwest::Client,
}

/// The wire format a request is sent in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Anthropic,
    OpenAi,
}

/// A resolved destination: URL, format and headers.
struct Target {
    url: String,
    format: Format,
    headers: HeaderMap,
}

impl ProviderClient {
    pub fn new(config: ProviderConfig) -> Result<ProviderClient, Error> {
        // reqwest is built with `rustls-no-provider` (ring instead of
        // aws-lc, for build time) and refuses to build a client until a
        // provider is installed; an error only says one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(config.timeouts.connect)
            .tcp_nodelay(true)
            // An API endpoint that redirects is misconfigured; following a
            // redirect would turn the POST into a GET and hide the problem.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(Error::HttpClient)?;
        Ok(ProviderClient { config, http })
    }

    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// Sends `request` to `provider` and streams the answer: every delta
    /// goes to `on_delta` as it arrives, and the complete response is
    /// returned once the provider says it is done.
    ///
    /// `limit` bounds the whole request (`request_timeout_ms`), on top of the
    /// connect, first-byte and idle timeouts. Every failure is an
    /// [`LlmFailure`], classified: network errors and timeouts are
    /// retryable; HTTP errors by `keel_core::wire::classify::classify_status`
    /// with the provider's own message and `retry-after`.
    ///
    /// Dropping the returned future closes the connection at once.
    pub async fn stream<F>(
        &self,
        provider: ProviderKind,
        request: &PromptRequest<'_>,
        limit: Option<Duration>,
        on_delta: F,
    ) -> Result<AssistantResponse, LlmFailure>
    where
        F: FnMut(StreamDelta) + Send,
    {
        self.stream_reusing(provider, request, None, limit, on_delta)
            .await
    }

    /// [`ProviderClient::stream`], the body encoded reusing the JSON an
    /// earlier request from the same history kept in `reuse`, with the
    /// history's count of edits (`keel_core::wire::EncodedHistory` says
    /// when that is right).
    pub async fn stream_reusing<F>(
        &self,
        provider: ProviderKind,
        request: &PromptRequest<'_>,
        reuse: Option<(&Mutex<EncodedHistory>, u64)>,
        limit: Option<Duration>,
        on_delta: F,
    ) -> Result<AssistantResponse, LlmFailure>
    where
        F: FnMut(StreamDelta) + Send,
    {
        let exchange = self.exchange(provider, request, reuse, on_delta);
        match limit {
            None => exchange.await,
            Some(limit) => tokio::time::timeout(limit, exchange)
                .await
                .unwrap_or_else(|_| {
                    Err(failure::timed_out(
                        "before the whole response arrived",
                        limit,
                    ))
                }),
        }
    }

    async fn exchange<F>(
        &self,
        provider: ProviderKind,
        request: &PromptRequest<'_>,
        reuse: Option<(&Mutex<EncodedHistory>, u64)>,
        on_delta: F,
    ) -> Result<AssistantResponse, LlmFailure>
    where
        F: FnMut(StreamDelta) + Send,
    {
        let target = self.target(provider)?;
        let encode = match target.format {
            Format::Anthropic => anthropic::encode_request_reusing,
            Format::OpenAi => openai::encode_request_reusing,
        };
        // Encoded before anything is awaited: the lock is never held
        // across an await.
        let body = match reuse {
            Some((history, edits)) => encode(
                request,
                edits,
                &mut history.lock().unwrap_or_else(PoisonError::into_inner),
            ),
            None => encode(request, 0, &mut EncodedHistory::default()),
        };
        let decoder: Box<dyn StreamDecoder> = match target.format {
            Format::Anthropic => Box::new(anthropic::Decoder::new(request.model)),
            Format::OpenAi => Box::new(openai::Decoder::new(request.model)),
        };
        let body =
            body.map_err(|error| failure::permanent(format!("cannot build the request: {error}")))?;

        let timeouts = self.config.timeouts;
        let send = self
            .http
            .post(&target.url)
            .headers(target.headers)
            .body(body)
            .send();
        let response = match tokio::time::timeout(timeouts.first_byte, send).await {
            Err(_) => {
                return Err(failure::timed_out(
                    "waiting for the response headers",
                    timeouts.first_byte,
                ))
            }
            Ok(Err(error)) => return Err(failure::transport(&error)),
            Ok(Ok(response)) => response,
        };

        let status = response.status();
        if !status.is_success() {
            let retry_after = retry_after_ms(response.headers(), SystemTime::now());
            let body = read::bounded_body(response, timeouts.idle).await;
            return Err(keel_core::wire::classify::classify_status(
                status.as_u16(),
                retry_after,
                &body,
            ));
        }
        if read::is_json(&response) {
            // A server that ignored `stream: true`, or a proxy answering
            // with an error under status 200.
            let body = read::bounded_body(response, timeouts.idle).await;
            return Err(failure::not_a_stream(&body));
        }

        let mut answer = read::decode_events(response, decoder, timeouts.idle, on_delta).await?;
        // The mock provider speaks Anthropic's format; the response records
        // who really answered.
        answer.provider = provider;
        Ok(answer)
    }

    fn target(&self, provider: ProviderKind) -> Result<Target, LlmFailure> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        let (base, key, format) = match provider {
            ProviderKind::Anthropic => {
                let Some(key) = &self.config.anthropic.api_key else {
                    return Err(failure::permanent(
                        "no Anthropic API key: set ANTHROPIC_API_KEY".to_owned(),
                    ));
                };
                (
                    &self.config.anthropic.base_url,
                    Some(key),
                    Format::Anthropic,
                )
            }
            ProviderKind::OpenAi => (
                &self.config.openai.base_url,
                self.config.openai.api_key.as_ref(),
                Format::OpenAi,
            ),
            ProviderKind::Mock => {
                let Some(url) = &self.config.mock_url else {
                    return Err(failure::permanent(
                        "the mock provider has no URL: set KEEL_MOCK_URL".to_owned(),
                    ));
                };
                (url, None, Format::Anthropic)
            }
        };
        let path = match format {
            Format::Anthropic => "/v1/messages",
            Format::OpenAi => "/chat/completions",
        };
        if let Some(key) = key {
            let (name, value) = match format {
                Format::Anthropic => ("x-api-key", key.clone()),
                Format::OpenAi => ("authorization", format!("Bearer {key}")),
            };
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                failure::permanent(format!(
                    "the {provider} API key contains characters not allowed in an HTTP header"
                ))
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        if format == Format::Anthropic {
            headers.insert(
                "anthropic-version",
                HeaderValue::from_static(ANTHROPIC_VERSION),
            );
        }
        Ok(Target {
            url: format!("{}{path}", base.trim_end_matches('/')),
            format,
            headers,
        })
    }
}
