//! Error classification shared by both providers: which failures are worth
//! retrying, and the message a user should see, intact from the provider.

use serde_json::Value;

use crate::input::LlmFailure;

/// Longest provider body kept in a message when it is not the usual JSON.
const MAX_RAW_BODY: usize = 500;

/// Classify an HTTP error response. `retry_after_ms` is the parsed
/// `retry-after` header, if any.
///
/// Retryable: 408, 409, 429, every 5xx and Anthropic's 529 (overloaded).
/// Not retryable: other 4xx (400, 401, 403, 404, …), and a 429 that means the
/// quota or spend cap is exhausted: waiting will not help.
pub fn classify_status(status: u16, retry_after_ms: Option<u64>, body: &str) -> LlmFailure {
    let detail = error_message(body);
    let message = format!("HTTP {status}: {detail}");
    let retryable = match status {
        429 => !quota_exhausted(body, retry_after_ms),
        408 | 409 | 500..=599 => true,
        _ => false,
    };
    LlmFailure {
        retryable,
        retry_after_ms: if retryable { retry_after_ms } else { None },
        message,
        prompt_too_long: (400..500).contains(&status) && prompt_too_long(body),
    }
}

/// A failure of the connection itself (refused, reset, timed out): retryable.
pub fn network_failure(what: &str) -> LlmFailure {
    LlmFailure {
        retryable: true,
        retry_after_ms: None,
        message: format!("network error: {what}"),
        prompt_too_long: false,
    }
}

