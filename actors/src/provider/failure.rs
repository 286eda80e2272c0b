//! Failures of the HTTP exchange itself, as [`LlmFailure`]s: transport
//! errors, timeouts, answers that are not a stream, and the `retry-after`
//! header. Failures the provider reports (statuses, error events) are
//! classified by `keel_core::wire::classify`.

use std::error::Error as _;
use std::time::{Duration, SystemTime};

use keel_core::wire::classify::{classify_stream_error, error_message, network_failure};
use keel_core::LlmFailure;
use reqwest::header::HeaderMap;

/// A failure that retrying cannot fix (configuration, a request keel
/// cannot build).
pub(crate) fn permanent(message: String) -> LlmFailure {
    LlmFailure {
        retryable: false,
        retry_after_ms: None,
        message,
        prompt_too_long: false,
    }
}

/// A clock of [`super::Timeouts`] (or the caller's limit) ran out.
pub(crate) fn timed_out(waiting_for: &str, after: Duration) -> LlmFailure {
    network_failure(&format!(
        "timed out after {} ms {waiting_for}",
        after.as_millis()
    ))
}

/// reqwest's error with its causes: its own `Display` says only "error
/// sending request for url (…)", the reason ("Connection refused") is in the
/// chain.
pub(crate) fn transport(error: &reqwest::Error) -> LlmFailure {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !message.contains(&cause_text) {
            message.push_str(": ");
            message.push_str(&cause_text);
        }
        source = cause.source();
    }
    if error.is_builder() {
        // A malformed base URL: the same request fails the same way again.
        return permanent(format!("invalid request: {message}"));
    }
    network_failure(&message)
}

/// A 200 whose body is JSON rather than an event stream: the provider's
/// error if it holds one, else a server that does not stream.
pub(crate) fn not_a_stream(body: &str) -> LlmFailure {
    let parsed = serde_json::from_str::<serde_json::Value>(body).ok();
    match parsed.as_ref().and_then(|value| value.get("error")) {
        Some(error) if error.is_object() => classify_stream_error(error),
        Some(_) => permanent(error_message(body)),
        None => permanent(
            "the server answered with JSON instead of an event stream; \
             does it support streaming (\"stream\": true)?"
                .to_owned(),
        ),
    }
}

/// How long the provider asks to wait, in milliseconds: OpenAI's
/// `retry-after-ms` if present, else the standard `retry-after`.
pub fn retry_after_ms(headers: &HeaderMap, now: SystemTime) -> Option<u64> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(parse_milliseconds) {
        return Some(ms);
    }
    header("retry-after").and_then(|value| parse_retry_after(value, now))
}

/// A `retry-after` value in milliseconds: delay-seconds (`"30"`, and the
/// fractional `"1.5"` some servers send) or an HTTP-date, counted from `now`
/// (a date in the past means "now": 0). Anything else is ignored.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<u64> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1000.0).ceil() as u64);
    }
    let when = httpdate::parse_http_date(value).ok()?;
    let wait = when.duration_since(now).unwrap_or(Duration::ZERO);
    Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
}

fn parse_milliseconds(value: &str) -> Option<u64> {
    let ms = value.trim().parse::<f64>().ok()?;
    (ms.is_finite() && ms >= 0.0).then(|| ms.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_seconds() {
        let now = SystemTime::UNIX_EPOCH;
        assert_eq!(parse_retry_after("30", now), Some(30_000));
        assert_eq!(parse_retry_after(" 0 ", now), Some(0));
        assert_eq!(parse_retry_after("1.5", now), Some(1_500));
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_as_an_http_date() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(30_000)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:40:00 GMT", now),
            Some(0)
        );
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", "2".parse().unwrap());
        assert_eq!(
            retry_after_ms(&headers, SystemTime::UNIX_EPOCH),
            Some(2_000)
        );
        headers.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retry_after_ms(&headers, SystemTime::UNIX_EPOCH), Some(250));
    }

    #[test]
    fn json_instead_of_a_stream_keeps_the_provider_error() {
        let failure = not_a_stream(r#"{"error":{"type":"overloaded_error","message":"busy"}}"#);
        assert_eq!(failure.message, "overloaded_error: busy");
        assert!(failure.retryable);
        assert!(!not_a_stream(r#"{"id":"x","choices":[]}"#).retryable);
    }
}
