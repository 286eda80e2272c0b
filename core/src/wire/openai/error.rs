//! The errors a stream reports, and the failures keel makes of them.
//!
//! The servers report an error mid-stream in three shapes (an `error`
//! member, a bare error object, an `error` event), and some put the HTTP
//! status in a numeric `code` that the shared table in `wire::classify`
//! does not read; this module finds the error in each shape and lets that
//! status decide whether it is retried. Kept apart so the decoder reads a
//! chunk, and this the ways a chunk can be a failure.

use serde_json::{json, Value};

use crate::input::LlmFailure;
use crate::wire::classify;

/// The error a chunk reports, if it is one: `{"error": {...}}` (OpenAI,
/// llama.cpp, newer vLLM), a bare `{"object": "error", ...}` (older vLLM),
/// or anything sent as an `error` event.
pub(super) fn error_of(chunk: &Value, event: &str) -> Option<Value> {
    match chunk.get("error") {
        Some(Value::Null) | None => {}
        Some(Value::String(message)) => return Some(json!({ "message": message })),
        Some(error) => return Some(error.clone()),
    }
    let bare = chunk.get("object").and_then(Value::as_str) == Some("error");
    (bare || event == "error").then(|| chunk.clone())
}

/// Classify an in-stream error. vLLM and llama.cpp put the HTTP status in a
/// numeric `code` and a type the shared table does not know
/// ("BadRequestError"); the status then decides what is retried.
pub(super) fn stream_failure(error: &Value) -> LlmFailure {
    let mut failure = classify::classify_stream_error(error);
    let status = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|code| u16::try_from(code).ok())
        .filter(|code| (400..=599).contains(code));
    if let Some(status) = status {
        failure.retryable = classify::classify_status(status, None, &failure.message).retryable;
    }
    failure
}

/// A failure that trying again may mend: a stream cut short, a chunk or a
/// tool call that did not come through whole.
pub(super) fn retryable(message: impl Into<String>) -> LlmFailure {
    LlmFailure {
        retryable: true,
        retry_after_ms: None,
        message: message.into(),
        prompt_too_long: false,
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::openai::Decoder;
    use crate::wire::{SseEvent, StreamDecoder};

    #[test]
    fn errors_in_every_shape_fail_the_stream() {
        let cases = [
            // OpenAI: a transient server error.
            (
                "",
                r#"{"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}"#,
                true,
                "server_error: The server had an error",
            ),
            // Newer vLLM: the status in a numeric code.
            (
                "",
                r#"{"error":{"message":"prompt too long","type":"BadRequestError","param":null,"code":400}}"#,
                false,
                "BadRequestError: prompt too long",
            ),
            // Older vLLM: a bare error object.
            (
                "",
                r#"{"object":"error","message":"engine died","type":"InternalServerError","param":null,"code":500}"#,
                true,
                "InternalServerError: engine died",
            ),
            // A proxy with a plain string.
            (
                "",
                r#"{"error":"upstream timed out"}"#,
                true,
                "upstream timed out",
            ),
            // An `error` event.
            (
                "error",
                r#"{"message":"Overloaded","type":"overloaded_error"}"#,
                true,
                "overloaded_error: Overloaded",
            ),
        ];
        for (event, data, retryable, message) in cases {
            let mut decoder = Decoder::new("m");
            let failure = decoder.feed(SseEvent { event, data }).unwrap_err();
            assert_eq!(failure.retryable, retryable, "{data}");
            assert_eq!(failure.message, message, "{data}");
            // The failure sticks.
            assert_eq!(
                decoder.feed(SseEvent {
                    event: "",
                    data: "[DONE]"
                }),
                Err(failure.clone())
            );
            assert_eq!(Box::new(decoder).finish(), Err(failure));
        }
    }

    #[test]
    fn a_quota_error_in_the_stream_is_not_retried() {
        let mut decoder = Decoder::new("m");
        let failure = decoder
            .feed(SseEvent {
                event: "",
                data: r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
            })
            .unwrap_err();
        assert!(!failure.retryable);
    }
}