/// Classify an `error` object sent inside a stream (Anthropic's `error`
/// event, an OpenAI chunk with `error`): by its type, like a status code.
pub fn classify_stream_error(error: &Value) -> LlmFailure {
    let kind = error
        .get("type")
        .or_else(|| error.get("code"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the provider reported an error");
    let retryable = matches!(
        kind,
        "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error" | "server_error"
    ) || kind.is_empty();
    let retryable = retryable && !matches!(kind, "insufficient_quota" | "billing_error");
    LlmFailure {
        retryable,
        retry_after_ms: None,
        message: if kind.is_empty() {
            message.to_owned()
        } else {
            format!("{kind}: {message}")
        },
        prompt_too_long: prompt_too_long(&error.to_string()),
    }
}

/// The provider's own message: `{"error": {"message": …}}` in both formats,
/// or the raw body (cut short) when it is something else.
pub fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let from_json = parsed.as_ref().and_then(|value| {
        let error = value.get("error")?;
        let message = error.get("message").and_then(Value::as_str);
        let kind = error
            .get("type")
            .or_else(|| error.get("code"))
            .and_then(Value::as_str);
        match (kind, message) {
            (Some(kind), Some(message)) => Some(format!("{kind}: {message}")),
            (None, Some(message)) => Some(message.to_owned()),
            (Some(kind), None) => Some(kind.to_owned()),
            (None, None) => error.as_str().map(str::to_owned),
        }
    });
    match from_json {
        Some(message) => message,
        None if body.trim().is_empty() => "no details in the response body".to_owned(),
        None => {
            let mut cut = body.trim().to_owned();
            if cut.len() > MAX_RAW_BODY {
                let mut end = MAX_RAW_BODY;
                while !cut.is_char_boundary(end) {
                    end -= 1;
                }
                cut.truncate(end);
                cut.push('…');
            }
            cut
        }
    }
}

/// A refusal of the prompt as longer than the model's context window, in
/// the words each provider uses: Anthropic's `prompt is too long: N tokens
/// > M maximum`, OpenAI's `context_length_exceeded` code, and the messages
/// of OpenAI-compatible servers (vLLM's "maximum context length", llama.cpp's
/// `exceed_context_size_error`, "context window").
fn prompt_too_long(body: &str) -> bool {
    let lower = body.to_ascii_lowercase();
    [
        "prompt is too long",
        "context_length_exceeded",
        "maximum context length",
        "exceed_context_size",
        "exceeds the context window",
        "context window exceeded",
        "input is too long",
    ]
    .iter()
    .any(|words| lower.contains(words))
}

/// A 429 that will not clear by waiting: OpenAI's `insufficient_quota`, or
/// a spend or usage limit (Anthropic's carries no `retry-after`).
fn quota_exhausted(body: &str, retry_after_ms: Option<u64>) -> bool {
    let lower = body.to_ascii_lowercase();
    if lower.contains("insufficient_quota") || lower.contains("billing") {
        return true;
    }
    let limit_words = lower.contains("spend limit")
        || lower.contains("usage limit")
        || lower.contains("credit balance")
        || lower.contains("quota");
    limit_words && retry_after_ms.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each provider's real "too long" answer is told apart from other
    /// client errors, so keel compacts instead of failing the turn.
    #[test]
    fn a_prompt_too_long_is_recognised_in_each_providers_words() {
        let anthropic = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#;
        let openai = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130532 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        let vllm = r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the messages, Please reduce the length of the messages.","type":"BadRequestError","param":null,"code":400}"#;
        let llama_cpp = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
        for body in [anthropic, openai, vllm, llama_cpp] {
            let failure = classify_status(400, None, body);
            assert!(failure.prompt_too_long, "{body}");
            assert!(!failure.retryable, "{body}");
        }
        let other = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: must be at least 1"}}"#;
        assert!(!classify_status(400, None, other).prompt_too_long);
        // A server error that mentions the words is not a refusal of the prompt.
        assert!(!classify_status(500, None, anthropic).prompt_too_long);
        let in_stream = serde_json::json!({"type": "invalid_request_error", "message": "prompt is too long: 300000 tokens > 200000 maximum"});
        assert!(classify_stream_error(&in_stream).prompt_too_long);
    }

    #[test]
    fn transient_statuses_are_retryable_with_their_retry_after() {
        for status in [408, 409, 429, 500, 502, 503, 529] {
            let failure = classify_status(status, Some(2_000), "");
            assert!(failure.retryable, "{status}");
            assert_eq!(failure.retry_after_ms, Some(2_000));
        }
    }

    #[test]
    fn client_errors_are_not_retried_and_keep_the_provider_message() {
        let body = r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
        let failure = classify_status(401, None, body);
        assert!(!failure.retryable);
        assert_eq!(
            failure.message,
            "HTTP 401: authentication_error: invalid x-api-key"
        );
        for status in [400, 403, 404, 413, 422] {
            assert!(!classify_status(status, None, "{}").retryable);
        }
    }

    #[test]
    fn an_exhausted_quota_is_not_retried() {
        let openai = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert!(!classify_status(429, None, openai).retryable);
        let anthropic = r#"{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your specified API usage limits."}}"#;
        assert!(!classify_status(429, None, anthropic).retryable);
        let plain = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit"}}"#;
        assert!(classify_status(429, Some(1_000), plain).retryable);
    }

    #[test]
    fn stream_errors_are_classified_by_type() {
        let overloaded: Value =
            serde_json::from_str(r#"{"type":"overloaded_error","message":"Overloaded"}"#).unwrap();
        let failure = classify_stream_error(&overloaded);
        assert!(failure.retryable);
        assert_eq!(failure.message, "overloaded_error: Overloaded");
        let invalid: Value = serde_json::from_str(
            r#"{"type":"invalid_request_error","message":"prompt is too long"}"#,
        )
        .unwrap();
        assert!(!classify_stream_error(&invalid).retryable);
    }

    #[test]
    fn a_body_that_is_not_json_is_kept_short() {
        let failure = classify_status(502, None, &"<html>bad gateway</html>".repeat(100));
        assert!(failure.message.len() < 600);
        assert!(failure.message.starts_with("HTTP 502: <html>"));
    }

    #[test]
    fn an_empty_body_says_there_are_no_details() {
        assert_eq!(
            classify_status(500, None, "  \n").message,
            "HTTP 500: no details in the response body"
        );
    }

    #[test]
    fn a_raw_body_is_cut_at_500_bytes_on_a_character_boundary() {
        let exact = "x".repeat(MAX_RAW_BODY);
        assert_eq!(error_message(&exact), exact, "500 bytes are kept whole");
        let long = format!("{exact}y");
        assert_eq!(error_message(&long), format!("{exact}…"));
        // 'a' then two-byte characters: byte 500 falls inside one, so the
        // cut goes back to the character's start.
        let accented = format!("a{}", "é".repeat(300));
        let cut = error_message(&accented);
        assert_eq!(cut, format!("a{}…", "é".repeat(249)));
    }

    #[test]
    fn each_sign_of_an_exhausted_quota_is_enough_and_a_retry_after_outweighs_the_vague_ones() {
        let body = |message: &str| {
            format!(
                r#"{{"type":"error","error":{{"type":"rate_limit_error","message":"{message}"}}}}"#
            )
        };
        // Certain whatever the headers say.
        for message in ["insufficient_quota", "billing hard limit reached"] {
            assert!(
                !classify_status(429, Some(1_000), &body(message)).retryable,
                "{message}"
            );
        }
        // Limit words: exhausted unless the provider says when to come back.
        for message in [
            "spend limit reached",
            "usage limit reached",
            "credit balance too low",
            "over quota",
        ] {
            assert!(
                !classify_status(429, None, &body(message)).retryable,
                "{message}"
            );
            assert!(
                classify_status(429, Some(1_000), &body(message)).retryable,
                "{message} with retry-after"
            );
        }
    }
}
